"""The change log: storage of change records. Nothing outside this package knows file formats.

``base`` states the contracts, ``local`` is the embedded on-disk backend, ``compaction`` keeps the
latest record per key, ``schemas`` is the schema store kept beside the log, ``partitioner`` is
Kafka's murmur2 partitioner.
"""

from cdc.log.base import (
    AppendResult,
    ChangeLogReader,
    ChangeLogWriter,
    CompactionReport,
    Record,
    StoredRecord,
    TopicInfo,
)

__all__ = ["AppendResult", "ChangeLogReader", "ChangeLogWriter", "CompactionReport", "Record",
           "StoredRecord", "TopicInfo"]
