//! Leaky bucket (as a queue): admitted work queues up to a capacity `C` and drains at a strictly
//! constant `L` per `P` ms. An admitted request learns its place in the queue as `delay_ms`; a
//! request that would overflow the queue is dropped.
//!
//! State: `level`, the queued work in scaled units (`c` requests are `c·P`), drained by `L` per ms.

use super::{ceil_div, floor_div, to_u64, Decision, FixedSize, Params, State};

pub(crate) struct LeakyBucket;

/// ms until a queue holding `level_scaled` has drained.
pub fn reset_after(params: &Params, level_scaled: u128) -> u64 {
    to_u64(ceil_div(level_scaled, u128::from(params.limit)))
}

impl FixedSize for LeakyBucket {
    type State = u128;

    fn fresh(_params: &Params, _t_ms: u64) -> u128 {
        0
    }

    fn advance(level: u128, params: &Params, last_ms: u64, t_ms: u64) -> u128 {
        let drained = u128::from(t_ms - last_ms) * u128::from(params.limit);
        level.saturating_sub(drained)
    }

    fn refund(level: u128, params: &Params, cost: u64) -> u128 {
        level.saturating_sub(params.cost_scaled(cost))
    }

    fn is_fresh(level: &u128, _params: &Params) -> bool {
        *level == 0
    }

    fn carry_over(level: u128, from: &Params, to: &Params, _t_ms: u64) -> u128 {
        // Counted in requests, re-scaled to the new period (rounded up), clamped to the new capacity.
        let rescaled = if from.period_ms == to.period_ms {
            level
        } else {
            ceil_div(level * u128::from(to.period_ms), u128::from(from.period_ms))
        };
        rescaled.min(to.capacity_scaled())
    }

    fn decide(level: u128, params: &Params, cost: u64, _t_ms: u64) -> (Decision, u128) {
        let work = params.cost_scaled(cost);
        let capacity = params.capacity_scaled();
        let rate = u128::from(params.limit);
        let allowed = level + work <= capacity;
        let (after, delay_ms, retry_after_ms) = if allowed {
            (level + work, to_u64(ceil_div(level, rate)), 0)
        } else if cost > params.capacity {
            (level, 0, -1)
        } else {
            let wait = ceil_div(level + work - capacity, rate);
            (level, 0, i64::try_from(wait).unwrap_or(i64::MAX))
        };
        let decision = Decision {
            allowed,
            limit: params.capacity,
            remaining: to_u64(floor_div(
                capacity.saturating_sub(after),
                u128::from(params.period_ms),
            )),
            retry_after_ms,
            reset_after_ms: reset_after(params, after),
            delay_ms,
        };
        (decision, after)
    }

    fn load(state: &State) -> Option<u128> {
        match state {
            State::LeakyBucket { level_scaled } => Some(*level_scaled),
            _ => None,
        }
    }

    fn store(level_scaled: u128) -> State {
        State::LeakyBucket { level_scaled }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{run_table, step};
    use super::super::Algorithm;

    #[test]
    fn spec_worked_example() {
        // leaky-bucket 3 1000: each queued request waits for the ones before it (334 ms apart).
        run_table(
            Algorithm::LeakyBucket,
            3,
            1000,
            None,
            &[
                step!(at 0, cost 1 => allowed, remaining 2, retry 0, reset 334),
                step!(at 0, cost 1 => allowed, remaining 1, retry 0, reset 667, delay 334),
                step!(at 0, cost 1 => allowed, remaining 0, retry 0, reset 1000, delay 667),
                step!(at 0, cost 1 => rejected, remaining 0, retry 334, reset 1000),
                step!(at 331, cost 1 => rejected, remaining 0, retry 3, reset 669),
                step!(at 1500, cost 1 => allowed, remaining 2, retry 0, reset 334),
            ],
        );
    }

    #[test]
    fn cost_zero_reports_the_current_queue_delay() {
        // A COST 0 probe is admitted and says how long a request queued now would wait.
        run_table(
            Algorithm::LeakyBucket,
            10,
            1000,
            Some(2),
            &[
                step!(at 0, cost 2 => allowed, remaining 0, retry 0, reset 200),
                step!(at 50, cost 0 => allowed, remaining 0, retry 0, reset 150, delay 150),
                step!(at 50, cost 3 => rejected, remaining 0, retry -1, reset 150),
                step!(at 100, cost 1 => allowed, remaining 0, retry 0, reset 200, delay 100),
            ],
        );
    }
}
