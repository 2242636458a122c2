"""The six algorithms in process, integer for integer as docs/algorithms.md defines them (the
module's cores are core/src/algorithms/*.rs): what `on_error="local"` decides with while Redis
cannot answer. No I/O, no floating point: Python ints hold every scaled product exactly.

A `LocalLimiter` keeps a state per key, as the module keeps one per Redis key: the same calls
at the same times (`now_ms`, the module's `AT`) give the same six fields, BLOCK, REFUND and TAKE
included (tests/test_local.py runs random sequences of each against the module).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple, TypeVar

from ._types import Limit

#: A reply field above a signed 64-bit integer is answered as its largest value.
_I64_MAX = 2**63 - 1
_U64_MAX = 2**64 - 1

#: (allowed, limit, remaining, retry_after_ms, reset_after_ms, delay_ms)
Fields = Tuple[bool, int, int, int, int, int]
#: (L, P, C): limit, period in ms, capacity
Params = Tuple[int, int, int]
_R = TypeVar("_R")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _u64(value: int) -> int:
    return min(value, _U64_MAX)


def _reply(fields: Fields) -> Fields:
    allowed, limit, remaining, retry, reset, delay = fields
    return (
        allowed,
        min(limit, _I64_MAX),
        min(remaining, _I64_MAX),
        min(retry, _I64_MAX),
        min(reset, _I64_MAX),
        min(delay, _I64_MAX),
    )


def params_of(limit: Limit) -> Params:
    return (limit.limit, limit.period_ms, limit.capacity)


def block_of(limit: Limit) -> Optional[int]:
    return limit.block_ms


class _TokenBucket:
    @staticmethod
    def fresh(p: Params, t: int) -> int:
        return p[2] * p[1]

    @staticmethod
    def advance(tokens: int, p: Params, last: int, t: int) -> int:
        return min(p[2] * p[1], tokens + (t - last) * p[0])

    @staticmethod
    def refund(tokens: int, p: Params, cost: int) -> int:
        return min(tokens + cost * p[1], p[2] * p[1])

    @staticmethod
    def is_fresh(tokens: int, p: Params) -> bool:
        return tokens >= p[2] * p[1]

    @staticmethod
    def carry(tokens: int, old: Params, new: Params, t: int) -> int:
        rescaled = tokens if old[1] == new[1] else tokens * new[1] // old[1]
        return min(rescaled, new[2] * new[1])

    @staticmethod
    def decide(tokens: int, p: Params, cost: int, t: int) -> Tuple[Fields, int]:
        limit, period, capacity = p
        need = cost * period
        allowed = tokens >= need
        after = tokens - need if allowed else tokens
        retry = 0 if allowed else -1 if cost > capacity else _ceil(need - tokens, limit)
        reset = _u64(_ceil(max(0, capacity * period - after), limit))
        return (allowed, capacity, _u64(after // period), retry, reset, 0), after


class _LeakyBucket:
    @staticmethod
    def fresh(p: Params, t: int) -> int:
        return 0

    @staticmethod
    def advance(level: int, p: Params, last: int, t: int) -> int:
        return max(0, level - (t - last) * p[0])

    @staticmethod
    def refund(level: int, p: Params, cost: int) -> int:
        return max(0, level - cost * p[1])

    @staticmethod
    def is_fresh(level: int, p: Params) -> bool:
        return level == 0

    @staticmethod
    def carry(level: int, old: Params, new: Params, t: int) -> int:
        rescaled = level if old[1] == new[1] else _ceil(level * new[1], old[1])
        return min(rescaled, new[2] * new[1])

    @staticmethod
    def decide(level: int, p: Params, cost: int, t: int) -> Tuple[Fields, int]:
        limit, period, capacity = p
        work, full = cost * period, capacity * period
        allowed = level + work <= full
        if allowed:
            after, delay, retry = level + work, _u64(_ceil(level, limit)), 0
        elif cost > capacity:
            after, delay, retry = level, 0, -1
        else:
            after, delay, retry = level, 0, _ceil(level + work - full, limit)
        remaining = _u64(max(0, full - after) // period)
        return (allowed, capacity, remaining, retry, _u64(_ceil(after, limit)), delay), after


class _FixedWindow:
    """State: (window_start, count)."""

    @staticmethod
    def fresh(p: Params, t: int) -> Tuple[int, int]:
        return (t - t % p[1], 0)

    @staticmethod
    def advance(s: Tuple[int, int], p: Params, last: int, t: int) -> Tuple[int, int]:
        return s if t - t % p[1] == s[0] else _FixedWindow.fresh(p, t)

    @staticmethod
    def refund(s: Tuple[int, int], p: Params, cost: int) -> Tuple[int, int]:
        return (s[0], max(0, s[1] - cost))

    @staticmethod
    def is_fresh(s: Tuple[int, int], p: Params) -> bool:
        return s[1] == 0

    @staticmethod
    def carry(s: Tuple[int, int], old: Params, new: Params, t: int) -> Tuple[int, int]:
        return s if old[1] == new[1] else _FixedWindow.fresh(new, t)

    @staticmethod
    def decide(s: Tuple[int, int], p: Params, cost: int, t: int) -> Tuple[Fields, Tuple[int, int]]:
        limit, period, _ = p
        start, count = s
        allowed = count + cost <= limit
        after = (start, count + cost if allowed else count)
        retry = 0 if allowed else -1 if cost > limit else start + period - t
        reset = 0 if after[1] == 0 else max(0, start + period - t)
        return (allowed, limit, max(0, limit - after[1]), retry, reset, 0), after


class _SlidingWindow:
    """State: (window_start, current, previous)."""

    @staticmethod
    def fresh(p: Params, t: int) -> Tuple[int, int, int]:
        return (t - t % p[1], 0, 0)

    @staticmethod
    def advance(s: Tuple[int, int, int], p: Params, last: int, t: int) -> Tuple[int, int, int]:
        start = t - t % p[1]
        if start == s[0]:
            return s
        if start == s[0] + p[1]:
            return (start, 0, s[1])
        return (start, 0, 0)

    @staticmethod
    def refund(s: Tuple[int, int, int], p: Params, cost: int) -> Tuple[int, int, int]:
        return (s[0], max(0, s[1] - cost), s[2])

    @staticmethod
    def is_fresh(s: Tuple[int, int, int], p: Params) -> bool:
        return s[1] == 0 and s[2] == 0

    @staticmethod
    def carry(s: Tuple[int, int, int], old: Params, new: Params, t: int) -> Tuple[int, int, int]:
        return s if old[1] == new[1] else _SlidingWindow.fresh(new, t)

    @staticmethod
    def _reset(p: Params, s: Tuple[int, int, int], t: int) -> int:
        start, current, previous = s
        if current > 0:
            return max(0, start + 2 * p[1] - t)
        if previous > 0:
            return max(0, start + p[1] - t)
        return 0

    @staticmethod
    def _retry(s: Tuple[int, int, int], p: Params, cost: int, t: int) -> int:
        limit, period, _ = p
        start, current, previous = s
        left = period - (t - start)
        if previous > 0 and current + cost <= limit:
            room = (limit - current - cost) * period
            wait = max(1, max(0, left - room // previous))
            if wait < left:
                return wait
        if current == 0:
            return left
        into_next = max(0, period - (limit - cost) * period // current)
        return left + into_next if into_next < period else left + period

    @staticmethod
    def decide(s: Tuple[int, int, int], p: Params, cost: int, t: int) -> Tuple[Fields, Tuple[int, int, int]]:
        limit, period, _ = p
        start, current, previous = s
        ceiling = limit * period
        est = previous * (period - (t - start)) + current * period
        need = cost * period
        allowed = est + need <= ceiling
        after, est_after = ((start, current + cost, previous), est + need) if allowed else (s, est)
        retry = 0 if allowed else -1 if cost > limit else _SlidingWindow._retry(s, p, cost, t)
        remaining = max(0, ceiling - est_after) // period
        return (allowed, limit, remaining, retry, _SlidingWindow._reset(p, after, t), 0), after


class _Gcra:
    @staticmethod
    def fresh(p: Params, t: int) -> int:
        return 0

    @staticmethod
    def advance(ahead: int, p: Params, last: int, t: int) -> int:
        return max(0, ahead - (t - last) * p[0])

    @staticmethod
    def refund(ahead: int, p: Params, cost: int) -> int:
        return max(0, ahead - cost * p[1])

    @staticmethod
    def is_fresh(ahead: int, p: Params) -> bool:
        return ahead == 0

    @staticmethod
    def carry(ahead: int, old: Params, new: Params, t: int) -> int:
        return ahead if old[0] == new[0] else _ceil(ahead * new[0], old[0])

    @staticmethod
    def decide(ahead: int, p: Params, cost: int, t: int) -> Tuple[Fields, int]:
        limit, period, capacity = p
        tolerance = capacity * period
        nxt = ahead + cost * period
        allowed = nxt <= tolerance
        after = nxt if allowed else ahead
        retry = 0 if allowed else -1 if cost > capacity else _ceil(nxt - tolerance, limit)
        remaining = _u64(max(0, tolerance - after) // period)
        return (allowed, capacity, remaining, retry, _u64(_ceil(after, limit)), 0), after


class _Algorithm(Protocol):
    """What `check` and `refund` ask of an algorithm of fixed state (its state: an int or a
    tuple of them, by algorithm)."""

    def fresh(self, p: Params, t: int) -> Any: ...
    def advance(self, state: Any, p: Params, last: int, t: int) -> Any: ...
    def refund(self, state: Any, p: Params, cost: int) -> Any: ...
    def is_fresh(self, state: Any, p: Params) -> bool: ...
    def carry(self, state: Any, old: Params, new: Params, t: int) -> Any: ...
    def decide(self, state: Any, p: Params, cost: int, t: int) -> Tuple[Fields, Any]: ...


_FIXED: Dict[str, _Algorithm] = {
    "token-bucket": _TokenBucket,
    "leaky-bucket": _LeakyBucket,
    "fixed-window": _FixedWindow,
    "sliding-window": _SlidingWindow,
    "gcra": _Gcra,
}


class Stored:
    """One key's limiter: its algorithm, the parameters of its last consuming call, that call's
    time (`last`), the state then, and the end of a penalty block (0: none). A sliding log's
    state is its runs `[[timestamp, count], ...]`, oldest first."""

    __slots__ = ("algorithm", "blocked_until", "last", "params", "state")

    def __init__(self, algorithm: str, params: Params, last: int, state: Any, blocked_until: int = 0):
        self.algorithm = algorithm
        self.params = params
        self.last = last
        self.state = state
        self.blocked_until = blocked_until

    def copy(self) -> "Stored":
        state = [list(run) for run in self.state] if self.algorithm == "sliding-log" else self.state
        return Stored(self.algorithm, self.params, self.last, state, self.blocked_until)

    def expires_at(self) -> int:
        """When the module's key would expire: the state is fresh then, and any block over."""
        p, t = self.params, self.last
        algorithm = self.algorithm
        if algorithm == "sliding-log":
            reset = (self.state[-1][0] + p[1] - t) if self.state else 0
        elif algorithm == "fixed-window":
            reset = 0 if self.state[1] == 0 else self.state[0] + p[1] - t
        elif algorithm == "sliding-window":
            reset = _SlidingWindow._reset(p, self.state, t)
        elif algorithm == "token-bucket":
            reset = _ceil(max(0, p[2] * p[1] - self.state), p[0])
        else:
            reset = _ceil(self.state, p[0])
        return max(t + max(0, reset), self.blocked_until)


