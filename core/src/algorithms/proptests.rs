//! Property tests of the pure cores: each property is one invariant of docs/algorithms.md,
//! checked on random call sequences against one key (random times, late arrivals, costs and, where
//! docs/algorithms.md allows them, parameter changes between calls).
//!
//! Sequences are generated relative to the period, so the same strategies exercise tiny limiters
//! (where boundaries and rounding collide often) and the largest accepted inputs (10^12 amounts,
//! 3650-day periods, times just below 2^53), where any overflow would show: run these in debug too,
//! where arithmetic overflow panics.
//!
//! A failure prints the call sequence (`Scenario`) that broke the property, already shrunk.

use std::collections::BTreeMap;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;

use super::testing::peek;
use super::{
    check, largest_grant, last_unit_delay_ms, refund, Algorithm, AlgorithmMismatch, Kind, Limiter,
    Outcome, Params, Refunded, Request, State, Write, MAX_AMOUNT, MAX_PERIOD_MS, TIME_LIMIT_MS,
};

/// Cases per property. A case is up to `MAX_STEPS` calls, each with a few probes.
const CASES: u32 = 256;
const MAX_STEPS: usize = 60;
/// The sliding log's default `ratelimit.max-log-limit`: larger limits are refused before the core,
/// and keeping them this small keeps the logs' memory small.
const LOG_LIMIT: u64 = 100_000;

// ---------------------------------------------------------------------------------------------
// Generated call sequences
// ---------------------------------------------------------------------------------------------

/// Tiny limiters, where boundaries and rounding collide often, or the largest accepted inputs.
#[derive(Clone, Copy, Debug)]
enum Scale {
    Small,
    Huge,
}

/// A call sequence against one key: the calls in order, with the parameters each names.
#[derive(Clone, Debug)]
struct Scenario {
    requests: Vec<Request>,
}

/// One generated call, before it is placed in time and priced under its parameters.
#[derive(Clone, Copy, Debug)]
struct Step {
    /// Time since the previous call, in eighths of the period (negative: a late-arriving call).
    eighths: i64,
    /// ms added to that, to land just before or after a boundary.
    jitter: i64,
    /// The cost: 0, 1, the `limit` field, just above it, half of it, or any up to just above it.
    cost_kind: u8,
    cost_any: u64,
    /// Which of the scenario's parameter sets the call names (modulo their number).
    params: usize,
}

fn step() -> impl Strategy<Value = Step> {
    (
        prop_oneof![
            3 => Just(0i64),
            3 => 0i64..=4,
            2 => -8i64..=0,
            2 => 0i64..=24,
            1 => -24i64..=48,
        ],
        prop_oneof![2 => Just(0i64), 1 => -3i64..=3],
        0u8..10,
        any::<u64>(),
        0usize..8,
    )
        .prop_map(|(eighths, jitter, cost_kind, cost_any, params)| Step {
            eighths,
            jitter,
            cost_kind,
            cost_any,
            params,
        })
}

/// An amount in `1..=max`, often at its bounds.
fn bounded(max: u64) -> BoxedStrategy<u64> {
    prop_oneof![
        Just(1),
        Just(max),
        Just(max - 1),
        1..=max,
        1..=max.min(1000)
    ]
    .boxed()
}

fn params(scale: Scale, algorithm: Algorithm) -> BoxedStrategy<Params> {
    let (limit, period, burst) = match scale {
        Scale::Small => (
            (1u64..=10).boxed(),
            (1u64..=50).boxed(),
            (1u64..=12).boxed(),
        ),
        Scale::Huge => {
            let max_limit = if algorithm == Algorithm::SlidingLog {
                LOG_LIMIT
            } else {
                MAX_AMOUNT
            };
            (
                bounded(max_limit),
                bounded(MAX_PERIOD_MS),
                bounded(MAX_AMOUNT),
            )
        }
    };
    let is_bucket = algorithm.is_bucket();
    (limit, period, burst)
        .prop_map(move |(limit, period, burst)| {
            Params::new(limit, period, is_bucket.then_some(burst)).expect("within the bounds")
        })
        .boxed()
}

fn start_ms(scale: Scale) -> BoxedStrategy<u64> {
    match scale {
        Scale::Small => (0u64..=10_000).boxed(),
        Scale::Huge => prop_oneof![
            Just(0),
            Just(TIME_LIMIT_MS - 1),
            0..TIME_LIMIT_MS,
            TIME_LIMIT_MS - 1_000_000_000_000..TIME_LIMIT_MS,
        ]
        .boxed(),
    }
}

