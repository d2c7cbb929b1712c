"""Every difference the differential fuzzer found, shrunk, kept as a case: the view must equal
the leader after each batch (or be refused at check time). New cases are printed by ``make
fuzz-views`` ready to paste here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.fuzz_views.grammar import Query
from tests.fuzz_views.harness import Case, replay


def test_postgres_integer_division_truncates(tmp_path: Path, pg_cluster: Any) -> None:
    """Seed 103: PostgreSQL's ``-1 / 2`` is 0; DuckDB's ``/`` gave -0.5."""
    replay(Case('postgres',
                ['CREATE TABLE f1 (id int PRIMARY KEY, a1 int NOT NULL, b1 numeric(8,2) NOT NULL)'],
                ['INSERT INTO f1 VALUES (8, -1, 0.00)', 'INSERT INTO f1 VALUES (9, 7, 1.00)'],
                [['UPDATE f1 SET a1 = -7 WHERE id = 9']],
                [Query('q1', "SELECT t.id, t.a1 / 2 AS v0, t.b1 / 3 AS v1, CASE WHEN t.a1 > 1 "
                       "THEN 'big' ELSE 'small' END AS v2 FROM f1 t WHERE t.b1 BETWEEN -1 AND 2",
                       ('id',), False)]),
           pg_cluster, tmp_path)


def test_postgres_coalesce_of_character_n_keeps_its_blanks(tmp_path: Path, pg_cluster: Any
                                                           ) -> None:
    """Seed 105: ``coalesce(c, '-')`` of a ``char(5)`` is a ``character`` value on the leader,
    blanks kept (``'ab   '``); the view gave ``'ab'``."""
    replay(Case('postgres',
                ['CREATE TABLE f0 (id int PRIMARY KEY, a0 int, b0 char(5))',
                 'CREATE TABLE f2 (id int PRIMARY KEY, a2 int NOT NULL)'],
                ["INSERT INTO f0 VALUES (9, 1, 'ab'), (12, 1, NULL), (13, 2, 'a ')",
                 'INSERT INTO f2 VALUES (24, 1), (14, 2), (15, 3)'],
                [["UPDATE f0 SET b0 = 'xyz' WHERE id = 12"]],
                [Query('q2', "SELECT l.id AS lid, r.id AS rid, coalesce(r.b0, '-') AS v1, "
                       "CASE WHEN r.a0 > 1 THEN r.b0 ELSE 'no' END AS v2 FROM f2 l "
                       "LEFT JOIN f0 r ON l.a2 = r.a0", ('lid', 'rid'), False)]),
           pg_cluster, tmp_path)


def test_a_null_group_is_a_group(tmp_path: Path, pg_cluster: Any) -> None:
    """Seed 1: ``GROUP BY`` a nullable column has a NULL group on the leader; the view
    stopped ("produced a row whose key holds NULL")."""
    replay(Case('postgres',
                ['CREATE TABLE f0 (id int PRIMARY KEY, a0 int, b0 char(3))'],
                ["INSERT INTO f0 VALUES (1, NULL, 'ab'), (2, 0, 'a '), (3, NULL, 'B ')"],
                [['UPDATE f0 SET a0 = 5 WHERE id = 1'], ['UPDATE f0 SET a0 = NULL WHERE id = 2'],
                 ['DELETE FROM f0 WHERE id = 3']],
                [Query('q5', 'SELECT t.a0 AS g, min(t.b0) AS a0, count(*) AS n FROM f0 t '
                       'GROUP BY t.a0', ('g',), False)]),
           pg_cluster, tmp_path)


def test_mariadb_like_on_a_case_insensitive_column_is_refused(tmp_path: Path,
                                                              mariadb_server: Any) -> None:
    """Seed 100: ``WHERE b2 LIKE 'a%'`` on a ``utf8mb4_general_ci`` column keeps 'Ab' on the
    leader; the view kept only 'ab' (now refused at check time, like grouping on it)."""
    case = Case('mysql',
                ['CREATE TABLE f2 (id int PRIMARY KEY, a2 int NOT NULL, b2 varchar(6) '
                 'CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci)'],
                ["INSERT INTO f2 VALUES (2, 1, 'Ab'), (5, 2, 'ab'), (7, 3, 'b')"],
                [["UPDATE f2 SET b2 = 'A' WHERE id = 7"]],
                [Query('q2', "SELECT t.id, t.a2 * 2 AS v0 FROM f2 t WHERE t.b2 LIKE 'a%'",
                       ('id',), False)])
    report = replay(case, mariadb_server, tmp_path)
    assert "f2.b2 (utf8mb4_general_ci): equality" in report.refused["q2"]


def test_postgres_literal_compared_with_character_n_ignores_its_blanks(tmp_path: Path,
                                                                       pg_cluster: Any) -> None:
    """Seed 205: ``b0 IN ('', 'B ', 'a ')`` with ``b0 char(3)`` keeps 'B' on the leader (the
    literals are ``character`` there, their blanks do not count); the view kept nothing."""
    replay(Case('postgres',
                ['CREATE TABLE f0 (id int PRIMARY KEY, b0 char(3), c0 date, d0 int)'],
                ["INSERT INTO f0 VALUES (14, 'B ', DATE '2024-12-31', NULL)",
                 "INSERT INTO f0 VALUES (15, 'a', DATE '2024-12-31', 1)"],
                [["UPDATE f0 SET b0 = 'x' WHERE id = 15"]],
                [Query('q11', "SELECT t.id, t.b0 || '|' AS v1, extract(year from t.c0) AS v2 "
                       "FROM f0 t WHERE t.d0 < -1 OR t.b0 IN ('', 'B ', 'a ') "
                       "OR t.b0 = 'x  ' OR t.b0 BETWEEN 'w ' AND 'x '", ('id',), False)]),
           pg_cluster, tmp_path)


def test_postgres_upper_under_the_c_collation_is_refused(tmp_path: Path, pg_cluster: Any
                                                         ) -> None:
    """Seed 303: under PostgreSQL's ``C`` collation ``upper('é')`` is ``'é'`` (ASCII letters
    only); the view's state gave ``'É'``. Refused at check time, naming the column; the same
    SQL over a ``C.utf8`` column is kept, and equals the leader."""
    case = Case('postgres',
                ['CREATE TABLE f0 (id int PRIMARY KEY, b0 char(3) COLLATE "C", '
                 'b1 varchar(6) COLLATE "C.utf8")'],
                ["INSERT INTO f0 VALUES (5, 'é', 'é'), (6, 'ab', 'Ab')"],
                [["UPDATE f0 SET b1 = 'éa' WHERE id = 6"]],
                [Query('q4', "SELECT l.id, upper(l.b0) AS v0 FROM f0 l", ('id',), False),
                 Query('q5', "SELECT l.id, upper(l.b1) AS v0, lower(l.b1) AS v1 FROM f0 l",
                       ('id',), False)])
    report = replay(case, pg_cluster, tmp_path)
    assert 'f0.b0 (C): upper/lower' in report.refused["q4"]
    assert report.accepted == ["q5"] and report.comparisons == 2


def test_postgres_icu_collations_order_as_on_the_leader(tmp_path: Path, pg_cluster: Any
                                                        ) -> None:
    """Deterministic ICU collations order text by the locale's rules on the leader ('B' before
    'a' is false there; Swedish puts 'ö' after 'z'; 'de-DE' is German's order): MIN/MAX,
    ``>``, BETWEEN, ORDER BY ... LIMIT and a window's ORDER BY in the view order the same way
    (DuckDB's ICU). A collation with an option the state does not map (``kn``: digits as
    numbers) is refused at check time, naming the column."""
    case = Case('postgres',
                ["CREATE COLLATION num (provider = icu, locale = 'und-u-kn-true')",
                 'CREATE TABLE f0 (id int PRIMARY KEY, g int, r varchar(6) COLLATE "und-x-icu", '
                 's varchar(6) COLLATE "sv-x-icu", d varchar(6) COLLATE "de-DE-x-icu", '
                 'n varchar(6) COLLATE num)'],
                ["INSERT INTO f0 VALUES (1, 1, 'a', 'a', 'a', '10'), (2, 1, 'B', 'ö', 'ä', '9'), "
                 "(3, 2, 'ö', 'z', 'b', '2'), (4, 2, 'Z', 'Z', 'B', 'x'), (5, 2, 'é', 'y', 'A', "
                 "'a')"],
                [["UPDATE f0 SET r = 'b', s = 'o' WHERE id = 1"], ["DELETE FROM f0 WHERE id = 3"],
                 ["INSERT INTO f0 VALUES (6, 1, 'A', 'Ö', 'Ä', '1')"]],
                [Query('q1', "SELECT t.g, min(t.r) AS r0, max(t.r) AS r1, min(t.s) AS s0, "
                       "max(t.s) AS s1, max(t.d) AS d1 FROM f0 t GROUP BY t.g", ('g',), False),
                 Query('q2', "SELECT t.id, t.s FROM f0 t WHERE t.s > 'y' ORDER BY t.s DESC "
                       "LIMIT 2", ('id',), True),
                 Query('q3', "SELECT t.id, row_number() OVER (PARTITION BY t.g ORDER BY t.r, "
                       "t.id) AS k FROM f0 t WHERE t.d BETWEEN 'a' AND 'b'", ('id',), False),
                 Query('q4', "SELECT t.id, t.n FROM f0 t ORDER BY t.n LIMIT 2", ('id',), True),
                 # ORDER BY an output's name or position orders that column (was: by bytes)
                 Query('q5', "SELECT t.id, t.s AS v FROM f0 t ORDER BY v DESC, 1 LIMIT 3",
                       ('id',), True)])
    report = replay(case, pg_cluster, tmp_path)
    assert "f0.n (num): order" in report.refused["q4"]
    assert report.accepted == ["q1", "q2", "q3", "q5"] and report.comparisons == 16


def test_postgres_timestamptz_computes_in_utc(tmp_path: Path, pg_cluster: Any) -> None:
    """Seed 384: a ``timestamptz`` was held as its text, so a comparison with a ``timestamp``
    literal did not run on the state ("Cannot compare VARCHAR and TIMESTAMP": refused), and
    ``cdc verify`` read the leader's ``+00:00`` as another value than the log's ``Z``. The
    state holds it as a TIMESTAMPTZ computed in UTC, like verify's leader session."""
    report = replay(Case(
        'postgres',
        ['CREATE TABLE f2 (id int PRIMARY KEY, a2 int, b2 timestamptz(0), c2 timestamp(0))'],
        ["INSERT INTO f2 VALUES (1, 1, TIMESTAMP '2024-01-01 12:30:00', TIMESTAMP "
         "'2024-01-01 12:30:00'), (2, 1, NULL, NULL), (3, 2, TIMESTAMP '2023-06-15 08:00:00', "
         "TIMESTAMP '2023-06-15 08:00:00')"],
        [["UPDATE f2 SET b2 = TIMESTAMP '2024-02-29 23:59:59' WHERE id = 2"]],
        [Query('q1', "SELECT t.a2 AS g, max(t.b2) AS a, min(t.c2) AS b FROM f2 t GROUP BY t.a2",
               ('g',)),
         Query('q2', "SELECT t.id, t.b2 AS a, extract(hour from t.b2) AS h FROM f2 t WHERE "
               "t.b2 < TIMESTAMP '2024-01-01 12:30:00' OR t.c2 >= TIMESTAMP "
               "'2024-01-01 12:30:00'", ('id',))]),
        pg_cluster, tmp_path)
    assert report.accepted == ["q1", "q2"] and report.comparisons == 4


