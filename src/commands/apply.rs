//! `RATELIMIT.APPLY key payload [key payload ...]`: replays limiter writes with their explicit
//! time, up to [`MAX_PAIRS`] keys at once, all or nothing.
//!
//! CHECK sends this to replicas and the AOF instead of itself, so a replica, an AOF replay or a
//! rewrite reproduces the master's state exactly whatever its own clock says. The payload is a
//! [`Change`]: a whole limiter, or a sliding log's appended entries.
//! Not meant to be called by applications.
//!
//! A command writes it under its short name, [`SHORT`] (`rla`): Redis looks the name up on every
//! replicated write, and a short name is cheaper to find. Both names run the same handler, so old
//! AOF files and older masters' streams (`ratelimit.apply`) keep loading. AOF rewrites use the
//! long name, the store's [`APPLY_COMMAND`]: the format is the store's, this command reads it.

use std::ffi::c_int;

use redis_module::raw;
use redis_ratelimit_core::algorithms::concurrency::{self, Acquire, Released};
use redis_ratelimit_core::algorithms::{sliding_log, Algorithm, Kind, Limiter, Refunded, Write};
use redis_ratelimit_core::codec::Change;
use redis_ratelimit_core::error::{self, ArgError};
use redis_ratelimit_core::value::LimiterRef;

use super::call::{handler, Call};
use super::registry::{Arg, ArgType, Command, Keys, KEY_OVERWRITTEN};
use super::txn::refused;
use super::txn::Txn;
use crate::config::{max_leases, max_log_limit, MAX_MAX_LEASES, MAX_MAX_LOG_LIMIT};
use crate::log::log_warning;
use crate::store::{Slot, APPLY_COMMAND, APPLY_SHORT_NAME};

const PAIR: [Arg; 2] = [
    Arg::new(c"key", ArgType::Key),
    Arg::new(c"payload", ArgType::String),
];

const ARGS: [Arg; 1] = [Arg::block(c"pair", &PAIR).multiple()];

pub(crate) const COMMAND: Command = Command {
    name: APPLY_COMMAND,
    flags: c"write deny-oom",
    arity: -3,
    keys: Keys::Pairs {
        flags: KEY_OVERWRITTEN,
    },
    summary: c"Replays a limiter write (replication and AOF); not for applications",
    complexity: c"O(1); sliding-log: O(appended entries)",
    args: &ARGS,
    acl: "write slow dangerous ratelimit",
    counted: false,
    handler: handler!(run),
};

/// `RATELIMIT.APPLY` under its short name: the same arguments, flags, keys and ACL categories.
/// Not in `@ratelimit`, the category applications are granted: only a master and AOF loading send
/// it, and neither goes through ACL, so `+@ratelimit -ratelimit.apply` keeps both names away.
pub(crate) const SHORT: Command = Command {
    name: APPLY_SHORT_NAME,
    summary: c"RATELIMIT.APPLY's short name, used in the replication stream and the AOF",
    acl: "write slow dangerous",
    counted: false,
    ..COMMAND
};

/// The most key-payload pairs one `ratelimit.apply` carries (a CHECKALL of more keys replicates
/// several, of at most this many each).
pub(crate) const MAX_PAIRS: usize = 8;

fn run(call: &Call) -> c_int {
    let argc = call.argc();
    if argc == 3 {
        return run_one(call);
    }
    if argc < 3 || argc % 2 == 0 {
        return call.error(&ArgError::WrongArity.message("ratelimit.apply", &[]));
    }
    run_pairs(call, (argc - 1) / 2)
}

/// `ratelimit.apply key payload`: one write.
fn run_one(call: &Call) -> c_int {
    let Ok(change) = Change::decode(call.bytes(2)) else {
        return call.error(error::STATE);
    };
    let mut txn = Txn::open(call, call.raw_arg(1), true);
    if let Err(message) = apply(call, &mut txn, change) {
        return call.error(&message);
    }
    txn.replicate_verbatim();
    txn.commit();
    call.reply_name(c"OK");
    raw::REDISMODULE_OK as c_int
}

