"""The search follower: embedded Tantivy full-text indexes, one document per row, the keys
spread over a fixed number of index shards written where the data is (on the executors).

Layout of a follower's directory (``path``; ``docs/followers.md`` shows an example):

``<path>/shards.json`` — ``{"version": 1, "shards": N}``: how many shards the index was created
with (written once, atomically, before any shard; ``followers.<name>.shards`` must say the same)
``<path>/shards/<n>/`` for ``n`` in ``range(N)`` — a Tantivy index each (one writer at a time
per shard: Tantivy's ``.tantivy-writer.lock``)
``<path>/watermarks.json`` — ``{"version": 1, "sources": {<source>: {"offset": {...},
"order": [...]}}}``, replaced atomically (temp file, fsync, rename, fsync of the directory)

**Shards.** A key lives in shard :func:`~cdc.sink.key_group` ``(key JSON bytes, N)`` — the
rule :meth:`SearchSink.owner` gives ``cdc apply``, so the task that owns a key writes its shard
(``Sink.placement`` is ``BY_OWNER``: on a cluster the executors write, never the driver). Every
machine that runs a task must see ``path`` at the same place (a shared file system, as for
Spark's checkpoints). N is fixed at creation: it bounds how many tasks write at once.

One document per key, live or deleted. Fields (names are exact; every one starts with ``_cdc_``
so a column of the same name can still be queried through the JSON fields):

``_cdc_id`` (``raw``, indexed)
    ``<topic>\\n<key JSON>``: the document's identity, used to upsert and delete by term. The key
    JSON never holds a raw newline, so the text after the last ``\\n`` is the key.
``_cdc_topic``, ``_cdc_key`` (``raw``, indexed and stored)
``_cdc_position`` (``raw``, stored)
    Lowercase hex of the position bytes of the record the document reflects.
``_cdc_p0`` .. ``_cdc_p3`` (u64 fast fields)
    The position as four big-endian u64 words: its bytes padded with zeros to 31 bytes, then its
    length as the 32nd byte, so the word tuples order exactly like the bytes (a proper prefix
    sorts first). Positions longer than 31 bytes are refused (every source's are 9 or 25).
``_cdc_hash`` (u64 fast field)
    The first 8 bytes (big-endian) of BLAKE2b of ``_cdc_id``'s UTF-8: maps a hit of a batched
    lookup back to its key without reading the stored document, and slices ``keys()``.
``_cdc_deleted`` (u64 indexed + fast): 1 on a delete marker (absent on a row)
``_cdc_deleted_at`` (u64 fast, markers only): when the delete was applied (ms since the epoch)
``_cdc_row`` (bytes, stored, rows only)
    UTF-8 JSON of :func:`~cdc.sink.row_text`: what :meth:`SearchSink.read` returns, exactly.
``_cdc_text`` (JSON, ``default`` tokenizer), ``_cdc_all`` (text, ``default`` tokenizer)
    The row's text columns as ``{column: text}``, and their texts joined by newlines. Text
    columns: ``text_fields`` for the table if configured, else every column whose JSON-form
    value is a string.
``_cdc_exact`` (JSON, ``raw`` tokenizer)
    Every other non-null column whose text is at most :data:`EXACT_MAX_CHARS` characters,
    indexed whole (exact match, case-sensitive).

Queries (:meth:`SearchSink.search`, ``cdc search``) use Tantivy's query parser with default
fields ``_cdc_all``, ``_cdc_text`` and ``_cdc_exact``: a bare word searches every text column;
``column:word`` is a tokenized match of a text column or an exact match of another column;
delete markers never match. Every shard is searched and the hits merged by score. **Scores are
each shard's own** (BM25 with the shard's term statistics): keys are spread by hash, so shards
hold like samples and scores compare closely, but not exactly as one index's would (on a tiny
index, where a word's frequency differs between shards, the order can differ).

Version gate, per shard of a :meth:`SearchSink.apply` call (shards in parallel threads): the
shard's writer is taken first (waiting up to :data:`LOCK_WAIT_S` while another process — a
replayed or speculative task — holds it), then a searcher of the shard's newest commit is
opened, so the gate sees every other writer's commit. The documents of the batch's keys are
found by ``term_set_query`` on ``_cdc_id`` (in chunks of :data:`LOOKUP_CHUNK`; every matching
document, should an id hold more than one), and their position words and hashes read from the
fast fields in one call per field. A change is applied only when its position is strictly
greater than the newest document's of its id (row or marker). The old documents of the changes
that pass are deleted by one ``term_set_query`` (issued before the adds, so it cannot touch
them), then the new documents are added: a row, or — for a delete or tombstone — a marker (none
when ``tombstone_retention`` is 0). Markers older than the retention are deleted in the same
commit. One ``commit`` per shard: a crash leaves each shard as it was before or after its share
of the batch (the replay is gated). The writer is released after the commit, once the merges it
started are done (a writer dropped at once would abandon them and the segments would pile up),
by a thread of its own: the apply call returns at the commit, and the shard's next writer waits
for the release; opening one first spends the opstamp Tantivy reuses (see
:func:`_fresh_writer`). Readers
(``read``, ``keys``, ``watermark``, ``search``) never take a lock, so ``cdc verify`` and ``cdc
search`` run beside ``cdc apply``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import struct
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tantivy

from cdc.errors import CdcError, check_format
from cdc.events import TableId, split_topic
from cdc.preflight import Step, writable_place
from cdc.sink import (
    ApplyStats,
    Change,
    Placement,
    Sink,
    Topics,
    key_group,
    newest_per_key,
    row_text,
)
from sinks.search_settings import SearchFollowerConfig
from sinks.watermarks import WatermarkFile, replace_file

if TYPE_CHECKING:
    from rich.console import Console

    from cdc.config import Config, FollowerConfig

ID, TOPIC, KEY, POSITION = "_cdc_id", "_cdc_topic", "_cdc_key", "_cdc_position"
WORDS = ("_cdc_p0", "_cdc_p1", "_cdc_p2", "_cdc_p3")
HASH, DELETED, DELETED_AT, ROW = "_cdc_hash", "_cdc_deleted", "_cdc_deleted_at", "_cdc_row"
TEXT, ALL, EXACT = "_cdc_text", "_cdc_all", "_cdc_exact"
FIELDS = frozenset({ID, TOPIC, KEY, POSITION, *WORDS, HASH, DELETED, DELETED_AT, ROW, TEXT, ALL,
                    EXACT})
#: the query parser's default fields (bare words: ``_cdc_all``; ``column:`` -> the JSON fields)
DEFAULT_FIELDS = [ALL, TEXT, EXACT]
#: non-text columns longer than this are stored but not indexed for exact match
EXACT_MAX_CHARS = 256
#: keys per term_set_query of the gate and of read()
LOOKUP_CHUNK = 20_000
#: keys() reads the live documents of a topic in slices of about this many (by hash range)
KEYS_SLICE = 20_000
#: how long a write waits for a shard's writer lock held by another process (seconds)
LOCK_WAIT_S = 120.0
#: the layout file's name and format
LAYOUT, LAYOUT_FORMAT = "shards.json", 1
#: Tantivy's smallest writer heap per indexing thread
_THREAD_HEAP_MIN = 15_000_000
_MAX_POSITION = 31
_WORDS = struct.Struct(">4Q")
_ROW_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"),
                             check_circular=False).encode


class SearchSinkError(CdcError):
    """The search follower's index cannot be opened, written or read."""


