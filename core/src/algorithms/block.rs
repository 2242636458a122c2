//! Penalty blocks (`BLOCK duration`): a key whose limit rejects a consuming call is blocked for
//! `duration`, and every call on it is rejected until the block ends.
//!
//! - A consuming call (cost ≥ 1) that the algorithm rejects at `t`, with `BLOCK d` given, blocks
//!   the key until `t + d`. That rejection writes the block (nothing else of the stored state
//!   changes). A cost above the limit (`retry_after_ms` -1) is the caller's mistake: no block.
//! - While blocked (`t < blocked_until`), every call is rejected and changes nothing, whatever
//!   its parameters or its own `BLOCK` (a block stands until it ends, and is not extended):
//!   `allowed` 0, `remaining` 0, `retry_after_ms` the larger of the time left in the block and
//!   what the algorithm alone would need (-1 if it never can pass), `reset_after_ms` at least
//!   the time left, `delay_ms` 0. The algorithm's own state keeps refilling or sliding meanwhile,
//!   so when the block ends the key answers as its algorithm would then.
//! - The first consuming call after the block clears it.

use super::{check, AlgorithmMismatch, Decision, Limiter, Outcome, Request, Write};

/// What a block did to a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blocking {
    /// The key was not blocked, and the call started no block.
    None,
    /// The key was blocked: the call was rejected for it, and changed nothing.
    Blocked,
    /// The call was rejected and started a block until this time (the write to store).
    Started(u64),
}

/// The answer of a call on a key blocked until `until_ms`, at `t_ms`, given what the algorithm
/// alone answers.
pub fn blocked_answer(own: &Decision, until_ms: u64, t_ms: u64) -> Decision {
    let left = until_ms.saturating_sub(t_ms);
    Decision {
        allowed: false,
        limit: own.limit,
        remaining: 0,
        retry_after_ms: if own.retry_after_ms < 0 {
            -1
        } else {
            own.retry_after_ms
                .max(i64::try_from(left).unwrap_or(i64::MAX))
        },
        reset_after_ms: own.reset_after_ms.max(left),
        delay_ms: 0,
    }
}

/// [`check`] with the key's block and the call's `BLOCK` (`block_ms`: its duration, `None`
/// without one). A block started by a committing call is stored in `stored` (then
/// [`Write::Updated`]); a limiter the call created is in `created`, as [`check`] leaves it.
/// Inlined: every CHECK's path, where the caller's match on the result then needs no copy of it
/// (`make profile`).
#[inline(always)]
pub fn check_blocking(
    stored: Option<&mut Limiter>,
    request: &Request,
    commit: bool,
    block_ms: Option<u64>,
    created: &mut Option<Limiter>,
) -> Result<(Outcome, Write, Blocking), AlgorithmMismatch> {
    if let Some(limiter) = stored.as_deref() {
        let t_ms = request.now_ms.max(limiter.last_ms);
        if limiter.blocked_at(t_ms) {
            let until_ms = limiter.blocked_until_ms;
            let mut copy = limiter.clone();
            // A PEEK on a copy: it writes nothing, `created` included.
            let (own, _) = check(Some(&mut copy), request, false, created)?;
            let decision = blocked_answer(&own.decision, until_ms, t_ms);
            let outcome = Outcome::new(decision, t_ms, request.cost);
            return Ok((outcome, Write::Nothing, Blocking::Blocked));
        }
    }
    let mut stored = stored;
    let (outcome, written) = check(stored.as_deref_mut(), request, commit, created)?;
    let starts = commit
        && request.cost > 0
        && !outcome.decision.allowed
        && outcome.decision.retry_after_ms >= 0;
    match (block_ms, stored) {
        (Some(block_ms), Some(limiter)) if starts => {
            let until_ms = outcome.t_ms.saturating_add(block_ms);
            limiter.blocked_until_ms = until_ms;
            let decision = blocked_answer(&outcome.decision, until_ms, outcome.t_ms);
            let outcome = Outcome {
                decision,
                ..outcome
            };
            Ok((outcome, Write::Updated, Blocking::Started(until_ms)))
        }
        _ => Ok((outcome, written, Blocking::None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::{Algorithm, Params};

    fn request(cost: u64, now_ms: u64) -> Request {
        Request {
            algorithm: Algorithm::FixedWindow,
            params: Params::new(2, 1_000, None).unwrap(),
            cost,
            now_ms,
        }
    }

    /// One call on `stored`, storing what it creates.
    fn call(
        stored: &mut Option<Limiter>,
        cost: u64,
        at: u64,
        block: Option<u64>,
    ) -> (Decision, Blocking) {
        let mut created = None;
        let (outcome, _, blocking) = check_blocking(
            stored.as_mut(),
            &request(cost, at),
            true,
            block,
            &mut created,
        )
        .unwrap();
        if let Some(limiter) = created {
            *stored = Some(limiter);
        }
        (outcome.decision, blocking)
    }

    #[test]
    fn a_rejection_blocks_the_key_until_the_block_ends() {
        let mut stored = None;
        let block = Some(5_000);
        assert!(call(&mut stored, 2, 100, block).0.allowed);
        // Rejected at 200: blocked until 5200; the answer waits for the block.
        let (rejected, blocking) = call(&mut stored, 1, 200, block);
        assert_eq!(blocking, Blocking::Started(5_200));
        assert_eq!(
            rejected,
            Decision {
                allowed: false,
                limit: 2,
                remaining: 0,
                retry_after_ms: 5_000,
                reset_after_ms: 5_000,
                delay_ms: 0,
            }
        );
        let held = stored.clone();
        // During the block: rejected, nothing changes, the block is not extended, whatever
        // the call asks (COST 0 included).
        for (cost, at) in [(1, 1_500), (0, 3_000), (2, 5_199)] {
            let (answer, blocking) = call(&mut stored, cost, at, Some(60_000));
            assert_eq!(blocking, Blocking::Blocked);
            assert!(!answer.allowed);
            assert_eq!(answer.remaining, 0);
            assert_eq!(answer.retry_after_ms, 5_200 - at as i64);
            assert_eq!(stored, held);
        }
        // A cost the limit can never admit says so, block or not.
        assert_eq!(call(&mut stored, 3, 4_000, None).0.retry_after_ms, -1);
        // At its end the window has moved on: admitted, and the block is cleared.
        let (answer, blocking) = call(&mut stored, 1, 5_200, block);
        assert!(answer.allowed);
        assert_eq!(blocking, Blocking::None);
        assert_eq!(stored.unwrap().blocked_until_ms, 0);
    }

    #[test]
    fn no_block_for_a_cost_that_never_fits_nor_without_block_nor_for_peek() {
        let mut stored = None;
        call(&mut stored, 2, 100, None);
        assert_eq!(call(&mut stored, 3, 200, Some(5_000)).1, Blocking::None);
        assert_eq!(call(&mut stored, 1, 200, None).1, Blocking::None);
        let mut created = None;
        let (outcome, write, blocking) = check_blocking(
            stored.as_mut(),
            &request(1, 200),
            false,
            Some(5_000),
            &mut created,
        )
        .unwrap();
        assert!(!outcome.decision.allowed);
        assert_eq!((write, created), (Write::Nothing, None));
        assert_eq!(blocking, Blocking::None);
        assert_eq!(stored.unwrap().blocked_until_ms, 0);
    }
}
