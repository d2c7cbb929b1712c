"""The Delta Lake warehouse follower: one Delta table per followed table, written with
``deltalake`` (no JVM) behind the version gate.

Layout (names exact; ``docs/followers.md`` has examples):

``<root>/<topic, escaped>/``
    One Delta table per topic (``<source>.<schema>.<table>``; in the directory name every
    character but letters, digits and ``._-`` is ``~XX`` per UTF-8 byte (:func:`table_dir`),
    so quotes, spaces and dots in identifiers are safe). Created at the first batch that
    touches the topic. Partitioned by ``_cdc_bucket``.
``<root>/_cdc_watermarks.json``
    Per source, the source offset applied up to and its order
    (:meth:`DeltaSink.set_watermark`).

Columns of a table: the source table's columns under their original names (the value schema's
``cdc.column``), typed by the column's logical kind (``cdc/logical.py``) in the topic's newest
Avro value schema in the log's schema store, or without a schema by the kind guessed from the
batch's values: ``BOOLEAN`` -> boolean; ``INT16``/``INT32``/``INT64`` -> long; ``FLOAT64`` ->
double (NaN and ±Infinity kept); any other kind -> string holding
:func:`~cdc.sink.canonical_text` of the JSON form (:func:`delta_kind`). Reserved columns (a
source column with one of these names, compared without case, is refused with
:class:`DeltaSinkError`):

``_cdc_key`` (string)       the key's JSON text (``{"id":42}``)
``_cdc_bucket`` (int)       ``crc32(key UTF-8) % buckets`` — the partition column
``_cdc_position`` (string)  lowercase hex of the position bytes (hex orders like the bytes)
``_cdc_deleted`` (boolean)  true for a delete marker (data columns NULL)
``_cdc_applied_ms`` (long)  wall clock (ms) when the row was last written; used by retention

``scd2`` tables also have ``valid_from``/``valid_to`` (timestamp, UTC, from the records' commit
times ``ts_ms``), ``is_current`` (boolean), ``_cdc_end_position`` (string: the position of the
record that ended the version) and ``_cdc_op`` (string: ``c``/``u``/``r``, ``d`` on markers).

Semantics, stated exactly:

* **scd1** (``folds = True``: at most one change per key). One MERGE per table per batch on
  ``bucket + key``: an existing row is replaced (every column, NULL where the change has none)
  only if ``s._cdc_position > t._cdc_position`` (the gate); a key without a row is inserted. A
  delete or tombstone writes a *marker row* (``_cdc_deleted`` true, data columns NULL, its
  position), so a late older record cannot resurrect the row. :meth:`vacuum` drops markers older
  than ``tombstone_retention``.
* **scd2** (``folds = False``: every record of the batch, ordered per key by position). Per key,
  records whose position is not greater than the newest position the table knows for the key
  (the max of its rows' ``_cdc_position`` and ``_cdc_end_position``) are skipped. Each remaining
  c/u/r record closes the key's open version (``valid_to`` = the record's commit time,
  ``is_current`` false, ``_cdc_end_position`` = its position) and becomes the new current row
  (``valid_from`` = its commit time). A delete or tombstone closes the open version and adds no
  row; with no open version it adds a marker row (``_cdc_deleted`` true, ``is_current`` false,
  ``valid_from = valid_to``, ``_cdc_end_position = _cdc_position``) so that the gate remembers
  it. A record without a commit time uses the wall clock at apply. The batch is one MERGE per
  table (new rows inserted, closed rows updated, matched on bucket + key + position): a crash
  leaves a table old or new, and re-applying a batch adds nothing.
* **Schema changes.** The table's columns only grow: a column added upstream is added to the
  table (older rows NULL; deltalake's schema merge); a dropped column stays and is NULL in rows
  written after the drop; a rename is a drop plus an add. A retype whose Delta type differs
  (``integer -> text``, ``bigint -> double``...), or a value that does not fit its column's type,
  turns the column into a string column holding the canonical text of every value, old rows
  included (the table is rewritten once, in one commit). A string column stays a string column.
* **Reading.** :meth:`read`/:meth:`keys` return the live rows (scd1: not markers; scd2:
  ``is_current``) as ``{column: canonical text}`` of the non-null columns — exactly what
  :func:`~cdc.sink.row_text` gives for the leader's JSON row. :func:`current_files` lists the
  live parquet files for readers without Delta support (Spark without Delta's jars, DuckDB).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import json
import math
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from cdc.errors import CdcError
from cdc.events import TableId
from cdc.log.open import log_settings
from cdc.logical import LogicalKind, guess_kind, logical_columns
from cdc.preflight import Step, writable_place
from cdc.sink import (
    ApplyStats,
    Change,
    Placement,
    Sink,
    Topics,
    canonical_text,
    cell_text,
    key_group,
    newest_per_key,
)
from cdc.types import SPECIAL_FLOATS
from sinks.delta_settings import DeltaFollowerConfig
from sinks.watermarks import WatermarkFile, replace_file

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from rich.table import Table

    from cdc.config import Config, FollowerConfig
    from cdc.log.base import SchemaRegistry

KEY = "_cdc_key"
BUCKET = "_cdc_bucket"
POSITION = "_cdc_position"
DELETED = "_cdc_deleted"
APPLIED = "_cdc_applied_ms"
VALID_FROM = "valid_from"
VALID_TO = "valid_to"
IS_CURRENT = "is_current"
END_POSITION = "_cdc_end_position"
OP = "_cdc_op"
#: a helper column of the scd2 MERGE source (never written to the table)
_CLOSE = "_cdc_close"
WATERMARK_FILE = "_cdc_watermarks.json"

_TIMESTAMP = pa.timestamp("us", tz="UTC")
SCD1_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    (KEY, pa.string()), (BUCKET, pa.int32()), (POSITION, pa.string()), (DELETED, pa.bool_()),
    (APPLIED, pa.int64()))
SCD2_COLUMNS: tuple[tuple[str, pa.DataType], ...] = SCD1_COLUMNS + (
    (VALID_FROM, _TIMESTAMP), (VALID_TO, _TIMESTAMP), (IS_CURRENT, pa.bool_()),
    (END_POSITION, pa.string()), (OP, pa.string()))

Mode = Literal["scd1", "scd2"]
_T = TypeVar("_T")
#: a data column's type: what its values are stored as
Kind = Literal["bool", "int64", "float64", "string"]
_ARROW: dict[str, pa.DataType] = {"bool": pa.bool_(), "int64": pa.int64(),
                                  "float64": pa.float64(), "string": pa.string()}
#: logical kind -> the kind of its column (any other: string)
_KINDS: dict[LogicalKind, Kind] = {LogicalKind.BOOLEAN: "bool", LogicalKind.INT16: "int64",
                                   LogicalKind.INT32: "int64", LogicalKind.INT64: "int64",
                                   LogicalKind.FLOAT64: "float64"}
_INT64 = (-(2**63), 2**63 - 1)
_PATH_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
#: how often a MERGE that lost a commit race (e.g. to `cdc warehouse vacuum`) is retried
_COMMIT_RETRIES = 5


#: the table's cdc settings beside its ``_delta_log`` (written before the table is created; a
#: name starting with ``_`` is never touched by Delta's vacuum)
SETTINGS_FILE = "_cdc_table.json"


class DeltaSinkError(CdcError):
    """The Delta warehouse follower cannot write or read its tables."""


# --------------------------------------------------------------------------------- layout

def table_dir(root: Path, topic: str) -> Path:
    """The directory of ``topic``'s table under ``root``: letters, digits and ``._-`` stay,
    every other character becomes ``~XX`` per UTF-8 byte (``src.My Schema.we.ird"name`` ->
    ``src.My~20Schema.we.ird~22name``). Not ``%XX``: deltalake percent-decodes paths."""
    return root / "".join(char if char in _PATH_SAFE else
                          "".join(f"~{byte:02X}" for byte in char.encode())
                          for char in topic)


def bucket_of(key: str, buckets: int) -> int:
    """The bucket of a key's JSON text: :func:`~cdc.sink.key_group` of its UTF-8 bytes."""
    return key_group(key.encode(), buckets)


