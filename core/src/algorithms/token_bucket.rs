//! Token bucket: tokens refill at `L` per `P` ms up to a capacity `C`; a request of cost `c` takes
//! `c` tokens. Allows bursts of up to `C`.
//!
//! State: `tokens` in scaled units (`c` requests are `c·P`), refilled by `L` per elapsed ms.

use super::{ceil_div, floor_div, to_u64, Decision, FixedSize, Params, State};

pub(crate) struct TokenBucket;

/// ms until a bucket holding `tokens_scaled` is full again.
pub fn reset_after(params: &Params, tokens_scaled: u128) -> u64 {
    let missing = params.capacity_scaled().saturating_sub(tokens_scaled);
    to_u64(ceil_div(missing, u128::from(params.limit)))
}

impl FixedSize for TokenBucket {
    type State = u128;

    fn fresh(params: &Params, _t_ms: u64) -> u128 {
        params.capacity_scaled()
    }

    fn advance(tokens: u128, params: &Params, last_ms: u64, t_ms: u64) -> u128 {
        let refill = u128::from(t_ms - last_ms) * u128::from(params.limit);
        params.capacity_scaled().min(tokens.saturating_add(refill))
    }

    fn refund(tokens: u128, params: &Params, cost: u64) -> u128 {
        (tokens + params.cost_scaled(cost)).min(params.capacity_scaled())
    }

    fn is_fresh(tokens: &u128, params: &Params) -> bool {
        *tokens >= params.capacity_scaled()
    }

    fn carry_over(tokens: u128, from: &Params, to: &Params, _t_ms: u64) -> u128 {
        // Counted in requests, re-scaled to the new period (rounded down), clamped to the new capacity.
        let rescaled = if from.period_ms == to.period_ms {
            tokens
        } else {
            tokens * u128::from(to.period_ms) / u128::from(from.period_ms)
        };
        rescaled.min(to.capacity_scaled())
    }

    fn decide(tokens: u128, params: &Params, cost: u64, _t_ms: u64) -> (Decision, u128) {
        let need = params.cost_scaled(cost);
        let period = u128::from(params.period_ms);
        let rate = u128::from(params.limit);
        let allowed = tokens >= need;
        let after = if allowed { tokens - need } else { tokens };
        let retry_after_ms = if allowed {
            0
        } else if cost > params.capacity {
            -1
        } else {
            i64::try_from(ceil_div(need - tokens, rate)).unwrap_or(i64::MAX)
        };
        let decision = Decision {
            allowed,
            limit: params.capacity,
            remaining: to_u64(floor_div(after, period)),
            retry_after_ms,
            reset_after_ms: reset_after(params, after),
            delay_ms: 0,
        };
        (decision, after)
    }

    fn load(state: &State) -> Option<u128> {
        match state {
            State::TokenBucket { tokens_scaled } => Some(*tokens_scaled),
            _ => None,
        }
    }

    fn store(tokens_scaled: u128) -> State {
        State::TokenBucket { tokens_scaled }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{run_table, step};
    use super::super::Algorithm;

    #[test]
    fn spec_worked_example() {
        // token-bucket 3 1000: three at once empty the bucket, one token every 334 ms.
        run_table(
            Algorithm::TokenBucket,
            3,
            1000,
            None,
            &[
                step!(at 0, cost 1 => allowed, remaining 2, retry 0, reset 334),
                step!(at 0, cost 1 => allowed, remaining 1, retry 0, reset 667),
                step!(at 0, cost 1 => allowed, remaining 0, retry 0, reset 1000),
                step!(at 0, cost 1 => rejected, remaining 0, retry 334, reset 1000),
                step!(at 331, cost 1 => rejected, remaining 0, retry 3, reset 669),
                step!(at 400, cost 2 => rejected, remaining 1, retry 267, reset 600),
                step!(at 1000, cost 0 => allowed, remaining 3, retry 0, reset 0),
            ],
        );
    }

    #[test]
    fn burst_above_limit_allows_a_larger_burst() {
        // 2 per second, capacity 5: five at once, then one every 500 ms.
        run_table(
            Algorithm::TokenBucket,
            2,
            1000,
            Some(5),
            &[
                step!(at 0, cost 5 => allowed, remaining 0, retry 0, reset 2500),
                step!(at 0, cost 1 => rejected, remaining 0, retry 500, reset 2500),
                step!(at 500, cost 1 => allowed, remaining 0, retry 0, reset 2500),
                step!(at 999, cost 1 => rejected, remaining 0, retry 1, reset 2001),
                step!(at 3000, cost 6 => rejected, remaining 5, retry -1, reset 0),
            ],
        );
    }
}
