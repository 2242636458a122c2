//! `RATELIMIT.ACQUIRE key limit lease-duration ID lease-id [COST n] [AT unix-ms]`
//! `RATELIMIT.ACQUIRE key POLICY name ID lease-id [COST n] [AT unix-ms]`
//! `RATELIMIT.RELEASE key ID lease-id [AT unix-ms]`
//!
//! Concurrency limits: at most `limit` cost in flight at once on a key, each request holding a
//! lease under its id until it releases it or the lease expires (`algorithms::concurrency`).
//! ACQUIRE answers the six fields of a decision; RELEASE answers 1 if the id held a live lease
//! (now gone), else 0.
//!
//! Writes replicate as effects with their time (`Change::LeaseAcquire`, `Change::LeaseRelease`,
//! applied by `ratelimit.apply`), never as the command, so a replica or an AOF replay drops the
//! expired leases by the master's time. A rejected ACQUIRE and a RELEASE of no live lease change
//! nothing: no write, no replication, no keyspace signal.
//!
//! Through a policy in shadow mode, an ACQUIRE its limit rejects is answered as admitted (as a
//! CHECK would be) but stores nothing: the key holds what enforcement would hold, and the
//! RELEASE of that id answers 0.

use std::ffi::c_int;

use redis_module::raw;
use redis_ratelimit_core::algorithms::concurrency::{self, Acquire, AcquireError, Released};
use redis_ratelimit_core::algorithms::{Kind, Write};
use redis_ratelimit_core::codec::{encode_lease_acquire, encode_lease_release};
use redis_ratelimit_core::error::{self, ArgError};
use redis_ratelimit_core::parse::{parse_acquire, parse_release, LEASE_ID_MAX};
use redis_ratelimit_core::policy::Mode;

use super::call::{handler, now_ms, Call};
use super::policy::resolve_lease;
use super::registry::{Arg, ArgType, Command, Keys, KEY_UPDATED};
use super::txn::refused;
use super::txn::{Event, Txn};
use crate::config::{max_leases, MAX_MAX_LEASES};
use crate::store::Slot;

// The config's upper bound is what stored and replicated states are held to.
const _: () = assert!(MAX_MAX_LEASES as u64 == concurrency::LEASES_CAP);
const _: () = assert!(LEASE_ID_MAX == concurrency::MAX_ID_LEN);

/// The most arguments an ACQUIRE can meaningfully have (name, key, limit, three options).
const MAX_ARGS: usize = 10;

const LIMIT_ARGS: [Arg; 2] = [
    Arg::new(c"limit", ArgType::Integer),
    Arg::new(c"lease-duration", ArgType::String),
];

const LIMIT: [Arg; 2] = [
    Arg::block(c"lease-limit", &LIMIT_ARGS),
    Arg::keyword(c"POLICY", c"name", ArgType::String),
];

const ACQUIRE_ARGS: [Arg; 5] = [
    Arg::new(c"key", ArgType::Key),
    Arg::one_of(c"limit", &LIMIT),
    Arg::keyword(c"ID", c"lease-id", ArgType::String),
    Arg::option(c"COST", c"cost", ArgType::Integer),
    Arg::option(c"AT", c"unix-ms", ArgType::UnixTime),
];

const RELEASE_ARGS: [Arg; 3] = [
    Arg::new(c"key", ArgType::Key),
    Arg::keyword(c"ID", c"lease-id", ArgType::String),
    Arg::option(c"AT", c"unix-ms", ArgType::UnixTime),
];

pub(crate) const ACQUIRE: Command = Command {
    name: c"ratelimit.acquire",
    flags: c"write deny-oom fast",
    arity: -6,
    keys: Keys::First {
        rest: false,
        flags: KEY_UPDATED,
    },
    summary: c"Takes (or renews) a lease on a concurrency limit, if the limit has room for it",
    complexity: c"O(log N) for N live leases",
    args: &ACQUIRE_ARGS,
    acl: "write fast ratelimit",
    counted: true,
    handler: handler!(run_acquire),
};

pub(crate) const RELEASE: Command = Command {
    name: c"ratelimit.release",
    flags: c"write fast",
    arity: -4,
    keys: Keys::First {
        rest: false,
        flags: KEY_UPDATED,
    },
    summary: c"Gives back a lease taken with RATELIMIT.ACQUIRE; answers 1 if it was live",
    complexity: c"O(log N) for N live leases",
    args: &RELEASE_ARGS,
    acl: "write fast ratelimit",
    counted: false,
    handler: handler!(run_release),
};

/// The arguments after the key, borrowed in place (at most `N`: the extra ones are options
/// given twice or unknown, which the parser names).
fn args_after_key<const N: usize>(call: &Call) -> ([&[u8]; N], usize) {
    let mut slices: [&[u8]; N] = [&[]; N];
    let count = call.argc().saturating_sub(2).min(N);
    for (i, slot) in slices[..count].iter_mut().enumerate() {
        *slot = call.bytes(2 + i);
    }
    (slices, count)
}

