"""The one YAML configuration file, validated on load.

Shape (every key except ``sources`` has a default)::

    log: {backend: local, path: ./cdc-data/log, partitions: 8}
    sources:
      - name: shop
        kind: postgres
        dsn: postgresql://cdc@127.0.0.1:5432/shop   # password via password_env or ~/.pgpass
        tables: [public.orders, public.customers]
    followers:                      # optional: what `cdc apply` folds the log into
      cache:
        kind: redis
        url: redis://127.0.0.1:6379/0   # password via password_env
        sources: [shop]                 # default: every source
        tables: [public.orders]         # default: every table of those sources

Relative paths are resolved against the directory of the config file, so a config means the same
thing whatever the working directory. Errors name the key (``sources[0].tables[1]``), the problem
and the fix. DSNs are secrets: they are kept as :class:`Secret` and only ever shown redacted.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union
from urllib.parse import urlsplit, urlunsplit

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from cdc import plugins
from cdc.errors import ConfigError
from cdc.events import TableId, topic_name

DEFAULT_CONFIG_NAME = "cdc.yaml"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, None: 1}
_SIZE = re.compile(r"^\s*(\d+)\s*(b|kb|kib|mb|mib|gb|gib)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    None: 1, "b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2,
    "gb": 1000**3, "gib": 1024**3,
}
_IDENT = r"[A-Za-z_][A-Za-z0-9_$]*"
_TABLE_NAME = re.compile(rf'^(?:{_IDENT}|"(?:[^"]|"")+")\.(?:{_IDENT}|"(?:[^"]|"")+")$')
_SOURCE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")


def parse_duration(value: Any) -> float:
    """Seconds from ``30``, ``"500ms"``, ``"24h"``, ``"7d"``."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 15m, 24h or 7d")
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError("expected a duration such as 30s, 15m, 24h or 7d")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


def parse_size(value: Any) -> int:
    """Bytes from ``1048576``, ``"64MiB"``, ``"1GB"``."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 64MiB or 1GiB")
    if isinstance(value, int):
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError("expected a size such as 64MiB or 1GiB")
    unit = match.group(2).lower() if match.group(2) else None
    return int(match.group(1)) * _SIZE_UNITS[unit]


Duration = Annotated[float, BeforeValidator(parse_duration)]
Size = Annotated[int, BeforeValidator(parse_size)]


def redact_dsn(dsn: str) -> str:
    """The DSN with any password replaced by ``***`` (URL and key=value forms)."""
    if "://" in dsn:
        parts = urlsplit(dsn)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            if ":" in userinfo:
                userinfo = userinfo.split(":", 1)[0] + ":***"
            netloc = f"{userinfo}@{host}"
        query = re.sub(r"(?i)(password=)[^&]*", r"\1***", parts.query)
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    return re.sub(r"(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)


class Invalid(ValueError):
    """A setting's value is wrong, and here is how to fix it (a validator's error that names
    its own fix; other validators' errors get a fix by their kind)."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.fix = fix


class Secret:
    """A string that never shows itself: ``str()`` and ``repr()`` give the redacted form."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The real value, for handing to a driver. Never log the result."""
        return self._value

    def __str__(self) -> str:
        return redact_dsn(self._value)

    __repr__ = __str__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def to_secret(value: Any) -> Secret:
    """``value`` as a :class:`Secret` (a pydantic before-validator for connection strings)."""
    if isinstance(value, Secret):
        return value
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected a connection string")
    return Secret(value)


SecretDsn = Annotated[Secret, BeforeValidator(to_secret)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, frozen=True)


class SchemaRegistryConfig(_Strict):
    """``log.schema_registry``: a Schema Registry of yours (Confluent's REST API) that holds the
    log's Avro schemas and assigns their ids, instead of the log's own schemas topic."""

    #: e.g. ``http://registry:8081`` (Apicurio: ``http://registry:8080/apis/ccompat/v7``)
    url: str = Field(pattern=r"^https?://\S+$")
    #: name of an environment variable holding ``user:password`` for basic authentication
    basic_auth_env: str | None = None


