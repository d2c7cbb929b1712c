"""Source connectors. Each knows one database's replication protocol and nothing downstream of
the log: it yields :class:`cdc.events.ChangeEvent` s with :class:`cdc.position.Position` s.

``postgres/`` (pgoutput logical replication, snapshot) arrives with issue #3, ``mysql/`` later.
"""
