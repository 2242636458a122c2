"""Redis down (killed) or stalled (SIGSTOP): `on_error` open gives admitted decisions of
`source="error"`, closed raises `RateLimitUnavailable`; a stall costs one call about the
timeout, then the breaker applies `on_error` at once, counted in calls sent to Redis. Timings
are asserted loosely; the breaker's effect is counted."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
import redis
import redis.asyncio

from conftest import spawn_server
from redis_ratelimit import AsyncRateLimiter, Limit, RateLimitUnavailable, RateLimiter

LIMIT = Limit("token-bucket", 100, "1s")


class Counting(redis.Redis):
    sent = 0

    def execute_command(self, *args, **options):
        type(self).sent += 1
        return super().execute_command(*args, **options)


class AsyncCounting(redis.asyncio.Redis):
    sent = 0

    async def execute_command(self, *args, **options):
        type(self).sent += 1
        return await super().execute_command(*args, **options)


@pytest.fixture
def own_server():
    server = spawn_server(False)
    yield server
    server.kill()  # SIGCONT first if stopped, always


def no_retry():
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return Retry(NoBackoff(), 0)


def test_killed_server_fails_open_or_closed(own_server):
    opened = RateLimiter.from_url(own_server.url, timeout=0.5)
    closed = RateLimiter.from_url(own_server.url, timeout=0.5, on_error="closed")
    assert opened.check("k", LIMIT).source == "library"
    own_server.kill()
    d = opened.check("k", LIMIT)
    assert d.allowed and d.source == "error" and (d.limit, d.remaining) == (0, 0)
    assert opened.check_all([("{a}1", LIMIT), ("{a}2", LIMIT)]).source == "error"
    with pytest.raises(RateLimitUnavailable) as raised:
        closed.check("k", LIMIT)
    assert isinstance(raised.value.__cause__, redis.ConnectionError)
    with pytest.raises(RateLimitUnavailable):
        opened.reset("k")  # no decision to give: raised whatever on_error says
    with opened.lease("l", 1, "1s") as held:  # failing open: held without a lease
        assert held.source == "error"


def test_a_stalled_server_costs_one_timeout_then_the_breaker_answers_at_once(own_server):
    client = Counting(port=own_server.port, socket_timeout=0.2, socket_connect_timeout=0.2, retry=no_retry())
    rl = RateLimiter(client, breaker_failures=3, breaker_cooldown=60)
    assert rl.check("k", LIMIT).allowed  # the engine found, the library loaded
    own_server.stop()
    Counting.sent = 0
    started = time.monotonic()
    slow = [rl.check("k", LIMIT) for _ in range(3)]
    three = time.monotonic() - started
    assert all(d.source == "error" and d.allowed for d in slow)
    assert Counting.sent == 3 and rl._core.breaker.is_open
    assert 0.3 <= three < 5, three  # about 3 x 0.2 s
    started = time.monotonic()
    fast = [rl.check("k", LIMIT) for _ in range(200)]
    assert all(d.source == "error" for d in fast)
    assert Counting.sent == 3, "the open breaker sends nothing"
    assert time.monotonic() - started < 2  # 200 calls without waiting on Redis


def test_the_breaker_lets_one_probe_through_per_cool_down(own_server):
    now = [0.0]
    client = Counting(port=own_server.port, socket_timeout=0.2, retry=no_retry())
    rl = RateLimiter(client, breaker_failures=2, breaker_cooldown=5, on_error="closed")
    rl._core.breaker.clock = lambda: now[0]
    rl.check("k", LIMIT)
    own_server.stop()
    Counting.sent = 0
    for _ in range(2):
        with pytest.raises(RateLimitUnavailable):
            rl.check("k", LIMIT)
    assert Counting.sent == 2
    for _ in range(10):
        with pytest.raises(RateLimitUnavailable, match="breaker open"):
            rl.check("k", LIMIT)
    assert Counting.sent == 2
    now[0] = 5.0  # the cool-down is over: one probe, still stalled
    with pytest.raises(RateLimitUnavailable):
        rl.check("k", LIMIT)
    assert Counting.sent == 3
    with pytest.raises(RateLimitUnavailable, match="breaker open"):
        rl.check("k", LIMIT)
    assert Counting.sent == 3
    own_server.resume()
    now[0] = 10.0  # the next probe finds Redis back: closed again
    assert rl.check("k", LIMIT).source == "library"
    assert rl.check("k", LIMIT).source == "library"
    assert not rl._core.breaker.is_open


def test_the_async_limiter_bounds_each_call_itself(own_server):
    async def main():
        # A client without any socket timeout: the limiter's own timeout bounds the call.
        client = AsyncCounting(port=own_server.port)
        arl = AsyncRateLimiter(client, timeout=0.2, breaker_failures=3, breaker_cooldown=60)
        assert (await arl.check("k", LIMIT)).allowed
        own_server.stop()
        AsyncCounting.sent = 0
        started = time.monotonic()
        for _ in range(3):
            assert (await arl.check("k", LIMIT)).source == "error"
        assert 0.3 <= time.monotonic() - started < 5
        results = await asyncio.gather(*(arl.check("k", LIMIT) for _ in range(100)))
        assert all(d.source == "error" for d in results)
        assert AsyncCounting.sent == 3
        closed = AsyncRateLimiter(redis.asyncio.Redis(port=own_server.port), timeout=0.2, on_error="closed")
        with pytest.raises(RateLimitUnavailable):
            await closed.check("k", LIMIT)

    asyncio.run(main())


def test_from_url_sets_the_timeout_and_no_retries(own_server):
    rl = RateLimiter.from_url(own_server.url, timeout=0.2)
    rl.check("k", LIMIT)
    own_server.stop()
    started = time.monotonic()
    assert rl.check("k", LIMIT).source == "error"
    assert time.monotonic() - started < 1.5  # one timeout of 0.2 s, not four with backoff


def test_the_default_timeout_is_a_gateways_100_ms(own_server):
    assert RateLimiter.from_url(own_server.url).client.get_connection_kwargs()["socket_timeout"] == 0.1
    arl = AsyncRateLimiter.from_url(own_server.url)
    assert arl.timeout == 0.1
    assert arl.client.connection_pool.connection_kwargs["socket_timeout"] == 0.1
    assert arl.client.connection_pool.connection_kwargs["socket_connect_timeout"] == 0.1


def test_the_breaker_logs_opening_and_closing_at_the_same_level(own_server, caplog):
    """uvicorn shows WARNING and up by default: Redis coming back must be seen where its going
    was."""
    rl = RateLimiter.from_url(own_server.url, timeout=0.2, breaker_failures=2, breaker_cooldown=0.01)
    assert rl.check("k", LIMIT).source == "library"
    own_server.stop()
    caplog.set_level(logging.DEBUG, logger="redis_ratelimit")
    for _ in range(2):
        assert rl.check("k", LIMIT).source == "error"
    assert rl._core.breaker.is_open
    own_server.resume()
    deadline = time.monotonic() + 10
    while rl.check("k", LIMIT).source != "library":  # the probe goes after the cool-down
        assert time.monotonic() < deadline
        time.sleep(0.02)
    opened = [r for r in caplog.records if "breaker open" in r.getMessage()]
    closed = [r for r in caplog.records if "breaker closed" in r.getMessage()]
    assert len(opened) == 1 and len(closed) == 1, caplog.text
    assert opened[0].levelno == closed[0].levelno == logging.WARNING


@pytest.fixture(params=["module", "library"])
def stalling_server(request):
    server = spawn_server(request.param == "module")
    yield server
    server.kill()  # SIGCONT first if stopped, always


@pytest.mark.parametrize("on_error", ["open", "closed"])
@pytest.mark.parametrize("connected", [True, False], ids=["pooled", "fresh"])
def test_a_client_without_socket_timeout_is_bounded_by_the_limiters_timeout(stalling_server, on_error, connected):
    """`RateLimiter(redis.Redis.from_url(url))`: no socket_timeout, redis-py's own retries. A call
    to a stalled Redis still ends (the limiter's timeout, 0.1 s by default, bounds its connect
    and its reply), failing open or closed, on a connection of the pool or a new one; the
    client's own configuration stays as it was for its other commands."""
    client = redis.Redis.from_url(stalling_server.url)
    kwargs = dict(client.connection_pool.connection_kwargs)
    rl = RateLimiter(client, on_error=on_error)
    assert rl.timeout == 0.1
    if connected:
        assert rl.check("k", LIMIT).allowed  # the connections it sends on are open
    stalling_server.stop()
    outcome: list = []

    def call():
        try:
            outcome.append(rl.check("k", LIMIT))
        except RateLimitUnavailable as error:
            outcome.append(error)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(30)  # generous: a call waits 0.1 s, then fails
    stuck = caller.is_alive()
    stalling_server.resume()  # a call still waiting would end now
    assert not stuck, "a call to the stalled Redis did not end"
    if on_error == "open":
        assert outcome[0].allowed and outcome[0].source == "error"
    else:
        assert isinstance(outcome[0], RateLimitUnavailable)
        assert isinstance(outcome[0].__cause__, redis.TimeoutError)
    assert client.connection_pool.connection_kwargs == kwargs  # not changed for the caller
    assert client.ping()
    rl.close()


