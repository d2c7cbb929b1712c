"""Appends to a log forever, printing what was acknowledged; SIGKILLed by test_crash.py.

It resumes from the sequence number stored in the log's source offsets, so a restart after a
kill continues exactly where the last *committed* append ended.
"""

import random
import sys

from cdc.log.local import LocalChangeLog
from tests.conftest import TOPIC, make_record

KEYS = 500
SIZES = (80, 700, 3000)


def main(path: str, seed: int) -> None:
    rnd = random.Random(seed)
    log = LocalChangeLog(path, partitions=4, segment_bytes=32 * 1024)
    log.ensure_topic(TOPIC)
    seq = log.source_offsets().get("gen", {}).get("seq", 0)
    print(f"READY {seq}", flush=True)
    while True:
        count = rnd.randint(1, 200)
        batch = [make_record(s, s % KEYS, tombstone=s % 13 == 0, size=rnd.choice(SIZES))
                 for s in range(seq + 1, seq + count + 1)]
        results = log.append(batch, {"gen": {"seq": seq + count}})
        for s, result in zip(range(seq + 1, seq + count + 1), results, strict=True):
            sys.stdout.write(f"ACK {s} {result.partition} {result.offset}\n")
        sys.stdout.flush()
        seq += count


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
