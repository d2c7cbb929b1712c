"""What the source database's own settings must not change, and a limit that is not a bug.

* A database whose defaults make every text output different (IntervalStyle, DateStyle,
  extra_float_digits, lc_monetary, TimeZone, bytea_output set with ALTER DATABASE) must be
  captured exactly as docs/types.md states: we pin our settings on every connection, including
  the replication connection, whose walsender produces pgoutput's text. Snapshot and stream
  rows are compared with the values ``tests/test_pg_types.py`` states.
* A timestamp past 294247-01-10 cannot be encoded (64-bit microseconds): capture and bootstrap
  say so, naming the table, the column, the value, the range and the fix — not "a bug".
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc_app.servers.postgres import ThrowawayPostgres
from tests.pgkit import (
    Capture,
    Database,
    cdc,
    new_database,
    output,
    read_topic,
    start_cluster,
    wait_caught_up,
    wait_for,
    write_config,
)
from tests.test_pg_types import COLUMNS, _by_key, _expected, _insert_rows

pytestmark = pytest.mark.timeout(300)

#: every setting whose default changes a text output we parse (IntervalStyle: not iso_8601,
#: the one we pin, so that the database's default differs from ours)
UNUSUAL_DEFAULTS = {
    "IntervalStyle": "sql_standard",
    "DateStyle": "German, DMY",
    "extra_float_digits": "0",
    "lc_monetary": "de_DE.UTF-8",
    "TimeZone": "Asia/Kolkata",
    "bytea_output": "escape",
}
#: the columns whose text output those settings change (and arrays of them)
AFFECTED = {"f4", "f8", "mon", "ba", "d", "tm", "ttz", "ts", "tstz", "iv", "tr"}


@pytest.fixture(scope="module")
def german_cluster() -> Iterator[ThrowawayPostgres]:
    """A cluster that knows the de_DE.UTF-8 locale (this machine ships only C ones): compiled
    with ``localedef`` into a private directory that the server finds through ``LOCPATH`` (not
    under pytest's tmp_path: the server may run as another user)."""
    if not Path("/usr/share/i18n/locales/de_DE").exists() or shutil.which("localedef") is None:
        pytest.skip("needs localedef and glibc's locale sources (de_DE)")
    locales = Path(tempfile.mkdtemp(prefix="cdc-locales-"))
    built = subprocess.run(["localedef", "-i", "de_DE", "-f", "UTF-8",
                            str(locales / "de_DE.UTF-8")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (locales / "C.utf8").symlink_to("/usr/lib/locale/C.utf8")  # the cluster's own locale
    locales.chmod(0o755)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOCPATH", str(locales))
        pg = start_cluster()
    yield pg
    pg.cleanup()
    shutil.rmtree(locales, ignore_errors=True)


class InputPinned(Database):
    """The test's own writes: input parsed with PostgreSQL's stock settings (``'1234.56'`` is
    not twelve thousand under de_DE's lc_monetary), whatever the database's defaults."""

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn(), autocommit=True,
                               options="-c lc_monetary=C -c DateStyle=ISO,MDY "
                                       "-c IntervalStyle=postgres -c TimeZone=UTC")


def test_database_defaults_do_not_change_what_is_captured(german_cluster: ThrowawayPostgres,
                                                          tmp_path: Path) -> None:
    pg_db = new_database(german_cluster)
    for name, value in UNUSUAL_DEFAULTS.items():
        pg_db.execute(f'ALTER DATABASE "{pg_db.name}" SET {name} = \'{value}\'')
    writer = InputPinned(pg_db.pg, pg_db.name, pg_db.source)
    with pg_db.connect() as conn:  # the defaults do apply to an ordinary session
        shown = {name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
                 for name in UNUSUAL_DEFAULTS}
        sample = conn.execute("SELECT '1 day 02:00'::interval::text, '2024-02-29'::date::text, "
                              "'1e308'::float8::text, '\\x00ff'::bytea::text, "
                              "(-1234.5)::numeric::money::text").fetchone()
    assert shown["DateStyle"] == "German, DMY" and shown["TimeZone"] == "Asia/Kolkata"
    assert sample == ("1 2:00:00", "29.02.2024", "1e+308", "\\000\\377", "-1.234,50 €"), sample
    columns = [c for c in COLUMNS if c.name in AFFECTED]
    definitions = [f"{c.name} {c.sql_type}" for c in columns]
    definitions += [f"a_{c.name} {c.sql_type}[]" for c in columns]
    pg_db.execute(f"CREATE TABLE types_all (id int PRIMARY KEY, {', '.join(definitions)})")
    _insert_rows(writer, columns, 1)
    log = tmp_path / "log"
    config = write_config(tmp_path, pg_db, ["public.types_all"])
    booted = cdc("bootstrap", "--config", str(config))
    assert booted.returncode == 0, output(booted)
    capture = Capture(config, tmp_path / "capture.log").start()
    try:
        _insert_rows(writer, columns, 101)
        wait_caught_up(pg_db, log, timeout=60)
    finally:
        capture_code = capture.terminate()
    assert capture_code == 0, (tmp_path / "capture.log").read_text()[-3000:]
    pg_db.drop()
    events = read_topic(log, f"{pg_db.source}.public.types_all")
    snapshot, streamed = _by_key(events, "r"), _by_key(events, "c")
    assert sorted(snapshot) == [1, 2, 3, 4, 5] and sorted(streamed) == [101, 102, 103, 104, 105]
    for row in range(5):
        expected = _expected(columns, row)
        for path, got in (("snapshot", snapshot[row + 1]), ("stream", streamed[row + 101])):
            got = dict(got)
            got.pop("id")
            wrong = {name: (got.get(name), value) for name, value in expected.items()
                     if got.get(name) != value}
            assert not wrong, f"{path} row {row}: (got, stated) {wrong}"


FAR = "294250-06-01 12:00:00"


def test_timestamp_past_the_encoding_limit_is_explained(pg_db: Database,
                                                        tmp_path: Path) -> None:
    pg_db.execute("CREATE TABLE far (id int PRIMARY KEY, at timestamp)")
    pg_db.execute(f"INSERT INTO far VALUES (1, '{FAR}')")
    config = write_config(tmp_path, pg_db, ["public.far"])

    def explained(text: str) -> None:
        assert "public.far.at" in text and "+294250-06-01T12:00:00" in text, text
        assert "+294247-01-10T04:00:54.775806" in text and "docs/types.md" in text, text
        assert "fix: correct the value" in text and "timestamptz" in text, text
        assert "bug" not in text and "Traceback" not in text, text

    refused = cdc("bootstrap", "--config", str(config))  # the snapshot path
    assert refused.returncode != 0
    explained(output(refused))

    pg_db.execute("UPDATE far SET at = '294247-01-10 04:00:54.775806'")  # the last that fits
    booted = cdc("bootstrap", "--config", str(config))
    assert booted.returncode == 0, output(booted)
    capture = Capture(config, tmp_path / "capture.log").start()
    pg_db.execute(f"INSERT INTO far VALUES (2, '{FAR}')")  # the streaming path
    assert capture.process is not None
    wait_for(lambda: not capture.alive(), 60, "capture to stop at the value")
    assert capture.process.returncode != 0
    explained((tmp_path / "capture.log").read_text())
    after = read_topic(tmp_path / "log", f"{pg_db.source}.public.far")
    assert [e.envelope["after"]["at"] for e in after if e.envelope] == [
        "+294247-01-10T04:00:54.775806"]
