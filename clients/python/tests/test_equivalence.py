"""Every decision the package returns equals the raw reply of `RATELIMIT.*` (module) or
`FCALL ratelimit_*` (library) on a twin key, over random sequences of all six algorithms (check,
peek, refund, check_all, reset, and acquire/release on a concurrency key beside them), under
RESP2 and RESP3, sync and async. Both sides are sent at the same explicit times: the test's
client appends `AT <t>` to the package's commands (the package never sends AT itself)."""

from __future__ import annotations

import asyncio
import random

import pytest
import redis
import redis.asyncio

from redis_ratelimit import ALGORITHMS, AsyncRateLimiter, Limit, RateLimiter

FIELDS = ("allowed", "limit", "remaining", "retry_after_ms", "reset_after_ms", "delay_ms")
TIMED = ("RATELIMIT.CHECK", "RATELIMIT.PEEK", "RATELIMIT.REFUND", "RATELIMIT.CHECKALL", "RATELIMIT.ACQUIRE",
         "RATELIMIT.RELEASE", "RATELIMIT.TAKE")
T0 = 1_796_006_883_715


class Clocked:
    """Appends `AT clock.now` to the package's decision commands."""

    now = T0

    def _timed(self, args):
        name = str(args[0]).upper()
        if name in TIMED or (name in ("FCALL", "FCALL_RO") and str(args[1]) != "ratelimit_reset"):
            return (*args, "AT", str(Clocked.now))
        return args


class SyncClocked(Clocked, redis.Redis):
    def execute_command(self, *args, **options):
        return super().execute_command(*self._timed(args), **options)


class AsyncClocked(Clocked, redis.asyncio.Redis):
    async def execute_command(self, *args, **options):
        return await super().execute_command(*self._timed(args), **options)


def raw(reply):
    """The six fields from a raw reply, whatever its shape (the test's own reading; TAKE's
    RESP3 map names its first field `granted`)."""
    if isinstance(reply, dict):
        named = {(k.decode() if isinstance(k, bytes) else k): v for k, v in reply.items()}
        reply = [named["granted" if f == "allowed" and "granted" in named else f] for f in FIELDS]
    return tuple(int(v) for v in reply[:6])


def fields(decision):
    return (int(decision.allowed), decision.limit, decision.remaining, decision.retry_after_ms,
            decision.reset_after_ms, decision.delay_ms)


def random_limit(rng: random.Random, algorithm: str) -> Limit:
    burst = rng.choice([None, rng.randint(1, 8)]) if algorithm in ("token-bucket", "leaky-bucket", "gcra") else None
    block = rng.choice([None, None, "300ms"])
    return Limit(algorithm, rng.randint(1, 6), rng.choice(["100ms", "1s", 250, "2s"]), burst=burst, block=block)


def plan(seed: int, algorithm: str):
    """(time, operation, cost, limit) steps: check, peek, refund, take, check_all, reset."""
    rng = random.Random(seed)
    limit = random_limit(rng, algorithm)
    other = random_limit(rng, rng.choice(ALGORITHMS))
    steps, now = [], T0
    for _ in range(25):
        now += rng.choice([0, 1, 7, 40, 150, 600])
        op = rng.choices(["check", "peek", "refund", "take", "check_all", "reset", "acquire", "release"],
                         [6, 2, 2, 3, 2, 1, 2, 1])[0]
        cost = rng.randint(0, 4) if op != "refund" else rng.randint(0, 3)
        if op == "take":
            cost = rng.randint(1, 9)  # MAX
        if op in ("acquire", "release"):  # a lease: (id, cost) on a concurrency limit of 3, 500 ms
            cost = (f"id{rng.randint(1, 3)}", rng.randint(1, 2))
        steps.append((now, op, cost, limit, other))
    return steps


