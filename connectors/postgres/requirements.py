"""What a PostgreSQL server must be set to for capture: one list, enforced by the connector at
start (``catalog.check_server``) and checked against ``docker/compose.yaml`` by the tests, so the
two cannot disagree. Light: imports nothing."""

#: server settings CDC needs: (setting, required value, why, fix)
REQUIRED = (
    ("wal_level", "logical", "logical replication needs wal_level = logical",
     "set wal_level = logical in postgresql.conf (ALTER SYSTEM SET wal_level = logical) and "
     "restart PostgreSQL"),
)

#: the capture role's attribute: ``REPLICATION`` (or superuser), for the slot and the stream;
#: SELECT on the captured tables comes on top (snapshots), and creating the publication needs
#: ownership of the tables (or a superuser)
ROLE_ATTRIBUTE = "REPLICATION"