def test_mariadb_timestamp_is_a_point_in_time(tmp_path: Path, mariadb_server: Any) -> None:
    """Seed 118: capture logs a MariaDB TIMESTAMP as a point in time (``Z``); the leader's
    answer to the view's SQL read it as a wall-clock time, so every such row was missing and
    extra at once. The leader's TIMESTAMP results are read as UTC (the session's zone)."""
    replay(Case('mysql',
                ['CREATE TABLE f2 (id int PRIMARY KEY, a2 int NOT NULL, b2 timestamp NULL '
                 'DEFAULT NULL, c2 datetime)'],
                ["INSERT INTO f2 VALUES (3, -1, TIMESTAMP '2024-12-31 23:00:00', "
                 "TIMESTAMP '2024-12-31 23:00:00'), (4, 1, NULL, NULL)"],
                [["UPDATE f2 SET b2 = TIMESTAMP '2023-06-15 08:00:00' WHERE id = 4"]],
                [Query('q0', 'SELECT t.id, t.b2 AS v, t.c2 AS w FROM f2 t ORDER BY t.b2 DESC, '
                       't.id LIMIT 3', ('id',), True),
                 Query('q1', 'SELECT t.b2 AS g, count(*) AS n, max(t.c2) AS m FROM f2 t '
                       'GROUP BY t.b2', ('g',))]),
           mariadb_server, tmp_path)


