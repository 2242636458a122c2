//! `ratelimit_refund` answers as `RATELIMIT.REFUND`: on the random sequences of equivalence.rs
//! with refunds between their calls (random costs, more than was consumed, COST 0, missing keys,
//! parameters other than the stored ones, times going backwards and near 2^53), on long sliding
//! logs refunded and extended again; and an admitted CHECK followed by a REFUND of its cost
//! leaves every PEEK as it was before the CHECK.

use std::fmt::Write as _;

use redis::{Cmd, Connection, Value};
use redis_ratelimit_core::algorithms::Algorithm;

use super::engines::{
    algorithms, both_engines, both_infos, calls_per_algorithm, fcall, native, same_info,
    same_reply, seed,
};
use super::limits::{block_duration, with_block, Limit};
use crate::common::rng::Rng;
use crate::common::{future_base_ms, send, show_value, try_reply6, MAX_AMOUNT, TIME_LIMIT_MS};
use crate::equivalence::sequences::{self, Params, Times};

/// One call of a sequence: `check` (or `checkall` of the one key, now and then) or `refund`, its
/// arguments after the key, and the PEEK sent with it: before a CHECK with the same arguments (it
/// must answer what the CHECK does), after a REFUND with its limit, COST 0 and its `AT` (it must
/// answer what the REFUND did).
struct Call {
    command: &'static str,
    args: Vec<String>,
    peek: Vec<String>,
    /// A REFUND naming other parameters than the CHECK before it (or another algorithm).
    other_params: bool,
    /// A CHECK naming BLOCK: when it starts a block it answers the block, its PEEK does not.
    block: bool,
    /// The period of the call's limit (ms).
    period: u64,
}

impl Call {
    fn check(limit: &Limit, cost: u64, at: u64, rng: &mut Rng) -> Call {
        let command = if rng.chance(15) { "checkall" } else { "check" };
        let args = limit.args(cost, Some(at), rng);
        Call {
            command,
            peek: args.clone(),
            args,
            other_params: false,
            block: false,
            period: limit.params.period,
        }
    }

    fn refund(limit: &Limit, cost: u64, at: u64, other_params: bool, rng: &mut Rng) -> Call {
        Call {
            command: "refund",
            args: limit.refund_args(cost, Some(at), rng),
            peek: limit.args(0, Some(at), rng),
            other_params,
            block: false,
            period: limit.params.period,
        }
    }

    fn is_refund(&self) -> bool {
        self.command == "refund"
    }

    /// The call's own decision: a CHECKALL answers it after the overall one.
    fn decision<'a>(&self, reply: &'a Value) -> &'a Value {
        match reply {
            Value::Array(items) if self.command == "checkall" && items.len() == 2 => &items[1],
            _ => reply,
        }
    }
}

/// What one call answered, `[module, library]`, and the library's value after it.
struct Step {
    call: [Value; 2],
    peek: [Value; 2],
    expiry: [Value; 2],
    exists: [Value; 2],
    value: Value,
}

/// Every call on both engines with its PEEK, then both keys' `PEXPIRETIME` and `EXISTS` and the
/// library's value, in one pipeline.
fn run_sequence(con: &mut Connection, nkey: &str, fkey: &str, calls: &[Call]) -> Vec<Step> {
    let mut cmds: Vec<Cmd> = Vec::with_capacity(calls.len() * 9);
    for call in calls {
        let call_cmds = [
            native(call.command, &[nkey], &call.args),
            fcall(call.command, &[fkey], &call.args),
        ];
        let peek_cmds = [
            native("peek", &[nkey], &call.peek),
            fcall("peek", &[fkey], &call.peek),
        ];
        if call.is_refund() {
            cmds.extend(call_cmds);
            cmds.extend(peek_cmds);
        } else {
            cmds.extend(peek_cmds);
            cmds.extend(call_cmds);
        }
        for command in ["PEXPIRETIME", "EXISTS"] {
            cmds.push(redis::cmd(command).arg(nkey).clone());
            cmds.push(redis::cmd(command).arg(fkey).clone());
        }
        cmds.push(redis::cmd("GET").arg(fkey).clone());
    }
    let mut replies = send(con, &cmds).into_iter();
    let mut next = || replies.next().expect("nine replies a call");
    calls
        .iter()
        .map(|call| {
            let mut pair = || [next(), next()];
            let (first, second) = (pair(), pair());
            let (call_replies, peek) = if call.is_refund() {
                (first, second)
            } else {
                (second, first)
            };
            let (expiry, exists) = (pair(), pair());
            Step {
                call: call_replies,
                peek,
                expiry,
                exists,
                value: next(),
            }
        })
        .collect()
}

