"""`RateLimit`: a Flask extension rate limiting every request of an app, or chosen views, with a
sync `RateLimiter`.

    limiter = RateLimiter.from_url("redis://localhost:6379")
    ratelimit = RateLimit(app, limiter=limiter, limit=Limit("sliding-window", 100, "1m"),
                          key=lambda request: request.headers.get("X-API-Key"))

    @app.post("/upload")
    @ratelimit.limit(Limit("token-bucket", 5, "1s"), name="upload")
    def upload(): ...

A request whose `key` is None (no API key here) is limited on its client address.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, List, Optional, Tuple, Union

from flask import Flask, Response, g, jsonify, request

from ._http import http_answer, refusal_body
from ._limiter import RateLimiter
from ._types import Decision, LimitSpec, RateLimitUnavailable, check_spec

KeyFunc = Callable[[Any], Optional[str]]


def client_address(req: Any) -> str:
    """The default key: `ip:` and Flask's `request.remote_addr` (the WSGI server's peer; behind a
    proxy, what werkzeug's `ProxyFix` sets from `X-Forwarded-For` for the proxies it is told
    to trust); `ip:unknown` where there is none."""
    return f"ip:{req.remote_addr or 'unknown'}"


def _identity(key: Optional[KeyFunc], req: Any) -> str:
    """The caller's identity (`key(req)`) where one is given, else its address."""
    found = None if key is None else key(req)
    if found is None or found == "":
        return client_address(req)
    if not isinstance(found, str) or not found:
        raise TypeError(f"key(request) must return a str or None, not {found!r}")
    return found


class RateLimit:
    """limiter: a `RateLimiter`; limit: the app-wide `Limit` or `Policy` checked before every
    request (None: only the views decorated with `.limit`); key: a function of Flask's
    `request`, the caller's identity, or where it is None (and without `key`) the client's
    address (`client_address`); skip: a function of the request, True for one not to limit
    nor count; name: the policy's name in the headers; cost: an int or a
    function of the request; refund_on: a function of the response's status (e.g.
    `lambda status: status >= 500`): such a response gets its cost back.

    Admitted: `RateLimit-Policy` and `RateLimit` on the response; refused: `429` with those,
    `Retry-After` and `{"error": "rate limited", "policy": name, "retry_after_ms": ...}`;
    Redis unavailable: the limiter's `on_error` ("closed": `503`). The decisions are in
    `flask.g.ratelimit` (a list of (name, Decision)).
    """

    def __init__(
        self,
        app: Optional[Flask] = None,
        *,
        limiter: RateLimiter,
        limit: Optional[LimitSpec] = None,
        key: Optional[KeyFunc] = None,
        skip: Optional[Callable[[Any], bool]] = None,
        name: str = "default",
        cost: Union[int, Callable[[Any], int]] = 1,
        refund_on: Optional[Callable[[int], bool]] = None,
    ):
        if not isinstance(limiter, RateLimiter):
            raise TypeError("the Flask RateLimit needs a (sync) RateLimiter")
        if limit is not None:
            check_spec(limit)
        if key is not None and not callable(key):
            raise TypeError("key must be a function of the request (or None: the client's address)")
        if skip is not None and not callable(skip):
            raise TypeError("skip must be a function of the request")
        self.skip = skip
        self.limiter = limiter
        self.default_limit = limit
        self.key = key
        self.name = name
        self.cost = cost
        self.refund_on = refund_on
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        app.extensions["redis_ratelimit"] = self
        app.before_request(self._before_request)
        app.after_request(self._after_request)

    def limit(
        self,
        limit: LimitSpec,
        *,
        key: Optional[KeyFunc] = None,
        name: Optional[str] = None,
        cost: Union[int, Callable[[Any], int]] = 1,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A view's own limit (checked after the app-wide one) on `key(request)`; by default (and
        where `key` answers None) the extension's key, or the client's address, prefixed with
        `name` (else the view's function name) and a colon, so that it never shares a key with
        the app-wide limit; `name` defaults to the extension's."""
        check_spec(limit)

        def own_key(req: Any) -> Optional[str]:
            # The app-wide key under the view's own name: another limit, another key.
            return f"{name or view_name}:{_identity(self.key, req)}"

        def view_key(req: Any) -> Optional[str]:
            found = None if key is None else key(req)
            return own_key(req) if found is None or found == "" else found

        view_name = "view"

        def decorate(view: Callable[..., Any]) -> Callable[..., Any]:
            nonlocal view_name
            view_name = view.__name__

            @functools.wraps(view)
            def limited(*args: Any, **kwargs: Any) -> Any:
                refused = self._decide(limit, view_key, name or self.name, cost)
                if refused is not None:
                    return refused
                return view(*args, **kwargs)

            return limited

        return decorate

    def _before_request(self) -> Optional[Response]:
        g.ratelimit = []
        g.ratelimit_refunds = []
        if self.default_limit is None:
            return None
        return self._decide(self.default_limit, self.key, self.name, self.cost)

    def _decide(self, limit: LimitSpec, key_func: Optional[KeyFunc], name: str, cost: Any) -> Optional[Response]:
        if self.skip is not None and self.skip(request):
            return None
        key = _identity(key_func, request)
        weight = cost if isinstance(cost, int) else cost(request)
        try:
            decision = self.limiter.check(key, limit, weight)
        except RateLimitUnavailable:
            response = jsonify({"error": "rate limiter unavailable"})
            response.status_code = 503
            return response
        if decision.source == "error":
            return None
        decisions: List[Tuple[str, Decision]] = g.setdefault("ratelimit", [])
        decisions.append((name, decision))
        g.setdefault("ratelimit_refunds", []).append((key, limit, weight, name))
        status, _ = http_answer([(name, decision)])
        if status == 429:
            response = jsonify(refusal_body(name, decision))
            response.status_code = 429
            g.ratelimit_refused = True
            return response
        return None

    def _after_request(self, response: Response) -> Response:
        decisions: List[Tuple[str, Decision]] = list(g.get("ratelimit", []))
        if not decisions:
            return response
        if self.refund_on is not None and self.refund_on(response.status_code) and not g.get("ratelimit_refused"):
            for i, (key, limit, weight, name) in enumerate(g.get("ratelimit_refunds", [])):
                try:
                    refunded = self.limiter.refund(key, limit, weight)
                except RateLimitUnavailable:
                    continue
                if refunded.source != "error":
                    decisions[i] = (name, refunded)
        overall = next((d for _, d in decisions if not d.allowed), decisions[-1][1])
        for header, value in http_answer(decisions, overall)[1].items():
            response.headers[header] = value
        return response


__all__ = ["RateLimit", "client_address"]
