"""Kafka's errors as the log's: which ones mean "the brokers went away for a while" (a capture
waits and retries: :class:`~cdc.errors.LogUnavailable`) and the fix to name for the others. The
one rule for every Kafka client of the log (appender, reader, schema topic)."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException

from cdc.errors import LogError, LogUnavailable

#: errors meaning "the brokers went away for a while": a capture waits and retries
TRANSIENT = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT,
              KafkaError._MSG_TIMED_OUT, KafkaError.REQUEST_TIMED_OUT,
              KafkaError.NOT_ENOUGH_REPLICAS, KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
              KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR,
              KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.LEADER_NOT_AVAILABLE,
              KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.CONCURRENT_TRANSACTIONS,
              KafkaError._RESOLVE, KafkaError.NETWORK_EXCEPTION, KafkaError._TIMED_OUT_QUEUE,
              KafkaError.BROKER_NOT_AVAILABLE, KafkaError._WAIT_COORD,
              KafkaError._DESTROY_BROKER}  # a broker's connection torn down mid-request


#: errors of a client that could not authenticate itself
AUTHENTICATION = {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED,
                   KafkaError._SSL}


def kafka_error(action: str, error: Any, where: str) -> LogError:
    """A :class:`LogError` naming the problem and the fix for a Kafka error
    (:class:`~cdc.errors.LogUnavailable` when the brokers went away for a while)."""
    err = error.args[0] if isinstance(error, KafkaException) and error.args else error
    code = err.code() if isinstance(err, KafkaError) else None
    text = err.str() if isinstance(err, KafkaError) else str(err)
    if code in TRANSIENT or (isinstance(err, KafkaError) and err.retriable()
                              and "AUTHORIZATION" not in str(err.name())):
        return LogUnavailable(f"Kafka log at {where}: {action} failed: {text}",
                              "check that the brokers are up and reachable "
                              "(log.bootstrap_servers)")
    fixes = {
        KafkaError._TRANSPORT: "check log.bootstrap_servers and that the brokers are up",
        KafkaError._ALL_BROKERS_DOWN: "check log.bootstrap_servers and that the brokers are up",
        KafkaError._TIMED_OUT: "check log.bootstrap_servers and that the brokers are up",
        KafkaError.TOPIC_AUTHORIZATION_FAILED:
            "grant this principal Describe/Read/Write on the cdc topics (or fix the ACLs)",
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            "grant this principal Write on the transactional id "
            "(log.transactional_id_prefix + source)",
        KafkaError.CLUSTER_AUTHORIZATION_FAILED:
            "grant this principal IdempotentWrite/Create on the cluster",
        KafkaError.GROUP_AUTHORIZATION_FAILED: "grant this principal Read on the group",
        KafkaError.SASL_AUTHENTICATION_FAILED:
            "check sasl.username in log.client and the password in log.password_env",
        KafkaError._AUTHENTICATION:
            "check sasl.mechanism and sasl.username in log.client and the password in "
            "log.password_env",
        KafkaError._SSL: "check the ssl.* settings in log.client (CA, certificate, key)",
        KafkaError.MSG_SIZE_TOO_LARGE:
            "raise the topic's max.message.bytes (and the broker's message.max.bytes) and "
            "log.client's message.max.bytes, or keep rows smaller",
        KafkaError._MSG_TIMED_OUT: "check that the brokers are up and reachable",
    }
    fix = fixes.get(code, "check the brokers' logs") if code is not None else \
        "check the brokers' logs"
    return LogError(f"Kafka log at {where}: {action} failed: {text}", fix)