/// `module <reply> library <reply>`.
fn both(replies: &[Value; 2]) -> String {
    format!(
        "module {} library {}",
        show_value(&replies[0]),
        show_value(&replies[1])
    )
}

/// The first call where the engines differ, or where a PEEK does not answer what its CHECK or
/// REFUND did.
fn first_difference(calls: &[Call], steps: &[Step]) -> Option<(usize, String)> {
    for (i, (call, s)) in calls.iter().zip(steps).enumerate() {
        let what = if !same_reply(&s.call[0], &s.call[1]) {
            format!("{}: {}", call.command.to_uppercase(), both(&s.call))
        } else if !same_reply(&s.peek[0], &s.peek[1]) {
            format!("PEEK: {}", both(&s.peek))
        } else if &s.peek[0] != call.decision(&s.call[0])
            && !(call.block
                && try_reply6(&s.peek[0]).is_some_and(|r| r[0] == 0)
                && try_reply6(call.decision(&s.call[0])).is_some_and(|r| r[0] == 0))
        {
            format!(
                "the module's PEEK {} != its {} {}",
                show_value(&s.peek[0]),
                call.command.to_uppercase(),
                show_value(&s.call[0])
            )
        } else if s.expiry[0] != s.expiry[1] {
            format!("PEXPIRETIME: {}", both(&s.expiry))
        } else if s.exists[0] != s.exists[1] {
            format!("EXISTS: {}", both(&s.exists))
        } else {
            continue;
        };
        return Some((i, what));
    }
    None
}

/// The calls and replies as redis-cli lines.
fn describe(nkey: &str, fkey: &str, calls: &[Call], steps: &[Step]) -> String {
    let mut out = String::new();
    for (call, s) in calls.iter().zip(steps) {
        let args = call.args.join(" ");
        let command = call.command.to_uppercase();
        for (engine, line) in [
            (
                0,
                format!(
                    "RATELIMIT.{command} {}{nkey}",
                    if call.command == "checkall" { "1 " } else { "" }
                ),
            ),
            (1, format!("FCALL ratelimit_{} 1 {fkey}", call.command)),
        ] {
            let _ = writeln!(
                out,
                "  {line} {args}\n    -> {} (PEEK {} {}) expires {}, exists {}",
                show_value(&s.call[engine]),
                call.peek.join(" "),
                show_value(&s.peek[engine]),
                show_value(&s.expiry[engine]),
                show_value(&s.exists[engine]),
            );
        }
        let _ = writeln!(out, "    library value {:?}", show_value(&s.value));
    }
    out
}

/// Runs `calls` on both engines and fails with the whole sequence at the first difference;
/// then compares INFO. `what` names the sequence.
fn assert_same(
    con: &mut Connection,
    what: &str,
    nkey: &str,
    fkey: &str,
    calls: &[Call],
) -> Vec<Step> {
    let steps = run_sequence(con, nkey, fkey, calls);
    if let Some((i, why)) = first_difference(calls, &steps) {
        panic!(
            "FUNCTIONS_SEED={:#x}, {what}, call {i}: {why}\n{}",
            seed(),
            describe(nkey, fkey, calls, &steps)
        );
    }
    // Every `last` is ahead of the server's clock: INFO answers for the same time on both.
    let (module, library) = both_infos(con, nkey, fkey);
    assert!(
        same_info(&module, &library),
        "FUNCTIONS_SEED={:#x}, {what}: INFO module {} != library {}\n{}",
        seed(),
        show_value(&module),
        show_value(&library),
        describe(nkey, fkey, calls, &steps)
    );
    steps
}

/// A refund's cost: nothing, one, what the call before asked, a few, up to the capacity, more
/// than the capacity, the largest COST.
fn refund_cost(rng: &mut Rng, asked: u64, capacity: u64) -> u64 {
    let cost = match rng.below(100) {
        0..=9 => 0,
        10..=34 => 1,
        35..=54 => asked,
        55..=69 => rng.range(2, 10),
        70..=79 => rng.range(1, capacity),
        80..=94 => rng.log_uniform(capacity.saturating_add(1), capacity.saturating_mul(1000)),
        _ => MAX_AMOUNT,
    };
    cost.min(MAX_AMOUNT)
}

