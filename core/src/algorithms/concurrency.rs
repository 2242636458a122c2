//! Concurrency: at most `L` cost in flight at once per key, held by leases that expire on their
//! own (docs/algorithms.md, "Concurrency").
//!
//! A key holds a set of leases `(id, cost, expiry)`. At time `t` the live leases are those whose
//! expiry is after `t`; `held` is their total cost. An ACQUIRE of `n` for an id without a live
//! lease is admitted when `held + n ≤ L` and stores `(id, n, t + D)`; for an id with a live lease
//! it is a renewal, admitted when `held − old + n ≤ L`, and then the lease's cost becomes `n` and
//! its expiry `t + D`. A RELEASE removes an id's live lease. Expired leases hold nothing; a write
//! drops them. Time is `t = max(call, last)` as for every algorithm; a rejected ACQUIRE and a
//! RELEASE of no live lease change nothing.
//!
//! The set itself, compact and O(log n) per operation, is [`leases::Leases`].

pub mod leases;

pub use leases::{Lease, Leases, MAX_ID_LEN};

/// The most live leases one key may hold, whatever `ratelimit.max-leases` says (the upper bound
/// of that config, and what a stored or replicated state is held to).
pub const LEASES_CAP: u64 = 1_000_000;

use super::{Decision, Kind, Limiter, Params, State, Write, MAX_AMOUNT};

/// One ACQUIRE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acquire<'a> {
    /// `limit`: `L`, the most cost held at once; `period_ms`: `D`, the lease duration.
    pub params: Params,
    /// The lease id: 1 to [`MAX_ID_LEN`] bytes.
    pub id: &'a [u8],
    /// `n`: the cost the lease holds, 1 to 10^12.
    pub cost: u64,
    /// The call time (the server's clock or `AT`), before `max(call, last)`.
    pub now_ms: u64,
}

/// What an ACQUIRE answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acquired {
    /// The six reply fields (`delay_ms` 0).
    pub decision: Decision,
    /// The evaluation time `t = max(call, last)`.
    pub t_ms: u64,
    /// `t + D`: the lease's expiry, if admitted.
    pub expiry_ms: u64,
}

/// Why an ACQUIRE was not decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcquireError {
    /// The key holds another algorithm.
    Mismatch(Kind),
    /// Admitting it would store more than `max` live leases.
    TooManyLeases { max: u64 },
    /// An id of no accepted length, or a cost of 0 or above 10^12.
    Invalid,
}

/// What [`release`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// The id held no live lease: nothing changed.
    Nothing,
    /// The lease is gone (and the expired ones with it); others remain.
    Updated,
    /// The lease was the last live one: the key is to be deleted.
    Emptied,
}

/// The leases live at `t`, as a decision sees them.
struct Live {
    /// Live leases and their cost.
    count: usize,
    held: u64,
    /// The cost of the leases that expired at or before `t` (still stored until a write).
    expired_cost: u64,
    /// The id's own live lease.
    own: Option<Lease>,
}

fn live(leases: Option<&Leases>, id: &[u8], t_ms: u64) -> Live {
    let Some(leases) = leases else {
        return Live {
            count: 0,
            held: 0,
            expired_cost: 0,
            own: None,
        };
    };
    let (expired, expired_cost) = leases.expiring_by(t_ms);
    Live {
        count: leases.len() - expired,
        held: leases.total_cost() - expired_cost,
        expired_cost,
        own: leases.get(id).filter(|lease| lease.expiry_ms > t_ms),
    }
}

/// The leases of a stored limiter, or the algorithm it holds instead.
fn leases_of(limiter: &Limiter) -> Result<&Leases, AcquireError> {
    match &limiter.state {
        State::Concurrency(leases) => Ok(leases),
        _ => Err(AcquireError::Mismatch(limiter.kind())),
    }
}

