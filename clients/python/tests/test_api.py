"""The values and the pure parts: limits checked when made, the headers derived from
decisions, the breaker's states on a fake clock, and the middleware's answers (in-process ASGI
and Flask apps on real servers): failing closed, refunds, several limits on a route."""

from __future__ import annotations

import asyncio
import datetime
import time

import httpx
import pytest
import redis.asyncio
from fastapi import Depends, FastAPI
from flask import Flask

from redis_ratelimit import (  # the README's import lines, as a user writes them
    AsyncRateLimiter,
    Decision,
    Limit,
    MultiDecision,
    Policy,
    RateLimited,
    RateLimiter,
    RateLimitUnavailable,
)
from redis_ratelimit._engine import Breaker, Core
from redis_ratelimit._wire import parse_decision, parse_multi
from redis_ratelimit._http import hash_tag, http_answer
from redis_ratelimit.asgi import RateLimitMiddleware
from redis_ratelimit.fastapi import RateLimit
from redis_ratelimit.flask import RateLimit as FlaskRateLimit

from conftest import free_port


def decision(allowed=True, limit=10, remaining=5, retry=0, reset=1500, delay=0, period=60_000, source="module"):
    return Decision(allowed, limit, remaining, retry, reset, delay, source, False, period)


# -- values -------------------------------------------------------------------------------

def test_limits_are_checked_when_made():
    assert Limit("GCRA", 5, "1S").args() == ["gcra", "5", "1S"]
    assert Limit("token-bucket", 10, "1s", burst=20, block="15m").args() == [
        "token-bucket", "10", "1s", "BURST", "20", "BLOCK", "15m"]
    assert Limit("fixed-window", 1, datetime.timedelta(minutes=2)).period_ms == 120_000
    assert Limit("fixed-window", 1, 250).args()[2] == "250"
    for bad in [("leaky", 1, "1s"), ("token-bucket", 0, "1s"), ("token-bucket", 10**12 + 1, "1s"),
                ("gcra", 1, "0ms"), ("gcra", 1, "3651d"), ("gcra", 1, "1y"), ("gcra", 1, "1s", 0)]:
        with pytest.raises(ValueError):
            Limit(*bad)
    for bad in [("gcra", True, "1s"), ("gcra", 1.5, "1s"), ("gcra", 1, 1.0)]:
        with pytest.raises(TypeError):
            Limit(*bad)
    with pytest.raises(ValueError, match="policy name"):
        Policy("a:b")
    with pytest.raises(TypeError):
        Policy("api", fallback="sliding-window 5 1s")
    assert Policy("api.v2-x_1").args() == ["POLICY", "api.v2-x_1"]


def test_replies_of_both_shapes_read_the_same():
    resp2 = [1, 10, 9, 0, 100, 0]
    resp3 = {b"allowed": True, b"limit": 10, b"remaining": 9, b"retry_after_ms": 0, b"reset_after_ms": 100, b"delay_ms": 0}
    assert parse_decision(resp2, "module") == parse_decision(resp3, "module")
    multi2 = [[0, 5, 0, 200, 900, 0], [0, 5, 0, 200, 900, 0], [1, 9, 8, 0, 100, 0]]
    multi3 = {**{k: v for k, v in zip([b"allowed", b"limit", b"remaining", b"retry_after_ms", b"reset_after_ms", b"delay_ms"], [False, 5, 0, 200, 900, 0])},
              b"limits": [dict(zip(resp3, [False, 5, 0, 200, 900, 0])), dict(zip(resp3, [True, 9, 8, 0, 100, 0]))]}
    assert parse_multi(multi2, "module", [1, 2]) == parse_multi(multi3, "module", [1, 2])
    assert isinstance(parse_multi(multi2, "module", [1, 2]), MultiDecision)


# -- headers ------------------------------------------------------------------------------