class SearchQueryError(SearchSinkError):
    """A query for ``cdc search`` is not valid."""


def doc_id(topic: str, key: str) -> str:
    """``_cdc_id`` of ``key`` (JSON text) in ``topic``."""
    return f"{topic}\n{key}"


def id_hash(identity: str) -> int:
    """``_cdc_hash`` of a document id (64 bits of BLAKE2b)."""
    return int.from_bytes(hashlib.blake2b(identity.encode(), digest_size=8).digest(), "big")


def position_words(position: bytes) -> tuple[int, int, int, int]:
    """The four u64 words of ``position`` (zero-padded to 31 bytes, then its length); their
    tuples order exactly like the bytes. :class:`SearchSinkError` beyond 31 bytes."""
    if len(position) > _MAX_POSITION:
        raise SearchSinkError(f"a position of {len(position)} bytes is longer than the search "
                              f"follower can order ({_MAX_POSITION})",
                              "report this: every known source's positions are 9 or 25 bytes")
    words: tuple[int, int, int, int] = _WORDS.unpack(
        position.ljust(_MAX_POSITION, b"\0") + bytes([len(position)]))
    return words


def build_schema() -> tantivy.Schema:
    """The index's schema (the module docstring describes each field)."""
    builder = tantivy.SchemaBuilder()
    builder.add_text_field(ID, tokenizer_name="raw", index_option="basic")
    builder.add_text_field(TOPIC, stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_text_field(KEY, stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_text_field(POSITION, stored=True, tokenizer_name="raw", index_option="basic")
    for word in WORDS:
        builder.add_unsigned_field(word, fast=True)
    builder.add_unsigned_field(HASH, fast=True)
    builder.add_unsigned_field(DELETED, indexed=True, fast=True)
    builder.add_unsigned_field(DELETED_AT, fast=True)
    builder.add_bytes_field(ROW, stored=True)
    builder.add_json_field(TEXT)
    builder.add_text_field(ALL)
    builder.add_json_field(EXACT, tokenizer_name="raw")
    return builder.build()


@dataclass
class Hit:
    """One row found by :meth:`SearchSink.search`."""

    topic: str
    key: str
    #: the row as :func:`~cdc.sink.row_text`
    row: dict[str, str]
    score: float


@dataclass
class SearchResult:
    """What :meth:`SearchSink.search` found: ``total`` matching rows, the best ``hits``."""

    total: int
    hits: list[Hit] = field(default_factory=list)


class SearchSink(Sink):
    """A search follower in directory ``path`` (layout and gate: the module docstring).

    ``tables`` maps topics to ``(source, TableId)`` (others are split on dots);
    ``text_fields`` maps ``schema.table`` (as in the config) to its text columns;
    ``writer_memory`` is the Tantivy writers' heap of one apply call (bytes, split over the
    shards it writes and their threads); ``tombstone_retention`` (seconds) is how long a delete
    marker stays; ``log_path`` is the change log's directory (kept for messages); ``shards`` is
    the number of index shards (fixed when the index is created). Nothing is opened until used.
    """

    #: the task that owns a key writes its shard (:meth:`owner_groups`)
    placement = Placement.BY_OWNER

    @classmethod
    def from_settings(cls, config: Config, name: str, settings: FollowerConfig,
                      topics: Topics) -> SearchSink:
        assert isinstance(settings, SearchFollowerConfig)
        return cls(name, config.resolve(settings.path), tables=topics,
                   text_fields=settings.text_fields, writer_memory=settings.writer_memory,
                   tombstone_retention=settings.tombstone_retention, log_path=config.log_path,
                   shards=settings.shards)

    def __init__(self, name: str, path: Path, tables: Mapping[str, tuple[str, TableId]],
                 text_fields: Mapping[str, list[str]], writer_memory: int,
                 tombstone_retention: float, log_path: Path, shards: int = 1) -> None:
        self.name = name
        self.path = Path(path)
        self.layout_path = self.path / LAYOUT
        self.watermark_path = self.path / "watermarks.json"
        self.tables = dict(tables)
        self.text_fields = {TableId.parse(table): tuple(columns)
                            for table, columns in text_fields.items()}
        self.writer_memory = int(writer_memory)
        self.retention_ms = int(round(tombstone_retention * 1000))
        self.log_path = Path(log_path)
        self.shard_count = int(shards)
        self.schema = build_schema()
        self.shards = [Shard(self, number) for number in range(self.shard_count)]
        self._laid_out = False
        self._text_columns: dict[str, tuple[str, ...] | None] = {}

    # ------------------------------------------------------------------------------- opening
    def check(self) -> None:
        """Create or open the layout and every shard: :class:`SearchSinkError` with the fix
        when the directory cannot be created, holds something else, or was created with
        another number of shards."""
        self._layout(create=True)
        for shard in self.shards:
            shard.open_index(create=True)

    def preflight(self) -> list[Step]:
        return [Step("directory", lambda: writable_place(
            self.path, f"followers.{self.name}.path", "create it and make it writable by this "
            f"user, or set followers.{self.name}.path elsewhere"))]

    def owner_groups(self, topic: str) -> int:
        """Keys of one shard are written by one task."""
        return self.shard_count

    def shard_of(self, key: str) -> Shard:
        """The shard that holds ``key`` (JSON text)."""
        return self.shards[key_group(key.encode(), self.shard_count)]

    def _layout(self, create: bool) -> bool:
        """Whether the layout is in place (created when ``create``); :class:`SearchSinkError`
        for another layout or another shard count."""
        if self._laid_out:
            return True
        if (self.path / "index" / "meta.json").exists():
            raise SearchSinkError(
                f"follower {self.name}: {self.path} holds a search index of an older layout "
                "(one index at index/, not shards)", "delete the directory and the follower's "
                "checkpoint: `cdc apply` rebuilds it from the log")
        try:
            layout = json.loads(self.layout_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            if not create:
                return False
            layout = self._create_layout()
        except NotADirectoryError as exc:
            raise self._cannot_create(self.path, exc) from None
        except (OSError, ValueError) as exc:
            raise SearchSinkError(f"follower {self.name}: cannot read {self.layout_path} "
                                  f"({exc})", "check the directory's permissions; if it is "
                                  "damaged, delete the directory and the follower's checkpoint "
                                  "so `cdc apply` rebuilds it") from None
        check_format(layout.get("version") if isinstance(layout, dict) else None, LAYOUT_FORMAT,
                     f"follower {self.name}: the search index {self.path}",
                     fix="run the cdc version that wrote it (or a newer one)",
                     error=SearchSinkError)
        if layout.get("shards") != self.shard_count:
            raise SearchSinkError(
                f"follower {self.name}: the search index at {self.path} was created with "
                f"{layout.get('shards')} shards, the config says {self.shard_count}",
                f"set followers.{self.name}.shards: {layout.get('shards')}, or delete the "
                "directory and the follower's checkpoint to rebuild it with "
                f"{self.shard_count}")
        self._laid_out = True
        return True

    @contextlib.contextmanager
    def creating(self) -> Iterator[None]:
        """Held while this process creates the layout or a shard: writers racing on a new
        index (a speculative or replayed task) create each part once, and never mistake the
        other's half-made shard for a foreign directory."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            handle = os.open(self.path / ".create.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise self._cannot_create(self.path, exc) from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
        finally:
            os.close(handle)

    def _create_layout(self) -> dict[str, Any]:
        with self.creating():
            with contextlib.suppress(FileNotFoundError):  # another writer was first
                layout: dict[str, Any] = json.loads(self.layout_path.read_text(encoding="utf-8"))
                return layout
            return self._write_layout()

    def _write_layout(self) -> dict[str, Any]:
        shards = self.path / "shards"
        try:
            if shards.is_dir() and any(shards.iterdir()):
                raise SearchSinkError(
                    f"follower {self.name}: {shards} is not empty and no {LAYOUT} says what it "
                    "holds", f"empty {self.path}, or point followers.{self.name}.path at "
                    "another directory")
            layout = {"version": LAYOUT_FORMAT, "shards": self.shard_count}
            replace_file(self.layout_path, json.dumps(layout))
        except OSError as exc:
            raise self._cannot_create(self.path, exc) from None
        return layout

    def _cannot_create(self, where: Path, exc: OSError) -> SearchSinkError:
        why = "a file is in its way" if isinstance(exc, NotADirectoryError) else exc.strerror
        return SearchSinkError(f"follower {self.name}: cannot create the index directory "
                               f"{where} ({why})", "make it writable (or move the file), or "
                               f"set followers.{self.name}.path elsewhere")

    def _error(self, action: str, where: Path, exc: Exception) -> SearchSinkError:
        text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        return SearchSinkError(f"follower {self.name}: cannot {action} the search index at "
                               f"{where}: {text}",
                               "check the directory's disk space and permissions")

    def _searchers(self) -> list[tuple[Shard, tantivy.Searcher]]:
        """A searcher on each shard's newest commit (none before the index exists)."""
        if not self._layout(create=False):
            return []
        found = [(shard, shard.searcher()) for shard in self.shards]
        return [(shard, searcher) for shard, searcher in found if searcher is not None]

    def close(self) -> None:
        """Wait until every writer is released, then forget the opened indexes."""
        for shard in self.shards:
            shard.released()
            shard.index = None

    # ---------------------------------------------------------------------------------- apply
    def apply(self, changes: Sequence[Change]) -> ApplyStats:
        """The gate and the writes of the module docstring: one commit per shard written, the
        shards in parallel threads."""
        self._layout(create=True)
        by_shard: dict[int, list[Change]] = {}
        for change in newest_per_key(changes):  # at most one per key is the contract
            by_shard.setdefault(self.shard_of(change.key).number, []).append(change)
        now_ms = int(time.time() * 1000)
        heap = max(_THREAD_HEAP_MIN, self.writer_memory // max(1, len(by_shard)))
        jobs = [(self.shards[number], batch) for number, batch in sorted(by_shard.items())]
        if len(jobs) == 1:
            results = [jobs[0][0].apply(jobs[0][1], heap, now_ms)]
        else:
            with ThreadPoolExecutor(min(len(jobs), os.cpu_count() or 1, 8)) as pool:
                results = list(pool.map(lambda job: job[0].apply(job[1], heap, now_ms), jobs))
        stats = ApplyStats()
        for one in results:
            stats.written += one.written
            stats.deleted += one.deleted
            stats.skipped += one.skipped
        return stats

    def _columns_of(self, change: Change) -> tuple[str, ...] | None:
        """The configured text columns of ``change``'s table (``None``: every string)."""
        if change.topic not in self._text_columns:
            known = self.tables.get(change.topic)
            table = known[1] if known is not None else split_topic(change.topic)[1]
            self._text_columns[change.topic] = self.text_fields.get(table)
        return self._text_columns[change.topic]

    def _document(self, identity: str, digest: int, change: Change) -> tantivy.Document:
        row = change.row
        assert row is not None
        texts = row_text(row)
        columns = self._columns_of(change)
        if columns is None:
            text = {c: texts[c] for c, value in row.items() if type(value) is str}
        else:
            text = {c: texts[c] for c in columns if c in texts}
        exact = {c: t for c, t in texts.items() if c not in text and len(t) <= EXACT_MAX_CHARS}
        doc = _common(identity, digest, change)
        doc.add_bytes(ROW, _ROW_JSON(texts).encode())
        if text:
            doc.add_json(TEXT, text)
            doc.add_text(ALL, "\n".join(text.values()))
        if exact:
            doc.add_json(EXACT, exact)
        return doc

    @staticmethod
    def _marker(identity: str, digest: int, change: Change, now_ms: int) -> tantivy.Document:
        doc = _common(identity, digest, change)
        doc.add_unsigned(DELETED, 1)
        doc.add_unsigned(DELETED_AT, now_ms)
        return doc

    # ----------------------------------------------------------------------------- watermarks
    def set_watermark(self, source: str, offset: Mapping[str, Any]) -> None:
        """Store ``offset`` for ``source`` unless the stored one orders after it
        (``sinks/watermarks.py``: atomic, durable, only forward)."""
        WatermarkFile(self.watermark_path, self.name, SearchSinkError).advance(source, offset)

    def watermark(self, source: str) -> dict[str, Any] | None:
        return WatermarkFile(self.watermark_path, self.name, SearchSinkError).get(source)

    # ------------------------------------------------------------------------------- reading
    def _live(self, *clauses: tuple[tantivy.Occur, tantivy.Query]) -> tantivy.Query:
        """``clauses`` and not a delete marker."""
        not_deleted = (tantivy.Occur.MustNot, tantivy.Query.term_query(self.schema, DELETED, 1))
        return tantivy.Query.boolean_query([*clauses, not_deleted])

    def read(self, topic: str, keys: Sequence[str]) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        searchers = dict(self._searchers())
        by_shard: dict[Shard, list[str]] = {}
        for key in dict.fromkeys(keys):
            by_shard.setdefault(self.shard_of(key), []).append(key)
        for shard, wanted in by_shard.items():
            searcher = searchers.get(shard)
            if searcher is None:
                continue
            for start in range(0, len(wanted), LOOKUP_CHUNK):
                ids = [doc_id(topic, key) for key in wanted[start:start + LOOKUP_CHUNK]]
                query = self._live((tantivy.Occur.Must,
                                    tantivy.Query.term_set_query(self.schema, ID, ids)))
                for _, address in searcher.search(query, len(ids), count=False).hits:
                    doc = searcher.doc(address)
                    out[_stored(doc, KEY)] = json.loads(_stored(doc, ROW))
        return out

    def keys(self, topic: str) -> Iterator[str]:
        """Every live key of ``topic``, once each, from one snapshot of each shard: the topic's
        documents in slices of ``_cdc_hash`` ranges of about :data:`KEYS_SLICE` documents."""
        for _, searcher in self._searchers():
            yield from self._shard_keys(searcher, topic)

    def _shard_keys(self, searcher: tantivy.Searcher, topic: str) -> Iterator[str]:
        in_topic = (tantivy.Occur.Must, tantivy.Query.term_query(self.schema, TOPIC, topic))
        total = _count(searcher, self._live(in_topic))
        if not total:
            return
        slices = -(-total // KEYS_SLICE)
        step = -(-(1 << 64) // slices)
        ranges = [(lo, min(lo + step, 1 << 64) - 1) for lo in range(0, 1 << 64, step)]
        while ranges:
            lo, hi = ranges.pop(0)
            limit = 2 * KEYS_SLICE
            query = self._live(in_topic, (tantivy.Occur.Must, tantivy.Query.range_query(
                self.schema, HASH, tantivy.FieldType.Unsigned, lo, hi)))
            hits = searcher.search(query, limit, count=False).hits
            if len(hits) >= limit and lo < hi:  # a crowded slice: halve it
                middle = lo + (hi - lo) // 2
                ranges[:0] = [(lo, middle), (middle + 1, hi)]
                continue
            for _, address in hits:
                yield _stored(searcher.doc(address), KEY)

    # ------------------------------------------------------------------------------- search
    def search(self, text: str, *, topics: Sequence[str] | None = None,
               limit: int = 20) -> SearchResult:
        """The live rows matching ``text`` (Tantivy query syntax, the module docstring's
        default fields), best first over every shard (each shard's scores: the module
        docstring), at most ``limit``; only ``topics`` when given. :class:`SearchQueryError`
        for bad syntax; :class:`SearchSinkError` when there is no index yet."""
        searchers = self._searchers()
        if not searchers:
            raise SearchSinkError(f"follower {self.name} has no search index yet (nothing at "
                                  f"{self.path})",
                                  f"run `cdc apply --follower {self.name}` first")
        index = searchers[0][0].index
        assert index is not None
        try:
            parsed = index.parse_query(text, default_field_names=DEFAULT_FIELDS,
                                       allow_regexes=True)
        except ValueError as exc:
            raise SearchQueryError(
                f"the query {text!r} is not valid: {str(exc).strip()[:300]}",
                "words match any text column; column:word, column:\"a phrase\", "
                "column:\"phrase pref\"*, AND / OR / NOT, (grouping), _cdc_all:/regex/; "
                "backslash-escape spaces and dots in column names (docs/followers.md)"
                ) from None
        clauses = [(tantivy.Occur.Must, parsed)]
        if topics is not None:
            clauses.append((tantivy.Occur.Must,
                            tantivy.Query.term_set_query(self.schema, TOPIC, list(topics))))
        query = self._live(*clauses)
        total = 0
        scored: list[tuple[float, int, Any]] = []
        for order, (_, searcher) in enumerate(searchers):
            try:
                found = searcher.search(query, max(1, limit), count=True)
            except ValueError as exc:
                raise SearchQueryError(f"the query {text!r} cannot run: "
                                       f"{str(exc).strip()[:300]}",
                                       "simplify the query (docs/followers.md)") from None
            total += int(found.count)  # type: ignore[attr-defined]
            scored.extend((float(score), order, (searcher, address))
                          for score, address in found.hits)
        scored.sort(key=lambda hit: (-hit[0], hit[1]))
        result = SearchResult(total if limit > 0 else 0)
        for score, _, (searcher, address) in scored[:max(0, limit)]:
            doc = searcher.doc(address)
            result.hits.append(Hit(_stored(doc, TOPIC), _stored(doc, KEY),
                                   json.loads(_stored(doc, ROW)), score))
        return result


class Shard:
    """Shard ``number`` of ``sink``'s index: ``<path>/shards/<number>/``, a Tantivy index."""

    def __init__(self, sink: SearchSink, number: int) -> None:
        self.sink = sink
        self.number = number
        self.path = sink.path / "shards" / str(number)
        self.index: tantivy.Index | None = None
        #: the thread releasing the last writer once its merges are done (:meth:`release`)
        self.releasing: threading.Thread | None = None

    def open_index(self, create: bool) -> tantivy.Index | None:
        """The index (created when ``create``; ``None`` when absent and not ``create``)."""
        if self.index is not None:
            return self.index
        exists = (self.path / "meta.json").exists()
        if not exists and not create:
            return None
        if not exists:
            with self.sink.creating():
                self.index = self._create()
                return self.index
        self._check_layout()
        try:
            index = tantivy.Index.open(str(self.path))
            index.config_reader("manual")
        except ValueError as exc:
            raise self.sink._error("open", self.path, exc) from None
        self.index = index
        return index

    def _create(self) -> tantivy.Index:
        """Create the shard's index (the caller holds :meth:`SearchSink.creating`), or open it
        when another writer just did."""
        name = self.sink.name
        try:
            if (self.path / "meta.json").exists():
                self._check_layout()
                index = tantivy.Index.open(str(self.path))
            else:
                self.path.mkdir(parents=True, exist_ok=True)
                if any(self.path.iterdir()):
                    raise SearchSinkError(
                        f"follower {name}: {self.path} is not empty and holds no Tantivy index",
                        f"empty it, or point followers.{name}.path at another directory")
                index = tantivy.Index(self.sink.schema, str(self.path), reuse=False)
            index.config_reader("manual")
        except OSError as exc:
            raise self.sink._cannot_create(self.path, exc) from None
        except ValueError as exc:
            raise self.sink._error("open", self.path, exc) from None
        return index

    def _check_layout(self) -> None:
        name = self.sink.name
        try:
            meta = json.loads((self.path / "meta.json").read_text())
            names = {entry["name"] for entry in meta["schema"]}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SearchSinkError(f"follower {name}: cannot read {self.path}/meta.json "
                                  f"({exc})", "check the directory's permissions; if the index "
                                  "is damaged, delete it and the follower's checkpoint, then "
                                  "`cdc apply` rebuilds it") from None
        if names != FIELDS:
            raise SearchSinkError(
                f"follower {name}: {self.path} holds a Tantivy index that is not a cdc search "
                "index of this version",
                f"point followers.{name}.path elsewhere, or delete the directory and the "
                "follower's checkpoint so `cdc apply` rebuilds it from the log")

    def searcher(self, create: bool = False) -> tantivy.Searcher | None:
        """A searcher on the newest commit (``None``: no index yet). A reload that fails is
        tried again twice: in another process than the writer's, a merge may delete the
        files of the commit being opened (the next commit names their replacement)."""
        index = self.open_index(create)
        if index is None:
            return None
        for attempt in range(3):
            try:
                index.reload()
                return index.searcher()
            except ValueError as exc:
                if attempt == 2:
                    raise self.sink._error("read", self.path, exc) from None
                time.sleep(0.05)
        raise AssertionError("unreachable")

    def take_writer(self, heap: int) -> tantivy.IndexWriter:
        """The shard's writer, made safe by :func:`_fresh_writer`; waits (up to
        :data:`LOCK_WAIT_S`) while another process holds it."""
        index = self.open_index(create=True)
        assert index is not None
        self.released()
        threads = max(1, min(os.cpu_count() or 1, 8, heap // _THREAD_HEAP_MIN))
        deadline = time.monotonic() + LOCK_WAIT_S
        pause = 0.005
        while True:
            try:
                writer = index.writer(heap_size=heap, num_threads=threads)
                break
            except ValueError as exc:
                if "LockBusy" not in str(exc):
                    raise self.sink._error("open the index writer of", self.path, exc) from None
                if time.monotonic() >= deadline:
                    raise SearchSinkError(
                        f"follower {self.sink.name}: the search index shard at {self.path} "
                        f"stayed locked by another writer for {LOCK_WAIT_S:.0f} s — most likely "
                        "another `cdc apply` of this follower is running",
                        "stop the other `cdc apply` (one apply per follower), or give this "
                        f"follower its own followers.{self.sink.name}.path") from None
                time.sleep(pause)
                pause = min(0.1, pause * 2)
        _fresh_writer(writer)
        return writer

    def apply(self, changes: Sequence[Change], heap: int, now_ms: int) -> ApplyStats:
        """The gate and the writes of ``changes`` (this shard's, one per key) in one commit."""
        sink = self.sink
        stats = ApplyStats()
        writer = self.take_writer(heap)
        try:
            searcher = self.searcher(create=True)  # after the lock: every commit is in it
            assert searcher is not None
            newest = {doc_id(change.topic, change.key): change for change in changes}
            hashes = {identity: id_hash(identity) for identity in newest}
            stored = self._held(searcher, hashes)
            passing: list[tuple[str, Change]] = []
            replaced: list[str] = []
            for identity, change in newest.items():
                old = stored.get(identity)
                if old is not None:
                    if change.position <= old:
                        stats.skipped += 1
                        continue
                    replaced.append(identity)
                passing.append((identity, change))
            if replaced:  # one delete query, before the adds: it cannot touch them
                writer.delete_documents_by_query(
                    tantivy.Query.term_set_query(sink.schema, ID, replaced))
            for identity, change in passing:
                if change.row is None:
                    stats.deleted += 1
                    if sink.retention_ms > 0:
                        writer.add_document(sink._marker(identity, hashes[identity], change,
                                                         now_ms))
                else:
                    stats.written += 1
                    writer.add_document(sink._document(identity, hashes[identity], change))
            purged = self._purge_markers(searcher, writer, now_ms)
            if replaced or passing or purged:
                writer.commit()
        except BaseException as exc:
            with contextlib.suppress(ValueError):
                writer.rollback()
            _release(writer)
            if isinstance(exc, ValueError):
                raise sink._error("write", self.path, exc) from None
            raise
        self.release(writer)
        return stats

    def release(self, writer: tantivy.IndexWriter) -> None:
        """Release ``writer`` (and the shard's lock) once the merges its commit started are
        done, in a thread of its own: the batch is committed and its caller goes on (a merge
        of a large index takes a third of a second and more). The shard's next writer --
        this process's or another's -- waits for it (:meth:`take_writer`)."""
        self.releasing = threading.Thread(target=_release, args=(writer,),
                                          name=f"search-shard-{self.number}-merges")
        self.releasing.start()

    def released(self) -> None:
        """Wait until this process's last writer of the shard is released."""
        if self.releasing is not None:
            self.releasing.join()
            self.releasing = None

    def _held(self, searcher: tantivy.Searcher, hashes: Mapping[str, int]) -> dict[str, bytes]:
        """Per document id of ``hashes`` (id -> :func:`id_hash`) that has a document (row or
        marker): the position it holds."""
        by_hash: dict[int, str] = {}
        colliding: list[str] = []
        for identity, digest in hashes.items():
            if digest in by_hash:
                colliding.append(identity)  # 64-bit collision in one batch: look up alone
            else:
                by_hash[digest] = identity
        out: dict[str, bytes] = {}
        unique = list(by_hash.values())
        for start in range(0, len(unique), LOOKUP_CHUNK):
            self._lookup(searcher, unique[start:start + LOOKUP_CHUNK], by_hash, out)
        for identity in colliding:
            self._lookup(searcher, [identity], {hashes[identity]: identity}, out)
        return out

    def _lookup(self, searcher: tantivy.Searcher, ids: list[str], by_hash: Mapping[int, str],
                out: dict[str, bytes]) -> None:
        query = tantivy.Query.term_set_query(self.sink.schema, ID, ids)
        limit = len(ids)
        while True:  # every matching document: an id may hold more than one
            found = searcher.search(query, limit, count=True)
            total = int(found.count)  # type: ignore[attr-defined]
            if total <= limit:
                break
            limit = total
        hits = found.hits
        if not hits:
            return
        addresses = [address for _, address in hits]
        hashes = searcher.fast_field_values(HASH, addresses)
        columns = [searcher.fast_field_values(word, addresses) for word in WORDS]
        pack = _WORDS.pack
        for digest, w0, w1, w2, w3 in zip(hashes, *columns, strict=True):
            identity = by_hash[int(digest)]
            position = pack(w0, w1, w2, w3)[:int(w3) & 0xFF]
            held = out.get(identity)
            if held is None or position > held:  # the newest document of the id decides
                out[identity] = position

    def _purge_markers(self, searcher: tantivy.Searcher, writer: tantivy.IndexWriter,
                       now_ms: int) -> bool:
        """Delete (uncommitted) the markers older than the retention; True if there were."""
        retention = self.sink.retention_ms
        cutoff = now_ms - retention
        if retention <= 0 or cutoff <= 0:
            return False
        expired = tantivy.Query.range_query(self.sink.schema, DELETED_AT,
                                            tantivy.FieldType.Unsigned, 0, cutoff,
                                            include_upper=False)
        if not _count(searcher, expired):
            return False
        writer.delete_documents_by_query(expired)
        return True


def _common(identity: str, digest: int, change: Change) -> tantivy.Document:
    doc = tantivy.Document()
    doc.add_text(ID, identity)
    doc.add_text(TOPIC, change.topic)
    doc.add_text(KEY, change.key)
    doc.add_text(POSITION, change.position.hex())
    w0, w1, w2, w3 = position_words(change.position)
    doc.add_unsigned(WORDS[0], w0)
    doc.add_unsigned(WORDS[1], w1)
    doc.add_unsigned(WORDS[2], w2)
    doc.add_unsigned(WORDS[3], w3)
    doc.add_unsigned(HASH, digest)
    return doc


def _release(writer: tantivy.IndexWriter) -> None:
    """Wait for ``writer``'s merges, which then releases it: a writer dropped at once would
    abandon them and the segments would pile up. A failed merge leaves the commit intact."""
    with contextlib.suppress(ValueError):
        writer.wait_merging_threads()


def _fresh_writer(writer: tantivy.IndexWriter) -> None:
    """Make a freshly opened (or rolled back) writer safe after a crash. Tantivy restarts a
    writer's opstamps *at* the last commit's opstamp, so (1) its first operation shares that
    opstamp: a merge of committed segments started before the writer's first commit targets
    that same opstamp, skips the operation on segments whose deletes are already "at" it and,
    when the merge's first segment applied it, never applies it to the merged segment — the
    documents it deleted come back (a row beside its newer marker); and (2) a replay of the
    killed run's operations reaches the same commit opstamp, whose ``<segment>.<opstamp>.del``
    files the killed commit may have left behind: every commit then fails with
    FileAlreadyExists. So: remove the files no commit references, then spend the reused
    opstamp on a delete that matches nothing."""
    writer.garbage_collect_files()
    writer.delete_documents_by_term(ID, "")  # no document has an empty _cdc_id


def _count(searcher: tantivy.Searcher, query: tantivy.Query) -> int:
    """How many live documents match ``query``."""
    return int(searcher.search(query, 1, count=True).count)  # type: ignore[attr-defined]


def _stored(doc: tantivy.Document, name: str) -> Any:
    """The stored value of field ``name`` (every document has the fields read this way)."""
    value = doc.get_first(name)
    if value is None:
        raise SearchSinkError(f"a document of the search index lacks its {name} field",
                              "the index is damaged: delete it and the follower's checkpoint, "
                              "then `cdc apply` rebuilds it from the log")
    return value


# ------------------------------------------------------------------------------ cdc search

#: ``cdc search`` shows every column of the rows when they have at most this many, else the
#: first ones (table order)
SHOWN_COLUMNS = 6
#: characters of a value ``cdc search`` shows
SHOWN_CHARS = 60


def search_follower(config: Config, name: str, query: str, *, table: str | None = None,
                    limit: int = 20) -> SearchResult:
    """``cdc search``: the rows of search follower ``name`` matching ``query`` (only ``table``,
    ``schema.table``, when given). :class:`CdcError` with the fix for an unknown follower,
    one of another kind, a table it does not follow, a missing index or a bad query."""
    follower = config.follower(name)
    if not isinstance(follower, SearchFollowerConfig):
        searchable = [n for n, f in config.followers.items()
                      if isinstance(f, SearchFollowerConfig)]
        raise CdcError(f"follower {name} is of kind {follower.kind}; `cdc search` reads search "
                       "followers", "pass a follower of kind search (in this config: "
                       f"{', '.join(searchable) or 'none'})")
    topics: list[str] | None = None
    if table is not None:
        wanted = TableId.parse(table)
        followed = config.follower_topics(name)
        topics = [topic for topic, (_, held) in followed.items() if held == wanted]
        if not topics:
            shown = ", ".join(sorted({str(held) for _, held in followed.values()})) or "none"
            raise CdcError(f"follower {name} does not follow table {wanted}",
                           f"pass one of its tables to --table ({shown})")
    sink = SearchSink.from_settings(config, name, follower, config.follower_topics(name))
    try:
        return sink.search(query, topics=topics, limit=limit)
    finally:
        sink.close()


def _shown(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 1] + "…"


def print_search(result: SearchResult, console: Console) -> None:
    """A line with the number of matching rows, then per topic (best hit first) a table of
    its hits: key, score, then every column, or the first :data:`SHOWN_COLUMNS` (table order)
    when the rows have more."""
    if not result.hits:
        console.print("no matching rows")
        return
    shown = f", the best {len(result.hits):,}" if result.total > len(result.hits) else ""
    console.print(f"{result.total:,} matching row(s){shown}", highlight=False)
    by_topic: dict[str, list[Hit]] = {}
    for hit in result.hits:
        by_topic.setdefault(hit.topic, []).append(hit)
    for topic, hits in by_topic.items():
        console.print(_hits_table(topic, hits))


def _hits_table(title: str, hits: list[Hit]) -> Any:
    from rich.table import Table
    from rich.text import Text

    columns = list(dict.fromkeys(column for hit in hits for column in hit.row))
    hidden = max(0, len(columns) - SHOWN_COLUMNS)
    table = Table(title=Text(f"{title}: {len(hits):,} row(s)"), title_justify="left",
                  caption=f"{hidden} more column(s) not shown" if hidden else None)
    for heading in ["key", "score", *columns[:SHOWN_COLUMNS]]:
        table.add_column(Text(heading), justify="right" if heading == "score" else "left",
                         overflow="fold")
    for hit in hits:
        cells = [hit.key, f"{hit.score:.2f}"]
        cells += [_shown(hit.row.get(column, "")) for column in columns[:SHOWN_COLUMNS]]
        table.add_row(*(Text(cell) for cell in cells))
    return table
