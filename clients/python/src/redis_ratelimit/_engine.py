"""The sans-IO engine of both limiters: which commands a call sends, and what their replies mean.

It does no I/O. Each operation is a generator (a plan) that yields what to send (`Call`,
`Transaction`, `LoadLibrary`) and receives the reply (or the error, thrown in), then returns a
typed result; `RateLimiter` runs it with a redis-py client, `AsyncRateLimiter` with an asyncio
one (`_limiter.py`). Engine detection, the Functions library's loading, policies' fallbacks,
shadow detection, the breaker and `on_error` all live here, once; the commands' words and the
replies' reading in `_wire.py`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Callable, Dict, Generator, List, Optional, Sequence, Set, Tuple, Union, cast

import redis

from ._clientside import Batch, Batches, DenialCache, Flight, target
from ._local import AlgorithmMismatch, LocalLimiter
from ._types import (
    MAX_AMOUNT,
    Decision,
    Limit,
    LimitSpec,
    MultiDecision,
    Policy,
    RateLimitUnavailable,
    _amount,
    check_cost,
    check_spec,
    period_ms,
)
from ._wire import (
    COMMANDS,
    FUNCTIONS,
    LIBRARY_NAME,
    NO_SUCH_POLICY,
    ONE_ARG_ARITY,
    SPEC_PROBE,
    Definition,
    as_text,
    check_at,
    check_key,
    check_lease_id,
    command_arity,
    duration_word,
    library_code,
    library_functions,
    one_arg_refused,
    pack,
    pack_parts,
    parse_decision,
    parse_multi,
    reply_fields,
    spec_args,
    spec_period,
    unavailable,
    unknown_command,
)

log = logging.getLogger("redis_ratelimit")

ENGINES = ("auto", "module", "library")
#: The sources of decisions Redis made.
SERVERS = ("module", "library")
ON_ERROR = ("open", "closed", "local")


@dataclass(frozen=True)
class Call:
    """One command: `client.execute_command(*args)`.

    late: for a command whose reply must not be lost (a batch's TAKE grants units): if the
    runner stops waiting for the reply (the caller was cancelled, or its timeout fired) and the
    reply comes all the same, the runner gives it to `late(reply)` (an error reply is dropped).
    """

    args: Tuple[Any, ...]
    late: Optional[Callable[[Any], None]] = field(default=None, compare=False)


@dataclass(frozen=True)
class Transaction:
    """Commands in one MULTI/EXEC (one round trip); the reply is the list of their replies."""

    calls: Tuple[Tuple[Any, ...], ...]


@dataclass(frozen=True)
class ListLibrary:
    """`FUNCTION LIST LIBRARYNAME name WITHCODE` (a cluster client asks every primary)."""

    name: str


@dataclass(frozen=True)
class LoadLibrary:
    """`FUNCTION LOAD REPLACE code` (on every primary of a cluster)."""

    code: str


@dataclass(frozen=True)
class CommandInfo:
    """`COMMAND INFO name` on one server (any node of a cluster): its raw reply. Asked once per
    limiter, with the engine's detection; not counted in `stats["commands"]` (the calls' own)."""

    name: str


@dataclass(frozen=True)
class Join:
    """Waits for a batch's TAKE in flight (sent by another caller of this limiter); the reply
    is whether it ended in time."""

    flight: Flight


Op = Union[Call, Transaction, ListLibrary, LoadLibrary, CommandInfo, Join]
Plan = Generator[Op, Any, Any]


def error_decision(period: int = 0, granted: int = 0) -> Decision:
    """What `on_error="open"` answers: admitted (`granted` the cost asked), every number 0,
    `source="error"`."""
    return Decision(True, 0, 0, 0, 0, 0, "error", False, period, granted)


class Breaker:
    """Consecutive failures open it for `cooldown_s`: calls then apply `on_error` at once,
    without touching Redis; after the cool-down one call (the probe) goes through, the others
    still fail at once; the probe's success closes it, its failure opens it again.

    failures: how many consecutive failures open it (0: never); clock: seconds, monotonic.
    """

    def __init__(self, failures: int = 3, cooldown_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        if failures < 0 or cooldown_s < 0:
            raise ValueError("breaker failures and cool-down must not be negative")
        self.threshold = failures
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.failures = 0
        self.open_until = 0.0
        self.probing = False
        self._lock = threading.Lock()

    @property
    def is_open(self) -> bool:
        return 0 < self.threshold <= self.failures

    def allow(self) -> bool:
        """Whether a call may go to Redis now (True for the probe of a half-open breaker)."""
        if not self.failures:
            return True  # closed, no failure since the last success: nothing to lock for
        with self._lock:
            if not self.is_open:
                return True
            if self.probing or self.clock() < self.open_until:
                return False
            self.probing = True
            return True

    def success(self) -> None:
        if not self.failures and not self.probing:
            return
        with self._lock:
            if self.is_open:
                # At the failure's level: a team that sees the failure sees the recovery.
                log.warning("redis_ratelimit: Redis answers again: breaker closed")
            self.failures = 0
            self.probing = False

    def failure(self) -> None:
        with self._lock:
            self.failures += 1
            self.probing = False
            if self.is_open:
                self.open_until = self.clock() + self.cooldown_s
                if self.failures == self.threshold:
                    log.warning(
                        "redis_ratelimit: %d consecutive failures: breaker open, on_error applies "
                        "at once, one probe every %.3g s",
                        self.failures,
                        self.cooldown_s,
                    )

    def abandon(self) -> None:
        """A call ended without an outcome (cancelled): a probe may go again."""
        with self._lock:
            self.probing = False


class Core:
    """The state and the plans shared by `RateLimiter` and `AsyncRateLimiter`."""

    def __init__(
        self,
        *,
        engine: str = "auto",
        on_error: str = "open",
        prefix: str = "fn:",
        breaker_failures: int = 3,
        breaker_cooldown: float = 1.0,
        policy_refresh: float = 10.0,
        denial_cache: Optional[int] = None,
        local_share: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be 'open', 'closed' or 'local', not {on_error!r}")
        if not isinstance(prefix, str):
            raise TypeError("prefix must be a str")
        if denial_cache is not None and (isinstance(denial_cache, bool) or not isinstance(denial_cache, int)):
            raise TypeError(f"denial_cache must be an int (entries) or None, not {type(denial_cache).__name__}")
        if denial_cache is not None and denial_cache < 0:
            raise ValueError(f"denial_cache must be 0 (off) or more entries, not {denial_cache}")
        if isinstance(local_share, bool) or not isinstance(local_share, (int, float)):
            raise TypeError(f"local_share must be a number, not {type(local_share).__name__}")
        if not 0 < local_share <= 1:
            raise ValueError(f"local_share must be above 0 and at most 1, not {local_share!r}")
        self.mode = engine
        self.on_error = on_error
        self.prefix = prefix
        self.breaker = Breaker(breaker_failures, breaker_cooldown, clock)
        self.policy_refresh = policy_refresh
        self.clock = clock
        #: "module" or "library" once known.
        self.engine: Optional[str] = "module" if engine == "module" else None
        #: Whether the module takes a limit spec as one argument (`_spec_form`); None until asked.
        self.one_arg: Optional[bool] = None
        self._library_ready = False
        self._policies: Dict[str, Tuple[float, Optional[Definition]]] = {}
        self._warned: Set[Union[str, Tuple[str, str]]] = set()
        self._code: Optional[str] = None
        self.cache = DenialCache(denial_cache) if denial_cache else None
        self.batches = Batches()
        self.local_share = Fraction(local_share)
        self.local = LocalLimiter() if on_error == "local" else None
        self._scaled: Dict[Limit, Limit] = {}
        #: Counters: "commands" sent to Redis, and decisions per source.
        self.stats: Dict[str, int] = {}

    # -- engines -------------------------------------------------------------------------

    def _use(self, engine: str) -> None:
        if self.engine == engine and ("engine", engine) in self._warned:
            return
        self.engine = engine
        if ("engine", engine) in self._warned:
            return
        self._warned.add(("engine", engine))
        if engine == "module":
            log.info("redis_ratelimit: engine: the module (RATELIMIT.* commands)")
        else:
            why = "engine='library'" if self.mode == "library" else "the server has no module"
            log.info(
                "redis_ratelimit: engine: the Functions library '%s' (FCALL ratelimit_*, keys under '%s'): %s",
                LIBRARY_NAME,
                self.prefix,
                why,
            )

    @property
    def code(self) -> str:
        if self._code is None:
            self._code = library_code()
        return self._code

    def _libraries(self, reply: Any) -> List[Optional[Dict[str, Any]]]:
        """FUNCTION LIST's `ratelimit` library per node (one node, or a cluster's dict of them):
        its fields, or None where it is missing."""
        if isinstance(reply, dict) and reply and not any(as_text(k) == "library_name" for k in reply):
            replies = list(reply.values())  # a cluster: one reply per primary
        else:
            replies = [reply]
        found: List[Optional[Dict[str, Any]]] = []
        for libraries in replies:
            mine = None
            for library in libraries or []:
                fields = reply_fields(library)
                if fields.get("library_name") == LIBRARY_NAME:
                    mine = fields
            found.append(mine)
        return found

    def ensure_library(self) -> Plan:
        """Loads the package's library where it is missing or lacks a function of the package's;
        a library with every function but other code is used as it is (said once)."""
        if self._library_ready:
            return
        reply = yield ListLibrary(LIBRARY_NAME)
        wanted = set(library_functions(self.code))
        load = None
        differs = False
        for library in self._libraries(reply):
            if library is None:
                load = load or "loaded"
                continue
            names = {reply_fields(f).get("name") for f in library.get("functions") or []}
            if not wanted <= names:
                load = "replaced an older"
            elif library.get("library_code") != self.code:
                differs = True
        if load:
            yield LoadLibrary(self.code)
            log.info(
                "redis_ratelimit: %s Functions library '%s' (FUNCTION LOAD)",
                load if load != "loaded" else "loaded the",
                LIBRARY_NAME,
            )
        elif differs and "differs" not in self._warned:
            self._warned.add("differs")
            log.warning(
                "redis_ratelimit: the server's Functions library '%s' has every function but other "
                "code than this package's: using it as it is (load_library() replaces it)",
                LIBRARY_NAME,
            )
        self._library_ready = True

    def load_library(self) -> Plan:
        yield LoadLibrary(self.code)
        self._library_ready = True
        log.info("redis_ratelimit: loaded the Functions library '%s' (FUNCTION LOAD)", LIBRARY_NAME)

    def detect(self) -> Plan:
        """The engine that serves ("module" or "library"), loading the library if needed."""
        if self.engine is None:
            try:
                yield Call(("RATELIMIT.POLICY", "LIST"))
                self._use("module")
            except redis.RedisError as error:  # a cluster client: RedisError
                if not unknown_command(error):
                    raise
                self.engine = "library"
        if self.engine == "library" or self.mode == "library":
            yield from self.ensure_library()
            self._use("library")
        else:
            self._use("module")
            yield from self._spec_form()
        return self.engine

    def _spec_form(self) -> Plan:
        """How the module takes a limit spec, asked once (by `detect`, else right after the first
        call the module answered, whose decision it then returns: a server that does not answer
        is not asked), never where the library serves (words: a server's library may be older):
        `COMMAND INFO RATELIMIT.CHECK`'s arity -3, as one argument (`one_arg`); any other arity,
        none (no such command) or an error reply, as words. Redis unavailable: words, and asked
        again after the next call (the call's own outcome stands either way)."""
        if self.one_arg is not None or self.engine == "library" or self.mode == "library":
            return
        try:
            reply = yield CommandInfo(SPEC_PROBE)
        except Exception as error:  # noqa: BLE001 - an error reply (no permission...), a reply not read: the words
            if unavailable(error):
                return
            reply = None
        self.one_arg = command_arity(reply) == ONE_ARG_ARITY

    def _one_arg_refused(self, error: BaseException) -> bool:
        """A call sent with its specs as one argument was refused as an older module refuses them
        (a cluster's node not upgraded yet, a failover to one): words from now on (said once),
        and the call is sent again so (so too for calls in flight when the form changed: no spec
        sent as words is refused so). False for any other error."""
        if not one_arg_refused(error):
            return False
        if self.one_arg:
            log.warning(
                "redis_ratelimit: a server does not take a limit spec as one argument (an older module: %s): "
                "sending the words from now on",
                error,
            )
        self.one_arg = False
        return True

    def _call(
        self,
        module: Optional[Tuple[Any, ...]],
        function: str,
        keys: Sequence[str],
        args: Optional[Sequence[Any]],
        readonly: bool = False,
        late: Optional[Callable[[Any, str], None]] = None,
    ) -> Plan:
        """The module's command, or the library's `function` on the prefixed keys with `args`
        (None: this call has no library form, e.g. a policy without a fallback); (reply, source)."""
        if self.mode != "library" and self.engine != "library" and module is not None:
            try:
                reply = yield Call(module, None if late is None else lambda reply: late(reply, "module"))
            except redis.RedisError as error:  # a cluster client: RedisError
                if self.mode == "module" or not unknown_command(error):
                    raise
                self.engine = "library"
            else:
                if self.engine is None:
                    self._use("module")
                return reply, "module"
        if args is None:
            raise redis.ResponseError(
                "no such policy: the Functions library has no policies (give the Policy a fallback=Limit(...))"
            )
        # Loaded (and said so) before the engine is announced: the log reads in order.
        yield from self.ensure_library()
        self._use("library")
        command: Tuple[Any, ...] = ("FCALL_RO" if readonly else "FCALL", function, len(keys))
        command += tuple(self.prefix + key for key in keys) + tuple(args)
        landing = None if late is None else lambda reply: late(reply, "library")
        try:
            reply = yield Call(command, landing)
        except redis.ResponseError as error:
            if "function not found" not in str(error).lower():
                raise
            self._library_ready = False  # flushed meanwhile: load it again, once
            yield from self.ensure_library()
            reply = yield Call(command, landing)
        return reply, "library"

    # -- policies ------------------------------------------------------------------------

    def _definition(self, policy: Policy) -> Plan:
        """The policy's definition (cached for `policy_refresh` s), None if the server has none;
        on the library (or before the engine is known, and it is the library) None."""
        if self.engine == "library" or self.mode == "library":
            return None
        cached = self._policies.get(policy.name)
        if cached is not None and self.clock() - cached[0] < self.policy_refresh:
            return cached[1]
        try:
            reply = yield Call(("RATELIMIT.POLICY", "GET", policy.name))
        except redis.RedisError as error:  # a cluster client: RedisError
            if self.mode == "module" or not unknown_command(error):
                raise
            self.engine = "library"  # announced once the library is ready
            return None
        if self.engine is None:
            self._use("module")
        definition = None if reply is None else Definition(reply_fields(reply))
        self._policies[policy.name] = (self.clock(), definition)
        return definition

    def _resolve(self, spec: LimitSpec) -> Plan:
        """(module args, library args or None, period ms, shadow definition or None). The module's
        spec is in the form `_spec_form` found (words until then); the library's, words."""
        one_arg = self.one_arg
        if isinstance(spec, Limit):
            return spec._spec if one_arg else spec._words, spec.args(), spec.period_ms, None
        fallback = spec.fallback.args() if spec.fallback else None
        fallback_period = spec.fallback.period_ms if spec.fallback else 0
        definition = yield from self._definition(spec)
        if self.engine == "library" or self.mode == "library":
            return None, fallback, fallback_period, None
        if definition is None:
            if spec.fallback is None:
                return spec_args(spec.args(), one_arg), None, 0, None  # the server says "no such policy"
            self._warn_fallback(spec)
            return spec_args(fallback or (), one_arg), fallback, fallback_period, None
        shadow = definition if definition.shadow else None
        return spec_args(spec.args(), one_arg), fallback, definition.period_ms, shadow

    def _warn_fallback(self, policy: Policy) -> None:
        if ("fallback", policy.name) not in self._warned:
            self._warned.add(("fallback", policy.name))
            log.warning(
                "redis_ratelimit: the server has no policy '%s': using its fallback %s",
                policy.name,
                " ".join(policy.fallback.args() if policy.fallback else ()),
            )

    def _forget(self, error: redis.ResponseError, specs: Sequence[LimitSpec]) -> bool:
        """After `no such policy` (deleted since it was read): forget it; whether to retry."""
        match = NO_SUCH_POLICY.search(str(error))
        if not match:
            return False
        for spec in specs:
            if (
                isinstance(spec, Policy)
                and spec.name == match.group(1)
                and spec.fallback
                and self._policies.get(spec.name, (0, None))[1] is not None
            ):
                self._policies[spec.name] = (self.clock(), None)
                return True
        return False

    # -- the calls -----------------------------------------------------------------------

    def decide(
        self,
        verb: str,
        key: str,
        spec: LimitSpec,
        cost: int,
        at: Optional[int] = None,
        late: Optional[Callable[[Any, str], None]] = None,
    ) -> Plan:
        """CHECK, PEEK, REFUND or TAKE (`cost`: its MAX) of `key` against `spec`, at the
        server's time or `AT at`; `late(reply, source)`: see `Call.late`."""
        check_key(key)
        check_spec(spec)
        check_cost(cost, 1 if verb == "TAKE" else 0)
        check_at(at)
        function = FUNCTIONS[verb]
        take = verb == "TAKE"
        for attempt in (0, 1):
            module_args, library_args, period, shadow = yield from self._resolve(spec)
            cost_args = ["MAX" if take else "COST", str(cost)] + ([] if at is None else ["AT", str(at)])
            try:
                if shadow is not None and verb in ("CHECK", "TAKE"):
                    # What enforcement answers, in the same round trip (one MULTI).
                    peek = ("RATELIMIT.PEEK", key, *self._inline(shadow), "COST", str(cost), *cost_args[2:])
                    check = (f"RATELIMIT.{verb}", key, *module_args, *cost_args)
                    enforced, answered = yield Transaction((peek, check))
                    yield from self._spec_form()
                    enforcement = parse_decision(enforced, "module")
                    decision = parse_decision(answered, "module", period, not enforcement.allowed, cost, take)
                    if decision.shadow_rejected:
                        log.info(
                            "redis_ratelimit: shadow policy '%s' would have rejected %s (retry in %d ms); admitted",
                            getattr(spec, "name", ""),
                            key,
                            enforcement.retry_after_ms,
                        )
                    return decision
                module = None if module_args is None else (f"RATELIMIT.{verb}", key, *module_args, *cost_args)
                library = None if library_args is None else [*library_args, *cost_args]
                reply, source = yield from self._call(module, function, [key], library, verb == "PEEK", late)
                if source == "module" and late is None:  # (not where a grant must not be lost meanwhile)
                    yield from self._spec_form()
                return parse_decision(reply, source, period, False, cost, take)
            except redis.ResponseError as error:
                if self._one_arg_refused(error):
                    return (yield from self.decide(verb, key, spec, cost, at, late))
                if attempt or not self._forget(error, [spec]):
                    raise

    def _inline(self, shadow: Definition) -> Tuple[str, ...]:
        """A shadow policy's limit inline, as the module takes a spec (its enforcement's PEEK)."""
        return spec_args(shadow.inline(), self.one_arg)

    def check_all(self, pairs: Sequence[Tuple[str, LimitSpec]], cost: int, at: Optional[int] = None) -> Plan:
        pairs = list(pairs)
        if not pairs:
            raise ValueError("check_all needs at least one (key, limit) pair")
        for pair in pairs:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError("check_all takes a list of (key, limit) pairs")
            check_key(pair[0])
            check_spec(pair[1])
        check_cost(cost)
        check_at(at)
        keys = [key for key, _ in pairs]
        specs = [spec for _, spec in pairs]
        for attempt in (0, 1):
            resolved = []
            for spec in specs:
                resolved.append((yield from self._resolve(spec)))
            cost_args = ["COST", str(cost)] + ([] if at is None else ["AT", str(at)])
            periods = [r[2] for r in resolved]
            try:
                module = None
                if all(r[0] is not None for r in resolved):
                    specs_args = [w for r in resolved for w in r[0]]
                    module = ("RATELIMIT.CHECKALL", len(keys), *keys, *specs_args, *cost_args)
                library = None
                if all(r[1] is not None for r in resolved):
                    library = [w for r in resolved for w in r[1]] + cost_args
                shadows = [r[3] for r in resolved]
                if module is not None and any(shadows):
                    peeks = tuple(
                        ("RATELIMIT.PEEK", key, *self._inline(s), *cost_args)
                        for key, s in zip(keys, shadows)
                        if s is not None
                    )
                    replies = yield Transaction((*peeks, module))
                    yield from self._spec_form()
                    verdicts = iter(not parse_decision(r, "module").allowed for r in replies[:-1])
                    flags = [next(verdicts) if s is not None else False for s in shadows]
                    return parse_multi(replies[-1], "module", periods, flags, cost)
                reply, source = yield from self._call(module, "ratelimit_checkall", keys, library)
                if source == "module":
                    yield from self._spec_form()
                return parse_multi(reply, source, periods, (), cost)
            except redis.ResponseError as error:
                if self._one_arg_refused(error):
                    return (yield from self.check_all(pairs, cost, at))
                if attempt or not self._forget(error, specs):
                    raise

    def acquire(self, key: str, limit: int, lease: Any, lease_id: str, cost: int) -> Plan:
        check_key(key)
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"a concurrency limit is an int, not {type(limit).__name__}")
        lease_ms = period_ms(lease, "lease")
        check_lease_id(lease_id)
        check_cost(cost, 1)
        args = [str(limit), duration_word(lease), "ID", lease_id, "COST", str(cost)]
        reply, source = yield from self._call(("RATELIMIT.ACQUIRE", key, *args), "ratelimit_acquire", [key], args)
        return parse_decision(reply, source, lease_ms, False, cost)

    def release(self, key: str, lease_id: str) -> Plan:
        check_key(key)
        check_lease_id(lease_id)
        args = ["ID", lease_id]
        reply, _ = yield from self._call(("RATELIMIT.RELEASE", key, *args), "ratelimit_release", [key], args)
        return int(reply)

    def reset(self, keys: Sequence[str]) -> Plan:
        if not keys:
            raise ValueError("reset needs at least one key")
        for key in keys:
            check_key(key)
        reply, _ = yield from self._call(("RATELIMIT.RESET", *keys), "ratelimit_reset", keys, [])
        return int(reply)

    # -- policies (the module's) ---------------------------------------------------------

    def policy_set(self, name: str, limit: Limit, shadow: bool) -> Plan:
        Policy(name)
        if not isinstance(limit, Limit):
            raise TypeError(f"a policy's limit is a Limit, not {type(limit).__name__}")
        words = ("RATELIMIT.POLICY", "SET", name, *limit.args()) + (("SHADOW",) if shadow else ())
        yield Call(words)
        self._policies.pop(name, None)

    def policy_get(self, name: str) -> Plan:
        Policy(name)
        reply = yield Call(("RATELIMIT.POLICY", "GET", name))
        if reply is None:
            return None
        return {k: (int(v) if isinstance(v, int) else v) for k, v in reply_fields(reply).items()}

    def policy_delete(self, name: str) -> Plan:
        Policy(name)
        reply = yield Call(("RATELIMIT.POLICY", "DEL", name))
        self._policies.pop(name, None)
        return bool(reply)

    def policy_list(self) -> Plan:
        reply = yield Call(("RATELIMIT.POLICY", "LIST"))
        return [as_text(name) for name in reply]

    # -- errors --------------------------------------------------------------------------

    def guarded(
        self,
        plan: Plan,
        period: int = 0,
        decides: bool = True,
        local: Optional[Callable[[], Any]] = None,
        granted: int = 0,
    ) -> Plan:
        """Runs `plan` under the breaker: Redis unavailable (or the breaker open) gives
        `error_decision` with `on_error="open"` (for calls that decide), `local()` with
        `on_error="local"` (as "open" where it answers None or there is none), else raises
        `RateLimitUnavailable`; an error reply is the caller's and is raised as it is."""
        if not self.breaker.allow():
            return self._fail(None, period, decides, local, granted)
        done = False
        try:
            result = yield from plan
            done = True
        except Exception as error:
            if not unavailable(error):
                self.breaker.success()  # Redis answered
                done = True
                raise
            self.breaker.failure()
            done = True
            return self._fail(error, period, decides, local, granted)
        finally:
            if not done:
                self.breaker.abandon()
        self.breaker.success()
        return result

    def _fail(
        self,
        error: Optional[BaseException],
        period: int,
        decides: bool,
        local: Optional[Callable[[], Any]] = None,
        granted: int = 0,
    ) -> Any:
        why = f"{type(error).__name__}: {error}" if error is not None else "breaker open"
        answer = None
        if self.on_error == "local" and decides and local is not None:
            answer = local()
        if error is not None:
            log.warning(
                "redis_ratelimit: Redis unavailable (%s): %s",
                why,
                "deciding in process"
                if answer is not None
                else "failing open"
                if self.on_error != "closed" and decides
                else "failing closed",
            )
        if answer is not None:
            return answer
        if self.on_error != "closed" and decides:
            return error_decision(period, granted)
        raise RateLimitUnavailable(f"Redis unavailable ({why})") from error

    # -- client-side decisions -----------------------------------------------------------

    def now_ms(self, at: Optional[int]) -> int:
        """The time of the denial cache and the batches: `at`, else the monotonic clock."""
        return at if at is not None else int(self.clock() * 1000)

    def _count(self, what: str, n: int = 1) -> None:
        self.stats[what] = self.stats.get(what, 0) + n

    def request(self, verb: str, key: str, spec: LimitSpec, cost: int, at: Optional[int] = None) -> Plan:
        """check, peek, refund or take (`cost`: its max), with the denial cache, the batches
        and the local fallback."""
        if self.direct_ok(verb, spec):
            return self._direct(verb, key, cast(Limit, spec), cost, at)
        return self._request(verb, key, spec, cost, at)

    def direct_ok(self, verb: str, spec: LimitSpec) -> bool:
        """Whether `request` is `_direct`'s one module command: an inline limit, the module known
        to serve and how it takes a spec, no denial cache, no batch, no hold ending."""
        return (
            type(spec) is Limit
            and self.engine == "module"
            and self.mode != "library"
            and self.one_arg is not None
            and self.cache is None
            and (spec.batch is None or verb != "CHECK")
            and not self.batches.pending()
        )

    def direct_args(self, verb: str, key: str, limit: Limit, cost: int, at: Optional[int]) -> Tuple[Any, ...]:
        """The checked arguments and the module's command of `_direct` (a runner's fast path
        sends them itself, then gives the outcome to `direct_reply` or `direct_error`)."""
        if type(key) is not str or not key:
            check_key(key)
        take = verb == "TAKE"
        if type(cost) is not int or not (take <= cost <= MAX_AMOUNT):
            _amount(cost, "max", 1) if take else check_cost(cost)
        if at is not None:
            check_at(at)
        spec = limit._spec if self.one_arg else limit._words
        args = (COMMANDS[verb], key, *spec, "MAX" if take else "COST", str(cost))
        if at is not None:
            args += ("AT", str(at))
        return args

    def direct_packed(
        self, verb: str, key: str, limit: Limit, cost: int, at: Optional[int], encoding: Tuple[str, str]
    ) -> bytes:
        """`direct_args`' command, checked the same, RESP-encoded as redis-py's `send_command`
        would send it (the key by the client's `encoding`): all but the key is packed once per
        limit, verb, cost and spec form (a runner's fast path sends it with `send_packed_command`)."""
        if type(key) is not str or not key:
            check_key(key)
        take = verb == "TAKE"
        if type(cost) is not int or not (take <= cost <= MAX_AMOUNT):
            _amount(cost, "max", 1) if take else check_cost(cost)
        one_arg = self.one_arg
        if at is None:
            packed = limit._packed_one if one_arg else limit._packed
            parts = packed.get((verb, cost))
            if parts is None:
                spec = limit._spec if one_arg else limit._words
                parts = pack_parts(COMMANDS[verb], (*spec, "MAX" if take else "COST", str(cost)))
                if len(packed) < 64:  # (costs that vary widely are packed each time)
                    packed[(verb, cost)] = parts
        else:
            check_at(at)
            spec = limit._spec if one_arg else limit._words
            words = (*spec, "MAX" if take else "COST", str(cost), "AT", str(at))
            parts = pack_parts(COMMANDS[verb], words)
        return pack(parts, key.encode(*encoding))

    def direct_refused(self, verb: str, key: str, limit: Limit, cost: int, at: Optional[int]) -> Decision:
        """`_direct`'s answer when the breaker lets no call through."""
        decision: Decision = self._fail(
            None, limit.period_ms, True, lambda: self._local(verb, key, limit, cost, at), cost
        )
        self._count(decision.source)
        return decision

    def direct_reply(self, verb: str, limit: Limit, cost: int, reply: Any) -> Decision:
        """`_direct`'s answer from the module's reply."""
        self.breaker.success()
        stats = self.stats
        stats["module"] = stats.get("module", 0) + 1
        return parse_decision(reply, "module", limit._period_ms, False, cost, verb == "TAKE")

    def direct_error(
        self, verb: str, key: str, limit: Limit, cost: int, at: Optional[int], error: Exception
    ) -> Optional[Decision]:
        """`_direct`'s outcome of a failed command: Redis unavailable gives `on_error`'s decision
        (or raises `RateLimitUnavailable`); None: the module is gone, ask `_request` (engine
        "auto"), or it refused the spec as one argument (`_one_arg_refused`: `_request` sends
        words); any other error reply is the caller's and is raised."""
        if unavailable(error):
            self.breaker.failure()
            decision: Decision = self._fail(
                error, limit.period_ms, True, lambda: self._local(verb, key, limit, cost, at), cost
            )
            self._count(decision.source)
            return decision
        self.breaker.success()  # Redis answered
        if (self.mode == "auto" and unknown_command(error)) or self._one_arg_refused(error):
            return None  # the module is gone (unloaded, another server), or older: ask `_request`
        raise error

    def _direct(self, verb: str, key: str, limit: Limit, cost: int, at: Optional[int]) -> Plan:
        """`request` where nothing but the module's one command can answer (an inline limit, the
        module known to serve, no denial cache, no batch, no hold ending): that command under the
        breaker, its words built once per Limit. The same answers and errors as `_request`."""
        args = self.direct_args(verb, key, limit, cost, at)
        if not self.breaker.allow():
            return self.direct_refused(verb, key, limit, cost, at)
        done = False
        try:
            reply = yield Call(args)
            done = True
        except Exception as error:  # noqa: BLE001 - direct_error sorts it: on_error's answer, or raised
            done = True
            decision = self.direct_error(verb, key, limit, cost, at, error)
            if decision is None:
                return (yield from self._request(verb, key, limit, cost, at))
            return decision
        finally:
            if not done:
                self.breaker.abandon()
        return self.direct_reply(verb, limit, cost, reply)

    def _request(self, verb: str, key: str, spec: LimitSpec, cost: int, at: Optional[int] = None) -> Plan:
        check_key(key)
        check_spec(spec)
        if verb == "TAKE":
            _amount(cost, "max", 1)
        else:
            check_cost(cost)
        check_at(at)
        now = self.now_ms(at)
        yield from self._refund_due(now, at)
        where = target(key, spec)
        asked = 1 if verb == "TAKE" else cost
        if self.cache is not None:
            if verb in ("CHECK", "TAKE"):
                hit = self.cache.get(where, asked, now)
                if hit is not None:
                    self._count("cache")
                    return hit
            elif verb == "REFUND":
                self.cache.drop_key(key)
        if verb == "CHECK" and isinstance(spec, Limit) and spec.batch is not None and 0 < cost <= spec.batch_limit:
            decision = yield from self._batched(key, spec, cost, at, now)
        else:
            decision = yield from self.guarded(
                self.decide(verb, key, spec, cost, at),
                spec_period(spec),
                True,
                lambda: self._local(verb, key, spec, cost, at),
                cost,
            )
        if (
            self.cache is not None
            and verb in ("CHECK", "TAKE")
            and decision.source in SERVERS
            and self._cacheable(spec)
        ):
            self.cache.put(where, asked, decision, now)
        self._count(decision.source)
        return decision

    def _cacheable(self, spec: LimitSpec) -> bool:
        """Whether refusals of `spec` may be answered again here: not with a BLOCK. A refusal
        that comes after a block has ended starts another one; answered from the cache instead,
        it would not, and the key could be admitted while per-request checks are still blocked.
        A policy's block is known from its definition once read, else its fallback's applies."""
        if isinstance(spec, Limit):
            return spec.block is None
        cached = self._policies.get(spec.name)
        if cached is not None and cached[1] is not None:
            return int(cached[1].fields.get("block_ms") or 0) == 0
        return spec.fallback is None or spec.fallback.block is None

    def _batched(self, key: str, limit: Limit, cost: int, at: Optional[int], now: int) -> Plan:
        """A CHECK answered from the units the batch holds, taking more with one TAKE (shared
        by concurrent callers) when they do not cover `cost`."""
        batch = self.batches.get(key, limit)
        while True:
            flight = leftover = None
            with batch.lock:
                if cost <= batch.held and now < batch.until:
                    return batch.local(cost, now)
                if batch.flight is not None:
                    flight = batch.flight
                else:
                    if batch.held and now >= batch.until:
                        leftover, batch.held = batch.held, 0
                    most = max(cost - batch.held, batch.size(now))
                    mine = batch.flight = Flight()
            if flight is None:
                break
            if not (yield Join(flight)):
                # The TAKE in flight did not end within this call's timeout: Redis did not
                # answer in time, for this call too (a CHECK of its own would wait once more,
                # and a CHECK whose caller then goes away loses its unit).
                return (
                    yield from self.guarded(
                        _no_answer("the batch's TAKE in flight did not end in time"),
                        limit.period_ms,
                        True,
                        lambda: self._local("CHECK", key, limit, cost, at),
                        cost,
                    )
                )
        short = 0
        try:
            if leftover:
                yield from self._refund_units(batch, leftover, at)
            # A grant whose reply this call does not wait for (cancelled, timed out) still lands
            # in the batch: held, then refunded when the hold ends or the limiter closes.
            late = lambda reply, source: self._land(batch, most, at, reply, source)  # noqa: E731
            decision = yield from self.guarded(
                self.decide("TAKE", key, limit, most, at, late),
                limit.period_ms,
                True,
                lambda: self._local("CHECK", key, limit, cost, at),
                cost,
            )
            if decision.source not in SERVERS:
                return decision  # Redis unavailable: on_error's answer for this request
            if decision.granted:
                self._count("taken", decision.granted)
                with batch.lock:
                    batch.held += decision.granted
                    batch.until, batch.taken_at, batch.reply = now + batch.hold_ms, now, decision
                    batch.virtual = at is not None
                self.batches.holding(batch)  # (the batches' lock is never taken inside a batch's)
            with batch.lock:
                if cost <= batch.held:
                    batch.held -= cost
                    batch.used(cost, now)
                    return batch.decision(cost, now, decision.source)
                short = cost - batch.held
        finally:
            with batch.lock:
                batch.flight = None
            mine.finish()
        if not decision.granted and short == 1:
            return decision  # the TAKE's refusal is the CHECK of one unit's
        # Refused: the wait until the server can grant the units the batch lacks.
        peek = yield from self.guarded(self.decide("PEEK", key, limit, short, at), limit.period_ms, True, None, 0)
        return replace(peek, allowed=False, granted=0, delay_ms=0, source=decision.source)

    def _land(self, batch: Batch, most: int, at: Optional[int], reply: Any, source: str) -> None:
        """A batch TAKE's reply that came after its caller stopped waiting: its grant is held
        by the batch (from now, for the hold time), so that it is admitted or refunded."""
        try:
            decision = parse_decision(reply, source, batch.limit.period_ms, False, most, True)
        except Exception as error:  # noqa: BLE001 - a reply of another shape: said, not hidden
            log.warning("redis_ratelimit: a late TAKE reply for %s could not be read (%r): %s", batch.key, reply, error)
            return
        if not decision.granted:
            return
        now = self.now_ms(at)
        self._count("taken", decision.granted)
        self._count("late", decision.granted)
        with batch.lock:
            batch.held += decision.granted
            batch.until, batch.taken_at, batch.reply = now + batch.hold_ms, now, decision
            batch.virtual = at is not None
        self.batches.holding(batch)

    def _refund_units(self, batch: Batch, units: int, at: Optional[int]) -> Plan:
        """Gives back the units a batch did not use (a failure is logged: they count until the
        key's state refills or slides past them)."""
        try:
            yield from self.guarded(self.decide("REFUND", batch.key, batch.limit, units, at), 0, False)
            self._count("refunded", units)
            if self.cache is not None:
                self.cache.drop_key(batch.key)
        except Exception as error:  # noqa: BLE001 - logged, never lost silently
            log.warning(
                "redis_ratelimit: refund of %d unused batch units of %s not done (%s: %s)",
                units,
                batch.key,
                type(error).__name__,
                error,
            )

    def _refund_due(self, now: Optional[int], at: Optional[int]) -> Plan:
        """Refunds what the batches whose hold has ended hold (every batch's with now None)."""
        for batch, units in self.batches.due(now):
            yield from self._refund_units(batch, units, at)

    def sweep(self) -> Plan:
        """Refunds the batches whose hold has ended on the limiter's clock (the timers' plan)."""
        yield from self._refund_due(self.now_ms(None), None)

    def next_sweep_s(self) -> Optional[float]:
        """Seconds until the next hold ends on the limiter's clock, None if none."""
        end = self.batches.next_end()
        return None if end is None else max(0.0, (end - self.now_ms(None)) / 1000)

    def close(self) -> Plan:
        """Gives back every unit the batches hold."""
        yield from self._refund_due(None, None)

    def forget(self, keys: Sequence[str]) -> None:
        """A reset through this limiter: the keys' cached refusals and held units are gone."""
        for key in keys:
            if self.cache is not None:
                self.cache.drop_key(key)
            self.batches.drop_key(key)
            if self.local is not None:
                self.local.reset(key)

    # -- the local fallback --------------------------------------------------------------

    def local_limit(self, spec: LimitSpec) -> Tuple[Optional[Limit], bool]:
        """The limit the local fallback decides with, scaled by `local_share`, and whether it
        is a shadow policy's: a Limit, a policy's cached definition, else its fallback; None
        without any."""
        shadow = False
        if isinstance(spec, Limit):
            base: Optional[Limit] = spec
        else:
            cached = self._policies.get(spec.name)
            definition = cached[1] if cached is not None else None
            base = definition.limit() if definition is not None else None
            shadow = definition is not None and definition.shadow
            if base is None:
                base = spec.fallback
        if base is None:
            return None, False
        scaled = self._scaled.get(base)
        if scaled is None:
            share = self.local_share
            scaled = Limit(
                base.algorithm,
                max(1, int(base.limit * share)),
                base.period_ms,
                burst=None if base.burst is None else max(1, int(base.burst * share)),
                block=base.block,
            )
            if len(self._scaled) > 1024:
                self._scaled.clear()
            self._scaled[base] = scaled
        return scaled, shadow

    def _local(self, verb: str, key: str, spec: LimitSpec, cost: int, at: Optional[int]) -> Optional[Decision]:
        """The in-process decision of `on_error="local"`; None where there is no limit to
        decide with (a policy without a cached definition nor a fallback)."""
        if self.local is None:
            return None
        limit, shadow = self.local_limit(spec)
        if limit is None:
            return None
        now = at if at is not None else int(time.time() * 1000)
        try:
            if verb == "TAKE":
                granted, fields = self.local.take(key, limit, cost, now)
            else:
                fields = getattr(self.local, verb.lower())(key, limit, cost, now)
                granted = cost if fields[0] else 0
        except AlgorithmMismatch as error:
            raise redis.ResponseError(
                f"ERR the key holds another algorithm ({error}) than '{limit.algorithm}' (in process)"
            ) from None
        allowed, limit_, remaining, retry, reset, delay = fields
        rejected = False
        if shadow and not allowed and verb in ("CHECK", "TAKE"):
            rejected, allowed, retry = True, True, 0
            granted = cost
        return Decision(
            bool(allowed), limit_, remaining, retry, reset, delay, "fallback", rejected, limit.period_ms, granted
        )

    def local_check_all(
        self, pairs: Sequence[Tuple[str, LimitSpec]], cost: int, at: Optional[int]
    ) -> Optional[MultiDecision]:
        """check_all in process, all or nothing (None: some limit has nothing to decide with)."""
        if self.local is None:
            return None
        known = [self.local_limit(spec)[0] for _, spec in pairs]
        limits = [limit for limit in known if limit is not None]
        if len(limits) < len(known):
            return None
        now = at if at is not None else int(time.time() * 1000)
        keys = [key for key, _ in pairs]
        peeks = [self.local.peek(key, limit, cost, now) for key, limit in zip(keys, limits)]
        if all(fields[0] for fields in peeks):
            peeks = [self.local.check(key, limit, cost, now) for key, limit in zip(keys, limits)]
        each = [
            Decision(bool(f[0]), f[1], f[2], f[3], f[4], f[5], "fallback", False, limit.period_ms, cost if f[0] else 0)
            for f, limit in zip(peeks, limits)
        ]
        least = min(each, key=lambda d: d.remaining)
        retry = -1 if any(d.retry_after_ms < 0 for d in each) else max(d.retry_after_ms for d in each)
        return MultiDecision(
            all(d.allowed for d in each),
            least.limit,
            least.remaining,
            retry,
            max(d.reset_after_ms for d in each),
            max(d.delay_ms for d in each),
            "fallback",
            False,
            each,
        )


def _no_answer(why: str) -> Plan:
    """A plan that fails as a call without a reply in time does."""
    yield from ()  # (a generator)
    raise redis.TimeoutError(why)