/// `ratelimit.apply key payload [key payload ...]`: several writes, all or nothing. Every pair
/// is decoded and checked, on a copy of its key's limiter, before any is written; the keys are
/// distinct (a master sends one pair per key).
fn run_pairs(call: &Call, pairs: usize) -> c_int {
    if pairs > MAX_PAIRS {
        return call.error(&format!(
            "ERR ratelimit.apply takes at most {MAX_PAIRS} key-payload pairs"
        ));
    }
    let mut changes = Vec::with_capacity(pairs);
    for i in 0..pairs {
        let Ok(change) = Change::decode(call.bytes(2 + 2 * i)) else {
            return call.error(error::STATE);
        };
        changes.push(change);
    }
    for i in 1..pairs {
        let name = call.bytes(1 + 2 * i);
        if (0..i).any(|j| call.bytes(1 + 2 * j) == name) {
            return call.error("ERR ratelimit.apply names a key twice");
        }
    }
    let mut txns: Vec<Txn> = (0..pairs)
        .map(|i| Txn::open(call, call.raw_arg(1 + 2 * i), true))
        .collect();
    for (txn, change) in txns.iter_mut().zip(&changes) {
        let mut copy = match txn.slot() {
            Slot::WrongType => return call.error(error::WRONG_TYPE),
            Slot::Empty => None,
            Slot::Limiter(limiter) => Some(Limiter::clone(&limiter)),
        };
        if let Err(message) = decide(call, copy.as_mut(), change.clone()) {
            return call.error(&message);
        }
    }
    for (txn, change) in txns.iter_mut().zip(changes) {
        if let Err(message) = apply(call, txn, change) {
            // Not seen: every pair was checked on the same state just above.
            log_warning("ratelimit: a checked ratelimit.apply pair failed; later pairs skipped");
            return call.error(&message);
        }
    }
    txns[0].replicate_verbatim();
    Txn::commit_all(&mut txns);
    call.reply_name(c"OK");
    raw::REDISMODULE_OK as c_int
}

/// What writing a change does to its key, once [`decide`] has applied it to the limiter.
enum Outcome {
    /// A new limiter replaces the key's value, expiring at this time.
    Create(Limiter, u64),
    /// The limiter changed in place is stored (if the key held one), expiring at this time.
    Store(u64),
    /// The key is deleted.
    Delete,
}

/// Stores `change` in the transaction's key and stages its expiry (or deletion). The error is
/// the reply (a change no admitted call could have made, or a wrong type); nothing is stored
/// then.
fn apply(call: &Call, txn: &mut Txn, change: Change) -> Result<(), String> {
    let mut stored = match txn.slot() {
        Slot::WrongType => return Err(error::WRONG_TYPE.to_string()),
        Slot::Empty => None,
        Slot::Limiter(limiter) => Some(limiter),
    };
    match decide(call, stored.as_deref_mut(), change)? {
        Outcome::Create(limiter, expires_at_ms) => {
            drop(stored);
            txn.create(limiter).map_err(refused)?;
            txn.expire_at(expires_at_ms);
        }
        Outcome::Store(expires_at_ms) => {
            store(stored)?;
            txn.expire_at(expires_at_ms);
        }
        Outcome::Delete => {
            drop(stored);
            txn.delete();
        }
    }
    Ok(())
}