def reserved_columns(mode: Mode) -> tuple[str, ...]:
    """The column names the follower keeps for itself in ``mode``."""
    return tuple(name for name, _ in (SCD2_COLUMNS if mode == "scd2" else SCD1_COLUMNS))


def current_files(table_path: str | Path) -> list[str]:
    """The parquet files of the table's current version (absolute paths), for readers without
    Delta support: ``spark.read.option("mergeSchema", "true").parquet(*files)`` or DuckDB's
    ``read_parquet(files, union_by_name = true)``. The files do not hold ``_cdc_bucket`` (a
    partition column lives in the directory names ``_cdc_bucket=N``). Empty for a table that
    does not exist."""
    from deltalake import DeltaTable

    path = Path(table_path)
    if not (path / "_delta_log").is_dir():
        return []
    return [str(name).removeprefix("file://") for name in DeltaTable(str(path)).file_uris()]


# ---------------------------------------------------------------------------------- types

def delta_kind(kind: LogicalKind) -> Kind:
    """The kind of column that holds values of logical kind ``kind`` (the module docstring)."""
    return _KINDS.get(kind, "string")


def value_types(values: Sequence[Any]) -> set[type]:
    """The Python types of the non-null values."""
    types = set(map(type, values))
    types.discard(type(None))
    return types


def kind_array(kind: Kind, values: Sequence[Any],
               types: set[type] | None = None) -> pa.Array | None:
    """The Arrow array of a ``kind`` column holding ``values`` (JSON forms; their
    :func:`value_types` are ``types``, if known), or ``None`` when a non-null value does not
    fit exactly: ``bool`` takes booleans, ``int64`` integers in its range (not booleans),
    ``float64`` floats and the strings ``NaN``/``Infinity``/``-Infinity``; ``string`` takes
    everything, as :func:`~cdc.sink.canonical_text`."""
    if types is None:
        types = value_types(values)
    if kind == "string":
        if not types <= {str}:
            values = [None if value is None else canonical_text(value) for value in values]
        return pa.array(values, pa.string())
    if kind == "bool":
        return pa.array(values, pa.bool_()) if types <= {bool} else None
    if kind == "int64":
        if not types <= {int}:
            return None
        try:
            return pa.array(values, pa.int64())
        except (OverflowError, pa.ArrowException):  # beyond 64 bits
            return None
    if types <= {float}:
        return pa.array(values, pa.float64())
    if types <= {float, str} and all(
            value in SPECIAL_FLOATS for value in values if type(value) is str):
        return pa.array([SPECIAL_FLOATS[value] if type(value) is str else value
                         for value in values], pa.float64())
    return None


