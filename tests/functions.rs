//! The Redis Functions library `lua-reference/functions/ratelimit.lua` (the module's commands
//! for servers that cannot load modules) against the module itself, on real servers.
//!
//! - Equivalence: one server with both engines, the module on keys `n:...` and the library on
//!   keys `f:...`. Seeded random sequences with `AT` (every algorithm, parameter changes, COST 0,
//!   costs above the capacity, same-ms runs, times going backwards, times just below 2^53) get
//!   the same PEEK and CHECK replies, the same `PEXPIRETIME` after every call and the same INFO at
//!   the end; random CHECKALLs (keys named more than once, mixed algorithms, wrong algorithms)
//!   get the same replies and expiries.
//! - Without `AT` both engines stay consistent on the same workload (equal decisions and
//!   `remaining`, durations within the time between the calls).
//! - Replication as effects: a replica's keys (value and absolute expiry) equal the master's;
//!   FCALL_RO of peek and info works on the replica, of check does not.
//! - MULTI, ACL key patterns, `maxmemory` (OOM refuses check, peek still answers), calls that
//!   change nothing write nothing.
//! - Every bad argument gets the module's message (with the function's name for the command's).
//! - Memory: bytes per key and per sliding-log entry against the module and the seed's ZSET
//!   (printed with `--nocapture`).
//!
//! `FUNCTIONS_SEED=<n>` (decimal or 0x-hex) replays another seed, `FUNCTIONS_CALLS=<n>` sets the
//! calls per algorithm of the equivalence run (default 4000).

mod common;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use common::{future_base_ms, send, Server};
use redis::{Cmd, Connection, Value};

/// The library, as `make functions` loads it.
const LIBRARY: &str = include_str!("../lua-reference/functions/ratelimit.lua");

const DEFAULT_SEED: u64 = 0xF0_0C71_0275;
const DEFAULT_CALLS: usize = 4000;
/// Lua doubles are exact below 2^53; the library refuses bucket `C·P` and sliding-window `L·P`
/// at or above it.
const EXACT: u64 = 1 << 53;
const MAX_AMOUNT: u64 = 1_000_000_000_000;
const DAY: u64 = 86_400_000;
const MAX_PERIOD: u64 = 3650 * DAY;
/// Sliding-log limits in the random runs (the library takes up to 100000).
const LOG_LIMIT: u64 = 1000;

const ALGORITHMS: [&str; 5] = [
    "token-bucket",
    "leaky-bucket",
    "fixed-window",
    "sliding-window",
    "sliding-log",
];

// ---------------------------------------------------------------------------------------------
// Helpers

fn seed() -> u64 {
    let Ok(text) = std::env::var("FUNCTIONS_SEED") else {
        return DEFAULT_SEED;
    };
    let text = text.trim();
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.unwrap_or_else(|e| panic!("FUNCTIONS_SEED={text:?}: {e}"))
}

fn calls_per_algorithm() -> usize {
    std::env::var("FUNCTIONS_CALLS")
        .ok()
        .map(|text| {
            text.trim()
                .parse()
                .unwrap_or_else(|e| panic!("FUNCTIONS_CALLS={text:?}: {e}"))
        })
        .unwrap_or(DEFAULT_CALLS)
}

/// `FUNCTION LOAD REPLACE` of the library.
fn load_library(con: &mut Connection) {
    let name: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(LIBRARY)
        .query(con)
        .expect("FUNCTION LOAD of lua-reference/functions/ratelimit.lua");
    assert_eq!(name, "ratelimit");
}

/// A server with the module and the library.
fn both_engines() -> (Server, Connection) {
    let server = Server::start();
    let mut con = server.client();
    load_library(&mut con);
    (server, con)
}

/// A server with the library only.
fn library_only(builder: common::ServerBuilder) -> (Server, Connection) {
    let server = builder.no_module().start();
    let mut con = server.client();
    load_library(&mut con);
    (server, con)
}

fn one(con: &mut Connection, cmd: &Cmd) -> Value {
    send(con, std::slice::from_ref(cmd)).remove(0)
}

fn error_text(value: &Value) -> Option<String> {
    match value {
        Value::ServerError(error) => Some(format!(
            "{} {}",
            error.code(),
            error.details().unwrap_or_default()
        )),
        _ => None,
    }
}

fn show(value: &Value) -> String {
    match value {
        Value::Int(n) => n.to_string(),
        Value::Nil => "nil".into(),
        Value::BulkString(bytes) => format!("{:?}", String::from_utf8_lossy(bytes)),
        Value::SimpleString(s) => s.clone(),
        Value::Okay => "OK".into(),
        Value::ServerError(_) => format!("(error) {}", error_text(value).unwrap_or_default()),
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(show).collect();
            format!("[{}]", parts.join(", "))
        }
        other => format!("{other:?}"),
    }
}

/// The six integers of a CHECK reply; None for anything else.
fn six(value: &Value) -> Option<[i64; 6]> {
    let Value::Array(items) = value else {
        return None;
    };
    let ints: Vec<i64> = items
        .iter()
        .map(|item| match item {
            Value::Int(n) => Some(*n),
            _ => None,
        })
        .collect::<Option<_>>()?;
    ints.try_into().ok()
}

fn int(value: &Value) -> i64 {
    match value {
        Value::Int(n) => *n,
        other => panic!("not an integer: {}", show(other)),
    }
}

/// The module's error text as the library words it: the function's name where the module names
/// its command.
fn as_library_error(module: &str) -> String {
    // The library has no gcra: its list of algorithms ends at sliding-log.
    let mut text = module
        .replace("RATELIMIT.RESET it", "ratelimit_reset it")
        .replace(
            "sliding-window, sliding-log or gcra",
            "sliding-window or sliding-log",
        )
        .replace(
            "token-bucket, leaky-bucket and gcra",
            "token-bucket and leaky-bucket",
        );
    for command in ["check", "peek", "checkall", "reset", "info"] {
        text = text.replace(
            &format!("'ratelimit.{command}'"),
            &format!("'ratelimit_{command}'"),
        );
    }
    text
}

/// Equal replies: equal values, or errors whose texts agree once the names are mapped.
fn same_reply(module: &Value, library: &Value) -> bool {
    match (error_text(module), error_text(library)) {
        (Some(m), Some(l)) => as_library_error(&m) == l,
        (None, None) => module == library,
        _ => false,
    }
}

/// The library's call for a module command: `RATELIMIT.X key args` is
/// `FCALL ratelimit_x 1 key args`.
fn fcall(function: &str, keys: &[&str], args: &[String]) -> Cmd {
    let mut cmd = redis::cmd(if function == "peek" || function == "info" {
        "FCALL_RO"
    } else {
        "FCALL"
    });
    cmd.arg(format!("ratelimit_{function}"))
        .arg(keys.len())
        .arg(keys)
        .arg(args);
    cmd
}

fn native(command: &str, keys: &[&str], args: &[String]) -> Cmd {
    let mut cmd = redis::cmd(&format!("RATELIMIT.{}", command.to_uppercase()));
    if command == "checkall" {
        cmd.arg(keys.len());
    }
    cmd.arg(keys).arg(args);
    cmd
}

/// A command as redis-cli would show it.
fn cmd_text(cmd: &Cmd) -> String {
    let args: Vec<String> = cmd
        .args_iter()
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            redis::Arg::Cursor => "<cursor>".into(),
        })
        .collect();
    args.join(" ")
}