class AlgorithmMismatch(Exception):
    """The key holds another algorithm than the call names (the module answers an error)."""


# -- the sliding log -------------------------------------------------------------------------


def _slid_out(stored: Stored, p: Params, t: int) -> Optional[int]:
    """How many runs at the log's front no longer count at `t` (under the stored period and the
    call's), or None when the whole stored log has left its own window (a fresh key)."""
    if stored.last + stored.params[1] <= t:
        return None
    cutoff = max(t - stored.params[1], t - p[1])
    gone = 0
    for ts, _ in stored.state:
        if ts > cutoff:
            break
        gone += 1
    return gone


def _log_check(
    stored: Optional[Stored], p: Params, cost: int, now: int, commit: bool
) -> Tuple[Fields, int, Optional[Stored]]:
    limit, period, _ = p
    t = max(now, stored.last) if stored is not None else now
    gone = _slid_out(stored, p, t) if stored is not None else None
    runs: List[List[int]] = stored.state[gone:] if (stored is not None and gone is not None) else []
    count = sum(n for _, n in runs)
    allowed = count + cost <= limit
    after = count + cost if allowed else count
    if allowed and cost > 0:
        newest: Optional[int] = t
    elif count > 0:
        newest = runs[-1][0]
    else:
        newest = None
    if allowed:
        retry = 0
    elif cost > limit:
        retry = -1
    else:
        k, seen, retry = count + cost - limit, 0, 0
        for ts, n in runs:
            seen += n
            if seen >= k:
                retry = ts + period - t
                break
    reset = 0 if newest is None else newest + period - t
    fields = (allowed, limit, max(0, limit - after), retry, reset, 0)
    if not (commit and allowed and cost > 0):
        return fields, t, None
    new_runs = [list(run) for run in runs]
    if new_runs and new_runs[-1][0] == t:
        new_runs[-1][1] += cost
    else:
        new_runs.append([t, cost])
    return fields, t, Stored("sliding-log", p, t, new_runs)


