//! The equivalence tests' calls and their random generation: limits small and huge, BURST above
//! and below the limit, parameter changes, COST 0, runs in one millisecond, long gaps and `AT`
//! going backwards (see tests/integration/equivalence.rs).

use redis_ratelimit_core::algorithms::Algorithm;

use super::{EXACT, MAX_LOG_LIMIT};
use crate::common::rng::Rng;
use crate::common::{DAY_MS, MAX_AMOUNT, MAX_PERIOD_MS};

/// What the equivalence tests need to know of an algorithm's Lua reference.
pub trait LuaReference {
    /// The reference script's path in the repository.
    fn script_file(self) -> &'static str;
    /// The reference script.
    fn script(self) -> &'static str;
    /// The largest limit (and BURST) usable with period `p`, within the scripts' exact range.
    fn bound(self, p: u64) -> u64;
}

impl LuaReference for Algorithm {
    fn script_file(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "lua-reference/token_bucket.lua",
            Algorithm::LeakyBucket => "lua-reference/leaky_bucket.lua",
            Algorithm::FixedWindow => "lua-reference/fixed_window.lua",
            Algorithm::SlidingWindow => "lua-reference/sliding_window.lua",
            Algorithm::SlidingLog => "lua-reference/sliding_log.lua",
            Algorithm::Gcra => "lua-reference/gcra.lua",
        }
    }

    fn script(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => include_str!("../../../lua-reference/token_bucket.lua"),
            Algorithm::LeakyBucket => include_str!("../../../lua-reference/leaky_bucket.lua"),
            Algorithm::FixedWindow => include_str!("../../../lua-reference/fixed_window.lua"),
            Algorithm::SlidingWindow => include_str!("../../../lua-reference/sliding_window.lua"),
            Algorithm::SlidingLog => include_str!("../../../lua-reference/sliding_log.lua"),
            Algorithm::Gcra => include_str!("../../../lua-reference/gcra.lua"),
        }
    }

    fn bound(self, p: u64) -> u64 {
        match self {
            Algorithm::SlidingLog => MAX_LOG_LIMIT,
            Algorithm::FixedWindow => MAX_AMOUNT,
            _ => MAX_AMOUNT.min((EXACT - 1) / p),
        }
    }
}

/// Limiter parameters named on a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    pub limit: u64,
    pub period: u64,
    /// BURST, buckets only; `None` means the default (the limit).
    pub burst: Option<u64>,
}

impl Params {
    pub fn capacity(&self) -> u64 {
        self.burst.unwrap_or(self.limit)
    }
}

/// One call of a sequence; `at` is absolute (ms since the epoch).
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub params: Params,
    pub cost: u64,
    pub at: u64,
}

impl Call {
    /// `RATELIMIT.CHECK` or `RATELIMIT.PEEK` with these arguments.
    pub fn native(&self, command: &str, alg: Algorithm, key: &str) -> redis::Cmd {
        let mut cmd = redis::cmd(command);
        cmd.arg(key)
            .arg(alg.name())
            .arg(self.params.limit)
            .arg(self.params.period);
        if let Some(burst) = self.params.burst {
            cmd.arg("BURST").arg(burst);
        }
        cmd.arg("COST").arg(self.cost).arg("AT").arg(self.at);
        cmd
    }

    /// The reference script's call: ARGV limit, period_ms, burst, cost, now_ms.
    pub fn lua(&self, sha: &str, key: &str) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(sha)
            .arg(1)
            .arg(key)
            .arg(self.params.limit)
            .arg(self.params.period)
            .arg(self.params.capacity())
            .arg(self.cost)
            .arg(self.at);
        cmd
    }

    pub fn native_text(&self, alg: Algorithm, key: &str) -> String {
        let burst = self
            .params
            .burst
            .map_or(String::new(), |b| format!(" BURST {b}"));
        format!(
            "RATELIMIT.CHECK {key} {} {} {}{burst} COST {} AT {}",
            alg.name(),
            self.params.limit,
            self.params.period,
            self.cost,
            self.at
        )
    }

    pub fn lua_text(&self, sha: &str, key: &str) -> String {
        format!(
            "EVALSHA {sha} 1 {key} {} {} {} {} {}",
            self.params.limit,
            self.params.period,
            self.params.capacity(),
            self.cost,
            self.at
        )
    }
}

fn gen_period(rng: &mut Rng) -> u64 {
    match rng.below(12) {
        0 => 1,
        1 => rng.range(2, 20),
        2..=4 => rng.pick(&[100, 250, 999, 1000, 1001, 60_000]),
        5 => rng.pick(&[3_600_000, DAY_MS, 7 * DAY_MS, 30 * DAY_MS, MAX_PERIOD_MS]),
        _ => rng.log_uniform(1, 200_000),
    }
}

fn gen_limit(alg: Algorithm, rng: &mut Rng, period: u64) -> u64 {
    let limit = if alg == Algorithm::SlidingLog {
        match rng.below(10) {
            0..=3 => rng.range(1, 5),
            4..=7 => rng.range(6, 100),
            _ => rng.range(101, MAX_LOG_LIMIT),
        }
    } else {
        match rng.below(10) {
            0..=3 => rng.range(1, 5),
            4..=6 => rng.range(6, 100),
            7 | 8 => rng.log_uniform(101, 1_000_000),
            _ => rng.log_uniform(1_000_001, MAX_AMOUNT),
        }
    };
    limit.clamp(1, alg.bound(period))
}

