//! The write decision on one key: [`evaluate`] decides a request on the limiter a [`Txn`] opened
//! and picks what the key stores (the limiter changed in place, a new one, or the same one in a
//! smaller form once a block is over) and what replicates the write (`ratelimit.apply`'s
//! payload: a block's end, a log's append, a packed bucket or window, a whole limiter);
//! [`decide`] is a whole CHECK-shaped call on its key: evaluate, count, notify, commit.

use std::sync::Arc;

use redis_ratelimit_core::algorithms::block::{self, Blocking};
use redis_ratelimit_core::algorithms::{Algorithm, Decision, Limiter, Outcome, Request, Write};
use redis_ratelimit_core::codec::{encode_packed, encode_write, Change};
use redis_ratelimit_core::error;
use redis_ratelimit_core::policy::{Counters, Mode};
use redis_ratelimit_core::value;

use super::call::Call;
use super::txn::{refused, Event, Txn};
use crate::store::Slot;

/// What [`evaluate`] decided on a key.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Evaluation {
    /// The decision, at its time.
    pub outcome: Outcome,
    /// What a block did to the call: decided it, started, or nothing.
    pub blocking: Blocking,
}

/// Decides `request` on the transaction's key and, with `commit`, stores the result: the state
/// (through [`LimiterRef::store`](redis_ratelimit_core::value::LimiterRef::store) or [`Txn::create`]),
/// and stages its expiry and the write to replicate (`ratelimit.apply`'s payload, encoded from
/// the limiter in hand). The error is the reply to send (WRONGTYPE, another algorithm, a
/// refused value); nothing is stored then.
#[inline(always)]
pub(crate) fn evaluate(
    txn: &mut Txn,
    request: &Request,
    commit: bool,
    block_ms: Option<u64>,
) -> Result<Evaluation, String> {
    // A limiter the call creates is written here, in place, by the core; what else the key needs
    // once the slot is closed (whether to store that limiter, the expiry, and what replicates
    // the write) is small. The slot lives in this block and is dropped where it is at its end
    // (moving it out to drop it, or the handle out of it, would copy the limiter).
    let mut created: Option<Limiter> = None;
    let (outcome, blocking, create, expires_at_ms, replicated) = {
        let mut slot = txn.slot();
        let mut stored = match &mut slot {
            Slot::Empty => None,
            Slot::Limiter(limiter) => Some(limiter),
            Slot::WrongType => return Err(error::WRONG_TYPE.to_string()),
        };
        // A block keeps the limiter in the boxed form: once a consuming call has cleared it,
        // the key goes back to the smallest form it fits.
        let was_blocked = stored
            .as_deref()
            .is_some_and(|limiter| limiter.blocked_until_ms != 0);
        let (outcome, written, blocking) = block::check_blocking(
            stored.as_deref_mut().map(|l| &mut **l),
            request,
            commit,
            block_ms,
            &mut created,
        )
        .map_err(|mismatch| {
            error::algorithm_mismatch(mismatch.stored.name(), request.algorithm.name())
        })?;
        // Saturating: a bucket refilling over more than u64 ms must not wrap into the past.
        let expires_at_ms = outcome.t_ms.saturating_add(outcome.decision.reset_after_ms);
        match written {
            Write::Nothing => return Ok(Evaluation { outcome, blocking }),
            Write::Created => {
                let Some(limiter) = created.as_ref() else {
                    return Ok(Evaluation { outcome, blocking });
                };
                let replicated = match blocking {
                    Blocking::Started(until_ms) => Replicated::Block(until_ms),
                    // A log replicates what it appended, not its whole state.
                    _ if request.algorithm == Algorithm::SlidingLog => Replicated::LogAppend,
                    _ => match value::pack(limiter) {
                        Some(words) => Replicated::Packed(words),
                        None => Replicated::Whole(Box::new(limiter.clone())),
                    },
                };
                (outcome, blocking, Create::New, expires_at_ms, replicated)
            }
            Write::Updated => {
                let Some(handle) = stored.as_mut() else {
                    return Ok(Evaluation { outcome, blocking });
                };
                let packed = handle.store().map_err(refused)?;
                match blocking {
                    // A block started: only its end changed. The key lives until the stored
                    // state (under its own parameters, not the call's) is fresh and the block
                    // has ended.
                    Blocking::Started(until_ms) => (
                        outcome,
                        blocking,
                        Create::Nothing,
                        handle.expires_at_ms(),
                        Replicated::Block(until_ms),
                    ),
                    _ => {
                        let replicated = match packed {
                            _ if request.algorithm == Algorithm::SlidingLog => {
                                Replicated::LogAppend
                            }
                            // An updated bucket or window: packed once, to store and to
                            // replicate.
                            Some(words) => Replicated::Packed(words),
                            None => Replicated::Whole(Box::new(Limiter::clone(handle))),
                        };
                        // The same limiter, stored anew in the form it now fits.
                        let create = if was_blocked
                            && handle.blocked_until_ms == 0
                            && request.algorithm != Algorithm::SlidingLog
                        {
                            created = Some(Limiter::clone(handle));
                            Create::Unblocked
                        } else {
                            Create::Nothing
                        };
                        (outcome, blocking, create, expires_at_ms, replicated)
                    }
                }
            }
        }
    };
    match (create, created) {
        (Create::New, Some(limiter)) => txn.create(limiter).map_err(refused)?,
        // If Redis refused the value, the boxed one it holds is the same state.
        (Create::Unblocked, Some(limiter)) => txn.create(limiter).unwrap_or(()),
        _ => {}
    }
    txn.expire_at(expires_at_ms);
    let payload = txn.replicate();
    match replicated {
        Replicated::Block(until_ms) => Change::Block { until_ms }.encode(payload),
        Replicated::LogAppend => Change::LogAppend {
            params: request.params,
            t_ms: outcome.t_ms,
            cost: request.cost,
        }
        .encode(payload),
        Replicated::Packed(words) => encode_packed(&words, payload),
        Replicated::Whole(limiter) => encode_write(&limiter, payload),
    }
    Ok(Evaluation { outcome, blocking })
}

