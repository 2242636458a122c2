//! Equivalence of the native commands with the Lua references in `lua-reference/`.
//!
//! For every algorithm, seeded random sequences of calls run on one server against the native
//! command (`RATELIMIT.CHECK ... AT t` on key `n:<alg>:<i>`) and against the reference script
//! (`EVALSHA sha 1 l:<alg>:<i> limit period burst cost t`). The sequences mix small and huge
//! limits, BURST above and below the limit, parameter changes between calls on the same key,
//! COST 0, costs above the capacity, runs of calls in the same millisecond, gaps longer than two
//! periods and `AT` values below the key's last time. For every call:
//!
//! - the native reply equals the script's, integer for integer;
//! - `RATELIMIT.PEEK` with the same arguments, sent just before, equals that CHECK reply;
//! - `PEXPIRETIME` of the native key equals that of the script's key, and after a consuming call
//!   it is `t + reset_after_ms` with `t = max(AT, last)`.
//!
//! At the end of each sequence `RATELIMIT.INFO` is compared with the script's stored state. The
//! same runs with times just below 2^53 (the largest `AT`) pass for the buckets and GCRA; for the
//! windows and the log they are checked too (the scripts keep their intermediates below 2^53).
//!
//! Then the seed script (`seed_sliding_log.lua`) is compared with the native sliding log: the
//! same decision on every call with cost 1 and distinct, increasing timestamps; and it admits more
//! than the limit when requests share a millisecond, which the native command does not.
//!
//! `EQUIV_SEED=<n>` (decimal or 0x-hex) replays another seed, `EQUIV_CALLS=<n>` sets the calls
//! per algorithm (default 10000). A mismatch panics with the seed, the whole sequence of the
//! failing key with every reply, and a shrunk sequence that still fails, as redis-cli commands.

use crate::common;

mod compare;
pub mod sequences;

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::Instant;

use common::rng::{seed_from_env, Rng};
use common::{future_base_ms, send, show_value, Server, DAY_MS};
use compare::{
    compare_state, describe_sequence, field_map, first_problem, int_field, ints,
    lua_expiry_rounded, run_sequence, shrink, Replies,
};
use redis::{Connection, Value};
use redis_ratelimit_core::algorithms::Algorithm;
use sequences::{gen_sequence, Call, LuaReference, Params, Times};

const DEFAULT_SEED: u64 = 0x5EED_0000_2024_0003;
const DEFAULT_CALLS: usize = 10_000;
/// Lua doubles are exact below 2^53; the scripts refuse `C·P` (buckets) or `L·P` (sliding window)
/// at or above it.
const EXACT: u64 = 1 << 53;
/// Sliding-log limits stay modest so that the script's ZSET stays fast.
const MAX_LOG_LIMIT: u64 = 1000;
const SEED_SCRIPT: &str = include_str!("../../lua-reference/seed_sliding_log.lua");

/// `$EQUIV_SEED`, else [`DEFAULT_SEED`] (printed once).
fn seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| seed_from_env("EQUIV_SEED", || DEFAULT_SEED))
}

fn calls_per_algorithm() -> usize {
    match std::env::var("EQUIV_CALLS") {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("EQUIV_CALLS={text:?}: {e}")),
        Err(_) => DEFAULT_CALLS,
    }
}

fn load_script(con: &mut Connection, script: &str) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(script)
        .query(con)
        .expect("SCRIPT LOAD")
}

// ---------------------------------------------------------------------------------------------
// The native commands against the Lua references

/// Coverage counters, printed and checked so the generator cannot silently degenerate.
#[derive(Default, Debug)]
struct Coverage {
    calls: usize,
    keys: usize,
    allowed: usize,
    rejected: usize,
    never: usize,
    cost0: usize,
    same_ms: usize,
    backwards: usize,
    long_gaps: usize,
    param_changes: usize,
    burst_below: usize,
    burst_above: usize,
    huge_limit: usize,
    /// `COST 0` rejected: a window or log over a lowered limit, a GCRA TAT beyond the tolerance.
    cost0_rejected: usize,
    /// GCRA: a TAT re-scaled beyond 2^53 scaled units (`reset_after_ms · L ≥ 2^53 + L`, so
    /// `ahead > 2^53`), which `gcra.lua` holds as whole ms and a remainder.
    beyond_exact: usize,
    /// Keys whose final RATELIMIT.INFO was compared with the script's stored state.
    states_compared: usize,
    /// Calls where the script's expiry was the rounded one (see [`lua_expiry_rounded`]).
    lua_expiry_rounded: usize,
}