/// Decides `request` on the stored limiter (`None` when the key is absent), and with `commit`
/// stores an admitted lease: in place when a limiter was stored, else into `created`
/// ([`Write::Created`]). A
/// rejected call writes nothing, commit or not. `max_leases`: the most live leases a key may
/// hold (`ratelimit.max-leases`); a new lease past it is an error, not a rejection.
pub fn acquire(
    stored: Option<&mut Limiter>,
    request: &Acquire,
    max_leases: u64,
    commit: bool,
    created: &mut Option<Limiter>,
) -> Result<(Acquired, Write), AcquireError> {
    if !(1..=MAX_ID_LEN).contains(&request.id.len()) || !(1..=MAX_AMOUNT).contains(&request.cost) {
        return Err(AcquireError::Invalid);
    }
    let (t_ms, leases) = match stored.as_deref() {
        Some(limiter) => (
            request.now_ms.max(limiter.last_ms),
            Some(leases_of(limiter)?),
        ),
        None => (request.now_ms, None),
    };
    let limit = request.params.limit;
    let n = request.cost;
    let expiry_ms = t_ms + request.params.period_ms;
    let now = live(leases, request.id, t_ms);
    let own_cost = now.own.map_or(0, |lease| lease.cost);
    let other = now.held - own_cost;
    let allowed = other.checked_add(n).is_some_and(|after| after <= limit);
    let max = max_leases.min(leases::MAX_LEASES as u64);
    if allowed && now.own.is_none() && now.count as u64 >= max {
        return Err(AcquireError::TooManyLeases { max });
    }
    let decision = if allowed {
        let last_other = leases.and_then(|leases| leases.last_expiry_except_ms(request.id));
        Decision {
            allowed: true,
            limit,
            remaining: limit - (other + n),
            retry_after_ms: 0,
            reset_after_ms: last_other.unwrap_or(0).max(expiry_ms) - t_ms,
            delay_ms: 0,
        }
    } else {
        let retry_after_ms = if n > limit {
            -1
        } else {
            // The least time by which enough of the other live leases have expired.
            let need = other + n - limit;
            let leases = leases.expect("a rejection with room to gain has leases");
            let target = now.expired_cost + need;
            let mut x = leases.expired_cost_by(target);
            if let (Some(own), Some(at)) = (now.own, x) {
                if own.expiry_ms <= at {
                    // The own lease expiring frees nothing a renewal would not give back.
                    x = leases.expired_cost_by(target + own.cost);
                }
            }
            x.map_or(-1, |at| (at - t_ms) as i64)
        };
        let last = leases.and_then(Leases::last_expiry_ms).unwrap_or(t_ms);
        Decision {
            allowed: false,
            limit,
            remaining: limit.saturating_sub(now.held),
            retry_after_ms,
            reset_after_ms: last.max(t_ms) - t_ms,
            delay_ms: 0,
        }
    };
    let acquired = Acquired {
        decision,
        t_ms,
        expiry_ms,
    };
    if !(commit && allowed) {
        return Ok((acquired, Write::Nothing));
    }
    let lease = Lease { cost: n, expiry_ms };
    match stored {
        Some(limiter) => {
            if let State::Concurrency(leases) = &mut limiter.state {
                leases.drop_expired(t_ms);
                // Within every bound the set has: the id and cost were checked, the count is
                // below `max`, and every expiry is within 3650 days of `t`.
                leases
                    .insert(request.id, lease)
                    .expect("an admitted lease fits the set");
            }
            limiter.params = request.params;
            limiter.last_ms = t_ms;
            Ok((acquired, Write::Updated))
        }
        None => {
            let mut leases = Leases::new();
            leases
                .insert(request.id, lease)
                .expect("one lease fits an empty set");
            *created = Some(Limiter {
                params: request.params,
                last_ms: t_ms,
                state: State::Concurrency(Box::new(leases)),
                blocked_until_ms: 0,
            });
            Ok((acquired, Write::Created))
        }
    }
}

