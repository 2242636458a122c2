"""`RateLimiter` (redis-py's sync client) and `AsyncRateLimiter` (`redis.asyncio`): thin runners
of the engine's plans (`_engine.py`), one method each per operation.

The operations' methods are shared at run time (`_Common`: each returns what `_run` gives, a
value for `RateLimiter`, an awaitable for `AsyncRateLimiter`); under `TYPE_CHECKING` each
limiter declares them with its own types, which type checkers read (py.typed)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncIterator,
    Callable,
    Dict,
    Iterator,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

import redis
import redis.asyncio

from ._engine import Call, CommandInfo, Core, Join, ListLibrary, LoadLibrary, Plan, Transaction
from ._types import Decision, Limit, LimitSpec, MultiDecision, Period, RateLimited, RateLimitUnavailable

log = logging.getLogger("redis_ratelimit")
#: asyncio.timeout (Python 3.11+), else None (asyncio.wait_for).
_timeout = getattr(asyncio, "timeout", None)

#: What `from_url` waits for Redis (connect and each reply), in seconds: a gateway's limiter
#: must not add more than this to a request when Redis stalls.
DEFAULT_TIMEOUT = 0.1
#: A policy's definition as `policies.get` returns it.
PolicyFields = Dict[str, Union[str, int]]
#: `from_url`'s client, made at the first call.
_LATER = object()
_LIMITER_OPTIONS = (
    "on_error",
    "engine",
    "prefix",
    "breaker_failures",
    "breaker_cooldown",
    "policy_refresh",
    "denial_cache",
    "local_share",
)
#: The longest a batches' timer sleeps before looking again (s).
SWEEP_WAIT_MAX = 60.0
#: How long a batch TAKE's reply is still awaited after its caller stopped waiting (cancelled,
#: timed out), so that its grant is held and refunded rather than lost; `close()` waits for
#: these too (s).
LATE_REPLY_WAIT = 5.0


class _Common:
    """The methods both limiters share; `_run` executes a plan (sync) or returns an awaitable."""

    _core: Core

    def _run(self, plan: Plan) -> Any:
        raise NotImplementedError

    def _guard(self, plan: Plan, period: int = 0, decides: bool = False) -> Any:
        return self._run(self._core.guarded(plan, period, decides))

    @property
    def engine(self) -> Optional[str]:
        """ "module" or "library" once a call has found out (None before)."""
        return self._core.engine

    @property
    def on_error(self) -> str:
        return self._core.on_error

    @property
    def stats(self) -> Dict[str, int]:
        """Counters since the limiter was made: "commands" sent to Redis, and the decisions
        answered per source ("module", "library", "cache", "local", "fallback", "error"),
        "taken" and "refunded": units batches took with TAKE and gave back."""
        return dict(self._core.stats)

    def held(self) -> int:
        """Units the batches of this limiter hold now (taken, not yet admitted nor refunded)."""
        return self._core.batches.held()

    def check(self, key: str, limit: LimitSpec, cost: int = 1, *, at: Optional[int] = None) -> Any:
        """Decides one request of `cost` on `key` and consumes it if admitted: a `Decision`.
        at: the call's time in ms since the Unix epoch (the module's `AT`), else the server's."""
        return self._request("CHECK", key, limit, cost, at)

    def peek(self, key: str, limit: LimitSpec, cost: int = 1, *, at: Optional[int] = None) -> Any:
        """What `check` would answer now, changing nothing (always asks Redis)."""
        return self._request("PEEK", key, limit, cost, at)

    def refund(self, key: str, limit: LimitSpec, cost: int, *, at: Optional[int] = None) -> Any:
        """Gives back up to `cost` that earlier checks consumed; the decision right after."""
        return self._request("REFUND", key, limit, cost, at)

    def take(self, key: str, limit: LimitSpec, max: int, *, at: Optional[int] = None) -> Any:
        """Grants and consumes the largest cost up to `max` that `check` would admit
        (`RATELIMIT.TAKE`): a `Decision` whose `granted` says how much (0: refused)."""
        return self._request("TAKE", key, limit, max, at)

    def _request(self, verb: str, key: str, limit: LimitSpec, cost: int, at: Optional[int]) -> Any:
        return self._run(self._core.request(verb, key, limit, cost, at))

    def check_all(self, pairs: Sequence[Tuple[str, LimitSpec]], cost: int = 1, *, at: Optional[int] = None) -> Any:
        """One request against several limits, all or nothing (`RATELIMIT.CHECKALL`; in a
        cluster the keys need one hash tag): a `MultiDecision`."""
        pairs = list(pairs)
        core = self._core
        plan = core.guarded(
            core.check_all(pairs, cost, at), 0, True, lambda: core.local_check_all(pairs, cost, at), cost
        )
        return self._run(_multi_on_error(plan, len(pairs)))

    def reset(self, *keys: str) -> Any:
        """Deletes limiters (of the engine that serves); how many existed."""
        self._core.forget(keys)
        return self._guard(self._core.reset(keys))

    def acquire(self, key: str, limit: int, lease: Period, *, id: str, cost: int = 1) -> Any:
        """Takes (or renews) a lease of `cost` under `id` on a concurrency limit of `limit`, for
        `lease` (`"30s"`); refused if it does not fit (look at `allowed`)."""
        from ._types import period_ms

        plan = self._core.acquire(key, limit, lease, id, cost)
        return self._run(self._core.guarded(plan, period_ms(lease, "lease"), True, None, cost))

    def release(self, key: str, id: str) -> Any:
        """Gives `id`'s lease back: 1 if it held one, else 0."""
        return self._guard(self._core.release(key, id))

    def detect_engine(self) -> Any:
        """Finds the engine that serves ("module" or "library"), loading the Functions library
        if it is needed and missing, and logs it; calls do this by themselves when needed."""
        return self._guard(self._core.detect())

    def load_library(self) -> Any:
        """`FUNCTION LOAD REPLACE` of the package's library (on every primary of a cluster)."""
        return self._guard(self._core.load_library())