fn words(line: &str) -> Vec<String> {
    line.split(' ')
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, stream: u64) -> Rng {
        Rng(seed ^ stream.wrapping_mul(0x9E6C_63D0_676A_9A99))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (`lo` when empty).
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + ((u128::from(self.next()) * u128::from(hi - lo + 1)) >> 64) as u64
    }

    /// About as likely to be small as huge: uniform in the number of bits.
    fn log_uniform(&mut self, lo: u64, hi: u64) -> u64 {
        let lo = lo.max(1);
        if hi <= lo {
            return lo;
        }
        let bits = self.range(
            u64::from(64 - lo.leading_zeros()),
            u64::from(64 - hi.leading_zeros()),
        );
        let start = 1u64 << (bits - 1);
        let end = if bits >= 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        self.range(start.max(lo), end.min(hi))
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 99) < percent
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.range(0, items.len() as u64 - 1) as usize]
    }
}

// ---------------------------------------------------------------------------------------------
// Limits and their arguments

fn is_bucket(algorithm: &str) -> bool {
    algorithm.ends_with("bucket")
}

/// The parameters named on a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Limit {
    algorithm: &'static str,
    limit: u64,
    period: u64,
    /// BURST, buckets only; None: the default (the limit).
    burst: Option<u64>,
}

impl Limit {
    /// The largest limit (and BURST) the library takes with this period, within the run's range.
    fn bound(algorithm: &str, period: u64) -> u64 {
        match algorithm {
            "sliding-log" => LOG_LIMIT,
            "fixed-window" => MAX_AMOUNT,
            _ => MAX_AMOUNT.min((EXACT - 1) / period),
        }
    }

    fn capacity(&self) -> u64 {
        self.burst.unwrap_or(self.limit)
    }

    /// `algorithm limit period [BURST c] [COST n] [AT t]`, spelled as a client might: names in
    /// any case, periods with a unit when they have one, options in any order.
    fn args(&self, cost: u64, at: Option<u64>, rng: &mut Rng) -> Vec<String> {
        let mut args = vec![
            self.spelled_algorithm(rng),
            self.limit.to_string(),
            spelled_period(self.period, rng),
        ];
        let mut options: Vec<(&str, u64)> = Vec::new();
        if let Some(burst) = self.burst {
            options.push(("BURST", burst));
        }
        if cost != 1 || rng.chance(50) {
            options.push(("COST", cost));
        }
        if let Some(at) = at {
            options.push(("AT", at));
        }
        for i in (1..options.len()).rev() {
            options.swap(i, rng.range(0, i as u64) as usize);
        }
        for (name, value) in options {
            args.push(if rng.chance(20) {
                name.to_lowercase()
            } else {
                name.to_string()
            });
            args.push(value.to_string());
        }
        args
    }

    /// `algorithm limit period [BURST c]`, a CHECKALL spec.
    fn spec_args(&self, rng: &mut Rng) -> Vec<String> {
        let mut args = vec![
            self.spelled_algorithm(rng),
            self.limit.to_string(),
            spelled_period(self.period, rng),
        ];
        if let Some(burst) = self.burst {
            args.push("BURST".into());
            args.push(burst.to_string());
        }
        args
    }

    fn spelled_algorithm(&self, rng: &mut Rng) -> String {
        if rng.chance(10) {
            self.algorithm.to_uppercase()
        } else {
            self.algorithm.to_string()
        }
    }
}

fn spelled_period(period: u64, rng: &mut Rng) -> String {
    let units = [(DAY, "d"), (3_600_000, "h"), (60_000, "m"), (1000, "s")];
    for (ms, unit) in units {
        if period % ms == 0 && rng.chance(50) {
            let unit = if rng.chance(20) {
                unit.to_uppercase()
            } else {
                unit.to_string()
            };
            return format!("{}{unit}", period / ms);
        }
    }
    if rng.chance(10) {
        format!("{period}ms")
    } else {
        period.to_string()
    }
}

fn gen_period(rng: &mut Rng) -> u64 {
    match rng.range(0, 11) {
        0 => 1,
        1 => rng.range(2, 20),
        2..=4 => rng.pick(&[100, 250, 999, 1000, 1001, 60_000]),
        5 => rng.pick(&[3_600_000, DAY, 7 * DAY, 30 * DAY, MAX_PERIOD]),
        _ => rng.log_uniform(1, 200_000),
    }
}

fn gen_limit(algorithm: &str, rng: &mut Rng, period: u64) -> u64 {
    let limit = match rng.range(0, 9) {
        0..=3 => rng.range(1, 5),
        4..=6 => rng.range(6, 100),
        7 | 8 => rng.log_uniform(101, 1_000_000),
        _ => rng.log_uniform(1_000_001, MAX_AMOUNT),
    };
    limit.clamp(1, Limit::bound(algorithm, period))
}

fn gen_burst(rng: &mut Rng, limit: u64, bound: u64) -> Option<u64> {
    let burst = match rng.range(0, 7) {
        0 | 1 => return None,
        2 => limit,
        3 | 4 => rng.range(1, limit.saturating_sub(1).max(1)),
        5 | 6 => rng.range(limit + 1, limit.saturating_mul(4)),
        _ => rng.log_uniform(1, MAX_AMOUNT),
    };
    Some(burst.clamp(1, bound))
}

fn gen_limit_spec(algorithm: &'static str, rng: &mut Rng) -> Limit {
    let period = gen_period(rng);
    let bound = Limit::bound(algorithm, period);
    if is_bucket(algorithm) && rng.chance(10) {
        // A fast flow into a small bucket: only C·P is bounded, not the limit.
        return Limit {
            algorithm,
            limit: rng.log_uniform(1, MAX_AMOUNT),
            period,
            burst: Some(rng.log_uniform(1, 1000).min(bound)),
        };
    }
    let limit = gen_limit(algorithm, rng, period);
    let burst = if is_bucket(algorithm) {
        gen_burst(rng, limit, bound)
    } else {
        None
    };
    Limit {
        algorithm,
        limit,
        period,
        burst,
    }
}

/// Back within the library's exact range after one parameter changed.
fn fit(mut limit: Limit) -> Limit {
    limit.period = limit.period.clamp(1, MAX_PERIOD);
    let bound = Limit::bound(limit.algorithm, limit.period);
    if limit.burst.is_none() || limit.algorithm == "sliding-log" {
        limit.limit = limit.limit.min(bound);
    }
    limit.burst = limit.burst.map(|b| b.clamp(1, bound));
    limit
}

/// A parameter change between two calls on a key (the SPEC's carry-over rules).
fn change(rng: &mut Rng, current: Limit, initial: Limit) -> Limit {
    let algorithm = current.algorithm;
    let changed = match rng.range(0, 5) {
        0 => Limit {
            limit: gen_limit(algorithm, rng, current.period),
            ..current
        },
        1 => Limit {
            period: gen_period(rng),
            ..current
        },
        2 => Limit {
            period: if rng.chance(50) {
                current.period + rng.range(1, 3)
            } else {
                current.period.saturating_sub(rng.range(1, 3)).max(1)
            },
            ..current
        },
        3 if is_bucket(algorithm) => Limit {
            burst: gen_burst(rng, current.limit, Limit::bound(algorithm, current.period)),
            ..current
        },
        4 => initial,
        _ => gen_limit_spec(algorithm, rng),
    };
    fit(changed)
}

fn gen_cost(rng: &mut Rng, capacity: u64) -> u64 {
    let cost = match rng.range(0, 99) {
        0..=9 => 0,
        10..=44 => 1,
        45..=59 => rng.range(2, 5),
        60..=69 => rng.range(1, capacity),
        70..=74 => capacity,
        75..=79 => capacity + 1,
        80..=84 => rng.log_uniform(capacity + 1, capacity.saturating_mul(1000)),
        _ => rng.log_uniform(1, capacity),
    };
    cost.min(MAX_AMOUNT)
}