/// Releases `id`'s live lease at `t = max(call, last)`; returns `t` and what changed. A
/// release that removes something also drops the expired leases and stores `last = t`.
pub fn release(
    limiter: &mut Limiter,
    id: &[u8],
    now_ms: u64,
) -> Result<(u64, Released), AcquireError> {
    let t_ms = now_ms.max(limiter.last_ms);
    let State::Concurrency(leases) = &mut limiter.state else {
        return Err(AcquireError::Mismatch(limiter.kind()));
    };
    if leases.get(id).is_none_or(|lease| lease.expiry_ms <= t_ms) {
        return Ok((t_ms, Released::Nothing));
    }
    leases.remove(id);
    leases.drop_expired(t_ms);
    limiter.last_ms = t_ms;
    let released = if leases.is_empty() {
        Released::Emptied
    } else {
        Released::Updated
    };
    Ok((t_ms, released))
}

/// What a concurrency key holds at `t = max(now, last)`, for `RATELIMIT.INFO`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// Live leases and their total cost.
    pub leases: u64,
    pub cost: u64,
    /// `L − held`, never negative.
    pub remaining: u64,
    /// ms from `t` until the last live lease expires (0: none is live).
    pub reset_after_ms: u64,
}

/// What `limiter` (a concurrency limiter) holds at `now_ms`; `None` for another algorithm.
pub fn held(limiter: &Limiter, now_ms: u64) -> Option<Held> {
    let leases = leases_of(limiter).ok()?;
    let t_ms = now_ms.max(limiter.last_ms);
    let (expired, expired_cost) = leases.expiring_by(t_ms);
    let cost = leases.total_cost() - expired_cost;
    Some(Held {
        leases: (leases.len() - expired) as u64,
        cost,
        remaining: limiter.params.limit.saturating_sub(cost),
        reset_after_ms: leases
            .last_expiry_ms()
            .map_or(0, |last| last.saturating_sub(t_ms)),
    })
}

