"""A limit spec as one argument: where the module's `RATELIMIT.CHECK` has arity -3 (`COMMAND INFO`,
asked once with the engine's detection), every spec of CHECK, PEEK, TAKE, REFUND and CHECKALL goes
as one argument, its words joined by single spaces (`"token-bucket 10 1s BURST 20"`, `"POLICY
api"`); elsewhere (arity -4, no answer, an error reply, the Functions library) as words. The plans
without a server (what is asked, the exact words sent both ways on every path), then real servers:
the same sequences both ways answer the same decisions."""

from __future__ import annotations

import asyncio
import random

import pytest
import redis
import redis.asyncio

from redis_ratelimit import AsyncRateLimiter, Limit, Policy, RateLimiter
from redis_ratelimit._engine import Call, CommandInfo, Core, ListLibrary, LoadLibrary, Transaction
from redis_ratelimit._wire import command_arity, library_code

from test_equivalence import T0

DECISION = [1, 10, 9, 0, 100, 0]
GRANT = [4, 10, 6, 0, 100, 0]  # TAKE's: 4 units (whatever its MAX: a batch then holds 3 to give back)
LIMIT = Limit("token-bucket", 10, "1s", burst=20, block="1m")
WINDOW = Limit("sliding-window", 100, "1m")


def info(arity):
    """COMMAND INFO RATELIMIT.CHECK's raw reply for a module of that arity."""
    return [[b"ratelimit.check", arity, [b"write", b"fast"], 1, 1, 1, [], [], [], []]]


class Script:
    """Answers a plan's operations as a server would: `arity` for COMMAND INFO (an exception is
    raised), policies by name (a dict of POLICY GET fields, or absent), every decision DECISION.
    `sent`: the operations, in order."""

    def __init__(self, arity=-3, policies=None, module=True):
        self.arity = arity
        self.old = False  # True: the server refuses specs as one argument (an older module)
        self.policies = policies or {}
        self.module = module
        self.sent = []
        self.library_loaded = False

    def answer(self, op):
        self.sent.append(op)
        if isinstance(op, CommandInfo):
            assert op.name == "RATELIMIT.CHECK"
            if isinstance(self.arity, Exception):
                raise self.arity
            return [None] if self.arity is None else info(self.arity)
        if isinstance(op, ListLibrary):
            return [] if not self.library_loaded else [[b"library_name", b"ratelimit", b"functions", []]]
        if isinstance(op, LoadLibrary):
            self.library_loaded = True
            return b"ratelimit"
        if isinstance(op, Transaction):
            return [self.reply(call) for call in op.calls]
        return self.reply(op.args)

    def reply(self, args):
        name = args[0]
        if name.startswith("RATELIMIT.") and not self.module:
            raise redis.ResponseError(f"unknown command '{name}', with args beginning with: ")
        if self.old and name in DECIDING and any(" " in str(a) for a in args):
            joined = next(a for a in args if " " in str(a))
            raise redis.ResponseError(f"ERR unknown algorithm '{joined}': expected token-bucket, leaky-bucket, ...")
        if args[:2] == ("RATELIMIT.POLICY", "LIST"):
            return [name.encode() for name in self.policies]
        if args[:2] == ("RATELIMIT.POLICY", "GET"):
            fields = self.policies.get(args[2])
            return None if fields is None else [w for k, v in fields.items() for w in (k.encode(), v)]
        if name == "RATELIMIT.CHECKALL":
            return [DECISION] * (1 + int(args[1]))
        if name == "FCALL" and args[1] == "ratelimit_checkall":
            return [DECISION] * (1 + int(args[2]))
        return GRANT if name == "RATELIMIT.TAKE" or args[1] == "ratelimit_take" else DECISION


def drive(plan, script):
    """Runs `plan` against `script`: its result."""
    reply, error = None, None
    while True:
        try:
            op = plan.throw(error) if error is not None else plan.send(reply)
        except StopIteration as stop:
            return stop.value
        reply, error = None, None
        try:
            reply = script.answer(op)
        except Exception as e:  # noqa: BLE001 - thrown into the plan, as the runners do
            error = e


def commands(script):
    """The decision commands sent (calls, and those of transactions), as tuples of str."""
    out = []
    for op in script.sent:
        calls = op.calls if isinstance(op, Transaction) else (op.args,) if isinstance(op, Call) else ()
        out += [tuple(str(w) for w in call) for call in calls if call[0] != "RATELIMIT.POLICY"]
    return out


