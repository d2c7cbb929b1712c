"""The one place that turns a config into a log: every caller opens logs here, never a backend.

``open_writer(config)`` gives the single writer (the capture daemon, a bootstrap);
``open_reader(config)`` a reader (status, verify, log dump, the Spark source, followers). The
local backend lives in :mod:`cdc.log.local`, the Kafka one in :mod:`cdc.log.kafka` (imported only
when chosen, so the local log needs no Kafka client).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc.errors import LogError
from cdc.log.base import ChangeLogReader, ChangeLogWriter

if TYPE_CHECKING:
    from cdc.config import Config, LogConfig
    from cdc.preflight import Part


def log_settings(config: Config) -> dict[str, Any]:
    """The log's settings as plain data (what a Spark task needs to open the log itself)."""
    settings = config.log.model_dump(mode="json")
    settings["path"] = str(config.log_path)
    return settings


def _config_of(settings: dict[str, Any]) -> LogConfig:
    from cdc.config import LogConfig

    return LogConfig.model_validate(settings)


def open_writer(config: Config) -> ChangeLogWriter:
    """The log writer for ``config`` (one per log: a second is refused or fences the first)."""
    return writer_from(log_settings(config))


def writer_from(settings: dict[str, Any]) -> ChangeLogWriter:
    log = _config_of(settings)
    if log.backend == "kafka":
        from cdc.log.kafka import KafkaChangeLog

        return KafkaChangeLog(log)
    from cdc.log.local import LocalChangeLog

    return LocalChangeLog(Path(settings["path"]), partitions=log.partitions,
                          segment_bytes=log.segment_bytes, fsync=log.fsync,
                          tombstone_retention=log.tombstone_retention)


def open_reader(config: Config, missing_ok: bool = False) -> ChangeLogReader | None:
    """A reader of ``config``'s log. ``missing_ok``: None when nothing was ever committed to
    it (no capture ran yet) instead of a :class:`~cdc.errors.LogError`."""
    return reader_from(log_settings(config), missing_ok)


def log_preflight(config: Config) -> Part:
    """The preflight part of ``config``'s log (:mod:`cdc.preflight`; creates nothing)."""
    if config.log.backend == "kafka":
        from cdc.log.kafka import preflight_part

        return preflight_part(config.log)
    from cdc.log.local import preflight_part as local_part

    return local_part(config.log_path)


def schema_store_from(settings: dict[str, Any] | None) -> Any:
    """The schema store of the log of ``settings`` (``None``: no settings, or no log yet)."""
    if settings is None:
        return None
    reader = reader_from(settings, missing_ok=True)
    return None if reader is None else reader.schemas()


def reader_from(settings: dict[str, Any], missing_ok: bool = False) -> ChangeLogReader | None:
    log = _config_of(settings)
    if log.backend == "kafka":
        from cdc.log.kafka import KafkaChangeLogReader

        reader: ChangeLogReader = KafkaChangeLogReader(log)
        if missing_ok and not reader.topics() and not reader.source_offsets():
            reader.close()
            return None
        return reader
    from cdc.log.local import STATE_FILE, LocalChangeLogReader

    path = Path(settings["path"])
    if not (path / STATE_FILE).exists():
        if missing_ok:
            return None
        if path.is_dir():
            raise LogError(f"{path} is not a change log (nothing was ever committed to it: it "
                           f"has no {STATE_FILE})",
                           "point log.path at the directory `cdc capture` writes, or run "
                           "`cdc bootstrap` to create the log")
        raise LogError(f"no change log at {path}",
                       "check log.path in the config, or run `cdc bootstrap` to create the log")
    return LocalChangeLogReader(path, log.tombstone_retention)


def must_read(config: Config) -> ChangeLogReader:
    """A reader of ``config``'s log; a clear error if there is none yet."""
    reader = open_reader(config)
    assert reader is not None
    return reader


def spark_kafka_options(settings: dict[str, Any]) -> dict[str, str]:
    """For a Kafka log (``settings`` as :func:`log_settings` gives them): the options of Spark's
    Kafka source that reach its brokers (``kafka.bootstrap.servers``, security...). A local
    log: :class:`~cdc.errors.LogError`."""
    log = _config_of(settings)
    if log.backend != "kafka":
        from cdc.errors import LogError

        raise LogError("Spark's Kafka source reads only a Kafka log", "set log.backend: kafka")
    from cdc.log.kafka import java_client_settings

    return {f"kafka.{key}": value for key, value in java_client_settings(log).items()}


def kafka_topic_name(settings: dict[str, Any], topic: str) -> str:
    """The Kafka topic holding log topic ``topic`` (Kafka logs only)."""
    from cdc.log.kafka import kafka_topic

    return kafka_topic(topic)
