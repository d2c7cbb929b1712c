"""The search follower: an embedded Tantivy full-text index, one document per row.

Layout of a follower's directory (``path``; ``docs/followers.md`` shows an example):

``<path>/shards.json`` — ``{"format": 2, "shards": N}``: the layout's version and the shard
count, fixed when the index is created (``followers.<name>.shards``)
``<path>/shard-<i>/`` — shard ``i`` (``0 <= i < N``): a Tantivy index holding the documents of
the keys whose ``crc32(key JSON bytes) % N`` is ``i`` (:func:`cdc.sink.key_group`). One writer
at a time per shard (Tantivy's ``.tantivy-writer.lock``): the executor task that owns the
shard's keys takes it for one batch and releases it (the sink's placement is ``BY_OWNER``);
a task that finds it taken (a replayed or speculative duplicate) waits for it. Every process
that writes or reads a shard must see the same directory: on a cluster, ``path`` is on storage
shared by the driver and every executor (NFS or similar).
``<path>/watermarks.json`` — ``{"version": 1, "sources": {<source>: {"offset": {...},
"order": [...]}}}``, replaced atomically (temp file, fsync, rename, fsync of the directory)

Format 1 (before shards): one index at ``<path>/index/``, no ``shards.json``; it is read and
written as a single shard.

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
delete markers never match. Every shard is queried and the hits merged by score; each shard
scores with its own term statistics (BM25's document frequencies), so scores from different
shards differ slightly from one index's — matching rows and counts are exact.

Version gate, per :meth:`SearchSink.apply` call: the documents of the batch's keys are found by
``term_set_query`` on ``_cdc_id`` (in chunks of :data:`LOOKUP_CHUNK`; every matching document,
should an id hold more than one), and their position words and hashes read from the fast fields
in one call per field. A change is applied only when its position is strictly greater than the
newest document's of its id (row or marker), read after the shard's writer is taken (so
from the newest commit: no other writer can commit meanwhile). The old documents of the
changes that pass are deleted by one ``term_set_query`` (issued before the adds, so it cannot
touch them), then the new documents are added: a row, or — for a delete or tombstone — a marker
(none when ``tombstone_retention`` is 0). Markers older than the retention are deleted in a
later commit of their shard (a batch that writes it). One ``commit`` per shard per call: a crash
leaves each shard as it was before or after its part of the batch (replayed, the gate skips what
was written). The writer is taken for the call and released after it with its merges finished
(opening it first spends the opstamp Tantivy reuses: see :func:`_fresh_writer`); readers
(``read``, ``keys``, ``watermark``, ``search``) never take the lock, so ``cdc verify`` and
``cdc search`` run beside ``cdc apply``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tantivy

from cdc.errors import CdcError, check_format
from cdc.events import TableId, split_topic
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
from sinks.search_settings import DEFAULT_SHARDS, SearchFollowerConfig
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
#: how long a task waits for a shard's writer another task holds
LOCK_WAIT_S = 120.0
#: the layout file of a sharded index, and its format (the format-1 layout: one ``index/``)
LAYOUT_FILE = "shards.json"
FORMAT = 2
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


class _Shard:
    """One Tantivy index of a search follower (a shard, or the whole follower in the format-1
    layout): the gate and the writes of the module docstring, for the keys it holds."""

    def __init__(self, follower: str, index_path: Path, schema: tantivy.Schema,
                 writer_memory: int, retention_ms: int, lock_wait: float) -> None:
        self.follower = follower
        self.index_path = index_path
        self.schema = schema
        self.writer_memory = writer_memory
        self.retention_ms = retention_ms
        self.lock_wait = lock_wait
        self._index: tantivy.Index | None = None

    # ------------------------------------------------------------------------------- opening
    def open_index(self, create: bool) -> tantivy.Index | None:
        """The index (created when ``create``; ``None`` when absent and not ``create``)."""
        if self._index is not None:
            return self._index
        exists = (self.index_path / "meta.json").exists()
        if not exists and not create:
            return None
        if exists:
            self._check_layout()
        try:
            if not exists:
                self.index_path.mkdir(parents=True, exist_ok=True)
                if any(p for p in self.index_path.iterdir() if not p.name.startswith(".")):
                    raise SearchSinkError(
                        f"follower {self.follower}: {self.index_path} is not empty and holds no "
                        "Tantivy index", f"empty it, or point followers.{self.follower}.path "
                        "at another directory")
                index = tantivy.Index(self.schema, str(self.index_path), reuse=False)
            else:
                index = tantivy.Index.open(str(self.index_path))
            index.config_reader("manual")
        except OSError as exc:
            raise SearchSinkError(
                f"follower {self.follower}: cannot create the index directory "
                f"{self.index_path} ({exc.strerror})", "make it writable, or set "
                f"followers.{self.follower}.path elsewhere") from None
        except ValueError as exc:
            raise self.error("open", exc) from None
        self._index = index
        return index

    def _check_layout(self) -> None:
        try:
            meta = json.loads((self.index_path / "meta.json").read_text())
            names = {entry["name"] for entry in meta["schema"]}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SearchSinkError(f"follower {self.follower}: cannot read {self.index_path}/"
                                  f"meta.json ({exc})", "check the directory's permissions; "
                                  "if the index is damaged, delete it and the follower's "
                                  "checkpoint, then `cdc apply` rebuilds it") from None
        if names != FIELDS:
            raise SearchSinkError(
                f"follower {self.follower}: {self.index_path} holds a Tantivy index that is not "
                "a cdc search index of this version",
                f"point followers.{self.follower}.path elsewhere, or delete the directory and "
                "the follower's checkpoint so `cdc apply` rebuilds it from the log")

    def error(self, action: str, exc: Exception) -> SearchSinkError:
        text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        return SearchSinkError(f"follower {self.follower}: cannot {action} the search index at "
                               f"{self.index_path}: {text}",
                               "check the directory's disk space and permissions")

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
                    raise self.error("read", exc) from None
                time.sleep(0.05)
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def writing(self) -> Iterator[tantivy.IndexWriter]:
        """This shard's writer, for one batch: taken (waiting up to ``lock_wait`` s while
        another task holds it: a replayed or speculative task, a task of the previous batch in
        another executor), made safe (:func:`_fresh_writer`), and released at the end with its
        merges finished, so any process can take it next."""
        index = self.open_index(create=True)
        assert index is not None
        threads = max(1, min(os.cpu_count() or 1, 8, self.writer_memory // _THREAD_HEAP_MIN))
        deadline = time.monotonic() + self.lock_wait
        pause = 0.005
        while True:
            try:
                writer = index.writer(heap_size=self.writer_memory, num_threads=threads)
                break
            except ValueError as exc:
                if "LockBusy" not in str(exc):
                    raise self.error("open the index writer of", exc) from None
                if time.monotonic() > deadline:
                    raise SearchSinkError(
                        f"follower {self.follower}: the search index shard {self.index_path} "
                        f"stayed locked by another writer for {self.lock_wait:.0f} s",
                        "a task of this follower is stuck (or another program writes the "
                        "index): the task is retried; if this repeats, stop the other writer"
                        ) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.2)
        try:
            _fresh_writer(writer)
            yield writer
        finally:
            with contextlib.suppress(ValueError):  # a failed merge leaves the commit intact
                writer.wait_merging_threads()  # releases the lock

    def close(self) -> None:
        self._index = None

    # ---------------------------------------------------------------------------------- apply
    def apply(self, changes: Sequence[Change], document: Any) -> ApplyStats:
        """The gate and the writes of the module docstring for ``changes`` (at most one per
        key), in one commit; ``document(identity, hash, change)`` makes a row's document."""
        stats = ApplyStats()
        newest = {doc_id(change.topic, change.key): change for change in changes}
        with self.writing() as writer:
            searcher = self.searcher(create=True)  # after the lock: the newest commit
            assert searcher is not None
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
            try:
                if replaced:  # one delete query, before the adds: it cannot touch them
                    writer.delete_documents_by_query(
                        tantivy.Query.term_set_query(self.schema, ID, replaced))
                now_ms = int(time.time() * 1000)
                for identity, change in passing:
                    if change.row is None:
                        stats.deleted += 1
                        if self.retention_ms > 0:
                            writer.add_document(self._marker(identity, hashes[identity],
                                                             change, now_ms))
                    else:
                        stats.written += 1
                        writer.add_document(document(identity, hashes[identity], change))
                purged = self._purge_markers(searcher, writer, now_ms)
                if replaced or passing or purged:
                    writer.commit()
            except BaseException as exc:
                writer.rollback()
                if isinstance(exc, ValueError):
                    raise self.error("write", exc) from None
                raise
        return stats

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
        query = tantivy.Query.term_set_query(self.schema, ID, ids)
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

    def _marker(self, identity: str, digest: int, change: Change,
                now_ms: int) -> tantivy.Document:
        doc = common_fields(identity, digest, change)
        doc.add_unsigned(DELETED, 1)
        doc.add_unsigned(DELETED_AT, now_ms)
        return doc

    def _purge_markers(self, searcher: tantivy.Searcher, writer: tantivy.IndexWriter,
                       now_ms: int) -> bool:
        """Delete (uncommitted) the markers older than the retention; True if there were."""
        cutoff = now_ms - self.retention_ms
        if self.retention_ms <= 0 or cutoff <= 0:
            return False
        expired = tantivy.Query.range_query(self.schema, DELETED_AT, tantivy.FieldType.Unsigned,
                                            0, cutoff, include_upper=False)
        if not _count(searcher, expired):
            return False
        writer.delete_documents_by_query(expired)
        return True

    # ------------------------------------------------------------------------------- reading
    def live(self, *clauses: tuple[tantivy.Occur, tantivy.Query]) -> tantivy.Query:
        """``clauses`` and not a delete marker."""
        not_deleted = (tantivy.Occur.MustNot, tantivy.Query.term_query(self.schema, DELETED, 1))
        return tantivy.Query.boolean_query([*clauses, not_deleted])

    def read(self, topic: str, keys: Sequence[str]) -> dict[str, dict[str, str]]:
        searcher = self.searcher()
        out: dict[str, dict[str, str]] = {}
        if searcher is None:
            return out
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), LOOKUP_CHUNK):
            ids = [doc_id(topic, key) for key in unique[start:start + LOOKUP_CHUNK]]
            query = self.live((tantivy.Occur.Must,
                               tantivy.Query.term_set_query(self.schema, ID, ids)))
            for _, address in searcher.search(query, len(ids), count=False).hits:
                doc = searcher.doc(address)
                out[_stored(doc, KEY)] = json.loads(_stored(doc, ROW))
        return out

    def keys(self, topic: str) -> Iterator[str]:
        """Every live key of ``topic`` in this shard, once each, from one snapshot of the index:
        the topic's documents in slices of ``_cdc_hash`` ranges of about :data:`KEYS_SLICE`."""
        searcher = self.searcher()
        if searcher is None:
            return
        in_topic = (tantivy.Occur.Must, tantivy.Query.term_query(self.schema, TOPIC, topic))
        total = _count(searcher, self.live(in_topic))
        if not total:
            return
        slices = -(-total // KEYS_SLICE)
        step = -(-(1 << 64) // slices)
        ranges = [(lo, min(lo + step, 1 << 64) - 1) for lo in range(0, 1 << 64, step)]
        while ranges:
            lo, hi = ranges.pop(0)
            limit = 2 * KEYS_SLICE
            query = self.live(in_topic, (tantivy.Occur.Must, tantivy.Query.range_query(
                self.schema, HASH, tantivy.FieldType.Unsigned, lo, hi)))
            hits = searcher.search(query, limit, count=False).hits
            if len(hits) >= limit and lo < hi:  # a crowded slice: halve it
                middle = lo + (hi - lo) // 2
                ranges[:0] = [(lo, middle), (middle + 1, hi)]
                continue
            for _, address in hits:
                yield _stored(searcher.doc(address), KEY)

    def search(self, text: str, topics: Sequence[str] | None, limit: int
               ) -> tuple[int, list[Hit]] | None:
        """``(matching rows, the best hits)`` of this shard (``None``: no index yet)."""
        searcher = self.searcher()
        if searcher is None:
            return None
        assert self._index is not None
        try:
            parsed = self._index.parse_query(text, default_field_names=DEFAULT_FIELDS,
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
        try:
            found = searcher.search(self.live(*clauses), max(1, limit), count=True)
        except ValueError as exc:
            raise SearchQueryError(f"the query {text!r} cannot run: {str(exc).strip()[:300]}",
                                   "simplify the query (docs/followers.md)") from None
        hits = []
        for score, address in found.hits[:max(0, limit)]:
            doc = searcher.doc(address)
            hits.append(Hit(_stored(doc, TOPIC), _stored(doc, KEY), json.loads(_stored(doc, ROW)),
                            float(score)))
        return int(found.count), hits  # type: ignore[attr-defined]


def common_fields(identity: str, digest: int, change: Change) -> tantivy.Document:
    """A document with the fields every document has (the module docstring)."""
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


class SearchSink(Sink):
    """A search follower in directory ``path`` (layout and gate: the module docstring).

    ``tables`` maps topics to ``(source, TableId)`` (others are split on dots);
    ``text_fields`` maps ``schema.table`` (as in the config) to its text columns;
    ``writer_memory`` is each shard writer's heap (bytes, split over its threads);
    ``tombstone_retention`` (seconds) is how long a delete marker stays; ``shards`` is the
    shard count of a new index (an existing one keeps its own; ``None``: the default;
    ``shards_required``: refuse an index with another count); ``log_path`` is the change log's
    directory (kept for messages). Nothing is opened until used.
    """

    #: each shard has one writer: executor tasks write the shards of the keys they own
    placement = Placement.BY_OWNER

    @classmethod
    def from_settings(cls, config: Config, name: str, settings: FollowerConfig,
                      topics: Topics) -> SearchSink:
        assert isinstance(settings, SearchFollowerConfig)
        return cls(name, config.resolve(settings.path), tables=topics,
                   text_fields=settings.text_fields, writer_memory=settings.writer_memory,
                   tombstone_retention=settings.tombstone_retention, log_path=config.log_path,
                   shards=settings.shards,
                   shards_required="shards" in settings.model_fields_set)

    def __init__(self, name: str, path: Path, tables: Mapping[str, tuple[str, TableId]],
                 text_fields: Mapping[str, list[str]], writer_memory: int,
                 tombstone_retention: float, log_path: Path, shards: int = DEFAULT_SHARDS,
                 shards_required: bool = False, lock_wait: float = LOCK_WAIT_S) -> None:
        self.name = name
        self.path = Path(path)
        self.watermark_path = self.path / "watermarks.json"
        self.tables = dict(tables)
        self.text_fields = {TableId.parse(table): tuple(columns)
                            for table, columns in text_fields.items()}
        self.writer_memory = int(writer_memory)
        self.retention_ms = int(round(tombstone_retention * 1000))
        self.log_path = Path(log_path)
        self.wanted_shards = int(shards)
        self.shards_required = shards_required
        self.lock_wait = lock_wait
        self.schema = build_schema()
        self._shards: list[_Shard] | None = None
        self._text_columns: dict[str, tuple[str, ...] | None] = {}

    # ------------------------------------------------------------------------------- layout
    @property
    def layout_path(self) -> Path:
        return self.path / LAYOUT_FILE

    def _shard_paths(self, create: bool) -> list[Path] | None:
        """The shards' index directories (``None``: no index yet and not ``create``): the
        format-1 layout's one ``index/``, else ``shard-<i>/`` for the count ``shards.json``
        holds (written, with :data:`FORMAT`, when the index is created)."""
        legacy = self.path / "index"
        if not self.layout_path.exists() and (legacy / "meta.json").exists():
            count, paths = 1, [legacy]
        else:
            stored = self._stored_count(create)
            if stored is None:
                return None
            count = stored
            paths = [self.path / f"shard-{index}" for index in range(count)]
        if self.shards_required and count != self.wanted_shards:
            raise SearchSinkError(
                f"follower {self.name}: shards is {self.wanted_shards}, but the index at "
                f"{self.path} has {count} shard(s) (fixed when it was created)",
                f"set followers.{self.name}.shards to {count}, or delete the directory and the "
                "follower's checkpoint so `cdc apply` rebuilds it with the new count")
        return paths

    def _stored_count(self, create: bool) -> int | None:
        try:
            data = json.loads(self.layout_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            if not create:
                return None
            try:
                replace_file(self.layout_path, json.dumps(
                    {"format": FORMAT, "shards": self.wanted_shards}, sort_keys=True) + "\n")
            except OSError as exc:
                raise SearchSinkError(
                    f"follower {self.name}: cannot create the index directory {self.path} "
                    f"({exc.strerror})", f"make it writable, or set "
                    f"followers.{self.name}.path elsewhere") from None
            return self.wanted_shards
        except NotADirectoryError:
            raise SearchSinkError(
                f"follower {self.name}: cannot create the index directory {self.path} (a file "
                "is in the way)", f"move the file, or set followers.{self.name}.path "
                "elsewhere") from None
        except (OSError, ValueError) as exc:
            raise SearchSinkError(f"follower {self.name}: cannot read {self.layout_path} "
                                  f"({exc})", "restore it, or delete the directory and the "
                                  "follower's checkpoint so `cdc apply` rebuilds it") from None
        found = data.get("format") if isinstance(data, dict) else data
        check_format(found, FORMAT, f"follower {self.name}: the search index {self.path}",
                     fix="run the cdc version that wrote the follower (or a newer one)",
                     error=SearchSinkError)
        count = data.get("shards")
        if not isinstance(count, int) or count < 1:
            raise SearchSinkError(f"follower {self.name}: {self.layout_path} holds no shard "
                                  "count", "restore it, or delete the directory and the "
                                  "follower's checkpoint so `cdc apply` rebuilds it")
        return count

    def shards(self, create: bool = False) -> list[_Shard]:
        """The follower's shards (empty: no index yet and not ``create``)."""
        if self._shards is None:
            paths = self._shard_paths(create)
            if paths is None:
                return []
            self._shards = [_Shard(self.name, path, self.schema, self.writer_memory,
                                   self.retention_ms, self.lock_wait) for path in paths]
        if create:
            for shard in self._shards:
                shard.open_index(create=True)
        return self._shards

    def shard_of(self, key: str, count: int) -> int:
        """The shard of ``key`` (its JSON text): :func:`cdc.sink.key_group` of its bytes."""
        return key_group(key.encode(), count)

    # ------------------------------------------------------------------------------- opening
    def check(self) -> None:
        """Create or open the index: :class:`SearchSinkError` with the fix when the directory
        cannot be created or holds something else."""
        self.shards(create=True)

    def owner_groups(self, topic: str) -> int:
        """The shard count: a shard has one writer (the task that owns its keys)."""
        return len(self.shards(create=True))

    def close(self) -> None:
        for shard in self._shards or []:
            shard.close()
        self._shards = None

    # ---------------------------------------------------------------------------------- apply
    def apply(self, changes: Sequence[Change]) -> ApplyStats:
        """The gate and the writes of the module docstring: per shard, one commit. A change no
        shard could hold (a position too long) fails the call before any shard is written."""
        shards = self.shards(create=True)
        by_shard: dict[int, list[Change]] = {}
        # at most one per key is the contract; keep the newest anyway
        for change in newest_per_key(changes):
            position_words(change.position)  # raises before anything is written
            by_shard.setdefault(self.shard_of(change.key, len(shards)), []).append(change)
        stats = ApplyStats()
        for index in sorted(by_shard):
            done = shards[index].apply(by_shard[index], self._document)
            stats.written += done.written
            stats.deleted += done.deleted
            stats.skipped += done.skipped
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
        doc = common_fields(identity, digest, change)
        doc.add_bytes(ROW, _ROW_JSON(texts).encode())
        if text:
            doc.add_json(TEXT, text)
            doc.add_text(ALL, "\n".join(text.values()))
        if exact:
            doc.add_json(EXACT, exact)
        return doc

    # ----------------------------------------------------------------------------- watermarks
    def set_watermark(self, source: str, offset: Mapping[str, Any]) -> None:
        """Store ``offset`` for ``source`` unless the stored one orders after it
        (``sinks/watermarks.py``: atomic, durable, only forward)."""
        WatermarkFile(self.watermark_path, self.name, SearchSinkError).advance(source, offset)

    def watermark(self, source: str) -> dict[str, Any] | None:
        return WatermarkFile(self.watermark_path, self.name, SearchSinkError).get(source)

    # ------------------------------------------------------------------------------- reading
    def read(self, topic: str, keys: Sequence[str]) -> dict[str, dict[str, str]]:
        shards = self.shards()
        if not shards:
            return {}
        by_shard: dict[int, list[str]] = {}
        for key in keys:
            by_shard.setdefault(self.shard_of(key, len(shards)), []).append(key)
        out: dict[str, dict[str, str]] = {}
        for index, wanted in by_shard.items():
            out.update(shards[index].read(topic, wanted))
        return out

    def keys(self, topic: str) -> Iterator[str]:
        """Every live key of ``topic``, once each (a key lives in one shard)."""
        for shard in self.shards():
            yield from shard.keys(topic)

    # ------------------------------------------------------------------------------- search
    def search(self, text: str, *, topics: Sequence[str] | None = None,
               limit: int = 20) -> SearchResult:
        """The live rows matching ``text`` (Tantivy query syntax, the module docstring's
        default fields), best first, at most ``limit``; only ``topics`` when given. Each shard
        ranks its own hits (BM25 with the shard's own term statistics); the best of every
        shard are merged by score (docs/followers.md: what that changes).
        :class:`SearchQueryError` for bad syntax; :class:`SearchSinkError` when there is no
        index yet."""
        found = [shard.search(text, topics, limit) for shard in self.shards()]
        if not found or all(part is None for part in found):
            raise SearchSinkError(f"follower {self.name} has no search index yet (nothing at "
                                  f"{self.path})",
                                  f"run `cdc apply --follower {self.name}` first")
        total = sum(part[0] for part in found if part is not None)
        hits = sorted((hit for part in found if part is not None for hit in part[1]),
                      key=lambda hit: -hit.score)
        result = SearchResult(total if limit > 0 else 0)
        result.hits.extend(hits[:max(0, limit)])
        return result


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