def test_the_arity_is_read_from_the_raw_reply():
    assert command_arity(info(-3)) == -3 and command_arity(info(-4)) == -4
    assert command_arity([None]) is None and command_arity([]) is None and command_arity(None) is None
    assert command_arity({"127.0.0.1:7000": info(-3)}) == -3  # a cluster client's reply of one node
    assert command_arity([[b"ratelimit.check", b"x"]]) is None


@pytest.mark.parametrize(
    "arity, one_arg",
    [(-3, True), (-4, False), (-5, False), (None, False), (redis.ResponseError("NOPERM no permission"), False)],
)
def test_the_detection_asks_the_arity_once(arity, one_arg):
    for engine in ("auto", "module"):
        core, script = Core(engine=engine), Script(arity)
        assert drive(core.detect(), script) == "module"
        asked = [type(op) for op in script.sent]
        assert asked == ([Call] if engine == "auto" else []) + [CommandInfo]
        assert core.one_arg is one_arg
        drive(core.detect(), script)
        drive(core.decide("CHECK", "k", LIMIT, 1), script)
        assert [type(op) for op in script.sent].count(CommandInfo) == 1, "asked once"
        assert core.direct_ok("CHECK", LIMIT)


def test_asked_after_the_first_answer_and_again_after_redis_was_unavailable():
    core, script = Core(engine="module"), Script(redis.ConnectionError("refused"))
    assert drive(core.decide("CHECK", "k", LIMIT, 1), script).source == "module", "the call's own outcome stands"
    assert [type(op) for op in script.sent] == [Call, CommandInfo], "asked once the module answered"
    assert core.one_arg is None and not core.direct_ok("CHECK", LIMIT), "no direct path before it is known"
    script.arity = -3
    drive(core.decide("CHECK", "k", LIMIT, 1), script)
    drive(core.decide("CHECK", "k", LIMIT, 1), script)
    assert core.one_arg is True and [type(op) for op in script.sent].count(CommandInfo) == 2
    words = ("token-bucket", "10", "1s", "BURST", "20", "BLOCK", "1m")
    assert commands(script) == [("RATELIMIT.CHECK", "k", *words, "COST", "1")] * 2 + [
        ("RATELIMIT.CHECK", "k", " ".join(words), "COST", "1")
    ]
    # A server that does not answer is not asked: the call fails as it would have.
    down, script = Core(engine="module"), Script(-3)
    script.reply = lambda args: (_ for _ in ()).throw(redis.ConnectionError("refused"))
    with pytest.raises(redis.ConnectionError):
        drive(down.decide("CHECK", "k", LIMIT, 1), script)
    assert [type(op) for op in script.sent] == [Call] and down.one_arg is None


def test_a_batch_take_is_not_followed_by_the_question():
    # (its grant must land in the batch however the caller's wait ends)
    core, script = Core(engine="module"), Script(-3)
    drive(core.request("CHECK", "k", Limit("gcra", 10, "1s", batch="50ms"), 1), script)
    assert [type(op) for op in script.sent] == [Call] and core.one_arg is None


def test_the_library_is_never_asked_and_keeps_the_words():
    core, script = Core(engine="library"), Script(-3, module=False)
    drive(core.detect(), script)
    drive(core.decide("CHECK", "k", LIMIT, 2), script)
    drive(core.check_all([("a", LIMIT), ("b", Policy("p", fallback=WINDOW))], 1), script)
    assert not any(isinstance(op, CommandInfo) for op in script.sent) and core.one_arg is None
    core.one_arg = True  # (even so: the library's functions take words)
    drive(core.decide("TAKE", "k", Policy("p", fallback=WINDOW), 5), script)
    assert commands(script) == [
        ("FCALL", "ratelimit_check", "1", "fn:k", "token-bucket", "10", "1s", "BURST", "20", "BLOCK", "1m", "COST", "2"),
        ("FCALL", "ratelimit_checkall", "2", "fn:a", "fn:b", "token-bucket", "10", "1s", "BURST", "20", "BLOCK", "1m",
         "sliding-window", "100", "1m", "COST", "1"),
        ("FCALL", "ratelimit_take", "1", "fn:k", "sliding-window", "100", "1m", "MAX", "5"),
    ]


def test_auto_without_the_module_never_asks():
    core, script = Core(), Script(None, module=False)
    assert drive(core.decide("CHECK", "k", WINDOW, 1), script).source == "library"
    drive(core.decide("CHECK", "k", WINDOW, 1), script)
    assert not any(isinstance(op, CommandInfo) for op in script.sent) and core.one_arg is None
    assert commands(script)[-1] == ("FCALL", "ratelimit_check", "1", "fn:k", "sliding-window", "100", "1m", "COST", "1")


