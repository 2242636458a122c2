"""`take` (RATELIMIT.TAKE / ratelimit_take), `Decision.granted`, the `at=` of every decision
call, and the options' validation. The random sequences against the raw replies are in
test_equivalence.py; here: policies (shadow ones included), the worked example, errors."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio

from redis_ratelimit import AsyncRateLimiter, Limit, Policy, RateLimiter

#: A whole second a day ahead of the server's clock: keys written AT then do not expire meanwhile.
T0 = (int(time.time()) + 86_400) * 1000


def test_take_grants_what_is_left_as_the_docs_show(server, key):
    rl = RateLimiter(server.client())
    limit = Limit("fixed-window", 5, "1s")
    first = rl.take(key, limit, 3, at=T0 + 100)
    assert (first.allowed, first.granted, first.remaining, first.reset_after_ms) == (True, 3, 2, 900)
    second = rl.take(key, limit, 3, at=T0 + 200)
    assert (second.granted, second.remaining) == (2, 0)
    third = rl.take(key, limit, 3, at=T0 + 300)
    assert (third.allowed, third.granted, third.retry_after_ms) == (False, 0, 700)
    assert third.source == ("module" if "--loadmodule" in server.proc.args else "library")
    # granted of the other calls: the cost when allowed, else 0
    assert rl.check(key, limit, 2, at=T0 + 1000).granted == 2
    assert rl.check(key, limit, 4, at=T0 + 1001).granted == 0
    assert rl.peek(key, limit, 3, at=T0 + 1002).granted == 3
    rl.close()


def test_take_through_policies_enforced_and_shadow(module_server, key):
    rl = RateLimiter(module_server.client(protocol=3))
    rl.policies.set("take-enforced", Limit("token-bucket", 4, "1s"))
    rl.policies.set("take-shadow", Limit("token-bucket", 4, "1s"), shadow=True)
    d = rl.take(key + ":e", Policy("take-enforced"), 10, at=T0)
    assert (d.granted, d.remaining, d.shadow_rejected, d.period_ms) == (4, 0, False, 1000)
    s = rl.take(key + ":s", Policy("take-shadow"), 10, at=T0)
    assert (s.granted, s.allowed, s.shadow_rejected) == (10, True, True)
    s = rl.take(key + ":s", Policy("take-shadow"), 1, at=T0)
    assert (s.granted, s.shadow_rejected) == (1, True)  # enforcement took the 4: nothing left
    rl.close()


def test_the_async_limiter_takes_too(server, key):
    async def main():
        arl = AsyncRateLimiter(redis.asyncio.Redis(port=server.port, protocol=3, socket_timeout=10))
        d = await arl.take(key, Limit("gcra", 2, "1s"), 5, at=T0)
        assert (d.granted, d.allowed) == (2, True)
        d = await arl.take(key, Limit("gcra", 2, "1s"), 5, at=T0 + 499)
        assert (d.granted, d.retry_after_ms) == (0, 1)
        await arl.aclose()

    asyncio.run(main())


def test_bad_values_are_typed_errors_naming_them(module_server, key):
    rl = RateLimiter(module_server.client())
    limit = Limit("token-bucket", 1, "1s")
    with pytest.raises(ValueError, match="max must be an integer from 1"):
        rl.take(key, limit, 0)
    with pytest.raises(TypeError, match="max must be an int"):
        rl.take(key, limit, 1.5)
    with pytest.raises(ValueError, match="max must be an integer from 1 to"):
        rl.take(key, limit, 10**12 + 1)
    with pytest.raises(TypeError, match="at must be an int"):
        rl.check(key, limit, at=1.5)
    with pytest.raises(ValueError, match="at must be from 0"):
        rl.check(key, limit, at=2**53)
    with pytest.raises(TypeError, match="denial_cache must be an int"):
        RateLimiter(module_server.client(), denial_cache="100")
    with pytest.raises(ValueError, match="denial_cache must be 0"):
        RateLimiter(module_server.client(), denial_cache=-1)
    with pytest.raises(ValueError, match="local_share must be above 0 and at most 1, not 0"):
        RateLimiter(module_server.client(), local_share=0)
    with pytest.raises(ValueError, match="local_share must be above 0 and at most 1, not 1.5"):
        RateLimiter(module_server.client(), local_share=1.5)
    with pytest.raises(ValueError, match="on_error must be 'open', 'closed' or 'local', not 'near'"):
        RateLimiter(module_server.client(), on_error="near")
    with pytest.raises(ValueError, match="batch must be"):
        Limit("token-bucket", 1, "1s", batch="soon")
    with pytest.raises(ValueError, match="batch_max=5 needs batch"):
        Limit("token-bucket", 1, "1s", batch_max=5)
    with pytest.raises(ValueError, match="batch_max must be an integer from 1"):
        Limit("token-bucket", 1, "1s", batch="50ms", batch_max=0)
    assert Limit("token-bucket", 7, "1s", batch="50ms").batch_limit == 7
    assert Limit("token-bucket", 7, "1s", batch="50ms").args() == ["token-bucket", "7", "1s"]
    rl.close()