class LogConfig(_Strict):
    """Where and how the change log is kept: ``backend: local`` (files under ``path``) or
    ``backend: kafka`` (compacted topics on ``bootstrap_servers``; ``path`` then holds only the
    daemons' status files and the followers' state)."""

    backend: Literal["local", "kafka"] = "local"
    path: Path = Path("./cdc-data/log")
    #: kafka: how the topics' records are written, fixed when the log is created: ``avro``
    #: (Confluent's wire format) or ``json`` (Kafka Connect's ``JsonConverter`` with schemas:
    #: ``{"schema", "payload"}``, what Debezium's JDBC sink reads; :mod:`cdc.connect`)
    format: Literal["avro", "json"] = "avro"
    #: format json: decimals as Connect's ``Decimal`` (``precise``: a NaN or infinity then stops
    #: capture) or as their exact text (``string``); fixed when the log is created
    decimal_handling: Literal["precise", "string"] = "precise"
    #: how times and timestamps are written: ``micro`` (Debezium's ``MicroTime``,
    #: ``MicroTimestamp``: exact to the microsecond); format json also ``adaptive`` (a column
    #: declaring at most 3 fractional digits as ``Timestamp`` / ``Time`` milliseconds, Debezium's
    #: default) or ``adaptive_time_microseconds`` (``time`` always ``MicroTime``); fixed when the
    #: log is created (:mod:`cdc.connect`)
    time_precision: Literal["micro", "adaptive", "adaptive_time_microseconds"] = "micro"
    #: kafka, format avro: keep the schemas in this Schema Registry (its ids in the values);
    #: fixed when the log is created
    schema_registry: SchemaRegistryConfig | None = None
    #: kafka: the brokers, ``host:port[,host:port...]``
    bootstrap_servers: str | None = None
    #: kafka: replication factor of the topics cdc creates (-1: the broker's default)
    replication_factor: int = Field(-1, ge=-1, le=32)
    #: kafka: ``min.insync.replicas`` of the topics cdc creates (None: the broker's default)
    min_insync_replicas: int | None = Field(None, ge=1, le=32)
    #: kafka: the compacted topic of Avro schemas (Confluent's ids and subjects)
    schemas_topic: str = "_cdc_schemas"
    #: kafka: the compacted topic of source offsets and topic descriptions
    offsets_topic: str = "_cdc_offsets"
    #: kafka: prefix of each source's transactional.id (``<prefix><source>``)
    transactional_id_prefix: str = "cdc-"
    #: kafka: how long a broker waits for an open transaction of a dead producer
    transaction_timeout: Duration = Field(60.0, ge=1, le=900)
    #: kafka: extra client settings (librdkafka names: ``security.protocol``, ``sasl.mechanism``,
    #: ``sasl.username``, ``ssl.ca.location``, ``message.max.bytes`` ...); no passwords here
    client: dict[str, str | int | bool] = Field(default_factory=dict)
    #: kafka: name of an environment variable holding ``sasl.password``
    password_env: str | None = None
    #: kafka: extra settings of the topics cdc creates (``segment.ms``,
    #: ``min.cleanable.dirty.ratio``, ``max.message.bytes`` ...); ``cleanup.policy`` is always
    #: ``compact`` and ``delete.retention.ms`` comes from ``tombstone_retention``
    topic_config: dict[str, str | int | float] = Field(default_factory=dict)
    partitions: int = Field(8, ge=1, le=4096)
    segment_bytes: Size = Field(64 * 1024**2, ge=4096)
    #: group commit: an append waits at most this long for company before it is made durable
    commit_interval: Duration = Field(0.02, ge=0, le=60)
    #: ... and a group never holds more than this many records
    commit_max_records: int = Field(20_000, ge=1)
    #: ... nor more than this many bytes of record values (capture's memory stays bounded)
    commit_max_bytes: Size = Field(16 * 1024**2, ge=4096)
    #: tombstones stay this long after they were appended, then compaction drops them
    tombstone_retention: Duration = Field(24 * 3600.0, ge=0)
    #: false only for throwaway logs: appends are then not fsynced
    fsync: bool = True

    @field_validator("decimal_handling", "time_precision", mode="before")
    @classmethod
    def _lossless_only(cls, value: Any) -> Any:
        refused = {
            "double": "decimal_handling double loses digits (a 64-bit float holds ~16 of them)",
            "connect": "time_precision connect loses microseconds (Kafka Connect's own "
                       "Timestamp and Time are milliseconds)",
        }
        if isinstance(value, str) and value in refused:
            raise Invalid(f"{refused[value]}: cdc offers only modes that lose nothing",
                          "use decimal_handling precise or string; time_precision micro, "
                          "adaptive or adaptive_time_microseconds")
        return value

    @model_validator(mode="after")
    def _backend_settings(self) -> LogConfig:
        if self.backend == "kafka":
            if not self.bootstrap_servers:
                raise ValueError("backend kafka needs bootstrap_servers (e.g. "
                                 "bootstrap_servers: broker1:9092,broker2:9092)")
            secret = [k for k in self.client if "password" in k.lower() or "secret" in k.lower()]
            if secret:
                raise ValueError(f"client: {secret} would put a secret in the config file; "
                                 "use password_env (sasl.password) instead")
            fixed = sorted({"cleanup.policy", "delete.retention.ms"} & set(self.topic_config))
            if fixed:
                raise ValueError(f"topic_config: {fixed} cannot be set: the log's topics are "
                                 "always compacted, and tombstones are kept for "
                                 "tombstone_retention (set that instead)")
        elif self.format != "avro":
            raise ValueError(f"format {self.format} is for backend kafka (what Kafka Connect "
                             "and other Kafka consumers read); a local log is read by cdc only: "
                             "remove format, or set backend: kafka")
        if self.schema_registry is not None and (self.backend != "kafka"
                                                 or self.format != "avro"):
            raise ValueError("schema_registry is for backend kafka with format avro (format "
                             "json carries each schema inline): remove it, or set those")
        if self.decimal_handling != "precise" and self.format != "json":
            raise Invalid("decimal_handling applies to format json only (format avro keeps "
                          "exact decimals, NaN included)", "remove it, or set format: json")
        if self.time_precision != "micro" and self.format != "json":
            raise Invalid(f"time_precision {self.time_precision} applies to format json only "
                          "(format avro keeps every time in microseconds)",
                          "remove it, or set format: json")
        return self