def _log_refund(stored: Stored, cost: int, t: int) -> str:
    gone = _slid_out(stored, stored.params, t)
    if gone is None:
        return "nothing"
    runs = stored.state[gone:]
    live = sum(n for _, n in runs)
    take = min(cost, live)
    if take == 0:
        return "nothing"
    blocked = t < stored.blocked_until
    if take == live and not blocked:
        return "emptied"
    runs = [list(run) for run in runs]
    left = take
    while runs and left:
        if runs[-1][1] > left:
            runs[-1][1] -= left
            left = 0
        else:
            left -= runs[-1][1]
            runs.pop()
    stored.state = runs
    stored.last = t
    return "updated"


# -- one call --------------------------------------------------------------------------------


def check(
    stored: Optional[Stored], algorithm: str, p: Params, cost: int, now: int, commit: bool
) -> Tuple[Fields, int, Optional[Stored]]:
    """The decision at `t = max(now, last)` and, when it consumed and `commit`, the limiter to
    store (None: nothing written)."""
    if stored is not None and stored.algorithm != algorithm:
        raise AlgorithmMismatch(stored.algorithm)
    if algorithm == "sliding-log":
        return _log_check(stored, p, cost, now, commit)
    a = _FIXED[algorithm]
    if stored is not None:
        t = max(now, stored.last)
        state = a.advance(stored.state, stored.params, stored.last, t)
        carried = a.carry(state, stored.params, p, t) if not a.is_fresh(state, stored.params) else a.fresh(p, t)
    else:
        t = now
        carried = a.fresh(p, t)
    fields, after = a.decide(carried, p, cost, t)
    if commit and fields[0] and cost > 0:
        return fields, t, Stored(algorithm, p, t, after)
    return fields, t, None


