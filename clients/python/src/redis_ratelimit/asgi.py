"""`RateLimitMiddleware`: rate limits any ASGI app (Starlette, FastAPI) with an
`AsyncRateLimiter`.

    app.add_middleware(RateLimitMiddleware, limiter=limiter, limit=Limit("sliding-window", 100, "1m"),
                       key=lambda request: request.headers.get("x-api-key"))

A request whose `key` is None (no API key here) is limited on its client address.

Needs Starlette (`pip install redis-ratelimit-client[fastapi]`) for the `Request` given to `key`.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple, Union

from starlette.requests import Request

from ._http import http_answer, refusal_body
from ._limiter import AsyncRateLimiter
from ._types import Decision, LimitSpec, RateLimitUnavailable, check_spec

KeyFunc = Callable[[Request], Union[Optional[str], Awaitable[Optional[str]]]]
CostFunc = Callable[[Request], Union[int, Awaitable[int]]]
SkipFunc = Callable[[Request], Union[bool, Awaitable[bool]]]


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def client_address(request: Request) -> str:
    """The default key: `ip:` and the address of the request's client, the ASGI scope's
    `client` (uvicorn fills it from `X-Forwarded-For` only for the proxies it trusts,
    `--forwarded-allow-ips`); `ip:unknown` where the server gives none (a Unix socket)."""
    client = request.scope.get("client")
    return f"ip:{client[0]}" if client else "ip:unknown"


async def request_key(request: Request, key: Optional[KeyFunc], prefix: str = "") -> str:
    """The caller's identity (`key(request)`) where one is given, else its address (after
    `prefix`)."""
    found = None if key is None else await _maybe_await(key(request))
    if found is None or found == "":
        return prefix + client_address(request)
    if not isinstance(found, str) or not found:
        raise TypeError(f"key(request) must return a str or None, not {found!r}")
    return found


class RateLimitMiddleware:
    """Limits each HTTP request on `key(request)`, the caller's identity (an API key, a user),
    or where it is None (and without `key`) on the client's address (`client_address`).

    limiter: an `AsyncRateLimiter`; limit: a `Limit` or a `Policy`; key: a function (or
    coroutine function) of the Starlette `Request`; skip: a function of the request, True for
    a request not to limit nor count (a health check); name: the policy's name in the headers;
    cost: an int or a function of the request; refund_on: a function of the response's status,
    e.g. `lambda status: status >= 500`: a request answered so gets its cost back (and its
    headers show the refund). The decision is in `request.state.ratelimit`.

    Admitted: the app answers, with `RateLimit-Policy` and `RateLimit`. Refused: `429` with
    those, `Retry-After` and `{"error": "rate limited", "policy": name, "retry_after_ms": ...}`.
    Redis unavailable: the limiter's `on_error`: "open" lets the request through without
    headers, "closed" answers `503 {"error": "rate limiter unavailable"}`.
    """

    def __init__(
        self,
        app: Any,
        *,
        limiter: AsyncRateLimiter,
        limit: LimitSpec,
        key: Optional[KeyFunc] = None,
        skip: Optional[SkipFunc] = None,
        name: str = "default",
        cost: Union[int, CostFunc] = 1,
        refund_on: Optional[Callable[[int], bool]] = None,
    ):
        if not isinstance(limiter, AsyncRateLimiter):
            raise TypeError("RateLimitMiddleware needs an AsyncRateLimiter")
        check_spec(limit)
        if key is not None and not callable(key):
            raise TypeError("key must be a function of the request (or None: the client's address)")
        if skip is not None and not callable(skip):
            raise TypeError("skip must be a function of the request")
        self.app = app
        self.limiter = limiter
        self.limit = limit
        self.key = key
        self.skip = skip
        self.name = name
        self.cost = cost
        self.refund_on = refund_on

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        if self.skip is not None and await _maybe_await(self.skip(request)):
            await self.app(scope, receive, send)
            return
        key = await request_key(request, self.key)
        cost = self.cost if isinstance(self.cost, int) else await _maybe_await(self.cost(request))
        try:
            decision = await self.limiter.check(key, self.limit, cost)
        except RateLimitUnavailable:
            await _send_json(send, 503, {"error": "rate limiter unavailable"}, {})
            return
        scope.setdefault("state", {})["ratelimit"] = decision
        status, headers = http_answer([(self.name, decision)])
        if status == 429:
            await _send_json(send, 429, refusal_body(self.name, decision), headers)
            return
        if decision.source == "error":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_with_headers(message: Dict[str, Any]) -> None:
            nonlocal started, headers
            if message["type"] == "http.response.start" and not started:
                started = True
                if self.refund_on is not None and self.refund_on(message["status"]):
                    headers = await self._refund(key, cost, headers)
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + _raw(headers)
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            if not started and self.refund_on is not None and self.refund_on(500):
                await self._refund(key, cost, headers)
            raise

    async def _refund(self, key: str, cost: int, headers: Dict[str, str]) -> Dict[str, str]:
        try:
            refunded = await self.limiter.refund(key, self.limit, cost)
        except RateLimitUnavailable:
            return headers
        if refunded.source == "error":
            return headers
        return http_answer([(self.name, refunded)])[1]


def _raw(headers: Dict[str, str]) -> List[Tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


async def _send_json(send: Any, status: int, body: Any, headers: Dict[str, str]) -> None:
    data = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": raw + _raw(headers)})
    await send({"type": "http.response.body", "body": data})


__all__ = ["Decision", "RateLimitMiddleware", "client_address"]