class ColumnSettings(_Strict):
    """``columns: {schema.table: ...}`` of a source: what of the table's rows may enter the log
    (:mod:`cdc.columns`)."""

    #: the only columns to keep (default: every column)
    include: list[str] | None = Field(None, min_length=1)
    #: columns to leave out
    exclude: list[str] = Field(default_factory=list)
    #: column -> ``hash``, ``mask``, ``mask(TEXT)``, ``truncate(N)`` or ``null``
    transforms: dict[str, str | None] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _rules_ok(self) -> ColumnSettings:
        from cdc.columns import parse_transform

        if self.include is not None and self.exclude:
            raise ValueError("set include or exclude, not both")
        for name, text in self.transforms.items():
            try:
                parse_transform(text)
            except ValueError as exc:
                raise ValueError(f"transforms.{name}: {exc}") from None
            if name in self.exclude or (self.include is not None and name not in self.include):
                raise ValueError(f"transforms.{name}: the column is left out, so it has nothing "
                                 "to transform (keep it, or drop the transform)")
        return self


def check_table_names(value: list[str]) -> list[str]:
    """``value`` if every entry is a schema-qualified table name, listed once; ``ValueError``
    naming the first that is not."""
    for index, table in enumerate(value):
        if not _TABLE_NAME.match(table):
            raise ValueError(
                f"table #{index + 1} {table!r} is not schema-qualified: write it as "
                "schema.table, e.g. public.orders (quote names with odd characters)"
            )
    if len(set(value)) != len(value):
        raise ValueError("lists a table twice")
    return value


class SourceConfig(_Strict):
    """What every source has, whatever its kind: the base of each kind's settings model, which
    its connector package declares and registers (:mod:`cdc.plugins`)."""

    #: the connector class, ``"module:Class"`` (set by each kind)
    connector: ClassVar[str]
    #: the URL schemes a ``dsn`` of this kind may have, the first one the usual (set by each
    #: kind; empty: not checked)
    dsn_schemes: ClassVar[tuple[str, ...]] = ()

    name: str
    kind: str
    dsn: SecretDsn
    #: name of an environment variable holding the password (never put it in the file)
    password_env: str | None = None
    tables: list[str] = Field(min_length=1)
    #: key columns for tables without a primary key
    keys: dict[str, list[str]] = Field(default_factory=dict)
    #: how often an idle source makes its server log something, so its stored position moves
    heartbeat_interval: Duration = Field(10.0, ge=0)
    #: memory for recent row images, used to complete rows with unsent (unchanged TOAST) values
    image_cache: Size = Field(48 * 1024**2, ge=0)
    #: per table (as in ``tables``): columns kept or left out and their transforms, applied
    #: before the log (cdc/columns.py)
    columns: dict[str, ColumnSettings] = Field(default_factory=dict)
    #: name of the environment variable holding the key of ``hash`` transforms (never logged)
    hash_key_env: str | None = None
    #: rows per chunk of an incremental snapshot (``cdc snapshot``, cdc/incremental.py)
    snapshot_chunk_size: int = Field(1024, ge=1, le=1_000_000)

    @field_validator("name")
    @classmethod
    def _name_ok(cls, value: str) -> str:
        if not _SOURCE_NAME.match(value):
            raise ValueError(
                "must start with a letter and hold only letters, digits, '_' or '-' (max 63)"
            )
        return value

    @field_validator("tables")
    @classmethod
    def _tables_ok(cls, value: list[str]) -> list[str]:
        return check_table_names(value)

    @field_validator("dsn")
    @classmethod
    def _dsn_kind(cls, value: Secret) -> Secret:
        """A URL-style DSN must name this kind's database (``dsn_schemes``)."""
        text = value.reveal().strip()
        if not cls.dsn_schemes or "://" not in text and not text.startswith("jdbc:"):
            return value  # a libpq ``key=value`` string, or a kind that says nothing
        scheme = text.split(":", 1)[0].lower()
        example = f"{cls.dsn_schemes[0]}://user@host:port/database"
        if scheme == "jdbc":
            raise Invalid("a JDBC URL: cdc connects with the database's own driver, not JDBC",
                          f"drop the `jdbc:` prefix and write it as {example}")
        if scheme not in cls.dsn_schemes:
            raise Invalid(f"a {scheme}:// connection string for a source of another kind",
                          f"write it as {example}, or set `kind:` to the database's kind")
        return value

    @model_validator(mode="after")
    def _keys_name_tables(self) -> SourceConfig:
        unknown = [table for table in self.keys if table not in self.tables]
        if unknown:
            raise ValueError(f"keys: names table(s) not in tables: {', '.join(unknown)}")
        unknown = [table for table in self.columns if table not in self.tables]
        if unknown:
            raise ValueError(f"columns: names table(s) not in tables: {', '.join(unknown)} "
                             "(write them exactly as under tables)")
        from cdc.columns import parse_transform

        hashes = any(parse_transform(t).kind == "hash"
                     for rules in self.columns.values() for t in rules.transforms.values())
        if hashes and not self.hash_key_env:
            raise ValueError("columns: a column is hashed, but hash_key_env is not set: name "
                             "the environment variable that holds the hash key")
        return self

    def has_column_rules(self, table: TableId) -> bool:
        """Whether ``table``'s rows are filtered or transformed before the log (the connector
        must then hand over typed events, never rows it encoded itself)."""
        return any(TableId.parse(text) == table for text in self.columns)

    def column_policies(self) -> Any:
        """The :class:`cdc.columns.ColumnPolicies` of this source, or None (reads the hash key
        from the environment: a missing one is a :class:`ConfigError`)."""
        from cdc.columns import ColumnPolicies

        return ColumnPolicies.from_settings(self.name, self.columns, self.hash_key_env)

    def password(self) -> str | None:
        """The password from ``password_env``, if configured and set."""
        return os.environ.get(self.password_env) if self.password_env else None


