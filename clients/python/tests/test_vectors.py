"""The conformance vectors (tests/vectors/v1.json at the repository's top, generated from the
core crate; the format is in tests/vectors/README.md) replayed by the in-process algorithms
(`on_error="local"`'s `LocalLimiter`): every timeline, every call (CHECK, PEEK, TAKE, REFUND,
RESET with their `now_ms`), the same reply integer for integer, and after each call the same
stored key: absent when the vector's is, else the same expiry, `last`, parameters, block and
state in exact integers. No server: the vectors are the module's answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from redis_ratelimit import Limit
from redis_ratelimit._local import LocalLimiter

VECTORS = Path(__file__).resolve().parents[3] / "tests" / "vectors" / "v1.json"
I64_MAX = 2**63 - 1


def load() -> Dict[str, Any]:
    with VECTORS.open() as file:
        vectors = json.load(file)
    assert vectors["version"] == 1, f"{VECTORS}: version {vectors['version']}"
    return vectors


GROUPS: List[Dict[str, Any]] = load()["groups"]


def limit_of(call: Dict[str, Any]) -> Limit:
    block = call.get("block_ms")
    return Limit(call["algorithm"], call["limit"], call["period_ms"], burst=call.get("burst"),
                 block=None if block is None else f"{block}ms")


def state_of(algorithm: str, state: Any) -> Dict[str, Any]:
    """A local state in the vectors' normalized form."""
    if algorithm == "token-bucket":
        return {"tokens_scaled": str(state)}
    if algorithm == "leaky-bucket":
        return {"level_scaled": str(state)}
    if algorithm == "gcra":
        return {"ahead_scaled": str(state)}
    if algorithm == "fixed-window":
        return {"window_start_ms": state[0], "count": state[1]}
    if algorithm == "sliding-window":
        return {"window_start_ms": state[0], "current": state[1], "previous": state[2]}
    runs: List[List[int]] = []
    for ts, count in state:
        if runs and runs[-1][0] == ts:
            runs[-1][1] += count
        else:
            runs.append([ts, count])
    return {"runs": runs}


def stored_of(local: LocalLimiter, key: str) -> Optional[Dict[str, Any]]:
    stored = local._keys.get(key)
    if stored is None:
        return None
    limit, period, capacity = stored.params
    return {
        "expires_at_ms": min(stored.expires_at(), I64_MAX),
        "last_ms": stored.last,
        "limit": limit,
        "period_ms": period,
        "burst": capacity,
        "blocked_until_ms": stored.blocked_until,
        "state": state_of(stored.algorithm, stored.state),
    }


def expected_stored(call: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    stored = call["stored"]
    if stored is None:
        return None
    return {name: value for name, value in stored.items() if name != "info"}


def apply(local: LocalLimiter, key: str, call: Dict[str, Any]) -> Any:
    op = call["op"]
    if op == "reset":
        return local.reset(key)
    limit, at = limit_of(call), call["at"]
    if op == "take":
        granted, fields = local.take(key, limit, call["max"], at)
        return [granted] + [int(v) for v in fields[1:]]
    if op == "check":
        fields = local.check(key, limit, call["cost"], at)
    elif op == "peek":
        fields = local.peek(key, limit, call["cost"], at)
    else:
        fields = local.refund(key, limit, call["cost"], at)
    return [int(v) for v in fields]


def test_the_vectors_cover_every_algorithm_and_operation() -> None:
    calls = [call for group in GROUPS for call in group["calls"]]
    assert len(calls) >= 500
    assert {call["op"] for call in calls} == {"check", "peek", "take", "refund", "reset"}
    assert {call.get("algorithm") for call in calls} - {None} == {
        "token-bucket", "leaky-bucket", "fixed-window", "sliding-window", "sliding-log", "gcra"}


@pytest.mark.parametrize("group", GROUPS, ids=[group["name"] for group in GROUPS])
def test_local_replays_the_vectors(group: Dict[str, Any]) -> None:
    local = LocalLimiter()
    key = group["key"]
    for i, call in enumerate(group["calls"]):
        where = f"{group['name']} call {i}: {json.dumps({k: v for k, v in call.items() if k != 'stored'})}"
        assert apply(local, key, call) == call["reply"], where
        assert stored_of(local, key) == expected_stored(call), where
