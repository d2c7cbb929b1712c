"""cdc: change data capture from PostgreSQL and MySQL into a compacted change log."""

__version__ = "0.1.0"
