"""Followers: one module per kind (Redis, Delta, search, SQL), each a :class:`cdc.sink.Sink`
behind the one version-gated contract of ``cdc/sink.py``, with its settings model beside it
(``<kind>_settings.py``, registered in ``cdc.followers``: :mod:`cdc.plugins`).
:func:`cdc.sink.open_sink` builds the sink of a configured follower.
"""