def _blocked_answer(own: Fields, until: int, t: int) -> Fields:
    left = max(0, until - t)
    retry = -1 if own[3] < 0 else max(own[3], left)
    return (False, own[1], 0, retry, max(own[4], left), 0)


def check_blocking(
    stored: Optional[Stored], algorithm: str, p: Params, cost: int, now: int, commit: bool, block_ms: Optional[int]
) -> Tuple[Fields, Optional[Stored]]:
    """`check` with the key's block and the call's BLOCK; the limiter to store (`stored` itself
    when a block started on it), None when nothing is written."""
    if stored is not None:
        if stored.algorithm != algorithm:
            raise AlgorithmMismatch(stored.algorithm)
        t = max(now, stored.last)
        if t < stored.blocked_until:
            own, _, _ = check(stored, algorithm, p, cost, now, False)
            return _blocked_answer(own, stored.blocked_until, t), None
    fields, t, written = check(stored, algorithm, p, cost, now, commit)
    starts = commit and cost > 0 and not fields[0] and fields[3] >= 0
    if block_ms is not None and stored is not None and starts:
        stored.blocked_until = t + block_ms
        return _blocked_answer(fields, stored.blocked_until, t), stored
    return fields, written


def refund(
    stored: Optional[Stored], algorithm: str, p: Params, cost: int, now: int
) -> Tuple[Fields, Optional[Stored], bool]:
    """(the PEEK of COST 0 right after, the limiter to keep, whether the key is deleted)."""
    if stored is None:
        fields, _ = check_blocking(None, algorithm, p, 0, now, False, None)
        return fields, None, False
    if stored.algorithm != algorithm:
        raise AlgorithmMismatch(stored.algorithm)
    t = max(now, stored.last)
    if algorithm == "sliding-log":
        outcome = _log_refund(stored, cost, t)
    else:
        a = _FIXED[algorithm]
        sp = stored.params
        state = a.advance(stored.state, sp, stored.last, t)
        outcome = "nothing"
        if not a.is_fresh(state, sp):
            given = a.refund(state, sp, cost)
            if given != state:
                if a.is_fresh(given, sp) and not t < stored.blocked_until:
                    outcome = "emptied"
                else:
                    stored.last, stored.state, outcome = t, given, "updated"
    after = None if outcome == "emptied" else stored
    fields, _ = check_blocking(after, algorithm, p, 0, t, False, None)
    return fields, after, outcome == "emptied"