/// The next `AT` of a sequence whose latest time so far is `cursor` (never below `start`).
fn next_time(rng: &mut Rng, cursor: u64, start: u64, period: u64, same_ms: &mut u64) -> u64 {
    if *same_ms > 0 {
        *same_ms -= 1;
        return cursor;
    }
    let at = match rng.range(0, 99) {
        0..=14 => {
            *same_ms = rng.range(1, 6);
            cursor
        }
        15..=49 => cursor + rng.log_uniform(1, period),
        50..=59 => ((cursor / period + 1) * period + rng.range(0, 2))
            .saturating_sub(1)
            .max(cursor),
        60..=67 => cursor + 2 * period + rng.log_uniform(1, 3 * period),
        68..=76 => cursor
            .saturating_sub(rng.log_uniform(1, 2 * period))
            .max(start),
        77..=84 => cursor + period + rng.range(0, 2) - 1,
        _ => cursor + rng.log_uniform(1, 2 * period),
    };
    at.min(EXACT - 1)
}

/// One call of a sequence: the arguments after the key, shared by both engines.
#[derive(Clone, Debug)]
struct Call {
    args: Vec<String>,
    consumes_if_allowed: bool,
    at: u64,
}

fn gen_sequence(algorithm: &'static str, rng: &mut Rng, base: u64, len: usize) -> Vec<Call> {
    let initial = gen_limit_spec(algorithm, rng);
    let near_top = rng.chance(8);
    let start = if near_top {
        EXACT - 1 - rng.log_uniform(1, 40 * initial.period.min(EXACT / 80))
    } else if rng.chance(50) {
        base
    } else {
        base + rng.log_uniform(1, DAY)
    };
    let mut limit = initial;
    let mut cursor = start;
    let mut same_ms = 0;
    let mut calls = Vec::with_capacity(len);
    for i in 0..len {
        if i > 0 && rng.chance(8) {
            limit = change(rng, limit, initial);
        }
        let at = if i == 0 {
            start
        } else {
            next_time(rng, cursor, start, limit.period, &mut same_ms)
        };
        cursor = cursor.max(at);
        let cost = gen_cost(rng, limit.capacity());
        calls.push(Call {
            args: limit.args(cost, Some(at), rng),
            consumes_if_allowed: cost > 0,
            at,
        });
    }
    calls
}

// ---------------------------------------------------------------------------------------------
// Equivalence with AT

/// What one call of a sequence answered on both engines.
struct Step {
    peek_module: Value,
    peek_library: Value,
    check_module: Value,
    check_library: Value,
    expiry_module: Value,
    expiry_library: Value,
}

fn run_sequence(con: &mut Connection, nkey: &str, fkey: &str, calls: &[Call]) -> Vec<Step> {
    let mut cmds = Vec::with_capacity(calls.len() * 6);
    for call in calls {
        cmds.push(native("peek", &[nkey], &call.args));
        cmds.push(fcall("peek", &[fkey], &call.args));
        cmds.push(native("check", &[nkey], &call.args));
        cmds.push(fcall("check", &[fkey], &call.args));
        cmds.push(redis::cmd("PEXPIRETIME").arg(nkey).clone());
        cmds.push(redis::cmd("PEXPIRETIME").arg(fkey).clone());
    }
    send(con, &cmds)
        .chunks_exact(6)
        .map(|c| Step {
            peek_module: c[0].clone(),
            peek_library: c[1].clone(),
            check_module: c[2].clone(),
            check_library: c[3].clone(),
            expiry_module: c[4].clone(),
            expiry_library: c[5].clone(),
        })
        .collect()
}

fn first_difference(calls: &[Call], steps: &[Step]) -> Option<(usize, String)> {
    let mut last: Option<u64> = None;
    for (i, (call, s)) in calls.iter().zip(steps).enumerate() {
        let Some(reply) = six(&s.check_module) else {
            return Some((i, format!("module CHECK: {}", show(&s.check_module))));
        };
        if s.check_library != s.check_module {
            let what = format!(
                "CHECK: module {} != library {}",
                show(&s.check_module),
                show(&s.check_library)
            );
            return Some((i, what));
        }
        if s.peek_library != s.peek_module || s.peek_module != s.check_module {
            let what = format!(
                "PEEK: module {} library {}, then CHECK {}",
                show(&s.peek_module),
                show(&s.peek_library),
                show(&s.check_module)
            );
            return Some((i, what));
        }
        if s.expiry_library != s.expiry_module {
            let what = format!(
                "PEXPIRETIME: module {} != library {}",
                show(&s.expiry_module),
                show(&s.expiry_library)
            );
            return Some((i, what));
        }
        if reply[0] == 1 && call.consumes_if_allowed {
            let t = last.map_or(call.at, |last| last.max(call.at));
            let want = i64::try_from(u128::from(t) + reply[4] as u128).unwrap_or(i64::MAX);
            if s.expiry_library != Value::Int(want) {
                let what = format!(
                    "expiry {} != t + reset_after = {want}",
                    show(&s.expiry_library)
                );
                return Some((i, what));
            }
            last = Some(t);
        }
    }
    None
}

fn describe(nkey: &str, fkey: &str, calls: &[Call], steps: &[Step]) -> String {
    let mut out = String::new();
    for (call, s) in calls.iter().zip(steps) {
        let args = call.args.join(" ");
        let _ = writeln!(
            out,
            "  RATELIMIT.CHECK {nkey} {args}\n    -> {} (PEEK {}) expires {}\n  \
             FCALL ratelimit_check 1 {fkey} {args}\n    -> {} (PEEK {}) expires {}",
            show(&s.check_module),
            show(&s.peek_module),
            show(&s.expiry_module),
            show(&s.check_library),
            show(&s.peek_library),
            show(&s.expiry_library),
        );
    }
    out
}

#[test]
fn the_library_answers_as_the_module_on_random_sequences() {
    let started = Instant::now();
    let (_server, mut con) = both_engines();
    let seed = seed();
    let base = future_base_ms();
    let per_algorithm = calls_per_algorithm();
    for (stream, algorithm) in ALGORITHMS.into_iter().enumerate() {
        let mut rng = Rng::new(seed, stream as u64);
        let (mut done, mut sequences, mut allowed, mut rejected) = (0, 0, 0, 0);
        while done < per_algorithm {
            let len = rng.range(10, 80) as usize;
            let calls = gen_sequence(algorithm, &mut rng, base, len);
            let nkey = format!("n:{algorithm}:{sequences}");
            let fkey = format!("f:{algorithm}:{sequences}");
            let steps = run_sequence(&mut con, &nkey, &fkey, &calls);
            if let Some((i, what)) = first_difference(&calls, &steps) {
                panic!(
                    "FUNCTIONS_SEED={seed:#x}, {algorithm}, sequence {sequences}, call {i}: \
                     {what}\n{}",
                    describe(&nkey, &fkey, &calls, &steps)
                );
            }
            for s in &steps {
                match six(&s.check_module) {
                    Some(r) if r[0] == 1 => allowed += 1,
                    _ => rejected += 1,
                }
            }
            // The stored state: INFO evaluates at max(now, last), and every `last` is ahead of
            // the server's clock, so both answer for the same time.
            let infos = send(
                &mut con,
                &[
                    redis::cmd("RATELIMIT.INFO").arg(&nkey).clone(),
                    fcall("info", &[&fkey], &[]),
                ],
            );
            assert_eq!(
                infos[0],
                infos[1],
                "FUNCTIONS_SEED={seed:#x}, {algorithm}, sequence {sequences}: INFO module {} \
                 != library {}\n{}",
                show(&infos[0]),
                show(&infos[1]),
                describe(&nkey, &fkey, &calls, &steps)
            );
            done += len;
            sequences += 1;
        }
        println!(
            "{algorithm}: {done} calls on {sequences} keys, {allowed} allowed, {rejected} rejected"
        );
    }
    // RESET answers alike, and removes every key of both engines.
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    let (nkeys, fkeys): (Vec<&str>, Vec<&str>) = keys
        .iter()
        .map(String::as_str)
        .partition(|k| k.starts_with("n:"));
    let removed_module = int(&one(&mut con, &native("reset", &nkeys, &[])));
    let removed_library = int(&one(&mut con, &fcall("reset", &fkeys, &[])));
    assert_eq!(removed_module, removed_library);
    assert_eq!(removed_library as usize, fkeys.len());
    let left: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(left, 0);
    println!("{:?} in all", started.elapsed());
}

