"""MySQL/MariaDB capture (row binlog with GTID). Not implemented yet."""