class FollowerConfig(_Strict):
    """What every follower kind has: what it follows and how ``cdc apply`` feeds it. The base
    of each kind's settings model, which its sink package declares and registers
    (:mod:`cdc.plugins`)."""

    #: the sink class, ``"module:Class"`` (set by each kind)
    sink: ClassVar[str]

    kind: str

    #: sources to follow (default: every source)
    sources: list[str] | None = Field(None, min_length=1)
    #: tables (schema.table) of those sources to follow (default: every table)
    tables: list[str] | None = Field(None, min_length=1)
    #: how long a deleted row's version marker stays (keep it >= log.tombstone_retention)
    tombstone_retention: Duration = Field(24 * 3600.0, ge=0)
    #: admission control: log records per micro-batch at most
    max_records_per_batch: int = Field(100_000, ge=1)
    #: continuous mode: a batch starts at most this often after a batch of 100 records or more
    #: (after a quieter one, as soon as the apply loop sees a change: it looks at the log every
    #: 50 ms). 50 ms for Redis and SQL (a batch costs them a progress record's fsync); search 250 ms
    #: (a Tantivy commit per shard), Delta 1 s (a MERGE per table)
    trigger_interval: Duration = Field(0.05, ge=0)
    #: no longer used (every batch of local mode runs in the follower's own process since the
    #: apply loop reads the log once for all followers); accepted so old configs still load
    driver_batch_records: int = Field(20_000, ge=0)
    #: the follower's progress folder: its progress record, how far into the log it has
    #: applied (spark_apply/progress.py; default: <log dir's parent>/state/apply/<follower>)
    checkpoint: Path | None = None
    #: how tasks read a micro-batch's records: ``log`` (the log contract, in Python),
    #: ``spark-kafka`` (Spark's Kafka source, Avro decoded in the JVM; Kafka logs only),
    #: ``auto`` (spark-kafka for a Kafka log, else log)
    reader: Literal["auto", "log", "spark-kafka"] = "auto"

    @field_validator("tables")
    @classmethod
    def _follower_tables_ok(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else check_table_names(value)

    def check_followed(self, name: str, tables: set[TableId]) -> None:
        """Raise ``ValueError`` naming the problem if this follower's own settings name tables
        outside ``tables`` (what follower ``name`` follows); nothing by default."""


class ViewConfig(_Strict):
    """``views: NAME:``: a view over one source's tables, written in the leader's SQL and kept
    current by ``cdc apply`` in its ``followers`` (``views/``, ``docs/views.md``)."""

    #: the source whose tables the view reads (one: views across two leaders are refused)
    source: str
    #: one SELECT in the leader's dialect (the same text runs on the leader for ``cdc verify``)
    sql: str = Field(min_length=1)
    #: the output columns that identify a row (an aggregate's GROUP BY columns)
    key: list[str] = Field(min_length=1)
    #: the followers that hold the view (any kind; their own tables are not affected)
    followers: list[str] = Field(min_length=1)
    #: admission control: log records per micro-batch at most
    max_records_per_batch: int = Field(100_000, ge=1)
    #: continuous mode: a micro-batch starts at most this often
    trigger_interval: Duration = Field(1.0, ge=0)
    #: the view's progress folder (spark_apply/progress.py; default: <log dir's
    #: parent>/state/apply/view-<name>)
    checkpoint: Path | None = None
    #: the view's state: its base tables' current rows (default: <log dir's
    #: parent>/state/views/<name>.duckdb)
    state: Path | None = None
    #: ``strict``: refuse the view when any of its constructs would be recomputed whole
    #: rather than maintained for the groups a batch touches (``auto``: recompute those)
    incremental: Literal["auto", "strict"] = "auto"
    #: the time zone of the view's session: ``timestamptz`` values are computed (``extract``,
    #: ``date_trunc``, casts to ``date``) and shown in it, as on a leader session with this
    #: ``TimeZone`` (MariaDB: ``time_zone``); an IANA name
    time_zone: str = "UTC"
    #: the most memory the view's state (its DuckDB) may use, in DuckDB's notation (``512MB``,
    #: ``2GB``); past it DuckDB spills to disk beside the state. One ``cdc apply`` holds every
    #: view's state it runs: their limits add up
    memory_limit: str = "1GB"

    @field_validator("memory_limit")
    @classmethod
    def _memory_limit_ok(cls, value: str) -> str:
        if not re.fullmatch(r"\s*\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*", value,
                            re.IGNORECASE):
            raise ValueError(f"memory_limit {value!r} is not an amount such as 512MB or 2GB")
        return value.strip()

    @field_validator("time_zone")
    @classmethod
    def _time_zone_ok(cls, value: str) -> str:
        import zoneinfo

        try:
            zoneinfo.ZoneInfo(value)
        except (ValueError, zoneinfo.ZoneInfoNotFoundError):
            raise ValueError(f"unknown time zone {value!r}: use an IANA name such as "
                             "Europe/Berlin or America/New_York, or UTC") from None
        return value

    #: what ``cdc apply`` asks of every follower-like entry
    kind: Literal["view"] = "view"
    reader: Literal["log"] = "log"
    tombstone_retention: float = 24 * 3600.0

    @property
    def sources(self) -> list[str]:
        return [self.source]

    @property
    def tables(self) -> None:
        """Read the source's topics; the view's sink keeps only its tables'."""
        return None


class SparkConfig(_Strict):
    """``spark:``: where ``cdc apply`` runs its Spark application."""

    #: Spark's master URL: ``local[N]`` (the embedded default, N cores of this machine) or a
    #: cluster's (``spark://host:7077``); ``cdc apply --master`` overrides it
    master: str = "local[2,3]"
    #: extra Spark settings (``spark.executor.memory: 1g``...); cdc's own defaults otherwise
    conf: dict[str, str] = Field(default_factory=dict)
    #: a folder of Spark's connector jars to use instead of the jar cache's (``cdc setup``
    #: fills that one; see cdc/jvm)
    jars_dir: Path | None = None
    #: hand the executors this installation's code and Python dependencies (spark.archives,
    #: spark_apply/ship.py): ``auto`` on a cluster master, not in local mode; ``never`` when
    #: every worker has the project installed itself
    ship: Literal["auto", "always", "never"] = "auto"

    @field_validator("master")
    @classmethod
    def _master(cls, value: str) -> str:
        value = value.strip()
        if not re.match(r"^(local(\[[^\]]+\])?|spark://\S+|yarn|k8s://\S+)$", value):
            raise ValueError(f"spark.master {value!r} is not a Spark master URL: use local[N] "
                             "or spark://host:port (also yarn, k8s://...)")
        return value

    @field_validator("conf", mode="before")
    @classmethod
    def _conf(cls, value: Any) -> Any:
        if isinstance(value, dict):
            bad = [k for k in value if not str(k).startswith("spark.")]
            if bad:
                raise ValueError(f"spark.conf: {bad} are not Spark settings (they start "
                                 "with spark.)")
            if "spark.master" in value:
                raise ValueError("spark.conf: set the master with spark.master (or cdc apply "
                                 "--master), not spark.conf")
            return {str(k): str(v) for k, v in value.items()}
        return value


class MetricsConfig(_Strict):
    """``metrics:``: the Prometheus endpoints (``/metrics``) of the daemons (docs/metrics.md).
    A port left unset serves nothing; ``--metrics-port`` on the command line overrides it."""

    #: ``cdc capture`` (and ``cdc bootstrap``)
    capture_port: int | None = Field(None, ge=1, le=65535)
    #: ``cdc apply``
    apply_port: int | None = Field(None, ge=1, le=65535)
    #: the address the endpoints listen on (``0.0.0.0``: every interface)
    address: str = "0.0.0.0"
    #: how often what costs a query is measured: source lag, log sizes, follower lag
    poll_interval: Duration = Field(5.0, ge=0.1, le=3600)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        import ipaddress

        try:
            ipaddress.ip_address(value.strip())
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address: use 0.0.0.0 (every interface), "
                             "127.0.0.1 (this machine only) or one of the machine's "
                             "addresses") from None
        return value.strip()

    @model_validator(mode="after")
    def _distinct_ports(self) -> MetricsConfig:
        if self.capture_port is not None and self.capture_port == self.apply_port:
            raise ValueError(f"capture_port and apply_port are both {self.capture_port}: "
                             "capture and apply each serve their own endpoint, so on one "
                             "machine they need different ports")
        return self


