"""How a batch's log ranges are known: planned by ``cdc apply`` from the log's committed state
and each follower's own progress record (``spark_apply/progress.py``) — the one module that
decides what a batch holds. No Spark checkpoint is read.

One *cycle* of the apply loop plans, for the followers that are ready (not busy with a batch,
not waiting out an outage), as few reads of the log as it can:

* **Groups.** Followers whose progress agrees on every topic both read (a partition missing
  from a record is at 0) form a group: one start offset for all, batches of the smallest
  ``max_records_per_batch`` among them (a follower busy or slow is not ready with the others,
  falls behind and reads with its own budget). A follower's topics are the
  topics of its sources (only the tables it follows, a view's base tables) plus its sources'
  transaction topics, so followers of one source agree only at the same transaction boundary.
* **The lead.** The group furthest into the log plans the cycle's end ``E`` from its start as
  the ``cdc`` Spark source does (:func:`spark_apply.source.next_end`: at most its
  ``max_records_per_batch``, never inside a transaction, the watermarks when it reaches the
  complete end).
* **Catching up in the same read.** A group behind the lead whose topics the lead reads, and
  whose distance to ``E`` fits its own budget, ends at ``E`` too: it is handed the records from
  its own start, read in the same pass. Next cycle the two starts agree and they are one group.
  A group further behind gets a read of its own (from its start, its own budget): a follower
  that was away or slow catches up without holding the others back.
* **Exactness.** Every share starts where its followers' records say they are and ends at a
  transaction boundary (``E`` restricted to a subset of a source's topics is a boundary of that
  subset); a record's offset is in a share iff ``start <= offset < end``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdc.log.base import ChangeLogReader, Committed
from cdc.reading import Range, plan_ranges
from cdc.transactions import is_transaction_topic
from spark_apply.source import SourceOptions, complete_end, next_end, transaction_cuts

Offsets = dict[str, dict[str, int]]


@dataclass(frozen=True)
class Member:
    """One follower (or view) as the planner sees it."""

    name: str
    #: its progress record's offsets (``{"topics": ..., "watermarks"?: ...}``)
    start: Mapping[str, Any]
    #: the sources it follows
    sources: frozenset[str]
    #: the topics it reads of them (None: every topic of its sources, created later ones too)
    only: frozenset[str] | None
    #: its ``max_records_per_batch``
    budget: int

    def topics(self, state: Committed) -> frozenset[str]:
        """The topics it reads in ``state``, its sources' transaction topics included."""
        return frozenset(name for name, info in state.topics.items()
                         if info.meta.get("source") in self.sources
                         and (self.only is None or name in self.only
                              or is_transaction_topic(info.meta)))


@dataclass
class Share:
    """What one group of followers applies in a cycle: the records ``start <= offset < end``
    of ``topics`` (its members' union)."""

    members: list[Member]
    topics: frozenset[str]
    start: Offsets
    end: dict[str, Any]
    ranges: list[Range] = field(default_factory=list)

    def holds(self, item: Range, offset: int) -> bool:
        """Whether the record at ``offset`` of ``item`` belongs to this share."""
        if item.topic not in self.topics:
            return False
        return offset >= int(self.start.get(item.topic, {}).get(str(item.partition), 0))

    def end_of(self, member: Member, state: Committed) -> dict[str, Any]:
        """``member``'s progress offsets after the share: its start moved to ``end`` on its
        topics; the end's watermarks of its sources (else the ones it had)."""
        mine = member.topics(state)
        topics: Offsets = {topic: dict(parts) for topic, parts in
                           member.start.get("topics", {}).items()}
        for topic, parts in self.end.get("topics", {}).items():
            if topic in mine:
                topics[topic] = dict(parts)
        out: dict[str, Any] = {"topics": dict(sorted(topics.items()))}
        marks = self.watermarks_of(member)
        if marks:
            out["watermarks"] = marks
        elif member.start.get("watermarks"):
            out["watermarks"] = member.start["watermarks"]
        return out

    def reaches_the_end(self) -> bool:
        """Whether the share ends at the complete end of its topics when planned (its end then
        carries the watermarks, :func:`spark_apply.source.next_end`); else the log holds more of
        them after it."""
        return "watermarks" in self.end

    def watermarks_of(self, member: Member) -> dict[str, Any]:
        """The end's watermarks of ``member``'s sources (none unless the end is complete)."""
        return {source: offset for source, offset in (self.end.get("watermarks") or {}).items()
                if source in member.sources}


@dataclass
class Read:
    """One pass over the log: ``ranges`` read once, handed to each of ``shares``."""

    ranges: list[Range]
    shares: list[Share]


def _offsets(start: Mapping[str, Any], topics: frozenset[str]) -> Offsets:
    return {topic: {str(p): int(n) for p, n in parts.items()}
            for topic, parts in start.get("topics", {}).items() if topic in topics}


def _agree(one: Offsets, other: Offsets, common: frozenset[str]) -> bool:
    for topic in common:
        a, b = one.get(topic, {}), other.get(topic, {})
        for partition in set(a) | set(b):
            if int(a.get(partition, 0)) != int(b.get(partition, 0)):
                return False
    return True


