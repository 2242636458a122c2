"""The package's values: limits, policies, decisions and errors. No I/O."""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple, Union

#: The module's rate-limit algorithms (docs/commands.md), in its own order.
ALGORITHMS = (
    "token-bucket",
    "leaky-bucket",
    "fixed-window",
    "sliding-window",
    "sliding-log",
    "gcra",
)
#: The algorithms that take `BURST`.
BURST_ALGORITHMS = ("token-bucket", "leaky-bucket", "gcra")

MAX_AMOUNT = 10**12
MAX_PERIOD_MS = 3650 * 86_400_000
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PERIOD = re.compile(r"^([0-9]+)(ms|s|m|h|d)?$", re.IGNORECASE)
_POLICY_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")

Period = Union[str, int, datetime.timedelta]


def period_ms(value: Period, what: str = "period") -> int:
    """A duration as the module takes it (`"1m"`, `"250ms"`, an int of ms, or a `timedelta` of
    whole ms) in ms; `ValueError` outside 1 ms to 3650 days."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be a str like '1m', an int of ms or a timedelta, not a bool")
    if isinstance(value, datetime.timedelta):
        ms, rest = divmod(value // datetime.timedelta(microseconds=1), 1000)
        if rest:
            raise ValueError(f"{what} must be whole milliseconds, not {value}")
    elif isinstance(value, int):
        ms = value
    elif isinstance(value, str):
        match = _PERIOD.match(value.strip())
        if not match:
            raise ValueError(
                f"{what} must be an integer of ms or with a unit ms, s, m, h or d "
                f"(250ms, 1s, 15m, 1h, 1d), not {value!r}"
            )
        ms = int(match.group(1)) * _UNITS_MS[(match.group(2) or "ms").lower()]
    else:
        raise TypeError(f"{what} must be a str like '1m', an int of ms or a timedelta, not {type(value).__name__}")
    if not 1 <= ms <= MAX_PERIOD_MS:
        raise ValueError(f"{what} must be from 1 ms to 3650 days, not {value!r}")
    return ms


def _amount(value: object, what: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not low <= value <= MAX_AMOUNT:
        raise ValueError(f"{what} must be an integer from {low} to {MAX_AMOUNT}, not {value}")
    return value


def check_cost(cost: object, low: int = 0) -> int:
    """A request's weight: an int from `low` (0, 1 for a lease) to 10^12."""
    return _amount(cost, "cost", low)


@dataclass(frozen=True)
class Limit:
    """A limit given inline: `Limit("sliding-window", 100, "1m")`, `Limit("token-bucket", 10, "1s",
    burst=20, block="15m")`.

    algorithm: one of the module's six (`ALGORITHMS`, case-insensitive); limit: requests per
    period, 1 to 10^12; period: `"1m"`, `"250ms"`, an int of ms or a `timedelta` (1 ms to 3650
    days); burst: a bucket's or gcra's capacity (default: limit), only for those three; block: a
    penalty block for whoever exceeds the limit (the period's syntax); batch: decide from units
    taken ahead with `RATELIMIT.TAKE` and held for this long (the period's syntax, e.g. "50ms";
    see the README's "Batches"), at most `batch_max` units at once (default: limit). Checked
    here, when it is made: a bad limit is a `ValueError` (or `TypeError`) before any call.
    """

    algorithm: str
    limit: int
    period: Period
    burst: Optional[int] = None
    block: Optional[Period] = None
    batch: Optional[Period] = None
    batch_max: Optional[int] = None
    if TYPE_CHECKING:  # set by __post_init__, not fields at run time (see there)
        _period_ms: int = field(init=False, repr=False, compare=False)
        _words: Tuple[str, ...] = field(init=False, repr=False, compare=False)
        _spec: Tuple[str] = field(init=False, repr=False, compare=False)
        _packed: Dict[Tuple[str, int], Tuple[bytes, bytes]] = field(init=False, repr=False, compare=False)
        _packed_one: Dict[Tuple[str, int], Tuple[bytes, bytes]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.algorithm, str) or self.algorithm.lower() not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}: expected one of {', '.join(ALGORITHMS)}")
        object.__setattr__(self, "algorithm", self.algorithm.lower())
        _amount(self.limit, "limit")
        period_ms(self.period)
        if self.burst is not None:
            if self.algorithm not in BURST_ALGORITHMS:
                raise ValueError(f"burst applies only to {', '.join(BURST_ALGORITHMS)}, not {self.algorithm}")
            _amount(self.burst, "burst")
        if self.block is not None:
            period_ms(self.block, "block")
        if self.batch is not None:
            period_ms(self.batch, "batch")
        if self.batch_max is not None:
            if self.batch is None:
                raise ValueError(f"batch_max={self.batch_max!r} needs batch (a hold time such as '50ms')")
            _amount(self.batch_max, "batch_max")
        # Computed once: every call of this limit sends these words (not dataclass fields: equality,
        # hashing and repr stay the fields').
        object.__setattr__(self, "_period_ms", period_ms(self.period))
        object.__setattr__(self, "_words", tuple(self.args()))
        #: The same words as one argument (`"token-bucket 10 1s BURST 20"`), for a module that
        #: takes a spec so (`_wire.spec_args`).
        object.__setattr__(self, "_spec", one_argument(self._words))
        #: The direct path's commands but for their key, RESP-encoded, by (verb, cost) (`_wire.pack`):
        #: the spec as words, and as one argument.
        object.__setattr__(self, "_packed", {})
        object.__setattr__(self, "_packed_one", {})

    @property
    def period_ms(self) -> int:
        """The period in ms."""
        return self._period_ms

    @property
    def block_ms(self) -> Optional[int]:
        """The penalty block in ms, None without one."""
        return None if self.block is None else period_ms(self.block, "block")

    @property
    def batch_ms(self) -> Optional[int]:
        """How long units taken for a batch are held (ms), None without batches."""
        return None if self.batch is None else period_ms(self.batch, "batch")

    @property
    def batch_limit(self) -> int:
        """The most units one batch holds: `batch_max`, by default the limit."""
        return self.batch_max if self.batch_max is not None else self.limit

    @property
    def capacity(self) -> int:
        """The most `remaining` can be: the burst for the buckets and gcra, else the limit."""
        return self.burst if self.burst is not None else self.limit

    def args(self) -> List[str]:
        """The module's words for this limit: `algorithm limit period [BURST b] [BLOCK d]`."""
        words = [self.algorithm, str(self.limit), _period_word(self.period)]
        if self.burst is not None:
            words += ["BURST", str(self.burst)]
        if self.block is not None:
            words += ["BLOCK", _period_word(self.block)]
        return words