/// Long runs on single sliding logs: thousands of entries slide through, so the library's dead
/// records are reclaimed many times, runs at one ms grow in place, limits and periods change.
#[test]
fn long_sliding_logs_answer_as_the_module() {
    let (_server, mut con) = both_engines();
    let seed = seed();
    let base = future_base_ms();
    let mut rng = Rng::new(seed, 400);
    for key in 0..8u64 {
        let mut limit = Limit {
            algorithm: "sliding-log",
            limit: rng.pick(&[1, 5, 50, 500]),
            period: rng.pick(&[20, 200, 1000, 60_000]),
            burst: None,
        };
        let mut at = base + key * 7;
        let mut calls = Vec::new();
        for _ in 0..1500 {
            if rng.chance(1) {
                limit.limit = rng.pick(&[1, 5, 50, 500]);
                limit.period = rng.pick(&[20, 200, 1000, 60_000]);
            }
            at += match rng.range(0, 9) {
                0..=2 => 0,
                3..=8 => rng.range(1, limit.period / 10 + 1),
                _ => rng.range(0, 2 * limit.period),
            };
            let cost = match rng.range(0, 9) {
                0 => 0,
                1..=6 => 1,
                _ => rng.range(2, 10),
            };
            calls.push(Call {
                args: limit.args(cost, Some(at), &mut rng),
                consumes_if_allowed: cost > 0,
                at,
            });
        }
        let (nkey, fkey) = (format!("n:log:{key}"), format!("f:log:{key}"));
        let steps = run_sequence(&mut con, &nkey, &fkey, &calls);
        if let Some((i, what)) = first_difference(&calls, &steps) {
            let from = i.saturating_sub(20);
            panic!(
                "FUNCTIONS_SEED={seed:#x}, log {key}, call {i}: {what}\ncalls {from}..={i}:\n{}",
                describe(&nkey, &fkey, &calls[from..=i], &steps[from..=i])
            );
        }
        let infos = send(
            &mut con,
            &[
                redis::cmd("RATELIMIT.INFO").arg(&nkey).clone(),
                fcall("info", &[&fkey], &[]),
            ],
        );
        assert_eq!(infos[0], infos[1], "log {key}: INFO");
    }
}

// ---------------------------------------------------------------------------------------------
// CHECKALL

#[test]
fn checkall_answers_as_the_module_with_repeated_keys_and_wrong_algorithms() {
    let (_server, mut con) = both_engines();
    let seed = seed();
    let base = future_base_ms();
    let mut rng = Rng::new(seed, 100);
    let mut calls = 0;
    let mut admitted = 0;
    let mut repeated = 0;
    let mut errors = 0;
    for group in 0..60 {
        // Three keys per group, each with its own algorithm and changing parameters.
        let names = ["a", "b", "c"];
        let mut limits: Vec<Limit> = (0..3)
            .map(|_| {
                let algorithm = rng.pick(&ALGORITHMS);
                let period = rng.pick(&[3, 50, 1000, 60_000]);
                let limit = rng.range(1, 8).min(Limit::bound(algorithm, period));
                let burst = (is_bucket(algorithm) && rng.chance(50)).then(|| rng.range(1, 10));
                Limit {
                    algorithm,
                    limit,
                    period,
                    burst,
                }
            })
            .collect();
        let nkeys: Vec<String> = names.iter().map(|k| format!("n:{group}:{k}")).collect();
        let fkeys: Vec<String> = names.iter().map(|k| format!("f:{group}:{k}")).collect();
        let start = base + rng.range(0, DAY);
        let mut cursor = start;
        let mut history = String::new();
        for _ in 0..40 {
            let count = rng.range(1, 4) as usize;
            let picked: Vec<usize> = (0..count).map(|_| rng.range(0, 2) as usize).collect();
            if picked
                .iter()
                .enumerate()
                .any(|(i, k)| picked[..i].contains(k))
            {
                repeated += 1;
            }
            for &k in &picked {
                if rng.chance(10) {
                    limits[k].limit = rng.range(1, 8);
                    limits[k].period = rng.pick(&[3, 50, 1000, 1001, 60_000]);
                }
            }
            let mut args = Vec::new();
            for (i, &k) in picked.iter().enumerate() {
                let mut limit = limits[k];
                if rng.chance(3) {
                    limit.algorithm = rng.pick(&ALGORITHMS); // most likely another algorithm
                    if !is_bucket(limit.algorithm) {
                        limit.burst = None;
                    }
                }
                if i + 1 < count {
                    args.extend(limit.spec_args(&mut rng));
                } else {
                    let cost = match rng.range(0, 9) {
                        0 => 0,
                        1..=5 => 1,
                        6..=8 => rng.range(2, 4),
                        _ => rng.range(5, 12),
                    };
                    let step = match rng.range(0, 9) {
                        0..=2 => 0,
                        3..=7 => rng.range(1, 40),
                        8 => rng.range(500, 3000),
                        _ => 0,
                    };
                    let at = if rng.chance(10) {
                        cursor.saturating_sub(rng.range(1, 100)).max(start)
                    } else {
                        cursor + step
                    };
                    cursor = cursor.max(at);
                    args.extend(limit.args(cost, Some(at), &mut rng));
                }
            }
            let n: Vec<&str> = picked.iter().map(|&k| nkeys[k].as_str()).collect();
            let f: Vec<&str> = picked.iter().map(|&k| fkeys[k].as_str()).collect();
            let mut cmds = vec![native("checkall", &n, &args), fcall("checkall", &f, &args)];
            for k in 0..3 {
                cmds.push(redis::cmd("PEXPIRETIME").arg(&nkeys[k]).clone());
                cmds.push(redis::cmd("PEXPIRETIME").arg(&fkeys[k]).clone());
            }
            let replies = send(&mut con, &cmds);
            let _ = writeln!(
                history,
                "  CHECKALL {} {} {}\n    module  {}\n    library {}",
                count,
                picked
                    .iter()
                    .map(|&k| names[k])
                    .collect::<Vec<_>>()
                    .join(" "),
                args.join(" "),
                show(&replies[0]),
                show(&replies[1])
            );
            assert!(
                same_reply(&replies[0], &replies[1]),
                "FUNCTIONS_SEED={seed:#x}, group {group}: CHECKALL differs\n{history}"
            );
            for k in 0..3 {
                assert_eq!(
                    replies[2 + 2 * k],
                    replies[3 + 2 * k],
                    "FUNCTIONS_SEED={seed:#x}, group {group}: PEXPIRETIME of key {} differs\n\
                     {history}",
                    names[k]
                );
            }
            // A limit of another algorithm may have created the key: reset it now and then.
            let mismatch = error_text(&replies[1]).is_some_and(|e| e.contains("limiter, not"));
            if mismatch && rng.chance(50) {
                let removed = send(
                    &mut con,
                    &[native("reset", &n, &[]), fcall("reset", &f, &[])],
                );
                assert_eq!(removed[0], removed[1], "RESET after\n{history}");
            }
            calls += 1;
            match &replies[0] {
                Value::Array(items) if six(&items[0]).is_some_and(|r| r[0] == 1) => admitted += 1,
                Value::ServerError(_) => errors += 1,
                _ => {}
            }
        }
        for k in 0..3 {
            let infos = send(
                &mut con,
                &[
                    redis::cmd("RATELIMIT.INFO").arg(&nkeys[k]).clone(),
                    fcall("info", &[&fkeys[k]], &[]),
                ],
            );
            assert_eq!(
                infos[0], infos[1],
                "group {group} key {}\n{history}",
                names[k]
            );
        }
    }
    println!(
        "{calls} CHECKALLs: {admitted} admitted, {repeated} with a repeated key, {errors} errors"
    );
    assert!(admitted > calls / 5 && repeated > calls / 5 && errors > 0);
}