fn gen_burst(rng: &mut Rng, limit: u64, bound: u64) -> Option<u64> {
    let burst = match rng.below(8) {
        0 | 1 => return None,
        2 => limit,
        3 | 4 => rng.range(1, limit.saturating_sub(1).max(1)), // below the limit
        5 | 6 => rng.range(limit + 1, limit.saturating_mul(4)), // above the limit
        _ => rng.log_uniform(1, MAX_AMOUNT),
    };
    Some(burst.clamp(1, bound))
}

fn gen_params(alg: Algorithm, rng: &mut Rng) -> Params {
    let period = gen_period(rng);
    let bound = alg.bound(period);
    if alg.is_bucket() && rng.chance(10) {
        // A fast flow into a small bucket: the limit is not bounded by the period, only C·P is.
        let limit = rng.log_uniform(1, MAX_AMOUNT);
        let burst = rng.log_uniform(1, 1000).min(bound);
        return Params {
            limit,
            period,
            burst: Some(burst),
        };
    }
    let limit = gen_limit(alg, rng, period);
    let burst = if alg.is_bucket() {
        gen_burst(rng, limit, bound)
    } else {
        None
    };
    Params {
        limit,
        period,
        burst,
    }
}

/// Brings parameters back within the scripts' exact range after one of them changed.
fn fit(alg: Algorithm, mut params: Params) -> Params {
    params.period = params.period.clamp(1, MAX_PERIOD_MS);
    let bound = alg.bound(params.period);
    if params.burst.is_none() || alg == Algorithm::SlidingLog {
        params.limit = params.limit.min(bound);
    }
    params.limit = params.limit.min(MAX_AMOUNT);
    params.burst = params.burst.map(|b| b.clamp(1, bound));
    params
}

/// A parameter change between two calls on the same key (docs/algorithms.md, "Parameter changes").
fn change_params(alg: Algorithm, rng: &mut Rng, current: Params, initial: Params) -> Params {
    let changed = match rng.below(6) {
        0 => Params {
            limit: gen_limit(alg, rng, current.period),
            ..current
        },
        1 => Params {
            period: gen_period(rng),
            ..current
        },
        2 => {
            // A small step of the period: carried-over quantities are re-scaled.
            let period = if rng.chance(50) {
                current.period + rng.range(1, 3)
            } else {
                current.period.saturating_sub(rng.range(1, 3)).max(1)
            };
            Params { period, ..current }
        }
        3 if alg.is_bucket() => Params {
            burst: gen_burst(rng, current.limit, alg.bound(current.period)),
            ..current
        },
        4 => initial,
        _ => gen_params(alg, rng),
    };
    fit(alg, changed)
}

fn gen_cost(rng: &mut Rng, capacity: u64) -> u64 {
    let cost = match rng.below(100) {
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

/// Where the times of a sequence lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Times {
    /// From `base` (a midnight one to two days ahead) on, over days to centuries.
    Future(u64),
    /// Just below 2^53, the bound on `AT` (docs/algorithms.md): the first call up to 40 periods
    /// before it, every later one clamped to 2^53 - 1.
    NearTop,
}

/// A random sequence of `len` calls on one key.
pub fn gen_sequence(alg: Algorithm, rng: &mut Rng, times: Times, len: usize) -> Vec<Call> {
    let initial = gen_params(alg, rng);
    let mut params = initial;
    let top = EXACT - 1; // the largest AT
    let start = match times {
        Times::Future(base) if rng.chance(50) => base,
        Times::Future(base) => base + rng.log_uniform(1, DAY_MS),
        Times::NearTop => top - rng.log_uniform(1, 40 * initial.period),
    };
    let mut cursor = start; // the latest AT so far
    let mut same_ms_run = 0;
    let mut calls = Vec::with_capacity(len);
    for i in 0..len {
        if i > 0 && rng.chance(8) {
            params = change_params(alg, rng, params, initial);
        }
        let p = params.period;
        let at = if i == 0 {
            cursor
        } else if same_ms_run > 0 {
            same_ms_run -= 1;
            cursor
        } else {
            match rng.below(100) {
                0..=14 => {
                    same_ms_run = rng.range(1, 6); // a run of calls in one millisecond
                    cursor
                }
                15..=49 => cursor + rng.log_uniform(1, p),
                50..=59 => {
                    // Around the next window boundary.
                    let boundary = (cursor / p + 1) * p;
                    (boundary + rng.range(0, 2)).saturating_sub(1).max(cursor)
                }
                60..=67 => cursor + 2 * p + rng.log_uniform(1, 3 * p), // a gap of over two periods
                68..=76 => cursor.saturating_sub(rng.log_uniform(1, 2 * p)).max(start), // backwards
                77..=84 => cursor + p + rng.range(0, 2) - 1,
                _ => cursor + rng.log_uniform(1, 2 * p),
            }
        };
        let at = at.min(top);
        cursor = cursor.max(at);
        let cost = gen_cost(rng, params.capacity());
        calls.push(Call { params, cost, at });
    }
    calls
}
