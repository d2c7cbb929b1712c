"""The latency prober (``cdc_app/probe.py``, issue 28): a process of its own that commits probe
rows on PostgreSQL and sees them appear in each follower kind through that kind's public client
and documented layout. Here the followers are written by their sinks directly (no capture, no
Spark: the prober must not care who writes), so the test knows when each probe was written and
checks that the prober saw it then — not before, not much later — and that a probe never written
is reported unseen, not dropped."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from cdc.sink import Change
from cdc_app import probe
from sinks.delta import table_dir
from tests.pgkit import new_database
from tests.sinkkit import TOPIC, build_sink, key_json, pos

pytestmark = pytest.mark.servers

KINDS = {"cache": "redis", "warehouse": "delta-scd1", "search": "search", "db": "sql-postgres"}


def test_summary_counts_unseen_probes_as_the_slowest(tmp_path: Path) -> None:
    out = tmp_path / "probe.jsonl"
    lines = [{"key": -k, "committed": 100.0 + k} for k in range(1, 11)]
    lines += [{"key": -k, "follower": "a", "kind": "redis", "committed": 100.0 + k,
               "seen": 100.1 + k, "latency_s": 0.1 * k} for k in range(1, 10)]  # -10 unseen
    lines.append({"key": -99, "committed": 500.0})  # outside the window
    out.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"key": -1')
    figures = probe.summarize(out, 100.0, 200.0, {"a": "redis", "b": "sql"})
    assert figures["a"] == {"kind": "redis", "p50_s": 0.5, "p99_s": None, "max_s": None,
                            "probes": 10, "unseen": 1}
    assert figures["b"]["unseen"] == 10 and figures["b"]["p50_s"] is None


def test_the_prober_sees_each_follower_kind_when_its_write_returns(
        tmp_path: Path, pg_db: Any, pg_cluster: Any, redis_url: str) -> None:
    pg_db.execute("CREATE TABLE items (id bigint PRIMARY KEY, v int, note text, "
                  "at timestamptz)")
    follower_db = new_database(pg_cluster)
    settings = {"root": str(tmp_path), "redis_url": redis_url,
                "url": follower_db.dsn().replace("postgresql://", "postgresql+psycopg://", 1)}
    sinks = {name: build_sink(kind, settings) for name, kind in KINDS.items()}
    spec = {"dsn": pg_db.dsn(), "rate": 20, "first_key": -1, "poll_s": 0.02,
            "insert": "INSERT INTO items VALUES (%(key)s, 0, 'probe', now())",
            "followers": [
                {"name": "cache", "kind": "redis", "url": redis_url,
                 "key": "public.items:{key}"},
                {"name": "warehouse", "kind": "delta",
                 "path": str(table_dir(tmp_path / "wh", TOPIC)), "key_json": '{{"id":{key}}}'},
                {"name": "search", "kind": "search", "path": str(tmp_path / "search"),
                 "id": TOPIC + '\n{{"id":{key}}}'},
                {"name": "db", "kind": "sql", "url": follower_db.dsn(), "table": "items",
                 "column": "id"}]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "probe.jsonl"
    prober = subprocess.Popen(probe.command(tmp_path / "spec.json", out), cwd=tmp_path,
                              stderr=subprocess.PIPE)
    #: per follower, key -> (its write began, its write returned)
    written: dict[str, dict[int, tuple[float, float]]] = {name: {} for name in KINDS}
    applied: set[int] = set()
    started = time.time()
    try:
        seq = 0
        final = False
        deadline = time.monotonic() + 90
        while not (final and applied) and time.monotonic() < deadline:
            time.sleep(0.3)
            new = [k for (k,) in pg_db.execute("SELECT id FROM items WHERE id < 0")
                   if k not in applied]
            if not new:
                continue
            final = len(applied) >= 15  # this round's probes never reach the db follower
            for name, sink in sinks.items():
                if final and name == "db":
                    continue
                batch = []
                for key in new:
                    seq += 1
                    batch.append(Change(TOPIC, "src", "public.items", key_json(key), pos(seq),
                                        {"id": key, "v": 0, "note": "probe"}, "c"))
                began = time.time()
                sink.apply(batch)
                done = time.time()
                written[name].update({key: (began, done) for key in new})
            applied.update(new)
        expected = sum(len(keys) for keys in written.values())
        while (time.monotonic() < deadline and out.exists() and expected > sum(
                1 for line in out.read_text().splitlines() if '"follower"' in line)):
            time.sleep(0.2)  # the prober's last reads
    finally:
        prober.terminate()
        _, errors = prober.communicate(timeout=30)
        for sink in sinks.values():
            sink.close()
        follower_db.drop()
    assert prober.returncode in (0, -15), errors.decode()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    seen = [line for line in lines if "follower" in line]
    for name in KINDS:
        mine = {line["key"]: line["seen"] for line in seen if line["follower"] == name}
        assert mine, f"{name}: the prober saw no probe ({errors.decode()[-2000:]})"
        for key, at in mine.items():
            began, done = written[name][key]
            assert at >= began, f"{name}: {key} seen before it was written"
            assert at - done < 1.0, f"{name}: {key} seen {at - done:.3f} s after its write"
        assert set(mine) == set(written[name]), name
    figures = probe.summarize(out, started, time.time(), {name: name for name in KINDS})
    assert figures["db"]["unseen"] > 0
    assert figures["cache"]["unseen"] == figures["cache"]["probes"] - len(written["cache"])