/// A refund's time: the call before's, the latest so far, a little later, earlier (backwards),
/// or more than a period later.
fn refund_time(rng: &mut Rng, before: u64, latest: u64, start: u64, period: u64) -> u64 {
    let at = match rng.below(100) {
        0..=29 => before,
        30..=44 => latest,
        45..=64 => latest + rng.log_uniform(1, period),
        65..=79 => latest
            .saturating_sub(rng.log_uniform(1, 2 * period))
            .max(start),
        _ => latest + period + rng.log_uniform(1, 2 * period),
    };
    at.min(TIME_LIMIT_MS - 1)
}

/// The generator of equivalence.rs (from `base` on, or, for about one sequence in twelve, just
/// below 2^53) with refunds between its calls, and now and then first, on the missing key.
fn gen_with_refunds(algorithm: Algorithm, rng: &mut Rng, base: u64, len: usize) -> Vec<Call> {
    let times = if rng.chance(8) {
        Times::NearTop
    } else {
        Times::Future(base)
    };
    let checks = sequences::gen_sequence(algorithm, rng, times, len);
    let start = checks[0].at;
    let mut latest = start;
    let mut calls = Vec::with_capacity(len * 3 / 2);
    for (i, check) in checks.iter().enumerate() {
        let refunds = match i {
            0 => usize::from(rng.chance(25)),
            _ if rng.chance(40) => rng.range(1, 2) as usize,
            _ => 0,
        };
        let before = checks[i.saturating_sub(1)];
        for _ in 0..refunds {
            let (limit, other_params) = match rng.below(100) {
                0..=74 => (
                    Limit {
                        algorithm,
                        params: before.params,
                    },
                    false,
                ),
                75..=97 => {
                    let params = checks[rng.index(checks.len())].params;
                    (Limit { algorithm, params }, params != before.params)
                }
                _ => {
                    // Another algorithm, with parameters within the library's bounds.
                    let other = Algorithm::ALL[rng.index(Algorithm::ALL.len())];
                    (Limit::new(other, 5, 1000, None), other != algorithm)
                }
            };
            let at = refund_time(rng, before.at, latest, start, limit.params.period);
            latest = latest.max(at);
            let cost = refund_cost(rng, before.cost, limit.params.capacity());
            calls.push(Call::refund(&limit, cost, at, other_params, rng));
        }
        latest = latest.max(check.at);
        let limit = Limit {
            algorithm,
            params: check.params,
        };
        calls.push(Call::check(&limit, check.cost, check.at, rng));
    }
    calls
}

fn starts_with(value: &Value, prefix: &[u8]) -> bool {
    matches!(value, Value::BulkString(bytes) if bytes.starts_with(prefix))
}

/// What the refunds of a run did, read from the library's values: checked so that the
/// generator cannot silently stop covering a case.
#[derive(Default, Debug)]
struct Coverage {
    checks: usize,
    refunds: usize,
    /// A refund that changed the value and left the key.
    given_back: usize,
    /// A refund that deleted the key (it was left as a fresh one).
    emptied: usize,
    /// A refund that left the value as it was (a missing key included).
    nothing: usize,
    /// A refund on a missing key.
    missing: usize,
    /// A refund naming other parameters than the call before.
    other_params: usize,
    /// A refund of more than the capacity.
    above_capacity: usize,
    /// A refund refused (another algorithm than the key holds).
    refused: usize,
    /// Sliding log: a refund that left the refunded header (newest entry older than `last`).
    refunded_header: usize,
    /// Sliding log: a consuming CHECK on a log with the refunded header.
    appended_to_refunded: usize,
}

impl Coverage {
    fn add(&mut self, calls: &[Call], steps: &[Step]) {
        let mut value_before = Value::Nil;
        for (call, s) in calls.iter().zip(steps) {
            if !call.is_refund() {
                self.checks += 1;
                let admitted = try_reply6(call.decision(&s.call[1])).is_some_and(|r| r[0] == 1);
                self.appended_to_refunded += usize::from(
                    admitted
                        && starts_with(&value_before, b"rl:sr")
                        && starts_with(&s.value, b"rl:sl"),
                );
            } else {
                self.refunds += 1;
                self.other_params += usize::from(call.other_params);
                self.refused += usize::from(try_reply6(&s.call[1]).is_none());
                let cost: u64 = call
                    .args
                    .iter()
                    .position(|word| word.eq_ignore_ascii_case("COST"))
                    .and_then(|i| call.args[i + 1].parse().ok())
                    .unwrap_or(0);
                let capacity = try_reply6(&s.call[1]).map_or(u64::MAX, |r| r[1] as u64);
                self.above_capacity += usize::from(cost > capacity);
                match (&value_before, &s.value) {
                    (Value::Nil, Value::Nil) => {
                        self.missing += 1;
                        self.nothing += 1;
                    }
                    (_, Value::Nil) => self.emptied += 1,
                    (before, after) if before == after => self.nothing += 1,
                    _ => {
                        self.given_back += 1;
                        self.refunded_header += usize::from(starts_with(&s.value, b"rl:sr"));
                    }
                }
            }
            value_before = s.value.clone();
        }
    }
}

