"""The wire format: the words of each command (checked arguments, inline limits, the library's
FCALL arguments) and what replies mean (RESP2 arrays, RESP3 maps, the library's arrays read into
`Decision`s; a policy's definition; which errors mean Redis is unavailable). No I/O, no state:
the engine (`_engine.py`) sends what this builds and reads replies with it.
"""

from __future__ import annotations

import asyncio
import re
from importlib import resources
from typing import Any, Dict, List, Optional, Sequence, Tuple

import redis

from ._types import (
    BURST_ALGORITHMS,
    Decision,
    Limit,
    LimitSpec,
    MultiDecision,
    check_spec,
    new_decision,
    one_argument,
    period_ms,
)

FIELDS = ("allowed", "limit", "remaining", "retry_after_ms", "reset_after_ms", "delay_ms")
LIBRARY_NAME = "ratelimit"
#: Error replies that mean the server cannot serve now (not the caller's mistake).
_UNAVAILABLE_REPLIES = ("BUSY ", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "OOM", "READONLY")
_UNAVAILABLE_TYPES: Tuple[type, ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    asyncio.TimeoutError,
    OSError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
)


def unavailable(error: BaseException) -> bool:
    """Whether `error` means Redis is down, refuses or did not answer in time (rather than an
    error reply to a bad call)."""
    if isinstance(error, _UNAVAILABLE_TYPES):
        return True
    if isinstance(error, redis.ResponseError):
        text = str(error)
        return text.startswith(_UNAVAILABLE_REPLIES) or getattr(error, "status_code", None) in (
            "OOM",
            "LOADING",
        )
    return False


def as_text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def reply_fields(reply: Any) -> Dict[str, Any]:
    """A field/value reply (a flat list under RESP2, a map under RESP3) as a dict of str keys."""
    items = list(reply.items()) if isinstance(reply, dict) else list(zip(reply[::2], reply[1::2]))
    return {as_text(k): as_text(v) for k, v in items}


def parse_decision(
    reply: Any, source: str, period: int = 0, enforced_refused: bool = False, cost: int = 0, take: bool = False
) -> Decision:
    """One decision from a RESP3 map (`allowed`, or TAKE's `granted`) or six integers (RESP2,
    the library). `granted`: TAKE's first field; else `cost` when allowed, 0 when not.
    `enforced_refused`: a shadow policy's enforcement refused the call, so it is
    `shadow_rejected` if it was admitted (a refused call admitted nothing)."""
    if isinstance(reply, dict):
        if b"limit" in reply:  # the module's map as redis-py reads it (bytes keys): no copy
            values = [
                reply[b"granted" if take else b"allowed"],
                reply[b"limit"],
                reply[b"remaining"],
                reply[b"retry_after_ms"],
                reply[b"reset_after_ms"],
                reply[b"delay_ms"],
            ]
        else:
            named = {(k.decode() if type(k) is bytes else k): v for k, v in reply.items()}
            values = [named["granted" if take and field == "allowed" else field] for field in FIELDS]
    else:
        values = reply
    first, limit, remaining, retry_after_ms, reset_after_ms, delay_ms = (
        int(values[0]),
        int(values[1]),
        int(values[2]),
        int(values[3]),
        int(values[4]),
        int(values[5]),
    )
    granted = first if take else (cost if first else 0)
    allowed = granted > 0 if take else bool(first)
    return new_decision(
        allowed,
        limit,
        remaining,
        retry_after_ms,
        reset_after_ms,
        delay_ms,
        source,
        enforced_refused and allowed,
        period,
        granted,
    )


def parse_multi(
    reply: Any, source: str, periods: Sequence[int], shadow: Sequence[bool] = (), cost: int = 0
) -> MultiDecision:
    """A CHECKALL reply (RESP2: the overall decision then one per key; RESP3: the overall map
    with its `limits`)."""
    if isinstance(reply, dict):
        named = {as_text(k): v for k, v in reply.items()}
        overall, each = named, list(named["limits"])
    else:
        overall, each = reply[0], list(reply[1:])
    shadow = list(shadow) or [False] * len(each)
    limits = [parse_decision(r, source, p, s, cost) for r, p, s in zip(each, periods, shadow)]
    top = parse_decision(overall, source)
    return MultiDecision(
        top.allowed,
        top.limit,
        top.remaining,
        top.retry_after_ms,
        top.reset_after_ms,
        top.delay_ms,
        source,
        # (A refused call admitted nothing: never shadow_rejected.)
        top.allowed and any(d.shadow_rejected for d in limits),
        limits,
    )


def pack_parts(command: str, words: Sequence[str]) -> Tuple[bytes, bytes]:
    """A command whose second word (the key) is left out, RESP-encoded as redis-py sends it:
    (the array's header and first word, every word after the key). The words are ASCII."""
    head = b"*%d\r\n$%d\r\n%s\r\n" % (len(words) + 2, len(command), command.encode())
    return head, b"".join(b"$%d\r\n%s\r\n" % (len(w), w.encode()) for w in words)


def pack(parts: Tuple[bytes, bytes], key: bytes) -> bytes:
    """The whole command of `pack_parts`, with its key (encoded as the client encodes it)."""
    return b"%s$%d\r\n%s\r\n%s" % (parts[0], len(key), key, parts[1])