def test_the_limiters_timeout_is_the_clients_else_the_default_and_checked(own_server):
    assert RateLimiter(own_server.client(socket_timeout=2.5)).timeout == 2.5
    assert RateLimiter(own_server.client(socket_timeout=2.5), timeout=0.3).timeout == 0.3
    # No socket_timeout (redis-py 6+ sets 5 s in Redis(...), none in from_url): the default.
    assert RateLimiter(redis.Redis(port=own_server.port, socket_timeout=None)).timeout == 0.1
    assert RateLimiter(redis.Redis.from_url(own_server.url)).timeout == 0.1
    assert AsyncRateLimiter(redis.asyncio.Redis(port=own_server.port, socket_timeout=None)).timeout == 0.1
    assert AsyncRateLimiter(redis.asyncio.Redis(port=own_server.port, socket_timeout=2.5)).timeout == 2.5
    for bad, error in ((0, ValueError), (-1, ValueError), (float("inf"), ValueError), ("1", TypeError), (True, TypeError)):
        with pytest.raises(error, match="timeout"):
            RateLimiter(redis.Redis(port=own_server.port), timeout=bad)
        with pytest.raises(error, match="timeout"):
            AsyncRateLimiter(redis.asyncio.Redis(port=own_server.port), timeout=bad)


def test_the_async_limiter_on_a_client_without_socket_timeout_is_bounded_by_default(own_server):
    async def main():
        arl = AsyncRateLimiter(redis.asyncio.Redis(port=own_server.port, socket_timeout=None), on_error="closed")
        assert (await arl.check("k", LIMIT)).allowed
        own_server.stop()
        try:
            with pytest.raises(RateLimitUnavailable):
                await asyncio.wait_for(arl.check("k", LIMIT), 30)  # generous: it waits 0.1 s
        finally:
            own_server.resume()
        await arl.aclose()

    asyncio.run(main())