// ---------------------------------------------------------------------------------------------
// The server's clock

/// A period of at least `ms` whose current window ends more than two minutes from now, so a
/// window boundary cannot fall between the two engines' calls.
fn safe_period(now: u64, ms: u64) -> u64 {
    (0..)
        .map(|k| ms + k * 60_000)
        .find(|p| now % p < p - 120_000)
        .expect("some period fits")
}

#[test]
fn without_at_both_engines_stay_consistent() {
    let (_server, mut con) = both_engines();
    let mut rng = Rng::new(seed(), 200);
    let period = safe_period(common::now_ms(), 3_600_000);
    for algorithm in ALGORITHMS {
        let limit = Limit {
            algorithm,
            limit: 5,
            period,
            burst: is_bucket(algorithm).then_some(40),
        };
        let (nkey, fkey) = (
            format!("n:clock:{algorithm}"),
            format!("f:clock:{algorithm}"),
        );
        let mut widest = 0;
        let mut seen_rejected = false;
        for i in 0..80 {
            let cost = if i % 9 == 8 { 0 } else { rng.range(1, 3) };
            let args = limit.args(cost, None, &mut rng);
            let cmds = [
                native("check", &[&nkey], &args),
                fcall("check", &[&fkey], &args),
                redis::cmd("PEXPIRETIME").arg(&nkey).clone(),
                redis::cmd("PEXPIRETIME").arg(&fkey).clone(),
            ];
            let sent = Instant::now();
            let replies = send(&mut con, &cmds);
            // The two calls ran within this many ms of each other.
            let apart = sent.elapsed().as_millis() as i64 + 1;
            widest = widest.max(apart);
            let (m, f) = (six(&replies[0]).unwrap(), six(&replies[1]).unwrap());
            let context = format!(
                "{algorithm} call {i} ({}): module {m:?} library {f:?}",
                args.join(" ")
            );
            assert_eq!(
                m[..3],
                f[..3],
                "allowed, limit, remaining differ: {context}"
            );
            for field in 3..6 {
                assert!(
                    (m[field] - f[field]).abs() <= widest + apart,
                    "field {field} apart by more than {} ms: {context}",
                    widest + apart
                );
            }
            let (em, ef) = (int(&replies[2]), int(&replies[3]));
            assert!(
                (em - ef).abs() <= widest + 1,
                "expiries {em} and {ef} more than {widest} ms apart: {context}"
            );
            seen_rejected |= m[0] == 0;
        }
        assert!(
            seen_rejected,
            "{algorithm}: the workload never reached the limit"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Replication, MULTI, replicas, ACL, OOM

/// Every key's value and absolute expiry on `server`.
fn keyspace(con: &mut Connection) -> HashMap<Vec<u8>, (Value, Value)> {
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(con).unwrap();
    let mut cmds = Vec::new();
    for key in &keys {
        cmds.push(redis::cmd("GET").arg(key).clone());
        cmds.push(redis::cmd("PEXPIRETIME").arg(key).clone());
    }
    let values = send(con, &cmds);
    keys.into_iter()
        .zip(values.chunks_exact(2))
        .map(|(key, pair)| (key, (pair[0].clone(), pair[1].clone())))
        .collect()
}

#[test]
fn a_replica_holds_the_masters_state_and_serves_read_only_calls() {
    let (master, mut con) = library_only(Server::builder());
    let replica = Server::builder().no_module().start();
    replica.replica_of(&master);
    let mut rng = Rng::new(seed(), 300);
    let base = future_base_ms();
    // With the server's clock: long periods, so nothing expires while the test runs.
    let mut cmds = Vec::new();
    for round in 0..300 {
        let algorithm = ALGORITHMS[round % 5];
        let limit = Limit {
            algorithm,
            limit: rng.range(3, 20),
            period: rng.pick(&[3_600_000, DAY]),
            burst: (is_bucket(algorithm) && rng.chance(50)).then(|| rng.range(1, 30)),
        };
        let key = format!("clock:{algorithm}:{}", rng.range(0, 4));
        cmds.push(fcall(
            "check",
            &[&key],
            &limit.args(rng.range(0, 3), None, &mut rng),
        ));
        if round % 7 == 0 {
            // The key twice, with another key between.
            let second = format!("clock:fixed-window:{}", rng.range(0, 4));
            let mut args = limit.spec_args(&mut rng);
            args.extend(words("fixed-window 100 1h"));
            args.extend(limit.spec_args(&mut rng));
            args.extend(words("COST 1"));
            cmds.push(fcall("checkall", &[&key, &second, &key], &args));
        }
    }
    // With AT: sliding logs that slide over thousands of entries (dead records reclaimed, runs
    // at one ms extended in place) and every algorithm stepping through its windows.
    for (i, algorithm) in ALGORITHMS.into_iter().enumerate() {
        let limit = Limit {
            algorithm,
            limit: 50,
            period: 200,
            burst: None,
        };
        let key = format!("at:{algorithm}");
        let mut at = base + i as u64;
        for _ in 0..2000 {
            at += rng.range(0, 6);
            cmds.push(fcall(
                "check",
                &[&key],
                &limit.args(rng.range(0, 2), Some(at), &mut rng),
            ));
        }
    }
    cmds.push(fcall(
        "reset",
        &["clock:token-bucket:0", "clock:token-bucket:0", "none"],
        &[],
    ));
    let replies = send(&mut con, &cmds);
    let failed: Vec<String> = replies.iter().filter_map(error_text).collect();
    assert!(failed.is_empty(), "errors: {failed:?}");
    common::wait_replica_sync(&master, &replica);

    let mut replica_con = replica.client();
    let on_master = keyspace(&mut con);
    let on_replica = keyspace(&mut replica_con);
    assert!(on_master.len() >= 20, "{} keys", on_master.len());
    assert_eq!(on_master.len(), on_replica.len());
    for (key, state) in &on_master {
        assert_eq!(
            on_replica.get(key),
            Some(state),
            "key {}",
            String::from_utf8_lossy(key)
        );
        assert!(
            matches!(state.1, Value::Int(ms) if ms > 0),
            "no expiry: {state:?}"
        );
    }
    // The AT keys' INFO is the same on both (every `last` is ahead of both clocks).
    for algorithm in ALGORITHMS {
        let info = fcall("info", &[&format!("at:{algorithm}")], &[]);
        let (m, r) = (one(&mut con, &info), one(&mut replica_con, &info));
        assert!(matches!(m, Value::Array(_)), "{}", show(&m));
        assert_eq!(m, r);
    }

    // Read-only calls work on the replica; writing ones do not, and change nothing.
    let peek = fcall(
        "peek",
        &["at:token-bucket"],
        &words("token-bucket 50 200 COST 1"),
    );
    assert!(six(&one(&mut replica_con, &peek)).is_some());
    let mut check_ro = redis::cmd("FCALL_RO");
    check_ro
        .arg("ratelimit_check")
        .arg(1)
        .arg("at:token-bucket")
        .arg(words("token-bucket 50 200"));
    // FCALL_RO refuses a function that may write (on a replica Redis says READONLY first).
    let refused = error_text(&one(&mut con, &check_ro)).expect("FCALL_RO of a writer");
    assert!(refused.contains("write flag"), "{refused}");
    let refused = error_text(&one(&mut replica_con, &check_ro)).expect("FCALL_RO of a writer");
    assert!(refused.starts_with("READONLY"), "{refused}");
    let check = fcall("check", &["new"], &words("token-bucket 50 200"));
    let refused = error_text(&one(&mut replica_con, &check)).expect("FCALL on a replica");
    assert!(refused.starts_with("READONLY"), "{refused}");
    assert_eq!(keyspace(&mut replica_con), on_replica);
    assert_eq!(keyspace(&mut con), on_master);
}

#[test]
fn multi_acl_and_maxmemory() {
    let (server, mut con) =
        library_only(Server::builder().config(&[("maxmemory-policy", "noeviction")]));
    let args = words("fixed-window 3 1h");

    // MULTI/EXEC: four checks against a limit of three.
    let mut pipe = redis::pipe();
    pipe.atomic();
    for _ in 0..4 {
        pipe.add_command(fcall("check", &["multi"], &args));
    }
    let replies: Vec<Vec<i64>> = pipe.query(&mut con).expect("EXEC");
    let allowed: Vec<i64> = replies.iter().map(|r| r[0]).collect();
    assert_eq!(allowed, [1, 1, 1, 0]);
    assert_eq!(replies[3][2], 0);

    // Keys are declared: COMMAND GETKEYS sees them, and ACL key patterns restrict them.
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("FCALL")
        .arg("ratelimit_checkall")
        .arg(2)
        .arg(&[
            "{t}:a",
            "{t}:b",
            "fixed-window",
            "1",
            "1s",
            "fixed-window",
            "1",
            "1m",
        ])
        .query(&mut con)
        .unwrap();
    assert_eq!(keys, ["{t}:a", "{t}:b"]);
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "tenant1", "on", ">secret", "~tenant1:*", "+@all"])
        .query(&mut con)
        .expect("ACL SETUSER");
    let mut tenant = redis::Client::open(format!(
        "redis://tenant1:secret@127.0.0.1:{}/",
        server.port()
    ))
    .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(10)))
    .expect("connect as tenant1");
    assert!(six(&one(&mut tenant, &fcall("check", &["tenant1:a"], &args))).is_some());
    for cmd in [
        fcall("check", &["tenant2:a"], &args),
        fcall("peek", &["other"], &args),
        fcall("info", &["other"], &[]),
        fcall("reset", &["tenant1:a", "other"], &[]),
        fcall(
            "checkall",
            &["tenant1:a", "tenant2:b"],
            &words("fixed-window 3 1h fixed-window 3 1h"),
        ),
    ] {
        let error = error_text(&one(&mut tenant, &cmd)).expect("refused");
        assert!(error.starts_with("NOPERM"), "{error}");
    }
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&["tenant2:a", "tenant2:b", "other"])
        .query(&mut con)
        .unwrap();
    assert_eq!(exists, 0);

    // Over maxmemory: a check is refused with OOM and changes nothing; peek and info answer.
    let before = keyspace(&mut con);
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "1"])
        .query(&mut con)
        .unwrap();
    for key in ["multi", "fresh"] {
        let error = error_text(&one(&mut con, &fcall("check", &[key], &args))).expect("OOM");
        assert!(error.starts_with("OOM"), "{error}");
    }
    for cmd in [
        fcall("checkall", &["multi"], &args),
        fcall("reset", &["multi"], &[]),
    ] {
        let error = error_text(&one(&mut con, &cmd)).expect("OOM");
        assert!(error.starts_with("OOM"), "{}: {error}", cmd_text(&cmd));
    }
    let peek = six(&one(&mut con, &fcall("peek", &["multi"], &args))).expect("peek under OOM");
    assert_eq!(peek[..3], [0, 3, 0]);
    let mut peek_rw = redis::cmd("FCALL");
    peek_rw.arg("ratelimit_peek").arg(1).arg("multi").arg(&args);
    assert!(
        six(&one(&mut con, &peek_rw)).is_some(),
        "FCALL of a no-writes function"
    );
    assert!(matches!(
        one(&mut con, &fcall("info", &["multi"], &[])),
        Value::Array(_)
    ));
    assert_eq!(keyspace(&mut con), before);
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "0"])
        .query(&mut con)
        .unwrap();
    assert!(six(&one(&mut con, &fcall("check", &["fresh"], &args))).is_some_and(|r| r[0] == 1));
}

