"""`RateLimit`: a FastAPI dependency that rate limits one route (or a router) with an
`AsyncRateLimiter`.

    limited = RateLimit(limiter, Limit("sliding-window", 100, "1m"), key=lambda r: r.headers.get("x-api-key"))
    @app.get("/search", dependencies=[Depends(limited)])

Several on one route combine: their keys sharing one hash tag (`{alice}:sec`, `{alice}:hour`),
through one `check_all` (all or nothing); otherwise one after the other, each admitted limit's
cost refunded when a later one refuses.
"""

# No `from __future__ import annotations` here: FastAPI reads `__call__`'s annotations
# (Request, Response) at run time, and cannot resolve them as strings on Python 3.9.
from typing import Any, Dict, List, Optional, Tuple, Union

from fastapi import HTTPException, Request, Response

from ._http import hash_tag, http_answer, refusal_body
from ._limiter import AsyncRateLimiter
from ._types import Decision, LimitSpec, RateLimitUnavailable, check_spec
from .asgi import CostFunc, KeyFunc, SkipFunc, _maybe_await, request_key

_DONE = "redis_ratelimit_done"


class RateLimit:
    """A dependency limiting a route on `key(request)`, the caller's identity, or where it is
    None (and without `key`) on the client's address (`redis_ratelimit.asgi.client_address`);
    `skip(request)` True: not limited.

    Admitted: the route runs, and its response gets `RateLimit-Policy` and `RateLimit` (if the
    route returns a `Response` of its own, set them from `request.state.ratelimit` yourself).
    Refused: `HTTPException(429)` with those headers, `Retry-After`, and as `detail`
    `{"error": "rate limited", "policy": name, "retry_after_ms": ...}`. Redis unavailable: the
    limiter's `on_error` ("closed": `HTTPException(503)`).
    """

    def __init__(
        self,
        limiter: AsyncRateLimiter,
        limit: LimitSpec,
        *,
        key: Optional[KeyFunc] = None,
        skip: Optional[SkipFunc] = None,
        name: str = "default",
        cost: Union[int, CostFunc] = 1,
    ):
        if not isinstance(limiter, AsyncRateLimiter):
            raise TypeError("RateLimit needs an AsyncRateLimiter")
        check_spec(limit)
        if key is not None and not callable(key):
            raise TypeError("key must be a function of the request (or None: the client's address)")
        if skip is not None and not callable(skip):
            raise TypeError("skip must be a function of the request")
        self.limiter = limiter
        self.limit = limit
        self.key = key
        self.skip = skip
        self.name = name
        self.cost = cost

    async def __call__(self, request: Request, response: Response) -> Optional[Decision]:
        if getattr(request.state, _DONE, False):
            return None  # decided with the route's first RateLimit
        setattr(request.state, _DONE, True)
        group = _route_limits(request) or [self]
        if self not in group:
            group.insert(0, self)
        work: List[Tuple[RateLimit, str, int]] = []
        for limit in group:
            if limit.skip is not None and await _maybe_await(limit.skip(request)):
                continue
            # Each dependency its own address key: limits of a route never share one.
            key = await request_key(request, limit.key, f"{limit.name}:")
            cost = limit.cost if isinstance(limit.cost, int) else await _maybe_await(limit.cost(request))
            work.append((limit, key, cost))
        if not work:
            return None
        try:
            status, headers, overall, refused = await _decide(work)
        except RateLimitUnavailable:
            raise HTTPException(503, detail={"error": "rate limiter unavailable"}) from None
        request.state.ratelimit = overall
        if status == 429:
            raise HTTPException(429, detail=refusal_body(refused.name, overall), headers=headers)
        response.headers.update(headers)
        return overall if isinstance(overall, Decision) else None


async def _decide(work: List[Tuple[RateLimit, str, int]]) -> Tuple[int, Dict[str, str], Any, "RateLimit"]:
    """(status, headers, the overall decision, the first limit that refused or the first)."""
    limiter = work[0][0].limiter
    same_limiter = all(w[0].limiter is limiter for w in work)
    same_cost = len({w[2] for w in work}) == 1
    if len(work) > 1 and same_limiter and same_cost and len({hash_tag(w[1]) for w in work}) == 1:
        multi = await limiter.check_all([(key, lim.limit) for lim, key, _ in work], cost=work[0][2])
        status, headers = http_answer([(w[0].name, d) for w, d in zip(work, multi.limits)], multi)
        refused = next((w[0] for w, d in zip(work, multi.limits) if not d.allowed), work[0][0])
        return status, headers, multi, refused
    decided: List[Tuple[RateLimit, str, int, Decision]] = []
    for lim, key, cost in work:
        d = await lim.limiter.check(key, lim.limit, cost)
        decided.append((lim, key, cost, d))
        if not d.allowed:
            for earlier, k, c, e in decided[:-1]:
                if e.source != "error" and c > 0:
                    await earlier.limiter.refund(k, earlier.limit, c)
            break
    last = decided[-1]
    status, headers = http_answer([(lim.name, d) for lim, _, _, d in decided], last[3])
    return status, headers, last[3], last[0]


def _route_limits(request: Request) -> List[RateLimit]:
    """The route's RateLimit dependencies, in order (the route's, its router's, nested)."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    found: List[RateLimit] = []

    def walk(node: Any) -> None:
        for sub in getattr(node, "dependencies", []) or []:
            if isinstance(sub.call, RateLimit) and sub.call not in found:
                found.append(sub.call)
            walk(sub)

    walk(dependant)
    return found


__all__ = ["RateLimit"]
