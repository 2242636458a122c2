"""The HTTP answer to decisions: status and the rate-limit fields of
draft-ietf-httpapi-ratelimit-headers-10, derived from the replies as the repository's README
derives them. Pure: the middleware of every framework uses it, and none parses a reply."""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple, Union

from ._types import Decision, MultiDecision


def ceil_s(ms: int) -> int:
    """Milliseconds as whole seconds, rounded up."""
    return -(-ms // 1000)


def http_answer(
    limits: Sequence[Tuple[str, Decision]], overall: Union[Decision, MultiDecision, None] = None
) -> Tuple[int, Dict[str, str]]:
    """(status, headers) for the decisions of one request: `limits` is (name, decision) per
    limit, `overall` the decision that admits or refuses (default: the only limit's).

    - `RateLimit-Policy: "name";q=<limit>;w=<period s>` per limit (without `w` where the period
      is unknown);
    - `RateLimit: "name";r=<remaining>;t=<s>` per limit, t = ⌈reset_after_ms/1000⌉ where it
      admits, ⌈retry_after_ms/1000⌉ where it refuses, and no item where it never can (-1);
    - refused: 429, and `Retry-After: ⌈retry_after_ms/1000⌉` of the overall decision unless -1.
    Decisions of `source="error"` (Redis unavailable, failing open) give 200 and no headers.
    """
    if overall is None:
        overall = limits[0][1]
    if overall.source == "error":
        return 200, {}
    policies: List[str] = []
    items: List[str] = []
    for name, d in limits:
        item = f'"{name}";q={d.limit}'
        if d.period_ms > 0:
            item += f";w={ceil_s(d.period_ms)}"
        policies.append(item)
        wait = d.reset_after_ms if d.allowed else d.retry_after_ms
        if wait >= 0:
            items.append(f'"{name}";r={d.remaining};t={ceil_s(wait)}')
    headers = {"RateLimit-Policy": ", ".join(policies)}
    if items:
        headers["RateLimit"] = ", ".join(items)
    if overall.allowed:
        return 200, headers
    if overall.retry_after_ms >= 0:
        headers["Retry-After"] = str(ceil_s(overall.retry_after_ms))
    return 429, headers


def refusal_body(name: str, decision: Union[Decision, MultiDecision]) -> Dict[str, object]:
    """The JSON body of a 429."""
    return {"error": "rate limited", "policy": name, "retry_after_ms": decision.retry_after_ms}


def hash_tag(key: str) -> str:
    """The part of `key` Redis Cluster hashes: the first non-empty `{...}`, else the key."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key