class _PolicyMethods:
    """`limiter.policies`: the server's named limits (the module's `RATELIMIT.POLICY`), one body
    per method for both limiters (each returns what the limiter's `_run` gives)."""

    def __init__(self, limiter: _Common):
        self._limiter = limiter

    def set(self, name: str, limit: Limit, shadow: bool = False) -> Any:
        """Defines (or replaces) policy `name` as `limit`, in shadow mode if `shadow`."""
        return self._limiter._guard(self._limiter._core.policy_set(name, limit, shadow))

    def get(self, name: str) -> Any:
        """Its definition (`algorithm`, `limit`, `period_ms`, `burst`, `mode`, `block_ms`), or None."""
        return self._limiter._guard(self._limiter._core.policy_get(name))

    def delete(self, name: str) -> Any:
        """Removes it: whether it existed."""
        return self._limiter._guard(self._limiter._core.policy_delete(name))

    def list(self) -> Any:
        """The names, sorted."""
        return self._limiter._guard(self._limiter._core.policy_list())


class Policies(_PolicyMethods):
    """`RateLimiter.policies`: the server's named limits (the module's `RATELIMIT.POLICY`)."""

    if TYPE_CHECKING:  # the methods as `RateLimiter.policies` returns them

        def set(self, name: str, limit: Limit, shadow: bool = False) -> None: ...
        def get(self, name: str) -> Optional[PolicyFields]: ...
        def delete(self, name: str) -> bool: ...
        def list(self) -> List[str]: ...


class AsyncPolicies(_PolicyMethods):
    """`AsyncRateLimiter.policies`: the same methods, awaited."""

    if TYPE_CHECKING:  # the methods as `AsyncRateLimiter.policies` returns them

        async def set(self, name: str, limit: Limit, shadow: bool = False) -> None: ...
        async def get(self, name: str) -> Optional[PolicyFields]: ...
        async def delete(self, name: str) -> bool: ...
        async def list(self) -> List[str]: ...


