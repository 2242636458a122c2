//! The conformance vectors of every engine: `cargo run -p redis-ratelimit-core --example vectors
//! > tests/vectors/v1.json` (tests/vectors/README.md describes the file).
//!
//! Seeded timelines of calls with `AT` on one key each (every algorithm; CHECK, PEEK, TAKE,
//! REFUND, RESET; BURST, BLOCK, parameter changes, calls before the key's last time, the largest
//! amounts and periods), decided by this crate: each call's exact reply and what the key then
//! holds (its absolute expiry, its state in exact integers, what `RATELIMIT.INFO` shows).
//! `core/tests/vectors.rs` fails when the committed file is not what this prints.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;

use redis_ratelimit_core::algorithms::block::check_blocking;
use redis_ratelimit_core::algorithms::{
    ceil_div, largest_grant, last_unit_delay_ms, refund, to_u64, Algorithm, Limiter, Params,
    Refunded, Request, State, Write, MAX_AMOUNT, MAX_PERIOD_MS,
};

/// The format's version: a change of the file's shape (not of its values) is a new version.
pub const VERSION: u64 = 1;
const SEED: u64 = 0x7EC7_0125_0000_0001;
/// 2100-01-01T00:00:00Z: every `AT` lies ahead of any real server's clock, so a key is never
/// expired by the server's time while a timeline runs.
const BASE_MS: u64 = 4_102_444_800_000;
const DAY_MS: u64 = 86_400_000;
/// Lua doubles are exact below 2^53; the generated walks keep `C·P` and `L·P` below it.
const EXACT: u64 = 1 << 53;

fn main() {
    print!("{}", generate());
}

/// The operation of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Check(u64),
    Peek(u64),
    Take(u64),
    Refund(u64),
    Reset,
}

/// A limit as a call spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spec {
    pub algorithm: Algorithm,
    pub limit: u64,
    pub period_ms: u64,
    pub burst: Option<u64>,
    pub block_ms: Option<u64>,
}

impl Spec {
    pub fn params(&self) -> Params {
        Params::new(self.limit, self.period_ms, self.burst).expect("generated parameters are valid")
    }
}

/// One call on a timeline's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    pub op: Op,
    pub spec: Spec,
    pub at_ms: u64,
}

/// A reply: the six integers (TAKE: the grant first), or RESET's count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Fields([i64; 6]),
    Count(i64),
}

/// The keys as the module holds them, decided by this crate.
#[derive(Default)]
pub struct Keyspace {
    pub keys: BTreeMap<String, Limiter>,
}

impl Keyspace {
    /// One call, as the module's command of the same name runs it.
    pub fn apply(&mut self, key: &str, call: &Call) -> Reply {
        let spec = call.spec;
        let request = |cost| Request {
            algorithm: spec.algorithm,
            params: spec.params(),
            cost,
            now_ms: call.at_ms,
        };
        match call.op {
            Op::Check(cost) => Reply::Fields(self.decide(key, &request(cost), true, spec.block_ms)),
            Op::Peek(cost) => Reply::Fields(self.decide(key, &request(cost), false, spec.block_ms)),
            Op::Take(max) => {
                let peek = |cost| {
                    let mut copy = self.keys.get(key).cloned();
                    let mut created = None;
                    check_blocking(
                        copy.as_mut(),
                        &request(cost),
                        false,
                        spec.block_ms,
                        &mut created,
                    )
                    .map(|(outcome, _, _)| outcome.decision)
                };
                let granted = largest_grant(max, |cost| peek(cost).map(|d| d.allowed))
                    .expect("one algorithm per key");
                let last_delay = last_unit_delay_ms(spec.algorithm, granted, peek)
                    .expect("one algorithm per key");
                let mut fields = self.decide(key, &request(granted.max(1)), true, spec.block_ms);
                if let (Some(delay), 1) = (last_delay, fields[0]) {
                    fields[5] = i64::try_from(delay).unwrap_or(i64::MAX);
                }
                fields[0] = i64::try_from(granted).unwrap_or(i64::MAX);
                Reply::Fields(fields)
            }
            Op::Refund(cost) => {
                let (outcome, refunded) =
                    refund(self.keys.get_mut(key), &request(cost)).expect("one algorithm per key");
                if refunded == Refunded::Emptied {
                    self.keys.remove(key);
                }
                Reply::Fields(outcome.decision.to_array())
            }
            Op::Reset => Reply::Count(i64::from(self.keys.remove(key).is_some())),
        }
    }