def test_mariadb_date_arithmetic_keeps_mariadbs_types(tmp_path: Path, mariadb_server: Any
                                                      ) -> None:
    """Seed 21297: MariaDB's ``DATE_SUB(date, INTERVAL 90 DAY)`` is a DATE (DuckDB's a
    TIMESTAMP: ``2023-03-17T00:00:00``), and an interval added to a TIMESTAMP gives a DATETIME,
    a wall-clock time (the state's gave a point in time, ``Z``)."""
    report = replay(Case(
        'mysql',
        ['CREATE TABLE f2 (id int PRIMARY KEY, b2 timestamp NULL, d2 date NOT NULL)'],
        ["INSERT INTO f2 VALUES (2, TIMESTAMP '2024-03-31 00:30:00', DATE '2023-06-15'), "
         "(3, NULL, DATE '2024-02-29')"],
        [["UPDATE f2 SET b2 = b2 + INTERVAL 1 HOUR, d2 = d2 + INTERVAL 1 DAY"]],
        [Query('q0', "SELECT t.id, DATE_SUB(t.d2, INTERVAL 90 DAY) AS v, t.d2 + INTERVAL 1 "
               "MONTH AS m, t.d2 + INTERVAL 2 HOUR AS h, DATE_ADD(t.b2, INTERVAL 2 HOUR) AS "
               "p FROM f2 t", ('id',))]),
        mariadb_server, tmp_path)
    assert report.accepted == ["q0"] and report.comparisons == 2


