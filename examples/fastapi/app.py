"""The example API: `GET /` limited per X-API-Key (per client address without one), and
`POST /jobs`, which also holds a concurrency lease while it works and refunds its rate cost
when it fails. The rate limiting is
the redis-ratelimit-client package (clients/python): its ASGI middleware and its limiter.

Settings: REDIS_URL (default redis://127.0.0.1:6379), RATELIMIT_POLICY (default `examples`),
RATELIMIT_FAIL (`open` or `closed`, default the config's `fail`), RATELIMIT_CONFIG (default
ratelimit.json beside this file). Start it with run.sh.
"""

import asyncio
import json
import logging
import os
import time
from contextlib import asynccontextmanager
from pathlib import Path

import redis
from fastapi import Body, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from redis_ratelimit import AsyncRateLimiter, Limit, Policy, RateLimited, RateLimitUnavailable
from redis_ratelimit.asgi import RateLimitMiddleware, client_address

logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
log = logging.getLogger("ratelimit")

config_path = Path(os.environ.get("RATELIMIT_CONFIG") or Path(__file__).with_name("ratelimit.json"))
config = json.loads(config_path.read_text())
fail = os.environ.get("RATELIMIT_FAIL") or config.get("fail", "open")
if fail not in ("open", "closed"):
    raise SystemExit(f"RATELIMIT_FAIL must be open or closed, not {fail!r}")
algorithm, limit, period = config["limit"].split()
# The policy on a server with the module; the same limit inline where there are no policies
# (the Functions library), or if the policy disappears.
inline = Limit(algorithm, int(limit), period)
policy = Policy(os.environ.get("RATELIMIT_POLICY") or "examples", fallback=inline)
jobs = config["jobs"]
LIMITED = {"/", "/jobs"}

limiter = AsyncRateLimiter.from_url(
    os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"), timeout=2, on_error=fail
)


async def define_policy():
    """Defines the policy if it is missing (the module only) and says what is in use."""
    try:
        definition = await limiter.policies.get(policy.name)
    except redis.ResponseError as error:
        if "unknown command" not in str(error).lower():
            raise
        return  # no module: the limiter finds the library and says so
    if definition is None:
        await limiter.policies.set(policy.name, inline)
        log.info("ratelimit: policy '%s' did not exist: defined it as %s", policy.name, config["limit"])
    else:
        spec = " ".join(f"{k}={v}" for k, v in definition.items() if k != "mode")
        log.info("ratelimit: using the existing policy '%s' (%s), mode %s", policy.name, spec, definition["mode"])


@asynccontextmanager
async def lifespan(app):
    failing = "open (admitted, no headers)" if fail == "open" else "closed (503)"
    log.info("ratelimit: when Redis is unreachable, requests fail %s", failing)
    try:
        await define_policy()
        await limiter.detect_engine()  # logs the engine, loads the library if needed
    except RateLimitUnavailable as error:
        log.warning("ratelimit: Redis is unreachable (%s): requests fail %s", error.__cause__ or error, failing)
    yield
    await limiter.aclose()


def api_key(request: Request):
    """Who a request counts as: its X-API-Key (`api:<key>`), else its client address
    (`ip:<address>`, the package's default key)."""
    key = request.headers.get("x-api-key")
    return f'{config["key_prefix"]}:{key}' if key else client_address(request)


def not_limited(request: Request):
    """The paths outside the API (the docs) are not limited, not counted."""
    return request.url.path not in LIMITED


app = FastAPI(lifespan=lifespan)
# A request the route fails with a 5xx was not served: its cost goes back.
app.add_middleware(
    RateLimitMiddleware,
    limiter=limiter,
    limit=policy,
    key=api_key,
    skip=not_limited,
    name=policy.name,
    refund_on=lambda status: status >= 500,
)


class JobFailed(Exception):
    pass


@app.exception_handler(JobFailed)
async def job_failed(request, error):
    return JSONResponse({"error": "job failed"}, status_code=500)


@app.exception_handler(RateLimitUnavailable)
async def unavailable(request, error):  # a lease while failing closed
    return JSONResponse({"error": "rate limiter unavailable"}, status_code=503)


@app.exception_handler(RateLimited)
async def too_many_jobs(request, error):
    d = error.decision
    headers = {}
    if d.retry_after_ms >= 0:  # an upper bound: leases usually end sooner
        headers["Retry-After"] = str(-(-d.retry_after_ms // 1000))
    body = {"error": "too many jobs in flight", "limit": d.limit}
    return JSONResponse(body, status_code=429, headers=headers)


@app.get("/", response_class=PlainTextResponse)
async def index():
    return "ok"


@app.post("/jobs")
async def run_job(request: Request, job: dict = Body(default={})):
    """Runs a job of `work_ms` (at most 5000) ms holding a lease on `jobs:<api key>` (`jobs:ip:<address>` without one);
    `{"fail": true}` makes it fail with a 500."""
    work_ms = min(int(job.get("work_ms", 100)), 5000)
    lease_key = f'{jobs["key_prefix"]}:{request.headers.get("x-api-key") or client_address(request)}'
    # RateLimited (a 429, above) when the key has `limit` jobs running; the lease is released
    # when the block ends, however it ends, before the answer is sent.
    async with limiter.lease(lease_key, jobs["limit"], jobs["lease"]):
        started_ms = time.time() * 1000
        await asyncio.sleep(work_ms / 1000)
        finished_ms = time.time() * 1000
        if job.get("fail"):
            raise JobFailed()  # a 500, and the middleware refunds its rate cost
    return {"status": "done", "started_at_ms": started_ms, "finished_at_ms": finished_ms}