    fn decide(
        &mut self,
        key: &str,
        request: &Request,
        commit: bool,
        block: Option<u64>,
    ) -> [i64; 6] {
        let mut created = None;
        let (outcome, written, _) =
            check_blocking(self.keys.get_mut(key), request, commit, block, &mut created)
                .expect("one algorithm per key");
        if let (Write::Created, Some(limiter)) = (written, created) {
            self.keys.insert(key.to_string(), limiter);
        }
        outcome.decision.to_array()
    }
}

// ---------------------------------------------------------------------------------------------
// What a key holds, as the file writes it

/// A stored key as one JSON object: its absolute expiry, `last`, the stored parameters, the block,
/// the state in exact integers (scaled quantities as decimal strings: they pass 2^53) and the
/// fields `RATELIMIT.INFO` answers while the server's clock is before `last`.
pub fn stored_json(limiter: &Limiter) -> String {
    let p = &limiter.params;
    let algorithm = match limiter.kind() {
        redis_ratelimit_core::algorithms::Kind::Rate(algorithm) => algorithm,
        redis_ratelimit_core::algorithms::Kind::Leases => unreachable!("no leases here"),
    };
    let period = u128::from(p.period_ms);
    let (state, own): (String, Vec<(&str, u64)>) = match &limiter.state {
        State::TokenBucket { tokens_scaled } => (
            format!("{{\"tokens_scaled\":\"{tokens_scaled}\"}}"),
            vec![("tokens", to_u64(tokens_scaled / period))],
        ),
        State::LeakyBucket { level_scaled } => (
            format!("{{\"level_scaled\":\"{level_scaled}\"}}"),
            vec![("level", to_u64(ceil_div(*level_scaled, period)))],
        ),
        State::FixedWindow {
            window_start_ms,
            count,
        } => (
            format!("{{\"window_start_ms\":{window_start_ms},\"count\":{count}}}"),
            vec![("window_start", *window_start_ms), ("count", *count)],
        ),
        State::SlidingWindow {
            window_start_ms,
            current,
            previous,
        } => (
            format!(
                "{{\"window_start_ms\":{window_start_ms},\"current\":{current},\"previous\":{previous}}}"
            ),
            vec![
                ("window_start", *window_start_ms),
                ("count", *current),
                ("previous", *previous),
            ],
        ),
        State::SlidingLog(log) => {
            let mut runs: Vec<(u64, u64)> = Vec::new();
            for (ts, n) in log.runs() {
                match runs.last_mut() {
                    Some((last, count)) if *last == ts => *count += n,
                    _ => runs.push((ts, n)),
                }
            }
            let runs: Vec<String> = runs.iter().map(|(ts, n)| format!("[{ts},{n}]")).collect();
            (
                format!("{{\"runs\":[{}]}}", runs.join(",")),
                vec![("entries", log.len())],
            )
        }
        State::Gcra { ahead_scaled } => (
            format!("{{\"ahead_scaled\":\"{ahead_scaled}\"}}"),
            vec![(
                "tat",
                limiter
                    .last_ms
                    .saturating_add(to_u64(ceil_div(*ahead_scaled, u128::from(p.limit)))),
            )],
        ),
        State::Concurrency(_) => unreachable!("no leases here"),
    };
    // INFO's remaining and reset_after_ms: a COST 0 PEEK with the stored parameters at `last`.
    let mut copy = limiter.clone();
    let request = Request {
        algorithm,
        params: *p,
        cost: 0,
        now_ms: limiter.last_ms,
    };
    let (outcome, _, _) = check_blocking(Some(&mut copy), &request, false, None, &mut None)
        .expect("its own algorithm");
    let d = outcome.decision.to_array();
    let mut info = format!(
        "{{\"algorithm\":\"{}\",\"limit\":{},\"period_ms\":{},\"burst\":{},\"remaining\":{},\"reset_after_ms\":{},\"updated_at_ms\":{}",
        algorithm.name(),
        p.limit,
        p.period_ms,
        p.capacity,
        d[2],
        d[4],
        limiter.last_ms
    );
    for (name, value) in own {
        let _ = write!(
            info,
            ",\"{name}\":{}",
            i64::try_from(value).unwrap_or(i64::MAX)
        );
    }
    if limiter.blocked_at(limiter.last_ms) {
        let _ = write!(info, ",\"blocked_until_ms\":{}", limiter.blocked_until_ms);
    }
    info.push('}');
    format!(
        "{{\"expires_at_ms\":{},\"last_ms\":{},\"limit\":{},\"period_ms\":{},\"burst\":{},\"blocked_until_ms\":{},\"state\":{state},\"info\":{info}}}",
        i64::try_from(limiter.expires_at_ms()).unwrap_or(i64::MAX),
        limiter.last_ms,
        p.limit,
        p.period_ms,
        p.capacity,
        limiter.blocked_until_ms,
    )
}

