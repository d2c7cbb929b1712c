"""PostgreSQL capture (pgoutput logical replication and snapshots). Not implemented yet: #3."""
