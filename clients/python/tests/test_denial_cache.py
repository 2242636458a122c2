"""The denial cache (`denial_cache=N`): refusals answered again locally (`source="cache"`) while
their wait lasts, for costs at least the refused one; it never admits what a per-request CHECK
refuses (a PEEK of the same key at the same `AT` before every call says what that CHECK would
answer), even while another process refunds, resets and redefines policies; what those cost is
under-admission within a cached wait, nothing else. Time is `at=` throughout."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
import redis.asyncio

from redis_ratelimit import ALGORITHMS, AsyncRateLimiter, Limit, Policy, RateLimiter

T0 = (int(time.time()) // 86_400 + 2) * 86_400_000


def random_limit(rng: random.Random, algorithm: str) -> Limit:
    burst = rng.choice([None, rng.randint(1, 6)]) if algorithm in ("token-bucket", "leaky-bucket", "gcra") else None
    return Limit(algorithm, rng.randint(1, 5), rng.choice([200, 1000, 3000]), burst=burst,
                 block=rng.choice([None, None, "700ms"]))


def flood(module_server, algorithm: str, seed: int, others: bool):
    """Random requests on 3 keys through a cached limiter; `others`: another process refunds,
    resets and redefines the policy now and then. Returns (calls, cached answers, under-admissions)."""
    rng = random.Random(f"{algorithm}{seed}{others}")
    plain = module_server.client()
    cached = RateLimiter(module_server.client(), denial_cache=8)
    policy = f"dc-{algorithm}-{seed}-{int(others)}"
    plain.execute_command("RATELIMIT.POLICY", "SET", policy, *random_limit(rng, algorithm).args())
    limits = [random_limit(rng, algorithm), Policy(policy)]
    keys = [f"dc:{algorithm}:{seed}:{int(others)}:{i}" for i in range(3)]
    now = T0 + rng.randint(0, 10_000)
    under = 0
    for step in range(150):
        now += rng.choice([0, 0, 0, 1, 3, 20, 90, 400])
        i = rng.randrange(len(keys))
        key, limit = keys[i], limits[i % 2]  # one limit per key (two on one key change each other)
        spec = limit.args() if isinstance(limit, Limit) else ["POLICY", policy]
        if others and rng.random() < 0.08:
            what = rng.choice(["refund", "reset", "policy"])
            if what == "refund":
                plain.execute_command("RATELIMIT.REFUND", key, *spec, "COST", rng.randint(1, 3), "AT", now)
            elif what == "reset":
                plain.execute_command("RATELIMIT.RESET", key)
            else:
                plain.execute_command("RATELIMIT.POLICY", "SET", policy, *random_limit(rng, algorithm).args())
        take = rng.random() < 0.2
        cost = rng.randint(1, 4) if take else rng.choice([1, 1, 1, 2, 3])
        verb, amount = ("TAKE", "MAX") if take else ("CHECK", "COST")
        # What a per-request call would answer now (a PEEK of one unit for a TAKE).
        peek = plain.execute_command("RATELIMIT.PEEK", key, *spec, "COST", 1 if take else cost, "AT", now)
        would = bool(int(peek[0]))
        d = cached.take(key, limit, cost, at=now) if take else cached.check(key, limit, cost, at=now)
        where = f"{algorithm} seed {seed} step {step}: {verb} {amount} {cost} {spec} at {now}: {d}"
        assert not d.allowed or would, where  # never admits what per-request refuses
        if d.source == "cache":
            assert not d.allowed and d.granted == 0 and d.retry_after_ms > 0, where
            under += would
        else:
            assert d.source == "module" and d.allowed == would, where
    stats = cached.stats
    cached.close()
    plain.close()
    return 150, stats.get("cache", 0), under


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_never_admits_what_a_per_request_check_refuses(module_server, algorithm):
    served = 0
    for seed in range(6):
        calls, cache, under = flood(module_server, algorithm, seed, others=False)
        assert under == 0, "alone on its keys, a cached refusal is exactly what Redis answers"
        served += cache
        _, cache, under = flood(module_server, algorithm, seed, others=True)
        served += cache
    assert served > 100  # the cache answered (the test would show nothing otherwise)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_cached_limiter_answers_what_per_request_calls_answer_on_a_twin_key(module_server, algorithm):
    """The same calls at the same times, through the cache on one key and as plain commands on a
    twin: the same admissions and grants, one by one. A PEEK cannot see what a refusal starts (a
    BLOCK): a refusal after a block has ended starts another, which an answer from the cache
    would skip, and the key would then be admitted while per-request calls are still blocked; so
    refusals of a limit with a BLOCK are never cached."""
    rng = random.Random(f"twin{algorithm}")
    plain = module_server.client()
    served = 0
    for seed in range(8):
        cached = RateLimiter(module_server.client(), denial_cache=8)
        limit = random_limit(rng, algorithm)
        if seed % 2:
            limit = Limit(limit.algorithm, limit.limit, limit.period, burst=limit.burst, block="700ms")
        key, twin = f"twin:{algorithm}:{seed}", f"twin:{algorithm}:{seed}:plain"
        now = T0 + rng.randint(0, 10_000)
        for step in range(120):
            now += rng.choice([0, 0, 1, 3, 20, 90, 400, 800])
            take = rng.random() < 0.2
            cost = rng.randint(1, 4) if take else rng.choice([1, 1, 2, 3])
            verb, amount = ("TAKE", "MAX") if take else ("CHECK", "COST")
            reply = plain.execute_command(f"RATELIMIT.{verb}", twin, *limit.args(), amount, cost, "AT", now)
            d = cached.take(key, limit, cost, at=now) if take else cached.check(key, limit, cost, at=now)
            granted = int(reply[0]) if take else (cost if int(reply[0]) else 0)
            assert (d.granted, d.allowed) == (granted, granted > 0), f"{limit} step {step} at {now}: {d} vs {reply}"
        served += cached.stats.get("cache", 0)
        if limit.block is not None:
            assert cached.stats.get("cache", 0) == 0
        cached.close()
    plain.close()
    assert served > 0  # the cache answered some (the test would show nothing otherwise)


def test_cached_refusals_count_down_and_cover_larger_costs(module_server, key):
    rl = RateLimiter(module_server.client(), denial_cache=100)
    limit = Limit("fixed-window", 3, "1s")
    assert rl.check(key, limit, 3, at=T0 + 100).allowed
    first = rl.check(key, limit, 2, at=T0 + 200)
    assert (first.source, first.retry_after_ms, first.reset_after_ms) == ("module", 800, 800)
    again = rl.check(key, limit, 2, at=T0 + 450)
    assert (again.source, again.allowed, again.retry_after_ms, again.reset_after_ms) == ("cache", False, 550, 550)
    assert rl.check(key, limit, 5, at=T0 + 460).source == "module"  # -1 (above the limit): never cached
    assert rl.check(key, limit, 5, at=T0 + 461).source == "module"
    assert rl.check(key, limit, 3, at=T0 + 470).source == "cache"  # a larger cost
    assert rl.check(key, limit, 1, at=T0 + 480).source == "module"  # a smaller one asks Redis
    assert rl.take(key, limit, 4, at=T0 + 490).source == "cache"  # refused 1 unit: any max
    assert rl.peek(key, limit, 2, at=T0 + 495).source == "module"  # peek always asks
    assert rl.check_all([(key, limit)], 2, at=T0 + 496).source == "module"
    assert rl.check(key, limit, 2, at=T0 + 1000).source == "module"  # the wait is over
    assert rl.stats["cache"] == 3


def test_take_refusals_are_cached_for_every_max(module_server, key):
    rl = RateLimiter(module_server.client(), denial_cache=100)
    limit = Limit("token-bucket", 1, "1s")
    assert rl.take(key, limit, 5, at=T0).granted == 1
    refused = rl.take(key, limit, 5, at=T0 + 10)
    assert (refused.source, refused.granted, refused.retry_after_ms) == ("module", 0, 990)
    assert rl.take(key, limit, 1, at=T0 + 20).source == "cache"
    assert rl.check(key, limit, 1, at=T0 + 30).retry_after_ms == 970  # the same entry


def test_reset_and_refund_through_the_limiter_drop_the_keys_entries(module_server, key):
    rl = RateLimiter(module_server.client(), denial_cache=100)
    limit = Limit("sliding-log", 1, "1s")
    rl.check(key, limit, at=T0)
    assert rl.check(key, limit, at=T0 + 1).source == "module"
    assert rl.check(key, limit, at=T0 + 2).source == "cache"
    rl.refund(key, limit, 1, at=T0 + 3)
    assert rl.check(key, limit, at=T0 + 4).allowed  # asked Redis again
    assert rl.check(key, limit, at=T0 + 5).source == "module"
    rl.reset(key)
    assert rl.check(key, limit, at=T0 + 6).allowed


def test_at_most_n_entries_and_off_by_default(module_server, key):
    rl = RateLimiter(module_server.client(), denial_cache=2)
    limit = Limit("fixed-window", 1, "10s")
    keys = [f"{key}:{i}" for i in range(3)]
    for k in keys:
        rl.check(k, limit, at=T0)
        rl.check(k, limit, at=T0)  # refused: cached
    assert len(rl._core.cache) == 2
    assert rl.check(keys[0], limit, at=T0).source == "module"  # the least recently used went
    assert rl.check(keys[2], limit, at=T0).source == "cache"
    off = RateLimiter(module_server.client())
    assert off._core.cache is None and RateLimiter(module_server.client(), denial_cache=0)._core.cache is None


def test_the_async_limiter_caches_too(module_server, key):
    async def main():
        arl = AsyncRateLimiter(redis.asyncio.Redis(port=module_server.port, protocol=3, socket_timeout=10),
                               denial_cache=10)
        limit = Limit("gcra", 1, "1s")
        await arl.check(key, limit, at=T0)
        assert (await arl.check(key, limit, at=T0 + 1)).source == "module"
        results = await asyncio.gather(*(arl.check(key, limit, at=T0 + 2) for _ in range(50)))
        assert {d.source for d in results} == {"cache"}
        assert arl.stats["commands"] == 2
        await arl.aclose()

    asyncio.run(main())