/// Applies `change` to the limiter the key holds (`None`: none), and says what to write. The
/// error is the reply: a change no admitted call could have made.
fn decide(
    call: &Call,
    mut stored: Option<&mut Limiter>,
    change: Change,
) -> Result<Outcome, String> {
    let state = || error::STATE.to_string();
    Ok(match change {
        Change::Replace(limiter) => {
            let expires_at_ms = limiter.expires_at_ms();
            Outcome::Create(limiter, expires_at_ms)
        }
        Change::LogAppend { params, t_ms, cost } => {
            // Only what an admitted call could have written: a log within its limit after the
            // append (so a payload cannot allocate without bound, and nothing is stored that RDB
            // loading would refuse), of this server's bounds when a client sends it. The master's
            // stream and an AOF replay were admitted under the master's (or an earlier) setting:
            // they are held to the hard cap only, so a lower local setting cannot make a replica
            // or a restarted server drop the master's writes.
            let bound = if call.replayed() {
                MAX_MAX_LOG_LIMIT as u64
            } else {
                max_log_limit()
            };
            let fits = params.limit <= bound
                && match &stored {
                    Some(limiter) if limiter.kind() != Kind::Rate(Algorithm::SlidingLog) => false,
                    other => sliding_log::append_fits(other.as_deref(), &params, t_ms, cost),
                };
            if !fits {
                return Err(state());
            }
            let mut created = None;
            match sliding_log::append(stored.as_deref_mut(), &params, t_ms, cost, &mut created) {
                Write::Created => {
                    Outcome::Create(created.ok_or_else(state)?, t_ms + params.period_ms)
                }
                _ => Outcome::Store(t_ms + params.period_ms),
            }
        }
        Change::LogRefund { t_ms, cost } => {
            // Only onto a log last written at or before the refund, as the master's was.
            let Some(handle) = stored.filter(|limiter| {
                limiter.kind() == Kind::Rate(Algorithm::SlidingLog) && limiter.last_ms <= t_ms
            }) else {
                return Err(state());
            };
            match sliding_log::refund(handle, cost, t_ms) {
                Refunded::Updated => Outcome::Store(handle.expires_at_ms()),
                Refunded::Emptied => Outcome::Delete,
                Refunded::Nothing => return Err(state()),
            }
        }
        Change::Block { until_ms } => {
            // Only onto a limiter the block starts after, as the master's did (never a lease
            // set: ACQUIRE has no BLOCK, and a blocked lease set could not be stored).
            let Some(handle) = stored
                .filter(|limiter| limiter.last_ms < until_ms && limiter.kind() != Kind::Leases)
            else {
                return Err(state());
            };
            handle.blocked_until_ms = until_ms;
            Outcome::Store(handle.expires_at_ms())
        }
        Change::LeaseAcquire {
            params,
            t_ms,
            cost,
            id,
        } => {
            // Only what an admitted ACQUIRE could have written: onto nothing or a lease set
            // last written at or before it, within its limit and the leases bound (this
            // server's for a client, the hard cap for the master's stream and an AOF replay, as
            // for the sliding log above).
            if stored
                .as_deref()
                .is_some_and(|l| l.kind() != Kind::Leases || l.last_ms > t_ms)
            {
                return Err(state());
            }
            let bound = if call.replayed() {
                MAX_MAX_LEASES as u64
            } else {
                max_leases()
            };
            let request = Acquire {
                params,
                id: &id,
                cost,
                now_ms: t_ms,
            };
            let mut created = None;
            let (acquired, write) = match concurrency::acquire(
                stored.as_deref_mut(),
                &request,
                bound,
                true,
                &mut created,
            ) {
                Ok(result) if result.0.decision.allowed => result,
                _ => return Err(state()),
            };
            match (write, created) {
                (Write::Created, Some(limiter)) => {
                    let expires_at_ms = limiter.expires_at_ms();
                    Outcome::Create(limiter, expires_at_ms)
                }
                _ => {
                    let expires_at_ms = stored.as_deref().map(Limiter::expires_at_ms);
                    Outcome::Store(expires_at_ms.unwrap_or(acquired.expiry_ms))
                }
            }
        }
        Change::LeaseRelease { t_ms, id } => {
            // Only the release of a live lease, on a lease set last written at or before it.
            let Some(handle) =
                stored.filter(|limiter| limiter.kind() == Kind::Leases && limiter.last_ms <= t_ms)
            else {
                return Err(state());
            };
            match concurrency::release(handle, &id, t_ms) {
                Ok((_, Released::Updated)) => Outcome::Store(handle.expires_at_ms()),
                Ok((_, Released::Emptied)) => Outcome::Delete,
                _ => return Err(state()),
            }
        }
    })
}

/// Stores a limiter changed through `handle`, if the key held one.
fn store(handle: Option<LimiterRef>) -> Result<(), String> {
    match handle {
        Some(mut handle) => handle.store().map(drop).map_err(refused),
        None => Ok(()),
    }
}