class Config(_Strict):
    """The whole file."""

    log: LogConfig = LogConfig()
    spark: SparkConfig = SparkConfig()
    metrics: MetricsConfig = MetricsConfig()
    #: each validated as its kind's registered model (:func:`config_model`)
    sources: list[SourceConfig] = Field(default_factory=list)
    followers: dict[str, FollowerConfig] = Field(default_factory=dict)
    views: dict[str, ViewConfig] = Field(default_factory=dict)
    #: where the file was read from (set by :func:`load_config`, not by the user)
    base_dir: Path = Field(default=Path("."), exclude=True)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its state, unpickled into this process's :func:`config_model` (the
        class is built at run time: plain pickle cannot find it by name)."""
        return (_config_from_state, (self.__getstate__(),))

    @model_validator(mode="after")
    def _unique_sources(self) -> Config:
        names = [source.name for source in self.sources]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise Invalid(f"source names must be unique; repeated: {', '.join(duplicates)}",
                          "give each source its own `name:` (it names the source's topics, "
                          "slot and stored position)")
        for name, follower in self.followers.items():
            self._check_follower(name, follower)
        for name, view in self.views.items():
            self._check_view(name, view)
        return self

    def _check_view(self, name: str, view: ViewConfig) -> None:
        if not _SOURCE_NAME.match(name):
            raise ValueError(f"views: the name {name!r} must start with a letter and hold only "
                             "letters, digits, '_' or '-' (max 63)")
        if name in self.followers:
            raise ValueError(f"views.{name}: a follower has the same name (`cdc apply` runs "
                             "both by name); rename one of them")
        known = [source.name for source in self.sources]
        if view.source not in known:
            raise ValueError(f"views.{name}.source: {view.source!r} is not under `sources:` "
                             f"(known: {', '.join(known) or 'none'})")
        unknown = [f for f in view.followers if f not in self.followers]
        if unknown:
            raise ValueError(f"views.{name}.followers: {unknown} are not under `followers:` "
                             f"(known: {', '.join(self.followers) or 'none'})")
        repeated = sorted({c for c in view.key if view.key.count(c) > 1})
        if repeated:
            raise ValueError(f"views.{name}.key: {repeated} repeated")

    def _check_follower(self, name: str, follower: FollowerConfig) -> None:
        if not _SOURCE_NAME.match(name):
            raise ValueError(f"followers: the name {name!r} must start with a letter and hold only "
                             "letters, digits, '_' or '-' (max 63)")
        known = {source.name: source for source in self.sources}
        unknown = [s for s in follower.sources or [] if s not in known]
        if unknown:
            raise ValueError(f"followers.{name}.sources: {unknown} are not under `sources:` "
                             f"(known: {', '.join(known) or 'none'})")
        followed = [known[s] for s in follower.sources or known]
        offered = {TableId.parse(t) for source in followed for t in source.tables}
        missing = [t for t in follower.tables or [] if TableId.parse(t) not in offered]
        if missing:
            raise ValueError(f"followers.{name}.tables: {missing} are not captured by the "
                             "follower's sources (add them to a source's tables, or remove "
                             "them here)")
        if follower.reader == "spark-kafka" and self.log.backend != "kafka":
            raise ValueError(f"followers.{name}.reader: spark-kafka reads only a Kafka log "
                             "(log.backend: kafka); use reader: log or auto")
        follower.check_followed(
            name, {TableId.parse(t) for t in follower.tables} if follower.tables else offered)

    @property
    def log_path(self) -> Path:
        path = self.log.path.expanduser()
        return path if path.is_absolute() else (self.base_dir / path).resolve()

    def follower(self, name: str) -> FollowerConfig | ViewConfig:
        """The follower or view called ``name``; :class:`ConfigError` listing the known ones."""
        if name in self.followers:
            return self.followers[name]
        if name in self.views:
            return self.views[name]
        known = ", ".join([*self.followers, *self.views]) or "none"
        raise ConfigError(f"no follower named {name!r} in the config (known: {known})",
                          "pass one of the names under `followers:` (add one: see "
                          "cdc.example.yaml)")

    def trimmed(self, name: str) -> Config:
        """A copy holding only what follower or view ``name`` needs to be written: its own
        settings (a view: its settings and its followers'), the sources it follows, the log —
        what ``cdc apply`` ships to the process or executor task that writes it, never the
        other followers' settings."""
        if name in self.views:
            view = self.views[name]
            followers = {f: self.followers[f] for f in view.followers if f in self.followers}
            views = {name: view}
            wanted = {view.source}
        else:
            followers = {name: self.follower(name)}  # type: ignore[dict-item]
            views = {}
            wanted = set(self.follower_sources(name))
        sources = [source for source in self.sources if source.name in wanted]
        return self.model_copy(update={"followers": followers, "views": views,
                                       "sources": sources})

    def follower_sources(self, name: str) -> list[str]:
        """The source names follower ``name`` follows (every source by default)."""
        chosen = self.follower(name).sources
        return list(chosen) if chosen else [source.name for source in self.sources]

    def follower_topics(self, name: str) -> dict[str, tuple[str, TableId]]:
        """Topic -> (source, table) of every table follower ``name`` follows."""
        follower = self.follower(name)
        wanted = {TableId.parse(t) for t in follower.tables} if follower.tables else None
        out: dict[str, tuple[str, TableId]] = {}
        for source_name in self.follower_sources(name):
            for text in self.source(source_name).tables:
                table = TableId.parse(text)
                if wanted is None or table in wanted:
                    out[topic_name(source_name, table)] = (source_name, table)
        return out

    def follower_checkpoint(self, name: str) -> Path:
        """The progress folder of follower or view ``name`` (relative paths: against
        the config file's directory)."""
        path = self.follower(name).checkpoint
        if path is None:
            folder = f"view-{name}" if name in self.views else name
            return self.log_path.parent / "state" / "apply" / folder
        return self.resolve(path)

    def view_state(self, name: str) -> Path:
        """The DuckDB file holding view ``name``'s state."""
        path = self.views[name].state
        if path is None:
            return self.log_path.parent / "state" / "views" / f"{name}.duckdb"
        return self.resolve(path)

    def resolve(self, path: Path) -> Path:
        """``path`` with ``~`` expanded, relative to the config file's directory."""
        path = path.expanduser()
        return path if path.is_absolute() else (self.base_dir / path).resolve()

    def source(self, name: str) -> SourceConfig:
        for source in self.sources:
            if source.name == name:
                return source
        known = ", ".join(s.name for s in self.sources) or "none"
        raise ConfigError(f"no source named {name!r} in the config (known: {known})",
                          "pass one of the names under `sources:`")


# --------------------------------------------------------------------------- loading and errors

_FIX_BY_TYPE = {
    "missing": "add the key",
    "int_parsing": "write a whole number",
    "int_type": "write a whole number",
    "bool_parsing": "write true or false",
    "literal_error": "use one of the allowed values",
    "greater_than_equal": "raise the value",
    "less_than_equal": "lower the value",
    "too_short": "add at least one entry",
    "list_type": "write a YAML list, e.g. [a, b]",
    "model_type": "write a mapping of key: value pairs",
    "dict_type": "write a mapping of key: value pairs",
    "string_type": "write a string",
}


@functools.cache
def source_kinds() -> dict[str, type[SourceConfig]]:
    """Source kind -> its settings model, as registered (:mod:`cdc.plugins`)."""
    return plugins.registered(plugins.SOURCE_GROUP, SourceConfig)


@functools.cache
def follower_kinds() -> dict[str, type[FollowerConfig]]:
    """Follower kind -> its settings model, as registered (:mod:`cdc.plugins`)."""
    return plugins.registered(plugins.FOLLOWER_GROUP, FollowerConfig)


def _one_of(models: dict[str, Any], base: type[BaseModel]) -> Any:
    """The type of one entry: the registered models, told apart by ``kind``."""
    if not models:
        return base
    if len(models) == 1:  # pydantic's discriminator needs a union: one model is its own type
        return next(iter(models.values()))
    return Annotated[Union[tuple(models.values())], Field(discriminator="kind")]  # noqa: UP007


@functools.cache
def config_model() -> type[Config]:
    """:class:`Config` with ``sources`` and ``followers`` validated as the kinds registered
    now (built once per process; :func:`forget_kinds` after installing a plugin at run time)."""
    source: Any = _one_of(source_kinds(), SourceConfig)
    follower: Any = _one_of(follower_kinds(), FollowerConfig)
    model: type[Config] = create_model(
        "Config", __base__=Config, __module__=__name__,
        sources=(list[source], Field(default_factory=list)),
        followers=(dict[str, follower], Field(default_factory=dict)))
    return model


def _config_from_state(state: dict[Any, Any]) -> Config:
    """A pickled :class:`Config` (:meth:`Config.__reduce__`) rebuilt."""
    model = config_model()
    config = model.__new__(model)
    config.__setstate__(state)
    return config


def forget_kinds() -> None:
    """Look the registered kinds up again at the next config read."""
    for cached in (source_kinds, follower_kinds, config_model):
        cached.cache_clear()


def _kinds_of(section: str) -> tuple[str, list[str]]:
    """What an entry of ``section`` is called, and its registered kinds."""
    if section == "followers":
        return "follower", list(follower_kinds())
    if section == "sources":
        return "source", list(source_kinds())
    return "entry", []


def _tagged_model(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model of the union member whose tag pydantic put into ``loc`` after a follower's
    name or a source's index (``followers.cache.redis.url``, ``sources.0.mysql.dsn``)."""
    if len(loc) < 3:
        return None
    kinds: dict[str, type[BaseModel]] = {}
    if loc[0] == "followers":
        kinds.update(follower_kinds())
    elif loc[0] == "sources":
        kinds.update(source_kinds())
    return kinds.get(str(loc[2])) if len(kinds) > 1 else None


def _untagged(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """``loc`` without the union tag (``followers.cache.redis.url`` -> ``followers.cache.url``,
    ``sources.0.mysql.dsn`` -> ``sources[0].dsn``)."""
    return loc[:2] + loc[3:] if _tagged_model(loc) is not None else loc


def _key_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "(top level)"


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = _tagged_model(loc)
    if model is not None:
        loc = loc[3:]
    else:
        model = Config
    for part in loc:
        if model is None or isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return model
        annotation = field.annotation
        args = getattr(annotation, "__args__", ())
        candidates = [annotation, *args]
        model = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
    return model


def _describe(error: Any) -> str:
    loc = tuple(error["loc"])
    key = _key_path(_untagged(loc))
    kind = error["type"]
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        known = sorted(parent.model_fields) if parent else []
        known = [k for k in known if k != "base_dir"]
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
        return f"{key}: unknown key\n  fix: remove it or correct the spelling ({hint})"
    message = str(error["msg"]).removeprefix("Value error, ")
    fix = _FIX_BY_TYPE.get(kind, "correct the value")
    raised = (error.get("ctx") or {}).get("error")
    if isinstance(raised, Invalid):
        fix = raised.fix
    what, kinds = _kinds_of(str(loc[0]) if loc else "")
    named = _either(kinds)
    if kind == "union_tag_not_found":
        key, message = f"{key}.kind", f"missing: every {what} needs a kind"
        fix = f"add `kind:` ({named})"
    elif kind == "union_tag_invalid":
        given = str(error["input"].get("kind"))
        key, message = f"{key}.kind", f"unknown {what} kind {given!r}"
        close = difflib.get_close_matches(given, kinds, n=1)
        fix = f"set `kind:` to {named}" + (f" (did you mean {close[0]!r}?)" if close else "")
    if kind == "missing" and loc and loc[-1] == "sources":
        fix = "add a `sources:` list naming the databases to capture"
    return f"{key}: {message}\n  fix: {fix}"


def _either(kinds: list[str]) -> str:
    """``'a', 'b' or 'c'``: the registered kinds, for a fix."""
    quoted = [repr(k) for k in kinds] or ["none registered (is the project installed?)"]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def parse_config(data: Any, base_dir: Path, origin: str = "config") -> Config:
    """Validate already-parsed YAML data; raise :class:`ConfigError` listing every problem."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: the top level must be a mapping (log:, sources:)",
                          "start the file with `log:` and `sources:` keys")
    if "base_dir" in data:
        raise ConfigError(f"{origin}: base_dir: unknown key", "remove it")
    try:
        return config_model().model_validate({**data, "base_dir": base_dir})
    except ValidationError as exc:
        details = "\n".join(_describe(error) for error in exc.errors())
        count = len(exc.errors())
        raise ConfigError(
            f"{origin}: {count} problem{'s' if count > 1 else ''} in the configuration:\n"
            f"{details}"
        ) from None


def load_config(path: str | Path | None = None) -> Config:
    """Read and validate the YAML file at ``path`` (default ``$CDC_CONFIG`` or ``./cdc.yaml``)."""
    file = Path(path or os.environ.get("CDC_CONFIG") or DEFAULT_CONFIG_NAME)
    if not file.exists():
        raise ConfigError(f"config file {file} does not exist",
                          "pass --config PATH or create cdc.yaml (see README.md)")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {file}: {exc.__class__.__name__}",
                          "check the path and its permissions; it must be UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{file}: not valid YAML{where}: {problem}",
                          "fix the YAML syntax (indentation, colons, quotes)") from None
    return parse_config(data, file.resolve().parent, origin=str(file))
