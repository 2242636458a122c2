"""`on_error="local"`: with Redis unreachable the limiter decides in process with the same
algorithm and parameters (`source="fallback"`), answering what the module answers (a twin key on
a live module server, the same `AT`s), scaled by `local_share`, through policies' cached
definitions or fallbacks, all or nothing for check_all; leases and policies without a
definition fail open; and the limiter goes back to Redis when the breaker's probe finds it."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
import redis
import redis.asyncio

from conftest import spawn_server
from redis_ratelimit import ALGORITHMS, AsyncRateLimiter, Limit, Policy, RateLimiter

T0 = (int(time.time()) // 86_400 + 2) * 86_400_000


@pytest.fixture
def dead_url():
    """The URL of a server that was started and killed: connections are refused."""
    server = spawn_server(False)
    url = server.url
    server.kill()
    return url


def raw(reply):
    return tuple(int(v) for v in reply)


def fields(d):
    return (int(d.allowed), d.limit, d.remaining, d.retry_after_ms, d.reset_after_ms, d.delay_ms)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_fallback_answers_what_the_module_answers(module_server, dead_url, algorithm):
    rng = random.Random(algorithm)
    twin = module_server.client()
    rl = RateLimiter.from_url(dead_url, timeout=0.2, on_error="local", breaker_failures=1, breaker_cooldown=3600)
    for seed in range(8):
        burst = rng.randint(1, 6) if algorithm in ("token-bucket", "leaky-bucket", "gcra") else None
        limit = Limit(algorithm, rng.randint(1, 5), rng.choice([100, 1000, 2500]), burst=burst,
                      block=rng.choice([None, "300ms"]))
        key = f"fallback:{algorithm}:{seed}"
        now = T0 + rng.randint(0, 5000)
        for step in range(40):
            now += rng.choice([0, 1, 30, 120, 700])
            op = rng.choice(["check", "check", "peek", "refund", "take"])
            cost = rng.randint(1 if op == "take" else 0, 4)
            got = getattr(rl, op)(key, limit, cost, at=now)
            assert got.source == "fallback", got
            verb = op.upper()
            amount = "MAX" if op == "take" else "COST"
            want = raw(twin.execute_command(f"RATELIMIT.{verb}", key, *limit.args(), amount, cost, "AT", now))
            first = got.granted if op == "take" else int(got.allowed)
            assert (first,) + fields(got)[1:] == want, f"{algorithm} seed {seed} step {step}: {op} {cost} at {now}"
            if op in ("check", "peek"):
                assert got.granted == (cost if got.allowed else 0)
    assert rl.stats["fallback"] == 8 * 40 and rl.stats.get("commands", 0) == 1  # the breaker opened at once
    twin.close()


def test_local_share_policies_leases_and_check_all(dead_url, module_server):
    rl = RateLimiter.from_url(dead_url, timeout=0.2, on_error="local", local_share=0.25, breaker_failures=1,
                              breaker_cooldown=3600)
    limit = Limit("token-bucket", 10, "1s", burst=7)  # scaled: floor(2.5) = 2 a second, burst floor(1.75) = 1
    d = rl.check("share", limit, at=T0)
    assert (d.source, d.limit, d.remaining) == ("fallback", 1, 0)
    assert not rl.check("share", limit, at=T0).allowed
    assert rl.check("share", limit, at=T0 + 500).allowed  # 2 a second: one every 500 ms
    tiny = Limit("fixed-window", 3, "1s")  # floor(0.75) = 0: at least 1
    assert rl.check("tiny", tiny, at=T0).limit == 1
    # A policy with neither a cached definition nor a fallback: open.
    d = rl.check("p", Policy("unknown-here"), at=T0)
    assert (d.source, d.allowed, d.granted) == ("error", True, 1)
    # ... with a fallback: decided with it (scaled).
    d = rl.check("p", Policy("unknown-here", fallback=Limit("fixed-window", 8, "1s")), at=T0)
    assert (d.source, d.limit) == ("fallback", 2)
    # Leases are not decided in process: open.
    assert rl.acquire("lease", 2, "1s", id="a").source == "error"
    # check_all: all or nothing.
    pairs = [("{u}:a", Limit("fixed-window", 4, "1s")), ("{u}:b", Limit("fixed-window", 8, "1s"))]
    assert rl.check_all(pairs, at=T0).allowed  # limits 1 and 2
    refused = rl.check_all(pairs, at=T0 + 1)
    assert not refused.allowed and refused.source == "fallback"
    assert [d.allowed for d in refused.limits] == [False, True]
    assert rl.check_all(pairs, at=T0 + 1000).allowed
    assert rl.check_all(pairs[1:], at=T0 + 1000).allowed  # b was not taken by the refused call
    assert not rl.check_all(pairs[1:], at=T0 + 1000).allowed


def test_a_policys_cached_definition_is_used(module_server):
    server = spawn_server(True)
    try:
        rl = RateLimiter.from_url(server.url, timeout=0.2, on_error="local", breaker_failures=1, breaker_cooldown=3600)
        rl.policies.set("cached", Limit("fixed-window", 2, "1s"))
        assert rl.check("c", Policy("cached"), at=T0).source == "module"  # reads the definition
        server.kill()
        d = rl.check("c", Policy("cached"), at=T0)
        assert (d.source, d.limit, d.remaining) == ("fallback", 2, 1)  # the local state starts fresh
        assert rl.check("c", Policy("cached"), at=T0).allowed
        assert not rl.check("c", Policy("cached"), at=T0).allowed
    finally:
        server.kill()


def test_back_to_redis_when_the_probe_finds_it(module_server):
    server = spawn_server(True)
    try:
        now = [0.0]
        client = redis.Redis(port=server.port, socket_timeout=0.2, retry=None)
        rl = RateLimiter(client, on_error="local", breaker_failures=1, breaker_cooldown=5)
        rl._core.breaker.clock = lambda: now[0]
        limit = Limit("sliding-window", 3, "1s")
        assert rl.check("back", limit, at=T0).source == "module"
        server.stop()
        assert rl.check("back", limit, at=T0 + 1).source == "fallback"  # one timeout, breaker open
        assert rl.check("back", limit, at=T0 + 2).source == "fallback"  # at once
        server.resume()
        assert rl.check("back", limit, at=T0 + 3).source == "fallback"  # still cooling down
        now[0] = 5.0
        d = rl.check("back:2", limit, at=T0 + 4)
        assert d.source == "module" and d.remaining == 2
        assert rl.check("back:2", limit, at=T0 + 5).source == "module"
    finally:
        server.kill()


def test_the_async_limiter_falls_back_too(dead_url):
    async def main():
        arl = AsyncRateLimiter(redis.asyncio.Redis.from_url(dead_url), timeout=0.2, on_error="local")
        d = await arl.take("a", Limit("gcra", 3, "1s"), 5, at=T0)
        assert (d.source, d.granted) == ("fallback", 3)
        d = await arl.check("a", Limit("gcra", 3, "1s"), at=T0)
        assert (d.source, d.allowed, d.retry_after_ms) == ("fallback", False, 334)
        await arl.aclose()

    asyncio.run(main())