def test_headers_follow_the_draft():
    assert http_answer([("default", decision(remaining=99, reset=116285))]) == (
        200, {"RateLimit-Policy": '"default";q=10;w=60', "RateLimit": '"default";r=99;t=117'})
    refused = decision(False, remaining=0, retry=56869, reset=116269)
    assert http_answer([("default", refused)]) == (429, {
        "RateLimit-Policy": '"default";q=10;w=60', "RateLimit": '"default";r=0;t=57', "Retry-After": "57"})
    never = decision(False, remaining=3, retry=-1)
    assert http_answer([("api", never)]) == (429, {"RateLimit-Policy": '"api";q=10;w=60'})
    assert http_answer([("x", decision(source="error"))]) == (200, {})
    sec, hour = decision(False, 5, 0, 200, 1000, period=1000), decision(True, 1000, 990, 0, 36000, period=3_600_000)
    status, headers = http_answer([("per-second", sec), ("per-hour", hour)], decision(False, 5, 0, 200, 36000))
    assert status == 429 and headers["Retry-After"] == "1"
    assert headers["RateLimit"] == '"per-second";r=0;t=1, "per-hour";r=990;t=36'
    assert hash_tag("{alice}:sec") == hash_tag("x{alice}") == "alice" and hash_tag("a{}b") == "a{}b"


def test_the_breaker_opens_probes_and_closes():
    now = [0.0]
    breaker = Breaker(failures=2, cooldown_s=10, clock=lambda: now[0])
    assert breaker.allow()
    breaker.failure()
    assert breaker.allow() and not breaker.is_open
    breaker.failure()
    assert breaker.is_open and not breaker.allow()
    now[0] = 10
    assert breaker.allow() and not breaker.allow()  # one probe at a time
    breaker.abandon()  # a cancelled probe
    assert breaker.allow()
    breaker.failure()  # failed: open for another cool-down
    assert not breaker.allow()
    now[0] = 20
    assert breaker.allow()
    breaker.success()
    assert not breaker.is_open and breaker.allow() and breaker.allow()
    assert Breaker(failures=0).allow()


# -- middleware ---------------------------------------------------------------------------

def drive(app, requests, *limiters):
    """The requests' answers; then the limiters closed, in the same event loop."""
    async def main():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
                return [await client.request(method, path, headers=headers) for method, path, headers in requests]
        finally:
            for limiter in limiters:
                await limiter.aclose()

    return asyncio.run(main())


def test_asgi_middleware_refunds_5xx_and_fails_closed(module_server, key):
    limiter = AsyncRateLimiter.from_url(module_server.url, protocol=3, timeout=5)
    app = FastAPI()

    @app.get("/fail")
    async def fail():
        raise RuntimeError("boom")

    @app.get("/ok")
    async def ok():
        return "ok"

    app.add_middleware(RateLimitMiddleware, limiter=limiter, limit=Limit("fixed-window", 3, "1h"),
                       key=lambda request: key, name="api", refund_on=lambda status: status >= 500)
    answers = drive(app, [("GET", "/ok", {}), ("GET", "/fail", {}), ("GET", "/ok", {})], limiter)
    assert [a.status_code for a in answers] == [200, 500, 200]
    # The failure took nothing: 2 left after the first, still 2 after the refund, then 1.
    assert [a.headers.get("ratelimit", "").split(";")[1] for a in (answers[0], answers[2])] == ["r=2", "r=1"]
    closed = AsyncRateLimiter.from_url(f"redis://127.0.0.1:{free_port()}", on_error="closed")
    app2 = FastAPI()
    app2.get("/")(lambda: "ok")
    app2.add_middleware(RateLimitMiddleware, limiter=closed, limit=Limit("gcra", 1, "1s"), key=lambda r: "k")
    [answer] = drive(app2, [("GET", "/", {})], closed)
    assert answer.status_code == 503 and answer.json() == {"error": "rate limiter unavailable"}


