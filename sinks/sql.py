"""The SQL follower: captured tables as plain tables of any database SQLAlchemy reaches
(PostgreSQL and SQLite tested), behind the version gate of ``sinks/base.py``.

*Work in progress (issue 14).* Not yet: the per-dialect type mapping from the Avro schemas
(columns are the Delta follower's four kinds for now: decimals, times and JSON are text),
identifier length limits, expiring delete markers after ``tombstone_retention`` (they are kept),
views, and dialects other than PostgreSQL and SQLite.

Layout, stated exactly:

* **The user's tables hold live rows only.** Table ``<table>`` (the leader's table name; the
  leader's schema on dialects with schemas, none on SQLite) has one column per leader column and
  a primary key of the log key's columns. Deleted rows are gone, nothing else is added.
* **Positions and delete markers live in a side table**, ``_cdc_rows`` (``tbl``: the log topic,
  ``key``: the key JSON text, ``position``: hex of the position bytes, ``deleted``, ``at_ms``),
  primary key ``(tbl, key)``; watermarks in ``_cdc_watermarks`` (``source``, ``offset`` JSON).
* **The gate is one statement per batch and table**: ``INSERT INTO _cdc_rows ... ON CONFLICT
  (tbl, key) DO UPDATE ... WHERE _cdc_rows.position < excluded.position RETURNING key`` — the
  keys returned are those this writer won, and the side rows stay locked until the transaction
  commits, so a racing writer with an older position waits, then loses. The user table's rows
  of the won keys are written (upsert or delete) in the same transaction.
* **Column kinds** (``bool``, ``int64``, ``float64``, ``string``: ``sinks/delta.py``'s): from the
  values; a value that does not fit its column's kind makes the column text (``canonical_text``
  of every value), as in the Delta follower.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from cdc.errors import CdcError
from sinks.base import ApplyStats, Change, Sink, canonical_text, cell_text

#: the side tables
ROWS = "_cdc_rows"
WATERMARKS = "_cdc_watermarks"
_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class SqlSinkError(CdcError):
    """The SQL follower cannot reach, write or read its database."""


def _kind_of(values: Sequence[Any]) -> str:
    types = {type(v) for v in values if v is not None}
    if types == {bool}:
        return "bool"
    if types == {int} and all(-(2**63) <= v < 2**63 for v in values if v is not None):
        return "int64"
    if types and types <= {float} | ({str} if all(
            v in _SPECIAL_FLOATS for v in values if type(v) is str) else set()) \
            and float in types:
        return "float64"
    return "string"


def _fits(kind: str, value: Any) -> bool:
    if value is None or kind == "string":
        return True
    if kind == "bool":
        return type(value) is bool
    if kind == "int64":
        return type(value) is int and -(2**63) <= value < 2**63
    return type(value) is float or (type(value) is str and value in _SPECIAL_FLOATS)


def _cell(kind: str, value: Any) -> Any:
    """A JSON-form value as stored in a ``kind`` column."""
    if value is None:
        return None
    if kind == "string":
        return value if type(value) is str else canonical_text(value)
    if kind == "float64" and type(value) is str:
        return _SPECIAL_FLOATS[value]
    return value


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


def _sql_types() -> dict[str, Any]:
    import sqlalchemy as sa

    return {"bool": sa.Boolean(), "int64": sa.BigInteger(), "float64": sa.Float(53),
            "string": sa.Text()}


class SqlSink(Sink):
    """One follower in one SQL database (``url``: an SQLAlchemy URL)."""

    def __init__(self, name: str, url: str, tables: Mapping[str, tuple[str, Any]] | None = None,
                 tombstone_retention: float = 24 * 3600.0) -> None:
        self.name = name
        self.url = url
        self.tables = dict(tables or {})
        self.tombstone_retention = tombstone_retention
        self._engine: Any = None
        self._meta: Any = None
        self._kinds: dict[str, dict[str, str]] = {}

    # ----------------------------------------------------------------------- connection
    @property
    def engine(self) -> Any:
        if self._engine is None:
            import sqlalchemy as sa

            try:
                sqlite = self.url.startswith("sqlite")
                database = sa.make_url(self.url).database if sqlite else None
                if database and database != ":memory:":
                    from pathlib import Path

                    Path(database).parent.mkdir(parents=True, exist_ok=True)
                self._engine = sa.create_engine(
                    self.url, connect_args={"timeout": 60} if sqlite else {})
            except Exception as exc:  # noqa: BLE001 - a bad URL, a missing driver or folder
                raise SqlSinkError(f"follower {self.name}: cannot use the database URL "
                                   f"{self._where()}: {exc}",
                                   f"correct followers.{self.name}.url") from None
        return self._engine

    def _where(self) -> str:
        import sqlalchemy as sa

        try:
            return sa.make_url(self.url).render_as_string(hide_password=True)
        except Exception:  # noqa: BLE001 - an unparsable URL
            return "(an unparsable URL)"

    @property
    def _sqlite(self) -> bool:
        return str(self.engine.dialect.name) == "sqlite"

    def check(self) -> None:
        """Connect and create the side tables; :class:`SqlSinkError` with the fix if not."""
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
                with _created_by_another_is_fine():
                    meta.create_all(conn)
            self._meta = meta
        return self._meta

    # ------------------------------------------------------------------------- tables
    def _table_name(self, topic: str) -> str:
        known = self.tables.get(topic)
        table = str(known[1]) if known is not None else topic.split(".", 1)[-1]
        return table.rsplit(".", 1)[-1]

    def _user_table(self, conn: Any, topic: str, key_columns: Sequence[str],
                    cells: Mapping[str, Sequence[Any]]) -> tuple[Any, dict[str, str]]:
        """The user table of ``topic``, created or widened for ``cells``; its column kinds."""
        import sqlalchemy as sa

        name = self._table_name(topic)
        kinds = self._load_kinds(conn, topic, name)
        if not kinds or any(column not in kinds for column in cells):
            self._ddl_lock(conn, name)  # then look again: another writer may have changed it
            kinds = self._load_kinds(conn, topic, name)
        types = _sql_types()
        if not kinds:
            kinds = {column: _kind_of(values) for column, values in cells.items()}
            for column in key_columns:
                kinds.setdefault(column, "string")
            columns = [sa.Column(column, types[kind], primary_key=column in key_columns)
                       for column, kind in kinds.items()]
            with _created_by_another_is_fine():
                sa.Table(name, sa.MetaData(), *columns).create(conn, checkfirst=True)
            kinds = self._load_kinds(conn, topic, name) or kinds
        else:
            for column, values in cells.items():
                held = kinds.get(column)
                if held is None:
                    kinds[column] = _kind_of(values)
                    declared = types[kinds[column]].compile(dialect=conn.dialect)
                    conn.execute(sa.text(f'ALTER TABLE "{name}" ADD COLUMN "{column}" '
                                         f"{declared}"))
                elif held != "string" and not all(_fits(held, v) for v in values):
                    self._widen(conn, name, column)
                    kinds[column] = "string"
        self._kinds[topic] = kinds
        table = sa.Table(name, sa.MetaData(), *[
            sa.Column(column, types[kind], primary_key=column in key_columns)
            for column, kind in kinds.items()])
        return table, kinds

    @staticmethod
    def _ddl_lock(conn: Any, name: str) -> None:
        """Serialize DDL on ``name`` between writers until the transaction ends (PostgreSQL's
        ``CREATE TABLE IF NOT EXISTS`` races otherwise; SQLite's writers are serialized)."""
        import zlib

        import sqlalchemy as sa

        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"),
                         {"k": zlib.crc32(name.encode())})

    def _load_kinds(self, conn: Any, topic: str, name: str) -> dict[str, str]:
        import sqlalchemy as sa

        inspector = sa.inspect(conn)
        if not inspector.has_table(name):
            return {}
        kinds: dict[str, str] = {}
        for column in inspector.get_columns(name):
            kind = column["type"]
            kinds[column["name"]] = ("bool" if isinstance(kind, sa.Boolean) else
                                     "int64" if isinstance(kind, sa.Integer) else
                                     "float64" if isinstance(kind, sa.Float) else "string")
        return kinds

    def _widen(self, conn: Any, name: str, column: str) -> None:
        """``column`` becomes text holding the canonical text of every value it held."""
        import sqlalchemy as sa

        rows = conn.execute(sa.text(f'SELECT rowid, "{column}" FROM "{name}"')).all() \
            if self._sqlite else None
        if self._sqlite:
            # SQLite keeps any value in any column: rewrite the values as text
            for rowid, value in rows or []:
                if value is not None:
                    conn.execute(sa.text(f'UPDATE "{name}" SET "{column}" = :v WHERE rowid = :r'),
                                 {"v": cell_text(value), "r": rowid})
            return
        conn.execute(sa.text(f'ALTER TABLE "{name}" ALTER COLUMN "{column}" TYPE TEXT '
                             f'USING "{column}"::text'))

    # -------------------------------------------------------------------------- apply
    def apply(self, changes: Sequence[Change]) -> ApplyStats:
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
        newest: dict[str, Change] = {}
        for change in batch:
            seen = newest.get(change.key)
            if seen is None or change.position > seen.position:
                newest[change.key] = change
        stats = ApplyStats(skipped=len(batch) - len(newest))
        with self.engine.begin() as conn:
            won = self._gate(conn, topic, list(newest.values()))
            stats.skipped += len(newest) - len(won)
            upserts = [newest[key] for key in won if newest[key].row is not None]
            deletes = [newest[key] for key in won if newest[key].row is None]
            key_columns = list(json.loads(next(iter(newest))).keys()) if newest else []
            if upserts or deletes:
                cells = {column: [c.row.get(column) for c in upserts]  # type: ignore[union-attr]
                         for column in dict.fromkeys(col for c in upserts
                                                     for col in c.row)}  # type: ignore[union-attr]
                table, kinds = self._user_table(conn, topic, key_columns, cells)
                self._write(conn, table, kinds, key_columns, upserts, deletes)
            stats.written += len(upserts)
            stats.deleted += len(deletes)
        return stats

    def _gate(self, conn: Any, topic: str, changes: Sequence[Change]) -> list[str]:
        """The keys of ``changes`` whose positions are newer than what the side table holds,
        recorded there atomically (the row locks last until the transaction ends)."""
        if not changes:
            return []
        rows = self._side_tables().tables[ROWS]
        dialect = conn.dialect.name
        insert: Any
        if dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        elif dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        else:
            raise SqlSinkError(f"follower {self.name}: the {dialect} dialect is not supported "
                               "yet", "use PostgreSQL or SQLite")
        now = int(time.time() * 1000)
        values = [{"tbl": topic, "key": c.key, "position": c.position.hex(),
                   "deleted": c.row is None, "at_ms": now} for c in changes]
        statement: Any = insert(rows).values(values)
        statement = statement.on_conflict_do_update(
            index_elements=[rows.c.tbl, rows.c.key],
            set_={"position": statement.excluded.position, "deleted": statement.excluded.deleted,
                  "at_ms": statement.excluded.at_ms},
            where=rows.c.position < statement.excluded.position).returning(rows.c.key)
        return [str(row[0]) for row in conn.execute(statement)]

    def _write(self, conn: Any, table: Any, kinds: Mapping[str, str], key_columns: Sequence[str],
               upserts: Sequence[Change], deletes: Sequence[Change]) -> None:
        import sqlalchemy as sa

        for change in deletes:
            key = json.loads(change.key)
            conn.execute(sa.delete(table).where(*[
                table.c[column] == _cell(kinds.get(column, "string"), key[column])
                for column in key_columns]))
        if not upserts:
            return
        for change in upserts:  # the whole row: columns it lacks become NULL
            key = json.loads(change.key)
            conn.execute(sa.delete(table).where(*[
                table.c[column] == _cell(kinds.get(column, "string"), key[column])
                for column in key_columns]))
        rows = [{column: _cell(kind, change.row.get(column))  # type: ignore[union-attr]
                 for column, kind in kinds.items()} for change in upserts]
        conn.execute(sa.insert(table), rows)

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
            kinds = self._load_kinds(conn, topic, name)
            if not kinds:
                return {}
            table = sa.Table(name, sa.MetaData(), *[sa.Column(c) for c in kinds])
            for key in keys:
                parsed = json.loads(key)
                row = conn.execute(sa.select(table).where(*[
                    table.c[column] == _cell(kinds.get(column, "string"), value)
                    for column, value in parsed.items()])).mappings().first()
                if row is not None:
                    out[key] = {column: cell_text(value) for column, value in row.items()
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
