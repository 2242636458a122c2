//! Limits spelled as clients spell them: algorithm names in any case, periods with a unit when
//! they have one, options in any order; and the generated sequences of tests/integration/equivalence.rs
//! turned into such calls.

use redis_ratelimit_core::algorithms::Algorithm;

use crate::common::rng::Rng;
use crate::common::DAY_MS;
use crate::equivalence::sequences::{self, Params};

/// A limit as a call names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    pub algorithm: Algorithm,
    pub params: Params,
}

impl Limit {
    pub fn new(algorithm: Algorithm, limit: u64, period: u64, burst: Option<u64>) -> Limit {
        Limit {
            algorithm,
            params: Params {
                limit,
                period,
                burst: burst.filter(|_| algorithm.is_bucket()),
            },
        }
    }

    /// `algorithm limit period [BURST c] [COST n] [AT t]`, spelled as a client might: names in
    /// any case, periods with a unit when they have one, options in any order.
    pub fn args(&self, cost: u64, at: Option<u64>, rng: &mut Rng) -> Vec<String> {
        self.spelled(cost, false, at, rng)
    }

    /// A REFUND's arguments, [`Limit::args`] with `COST` always named (a REFUND requires it).
    pub fn refund_args(&self, cost: u64, at: Option<u64>, rng: &mut Rng) -> Vec<String> {
        self.spelled(cost, true, at, rng)
    }

    fn spelled(&self, cost: u64, name_cost: bool, at: Option<u64>, rng: &mut Rng) -> Vec<String> {
        let mut args = self.head(rng);
        let mut options: Vec<(&str, u64)> = Vec::new();
        if let Some(burst) = self.params.burst {
            options.push(("BURST", burst));
        }
        if name_cost || cost != 1 || rng.chance(50) {
            options.push(("COST", cost));
        }
        if let Some(at) = at {
            options.push(("AT", at));
        }
        rng.shuffle(&mut options);
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
    pub fn spec_args(&self, rng: &mut Rng) -> Vec<String> {
        let mut args = self.head(rng);
        if let Some(burst) = self.params.burst {
            args.push("BURST".into());
            args.push(burst.to_string());
        }
        args
    }

    /// `algorithm limit period`.
    fn head(&self, rng: &mut Rng) -> Vec<String> {
        let name = self.algorithm.name();
        vec![
            if rng.chance(10) {
                name.to_uppercase()
            } else {
                name.to_string()
            },
            self.params.limit.to_string(),
            spelled_period(self.params.period, rng),
        ]
    }
}

fn spelled_period(period: u64, rng: &mut Rng) -> String {
    let units = [(DAY_MS, "d"), (3_600_000, "h"), (60_000, "m"), (1000, "s")];
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

/// One call of a sequence: the arguments after the key, the same for both engines.
#[derive(Clone, Debug)]
pub struct Call {
    pub args: Vec<String>,
    pub consumes_if_allowed: bool,
    pub at: u64,
}

impl Call {
    pub fn new(limit: &Limit, cost: u64, at: u64, rng: &mut Rng) -> Call {
        Call {
            args: limit.args(cost, Some(at), rng),
            consumes_if_allowed: cost > 0,
            at,
        }
    }
}

/// A random sequence of `len` calls on one key with `AT` (tests/integration/equivalence.rs's generator: from
/// `base` on, or, for about one sequence in twelve, just below 2^53), spelled.
pub fn gen_sequence(algorithm: Algorithm, rng: &mut Rng, base: u64, len: usize) -> Vec<Call> {
    let times = if rng.chance(8) {
        sequences::Times::NearTop
    } else {
        sequences::Times::Future(base)
    };
    sequences::gen_sequence(algorithm, rng, times, len)
        .into_iter()
        .map(|call| {
            let limit = Limit {
                algorithm,
                params: call.params,
            };
            Call::new(&limit, call.cost, call.at, rng)
        })
        .collect()
}

/// `args` (a call's, or a CHECKALL spec's: `algorithm limit period` then option pairs) with
/// `BLOCK d` among its options: right after the period or after any option pair, the name in
/// any case, the duration spelled as a period might be.
pub fn with_block(mut args: Vec<String>, block_ms: u64, rng: &mut Rng) -> Vec<String> {
    let pairs = args.len().saturating_sub(3) / 2;
    let at = 3 + 2 * rng.index(pairs + 1);
    let name = if rng.chance(20) { "block" } else { "BLOCK" };
    args.splice(at..at, [name.to_string(), spelled_period(block_ms, rng)]);
    args
}

/// A block's duration for a limit of `period` ms: shorter than the period, about it, a few
/// periods, or anything up to the largest (3650 days).
pub fn block_duration(period: u64, rng: &mut Rng) -> u64 {
    let ms = match rng.below(10) {
        0..=2 => rng.range(1, period.max(2)),
        3..=4 => period,
        5..=8 => rng.range(period, period.saturating_mul(4)),
        _ => rng.log_uniform(1, 3650 * DAY_MS),
    };
    ms.clamp(1, 3650 * DAY_MS)
}

/// [`gen_sequence`] with `BLOCK` on a share of its calls (all, most or some; a call without it
/// on a blocked key must still be rejected): the calls, and per call whether it names BLOCK.
pub fn gen_blocked_sequence(
    algorithm: Algorithm,
    rng: &mut Rng,
    base: u64,
    len: usize,
) -> (Vec<Call>, Vec<bool>) {
    let times = if rng.chance(8) {
        sequences::Times::NearTop
    } else {
        sequences::Times::Future(base)
    };
    let share = rng.pick(&[100, 70, 30]);
    sequences::gen_sequence(algorithm, rng, times, len)
        .into_iter()
        .map(|call| {
            let limit = Limit {
                algorithm,
                params: call.params,
            };
            let mut made = Call::new(&limit, call.cost, call.at, rng);
            let blocks = rng.chance(share);
            if blocks {
                let ms = block_duration(call.params.period, rng);
                made.args = with_block(made.args, ms, rng);
            }
            (made, blocks)
        })
        .unzip()
}
