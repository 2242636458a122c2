"""The API against real servers: engines and the library's loading, policies and their
fallbacks, shadow mode, leases, and the caller's mistakes (raised, never swallowed)."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis
import redis.asyncio

from redis_ratelimit import (
    AsyncRateLimiter,
    Decision,
    Limit,
    MultiDecision,
    Policy,
    RateLimited,
    RateLimiter,
)

PER_MINUTE = Limit("sliding-window", 3, "1m")


def engine_of(server) -> str:
    return "module" if "--loadmodule" in server.proc.args else "library"


@pytest.mark.parametrize("protocol", [2, 3])
def test_check_counts_and_refuses_with_typed_decisions(server, key, protocol):
    rl = RateLimiter(server.client(protocol))
    first = rl.check(key, PER_MINUTE)
    assert isinstance(first, Decision) and first.allowed and first.remaining == 2
    assert first.source == engine_of(server) and first.period_ms == 60_000
    assert rl.check(key, PER_MINUTE, cost=2).remaining == 0
    refused = rl.check(key, PER_MINUTE)
    assert not refused.allowed and refused.retry_after_ms > 0 and refused.limit == 3
    assert rl.peek(key, PER_MINUTE, cost=0).remaining == 0
    assert rl.refund(key, PER_MINUTE, 2).remaining == 2
    assert rl.check(key, PER_MINUTE, cost=4).retry_after_ms == -1  # above the limit: never
    assert rl.reset(key) == 1 and rl.reset(key) == 0
    rl.close()


def test_check_all_is_all_or_nothing(server, key):
    rl = RateLimiter(server.client(3))
    keys = [f"{{{key}}}:sec", f"{{{key}}}:hour"]
    pairs = [(keys[0], Limit("token-bucket", 5, "1m")), (keys[1], Limit("fixed-window", 1000, "1h"))]
    first = rl.check_all(pairs, cost=5)
    assert isinstance(first, MultiDecision) and first.allowed
    assert [d.remaining for d in first.limits] == [0, 995]
    second = rl.check_all(pairs, cost=5)
    assert not second.allowed and [d.allowed for d in second.limits] == [False, True]
    assert second.limits[1].remaining == 990  # what would remain: nothing was taken
    assert rl.peek(keys[1], pairs[1][1], cost=0).remaining == 995
    rl.close()


def test_leases_hold_and_release(server, key):
    rl = RateLimiter(server.client(3))
    with rl.lease(key, 1, "30s") as held:
        assert held.allowed and held.period_ms == 30_000
        with pytest.raises(RateLimited) as refused:
            with rl.lease(key, 1, "30s"):
                pass
        assert refused.value.decision.retry_after_ms > 0
    assert rl.acquire(key, 1, "30s", id="job-1").allowed
    assert rl.release(key, "job-1") == 1 and rl.release(key, "job-1") == 0
    rl.close()


def test_async_limiter_has_the_same_methods(server, key):
    async def main():
        arl = AsyncRateLimiter(redis.asyncio.Redis(port=server.port, protocol=3, socket_timeout=10))
        assert (await arl.check(key, PER_MINUTE)).remaining == 2
        multi = await arl.check_all([(f"{{{key}}}a", PER_MINUTE), (f"{{{key}}}b", PER_MINUTE)])
        assert multi.allowed and len(multi.limits) == 2
        async with arl.lease(key + ":l", 1, "5s") as held:
            assert held.allowed
            with pytest.raises(RateLimited):
                async with arl.lease(key + ":l", 1, "5s"):
                    pass
        assert await arl.reset(key) == 1
        assert await arl.detect_engine() == engine_of(server)
        await arl.aclose()

    asyncio.run(main())


def test_callers_mistakes_raise(server, key):
    rl = RateLimiter(server.client(3), on_error="open")
    with pytest.raises(ValueError, match="token-bucket, leaky-bucket, fixed-window, sliding-window, sliding-log, gcra"):
        Limit("token-buckett", 1, "1s")
    with pytest.raises(ValueError, match="period"):
        Limit("gcra", 1, "1 minute")
    with pytest.raises(ValueError, match="burst applies only"):
        Limit("fixed-window", 1, "1s", burst=3)
    with pytest.raises(ValueError, match="cost"):
        rl.check(key, PER_MINUTE, cost=-1)
    with pytest.raises(TypeError):
        rl.check(key, "sliding-window 3 1m")
    prefix = "fn:" if engine_of(server) == "library" else ""
    server.client().set(prefix + key, "a string")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        rl.check(key, PER_MINUTE)
    rl.close()


def test_another_algorithm_on_a_key_is_the_servers_error(server, key):
    rl = RateLimiter(server.client(2))
    rl.check(key, Limit("token-bucket", 5, "1h"))
    with pytest.raises(redis.ResponseError, match="holds a token-bucket limiter"):
        rl.check(key, Limit("fixed-window", 5, "1h"))
    rl.close()


def test_policies_and_shadow_mode_on_the_module(module_server, key, caplog):
    caplog.set_level(logging.INFO, logger="redis_ratelimit")
    rl = RateLimiter(module_server.client(3))
    name = key.replace(":", "_")[:60]
    rl.policies.set(name, Limit("fixed-window", 2, "1h"), shadow=True)
    assert rl.policies.get(name) == {"algorithm": "fixed-window", "limit": 2, "period_ms": 3600000,
                                     "burst": 2, "mode": "shadow", "block_ms": 0}
    assert name in rl.policies.list()
    decisions = [rl.check(key, Policy(name)) for _ in range(3)]
    assert all(d.allowed for d in decisions)
    assert [d.shadow_rejected for d in decisions] == [False, False, True]
    assert decisions[0].period_ms == 3_600_000
    assert caplog.text.count(f"shadow policy '{name}' would have rejected {key}") == 1
    rl.policies.set(name, Limit("fixed-window", 2, "1h"))  # enforced: read again at once
    assert not rl.check(key, Policy(name)).allowed
    assert rl.policies.delete(name) is True and rl.policies.delete(name) is False
    assert rl.policies.get(name) is None
    rl.close()


def test_a_missing_policy_uses_its_fallback_with_one_warning(server, key, caplog):
    rl = RateLimiter(server.client(2))
    fallback = Limit("gcra", 2, "1h")
    with caplog.at_level(logging.WARNING, logger="redis_ratelimit"):
        first = rl.check(key, Policy("nowhere", fallback=fallback))
        second = rl.check(key, Policy("nowhere", fallback=fallback))
    assert (first.remaining, second.remaining) == (1, 0) and first.period_ms == 3_600_000
    if engine_of(server) == "module":
        assert caplog.text.count("no policy 'nowhere'") == 1
    with pytest.raises(redis.ResponseError, match="no such policy"):
        rl.check(key + "x", Policy("nowhere"))
    rl.close()


def test_the_library_is_loaded_when_missing_or_older_and_after_a_flush(fresh_server, key, caplog):
    caplog.set_level(logging.INFO, logger="redis_ratelimit")
    plain = fresh_server.client()
    # An older library: only one function.
    plain.function_load("#!lua name=ratelimit\nredis.register_function('ratelimit_check', function() return 1 end)")
    rl = RateLimiter(fresh_server.client(3))
    assert rl.check(key, PER_MINUTE).source == "library"
    assert "engine: the Functions library" in caplog.text
    assert "replaced an older Functions library 'ratelimit'" in caplog.text
    listed = plain.execute_command("FUNCTION", "LIST", "LIBRARYNAME", "ratelimit")
    functions = [dict(zip(f[::2], f[1::2]))[b"name"] for f in dict(zip(listed[0][::2], listed[0][1::2]))[b"functions"]]
    assert b"ratelimit_acquire" in functions
    plain.function_flush()
    assert rl.check(key, PER_MINUTE).remaining == 1  # loaded again, the key kept
    assert caplog.text.count("loaded the Functions library 'ratelimit'") == 1
    # A second limiter finds it and loads nothing.
    caplog.clear()
    other = RateLimiter(fresh_server.client(2))
    assert other.detect_engine() == "library"
    assert "loaded" not in caplog.text
    with pytest.raises(redis.ResponseError, match="unknown command"):
        RateLimiter(fresh_server.client(), engine="module").check(key, PER_MINUTE)
    rl.close()
    other.close()


def test_engine_library_on_a_module_server_uses_the_library(module_server, key):
    rl = RateLimiter(module_server.client(3), engine="library", prefix="mine:")
    assert rl.check(key, PER_MINUTE).source == "library"
    assert module_server.client().exists("mine:" + key) == 1
    rl.close()


def test_check_all_with_policies_finds_shadow_rejections(server, key):
    rl = RateLimiter(server.client(2))
    name = "ca" + str(abs(hash(key)) % 10**8)
    shadow_name = name + "s"
    enforced, shadow = Limit("fixed-window", 10, "1h"), Limit("fixed-window", 1, "1h")
    keys = [f"{{{key}}}:e", f"{{{key}}}:s"]
    if engine_of(server) == "module":
        rl.policies.set(name, enforced)
        rl.policies.set(shadow_name, shadow, shadow=True)
    pairs = [(keys[0], Policy(name, fallback=enforced)), (keys[1], Policy(shadow_name, fallback=shadow))]
    first, second = rl.check_all(pairs), rl.check_all(pairs)
    assert first.allowed and not first.shadow_rejected
    assert [d.period_ms for d in first.limits] == [3_600_000, 3_600_000]
    if engine_of(server) == "module":  # the shadow limit admits what it would reject
        assert second.allowed and second.shadow_rejected
        assert [d.shadow_rejected for d in second.limits] == [False, True]
        assert rl.peek(keys[0], enforced, cost=0).remaining == 8
    else:  # no policies: the fallbacks, enforced
        assert not second.allowed and not second.shadow_rejected
    rl.close()


@pytest.mark.parametrize("protocol", [2, 3])
def test_check_all_refused_by_another_limit_is_not_shadow_rejected(module_server, key, protocol):
    # Nothing was admitted, so nothing was admitted in shadow: the whole call is not
    # shadow_rejected, though the shadow policy alone would have refused.
    rl = RateLimiter(module_server.client(protocol))
    name = "cr" + str(abs(hash(key)) % 10**8)
    rl.policies.set(name, Limit("fixed-window", 1, "1h"), shadow=True)
    strict = Limit("fixed-window", 1, "1h")
    pairs = [(f"{{{key}}}:s", Policy(name)), (f"{{{key}}}:e", strict)]
    assert rl.check_all(pairs).allowed
    refused = rl.check_all(pairs)
    assert not refused.allowed and not refused.shadow_rejected
    assert [d.allowed for d in refused.limits] == [True, False]
    # Each limit's own: the shadow one would have admitted past its enforcement, the other refused.
    assert [d.shadow_rejected for d in refused.limits] == [True, False]
    rl.close()


@pytest.mark.parametrize("protocol", [2, 3])
def test_async_check_all_refused_by_another_limit_is_not_shadow_rejected(module_server, key, protocol):
    # The asyncio twin of the test above (Node's and the Rust crate's rule: the overall decision
    # is shadow_rejected only when it was admitted).
    async def main():
        arl = AsyncRateLimiter(redis.asyncio.Redis(port=module_server.port, protocol=protocol, socket_timeout=10))
        name = "ar" + str(abs(hash(key)) % 10**8)
        await arl.policies.set(name, Limit("fixed-window", 1, "1h"), shadow=True)
        pairs = [(f"{{{key}}}:s", Policy(name)), (f"{{{key}}}:e", Limit("fixed-window", 1, "1h"))]
        admitted = await arl.check_all(pairs)
        assert admitted.allowed and not admitted.shadow_rejected
        refused = await arl.check_all(pairs)
        assert not refused.allowed and not refused.shadow_rejected
        assert [(d.allowed, d.shadow_rejected) for d in refused.limits] == [(True, True), (False, False)]
        await arl.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("protocol", [2, 3])
def test_decoded_responses_read_the_same(server, key, protocol):
    rl = RateLimiter(server.client(protocol, decode_responses=True))
    assert rl.detect_engine() == engine_of(server)
    assert rl.check(key, PER_MINUTE).remaining == 2
    multi = rl.check_all([(f"{{{key}}}a", PER_MINUTE), (f"{{{key}}}b", PER_MINUTE)], cost=3)
    assert multi.allowed and [d.remaining for d in multi.limits] == [0, 0]
    if engine_of(server) == "module":
        rl.policies.set("decoded", PER_MINUTE)
        assert rl.policies.get("decoded")["algorithm"] == "sliding-window"
        assert "decoded" in rl.policies.list()
    rl.close()