def _client_kwargs(kwargs: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    limiter = {k: kwargs.pop(k) for k in list(kwargs) if k in _LIMITER_OPTIONS}
    return limiter, kwargs


class RateLimiter(_Common):
    """Rate limits with redis-py's sync client (`redis.Redis`, `redis.RedisCluster`), RESP2 or
    RESP3.

    on_error: "open" (Redis down, refusing or silent: an admitted `Decision(source="error")`)
    or "closed" (`RateLimitUnavailable`); engine: "auto" (the module, else the Functions
    library), "module" or "library"; prefix: where the library's keys live ("fn:");
    breaker_failures, breaker_cooldown: that many consecutive failures make every call apply
    `on_error` at once for `breaker_cooldown` s, then one call probes; policy_refresh: how long
    a policy's definition is kept (s). timeout: what a call waits for Redis at most (connect
    and each reply, s; default the client's `socket_timeout`, else `DEFAULT_TIMEOUT`), never
    retried: a `redis.Redis` whose own timeouts and retries do not keep within it gets the
    limiter's commands on connections of the limiter's own, made with its settings and bounded
    by `timeout` (the client stays as it is for its other commands).
    """

    if TYPE_CHECKING:  # `_Common`'s methods as this limiter returns them

        def check(self, key: str, limit: LimitSpec, cost: int = 1, *, at: Optional[int] = None) -> Decision: ...
        def peek(self, key: str, limit: LimitSpec, cost: int = 1, *, at: Optional[int] = None) -> Decision: ...
        def refund(self, key: str, limit: LimitSpec, cost: int, *, at: Optional[int] = None) -> Decision: ...
        def take(self, key: str, limit: LimitSpec, max: int, *, at: Optional[int] = None) -> Decision: ...
        def check_all(
            self, pairs: Sequence[Tuple[str, LimitSpec]], cost: int = 1, *, at: Optional[int] = None
        ) -> MultiDecision: ...
        def reset(self, *keys: str) -> int: ...
        def acquire(self, key: str, limit: int, lease: Period, *, id: str, cost: int = 1) -> Decision: ...
        def release(self, key: str, id: str) -> int: ...
        def detect_engine(self) -> str: ...
        def load_library(self) -> None: ...

    def __init__(self, client: Any, *, timeout: Optional[float] = None, **options: Any):
        unknown = set(options) - set(_LIMITER_OPTIONS)
        if unknown:
            raise TypeError(f"unknown option(s) {', '.join(sorted(unknown))}")
        if isinstance(client, redis.asyncio.Redis):
            raise TypeError("RateLimiter takes a sync client; use AsyncRateLimiter with redis.asyncio")
        self.client = client
        self.timeout = _call_timeout(timeout, _client_timeouts(client)[0])
        self._core = Core(**options)
        self.policies = Policies(self)
        #: What the limiter sends on: the client, or one on a pool of the limiter's own bounded by
        #: `timeout` (`_own_pool`).
        self._sender, self._own_pool, pool = _bounded_sender(client, self.timeout)
        #: (the pool, its get_connection) where the limiter sends its commands on the pool's
        #: connections itself, else None (execute_command).
        self._direct = None if pool is None else (pool, _connection_getter(pool))
        self._encoding = _encoding(pool)
        #: Threads reading batch TAKE replies that came after their caller's timeout.
        self._late: Set[threading.Thread] = set()
        self._sweeper: Optional[threading.Thread] = None
        self._sweep_wake = threading.Condition()
        self._sleep_until = 0.0
        self._closed = False

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float = DEFAULT_TIMEOUT, cluster: bool = False, **kwargs: Any
    ) -> "RateLimiter":
        """A limiter on a client of its own: `timeout` bounds the connection and every reply,
        and a timeout is not retried (the breaker takes over). Other keyword arguments go to the
        limiter if they are its options, else to `redis.Redis.from_url`."""
        options, client_kwargs = _client_kwargs(dict(kwargs))
        client_kwargs.setdefault("socket_timeout", timeout)
        client_kwargs.setdefault("socket_connect_timeout", timeout)
        client: Any
        if cluster:
            client = redis.RedisCluster.from_url(url, **client_kwargs)
        else:
            client_kwargs.setdefault("retry", _no_retry())
            client = redis.Redis.from_url(url, **client_kwargs)
        return cls(client, **options)

    def close(self) -> None:
        """Refunds the units the batches hold (a failure is logged), then closes the client."""
        with self._sweep_wake:
            self._closed = True
            self._sweep_wake.notify()
        if self._sweeper is not None and self._sweeper is not threading.current_thread():
            self._sweeper.join(5.0)
        for reader in list(self._late):
            reader.join(LATE_REPLY_WAIT)
        try:
            self._execute(self._core.close())
        finally:
            if self._own_pool is not None:
                self._own_pool.disconnect()
            self.client.close()

    def _schedule(self) -> None:
        """A hold ends on the limiter's clock: the batches' thread refunds it then."""
        delay = self._core.next_sweep_s()
        if delay is None or self._closed:
            return
        with self._sweep_wake:
            if self._sweeper is None:
                self._sweeper = threading.Thread(target=self._sweep_loop, name="redis_ratelimit-batches", daemon=True)
                self._sweeper.start()
            if time.monotonic() + delay < self._sleep_until:
                self._sleep_until = 0.0
                self._sweep_wake.notify()

    def _sweep_loop(self) -> None:
        while True:
            with self._sweep_wake:
                while not self._closed:
                    delay = self._core.next_sweep_s()
                    if delay is not None and delay <= 0:
                        break
                    wait = SWEEP_WAIT_MAX if delay is None else min(delay, SWEEP_WAIT_MAX)
                    self._sleep_until = time.monotonic() + (wait if delay is not None else float("inf"))
                    self._sweep_wake.wait(wait)
                if self._closed:
                    return
            try:
                self._execute(self._core.sweep())
            except Exception as error:  # noqa: BLE001 - the refunds log their own failures
                log.warning("redis_ratelimit: batch refunds failed (%s: %s)", type(error).__name__, error)

    def __enter__(self) -> "RateLimiter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _perform(self, op: Any) -> Any:
        if type(op) is Call:
            stats = self._core.stats
            stats["commands"] = stats.get("commands", 0) + 1
            if self._direct is None:
                return self._sender.execute_command(*op.args)
            if op.late is not None:
                return self._keep_reply(op)
            pool, get = self._direct
            conn = get()
            try:
                # What execute_command does without retries: the same connection, bounded by
                # its socket_timeout; one that failed is disconnected by redis-py itself.
                conn.send_command(*op.args)
                return conn.read_response()
            finally:
                pool.release(conn)
        if isinstance(op, Join):
            return op.flight.event.wait(2 * self.timeout)
        if isinstance(op, CommandInfo):
            args, options = _command_info(self._sender, op.name)
            return self._sender.execute_command(*args, **options)
        self._core._count("commands", len(op.calls) + 2 if isinstance(op, Transaction) else 1)
        sender = self._sender
        if isinstance(op, Transaction):
            pipe = sender.pipeline(transaction=True)
            for call in op.calls:
                pipe.execute_command(*call)
            return pipe.execute()
        if isinstance(op, ListLibrary):
            return sender.function_list(library=op.name, withcode=True)
        if isinstance(op, LoadLibrary):
            return sender.function_load(op.code, replace=True)
        raise TypeError(op)

    def _keep_reply(self, op: Call) -> Any:
        """`op` on a connection of the client's pool whose reply is not dropped when the
        client's `socket_timeout` fires: the connection stays open, and a thread reads the late
        reply (for `op.late`) before giving the connection back (redis-py drops a timed-out
        connection, and the reply with it)."""
        assert self._direct is not None and op.late is not None  # (only then is it called)
        pool, get = self._direct
        conn = get()
        try:
            conn.send_command(*op.args)
            reply = conn.read_response(disconnect_on_error=False)
        except redis.ResponseError:
            pool.release(conn)
            raise
        except redis.TimeoutError:
            if getattr(conn, "_sock", None) is None:  # the send timed out: nothing was sent whole
                pool.release(conn)
            else:
                self._read_late(pool, conn, op.late)
            raise
        except BaseException:
            conn.disconnect()
            pool.release(conn)
            raise
        pool.release(conn)
        return reply

    def _read_late(self, pool: Any, conn: Any, late: Callable[[Any], None]) -> None:
        def read() -> None:
            deadline = time.monotonic() + LATE_REPLY_WAIT
            try:
                while True:
                    try:
                        reply = conn.read_response(disconnect_on_error=False)
                        break
                    except redis.TimeoutError:
                        if time.monotonic() < deadline:
                            continue
                        log.warning(
                            "redis_ratelimit: a batch TAKE had no reply within %.3g s: what it may "
                            "have granted stays consumed in Redis",
                            LATE_REPLY_WAIT,
                        )
                        conn.disconnect()
                        return
                    except redis.ResponseError:
                        return
                    except BaseException:  # noqa: BLE001 - any other end: the connection is not reused
                        conn.disconnect()
                        return
                late(reply)
            finally:
                pool.release(conn)
                self._late.discard(threading.current_thread())
            self._schedule()

        reader = threading.Thread(target=read, name="redis_ratelimit-late-reply", daemon=True)
        self._late.add(reader)
        reader.start()

    def _request(self, verb: str, key: str, limit: LimitSpec, cost: int, at: Optional[int]) -> Any:
        core = self._core
        direct = self._direct
        if direct is None or not core.direct_ok(verb, limit):
            return self._run(core.request(verb, key, limit, cost, at))
        # `Core._direct` as `_execute` runs it with `_perform`'s `Call`, without a plan: the
        # same breaker, `on_error`, statistics and errors.
        packed = core.direct_packed(verb, key, limit, cost, at, self._encoding)  # type: ignore[arg-type]  # direct_ok: type(limit) is Limit
        breaker = core.breaker
        if not breaker.allow():
            return core.direct_refused(verb, key, limit, cost, at)  # type: ignore[arg-type]  # direct_ok: type(limit) is Limit
        stats = core.stats
        stats["commands"] = stats.get("commands", 0) + 1
        pool, get = direct
        done = False
        try:
            conn = get()
            try:
                conn.send_packed_command([packed])  # (what send_command sends, packed once)
                reply = conn.read_response()
            finally:
                pool.release(conn)
            done = True
        except Exception as error:  # noqa: BLE001 - direct_error sorts it: on_error's answer, or raised
            done = True
            decision = core.direct_error(verb, key, limit, cost, at, error)  # type: ignore[arg-type]  # direct_ok: type(limit) is Limit
            if decision is None:
                return self._run(core._request(verb, key, limit, cost, at))
            return decision
        finally:
            if not done:
                breaker.abandon()
        return core.direct_reply(verb, limit, cost, reply)  # type: ignore[arg-type]  # direct_ok: type(limit) is Limit

    def _run(self, plan: Plan) -> Any:
        try:
            return self._execute(plan)
        finally:
            if self._core.batches.timed():
                self._schedule()

    def _execute(self, plan: Plan) -> Any:
        reply: Any = None
        error: Optional[BaseException] = None
        while True:
            try:
                op = plan.throw(error) if error is not None else plan.send(reply)
            except StopIteration as stop:
                return stop.value
            reply, error = None, None
            try:
                reply = self._perform(op)
            except Exception as e:  # noqa: BLE001 - thrown into the plan, which decides
                error = e

    @contextlib.contextmanager
    def lease(
        self, key: str, limit: int, lease: Period, *, cost: int = 1, id: Optional[str] = None
    ) -> Iterator[Decision]:
        """Holds a lease for the block (a random id unless `id`): `RateLimited` if refused;
        released when the block ends, however it ends (an unreachable Redis is logged: the lease
        expires by itself)."""
        lease_id = id or uuid.uuid4().hex
        decision = self.acquire(key, limit, lease, id=lease_id, cost=cost)
        if not decision.allowed:
            raise RateLimited(decision)
        try:
            yield decision
        finally:
            if decision.source != "error":
                try:
                    self.release(key, lease_id)
                except RateLimitUnavailable as error:
                    log.warning("redis_ratelimit: release of %s not done (%s): it expires by itself", key, error)


