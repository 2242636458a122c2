"""A batch's TAKE whose caller stopped waiting (cancelled, or its timeout fired before the reply)
still lands its grant in the batch, to be admitted or refunded: after `close()`, the units
consumed in Redis are exactly the units admitted to callers. Replies are made late with a
SIGSTOPped server (deterministic) and under load with busy scripts from another client."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import redis
import redis.asyncio

from conftest import spawn_server
from redis_ratelimit import AsyncRateLimiter, Limit, RateLimiter

#: Busy for `ARGV[1]` ms (the server answers no one meanwhile: replies to others come late).
BUSY = """
local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
while true do
  t = redis.call('TIME')
  if t[1] * 1000000 + t[2] - start > tonumber(ARGV[1]) * 1000 then return 1 end
end
"""
SERVED = ("module", "local")


def consumed(server, key: str, limit: Limit) -> int:
    peek = server.client().execute_command("RATELIMIT.PEEK", key, *limit.args(), "COST", 0)
    return limit.limit - peek[2]


def test_a_cancelled_batched_check_keeps_its_grant_async():
    """The issue's sequence: 40 checks, the hold ends (the rest refunded: 60 left), the next
    TAKE waits on a stalled server and its caller is cancelled; `aclose()` refunds it."""
    server = spawn_server(True)
    try:
        key, limit = "late:cancel", Limit("fixed-window", 100, "1h", batch="1s")

        async def main():
            al = AsyncRateLimiter(redis.asyncio.Redis(port=server.port), timeout=2)
            for _ in range(40):
                assert (await al.check(key, limit)).allowed
            deadline = time.monotonic() + 10
            while consumed(server, key, limit) != 40:  # the hold's end refunds the rest
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            assert al.held() == 0
            server.stop()
            task = asyncio.ensure_future(al.check(key, limit))
            await asyncio.sleep(0.05)  # (its TAKE goes out in a task that the cancel does not stop)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            server.resume()
            await al.aclose()
            return al.stats

        stats = asyncio.run(main())
        assert stats.get("late", 0) > 0, stats  # the TAKE's grant came after its caller left
        assert consumed(server, key, limit) == 40, stats
        assert stats["taken"] == 40 + stats["refunded"], stats
    finally:
        server.kill()


def test_a_timed_out_batched_check_keeps_its_late_grant_sync():
    server = spawn_server(True)
    try:
        key, limit = "late:timeout", Limit("fixed-window", 100, "1h", batch="1s")
        rl = RateLimiter.from_url(server.url, timeout=0.2)
        assert rl.check(key, limit).allowed and rl.held() == 0  # a TAKE of 1, admitted
        server.stop()
        d = rl.check(key, limit)
        assert d.source == "error", d  # timed out: failing open, nothing consumed for it
        server.resume()  # the TAKE it sent runs now, and its reply comes late
        rl.close()  # waits for that reply, then refunds its grant
        assert rl.stats.get("late", 0) > 0, rl.stats
        assert consumed(server, key, limit) == 1, rl.stats
    finally:
        server.kill()


def busy_loop(port: int, stop: threading.Event, ms: int) -> None:
    client = redis.Redis(port=port)
    while not stop.is_set():
        client.eval(BUSY, 0, ms)
        time.sleep(0.01)
    client.close()


def test_cancellations_and_late_replies_under_load_lose_no_unit_async():
    server = spawn_server(True)
    stop = threading.Event()
    busy = threading.Thread(target=busy_loop, args=(server.port, stop, 60))
    try:
        key, limit = "late:load-async", Limit("fixed-window", 10**6, "1h", batch="10s", batch_max=50)
        rng = random.Random(39)

        async def main():
            al = AsyncRateLimiter(redis.asyncio.Redis(port=server.port, max_connections=200), timeout=0.03,
                                  breaker_failures=0)
            admitted = cancelled = 0

            async def one():
                nonlocal admitted, cancelled
                task = asyncio.ensure_future(al.check(key, limit))
                if rng.random() < 0.25:
                    await asyncio.sleep(rng.random() * 0.01)
                    task.cancel()
                try:
                    d = await task
                except asyncio.CancelledError:
                    cancelled += 1
                    return
                if d.allowed and d.source in SERVED:
                    admitted += 1

            for _ in range(150):
                await asyncio.gather(*(one() for _ in range(20)))
            stop.set()
            await asyncio.get_running_loop().run_in_executor(None, busy.join)
            await al.aclose()
            return admitted, cancelled, al.stats

        busy.start()
        admitted, cancelled, stats = asyncio.run(main())
        print(f"async: 3000 calls, {cancelled} cancelled, {admitted} admitted, "
              f"{consumed(server, key, limit)} consumed, stats {stats}")
        assert cancelled > 20 and stats.get("late", 0) > 0, stats
        assert consumed(server, key, limit) == admitted, (admitted, cancelled, stats)
    finally:
        stop.set()
        if busy.is_alive():
            busy.join()
        server.kill()


def test_late_replies_under_load_lose_no_unit_sync():
    server = spawn_server(True)
    stop = threading.Event()
    busy = threading.Thread(target=busy_loop, args=(server.port, stop, 60))
    try:
        key, limit = "late:load-sync", Limit("fixed-window", 10**6, "1h", batch="10s", batch_max=50)
        rl = RateLimiter.from_url(server.url, timeout=0.03, breaker_failures=0)
        admitted = [0] * 4

        def worker(i: int) -> None:
            for _ in range(300):
                d = rl.check(key, limit)
                if d.allowed and d.source in SERVED:
                    admitted[i] += 1

        busy.start()
        workers = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        stop.set()
        busy.join()
        rl.close()
        print(f"sync: 1200 calls, {sum(admitted)} admitted, {consumed(server, key, limit)} consumed, "
              f"stats {rl.stats}")
        assert rl.stats.get("late", 0) > 0, rl.stats
        assert consumed(server, key, limit) == sum(admitted), (admitted, rl.stats)
    finally:
        stop.set()
        if busy.is_alive():
            busy.join()
        server.kill()
