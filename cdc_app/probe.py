"""The latency prober: commit on the leader -> visible to a reader of each follower, measured
from outside the product.

Run as a script, never imported (``python <this file> SPEC.json OUT.jsonl``): it imports nothing
from the product — only the followers' public clients (``psycopg``, ``redis``, ``pyarrow`` for
Delta's files, ``tantivy``) — and knows the followers only by their documented layouts
(``docs/followers.md``). ``make lint`` checks the imports (``.importlinter``).

What it does, while it runs (until SIGTERM or SIGINT; SIGUSR1 stops the commits and leaves the
readers running, so a caller can compare leader and followers while the last probes arrive):

* **Commits sample rows** on the leader (PostgreSQL: ``spec["dsn"]``; MySQL/MariaDB:
  ``spec["mysql"]``, PyMySQL's connection arguments): every ``1/rate`` s one autocommit
  ``INSERT`` of ``spec["insert"]`` with the next probe key (``spec["first_key"]``, negative,
  then one lower each time: keys the workload never uses). The commit time is the wall clock
  read when ``COMMIT`` returned (``time.time()``).
* **Reads each follower through its public client**, one thread per follower, every
  ``spec["poll_s"]`` (default 0.02 s), for the probes not yet seen there:

  - ``redis``: ``EXISTS`` of each probe's row key (``key`` template, ``{key}`` = the probe key);
  - ``sql``: ``SELECT`` of the key column for the pending keys in the follower database
    (PostgreSQL, or SQLite: ``sqlite:///<path>``);
  - ``delta``: the table's new commits (``_delta_log/<version>.json``, the Delta protocol's
    atomic unit: a reader of the newest version sees exactly these) — the ``_cdc_key`` column of
    the files each commit adds (``dataChange`` true);
  - ``search``: per shard of the index (``<path>/shards/<n>/``), ``reload()`` of the reader
    (what ``cdc search`` does per query), then a term query on ``_cdc_id`` (``<topic>\\n<key
    JSON>``).

  A probe is *seen* at the wall clock when the read that found it returned: a conservative
  figure (it includes the read itself and up to one poll interval).
* **Writes one JSON line per (probe, follower)** to OUT when seen: ``{"key", "follower",
  "kind", "committed", "seen", "latency_s"}``; and one ``{"key", "committed"}`` line per probe
  when committed, so a reader can count probes never seen. Lines are flushed as written.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

_LOCK = threading.Lock()


class Probes:
    """The committed probes (key -> commit time) and the output file."""

    def __init__(self, out: Path) -> None:
        self.committed: dict[int, float] = {}
        self.out = out.open("a", buffering=1)
        self.stop = threading.Event()
        #: set by SIGUSR1: no more probes are committed; the readers go on
        self.enough = threading.Event()

    def write(self, line: dict[str, Any]) -> None:
        with _LOCK:
            self.out.write(json.dumps(line) + "\n")

    def pending(self, seen: set[int]) -> dict[int, float]:
        with _LOCK:
            return {key: at for key, at in self.committed.items() if key not in seen}


def leader_connection(spec: dict[str, Any]) -> Any:
    """An autocommit connection to the leader: ``spec["dsn"]`` (PostgreSQL, psycopg) or
    ``spec["mysql"]`` (MySQL/MariaDB: PyMySQL's ``connect()`` arguments)."""
    if "mysql" in spec:
        import pymysql

        return pymysql.connect(**spec["mysql"], autocommit=True)
    import psycopg

    return psycopg.connect(spec["dsn"], autocommit=True)


def commit_probes(spec: dict[str, Any], probes: Probes) -> None:
    interval = 1.0 / float(spec.get("rate", 10))
    key = int(spec.get("first_key", -1))
    conn = leader_connection(spec)
    with conn, conn.cursor() as cursor:
        next_at = time.monotonic()
        while not probes.stop.is_set() and not probes.enough.is_set():
            cursor.execute(spec["insert"], {"key": key})
            committed = time.time()
            with _LOCK:
                probes.committed[key] = committed
            probes.write({"key": key, "committed": committed})
            key -= 1
            next_at += interval
            probes.stop.wait(max(0.0, next_at - time.monotonic()))


class Reader:
    """One follower's reader: :meth:`found` returns the pending keys a read finds now."""

    def __init__(self, follower: dict[str, Any]) -> None:
        self.follower = follower

    def found(self, keys: list[int]) -> set[int]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class RedisReader(Reader):
    def __init__(self, follower: dict[str, Any]) -> None:
        super().__init__(follower)
        import redis

        self.client = redis.Redis.from_url(follower["url"])

    def found(self, keys: list[int]) -> set[int]:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.exists(self.follower["key"].format(key=key))
        return {key for key, there in zip(keys, pipe.execute(), strict=True) if there}


class SqlReader(Reader):
    """PostgreSQL (``postgresql://``, psycopg) or SQLite (``sqlite:///<path>``)."""

    def __init__(self, follower: dict[str, Any]) -> None:
        super().__init__(follower)
        url = follower["url"]
        self.sqlite = url.startswith("sqlite:///")
        self.select = f'SELECT "{follower["column"]}" FROM "{follower["table"]}" WHERE '
        if self.sqlite:
            import sqlite3

            self.conn: Any = sqlite3.connect(url[len("sqlite:///"):], isolation_level=None,
                                             check_same_thread=False)
        else:
            import psycopg

            self.conn = psycopg.connect(url, autocommit=True)

    def found(self, keys: list[int]) -> set[int]:
        column = f'"{self.follower["column"]}"'
        try:
            if self.sqlite:
                marks = ",".join("?" * len(keys))
                rows = self.conn.execute(f"{self.select}{column} IN ({marks})", keys)
            else:
                rows = self.conn.execute(f"{self.select}{column} = ANY(%s)", (keys,))
            return {row[0] for row in rows}
        except Exception:  # noqa: BLE001 - the table does not exist yet
            return set()

    def close(self) -> None:
        self.conn.close()


class DeltaReader(Reader):
    """New commits of the table, in order; the ``_cdc_key`` of the files they add."""

    def __init__(self, follower: dict[str, Any]) -> None:
        super().__init__(follower)
        self.table = Path(follower["path"])
        self.next_version = 0
        self.keys_seen: set[str] = set()
        self.template = follower["key_json"]  # e.g. '{{"id":{key}}}'
        import pyarrow  # noqa: F401 - imported before the first read, not timed by it

    def found(self, keys: list[int]) -> set[int]:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        # probe keys are negative: the key JSON's text up to the key, then "-" (kept whether
        # pending yet or not: a commit may be read before its probe's COMMIT time is taken)
        prefix = self.template.format(key="\0").split("\0")[0] + "-"
        while (commit := self.table / "_delta_log" / f"{self.next_version:020d}.json").exists():
            for line in commit.read_text().splitlines():
                add = json.loads(line).get("add") if line.strip() else None
                if add and add.get("dataChange", True):
                    path = self.table / urllib.parse.unquote(add["path"])
                    column = pq.read_table(path, columns=["_cdc_key"]).column(0).cast(
                        pa.string())  # deltalake writes string_view, which has no kernels
                    probes = column.filter(pc.starts_with(column, prefix))
                    self.keys_seen.update(probes.to_pylist())
            self.next_version += 1
        return {key for key in keys if self.template.format(key=key) in self.keys_seen}


class SearchReader(Reader):
    """Every shard of the index (``<path>/shards/<n>/``, docs/followers.md), each reloaded."""

    def __init__(self, follower: dict[str, Any]) -> None:
        super().__init__(follower)
        self.indexes: list[Any] = []
        self.template = follower["id"]
        import tantivy  # noqa: F401 - imported before the first read, not timed by it

    def found(self, keys: list[int]) -> set[int]:
        import tantivy

        if not self.indexes:
            root = Path(self.follower["path"]) / "shards"
            shards = sorted(root.glob("*/meta.json")) if root.is_dir() else []
            layout = Path(self.follower["path"]) / "shards.json"
            if not shards or len(shards) != json.loads(layout.read_text())["shards"]:
                return set()
            self.indexes = [tantivy.Index.open(str(meta.parent)) for meta in shards]
        ids = {self.template.format(key=key): key for key in keys}
        out = set()
        for index in self.indexes:
            index.reload()
            searcher = index.searcher()
            query = tantivy.Query.term_set_query(index.schema, "_cdc_id", list(ids))
            for _, address in searcher.search(query, limit=max(1, len(ids))).hits:
                doc = searcher.doc(address)
                identity = f"{doc['_cdc_topic'][0]}\n{doc['_cdc_key'][0]}"
                if identity in ids:
                    out.add(ids[identity])
        return out


def command(spec: Path, out: Path) -> list[str]:
    """The prober's command line: this file run as a script by this Python, isolated (``-I``:
    neither its own folder nor ``PYTHONPATH`` on ``sys.path``, so no module of the product can
    be imported into it, even by accident)."""
    return [sys.executable, "-I", str(Path(__file__).resolve()), str(spec), str(out)]


def summarize(out: Path, since: float, until: float, followers: dict[str, str]
              ) -> dict[str, dict[str, Any]]:
    """Per follower (``followers``: name -> kind), over the probes committed in ``[since,
    until)`` (epoch s): ``p50_s``, ``p99_s``, ``max_s`` (nearest rank; a probe never seen counts
    as slower than every seen one, so it cannot flatter p99), ``probes`` and ``unseen``. Kept
    importable for the demo and the benchmark (it reads the prober's file; the prober itself
    never imports the product)."""
    committed: set[int] = set()
    seen: dict[str, dict[int, float]] = {name: {} for name in followers}
    for line in out.read_text().splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue  # a line being written
        if not since <= item["committed"] < until:
            continue
        if item.get("follower") in seen:
            seen[item["follower"]][item["key"]] = item["latency_s"]
        else:
            committed.add(item["key"])
    figures: dict[str, dict[str, Any]] = {}
    for name, latencies in sorted(seen.items()):
        ordered = sorted(latencies[key] for key in committed if key in latencies)
        unseen = len(committed - set(latencies))
        ordered += [float("inf")] * unseen

        def rank(q: float, values: list[float] = ordered) -> float | None:
            if not values:
                return None
            value = values[min(len(values) - 1, max(0, int(round(q * len(values))) - 1))]
            return None if value == float("inf") else round(value, 3)

        figures[name] = {"kind": followers[name], "p50_s": rank(0.5), "p99_s": rank(0.99),
                         "max_s": rank(1.0), "probes": len(ordered), "unseen": unseen}
    return figures


READERS: dict[str, type[Reader]] = {"redis": RedisReader, "sql": SqlReader,
                                    "delta": DeltaReader, "search": SearchReader}


def follow(follower: dict[str, Any], probes: Probes, poll: float, ready: threading.Barrier
           ) -> None:
    try:
        reader = READERS[follower["kind"]](follower)
    finally:
        ready.wait()
    seen: set[int] = set()
    try:
        while not probes.stop.is_set():
            pending = probes.pending(seen)
            if pending:
                try:
                    found = reader.found(sorted(pending))
                except Exception as exc:  # noqa: BLE001 - a follower mid-write: read again
                    print(f"probe: {follower['name']}: {exc}", file=sys.stderr)
                    found = set()
                now = time.time()
                for key in found:
                    seen.add(key)
                    probes.write({"key": key, "follower": follower["name"],
                                  "kind": follower["kind"], "committed": pending[key],
                                  "seen": now, "latency_s": round(now - pending[key], 4)})
            probes.stop.wait(poll)
    finally:
        reader.close()


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    probes = Probes(Path(sys.argv[2]))
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: probes.stop.set())
    poll = float(spec.get("poll_s", 0.02))
    ready = threading.Barrier(len(spec["followers"]) + 1)
    threads = [threading.Thread(target=follow, args=(f, probes, poll, ready), daemon=True)
               for f in spec["followers"]]
    for thread in threads:
        thread.start()
    signal.signal(signal.SIGUSR1, lambda *_: probes.enough.set())
    ready.wait()  # every reader's client loaded before the first probe
    commit_probes(spec, probes)
    probes.stop.wait()
    for thread in threads:
        thread.join(5)


if __name__ == "__main__":
    main()