/// A call and its outcome as one line of the file.
pub fn call_json(call: &Call, reply: &Reply, stored: Option<&Limiter>) -> String {
    let mut line = String::new();
    let (op, amount) = match call.op {
        Op::Check(cost) => ("check", Some(("cost", cost))),
        Op::Peek(cost) => ("peek", Some(("cost", cost))),
        Op::Take(max) => ("take", Some(("max", max))),
        Op::Refund(cost) => ("refund", Some(("cost", cost))),
        Op::Reset => ("reset", None),
    };
    let _ = write!(line, "{{\"op\":\"{op}\"");
    if let Some((name, amount)) = amount {
        let s = call.spec;
        let _ = write!(
            line,
            ",\"algorithm\":\"{}\",\"limit\":{},\"period_ms\":{}",
            s.algorithm.name(),
            s.limit,
            s.period_ms
        );
        if let Some(burst) = s.burst {
            let _ = write!(line, ",\"burst\":{burst}");
        }
        if let Some(block) = s.block_ms {
            let _ = write!(line, ",\"block_ms\":{block}");
        }
        let _ = write!(line, ",\"{name}\":{amount},\"at\":{}", call.at_ms);
    }
    match reply {
        Reply::Fields(f) => {
            let _ = write!(
                line,
                ",\"reply\":[{},{},{},{},{},{}]",
                f[0], f[1], f[2], f[3], f[4], f[5]
            );
        }
        Reply::Count(n) => {
            let _ = write!(line, ",\"reply\":{n}");
        }
    }
    match stored {
        Some(limiter) => {
            let _ = write!(line, ",\"stored\":{}}}", stored_json(limiter));
        }
        None => line.push_str(",\"stored\":null}"),
    }
    line
}

// ---------------------------------------------------------------------------------------------
// The timelines

/// splitmix64: small, seeded, the same on every machine.
pub struct Rng(u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// One key's timeline.
pub struct Group {
    pub name: String,
    pub calls: Vec<Call>,
}

fn spec_for(rng: &mut Rng, algorithm: Algorithm) -> Spec {
    let period_ms = rng.pick(&[1, 7, 100, 250, 1000, 1001, 60_000, 3_600_000, DAY_MS]);
    let limit: u64 = if algorithm == Algorithm::SlidingLog {
        rng.pick(&[1, 2, 3, 5, 10, 50, 1000])
    } else {
        rng.pick(&[1, 2, 3, 5, 10, 100, 1000, 1_000_000])
    };
    let burst = if algorithm.is_bucket() && rng.chance(60) {
        Some(
            rng.pick(&[1, limit.div_ceil(2), limit, limit * 2, limit * 10])
                .max(1),
        )
    } else {
        None
    };
    let mut spec = Spec {
        algorithm,
        limit,
        period_ms,
        burst,
        block_ms: None,
    };
    // Walks stay within what the Lua engines compute exactly.
    let capacity = u128::from(spec.burst.unwrap_or(limit));
    if capacity * u128::from(period_ms) >= u128::from(EXACT)
        || u128::from(limit) * u128::from(period_ms) >= u128::from(EXACT)
    {
        spec.period_ms = 1000;
    }
    spec
}

/// A cost that exercises the spec: 0, 1, a part, the whole capacity, more.
fn cost_for(rng: &mut Rng, spec: &Spec) -> u64 {
    let capacity = spec.burst.unwrap_or(spec.limit);
    match rng.below(10) {
        0 => 0,
        1..=4 => 1,
        5 | 6 => rng.range(1, capacity.max(1)),
        7 => capacity,
        8 => capacity + 1,
        _ => rng.range(1, 3),
    }
}

/// The next call's time: mostly forward by a fraction of the period, sometimes the same ms,
/// before the key's last time, or more than two periods later.
fn next_at(rng: &mut Rng, at: u64, spec: &Spec) -> u64 {
    let p = spec.period_ms;
    match rng.below(12) {
        0 | 1 => at,
        2 => at.saturating_sub(rng.range(1, p.max(2))),
        3 => at + rng.range(2 * p, 5 * p),
        4 => at + 1,
        _ => at + rng.range(1, (p / spec.limit.max(1)).max(2)),
    }
}

/// What a walk's calls may be.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// Every operation.
    Mixed,
    /// Every operation, under a `BLOCK`.
    Block,
    /// CHECK (any cost), PEEK of COST 0 and RESET only: what the reference scripts implement.
    Checks,
}

