"""Batches (`Limit(..., batch="50ms")`): units taken ahead with TAKE, admitted from locally
(`source="local"`), the unused ones refunded when the hold ends or the limiter closes, one TAKE
in flight per batch for concurrent callers. The bound of docs/guarantees.md ("Client-side
decisions"), tested with several limiters on one key at deterministic times (`at=`): over every
window, admissions <= what per-request CHECKs could admit in it + the units held when it starts."""

from __future__ import annotations

import asyncio
import bisect
import logging
import random
import time
from typing import Dict, List, Tuple

import pytest
import redis.asyncio

from conftest import spawn_server
from redis_ratelimit import ALGORITHMS, AsyncRateLimiter, Limit, RateLimiter
from redis_ratelimit._local import LocalLimiter

T0 = (int(time.time()) // 86_400 + 2) * 86_400_000  # aligned to every period used here


# -- the bound ---------------------------------------------------------------------------------

class Envelope:
    """The most per-request CHECKs can admit in [s, s + w) (unit costs, from a fresh key, each
    admitted as early as it can be: a PEEK first, so a BLOCK never starts)."""

    def __init__(self, limit: Limit):
        self.limit = limit
        self.memo: Dict[Tuple[int, int], int] = {}
        self.aligned = limit.algorithm in ("fixed-window", "sliding-window")

    def __call__(self, s: int, w: int) -> int:
        phase = (s - T0) % self.limit.period_ms if self.aligned else 0
        if (phase, w) not in self.memo:
            local, admitted, start = LocalLimiter(), 0, T0 + 10 * self.limit.period_ms + phase
            for t in range(start, start + w):
                while local.peek("k", self.limit, 1, t)[0]:
                    assert local.check("k", self.limit, 1, t)[0]
                    admitted += 1
            self.memo[(phase, w)] = admitted
        return self.memo[(phase, w)]


def run_clients(server, limit: Limit, seed: int, clients: int = 3, steps: int = 900):
    """Requests from `clients` limiters (each its own connection) on one key, at random times
    with bursts and pauses. Returns (admissions [(t, cost)], held [(t, units held by all after
    the call at t)], the limiters)."""
    rng = random.Random(seed)
    limiters = [RateLimiter(server.client()) for _ in range(clients)]
    key = f"bound:{limit.algorithm}:{seed}"
    admissions: List[Tuple[int, int]] = []
    held: List[Tuple[int, int]] = []
    admitted = [0] * clients
    now = T0 + 3_600_000
    for step in range(steps):
        now += rng.choice([0, 0, 0, 1, 1, 2, 5]) if rng.random() > 0.02 else rng.choice([60, 200, 900])
        which = rng.randrange(clients)
        cost = rng.choice([1, 1, 1, 1, 2, 3])
        d = limiters[which].check(key, limit, cost, at=now)
        if d.allowed:
            assert d.granted == cost and d.source in ("local", "module")
            admissions.append((now, cost))
            admitted[which] += cost
        held.append((now, sum(r.held() for r in limiters)))
    # A client never admits more than it was granted: every unit taken is admitted, refunded
    # or still held (all requests here are at most batch_max: all go through the batch).
    for rl, units in zip(limiters, admitted):
        st = rl.stats
        assert st.get("taken", 0) == units + st.get("refunded", 0) + rl.held(), st
    return admissions, held, limiters


def worst_excess(admissions, held, envelope: Envelope, widths=(100, 1000), step=10):
    """max over window starts s (every `step` ms) and widths w of
    admitted(s, w) - envelope(s, w) - held(s): <= 0 is the bound."""
    times = [t for t, _ in admissions]
    sums = [0]
    for _, cost in admissions:
        sums.append(sums[-1] + cost)
    held_times = [t for t, _ in held]
    worst = None
    first, last = admissions[0][0], admissions[-1][0]
    for w in widths:
        for s in range(first - first % step, last + 1, step):
            admitted = sums[bisect.bisect_left(times, s + w)] - sums[bisect.bisect_left(times, s)]
            before = bisect.bisect_left(held_times, s)  # the calls before s
            units = held[before - 1][1] if before else 0
            excess = admitted - envelope(s, w) - units
            if worst is None or excess > worst[0]:
                worst = (excess, s, w, admitted, units)
    return worst


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_admissions_stay_within_the_bound(module_server, algorithm):
    burst = 30 if algorithm in ("token-bucket", "leaky-bucket", "gcra") else None
    limit = Limit(algorithm, 40, "1s", burst=burst, batch="50ms", batch_max=12)
    for seed in range(2):
        admissions, held, limiters = run_clients(module_server, limit, seed)
        worst = worst_excess(admissions, held, Envelope(limit))
        assert worst[0] <= 0, f"{algorithm} seed {seed}: window {worst}"
        assert sum(rl.stats.get("local", 0) for rl in limiters) > 0
        for rl in limiters:
            rl.close()  # refunds what it holds
            assert rl.held() == 0 and rl.stats.get("taken", 0) >= rl.stats.get("refunded", 0)


def test_a_batch_takes_from_its_rate_and_refunds_at_the_end_of_the_hold(module_server, key):
    rl = RateLimiter(module_server.client())
    limit = Limit("token-bucket", 100, "1s", batch="50ms", batch_max=8)
    sources = [rl.check(key, limit, at=T0 + i).source for i in range(12)]
    # Sized from the units admitted over the last hold (7/8 of them, at least 1): 1, 1, 1, 2, 4, 7.
    assert sources == ["module", "module", "module", "module", "local", "module", "local", "local",
                       "local", "module", "local", "local"], sources
    assert rl.stats["taken"] == 1 + 1 + 1 + 2 + 4 + 7 and rl.held() == 4
    local = rl.check(key, limit, at=T0 + 12)
    assert (local.source, local.remaining, local.granted) == ("local", 3, 1)  # remaining: held units
    peek = rl.peek(key, limit, 0, at=T0 + 20)
    assert peek.remaining == 100 - 16 + 2  # 16 taken, 2 units refilled in 20 ms
    # The hold ends 50 ms after the last TAKE (at T0 + 9): the next call refunds the 3 left.
    rl.check(key + ":other", Limit("fixed-window", 5, "1s"), at=T0 + 58)
    assert rl.held() == 3
    after = rl.check(key + ":other", Limit("fixed-window", 5, "1s"), at=T0 + 59)
    assert after.source == "module" and rl.held() == 0 and rl.stats["refunded"] == 3
    assert rl.peek(key, limit, 0, at=T0 + 59).remaining == 100 - 16 + 5 + 3  # 5.9 refilled, 3 back
    rl.close()


def test_larger_costs_and_refusals(module_server, key):
    rl = RateLimiter(module_server.client())
    limit = Limit("fixed-window", 10, "1s", batch="100ms", batch_max=4)
    assert rl.check(key, limit, 5, at=T0).source == "module"  # above batch_max: per request
    assert rl.check(key, limit, 3, at=T0 + 1).source == "module"  # TAKE max(3, 1)
    assert rl.held() == 0
    d = rl.check(key, limit, 3, at=T0 + 2)  # 2 left on the server: TAKE grants 2, not enough
    assert (d.allowed, d.granted, d.retry_after_ms) == (False, 0, 998)  # PEEK of the unit it lacks
    assert rl.held() == 2
    assert rl.check(key, limit, 2, at=T0 + 3).source == "local"
    refused = rl.check(key, limit, 1, at=T0 + 4)
    assert (refused.allowed, refused.retry_after_ms, refused.source) == (False, 996, "module")
    rl.close()


def test_concurrent_callers_share_one_take_in_flight(module_server, key):
    class Watching(redis.asyncio.Redis):
        flying = 0
        most = 0
        takes = 0

        async def execute_command(self, *args, **options):
            take = args[0] == "RATELIMIT.TAKE"
            if take:
                cls = type(self)
                cls.takes += 1
                cls.flying += 1
                cls.most = max(cls.most, cls.flying)
            try:
                await asyncio.sleep(0.001)
                return await super().execute_command(*args, **options)
            finally:
                if take:
                    type(self).flying -= 1

    async def main():
        arl = AsyncRateLimiter(Watching(port=module_server.port, socket_timeout=10))
        limit = Limit("gcra", 1000, "1s", batch="1s", batch_max=64)
        results = await asyncio.gather(*(arl.check(key, limit, at=T0) for _ in range(60)))
        assert all(d.allowed for d in results)
        assert Watching.most == 1  # one TAKE in flight at a time
        assert Watching.takes == 9  # 1, 1, 1, 2, 4, 7, 14, 26, 49: not one per caller
        assert sum(d.source == "local" for d in results) == 60 - Watching.takes
        held = arl.held()
        await arl.aclose()  # refunds what is held
        plain = module_server.client()
        assert int(plain.execute_command("RATELIMIT.PEEK", key, *limit.args(), "COST", 0, "AT", T0)[2]) == 1000 - 60
        plain.close()
        assert held == 1 + 1 + 1 + 2 + 4 + 7 + 14 + 26 + 49 - 60

    asyncio.run(main())


def test_a_refund_that_fails_is_logged(caplog):
    server = spawn_server(True)
    try:
        rl = RateLimiter.from_url(server.url, timeout=0.2)
        limit = Limit("token-bucket", 100, "1s", batch="1s")
        for i in range(6):
            rl.check("lost", limit, at=T0 + i)
        assert rl.held() > 0
        server.kill()
        with caplog.at_level(logging.WARNING, logger="redis_ratelimit"):
            rl.close()
        assert "unused batch units of lost not done" in caplog.text
    finally:
        server.kill()


def wait_until(condition, seconds: float = 10.0) -> bool:
    """Polls `condition` until it holds (True) or `seconds` pass (False)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_without_at_the_hold_ends_on_a_timer(module_server, key):
    """On the limiter's own clock, an idle limiter refunds when the hold ends (sync: a thread)."""
    rl = RateLimiter(module_server.client())
    limit = Limit("token-bucket", 1000, "100h", batch="500ms")  # one token refills in 6 minutes
    for _ in range(6):
        assert rl.check(key, limit).allowed
    # Taken 1, 1, 1, 2 and 4 (3 held) unless this machine took 500 ms for 6 calls: either way,
    # the timer gives back everything left, and taken = admitted + refunded.
    assert wait_until(lambda: rl.held() == 0 and rl.stats["taken"] == 6 + rl.stats.get("refunded", 0))
    assert rl.stats["refunded"] >= 1
    assert rl.peek(key, limit, 0).remaining == 994
    rl.close()


def test_without_at_the_async_hold_ends_on_a_timer(module_server, key):
    async def main():
        arl = AsyncRateLimiter(redis.asyncio.Redis(port=module_server.port, protocol=3, socket_timeout=10))
        limit = Limit("token-bucket", 1000, "100h", batch="500ms")
        for _ in range(6):
            assert (await arl.check(key, limit)).allowed
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
                arl.held() == 0 and arl.stats["taken"] == 6 + arl.stats.get("refunded", 0)):
            await asyncio.sleep(0.01)
        assert arl.held() == 0 and arl.stats["taken"] == 6 + arl.stats["refunded"]
        assert arl.stats["refunded"] >= 1
        assert (await arl.peek(key, limit, 0)).remaining == 994
        await arl.aclose()

    asyncio.run(main())


