"""The limiters' path without a plan (`AsyncRateLimiter`: one coroutine) (an inline limit on the module, a client whose own
timeouts bound each call, as `from_url` makes): the same answers, timeouts, breaker, `on_error`
and error replies as the plan runner's. Each test first checks that the path is the one taken
(no plan runs); a stall is a SIGSTOPped server, timings are asserted loosely."""

from __future__ import annotations

import asyncio

import pytest
import redis

from conftest import spawn_server
from redis_ratelimit import AsyncRateLimiter, Limit, RateLimitUnavailable, RateLimiter

# Nothing refills or expires while a test runs (a token bucket of 100 a second would refill
# between two calls on a loaded machine): remaining is exact from call to call.
LIMIT = Limit("sliding-log", 100, "1h")


@pytest.fixture
def own_server():
    server = spawn_server(True)
    yield server
    server.kill()  # SIGCONT first if stopped, always


def planless(limiter) -> list:
    """Counts the plans `limiter` runs from now on (the fast path runs none)."""
    plans: list = []
    execute = limiter._execute

    def counted(plan, *rest):
        plans.append(plan)
        return execute(plan, *rest)

    limiter._execute = counted  # type: ignore[method-assign]
    return plans


def test_the_fast_path_answers_as_the_plans_do(own_server):
    async def main():
        arl = AsyncRateLimiter.from_url(own_server.url, timeout=2)
        first = await arl.check("fast:k", LIMIT, 3)  # finds the engine (a plan)
        assert first.source == "module" and first.remaining == 97
        plans = planless(arl)
        d = await arl.check("fast:k", LIMIT, 4, at=None)
        assert (d.allowed, d.remaining, d.granted, d.source) == (True, 93, 4, "module")
        assert (await arl.peek("fast:k", LIMIT, 0)).remaining == 93
        assert (await arl.refund("fast:k", LIMIT, 4)).remaining == 97
        taken = await arl.take("fast:k", LIMIT, 200)
        assert (taken.allowed, taken.granted, taken.remaining) == (True, 97, 0)
        assert not (await arl.check("fast:k", LIMIT)).allowed
        assert plans == []
        assert arl.stats == {"commands": 6, "module": 6}
        with pytest.raises(ValueError, match="cost"):
            await arl.check("fast:k", LIMIT, -1)
        with pytest.raises(TypeError, match="key"):
            await arl.check(b"fast:k", LIMIT)  # type: ignore[arg-type]
        # An error reply is the caller's: raised as it is, and Redis answered (breaker closed).
        await arl.client.set("fast:string", "x")
        with pytest.raises(redis.ResponseError):
            await arl.check("fast:string", Limit("fixed-window", 5, "1s"))
        assert arl._core.breaker.failures == 0
        assert plans == []
        await arl.aclose()

    asyncio.run(main())


def test_a_stall_costs_one_timeout_per_call_then_the_breaker_answers(own_server):
    async def main():
        arl = AsyncRateLimiter.from_url(own_server.url, timeout=0.2, breaker_failures=3, breaker_cooldown=60)
        closed = AsyncRateLimiter.from_url(own_server.url, timeout=0.2, on_error="closed", breaker_failures=0)
        for limiter in (arl, closed):
            assert (await limiter.check("fast:k", LIMIT)).source == "module"
        plans, closed_plans = planless(arl), planless(closed)
        own_server.stop()
        loop = asyncio.get_running_loop()
        started = loop.time()
        slow = [await arl.check("fast:k", LIMIT) for _ in range(3)]
        assert all(d.allowed and d.source == "error" for d in slow)
        assert 0.3 <= loop.time() - started < 5  # about 3 x 0.2 s
        assert arl._core.breaker.is_open and arl.stats["commands"] == 4
        started = loop.time()
        fast = await asyncio.gather(*(arl.check("fast:k", LIMIT) for _ in range(100)))
        assert all(d.source == "error" for d in fast)
        assert arl.stats["commands"] == 4, "the open breaker sends nothing"
        assert arl.stats["error"] == 103
        assert loop.time() - started < 2
        with pytest.raises(RateLimitUnavailable) as raised:
            await closed.check("fast:k", LIMIT)
        assert isinstance(raised.value.__cause__, redis.TimeoutError)
        assert plans == [] and closed_plans == []
        own_server.resume()
        await arl.aclose()
        await closed.aclose()

    asyncio.run(main())


def test_a_cancelled_probe_lets_the_next_call_probe(own_server):
    async def main():
        now = [0.0]
        arl = AsyncRateLimiter.from_url(own_server.url, timeout=0.5, breaker_failures=1, breaker_cooldown=5)
        arl._core.breaker.clock = lambda: now[0]
        assert (await arl.check("fast:k", LIMIT)).source == "module"
        plans = planless(arl)
        own_server.stop()
        assert (await arl.check("fast:k", LIMIT)).source == "error"  # opens the breaker
        now[0] = 5.0
        probe = asyncio.ensure_future(arl.check("fast:k", LIMIT))
        await asyncio.sleep(0.05)
        assert arl._core.breaker.probing
        probe.cancel()
        with pytest.raises(asyncio.CancelledError):
            await probe
        assert not arl._core.breaker.probing  # abandoned: not a failure, not a stuck probe
        own_server.resume()
        assert (await arl.check("fast:k", LIMIT)).source == "module"  # the next call probes
        assert not arl._core.breaker.is_open
        assert plans == []
        await arl.aclose()

    asyncio.run(main())


def test_the_sync_fast_path_answers_times_out_and_breaks_as_the_plans_do(own_server):
    rl = RateLimiter.from_url(own_server.url, timeout=0.2, breaker_failures=3, breaker_cooldown=60)
    assert rl.check("fast:s", LIMIT, 3).source == "module"  # finds the engine (a plan)
    plans = planless(rl)
    d = rl.check("fast:s", LIMIT, 4)
    assert (d.allowed, d.remaining, d.granted, d.source) == (True, 93, 4, "module")
    assert rl.peek("fast:s", LIMIT, 0).remaining == 93
    assert rl.refund("fast:s", LIMIT, 4).remaining == 97
    assert rl.take("fast:s", LIMIT, 200).granted == 97
    with pytest.raises(ValueError, match="cost"):
        rl.check("fast:s", LIMIT, -1)
    rl.client.set("fast:string", "x")
    with pytest.raises(redis.ResponseError):
        rl.check("fast:string", Limit("fixed-window", 5, "1s"))
    assert rl._core.breaker.failures == 0 and rl.stats["commands"] == 6
    own_server.stop()
    assert all(rl.check("fast:s", LIMIT).source == "error" for _ in range(3))
    assert rl._core.breaker.is_open and rl.stats["commands"] == 9
    assert all(rl.check("fast:s", LIMIT).source == "error" for _ in range(50))
    assert rl.stats["commands"] == 9, "the open breaker sends nothing"
    assert plans == []
    own_server.resume()
    rl.close()
