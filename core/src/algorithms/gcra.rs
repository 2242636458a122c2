//! GCRA, the generic cell rate algorithm: a theoretical arrival time (TAT) per key.
//!
//! Requests are scheduled one emission interval `T = P/L` apart; a request of cost `c` moves the
//! TAT `c·T` later, and is admitted if the new TAT is at most the tolerance `C·T` ahead of `t`
//! (`C` the capacity: `BURST`, or `max_burst + 1` for `CL.THROTTLE` and `GCRA`).
//!
//! State: how far the TAT is ahead of `last`, in scaled units (`L` per ms, so `T` is `P` units):
//! `0` is a fresh key. With the same parameters this is the token bucket seen from the other
//! side (`ahead = C·P − tokens`), and every reply is the token bucket's. They differ when the
//! parameters change: the TAT is a point in time, so it is kept in time (re-scaled to the new
//! rate, rounded up) and never clamped, as redis-cell and Redis's `GCRA` keep it: a key whose TAT
//! is beyond the new tolerance rejects until time catches up.

use super::{ceil_div, floor_div, to_u64, Decision, FixedSize, Params, State};

pub(crate) struct Gcra;

impl FixedSize for Gcra {
    type State = u128;

    fn fresh(_params: &Params, _t_ms: u64) -> u128 {
        0
    }

    fn advance(ahead: u128, params: &Params, last_ms: u64, t_ms: u64) -> u128 {
        ahead.saturating_sub(u128::from(t_ms - last_ms) * u128::from(params.limit))
    }

    /// The TAT `cost` emission intervals earlier (one interval is `P` units), never before `t`.
    fn refund(ahead: u128, params: &Params, cost: u64) -> u128 {
        ahead.saturating_sub(params.cost_scaled(cost))
    }

    fn is_fresh(ahead: &u128, _params: &Params) -> bool {
        *ahead == 0
    }

    fn carry_over(ahead: u128, from: &Params, to: &Params, _t_ms: u64) -> u128 {
        // The same span of time in the new units (L per ms), rounded up: a TAT never moves
        // earlier than it was.
        if from.limit == to.limit {
            ahead
        } else {
            ceil_div(ahead * u128::from(to.limit), u128::from(from.limit))
        }
    }

    fn decide(ahead: u128, params: &Params, cost: u64, _t_ms: u64) -> (Decision, u128) {
        let tolerance = params.capacity_scaled();
        let period = u128::from(params.period_ms);
        let rate = u128::from(params.limit);
        let next = ahead + params.cost_scaled(cost);
        let allowed = next <= tolerance;
        let after = if allowed { next } else { ahead };
        let retry_after_ms = if allowed {
            0
        } else if cost > params.capacity {
            -1
        } else {
            i64::try_from(ceil_div(next - tolerance, rate)).unwrap_or(i64::MAX)
        };
        let decision = Decision {
            allowed,
            limit: params.capacity,
            remaining: to_u64(floor_div(tolerance.saturating_sub(after), period)),
            retry_after_ms,
            reset_after_ms: to_u64(ceil_div(after, rate)),
            delay_ms: 0,
        };
        (decision, after)
    }

    fn load(state: &State) -> Option<u128> {
        match state {
            State::Gcra { ahead_scaled } => Some(*ahead_scaled),
            _ => None,
        }
    }

    fn store(ahead_scaled: u128) -> State {
        State::Gcra { ahead_scaled }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{apply, run_table, step};
    use super::super::{Algorithm, Limiter, Params, Request};

    #[test]
    fn a_burst_then_one_per_interval() {
        // gcra 3 1000 BURST 3: an interval of 333.3 ms, three at once; the TAT moves 333.3 ms
        // per request, and the reply is the token bucket's.
        run_table(
            Algorithm::Gcra,
            3,
            1000,
            Some(3),
            &[
                step!(at 0, cost 1 => allowed, remaining 2, retry 0, reset 334),
                step!(at 0, cost 1 => allowed, remaining 1, retry 0, reset 667),
                step!(at 0, cost 1 => allowed, remaining 0, retry 0, reset 1000),
                step!(at 0, cost 1 => rejected, remaining 0, retry 334, reset 1000),
                step!(at 331, cost 1 => rejected, remaining 0, retry 3, reset 669),
                step!(at 400, cost 2 => rejected, remaining 1, retry 267, reset 600),
                step!(at 400, cost 4 => rejected, remaining 1, retry -1, reset 600),
                step!(at 1000, cost 0 => allowed, remaining 3, retry 0, reset 0),
            ],
        );
    }

    #[test]
    fn equals_the_token_bucket_with_the_same_parameters() {
        let params = Params::new(7, 3_000, Some(4)).unwrap();
        let (mut bucket, mut gcra) = (None::<Limiter>, None::<Limiter>);
        let mut now = 1_000_000u64;
        for i in 0..2_000u64 {
            // A deterministic walk of gaps and costs, some late.
            now = (now + (i * 7_919) % 900).saturating_sub((i % 11 == 0) as u64 * 500);
            let cost = (i * 31) % 6;
            let request = |algorithm| Request {
                algorithm,
                params,
                cost,
                now_ms: now,
            };
            assert_eq!(
                apply(&mut gcra, &request(Algorithm::Gcra)),
                apply(&mut bucket, &request(Algorithm::TokenBucket)),
                "call {i}"
            );
        }
    }

    #[test]
    fn a_tat_is_a_point_in_time_through_parameter_changes() {
        // 10 per second, bursts of 10: ten at once put the TAT 1 s ahead.
        let wide = Params::new(10, 1_000, Some(10)).unwrap();
        let narrow = Params::new(1, 1_000, Some(2)).unwrap();
        let call = |params, cost, now_ms| Request {
            algorithm: Algorithm::Gcra,
            params,
            cost,
            now_ms,
        };
        let mut stored = None;
        assert!(apply(&mut stored, &call(wide, 10, 0)).allowed);
        // Now 1 per second with bursts of 2 (a tolerance of 2 s): the TAT is still 1 s ahead,
        // so one more fits, and the next must wait for it. A token bucket would have clamped its
        // (empty) bucket and re-scaled it instead.
        let decision = apply(&mut stored, &call(narrow, 1, 0));
        assert!(decision.allowed, "{decision:?}");
        assert_eq!((decision.remaining, decision.reset_after_ms), (0, 2_000));
        let decision = apply(&mut stored, &call(narrow, 1, 0));
        assert!(!decision.allowed);
        assert_eq!(decision.retry_after_ms, 1_000);
        // The other way round, a TAT beyond the new tolerance rejects until time catches up.
        let mut stored = None;
        assert!(apply(&mut stored, &call(narrow, 2, 0)).allowed);
        let shorter = Params::new(1, 1_000, Some(1)).unwrap();
        let decision = apply(&mut stored, &call(shorter, 1, 500));
        assert!(!decision.allowed);
        assert_eq!((decision.remaining, decision.retry_after_ms), (0, 1_500));
    }
}
