"""The application on top of the core: the ``cdc`` command line (:mod:`cdc_app.cli`), the demos,
the ``cdc status`` screen, the Prometheus metrics server, the log viewer, the ``cdc snapshot``
request and progress, and the throwaway servers (:mod:`cdc_app.servers`: PostgreSQL, MariaDB,
Redis, Kafka, Spark) the demo and the tests start. Nothing in the core, the plugins or the Spark
jobs imports it (``docs/architecture.md``)."""