impl Coverage {
    fn add(&mut self, calls: &[Call], replies: &[Replies]) {
        self.keys += 1;
        self.calls += calls.len();
        let mut cursor: Option<u64> = None;
        for (i, (call, r)) in calls.iter().zip(replies).enumerate() {
            if let Ok(reply) = ints(&r.native) {
                match reply.first() {
                    Some(1) => self.allowed += 1,
                    _ => self.rejected += 1,
                }
                if reply.get(3) == Some(&-1) {
                    self.never += 1;
                }
                self.cost0_rejected += usize::from(call.cost == 0 && reply.first() == Some(&0));
                if let Some(&reset) = reply.get(4) {
                    let scaled = u128::from(reset.unsigned_abs()) * u128::from(call.params.limit);
                    let bound = u128::from(EXACT) + u128::from(call.params.limit);
                    self.beyond_exact += usize::from(scaled >= bound);
                }
            }
            self.cost0 += usize::from(call.cost == 0);
            self.lua_expiry_rounded += usize::from(
                r.expire_native != r.expire_lua
                    && lua_expiry_rounded(&r.expire_native, &r.expire_lua),
            );
            if let Some(c) = cursor {
                self.same_ms += usize::from(call.at == c);
                self.backwards += usize::from(call.at < c);
                self.long_gaps += usize::from(call.at > c + 2 * call.params.period);
            }
            if i > 0 && calls[i - 1].params != call.params {
                self.param_changes += 1;
            }
            if let Some(b) = call.params.burst {
                self.burst_below += usize::from(b < call.params.limit);
                self.burst_above += usize::from(b > call.params.limit);
            }
            self.huge_limit += usize::from(call.params.capacity() > 1_000_000);
            cursor = Some(cursor.map_or(call.at, |c| c.max(call.at)));
        }
    }
}

/// Runs random sequences on one algorithm until `target` calls; returns what they covered and a
/// report per failing key.
fn run_equivalence(alg: Algorithm, times: Times, target: usize) -> (Coverage, Vec<String>) {
    let started = Instant::now();
    let seed = seed();
    let server = Server::start();
    let mut con = server.client();
    let sha = load_script(&mut con, alg.script());
    let base = match times {
        Times::Future(base) => base,
        Times::NearTop => EXACT,
    };
    let stream = alg.index() as u64 + if times == Times::NearTop { 50 } else { 1 };
    let mut rng = Rng::with_stream(seed, stream);
    let mut coverage = Coverage::default();
    let mut failures: Vec<String> = Vec::new();
    let mut key_index = 0;
    while coverage.calls < target {
        let len = rng.range(20, 120) as usize;
        let calls = gen_sequence(alg, &mut rng, times, len);
        let nkey = format!("n:{}:{key_index}", alg.name());
        let lkey = format!("l:{}:{key_index}", alg.name());
        let replies = run_sequence(&mut con, alg, &sha, &nkey, &lkey, &calls);
        coverage.add(&calls, &replies);
        let problem = match first_problem(&calls, &replies) {
            Some((i, problem)) => Some((Some(i), problem)),
            None => match compare_state(&mut con, alg, &sha, &nkey, &lkey) {
                Ok(compared) => {
                    coverage.states_compared += usize::from(compared);
                    None
                }
                Err(problem) => Some((None, problem)),
            },
        };
        if let Some((index, problem)) = problem {
            let mut out = String::new();
            let upto = index.map_or(calls.len(), |i| i + 1);
            let _ = writeln!(
                out,
                "\n=== {} mismatch on key #{key_index} ({nkey} / {lkey}){}: {problem}",
                alg.name(),
                index.map_or(String::new(), |i| format!(" at call {i}")),
            );
            let _ = writeln!(
                out,
                "  seed {seed:#x} (EQUIV_SEED={seed:#x} cargo test --profile tests --test integration equivalence::), \
                 base {base}; the sequence up to the mismatch:"
            );
            describe_sequence(
                &mut out,
                alg,
                &sha,
                base,
                &calls[..upto],
                Some(&replies[..upto]),
            );
            if index.is_some() && failures.len() < 3 {
                let small = shrink(&mut con, alg, &sha, &calls[..upto]);
                let small_replies = run_sequence(
                    &mut con,
                    alg,
                    &sha,
                    &format!("min:n:{key_index}"),
                    &format!("min:l:{key_index}"),
                    &small,
                );
                match first_problem(&small, &small_replies) {
                    Some((_, why)) => {
                        let _ = writeln!(
                            out,
                            "  shrunk to {} calls, still failing: {why}",
                            small.len()
                        );
                        describe_sequence(&mut out, alg, &sha, base, &small, Some(&small_replies));
                    }
                    None => {
                        let _ = writeln!(out, "  (shrinking found no shorter failing sequence)");
                    }
                }
            }
            failures.push(out);
        }
        key_index += 1;
    }
    eprintln!(
        "{} ({times:?}): seed {seed:#x}, {:?}, {} ms",
        alg.name(),
        coverage,
        started.elapsed().as_millis()
    );
    (coverage, failures)
}

