"""``make fuzz-views SECONDS=600 SEED=7 DIALECT=both``: the differential fuzzer for as long as
asked, one fresh seed after another from ``SEED`` (a fresh one from the clock when unset); each
failing query is shrunk and printed as a ready pytest case for
``tests/fuzz_views/test_regressions.py``. Exit code 1 when any query differed from the leader."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from tests.fuzz_views.harness import as_pytest, generate, run_case, shrink


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz_views")
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--dialect", choices=("postgres", "mysql", "both"), default="both")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--queries", type=int, default=16)
    parser.add_argument("--refusals", action="store_true",
                        help="print why each refused query was refused")
    args = parser.parse_args()
    console = Console()
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    dialects = ["postgres", "mysql"] if args.dialect == "both" else [args.dialect]
    servers = {}
    failed = 0
    comparisons = 0
    deadline = time.monotonic() + args.seconds
    with tempfile.TemporaryDirectory(prefix="fuzz-views-") as scratch:
        try:
            for dialect in dialects:
                servers[dialect] = _server(dialect)
            while time.monotonic() < deadline:
                for dialect in dialects:
                    case = generate(seed, dialect, args.batches, args.queries)
                    with console.status(f"seed {seed} ({dialect})") as status:
                        report = run_case(case, servers[dialect],
                                          Path(scratch) / f"{dialect}{seed}",
                                          progress=lambda text: status.update(text))
                    report.seed = seed
                    comparisons += report.comparisons
                    console.print(report.summary())
                    if args.refusals:
                        for name, why in report.refused.items():
                            query = next(q for q in case.queries if q.name == name)
                            console.print(f"  refused {query.sql}\n    {why.splitlines()[0]}",
                                          soft_wrap=True, highlight=False, markup=False)
                    for query in {q.name: q for q, _, _ in report.mismatches}.values():
                        failed += 1
                        first = next(t for q, n, t in report.mismatches if q.name == query.name)
                        console.print(f"[red]{query.name} differs[/]: {query.sql}\n  {first}",
                                      soft_wrap=True)
                        small = shrink(case, query, servers[dialect],
                                       Path(scratch) / f"shrink{seed}{query.name}")
                        console.print(as_pytest(small, f"{dialect}_seed{seed}_{query.name}"),
                                      highlight=False, markup=False, soft_wrap=True)
                seed += 1
        finally:
            for server in servers.values():
                server.cleanup()
    console.print(f"{comparisons} comparisons, {failed} failing queries")
    return 1 if failed else 0


def _server(dialect: str):  # type: ignore[no-untyped-def]
    if dialect == "postgres":
        from tests.pgkit import start_cluster
        return start_cluster()
    from tests.mykit import start_server
    return start_server()


if __name__ == "__main__":
    sys.exit(main())
