"""The speed guard: small versions of the capture, log and apply benchmarks, each as a ratio to a
reference measured in the same run, compared with the ratios committed in ``bench/baseline.json``.

Run with ``make bench-guard`` (CI runs it after ``make test``, alone on the machine) or
``.venv/bin/python bench/guard.py [--only PATH[,PATH]] [--runs N] [--json FILE]
[--write-baseline]``.

Why ratios of CPU seconds: a guard that compared rows per second with a committed number would
fail on a slower machine and pass a real slowdown on a faster one. Each path here is measured
against a reference that does comparable work on the same machine in the same minute -- the
tool the database ships, or the plain-library way of doing the same thing -- and both sides are
counted in CPU seconds per row, which other work on the machine changes far less than wall time.

Each path, as ours (CPU seconds of ...) against the reference (CPU seconds of ...):

- ``pg_stream``: ``cdc capture`` draining a backlog (its process, steady state: from its first
  committed record to its last; start-up excluded) against ``pg_recvlogical`` (pgoutput) over
  the same range (the client and the server's side: every postgres process).
- ``pg_snapshot``: ``cdc bootstrap`` of the loaded table (its process, from its first committed
  record to its exit) against ``psql -c "COPY (SELECT ...) TO STDOUT"`` into /dev/null (client
  and server).
- ``mysql_stream``: ``cdc capture`` draining a binlog backlog against ``mariadb-binlog
  --read-from-remote-server -v`` (client and server, mariadbd).
- ``mysql_snapshot``: ``cdc bootstrap`` of the loaded table against ``mariadb --quick -e
  "SELECT ..."`` (client and server).
- ``log_append``: ``LocalChangeLog.append`` of pre-built records, 1,000 a batch, fsync off (this
  process), against ``os.write`` of the same framed bytes to 8 files, 1,000 a batch.
- ``apply_fold``: the apply task's read + decode + fold of a local log
  (``spark_apply.tasks.fold_raw``; this process) against the same fold the plain way: latest
  (position, offset) per key in a dict, the winners decoded by fastavro.

ratio = reference CPU seconds per row / ours (higher is faster). Ours counts only our process --
it is what our code costs; the reference counts client and server, the whole cost of the
database's own tool, so that it is large enough to measure. The two capture tables are those of
``bench/pg_capture.py`` and ``bench/mysql_capture.py`` (imported from there: one definition).

The guard fails (exit 1) when a path's ratio (the best of ``--runs``, default 1) is more than
the baseline's ``margin`` below its baseline ratio, naming the path, both ratios and the
commands that reproduce it. ``--write-baseline`` measures and writes ``bench/baseline.json``
(the median of ``--runs`` per path): raising a baseline is a commit of its own. The last line
of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))  # `bench` is not an installed package

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench import common  # noqa: E402
from cdc_app.console import make_console  # noqa: E402

BASELINE = PROJECT / "bench" / "baseline.json"
#: a ratio may fall this far below its baseline before the guard fails (docs/benchmarks.md
#: has the spread it was chosen from)
DEFAULT_MARGIN = 0.30
PATHS = ("pg_stream", "pg_snapshot", "mysql_stream", "mysql_snapshot", "log_append",
         "apply_fold")
#: rows of the capture backlogs (then 10 % of them updated) and the snapshots
CAPTURE_ROWS = 250_000
#: records of the in-process paths
LOG_RECORDS = 200_000
#: distinct keys among them (the fold keeps one change per key)
FOLD_KEYS = 50_000
BATCH = 1_000
#: timings of each in-process side (the least is kept)
REPEATS = 5
#: a second pg_recvlogical slot: the reference runs before each of two captures
SECOND_RECV_SLOT = "guard_recv2"
REPRODUCE = {
    "pg_stream": "make bench-pg BENCH_ARGS=--no-debezium",
    "pg_snapshot": "make bench-pg BENCH_ARGS=--no-debezium",
    "mysql_stream": "make bench-mysql BENCH_ARGS='--no-debezium --huge-rows 0'",
    "mysql_snapshot": "make bench-mysql BENCH_ARGS='--no-debezium --huge-rows 0'",
    "log_append": "make bench",
    "apply_fold": "make bench-apply",
}


@dataclass
class Measurement:
    """One path's figures in one run: CPU seconds per row of ours and of the reference."""

    path: str
    rows: int
    ours_cpu_s: float
    ours_rows: int
    reference: str
    reference_cpu_s: float
    reference_rows: int
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """Reference CPU seconds per row / ours: above 1, ours costs less a row."""
        ours = self.ours_cpu_s / max(self.ours_rows, 1)
        reference = self.reference_cpu_s / max(self.reference_rows, 1)
        return reference / ours if ours > 0 else float("inf")

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": round(self.ratio, 4),
                "ours_us_per_row": round(self.ours_cpu_s / max(self.ours_rows, 1) * 1e6, 3),
                "reference_us_per_row": round(
                    self.reference_cpu_s / max(self.reference_rows, 1) * 1e6, 3)}