/// The time of a call `step` after a call at `previous_ms`, kept within `0 .. 2^53`.
fn place(previous_ms: u64, step: &Step, period_ms: u64) -> u64 {
    let delta = i128::from(step.eighths) * i128::from(period_ms) / 8 + i128::from(step.jitter);
    let at = (i128::from(previous_ms) + delta).clamp(0, i128::from(TIME_LIMIT_MS - 1));
    u64::try_from(at).expect("clamped")
}

fn price(step: &Step, params: &Params) -> u64 {
    let limit_field = params.capacity;
    let cost = match step.cost_kind {
        0 => 0,
        1..=3 => 1,
        4 => limit_field,
        5 => limit_field + 1,
        6 => limit_field / 2,
        _ => step.cost_any % (limit_field + 2),
    };
    cost.min(MAX_AMOUNT)
}

/// Sequences of `algorithms` at `scale`, each naming one of up to `param_sets` parameter sets
/// (1: fixed parameters).
fn scenario_at(
    scale: Scale,
    algorithms: &'static [Algorithm],
    param_sets: usize,
) -> BoxedStrategy<Scenario> {
    select(algorithms)
        .prop_flat_map(move |algorithm| {
            (
                vec(params(scale, algorithm), 1..=param_sets),
                start_ms(scale),
                vec(step(), 1..=MAX_STEPS),
            )
                .prop_map(move |(palette, start, steps)| {
                    let mut now_ms = start;
                    let requests = steps
                        .iter()
                        .enumerate()
                        .map(|(i, step)| {
                            let params = palette[step.params % palette.len()];
                            if i > 0 {
                                now_ms = place(now_ms, step, params.period_ms);
                            }
                            Request {
                                algorithm,
                                params,
                                cost: price(step, &params),
                                now_ms,
                            }
                        })
                        .collect();
                    Scenario { requests }
                })
        })
        .boxed()
}

/// Mostly tiny limiters, a quarter of the cases at the largest accepted inputs.
fn scenario(algorithms: &'static [Algorithm], param_sets: usize) -> BoxedStrategy<Scenario> {
    prop_oneof![
        3 => scenario_at(Scale::Small, algorithms, param_sets),
        1 => scenario_at(Scale::Huge, algorithms, param_sets),
    ]
    .boxed()
}

const ALL: &[Algorithm] = &Algorithm::ALL;
const TOKEN_BUCKET: &[Algorithm] = &[Algorithm::TokenBucket];
const LEAKY_BUCKET: &[Algorithm] = &[Algorithm::LeakyBucket];
const WINDOWS: &[Algorithm] = &[Algorithm::FixedWindow, Algorithm::SlidingWindow];
const SLIDING_LOG: &[Algorithm] = &[Algorithm::SlidingLog];

/// Fixed parameters: every call names the same ones.
fn fixed(algorithms: &'static [Algorithm]) -> BoxedStrategy<Scenario> {
    scenario(algorithms, 1)
}

/// Parameters changing between calls among up to three sets.
fn changing(algorithms: &'static [Algorithm]) -> BoxedStrategy<Scenario> {
    scenario(algorithms, 3)
}

// ---------------------------------------------------------------------------------------------
// Running calls
// ---------------------------------------------------------------------------------------------

/// One committed call (a CHECK) of a scenario, with the stored limiter before and after it.
struct Call<'a> {
    before: &'a Option<Limiter>,
    request: &'a Request,
    outcome: Outcome,
    after: &'a Option<Limiter>,
}

/// A CHECK: commits, storing what the core creates.
fn commit(stored: &mut Option<Limiter>, request: &Request) -> Outcome {
    let mut created = None;
    let (outcome, write) =
        check(stored.as_mut(), request, true, &mut created).expect("same algorithm");
    if let (Write::Created, Some(limiter)) = (write, created.take()) {
        *stored = Some(limiter);
    }
    outcome
}

/// The same request at another time.
fn at(request: &Request, now_ms: u64) -> Request {
    Request { now_ms, ..*request }
}

/// Runs the scenario's calls in order as CHECKs on one key, handing each to `each`.
fn walk(
    scenario: &Scenario,
    mut each: impl FnMut(&Call) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    let mut stored: Option<Limiter> = None;
    for request in &scenario.requests {
        let before = stored.clone();
        let outcome = commit(&mut stored, request);
        each(&Call {
            before: &before,
            request,
            outcome,
            after: &stored,
        })?;
    }
    Ok(())
}

