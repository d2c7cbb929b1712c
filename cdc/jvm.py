"""Options for every JVM this project starts: ``CDC_JVM_OPTIONS``.

The Spark driver of ``cdc apply`` (``spark.driver.extraJavaOptions``), its executors
(``spark.executor.extraJavaOptions``, unless the config sets them), and the throwaway servers of
the demo and the tests (Kafka brokers, Spark's master and workers) add the options in the
environment variable ``CDC_JVM_OPTIONS``, split like a shell would. On a small machine, where
JVMs live for minutes, ``-XX:TieredStopAtLevel=1 -XX:+UseSerialGC`` (the JIT's quick tier only,
one GC thread) saves about a fifth of their CPU time; the test suite sets exactly that
(``tests/conftest.py``). Unset: the JVM's defaults.
"""

from __future__ import annotations

import os
import shlex

#: the environment variable read by :func:`jvm_options`
JVM_OPTIONS_ENV = "CDC_JVM_OPTIONS"


def jvm_options() -> list[str]:
    """The options of ``CDC_JVM_OPTIONS`` (empty when unset)."""
    return shlex.split(os.environ.get(JVM_OPTIONS_ENV, ""))
