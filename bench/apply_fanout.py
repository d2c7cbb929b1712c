"""Benchmark: ``cdc apply``'s one-pass loop fanned out to many followers and views (issue 44,
point 1), Spark local mode ``local[2]`` (no SparkSession is started in local mode).

Run with ``.venv/bin/python bench/apply_fanout.py [--scale 0.01] [--skip-once]
[--skip-startup] [--json FILE] [--keep]``.

The world (throwaway servers, ``cdc_app.servers``; the TPC-H set-up of
``tests/test_tpch_views.py``, imported from there):

* TPC-H at ``--scale`` (default 0.01: 86,805 rows in 8 tables) from ``tpchgen-cli``, loaded
  into a throwaway PostgreSQL (``tests/pgkit.py``'s ``start_cluster``);
* **the big log**: ``cdc bootstrap`` of those rows, then ``cdc capture`` of every lineitem
  updated once (``l_comment``) in transactions of ``--txn`` rows (default 2,000): ~147,000
  changes at SF 0.01; capture is stopped once it caught up;
* **the small log**: a second database with the same tables and only a few rows in each (the
  first 10 orders with their lineitems, ...), bootstrapped: an (almost) empty log;
* one throwaway ``redis-server``. The followers: ``cache1``/``cache2`` (Redis, databases 1
  and 2, flushed before each run) and ``lite1``/``lite2`` (``kind: sql`` into SQLite files);
  the 22 TPC-H queries as views ``q01``..``q22`` written into ``viewdb`` (SQLite; a follower
  that is not itself applied). Every run has its own progress folders and view states.

Measurements:

**(a) read + decode CPU per change** — ``cdc apply --once`` of the big log, each in a fresh
child process of this script (``run_apply`` in-process there), with 1 follower (``cache1``), 4
(the four followers) and 26 (the four + the 22 views). Read + decode CPU: the loop's own
thread (``ApplyJob.read_cpu_seconds``: planning, reading, folding, decoding for the views,
cutting the batches) plus what each follower's processes spent reading and decoding
(``FollowerProgress.read_cpu_seconds``: a follower's process decodes what it writes, and a
follower alone in its share reads its ranges itself), per record the loop planned
(``read_records``): must not grow with the count. Beside it: the wall time of
``run_apply`` and from the child's start (imports included), its CPU (the child and its
follower processes), each follower's batches and records, views that failed, and the peak RSS
of the apply process alone and with its children (sampled every 0.2 s from ``/proc``).

**(b) start-up** — ``cdc apply`` (continuous, a subprocess: ``python -m cdc_app.cli apply``) of
the small log with the four followers and 22 views: seconds from ``Popen`` to each follower's
and view's first committed batch (its ``progress.json`` exists in its progress folder): goal
< 20 s for the last of them.

**(c) driver memory per extra view** — the same continuous ``cdc apply`` of the small log with
the four followers and no view: RSS of the apply process (the parent, and parent + children)
sampled for ``--settle`` s after every first batch was committed; per extra view = (22 views -
0 views) / 22: goal <= 50 MB. The same figure from (a)'s peak RSS (4 vs 26, the big log) is
reported beside it.

``uptime`` at the start and the end and the 1-minute load beside each run. A Rich table; the
last line of stdout is the JSON of the results (``--json FILE`` writes it there too).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MASTER = "local[2]"
FOLLOWERS = ("cache1", "cache2", "lite1", "lite2")
SETTLE_S = 5.0


# ------------------------------------------------------------------------------ /proc

def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children, their children, ...)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RssSampler:
    """RSS of ``pid`` alone and with its descendants, every ``every`` s in a thread: the peaks,
    and the samples taken after :meth:`mark` (the steady state)."""

    def __init__(self, pid: int, every: float = 0.2) -> None:
        self.pid, self.every = pid, every
        self.peak_parent = self.peak_total = 0.0
        self.after: list[tuple[float, float, int]] = []
        self.children_cpu: dict[int, float] = {}
        self._marked = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss-sampler")

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def mark(self) -> None:
        self._marked = True

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def sample(self) -> tuple[float, float, int]:
        parent = _rss_mb(self.pid)
        children = _descendants(self.pid)
        for child in children:  # the last CPU seen of each (they are gone at the end)
            self.children_cpu[child] = _cpu_s(child)
        return parent, parent + sum(_rss_mb(c) for c in children), len(children)

    def _run(self) -> None:
        while not self._stop.is_set():
            parent, total, children = self.sample()
            self.peak_parent = max(self.peak_parent, parent)
            self.peak_total = max(self.peak_total, total)
            if self._marked:
                self.after.append((parent, total, children))
            self._stop.wait(self.every)

    def steady(self) -> dict[str, Any]:
        """The median of the samples after :meth:`mark` (parent, parent + children)."""
        if not self.after:
            return {"parent_mb": None, "total_mb": None, "children": None}
        parents = sorted(s[0] for s in self.after)
        totals = sorted(s[1] for s in self.after)
        return {"parent_mb": round(parents[len(parents) // 2], 1),
                "total_mb": round(totals[len(totals) // 2], 1),
                "children": max(s[2] for s in self.after), "samples": len(self.after)}


# ------------------------------------------------------------------------------ the child

def child_main(spec_path: Path) -> None:
    """(a)'s child: ``run_apply(..., once=True)`` of the spec's config and names in this
    process; its figures as JSON into ``spec["result"]``."""
    started = time.perf_counter()
    spec = json.loads(spec_path.read_text())
    sampler = RssSampler(os.getpid()).start()
    from cdc.config import load_config
    from spark_apply import jobs

    imported = time.perf_counter() - started
    seen: list[Any] = []
    wait = jobs.ApplyJob.wait

    def keep(self: Any, *args: Any, **kwargs: Any) -> None:  # the job, even when it raises
        seen.append(self)
        wait(self, *args, **kwargs)
    jobs.ApplyJob.wait = keep  # type: ignore[method-assign]
    error = None
    before = os.times()
    applying = time.perf_counter()
    try:
        jobs.run_apply(load_config(Path(spec["config"])), spec["names"], once=True,
                       master=MASTER)
    except BaseException as exc:  # noqa: BLE001 - reported
        error = f"{type(exc).__name__}: {str(exc)[:600]}"
    apply_s = time.perf_counter() - applying
    after = os.times()
    sampler.stop()
    job = seen[0] if seen else None
    figures: dict[str, Any] = {
        "imports_s": round(imported, 2), "apply_s": round(apply_s, 2),
        "from_start_s": round(time.perf_counter() - started, 2), "error": error,
        "parent_cpu_s": round(after.user + after.system - before.user - before.system, 2),
        "children_cpu_s": round(max(sum(sampler.children_cpu.values()),
                                    after.children_user + after.children_system
                                    - before.children_user - before.children_system), 2),
        "peak_parent_mb": round(sampler.peak_parent, 1),
        "peak_total_mb": round(sampler.peak_total, 1),
        "vmhwm_mb": round(_hwm_mb(), 1)}
    if job is not None:
        figures.update(
            read_cpu_s=round(job.read_cpu_seconds, 3), read_records=job.read_records,
            followers_read_cpu_s=round(sum(p.read_cpu_seconds
                                           for p in job.progress.values()), 3),
            failed_views={k: str(v)[:300] for k, v in job.failed_views.items()},
            restarts=dict(job.restarts),
            followers={name: {"batches": p.batches, "records": p.records, "changes": p.changes,
                              "written": p.written, "seconds": round(p.seconds, 2),
                              "error": str(p.error)[:300] if p.error else None}
                       for name, p in job.progress.items()})
    Path(spec["result"]).write_text(json.dumps(figures))


def child_phases(spec_path: Path) -> None:
    """(b)'s breakdown: continuous ``run_apply`` in this process (a thread), the time from this
    process's start to the end of each of its steps (imports, ``ApplyJob.prepare`` — the log
    and every sink's check —, the runners, ``ApplyJob.start``, each name's first batch handed
    to its runner and its first ``progress.json``); stopped once every first batch is in."""
    started = time.perf_counter()
    spec = json.loads(spec_path.read_text())
    from cdc.config import load_config
    from spark_apply import jobs

    marks: dict[str, float] = {"imports": time.perf_counter() - started}
    dispatched: dict[str, float] = {}

    def timed(name: str, method: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            marks.setdefault(f"{name} begins", time.perf_counter() - started)
            try:
                return method(*args, **kwargs)
            finally:
                marks.setdefault(f"{name} ends", time.perf_counter() - started)
        return wrapper

    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    real_prepare = jobs.ApplyJob.prepare.__func__  # type: ignore[attr-defined]

    def profiled_prepare(*args: Any, **kwargs: Any) -> Any:
        return profile.runcall(real_prepare, *args, **kwargs)
    jobs.ApplyJob.prepare = classmethod(timed("prepare", profiled_prepare))  # type: ignore
    jobs.ApplyJob.runners = timed("runners", jobs.ApplyJob.runners)  # type: ignore
    jobs.ApplyJob.start = timed("start", jobs.ApplyJob.start)  # type: ignore
    real_dispatch = jobs.ApplyJob._dispatch

    def dispatch(self: Any, name: str, batch: Any) -> None:
        dispatched.setdefault(name, time.perf_counter() - started)
        real_dispatch(self, name, batch)
    jobs.ApplyJob._dispatch = dispatch  # type: ignore[method-assign]
    config = load_config(Path(spec["config"]))
    marks["config loaded"] = time.perf_counter() - started
    stop = threading.Event()
    errors: list[str] = []

    def run() -> None:
        try:
            jobs.run_apply(config, spec["names"], once=False, stop=stop,
                           master=MASTER)
        except BaseException as exc:  # noqa: BLE001 - reported
            errors.append(f"{type(exc).__name__}: {str(exc)[:600]}")
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    paths = {name: config.follower_checkpoint(name) / "progress.json" for name in spec["names"]}
    committed: dict[str, float] = {}
    deadline = time.monotonic() + 300
    while len(committed) < len(paths) and thread.is_alive() and time.monotonic() < deadline:
        for name, path in paths.items():
            if name not in committed and path.exists():
                committed[name] = time.perf_counter() - started
        time.sleep(0.05)
    stop.set()
    thread.join(60)
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(25)
    Path(spec["result"]).with_suffix(".prepare-profile.txt").write_text(out.getvalue())
    Path(spec["result"]).write_text(json.dumps({
        "marks": {k: round(v, 2) for k, v in sorted(marks.items(), key=lambda i: i[1])},
        "first_dispatch_s": round(min(dispatched.values()), 2) if dispatched else None,
        "last_dispatch_s": round(max(dispatched.values()), 2) if dispatched else None,
        "first_committed_s": round(min(committed.values()), 2) if committed else None,
        "all_committed_s": round(max(committed.values()), 2)
        if len(committed) == len(paths) else None,
        "committed": {k: round(v, 2) for k, v in committed.items()},
        "errors": errors,
        "prepare_profile": [line for line in out.getvalue().splitlines() if line.strip()][:32]}))


def _hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


# ------------------------------------------------------------------------------ the world

def generate(directory: Path, scale: float) -> dict[str, list[list[str]]]:
    """TPC-H's rows at ``scale`` per table (``tpchgen-cli``), as the generator's texts."""
    from tests.test_tpch_views import TABLES

    tool = Path(sys.executable).parent / "tpchgen-cli"
    done = subprocess.run([str(tool), "tbl", "--scale-factor", str(scale), "--output-dir",
                           str(directory), "--quiet"], capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"tpchgen-cli failed: {done.stdout}{done.stderr}")
    tables = {}
    for name, (columns, _key) in TABLES.items():
        lines = (directory / f"{name}.tbl").read_text().splitlines()
        tables[name] = [line.split("|")[:len(columns)] for line in lines]
    return tables


def small(tables: dict[str, list[list[str]]], orders: int = 10) -> dict[str, list[list[str]]]:
    """A few rows of each table: the first ``orders`` orders and their lineitems, the parts,
    suppliers and customers they name (and the first 10 of each), every nation and region."""
    keep_orders = tables["orders"][:orders]
    order_keys = {row[0] for row in keep_orders}
    items = [row for row in tables["lineitem"] if row[0] in order_keys]
    parts = {row[1] for row in items} | {row[0] for row in tables["part"][:10]}
    suppliers = {row[2] for row in items} | {row[0] for row in tables["supplier"][:10]}
    customers = {row[1] for row in keep_orders} | {row[0] for row in tables["customer"][:10]}
    return {"region": tables["region"], "nation": tables["nation"],
            "supplier": [r for r in tables["supplier"] if r[0] in suppliers],
            "customer": [r for r in tables["customer"] if r[0] in customers],
            "part": [r for r in tables["part"] if r[0] in parts],
            "partsupp": [r for r in tables["partsupp"] if r[0] in parts and r[1] in suppliers],
            "orders": keep_orders, "lineitem": items}


def load_rows(db: Any, tables: dict[str, list[list[str]]]) -> int:
    from tests.test_tpch_views import _ddl, _inserts

    with db.connect() as conn, conn.transaction():
        for statement in _ddl():
            conn.execute(statement)
        for name, rows in tables.items():
            for statement in _inserts(name, rows):
                conn.execute(statement)
    return sum(len(rows) for rows in tables.values())


def run_config(run_dir: Path, db: Any, log: Path, redis_url: str, views: bool) -> Path:
    """A ``cdc.yaml`` of the log ``log`` with the four followers (progress folders under
    ``run_dir``) and, with ``views``, the 22 TPC-H views into ``viewdb``."""
    from tests.pgkit import write_config
    from tests.test_tpch_views import QUERIES, TABLES, _one_line

    run_dir.mkdir(parents=True, exist_ok=True)
    base = redis_url.rsplit("/", 1)[0]
    lines = ["followers:"]
    for number in (1, 2):
        lines += [f"  cache{number}:", "    kind: redis", f"    url: {base}/{number}",
                  f"    checkpoint: {run_dir / 'progress' / f'cache{number}'}"]
        lines += [f"  lite{number}:", "    kind: sql",
                  f"    url: sqlite:///{run_dir / f'lite{number}.sqlite'}",
                  f"    checkpoint: {run_dir / 'progress' / f'lite{number}'}"]
    lines += ["  viewdb:", "    kind: sql", f"    url: sqlite:///{run_dir / 'views.sqlite'}",
              f"    checkpoint: {run_dir / 'progress' / 'viewdb'}"]
    if views:
        lines.append("views:")
        for name, sql, key, _limited in QUERIES:
            lines += [f"  {name}:", f"    source: {db.source}",
                      f"    sql: {json.dumps(_one_line(sql))}",
                      f"    key: {json.dumps(list(key))}", "    followers: [viewdb]",
                      f"    checkpoint: {run_dir / 'progress' / f'view-{name}'}",
                      f"    state: {run_dir / 'state' / f'{name}.duckdb'}"]
    lines.append(f"spark:\n  master: {json.dumps(MASTER)}")
    return write_config(run_dir, db, [f"public.{name}" for name in TABLES], log_path=log,
                        extra="\n".join(lines) + "\n")


def flush_redis(url: str) -> None:
    import redis

    with redis.Redis.from_url(url) as client:
        client.flushall()


def cdc_ok(*args: str, timeout: float = 900) -> str:
    from tests.pgkit import cdc, output

    done = cdc(*args, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"cdc {' '.join(args[:1])} failed: {output(done)[-3000:]}")
    return done.stdout


def log_records(log: Path) -> int:
    """Records committed in the local log (every topic)."""
    from cdc.log.open import reader_from

    reader = reader_from({"path": str(log)})
    assert reader is not None
    try:
        return sum(sum(ends) for ends in reader.committed().ends.values())
    finally:
        reader.close()


# ------------------------------------------------------------------------------ (a)

def once_run(work: Path, config: Path, names: list[str], label: str, timeout: float
             ) -> dict[str, Any]:
    spec = {"config": str(config), "names": names, "result": str(work / f"{label}.json")}
    spec_path = work / f"{label}.spec.json"
    spec_path.write_text(json.dumps(spec))
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    with open(work / f"{label}.out", "wb") as out:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child",
                                 str(spec_path)], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
    wall = time.perf_counter() - started
    result_path = work / f"{label}.json"
    figures: dict[str, Any] = json.loads(result_path.read_text()) if result_path.exists() \
        else {"error": f"no result (exit {proc.returncode}): "
                       f"{(work / f'{label}.out').read_text(errors='replace')[-1500:]}"}
    figures.update(count=len(names), names=names, process_wall_s=round(wall, 2),
                   exit=proc.returncode, load_1m_before=round(load_before, 2),
                   load_1m_after=round(os.getloadavg()[0], 2))
    records = figures.get("read_records")
    if records:  # the loop's read and each follower process's own read + decode, together
        total = figures["read_cpu_s"] + figures.get("followers_read_cpu_s", 0.0)
        figures["read_cpu_us_per_record"] = round(total / records * 1e6, 2)
    return figures


# ------------------------------------------------------------------------------ (b), (c)

def startup_run(work: Path, config: Path, names: list[str], views: list[str], label: str,
                timeout: float, settle: float) -> dict[str, Any]:
    """``cdc apply`` continuous as a subprocess: seconds from ``Popen`` to each name's first
    committed batch (its ``progress.json``), then RSS for ``settle`` s; SIGTERM."""
    from cdc.config import load_config

    loaded = load_config(config)
    folders = {name: loaded.follower_checkpoint(name) / "progress.json" for name in names + views}
    args = [sys.executable, "-m", "cdc_app.cli", "apply", "--config", str(config),
            "--master", MASTER, *[a for n in names for a in ("--follower", n)],
            *[a for v in views for a in ("--view", v)]]
    load_before = os.getloadavg()[0]
    first: dict[str, float] = {}
    error = None
    log_file = work / f"{label}.log"
    with open(log_file, "wb") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                start_new_session=True)
        sampler = RssSampler(proc.pid).start()
        try:
            while len(first) < len(folders):
                now = time.perf_counter() - started
                for name, path in folders.items():
                    if name not in first and path.exists():
                        first[name] = now
                if proc.poll() is not None:
                    error = f"cdc apply exited {proc.returncode} before every first batch"
                    break
                if now > timeout:
                    error = f"not every first batch within {timeout:.0f} s"
                    break
                time.sleep(0.05)
            if error is None:
                sampler.mark()
                time.sleep(settle)
        finally:
            sampler.stop()
            stopping = time.perf_counter()
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
            stop_s = time.perf_counter() - stopping
            with contextlib.suppress(ProcessLookupError):  # nothing of it may outlive it
                os.killpg(proc.pid, signal.SIGKILL)
    text = log_file.read_text(errors="replace")
    missing = sorted(set(folders) - set(first))
    last = max(first.values()) if first and not missing else None
    return {"label": label, "followers": len(names), "views": len(views),
            "first_batch_s": {k: round(v, 2) for k, v in sorted(first.items(), key=lambda i: i[1])},
            "all_first_batches_s": round(last, 2) if last is not None else None,
            "followers_first_s": round(max(first[n] for n in names), 2)
            if all(n in first for n in names) else None,
            "views_first_s": round(max(first[v] for v in views), 2)
            if views and all(v in first for v in views) else None,
            "missing": missing, "error": error, "exit": proc.returncode, "stop_s": round(stop_s, 2),
            "peak_parent_mb": round(sampler.peak_parent, 1),
            "peak_total_mb": round(sampler.peak_total, 1), "steady": sampler.steady(),
            "load_1m_before": round(load_before, 2),
            "load_1m_after": round(os.getloadavg()[0], 2),
            "log_errors": [line for line in text.splitlines()
                           if "error" in line.lower() or "Traceback" in line][:20],
            "log_tail": text[-1500:] if error or proc.returncode not in (0, -15) else ""}


def phases_run(work: Path, config: Path, names: list[str]) -> dict[str, Any]:
    spec = {"config": str(config), "names": names, "result": str(work / "phases.json")}
    spec_path = work / "phases.spec.json"
    spec_path.write_text(json.dumps(spec))
    load_before = os.getloadavg()[0]
    with open(work / "phases.out", "wb") as out:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()),
                                 "--child-phases", str(spec_path)], stdout=out,
                                stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            proc.wait(400)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
    path = work / "phases.json"
    figures: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {
        "errors": [(work / "phases.out").read_text(errors="replace")[-1500:]]}
    figures.update(load_1m_before=round(load_before, 2), exit=proc.returncode)
    return figures


# ------------------------------------------------------------------------------ main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-phases", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--scale", type=float, default=0.01, help="TPC-H scale factor (0.01)")
    parser.add_argument("--txn", type=int, default=2000,
                        help="lineitems updated per transaction for the big log (2,000)")
    parser.add_argument("--counts", default="1,4,26",
                        help="(a)'s runs in order: 1 = cache1, 4 = the four followers, 26 = the "
                             "four + the 22 views, or names joined by + (1,4,26)")
    parser.add_argument("--settle", type=float, default=SETTLE_S,
                        help=f"(c): seconds of RSS samples after the first batches ({SETTLE_S:g})")
    parser.add_argument("--skip-once", action="store_true", help="skip (a)")
    parser.add_argument("--skip-startup", action="store_true", help="skip (b) and (c)")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--timeout", type=float, default=1800, help="per run (1800 s)")
    args = parser.parse_args()
    if args.child is not None:
        child_main(args.child)
        return
    if args.child_phases is not None:
        child_phases(args.child_phases)
        return

    from rich.console import Console

    from bench.common import figures_table, goal, print_json, uptime, work_directory
    from cdc_app.servers.redis import ThrowawayRedis
    from tests.pgkit import Capture, new_database, start_cluster, wait_caught_up
    from tests.test_tpch_views import QUERIES

    console = Console(stderr=True, width=200)
    views = [name for name, *_ in QUERIES]
    results: dict[str, Any] = {"master": MASTER, "scale": args.scale, "uptime_start": uptime(),
                               "cpus": os.cpu_count()}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT, check=False).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "cdc", "spark_apply", "sinks",
                            "views", "connectors", "cdc_app"], capture_output=True, text=True,
                           cwd=ROOT, check=False).stdout.strip()
    results["code"] = commit + (" (+ uncommitted product changes)" if dirty else "")
    pg = redis_server = None
    with work_directory(None, "cdc-bench-fanout-", args.keep) as work:
        try:
            console.print(f"work directory {work}; {results['uptime_start']}")
            tables = generate(work / "tpch", args.scale)
            console.print("starting a throwaway PostgreSQL and redis-server ...")
            pg = start_cluster()
            redis_server = ThrowawayRedis().start()
            url = redis_server.url

            if not args.skip_once:
                console.rule("(a) the big log")
                db = new_database(pg)
                rows = load_rows(db, tables)
                log = work / "big" / "log"
                config = run_config(work / "big", db, log, url, views=True)
                started = time.perf_counter()
                cdc_ok("bootstrap", "--config", str(config))
                bootstrap_s = time.perf_counter() - started
                capture = Capture(config, work / "capture.log").start()
                try:
                    keys = sorted({int(row[0]) for row in tables["lineitem"]})
                    updated = 0
                    started = time.perf_counter()
                    with db.connect() as conn:
                        chunk: list[int] = []
                        per_order = len(tables["lineitem"]) / len(keys)
                        step = max(1, int(args.txn / per_order))
                        for at in range(0, len(keys), step):
                            chunk = keys[at:at + step]
                            cursor = conn.execute(
                                "UPDATE lineitem SET l_comment = left(l_comment, 40) || 'upd' "
                                "WHERE l_orderkey >= %s AND l_orderkey <= %s",
                                (chunk[0], chunk[-1]))
                            updated += cursor.rowcount
                    wait_caught_up(db, log, timeout=600)
                    capture_s = time.perf_counter() - started
                finally:
                    capture.terminate(60)
                records = log_records(log)
                results["big_log"] = {"rows": rows, "updated": updated, "records": records,
                                      "bootstrap_s": round(bootstrap_s, 1),
                                      "capture_s": round(capture_s, 1)}
                console.print(f"big log: {rows:,} rows bootstrapped in {bootstrap_s:.1f} s, "
                              f"{updated:,} lineitem updates captured in {capture_s:.1f} s; "
                              f"{records:,} log records")
                runs = []
                for index, entry in enumerate(args.counts.split(",")):
                    if entry.isdigit():
                        count = int(entry)
                        names = (["cache1"] if count == 1 else list(FOLLOWERS)[:count]
                                 if count <= 4 else [*FOLLOWERS, *views[:count - 4]])
                    else:  # names joined by "+" (e.g. cache1+cache2)
                        names = entry.split("+")
                        count = len(names)
                    run_dir = work / "big" / f"run{index}-{count}"
                    cfg = run_config(run_dir, db, log, url, views=count > 4)
                    flush_redis(url)
                    console.print(f"cdc apply --once, {count} followers/views "
                                  f"(load {os.getloadavg()[0]:.2f}) ...")
                    figures = once_run(work, cfg, names, f"once{index}-{count}", args.timeout)
                    runs.append(figures)
                    shown = ("apply_s", "read_cpu_s", "read_records", "read_cpu_us_per_record",
                             "error", "failed_views")
                    console.print(f"  {json.dumps({k: figures.get(k) for k in shown})}")
                results["once"] = runs

            if not args.skip_startup:
                console.rule("(b), (c) the small log")
                db_small = new_database(pg)
                few = load_rows(db_small, small(tables))
                log = work / "small" / "log"
                config = run_config(work / "small" / "boot", db_small, log, url, views=True)
                cdc_ok("bootstrap", "--config", str(config))
                results["small_log"] = {"rows": few, "records": log_records(log)}
                startup = []
                for label, chosen in (("startup-22-views", views), ("startup-0-views", [])):
                    cfg = run_config(work / "small" / label, db_small, log, url,
                                     views=bool(chosen))
                    flush_redis(url)
                    console.print(f"cdc apply (continuous), 4 followers + {len(chosen)} views "
                                  f"(load {os.getloadavg()[0]:.2f}) ...")
                    figures = startup_run(work, cfg, list(FOLLOWERS), chosen, label, 300,
                                          args.settle)
                    startup.append(figures)
                    shown = ("all_first_batches_s", "followers_first_s", "views_first_s",
                             "steady", "missing", "error")
                    console.print(f"  {json.dumps({k: figures.get(k) for k in shown})}")
                results["startup"] = startup
                cfg = run_config(work / "small" / "phases", db_small, log, url, views=True)
                flush_redis(url)
                console.print("the same 4 + 22 in-process (run_apply in a fresh child), its "
                              f"steps timed (load {os.getloadavg()[0]:.2f}) ...")
                results["startup_phases"] = phases_run(work, cfg, [*FOLLOWERS, *views])
                phases = results["startup_phases"]
                shown_phases = {k: v for k, v in phases.items() if k != "prepare_profile"}
                console.print(f"  {json.dumps(shown_phases)}")
                console.print("\n".join(phases.get("prepare_profile", [])), markup=False)
        finally:
            if redis_server is not None:
                redis_server.stop()
            if pg is not None:
                pg.cleanup()
    results["uptime_end"] = uptime()
    summarize(results, console, figures_table, goal)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print_json(results)


def summarize(results: dict[str, Any], console: Any, figures_table: Any, goal: Any) -> None:
    """The tables and the goals (into ``results["goals"]``)."""
    goals: dict[str, Any] = {}
    once = results.get("once") or []
    if once:
        table = figures_table(
            "(a) cdc apply --once of the big log, local[2]", "followers + views", "records read",
            "read + decode CPU s: loop + followers' processes", "µs/record", "× 1 follower",
            "run_apply s", "from start s",
            "CPU s (apply + children)", "peak RSS MB (apply / + children)", "note")
        base = once[0].get("read_cpu_us_per_record")
        for run in once:
            per = run.get("read_cpu_us_per_record")
            views = run["count"] - 4 if run["count"] > 4 else 0
            failed = run.get("failed_views") or {}
            note = run.get("error") or ""
            if failed:
                note = f"views failed: {', '.join(failed)}; " + note
            note += f" load {run['load_1m_before']}→{run['load_1m_after']}"
            table.add_row(
                f"{run['count'] - views} + {views}", f"{run.get('read_records', 0):,}",
                f"{run.get('read_cpu_s', 0):.2f} + {run.get('followers_read_cpu_s', 0):.2f}",
                f"{per:.2f}" if per else "-",
                f"{per / base:.2f}" if per and base else "-", f"{run.get('apply_s', 0):.1f}",
                f"{run.get('from_start_s', 0):.1f}",
                f"{run.get('parent_cpu_s', 0):.1f} + {run.get('children_cpu_s', 0):.1f}",
                f"{run.get('peak_parent_mb', 0):,.0f} / {run.get('peak_total_mb', 0):,.0f}", note)
        console.print(table)
        by_count: dict[int, list[dict[str, Any]]] = {}
        for run in once:
            if run.get("read_cpu_us_per_record") and not run.get("error"):
                by_count.setdefault(run["count"], []).append(run)

        def median(values: list[float]) -> float:
            values = sorted(values)
            middle = len(values) // 2
            return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2
        per = {count: median([r["read_cpu_us_per_record"] for r in runs])
               for count, runs in sorted(by_count.items())}
        results["read_cpu_us_per_record_median"] = per
        if 1 in per:
            worst = max(per.values()) / per[1]
            goals["read_cpu_per_record_max_vs_1"] = {
                "value": round(worst, 2), "goal": "~1 (must not grow; <= 1.1 allowed as noise)",
                "met": worst <= 1.1}
        if 4 in by_count and 26 in by_count:
            for what in ("peak_parent_mb", "peak_total_mb"):
                extra = (by_count[26][0][what] - by_count[4][0][what]) / 22
                goals[f"once_{what}_per_view"] = {"value": round(extra, 1), "goal": "<= 50",
                                                   "met": extra <= 50}
    startup = results.get("startup") or []
    if startup:
        table = figures_table(
            "(b), (c) cdc apply (continuous) of the small log, local[2]", "run",
            "followers' first batch s", "views' first batch s", "all s",
            "steady RSS MB apply", "apply + children", "peak apply / + children", "note")
        for run in startup:
            steady = run["steady"]
            note = run.get("error") or ""
            if run.get("missing"):
                note += f" missing: {', '.join(run['missing'])}"
            note += f" load {run['load_1m_before']}→{run['load_1m_after']}"
            table.add_row(run["label"], str(run.get("followers_first_s")),
                          str(run.get("views_first_s")), str(run.get("all_first_batches_s")),
                          str(steady.get("parent_mb")), str(steady.get("total_mb")),
                          f"{run['peak_parent_mb']:,.0f} / {run['peak_total_mb']:,.0f}", note)
        console.print(table)
        with_views = next((r for r in startup if r["views"]), None)
        without = next((r for r in startup if not r["views"]), None)
        if with_views is not None:
            goals["startup_all_first_batches_s"] = goal(with_views["all_first_batches_s"], 20,
                                                        below=True)
        if with_views is not None and without is not None:
            for what in ("parent_mb", "total_mb"):
                a, b = with_views["steady"].get(what), without["steady"].get(what)
                if a is not None and b is not None:
                    extra = round((a - b) / with_views["views"], 1)
                    goals[f"steady_{what}_per_view"] = {"value": extra, "goal": "<= 50",
                                                        "met": extra <= 50}
    results["goals"] = goals
    for name, figure in goals.items():
        mark = {True: "[green]met[/]", False: "[red]missed[/]", None: "-"}[figure["met"]]
        console.print(f"{name}: {figure['value']} (goal {figure['goal']}): {mark}")


if __name__ == "__main__":
    main()
