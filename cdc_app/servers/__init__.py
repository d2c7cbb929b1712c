"""Throwaway local database servers for the demo, the tests and the benchmarks.

They start on free loopback ports with the settings CDC needs, in their own data directories,
and never touch the machine's default instances.
"""
