from cdc.log.local import LocalChangeLog
from cdc.log.partitioner import murmur2, partition_for
from tests.conftest import TOPIC, make_record

# Kafka's own vectors (org.apache.kafka.common.utils.UtilsTest#testMurmur2)
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_murmur2_matches_kafka_vectors() -> None:
    for data, expected in KAFKA_VECTORS.items():
        assert murmur2(data) == expected, data


def test_partition_is_the_positive_hash_modulo_count() -> None:
    # toPositive(-790332482) = 1357151166; 1357151166 % 50 = 16
    assert partition_for(b"foobar", 50) == 16
    assert partition_for(b"abc", 7) == 479470107 % 7
    for data, expected in KAFKA_VECTORS.items():
        assert partition_for(data, 12) == (expected & 0x7FFFFFFF) % 12


def test_log_places_each_key_in_its_kafka_partition(log_dir) -> None:
    with LocalChangeLog(log_dir, partitions=6) as log:
        log.ensure_topic(TOPIC)
        results = log.append([make_record(seq, seq % 40) for seq in range(200)])
        for seq, result in enumerate(results):
            assert result.partition == partition_for(f'{{"id":{seq % 40}}}'.encode(), 6)
        used = {result.partition for result in results}
        assert len(used) == 6, "40 keys should spread over all 6 partitions"
