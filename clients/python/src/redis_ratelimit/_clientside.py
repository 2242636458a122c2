"""Decisions without a round trip where it is safe: the denial cache and the batches' state.
No I/O: the engine (`_engine.py`) asks them what it may answer locally and tells them what Redis
answered. Times are ms on the limiter's clock (monotonic, or the calls' `at`)."""

from __future__ import annotations

import heapq
import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Dict, List, Optional, Set, Tuple

from ._types import Decision, Limit, LimitSpec

#: (key, the limit's words or the policy's name): what a cached refusal or a batch belongs to.
Target = Tuple[str, Tuple[str, ...]]


def target(key: str, spec: LimitSpec) -> Target:
    if isinstance(spec, Limit):
        return key, ("limit", *spec.args())
    fallback = tuple(spec.fallback.args()) if spec.fallback else ()
    return key, ("policy", spec.name, *fallback)


class DenialCache:
    """At most `size` refusals, the least recently used dropped first, each answered again until
    its `retry_after_ms` has passed, for a cost at least the refused one (a cost that was refused
    is refused for any larger cost: admission is monotone in the cost) up to the limit. A refusal
    that can never pass (`retry_after_ms` -1, a cost above the limit) is not kept: it goes to
    Redis every time."""

    def __init__(self, size: int):
        self.size = size
        self._entries: "OrderedDict[Tuple[Target, int], Tuple[int, int, Decision]]" = OrderedDict()
        self._by_key: Dict[str, Set[Tuple[Target, int]]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, where: Target, cost: int, now_ms: int) -> Optional[Decision]:
        """The refusal to answer for a request of `cost` at `now_ms`, its waits counted down."""
        with self._lock:
            best = None
            for entry in list(self._by_key.get(where[0], ())):
                if entry[0] != where or entry[1] > cost:
                    continue
                until, at, decision = self._entries[entry]
                if cost > decision.limit:
                    return None  # never admitted (-1): Redis says so
                if now_ms >= until:
                    self._drop(entry)
                    continue
                if best is None or until > best[0]:
                    best = (until, at, decision, entry)
            if best is None:
                return None
            until, at, decision, entry = best
            self._entries.move_to_end(entry)
        elapsed = max(0, now_ms - at)
        return replace(
            decision,
            retry_after_ms=until - max(now_ms, at),
            reset_after_ms=max(0, decision.reset_after_ms - elapsed),
            delay_ms=0,
            source="cache",
            granted=0,
        )

    def put(self, where: Target, cost: int, decision: Decision, now_ms: int) -> None:
        """Keeps a refusal of `cost` (a TAKE's refusal is one of cost 1)."""
        if decision.allowed or decision.retry_after_ms <= 0:
            return
        entry = (where, cost)
        with self._lock:
            self._entries[entry] = (now_ms + decision.retry_after_ms, now_ms, decision)
            self._entries.move_to_end(entry)
            self._by_key.setdefault(where[0], set()).add(entry)
            while len(self._entries) > self.size:
                self._drop(next(iter(self._entries)))

    def drop_key(self, key: str) -> None:
        """Forgets every refusal of `key` (a reset or a refund through this limiter)."""
        with self._lock:
            for entry in list(self._by_key.get(key, ())):
                self._drop(entry)

    def _drop(self, entry: Tuple[Target, int]) -> None:
        self._entries.pop(entry, None)
        keyed = self._by_key.get(entry[0][0])
        if keyed is not None:
            keyed.discard(entry)
            if not keyed:
                del self._by_key[entry[0][0]]


