"""Rate limiting for FastAPI (any Starlette app) with redis-ratelimit: the part to lift as is.

- `RateLimiter` decides requests: `RATELIMIT.CHECK <key> POLICY <name>` with the module, or, on a
  server without it (`unknown command`), the Functions library's `FCALL ratelimit_check` with the
  inline limit of the config (the library has no policies). It defines the policy when it is
  missing, follows its definition (shadow mode, period) and fails open or closed when Redis is
  unreachable.
- `RateLimitMiddleware` limits requests per `X-API-Key`: 401 without one (not counted), 429 with
  `Retry-After` when rejected, and the IETF draft's `RateLimit-Policy` / `RateLimit` on every
  limited answer, derived from the reply as the README derives them (`http_answer`); a request
  the route fails with a 5xx gets its cost back (`RATELIMIT.REFUND`).
- `RateLimiter.lease()` holds a concurrency lease (`RATELIMIT.ACQUIRE` / `RATELIMIT.RELEASE`)
  for the duration of a block.
"""

import logging
import time
import uuid
from contextlib import asynccontextmanager

import redis
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import JSONResponse

log = logging.getLogger("ratelimit")

FIELDS = ("allowed", "limit", "remaining", "retry_after_ms", "reset_after_ms", "delay_ms")
UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# How often the policy's definition is read again: a POLICY SET rolls out without a deploy.
POLICY_REFRESH_S = 10
# Errors that mean "Redis is not there", as opposed to an error reply.
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, OSError)


def decision(reply):
    """A decision as a dict of six integers, from whatever the engine and protocol answered: the
    module under RESP3 (a map, allowed a bool), RESP2 or the library (six integers)."""
    if isinstance(reply, dict):
        named = {(k.decode() if isinstance(k, bytes) else k): v for k, v in reply.items()}
        reply = [named[field] for field in FIELDS]
    return dict(zip(FIELDS, map(int, reply)))