#[test]
fn refunds_answer_as_the_module_on_random_sequences() {
    let (_server, mut con) = both_engines();
    let seed = seed();
    let base = future_base_ms();
    let per_algorithm = calls_per_algorithm();
    for algorithm in algorithms() {
        let name = algorithm.name();
        let mut rng = Rng::with_stream(seed, 500 + algorithm.index() as u64);
        let mut coverage = Coverage::default();
        let mut sequences = 0;
        while coverage.checks < per_algorithm {
            let len = rng.range(10, 80) as usize;
            let calls = gen_with_refunds(algorithm, &mut rng, base, len);
            let nkey = format!("n:refund:{name}:{sequences}");
            let fkey = format!("f:refund:{name}:{sequences}");
            let what = format!("{name}, sequence {sequences}");
            let steps = assert_same(&mut con, &what, &nkey, &fkey, &calls);
            coverage.add(&calls, &steps);
            sequences += 1;
        }
        println!("{name}: {sequences} keys, {coverage:?}");
        if per_algorithm >= 2000 {
            let c = &coverage;
            let mut varied = vec![
                ("given back", c.given_back),
                ("emptied", c.emptied),
                ("nothing to give", c.nothing),
                ("a missing key", c.missing),
                ("other parameters", c.other_params),
                ("more than the capacity", c.above_capacity),
                ("another algorithm", c.refused),
            ];
            if algorithm == Algorithm::SlidingLog {
                varied.push(("the refunded header", c.refunded_header));
                varied.push(("a CHECK on the refunded header", c.appended_to_refunded));
            }
            for (what, n) in varied {
                assert!(n >= 10, "{name}: too few refunds with {what}: {coverage:?}");
            }
        }
    }
}

/// Long sliding logs (hundreds of entries, so the library reads them in chunks and appends to
/// them in place) refunded and extended again: a refund writes the log whole, with the refunded
/// header when its newest entry is older than the refund, and the next CHECK appends to it and
/// gives it the usual header back; parameters change, times go backwards.
#[test]
fn long_sliding_logs_with_refunds_answer_as_the_module() {
    let (_server, mut con) = both_engines();
    let base = future_base_ms();
    let mut rng = Rng::with_stream(seed(), 510);
    let mut coverage = Coverage::default();
    for key in 0..8u64 {
        let limits = [5, 50, 500, 2000];
        let periods = [200, 1000, 60_000, 3_600_000];
        let mut limit = Limit::new(
            Algorithm::SlidingLog,
            rng.pick(&limits),
            rng.pick(&periods),
            None,
        );
        let mut at = base + key * 7;
        let mut calls = Vec::new();
        for _ in 0..1500 {
            if rng.chance(1) {
                limit.params.limit = rng.pick(&limits);
                limit.params.period = rng.pick(&periods);
            }
            let period = limit.params.period;
            at += match rng.below(10) {
                0..=2 => 0,
                3..=8 => rng.range(1, period / 50 + 1),
                _ => rng.range(0, period),
            };
            if rng.chance(15) {
                let cost = match rng.below(10) {
                    0 => 0,
                    1..=5 => 1,
                    6..=8 => rng.range(2, 20),
                    _ => rng.range(1, 3 * limit.params.limit),
                };
                let when = match rng.below(10) {
                    0..=5 => at,
                    6..=7 => at.saturating_sub(rng.range(1, period)),
                    _ => at + rng.range(1, period / 10 + 1),
                };
                calls.push(Call::refund(&limit, cost, when, false, &mut rng));
            } else {
                let cost = match rng.below(10) {
                    0 => 0,
                    1..=7 => 1,
                    _ => rng.range(2, 10),
                };
                calls.push(Call::check(&limit, cost, at, &mut rng));
            }
        }
        let (nkey, fkey) = (format!("n:refund-log:{key}"), format!("f:refund-log:{key}"));
        let steps = assert_same(&mut con, &format!("log {key}"), &nkey, &fkey, &calls);
        coverage.add(&calls, &steps);
    }
    println!("long logs: {coverage:?}");
    let long_refunded = coverage.refunded_header;
    assert!(
        long_refunded >= 50 && coverage.appended_to_refunded >= 50 && coverage.given_back >= 100,
        "{coverage:?}"
    );
}