class AsyncRateLimiter(_Common):
    """`RateLimiter` for `redis.asyncio` clients: the same methods and options, awaited, and
    `async with limiter.lease(...)`. timeout: every call is bounded by it (seconds; default the
    client's `socket_timeout`, else `DEFAULT_TIMEOUT`), however the client is configured."""

    if TYPE_CHECKING:  # `_Common`'s methods as this limiter returns them (awaitables)

        async def check(self, key: str, limit: LimitSpec, cost: int = 1, *, at: Optional[int] = None) -> Decision: ...
        async def peek(self, key: str, limit: LimitSpec, cost: int = 1, *, at: Optional[int] = None) -> Decision: ...
        async def refund(self, key: str, limit: LimitSpec, cost: int, *, at: Optional[int] = None) -> Decision: ...
        async def take(self, key: str, limit: LimitSpec, max: int, *, at: Optional[int] = None) -> Decision: ...
        async def check_all(
            self, pairs: Sequence[Tuple[str, LimitSpec]], cost: int = 1, *, at: Optional[int] = None
        ) -> MultiDecision: ...
        async def reset(self, *keys: str) -> int: ...
        async def acquire(self, key: str, limit: int, lease: Period, *, id: str, cost: int = 1) -> Decision: ...
        async def release(self, key: str, id: str) -> int: ...
        async def detect_engine(self) -> str: ...
        async def load_library(self) -> None: ...

    def __init__(self, client: Any, *, timeout: Optional[float] = None, **options: Any):
        unknown = set(options) - set(_LIMITER_OPTIONS)
        if unknown:
            raise TypeError(f"unknown option(s) {', '.join(sorted(unknown))}")
        if isinstance(client, redis.Redis):
            raise TypeError("AsyncRateLimiter takes a redis.asyncio client; use RateLimiter with redis.Redis")
        if client is None:
            raise TypeError("AsyncRateLimiter needs a redis.asyncio client (or AsyncRateLimiter.from_url)")
        self._client = None if client is _LATER else client
        self._make_client: Optional[Callable[[], Any]] = None
        self.timeout = _call_timeout(timeout, None if client is _LATER else _client_timeouts(client)[0])
        self._core = Core(**options)
        self.policies = AsyncPolicies(self)
        self._timer: Optional[asyncio.TimerHandle] = None
        self._timer_when = 0.0
        self._sweeps: Set["asyncio.Task[None]"] = set()
        #: Batch TAKEs still awaited after their caller stopped waiting (their grants land late).
        self._late: Set["asyncio.Future[Any]"] = set()
        #: (pool, get_connection) once the client is known, () for execute_command.
        self._direct: Any = None
        #: Whether the client's own timeouts bound a command within `timeout` (None: not known).
        self._bounds: Optional[bool] = None
        #: The direct path's key encoding (the pool's), once known.
        self._encoding: Optional[Tuple[str, str]] = None

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float = DEFAULT_TIMEOUT, cluster: bool = False, **kwargs: Any
    ) -> "AsyncRateLimiter":
        """As `RateLimiter.from_url`, with a `redis.asyncio` client."""
        options, client_kwargs = _client_kwargs(dict(kwargs))
        client_kwargs.setdefault("socket_timeout", timeout)
        client_kwargs.setdefault("socket_connect_timeout", timeout)
        if not cluster:
            client_kwargs.setdefault("retry", _no_retry(asyncio=True))
        kind = redis.asyncio.RedisCluster if cluster else redis.asyncio.Redis
        limiter = cls(_LATER, timeout=timeout, **options)
        # Made at the first call, inside the event loop that serves it: a limiter made at import
        # time (a module-level app) binds nothing to another loop (Python 3.9's asyncio does).
        limiter._make_client = lambda: kind.from_url(url, **client_kwargs)
        return limiter

    @property
    def client(self) -> Any:
        """The `redis.asyncio` client (for `from_url`, made at its first use)."""
        if self._client is None and self._make_client is not None:
            self._client = self._make_client()
        return self._client

    async def aclose(self) -> None:
        """Refunds the units the batches hold (a failure is logged), then closes the client."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._client is None:
            return
        if self._late:
            await asyncio.wait(list(self._late), timeout=LATE_REPLY_WAIT)
        try:
            await self._execute(self._core.close())
        finally:
            close = getattr(self._client, "aclose", None) or self._client.close
            await close()

    async def close(self) -> None:
        """`aclose()`."""
        await self.aclose()

    async def __aenter__(self) -> "AsyncRateLimiter":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _perform(self, op: Any) -> Any:
        if type(op) is Call:
            self._core._count("commands")
            direct = self._direct
            if direct is None:
                direct = self._direct = _direct_async(self.client)
            if not direct:
                return await self.client.execute_command(*op.args)
            pool, get = direct
            conn = await get()
            try:
                # What execute_command does without retries: one connection; a failed or
                # cancelled read disconnects it (redis-py), so none goes back with a reply due.
                await conn.send_command(*op.args)
                return await conn.read_response()
            finally:
                await pool.release(conn)
        if isinstance(op, Join):
            if op.flight.event.is_set():
                return True
            future = asyncio.get_running_loop().create_future()
            op.flight.futures.append(future)
            await future  # bounded by the call's timeout (a redis.TimeoutError: ask for itself)
            return True
        if isinstance(op, CommandInfo):
            args, options = _command_info(self.client, op.name)
            return await self.client.execute_command(*args, **options)
        self._core._count("commands", len(op.calls) + 2 if isinstance(op, Transaction) else 1)
        if isinstance(op, Transaction):
            pipe = self.client.pipeline(transaction=True)
            for call in op.calls:
                pipe.execute_command(*call)
            return await pipe.execute()
        if isinstance(op, ListLibrary):
            return await self.client.function_list(library=op.name, withcode=True)
        if isinstance(op, LoadLibrary):
            return await self.client.function_load(op.code, replace=True)
        raise TypeError(op)

    def _run(self, plan: Plan) -> Any:
        """The awaitable of `plan` (no coroutine of its own around `_execute`'s)."""
        return self._execute(plan, True)

    def _request(self, verb: str, key: str, limit: LimitSpec, cost: int, at: Optional[int]) -> Any:
        core = self._core
        # The common case (the module's one command on the client's own connection, whose
        # timeouts bound it) in one coroutine, without a plan: what `_execute` would run.
        if self._bounds and core.direct_ok(verb, limit):
            return self._direct_request(verb, key, limit, cost, at)  # type: ignore[arg-type]  # direct_ok: type(limit) is Limit
        return self._execute(core.request(verb, key, limit, cost, at), True)

    async def _direct_request(self, verb: str, key: str, limit: Limit, cost: int, at: Optional[int]) -> Any:
        """`Core._direct` run as `_execute` runs it on the direct path (`_perform`'s `Call`),
        with the same breaker, `on_error`, statistics and errors."""
        core = self._core
        encoding = self._encoding
        if encoding is None:
            encoding = self._encoding = _encoding(self._direct[0])
        packed = core.direct_packed(verb, key, limit, cost, at, encoding)
        breaker = core.breaker
        if not breaker.allow():
            return core.direct_refused(verb, key, limit, cost, at)
        stats = core.stats
        stats["commands"] = stats.get("commands", 0) + 1
        pool, get = self._direct
        done = False
        try:
            conn = await get()
            try:
                # As `_perform`: a failed or cancelled read disconnects the connection
                # (redis-py), so none goes back with a reply due.
                await conn.send_packed_command([packed])  # (what send_command sends, packed once)
                reply = await conn.read_response()
            finally:
                await pool.release(conn)
            done = True
        except Exception as error:  # noqa: BLE001 - direct_error sorts it: on_error's answer, or raised
            done = True
            if isinstance(error, asyncio.TimeoutError):
                timeout = redis.TimeoutError(f"no reply within {self.timeout} s")
                timeout.__cause__ = error
                error = timeout
            decision = core.direct_error(verb, key, limit, cost, at, error)
            if decision is None:
                return await self._execute(core._request(verb, key, limit, cost, at), True)
            return decision
        finally:
            if not done:
                breaker.abandon()
        return core.direct_reply(verb, limit, cost, reply)

    def _schedule(self) -> None:
        """A hold ends on the limiter's clock: a timer refunds it then."""
        delay = self._core.next_sweep_s()
        if delay is None:
            return
        delay = min(delay, SWEEP_WAIT_MAX)
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        if self._timer is not None and self._timer_when <= when:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_when = when
        self._timer = loop.call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        task = asyncio.ensure_future(self._sweep())
        self._sweeps.add(task)
        task.add_done_callback(self._sweeps.discard)

    async def _sweep(self) -> None:
        try:
            await self._execute(self._core.sweep())
        except Exception as error:  # noqa: BLE001 - the refunds log their own failures
            log.warning("redis_ratelimit: batch refunds failed (%s: %s)", type(error).__name__, error)
        self._schedule()

    async def _execute(self, plan: Plan, schedule: bool = False) -> Any:
        """Runs `plan`; `schedule`: then arms the batches' timer if a hold ends (a call's)."""
        reply: Any = None
        error: Optional[BaseException] = None
        try:
            while True:
                try:
                    op = plan.throw(error) if error is not None else plan.send(reply)
                except StopIteration as stop:
                    return stop.value
                reply, error = None, None
                try:
                    if type(op) is Call and op.late is not None:
                        reply = await self._keep_reply(op)
                    elif type(op) is Call and self._client_bounds():
                        # (A client whose own timeouts are within the limiter's bounds each
                        # step of the call itself, as for any command: nothing to add.)
                        reply = await self._perform(op)
                    elif _timeout is not None:
                        # asyncio.timeout (3.11+) bounds the call in this task; wait_for would
                        # make a task per call (Python before 3.12).
                        async with _timeout(self.timeout):
                            reply = await self._perform(op)
                    else:
                        reply = await asyncio.wait_for(self._perform(op), self.timeout)
                except asyncio.TimeoutError as e:
                    if isinstance(op, Join):
                        reply = False  # the TAKE in flight did not end in time
                        continue
                    error = redis.TimeoutError(f"no reply within {self.timeout} s")
                    error.__cause__ = e
                except Exception as e:  # noqa: BLE001 - thrown into the plan, which decides
                    error = e
        finally:
            plan.close()  # cancelled mid-plan: the breaker forgets the probe
            if schedule and self._core.batches.timed():
                self._schedule()

    def _client_bounds(self) -> bool:
        """Whether the client's own timeouts bound a command within `timeout`: its connect,
        each write and each read (redis.asyncio's `socket_connect_timeout`, `socket_timeout`),
        on the limiter's direct path (no retries, no wrapper)."""
        bounds = self._bounds
        if bounds is None:
            direct = self._direct
            if direct is None:
                direct = self._direct = _direct_async(self.client)
            kwargs = direct[0].connection_kwargs if direct else {}
            read, connect = kwargs.get("socket_timeout"), kwargs.get("socket_connect_timeout")
            limit = self.timeout
            bounds = self._bounds = (
                bool(direct) and read is not None and connect is not None and (read <= limit and connect <= limit)
            )
        return bounds

    async def _keep_reply(self, op: Call) -> Any:
        """`op` in a task of its own, which neither the caller's cancellation nor its timeout
        cancels: if the caller stops waiting, the reply still comes (within `LATE_REPLY_WAIT`)
        and goes to `op.late`."""
        late = op.late
        assert late is not None  # (only then is it called)
        task = asyncio.ensure_future(asyncio.wait_for(self._perform(op), LATE_REPLY_WAIT))
        try:
            return await asyncio.wait_for(asyncio.shield(task), self.timeout)
        except BaseException:
            if not task.done() or (not task.cancelled() and task.exception() is None):
                self._late.add(task)
                task.add_done_callback(lambda done: self._landed(done, late))
            raise

    def _landed(self, task: "asyncio.Future[Any]", late: Callable[[Any], None]) -> None:
        self._late.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            late(task.result())
            self._schedule()
        elif not isinstance(error, redis.ResponseError):
            log.warning(
                "redis_ratelimit: a batch TAKE had no reply (%s: %s): what it may have granted stays consumed in Redis",
                type(error).__name__,
                error,
            )

    @contextlib.asynccontextmanager
    async def lease(
        self, key: str, limit: int, lease: Period, *, cost: int = 1, id: Optional[str] = None
    ) -> AsyncIterator[Decision]:
        """As `RateLimiter.lease`: `async with limiter.lease(key, 2, "30s") as decision: ...`."""
        lease_id = id or uuid.uuid4().hex
        decision = await self.acquire(key, limit, lease, id=lease_id, cost=cost)
        if not decision.allowed:
            raise RateLimited(decision)
        try:
            yield decision
        finally:
            if decision.source != "error":
                try:
                    await self.release(key, lease_id)
                except RateLimitUnavailable as error:
                    log.warning("redis_ratelimit: release of %s not done (%s): it expires by itself", key, error)


def _multi_on_error(plan: Plan, count: int) -> Plan:
    """check_all's `on_error="open"` answer is a MultiDecision of `count` error decisions."""
    result = yield from plan
    if isinstance(result, Decision):  # the error decision
        return MultiDecision(True, 0, 0, 0, 0, 0, "error", False, [result] * count)
    return result


def _plain_client(client: Any) -> bool:
    """A `redis.Redis` whose commands the limiter may send on its pool's connections itself:
    not a cluster client, not a single-connection client, not one whose `execute_command` is
    its own (a subclass that counts or wraps calls keeps them)."""
    return (
        isinstance(client, redis.Redis)
        and type(client).execute_command is redis.Redis.execute_command
        and getattr(client, "connection", None) is None
        and hasattr(client, "connection_pool")
    )


def _call_timeout(timeout: object, client_timeout: Optional[float]) -> float:
    """A limiter's `timeout` (s): as given, else the client's `socket_timeout`, else
    `DEFAULT_TIMEOUT`; a positive number of seconds."""
    if timeout is None:
        timeout = client_timeout if client_timeout is not None else DEFAULT_TIMEOUT
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
    if not 0 < timeout < float("inf"):
        raise ValueError(f"timeout must be a positive, finite number of seconds, not {timeout!r}")
    return float(timeout)


def _client_timeouts(client: Any) -> Tuple[Optional[float], Optional[float]]:
    """(socket_timeout, socket_connect_timeout) of a redis-py client's connections (a connect
    timeout not set is the socket_timeout, as redis-py's connections take it)."""
    kwargs: Dict[str, Any] = {}
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        kwargs = pool.connection_kwargs
    elif getattr(client, "nodes_manager", None) is not None:  # a cluster
        kwargs = client.nodes_manager.connection_kwargs
    read = kwargs.get("socket_timeout")
    connect = kwargs.get("socket_connect_timeout")
    return read, read if connect is None else connect


def _within(client: Any, timeout: float) -> bool:
    """Whether `client`'s own timeouts bound each connect and each reply within `timeout`."""
    read, connect = _client_timeouts(client)
    return read is not None and connect is not None and read <= timeout and connect <= timeout


def _bounded_sender(client: Any, timeout: float) -> Tuple[Any, Any, Any]:
    """(the client the limiter sends on, the pool of the limiter's own or None, the pool whose
    connections the limiter sends on itself or None: execute_command).

    A plain `redis.Redis` without retries whose timeouts keep within `timeout` (what `from_url`
    makes): its own pool. Another plain `redis.Redis` (no socket_timeout, a longer one, retries:
    `redis.Redis.from_url(url)`'s defaults): a pool of the limiter's own with the client's
    connection settings (address, credentials, TLS, protocol, decoding), `timeout` for the
    connect and each reply, and no retries, so that a stalled Redis costs a call `timeout`
    while the client's other commands keep their configuration. Any other client (a cluster, a
    single-connection client, one with its own `execute_command` or connection pool) is sent
    through as it is: its timeouts bound the call (said once if they do not)."""
    if _plain_client(client):
        pool = client.connection_pool
        retry = pool.connection_kwargs.get("retry")
        if _within(client, timeout) and (retry is None or getattr(retry, "_retries", 1) == 0):
            return client, None, pool
        if type(pool) in (redis.ConnectionPool, redis.BlockingConnectionPool):
            kwargs = dict(pool.connection_kwargs)
            kwargs.update(socket_timeout=timeout, socket_connect_timeout=timeout, retry=_no_retry())
            kwargs.pop("retry_on_timeout", None)
            own = redis.ConnectionPool(
                connection_class=pool.connection_class, max_connections=pool.max_connections, **kwargs
            )
            return redis.Redis(connection_pool=own), own, own
    if not _within(client, timeout):
        log.warning(
            "redis_ratelimit: %s sends the limiter's commands itself and its socket_timeout (or "
            "socket_connect_timeout) is not set or above the limiter's timeout (%.3g s): a "
            "stalled Redis makes a call wait that long; give the client socket_timeout=%.3g",
            type(client).__name__,
            timeout,
            timeout,
        )
    return client, None, None


def _connection_getter(pool: Any) -> Callable[[], Any]:
    """`pool.get_connection`: redis-py 5 takes a command's name, 6+ warns if given one."""
    import inspect

    parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
    if parameter is not None and parameter.default is inspect.Parameter.empty:
        return lambda: pool.get_connection("RATELIMIT.CHECK")
    getter: Callable[[], Any] = pool.get_connection
    return getter


def _encoding(pool: Any) -> Tuple[str, str]:
    """How a pool's connections encode a str argument (redis-py's `Encoder`)."""
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    return kwargs.get("encoding", "utf-8"), kwargs.get("encoding_errors", "strict")


def _command_info(client: Any, name: str) -> Tuple[Tuple[str, ...], Dict[str, Any]]:
    """`COMMAND INFO name` for `client.execute_command`, its reply raw: the command's words as
    its first argument (redis-py sends them as two words; no reply callback has that name, so
    `[nil]` for a command the server lacks is read as it is); a cluster asks any node."""
    if isinstance(client, (redis.RedisCluster, redis.asyncio.RedisCluster)):
        return ("COMMAND INFO", name), {"target_nodes": client.RANDOM}
    return ("COMMAND INFO", name), {}


def _direct_async(client: Any) -> Any:
    """`_direct` for a `redis.asyncio` client: (pool, get_connection), or () where the limiter
    goes through execute_command (a cluster, a single-connection or a wrapped client, retries)."""
    if not (
        isinstance(client, redis.asyncio.Redis)
        and type(client).execute_command is redis.asyncio.Redis.execute_command
        and not getattr(client, "single_connection_client", True)
        and hasattr(client, "connection_pool")
    ):
        return ()
    retry = (
        client.get_retry() if hasattr(client, "get_retry") else client.connection_pool.connection_kwargs.get("retry")
    )
    if retry is not None and getattr(retry, "_retries", 1) != 0:
        return ()
    pool = client.connection_pool
    return pool, _connection_getter(pool)


def _no_retry(asyncio: bool = False) -> Any:
    """No retry of a failed call: the breaker, not the client, decides what follows a failure."""
    from redis.backoff import NoBackoff

    if asyncio:
        from redis.asyncio.retry import Retry as AsyncRetry

        return AsyncRetry(NoBackoff(), 0)
    from redis.retry import Retry

    return Retry(NoBackoff(), 0)


__all__: List[str] = ["AsyncPolicies", "AsyncRateLimiter", "Policies", "RateLimiter"]