def ceil_s(ms):
    return -(-ms // 1000)


def http_answer(d, period_s, policy="default"):
    """The HTTP status and rate-limit headers for one decision (d: what `decision` returns)."""
    headers = {"RateLimit-Policy": f'"{policy}";q={d["limit"]};w={period_s}'}
    if d["allowed"]:
        headers["RateLimit"] = f'"{policy}";r={d["remaining"]};t={ceil_s(d["reset_after_ms"])}'
        return 200, headers
    if d["retry_after_ms"] >= 0:  # -1: this cost can never pass; send no Retry-After
        headers["Retry-After"] = str(ceil_s(d["retry_after_ms"]))
        headers["RateLimit"] = f'"{policy}";r={d["remaining"]};t={ceil_s(d["retry_after_ms"])}'
    return 429, headers


def period_ms(text):
    """A period in the module's syntax (`250ms`, `10s`, `1m`, or bare ms) in ms."""
    text = str(text).strip().lower()
    for unit in ("ms", "s", "m", "h", "d"):  # "ms" before "s" and "m"
        if text.endswith(unit) and text[: -len(unit)].isdigit():
            return int(text[: -len(unit)]) * UNITS_MS[unit]
    return int(text)


def pairs(reply):
    """A field/value reply (a flat list under RESP2, a map under RESP3) as a dict of str keys."""
    if isinstance(reply, (list, tuple)):
        reply = dict(zip(reply[::2], reply[1::2]))
    text = lambda v: v.decode() if isinstance(v, bytes) else v  # noqa: E731
    return {text(k): text(v) for k, v in reply.items()}


class Unavailable(Exception):
    """Redis cannot be reached and the limiter fails closed."""


class RateLimiter:
    """One named limit, decided by the module through its policy, or by the Functions library
    with the same limit inline.

    client: a `redis.asyncio.Redis`; policy: the policy's name; limit: its definition as the
    module's words (`["sliding-window", "5", "10s"]`), used to define it when it is missing and
    inline by the library; fail_open: what to do when Redis is unreachable; library: the text of
    lua-reference/functions/ratelimit.lua, loaded when the library is needed and not there.
    """

    def __init__(self, client, policy, limit, *, fail_open=True, library=None, leases=None):
        self.client = client
        self.policy = policy
        self.limit = [str(word) for word in limit]
        self.fail_open = fail_open
        self.library = library
        # Concurrency leases: {"limit": n, "lease": "30s"}, or None.
        self.leases = leases
        self.engine = None  # "module" or "functions", once Redis has answered
        self.mode = "enforce"
        self.period_s = ceil_s(period_ms(self.limit[2]))
        self.peek_spec = self.limit  # the policy's definition inline, to PEEK in shadow mode
        self.fetched_at = 0.0

    async def start(self):
        """Finds the engine, defines the policy if it is missing, and logs what it did. Never
        fails on an unreachable Redis: it says so, and tries again at the next request."""
        log.info("ratelimit: when Redis is unreachable, requests fail %s", self.failing())
        try:
            await self._detect()
        except UNREACHABLE as error:
            log.warning("ratelimit: Redis is unreachable (%s): failing %s", error, self.failing())

    def failing(self):
        return "open (admitted, no headers)" if self.fail_open else "closed (503)"

    async def _detect(self):
        try:
            reply = await self.client.execute_command("RATELIMIT.POLICY", "GET", self.policy)
        except redis.ResponseError as error:
            if "unknown command" not in str(error).lower():
                raise
            await self._use_library()
            return
        if reply is None:
            await self.client.execute_command("RATELIMIT.POLICY", "SET", self.policy, *self.limit)
            log.info(
                "ratelimit: policy '%s' did not exist: defined it as %s",
                self.policy,
                " ".join(self.limit),
            )
            reply = await self.client.execute_command("RATELIMIT.POLICY", "GET", self.policy)
        else:
            log.info("ratelimit: using the existing policy '%s'", self.policy)
        self._follow(pairs(reply))
        if self.engine != "module":
            self.engine = "module"
            log.info(
                "ratelimit: engine: the module (RATELIMIT.CHECK key POLICY %s), %s, mode %s",
                self.policy,
                " ".join(self.peek_spec),
                self.mode,
            )

    def _follow(self, definition):
        """Takes the policy's definition as the server has it (POLICY GET's fields)."""
        spec = [definition["algorithm"], str(definition["limit"]), f'{definition["period_ms"]}ms']
        if definition["algorithm"] in ("token-bucket", "leaky-bucket", "gcra"):
            spec += ["BURST", str(definition["burst"])]
        if int(definition.get("block_ms", 0) or 0) > 0:
            spec += ["BLOCK", f'{definition["block_ms"]}ms']
        if definition["mode"] != self.mode:
            log.info("ratelimit: policy '%s' is in %s mode", self.policy, definition["mode"])
        self.mode = definition["mode"]
        self.period_s = ceil_s(int(definition["period_ms"]))
        self.peek_spec = spec
        self.fetched_at = time.monotonic()

    async def _use_library(self):
        loaded = await self.client.execute_command("FUNCTION", "LIST", "LIBRARYNAME", "ratelimit")
        if not loaded:
            if self.library is None:
                raise RuntimeError("the module is not loaded and neither is the ratelimit library")
            try:
                await self.client.execute_command("FUNCTION", "LOAD", self.library)
                log.info("ratelimit: loaded the Functions library 'ratelimit'")
            except redis.ResponseError as error:
                if "already exists" not in str(error):  # another app loaded it meanwhile
                    raise
        self.engine = "functions"
        log.info(
            "ratelimit: the module is not loaded: engine: the Functions library "
            "(FCALL ratelimit_check 1 fn:key %s; no policies, so no shadow mode)",
            " ".join(self.limit),
        )

    async def _ready(self):
        if self.engine is None:
            await self._detect()
        elif self.engine == "module" and time.monotonic() - self.fetched_at > POLICY_REFRESH_S:
            reply = await self.client.execute_command("RATELIMIT.POLICY", "GET", self.policy)
            if reply is None:
                await self._detect()  # deleted meanwhile: define it again
            else:
                self._follow(pairs(reply))

    async def check(self, key, cost=1):
        """The decision for one request of `cost` on `key` (a dict of six integers), or None when
        Redis is unreachable and the limiter fails open (Unavailable when it fails closed)."""
        try:
            await self._ready()
            return await self._check(key, cost)
        except redis.ResponseError as error:
            if "no such policy" not in str(error):
                raise
            await self._detect()  # deleted between two refreshes
            return await self._check(key, cost)
        except UNREACHABLE as error:
            return self._unreachable(error)

    async def _check(self, key, cost):
        if self.engine == "functions":
            reply = await self.client.fcall("ratelimit_check", 1, "fn:" + key, *self.limit, "COST", cost)
            return decision(reply)
        if self.mode != "shadow":
            check = ("RATELIMIT.CHECK", key, "POLICY", self.policy, "COST", cost)
            return decision(await self.client.execute_command(*check))
        # Shadow mode answers a would-be rejection as admitted: what enforcement would answer is
        # a PEEK of the same definition inline, in one transaction with the CHECK.
        pipe = self.client.pipeline(transaction=True)
        pipe.execute_command("RATELIMIT.PEEK", key, *self.peek_spec, "COST", cost)
        pipe.execute_command("RATELIMIT.CHECK", key, "POLICY", self.policy, "COST", cost)
        enforced, answered = map(decision, await pipe.execute())
        if not enforced["allowed"]:
            log.warning(
                "ratelimit: shadow policy '%s' would have rejected %s (retry in %d ms); admitted",
                self.policy,
                key,
                enforced["retry_after_ms"],
            )
        return answered

    async def refund(self, key, cost=1):
        """Gives back `cost` that an admitted request consumed (it was not served); the decision
        right after, or None if Redis is unreachable."""
        try:
            if self.engine == "functions":
                reply = await self.client.fcall("ratelimit_refund", 1, "fn:" + key, *self.limit, "COST", cost)
            else:
                reply = await self.client.execute_command(
                    "RATELIMIT.REFUND", key, "POLICY", self.policy, "COST", cost
                )
            return decision(reply)
        except UNREACHABLE as error:
            log.warning("ratelimit: refund of %s not done: %s", key, error)
            return None

    def _unreachable(self, error):
        log.warning("ratelimit: Redis is unreachable (%s): failing %s", error, self.failing())
        if self.fail_open:
            return None
        raise Unavailable(str(error))

    @asynccontextmanager
    async def lease(self, key, cost=1):
        """Holds a concurrency lease on `key` for the block's duration: yields the ACQUIRE
        decision (look at its `allowed`) and releases the lease when the block ends, however it
        ends. A lease whose holder dies expires by itself after `leases["lease"]`."""
        lease_id = uuid.uuid4().hex
        limit, duration = str(self.leases["limit"]), str(self.leases["lease"])
        try:
            if self.engine == "functions":
                args = ("ratelimit_acquire", 1, "fn:" + key, limit, duration, "ID", lease_id)
                reply = await self.client.fcall(*args, "COST", cost)
            else:
                args = ("RATELIMIT.ACQUIRE", key, limit, duration, "ID", lease_id)
                reply = await self.client.execute_command(*args, "COST", cost)
            acquired = decision(reply)
        except UNREACHABLE as error:
            acquired = self._unreachable(error)
        try:
            yield acquired
        finally:
            if acquired is not None and acquired["allowed"]:
                try:
                    if self.engine == "functions":
                        await self.client.fcall("ratelimit_release", 1, "fn:" + key, "ID", lease_id)
                    else:
                        await self.client.execute_command("RATELIMIT.RELEASE", key, "ID", lease_id)
                except UNREACHABLE as error:  # the lease expires by itself
                    log.warning("ratelimit: release of %s not done: %s", key, error)


class RateLimitMiddleware(BaseHTTPMiddleware):
    """Limits the requests to `paths` per `X-API-Key` (the key `<prefix>:<api key>`), stores
    the decision in `request.state.ratelimit`, answers with the rate-limit headers, and refunds the
    request's cost when the route fails with a 5xx (its headers then show the refund)."""

    def __init__(self, app, limiter, paths, prefix="api"):
        super().__init__(app)
        self.limiter = limiter
        self.paths = set(paths)
        self.prefix = prefix

    async def dispatch(self, request, call_next):
        if request.url.path not in self.paths:
            return await call_next(request)
        api_key = request.headers.get("x-api-key")
        if not api_key:
            return JSONResponse({"error": "missing X-API-Key"}, status_code=401)
        key = f"{self.prefix}:{api_key}"
        try:
            d = await self.limiter.check(key)
        except Unavailable:
            return JSONResponse({"error": "rate limiter unavailable"}, status_code=503)
        request.state.ratelimit_key = key
        request.state.ratelimit = d
        if d is None:  # failing open: no decision, no headers
            return await call_next(request)
        status, headers = http_answer(d, self.limiter.period_s, self.limiter.policy)
        if status == 429:
            body = {"error": "rate limited", "policy": self.limiter.policy}
            body["retry_after_ms"] = d["retry_after_ms"]
            return JSONResponse(body, status_code=429, headers=headers)
        try:
            response = await call_next(request)
        except Unavailable:  # a lease, failing closed
            return JSONResponse({"error": "rate limiter unavailable"}, status_code=503)
        except Exception:  # the route failed: a 500, as Starlette would answer, refunded below
            log.exception("ratelimit: %s %s failed", request.method, request.url.path)
            response = JSONResponse({"error": "internal error"}, status_code=500)
        if response.status_code >= 500:  # not served: its cost goes back
            refunded = await self.limiter.refund(key)
            if refunded is not None:
                headers = http_answer(refunded, self.limiter.period_s, self.limiter.policy)[1]
        response.headers.update(headers)
        return response
