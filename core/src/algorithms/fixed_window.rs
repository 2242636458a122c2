//! Fixed window: a counter per epoch-aligned window of `P` ms; at most `L` cost per window.
//!
//! State: the window's start `w = t − t mod P` and the cost admitted in it.

use super::{Decision, FixedSize, Params, State};

pub(crate) struct FixedWindow;

/// The counter of one window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Counter {
    window_start_ms: u64,
    count: u64,
}

/// ms from `t` until the window holding `count` ends (0 when it holds nothing).
pub fn reset_after(params: &Params, window_start_ms: u64, count: u64, t_ms: u64) -> u64 {
    if count == 0 {
        0
    } else {
        (window_start_ms + params.period_ms).saturating_sub(t_ms)
    }
}

impl FixedSize for FixedWindow {
    type State = Counter;

    fn fresh(params: &Params, t_ms: u64) -> Counter {
        Counter {
            window_start_ms: params.window_start(t_ms),
            count: 0,
        }
    }

    fn advance(counter: Counter, params: &Params, _last_ms: u64, t_ms: u64) -> Counter {
        if params.window_start(t_ms) == counter.window_start_ms {
            counter
        } else {
            Self::fresh(params, t_ms)
        }
    }

    fn refund(counter: Counter, _params: &Params, cost: u64) -> Counter {
        Counter {
            count: counter.count.saturating_sub(cost),
            ..counter
        }
    }

    fn is_fresh(counter: &Counter, _params: &Params) -> bool {
        counter.count == 0
    }

    fn carry_over(counter: Counter, from: &Params, to: &Params, t_ms: u64) -> Counter {
        if from.period_ms == to.period_ms {
            counter
        } else {
            Self::fresh(to, t_ms)
        }
    }

    fn decide(counter: Counter, params: &Params, cost: u64, t_ms: u64) -> (Decision, Counter) {
        let allowed = counter
            .count
            .checked_add(cost)
            .is_some_and(|total| total <= params.limit);
        let after = Counter {
            count: if allowed {
                counter.count + cost
            } else {
                counter.count
            },
            ..counter
        };
        let window_left = counter.window_start_ms + params.period_ms - t_ms;
        let retry_after_ms = if allowed {
            0
        } else if cost > params.limit {
            -1
        } else {
            window_left as i64
        };
        let decision = Decision {
            allowed,
            limit: params.limit,
            remaining: params.limit.saturating_sub(after.count),
            retry_after_ms,
            reset_after_ms: reset_after(params, after.window_start_ms, after.count, t_ms),
            delay_ms: 0,
        };
        (decision, after)
    }

    fn load(state: &State) -> Option<Counter> {
        match state {
            State::FixedWindow {
                window_start_ms,
                count,
            } => Some(Counter {
                window_start_ms: *window_start_ms,
                count: *count,
            }),
            _ => None,
        }
    }

    fn store(counter: Counter) -> State {
        State::FixedWindow {
            window_start_ms: counter.window_start_ms,
            count: counter.count,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{run_table, step};
    use super::super::Algorithm;

    #[test]
    fn spec_worked_example() {
        // fixed-window 2 1000: two per aligned second; the counter resets at the boundary.
        run_table(
            Algorithm::FixedWindow,
            2,
            1000,
            None,
            &[
                step!(at 100, cost 1 => allowed, remaining 1, retry 0, reset 900),
                step!(at 200, cost 1 => allowed, remaining 0, retry 0, reset 800),
                step!(at 300, cost 1 => rejected, remaining 0, retry 700, reset 700),
                step!(at 999, cost 0 => allowed, remaining 0, retry 0, reset 1),
                step!(at 1000, cost 2 => allowed, remaining 0, retry 0, reset 1000),
                step!(at 1001, cost 3 => rejected, remaining 0, retry -1, reset 999),
            ],
        );
    }

    #[test]
    fn time_never_runs_backwards_for_a_key() {
        // A call stamped before the last consuming call is evaluated at that call's time.
        run_table(
            Algorithm::FixedWindow,
            1,
            1000,
            None,
            &[
                step!(at 1500, cost 1 => allowed, remaining 0, retry 0, reset 500),
                step!(at 900, cost 1 => rejected, remaining 0, retry 500, reset 500),
                step!(at 2000, cost 1 => allowed, remaining 0, retry 0, reset 1000),
            ],
        );
    }
}
