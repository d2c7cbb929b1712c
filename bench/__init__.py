"""Benchmarks (run as scripts, e.g. ``make bench``); see docs/benchmarks.md for results."""