fn assert_no_failures(alg: Algorithm, coverage: &Coverage, failures: &[String]) {
    if !failures.is_empty() {
        panic!(
            "{}: {} of {} keys disagree with {} (seed {:#x}):{}",
            alg.name(),
            failures.len(),
            coverage.keys,
            alg.script_file(),
            seed(),
            failures.iter().take(5).cloned().collect::<String>()
        );
    }
}

fn equivalence(alg: Algorithm) {
    let target = calls_per_algorithm();
    let (coverage, failures) = run_equivalence(alg, Times::Future(future_base_ms()), target);
    assert_no_failures(alg, &coverage, &failures);
    assert!(coverage.calls >= 2000.min(target));
    let c = &coverage;
    let mut varied = vec![
        ("allowed", c.allowed),
        ("rejected", c.rejected),
        ("never (-1)", c.never),
        ("cost 0", c.cost0),
        ("same ms", c.same_ms),
        ("backwards", c.backwards),
        ("long gaps", c.long_gaps),
        ("parameter changes", c.param_changes),
        ("final states compared", c.states_compared),
    ];
    if alg != Algorithm::SlidingLog {
        varied.push(("capacity above 10^6", c.huge_limit));
    }
    if alg.is_bucket() {
        varied.push(("burst below the limit", c.burst_below));
        varied.push(("burst above the limit", c.burst_above));
    }
    if alg == Algorithm::Gcra {
        varied.push((
            "COST 0 rejected (TAT beyond the tolerance)",
            c.cost0_rejected,
        ));
        varied.push(("a TAT beyond 2^53 scaled units", c.beyond_exact));
    }
    if target >= 2000 {
        for (what, n) in varied {
            assert!(
                n >= 10,
                "{}: too few calls with {what}: {coverage:?}",
                alg.name()
            );
        }
    }
}

/// Times just below 2^53 on the buckets and GCRA: equal replies; the scripts' expiries, at or
/// above 2^53, are the native ones rounded to a double (the tolerated [`lua_expiry_rounded`]).
#[test]
fn buckets_just_below_2_pow_53_equal_lua_reference() {
    for alg in [
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Gcra,
    ] {
        let (coverage, failures) = run_equivalence(alg, Times::NearTop, 2000);
        assert_no_failures(alg, &coverage, &failures);
    }
}

/// Times just below 2^53 on the windows and the log. `fixed_window.lua`, `sliding_window.lua` and
/// `sliding_log.lua` compute `w + P - t`, `w + 2*P - t` and `ts + P - t` as `P - (t - w)`,
/// `2*P - (t - w)` and `P - (t - ts)`, so no intermediate passes 2^53 (summed left to right,
/// `w + P` rounded there and answers came out 1 ms off, e.g. fixed-window period 997 at
/// `AT 9007199254740991`: 334 natively, 333 from the script).
#[test]
fn windows_and_log_just_below_2_pow_53_equal_lua_reference() {
    let mut report = String::new();
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
        let (coverage, failures) = run_equivalence(alg, Times::NearTop, 2000);
        if !failures.is_empty() {
            let _ = write!(
                report,
                "\n##### {}: {} of {} keys disagree{}",
                alg.name(),
                failures.len(),
                coverage.keys,
                failures.iter().take(2).cloned().collect::<String>()
            );
        }
    }
    assert!(report.is_empty(), "seed {:#x}:{report}", seed());
}

#[test]
fn token_bucket_equals_lua_reference() {
    equivalence(Algorithm::TokenBucket);
}

#[test]
fn leaky_bucket_equals_lua_reference() {
    equivalence(Algorithm::LeakyBucket);
}

#[test]
fn fixed_window_equals_lua_reference() {
    equivalence(Algorithm::FixedWindow);
}