/// Rejections, COST 0, PEEK, INFO and errors write nothing: the dirty counter stays, nothing is
/// replicated, every value and expiry stays.
#[test]
fn calls_that_change_nothing_write_nothing() {
    let (server, mut con) = library_only(Server::builder());
    let at = future_base_ms();
    let mut setup = Vec::new();
    for algorithm in ALGORITHMS {
        let args = words(&format!("{algorithm} 2 1h COST 2 AT {at}"));
        setup.push(fcall("check", &[algorithm], &args));
    }
    let replies = send(&mut con, &setup);
    assert!(replies.iter().all(|r| six(r).is_some_and(|r| r[0] == 1)));
    let dirty = |server: &Server| server.info_field("persistence", "rdb_changes_since_last_save");
    let before = (dirty(&server), keyspace(&mut con));
    let mut calls = Vec::new();
    for algorithm in ALGORITHMS {
        for cost in [1, 0, 3] {
            let args = words(&format!("{algorithm} 2 1h COST {cost} AT {}", at + 5));
            calls.push(fcall("check", &[algorithm], &args));
            calls.push(fcall("peek", &[algorithm], &args));
            calls.push(fcall("checkall", &[algorithm, algorithm], &{
                let mut both = words(&format!("{algorithm} 2 1h"));
                both.extend(args.clone());
                both
            }));
        }
        calls.push(fcall("info", &[algorithm], &[]));
        calls.push(fcall("check", &[algorithm], &words("leaky-window 1 1s")));
        calls.push(fcall("check", &[algorithm], &words("fixed-window 0 1s")));
        let other = if algorithm == "fixed-window" {
            "token-bucket"
        } else {
            "fixed-window"
        };
        calls.push(fcall(
            "check",
            &[algorithm],
            &words(&format!("{other} 5 1h")),
        ));
    }
    calls.push(fcall("reset", &["missing", "missing2"], &[]));
    calls.push(fcall(
        "check",
        &["nothing-yet"],
        &words("sliding-log 3 1s COST 0"),
    ));
    calls.push(fcall(
        "check",
        &["nothing-yet"],
        &words("sliding-log 3 1s COST 4"),
    ));
    let replies = send(&mut con, &calls);
    let answered = replies.iter().filter(|r| six(r).is_some()).count();
    let errors = replies.iter().filter(|r| error_text(r).is_some()).count();
    assert!(
        answered >= 30 && errors >= 15,
        "{answered} answers, {errors} errors"
    );
    assert_eq!((dirty(&server), keyspace(&mut con)), before);
}