/// A CHECK (admitted, of a positive cost) followed at the same time by a REFUND of its cost
/// leaves every PEEK answering as before the CHECK (COST 0, 1, the CHECK's, the limit field and
/// one more), and the key absent where it was equivalent to a fresh one; the REFUND answers the
/// PEEK COST 0 of before. On the library, with the module answering the same all along.
#[test]
fn a_refund_of_an_admitted_checks_cost_leaves_every_peek_as_before_it() {
    let (_server, mut con) = both_engines();
    let seed = seed();
    let base = future_base_ms();
    let per_algorithm = calls_per_algorithm() / 2;
    for algorithm in algorithms() {
        let name = algorithm.name();
        let mut rng = Rng::with_stream(seed, 520 + algorithm.index() as u64);
        let (mut done, mut sequences, mut inverted, mut emptied) = (0, 0, 0, 0);
        while done < per_algorithm {
            let len = rng.range(10, 60) as usize;
            let times = if rng.chance(8) {
                Times::NearTop
            } else {
                Times::Future(base)
            };
            let checks = sequences::gen_sequence(algorithm, &mut rng, times, len);
            let (nkey, fkey) = (
                format!("n:inverse:{name}:{sequences}"),
                format!("f:inverse:{name}:{sequences}"),
            );
            // Every time so far is at most `latest`, so is every key's `last`: a call at
            // `latest` is evaluated at `latest`.
            let mut latest = 0;
            for (i, check) in checks.iter().enumerate() {
                latest = latest.max(check.at);
                let context =
                    || format!("FUNCTIONS_SEED={seed:#x}, {name}, sequence {sequences}, call {i}");
                let limit = Limit {
                    algorithm,
                    params: check.params,
                };
                if !rng.chance(40) {
                    let args = limit.args(check.cost, Some(check.at), &mut rng);
                    let replies = send(
                        &mut con,
                        &[
                            native("check", &[&nkey], &args),
                            fcall("check", &[&fkey], &args),
                        ],
                    );
                    assert_eq!(
                        replies[0],
                        replies[1],
                        "{}: CHECK {}",
                        context(),
                        args.join(" ")
                    );
                    continue;
                }
                let t = latest;
                let probes = probes(&limit, check.params, check.cost, t, &mut rng);
                let check_args = limit.args(check.cost, Some(t), &mut rng);
                let mut cmds = peeks(&nkey, &fkey, &probes);
                cmds.push(native("check", &[&nkey], &check_args));
                cmds.push(fcall("check", &[&fkey], &check_args));
                let before = send(&mut con, &cmds);
                let (checked, before) = (&before[2 * probes.len()..], &before[..2 * probes.len()]);
                assert_eq!(
                    before.iter().step_by(2).collect::<Vec<_>>(),
                    before.iter().skip(1).step_by(2).collect::<Vec<_>>(),
                    "{}: PEEKs before the CHECK",
                    context()
                );
                assert_eq!(
                    checked[0],
                    checked[1],
                    "{}: CHECK {}",
                    context(),
                    check_args.join(" ")
                );
                if !(check.cost > 0 && try_reply6(&checked[1]).is_some_and(|r| r[0] == 1)) {
                    continue;
                }
                let refund_args = limit.refund_args(check.cost, Some(t), &mut rng);
                let mut cmds = vec![
                    native("refund", &[&nkey], &refund_args),
                    fcall("refund", &[&fkey], &refund_args),
                ];
                cmds.extend(peeks(&nkey, &fkey, &probes));
                cmds.push(redis::cmd("EXISTS").arg(&nkey).clone());
                cmds.push(redis::cmd("EXISTS").arg(&fkey).clone());
                let after = send(&mut con, &cmds);
                let show = |replies: &[Value]| {
                    replies.iter().map(show_value).collect::<Vec<_>>().join(" ")
                };
                let context = || {
                    format!(
                        "{}: CHECK {} then REFUND {}\n  PEEKs {:?}\n  before: {}\n  after:  {}",
                        context(),
                        check_args.join(" "),
                        refund_args.join(" "),
                        probes.iter().map(|p| p.join(" ")).collect::<Vec<_>>(),
                        show(before),
                        show(&after),
                    )
                };
                assert_eq!(after[0], after[1], "{}: the REFUNDs differ", context());
                assert_eq!(
                    after[1],
                    before[1],
                    "{}: REFUND != the PEEK COST 0 before",
                    context()
                );
                assert_eq!(
                    &after[2..2 + before.len()],
                    before,
                    "{}: PEEKs after != before",
                    context()
                );
                let exists = &after[2 + before.len()..];
                assert_eq!(exists[0], exists[1], "{}: EXISTS", context());
                let fresh_before = try_reply6(&before[1]).is_some_and(|r| r[4] == 0);
                assert_eq!(
                    exists[1],
                    Value::Int(i64::from(!fresh_before)),
                    "{}: the key must be absent exactly where it was fresh",
                    context()
                );
                inverted += 1;
                emptied += usize::from(fresh_before);
            }
            let (module, library) = both_infos(&mut con, &nkey, &fkey);
            assert!(
                same_info(&module, &library),
                "{name}, sequence {sequences}: INFO {} != {}",
                show_value(&module),
                show_value(&library)
            );
            done += len;
            sequences += 1;
        }
        println!("{name}: {done} calls on {sequences} keys, {inverted} CHECK + REFUND pairs, {emptied} left the key fresh");
        if per_algorithm >= 1000 {
            assert!(
                inverted >= 100 && emptied >= 10,
                "{name}: {inverted} pairs, {emptied} emptied"
            );
        }
    }
}

