"""SIGKILL ``cdc apply`` at random moments under a write load; afterwards ``cdc verify`` passes
for every follower and each equals the table.

Real PostgreSQL (the ``pg_db`` fixture), ``cdc bootstrap`` + ``cdc capture`` as a subprocess,
and one ``cdc apply`` process running four followers of three kinds side by side (continuous,
600 records per micro-batch at most): ``cache`` (real Redis, 200 ms trigger), ``warehouse``
(Delta, SCD1), ``history`` (Delta, SCD2) and ``search`` (Tantivy). The process is SIGKILLed
:data:`KILLS` times and restarted from the followers' progress records each time. The kill
moments and their classification below follow the Redis follower (its script calls are
observable from outside); the other followers run in the same apply, so every kill lands
wherever their batches are at that instant. The load runs for the whole test: inserts, updates
(half of them leaving the out-of-line TOASTed ``note`` unchanged), primary-key changes and
deletes, plus updates and key changes of snapshotted rows whose TOASTed note never changes.

Each kill waits for one of these moments, in a random order (the seed is printed; set
``CDC_CRASH_SEED`` to replay its choices — the timing of the processes is not replayable):

``recovery``  a random delay of 0-500 ms after the restarted run first moves (replays the batch
              the last kill left in flight, or plans its first);
``in-batch``  a random delay of 0-600 ms after this run plans its first new micro-batch;
``written``   right after Redis executed a batch's writes (polling Redis's EVALSHA count), i.e.
              inside the batch, before its progress record was written;
``between``   right after the progress record counted a batch.

Every kill goes through ``tests/kills.py``: from the chosen moment it fires as soon as one of the
four queries has a batch planned and not committed, and it fails the test unless the driver's
queries planned, committed or wrote in the second before (a kill on an idle or still starting
process proves nothing; start-up kills before any work are therefore gone).

Most kills SIGKILL the whole process group at once (driver, JVM, Python workers: a machine or
container crash); every third kills only the ``cdc apply`` process (``kill -9 PID``): its JVM
notices and exits by itself (the test waits for that before restarting, and fails if it does
not happen within a minute).

After every kill (once the whole process group is gone) the test reads the progress record and Redis
and classifies what the kill hit: *before its first commit* (the run had committed nothing and
done nothing to the Redis batch in flight, if any); *mid-batch* (a batch in flight — named in
``planned.json``, not yet counted by ``progress.json`` — that this run planned, or had Redis run
script calls for, e.g. a replay going through the version gate), split by how many
of the batch's folded changes Redis already held (read back from the log's offset range and
compared with each Redis row's ``_cdc_position``): none, some, or all; or *between batches*.
Every batch left in flight must later be written again from the same start (the record still
says it). Replays of batches Redis already held go through the version gate: the last kill is
retried (at most :data:`EXTRA_KILLS` more) until it leaves such a batch, and the final run's
``skipped by the version gate`` counter must cover it. Then the load stops, ``cdc apply`` runs
once more, ``cdc verify`` must exit 0, and Redis's keys and column texts must equal the table's
rows as ``cdc verify`` decodes them.

What this cannot catch: a version gate that lets *equal or older* positions through. A replay
reads the same records from the same start, in order, so an un-gated replay rewrites the same values
and the end state is the same; the gate's ordering is exercised here (a gate that wrongly
skipped a newer change would leave the follower stale), its tolerance of older records by
``tests/test_fold.py`` and ``tests/test_apply.py`` (replay from offset 0, out-of-order batches).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from cdc.config import load_config
from cdc.events import TableId
from cdc.log.local import LocalChangeLogReader
from cdc.sink import open_sink, row_text
from cdc.transactions import TOPIC_SUFFIX as TRANSACTION_SUFFIX
from sinks.redis import DELETED_PREFIX, POSITION_FIELD, RedisSink
from tests.kills import Watch
from tests.pgkit import (
    PROJECT,
    Capture,
    Database,
    Load,
    assert_verified,
    cdc,
    output,
    stored_offset,
    verify_followers,
    wait_caught_up,
    wait_for,
    wait_progressing,
    write_config,
)
from tests.sparkkit import committed_batches, driver_watch, group_freeze

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

KILLS = 6
#: extra kills allowed to make the last one leave a batch Redis already holds
EXTRA_KILLS = 4
MAX_RECORDS = 600
#: the table followers' batches: bigger, so they keep up without many MERGEs / commits
TABLE_MAX_RECORDS = 5000
SEEDED_ROWS = 1500
TABLE = TableId("public", "items")


# --------------------------------------------------------------------------------- processes

#: the followers of the ``cdc apply`` process, as the config writes them
FOLLOWERS = ("cache", "warehouse", "history", "search")


class ApplyRun:
    """One ``cdc apply`` process of every follower (continuous), in its own process group."""

    def __init__(self, config: Path, log_file: Path) -> None:
        self.log_file = log_file
        self.started = time.monotonic()
        with open(log_file, "ab") as out:
            follow = [arg for name in FOLLOWERS for arg in ("--follower", name)]
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cdc_app.cli", "apply", "--config", str(config), *follow],
                stdout=out, stderr=out, cwd=PROJECT, start_new_session=True)

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self, whole_group: bool) -> float:
        """SIGKILL the group (or only the ``cdc apply`` process) and wait until every process of
        the group is gone; returns how long the rest of the group lived on."""
        pid = self.process.pid
        if whole_group:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):  # if the kill aimed with SIGSTOP
                os.killpg(pid, signal.SIGCONT)
        self.process.wait(30)
        killed = time.monotonic()
        while _group_alive(pid):
            if time.monotonic() - killed > 60:
                os.killpg(pid, signal.SIGKILL)
                raise AssertionError("the Spark JVM outlived its cdc apply process by 60 s")
            time.sleep(0.05)
        return time.monotonic() - killed

    def terminate(self) -> tuple[int, str]:
        """SIGTERM; the exit code and the output of this run."""
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            code = self.process.wait(30)
        return code, self.log_file.read_text(errors="replace")

    def cleanup(self) -> None:
        if _group_alive(self.process.pid):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


# -------------------------------------------------------------------------------- checkpoint

@dataclass
class Checkpoint:
    """The follower's progress folder (``spark_apply/progress.py``): ``planned.json`` names the
    batch handed to its runner (number, start and end offsets), ``progress.json`` counts the
    batches written and holds the offsets the follower resumes from."""

    path: Path

    def _read(self, name: str) -> dict[str, Any]:
        import json

        try:
            return dict(json.loads((self.path / name).read_text()))
        except (OSError, ValueError):
            return {}

    def committed(self) -> int:
        """Batches written (the number of the last one)."""
        return int(self._read("progress.json").get("batches", 0))

    def planned(self) -> int:
        """The number of the last batch handed to the runner."""
        return max(int(self._read("planned.json").get("batch", 0)), self.committed())

    def resumes_from(self) -> dict[str, Any]:
        return dict(self._read("progress.json").get("offsets") or {"topics": {}})

    def in_flight(self) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
        """The batch planned but not written, if any: (number, start, end)."""
        planned = self._read("planned.json")
        number = int(planned.get("batch", 0))
        if number <= self.committed():
            return None
        return number, dict(planned["start"]), dict(planned["end"])


def batch_changes(log: Path, start: dict[str, Any], end: dict[str, Any]
                  ) -> dict[tuple[str, str], bytes]:
    """The fold of the log records in ``(start, end]`` (source offsets as in the checkpoint):
    per (topic, key), the position of the record with the highest (position, offset) — leaving
    out keys whose winner is a tombstone of a delete in an earlier batch (they share the
    position, so Redis holds it already without this batch having been written)."""
    reader = LocalChangeLogReader(log)
    best: dict[tuple[str, str], tuple[bytes, int, bool]] = {}
    values: set[tuple[str, str, bytes]] = set()  # (topic, key, position) of non-tombstones
    for topic, parts in end.get("topics", {}).items():
        if topic.endswith(f".{TRANSACTION_SUFFIX}"):
            continue  # transaction events are not rows
        for partition, stop in parts.items():
            at = int(start.get("topics", {}).get(topic, {}).get(partition, 0))
            while at < stop:
                records = reader.read(topic, int(partition), at, min(4096, stop - at))
                if not records:
                    break
                for record in records:
                    if record.offset >= stop:
                        break
                    key, position = record.key.decode(), bytes(record.position)
                    if key == "{}":  # a truncate: table-level, never a change of its own
                        continue
                    if record.value is not None:
                        values.add((topic, key, position))
                    rank = (position, record.offset, record.value is None)
                    if (topic, key) not in best or rank[:2] > best[(topic, key)][:2]:
                        best[(topic, key)] = rank
                at = records[-1].offset + 1
    return {group: position for group, (position, _, tombstone) in best.items()
            if not tombstone or (*group, position) in values}


def held_positions(sink: RedisSink, groups: list[tuple[str, str]]) -> list[str | None]:
    """The position (hex) Redis holds for each (topic, key): the row's, else the delete
    marker's."""
    pipe = sink.client.pipeline(transaction=False)
    for topic, key in groups:
        row = sink.row_key(topic, key)
        pipe.hget(row, POSITION_FIELD)
        pipe.get(DELETED_PREFIX + row)
    found = pipe.execute()
    return [row or marker for row, marker in zip(found[::2], found[1::2], strict=True)]