// ---------------------------------------------------------------------------------------------
// Errors

#[test]
fn every_bad_argument_gets_the_modules_message() {
    let (_server, mut con) = both_engines();
    let check_vectors = [
        "",
        "token-bucket",
        "token-bucket 10",
        "leaky-window 10 1s",
        "sliding-logs 1 1s",
        "fixed-window 0 1s",
        "fixed-window -1 1s",
        "fixed-window 1000000000001 1s",
        "fixed-window 99999999999999999999999 1s",
        "fixed-window 1.0 1s",
        "fixed-window 10 0",
        "fixed-window 10 0s",
        "fixed-window 10 3651d",
        "fixed-window 10 1w",
        "fixed-window 10 1.5s",
        "fixed-window 10 s",
        "fixed-window 10 -1s",
        "fixed-window 10 1mss",
        "fixed-window 10 1s BURST 5",
        "FIXED-WINDOW 10 1S cost 1 at 5 burst 2",
        "token-bucket 10 1s BURST 0",
        "token-bucket 10 1s BURST x",
        "token-bucket 10 1s BURST",
        "token-bucket 10 1s BURST 2 BURST 3",
        "token-bucket 10 1s COST -1",
        "token-bucket 10 1s COST 1000000000001",
        "token-bucket 10 1s COST",
        "token-bucket 10 1s COST 1 COST 2",
        "token-bucket 10 1s COST x COST 2",
        "token-bucket 10 1s COST 1 COST x",
        "token-bucket 10 1s AT 9007199254740992",
        "token-bucket 10 1s AT 1e3",
        "token-bucket 10 1s AT",
        "token-bucket 10 1s AT 1 AT 2",
        "token-bucket 10 1s LIMIT 3",
        "token-bucket 10 1s COST 1 AT 2 BURST 3 COST 4",
        "sliding-log 100001 1s",
        "sliding-log 1000000000000 1s COST 1",
    ];
    for line in check_vectors {
        let args = words(line);
        for command in ["check", "peek"] {
            let replies = send(
                &mut con,
                &[
                    native(command, &["k"], &args),
                    fcall(command, &["k"], &args),
                ],
            );
            let module = error_text(&replies[0])
                .unwrap_or_else(|| panic!("{command} {line}: {}", show(&replies[0])));
            assert_eq!(
                error_text(&replies[1]),
                Some(as_library_error(&module)),
                "{command} k {line}"
            );
        }
    }
    let checkall_vectors = [
        ("k", "fixed-window 1"),
        ("", "k fixed-window 1 1s"),
        ("a b c d", ""),
        (
            "a b",
            "fixed-window 1 1s fixed-window 1 1s fixed-window 1 1s",
        ),
        ("a b c", "fixed-window 1 1s fixed-window 1 1s"),
        ("a b", "fixed-window 1 1s COST 1 AT 5 x"),
        ("a b", "fixed-window 1 1s fixed-window 1"),
        ("a b", "token-bucket 1 1s BURST 2 BURST 3 fixed-window 1 1s"),
        ("a b", "fixed-window 1 1s BURST 2 fixed-window 1 1s"),
        ("a b", "token-bucket 1 1s fixed-window 1 1s BURST 2"),
        ("a b", "token-bucket 1 1s BURST"),
        ("a b", "token-bucket 1 1s BURST x fixed-window 1 1s"),
        ("a b", "leaky-window 1 1s fixed-window 1 1s"),
        ("a b", "fixed-window 1 1s sliding-logs 1 1s"),
        ("a b", "fixed-window 1 0 fixed-window 1 1s"),
        (
            "a b c",
            "fixed-window 1 1s fixed-window 0 1s fixed-window 1 1s",
        ),
        ("a b", "fixed-window 1 1s fixed-window 1 1s COST 1 COST 2"),
        ("a b", "fixed-window 1 1s fixed-window 1 1s COST x"),
        ("a b", "fixed-window 1 1s fixed-window 1 1s AT"),
        ("a b", "fixed-window 1 1s fixed-window 1 1s LIMIT 2"),
        ("a b", "sliding-log 100001 1s fixed-window 1 1s"),
        (
            "a b",
            "fixed-window 1 1s token-bucket 1 1s COST 1 BURST 2 BURST 3",
        ),
        ("k", "token-bucket 10 1s at 5 cost 2 burst 0"),
        ("k", "fixed-window 10 1s BURST 5"),
    ];
    for (keys, line) in checkall_vectors {
        let keys = words(keys);
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let args = words(line);
        let replies = send(
            &mut con,
            &[
                native("checkall", &keys, &args),
                fcall("checkall", &keys, &args),
            ],
        );
        let module = error_text(&replies[0])
            .unwrap_or_else(|| panic!("CHECKALL {keys:?} {line}: {}", show(&replies[0])));
        assert_eq!(
            error_text(&replies[1]),
            Some(as_library_error(&module)),
            "CHECKALL {keys:?} {line}"
        );
    }
    for (command, keys, args) in [
        ("info", vec!["k"], words("extra")),
        ("reset", vec![], vec![]),
    ] {
        let module = error_text(&one(&mut con, &native(command, &keys, &args))).unwrap();
        let library = error_text(&one(&mut con, &fcall(command, &keys, &args)));
        assert_eq!(library, Some(as_library_error(&module)), "{command}");
    }
    let dbsize: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(dbsize, 0, "an error created a key");

    // Where only the library refuses: its exact range, and FCALL's own key count.
    let lua_only = [
        (
            fcall(
                "check",
                &["k"],
                &words("token-bucket 10 1d BURST 1000000000000"),
            ),
            "ERR BURST (or limit, without BURST) times the period in ms must be below 2^53",
        ),
        (
            fcall("peek", &["k"], &words("leaky-bucket 1000000000000 10s")),
            "ERR BURST (or limit, without BURST) times the period in ms must be below 2^53",
        ),
        (
            fcall("check", &["k"], &words("sliding-window 1000000000000 10s")),
            "ERR limit times the period in ms must be below 2^53",
        ),
        (
            fcall(
                "checkall",
                &["a", "b"],
                &words("fixed-window 1 1s sliding-window 1000000000 1d"),
            ),
            "ERR limit spec 2 (key 'b'): limit times the period in ms must be below 2^53",
        ),
        (
            fcall("check", &[], &words("fixed-window 1 1s")),
            "ERR ratelimit_check takes exactly one key",
        ),
        (
            fcall("info", &["a", "b"], &[]),
            "ERR ratelimit_info takes exactly one key",
        ),
    ];
    for (cmd, prefix) in lua_only {
        let error = error_text(&one(&mut con, &cmd)).unwrap_or_default();
        assert!(error.starts_with(prefix), "{}: {error}", cmd_text(&cmd));
    }
    // The same limits are fine where the product stays below 2^53.
    for (cmd, module) in [
        (
            fcall(
                "check",
                &["ok1"],
                &words("token-bucket 10 9007ms BURST 1000000000000"),
            ),
            native(
                "check",
                &["ok1n"],
                &words("token-bucket 10 9007ms BURST 1000000000000"),
            ),
        ),
        (
            fcall(
                "check",
                &["ok2"],
                &words("fixed-window 1000000000000 3650d COST 1000000000000"),
            ),
            native(
                "check",
                &["ok2n"],
                &words("fixed-window 1000000000000 3650d COST 1000000000000"),
            ),
        ),
    ] {
        let library = one(&mut con, &cmd);
        assert!(six(&library).is_some(), "{}", show(&library));
        assert_eq!(six(&library), six(&one(&mut con, &module)));
    }
}

