"""SIGTERM at any moment of ``cdc capture``'s life drains what it has and exits 0.

The daemon catches SIGTERM from the first line of the command line (``cdc_app/shutdown.py``), before
its slow imports, config and log opening; so the test waits until ``/proc/<pid>/status`` shows
SIGTERM caught and then signals it after 0 ms ... 1.5 s — start-up, connecting, streaming under
a write load. Every time: exit 0, the slot released (not ``active``) by the time the process is
gone, and the slot's confirmed LSN equal to the log's stored offset; afterwards the log equals
the audit trail of the load exactly."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pgkit import (
    PROJECT,
    Capture,
    Database,
    Load,
    cdc,
    check_against_audit,
    output,
    read_topic,
    stored_offset,
    wait_caught_up,
    write_config,
)

pytestmark = pytest.mark.timeout(300)

#: seconds between "SIGTERM is caught" and sending it
DELAYS = [0.0, 0.05, 0.15, 0.3, 0.6, 1.5]


def catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler installed for SIGTERM (``SigCgt``)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


def test_sigterm_at_any_moment_drains_and_exits_0(pg_db: Database, tmp_path: Path) -> None:
    pg_db.execute("CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, amount numeric(12,2), "
                  "note text, updated timestamptz NOT NULL DEFAULT now());"
                  "CREATE TABLE audit (seq bigserial PRIMARY KEY, id int NOT NULL, "
                  "v int NOT NULL, op text NOT NULL)")
    config = write_config(tmp_path, pg_db, ["public.items"])
    booted = cdc("bootstrap", "--config", str(config))
    assert booted.returncode == 0, output(booted)
    log, capture_log = tmp_path / "log", tmp_path / "capture.log"
    load = Load(pg_db, threads=1).start()
    try:
        for delay in DELAYS:
            written = capture_log.stat().st_size if capture_log.exists() else 0
            capture = Capture(config, capture_log).start()
            assert capture.process is not None
            deadline = time.monotonic() + 30
            while not catches_sigterm(capture.process.pid):  # (polled tightly: see delay 0)
                assert time.monotonic() < deadline, "capture never caught SIGTERM"
                time.sleep(0.001)
            if delay == 0:  # stopped where it was seen: the SIGTERM lands there, not later
                capture.process.send_signal(signal.SIGSTOP)
                capture.process.send_signal(signal.SIGTERM)
                capture.process.send_signal(signal.SIGCONT)
            time.sleep(delay)
            code = capture.terminate()
            said = capture_log.read_bytes()[written:].decode(errors="replace")
            assert code == 0, f"SIGTERM {delay} s after start-up: exit {code}\n{said[-3000:]}"
            if delay == 0:  # caught while still importing: it must not even start streaming
                assert "stopped before streaming started" in said, said[-3000:]
            slot, stored = pg_db.slot(), stored_offset(log, pg_db.source)
            assert slot is not None and stored is not None
            assert not slot["active"], f"slot still active after exit (SIGTERM at {delay} s)"
            assert slot["confirmed"] == stored["lsn"], f"SIGTERM at {delay} s\n{said[-3000:]}"
    finally:
        load.finish()
    capture = Capture(config, capture_log).start()
    wait_caught_up(pg_db, log)
    assert capture.terminate() == 0
    assert load.committed > 0
    check_against_audit(pg_db, read_topic(log, f"{pg_db.source}.public.items"))


def test_other_commands_still_die_of_sigterm() -> None:
    """Only the daemon keeps a SIGTERM that came early; any other command gets it delivered
    (default disposition: killed by the signal) once it knows it is not the daemon."""
    script = ("import os, signal, time\n"
              "from cdc_app import shutdown\n"
              "assert not shutdown.running_as_cdc()\n"  # python -c: importing it changes nothing
              "shutdown.catch_early()\n"
              "os.kill(os.getpid(), signal.SIGTERM)\n"
              "time.sleep(0.2)\n"  # recorded, not fatal
              "assert shutdown.requested()\n"
              "print('survived', flush=True)\n"
              "shutdown.release()\n"
              "time.sleep(5)\n"
              "print('not killed')\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=PROJECT, timeout=60)
    assert result.stdout == "survived\n" and result.returncode == -signal.SIGTERM, result