def test_fastapi_dependencies_without_a_shared_tag_refund_what_passed(module_server, key):
    limiter = AsyncRateLimiter.from_url(module_server.url, timeout=5)
    roomy = RateLimit(limiter, Limit("fixed-window", 100, "1h"), key=lambda r: key + ":a", name="roomy")
    tight = RateLimit(limiter, Limit("fixed-window", 1, "1h"), key=lambda r: key + ":b", name="tight")
    app = FastAPI()

    @app.get("/", dependencies=[Depends(roomy), Depends(tight)])
    async def index():
        return "ok"

    first, second = drive(app, [("GET", "/", {}), ("GET", "/", {})], limiter)
    assert first.status_code == 200
    assert first.headers["ratelimit-policy"] == '"roomy";q=100;w=3600, "tight";q=1;w=3600'
    assert second.status_code == 429 and second.json()["detail"]["policy"] == "tight"
    plain = module_server.client()
    roomy_left = plain.execute_command("RATELIMIT.PEEK", key + ":a", "fixed-window", 100, "1h", "COST", 0)[2]
    assert roomy_left == 99, "the refused request's cost went back to the first limit"


def test_every_adapter_limits_keyless_requests_on_the_client_address(module_server, key):
    """Without `key`, or where it answers None or "", the key is the client's address; `skip`
    exempts; another answer is the caller's mistake."""
    limiter = AsyncRateLimiter.from_url(module_server.url, timeout=5)
    app = FastAPI()
    app.get("/")(lambda: "ok")
    app.get("/health")(lambda: "ok")
    app.add_middleware(RateLimitMiddleware, limiter=limiter, limit=Limit("fixed-window", 3, "1h"),
                       key=lambda r: r.headers.get("x-api-key"), skip=lambda r: r.url.path == "/health")
    module_server.client().delete("ip:127.0.0.1", f"{key}-dep:ip:127.0.0.1")
    answers = drive(app, [("GET", "/", {})] * 2 + [("GET", "/", {"X-API-Key": ""}), ("GET", "/", {}),
                          ("GET", "/health", {}), ("GET", "/", {"X-API-Key": key})], limiter)
    assert [a.status_code for a in answers] == [200, 200, 200, 429, 200, 200]
    assert "ratelimit" not in answers[4].headers  # skipped: not limited, not counted
    assert module_server.client().exists("ip:127.0.0.1", key) == 2
    # The dependency's own address key (its name first), apart from the middleware's.
    limiter = AsyncRateLimiter.from_url(module_server.url, timeout=5)
    plain = FastAPI()
    plain.get("/dep", dependencies=[Depends(RateLimit(limiter, Limit("fixed-window", 2, "1h"), name=f"{key}-dep"))])(
        lambda: "ok")
    assert [a.status_code for a in drive(plain, [("GET", "/dep", {})] * 3, limiter)] == [200, 200, 429]
    assert module_server.client().exists(f"{key}-dep:ip:127.0.0.1") == 1
    limiter = AsyncRateLimiter.from_url(module_server.url, timeout=5)
    bad = FastAPI()
    bad.get("/")(lambda: "ok")
    bad.add_middleware(RateLimitMiddleware, limiter=limiter, limit=Limit("fixed-window", 3, "1h"), key=lambda r: 5)
    with pytest.raises(TypeError, match="key"):
        asyncio.run(httpx.AsyncClient(transport=httpx.ASGITransport(app=bad), base_url="http://app").get("/"))
    flask_app = Flask("keyless")
    FlaskRateLimit(flask_app, limiter=RateLimiter(module_server.client()), limit=Limit("fixed-window", 2, "1h"),
                   name=key, skip=lambda r: r.path == "/health")
    flask_app.add_url_rule("/", "index", lambda: "ok")
    flask_app.add_url_rule("/health", "health", lambda: "ok")
    module_server.client().delete("ip:203.0.113.3")
    client = flask_app.test_client()
    peer = {"REMOTE_ADDR": "203.0.113.3"}
    assert [client.get("/", environ_base=peer).status_code for _ in range(3)] == [200, 200, 429]
    assert client.get("/health", environ_base=peer).status_code == 200
    assert client.get("/", environ_base={"REMOTE_ADDR": "203.0.113.4"}).status_code == 200
    assert module_server.client().exists("ip:203.0.113.3") == 1