@dataclass
class Kill:
    """What one kill did and hit."""

    mode: str
    whole_group: bool
    at: float  # seconds after the run started
    run_committed: int  # batches this run committed before the kill
    in_flight: int | None
    fresh: bool  # the in-flight batch was planned by this run (not left by an earlier kill)
    batch_changes: int = 0
    applied: int = 0  # of the in-flight batch's folded changes, already in Redis
    watermark: int = 0  # the follower's watermark LSN after the kill
    jvm_lived: float = 0.0

    #: the in-flight batch's changes Redis held at the previous kill (None: not in flight then)
    applied_before: int | None = None
    #: script calls (row writes, watermarks) Redis ran for this run
    redis_calls: int = 0

    @property
    def mid_batch(self) -> bool:
        """The kill landed inside a micro-batch of this run: it planned the batch in flight, or
        committed earlier ones, or had Redis run its writes of the (replayed) batch in flight —
        through the version gate when an earlier run had written them already."""
        return self.in_flight is not None and (self.fresh or self.run_committed > 0
                                               or self.applied != self.applied_before
                                               or self.redis_calls > 0)

    @property
    def hit(self) -> str:
        if self.mid_batch:
            if self.applied == 0:
                return "mid-batch, nothing written"
            if self.applied < self.batch_changes:
                return "mid-batch, partly written"
            return "mid-batch, written, not committed"
        return "before its first commit" if self.run_committed == 0 else "between batches"