def fits(kind: Kind, values: Sequence[Any]) -> bool:
    """Whether every non-null value of ``values`` fits a ``kind`` column (see
    :func:`kind_array`)."""
    return kind_array(kind, values) is not None


def column_array(kind: Kind, values: Sequence[Any]) -> pa.Array:
    """The Arrow array of a ``kind`` column holding ``values`` (JSON forms that fit)."""
    array = kind_array(kind, values)
    if array is None:  # pragma: no cover - the column plan checked every value
        raise ValueError(f"a value does not fit a {kind} column")
    return array


_EMPTY: Mapping[str, Any] = {}


def row_columns(images: Sequence[Mapping[str, Any] | None],
                names: Sequence[str] | None = None) -> dict[str, list[Any]]:
    """Per column (``names``, or every column any image has, in order of appearance), its
    values aligned with ``images`` (``None`` where an image lacks it or is ``None``)."""
    rows = [_EMPTY if image is None else image for image in images]
    if names is None:
        names = list(dict.fromkeys(itertools.chain.from_iterable(rows)))
    return {name: [row.get(name) for row in rows] for name in names}


def kind_of_arrow(data_type: pa.DataType) -> Kind:
    if pa.types.is_boolean(data_type):
        return "bool"
    if pa.types.is_integer(data_type):
        return "int64"
    if pa.types.is_floating(data_type):
        return "float64"
    return "string"


# ---------------------------------------------------------------------------------- state

@dataclass
class _Table:
    """One topic's Delta table as this sink knows it."""

    topic: str
    path: Path
    mode: Mode
    buckets: int
    table: DeltaTable | None = None
    #: data columns -> kind, as in the table's schema
    columns: dict[str, Kind] = field(default_factory=dict)
    #: (version, live rows) cached for read()/keys()
    live: tuple[int, pa.Table] | None = None
    #: the table's description (the cdc settings, JSON), restored when a commit drops it
    description: str = ""


@dataclass
class MaintenanceResult:
    """What ``vacuum``/``optimize`` did to one table."""

    topic: str
    path: Path
    live_files_before: int = 0
    live_files_after: int = 0
    disk_files_before: int = 0
    disk_files_after: int = 0
    rows: int = 0
    markers_dropped: int = 0
    seconds: float = 0.0


def _disk_files(path: Path) -> int:
    """Data files (parquet) under a table directory, referenced or not (the log not counted)."""
    return sum(1 for file in path.rglob("*.parquet") if "_delta_log" not in file.parts)


@contextlib.contextmanager
def _delta_errors(follower: str, what: str, path: Path) -> Iterator[None]:
    """Turn deltalake's and the filesystem's errors into :class:`DeltaSinkError`."""
    from deltalake.exceptions import CommitFailedError, DeltaError

    try:
        yield
    except (CdcError, CommitFailedError):
        raise
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise DeltaSinkError(f"follower {follower}: cannot {what} at {path}: the disk is "
                                 "full", "free space on the warehouse's filesystem, then run "
                                 "`cdc apply` again (it replays the batch)") from None
        raise DeltaSinkError(f"follower {follower}: cannot {what} at {path}: "
                             f"{exc.strerror or exc}",
                             "make the directory writable by this user, or set the "
                             f"follower's path elsewhere (followers.{follower}.path)") from None
    except Exception as exc:
        # deltalake raises DeltaError, pyarrow ArrowException, and plain Exception ("External
        # error: ..."); anything else is a bug and keeps its traceback
        if not isinstance(exc, DeltaError | pa.ArrowException) and type(exc) is not Exception:
            raise
        first = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0][:400]
        if "Duplicate field name" in str(exc):
            raise DeltaSinkError(f"follower {follower}: cannot {what} at {path}: {first}",
                                 "Delta column names ignore case, so two source columns "
                                 "that differ only in case cannot both be followed: rename "
                                 "one, or leave the table out of the follower's tables"
                                 ) from None
        if "No space left" in str(exc):
            raise DeltaSinkError(f"follower {follower}: cannot {what} at {path}: the disk is "
                                 "full", "free space on the warehouse's filesystem, then run "
                                 "`cdc apply` again (it replays the batch)") from None
        raise DeltaSinkError(f"follower {follower}: cannot {what} at {path}: {first}",
                             "check the table directory (it must be a Delta table written by "
                             "this follower) and the disk; `cdc apply` replays the batch "
                             "once fixed") from None


# ----------------------------------------------------------------------------------- sink

