use super::*;

/// One step of a timeline: a call `AT at` with `COST cost`, and the reply it must get
/// (`retry`/`reset`: `retry_after_ms`/`reset_after_ms`; its `limit` is the table's: the
/// capacity for buckets, the limit otherwise).
#[derive(Clone, Copy, Debug)]
pub struct Step {
    pub at: u64,
    pub cost: u64,
    pub allowed: bool,
    pub remaining: u64,
    pub retry_after: i64,
    pub reset_after: u64,
    pub delay: u64,
}

/// A [`Step`] that reads as a timeline row:
/// `step!(at 400, cost 2 => rejected, remaining 1, retry 267, reset 600)`,
/// with `, delay N` where it is not 0.
macro_rules! step {
    (at $at:expr, cost $cost:expr => $verdict:ident, remaining $remaining:expr,
     retry $retry:expr, reset $reset:expr $(, delay $delay:expr)?) => {
        $crate::algorithms::testing::Step {
            at: $at,
            cost: $cost,
            allowed: step!(@$verdict),
            remaining: $remaining,
            retry_after: $retry,
            reset_after: $reset,
            delay: 0 $(+ $delay)?,
        }
    };
    (@allowed) => { true };
    (@rejected) => { false };
}
pub(crate) use step;

/// Runs a timeline on one fresh key and checks every reply.
pub fn run_table(
    algorithm: Algorithm,
    limit: u64,
    period_ms: u64,
    burst: Option<u64>,
    steps: &[Step],
) {
    let params = Params::new(limit, period_ms, burst).expect("valid params");
    let mut stored: Option<Limiter> = None;
    for (i, step) in steps.iter().enumerate() {
        let request = Request {
            algorithm,
            params,
            cost: step.cost,
            now_ms: step.at,
        };
        let reply = apply(&mut stored, &request);
        let expected = Decision {
            allowed: step.allowed,
            limit: params.capacity,
            remaining: step.remaining,
            retry_after_ms: step.retry_after,
            reset_after_ms: step.reset_after,
            delay_ms: step.delay,
        };
        assert_eq!(reply, expected, "{} step {i}: {step:?}", algorithm.name());
    }
}

/// One committing call on an `Option<Limiter>` slot, storing what is created.
pub fn apply(stored: &mut Option<Limiter>, request: &Request) -> Decision {
    let mut created = None;
    let (outcome, _) = check(stored.as_mut(), request, true, &mut created).expect("same algorithm");
    if let Some(limiter) = created {
        *stored = Some(limiter);
    }
    outcome.decision
}

/// The states one key goes through: a committing call per `(gap, cost)`, the time moving on
/// by `gap` from `start_ms` and the cost capped at the limit; the stored limiter after each
/// call that left one.
pub fn states(
    algorithm: Algorithm,
    params: Params,
    start_ms: u64,
    calls: &[(u64, u64)],
) -> Vec<Limiter> {
    let mut stored: Option<Limiter> = None;
    let mut now_ms = start_ms;
    let mut states = Vec::new();
    for &(gap, cost) in calls {
        now_ms += gap;
        let request = Request {
            algorithm,
            params,
            cost: cost.min(params.limit),
            now_ms,
        };
        apply(&mut stored, &request);
        states.extend(stored.clone());
    }
    states
}

/// A non-committing call (PEEK).
pub fn peek(stored: &Option<Limiter>, request: &Request) -> Decision {
    let mut copy = stored.clone();
    let mut created = None;
    let (outcome, write) =
        check(copy.as_mut(), request, false, &mut created).expect("same algorithm");
    assert_eq!((write, created), (Write::Nothing, None));
    assert_eq!(&copy, stored, "peek must not change the state");
    outcome.decision
}