/// The evaluation times and costs of the scenario's admitted (consuming) calls: each is evaluated
/// at or after the previous one, since the key's `last` is the latest of them.
fn admissions(scenario: &Scenario) -> Result<Vec<(u64, u64)>, TestCaseError> {
    let mut admitted: Vec<(u64, u64)> = Vec::new();
    walk(scenario, |call| {
        if call.outcome.consumed {
            let t_ms = call.outcome.t_ms;
            prop_assert!(
                admitted.last().is_none_or(|(last, _)| *last <= t_ms),
                "time ran backwards"
            );
            admitted.push((t_ms, call.request.cost));
        }
        Ok(())
    })?;
    Ok(admitted)
}

/// What one key stores over a random call sequence of any algorithm (parameters changing among
/// up to three sets, tiny limiters and the largest inputs), with a refund after every third call
/// or so: the limiter after each call that left one. The store's codec must accept every one of
/// them (core/src/codec/).
pub(crate) fn stored_limiters() -> impl Strategy<Value = Vec<Limiter>> {
    changing(ALL).prop_map(|scenario| {
        let mut stored = None;
        let mut states = Vec::new();
        for request in &scenario.requests {
            commit(&mut stored, request);
            states.extend(stored.clone());
            if request.now_ms % 3 == 0 {
                let (_, refunded) = refund(stored.as_mut(), request).expect("same algorithm");
                if refunded == Refunded::Emptied {
                    stored = None;
                }
                states.extend(stored.clone());
            }
        }
        states
    })
}

// ---------------------------------------------------------------------------------------------
// Invariants of every call (shared by several properties)
// ---------------------------------------------------------------------------------------------

/// The reply's fields stay within their documented ranges, and time never runs backwards.
fn reply_within_bounds(call: &Call) -> Result<(), TestCaseError> {
    let (request, outcome) = (call.request, &call.outcome);
    let decision = &outcome.decision;
    let limit_field = if request.algorithm.is_bucket() {
        request.params.capacity
    } else {
        request.params.limit
    };
    let last_ms = call.before.as_ref().map_or(0, |limiter| limiter.last_ms);
    prop_assert_eq!(
        outcome.t_ms,
        request.now_ms.max(last_ms),
        "t = max(call, last)"
    );
    prop_assert_eq!(decision.limit, limit_field);
    prop_assert!(
        decision.remaining <= decision.limit,
        "remaining above limit: {:?}",
        decision
    );
    prop_assert_eq!(outcome.consumed, decision.allowed && request.cost > 0);
    if decision.allowed {
        prop_assert_eq!(
            decision.retry_after_ms,
            0,
            "allowed, yet a retry: {:?}",
            decision
        );
    } else {
        prop_assert!(
            decision.retry_after_ms == -1 || decision.retry_after_ms >= 1,
            "rejected, yet retry_after {}",
            decision.retry_after_ms
        );
    }
    // -1 exactly when the cost can never fit.
    prop_assert_eq!(
        decision.retry_after_ms == -1,
        request.cost > limit_field,
        "retry_after -1 iff cost > limit: {:?}",
        decision
    );
    if !(decision.allowed && request.algorithm == Algorithm::LeakyBucket) {
        prop_assert_eq!(
            decision.delay_ms,
            0,
            "delay outside an admitted leaky-bucket call"
        );
    }
    Ok(())
}

/// A call that consumed nothing (rejected, or COST 0) leaves the stored limiter as it was.
fn unchanged_unless_consumed(call: &Call) -> Result<(), TestCaseError> {
    if !call.outcome.consumed {
        prop_assert_eq!(
            call.before,
            call.after,
            "a non-consuming call changed the state"
        );
    }
    Ok(())
}

/// PEEK (no commit) answers what the CHECK answered, and writes nothing.
fn peek_matches_check(call: &Call) -> Result<(), TestCaseError> {
    let mut copy = call.before.clone();
    let (peeked, write) =
        check(copy.as_mut(), call.request, false, &mut None).expect("same algorithm");
    prop_assert!(matches!(write, Write::Nothing), "PEEK wrote {:?}", write);
    prop_assert_eq!(&copy, call.before, "PEEK changed the state");
    prop_assert_eq!(
        peeked,
        call.outcome,
        "PEEK differs from the CHECK that followed"
    );
    Ok(())
}