@dataclass
class _Group:
    members: list[Member]
    topics: frozenset[str]
    start: Offsets

    @property
    def budget(self) -> int:
        return min(member.budget for member in self.members)


def group(members: Sequence[Member], state: Committed) -> list[_Group]:
    """Members whose starts agree on their common topics, together (see the module docstring);
    the furthest group first."""
    groups: list[_Group] = []
    for member in members:
        topics = member.topics(state)
        start = _offsets(member.start, topics)
        for found in groups:
            if _agree(found.start, start, found.topics & topics):
                found.members.append(member)
                found.topics |= topics
                for topic, parts in start.items():
                    found.start.setdefault(topic, {}).update(parts)
                break
        else:
            groups.append(_Group([member], topics, start))
    groups.sort(key=lambda g: -sum(sum(parts.values()) for parts in g.start.values()))
    return groups


def _complete(state: Committed, members: Sequence[Member],
              target: Mapping[str, Any] | None) -> dict[str, Any]:
    """The complete end of every source the members follow (``target``: the one fixed when a
    ``--once`` run started)."""
    if target is not None:
        return dict(target)
    sources = tuple(sorted({source for member in members for source in member.sources}))
    return complete_end(state, SourceOptions(log="", sources=sources))


def _restricted(complete: Mapping[str, Any], topics: frozenset[str],
                sources: frozenset[str]) -> dict[str, Any]:
    return {"topics": {topic: parts for topic, parts in complete["topics"].items()
                       if topic in topics},
            "watermarks": {source: offset for source, offset in
                           (complete.get("watermarks") or {}).items() if source in sources}}


def _pending(start: Offsets, end: Mapping[str, Any], topics: frozenset[str]) -> int:
    return sum(max(0, int(stop) - int(start.get(topic, {}).get(partition, 0)))
               for topic, parts in end.get("topics", {}).items() if topic in topics
               for partition, stop in parts.items())


def _end(log: ChangeLogReader, state: Committed, start: Offsets,
         complete: Mapping[str, Any], budget: int) -> dict[str, Any]:
    begun = {"topics": start}
    boundaries = transaction_cuts(log, state, begun, complete)
    return next_end(begun, complete, budget, boundaries)


def _sources(members: Sequence[Member]) -> frozenset[str]:
    return frozenset(source for member in members for source in member.sources)


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def has_work(share: Share) -> bool:
    """Whether a share moves its members: records to read, or watermarks they lack."""
    if share.ranges:
        return True
    return any(share.watermarks_of(member)
               and canonical(share.watermarks_of(member))
               != canonical({s: o for s, o in (member.start.get("watermarks") or {}).items()
                             if s in member.sources})
               for member in share.members)


def plan_cycle(log: ChangeLogReader, state: Committed, members: Sequence[Member],
               target: Mapping[str, Any] | None = None) -> list[Read]:
    """The reads of one cycle for ``members`` (the ready followers): see the module docstring.
    Shares with nothing to do are left out; so is a read without shares."""
    if not members:
        return []
    complete = _complete(state, members, target)
    groups = group(members, state)
    lead, rest = groups[0], groups[1:]
    lead_complete = _restricted(complete, lead.topics, _sources(lead.members))
    lead_end = _end(log, state, lead.start, lead_complete, lead.budget)
    shares = [Share(lead.members, lead.topics, lead.start, lead_end)]
    reads: list[Read] = []
    for other in rest:
        behind = all(int(p) <= int(lead.start.get(t, {}).get(k, 0))
                     for t, parts in other.start.items() for k, p in parts.items())
        if (other.topics <= lead.topics and behind
                and _pending(other.start, lead_end, other.topics) <= other.budget):
            mine = {"topics": {t: parts for t, parts in lead_end["topics"].items()
                               if t in other.topics}}
            if "watermarks" in lead_end:
                mine["watermarks"] = lead_end["watermarks"]
            shares.append(Share(other.members, other.topics, other.start, mine))
            continue
        alone = _restricted(complete, other.topics, _sources(other.members))
        end = _end(log, state, other.start, alone, other.budget)
        reads.append(_read(state, [Share(other.members, other.topics, other.start, end)]))
    reads.insert(0, _read(state, shares))
    return [read for read in reads if read.shares]


def _read(state: Committed, shares: list[Share]) -> Read:
    """The ranges to read once for ``shares`` (from the earliest start of each partition)."""
    kept = []
    for share in shares:
        share.ranges = plan_ranges(state, {"topics": share.start}, share.end)
        if has_work(share):
            kept.append(share)
    spans: dict[tuple[str, int], Range] = {}
    for share in kept:
        for item in share.ranges:
            known = spans.get((item.topic, item.partition))
            if known is None or item.start < known.start:
                spans[(item.topic, item.partition)] = Range(
                    item.topic, item.partition, item.start,
                    max(item.end, known.end if known else item.end), item.source, item.table)
            elif item.end > known.end:
                spans[(item.topic, item.partition)] = Range(
                    item.topic, item.partition, known.start, item.end, item.source, item.table)
    return Read(list(spans.values()), kept)
