"""PURE: the ready jobs in claim order, so "how many wait ahead of this one" is O(log n).

The ready heap (heaps.py) can only say which job is first. ``why`` on a ready job asks how
many ready jobs come before it: counting them walked every record (tens of ms with 100k
jobs). :class:`ReadyOrder` keeps the ready jobs' heap entries ``(-priority, ready_at, seq,
job_id)`` (the same tuples as the heaps: no memory of their own; ``seq`` is unique, so
``job_id`` never decides an order) sorted in chunks of at most ``2 * LOAD`` (the layout of
``sortedcontainers.SortedList``): adding or removing one is a bisect and a short list move, a
rank a bisect plus one length per chunk.

Kept by the queue's state at each change of a ready job (``JobHeaps.push_ready`` and
``reinsert``, ``QueueState._move`` and ``_forget``, ``undo.put_back``); by job id, so a job
pushed again (an edit, a retry) replaces its old entry. That costs about a microsecond per
enqueue and per claim, so a queue has no index until someone asks: the first ``why`` makes one
(``JobHeaps.order``), which records every change from then on, and :meth:`ReadyOrder.seed`
adds the jobs that were ready already (from the heaps' entries), in slices of the caller's;
until it is ``complete`` the caller counts instead.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable

from .records import READY, JobRecord

Key = tuple[int, float, int, str]  # (-priority, ready_at, seq, job_id): a ready heap entry
LOAD = 1000  # a chunk splits in two past twice this


class ReadyOrder:
    """The keys of the ready jobs, sorted, with each job's rank among them."""

    __slots__ = ("_chunks", "_maxes", "_keys", "complete")

    def __init__(self) -> None:
        self._chunks: list[list[Key]] = []
        self._maxes: list[Key] = []  # the last key of each chunk
        self._keys: dict[str, Key] = {}
        self.complete = False  # every ready job is in (seed ended); until then, count instead

    def seed(self, entries: Iterable[Key], jobs: dict[str, JobRecord]) -> None:
        """Add those of the heaps' ``entries`` (a snapshot taken after this index was made,
        walked in any number of calls) that are live: their job is the queue's (``jobs``),
        ready, pushed by that entry (its ``seq``), and not recorded yet. A job that changed
        since the index was made was recorded (or dropped) by that change, so its entry here
        is already right; a stale or twin entry is skipped. The tuples are the heaps' own."""
        keys = self._keys
        for entry in entries:
            job_id = entry[3]
            if job_id in keys:
                continue
            rec = jobs.get(job_id)
            if rec is not None and rec.state == READY and rec.seq == entry[2]:
                self.add(job_id, entry)

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, job_id: str, key: Key) -> None:
        """Record ``job_id`` as ready with ``key`` (replacing the key it had)."""
        keys = self._keys
        if job_id in keys:
            self.discard(job_id)
        keys[job_id] = key
        chunks, maxes = self._chunks, self._maxes
        if not maxes:
            chunks.append([key])
            maxes.append(key)
            return
        if key > maxes[-1]:  # past every key (a plain FIFO enqueue): the last chunk
            pos = len(chunks) - 1
            chunks[pos].append(key)
            maxes[pos] = key
        else:
            pos = bisect_left(maxes, key)
            insort(chunks[pos], key)
        chunk = chunks[pos]
        if len(chunk) > 2 * LOAD:
            chunks.insert(pos + 1, chunk[LOAD:])
            del chunk[LOAD:]
            maxes.insert(pos, chunk[-1])

    def discard(self, job_id: str) -> None:
        """Forget ``job_id`` (no longer ready); nothing if it was not recorded."""
        key = self._keys.pop(job_id, None)
        if key is None:
            return
        chunks, maxes = self._chunks, self._maxes
        pos = 0 if key <= maxes[0] else bisect_left(maxes, key)  # (a claim takes the first)
        chunk = chunks[pos]
        del chunk[0 if chunk[0] == key else bisect_left(chunk, key)]
        if not chunk:
            del chunks[pos], maxes[pos]
        elif maxes[pos] == key:
            maxes[pos] = chunk[-1]

    def key_of(self, job_id: str) -> Key | None:
        """The key recorded for ``job_id``, or None if it is not recorded as ready."""
        return self._keys.get(job_id)

    def ahead_of(self, job_id: str) -> int | None:
        """How many recorded jobs sort before ``job_id`` (None if it is not recorded)."""
        key = self._keys.get(job_id)
        if key is None:
            return None
        chunks = self._chunks
        pos = bisect_left(self._maxes, key)
        return sum(len(chunk) for chunk in chunks[:pos]) + bisect_left(chunks[pos], key)
