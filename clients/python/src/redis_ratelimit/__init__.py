"""Rate limiting with the redis-ratelimit module, or its Redis Functions library where modules
cannot be loaded: `RateLimiter` (redis-py) and `AsyncRateLimiter` (`redis.asyncio`).

    from redis_ratelimit import RateLimiter, Limit
    limiter = RateLimiter.from_url("redis://localhost:6379")
    decision = limiter.check("api:alice", Limit("sliding-window", 100, "1m"))

Middleware: `redis_ratelimit.asgi`, `redis_ratelimit.fastapi`, `redis_ratelimit.flask`.
"""

from ._limiter import AsyncRateLimiter, Policies, RateLimiter
from ._types import (
    ALGORITHMS,
    Decision,
    Limit,
    MultiDecision,
    Policy,
    RateLimited,
    RateLimitUnavailable,
)

__version__ = "0.1.0"

__all__ = [
    "ALGORITHMS",
    "AsyncRateLimiter",
    "Decision",
    "Limit",
    "MultiDecision",
    "Policies",
    "Policy",
    "RateLimitUnavailable",
    "RateLimited",
    "RateLimiter",
]