#: around summer time's changes: Berlin's 2024-03-31 01:00 UTC, New York's 2024-11-03 06:00
_ZONED_ROWS = ["(1, '2024-03-31 00:30:00'), (2, '2024-03-31 23:30:00'), "
               "(3, '2024-11-03 05:30:00'), (4, NULL)"]
_ZONED_SQL = ("SELECT t.id, t.a0 AS v, extract(hour from t.a0) AS h, CAST(t.a0 AS DATE) AS d "
              "FROM f0 t WHERE t.a0 IS NULL OR t.a0 >= TIMESTAMP '2024-03-31 02:30:00'")


def test_postgres_timestamptz_in_the_views_time_zone(tmp_path: Path, pg_cluster: Any) -> None:
    """A view with ``time_zone: America/New_York`` (and Europe/Berlin) computes ``extract``,
    casts to ``date``, comparisons with a ``timestamp`` literal and ``date_trunc`` as a
    PostgreSQL session with that TimeZone does, and shows the values with its offsets; the
    hour that New York's fall-back repeats included. In UTC these rows differ."""
    for zone in ("America/New_York", "Europe/Berlin"):
        report = replay(Case(
            'postgres', ['CREATE TABLE f0 (id int PRIMARY KEY, a0 timestamptz)'],
            [f"SET LOCAL TimeZone = 'UTC'; INSERT INTO f0 VALUES {_ZONED_ROWS[0]}"],
            [["UPDATE f0 SET a0 = a0 + interval '1 hour'"]],
            [Query('q0', _ZONED_SQL, ('id',)),
             Query('q1', "SELECT date_trunc('day', t.a0) AS g, count(*) AS n FROM f0 t "
                   "GROUP BY date_trunc('day', t.a0)", ('g',))], time_zone=zone),
            pg_cluster, tmp_path / zone.replace("/", "-"))
        assert report.accepted == ["q0", "q1"] and report.comparisons == 4


def test_mariadb_timestamp_in_the_views_time_zone(tmp_path: Path, mariadb_server: Any) -> None:
    """The same on MariaDB (its time zone tables loaded): a TIMESTAMP shown in the session's
    zone names two instants in the hour New York's fall-back repeats; the leader's answer is
    read as the instant it is (``UNIX_TIMESTAMP``), so the row at 05:30 UTC is not confused
    with the one at 06:30 UTC."""
    for zone in ("America/New_York", "Europe/Berlin"):
        report = replay(Case(
            'mysql', ['CREATE TABLE f0 (id int PRIMARY KEY, a0 timestamp NULL)'],
            ["SET time_zone = '+00:00'", f"INSERT INTO f0 VALUES {_ZONED_ROWS[0]}"],
            [["UPDATE f0 SET a0 = a0 + INTERVAL 1 HOUR"]],
            [Query('q0', _ZONED_SQL, ('id',))], time_zone=zone),
            mariadb_server, tmp_path / zone.replace("/", "-"))
        assert report.accepted == ["q0"] and report.comparisons == 2


def test_postgres_difference_of_instants_is_the_elapsed_interval(tmp_path: Path,
                                                                 pg_cluster: Any) -> None:
    """Seed 45578: ``timestamptz - timestamp`` in Europe/Berlin is the elapsed time (across the
    spring DST change: 181 days 21:30, not DuckDB's wall-clock 22:30), shown as PostgreSQL's
    ``iso_8601`` interval; ``cdc verify`` reads the leader's interval as that text (it died
    on psycopg's loader before)."""
    report = replay(Case(
        'postgres', ['CREATE TABLE f1 (id int PRIMARY KEY, b1 timestamptz(0))'],
        ["INSERT INTO f1 VALUES (22, TIMESTAMP '2024-06-30 22:30:00'), "
         "(3, TIMESTAMP '2024-03-31 01:30:00'), (4, TIMESTAMP '2023-12-31 23:00:00'), "
         "(5, NULL)"],
        [["UPDATE f1 SET b1 = b1 - interval '200 days 3 hours'"]],
        [Query('q5', "SELECT t.id, t.b1 - TIMESTAMP '2024-01-01 00:00:00' AS v0 FROM f1 t",
               ('id',))], time_zone='Europe/Berlin'),
        pg_cluster, tmp_path)
    assert report.accepted == ["q5"] and report.comparisons == 2
