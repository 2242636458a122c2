//! Sliding window (weighted counter): the current aligned window's count plus the previous
//! window's count weighted by how much of it still overlaps the sliding window `(t − P, t]`.
//!
//! With `e = t − w` ms into the current window, the estimate in scaled units is
//! `est = previous·(P − e) + current·P`, compared against `L·P`.

use super::{Decision, FixedSize, Params, State};

pub(crate) struct SlidingWindow;

/// The counts of the current window and of the one just before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Counters {
    window_start_ms: u64,
    current: u64,
    previous: u64,
}

/// ms from `t` until both counts have slid out of the window.
pub fn reset_after(
    params: &Params,
    window_start_ms: u64,
    current: u64,
    previous: u64,
    t_ms: u64,
) -> u64 {
    let end = if current > 0 {
        window_start_ms + 2 * params.period_ms
    } else if previous > 0 {
        window_start_ms + params.period_ms
    } else {
        return 0;
    };
    end.saturating_sub(t_ms)
}

/// The scaled estimate at `e` ms into the window.
fn estimate(counters: &Counters, period: u128, elapsed_ms: u128) -> u128 {
    u128::from(counters.previous) * (period - elapsed_ms) + u128::from(counters.current) * period
}

/// The least `d ≥ 1` after which a rejected request of `cost ≤ L` is admitted.
fn retry_after(counters: &Counters, params: &Params, cost: u64, t_ms: u64) -> u64 {
    let period = u128::from(params.period_ms);
    let limit = u128::from(params.limit);
    let cost = u128::from(cost);
    let current = u128::from(counters.current);
    let previous = u128::from(counters.previous);
    let elapsed = u128::from(t_ms - counters.window_start_ms);
    let left_in_window = period - elapsed;
    // Later in this window: the previous window's weight decays until the request fits.
    if previous > 0 && current + cost <= limit {
        let room = (limit - current - cost) * period;
        let wait = left_in_window.saturating_sub(room / previous).max(1);
        if wait < left_in_window {
            return wait as u64;
        }
    }
    // In the next window, the current count becomes the decaying previous one.
    if current == 0 {
        return left_in_window as u64;
    }
    let into_next = period.saturating_sub((limit - cost) * period / current);
    if into_next < period {
        (left_in_window + into_next) as u64
    } else {
        // Only at the start of the window after next have both counts slid out.
        (left_in_window + period) as u64
    }
}

impl FixedSize for SlidingWindow {
    type State = Counters;

    fn fresh(params: &Params, t_ms: u64) -> Counters {
        Counters {
            window_start_ms: params.window_start(t_ms),
            current: 0,
            previous: 0,
        }
    }

    fn advance(counters: Counters, params: &Params, _last_ms: u64, t_ms: u64) -> Counters {
        let window_start_ms = params.window_start(t_ms);
        if window_start_ms == counters.window_start_ms {
            counters
        } else if window_start_ms == counters.window_start_ms + params.period_ms {
            Counters {
                window_start_ms,
                current: 0,
                previous: counters.current,
            }
        } else {
            Self::fresh(params, t_ms)
        }
    }

    /// The current window's count only: what earlier windows counted is spent.
    fn refund(counters: Counters, _params: &Params, cost: u64) -> Counters {
        Counters {
            current: counters.current.saturating_sub(cost),
            ..counters
        }
    }

    fn is_fresh(counters: &Counters, _params: &Params) -> bool {
        counters.current == 0 && counters.previous == 0
    }

    fn carry_over(counters: Counters, from: &Params, to: &Params, t_ms: u64) -> Counters {
        if from.period_ms == to.period_ms {
            counters
        } else {
            Self::fresh(to, t_ms)
        }
    }

    fn decide(counters: Counters, params: &Params, cost: u64, t_ms: u64) -> (Decision, Counters) {
        let period = u128::from(params.period_ms);
        let ceiling = u128::from(params.limit) * period;
        let elapsed = u128::from(t_ms - counters.window_start_ms);
        let est = estimate(&counters, period, elapsed);
        let need = params.cost_scaled(cost);
        let allowed = est + need <= ceiling;
        let (after, est_after) = if allowed {
            let after = Counters {
                current: counters.current + cost,
                ..counters
            };
            (after, est + need)
        } else {
            (counters, est)
        };
        let retry_after_ms = if allowed {
            0
        } else if cost > params.limit {
            -1
        } else {
            retry_after(&counters, params, cost, t_ms) as i64
        };
        let decision = Decision {
            allowed,
            limit: params.limit,
            remaining: (ceiling.saturating_sub(est_after) / period) as u64,
            retry_after_ms,
            reset_after_ms: reset_after(
                params,
                after.window_start_ms,
                after.current,
                after.previous,
                t_ms,
            ),
            delay_ms: 0,
        };
        (decision, after)
    }

    fn load(state: &State) -> Option<Counters> {
        match state {
            State::SlidingWindow {
                window_start_ms,
                current,
                previous,
            } => Some(Counters {
                window_start_ms: *window_start_ms,
                current: *current,
                previous: *previous,
            }),
            _ => None,
        }
    }

    fn store(counters: Counters) -> State {
        State::SlidingWindow {
            window_start_ms: counters.window_start_ms,
            current: counters.current,
            previous: counters.previous,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{run_table, step};
    use super::super::Algorithm;

    #[test]
    fn spec_worked_example() {
        // sliding-window 2 1000: the previous second's count fades out linearly.
        run_table(
            Algorithm::SlidingWindow,
            2,
            1000,
            None,
            &[
                step!(at 0, cost 1 => allowed, remaining 1, retry 0, reset 2000),
                step!(at 100, cost 1 => allowed, remaining 0, retry 0, reset 1900),
                step!(at 200, cost 1 => rejected, remaining 0, retry 1300, reset 1800),
                step!(at 1500, cost 1 => allowed, remaining 0, retry 0, reset 1500),
                step!(at 1999, cost 1 => rejected, remaining 0, retry 1, reset 1001),
                step!(at 2000, cost 1 => allowed, remaining 0, retry 0, reset 2000),
            ],
        );
    }

    #[test]
    fn retry_later_in_the_same_window_as_the_previous_count_decays() {
        // 10 per second; 10 in window 0, then in window 1 the weight of those 10 decays by 1 per 100 ms.
        run_table(
            Algorithm::SlidingWindow,
            10,
            1000,
            None,
            &[
                step!(at 0, cost 10 => allowed, remaining 0, retry 0, reset 2000),
                step!(at 1000, cost 1 => rejected, remaining 0, retry 100, reset 1000),
                step!(at 1100, cost 1 => allowed, remaining 0, retry 0, reset 1900),
                step!(at 1150, cost 1 => rejected, remaining 0, retry 50, reset 1850),
                step!(at 1199, cost 1 => rejected, remaining 0, retry 1, reset 1801),
                step!(at 1200, cost 1 => allowed, remaining 0, retry 0, reset 1800),
            ],
        );
    }
}