def take(
    stored: Optional[Stored], algorithm: str, p: Params, most: int, now: int, block_ms: Optional[int]
) -> Tuple[int, Fields, Optional[Stored]]:
    """RATELIMIT.TAKE: (the grant g, the fields of CHECK COST max(g, 1), the limiter to store),
    but a leaky bucket's `delay_ms` for g > 1 is the wait of the last granted unit."""

    def admits(cost: int) -> bool:
        copy = stored.copy() if stored is not None else None
        return check_blocking(copy, algorithm, p, cost, now, False, block_ms)[0][0]

    granted = most if admits(most) else 0
    if not granted:
        low, high = 0, most
        while high - low > 1:
            middle = low + (high - low) // 2
            if admits(middle):
                low = middle
            else:
                high = middle
        granted = low
    last_unit_delay = None
    if algorithm == "leaky-bucket" and granted > 1:
        # The wait of the last granted unit (what the module replies): the queue ahead of it once
        # the first granted - 1 are queued, the reset of a PEEK of cost granted - 1 now.
        copy = stored.copy() if stored is not None else None
        last_unit_delay = check_blocking(copy, algorithm, p, granted - 1, now, False, block_ms)[0][4]
    fields, written = check_blocking(stored, algorithm, p, max(granted, 1), now, True, block_ms)
    if last_unit_delay is not None:
        fields = (*fields[:5], last_unit_delay)
    return granted, fields, written


class LocalLimiter:
    """Keys' states in process, at most `max_keys` of them (the least recently used go first,
    after those whose state is as good as fresh at the newest time seen). Thread-safe.

    Every method takes the call time `now_ms` (ms since the Unix epoch, the module's `AT`) and
    answers the six fields of the module's reply (`take`: the grant first, as TAKE's reply).
    """

    def __init__(self, max_keys: int = 10_000):
        if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
            raise ValueError(f"max_keys must be an int >= 1, not {max_keys!r}")
        self.max_keys = max_keys
        self._keys: "OrderedDict[str, Stored]" = OrderedDict()
        self._newest = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._keys)

    def _run(self, key: str, now_ms: int, call: Callable[[Optional[Stored]], Tuple[_R, Optional[Stored], bool]]) -> _R:
        with self._lock:
            self._newest = max(self._newest, now_ms)
            stored = self._keys.get(key)
            result, written, deleted = call(stored)
            if deleted:
                self._keys.pop(key, None)
            elif written is not None:
                self._keys[key] = written
                self._keys.move_to_end(key)
                self._bound()
            return result

    def _bound(self) -> None:
        if len(self._keys) <= self.max_keys:
            return
        for key in [k for k, s in self._keys.items() if s.expires_at() <= self._newest]:
            del self._keys[key]
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)

    def check(self, key: str, limit: Limit, cost: int, now_ms: int, commit: bool = True) -> Fields:
        p, block = params_of(limit), block_of(limit)

        def call(stored: Optional[Stored]) -> Tuple[Fields, Optional[Stored], bool]:
            fields, written = check_blocking(stored, limit.algorithm, p, cost, now_ms, commit, block)
            return _reply(fields), written, False

        return self._run(key, now_ms, call)

    def peek(self, key: str, limit: Limit, cost: int, now_ms: int) -> Fields:
        return self.check(key, limit, cost, now_ms, commit=False)

    def refund(self, key: str, limit: Limit, cost: int, now_ms: int) -> Fields:
        def call(stored: Optional[Stored]) -> Tuple[Fields, Optional[Stored], bool]:
            fields, after, deleted = refund(stored, limit.algorithm, params_of(limit), cost, now_ms)
            return _reply(fields), after, deleted

        return self._run(key, now_ms, call)

    def take(self, key: str, limit: Limit, most: int, now_ms: int) -> Tuple[int, Fields]:
        def call(stored: Optional[Stored]) -> Tuple[Tuple[int, Fields], Optional[Stored], bool]:
            granted, fields, written = take(stored, limit.algorithm, params_of(limit), most, now_ms, block_of(limit))
            return (granted, _reply(fields)), written, False

        return self._run(key, now_ms, call)

    def reset(self, *keys: str) -> int:
        with self._lock:
            return sum(self._keys.pop(key, None) is not None for key in keys)


__all__ = ["AlgorithmMismatch", "LocalLimiter"]
