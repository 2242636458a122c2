"""The in-process algorithms (`on_error="local"`'s) equal the module integer for integer: the
same random sequences of CHECK, PEEK, REFUND and TAKE (all six algorithms, BURST, BLOCK,
parameters changed on a key, times going back) sent to the module with `AT` and to a
`LocalLimiter` at the same times give the same six fields, and the key exists in Redis exactly
when the local limiter keeps a state, expiring when the local state says (PEXPIRETIME)."""

from __future__ import annotations

import random
import time

import pytest

from redis_ratelimit import ALGORITHMS, Limit
from redis_ratelimit._local import AlgorithmMismatch, LocalLimiter


def future_t0() -> int:
    """A day ahead of the server's clock: the keys' expiries lie ahead of it, so Redis expires
    nothing during the test (the AT world alone decides)."""
    return (int(time.time() * 1000) // 86_400_000 + 2) * 86_400_000 + 123


def random_limit(rng: random.Random, algorithm: str) -> Limit:
    burst = rng.choice([None, rng.randint(1, 9)]) if algorithm in ("token-bucket", "leaky-bucket", "gcra") else None
    block = rng.choice([None, None, None, f"{rng.choice([1, 90, 400, 2500])}ms"])
    period = rng.choice([1, 3, 100, 250, 1000, 1001, 7000])
    return Limit(algorithm, rng.randint(1, 7), period, burst=burst, block=block)


def raw(reply) -> tuple:
    return tuple(int(v) for v in reply)


def mine(fields) -> tuple:
    return tuple(int(v) for v in fields)


def run_sequence(client, algorithm: str, seed: int, steps: int = 60) -> int:
    rng = random.Random(seed)
    key = f"local:{algorithm}:{seed}"
    client.delete(key)
    local = LocalLimiter()
    limits = [random_limit(rng, algorithm) for _ in range(2)]
    now = future_t0() + rng.randint(0, 10_000)
    compared = 0
    for step in range(steps):
        now += rng.choice([0, 0, 1, 2, 5, 40, 99, 150, 333, 600, 1000, 2600]) if rng.random() > 0.1 else -rng.randint(1, 300)
        limit = limits[0] if rng.random() < 0.8 else limits[1]
        op = rng.choices(["check", "peek", "refund", "take"], [6, 2, 2, 3])[0]
        cost = rng.choice([0, 1, 1, 1, 2, 3, 5, 9])
        spec = limit.args()
        where = f"{algorithm} seed {seed} step {step}: {op} {' '.join(spec)} cost {cost} at {now}"
        if op == "take":
            most = max(1, cost)
            want = raw(client.execute_command("RATELIMIT.TAKE", key, *spec, "MAX", most, "AT", now))
            granted, fields = local.take(key, limit, most, now)
            got = (granted,) + mine(fields)[1:]
        else:
            want = raw(client.execute_command(f"RATELIMIT.{op.upper()}", key, *spec, "COST", cost, "AT", now))
            got = mine(getattr(local, op)(key, limit, cost, now))
        assert got == want, where
        expiry = client.pexpiretime(key)
        stored = local._keys.get(key)
        if expiry < 0:
            assert stored is None, where + ": Redis has no key"
        else:
            assert stored is not None and stored.expires_at() == expiry, where
        compared += 1
    return compared


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_local_algorithms_equal_the_module_with_at(module_server, algorithm):
    client = module_server.client()
    try:
        for seed in range(40):
            assert run_sequence(client, algorithm, seed) == 60
    finally:
        client.close()


def test_the_worked_examples_of_blocks_and_partial_grants():
    """docs/algorithms.md's tables for blocks and partial grants, in process."""
    local = LocalLimiter()
    fw = Limit("fixed-window", 2, 1000, block=5000)
    assert local.check("b", fw, 2, 0) == (True, 2, 0, 0, 1000, 0)
    assert local.check("b", fw, 1, 100) == (False, 2, 0, 5000, 5000, 0)
    assert local.peek("b", fw, 0, 2000) == (False, 2, 0, 3100, 3100, 0)
    assert local.check("b", fw, 3, 3000) == (False, 2, 0, -1, 2100, 0)
    assert local.check("b", fw, 1, 5100) == (True, 2, 1, 0, 900, 0)
    tb = Limit("token-bucket", 3, 1000)
    assert local.take("t", tb, 5, 0) == (3, (True, 3, 0, 0, 1000, 0))
    assert local.take("t", tb, 5, 500) == (1, (True, 3, 0, 0, 834, 0))
    assert local.take("t", tb, 2, 600) == (0, (False, 3, 0, 67, 734, 0))
    lb = Limit("leaky-bucket", 2, 1000, burst=4)
    assert local.take("l", lb, 6, 0)[0] == 4
    assert local.take("l", lb, 2, 250) == (0, (False, 4, 0, 250, 1750, 0))
    assert local.take("l", lb, 2, 500) == (1, (True, 4, 0, 0, 2000, 1500))
    log = Limit("sliding-log", 3, 1000)
    local.check("s", log, 2, 0)
    local.check("s", log, 1, 600)
    assert local.refund("s", log, 2, 700) == (True, 3, 2, 0, 300, 0)
    with pytest.raises(AlgorithmMismatch):
        local.check("s", Limit("gcra", 3, 1000), 1, 800)


def test_the_local_limiter_keeps_at_most_max_keys():
    local = LocalLimiter(max_keys=3)
    limit = Limit("fixed-window", 5, 1000)
    for i in range(10):
        local.check(f"k{i}", limit, 1, 10_000 + i)
    assert len(local) == 3 and list(local._keys) == ["k7", "k8", "k9"]
    # States as good as fresh at the newest time go before live ones.
    local.check("late", limit, 1, 50_000)
    assert len(local) == 1
    with pytest.raises(ValueError):
        LocalLimiter(max_keys=0)
