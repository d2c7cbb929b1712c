"""The search follower: an embedded Tantivy full-text index, one document per row.

Layout of a follower's directory (``path``; ``docs/followers.md`` shows an example):

``<path>/index/`` — the Tantivy index (one writer at a time: Tantivy's ``.tantivy-writer.lock``)
``<path>/watermarks.json`` — ``{"version": 1, "sources": {<source>: {"offset": {...},
"order": [...]}}}``, replaced atomically (temp file, fsync, rename, fsync of the directory)

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
delete markers never match.

Version gate, per :meth:`SearchSink.apply` call: the documents of the batch's keys are found by
``term_set_query`` on ``_cdc_id`` (in chunks of :data:`LOOKUP_CHUNK`; every matching document,
should an id hold more than one), and their position words and hashes read from the fast fields
in one call per field. A change is applied only when its position is strictly greater than the
newest document's of its id (row or marker). The old documents of the
changes that pass are deleted by one ``term_set_query`` (issued before the adds, so it cannot
touch them), then the new documents are added: a row, or — for a delete or tombstone — a marker
(none when ``tombstone_retention`` is 0). Markers older than the retention are deleted in the same
commit. One ``commit`` per call: a crash leaves the index as it was before or after the whole
batch. The writer is opened by :meth:`SearchSink.check` or the first :meth:`SearchSink.apply`
and kept (opening it, and each rollback, first spends the opstamp Tantivy reuses: see
:func:`_fresh_writer`); readers (``read``, ``keys``, ``watermark``, ``search``) never take the
lock, so ``cdc verify`` and ``cdc search`` run beside ``cdc apply``.
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

from cdc.errors import CdcError
from cdc.events import TableId, split_topic
from cdc.sink import (
    ApplyStats,
    Change,
    Placement,
    Sink,
    Topics,
    newest_per_key,
    row_text,
)
from sinks.search_settings import SearchFollowerConfig
from sinks.watermarks import WatermarkFile

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
    ``writer_memory`` is the Tantivy writer's heap (bytes, split over its threads);
    ``tombstone_retention`` (seconds) is how long a delete marker stays; ``log_path`` is the
    change log's directory (kept for messages). Nothing is opened until used.
    """

    #: a Tantivy index has one writer: ``cdc apply`` writes it from the driver
    placement = Placement.DRIVER

    @classmethod
    def from_settings(cls, config: Config, name: str, settings: FollowerConfig,
                      topics: Topics) -> SearchSink:
        assert isinstance(settings, SearchFollowerConfig)
        return cls(name, config.resolve(settings.path), tables=topics,
                   text_fields=settings.text_fields, writer_memory=settings.writer_memory,
                   tombstone_retention=settings.tombstone_retention, log_path=config.log_path)

    def __init__(self, name: str, path: Path, tables: Mapping[str, tuple[str, TableId]],
                 text_fields: Mapping[str, list[str]], writer_memory: int,
                 tombstone_retention: float, log_path: Path) -> None:
        self.name = name
        self.path = Path(path)
        self.index_path = self.path / "index"
        self.watermark_path = self.path / "watermarks.json"
        self.tables = dict(tables)
        self.text_fields = {TableId.parse(table): tuple(columns)
                            for table, columns in text_fields.items()}
        self.writer_memory = int(writer_memory)
        self.retention_ms = int(round(tombstone_retention * 1000))
        self.log_path = Path(log_path)
        self.schema = build_schema()
        self._index: tantivy.Index | None = None
        self._writer: tantivy.IndexWriter | None = None
        self._text_columns: dict[str, tuple[str, ...] | None] = {}

    # ------------------------------------------------------------------------------- opening
    def check(self) -> None:
        """Create or open the index and take its writer: :class:`SearchSinkError` with the fix
        when the directory cannot be created, holds something else, or another process
        (usually another ``cdc apply`` of this follower) is writing to it."""
        self._open_writer()

    def _open_writer(self) -> tantivy.IndexWriter:
        if self._writer is not None:
            return self._writer
        index = self._open_index(create=True)
        assert index is not None
        threads = max(1, min(os.cpu_count() or 1, 8, self.writer_memory // _THREAD_HEAP_MIN))
        try:
            self._writer = index.writer(heap_size=self.writer_memory, num_threads=threads)
        except ValueError as exc:
            if "LockBusy" in str(exc):
                raise SearchSinkError(
                    f"follower {self.name}: the search index at {self.index_path} is locked by "
                    "another writer — most likely another `cdc apply` of this follower is "
                    "running", "stop the other `cdc apply` (one apply per follower), or give "
                    f"this follower its own followers.{self.name}.path") from None
            raise self._error("open the index writer of", exc) from None
        _fresh_writer(self._writer)
        return self._writer

    def _open_index(self, create: bool) -> tantivy.Index | None:
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
                if any(self.index_path.iterdir()):
                    raise SearchSinkError(
                        f"follower {self.name}: {self.index_path} is not empty and holds no "
                        "Tantivy index", f"empty it, or point followers.{self.name}.path at "
                        "another directory")
                index = tantivy.Index(self.schema, str(self.index_path), reuse=False)
            else:
                index = tantivy.Index.open(str(self.index_path))
            index.config_reader("manual")
        except OSError as exc:
            raise SearchSinkError(
                f"follower {self.name}: cannot create the index directory {self.index_path} "
                f"({exc.strerror})", f"make it writable, or set followers.{self.name}.path "
                "elsewhere") from None
        except ValueError as exc:
            raise self._error("open", exc) from None
        self._index = index
        return index

    def _check_layout(self) -> None:
        try:
            meta = json.loads((self.index_path / "meta.json").read_text())
            names = {entry["name"] for entry in meta["schema"]}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SearchSinkError(f"follower {self.name}: cannot read {self.index_path}/"
                                  f"meta.json ({exc})", "check the directory's permissions; "
                                  "if the index is damaged, delete it and the follower's "
                                  "checkpoint, then `cdc apply` rebuilds it") from None
        if names != FIELDS:
            raise SearchSinkError(
                f"follower {self.name}: {self.index_path} holds a Tantivy index that is not a "
                "cdc search index of this version",
                f"point followers.{self.name}.path elsewhere, or delete the directory and the "
                "follower's checkpoint so `cdc apply` rebuilds it from the log")

    def _error(self, action: str, exc: Exception) -> SearchSinkError:
        text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        return SearchSinkError(f"follower {self.name}: cannot {action} the search index at "
                               f"{self.index_path}: {text}",
                               "check the directory's disk space and permissions")

    def _searcher(self, create: bool = False) -> tantivy.Searcher | None:
        """A searcher on the newest commit (``None``: no index yet). A reload that fails is
        tried again twice: in another process than the writer's, a merge may delete the
        files of the commit being opened (the next commit names their replacement)."""
        index = self._open_index(create)
        if index is None:
            return None
        for attempt in range(3):
            try:
                index.reload()
                return index.searcher()
            except ValueError as exc:
                if attempt == 2:
                    raise self._error("read", exc) from None
                time.sleep(0.05)
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Release the writer (waiting for running segment merges) and the index."""
        writer, self._writer = self._writer, None
        if writer is not None:
            with contextlib.suppress(ValueError):  # a failed merge leaves the commit intact
                writer.wait_merging_threads()
        self._index = None

    # ---------------------------------------------------------------------------------- apply
    def apply(self, changes: Sequence[Change]) -> ApplyStats:
        """The gate and the writes of the module docstring, in one commit."""
        stats = ApplyStats()
        writer = self._open_writer()
        # at most one per key is the contract; keep the newest anyway
        newest = {doc_id(change.topic, change.key): change for change in newest_per_key(changes)}
        searcher = self._searcher(create=True)
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
                        writer.add_document(self._marker(identity, hashes[identity], change,
                                                         now_ms))
                else:
                    stats.written += 1
                    writer.add_document(self._document(identity, hashes[identity], change))
            purged = self._purge_markers(searcher, writer, now_ms)
            if replaced or passing or purged:
                writer.commit()
        except BaseException as exc:
            writer.rollback()
            _fresh_writer(writer)  # rollback() reopens the writer at the last commit
            if isinstance(exc, ValueError):
                raise self._error("write", exc) from None
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
        doc = self._common(identity, digest, change)
        doc.add_bytes(ROW, _ROW_JSON(texts).encode())
        if text:
            doc.add_json(TEXT, text)
            doc.add_text(ALL, "\n".join(text.values()))
        if exact:
            doc.add_json(EXACT, exact)
        return doc

    def _marker(self, identity: str, digest: int, change: Change,
                now_ms: int) -> tantivy.Document:
        doc = self._common(identity, digest, change)
        doc.add_unsigned(DELETED, 1)
        doc.add_unsigned(DELETED_AT, now_ms)
        return doc

    @staticmethod
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
        searcher = self._searcher()
        out: dict[str, dict[str, str]] = {}
        if searcher is None:
            return out
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), LOOKUP_CHUNK):
            ids = [doc_id(topic, key) for key in unique[start:start + LOOKUP_CHUNK]]
            query = self._live((tantivy.Occur.Must,
                                tantivy.Query.term_set_query(self.schema, ID, ids)))
            for _, address in searcher.search(query, len(ids), count=False).hits:
                doc = searcher.doc(address)
                out[_stored(doc, KEY)] = json.loads(_stored(doc, ROW))
        return out

    def keys(self, topic: str) -> Iterator[str]:
        """Every live key of ``topic``, once each, from one snapshot of the index: the topic's
        documents in slices of ``_cdc_hash`` ranges of about :data:`KEYS_SLICE` documents."""
        searcher = self._searcher()
        if searcher is None:
            return
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
        default fields), best first, at most ``limit``; only ``topics`` when given.
        :class:`SearchQueryError` for bad syntax; :class:`SearchSinkError` when there is no
        index yet."""
        searcher = self._searcher()
        if searcher is None:
            raise SearchSinkError(f"follower {self.name} has no search index yet (nothing at "
                                  f"{self.index_path})",
                                  f"run `cdc apply --follower {self.name}` first")
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
            found = searcher.search(self._live(*clauses), max(1, limit), count=True)
        except ValueError as exc:
            raise SearchQueryError(f"the query {text!r} cannot run: {str(exc).strip()[:300]}",
                                   "simplify the query (docs/followers.md)") from None
        result = SearchResult(int(found.count) if limit > 0 else 0)  # type: ignore[attr-defined]
        for score, address in found.hits[:max(0, limit)]:
            doc = searcher.doc(address)
            result.hits.append(Hit(_stored(doc, TOPIC), _stored(doc, KEY),
                                   json.loads(_stored(doc, ROW)), float(score)))
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