POLICIES = {
    "api": {"algorithm": b"sliding-window", "limit": 100, "period_ms": 60000, "mode": b"enforce", "block_ms": 0},
    "dark": {"algorithm": b"gcra", "limit": 5, "period_ms": 1000, "burst": 8, "mode": b"shadow", "block_ms": 2000},
}


def spec(words, one_arg):
    return (" ".join(words),) if one_arg else tuple(words)


@pytest.mark.parametrize("one_arg", [False, True])
def test_every_command_sends_its_spec_in_the_form_found(one_arg):
    core, script = Core(engine="module"), Script(-3 if one_arg else -4, POLICIES)
    drive(core.detect(), script)
    lim = ("token-bucket", "10", "1s", "BURST", "20", "BLOCK", "1m")
    api, dark = ("POLICY", "api"), ("POLICY", "dark")
    gone = Policy("gone", fallback=WINDOW)
    drive(core.decide("CHECK", "k", LIMIT, 1), script)
    drive(core.decide("PEEK", "k", LIMIT, 2, at=T0), script)
    drive(core.decide("TAKE", "k", LIMIT, 7), script)
    drive(core.decide("REFUND", "k", LIMIT, 3), script)
    drive(core.decide("CHECK", "k", Policy("api"), 1), script)
    drive(core.decide("TAKE", "k", Policy("api"), 4), script)
    drive(core.decide("CHECK", "k", Policy("dark"), 1), script)  # a shadow policy: enforcement's PEEK beside it
    drive(core.decide("CHECK", "k", gone, 1), script)  # no such policy: its fallback
    drive(core.decide("CHECK", "k", Policy("nope"), 1), script)  # none either: the module says so
    drive(core.check_all([("a", LIMIT), ("b", Policy("api")), ("c", gone)], 2, at=T0), script)
    drive(core.check_all([("a", WINDOW), ("b", Policy("dark"))], 1), script)
    s = lambda words: spec(words, one_arg)  # noqa: E731
    window = ("sliding-window", "100", "1m")
    dark_inline = ("gcra", "5", "1000ms", "BURST", "8", "BLOCK", "2000ms")
    assert commands(script) == [
        ("RATELIMIT.CHECK", "k", *s(lim), "COST", "1"),
        ("RATELIMIT.PEEK", "k", *s(lim), "COST", "2", "AT", str(T0)),
        ("RATELIMIT.TAKE", "k", *s(lim), "MAX", "7"),
        ("RATELIMIT.REFUND", "k", *s(lim), "COST", "3"),
        ("RATELIMIT.CHECK", "k", *s(api), "COST", "1"),
        ("RATELIMIT.TAKE", "k", *s(api), "MAX", "4"),
        ("RATELIMIT.PEEK", "k", *s(dark_inline), "COST", "1"),
        ("RATELIMIT.CHECK", "k", *s(dark), "COST", "1"),
        ("RATELIMIT.CHECK", "k", *s(window), "COST", "1"),
        ("RATELIMIT.CHECK", "k", *s(("POLICY", "nope")), "COST", "1"),
        ("RATELIMIT.CHECKALL", "3", "a", "b", "c", *s(lim), *s(api), *s(window), "COST", "2", "AT", str(T0)),
        ("RATELIMIT.PEEK", "b", *s(dark_inline), "COST", "1"),
        ("RATELIMIT.CHECKALL", "2", "a", "b", *s(window), *s(dark), "COST", "1"),
    ]
    # The direct path (the runners' fast path): the same words, and packed as redis-py packs them.
    import redis.connection

    pack = redis.connection.Connection().pack_command
    for verb, cost, at in [("CHECK", 1, None), ("TAKE", 9, None), ("PEEK", 0, T0), ("REFUND", 2, None)]:
        words = core.direct_args(verb, "k", LIMIT, cost, at)
        assert words[2:-2 - 2 * (at is not None)] == s(lim)
        assert core.direct_packed(verb, "k", LIMIT, cost, at, ("utf-8", "strict")) == b"".join(pack(*words))