def twin_raw(client, engine, op, keys, cost, limit, other):
    """The raw command on the twin keys, at Clocked.now."""
    at = ["AT", str(Clocked.now)]
    spec = limit.args()
    if op in ("acquire", "release"):
        lease_id, n = cost
        args = [3, "500ms", "ID", lease_id, "COST", n] if op == "acquire" else ["ID", lease_id]
        if engine == "module":
            return client.execute_command(f"RATELIMIT.{op.upper()}", keys[2], *args, *at)
        return client.fcall(f"ratelimit_{op}", 1, keys[2], *args, *at)
    if engine == "module":
        if op == "check_all":
            return client.execute_command("RATELIMIT.CHECKALL", 2, *keys[:2], *spec, *other.args(), "COST", cost, *at)
        if op == "reset":
            return client.execute_command("RATELIMIT.RESET", keys[0])
        if op == "take":
            return client.execute_command("RATELIMIT.TAKE", keys[0], *spec, "MAX", cost, *at)
        return client.execute_command(f"RATELIMIT.{op.upper()}", keys[0], *spec, "COST", cost, *at)
    if op == "take":
        return client.fcall("ratelimit_take", 1, keys[0], *spec, "MAX", cost, *at)
    if op == "check_all":
        return client.fcall("ratelimit_checkall", 2, *keys[:2], *spec, *other.args(), "COST", cost, *at)
    if op == "reset":
        return client.fcall("ratelimit_reset", 1, keys[0])
    return client.fcall(f"ratelimit_{op}", 1, keys[0], *spec, "COST", cost, *at)


def expected_multi(reply):
    if isinstance(reply, dict):
        limits = reply.get(b"limits", reply.get("limits"))
        return raw(reply), [raw(r) for r in limits]
    return raw(reply[0]), [raw(r) for r in reply[1:]]


async def run_sequence(server, engine, protocol, mode, algorithm, seed):
    prefix = "fn:" if engine == "library" else ""
    keys = [f"{{s{seed}{algorithm}{protocol}{mode}}}:{k}" for k in ("a", "b", "lease")]
    twins = [f"{{s{seed}{algorithm}{protocol}{mode}}}:t{k}" for k in ("a", "b", "lease")]
    twins = [prefix + t for t in twins]  # the library's twin keys live under its prefix too
    plain = server.client(protocol)
    if mode == "sync":
        limiter = RateLimiter(SyncClocked(port=server.port, protocol=protocol, socket_timeout=10), engine=engine)
    else:
        limiter = AsyncRateLimiter(AsyncClocked(port=server.port, protocol=protocol, socket_timeout=10), engine=engine)
    if engine == "library":
        plain.function_load(open(_library()).read(), replace=True)
    try:
        for now, op, cost, limit, other in plan(seed, algorithm):
            Clocked.now = now
            if op == "acquire":
                got = limiter.acquire(keys[2], 3, "500ms", id=cost[0], cost=cost[1])
            elif op == "release":
                got = limiter.release(keys[2], cost[0])
            elif op == "reset":
                got = limiter.reset(keys[0])
            elif op == "check_all":
                got = limiter.check_all([(keys[0], limit), (keys[1], other)], cost=cost)
            else:
                got = getattr(limiter, op)(keys[0], limit, cost)
            if mode == "async":
                got = await got
            want = twin_raw(plain, engine, op, twins, cost, limit, other)
            where = f"{engine} RESP{protocol} {mode} {algorithm} seed {seed}: {op} cost {cost} at {now}"
            if op in ("reset", "release"):
                assert got == want, where
            elif op == "acquire":
                assert fields(got) == raw(want) and got.period_ms == 500, where
            elif op == "check_all":
                overall, each = expected_multi(want)
                assert fields(got) == overall, where
                assert [fields(d) for d in got.limits] == each, where
                assert got.source == engine
            elif op == "take":
                assert (got.granted,) + fields(got)[1:] == raw(want), where
                assert got.allowed == (got.granted > 0) and got.source == engine, where
            else:
                assert fields(got) == raw(want), where
                assert got.source == engine and got.period_ms == limit.period_ms, where
                assert got.granted == (cost if got.allowed else 0), where
    finally:
        plain.close()
        if mode == "async":
            await limiter.aclose()
        else:
            limiter.close()


def _library():
    from conftest import LIBRARY

    return LIBRARY


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_decisions_equal_the_raw_replies_on_twin_keys(server, mode, protocol, algorithm):
    engine = "library" if server.proc.args.count("--loadmodule") == 0 else "module"
    for seed in range(2):
        asyncio.run(run_sequence(server, engine, protocol, mode, algorithm, seed))