def one_argument(words: Sequence[str]) -> Tuple[str]:
    """A limit spec's words as one argument, joined by single spaces (`"token-bucket 10 1s BURST
    20"`), as a module whose `RATELIMIT.CHECK` has arity -3 takes it: the one place they are
    joined. No word holds a space (a period is digits and a unit, a policy name has none)."""
    return (" ".join(words),)


def _period_word(value: Period) -> str:
    if isinstance(value, str):
        return value.strip()
    return f"{period_ms(value)}ms" if isinstance(value, datetime.timedelta) else str(value)


@dataclass(frozen=True)
class Policy:
    """A limit defined on the server by name (`RATELIMIT.POLICY SET`): `Policy("api")`.

    fallback: the inline `Limit` used where policies do not exist (the Functions library has
    none) and, with a warning logged once, when the server has no policy of that name. Without
    one, those cases raise `redis.ResponseError` ("no such policy").
    """

    name: str
    fallback: Optional[Limit] = None

    def __init__(self, name: str, *, fallback: Optional[Limit] = None) -> None:
        if not isinstance(name, str) or not _POLICY_NAME.match(name):
            raise ValueError(f"policy name must be 1 to 64 characters of A-Z, a-z, 0-9, '_', '-' and '.', not {name!r}")
        if fallback is not None and not isinstance(fallback, Limit):
            raise TypeError(f"fallback must be a Limit, not {type(fallback).__name__}")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "fallback", fallback)

    def args(self) -> List[str]:
        return ["POLICY", self.name]


LimitSpec = Union[Limit, Policy]


def check_spec(spec: object) -> LimitSpec:
    if not isinstance(spec, (Limit, Policy)):
        raise TypeError(f"a limit must be a Limit or a Policy, not {type(spec).__name__}")
    return spec


@dataclass(frozen=True)
class Decision:
    """What the server decided for one request.

    allowed: admitted (and its cost consumed); limit: the most `remaining` can be; remaining:
    how much cost could still pass now; retry_after_ms: 0 when allowed, else when the same
    request would pass (-1: never, its cost is above the limit); reset_after_ms: when the key is
    as good as new; delay_ms: the leaky bucket's wait before processing; source: "module",
    "library", "error" (Redis unreachable and `on_error="open"`: admitted, every number 0),
    "cache" (a refusal answered again by the denial cache), "local" (admitted from a batch's
    units) or "fallback" (decided in process, `on_error="local"`); shadow_rejected: a shadow
    policy admitted what enforcement would have rejected; period_ms: the limit's period (a
    lease's duration), 0 where unknown, for headers such as `RateLimit-Policy`'s `w`; granted:
    the units granted (`take`: the grant; other calls: the cost when allowed, else 0).
    """

    allowed: bool
    limit: int
    remaining: int
    retry_after_ms: int
    reset_after_ms: int
    delay_ms: int
    source: str
    shadow_rejected: bool = False
    period_ms: int = 0
    granted: int = 0


_new = object.__new__


def new_decision(
    allowed: bool,
    limit: int,
    remaining: int,
    retry_after_ms: int,
    reset_after_ms: int,
    delay_ms: int,
    source: str,
    shadow_rejected: bool,
    period_ms: int,
    granted: int,
) -> Decision:
    """`Decision(...)`, made without the frozen dataclass's field-by-field `__init__` (the hot
    path makes one per call): the same value, still frozen."""
    decision = _new(Decision)
    decision.__dict__.update(
        allowed=allowed,
        limit=limit,
        remaining=remaining,
        retry_after_ms=retry_after_ms,
        reset_after_ms=reset_after_ms,
        delay_ms=delay_ms,
        source=source,
        shadow_rejected=shadow_rejected,
        period_ms=period_ms,
        granted=granted,
    )
    return decision


@dataclass(frozen=True)
class MultiDecision:
    """What `check_all` decided: the overall fields (allowed only if every limit allows; the
    least remaining; the longest waits) and each limit's own `Decision`, in order.
    shadow_rejected: the call was admitted and a shadow policy among its limits admitted what
    its enforcement would have refused (a refused call admitted nothing, so it is never set)."""

    allowed: bool
    limit: int
    remaining: int
    retry_after_ms: int
    reset_after_ms: int
    delay_ms: int
    source: str
    shadow_rejected: bool
    limits: List[Decision]


class RateLimited(Exception):
    """A request was refused; `decision` says when to retry."""

    def __init__(self, decision: Union[Decision, MultiDecision]):
        super().__init__(f"rate limited: retry after {decision.retry_after_ms} ms")
        self.decision = decision


class RateLimitUnavailable(Exception):
    """Redis is down, refuses or does not answer in time, and the limiter fails closed (or the
    call has no decision to give: `reset`, `release`, `policies`). `__cause__` is the error."""