def test_threads_share_a_batch(module_server, key):
    """Sync callers on threads: one TAKE in flight per batch, never more admitted than taken."""
    import threading

    rl = RateLimiter(module_server.client())
    limit = Limit("fixed-window", 10_000, "1h", batch="1h", batch_max=256)
    results: List[str] = []
    lock = threading.Lock()

    def work():
        for _ in range(100):
            d = rl.check(key, limit, at=T0)
            with lock:
                results.append(d.source if d.allowed else "refused")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(results) == 800 and "refused" not in results
    assert rl.stats["taken"] == 800 + rl.held()
    assert results.count("local") >= 800 - 20 and rl.stats["commands"] < 30
    rl.close()
    plain = module_server.client()
    assert int(plain.execute_command("RATELIMIT.PEEK", key, *limit.args(), "COST", 0, "AT", T0)[2]) == 10_000 - 800


class Mirrored(redis.Redis):
    """A client that replays each TAKE of `key` on `twin` as one-unit CHECKs at the same `AT`
    (and each REFUND as it is): the twin's state is what per-request checks of the same units
    make of it. `takes`: (AT, the delay_ms the last of those CHECKs got), one per grant."""

    key = twin = ""
    takes: List[Tuple[int, int]] = []

    def execute_command(self, *args, **options):
        reply = super().execute_command(*args, **options)
        words = [a.decode() if isinstance(a, bytes) else str(a) for a in args]
        library = words[0] == "FCALL"
        verb = words[1].upper() if library else words[0].upper()
        key_at = 3 if library else 1
        if words[key_at].endswith(self.key) and verb in ("RATELIMIT_TAKE", "RATELIMIT.TAKE") and reply[0] > 0:
            check = list(words)
            check[key_at] = words[key_at][: -len(self.key)] + self.twin
            check[1 if library else 0] = "ratelimit_check" if library else "RATELIMIT.CHECK"
            at = check.index("MAX")
            check[at:at + 2] = ["COST", "1"]
            for _ in range(reply[0]):
                last = super().execute_command(*check)
                assert last[0] == 1, last
            self.takes.append((int(words[words.index("AT") + 1]), last[5]))
        elif words[key_at].endswith(self.key) and verb in ("RATELIMIT_REFUND", "RATELIMIT.REFUND"):
            refund = list(words)
            refund[key_at] = words[key_at][: -len(self.key)] + self.twin
            super().execute_command(*refund)
        return reply


