"""The SQL follower (``kind: sql``, ``sinks/sql.py``; issue 14, in progress): PostgreSQL
captured, ``cdc apply`` into SQLite and into a second PostgreSQL database, ``cdc verify``
passes for both, and the user's tables hold the live rows only (positions and delete markers
in the side table). The sink contract suite runs on both dialects too
(``tests/test_sink_contract.py``)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from tests.pgkit import (
    PROJECT,
    Capture,
    Database,
    Load,
    cdc,
    new_database,
    output,
    wait_caught_up,
    write_config,
)


def test_sql_followers_equal_the_leader_and_hold_live_rows_only(
        tmp_path: Path, pg_db: Database, pg_cluster: Any) -> None:
    pg_db.execute("""
        CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, amount numeric(12,2), note text,
                            updated timestamptz NOT NULL DEFAULT now());
        CREATE TABLE audit (seq bigserial PRIMARY KEY, id int NOT NULL, v int NOT NULL,
                            op text NOT NULL);
        INSERT INTO items (id, v, note) SELECT g, 1, 'snap' FROM generate_series(1, 300) g;
    """)
    target = new_database(pg_cluster)
    try:
        url = target.dsn().replace("postgresql://", "postgresql+psycopg://", 1)
        sqlite = tmp_path / "follower" / "db.sqlite"
        followers = (f"followers:\n  lite:\n    kind: sql\n    url: sqlite:///{sqlite}\n"
                     f"  report:\n    kind: sql\n    url: {url}\n")
        config = write_config(tmp_path, pg_db, ["public.items"], extra=followers)
        assert cdc("bootstrap", "--config", str(config)).returncode == 0
        capture = Capture(config, tmp_path / "capture.log").start()
        apply = subprocess.Popen(
            [sys.executable, "-m", "cdc.cli", "apply", "--config", str(config), "--follower",
             "lite", "--follower", "report"], cwd=PROJECT, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            pg_db.execute("DELETE FROM items WHERE id <= 20")
            pg_db.execute("UPDATE items SET id = 1000 WHERE id = 50")  # a key change
            load = Load(pg_db, threads=2).start()
            time.sleep(3)
            load.finish()
            wait_caught_up(pg_db, tmp_path / "log")
            for name in ("lite", "report"):  # verify waits for the follower to catch up
                verified = cdc("verify", "--config", str(config), "--follower", name,
                               "--timeout", "180s", timeout=300)
                assert verified.returncode == 0, output(verified)
                assert "follower equals the leader" in verified.stdout
        finally:
            apply.send_signal(signal.SIGTERM)
            assert apply.wait(120) == 0
            assert capture.terminate() == 0
        live = pg_db.execute("SELECT count(*) FROM items")[0][0]
        for engine_url in (f"sqlite:///{sqlite}", url):
            engine = sa.create_engine(engine_url)
            try:
                with engine.connect() as conn:
                    assert conn.execute(sa.text("SELECT count(*) FROM items")).scalar() == live
                    columns = [c["name"] for c in sa.inspect(conn).get_columns("items")]
                    assert columns[:4] == ["id", "v", "amount", "note"]
                    assert not [c for c in columns if c.startswith("_cdc")]
                    deleted = conn.execute(sa.text(
                        "SELECT count(*) FROM _cdc_rows WHERE deleted")).scalar()
                    assert deleted >= 21  # 20 deletes and the moved key's old one
            finally:
                engine.dispose()
    finally:
        target.drop()