@pytest.mark.parametrize("one_arg", [False, True])
def test_batches_and_the_denial_cache_send_the_same_form(one_arg):
    batched = Limit("gcra", 10, "1s", batch="50ms", batch_max=4)
    t = [0.0]
    core, script = Core(engine="module", denial_cache=10, clock=lambda: t[0]), Script(-3 if one_arg else -4)
    drive(core.detect(), script)
    drive(core.request("CHECK", "k", batched, 1), script)  # a batch's TAKE
    drive(core.request("CHECK", "j", LIMIT, 1), script)  # through the denial cache
    t[0] = 1.0
    drive(core.sweep(), script)  # the hold ended: the REFUND of what the batch holds
    s = lambda words: spec(words, one_arg)  # noqa: E731
    gcra = ("gcra", "10", "1s")
    assert commands(script) == [
        ("RATELIMIT.TAKE", "k", *s(gcra), "MAX", "1"),
        ("RATELIMIT.CHECK", "j", *s(LIMIT.args()), "COST", "1"),
        ("RATELIMIT.REFUND", "k", *s(gcra), "COST", "3"),
    ]


def test_a_server_that_refuses_one_argument_gets_words_from_then_on():
    # A cluster's node not upgraded yet, or a failover to an older module, after -3 was found.
    core, script = Core(engine="module", denial_cache=10), Script(-3)
    drive(core.detect(), script)
    script.old = True
    words = ("token-bucket", "10", "1s", "BURST", "20", "BLOCK", "1m")
    assert drive(core.decide("CHECK", "k", LIMIT, 1), script).allowed
    assert core.one_arg is False
    drive(core.decide("PEEK", "k", LIMIT, 1), script)
    core.one_arg = True
    assert drive(core.check_all([("a", LIMIT), ("b", Policy("p"))], 1), script).allowed
    assert commands(script) == [
        ("RATELIMIT.CHECK", "k", " ".join(words), "COST", "1"),
        ("RATELIMIT.CHECK", "k", *words, "COST", "1"),
        ("RATELIMIT.PEEK", "k", *words, "COST", "1"),
        ("RATELIMIT.CHECKALL", "2", "a", "b", " ".join(words), "POLICY p", "COST", "1"),
        ("RATELIMIT.CHECKALL", "2", "a", "b", *words, "POLICY", "p", "COST", "1"),
    ]
    # The direct path: its refusal sends `_request` (words); any other error reply is the caller's.
    core.one_arg = True
    refused = redis.ResponseError(f"ERR unknown algorithm '{' '.join(words)}': expected token-bucket, ...")
    assert core.direct_error("CHECK", "k", LIMIT, 1, None, refused) is None and core.one_arg is False
    core.one_arg = True
    with pytest.raises(redis.ResponseError):
        core.direct_error("CHECK", "k", LIMIT, 1, None, redis.ResponseError("WRONGTYPE Operation against a key"))
    # A call in flight when another's refusal changed the form: sent again too.
    assert core.direct_error("CHECK", "k", LIMIT, 1, None, refused) is None and core.one_arg is False
    assert core.direct_error("CHECK", "k", LIMIT, 1, None, refused) is None and core.one_arg is False


# -- real servers: the same sequences in both forms answer the same -----------------------------


def server_arity(server):
    reply = redis.Redis(port=server.port).execute_command("COMMAND INFO", "RATELIMIT.CHECK")
    return command_arity(reply)


STEPS = 120
DECIDING = ("RATELIMIT.CHECK", "RATELIMIT.PEEK", "RATELIMIT.TAKE", "RATELIMIT.REFUND", "RATELIMIT.CHECKALL")


