"""The SQL follower: captured tables as plain tables of any database SQLAlchemy reaches
(PostgreSQL and SQLite tested), behind the version gate of ``cdc/sink.py``.

*Work in progress (issue 14).* Not yet: expiring delete markers after ``tombstone_retention``
(they are kept), and dialects other than PostgreSQL and SQLite (the gate needs ``INSERT ... ON
CONFLICT ... RETURNING``).

Layout, stated exactly:

* **The user's tables hold live rows only.** Table ``<table>`` (the leader's table name without
  its schema, in the connection's default schema) has one column per leader column and a
  primary key of the log key's columns. Deleted rows are gone, nothing else is added. A view's
  table (no schema in the log) has a unique index on its key instead (``_cdc_key_<crc32>``;
  NULLS NOT DISTINCT on PostgreSQL 15+): a view's key may hold NULL (a NULL group), matched
  with ``IS NULL`` when written and read.
* **Positions and delete markers live in a side table**, ``_cdc_rows`` (``tbl``: the log topic,
  ``key``: the key JSON text, ``position``: hex of the position bytes, ``deleted``, ``at_ms``),
  primary key ``(tbl, key)``; watermarks in ``_cdc_watermarks`` (``source``, ``offset`` JSON),
  with one row ``#format`` holding the side tables' layout version (:data:`FORMAT`).
* **The gate is one statement per batch and table**: ``INSERT INTO _cdc_rows ... ON CONFLICT
  (tbl, key) DO UPDATE ... WHERE _cdc_rows.position < excluded.position RETURNING key`` — the
  keys returned are those this writer won, and the side rows stay locked until the transaction
  commits, so a racing writer with an older position waits, then loses. The user table's rows
  of the won keys are written (upsert or delete) in the same transaction, after reading the
  table's columns under a lock that table changes wait for (PostgreSQL: ``LOCK TABLE ... IN ROW
  EXCLUSIVE MODE``; SQLite: the gate already holds the database's write lock).
* **Identifiers** longer than the dialect keeps (PostgreSQL: 63 bytes; it would silently cut
  them) are refused with :class:`SqlSinkError` naming the table or column, never shortened.

Columns (one mapping, stated exactly)
-------------------------------------

With a value schema for the topic in the log's schema store, a table is created with a column
per column of the newest schema version, typed from its logical kind (``cdc/logical.py``: of the
field's ``cdc.type``). Without a schema (a view's topic ``<source>.views.<name>``) the kind is
guessed from the first batch's values (:func:`cdc.logical.guess_kind`: boolean, int64, float64
or text). Either way the kind is mapped by one table (:func:`_mapped_type`), shown here by the
column types that have each kind:

======================  =====================================  =========================
logical type            PostgreSQL                             SQLite
======================  =====================================  =========================
boolean                 BOOLEAN                                BOOLEAN (0/1)
int16, int32, int64     SMALLINT, INTEGER, BIGINT              BIGINT (1)
year                    INTEGER                                BIGINT (1)
uint64                  NUMERIC(20,0)                          TEXT (2)
decimal(p, s)           NUMERIC(p,s); NUMERIC if p > 1000 (3)  TEXT (4)
numeric (unconstr.)     NUMERIC (5)                            TEXT (4)
float32, float64        DOUBLE PRECISION (6)                   TEXT (7)
date                    DATE (8)                               TEXT
timestamp               TIMESTAMP (8)                          TEXT
timestamptz             TIMESTAMPTZ (8)                        TEXT
time                    TIME (9)                               TEXT
json                    JSON (10)                              TEXT
array(T)                JSON holding the compact JSON form     TEXT
uuid                    UUID                                   TEXT
bytes                   BYTEA                                  BLOB
everything else         TEXT                                   TEXT
======================  =====================================  =========================

TEXT always holds :func:`~cdc.sink.canonical_text` of the JSON form (``docs/types.md``):
strings as they are, other values as compact JSON (``[1,null,3]``, ``{"x":1.5,...}``).
Other dialects would get SQLite's column types as SQLAlchemy's generic types (Boolean,
BigInteger, LargeBinary, Text). Notes:

1. SQLite's INTEGER affinity (declared BIGINT so that a one-column key is not a rowid alias,
   which refuses text if the column is ever widened).
2. SQLite integers are signed 64-bit: 2^63 .. 2^64-1 would not fit.
3. PostgreSQL's precision limit is 1000; NUMERIC without a typmod keeps each value's digits and
   scale exactly. ``NaN`` is kept; ``Infinity`` does not fit NUMERIC(p,s) (the column becomes
   TEXT, see below).
4. The exact decimal text: SQLite's NUMERIC affinity would round it to a double.
5. ``NaN`` kept; ``Infinity``/``-Infinity`` from PostgreSQL 14 on (before: the column becomes
   TEXT).
6. NaN, ±Infinity and -0 kept. float32 too: its JSON form is the float32's exact double, which
   a REAL column would print with float4's shortest digits instead.
7. SQLite's REAL stores NaN as NULL and its REAL affinity turns -0.0 into 0.0; TEXT holds the
   JSON form exactly (SQLite still computes with it: ``SUM(col)`` converts the text).
8. ``infinity``/``-infinity``, BC years and years past 9999 are converted both ways (the JSON
   form's ``-0043-03-15`` is PostgreSQL's ``0044-03-15 BC``); values outside PostgreSQL's range
   make the column TEXT. Connections run with ``DateStyle=ISO,YMD``, ``TimeZone=UTC`` and
   ``extra_float_digits=3``, so the text PostgreSQL gives back is exact.
9. 00:00:00 to 24:00:00; a MySQL ``TIME`` beyond (negative, past 24 h) makes the column TEXT.
10. Not JSONB, which reorders keys and respaces the text: JSON keeps the text byte for byte. A
    key column that would be JSON is TEXT (JSON has no equality operator).

Writing converts the JSON form to the column (PostgreSQL: the value's input text, cast to the
column type); :meth:`SqlSink.read` converts back (PostgreSQL: ``CAST(col AS TEXT)``, BYTEA as
bytes), so it returns exactly ``row_text`` of the leader's JSON row.

**Schema changes** (as the Delta follower): a column of a newer schema version is added with its
mapped type (older rows NULL); a dropped column stays (NULL in rows written later); a rename
is a drop plus an add. A retype whose new mapped type the held column cannot hold (it holds the
same type, a narrower integer, and a NUMERIC without typmod holds any decimal; SMALLINT does not
hold int64), or a value that does not read back exactly from its column (a MySQL ``TIME`` of 25
hours, ``Infinity`` in a NUMERIC(p,s)), makes the column TEXT holding the canonical text of
every value, old rows included (PostgreSQL: ``ALTER COLUMN ... TYPE TEXT`` and the values
rewritten in the JSON form; SQLite: the table is rebuilt). A TEXT column stays TEXT.
Table changes run in their own transaction under a per-table lock (PostgreSQL: an advisory
lock), then the batch is applied again.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import math
import os
import re
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc.errors import CdcError, check_format
from cdc.log.open import log_settings
from cdc.logical import Logical, LogicalKind, guess_kind, logical_columns
from cdc.preflight import Step, writable_place
from cdc.sink import (
    ApplyStats,
    Change,
    Sink,
    Topics,
    canonical_text,
    cell_text,
    newest_per_key,
)
from cdc.types import SPECIAL_FLOATS
from sinks.sql_settings import SqlFollowerConfig

if TYPE_CHECKING:
    from cdc.config import Config, FollowerConfig

#: the side tables
ROWS = "_cdc_rows"
WATERMARKS = "_cdc_watermarks"
#: the name of a view's table's key index starts so (then the CRC-32 of the table's name)
KEY_INDEX = "_cdc_key_"
#: the version of the side tables' layout: a row of ``_cdc_watermarks`` whose ``source`` is
#: :data:`FORMAT_ROW` (no source name starts with ``#``) holds ``{"format": N}``; tables
#: without it were written before formats were marked (format 1)
FORMAT = 1
FORMAT_ROW = "#format"
#: how often a batch is retried after changing its table before giving up
_RESHAPES = 5


class SqlSinkError(CdcError):
    """The SQL follower cannot reach, write or read its database."""


class _Reshape(Exception):  # noqa: N818 - a signal, not an error
    """The batch needs the user table created or changed first."""


# -------------------------------------------------------------- logical kinds -> columns

def _mapped_type(logical: Logical, postgres: bool, key: bool) -> Any:
    """The column type of a logical kind (the module docstring's table)."""
    import sqlalchemy as sa

    kind = logical.kind
    if not postgres:
        portable = {LogicalKind.BOOLEAN: sa.Boolean, LogicalKind.INT16: sa.BigInteger,
                    LogicalKind.INT32: sa.BigInteger, LogicalKind.INT64: sa.BigInteger,
                    LogicalKind.BYTES: sa.LargeBinary}
        return portable.get(kind, sa.Text)()
    if kind is LogicalKind.DECIMAL:
        precision = logical.precision
        return sa.Numeric(precision, logical.scale or 0) if precision and precision <= 1000 \
            else sa.Numeric()
    if kind is LogicalKind.JSON:
        return sa.Text() if key else sa.JSON()
    mapped = {LogicalKind.BOOLEAN: sa.Boolean(), LogicalKind.INT16: sa.SmallInteger(),
              LogicalKind.INT32: sa.Integer(), LogicalKind.INT64: sa.BigInteger(),
              LogicalKind.NUMERIC: sa.Numeric(), LogicalKind.FLOAT64: sa.Double(),
              LogicalKind.DATE: sa.Date(), LogicalKind.TIMESTAMP: sa.TIMESTAMP(),
              LogicalKind.TIMESTAMPTZ: sa.TIMESTAMP(timezone=True),
              LogicalKind.TIME: sa.Time(), LogicalKind.UUID: sa.Uuid(),
              LogicalKind.BYTES: sa.LargeBinary()}
    return mapped.get(kind) or sa.Text()


# ------------------------------------------------------------ dates and times (PostgreSQL)

_JSON_DATE = re.compile(r"([+-]?\d{4,})-(\d\d)-(\d\d)")
_JSON_MOMENT = re.compile(r"([+-]?\d{4,}-\d\d-\d\d)T(\d\d:\d\d:\d\d\.\d{6})(Z?)")
_JSON_TIME = re.compile(r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d\.\d{6}|24:00:00\.000000")
_PG_MOMENT = re.compile(
    r"(\d{4,})-(\d\d)-(\d\d)(?: (\d\d:\d\d:\d\d)(?:\.(\d{1,6}))?)?(\+00)?( BC)?")
#: astronomical years PostgreSQL holds (4713 BC is -4712)
_PG_YEARS = {"date": (-4712, 5874896), "timestamp": (-4712, 294275),
             "timestamptz": (-4712, 294275)}
_INFINITIES = ("infinity", "-infinity")


def _moment_fits(kind: str, value: Any) -> bool:
    """Whether a date/timestamp/timestamptz/time JSON form fits PostgreSQL's type."""
    if type(value) is not str:
        return False
    if kind == "time":
        return _JSON_TIME.fullmatch(value) is not None
    if value in _INFINITIES:
        return True
    if kind == "date":
        day = _JSON_DATE.fullmatch(value)
    else:
        moment = _JSON_MOMENT.fullmatch(value)
        if moment is None or bool(moment[3]) != (kind == "timestamptz"):
            return False
        day = _JSON_DATE.fullmatch(moment[1])
    if day is None or _shown_year(int(day[1])) != day[1]:
        return False
    low, high = _PG_YEARS[kind]
    return low <= int(day[1]) <= high


def _shown_year(year: int) -> str:
    """An astronomical year as the JSON form writes it (ISO 8601, expanded outside 0-9999)."""
    return f"{year:04d}" if 0 <= year <= 9999 else f"+{year}" if year > 0 else f"-{-year:04d}"


def _pg_moment_in(value: str) -> str:
    """A date/timestamp/timestamptz JSON form as PostgreSQL input text."""
    if value in _INFINITIES:
        return value
    day, _, clock = value.partition("T")
    parts = _JSON_DATE.fullmatch(day)
    assert parts is not None  # checked by _moment_fits
    year = int(parts[1])
    text = f"{year if year > 0 else 1 - year:04d}-{parts[2]}-{parts[3]}"
    if clock:
        text += " " + clock.removesuffix("Z") + ("+00" if clock.endswith("Z") else "")
    return text if year > 0 else text + " BC"


def _pg_moment_out(text: str) -> str:
    """PostgreSQL's text of a date/timestamp/timestamptz (ISO, UTC) as the JSON form."""
    if text in _INFINITIES:
        return text
    parts = _PG_MOMENT.fullmatch(text)
    if parts is None:
        raise SqlSinkError(f"PostgreSQL gave the date/time {text!r} in an unexpected form",
                           "report it: the follower sets DateStyle=ISO,YMD and TimeZone=UTC")
    year = 1 - int(parts[1]) if parts[7] else int(parts[1])
    out = f"{_shown_year(year)}-{parts[2]}-{parts[3]}"
    if parts[4]:
        out += f"T{parts[4]}.{(parts[5] or '').ljust(6, '0')}" + ("Z" if parts[6] else "")
    return out


def _pg_time_out(text: str) -> str:
    clock, _, fraction = text.partition(".")
    return f"{clock}.{fraction.ljust(6, '0')}"


# ------------------------------------------------------------------------ other checks

_DECIMAL = re.compile(r"-?(\d+)(?:\.(\d+))?")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _numeric_fits(value: Any, precision: int | None, scale: int | None,
                  infinity: bool) -> bool:
    """Whether a decimal's JSON text reads back from a NUMERIC(precision, scale) unchanged."""
    if type(value) is not str:
        return False
    if value == "NaN":
        return True
    if value in ("Infinity", "-Infinity"):
        return infinity and precision is None
    parts = _DECIMAL.fullmatch(value)
    if parts is None or (value[0] == "-" and not value.strip("-0.")):  # no negative zero
        return False
    if precision is None:
        return True
    fraction = parts[2] or ""
    return len(fraction) == (scale or 0) and len(parts[1].lstrip("0")) <= precision - len(
        fraction)


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def _json_fits(value: Any) -> bool:
    if type(value) is not str:
        return isinstance(value, list | dict)
    try:
        json.loads(value, parse_constant=_no_constant)  # PostgreSQL's JSON has no NaN
    except ValueError:
        return False
    return True


def _bytes_fits(value: Any) -> bool:
    if type(value) is not str:
        return False
    try:
        return base64.b64encode(base64.b64decode(value, validate=True)).decode() == value
    except (binascii.Error, ValueError):
        return False


# ------------------------------------------------------------------------------ columns

_MOMENTS = ("date", "timestamp", "timestamptz", "time")
#: kinds whose PostgreSQL text differs from the JSON form's (rewritten when widened to TEXT)
_REWRITTEN = ("float", *_MOMENTS)
_FITS: dict[str, Any] = {
    "bool": lambda column, value: type(value) is bool,
    "int": lambda column, value: type(value) is int and -(
        2 ** (column.bits - 1)) <= value < 2 ** (column.bits - 1),
    "float": lambda column, value: value in SPECIAL_FLOATS if type(value) is str else (
        type(value) is float and (column.postgres or value != 0 or math.copysign(1, value) > 0)),
    "numeric": lambda column, value: _numeric_fits(value, column.type.precision,
                                                   column.type.scale, column.infinity),
    "json": lambda column, value: _json_fits(value),
    "uuid": lambda column, value: type(value) is str and _UUID.fullmatch(value) is not None,
    "bytes": lambda column, value: _bytes_fits(value),
    **{kind: (lambda column, value: _moment_fits(column.kind, value)) for kind in _MOMENTS},
}


def _kind(sqltype: Any, postgres: bool) -> str:
    """How a column of ``sqltype`` holds values (``text``: the canonical text)."""
    import sqlalchemy as sa

    kinds = ((sa.Boolean, "bool"), (sa.Integer, "int"), (sa.Float, "float"),
             (sa.Numeric, "numeric"), (sa.DateTime, "timestamp"), (sa.Date, "date"),
             (sa.Time, "time"), (sa.JSON, "json"), (sa.Uuid, "uuid"), (sa.LargeBinary, "bytes"))
    kind = next((kind for cls, kind in kinds if isinstance(sqltype, cls)), "text")
    if kind in ("timestamp", "time") and getattr(sqltype, "timezone", False):
        kind = "timestamptz" if kind == "timestamp" else "text"
    if not postgres and kind not in ("bool", "int", "float", "bytes"):
        return "text"
    return kind


@dataclass(frozen=True)
class _Column:
    """A user-table column: its type, and how JSON-form values go in and come out."""

    name: str
    type: Any
    kind: str
    postgres: bool
    #: PostgreSQL: the type's SQL (bound values are cast to it)
    cast: str = ""
    #: integers: their width
    bits: int = 64
    #: numeric: whether ``Infinity`` fits (PostgreSQL 14 and later)
    infinity: bool = False

    def fits(self, value: Any) -> bool:
        """Whether ``value`` (JSON form) reads back from this column unchanged."""
        return value is None or self.kind == "text" or bool(_FITS[self.kind](self, value))

    def holds(self, wanted: Any | None, dialect: Any) -> bool:
        """Whether this column holds every value of a column of type ``wanted``."""
        if wanted is None or self.kind == "text":
            return True
        other = _column(self.name, wanted, dialect)
        if other.kind != self.kind:
            return False
        if self.kind == "int":
            return self.bits >= other.bits
        if self.kind == "numeric":
            return self.type.precision is None or (self.type.precision, self.type.scale) == (
                other.type.precision, other.type.scale)
        return True

    def to_db(self, value: Any) -> Any:
        """A JSON-form value as bound for this column."""
        if value is None:
            return None
        if self.kind == "bytes":
            return base64.b64decode(value)
        if self.postgres:  # the input text, cast by the statement
            return _pg_moment_in(value) if self.kind in _MOMENTS[:3] else canonical_text(value)
        if self.kind in ("bool", "int"):
            return value
        if self.kind == "float" and type(value) is str:  # REAL keeps NaN as NULL: as text
            return value if value == "NaN" else SPECIAL_FLOATS[value]
        return value if self.kind == "float" else canonical_text(value)

    def from_db(self, value: Any) -> str:
        """A value read by :meth:`select` as the JSON form's canonical text."""
        if self.kind == "bytes" and isinstance(value, bytes | bytearray | memoryview):
            return base64.b64encode(bytes(value)).decode("ascii")
        if self.postgres:  # PostgreSQL's text of the value
            if self.kind == "float":
                return cell_text(float(value))
            if self.kind in _MOMENTS:
                return _pg_time_out(value) if self.kind == "time" else _pg_moment_out(value)
            return str(value)
        if self.kind == "bool" and type(value) is int:
            return "true" if value else "false"
        return cell_text(value)

    def bind(self, param: str) -> str:
        return f"CAST(:{param} AS {self.cast})" if self.postgres else f":{param}"

    def select(self, quoted: str) -> str:
        return f"CAST({quoted} AS TEXT)" if self.postgres and self.kind != "bytes" else quoted


def _column(name: str, sqltype: Any, dialect: Any) -> _Column:
    import sqlalchemy as sa

    postgres = dialect.name == "postgresql"
    kind = _kind(sqltype, postgres)
    bits = 64
    if postgres and kind == "int" and not isinstance(sqltype, sa.BigInteger):
        bits = 16 if isinstance(sqltype, sa.SmallInteger) else 32
    version = tuple(dialect.server_version_info or ())
    return _Column(name, sqltype, kind, postgres,
                   cast=str(sqltype.compile(dialect=dialect)) if postgres else "", bits=bits,
                   infinity=postgres and version >= (14,))


def _unnest(conn: Any, columns: Sequence[_Column], prefix: str) -> tuple[str, str]:
    """PostgreSQL: ``unnest``'s arguments (the bound arrays ``:<prefix><i>``: bytea[] for
    bytes, else text[]) and the select list casting each ``u.c<i>`` to its column's type."""
    arrays = ", ".join(f"CAST(:{prefix}{i} AS {'bytea' if c.kind == 'bytes' else 'text'}[])"
                       for i, c in enumerate(columns))
    casts = ", ".join(f"u.c{i}" if c.kind == "bytes" else f"CAST(u.c{i} AS {c.cast})"
                      for i, c in enumerate(columns))
    return arrays, casts


def _by_nulls(keys: Sequence[_Column], values: Sequence[Mapping[str, Any]]
              ) -> dict[frozenset[str], list[Mapping[str, Any]]]:
    """``values`` (parsed keys) grouped by which of the ``keys`` columns they hold NULL in (a
    view's NULL group: ``column = NULL`` matches nothing, so each such shape gets
    :func:`_key_match`'s ``IS NULL``)."""
    out: dict[frozenset[str], list[Mapping[str, Any]]] = {}
    for value in values:
        nulls = frozenset(c.name for c in keys if value.get(c.name) is None)
        out.setdefault(nulls, []).append(value)
    return out


def _key_match(conn: Any, keys: Sequence[_Column], nulls: frozenset[str]) -> str:
    """``WHERE`` text matching one key: ``column = :k<i>``, or ``column IS NULL`` for the
    columns in ``nulls``."""
    return " AND ".join(f"{_quoted(conn, c.name)} IS NULL" if c.name in nulls
                        else f"{_quoted(conn, c.name)} = {c.bind(f'k{i}')}"
                        for i, c in enumerate(keys))


def _aliases(count: int) -> str:
    return ", ".join(f"c{i}" for i in range(count))


def _quoted(conn: Any, name: str) -> str:
    """``name`` quoted for a ``text()`` statement (its colons escaped)."""
    return str(conn.dialect.identifier_preparer.quote_identifier(name)).replace(":", "\\:")


@contextlib.contextmanager
def _created_by_another_is_fine() -> Iterator[None]:
    """SQLite checks for a table and creates it in two steps, outside its write lock: another
    writer may create it in between. That table is the same one; go on."""
    import sqlalchemy as sa

    try:
        yield
    except sa.exc.OperationalError as exc:
        if "already exists" not in str(exc):
            raise


def _postgres_session(dbapi_connection: Any, _record: Any) -> None:
    """Session settings that make PostgreSQL's text of dates, times and floats exact."""
    cursor = dbapi_connection.cursor()
    try:
        for setting in ("SET DateStyle TO 'ISO, YMD'", "SET TimeZone TO 'UTC'",
                        "SET extra_float_digits TO 3"):
            cursor.execute(setting)
    finally:
        cursor.close()
    dbapi_connection.commit()


class SqlSink(Sink):
    """One follower in one SQL database (``url``: an SQLAlchemy URL). ``log_path``/``log``:
    the change log (its settings, ``cdc.log.open.log_settings``), whose schema store types
    the columns."""

    @classmethod
    def from_settings(cls, config: Config, name: str, settings: FollowerConfig,
                      topics: Topics) -> SqlSink:
        assert isinstance(settings, SqlFollowerConfig)
        return cls(name, settings.database_url(), tables=topics,
                   tombstone_retention=settings.tombstone_retention,
                   log_path=config.log_path, log=log_settings(config))

    def __init__(self, name: str, url: str, tables: Mapping[str, tuple[str, Any]] | None = None,
                 tombstone_retention: float = 24 * 3600.0, *, log_path: Path | None = None,
                 log: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self.url = url
        self.tables = dict(tables or {})
        self.tombstone_retention = tombstone_retention
        self.log_settings = dict(log) if log is not None else (
            None if log_path is None else {"backend": "local", "path": str(log_path)})
        self._store: Any = None
        self._engine: Any = None
        self._meta: Any = None

    # ----------------------------------------------------------------------- connection
    @property
    def engine(self) -> Any:
        if self._engine is None:
            import sqlalchemy as sa

            try:
                sqlite = self.url.startswith("sqlite")
                database = sa.make_url(self.url).database if sqlite else None
                if database and database != ":memory:":
                    Path(database).parent.mkdir(parents=True, exist_ok=True)
                engine = sa.create_engine(
                    self.url, connect_args={"timeout": 60} if sqlite else {})
            except Exception as exc:  # noqa: BLE001 - a bad URL, a missing driver or folder
                raise SqlSinkError(f"follower {self.name}: cannot use the database URL "
                                   f"{self._where()}: {exc}",
                                   f"correct followers.{self.name}.url") from None
            if engine.dialect.name == "postgresql":
                sa.event.listen(engine, "connect", _postgres_session)
            self._engine = engine
        return self._engine

    def _where(self) -> str:
        import sqlalchemy as sa

        try:
            return sa.make_url(self.url).render_as_string(hide_password=True)
        except Exception:  # noqa: BLE001 - an unparsable URL
            return "(an unparsable URL)"

    def check(self) -> None:
        """Connect and create the side tables, and check the names of the tables whose
        schemas are known; :class:`SqlSinkError` with the fix if not."""
        try:
            self.engine  # noqa: B018 - builds the engine (a bad URL fails here)
            self._side_tables()
        except SqlSinkError:
            raise
        except Exception as exc:  # noqa: BLE001 - the driver's own errors, one clear message
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise SqlSinkError(f"follower {self.name}: cannot write the database at "
                               f"{self._where()}: {first[:300]}",
                               f"check followers.{self.name}.url and that the database is up "
                               "and writable") from None
        for topic in self.tables:
            _, newest = self._declared(topic, self.engine.dialect, ())
            self._check_names(self.engine.dialect, self._table_name(topic), newest)

    def preflight(self) -> list[Step]:
        return [Step("database", self._reachable)]

    def _reachable(self) -> str:
        """The database answers (a SQLite file: its folder is writable); creates nothing."""
        import sqlalchemy as sa

        url = sa.make_url(self.url)
        if url.get_backend_name() == "sqlite":
            if not url.database or url.database == ":memory:":
                return "SQLite in memory"
            path = Path(url.database)
            if path.exists():
                if not os.access(path, os.W_OK):
                    raise SqlSinkError(f"the SQLite file {path} is not writable by this user",
                                       "make it writable, or correct "
                                       f"followers.{self.name}.url")
                return f"SQLite file {path} exists and is writable"
            return writable_place(path.parent, f"followers.{self.name}.url's folder",
                                  f"correct followers.{self.name}.url")
        engine = sa.create_engine(self.url)
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
            version = ".".join(str(v) for v in engine.dialect.server_version_info or ())
        except Exception as exc:  # noqa: BLE001 - the driver's own errors, one clear message
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise SqlSinkError(f"cannot reach the database at {self._where()}: {first[:300]}",
                               f"check followers.{self.name}.url and that the database is up"
                               ) from None
        finally:
            engine.dispose()
        return f"{engine.dialect.name} {version} at {self._where()}"

    def _side_tables(self) -> Any:
        import sqlalchemy as sa

        if self._meta is None:
            meta = sa.MetaData()
            sa.Table(ROWS, meta, sa.Column("tbl", sa.String(512), primary_key=True),
                     sa.Column("key", sa.Text, primary_key=True),
                     sa.Column("position", sa.String(128), nullable=False),
                     sa.Column("deleted", sa.Boolean, nullable=False),
                     sa.Column("at_ms", sa.BigInteger, nullable=False))
            sa.Table(WATERMARKS, meta, sa.Column("source", sa.String(512), primary_key=True),
                     sa.Column("offset", sa.Text, nullable=False))
            with self.engine.begin() as conn:
                self._ddl_lock(conn, ROWS)  # two writers creating them at once
                for table in meta.sorted_tables:  # each its own: one created by another
                    with _created_by_another_is_fine():  # must not skip the next one
                        table.create(conn, checkfirst=True)
                self._check_format(conn, meta.tables[WATERMARKS])
            self._meta = meta
        return self._meta

    def _check_format(self, conn: Any, watermarks: Any) -> None:
        """Mark the side tables with :data:`FORMAT`, or refuse a newer layout."""
        import sqlalchemy as sa

        held = conn.execute(sa.select(watermarks.c.offset).where(
            watermarks.c.source == FORMAT_ROW)).scalar()
        if held is None:
            # PostgreSQL's writers are serialized by the DDL lock; SQLite's may meet here, and
            # a duplicate row there leaves the transaction usable: the other wrote the same
            with contextlib.suppress(sa.exc.IntegrityError):
                conn.execute(sa.insert(watermarks).values(
                    source=FORMAT_ROW, offset=json.dumps({"format": FORMAT})))
            return
        try:
            found = json.loads(held).get("format")
        except (ValueError, AttributeError):
            found = held
        check_format(found, FORMAT, f"follower {self.name}: its table {WATERMARKS}",
                     fix="run the cdc version that wrote the follower (or a newer one)",
                     error=SqlSinkError)

    # ------------------------------------------------------------------------ schemas
    def _schema_store(self) -> Any:
        if self._store is None:
            from cdc.log.open import schema_store_from

            self._store = schema_store_from(self.log_settings)
        return self._store

    def _declared(self, topic: str, dialect: Any, key_columns: Sequence[str]
                  ) -> tuple[dict[str, Any], list[str]]:
        """From the schema store: every column any value schema version of ``topic`` had,
        with its mapped type in the newest version holding it, and the newest version's
        columns (none without a schema)."""
        store = self._schema_store()
        declared: dict[str, Any] = {}
        newest: list[str] = []
        if store is None:
            return declared, newest
        postgres = dialect.name == "postgresql"
        for registered in store.versions(f"{topic}-value"):
            newest = []
            for column, logical in logical_columns(registered.schema).items():
                declared[column] = _mapped_type(logical, postgres, column in key_columns)
                newest.append(column)
        return declared, newest

    def _check_names(self, dialect: Any, table: str, columns: Sequence[str]) -> None:
        """Refuse a table or column name longer than ``dialect`` keeps."""
        limit = int(dialect.max_identifier_length)
        named = [(table, f"table {table}"), *((c, f"column {c} of table {table}")
                                              for c in columns)]
        for name, what in named:
            size = len(name.encode())
            if size > limit:
                raise SqlSinkError(
                    f"follower {self.name}: the name of {what} is {size} bytes long; "
                    f"{dialect.name} keeps at most {limit} bytes of a name (it would cut the "
                    "name short, and two names could become one)",
                    f"rename it on the leader to at most {limit} bytes, or leave table "
                    f"{table} out of followers.{self.name}.tables")

    # ------------------------------------------------------------------------- tables
    def _table_name(self, topic: str) -> str:
        known = self.tables.get(topic)
        table = str(known[1]) if known is not None else topic.split(".", 1)[-1]
        return table.rsplit(".", 1)[-1]

    def _held(self, conn: Any, name: str, lock: bool = False) -> dict[str, _Column] | None:
        """The columns of table ``name`` (``None``: no such table); ``lock``: first lock it
        against table changes until the transaction ends."""
        import sqlalchemy as sa

        inspector = sa.inspect(conn)
        if not inspector.has_table(name):
            return None
        if lock and conn.dialect.name == "postgresql":
            conn.execute(sa.text(f"LOCK TABLE {_quoted(conn, name)} IN ROW EXCLUSIVE MODE"))
        return {column["name"]: _column(column["name"], column["type"], conn.dialect)
                for column in inspector.get_columns(name)}

    def _plan(self, conn: Any, topic: str, held: Mapping[str, _Column] | None,
              key_columns: Sequence[str], cells: Mapping[str, Sequence[Any]]
              ) -> tuple[dict[str, Any], list[str]]:
        """What the table needs for a batch whose rows hold ``cells``: the columns to add
        (with their types) and the held columns to widen to TEXT."""
        import sqlalchemy as sa

        declared, newest = self._declared(topic, conn.dialect, key_columns)
        adds: dict[str, Any] = {}
        widen: list[str] = []
        for name in dict.fromkeys([*newest, *cells, *key_columns]):
            values = cells.get(name, ())
            column = (held or {}).get(name)
            if column is None:
                wanted = declared[name] if name in declared else _mapped_type(
                    Logical(guess_kind(values)), conn.dialect.name == "postgresql", False)
                fits = all(map(_column(name, wanted, conn.dialect).fits, values))
                adds[name] = wanted if fits else sa.Text()
            elif not (column.holds(declared.get(name), conn.dialect)
                      and all(map(column.fits, values))):
                widen.append(name)
        return adds, widen

    def _reshape(self, topic: str, key_columns: Sequence[str],
                 cells: Mapping[str, Sequence[Any]]) -> None:
        """Create or change the table of ``topic`` for a batch (one transaction)."""
        import sqlalchemy as sa

        name = self._table_name(topic)
        with self.engine.begin() as conn:
            self._ddl_lock(conn, name)
            if conn.dialect.name == "sqlite":  # take the write lock before looking
                conn.execute(sa.text(f"DELETE FROM {ROWS} WHERE 1 = 0"))
            held = self._held(conn, name)
            adds, widen = self._plan(conn, topic, held, key_columns, cells)
            self._check_names(conn.dialect, name, list(adds))
            if held is None:
                self._create(conn, name, adds, key_columns,
                             primary=bool(self._declared(topic, conn.dialect, key_columns)[0]))
                return
            for column, sqltype in adds.items():
                conn.execute(sa.text(f"ALTER TABLE {_quoted(conn, name)} ADD COLUMN "
                                     f"{_quoted(conn, column)} "
                                     f"{sqltype.compile(dialect=conn.dialect)}"))
            if widen and conn.dialect.name == "postgresql":
                self._widen(conn, name, [held[column] for column in widen])
            elif widen:
                self._rebuild(conn, name, held, widen)

    def declare(self, topic: str, columns: Mapping[str, LogicalKind],
                key: Sequence[str]) -> None:
        """A view's table created empty (a unique index on its key: it may hold NULL)."""
        name = self._table_name(topic)
        with self.engine.begin() as conn:
            self._ddl_lock(conn, name)
            if self._held(conn, name) is not None:
                return
            postgres = conn.dialect.name == "postgresql"
            self._check_names(conn.dialect, name, list(columns))
            self._create(conn, name, {column: _mapped_type(Logical(kind), postgres,
                                                           column in key)
                                      for column, kind in columns.items()}, key, primary=False)

    @staticmethod
    def _create(conn: Any, name: str, columns: Mapping[str, Any],
                key_columns: Sequence[str], primary: bool = True) -> None:
        """Table ``name``: its key the primary key, or -- without ``primary``: a view's table,
        whose key may hold NULL (a NULL group) -- a unique index (on PostgreSQL 15 and later
        with NULLS NOT DISTINCT)."""
        import sqlalchemy as sa

        table = sa.Table(name, sa.MetaData(), *[
            sa.Column(column, sqltype, primary_key=primary and column in key_columns,
                      autoincrement=False)
            for column, sqltype in columns.items()])
        if not primary:
            postgres = conn.dialect.name == "postgresql"
            options = ({"postgresql_nulls_not_distinct": True}
                       if postgres and (conn.dialect.server_version_info or (0,)) >= (15,)
                       else {})
            sa.Index(f"{KEY_INDEX}{zlib.crc32(name.encode()):08x}",
                     *[table.c[column] for column in key_columns], unique=True, **options)
        with _created_by_another_is_fine():
            table.create(conn, checkfirst=True)

    @staticmethod
    def _ddl_lock(conn: Any, name: str) -> None:
        """Serialize DDL on ``name`` between writers until the transaction ends (PostgreSQL's
        ``CREATE TABLE IF NOT EXISTS`` races otherwise; SQLite's writers are serialized)."""
        import sqlalchemy as sa

        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"),
                         {"k": zlib.crc32(name.encode())})

    @staticmethod
    def _widen(conn: Any, name: str, columns: Sequence[_Column]) -> None:
        """PostgreSQL: ``columns`` become TEXT holding the canonical text of their values."""
        import sqlalchemy as sa

        table = _quoted(conn, name)
        for column in columns:
            quoted = _quoted(conn, column.name)
            using = (f"translate(encode({quoted}, 'base64'), chr(10), '')"
                     if column.kind == "bytes" else f"CAST({quoted} AS TEXT)")
            conn.execute(sa.text(f"ALTER TABLE {table} ALTER COLUMN {quoted} TYPE TEXT "
                                 f"USING {using}"))
            if column.kind not in _REWRITTEN:
                continue  # PostgreSQL's text is the JSON form's already
            held = conn.execute(sa.text(f"SELECT CAST(ctid AS TEXT), {quoted} FROM {table} "
                                        f"WHERE {quoted} IS NOT NULL")).all()
            changed = [{"r": row, "v": text} for row, value in held
                       if (text := column.from_db(value)) != value]
            if changed:
                conn.execute(sa.text(f"UPDATE {table} SET {quoted} = :v "
                                     "WHERE ctid = CAST(:r AS tid)"), changed)

    def _rebuild(self, conn: Any, name: str, held: Mapping[str, _Column],
                 widen: Sequence[str]) -> None:
        """SQLite (no ALTER COLUMN): the table rebuilt with ``widen`` as TEXT holding the
        canonical text of their values."""
        import sqlalchemy as sa

        spare = f"{name}__cdc_widen"
        inspector = sa.inspect(conn)
        keys = inspector.get_pk_constraint(name)["constrained_columns"]
        primary = bool(keys)
        if not primary:  # a view's table: its key's unique index
            keys = next((index["column_names"] for index in inspector.get_indexes(name)
                         if str(index["name"]).startswith(KEY_INDEX)), [])
        conn.execute(sa.text(f"DROP TABLE IF EXISTS {_quoted(conn, spare)}"))
        self._create(conn, spare, {column: sa.Text() if column in widen else held[column].type
                                   for column in held}, keys, primary)
        names = ", ".join(_quoted(conn, column) for column in held)
        rows = conn.execute(sa.text(f"SELECT {names} FROM {_quoted(conn, name)}")).all()
        values = [{f"p{i}": held[column].from_db(value) if column in widen and value is not None
                   else value for i, (column, value) in enumerate(zip(held, row, strict=True))}
                  for row in rows]
        if values:
            binds = ", ".join(f":p{i}" for i in range(len(held)))
            conn.execute(sa.text(f"INSERT INTO {_quoted(conn, spare)} ({names}) "
                                 f"VALUES ({binds})"), values)
        conn.execute(sa.text(f"DROP TABLE {_quoted(conn, name)}"))
        conn.execute(sa.text(f"ALTER TABLE {_quoted(conn, spare)} RENAME TO "
                             f"{_quoted(conn, name)}"))

    # -------------------------------------------------------------------------- apply
    def apply(self, changes: Sequence[Change]) -> ApplyStats:
        import sqlalchemy as sa

        try:
            return self._apply(changes)
        except sa.exc.DBAPIError as exc:  # never the statement or its parameters: row data
            first = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
            raise SqlSinkError(f"follower {self.name}: writing a batch failed: {first}",
                               "check the database (up, writable, not out of space); the "
                               "batch is replayed when `cdc apply` restarts") from None

    def _apply(self, changes: Sequence[Change]) -> ApplyStats:
        stats = ApplyStats()
        by_topic: dict[str, list[Change]] = {}
        for change in changes:
            by_topic.setdefault(change.topic, []).append(change)
        self._side_tables()
        for topic, batch in by_topic.items():
            one = self._apply_topic(topic, batch)
            stats.written += one.written
            stats.deleted += one.deleted
            stats.skipped += one.skipped
        return stats

    def _apply_topic(self, topic: str, batch: Sequence[Change]) -> ApplyStats:
        newest = list(newest_per_key(batch))
        for _ in range(_RESHAPES):
            try:
                stats = self._apply_newest(topic, newest)
            except _Reshape as need:  # the batch was rolled back: change the table, go again
                self._reshape(topic, *need.args)
                continue
            stats.skipped += len(batch) - len(newest)
            return stats
        raise SqlSinkError(f"follower {self.name}: table {self._table_name(topic)} was changed "
                           f"under {_RESHAPES} attempts in a row to write one batch",
                           "run the command again; report it if it keeps happening")

    def _apply_newest(self, topic: str, newest: Sequence[Change]) -> ApplyStats:
        """One transaction: the gate, then the won keys' rows (:class:`_Reshape` when the
        table must be created or changed first)."""
        stats = ApplyStats()
        with self.engine.begin() as conn:
            won = set(self._gate(conn, topic, newest))
            stats.skipped = len(newest) - len(won)
            upserts = [c for c in newest if c.key in won and c.row is not None]
            deletes = [c for c in newest if c.key in won and c.row is None]
            if upserts or deletes:
                self._write_won(conn, topic, upserts, deletes)
            stats.written, stats.deleted = len(upserts), len(deletes)
        return stats

    def _write_won(self, conn: Any, topic: str, upserts: Sequence[Change],
                   deletes: Sequence[Change]) -> None:
        key_columns = list(json.loads((upserts or deletes)[0].key))
        cells = {column: [c.row.get(column) for c in upserts]  # type: ignore[union-attr]
                 for column in dict.fromkeys(col for c in upserts
                                             for col in c.row)}  # type: ignore[union-attr]
        name = self._table_name(topic)
        held = self._held(conn, name, lock=True)
        if held is None and not upserts:
            return  # deletes of rows never written: the side table remembers them
        if held is None or any(self._plan(conn, topic, held, key_columns, cells)):
            raise _Reshape(key_columns, cells)
        self._write(conn, name, held, key_columns, upserts, deletes)

    def _gate(self, conn: Any, topic: str, changes: Sequence[Change]) -> list[str]:
        """The keys of ``changes`` whose positions are newer than what the side table holds,
        recorded there atomically (the row locks last until the transaction ends): one
        statement per batch, the batch bound as arrays (PostgreSQL) or one JSON array
        (SQLite), so no statement grows with the batch."""
        if not changes:
            return []
        self._side_tables()
        now = int(time.time() * 1000)
        dialect = conn.dialect.name
        if dialect == "postgresql":
            return self._gate_postgres(conn, topic, changes, now)
        if dialect == "sqlite":
            return self._gate_sqlite(conn, topic, changes, now)
        raise SqlSinkError(f"follower {self.name}: the {dialect} dialect is not supported yet",
                           "use PostgreSQL or SQLite")

    @staticmethod
    def _gate_postgres(conn: Any, topic: str, changes: Sequence[Change], now: int) -> list[str]:
        """:meth:`_gate` on PostgreSQL: one statement, the batch bound as arrays (``unnest``):
        no statement text grows with the batch, so nothing is compiled per row."""
        import sqlalchemy as sa

        rows = _quoted(conn, ROWS)
        statement = sa.text(
            f"INSERT INTO {rows} (tbl, key, position, deleted, at_ms) "
            "SELECT :tbl, u.key, u.position, u.deleted, :at FROM unnest(CAST(:keys AS text[]), "
            "CAST(:positions AS text[]), CAST(:deleted AS boolean[])) AS u(key, position, "
            "deleted) ON CONFLICT (tbl, key) DO UPDATE SET position = excluded.position, "
            "deleted = excluded.deleted, at_ms = excluded.at_ms "
            f"WHERE {rows}.position < excluded.position RETURNING key")
        result = conn.execute(statement, {
            "tbl": topic, "at": now, "keys": [c.key for c in changes],
            "positions": [c.position.hex() for c in changes],
            "deleted": [c.row is None for c in changes]})
        return [str(row[0]) for row in result]

    @staticmethod
    def _gate_sqlite(conn: Any, topic: str, changes: Sequence[Change], now: int) -> list[str]:
        """:meth:`_gate` on SQLite: one statement, the batch bound as one JSON array read by
        ``json_each`` (``WHERE true``: SQLite's grammar needs it before an upsert clause)."""
        import sqlalchemy as sa

        rows = _quoted(conn, ROWS)
        statement = sa.text(
            f"INSERT INTO {rows} (tbl, key, position, deleted, at_ms) "
            "SELECT :tbl, json_extract(value, '$[0]'), json_extract(value, '$[1]'), "
            "json_extract(value, '$[2]'), :at FROM json_each(:batch) WHERE true "
            "ON CONFLICT (tbl, key) DO UPDATE SET position = excluded.position, "
            "deleted = excluded.deleted, at_ms = excluded.at_ms "
            f"WHERE {rows}.position < excluded.position RETURNING key")
        batch = json.dumps([[c.key, c.position.hex(), c.row is None] for c in changes])
        return [str(row[0]) for row in conn.execute(statement, {"tbl": topic, "at": now,
                                                                "batch": batch})]

    @staticmethod
    def _write(conn: Any, name: str, held: Mapping[str, _Column], key_columns: Sequence[str],
               upserts: Sequence[Change], deletes: Sequence[Change]) -> None:
        """Delete the rows of every won key, then insert the upserts' whole rows (columns a
        row lacks are NULL). PostgreSQL: one statement each, columns bound as arrays."""
        import sqlalchemy as sa

        if conn.dialect.name == "postgresql":
            SqlSink._write_postgres(conn, name, held, key_columns, upserts, deletes)
            return
        table = _quoted(conn, name)
        keys = [held[column] for column in key_columns]
        doomed = [json.loads(change.key) for change in (*deletes, *upserts)]
        for nulls, group in _by_nulls(keys, doomed).items():
            conn.execute(sa.text(f"DELETE FROM {table} WHERE {_key_match(conn, keys, nulls)}"),
                         [{f"k{i}": c.to_db(key[c.name]) for i, c in enumerate(keys)
                           if c.name not in nulls} for key in group])
        if not upserts:
            return
        columns = list(held.values())
        names = ", ".join(_quoted(conn, c.name) for c in columns)
        binds = ", ".join(c.bind(f"p{i}") for i, c in enumerate(columns))
        conn.execute(sa.text(f"INSERT INTO {table} ({names}) VALUES ({binds})"), [
            {f"p{i}": c.to_db(change.row.get(c.name))  # type: ignore[union-attr]
             for i, c in enumerate(columns)} for change in upserts])

    @staticmethod
    def _write_postgres(conn: Any, name: str, held: Mapping[str, _Column],
                        key_columns: Sequence[str], upserts: Sequence[Change],
                        deletes: Sequence[Change]) -> None:
        """:meth:`_write` on PostgreSQL: a ``DELETE`` and an ``INSERT`` whose values come from
        ``unnest`` of one array per column (text, cast to the column's type; bytea as is)."""
        import sqlalchemy as sa

        table = _quoted(conn, name)
        keys = [held[column] for column in key_columns]
        doomed = [json.loads(change.key) for change in (*deletes, *upserts)]
        grouped = _by_nulls(keys, doomed)
        plain = grouped.pop(frozenset(), [])
        if plain:  # keys without NULL (all of a table's): one statement
            arrays, casts = _unnest(conn, keys, "k")
            conn.execute(sa.text(
                f"DELETE FROM {table} WHERE ({', '.join(_quoted(conn, c.name) for c in keys)}) "
                f"IN (SELECT {casts} FROM unnest({arrays}) AS u({_aliases(len(keys))}))"),
                {f"k{i}": [c.to_db(key[c.name]) for key in plain] for i, c in enumerate(keys)})
        for nulls, group in grouped.items():  # a view's NULL groups
            conn.execute(sa.text(f"DELETE FROM {table} WHERE {_key_match(conn, keys, nulls)}"),
                         [{f"k{i}": c.to_db(key[c.name]) for i, c in enumerate(keys)
                           if c.name not in nulls} for key in group])
        if not upserts:
            return
        columns = list(held.values())
        arrays, casts = _unnest(conn, columns, "p")
        names = ", ".join(_quoted(conn, c.name) for c in columns)
        conn.execute(sa.text(
            f"INSERT INTO {table} ({names}) SELECT {casts} FROM unnest({arrays}) "
            f"AS u({_aliases(len(columns))})"),
            {f"p{i}": [c.to_db(change.row.get(c.name))  # type: ignore[union-attr]
                       for change in upserts] for i, c in enumerate(columns)})

    # ----------------------------------------------------------------------- watermarks
    def set_watermark(self, source: str, offset: Mapping[str, Any]) -> None:
        import sqlalchemy as sa

        from cdc.offsets import offset_order

        watermarks = self._side_tables().tables[WATERMARKS]
        with self.engine.begin() as conn:
            held = conn.execute(sa.select(watermarks.c.offset).where(
                watermarks.c.source == source)).scalar()
            if held is not None and offset_order(json.loads(held)) > offset_order(offset):
                return
            conn.execute(sa.delete(watermarks).where(watermarks.c.source == source))
            conn.execute(sa.insert(watermarks).values(source=source,
                                                      offset=json.dumps(dict(offset))))

    def watermark(self, source: str) -> dict[str, Any] | None:
        import sqlalchemy as sa

        watermarks = self._side_tables().tables[WATERMARKS]
        with self.engine.connect() as conn:
            held = conn.execute(sa.select(watermarks.c.offset).where(
                watermarks.c.source == source)).scalar()
        return None if held is None else dict(json.loads(held))

    # -------------------------------------------------------------------------- reading
    def read(self, topic: str, keys: Sequence[str]) -> dict[str, dict[str, str]]:
        import sqlalchemy as sa

        if not keys:
            return {}
        name = self._table_name(topic)
        out: dict[str, dict[str, str]] = {}
        with self.engine.connect() as conn:
            held = self._held(conn, name)
            if not held:
                return {}
            columns = list(held.values())
            select = (f"SELECT {', '.join(c.select(_quoted(conn, c.name)) for c in columns)} "
                      f"FROM {_quoted(conn, name)} WHERE ")
            for key in keys:
                parsed = json.loads(key)
                if any(column not in held for column in parsed):
                    continue
                columns_of_key = [held[column] for column in parsed]
                nulls = frozenset(column for column, value in parsed.items() if value is None)
                row = conn.execute(sa.text(select + _key_match(conn, columns_of_key, nulls)), {
                    f"k{i}": held[column].to_db(value)
                    for i, (column, value) in enumerate(parsed.items())
                    if value is not None}).first()
                if row is not None:
                    out[key] = {c.name: c.from_db(value)
                                for c, value in zip(columns, row, strict=True)
                                if value is not None}
        return out

    def keys(self, topic: str) -> Iterator[str]:
        import sqlalchemy as sa

        rows = self._side_tables().tables[ROWS]
        with self.engine.connect() as conn:
            found = conn.execute(sa.select(rows.c.key).where(
                rows.c.tbl == topic, rows.c.deleted.is_(False))).scalars().all()
        yield from (str(key) for key in found)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