def test_flask_refund_and_failing_closed(module_server, key):
    app = Flask(__name__)
    limiter = RateLimiter(module_server.client(3))
    FlaskRateLimit(app, limiter=limiter, limit=Limit("fixed-window", 5, "1h"), key=lambda r: key,
                   refund_on=lambda status: status >= 500)

    @app.get("/fail")
    def fail():
        return "no", 503

    client = app.test_client()
    assert client.get("/fail").headers["RateLimit"].startswith('"default";r=5;')
    closed = Flask("closed")
    FlaskRateLimit(closed, limiter=RateLimiter.from_url(f"redis://127.0.0.1:{free_port()}", on_error="closed"),
                   limit=Limit("gcra", 1, "1s"), key=lambda r: "k")
    closed.get("/")(lambda: "ok")
    answer = closed.test_client().get("/")
    assert answer.status_code == 503 and answer.json == {"error": "rate limiter unavailable"}


def test_the_limiters_refuse_the_other_kind_of_client(module_server):
    async def async_client():  # inside a loop: Python 3.9's asyncio wants one for redis.asyncio
        return redis.asyncio.Redis.from_url(module_server.url)

    with pytest.raises(TypeError):
        RateLimiter(asyncio.run(async_client()))
    with pytest.raises(TypeError):
        AsyncRateLimiter(module_server.client())
    with pytest.raises(TypeError):
        AsyncRateLimiter(None)
    with pytest.raises(ValueError):
        RateLimiter(module_server.client(), on_error="maybe")
    with pytest.raises(TypeError):
        RateLimiter(module_server.client(), retries=1)  # not an option
    assert RateLimited(decision(False)).decision.allowed is False
    assert issubclass(RateLimitUnavailable, Exception)


def test_what_counts_as_unavailable():
    from redis._parsers.base import BaseParser  # how redis-py turns error replies into exceptions

    from redis_ratelimit._wire import unavailable

    parse = BaseParser.parse_error
    for reply in ["LOADING Redis is loading the dataset in memory", "OOM command not allowed when used memory > 'maxmemory'.",
                  "READONLY You can't write against a read only replica.", "CLUSTERDOWN The cluster is down",
                  "MASTERDOWN Link with MASTER is down", "TRYAGAIN Multiple keys request during rehashing of slot",
                  "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."]:
        assert unavailable(parse(reply)), reply
    for error in [redis.ConnectionError("refused"), redis.TimeoutError("slow"), ConnectionRefusedError(), asyncio.TimeoutError()]:
        assert unavailable(error)
    for reply in ["ERR unknown algorithm 'x'", "WRONGTYPE Operation against a key holding the wrong kind of value",
                  "NOPERM this user has no permissions", "ERR no such policy 'api'"]:
        assert not unavailable(parse(reply)), reply


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_the_direct_paths_packed_command_is_what_redis_py_sends(encoding):
    # The fast path sends its command packed by the package (all but the key packed once per
    # limit, verb and cost): byte for byte what redis-py's send_command packs, sync and asyncio.
    import redis.connection

    core = Core()
    limits = [Limit("gcra", 10, "1s"), Limit("token-bucket", 5, "250ms", burst=7, block="1m"),
              Limit("sliding-log", 10**12, 3_600_000)]
    keys = ["k", "user:é", "{tag}:" + "x" * 300]
    calls = [("CHECK", 1, None), ("CHECK", 0, None), ("PEEK", 3, None), ("REFUND", 2, None),
             ("TAKE", 9, None), ("CHECK", 1, 1_700_000_000_000)]
    for pack in (redis.connection.Connection(encoding=encoding).pack_command,
                 redis.asyncio.Connection(encoding=encoding).pack_command):
        for limit in limits:
            for key in keys:
                for verb, cost, at in calls * 2:  # the second time from the limit's cache
                    words = core.direct_args(verb, key, limit, cost, at)
                    want = b"".join(bytes(part) for part in pack(*words))
                    assert core.direct_packed(verb, key, limit, cost, at, (encoding, "strict")) == want
    with pytest.raises(TypeError):
        core.direct_packed("CHECK", "", limits[0], 1, None, ("utf-8", "strict"))
    with pytest.raises(ValueError):
        core.direct_packed("TAKE", "k", limits[0], 0, None, ("utf-8", "strict"))