#[test]
fn keys_of_the_other_engine_or_type_are_wrongtype_and_reset_counts_like_del() {
    let (_server, mut con) = both_engines();
    let args = words("token-bucket 5 1h");
    let setup = [
        native("check", &["module-key"], &args),
        fcall("check", &["library-key"], &args),
        fcall("check", &["library-log"], &words("sliding-log 5 1h")),
        redis::cmd("HSET").arg(&["hash", "f", "v"]).clone(),
        redis::cmd("SET").arg(&["plain", "hello"]).clone(),
        redis::cmd("SET").arg(&["empty", ""]).clone(),
        redis::cmd("SET").arg(&["lookalike", "rl:tb 1 2"]).clone(),
        redis::cmd("SET").arg(&["lookalike-log", "rl:sl"]).clone(),
    ];
    let replies = send(&mut con, &setup);
    assert!(replies.iter().all(|r| error_text(r).is_none()));
    const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
    for key in [
        "module-key",
        "hash",
        "plain",
        "empty",
        "lookalike",
        "lookalike-log",
    ] {
        for cmd in [
            fcall("check", &[key], &args),
            fcall("peek", &[key], &args),
            fcall("info", &[key], &[]),
            fcall(
                "checkall",
                &["library-key", key],
                &words("token-bucket 5 1h token-bucket 5 1h"),
            ),
            fcall("reset", &["library-key", key], &[]),
        ] {
            assert_eq!(
                error_text(&one(&mut con, &cmd)).as_deref(),
                Some(WRONGTYPE),
                "{key}: {}",
                cmd_text(&cmd)
            );
        }
    }
    for cmd in [
        native("check", &["library-key"], &args),
        native("info", &["library-log"], &[]),
        native("reset", &["module-key", "library-key"], &[]),
    ] {
        assert_eq!(
            error_text(&one(&mut con, &cmd)).as_deref(),
            Some(WRONGTYPE),
            "{}",
            cmd_text(&cmd)
        );
    }
    // Another algorithm on a limiter key: the module's message, with the function's name.
    let module = error_text(&one(
        &mut con,
        &native("check", &["module-key"], &words("sliding-log 5 1h")),
    ))
    .unwrap();
    let library = error_text(&one(
        &mut con,
        &fcall("check", &["library-key"], &words("sliding-log 5 1h")),
    ));
    assert_eq!(library, Some(as_library_error(&module)));
    let library = error_text(&one(&mut con, &fcall("check", &["library-log"], &args)));
    assert_eq!(
        library.as_deref(),
        Some("ERR key holds a sliding-log limiter, not token-bucket: ratelimit_reset it to change algorithm")
    );
    // RESET: a key named twice counts once, a missing one not at all; nothing else is touched.
    assert_eq!(one(&mut con, &fcall("info", &["missing"], &[])), Value::Nil);
    let removed = one(
        &mut con,
        &fcall(
            "reset",
            &["library-key", "missing", "library-key", "library-log"],
            &[],
        ),
    );
    assert_eq!(removed, Value::Int(2));
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&["library-key", "library-log", "module-key", "hash", "plain"])
        .query(&mut con)
        .unwrap();
    assert_eq!(exists, 3);
}

// ---------------------------------------------------------------------------------------------
// Memory

fn memory_usage(con: &mut Connection, key: &str) -> i64 {
    redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query(con)
        .expect("MEMORY USAGE")
}

/// Bytes per key for every algorithm, and per entry of a full sliding log, against the module
/// and the seed's ZSET (a member per request): printed with `--nocapture`.
#[test]
fn memory_per_key_and_per_log_entry() {
    let (_server, mut con) = both_engines();
    let at = future_base_ms();
    println!(
        "MEMORY USAGE of one key (`rl:` and 12 digits, 15-byte names; state after one CHECK):"
    );
    for algorithm in ALGORITHMS {
        let args = words(&format!("{algorithm} 100 1m AT {at}"));
        send(
            &mut con,
            &[
                native("check", &["rl:000000000001"], &args),
                fcall("check", &["rl:000000000002"], &args),
            ],
        );
        let (module, library) = (
            memory_usage(&mut con, "rl:000000000001"),
            memory_usage(&mut con, "rl:000000000002"),
        );
        println!("  {algorithm:15} module {module:4} B   library {library:4} B");
        let _: i64 = redis::cmd("DEL")
            .arg(&["rl:000000000001", "rl:000000000002"])
            .query(&mut con)
            .unwrap();
        assert!(library <= 160, "{algorithm}: {library} B");
    }

    // A full log of 100000 entries 700 ms apart, then 20000 more calls sliding it (one entry
    // leaves as one comes), as the module's own memory test measures it.
    const ENTRIES: u64 = 100_000;
    const GAP: u64 = 700;
    let period = ENTRIES * GAP;
    let args = |t: u64| words(&format!("sliding-log {ENTRIES} {period} AT {t}"));
    let fill = |con: &mut Connection, from: u64, to: u64| {
        for chunk in (from..to).collect::<Vec<_>>().chunks(2000) {
            let mut cmds = Vec::new();
            for &i in chunk {
                cmds.push(native("check", &["log:module"], &args(at + i * GAP)));
                cmds.push(fcall("check", &["log:library"], &args(at + i * GAP)));
            }
            let replies = send(con, &cmds);
            for pair in replies.chunks_exact(2) {
                assert_eq!(pair[0], pair[1]);
                assert_eq!(six(&pair[0]).map(|r| r[0]), Some(1), "{}", show(&pair[0]));
            }
        }
    };
    fill(&mut con, 0, ENTRIES);
    for chunk in (0..ENTRIES).collect::<Vec<_>>().chunks(5000) {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg("log:seed");
        for &i in chunk {
            zadd.arg(at + i * GAP).arg(at + i * GAP); // the seed's ZADD key t t
        }
        one(&mut con, &zadd);
    }
    let per_entry =
        |con: &mut Connection, key: &str| memory_usage(con, key) as f64 / ENTRIES as f64;
    let full = (
        per_entry(&mut con, "log:module"),
        per_entry(&mut con, "log:library"),
        per_entry(&mut con, "log:seed"),
    );
    fill(&mut con, ENTRIES, ENTRIES + 20_000);
    let slid = (
        per_entry(&mut con, "log:module"),
        per_entry(&mut con, "log:library"),
    );
    println!(
        "sliding log, {ENTRIES} entries {GAP} ms apart, bytes per entry: module {:.2}, library \
         {:.2}, seed ZSET {:.2}; after sliding 20000 more: module {:.2}, library {:.2}",
        full.0, full.1, full.2, slid.0, slid.1
    );
    let info = one(&mut con, &fcall("info", &["log:library"], &[]));
    assert_eq!(info, one(&mut con, &native("info", &["log:module"], &[])));
    assert!(full.1 < 4.5 && slid.1 < 6.0, "library: {full:?} {slid:?}");
    assert!(slid.1 * 4.0 < full.2, "library {slid:?} vs seed {full:?}");
}
