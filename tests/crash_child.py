"""Appends to a log forever, printing what it takes on and what was acknowledged; SIGKILLed by
test_crash.py.

It resumes from the sequence number stored in the log's source offsets, so a restart after a
kill continues exactly where the last *committed* append ended. Like capture's dispatcher, it
holds work beyond the committed offset: a generator thread builds the next batch while the
current one is appended (a queue of one), and prints ``TAKE <seq>`` once the records up to
``<seq>`` are in its memory, before they are handed to the log. So at any instant after the
first ``TAKE`` the child's own position (the highest ``TAKE``) is ahead of what the log
committed: a SIGKILL always lands on records in flight.
"""

import queue
import random
import sys
import threading

from cdc.log.base import Record
from cdc.log.local import LocalChangeLog
from tests.conftest import TOPIC, make_record

KEYS = 500
SIZES = (80, 700, 3000)
_PRINT = threading.Lock()  # the two threads' lines never interleave


def say(text: str) -> None:
    with _PRINT:
        sys.stdout.write(text)
        sys.stdout.flush()


def generate(seq: int, seed: int, out: "queue.Queue[tuple[int, list[Record]]]") -> None:
    rnd = random.Random(seed)
    while True:
        count = rnd.randint(1, 200)
        batch = [make_record(s, s % KEYS, tombstone=s % 13 == 0, size=rnd.choice(SIZES))
                 for s in range(seq + 1, seq + count + 1)]
        seq += count
        say(f"TAKE {seq}\n")
        out.put((seq, batch))


def main(path: str, seed: int) -> None:
    log = LocalChangeLog(path, partitions=4, segment_bytes=32 * 1024)
    log.ensure_topic(TOPIC)
    seq = log.source_offsets().get("gen", {}).get("seq", 0)
    print(f"READY {seq}", flush=True)
    batches: queue.Queue[tuple[int, list[Record]]] = queue.Queue(maxsize=1)
    threading.Thread(target=generate, args=(seq, seed, batches), daemon=True).start()
    while True:
        end, batch = batches.get()
        results = log.append(batch, {"gen": {"seq": end}})
        say("".join(f"ACK {s} {result.partition} {result.offset}\n" for s, result
                    in zip(range(end - len(batch) + 1, end + 1), results, strict=True)))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