/// The error reply for a core's refusal.
fn acquire_error(error: AcquireError) -> String {
    match error {
        AcquireError::Mismatch(stored) => {
            error::algorithm_mismatch(stored.name(), Kind::Leases.name())
        }
        AcquireError::TooManyLeases { max } => error::too_many_leases(max),
        AcquireError::Invalid => error::INTERNAL.to_string(),
    }
}

fn run_acquire(call: &Call) -> c_int {
    let (slices, count) = args_after_key::<MAX_ARGS>(call);
    let args = &slices[..count];
    let parsed = if call.argc() < 6 {
        Err(ArgError::WrongArity)
    } else {
        parse_acquire(args)
    };
    let parsed = match parsed {
        Ok(parsed) => parsed,
        Err(error) => return call.error(&error.message("ratelimit.acquire", args)),
    };
    let (params, through) = match resolve_lease(&parsed.limit) {
        Ok(resolved) => resolved,
        Err(message) => return call.error(&message),
    };
    let request = Acquire {
        params,
        id: parsed.id,
        cost: parsed.cost,
        now_ms: parsed.at_ms.unwrap_or_else(now_ms),
    };
    let mut txn = Txn::open(call, call.raw_arg(1), true);
    // The handle borrows the key: it is done with, in this block, before the key is written.
    let (acquired, expires_at_ms) = {
        let mut stored = match txn.slot() {
            Slot::WrongType => return call.error(error::WRONG_TYPE),
            Slot::Empty => None,
            Slot::Limiter(handle) => Some(handle),
        };
        let mut created = None;
        let (acquired, write) = match concurrency::acquire(
            stored.as_deref_mut(),
            &request,
            max_leases(),
            true,
            &mut created,
        ) {
            Ok(decided) => decided,
            Err(error) => return call.error(&acquire_error(error)),
        };
        // A lease set is boxed: an update is in place already, and `store` keeps it there.
        let expires_at_ms = match write {
            Write::Nothing => None,
            Write::Updated => match stored {
                Some(mut handle) => {
                    if let Err(why) = handle.store() {
                        return call.error(&refused(why));
                    }
                    Some(handle.expires_at_ms())
                }
                None => None,
            },
            Write::Created => {
                let Some(limiter) = created else {
                    return call.error(error::INTERNAL);
                };
                // The key held nothing to keep a handle on; the new limiter goes in whole.
                drop(stored);
                let expires_at_ms = limiter.expires_at_ms();
                if let Err(why) = txn.create(limiter) {
                    return call.error(&refused(why));
                }
                Some(expires_at_ms)
            }
        };
        (acquired, expires_at_ms)
    };
    if let Some(expires_at_ms) = expires_at_ms {
        txn.expire_at(expires_at_ms);
        encode_lease_acquire(
            &params,
            acquired.t_ms,
            request.cost,
            request.id,
            txn.replicate(),
        );
    }
    let mode = through.as_ref().map_or(Mode::Enforce, |(mode, _)| *mode);
    let (answer, shadowed) = redis_ratelimit_core::policy::answer(acquired.decision, mode);
    txn.count(
        Kind::Leases,
        answer.allowed,
        false,
        through
            .as_ref()
            .map(|(_, counters)| (&**counters, shadowed)),
    );
    if shadowed {
        txn.notify(Event::ShadowRejected);
    } else if !answer.allowed {
        txn.notify(Event::Rejected);
    }
    txn.commit();
    call.reply_decision(&answer, call.resp3(), 0);
    raw::REDISMODULE_OK as c_int
}

fn run_release(call: &Call) -> c_int {
    // ID and AT with their values, and one more option with its value: an option given twice
    // or an unknown one is then named by the parser.
    let (slices, count) = args_after_key::<6>(call);
    let args = &slices[..count];
    let parsed = if call.argc() < 4 {
        Err(ArgError::WrongArity)
    } else {
        parse_release(args)
    };
    let parsed = match parsed {
        Ok(parsed) => parsed,
        Err(error) => return call.error(&error.message("ratelimit.release", args)),
    };
    let now = parsed.at_ms.unwrap_or_else(now_ms);
    let mut txn = Txn::open(call, call.raw_arg(1), true);
    let mut handle = match txn.slot() {
        Slot::WrongType => return call.error(error::WRONG_TYPE),
        Slot::Empty => {
            call.reply_integer(0);
            return raw::REDISMODULE_OK as c_int;
        }
        Slot::Limiter(handle) => handle,
    };
    // What the key needs once the lease set is stored: a new expiry, or deletion.
    let (t_ms, after) = match concurrency::release(&mut handle, parsed.id, now) {
        Err(error) => return call.error(&acquire_error(error)),
        Ok((_, Released::Nothing)) => {
            call.reply_integer(0);
            return raw::REDISMODULE_OK as c_int;
        }
        Ok((t_ms, released)) => {
            if let Err(why) = handle.store() {
                return call.error(&refused(why));
            }
            (
                t_ms,
                (released == Released::Updated).then(|| handle.expires_at_ms()),
            )
        }
    };
    drop(handle);
    match after {
        Some(expires_at_ms) => txn.expire_at(expires_at_ms),
        None => txn.delete(),
    }
    encode_lease_release(t_ms, parsed.id, txn.replicate());
    txn.commit();
    call.reply_integer(1);
    raw::REDISMODULE_OK as c_int
}