class Recording(redis.Redis):
    """Keeps the decision commands' arguments (`seen`); the limiter sends everything through
    `execute_command` on it (no direct path)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seen = []

    def execute_command(self, *args, **options):
        if str(args[0]).upper() in DECIDING or str(args[0]).upper().startswith("FCALL"):
            self.seen.append(tuple(str(a) for a in args))
        return super().execute_command(*args, **options)


#: Every algorithm, with BURST and BLOCK where they apply, tight enough to refuse and block often.
SPECS = (
    Limit("token-bucket", 3, "1s", burst=5, block="300ms"),
    Limit("leaky-bucket", 2, "500ms", burst=4),
    Limit("fixed-window", 2, "200ms", block="300ms"),
    Limit("sliding-window", 3, "1s"),
    Limit("sliding-log", 2, "250ms", block=400),
    Limit("gcra", 2, "1s", burst=3, block="1s"),
)


def sequence(seed, specs):
    """(time, operation, cost, spec index, other spec index) steps over every call that sends
    a spec."""
    rng = random.Random(seed)
    steps, now = [], T0
    for _ in range(STEPS):
        now += rng.choice([0, 1, 7, 40, 150, 600])
        op = rng.choices(["check", "peek", "refund", "take", "check_all"], [6, 2, 2, 3, 3])[0]
        cost = rng.randint(1, 9) if op == "take" else rng.randint(0, 4)
        steps.append((now, op, cost, rng.randrange(len(specs)), rng.randrange(len(specs))))
    return steps


async def run_both(server, engine, protocol, mode, seed, specs):
    """The sequence through a limiter sending words and one sending one argument, on keys of
    their own (one per spec) at the same times: (decisions, decisions, the commands the
    one-argument limiter sent, if recorded, and its form at the end)."""
    results, seen = [], []
    for one_arg in (False, True):
        if mode == "async":
            limiter = AsyncRateLimiter(redis.asyncio.Redis(port=server.port, protocol=protocol, socket_timeout=10),
                                       engine=engine)
        else:  # "sync": the direct path where it applies; "recorded": every command through execute_command
            client = server.client(protocol) if mode == "sync" else Recording(port=server.port, protocol=protocol,
                                                                             socket_timeout=10)
            limiter = RateLimiter(client, engine=engine)
        limiter._core.one_arg = one_arg  # (before any call: not asked)
        tag = f"{{f{seed}{engine}{protocol}{mode}{int(one_arg)}}}"
        got = []
        try:
            for now, op, cost, i, j in sequence(seed, specs):
                if op == "check_all":
                    call = limiter.check_all([(f"{tag}a{i}", specs[i]), (f"{tag}b{j}", specs[j])], cost, at=now)
                else:
                    call = getattr(limiter, op)(f"{tag}a{i}", specs[i], cost, at=now)
                got.append((op, cost, (await call) if mode == "async" else call))
        finally:
            if mode == "async":
                await limiter.aclose()
            else:
                limiter.close()
        results.append(got)
        seen = getattr(limiter.client, "seen", [])
    return results[0], results[1], seen, limiter._core.one_arg


@pytest.mark.parametrize("mode", ["sync", "recorded", "async"])
@pytest.mark.parametrize("protocol", [2, 3])
def test_both_forms_answer_the_same_decisions(server, mode, protocol):
    engine = "library" if server.proc.args.count("--loadmodule") == 0 else "module"
    specs = list(SPECS)
    plain = redis.Redis(port=server.port)
    # An older module (arity -4) refuses the first call's one argument: words from then on.
    older = engine == "module" and server_arity(server) != -3
    if engine == "module":
        plain.execute_command("RATELIMIT.POLICY", "SET", "form-api", "token-bucket", 5, "1s", "BURST", 7)
        plain.execute_command("RATELIMIT.POLICY", "SET", "form-dark", "fixed-window", 3, "1s", "SHADOW")
        specs += [Policy("form-api"), Policy("form-dark"), Policy("form-gone", fallback=Limit("gcra", 4, "1s"))]
    else:
        plain.function_load(library_code(), replace=True)
        specs += [Policy("form-api", fallback=Limit("token-bucket", 5, "1s", burst=7))]
    plain.close()
    for seed in range(2):
        words, one, seen, one_arg = asyncio.run(run_both(server, engine, protocol, mode, seed, specs))
        assert len(words) == len(one) == STEPS
        for i, (a, b) in enumerate(zip(words, one)):
            assert a == b, f"{engine} RESP{protocol} {mode} seed {seed} step {i}"
            assert a[2].source == engine
        assert engine == "library" or one_arg is not older
        if mode == "recorded":
            joined = [args for args in seen if any(" " in a for a in args)]
            if older:
                assert len(joined) == 1 and seen[0] == joined[0], "refused once, then words"
            elif engine == "module":
                assert len(joined) == len(seen), "the module got every spec as one argument"
            else:
                assert seen and not joined, "the library got words"


def test_a_limiter_finds_the_servers_form(server):
    engine = "library" if server.proc.args.count("--loadmodule") == 0 else "module"
    rl = RateLimiter(server.client())
    try:
        rl.check("form:find", WINDOW)
        rl.check("form:find", WINDOW)
        if engine == "module":
            assert rl._core.one_arg is (server_arity(server) == -3)
            assert rl.stats == {"commands": 2, "module": 2}, "COMMAND INFO is not a call's command"
        else:
            assert rl._core.one_arg is None and rl.engine == "library", "never asked"
    finally:
        rl.close()