class DeltaSink(Sink):
    """A Delta warehouse follower (layout, gate and schema rules: the module docstring).

    ``tables`` maps topics to ``(source, TableId)`` (for messages; any topic gets a table);
    ``buckets`` applies to tables created from now on (an existing table keeps the count it was
    created with, stored in its description); ``log_path`` is the change log's directory, whose
    schema store gives column types.
    """

    @classmethod
    def from_settings(cls, config: Config, name: str, settings: FollowerConfig,
                      topics: Topics) -> DeltaSink:
        assert isinstance(settings, DeltaFollowerConfig)
        return cls(name, config.resolve(settings.path), tables=topics, mode=settings.mode,
                   buckets=settings.buckets, tombstone_retention=settings.tombstone_retention,
                   log_path=config.log_path, log=log_settings(config))

    def __init__(self, name: str, root: Path, *, tables: Mapping[str, tuple[str, TableId]],
                 mode: Mode = "scd1", buckets: int = 16,
                 tombstone_retention: float = 24 * 3600.0, log_path: Path | None = None,
                 log: Mapping[str, Any] | None = None) -> None:
        if mode not in ("scd1", "scd2"):
            raise DeltaSinkError(f"follower {name}: unknown mode {mode!r}",
                                 "set mode to scd1 or scd2")
        self.name = name
        self.root = Path(root)
        self.tables = dict(tables)
        self.mode: Mode = mode
        self.folds = mode == "scd1"
        self.buckets = max(1, int(buckets))
        self.tombstone_retention = float(tombstone_retention)
        self.log_path = None if log_path is None else Path(log_path)
        #: the change log's settings (``cdc.log.open.log_settings``); default: a local log at
        #: ``log_path``
        self.log_settings = dict(log) if log is not None else (
            None if log_path is None else {"backend": "local", "path": str(log_path)})
        self.reserved = reserved_columns(mode)
        self._reserved_folded = {name.casefold() for name in self.reserved}
        self._store: SchemaRegistry | None = None
        self._state: dict[str, _Table] = {}
        self._owner_buckets: dict[str, int] = {}

    # ------------------------------------------------------------------------- checking
    def check(self) -> None:
        """The root directory exists (or is created) and is writable, and every existing table
        of the followed topics was written in this follower's mode; :class:`DeltaSinkError`
        with the fix otherwise."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.root, prefix=".cdc-probe-"):
                pass
        except OSError as exc:
            raise DeltaSinkError(f"follower {self.name}: the warehouse directory {self.root} "
                                 f"is not writable ({exc.strerror or exc})",
                                 "create it and make it writable by this user, or set "
                                 f"followers.{self.name}.path elsewhere") from None
        for topic in self.tables:
            self._open(topic)

    def preflight(self) -> list[Step]:
        return [Step("directory", lambda: writable_place(
            self.root, f"followers.{self.name}.path", "create it and make it writable by this "
            f"user, or set followers.{self.name}.path elsewhere"))]

    def close(self) -> None:
        self._state.clear()

    #: tasks own whole buckets (a bucket is a file partition: two writers there would race)
    placement = Placement.BY_OWNER

    def owner_groups(self, topic: str) -> int:
        """The table's bucket count: a bucket (a file partition) has one writer."""
        buckets = self._owner_buckets.get(topic)
        if buckets is None:
            state = self._open(topic)
            buckets = self._owner_buckets[topic] = (state.buckets if state is not None
                                                    else self.buckets)
        return buckets

    def owner(self, topic: str, key: bytes, writers: int) -> int:
        """The task of ``key``'s bucket (``bucket % writers``)."""
        return key_group(key, self.owner_groups(topic)) % writers

    def refresh(self) -> None:
        """Tables are re-read at the next write: other tasks committed since."""
        self._state.clear()
        self._owner_buckets.clear()

    # ---------------------------------------------------------------------- table state
    def table_path(self, topic: str) -> Path:
        return table_dir(self.root, topic)

    def _open(self, topic: str) -> _Table | None:
        """The topic's table if it exists on disk (loaded once, then kept)."""
        state = self._state.get(topic)
        if state is not None and state.table is not None:
            return state
        path = self.table_path(topic)
        if not (path / "_delta_log").is_dir():
            return None
        from deltalake import DeltaTable

        with _delta_errors(self.name, "open the Delta table", path):
            table = DeltaTable(str(path))
            info, description = self._description(table, path)
        if info.get("mode") != self.mode:
            raise DeltaSinkError(
                f"follower {self.name}: the table at {path} was written in mode "
                f"{info.get('mode')}, but the follower is configured with mode {self.mode}",
                f"set followers.{self.name}.mode back to {info.get('mode')}, or give the "
                f"follower a new path (scd1 and scd2 tables hold different columns)")
        state = _Table(topic, path, self.mode, int(info["buckets"]), table,
                       description=description)
        self._load_columns(state)
        self._state[topic] = state
        return state

    def _description(self, table: DeltaTable, path: Path) -> tuple[dict[str, Any], str]:
        """The cdc settings of the table and their text: from the table's description, else
        from :data:`SETTINGS_FILE` beside its log (a schema-merging MERGE of deltalake drops
        the description; :meth:`_keep_description` puts it back, a crash in between leaves
        only the file)."""
        texts = [table.metadata().description or ""]
        with contextlib.suppress(OSError):
            texts.append((path / SETTINGS_FILE).read_text())
        for text in texts:
            try:
                info = json.loads(text)["cdc"]
                int(info["buckets"])
                return dict(info), text
            except (ValueError, KeyError, TypeError):
                continue
        raise DeltaSinkError(f"follower {self.name}: {path} is a Delta table this "
                             "follower did not create (its description lacks the cdc "
                             "settings)", "move it away, or give the follower another path")

    @staticmethod
    def _keep_description(state: _Table) -> None:
        """Put the cdc settings back into the table's description if the last commit dropped
        them (deltalake's MERGE with a schema merge does)."""
        assert state.table is not None
        if state.description and state.table.metadata().description != state.description:
            state.table.alter.set_table_description(state.description)

    def _load_columns(self, state: _Table) -> None:
        assert state.table is not None
        schema = pa.schema(state.table.schema().to_arrow())
        state.columns = {f.name: kind_of_arrow(f.type) for f in schema
                         if f.name not in self.reserved}

    def _create(self, topic: str, columns: Mapping[str, Kind]) -> _Table:
        """Create ``topic``'s table: the reserved columns, then ``columns`` in order."""
        from deltalake import DeltaTable

        path = self.table_path(topic)
        description = json.dumps({"cdc": {"follower": self.name, "topic": topic,
                                          "mode": self.mode, "buckets": self.buckets}})
        schema = pa.schema([*(SCD2_COLUMNS if self.mode == "scd2" else SCD1_COLUMNS),
                            *((name, _ARROW[kind]) for name, kind in columns.items())])
        with _delta_errors(self.name, "create the Delta table", path):
            path.mkdir(parents=True, exist_ok=True)
            if not (path / SETTINGS_FILE).exists():
                replace_file(path / SETTINGS_FILE, description)
            try:
                DeltaTable.create(str(path), schema, mode="ignore", partition_by=[BUCKET],
                                  description=description)
            except Exception:
                # another task created it at the same moment: use theirs
                if not (path / "_delta_log" / "00000000000000000000.json").exists():
                    raise
        self._state.pop(topic, None)
        state = self._open(topic)
        if state is None:  # pragma: no cover - create() returned without a log
            raise DeltaSinkError(f"follower {self.name}: creating {path} left no Delta log",
                                 "check the directory and the disk")
        return state

    def declare(self, topic: str, columns: Mapping[str, LogicalKind],
                key: Sequence[str]) -> None:
        if self._open(topic) is None:
            self._create(topic, {column: delta_kind(kind) for column, kind in columns.items()})

    def _schema_store(self) -> SchemaRegistry | None:
        if self._store is None:
            from cdc.log.open import schema_store_from

            self._store = schema_store_from(self.log_settings)
        return self._store

    def declared_columns(self, topic: str) -> tuple[dict[str, Kind], list[str]]:
        """From the schema store: every column any value schema version of ``topic`` had, with
        its kind in the newest version holding it, and the newest version's columns."""
        store = self._schema_store()
        kinds: dict[str, Kind] = {}
        newest: list[str] = []
        if store is None:
            return kinds, newest
        for registered in store.versions(f"{topic}-value"):
            newest = []
            for column, logical in logical_columns(registered.schema).items():
                kinds[column] = delta_kind(logical.kind)
                newest.append(column)
        return kinds, newest

    # ---------------------------------------------------------------------------- apply
    def apply(self, changes: Sequence[Change]) -> ApplyStats:
        """Apply ``changes`` (scd1: at most one per key; scd2: every record, in position order
        per key): one MERGE per touched table. Returns written/deleted/skipped as stated in the
        module docstring."""
        stats = ApplyStats()
        by_topic: dict[str, list[Change]] = {}
        for change in changes:
            by_topic.setdefault(change.topic, []).append(change)
        for topic, batch in by_topic.items():
            one = self._with_retries(topic, batch)
            stats.written += one.written
            stats.deleted += one.deleted
            stats.skipped += one.skipped
        return stats

    def _with_retries(self, topic: str, batch: list[Change]) -> ApplyStats:
        return self._retrying(topic, lambda: self._apply_topic(topic, batch))

    def _retrying(self, topic: str, work: Callable[[], _T]) -> _T:
        """``work()``, redone from a fresh read of the table when its commit loses a race with
        another writer (a `cdc warehouse` run beside `cdc apply`, or the reverse)."""
        from deltalake.exceptions import CommitFailedError

        for attempt in range(_COMMIT_RETRIES):
            try:
                return work()
            except CommitFailedError as exc:
                self._state.pop(topic, None)
                if attempt == _COMMIT_RETRIES - 1:
                    raise DeltaSinkError(
                        f"follower {self.name}: a commit to {self.table_path(topic)} lost "
                        f"{_COMMIT_RETRIES} races with other writers in a row "
                        f"({str(exc).splitlines()[0][:200]})",
                        "run one `cdc apply` per follower; then run the command again") from None
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    def _apply_topic(self, topic: str, batch: list[Change]) -> ApplyStats:
        state = self._open(topic)
        given = len(batch)
        if self.mode == "scd1":
            batch = list(newest_per_key(batch))  # MERGE: one source row per target row
        arrays: dict[str, pa.Array] = {}
        columns = self._plan_columns(topic, state, row_columns([c.row for c in batch]),
                                     len(batch), arrays)
        if state is None:
            state = self._create(topic, columns)
        with _delta_errors(self.name, "write the Delta table", state.path):
            if self.mode == "scd1":
                stats = self._merge_scd1(state, batch, arrays)
            else:
                stats = self._merge_scd2(state, batch, columns)
        stats.skipped += given - len(batch)  # folded away here: older than their key's newest
        self._load_columns(state)
        return stats

    # --------------------------------------------------------------------- column plans
    def _plan_columns(self, topic: str, state: _Table | None, cells: dict[str, list[Any]],
                      rows: int, arrays: dict[str, pa.Array]) -> dict[str, Kind]:
        """The data columns (and their kinds) the table has after a batch whose rows hold
        ``cells`` (:func:`row_columns` of its ``rows`` images), in order; widens the table's
        columns to string first when the batch needs it (one rewrite). Fills ``arrays`` with
        each column's Arrow array for those rows (NULL where a row lacks it)."""
        declared, newest = self.declared_columns(topic)
        held_columns = {} if state is None else state.columns
        for name in [*newest, *held_columns]:
            if name not in cells:
                cells[name] = [None] * rows
        for name in cells:
            if name.casefold() in self._reserved_folded:
                raise DeltaSinkError(
                    f"follower {self.name}: table {self._table_name(topic)} has a "
                    f"column named {name}, which the Delta follower ({self.mode}) reserves",
                    "rename the column, or leave the table out of the follower's tables")
        planned: dict[str, Kind] = dict(held_columns)
        for name, seen in cells.items():
            held = held_columns.get(name)
            types = value_types(seen)
            kind: Kind
            if held is None:
                kind = declared.get(name) or delta_kind(guess_kind(seen))
            elif held == "string" or declared.get(name, held) == held:
                kind = held
            else:
                kind = "string"  # retyped upstream: the column becomes text
            array = kind_array(kind, seen, types)
            if array is None:  # a value that does not fit: the column becomes text
                kind, array = "string", kind_array("string", seen, types)
            planned[name] = kind
            arrays[name] = array
        widened = [name for name, kind in held_columns.items() if planned[name] != kind]
        if state is not None and widened:
            self._widen(state, widened)
        return planned

    def _table_name(self, topic: str) -> str:
        known = self.tables.get(topic)
        return str(known[1]) if known is not None else topic

    def _widen(self, state: _Table, names: Sequence[str]) -> None:
        """Rewrite the table with ``names`` turned into string columns of canonical text."""
        from deltalake import write_deltalake

        assert state.table is not None
        with _delta_errors(self.name, "rewrite the Delta table (a column became text)",
                           state.path):
            data = state.table.to_pyarrow_table()
            for name in names:
                index = data.schema.get_field_index(name)
                texts = [None if v is None else cell_text(v)
                         for v in data.column(index).to_pylist()]
                data = data.set_column(index, pa.field(name, pa.string()),
                                       pa.array(texts, pa.string()))
            write_deltalake(state.table, data, mode="overwrite", schema_mode="overwrite",
                            partition_by=[BUCKET],
                            description=state.description or state.table.metadata().description)
            state.table.update_incremental()
        self._load_columns(state)

    # ------------------------------------------------------------------------- source
    @staticmethod
    def _data_arrays(columns: Mapping[str, Kind],
                     cells: Mapping[str, Sequence[Any]]) -> dict[str, pa.Array]:
        return {name: column_array(kind, cells[name]) for name, kind in columns.items()}

    def _bucket_filter(self, state: _Table, buckets: set[int]) -> str:
        """A literal pruning term on the partition column (lets the MERGE skip the files of
        untouched buckets), or ``""`` when every bucket is touched."""
        if len(buckets) >= state.buckets:
            return ""
        return f"t.{BUCKET} IN ({', '.join(str(b) for b in sorted(buckets))}) AND "

    def _held(self, state: _Table, keys: Sequence[str], columns: list[str]) -> pa.Table:
        """The table's rows of ``keys`` (only ``columns``), reading only their buckets."""
        assert state.table is not None
        buckets = sorted({bucket_of(key, state.buckets) for key in keys})
        dataset = state.table.to_pyarrow_dataset()
        # the key filter runs in memory: pushed into the scan, pyarrow compares it with the
        # files' row group statistics, which deltalake may write as string_view (no kernel)
        held = dataset.to_table(columns=columns, filter=pc.field(BUCKET).isin(buckets))
        return held.filter(pc.is_in(held.column(KEY), value_set=pa.array(list(keys),
                                                                          pa.string())))

    # --------------------------------------------------------------------------- scd1
    def _merge_scd1(self, state: _Table, batch: Sequence[Change],
                    data: Mapping[str, pa.Array]) -> ApplyStats:
        assert state.table is not None
        now = int(time.time() * 1000)
        keys = [change.key for change in batch]
        buckets = [bucket_of(key, state.buckets) for key in keys]
        positions = [change.position.hex() for change in batch]
        deletes = [i for i, change in enumerate(batch) if change.row is None]
        arrays: dict[str, pa.Array] = {
            KEY: pa.array(keys, pa.string()), BUCKET: pa.array(buckets, pa.int32()),
            POSITION: pa.array(positions, pa.string()),
            DELETED: pa.array([change.row is None for change in batch], pa.bool_()),
            APPLIED: pa.array([now] * len(batch), pa.int64()), **data}
        # which deletes pass the gate (the MERGE's metrics count rows, not their kind)
        applied_deletes = len(deletes)
        if deletes:
            held = self._held(state, [keys[i] for i in deletes], [KEY, POSITION])
            held_at = dict(zip(held.column(KEY).to_pylist(), held.column(POSITION).to_pylist(),
                               strict=True))
            applied_deletes = sum(1 for i in deletes if held_at.get(keys[i]) is None
                                  or positions[i] > held_at[keys[i]])
        source = pa.table(arrays)
        prune = self._bucket_filter(state, set(buckets))
        metrics = (state.table.merge(
            source, f"{prune}t.{BUCKET} = s.{BUCKET} AND t.{KEY} = s.{KEY}",
            source_alias="s", target_alias="t", merge_schema=True)
            .when_matched_update_all(predicate=f"s.{POSITION} > t.{POSITION}")
            .when_not_matched_insert_all()
            .execute())
        self._keep_description(state)
        changed = int(metrics["num_target_rows_inserted"]) + int(
            metrics["num_target_rows_updated"])
        state.live = None
        return ApplyStats(written=changed - applied_deletes, deleted=applied_deletes,
                          skipped=len(batch) - changed)

    # --------------------------------------------------------------------------- scd2
    def _merge_scd2(self, state: _Table, batch: Sequence[Change],
                    columns: Mapping[str, Kind]) -> ApplyStats:
        assert state.table is not None
        now = int(time.time() * 1000)
        plan = _History(now)
        keys = list(dict.fromkeys(change.key for change in batch))
        held = self._held(state, keys, [KEY, POSITION, END_POSITION, IS_CURRENT])
        for key, position, end, current in zip(*(held.column(n).to_pylist() for n in (
                KEY, POSITION, END_POSITION, IS_CURRENT)), strict=True):
            plan.know(key, position, end, bool(current))
        for change in batch:
            plan.add(change)
        if not plan.rows and not plan.closes:
            return plan.stats
        source = self._scd2_source(state, plan, columns, now)
        touched = {bucket_of(row.change.key, state.buckets) for row in plan.rows}
        touched.update(bucket_of(key, state.buckets) for key, _, _, _ in plan.closes)
        prune = self._bucket_filter(state, touched)
        state.table.merge(
            source, f"{prune}t.{BUCKET} = s.{BUCKET} AND t.{KEY} = s.{KEY} AND "
                    f"t.{POSITION} = s.{POSITION}",
            source_alias="s", target_alias="t", merge_schema=True) \
            .when_matched_update({VALID_TO: f"s.{VALID_TO}", IS_CURRENT: "false",
                                  END_POSITION: f"s.{END_POSITION}", APPLIED: f"s.{APPLIED}"},
                                 predicate=f"s.{_CLOSE} AND t.{IS_CURRENT}") \
            .when_not_matched_insert_all(predicate=f"NOT s.{_CLOSE}", except_cols=[_CLOSE]) \
            .execute()
        self._keep_description(state)
        state.live = None
        return plan.stats

    def _scd2_source(self, state: _Table, plan: _History, columns: Mapping[str, Kind],
                     now: int) -> pa.Table:
        rows, closes = plan.rows, plan.closes
        keys = [row.change.key for row in rows] + [key for key, _, _, _ in closes]
        micros = [None if r.valid_from is None else r.valid_from * 1000 for r in rows]
        ends = [None if r.valid_to is None else r.valid_to * 1000 for r in rows]
        arrays: dict[str, pa.Array] = {
            KEY: pa.array(keys, pa.string()),
            BUCKET: pa.array([bucket_of(key, state.buckets) for key in keys], pa.int32()),
            POSITION: pa.array([r.change.position.hex() for r in rows]
                               + [position for _, position, _, _ in closes], pa.string()),
            DELETED: pa.array([r.marker for r in rows] + [False] * len(closes), pa.bool_()),
            APPLIED: pa.array([now] * len(keys), pa.int64()),
            VALID_FROM: pa.array(micros + [None] * len(closes), _TIMESTAMP),
            VALID_TO: pa.array(ends + [ms * 1000 for _, _, ms, _ in closes], _TIMESTAMP),
            IS_CURRENT: pa.array([r.end is None for r in rows] + [False] * len(closes),
                                 pa.bool_()),
            END_POSITION: pa.array([r.end for r in rows] + [end for _, _, _, end in closes],
                                   pa.string()),
            OP: pa.array(["d" if r.marker else r.change.op for r in rows] + [None] * len(closes),
                         pa.string()),
        }
        images = [None if r.marker else r.change.row for r in rows] + [None] * len(closes)
        arrays.update(self._data_arrays(columns, row_columns(images, list(columns))))
        arrays[_CLOSE] = pa.array([False] * len(rows) + [True] * len(closes), pa.bool_())
        return pa.table(arrays)

    # ----------------------------------------------------------------------- watermarks
    @property
    def watermark_file(self) -> Path:
        return self.root / WATERMARK_FILE

    def set_watermark(self, source: str, offset: Mapping[str, Any]) -> None:
        """Store ``offset`` for ``source`` unless the stored one orders after it
        (``sinks/watermarks.py``: atomic, durable, only forward)."""
        WatermarkFile(self.watermark_file, self.name, DeltaSinkError).advance(source, offset)

    def watermark(self, source: str) -> dict[str, Any] | None:
        return WatermarkFile(self.watermark_file, self.name, DeltaSinkError).get(source)

    # -------------------------------------------------------------------------- reading
    def _live(self, topic: str) -> tuple[_Table, pa.Table] | None:
        """The topic's live rows (scd1: not markers; scd2: current), cached per version."""
        state = self._open(topic)
        if state is None or state.table is None:
            return None
        with _delta_errors(self.name, "read the Delta table", state.path):
            state.table.update_incremental()
            version = state.table.version()
            if state.live is not None and state.live[0] == version:
                return state, state.live[1]
            self._load_columns(state)
            live = pc.field(IS_CURRENT) if self.mode == "scd2" else ~pc.field(DELETED)
            rows = state.table.to_pyarrow_dataset().to_table(
                columns=[KEY, *state.columns], filter=live)
        state.live = (version, rows)
        return state, rows

    def read(self, topic: str, keys: Sequence[str]) -> dict[str, dict[str, str]]:
        found = self._live(topic)
        if found is None or not keys:
            return {}
        state, rows = found
        chosen = rows.filter(pc.is_in(rows.column(KEY), value_set=pa.array(list(keys),
                                                                            pa.string())))
        out: dict[str, dict[str, str]] = {}
        for row in chosen.to_pylist():
            key = row.pop(KEY)
            out[key] = {name: cell_text(value) for name, value in row.items()
                        if value is not None}
        return out

    def keys(self, topic: str) -> Iterator[str]:
        found = self._live(topic)
        if found is None:
            return iter(())
        return iter(found[1].column(KEY).to_pylist())

    def history(self, topic: str) -> pa.Table:
        """Every row of the topic's table (markers included), ordered by key and position."""
        state = self._open(topic)
        if state is None or state.table is None:
            return pa.table({})
        with _delta_errors(self.name, "read the Delta table", state.path):
            state.table.update_incremental()
            return state.table.to_pyarrow_table().sort_by([(KEY, "ascending"),
                                                           (POSITION, "ascending")])

    # ---------------------------------------------------------------------- maintenance
    def existing_topics(self) -> list[str]:
        """The followed topics whose table exists."""
        return [topic for topic in self.tables if self._open(topic) is not None]

    def vacuum(self, retain: float, *, optimize: bool = False) -> list[MaintenanceResult]:
        """Per existing table: drop markers (``_cdc_deleted``) written more than
        ``tombstone_retention`` ago; with ``optimize``, compact small files (one commit) and
        write a checkpoint; then delete files the table stopped referencing more than
        ``retain`` seconds ago (rounded up to whole hours: deltalake's unit) and, when
        ``retain`` is at least an hour, also files no commit ever referenced (left by a
        crashed writer) older than that."""
        results = []
        for topic in self.existing_topics():
            results.append(self._retrying(topic, functools.partial(
                self._maintain, topic, retain, optimize)))
        return results

    def _maintain(self, topic: str, retain: float, optimize: bool) -> MaintenanceResult:
        state = self._open(topic)
        assert state is not None and state.table is not None
        started = time.monotonic()
        table = state.table
        result = MaintenanceResult(state.topic, state.path)
        with _delta_errors(self.name, "maintain the Delta table", state.path):
            table.update_incremental()
            result.live_files_before = len(table.file_uris())
            result.disk_files_before = _disk_files(state.path)
            cutoff = int((time.time() - self.tombstone_retention) * 1000)
            markers = table.to_pyarrow_dataset().count_rows(
                filter=pc.field(DELETED) & (pc.field(APPLIED) < cutoff))
            if markers:
                table.delete(f"{DELETED} AND {APPLIED} < {cutoff}")
                result.markers_dropped = markers
            if optimize:
                table.optimize.compact()
                table.create_checkpoint()
            hours = math.ceil(max(retain, 0.0) / 3600)
            table.vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=False,
                         full=hours >= 1)
            table.update_incremental()
            result.live_files_after = len(table.file_uris())
            result.disk_files_after = _disk_files(state.path)
            live = pc.field(IS_CURRENT) if self.mode == "scd2" else ~pc.field(DELETED)
            result.rows = table.to_pyarrow_dataset().count_rows(filter=live)
        state.live = None
        result.seconds = time.monotonic() - started
        return result