/// The PEEKs of the inverse property: the limit with COST 0 (first), 1, the CHECK's, the limit
/// field (the capacity for buckets) and one more, at `t`.
fn probes(limit: &Limit, params: Params, cost: u64, t: u64, rng: &mut Rng) -> Vec<Vec<String>> {
    let field = params.capacity().max(params.limit);
    [0, 1, cost, field, field + 1]
        .into_iter()
        .map(|cost| limit.args(cost.min(MAX_AMOUNT), Some(t), rng))
        .collect()
}

/// Each probe on the module's key then on the library's.
fn peeks(nkey: &str, fkey: &str, probes: &[Vec<String>]) -> Vec<Cmd> {
    probes
        .iter()
        .flat_map(|args| [native("peek", &[nkey], args), fcall("peek", &[fkey], args)])
        .collect()
}

/// The sequences with refunds, BLOCK on most CHECKs of some sequences: refunds during blocks
/// give back and keep the key (also when left as a fresh one) and answer the block, calls without
/// BLOCK on a blocked key are rejected, blocks end; the same replies, expiries, existence and
/// INFO on both engines.
#[test]
fn refunds_during_blocks_answer_as_the_module() {
    let (_server, mut con) = both_engines();
    let seed = seed();
    let base = future_base_ms();
    let per_algorithm = calls_per_algorithm() / 2;
    for algorithm in algorithms() {
        let name = algorithm.name();
        let mut rng = Rng::with_stream(seed, 700 + algorithm.index() as u64);
        let (mut checks, mut sequences, mut during, mut kept) = (0, 0, 0, 0);
        while checks < per_algorithm {
            let len = rng.range(10, 80) as usize;
            let mut calls = gen_with_refunds(algorithm, &mut rng, base, len);
            let share = rng.pick(&[90, 50]);
            for call in calls.iter_mut().filter(|call| !call.is_refund()) {
                if rng.chance(share) {
                    let ms = block_duration(call.period, &mut rng);
                    call.args = with_block(std::mem::take(&mut call.args), ms, &mut rng);
                    call.block = true;
                }
            }
            let nkey = format!("n:blockrefund:{name}:{sequences}");
            let fkey = format!("f:blockrefund:{name}:{sequences}");
            let what = format!("{name}, blocked sequence {sequences}");
            let steps = assert_same(&mut con, &what, &nkey, &fkey, &calls);
            let mut before = Value::Nil;
            for (call, s) in calls.iter().zip(&steps) {
                if call.is_refund() && starts_with(&before, b"rl:bk ") {
                    during += 1;
                    kept += usize::from(before != s.value);
                } else if !call.is_refund() {
                    checks += 1;
                }
                before = s.value.clone();
            }
            sequences += 1;
        }
        println!("{name}: {sequences} keys, {checks} checks, {during} refunds during a block, {kept} of them gave back");
        if per_algorithm >= 1000 {
            assert!(
                during >= 20 && kept >= 5,
                "{name}: too few refunds during a block"
            );
        }
    }
}