# ------------------------------------------------------------------------------------- waits

def evalsha_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def wait_for_moment(mode: str, run: ApplyRun, checkpoint: Checkpoint, client: Any,
                    rng: random.Random, deadline: float, watch: Watch) -> None:
    """Return at the moment ``mode`` aims for (see the module docstring), or at ``deadline``
    (the kill then lands wherever the run is)."""
    offsets0, commits0 = checkpoint.planned(), checkpoint.committed()
    if mode == "recovery":
        watch.wait_moving(180)
        time.sleep(rng.uniform(0, 0.5))
        return
    if mode == "written":
        calls = evalsha_calls(client)
        while time.monotonic() < deadline and run.alive():
            if evalsha_calls(client) > calls:
                return
            time.sleep(0.002)
        return
    while time.monotonic() < deadline and run.alive():
        if mode == "in-batch" and checkpoint.planned() > offsets0:
            time.sleep(rng.uniform(0, 0.6))
            return
        if mode == "between" and checkpoint.committed() > commits0:
            return
        time.sleep(0.003)


# -------------------------------------------------------------------------------------- test

def seeded_row_edits(db: Database, rng: random.Random, moved: list[int]) -> None:
    """Update a few snapshotted rows without touching their TOASTed note, and move one to a new
    primary key (its note stays unchanged too)."""
    ids = [rng.randint(1, SEEDED_ROWS) for _ in range(3)]
    with db.connect() as conn, conn.transaction():
        conn.execute("UPDATE items SET v = v + 1, updated = now() WHERE id = ANY(%s)", (ids,))
        old = rng.randint(1, SEEDED_ROWS)
        new = 5_000_000 + len(moved)
        if conn.execute("UPDATE items SET id = %s, v = v + 1 WHERE id = %s",
                        (new, old)).rowcount:
            moved.append(new)