/// ms after `last` until the last stored lease expires: the key expires at `last` plus this.
pub fn reset_after(leases: &Leases, last_ms: u64) -> u64 {
    leases
        .last_expiry_ms()
        .map_or(0, |last| last.saturating_sub(last_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::{Algorithm, MAX_PERIOD_MS, TIME_LIMIT_MS};
    use proptest::prelude::*;

    /// The leases written out as a list, and the definitions of the module documentation applied
    /// to it literally (no index, no prefix sums): what the cores must answer.
    #[derive(Clone, Debug, Default)]
    struct Model {
        leases: Vec<(Vec<u8>, u64, u64)>,
        last: Option<u64>,
        limit: u64,
    }

    #[derive(Debug, PartialEq, Eq)]
    enum Answer {
        Acquired(Decision),
        TooMany,
        Released(bool),
    }

    impl Model {
        fn live(&self, t: u64) -> impl Iterator<Item = &(Vec<u8>, u64, u64)> {
            self.leases.iter().filter(move |(_, _, e)| *e > t)
        }

        fn acquire(&mut self, id: &[u8], limit: u64, d: u64, n: u64, now: u64, max: u64) -> Answer {
            let t = self.last.map_or(now, |last| now.max(last));
            let held: u64 = self.live(t).map(|l| l.1).sum();
            let own = self.live(t).find(|l| l.0 == id).map(|l| l.1);
            let other = held - own.unwrap_or(0);
            let allowed = other + n <= limit;
            if allowed && own.is_none() && self.live(t).count() as u64 >= max {
                return Answer::TooMany;
            }
            let last_expiry = |leases: &[(Vec<u8>, u64, u64)]| {
                leases
                    .iter()
                    .filter(|l| l.2 > t)
                    .map(|l| l.2)
                    .max()
                    .unwrap_or(t)
                    - t
            };
            if allowed {
                self.leases.retain(|l| l.2 > t && l.0 != id);
                self.leases.push((id.to_vec(), n, t + d));
                self.last = Some(t);
                self.limit = limit;
                return Answer::Acquired(Decision {
                    allowed: true,
                    limit,
                    remaining: limit - other - n,
                    retry_after_ms: 0,
                    reset_after_ms: last_expiry(&self.leases),
                    delay_ms: 0,
                });
            }
            // Try every later expiry, in order, for the first one where the request fits.
            let retry = if n > limit {
                -1
            } else {
                let mut times: Vec<u64> = self.live(t).map(|l| l.2).collect();
                times.sort();
                times
                    .into_iter()
                    .find(|&x| {
                        let other: u64 = self.live(x).filter(|l| l.0 != id).map(|l| l.1).sum();
                        other + n <= limit
                    })
                    .map_or(-2, |x| (x - t) as i64)
            };
            Answer::Acquired(Decision {
                allowed: false,
                limit,
                remaining: limit.saturating_sub(held),
                retry_after_ms: retry,
                reset_after_ms: last_expiry(&self.leases),
                delay_ms: 0,
            })
        }

        fn release(&mut self, id: &[u8], now: u64) -> Answer {
            let Some(last) = self.last else {
                return Answer::Released(false);
            };
            let t = now.max(last);
            if self.live(t).all(|l| l.0 != id) {
                return Answer::Released(false);
            }
            self.leases.retain(|l| l.2 > t && l.0 != id);
            self.last = if self.leases.is_empty() {
                None
            } else {
                Some(t)
            };
            Answer::Released(true)
        }
    }

    /// One key through the cores: ACQUIRE and RELEASE as the commands run them.
    #[derive(Default)]
    struct Key(Option<Limiter>);

    impl Key {
        fn acquire(&mut self, id: &[u8], limit: u64, d: u64, n: u64, now: u64, max: u64) -> Answer {
            let request = Acquire {
                params: Params::new(limit, d, None).unwrap(),
                id,
                cost: n,
                now_ms: now,
            };
            let mut created = None;
            match acquire(self.0.as_mut(), &request, max, true, &mut created) {
                Ok((acquired, write)) => {
                    if let (Write::Created, Some(limiter)) = (write, created.take()) {
                        self.0 = Some(limiter);
                    }
                    Answer::Acquired(acquired.decision)
                }
                Err(AcquireError::TooManyLeases { .. }) => Answer::TooMany,
                Err(other) => panic!("{other:?}"),
            }
        }

        fn release(&mut self, id: &[u8], now: u64) -> Answer {
            let Some(limiter) = self.0.as_mut() else {
                return Answer::Released(false);
            };
            match release(limiter, id, now).unwrap().1 {
                Released::Nothing => Answer::Released(false),
                Released::Updated => Answer::Released(true),
                Released::Emptied => {
                    self.0 = None;
                    Answer::Released(true)
                }
            }
        }

        fn leases(&self) -> Option<&Leases> {
            self.0.as_ref().map(|limiter| match &limiter.state {
                State::Concurrency(leases) => &**leases,
                _ => panic!("not concurrency"),
            })
        }
    }

    fn decision(allowed: bool, remaining: u64, retry: i64, reset: u64) -> Answer {
        Answer::Acquired(Decision {
            allowed,
            limit: 3,
            remaining,
            retry_after_ms: retry,
            reset_after_ms: reset,
            delay_ms: 0,
        })
    }

    #[test]
    fn worked_example() {
        // concurrency 3, leases of 1000 ms: the table of docs/algorithms.md.
        let mut key = Key::default();
        let mut acquire = |id: &[u8], n, at| key.acquire(id, 3, 1000, n, at, 100);
        assert_eq!(acquire(b"a", 1, 0), decision(true, 2, 0, 1000));
        assert_eq!(acquire(b"b", 2, 400), decision(true, 0, 0, 1000));
        assert_eq!(acquire(b"c", 1, 500), decision(false, 0, 500, 900));
        assert_eq!(acquire(b"c", 4, 500), decision(false, 0, -1, 900));
        // A renewal of b at its own cost fits; at 3 it waits for a to expire.
        assert_eq!(acquire(b"b", 3, 600), decision(false, 0, 400, 800));
        assert_eq!(acquire(b"b", 1, 600), decision(true, 1, 0, 1000));
        assert_eq!(acquire(b"c", 1, 1000), decision(true, 1, 0, 1000));
        assert_eq!(key.release(b"a", 1000), Answer::Released(false));
        assert_eq!(key.release(b"b", 1100), Answer::Released(true));
        assert_eq!(key.release(b"b", 1100), Answer::Released(false));
        let mut acquire = |id: &[u8], n, at| key.acquire(id, 3, 1000, n, at, 100);
        // AT before last: evaluated at last (1100).
        assert_eq!(acquire(b"d", 2, 900), decision(true, 0, 0, 1000));
        assert_eq!(key.release(b"c", 2000), Answer::Released(false));
        assert_eq!(key.release(b"d", 2099), Answer::Released(true));
        assert!(key.0.is_none(), "the last release deletes the key");
    }

    #[test]
    fn a_new_lease_past_max_leases_is_an_error_a_renewal_is_not() {
        let mut key = Key::default();
        assert_eq!(
            key.acquire(b"a", 10, 100, 1, 0, 2),
            decision10(true, 9, 100)
        );
        assert_eq!(
            key.acquire(b"b", 10, 100, 1, 0, 2),
            decision10(true, 8, 100)
        );
        assert_eq!(key.acquire(b"c", 10, 100, 1, 0, 2), Answer::TooMany);
        assert_eq!(
            key.acquire(b"b", 10, 100, 3, 50, 2),
            decision10(true, 6, 100)
        );
        // Once one has expired, there is room again.
        assert_eq!(
            key.acquire(b"c", 10, 100, 1, 100, 2),
            decision10(true, 6, 100)
        );
    }

    fn decision10(allowed: bool, remaining: u64, reset: u64) -> Answer {
        Answer::Acquired(Decision {
            allowed,
            limit: 10,
            remaining,
            retry_after_ms: 0,
            reset_after_ms: reset,
            delay_ms: 0,
        })
    }

    #[test]
    fn a_rejected_call_and_an_empty_release_change_nothing() {
        let mut key = Key::default();
        key.acquire(b"a", 1, 100, 1, 10, 100);
        let before = key.0.clone();
        assert_eq!(
            key.acquire(b"b", 1, 100, 1, 50, 100),
            decision1(false, 60, 60)
        );
        assert_eq!(key.release(b"b", 80), Answer::Released(false));
        // A release after the lease expired releases nothing either.
        assert_eq!(key.release(b"a", 110), Answer::Released(false));
        assert_eq!(key.0, before);
    }

    fn decision1(allowed: bool, retry: i64, reset: u64) -> Answer {
        Answer::Acquired(Decision {
            allowed,
            limit: 1,
            remaining: 0,
            retry_after_ms: retry,
            reset_after_ms: reset,
            delay_ms: 0,
        })
    }

    #[test]
    fn acquire_on_another_algorithm_is_a_mismatch() {
        let params = Params::new(3, 1000, None).unwrap();
        let mut window = Limiter {
            params,
            last_ms: 5,
            state: State::FixedWindow {
                window_start_ms: 0,
                count: 1,
            },
            blocked_until_ms: 0,
        };
        let request = Acquire {
            params,
            id: b"x",
            cost: 1,
            now_ms: 5,
        };
        assert_eq!(
            acquire(Some(&mut window), &request, 10, true, &mut None).err(),
            Some(AcquireError::Mismatch(Kind::Rate(Algorithm::FixedWindow)))
        );
        assert_eq!(
            release(&mut window, b"x", 5),
            Err(AcquireError::Mismatch(Kind::Rate(Algorithm::FixedWindow)))
        );
        for bad in [
            Acquire { id: b"", ..request },
            Acquire {
                id: &[1; 129],
                ..request
            },
            Acquire { cost: 0, ..request },
            Acquire {
                cost: MAX_AMOUNT + 1,
                ..request
            },
        ] {
            assert_eq!(
                acquire(None, &bad, 10, true, &mut None).err(),
                Some(AcquireError::Invalid)
            );
        }
    }

    /// One step of a random sequence.
    #[derive(Clone, Debug)]
    enum Op {
        Acquire {
            id: u8,
            limit: u64,
            d: u64,
            n: u64,
            gap: i64,
        },
        Release {
            id: u8,
            gap: i64,
        },
    }

    fn op(huge: bool) -> impl Strategy<Value = Op> {
        let scale = if huge { MAX_AMOUNT / 4 } else { 1 };
        let d_max = if huge { MAX_PERIOD_MS } else { 2000 };
        prop_oneof![
            3 => (0u8..12, 1u64..=4, 1u64..=d_max, 1u64..=4, -300i64..600).prop_map(
                move |(id, limit, d, n, gap)| Op::Acquire {
                    id,
                    limit: limit * scale,
                    d: if huge { d } else { d % 2000 + 1 },
                    n: n * scale,
                    gap,
                }
            ),
            1 => (0u8..12, -300i64..900).prop_map(|(id, gap)| Op::Release { id, gap }),
        ]
    }

    fn run(ops: &[Op], start: u64, max: u64) -> Result<(), TestCaseError> {
        let mut key = Key::default();
        let mut model = Model::default();
        let mut now = start;
        let mut last_t = 0;
        for op in ops {
            let (answer, expected) = match op {
                Op::Acquire {
                    id,
                    limit,
                    d,
                    n,
                    gap,
                } => {
                    now = now.saturating_add_signed(*gap).min(TIME_LIMIT_MS - 1);
                    let id = [b'i', *id];
                    (
                        key.acquire(&id, *limit, *d, *n, now, max),
                        model.acquire(&id, *limit, *d, *n, now, max),
                    )
                }
                Op::Release { id, gap } => {
                    now = now.saturating_add_signed(*gap).min(TIME_LIMIT_MS - 1);
                    let id = [b'i', *id];
                    (key.release(&id, now), model.release(&id, now))
                }
            };
            prop_assert_eq!(&answer, &expected, "{:?} at {}", op, now);
            if let Some(limiter) = &key.0 {
                let leases = key.leases().unwrap();
                leases.check_invariants();
                // Held never exceeds the limit it was admitted under, time never runs
                // backwards for the key, and the key expires with its last lease.
                prop_assert!(leases.total_cost() <= limiter.params.limit);
                prop_assert!(limiter.last_ms >= last_t);
                last_t = limiter.last_ms;
                prop_assert!(leases.iter().all(|(_, l)| l.expiry_ms > limiter.last_ms));
                prop_assert_eq!(Some(limiter.expires_at_ms()), leases.last_expiry_ms());
                prop_assert!(leases.len() as u64 <= max);
                let stored: Vec<(Vec<u8>, u64, u64)> = leases
                    .iter()
                    .map(|(id, l)| (id.to_vec(), l.cost, l.expiry_ms))
                    .collect();
                let mut modelled: Vec<_> = model.leases.clone();
                modelled.sort_by(|a, b| a.2.cmp(&b.2).then(a.0.cmp(&b.0)));
                prop_assert_eq!(stored, modelled);
            } else {
                prop_assert!(model.leases.is_empty() && model.last.is_none());
                last_t = 0;
            }
            if let Answer::Acquired(decision) = answer {
                prop_assert!(decision.remaining <= decision.limit);
                prop_assert_eq!(decision.allowed, decision.retry_after_ms == 0);
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The cores equal the model on random sequences: acquires, renewals (an id acquired
        /// again), releases, expiry, times running backwards, costs and limits changing.
        #[test]
        fn acquire_and_release_match_the_model(ops in proptest::collection::vec(op(false), 1..120)) {
            run(&ops, 1_000_000, 100)?;
        }

        /// The same with the largest accepted amounts and durations, times near 2^53, and a
        /// max-leases bound that is reached.
        #[test]
        fn the_largest_inputs_match_the_model(ops in proptest::collection::vec(op(true), 1..60)) {
            run(&ops, TIME_LIMIT_MS - 10_000, 100)?;
            run(&ops, 0, 4)?;
        }
    }
}
