"""The example API: `GET /` limited per X-API-Key, and `POST /jobs`, which also holds a
concurrency lease while it works and refunds its rate cost when it fails.

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

import redis.asyncio as aioredis
from fastapi import Body, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from ratelimit import RateLimiter, RateLimitMiddleware, ceil_s

logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")

config_path = Path(os.environ.get("RATELIMIT_CONFIG") or Path(__file__).with_name("ratelimit.json"))
config = json.loads(config_path.read_text())
library_path = config_path.parent / config["functions_library"]
fail = os.environ.get("RATELIMIT_FAIL") or config.get("fail", "open")
if fail not in ("open", "closed"):
    raise SystemExit(f"RATELIMIT_FAIL must be open or closed, not {fail!r}")

client = aioredis.Redis.from_url(
    os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"), socket_connect_timeout=1, socket_timeout=2
)
limiter = RateLimiter(
    client,
    os.environ.get("RATELIMIT_POLICY") or "examples",
    config["limit"].split(),
    fail_open=fail == "open",
    library=library_path.read_text() if library_path.is_file() else None,
    leases=config["jobs"],
)


@asynccontextmanager
async def lifespan(app):
    await limiter.start()
    yield
    await client.aclose()


app = FastAPI(lifespan=lifespan)
class JobFailed(Exception):
    pass


@app.exception_handler(JobFailed)
async def job_failed(request, error):
    return JSONResponse({"error": "job failed"}, status_code=500)


app.add_middleware(RateLimitMiddleware, limiter=limiter, paths={"/", "/jobs"}, prefix=config["key_prefix"])


@app.get("/", response_class=PlainTextResponse)
async def index():
    return "ok"


@app.post("/jobs")
async def jobs(request: Request, job: dict = Body(default={})):
    """Runs a job of `work_ms` (at most 5000) ms holding a lease on `jobs:<api key>`;
    `{"fail": true}` makes it fail with a 500."""
    work_ms = min(int(job.get("work_ms", 100)), 5000)
    lease_key = f'{config["jobs"]["key_prefix"]}:{request.headers["x-api-key"]}'
    async with limiter.lease(lease_key) as acquired:
        if acquired is not None and not acquired["allowed"]:
            headers = {}
            if acquired["retry_after_ms"] >= 0:  # an upper bound: leases usually end sooner
                headers["Retry-After"] = str(ceil_s(acquired["retry_after_ms"]))
            body = {"error": "too many jobs in flight", "limit": acquired["limit"]}
            return JSONResponse(body, status_code=429, headers=headers)
        started_ms = time.time() * 1000
        await asyncio.sleep(work_ms / 1000)
        finished_ms = time.time() * 1000
        # The lease is released when this block ends, however it ends, before the answer is sent.
        if job.get("fail"):
            raise JobFailed()  # a 500, and the middleware refunds its rate cost
    return {"status": "done", "started_at_ms": started_ms, "finished_at_ms": finished_ms}
