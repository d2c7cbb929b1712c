"""One runner per follower, chosen once when ``cdc apply`` starts (``runners/base.py`` is the
contract):

* a sink placed on the driver (``Placement.DRIVER``) — :class:`InlineRunner`;
* ``reader: spark-kafka``, or ``auto`` with a Kafka log on a cluster master — :class:`KafkaRunner`;
* a cluster master (``spark.master`` not ``local``) — :class:`ExecutorRunner`;
* local mode: a view — :class:`InlineRunner` (in the apply process: DuckDB does the work; at
  most one view per core writes at a time);
  any other follower — :class:`ProcessRunner` (a process of its own).
"""
