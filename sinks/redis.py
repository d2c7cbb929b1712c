"""The Redis cache follower: one hash per row, written atomically with its position.

Layout (the names below are exact; ``docs/followers.md`` shows an example):

``<row key>`` — a **hash**, one per live row
    The row key is ``key_template`` rendered with ``{schema}``, ``{table}`` (the table's names,
    unquoted), ``{source}`` (the source name), ``{key}`` (the key columns' values as
    :func:`~cdc.sink.canonical_text`, in key order, joined by ``:``) and ``{key_json}`` (the
    key's JSON text as in the log, e.g. ``{"id":42}``). Default ``{schema}.{table}:{key}``, e.g.
    ``public.orders:42``. Fields: every non-null column -> its canonical text
    (:func:`~cdc.sink.row_text`), plus two reserved fields: ``_cdc_position`` = the lowercase
    hex of the position bytes the row reflects, and ``_cdc_key`` = the key's JSON text. A
    column with a reserved name cannot be followed (:class:`RedisSinkError`).
``cdc:deleted:<row key>`` — a **string**, the delete marker
    Holds the hex position of the delete (or tombstone) that removed the row, with a TTL of
    ``tombstone_retention`` (no marker when the retention is 0). Removed when the key is
    written again.
``cdc:watermark:<follower>`` — a **hash**
    Field ``<source>`` = the JSON of the source offset the follower has applied up to (see
    :meth:`RedisSink.set_watermark`); field ``<source>#order`` = that offset's order as hex,
    used to only ever move forward; field ``#format`` = :data:`FORMAT`, the version of this
    layout (a hash without it was written before formats were marked: format 1). A newer
    format is refused (:meth:`RedisSink.watermark`), never misread.

Version gate (a server-side Lua script, one ``EVALSHA`` per ``chunk_rows`` changes, several
calls pipelined per round trip): for each change, the stored position is the row hash's
``_cdc_position`` or, without a hash, the delete marker's value. A change is applied only when
its position is strictly greater (bytes compared left to right; the script compares the hex in
8-digit chunks as numbers, so the server's collation locale does not matter). An upsert replaces
the whole hash (columns dropped upstream vanish) and removes the marker; a delete removes the
hash and sets the marker. Each change is atomic: a crash leaves each key old or new.

Not supported: Redis Cluster (one script call touches keys of many slots).
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import redis

from cdc.config import Config, FollowerConfig, Secret
from cdc.errors import CdcError, FollowerUnavailable, check_format
from cdc.events import TableId, split_topic
from cdc.preflight import Step
from cdc.sink import ApplyStats, Change, Sink, Topics, canonical_text, row_text
from sinks.redis_settings import RedisFollowerConfig, check_key_template

POSITION_FIELD = "_cdc_position"
KEY_FIELD = "_cdc_key"
RESERVED_FIELDS = frozenset({POSITION_FIELD, KEY_FIELD})
DELETED_PREFIX = "cdc:deleted:"
WATERMARK_PREFIX = "cdc:watermark:"
#: the version of this layout, stored in each watermark hash (see the module docstring)
FORMAT = 1
DEFAULT_KEY_TEMPLATE = "{schema}.{table}:{key}"
_GLOB_SPECIAL = frozenset("*?[]\\")
#: a row's {column: text} as the script's JSON argument (UTF-8 passes through cjson as is)
_ROW_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"),
                             check_circular=False).encode
# placeholders in a topic's parsed template (compared by identity, never equal to a name)
_KEY = object()
_KEY_JSON = object()

# KEYS: per change, the row key then the marker key. ARGV[1]: retention ms; ARGV[2]: the
# chunk's changes as one JSON array, per change ``[position hex, key JSON, row]`` where row is
# "" for a delete, else an object {column: text}. One packed argument per call: redis-py's
# per-argument packing was most of the client's time, and cjson decodes the chunk in C.
# Returns {written, deleted, skipped}.
_APPLY_LUA = """
local function newer(a, b)
  if a == b then return false end
  if #a == #b then
    for i = 1, #a, 8 do
      local x = tonumber(string.sub(a, i, i + 7), 16)
      local y = tonumber(string.sub(b, i, i + 7), 16)
      if x ~= y then return x > y end
    end
    return false
  end
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return #a > #b
end
local retention = tonumber(ARGV[1])
local changes = cjson.decode(ARGV[2])
local written, deleted, skipped = 0, 0, 0
for c = 1, #changes do
  local change = changes[c]
  local row, marker = KEYS[2 * c - 1], KEYS[2 * c]
  local pos, key, image = change[1], change[2], change[3]
  local held = redis.call('HGET', row, '_cdc_position')
  local in_row = held
  if not held then held = redis.call('GET', marker) end
  if held and not newer(pos, held) then
    skipped = skipped + 1
  elseif type(image) ~= 'table' then
    redis.call('DEL', row)
    if retention > 0 then
      redis.call('SET', marker, pos, 'PX', retention)
    else
      redis.call('DEL', marker)
    end
    deleted = deleted + 1
  else
    local fields = {'_cdc_position', pos, '_cdc_key', key}
    local n = 4
    for column, text in pairs(image) do
      fields[n + 1] = column
      fields[n + 2] = text
      n = n + 2
    end
    -- a whole new row, whatever the key held before (a row or a marker, never both)
    if in_row then redis.call('DEL', row) elseif held then redis.call('DEL', marker) end
    redis.call('HSET', row, unpack(fields))
    written = written + 1
  end