fn walk(rng: &mut Rng, algorithm: Algorithm, name: String, len: usize, kind: Walk) -> Group {
    // Under a BLOCK, small limits: rejections (which start blocks) are frequent.
    let spec_of = |rng: &mut Rng| {
        let mut spec = spec_for(rng, algorithm);
        if kind == Walk::Block {
            spec.limit = rng.pick(&[1, 2, 3, 5]);
            spec.burst = spec.burst.map(|_| rng.pick(&[1, 2, 4]));
        }
        spec
    };
    let mut spec = spec_of(rng);
    if kind == Walk::Block {
        spec.block_ms = Some(rng.pick(&[1, 50, 1000, 5000, spec.period_ms * 3]));
    }
    let mut at = BASE_MS + rng.below(10 * DAY_MS);
    let mut calls = Vec::with_capacity(len);
    for _ in 0..len {
        at = next_at(rng, at, &spec);
        // Parameter changes: all that docs/algorithms.md allows (limit, period, burst).
        if rng.chance(12) {
            let mut changed = spec_of(rng);
            changed.block_ms = spec.block_ms;
            spec = changed;
        }
        let op = match rng.below(20) {
            // A timeline starts with a call that stores something, mostly.
            _ if calls.is_empty() => Op::Check(cost_for(rng, &spec)),
            0..=8 => Op::Check(cost_for(rng, &spec)),
            9..=18 if kind == Walk::Checks => match rng.below(3) {
                0 => Op::Peek(0),
                _ => Op::Check(cost_for(rng, &spec)),
            },
            9..=11 => Op::Peek(if rng.chance(50) {
                0
            } else {
                cost_for(rng, &spec)
            }),
            12..=14 => Op::Take(cost_for(rng, &spec).max(1) + rng.below(3)),
            15..=18 => Op::Refund(cost_for(rng, &spec)),
            _ => Op::Reset,
        };
        calls.push(Call {
            op,
            spec,
            at_ms: at,
        });
    }
    Group { name, calls }
}