def library_code() -> str:
    """The package's copy of lua-reference/functions/ratelimit.lua."""
    return resources.files(__package__).joinpath("ratelimit.lua").read_text(encoding="utf-8")


def library_functions(code: str) -> List[str]:
    return re.findall(r"function_name\s*=\s*'([a-z_]+)'", code)


class Definition:
    """A policy as the server defines it (`RATELIMIT.POLICY GET`), as far as calls need it."""

    def __init__(self, fields: Dict[str, Any]):
        self.fields = fields
        self.algorithm = fields["algorithm"]
        self.shadow = fields.get("mode") == "shadow"
        self.period_ms = int(fields.get("period_ms", fields.get("lease_ms", 0)))

    def limit(self) -> Optional[Limit]:
        """The same limit as a `Limit` (None for a concurrency policy)."""
        try:
            burst = int(self.fields["burst"]) if self.algorithm in BURST_ALGORITHMS else None
            block = int(self.fields.get("block_ms") or 0) or None
            return Limit(self.algorithm, int(self.fields["limit"]), self.period_ms, burst=burst, block=block)
        except (KeyError, ValueError, TypeError):
            return None

    def inline(self) -> List[str]:
        """The same limit as inline arguments (to PEEK what enforcement would answer)."""
        words = [self.algorithm, str(self.fields["limit"]), f"{self.period_ms}ms"]
        if self.algorithm in BURST_ALGORITHMS:
            words += ["BURST", str(self.fields["burst"])]
        if int(self.fields.get("block_ms") or 0) > 0:
            words += ["BLOCK", f"{self.fields['block_ms']}ms"]
        return words


#: The command whose arity (`COMMAND INFO`) says how the module takes a limit spec: -3, as one
#: argument too (`"token-bucket 10 1s BURST 20"`); an older module's -4, only as words.
SPEC_PROBE = "RATELIMIT.CHECK"
ONE_ARG_ARITY = -3


def spec_args(words: Sequence[str], one_arg: Optional[bool]) -> Tuple[str, ...]:
    """A limit spec's words (`algorithm limit period [BURST c] [BLOCK d]`, `POLICY name`) as the
    module's CHECK, PEEK, TAKE, REFUND and CHECKALL take them: one argument (`one_arg`: the
    module takes that, the same call in fewer arguments; `one_argument`), else the words."""
    return one_argument(words) if one_arg else tuple(words)


#: An older module's reply to a spec sent as one argument (it reads the whole as an algorithm).
_ONE_ARG_REFUSED = re.compile(r"unknown algorithm '[^']* [^']*'")


def one_arg_refused(error: BaseException) -> bool:
    """Whether `error` is a module's refusal of a spec sent as one argument: a server that does
    not take that form (an older module: a cluster's node not upgraded yet, a failover to one)."""
    return isinstance(error, redis.ResponseError) and _ONE_ARG_REFUSED.search(str(error)) is not None


def command_arity(reply: Any) -> Optional[int]:
    """The arity in `COMMAND INFO name`'s raw reply (`[[name, arity, flags, ...]]`; `[nil]` where
    the server has no such command; a cluster client's {node: reply} of one node); None where it
    says none."""
    if isinstance(reply, dict):
        reply = next(iter(reply.values()), None)
    if not isinstance(reply, (list, tuple)) or not reply:
        return None
    info = reply[0]
    if not isinstance(info, (list, tuple)) or len(info) < 2:
        return None
    try:
        return int(info[1])
    except (TypeError, ValueError):
        return None


COMMANDS = {verb: f"RATELIMIT.{verb}" for verb in ("CHECK", "PEEK", "REFUND", "TAKE")}
FUNCTIONS = {
    "CHECK": "ratelimit_check",
    "PEEK": "ratelimit_peek",
    "REFUND": "ratelimit_refund",
    "TAKE": "ratelimit_take",
}
NO_SUCH_POLICY = re.compile(r"no such policy '([^']*)'")


def unknown_command(error: Exception) -> bool:
    """The server has no such command (a cluster client says so before sending it)."""
    text = str(error).lower()
    return "unknown command" in text or "command doesn't exist in redis commands" in text


def check_at(at: object) -> Optional[int]:
    """`at`: the call's time in ms since the Unix epoch (the module's `AT`), an int from 0 to
    below 2^53, or None (the server's clock)."""
    if at is None:
        return None
    if isinstance(at, bool) or not isinstance(at, int):
        raise TypeError(f"at must be an int of ms since the Unix epoch, not {type(at).__name__}")
    if not 0 <= at < 2**53:
        raise ValueError(f"at must be from 0 to below 2^53 ms, not {at}")
    return at


def check_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise TypeError(f"a key is a non-empty str, not {key!r}")
    return key


def check_lease_id(lease_id: object) -> str:
    if not isinstance(lease_id, str) or not 1 <= len(lease_id.encode()) <= 128:
        raise ValueError(f"a lease id is a str of 1 to 128 bytes, not {lease_id!r}")
    return lease_id


def duration_word(value: Any) -> str:
    return value.strip() if isinstance(value, str) else f"{period_ms(value)}ms"


def spec_period(spec: LimitSpec) -> int:
    """The period known without asking the server (a Limit's, a Policy's fallback's), else 0."""
    spec = check_spec(spec)
    if isinstance(spec, Limit):
        return spec.period_ms
    return spec.fallback.period_ms if spec.fallback else 0