class GuardError(RuntimeError):
    """A measurement could not be made (a tool failed): the guard says so and exits 2."""


# ------------------------------------------------------------------------------ CPU counters


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a live process and of its children it has waited for."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return sum(int(fields[index]) for index in (11, 12, 13, 14)) / tick


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` (its exited children included, once reaped) and of its live
    children: a PostgreSQL server's postmaster and its backends (a walsender, a COPY's
    backend), whether they are still running or have exited."""
    total = process_cpu(root)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == root:
                total += process_cpu(int(entry.name))
    return total


def reference_cpu(client: Callable[[], common.Result], server: Callable[[], float], rows: int
                  ) -> tuple[float, int]:
    """Run a reference client (``run_to_devnull``-like, its own CPU from ``wait4``) and add
    the server's CPU seconds over the same interval: (CPU seconds, ``rows``)."""
    before = server()
    result = client()
    time.sleep(0.2)  # let the server's side of the connection finish and be reaped
    if result.error or result.cpu_s is None:
        raise GuardError(f"{result.tool}: {result.error}")
    return result.cpu_s + server() - before, rows


def steady_cpu(command: Sequence[str], log: Path, rows: int, out: Path, timeout: float
               ) -> tuple[float, int]:
    """Run ``cdc capture`` until the local log ``log`` holds ``rows`` records, measuring its
    CPU seconds from its first committed record (its start-up -- imports, connections, catalog
    -- is not what the guard watches) to its last, then stop it with SIGTERM. Returns (CPU
    seconds, records counted over them)."""
    deadline = time.monotonic() + timeout
    with open(out, "wb") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=PROJECT)
        try:
            first: tuple[float, int] | None = None
            while True:
                cpu = process_cpu(proc.pid)
                done = common.log_records(log)
                if first is None and done:
                    first = (cpu, done)
                if done >= rows:
                    break
                if proc.poll() is not None:
                    raise GuardError(f"`{' '.join(command)}` exited {proc.returncode} with "
                                     f"{done:,} of {rows:,} records in the log:\n"
                                     f"{common.tail(out)}")
                if time.monotonic() > deadline:
                    raise GuardError(f"`{' '.join(command)}` had {done:,} of {rows:,} records "
                                     f"after {timeout:.0f} s:\n{common.tail(out)}")
                time.sleep(0.02)
            assert first is not None
            return cpu - first[0], done - first[1]
        finally:
            common.stop(proc)


# ------------------------------------------------------------------------------ capture paths


def _args(rows: int, timeout: float) -> argparse.Namespace:
    """The options the full capture benchmarks' functions read, for a small run."""
    # profile=True: setup bootstraps a second source on the empty table (a second drain)
    return argparse.Namespace(rows=rows, batch=BATCH, updates=0.1, timeout=timeout, profile=True,
                              no_debezium=True, no_diagnostics=True, huge_rows=0, stall=120)


def quiet_console() -> Console:
    return Console(file=io.StringIO(), width=120)


Sample = tuple[float, int]  # (CPU seconds, rows counted over them)


def cheapest(samples: Sequence[Sample]) -> Sample:
    """The sample with the least CPU seconds a row: the one least disturbed by the rest of the
    machine (a VM's cores slow down and speed up over seconds; nothing makes code faster)."""
    return min(samples, key=lambda s: s[0] / max(s[1], 1))


def alternate(path: str, reference: str, measure_reference: Callable[[], Sample],
              measure_ours: Sequence[Callable[[], Sample]], notes: dict[str, Any] | None = None
              ) -> Measurement:
    """Reference, ours, reference, ours, ...: one reference before each of ``measure_ours``
    (each a fresh run of ours), so both sides see the same minutes of the machine; the
    cheapest sample of each side is kept."""
    refs: list[Sample] = []
    ours: list[Sample] = []
    for run in measure_ours:
        refs.append(measure_reference())
        ours.append(run())
    cpu, rows = cheapest(ours)
    ref_cpu, ref_rows = cheapest(refs)
    return Measurement(path, rows, cpu, rows, reference, ref_cpu, ref_rows,
                       {**(notes or {}), "ours_samples": ours, "reference_samples": refs})


def settle(server_cpu: Callable[[], float], limit: float = 15.0) -> float:
    """Wait (at most ``limit`` s) until the server spends under 4 % of a core over a quarter
    second -- the load's background work (a checkpoint, InnoDB's purge and page flushing,
    autovacuum) would otherwise land in the references' server CPU. Returns the seconds
    waited."""
    started = time.monotonic()
    before = server_cpu()
    while time.monotonic() - started < limit:
        time.sleep(0.25)
        now = server_cpu()
        if now - before < 0.01:
            break
        before = now
    return round(time.monotonic() - started, 2)


def drains(bench: common.CaptureBench, sources: Sequence[str], work: Path, timeout: float
           ) -> list[Callable[[], Sample]]:
    """One ``cdc capture`` drain of the backlog per source (each bootstrapped on the empty
    table before the backlog, with its own log): :func:`steady_cpu` of each."""
    def drain(source: str) -> Sample:
        return steady_cpu(common.capture_command(bench.work / f"{source}.yaml", __file__),
                          bench.work / f"log-{source}", bench.expected,
                          work / f"capture-{source}.out", timeout)
    return [lambda source=source: drain(source) for source in sources]  # type: ignore[misc]


def pg_paths(paths: Sequence[str], work: Path, rows: int, timeout: float,
             console: Console) -> list[Measurement]:
    """``pg_stream`` and ``pg_snapshot`` against one throwaway PostgreSQL."""
    from bench import pg_capture as pg
    from cdc_app.servers.postgres import ThrowawayPostgres

    results = []
    with ThrowawayPostgres() as server:
        bench = pg.Bench(args=_args(rows, timeout), console=quiet_console(),
                         progress_console=console, work=work, server=server)
        pg.setup(bench)  # bootstraps SOURCE and PROFILE_SOURCE on the empty table
        with bench.connect() as conn:
            pg.create_slot(conn, SECOND_RECV_SLOT)
        pg.load(bench)
        with bench.connect() as conn:
            conn.execute(f"VACUUM {pg.TABLE}")
            conn.execute("CHECKPOINT")
        postmaster = int((Path(str(server.directory)) / "data" / "postmaster.pid")
                         .read_text().split()[0])

        def server_cpu() -> float:
            return tree_cpu(postmaster)

        waited = settle(server_cpu)
        if "pg_stream" in paths:
            slots = iter((pg.RECV_SLOT, SECOND_RECV_SLOT))
            results.append(alternate(
                "pg_stream", "pg_recvlogical (pgoutput) + walsender",
                lambda: reference_cpu(lambda: pg.measure_recvlogical(bench, next(slots)),
                                      server_cpu, bench.expected),
                drains(bench, (pg.SOURCE, pg.PROFILE_SOURCE), work, timeout),
                {"settled_s": waited}))
        if "pg_snapshot" in paths:
            settle(server_cpu)  # the drains' walsenders and checkpoints done
            results.append(alternate(
                "pg_snapshot", "psql COPY TO STDOUT + its backend",
                lambda: reference_cpu(lambda: pg.measure_copy(bench), server_cpu, rows),
                [lambda source=source: run_to_exit(  # type: ignore[misc]
                    common.cdc_command("bootstrap", "--config",
                                       str(bench.source_config(source))),
                    bench.work / f"log-{source}", rows, work / f"bootstrap-{source}.out",
                    timeout)
                 for source in (pg.SNAPSHOT_SOURCE, f"{pg.SNAPSHOT_SOURCE}2")]))
    return results


def mysql_paths(paths: Sequence[str], work: Path, rows: int, timeout: float,
                console: Console) -> list[Measurement]:
    """``mysql_stream`` and ``mysql_snapshot`` against one throwaway MariaDB."""
    from bench import mysql_capture as my
    from cdc_app.servers.mysql import ThrowawayMariaDB

    results = []
    server = ThrowawayMariaDB(flush_log_at_trx_commit=2, sync_binlog=0,
                              options={"innodb_buffer_pool_size": "256M",
                                       "max_allowed_packet": "64M"})
    with server:
        bench = my.Bench(args=_args(rows, timeout), console=quiet_console(),
                         progress_console=console, work=work, server=server)
        my.setup(bench)  # bootstraps SOURCE and PROFILE_SOURCE on the empty table
        my.load(bench)
        assert server.process is not None
        pid = server.process.pid

        def server_cpu() -> float:
            return process_cpu(pid)

        waited = settle(server_cpu)
        if "mysql_stream" in paths:
            results.append(alternate(
                "mysql_stream", "mariadb-binlog -v + mariadbd",
                lambda: reference_cpu(lambda: my.measure_binlog(bench), server_cpu,
                                      bench.expected),
                drains(bench, (my.SOURCE, my.PROFILE_SOURCE), work, timeout),
                {"settled_s": waited}))
        if "mysql_snapshot" in paths:
            settle(server_cpu)  # the drains' binlog dump threads done
            log = bench.work / f"log-{my.SNAPSHOT_SOURCE}"
            config = bench.source_config(my.SNAPSHOT_SOURCE)

            def bootstrap() -> Sample:
                shutil.rmtree(log, ignore_errors=True)  # a fresh log each time
                return run_to_exit(common.cdc_command("bootstrap", "--config", str(config)),
                                   log, rows, work / "bootstrap.out", timeout)

            results.append(alternate(
                "mysql_snapshot", "mariadb --quick SELECT + mariadbd",
                lambda: reference_cpu(lambda: my.measure_select(bench), server_cpu, rows),
                [bootstrap, bootstrap]))
    return results


def run_to_exit(command: Sequence[str], log: Path, rows: int, out: Path, timeout: float
                ) -> tuple[float, int]:
    """A ``cdc`` command that exits once it has written ``rows`` records into ``log``: its CPU
    seconds from its first committed record to its exit (``wait4``'s total less what
    ``/proc`` said at the first record), and the records counted over them."""
    deadline = time.monotonic() + timeout
    with open(out, "wb") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=PROJECT)
        first: tuple[float, int] | None = None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                break
            if first is None:
                cpu = process_cpu(proc.pid)
                done = common.log_records(log)
                if done:
                    first = (cpu, done)
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise GuardError(f"`{' '.join(command)}` did not finish within {timeout:.0f} s")
            time.sleep(0.01)
    total = common.log_records(log)
    if proc.returncode != 0 or total < rows:
        raise GuardError(f"`{' '.join(command)}` exited {proc.returncode} with {total:,} of "
                         f"{rows:,} records in the log:\n{common.tail(out)}")
    if first is None:  # it wrote everything between two polls: no steady state was seen
        first = (0.0, 0)
    return usage.ru_utime + usage.ru_stime - first[0], total - first[1]


# ------------------------------------------------------------------------------ in-process paths


def log_and_fold_paths(paths: Sequence[str], work: Path, records: int, keys: int
                       ) -> list[Measurement]:
    """``log_append`` and ``apply_fold``, in this process (CPU from ``time.process_time``)."""
    from bench import log_append as la
    from cdc.log.schemas import SchemaStore

    log_dir = work / "fold-log"
    log_dir.mkdir()
    # the records' schemas are registered in the log's own store, as capture registers them
    built = la.build_records(records, work, lambda _n: None,
                             store=SchemaStore(log_dir, writable=True), keys=keys)
    results = []
    # each side REPEATS times, alternating, the cheapest kept: these take a fraction of a
    # second, where one slow second of the machine would show
    framed = la.frame(built)
    _append_all(la, log_dir, built)  # the log apply_fold reads
    appends = iter(range(1, 2 * REPEATS + 1))
    raws = iter(range(1, REPEATS + 1))
    if "log_append" in paths:
        results.append(alternate(
            "log_append", "os.write of the framed bytes to 8 files",
            lambda: (_cpu(lambda: _raw_append(work / f"raw-{next(raws)}", framed)), records),
            [lambda: (_cpu(lambda: _append_all(la, work / f"log-{next(appends)}", built)),
                      records)] * REPEATS))
    if "apply_fold" in paths:
        changes: list[int] = []

        def fold(how: Callable[[Path], tuple[float, int]]) -> Sample:
            cpu, count = how(log_dir)
            changes.append(count)
            return cpu, records

        results.append(alternate("apply_fold", "dict fold + fastavro decode of the winners",
                                 lambda: fold(_fold_reference),
                                 [lambda: fold(_fold_ours)] * REPEATS))
        if len(set(changes)) != 1:
            raise GuardError(f"apply_fold: ours and the reference folded {records:,} records "
                             f"into different counts of changes: {sorted(set(changes))}")
        results[-1].notes["changes"] = changes[0]
    for measurement in results:  # five samples a side: not worth a line of JSON each
        measurement.notes.pop("ours_samples")
        measurement.notes.pop("reference_samples")
    return results


def _cpu(work: Callable[[], object]) -> float:
    started = time.process_time()
    work()
    return time.process_time() - started


def _append_all(la: Any, directory: Path, records: Sequence[Any]) -> None:
    from cdc.log.local import LocalChangeLog
    from cdc_app.synthetic import ORDERS

    log = LocalChangeLog(directory, partitions=la.PARTITIONS, fsync=False)
    try:
        log.ensure_topic(ORDERS.topic, {"source": "shop", "table": str(ORDERS.table)})
        la.direct_append(log, records, BATCH)
    finally:
        log.close()


def _raw_append(directory: Path, framed: Sequence[tuple[int, bytes]]) -> None:
    directory.mkdir()
    fds = [os.open(directory / f"{index}.seg", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
           for index in range(8)]
    try:
        for start in range(0, len(framed), BATCH):
            parts: dict[int, list[bytes]] = {}
            for partition, data in framed[start:start + BATCH]:
                parts.setdefault(partition, []).append(data)
            for partition, pieces in parts.items():
                os.write(fds[partition], b"".join(pieces))
    finally:
        for fd in fds:
            os.close(fd)


def _log_settings(directory: Path) -> dict[str, Any]:
    return {"path": str(directory)}


def _fold_ours(directory: Path) -> tuple[float, int]:
    from cdc.reading import raw_records
    from spark_apply.tasks import TaskReport, fold_raw

    reader, decoder, ranges = common.whole_log(_log_settings(directory))
    started = time.process_time()
    changes = fold_raw(raw_records(reader, ranges), decoder.change, False, TaskReport())
    return time.process_time() - started, len(changes)


def _fold_reference(directory: Path) -> tuple[float, int]:
    """The fold done with the plain tools: the stored records read by the log's reader (not
    timed), then, timed: latest (position, offset) per key in a dict, and each winner's value
    decoded by fastavro against its writer schema."""
    import fastavro

    from cdc.reading import raw_records

    reader, _decoder, ranges = common.whole_log(_log_settings(directory))
    records = list(raw_records(reader, ranges))
    store = reader.schemas()
    parsed: dict[int, Any] = {}
    started = time.process_time()
    best: dict[tuple[str, bytes], tuple[bytes, int, bytes | None]] = {}
    for item, key, position, offset, payload in records:
        group = (item.topic, key)
        current = best.get(group)
        if current is None or (position, offset) > current[:2]:
            best[group] = (position, offset, payload)
    changes = 0
    for _position, _offset, payload in best.values():
        changes += 1
        if payload is None:  # a tombstone: a delete, nothing to decode
            continue
        schema_id = int.from_bytes(payload[1:5], "big")
        schema = parsed.get(schema_id)
        if schema is None:
            schema = parsed[schema_id] = fastavro.parse_schema(store.get(schema_id).schema)
        fastavro.schemaless_reader(io.BytesIO(payload[5:]), schema, None)
    return time.process_time() - started, changes


# ------------------------------------------------------------------------------ the run


def measure(paths: Sequence[str], rows: int, records: int, timeout: float, console: Console
            ) -> list[Measurement]:
    """One measurement of each of ``paths``."""
    results: list[Measurement] = []
    with tempfile.TemporaryDirectory(prefix="bench-guard-", dir=_tmp_parent()) as tmp:
        work = Path(tmp)
        if "log_append" in paths or "apply_fold" in paths:
            (work / "inproc").mkdir()
            results += log_and_fold_paths(paths, work / "inproc", records,
                                          max(records * FOLD_KEYS // LOG_RECORDS, 1))
        if "mysql_stream" in paths or "mysql_snapshot" in paths:
            (work / "mysql").mkdir()
            results += mysql_paths(paths, work / "mysql", rows, timeout, console)
        if "pg_stream" in paths or "pg_snapshot" in paths:
            (work / "pg").mkdir()
            results += pg_paths(paths, work / "pg", rows, timeout, console)
    order = {path: index for index, path in enumerate(PATHS)}
    return sorted(results, key=lambda m: order[m.path])


def _tmp_parent() -> Path:
    parent = PROJECT / ".bench-tmp"
    parent.mkdir(exist_ok=True)
    return parent


@dataclass
class Verdict:
    path: str
    ratio: float
    baseline: float | None
    floor: float | None

    @property
    def failed(self) -> bool:
        return self.floor is not None and self.ratio < self.floor


def judge(best: dict[str, float], baseline: dict[str, Any]) -> list[Verdict]:
    """Each measured path's best ratio against its baseline ratio less the margin."""
    margin = float(baseline.get("margin", DEFAULT_MARGIN))
    verdicts = []
    for path, ratio in best.items():
        base = baseline.get("paths", {}).get(path, {}).get("ratio")
        floor = None if base is None else base * (1 - margin)
        verdicts.append(Verdict(path, ratio, base, floor))
    return verdicts


def failure_text(verdict: Verdict, margin: float) -> str:
    assert verdict.baseline is not None
    drop = 1 - verdict.ratio / verdict.baseline
    return (f"{verdict.path}: ratio {verdict.ratio:.3f}, baseline {verdict.baseline:.3f} -- "
            f"{drop:.0%} slower against its reference (the margin is {margin:.0%}). "
            f"Reproduce: .venv/bin/python bench/guard.py --only {verdict.path} --runs 3; the "
            f"full benchmark: {REPRODUCE[verdict.path]}. If the slowdown is meant, lower the "
            f"baseline in a commit of its own (bench/guard.py --write-baseline --runs 5)")


def report(console: Console, runs: list[list[Measurement]], verdicts: list[Verdict]) -> None:
    table = Table(title="speed guard: reference CPU seconds per row / ours (higher is faster)")
    for column in ("path", "reference", "ours µs/row", "ref µs/row", "ratio (runs)",
                   "baseline", "floor", ""):
        table.add_column(column, justify="left" if column in ("path", "reference", "") else
                         "right")
    by_path: dict[str, list[Measurement]] = {}
    for run in runs:
        for m in run:
            by_path.setdefault(m.path, []).append(m)
    for verdict in verdicts:
        ms = by_path[verdict.path]
        best = max(ms, key=lambda m: m.ratio)
        figures = best.as_json()
        table.add_row(verdict.path, best.reference, f"{figures['ours_us_per_row']:.2f}",
                      f"{figures['reference_us_per_row']:.2f}",
                      " ".join(f"{m.ratio:.3f}" for m in ms),
                      "-" if verdict.baseline is None else f"{verdict.baseline:.3f}",
                      "-" if verdict.floor is None else f"{verdict.floor:.3f}",
                      "[red]SLOWER[/]" if verdict.failed else
                      "[red]no baseline[/]" if verdict.baseline is None else "[green]ok[/]")
    console.print(table)


def load_baseline(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"margin": DEFAULT_MARGIN, "paths": {}}
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def write_baseline(path: Path, runs: list[list[Measurement]], margin: float) -> None:
    by_path: dict[str, list[float]] = {}
    for run in runs:
        for m in run:
            by_path.setdefault(m.path, []).append(m.ratio)
    old = load_baseline(path)
    paths = old.get("paths", {})
    for name, ratios in by_path.items():
        paths[name] = {"ratio": round(statistics.median(ratios), 4),
                       "runs": [round(r, 4) for r in ratios],
                       "reference": next(m.reference for run in runs for m in run
                                         if m.path == name)}
    data = {"margin": margin,
            "about": "ratios of bench/guard.py (reference CPU seconds per row / ours), the "
                     "median of the runs; bench-guard fails below ratio x (1 - margin). Raise "
                     "or lower them only in a commit of their own.",
            "measured": time.strftime("%Y-%m-%d"),
            "paths": {name: paths[name] for name in PATHS if name in paths}}
    path.write_text(json.dumps(data, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(PATHS),
                        help=f"comma-separated paths to measure ({', '.join(PATHS)})")
    parser.add_argument("--runs", type=int, default=1,
                        help="measurements of each path; the best ratio is judged (1)")
    parser.add_argument("--rows", type=int, default=CAPTURE_ROWS,
                        help=f"rows of the capture backlogs and snapshots ({CAPTURE_ROWS:,})")
    parser.add_argument("--records", type=int, default=LOG_RECORDS,
                        help=f"records of log_append and apply_fold ({LOG_RECORDS:,})")
    parser.add_argument("--baseline", type=Path, default=BASELINE,
                        help="the committed ratios (bench/baseline.json)")
    parser.add_argument("--write-baseline", action="store_true",
                        help="write the measured ratios (median of --runs) as the baseline")
    parser.add_argument("--margin", type=float, default=None,
                        help="with --write-baseline: the margin to write (kept otherwise)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds any one measurement may take (300)")
    args = parser.parse_args(argv)
    paths = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = [p for p in paths if p not in PATHS]
    if unknown or not paths or args.runs < 1:
        parser.error(f"--only takes paths of {', '.join(PATHS)} (got {', '.join(unknown)}); "
                     "--runs at least 1")

    console = make_console()
    started = time.monotonic()
    runs: list[list[Measurement]] = []
    try:
        for index in range(args.runs):
            console.print(f"speed guard run {index + 1}/{args.runs}: {', '.join(paths)}",
                          highlight=False)
            runs.append(measure(paths, args.rows, args.records, args.timeout, console))
    except GuardError as exc:
        console.print(f"[red]speed guard: a measurement failed[/]: {exc}", highlight=False,
                      markup=True)
        return 2
    baseline = load_baseline(args.baseline)
    margin = float(baseline.get("margin", DEFAULT_MARGIN))
    best = {path: max(m.ratio for run in runs for m in run if m.path == path)
            for path in paths}
    verdicts = judge(best, baseline)
    report(console, runs, verdicts)
    summary = {"seconds": round(time.monotonic() - started, 1), "margin": margin,
               "load_averages": common.load_averages(),
               "runs": [[m.as_json() for m in run] for run in runs],
               "verdicts": [asdict(v) | {"failed": v.failed} for v in verdicts]}
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    if args.write_baseline:
        write_baseline(args.baseline, runs, args.margin if args.margin is not None else margin)
        console.print(f"baseline written to {args.baseline}", highlight=False)
        common.print_summary(summary)
        return 0
    missing = [v.path for v in verdicts if v.baseline is None]
    if missing:  # a guard without a baseline would pass anything
        console.print(f"[red]speed guard: no baseline for {', '.join(missing)}[/] in "
                      f"{args.baseline}: measure one with `.venv/bin/python bench/guard.py "
                      f"--only {','.join(missing)} --runs 5 --write-baseline` on a quiet machine "
                      "and commit it on its own", highlight=False, soft_wrap=True)
        common.print_summary(summary)
        return 2
    failed = [v for v in verdicts if v.failed]
    for verdict in failed:
        console.print(f"[red]speed guard FAILED[/] {failure_text(verdict, margin)}",
                      highlight=False, soft_wrap=True)  # one line to find in a CI log
    if not failed:
        console.print(f"speed guard: {len(verdicts)} path(s) within {margin:.0%} of their "
                      f"baselines in {summary['seconds']:.0f} s", highlight=False)
    common.print_summary(summary)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