@dataclass
class _Version:
    """One row an scd2 batch inserts: a version (``marker`` False) or a delete marker."""

    change: Change
    valid_from: int | None
    marker: bool = False
    valid_to: int | None = None
    #: position (hex) of the record that ended it; None while current
    end: str | None = None


class _History:
    """The scd2 plan of one table's batch: which rows to insert and which held rows to close,
    walking each key's records in order behind the gate (the module docstring)."""

    def __init__(self, now_ms: int) -> None:
        self.now = now_ms
        self.stats = ApplyStats()
        self.rows: list[_Version] = []
        #: (key, position of the held current row, valid_to ms, end position)
        self.closes: list[tuple[str, str, int, str]] = []
        #: per key: the newest position known (held rows and this batch)
        self._known: dict[str, str] = {}
        #: per key: the open version: a held row's position (str) or a new row (_Version)
        self._open: dict[str, str | _Version] = {}

    def know(self, key: str, position: str, end: str | None, current: bool) -> None:
        """A held row of ``key``."""
        newest = max(position, end or "")
        if newest > self._known.get(key, ""):
            self._known[key] = newest
        if current:
            self._open[key] = position

    def add(self, change: Change) -> None:
        key, position = change.key, change.position.hex()
        known = self._known.get(key)
        if known is not None and position <= known:
            self.stats.skipped += 1
            return
        self._known[key] = position
        moment = change.ts_ms if change.ts_ms is not None else self.now
        closed = self._close(key, moment, position)
        if change.row is None:
            self.stats.deleted += 1
            if not closed:
                self.rows.append(_Version(change, moment, marker=True, valid_to=moment,
                                          end=position))
            return
        version = _Version(change, moment)
        self.rows.append(version)
        self._open[key] = version
        self.stats.written += 1

    def _close(self, key: str, moment: int, position: str) -> bool:
        """End ``key``'s open version at ``moment``/``position``; False if none is open."""
        opened = self._open.pop(key, None)
        if opened is None:
            return False
        if isinstance(opened, _Version):
            opened.valid_to, opened.end = moment, position
        else:
            self.closes.append((key, opened, moment, position))
        return True


# ------------------------------------------------------------------------------- output

def maintenance_table(results: Sequence[MaintenanceResult], title: str) -> Table:
    """A rich table: per Delta table, files (live and on disk) before -> after, rows."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column in ("table", "live files", "files on disk", "live rows", "markers dropped",
                   "seconds"):
        table.add_column(column, justify="left" if column == "table" else "right")
    for r in results:
        table.add_row(r.topic, f"{r.live_files_before:,} -> {r.live_files_after:,}",
                      f"{r.disk_files_before:,} -> {r.disk_files_after:,}", f"{r.rows:,}",
                      f"{r.markers_dropped:,}", f"{r.seconds:.2f}")
    return table