def leader_rows(config_path: Path) -> dict[str, dict[str, str]]:
    """Every row of the table as ``cdc verify`` decodes it, as follower text."""
    from connectors.postgres.checksum import PostgresLeader

    config = load_config(config_path)
    leader = PostgresLeader(config.sources[0])
    try:
        out: dict[str, dict[str, str]] = {}
        for chunk in leader.chunks(TABLE, 2000):
            for key, row in leader.rows(TABLE, chunk).items():
                out[key] = row_text(row)
        return out
    finally:
        leader.close()


def test_apply_survives_sigkill_under_load(pg_db: Database, tmp_path: Path,
                                          redis_url: str) -> None:
    began = time.monotonic()
    seed = int(os.environ.get("CDC_CRASH_SEED", random.randrange(1, 10**6)))
    print(f"\napply crash test: seed {seed} (CDC_CRASH_SEED={seed} replays the choices)")
    rng = random.Random(seed)
    pg_db.execute("""
        CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, amount numeric(12,2), note text,
                            updated timestamptz NOT NULL DEFAULT now());
        ALTER TABLE items ALTER note SET STORAGE EXTERNAL;  -- notes over 2 kB go out of line
        CREATE TABLE audit (seq bigserial PRIMARY KEY, id int NOT NULL, v int NOT NULL,
                            op text NOT NULL);
    """)
    pg_db.execute("INSERT INTO items (id, v, amount, note) SELECT g, 1, g / 7.0, "
                  "repeat(md5(g::text), 70) FROM generate_series(1, %s) g", (SEEDED_ROWS,))
    checkpoint = Checkpoint(tmp_path / "checkpoint")
    follower = (f"followers:\n  cache:\n    kind: redis\n    url: {redis_url}\n"
                f"    max_records_per_batch: {MAX_RECORDS}\n    trigger_interval: 200ms\n"
                f"    checkpoint: {checkpoint.path}\n"
                f"  warehouse:\n    kind: delta\n    path: {tmp_path / 'warehouse'}\n"
                f"    buckets: 4\n    max_records_per_batch: {TABLE_MAX_RECORDS}\n"
                f"    trigger_interval: 500ms\n"
                f"  history:\n    kind: delta\n    mode: scd2\n    path: {tmp_path / 'history'}\n"
                f"    buckets: 4\n    max_records_per_batch: {TABLE_MAX_RECORDS}\n"
                f"    trigger_interval: 500ms\n"
                f"  search:\n    kind: search\n    path: {tmp_path / 'search'}\n"
                f"    max_records_per_batch: {TABLE_MAX_RECORDS}\n    trigger_interval: 500ms\n")
    config_path = write_config(tmp_path, pg_db, ["public.items"], extra=follower)
    log = tmp_path / "log"
    topic = f"{pg_db.source}.public.items"
    result = cdc("bootstrap", "--config", str(config_path))
    assert result.returncode == 0, output(result)
    sink = open_sink(load_config(config_path), "cache")
    assert isinstance(sink, RedisSink)
    client = sink.client

    def watermark() -> int:
        return int((sink.watermark(pg_db.source) or {}).get("lsn", 0))

    capture = Capture(config_path, tmp_path / "capture.log").start()
    load = Load(pg_db, threads=2, key_changes=0.05, pause=0.05, seed=seed).start()
    modes = ["recovery", "in-batch", "written", "between", "between"]
    rng.shuffle(modes)
    modes.append("written")  # the last kill should leave a written, uncommitted batch
    kills: list[Kill] = []
    replays: dict[int, str] = {}  # in-flight batch -> its start offsets, until written
    confirmed_replays: set[int] = set()
    moved: list[int] = []
    run: ApplyRun | None = None
    roots = [checkpoint.path, tmp_path / "state" / "apply"]
    watch = driver_watch(roots, lambda: evalsha_calls(client)).start()
    try:
        while len(kills) < KILLS + EXTRA_KILLS:
            number = len(kills)
            if number >= KILLS and kills[-1].applied > 0:
                break
            mode = modes[number] if number < len(modes) else "written"
            run = ApplyRun(config_path, tmp_path / f"apply-{number:02d}.log")
            commits_at_start = checkpoint.committed()
            offsets_at_start = checkpoint.planned()
            calls_at_start = evalsha_calls(client)
            wait_for_moment(mode, run, checkpoint, client, rng, time.monotonic() + 180, watch)
            assert run.alive(), run.log_file.read_text(errors="replace")[-3000:]
            whole_group = number % 3 != 2
            at = time.monotonic() - run.started
            lived: list[float] = []
            watch.kill(mode, lambda r=run, g=whole_group, out=lived: out.append(r.kill(g)),
                       lambda: committed_batches(roots), aim=60,
                       freeze=group_freeze(run.process.pid))
            jvm_lived = lived[0]
            flight = checkpoint.in_flight()
            in_flight = None if flight is None else flight[0]
            kill = Kill(mode, whole_group, at, checkpoint.committed() - commits_at_start,
                        in_flight, in_flight is not None and in_flight > offsets_at_start,
                        watermark=watermark(), jvm_lived=jvm_lived,
                        redis_calls=evalsha_calls(client) - calls_at_start)
            if flight is not None:
                number, start, end = flight
                changes = batch_changes(log, start, end)
                groups = sorted(changes)
                held = held_positions(sink, groups)
                kill.batch_changes = len(groups)
                kill.applied = sum(h == changes[g].hex() for g, h in zip(groups, held,
                                                                           strict=True))
                if kills and kills[-1].in_flight == in_flight:
                    kill.applied_before = kills[-1].applied
                # the record still says where the batch started: the restart resumes there
                assert checkpoint.resumes_from() == start or not checkpoint.committed(), number
                replays.setdefault(number, json.dumps(start, sort_keys=True))
            for batch in list(replays):
                if checkpoint.committed() >= batch:  # written again, from the same start
                    confirmed_replays.add(batch)
                    del replays[batch]
            kills.append(kill)
            print(f"kill {number + 1:2d}: {mode:8s} {'group' if whole_group else 'pid  '} "
                  f"at {at:5.1f} s, run committed {kill.run_committed:3d} batches -> "
                  f"{kill.hit}" + (f" (batch {in_flight} in flight: {kill.applied}/"
                                   f"{kill.batch_changes} changes in Redis)"
                                   if in_flight is not None else "")
                  + f", {kill.redis_calls} Redis script calls, watermark {kill.watermark:X}"
                  + ("" if whole_group else f", JVM lived {jvm_lived:.1f} s more"),
                  flush=True)
            seeded_row_edits(pg_db, rng, moved)
            time.sleep(rng.uniform(0, 0.5))
        run = None
        load.finish()
        wait_caught_up(pg_db, log, timeout=180)

        # the last run: replays what the last kill left in flight (with the same offsets),
        # then follows; verify
        run = ApplyRun(config_path, tmp_path / "apply-final.log")
        for batch in replays:
            wait_for(lambda b=batch: checkpoint.committed() >= b, 300, f"batch {batch}")
            confirmed_replays.add(batch)
        # the backlog the load left grows with the time the kills took (a loaded machine's
        # kill phase is longer): wait while the followers keep committing batches, until
        # the cache's watermark passes the capture's (written once a batch drained it all)
        target = int((stored_offset(log, pg_db.source) or {}).get("lsn", 0))
        wait_progressing(lambda: watermark() >= target, lambda: committed_batches(roots),
                         180, f"follower cache's watermark to reach {target:X}")
        verified = verify_followers(config_path, FOLLOWERS)
        code, text = run.terminate()
        run = None
    finally:
        watch.stop()
        if run is not None:
            run.cleanup()
        load.stop.set()
        capture_code = capture.terminate()
    assert capture_code == 0, (tmp_path / "capture.log").read_text()[-3000:]
    assert_verified(verified)
    assert code == 0, text[-3000:]

    # every follower equals the table: the same keys, the same column texts
    leader = leader_rows(config_path)
    for name in FOLLOWERS:
        follower_sink = sink if name == "cache" else open_sink(load_config(config_path), name)
        held_keys = set(follower_sink.keys(topic))
        assert held_keys == set(leader), (
            f"{name}: only in the follower: {sorted(held_keys - set(leader))[:5]}, "
            f"only in the table: {sorted(set(leader) - held_keys)[:5]}")
        rows = follower_sink.read(topic, sorted(held_keys))
        differing = [key for key in leader if rows[key] != leader[key]]
        assert not differing, f"{name}: {len(differing)} rows differ, e.g. {differing[:5]}"
        if follower_sink is not sink:
            follower_sink.close()
    notes = pg_db.execute("SELECT count(*) FROM items WHERE length(note) > 2000")[0][0]

    # the kills hit what they were meant to
    hits = Counter(kill.hit for kill in kills)
    summary = re.search(r"follower cache: ([\d,]+) batches[^\n]*? ([\d,]+) skipped by the "
                        r"version gate", text)  # (its own line: every follower has one)
    assert summary, text[-3000:]
    final_skipped = int(summary.group(2).replace(",", ""))
    written_in_flight = [k for k in kills if k.mid_batch and k.applied > 0]
    left_in_flight = {k.in_flight for k in kills if k.in_flight is not None}
    print(f"kills: {dict(hits)}; replays confirmed (written later from the same start): "
          f"{len(confirmed_replays)} of {len(left_in_flight)}; final run skipped {final_skipped:,} "
          "by the gate "
          f"(last kill left {kills[-1].applied} written); {len(leader):,} rows "
          f"({notes:,} with TOASTed notes, {len(moved)} snapshotted rows moved to a new key), "
          f"{load.committed:,} load transactions; {time.monotonic() - began:.0f} s in all")
    assert len(kills) >= KILLS
    assert sum(1 for k in kills if k.mid_batch) >= 3, hits
    assert len(written_in_flight) >= 2, hits  # replays that must go through the version gate
    assert confirmed_replays == left_in_flight  # each written again from where it started
    assert kills[-1].applied > 0, "no kill left a written, uncommitted batch at the end"
    assert final_skipped >= kills[-1].applied
    marks = [kill.watermark for kill in kills]
    assert marks == sorted(marks)
    assert sum(kill.run_committed > 0 for kill in kills) >= 2  # progress between the kills
    assert len(moved) > 0 and notes > 1000