/// Which limiter [`evaluate`] stores in the key whole (the one in its `created`).
#[derive(Clone, Copy)]
enum Create {
    /// None: the key's value was changed where it is, if at all.
    Nothing,
    /// A new one: the key held none (or one equivalent to a fresh one).
    New,
    /// The same limiter, a block over: in the form it now fits.
    Unblocked,
}

/// How [`evaluate`] replicates a write: `ratelimit.apply`'s payload, encoded from what the call
/// stored.
enum Replicated {
    /// A block started: only its end changed.
    Block(u64),
    /// A sliding log's append (the request's parameters and cost at the outcome's time).
    LogAppend,
    /// A bucket's or window's packed form.
    Packed([u64; 4]),
    /// A limiter that does not pack (rare: a boxed one a block no longer holds).
    Whole(Box<Limiter>),
}

/// Decides `request` on the call's key (argument 1), as CHECK, PEEK, TAKE and the dialects do,
/// through a [`Txn`]: evaluates it, then, for a committing call, counts the answer (`through`:
/// the policy the call went through, whose counters count it too) and raises
/// `ratelimit.rejected` (or, for a rejection shadow `mode` admits, `ratelimit.shadow-rejected`;
/// `shadow_short`: shadow mode admitted more than enforcement would have, TAKE's short grant),
/// and commits. Answers the decision as `mode` answers it. The error is the reply to send;
/// nothing is written then.
/// Inlined: it is every CHECK's whole path, and a call of its own is measurably dearer
/// (`make profile`).
#[inline(always)]
pub(crate) fn decide(
    call: &Call,
    request: &Request,
    commit: bool,
    mode: Mode,
    block_ms: Option<u64>,
    through: Option<&Arc<Counters>>,
    shadow_short: bool,
) -> Result<Decision, String> {
    let mut txn = Txn::open(call, call.raw_arg(1), commit);
    let evaluation = evaluate(&mut txn, request, commit, block_ms)?;
    let (answer, shadowed) =
        redis_ratelimit_core::policy::answer(evaluation.outcome.decision, mode);
    if commit {
        let blocked = evaluation.blocking == Blocking::Blocked;
        let shadowed = shadowed || shadow_short;
        txn.count(
            request.algorithm.into(),
            answer.allowed,
            blocked,
            through.map(|counters| (&**counters, shadowed)),
        );
        if shadowed {
            txn.notify(Event::ShadowRejected);
        } else if !answer.allowed {
            txn.notify(Event::Rejected);
        }
        if let Blocking::Started(_) = evaluation.blocking {
            txn.notify(Event::Blocked);
        }
    }
    txn.commit();
    Ok(answer)
}