class Flight:
    """A TAKE in flight for a batch: callers of the same process wait for it instead of sending
    their own. `finish` wakes them (threads through `event`, coroutines through their futures)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.futures: List[Any] = []

    def finish(self) -> None:
        self.event.set()
        for future in self.futures:
            if not future.done():
                future.get_loop().call_soon_threadsafe(_resolve, future)


def _resolve(future: Any) -> None:
    if not future.done():
        future.set_result(None)


class Batch:
    """The units one limiter holds for (key, limit): taken with TAKE, answered from locally,
    refunded when the hold ends.

    held: units taken and not yet admitted nor refunded; until: when the hold ends (ms);
    taken_at, reply: the last TAKE's time and answer (for the numbers of local decisions);
    used_*: units admitted in the current and the previous span of `hold_ms` (the recent rate
    that sizes the next TAKE)."""

    def __init__(self, key: str, limit: Limit):
        self.key = key
        self.limit = limit
        self.hold_ms: int = limit.batch_ms or 1
        self.most = limit.batch_limit
        self.held = 0
        self.until = 0
        self.taken_at = 0
        self.reply: Optional[Decision] = None
        self.flight: Optional[Flight] = None
        self.span_start = 0
        self.used_now = 0
        self.used_before = 0
        #: Its times are the calls' `at` (no timer refunds it: the next call does).
        self.virtual = False
        self.lock = threading.Lock()

    def _roll(self, now_ms: int) -> None:
        if now_ms >= self.span_start + 2 * self.hold_ms:
            self.span_start, self.used_now, self.used_before = now_ms, 0, 0
        elif now_ms >= self.span_start + self.hold_ms:
            self.span_start, self.used_before, self.used_now = self.span_start + self.hold_ms, self.used_now, 0

    def used(self, units: int, now_ms: int) -> None:
        self._roll(now_ms)
        self.used_now += units

    def size(self, now_ms: int) -> int:
        """How many units to take: seven eighths of what was admitted over the last hold time,
        from 1 to `most` (a batch that runs out before its hold ends costs the next TAKE only; one
        whose hold ends with units left costs a REFUND too)."""
        self._roll(now_ms)
        return max(1, min(self.most, max(self.used_now, self.used_before) * 7 // 8))

    def local(self, cost: int, now_ms: int) -> Decision:
        """Admits `cost` from the held units (the caller checked `cost <= held`)."""
        self.held -= cost
        self.used(cost, now_ms)
        return self.decision(cost, now_ms, "local")

    def decision(self, cost: int, now_ms: int, source: str) -> Decision:
        reply = self.reply
        assert reply is not None
        elapsed = max(0, now_ms - self.taken_at)
        return Decision(
            True,
            reply.limit,
            self.held,
            0,
            max(0, reply.reset_after_ms - elapsed),
            max(0, reply.delay_ms - elapsed),
            source,
            False,
            reply.period_ms,
            cost,
        )


class Batches:
    """Every batch of a limiter, and the order their holds end in (to refund them on time)."""

    def __init__(self) -> None:
        self._batches: Dict[Target, Batch] = {}
        self._ends: List[Tuple[int, int, Batch]] = []
        #: The ends of holds on the limiter's own clock (what timers wait for), earliest first.
        self._real_ends: List[int] = []
        self._lock = threading.Lock()
        self._seq = 0

    def get(self, key: str, limit: Limit) -> Batch:
        where = target(key, limit)
        with self._lock:
            batch = self._batches.get(where)
            if batch is None:
                batch = self._batches[where] = Batch(key, limit)
            return batch

    def holding(self, batch: Batch) -> None:
        """`batch` holds units until `batch.until`."""
        with self._lock:
            self._seq += 1
            heapq.heappush(self._ends, (batch.until, self._seq, batch))
            if not batch.virtual:
                heapq.heappush(self._real_ends, batch.until)

    def due(self, now_ms: Optional[int]) -> List[Tuple[Batch, int]]:
        """The batches whose hold has ended at `now_ms` (all of them if None) and the units each
        gives back, taken from them (the caller refunds them)."""
        found = []
        with self._lock:
            while self._real_ends and (now_ms is None or self._real_ends[0] <= now_ms):
                heapq.heappop(self._real_ends)
            while self._ends and (now_ms is None or self._ends[0][0] <= now_ms):
                _, _, batch = heapq.heappop(self._ends)
                with batch.lock:
                    if batch.held and (now_ms is None or batch.until <= now_ms):
                        found.append((batch, batch.held))
                        batch.held = 0
            if now_ms is None:
                for batch in self._batches.values():
                    with batch.lock:
                        if batch.held:
                            found.append((batch, batch.held))
                            batch.held = 0
            # Idle batches without units are forgotten (a new one starts from scratch).
            if len(self._batches) > 1024:
                for where in [w for w, b in self._batches.items() if not b.held and b.flight is None]:
                    del self._batches[where]
        return found

    def timed(self) -> bool:
        """Whether some hold ends on the limiter's own clock (a timer has work)."""
        return bool(self._real_ends)

    def pending(self) -> bool:
        """Whether some hold is under way (a call may have units to refund first)."""
        return bool(self._ends)

    def next_end(self) -> Optional[int]:
        """The earliest end of a hold on the limiter's own clock (not `at`'s), None if none (a
        hold extended since may end later: the timer then finds nothing to refund yet)."""
        ends = self._real_ends
        return ends[0] if ends else None

    def held(self) -> int:
        """Units held by every batch now."""
        with self._lock:
            return sum(batch.held for batch in self._batches.values())

    def drop_key(self, key: str) -> List[Tuple[Batch, int]]:
        """A reset of `key`: its batches' units are gone with it (nothing to refund)."""
        with self._lock:
            for where, batch in self._batches.items():
                if where[0] == key:
                    with batch.lock:
                        batch.held = 0
        return []
