"""What a MySQL/MariaDB server must be set to for capture: one list, enforced by the connector
at start (``catalog.server_info``) and checked against ``docker/compose.yaml`` by the tests, so
the two cannot disagree. Light: imports nothing."""

#: binlog settings CDC needs: (variable, required value, why, fix)
REQUIRED = (
    ("log_bin", "ON", "the binary log is off, so there is nothing to stream",
     "start the server with log_bin (e.g. log_bin=mysql-bin in my.cnf) and restart it"),
    ("binlog_format", "ROW", "row changes are not logged as rows",
     "SET GLOBAL binlog_format = 'ROW' (and binlog_format=ROW in my.cnf); sessions already "
     "open keep their format until they reconnect"),
    ("binlog_row_image", "FULL", "row images are not whole, so a follower rebuilt from the "
     "log would lose columns",
     "SET GLOBAL binlog_row_image = 'FULL' (and in my.cnf)"),
    ("binlog_row_metadata", "FULL", "table-map events carry no column names, so changes "
     "cannot be matched to columns",
     "SET GLOBAL binlog_row_metadata = 'FULL' (and in my.cnf); needs MariaDB 10.5+ or "
     "MySQL 8.0.14+"),
)

#: global privileges the capture user needs (on ``*.*``), each with the grants that give it:
#: REPLICATION SLAVE (the binlog dump) and REPLICATION CLIENT (binlog positions; MariaDB 10.5+
#: calls it BINLOG MONITOR); SELECT on the captured tables comes on top (snapshots)
PRIVILEGES = (
    ("REPLICATION SLAVE", ("REPLICATION SLAVE",)),
    ("REPLICATION CLIENT", ("REPLICATION CLIENT", "BINLOG MONITOR", "SUPER")),
)