/// A call naming another algorithm than the key holds is refused and changes nothing.
fn other_algorithm_refused(call: &Call) -> Result<(), TestCaseError> {
    let Some(stored) = call.after else {
        return Ok(());
    };
    let held = stored.kind();
    for algorithm in Algorithm::ALL
        .into_iter()
        .filter(|a| Kind::Rate(*a) != held)
    {
        let mut copy = call.after.clone();
        let request = Request {
            algorithm,
            ..*call.request
        };
        let mut created = None;
        let refused = check(copy.as_mut(), &request, true, &mut created).err();
        prop_assert_eq!(created, None);
        prop_assert_eq!(refused, Some(AlgorithmMismatch { stored: held }));
        prop_assert_eq!(&copy, call.after);
    }
    Ok(())
}

/// The stored limiter's own accounting works on any stored state without overflow.
fn stored_accounting(call: &Call) -> Result<(), TestCaseError> {
    if let Some(limiter) = call.after {
        prop_assert!(limiter.expires_at_ms() >= limiter.last_ms);
        let _ = call.outcome.decision.to_array();
        if let State::SlidingLog(log) = &limiter.state {
            prop_assert!(log.len() <= LOG_LIMIT, "log grew to {}", log.len());
            prop_assert!(log.runs().all(|(ts, run)| ts <= limiter.last_ms && run > 0));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// Proves the fixed window's hard bound (and the weighted sliding window's, whose estimate
    /// counts the current window in full): the cost admitted in one aligned window never exceeds L.
    #[test]
    fn windows_never_admit_more_than_the_limit_in_an_aligned_window(s in fixed(WINDOWS)) {
        let params = s.requests[0].params;
        let mut per_window: BTreeMap<u64, u64> = BTreeMap::new();
        for (t_ms, cost) in admissions(&s)? {
            let admitted = per_window.entry(params.window_start(t_ms)).or_default();
            *admitted += cost;
            prop_assert!(*admitted <= params.limit, "{} admitted in the window of {}", admitted, t_ms);
        }
    }

    /// Proves the sliding log is exact: the cost admitted in any interval (x − P, x] of
    /// evaluation times never exceeds L.
    #[test]
    fn sliding_log_never_admits_more_than_the_limit_in_any_period(s in fixed(SLIDING_LOG)) {
        let params = s.requests[0].params;
        let admitted = admissions(&s)?;
        for &(x, _) in &admitted {
            let in_window: u64 = admitted
                .iter()
                .filter(|(t, _)| *t <= x && *t + params.period_ms > x)
                .map(|(_, cost)| cost)
                .sum();
            prop_assert!(in_window <= params.limit, "{} admitted in the period ending at {}", in_window, x);
        }
    }

    /// Proves the token bucket's rate bound: over any [t0, t] of evaluation times the admitted
    /// cost is at most C + (t − t0)·L/P, exactly: admitted·P ≤ C·P + (t − t0)·L.
    #[test]
    fn token_bucket_never_admits_more_than_capacity_plus_refill(s in fixed(TOKEN_BUCKET)) {
        admitted_within_capacity_plus_rate(&s)?;
    }

    /// Proves the leaky bucket never queues more than C, and that its admitted work over any
    /// [t0, t] is at most C + (t − t0)·L/P (what fits in the queue plus what drained).
    #[test]
    fn leaky_bucket_never_queues_more_than_capacity_nor_admits_faster_than_it_drains(
        s in fixed(LEAKY_BUCKET)
    ) {
        walk(&s, |call| {
            if let Some(Limiter { params, state: State::LeakyBucket { level_scaled }, .. }) = call.after {
                prop_assert!(*level_scaled <= params.capacity_scaled(), "queue above capacity");
            }
            Ok(())
        })?;
        admitted_within_capacity_plus_rate(&s)?;
    }

    /// Proves a REFUND of what an admitted CHECK took, at the same time, leaves every PEEK
    /// answering as before the CHECK (for several costs), and the key absent where it was
    /// absent or equivalent to a fresh one; and that a refund gives back no more than was taken.
    #[test]
    fn refund_after_an_admitted_check_answers_as_before_it(s in changing(ALL)) {
        walk(&s, |call| {
            if !call.outcome.consumed {
                return Ok(());
            }
            let request = at(call.request, call.outcome.t_ms);
            let mut after = call.after.clone();
            let (outcome, refunded) = refund(after.as_mut(), &request).expect("same algorithm");
            prop_assert!(refunded != Refunded::Nothing, "an admitted cost gave nothing back");
            if refunded == Refunded::Emptied {
                after = None;
            }
            let limit_field = request.params.capacity.max(request.params.limit);
            for cost in [0, 1, request.cost, limit_field, limit_field + 1] {
                let probe = Request { cost, ..request };
                prop_assert_eq!(
                    peek(&after, &probe),
                    peek(call.before, &probe),
                    "PEEK COST {} after CHECK + REFUND", cost
                );
            }
            prop_assert_eq!(outcome.decision, peek(call.before, &Request { cost: 0, ..request }));
            let was_fresh = peek(call.before, &Request { cost: 0, ..request }).reset_after_ms == 0;
            prop_assert_eq!(after.is_none(), was_fresh, "absent after the refund iff fresh before");
            // A second refund finds nothing more to give than the first left.
            if let Some(mut again) = after.clone() {
                let _ = refund(Some(&mut again), &request).expect("same algorithm");
            }
            Ok(())
        })?;
    }

    /// Proves PEEK equals the CHECK that follows it, on any reachable state (parameters changing
    /// between calls, late arrivals) and for any request, and that PEEK writes nothing.
    #[test]
    fn peek_answers_exactly_what_the_following_check_does(s in changing(ALL)) {
        walk(&s, peek_matches_check)?;
    }

    /// Proves RATELIMIT.TAKE's search on any reachable state: admission is monotone in the cost
    /// (a PEEK that admits a cost admits every smaller one), and `largest_grant(n)` is the
    /// largest cost up to `n` a PEEK admits (it admits the grant and refuses one unit more).
    #[test]
    fn largest_grant_is_the_largest_cost_a_peek_admits(s in changing(ALL)) {
        walk(&s, |call| {
            let admits = |cost: u64| -> Result<bool, AlgorithmMismatch> {
                let mut state = call.before.clone();
                let request = Request { cost, ..*call.request };
                check(state.as_mut(), &request, false, &mut None).map(|(outcome, _)| outcome.decision.allowed)
            };
            let limit = call.outcome.decision.limit;
            let mut admitted = true;
            for cost in 1..=limit.saturating_add(1).min(70) {
                let now = admits(cost).expect("same algorithm");
                prop_assert!(admitted || !now, "cost {cost} admitted after a smaller one was not");
                admitted = now;
            }
            // What a COST 0 PEEK calls `remaining`: the grant, wherever MAX does not cap it.
            let mut state = call.before.clone();
            let asked = Request { cost: 0, ..*call.request };
            let (peeked, _) = check(state.as_mut(), &asked, false, &mut None).expect("same algorithm");
            for max in [1, 2, 3, call.request.cost.max(1), limit, limit + 1, MAX_AMOUNT] {
                let granted = largest_grant(max, admits).expect("same algorithm");
                prop_assert_eq!(granted, max.min(peeked.decision.remaining), "max {}", max);
                prop_assert!(granted <= max);
                prop_assert!(granted == 0 || admits(granted).expect("same algorithm"));
                prop_assert!(
                    granted == max || !admits(granted + 1).expect("same algorithm"),
                    "max {max}: {granted} granted, one more admitted too"
                );
            }
            Ok(())
        })?;
    }

    /// Proves TAKE's `delay_ms` on any reachable state: for a grant of `g` units it is the
    /// `delay_ms` the last of `g` one-unit CHECKs at the same moment gets (a leaky bucket's
    /// place in the queue of the last unit; the CHECK's own `delay_ms`, 0, for the others), so
    /// it is never less than any of those CHECKs' delays.
    #[test]
    fn a_grants_delay_is_the_wait_of_its_last_unit(s in changing(ALL)) {
        walk(&s, |call| {
            let peek = |cost: u64| -> Result<super::Decision, AlgorithmMismatch> {
                let mut state = call.before.clone();
                let request = Request { cost, ..*call.request };
                check(state.as_mut(), &request, false, &mut None).map(|(outcome, _)| outcome.decision)
            };
            let limit = call.outcome.decision.limit;
            for max in [1, 2, 3, limit.min(40), limit.saturating_add(1).min(41)] {
                let granted = largest_grant(max, |cost| peek(cost).map(|d| d.allowed))
                    .expect("same algorithm");
                if granted == 0 {
                    continue;
                }
                let checked = peek(granted).expect("same algorithm").delay_ms;
                let delay = last_unit_delay_ms(call.request.algorithm, granted, peek)
                    .expect("same algorithm")
                    .unwrap_or(checked);
                // The same units as one-unit CHECKs, one after another at the same moment.
                let mut state = call.before.clone();
                let mut last = 0;
                for _ in 0..granted {
                    let request = Request { cost: 1, ..*call.request };
                    let mut created = None;
    let (outcome, write) = check(state.as_mut(), &request, true, &mut created)
                        .expect("same algorithm");
                    prop_assert!(outcome.decision.allowed, "a granted unit refused alone");
                    prop_assert!(outcome.decision.delay_ms <= delay);
                    last = outcome.decision.delay_ms;
                    if let (Write::Created, Some(limiter)) = (write, created.take()) {
                        state = Some(limiter);
                    }
                }
                prop_assert_eq!(delay, last, "max {}, {} granted", max, granted);
            }
            Ok(())
        })?;
    }

    /// Proves that a rejected call and a COST 0 call never change the stored state, and that a
    /// call naming another algorithm is refused without changing it either.
    #[test]
    fn rejected_and_cost_zero_calls_never_change_the_state(s in changing(ALL)) {
        walk(&s, |call| {
            unchanged_unless_consumed(call)?;
            other_algorithm_refused(call)
        })?;
    }

    /// Proves every reply stays in range: `remaining` ≤ the `limit` field (C for buckets, L
    /// otherwise), allowed ⇒ retry_after 0, rejected ⇒ retry_after ≥ 1 or -1, -1 exactly when the
    /// cost exceeds the `limit` field, a delay only for an admitted leaky-bucket call, and t = max(call, last).
    #[test]
    fn replies_stay_within_their_documented_ranges(s in changing(ALL)) {
        walk(&s, reply_within_bounds)?;
    }

    /// Proves an admitted leaky-bucket request's delay is its place in the queue: the time the
    /// work queued ahead of it takes to drain, as a COST 0 PEEK just before it reports it.
    #[test]
    fn leaky_bucket_delay_is_the_time_the_queue_ahead_takes_to_drain(s in changing(LEAKY_BUCKET)) {
        walk(&s, |call| {
            if call.outcome.decision.allowed {
                let ahead = peek(call.before, &Request { cost: 0, ..*call.request });
                prop_assert_eq!(call.outcome.decision.delay_ms, ahead.reset_after_ms);
                prop_assert_eq!(call.outcome.decision.delay_ms, ahead.delay_ms);
            }
            Ok(())
        })?;
    }

    /// Proves retry_after is exact for all six algorithms (fixed parameters): a request rejected
    /// at t with retry_after r > 0 is admitted at t + r and still rejected at t + r − 1.
    #[test]
    fn retry_after_is_exactly_the_wait_until_the_same_request_is_admitted(s in fixed(ALL)) {
        walk(&s, |call| {
            let t = call.outcome.t_ms;
            let retry = call.outcome.decision.retry_after_ms;
            if retry == -1 {
                prop_assert!(call.request.cost > call.outcome.decision.limit, "-1 for a cost that fits");
            }
            if call.outcome.decision.allowed || retry == -1 {
                return Ok(());
            }
            let r = u64::try_from(retry).expect("checked above");
            // The latest time it is still rejected, and the time it is admitted.
            let earlier = peek(call.after, &at(call.request, t + r - 1));
            prop_assert!(!earlier.allowed, "admitted at t + r − 1 = {}", t + r - 1);
            // A wait beyond i64::MAX ms (~3·10^8 years) is reported saturated: only a lower bound.
            if retry < i64::MAX {
                let later = peek(call.after, &at(call.request, t + r));
                prop_assert!(later.allowed, "still rejected at t + r = {}: {:?}", t + r, later);
            }
            Ok(())
        })?;
    }

    /// Proves reset_after is exact: after a consuming call at t with reset_after R (> 0), the key
    /// expires at t + R, and at t + R it answers like an absent key (COST 0 and the same request)
    /// while at t + R − 1 it does not; and any call with the stored parameters reports the
    /// stored key's expiry as t + reset_after (0 once it has passed).
    #[test]
    fn reset_after_is_exactly_the_wait_until_the_key_is_fresh(s in changing(ALL)) {
        walk(&s, |call| {
            let t = call.outcome.t_ms;
            let reset = call.outcome.decision.reset_after_ms;
            let request = call.request;
            let Some(stored) = call.after else {
                prop_assert_eq!(reset, 0, "an absent key is fresh");
                return Ok(());
            };
            if !call.outcome.consumed {
                if stored.params == request.params {
                    let expires = stored.expires_at_ms();
                    prop_assert_eq!(t.saturating_add(reset), expires.max(t),
                        "reply's reset_after disagrees with the key's expiry");
                }
                return Ok(());
            }
            prop_assert!(reset > 0, "a consuming call left a fresh state");
            prop_assert_eq!(stored.expires_at_ms(), t.saturating_add(reset));
            // A reset beyond i64::MAX ms is reported saturated: nothing exact to check.
            let Some(end) = t.checked_add(reset).filter(|_| reset < i64::MAX as u64) else {
                return Ok(());
            };
            let zero = Request { cost: 0, ..*request };
            for probe_request in [at(&zero, end), at(request, end)] {
                prop_assert_eq!(
                    peek(call.after, &probe_request),
                    peek(&None, &probe_request),
                    "not fresh at t + R = {}", end
                );
            }
            let before_end = at(&zero, end - 1);
            prop_assert_ne!(
                peek(call.after, &before_end),
                peek(&None, &before_end),
                "already fresh at t + R − 1 = {}", end - 1
            );
            Ok(())
        })?;
    }

    /// Proves no arithmetic overflows or panics at the largest accepted inputs (limit, burst and
    /// cost up to 10^12, periods up to 3650 days, times up to 2^53 − 1) with arbitrary parameter
    /// changes on one key, while every per-call invariant still holds.
    #[test]
    fn largest_inputs_never_overflow(s in scenario_at(Scale::Huge, ALL, 4)) {
        walk(&s, |call| {
            reply_within_bounds(call)?;
            unchanged_unless_consumed(call)?;
            peek_matches_check(call)?;
            stored_accounting(call)
        })?;
    }
}

/// Checks admitted·P ≤ C·P + (t − t0)·L over every interval of calls of a fixed-params bucket.
fn admitted_within_capacity_plus_rate(s: &Scenario) -> Result<(), TestCaseError> {
    let params = s.requests[0].params;
    let (period, rate) = (u128::from(params.period_ms), u128::from(params.limit));
    let admitted = admissions(s)?;
    for (i, &(t0, _)) in admitted.iter().enumerate() {
        let mut total: u128 = 0;
        for &(t, cost) in &admitted[i..] {
            total += u128::from(cost);
            prop_assert!(
                total * period <= params.capacity_scaled() + u128::from(t - t0) * rate,
                "{} admitted over [{}, {}]",
                total,
                t0,
                t
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Parameter changes (docs/algorithms.md: parameters given on a call win over those stored)
// ---------------------------------------------------------------------------------------------

/// One call of a timeline: `(limit, period, burst, at, cost, expected reply)`.
type Row = (u64, u64, Option<u64>, u64, u64, [i64; 6]);

/// Runs a timeline on one fresh key, each call naming its own parameters, checking every reply.
fn timeline(algorithm: Algorithm, rows: &[Row]) {
    let mut stored: Option<Limiter> = None;
    for (i, &(limit, period_ms, burst, now_ms, cost, expected)) in rows.iter().enumerate() {
        let request = Request {
            algorithm,
            params: Params::new(limit, period_ms, burst).expect("valid params"),
            cost,
            now_ms,
        };
        let reply = commit(&mut stored, &request).decision.to_array();
        assert_eq!(
            reply,
            expected,
            "{} row {i}: {limit} {period_ms} BURST {burst:?} AT {now_ms} COST {cost}",
            algorithm.name()
        );
    }
}

#[test]
fn token_bucket_rescales_tokens_rounding_down_and_clamps_them_to_the_new_capacity() {
    timeline(
        Algorithm::TokenBucket,
        &[
            // 3 per second, emptied at 0.
            (3, 1000, None, 0, 3, [1, 3, 0, 0, 1000, 0]),
            // At 1, 0.003 of a token; re-scaled to 100 ms, ⌊3·100/1000⌋ = 0 scaled units, so a
            // token is 100 units away: ⌈100/3⌉ = 34 ms (33 had it rounded up to 1 unit).
            (3, 100, None, 1, 1, [0, 3, 0, 34, 100, 0]),
            // Rejected, so nothing was stored. At 500, 1.5 tokens, clamped to a capacity of 1:
            // admitting one leaves none, 1000 units (334 ms) from full.
            (3, 1000, Some(1), 500, 1, [1, 1, 0, 0, 334, 0]),
            // The empty bucket carried back to capacity 3 stays empty: no refill at the same t.
            (3, 1000, None, 500, 0, [1, 3, 0, 0, 1000, 0]),
        ],
    );
}

#[test]
fn leaky_bucket_rescales_the_queue_rounding_up_and_clamps_it_to_the_new_capacity() {
    timeline(
        Algorithm::LeakyBucket,
        &[
            (3, 1000, None, 0, 1, [1, 3, 2, 0, 334, 0]),
            // At 1, 997 units queued; re-scaled to 10 ms, ⌈997·10/1000⌉ = 10 units, which drain
            // in ⌈10/3⌉ = 4 ms (3 had it rounded down to 9).
            (3, 10, None, 1, 0, [1, 3, 2, 0, 4, 4]),
            // COST 0 stored nothing: 997 units, plus 2 requests, under the original parameters.
            (3, 1000, None, 1, 2, [1, 3, 0, 0, 999, 333]),
            // 2997 units clamped to a queue of 1 request (1000 units).
            (3, 1000, Some(1), 1, 0, [1, 1, 0, 0, 334, 334]),
            (3, 1000, Some(1), 1, 1, [0, 1, 0, 334, 334, 0]),
            (3, 1000, None, 1, 0, [1, 3, 0, 0, 999, 999]),
        ],
    );
}

#[test]
fn fixed_window_keeps_its_count_for_the_same_period_and_starts_afresh_for_a_new_one() {
    timeline(
        Algorithm::FixedWindow,
        &[
            (5, 1000, None, 100, 3, [1, 5, 2, 0, 900, 0]),
            // Same period, lower limit: the count of 3 is kept.
            (4, 1000, None, 200, 1, [1, 4, 0, 0, 800, 0]),
            (4, 1000, None, 300, 1, [0, 4, 0, 700, 700, 0]),
            // A limit below the count: remaining is 0, never negative, and even COST 0 does not fit.
            (2, 1000, None, 300, 0, [0, 2, 0, 700, 700, 0]),
            // A new period starts afresh, in its own aligned window [0, 500).
            (4, 500, None, 300, 4, [1, 4, 0, 0, 200, 0]),
            (4, 500, None, 499, 1, [0, 4, 0, 1, 1, 0]),
        ],
    );
}

#[test]
fn sliding_window_keeps_its_counts_for_the_same_period_and_starts_afresh_for_a_new_one() {
    timeline(
        Algorithm::SlidingWindow,
        &[
            (4, 1000, None, 500, 3, [1, 4, 1, 0, 1500, 0]),
            // In the next window the 3 weigh 3·750/1000.
            (4, 1000, None, 1250, 0, [1, 4, 1, 0, 750, 0]),
            // Same period, higher limit: counts kept, 2250 + 5000 ≤ 8000.
            (8, 1000, None, 1250, 5, [1, 8, 0, 0, 1750, 0]),
            // A new period starts afresh: 8 fit at once.
            (8, 500, None, 1250, 8, [1, 8, 0, 0, 750, 0]),
        ],
    );
}

#[test]
fn sliding_log_keeps_its_entries_across_parameter_changes() {
    timeline(
        Algorithm::SlidingLog,
        &[
            (3, 1000, None, 0, 2, [1, 3, 1, 0, 1000, 0]),
            (3, 1000, None, 600, 1, [1, 3, 0, 0, 1000, 0]),
            // A longer period keeps all three entries: full until the one at 0 leaves at 2000.
            (3, 2000, None, 900, 1, [0, 3, 0, 1100, 1700, 0]),
            // Entries gone under the stored period stay gone: at 1100 the two at 0 have left.
            (3, 2000, None, 1100, 1, [1, 3, 1, 0, 2000, 0]),
            // A shorter period counts only the entries inside it: 1100, not 600.
            (3, 500, None, 1200, 0, [1, 3, 2, 0, 400, 0]),
            // A lower limit: both entries count; the 2nd oldest (1100) must leave.
            (1, 2000, None, 1200, 1, [0, 1, 0, 1900, 1900, 0]),
        ],
    );
}