end
return {written, deleted, skipped}
"""

# KEYS[1]: the watermark hash. ARGV: source, offset JSON, order hex ('' = unordered), format.
# Returns 1 when stored, 0 when the stored offset is newer.
_WATERMARK_LUA = """
local held = redis.call('HGET', KEYS[1], ARGV[1] .. '#order')
local order = ARGV[3]
if held and order ~= '' and held ~= '' and #held == #order then
  for i = 1, #order, 8 do
    local x = tonumber(string.sub(order, i, i + 7), 16)
    local y = tonumber(string.sub(held, i, i + 7), 16)
    if x ~= y then
      if x < y then return 0 end
      break
    end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], ARGV[1] .. '#order', order, '#format', ARGV[4])
return 1
"""


class RedisSinkError(CdcError):
    """The Redis follower cannot be reached or cannot hold a row."""


class RedisUnavailable(RedisSinkError, FollowerUnavailable):
    """Redis does not answer (down, restarting, unreachable): ``cdc apply`` waits for it."""


def key_text(key_json: str) -> str:
    """``{key}`` of the template: the key columns' canonical texts in key order, joined by
    ``:`` (``{"a":1,"b":"x"}`` -> ``1:x``)."""
    values = json.loads(key_json)
    return ":".join(canonical_text(value) for value in values.values())


def fast_key_text(key_json: str) -> str:
    """:func:`key_text`, without parsing the JSON for the common one-column keys as the log
    writes them (compact): an integer (``{"id":42}`` -> ``42``) or a string free of escapes
    (``{"code":"ab"}`` -> ``ab``). Anything else goes through :func:`key_text`."""
    quotes = key_json.count('"')
    if (quotes == 2 or quotes == 4) and key_json[:2] == '{"' and key_json[-1:] == "}":
        at = key_json.find('":') + 2
        value = key_json[at:-1]
        if quotes == 2:
            digits = value[1:] if value[:1] == "-" else value
            if (digits.isdigit() and digits.isascii()
                    and (digits[0] != "0" or value == "0")):
                return value  # str(int(value)): the JSON integer's text is already canonical
        elif (len(value) >= 2 and value[0] == '"' and value[-1] == '"'
              and "\\" not in value and key_json[at - 3] != "\\"):
            return value[1:-1]  # a string without escapes: its JSON text is its characters
    return key_text(key_json)


def glob_escape(text: str) -> str:
    """``text`` as a literal inside a Redis MATCH pattern (``*?[]\\`` escaped)."""
    return "".join("\\" + char if char in _GLOB_SPECIAL else char for char in text)


class RedisSink(Sink):
    """A Redis follower (layout and gate: the module docstring).

    ``tables`` maps topic names to ``(source, TableId)``; topics missing from it are split with
    :func:`cdc.events.split_topic`. ``chunk_rows`` changes go into one script call;
    ``pipeline_calls`` calls share one round trip. ``password`` (if given) overrides one in the
    URL. Connecting is lazy: :meth:`check` PINGs.
    """

    @classmethod
    def from_settings(cls, config: Config, name: str, settings: FollowerConfig,
                      topics: Topics) -> RedisSink:
        assert isinstance(settings, RedisFollowerConfig)
        return cls(name, settings.url, key_template=settings.key_template,
                   tombstone_retention=settings.tombstone_retention, tables=topics,
                   password=settings.password())

    def __init__(self, name: str, url: str | Secret, *,
                 key_template: str = DEFAULT_KEY_TEMPLATE,
                 tombstone_retention: float = 24 * 3600.0,
                 tables: Mapping[str, tuple[str, TableId]] | None = None,
                 chunk_rows: int = 300, pipeline_calls: int = 8,
                 password: str | None = None) -> None:
        self.name = name
        self._url = url if isinstance(url, Secret) else Secret(url)
        self.key_template = check_key_template(key_template)
        self.retention_ms = int(round(tombstone_retention * 1000))
        self.tables = dict(tables or {})
        self._renderers: dict[str, Callable[[str], str]] = {}
        self.chunk_rows = chunk_rows
        self.pipeline_calls = pipeline_calls
        try:
            extra = {"password": password} if password is not None else {}
            self.client = redis.Redis.from_url(self._url.reveal(), decode_responses=True,
                                               socket_connect_timeout=5, socket_timeout=60,
                                               **extra)
        except ValueError as exc:
            raise RedisSinkError(f"follower {name}: the Redis URL {self._url} is not valid "
                                 f"({exc})", "write it as redis://[:password@]host:port/db"
                                 ) from None
        self._apply_script = self.client.register_script(_APPLY_LUA)
        self._watermark_script = self.client.register_script(_WATERMARK_LUA)

    # ---------------------------------------------------------------------------- connection
    def check(self) -> None:
        """PING the server; :class:`RedisSinkError` with the fix when it does not answer."""
        self._call(self.client.ping)

    def preflight(self) -> list[Step]:
        return [Step("server", self._server_version)]

    def _server_version(self) -> str:
        info = self._call(self.client.info, "server")
        return f"Redis {info.get('redis_version', '?')} at {self._url}"

    def _call(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except redis.AuthenticationError:
            raise RedisSinkError(f"follower {self.name}: Redis at {self._url} refused the "
                                 "password", "correct the password in the follower's url"
                                 ) from None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise RedisUnavailable(f"follower {self.name}: cannot reach Redis at {self._url} "
                                 f"({exc.__class__.__name__})",
                                 "start Redis there, or correct the follower's url") from None
        except redis.ResponseError as exc:
            raise RedisSinkError(f"follower {self.name}: Redis at {self._url} refused a "
                                 f"command: {exc}", "check the server's ACLs and that the key "
                                 "space is not shared with other data") from None

    def close(self) -> None:
        self.client.close()

    # --------------------------------------------------------------------------------- layout
    def table_of(self, topic: str) -> tuple[str, TableId]:
        known = self.tables.get(topic)
        return known if known is not None else split_topic(topic)

    def row_key(self, topic: str, key_json: str) -> str:
        """The Redis key of ``key_json``'s row in ``topic``."""
        render: Callable[[str], str] | None = self._renderers.get(topic)
        if render is None:
            render = self._renderers[topic] = self._renderer(topic)
        return render(key_json)

    def _renderer(self, topic: str) -> Callable[[str], str]:
        """``key JSON -> row key`` for ``topic``: the template's parts joined (the literal
        texts around one ``{key}`` precomputed, the common case)."""
        parts = self._template_parts(topic)
        texts = [part for part in parts if part is not _KEY and part is not _KEY_JSON]
        if [part for part in parts if part is _KEY or part is _KEY_JSON] == [_KEY]:
            at = parts.index(_KEY)
            prefix = "".join(parts[:at])  # type: ignore[arg-type]
            suffix = "".join(parts[at + 1:])  # type: ignore[arg-type]
            return lambda key_json: prefix + fast_key_text(key_json) + suffix
        if len(texts) == len(parts):
            constant = "".join(texts)  # type: ignore[arg-type]
            return lambda key_json: constant

        def render(key_json: str) -> str:
            out: list[str] = []
            for part in parts:
                if part is _KEY:
                    out.append(fast_key_text(key_json))
                elif part is _KEY_JSON:
                    out.append(key_json)
                else:
                    out.append(part)  # type: ignore[arg-type]
            return "".join(out)

        return render

    def _template_parts(self, topic: str) -> list[object]:
        """The template for ``topic``: literal texts, with :data:`_KEY` and :data:`_KEY_JSON`
        (compared by identity) where the key goes."""
        source, table = self.table_of(topic)
        names: dict[str, object] = {"schema": table.schema, "table": table.table, "source": source,
                 "key": _KEY, "key_json": _KEY_JSON}
        parts: list[object] = []
        for text, name, _, _ in string.Formatter().parse(self.key_template):
            parts.append(text)  # (the parser already turned {{ and }} into { and })
            if name is not None:
                parts.append(names[name])
        return parts

    def table_pattern(self, topic: str) -> str:
        """A SCAN MATCH pattern covering every row key of ``topic`` (it may match more)."""
        source, table = self.table_of(topic)
        literal = {"schema": glob_escape(table.schema), "table": glob_escape(table.table),
                   "source": glob_escape(source), "key": "*", "key_json": "*"}
        out = []
        for text, name, _, _ in string.Formatter().parse(self.key_template):
            out.append(glob_escape(text))
            if name is not None:
                out.append(literal[name])
        return "".join(out)

    # ---------------------------------------------------------------------------------- apply
    def apply(self, changes: Sequence[Change]) -> ApplyStats:
        stats = ApplyStats()
        calls_per_trip = self.chunk_rows * self.pipeline_calls
        for start in range(0, len(changes), calls_per_trip):
            trip = changes[start:start + calls_per_trip]
            pipe = self.client.pipeline(transaction=False)
            for offset in range(0, len(trip), self.chunk_rows):
                keys, args = self._script_args(trip[offset:offset + self.chunk_rows])
                self._apply_script(keys=keys, args=args, client=pipe)
            for written, deleted, skipped in self._call(pipe.execute):
                stats.written += int(written)
                stats.deleted += int(deleted)
                stats.skipped += int(skipped)
        return stats

    def _script_args(self, chunk: Sequence[Change]) -> tuple[list[str], list[Any]]:
        """The script's KEYS and ARGV for ``chunk`` (see :data:`_APPLY_LUA`)."""
        keys: list[str] = []
        packed: list[tuple[str, str, Any]] = []
        row_key = self.row_key
        for change in chunk:
            name = row_key(change.topic, change.key)
            keys += (name, DELETED_PREFIX + name)
            row = change.row
            if row is None:
                packed.append((change.position.hex(), change.key, ""))
                continue
            if POSITION_FIELD in row or KEY_FIELD in row:
                raise RedisSinkError(
                    f"follower {self.name}: table {change.table} has a column named "
                    f"{sorted(RESERVED_FIELDS.intersection(row))[0]}, which the Redis "
                    "follower reserves for its own bookkeeping",
                    "rename the column, or leave the table out of the follower's tables")
            packed.append((change.position.hex(), change.key, row_text(row)))
        return keys, [self.retention_ms, _ROW_JSON(packed)]

    # ----------------------------------------------------------------------------- watermarks
    def _watermark_key(self) -> str:
        return WATERMARK_PREFIX + self.name

    def set_watermark(self, source: str, offset: Mapping[str, Any]) -> None:
        """Store ``offset`` for ``source`` unless the stored one orders after it (by
        :func:`cdc.offsets.offset_order`: PostgreSQL ``lsn``)."""
        from cdc.offsets import offset_order

        order = "".join(f"{part:016x}" for part in offset_order(offset))
        text = json.dumps(dict(offset), sort_keys=True, separators=(",", ":"))
        self._call(self._watermark_script, keys=[self._watermark_key()],
                   args=[source, text, order, FORMAT])

    def watermark(self, source: str) -> dict[str, Any] | None:
        text, layout = self._call(self.client.hmget, self._watermark_key(), [source, "#format"])
        check_format(int(layout) if layout and layout.isdigit() else (layout or 1), FORMAT,
                     f"follower {self.name}: Redis's {self._watermark_key()}",
                     fix="run the cdc version that wrote the follower (or a newer one)",
                     error=RedisSinkError)
        return None if text is None else dict(json.loads(text))

    # ------------------------------------------------------------------------------ reading
    def read(self, topic: str, keys: Sequence[str]) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        for start in range(0, len(keys), 1000):
            chunk = keys[start:start + 1000]
            pipe = self.client.pipeline(transaction=False)
            for key in chunk:
                pipe.hgetall(self.row_key(topic, key))
            for key, fields in zip(chunk, self._call(pipe.execute), strict=True):
                if fields:
                    out[key] = {column: text for column, text in fields.items()
                                if column not in RESERVED_FIELDS}
        return out

    def _renders_to(self, topic: str, key: str, name: str) -> bool:
        try:
            return self.row_key(topic, key) == name
        except (ValueError, AttributeError):  # not a key JSON object: not one of our rows
            return False

    def keys(self, topic: str) -> Iterator[str]:
        """Every key JSON text held for ``topic``: hashes found by SCAN with
        :meth:`table_pattern` whose ``_cdc_key`` renders back to their own Redis key (so rows
        of other tables the pattern happens to match are left out). Each key at most once."""
        pattern = self.table_pattern(topic)
        seen: set[str] = set()
        cursor = 0
        while True:
            cursor, names = self._call(self.client.scan, cursor, match=pattern, count=1000)
            yield from self._owned_keys(topic, [n for n in names if n not in seen], seen)
            if cursor == 0:
                return

    def _owned_keys(self, topic: str, names: list[str], seen: set[str]) -> list[str]:
        if not names:
            return []
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.hget(name, KEY_FIELD)
        found = self._call(pipe.execute, raise_on_error=False)
        out = []
        for name, key in zip(names, found, strict=True):
            if isinstance(key, str) and self._renders_to(topic, key, name):
                seen.add(name)
                out.append(key)
        return out