/// The largest amounts and periods: 10^12 with 3650 days, a bucket whose refill takes more than
/// 2^63 ms (replies and the expiry saturate), the longest sliding log.
fn largest(algorithm: Algorithm) -> Group {
    let at = BASE_MS + 12_345;
    let huge = |limit, burst, period_ms| Spec {
        algorithm,
        limit,
        period_ms,
        burst,
        block_ms: None,
    };
    let call = |op, spec, at_ms| Call { op, spec, at_ms };
    let calls = if algorithm == Algorithm::SlidingLog {
        let s = huge(100_000, None, MAX_PERIOD_MS);
        vec![
            call(Op::Check(100_000), s, at),
            call(Op::Peek(0), s, at + 1),
            call(Op::Check(1), s, at + DAY_MS),
            call(Op::Refund(40_000), s, at + 2 * DAY_MS),
            call(Op::Take(MAX_AMOUNT), s, at + 2 * DAY_MS),
            call(Op::Check(MAX_AMOUNT), s, at + 3 * DAY_MS),
            call(Op::Check(1), s, at + MAX_PERIOD_MS + 1),
        ]
    } else if algorithm.is_bucket() {
        let s = huge(MAX_AMOUNT, Some(MAX_AMOUNT), MAX_PERIOD_MS);
        let slow = huge(1, Some(MAX_AMOUNT), MAX_PERIOD_MS);
        vec![
            call(Op::Check(MAX_AMOUNT), s, at),
            call(Op::Peek(1), s, at),
            call(Op::Check(1), s, at + 1),
            call(Op::Refund(MAX_AMOUNT / 2), s, at + 1),
            call(Op::Take(MAX_AMOUNT), s, at + 2),
            call(Op::Reset, s, at + 2),
            call(Op::Check(MAX_AMOUNT), slow, at + 3),
            call(Op::Peek(1), slow, at + 4),
            call(Op::Take(MAX_AMOUNT), slow, at + 5),
            call(Op::Refund(1), slow, at + 6),
            call(
                Op::Check(MAX_AMOUNT),
                huge(MAX_AMOUNT, Some(1), MAX_PERIOD_MS),
                at + 7,
            ),
        ]
    } else {
        let s = huge(MAX_AMOUNT, None, MAX_PERIOD_MS);
        vec![
            call(Op::Check(MAX_AMOUNT - 1), s, at),
            call(Op::Peek(2), s, at),
            call(Op::Take(MAX_AMOUNT), s, at + 1),
            call(Op::Refund(3), s, at + DAY_MS),
            call(Op::Check(MAX_AMOUNT), s, at + 2 * DAY_MS),
            call(Op::Check(1), huge(1, None, MAX_PERIOD_MS), at + 3 * DAY_MS),
            call(Op::Peek(0), s, at + MAX_PERIOD_MS),
            call(Op::Check(5), s, at + 2 * MAX_PERIOD_MS),
        ]
    };
    Group {
        name: format!("{}/largest", algorithm.name()),
        calls,
    }
}

/// Times just below 2^53, the largest `AT`, where every engine must stay exact.
fn near_limit_of_time(rng: &mut Rng, algorithm: Algorithm) -> Group {
    let spec = Spec {
        algorithm,
        limit: 5,
        period_ms: 1000,
        burst: algorithm.is_bucket().then_some(7),
        block_ms: None,
    };
    let mut at = EXACT - 200_000;
    let mut calls = Vec::new();
    for _ in 0..8 {
        at = next_at(rng, at, &spec);
        calls.push(Call {
            op: Op::Check(cost_for(rng, &spec)),
            spec,
            at_ms: at,
        });
    }
    Group {
        name: format!("{}/near-2^53", algorithm.name()),
        calls,
    }
}

/// Every timeline, in the file's order.
pub fn groups() -> Vec<Group> {
    let mut rng = Rng(SEED);
    let mut groups = Vec::new();
    for algorithm in Algorithm::ALL {
        for (kind, name, count) in [
            (Walk::Mixed, "walk", 8),
            (Walk::Block, "block", 3),
            (Walk::Checks, "checks", 3),
        ] {
            for i in 0..count {
                let name = format!("{}/{name}/{i}", algorithm.name());
                groups.push(walk(&mut rng, algorithm, name, 12, kind));
            }
        }
        groups.push(largest(algorithm));
        groups.push(near_limit_of_time(&mut rng, algorithm));
    }
    groups
}

/// The whole file.
pub fn generate() -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{{\"version\":{VERSION},");
    out.push_str("\"comment\":\"Conformance vectors of redis-ratelimit, generated from the core crate by `cargo run -p redis-ratelimit-core --example vectors > tests/vectors/v1.json`; do not edit. The format is in tests/vectors/README.md.\",\n");
    let _ = writeln!(out, "\"seed\":\"{SEED:#x}\",");
    out.push_str("\"groups\":[\n");
    let groups = groups();
    for (g, group) in groups.iter().enumerate() {
        let key = format!("vectors:{}", group.name);
        let _ = writeln!(
            out,
            "{{\"name\":\"{}\",\"key\":\"{key}\",\"calls\":[",
            group.name
        );
        let mut keys = Keyspace::default();
        for (i, call) in group.calls.iter().enumerate() {
            let reply = keys.apply(&key, call);
            let line = call_json(call, &reply, keys.keys.get(&key));
            let comma = if i + 1 < group.calls.len() { "," } else { "" };
            let _ = writeln!(out, "{line}{comma}");
        }
        let comma = if g + 1 < groups.len() { "," } else { "" };
        let _ = writeln!(out, "]}}{comma}");
    }
    out.push_str("]}\n");
    out
}