@pytest.mark.parametrize("seed", range(3))
def test_a_leaky_buckets_local_delay_is_never_below_a_per_request_checks(server, seed):
    """A request admitted from a batch reports the last TAKE's `delay_ms` (the wait of its last
    unit) counted down: never less than the wait per-request CHECKs of the batch's units would
    have given the last of them, counted down alike."""
    rng = random.Random(seed)
    batched = Limit("leaky-bucket", 10, "1s", burst=20, batch="1s")
    key = f"delay:{seed}:{time.time_ns()}"
    client = Mirrored(port=server.port, protocol=2)
    client.key, client.twin, client.takes = key, key + ":twin", []
    rl = RateLimiter(client)
    now = T0 + 7_200_000
    local = 0
    for _ in range(400):
        now += rng.choice([0, 0, 1, 5, 20, 60, 150])
        d = rl.check(key, batched, at=now)
        if not d.allowed:
            continue
        taken_at, last_wait = client.takes[-1]
        per_request = max(0, last_wait - (now - taken_at))
        assert d.delay_ms >= per_request, (d, client.takes[-1], now)
        assert d.delay_ms == per_request  # the TAKE's delay_ms is that wait exactly
        local += d.source == "local"
    rl.close()
    assert local > 20 and len(client.takes) > 5  # many came from batches