#[test]
fn sliding_window_equals_lua_reference() {
    equivalence(Algorithm::SlidingWindow);
}

#[test]
fn sliding_log_equals_lua_reference() {
    equivalence(Algorithm::SlidingLog);
}

#[test]
fn gcra_equals_lua_reference() {
    equivalence(Algorithm::Gcra);
}

// ---------------------------------------------------------------------------------------------
// The usual ZSET script (lua-reference/seed_sliding_log.lua)

/// `EVALSHA seed 1 key limit current_time window`: 1 allowed, 0 rejected.
fn seed_call(sha: &str, key: &str, limit: u64, at: u64, window: u64) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha).arg(1).arg(key).arg(limit).arg(at).arg(window);
    cmd
}

fn native_log_call(key: &str, limit: u64, at: u64, window: u64) -> redis::Cmd {
    let mut cmd = redis::cmd("RATELIMIT.CHECK");
    cmd.arg(key)
        .arg("sliding-log")
        .arg(limit)
        .arg(window)
        .arg("COST")
        .arg(1)
        .arg("AT")
        .arg(at);
    cmd
}

/// With cost 1 and distinct, increasing timestamps the ZSET script and the native sliding log
/// take the same decision on every call. (The window stays fixed per key: the seed has no rule for
/// a changed window, it just keeps what it has not trimmed yet; the limit may change.)
#[test]
fn seed_script_agrees_with_native_sliding_log_on_distinct_timestamps() {
    let seed = seed();
    let server = Server::start();
    let mut con = server.client();
    let sha = load_script(&mut con, SEED_SCRIPT);
    let base = future_base_ms();
    let mut rng = Rng::with_stream(seed, 100);
    let (mut calls, mut allowed, mut keys) = (0, 0, 0);
    while calls < calls_per_algorithm().max(2000) {
        // The seed EXPIREs its key after `window` seconds of real time: keep windows >= 10 ms so
        // that nothing expires while a sequence runs (one pipeline, well under a second).
        let window = match rng.below(4) {
            0 => rng.range(10, 100),
            1 => rng.pick(&[250, 1000, 60_000]),
            _ => rng.log_uniform(10, 100_000),
        };
        let mut limit = rng.pick(&[1, 2, 3, 5, 10, 50]);
        let len = rng.range(50, 200) as usize;
        let mut at = base + rng.below(DAY_MS);
        let mut sequence = Vec::with_capacity(len);
        for _ in 0..len {
            if rng.chance(3) {
                limit = rng.pick(&[1, 2, 3, 5, 10, 50]);
            }
            // Distinct, increasing: dense bursts, steps around the window, long pauses.
            at += match rng.below(10) {
                0..=4 => rng.log_uniform(1, (window / limit).max(1)),
                5..=7 => rng.log_uniform(1, window),
                8 => window + rng.range(0, 2) - 1,
                _ => rng.log_uniform(window, 3 * window),
            }
            .max(1);
            sequence.push((limit, at));
        }
        let skey = format!("seed:{keys}");
        let nkey = format!("native:{keys}");
        let mut cmds = Vec::with_capacity(2 * sequence.len());
        for &(limit, at) in &sequence {
            cmds.push(seed_call(&sha, &skey, limit, at, window));
            cmds.push(native_log_call(&nkey, limit, at, window));
        }
        let values = send(&mut con, &cmds);
        for (i, pair) in values.chunks_exact(2).enumerate() {
            let native = ints(&pair[1]).unwrap_or_default();
            let seed_says = pair[0].clone();
            if native.first().map(|a| Value::Int(*a)) != Some(seed_says.clone()) {
                let history: Vec<String> = sequence[..=i]
                    .iter()
                    .zip(values.chunks_exact(2))
                    .map(|(&(l, at), r)| {
                        format!(
                            "  limit {l} AT base+{}: seed {} native {}",
                            at - base,
                            show_value(&r[0]),
                            show_value(&r[1])
                        )
                    })
                    .collect();
                panic!(
                    "seed script and native sliding-log disagree at call {i} (window {window} ms, \
                     seed {seed:#x}, base {base}):\n{}",
                    history.join("\n")
                );
            }
            allowed += usize::from(seed_says == Value::Int(1));
        }
        calls += sequence.len();
        keys += 1;
    }
    eprintln!("seed vs native sliding-log: {calls} calls on {keys} keys, {allowed} allowed");
    assert!(
        allowed > calls / 10 && allowed < calls * 9 / 10,
        "{allowed} of {calls} allowed"
    );
}

/// Requests in the same millisecond: the ZSET script's `ZADD key t t` collapses them into one member, so
/// it admits all of them; the native sliding log (and sliding_log.lua) counts each one.
#[test]
fn seed_script_undercounts_requests_in_the_same_millisecond() {
    let server = Server::start();
    let mut con = server.client();
    let seed_sha = load_script(&mut con, SEED_SCRIPT);
    let reference_sha = load_script(&mut con, Algorithm::SlidingLog.script());
    let t = future_base_ms() + 123;
    let (limit, window, burst) = (3u64, 1000u64, 10usize);
    let reference = Call {
        params: Params {
            limit,
            period: window,
            burst: None,
        },
        cost: 1,
        at: t,
    };
    let mut cmds = Vec::with_capacity(3 * burst);
    for _ in 0..burst {
        cmds.push(seed_call(&seed_sha, "seed", limit, t, window));
        cmds.push(native_log_call("native", limit, t, window));
        cmds.push(reference.lua(&reference_sha, "reference"));
    }
    let values = send(&mut con, &cmds);
    let mut seed_admitted = 0;
    let mut native_replies = Vec::new();
    let mut reference_replies = Vec::new();
    for triple in values.chunks_exact(3) {
        seed_admitted += usize::from(triple[0] == Value::Int(1));
        native_replies.push(ints(&triple[1]).expect("native reply"));
        reference_replies.push(ints(&triple[2]).expect("reference reply"));
    }
    let native_admitted = native_replies.iter().filter(|r| r[0] == 1).count();
    // The seed admits all 10 requests of the burst against a limit of 3...
    assert_eq!(
        seed_admitted, burst,
        "the ZSET script admitted {seed_admitted} of {burst}"
    );
    // ...and remembers only one of them.
    let members: i64 = redis::cmd("ZCARD").arg("seed").query(&mut con).unwrap();
    assert_eq!(members, 1);
    // The native command admits exactly the limit and tells the rest when to retry.
    assert_eq!(native_admitted, limit as usize);
    let mut expected = Vec::new();
    for i in 0..burst as i64 {
        expected.push(if i < limit as i64 {
            vec![1, 3, 2 - i, 0, 1000, 0]
        } else {
            vec![0, 3, 0, 1000, 1000, 0]
        });
    }
    assert_eq!(native_replies, expected);
    assert_eq!(
        reference_replies, expected,
        "sliding_log.lua counts them too"
    );
    let info: Value = redis::cmd("RATELIMIT.INFO")
        .arg("native")
        .query(&mut con)
        .unwrap();
    assert_eq!(int_field(&field_map(&info), "entries"), Some(limit as i64));
    // One millisecond later the seed still sees a single entry and admits two more (5 in total in
    // the window), where the native log admits none until the burst leaves the window.
    let mut later = 0;
    for _ in 0..2 {
        let seed_says: i64 = seed_call(&seed_sha, "seed", limit, t + 1, window)
            .query(&mut con)
            .unwrap();
        later += seed_says;
        let native = ints(
            &native_log_call("native", limit, t + 1, window)
                .query(&mut con)
                .unwrap(),
        )
        .unwrap();
        assert_eq!(native, [0, 3, 0, 999, 999, 0]);
    }
    assert_eq!(later, 2);
}

/// The seed EXPIREs its key after `window` seconds although the window is in milliseconds; the
/// native key expires when its newest entry leaves the window.
#[test]
fn seed_script_expires_keys_a_thousand_times_too_late() {
    let server = Server::start();
    let mut con = server.client();
    let sha = load_script(&mut con, SEED_SCRIPT);
    let t = future_base_ms();
    let window = 60_000u64; // one minute
    let admitted: i64 = seed_call(&sha, "seed", 5, t, window)
        .query(&mut con)
        .unwrap();
    assert_eq!(admitted, 1);
    let ttl_s: i64 = redis::cmd("TTL").arg("seed").query(&mut con).unwrap();
    // 60000 s (about 16.7 hours) of real time, not 60 s after the request's timestamp.
    assert!((59_990..=60_000).contains(&ttl_s), "TTL {ttl_s} s");
    let native = ints(
        &native_log_call("native", 5, t, window)
            .query(&mut con)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(native, [1, 5, 4, 0, 60_000, 0]);
    let expires: i64 = redis::cmd("PEXPIRETIME")
        .arg("native")
        .query(&mut con)
        .unwrap();
    assert_eq!(expires, (t + window) as i64);
}
