//! `RATELIMIT.INFO key`: the stored state as field/value pairs (a map under RESP3); nil when the
//! key does not exist.
//!
//! Every existing limiter key is described, also one whose state is already a fresh key's but
//! that still exists (its expiry removed by `PERSIST`, or restored with `RESTORE key 0`): its
//! stored parameters and state as they are, and `remaining`/`reset_after_ms` as a fresh key's.

use std::ffi::{c_int, CStr, CString};

use redis_module::raw;
use redis_ratelimit_core::algorithms::block::check_blocking;
use redis_ratelimit_core::algorithms::{
    ceil_div, concurrency, to_u64, Kind, Limiter, Request, State,
};
use redis_ratelimit_core::error::{self, ArgError};

use super::call::{handler, now_ms, Call};
use super::registry::{Arg, ArgType, Command, Keys, KEY_READ};
use crate::store::{Key, Slot};

const ARGS: [Arg; 1] = [Arg::new(c"key", ArgType::Key)];

pub(crate) const COMMAND: Command = Command {
    name: c"ratelimit.info",
    flags: c"readonly fast",
    arity: 2,
    keys: Keys::First {
        rest: false,
        flags: KEY_READ,
    },
    summary: c"Describes a limiter key: its parameters, its state and what it has left",
    complexity: c"O(1); sliding-log: O(log size)",
    args: &ARGS,
    acl: "read fast ratelimit",
    counted: false,
    handler: handler!(run),
};

/// The algorithm's own fields, in requests or ms.
fn own_fields(limiter: &Limiter) -> Vec<(&'static CStr, u64)> {
    let period = u128::from(limiter.params.period_ms);
    match &limiter.state {
        State::TokenBucket { tokens_scaled } => vec![(c"tokens", to_u64(tokens_scaled / period))],
        // The theoretical arrival time, in ms since the epoch (rounded up).
        State::Gcra { ahead_scaled } => vec![(
            c"tat",
            limiter.last_ms.saturating_add(to_u64(ceil_div(
                *ahead_scaled,
                u128::from(limiter.params.limit),
            ))),
        )],
        State::LeakyBucket { level_scaled } => {
            vec![(c"level", to_u64(ceil_div(*level_scaled, period)))]
        }
        State::FixedWindow {
            window_start_ms,
            count,
        } => vec![(c"window_start", *window_start_ms), (c"count", *count)],
        State::SlidingWindow {
            window_start_ms,
            current,
            previous,
        } => vec![
            (c"window_start", *window_start_ms),
            (c"count", *current),
            (c"previous", *previous),
        ],
        State::SlidingLog(log) => vec![(c"entries", log.len())],
        // Described by `reply_concurrency`.
        State::Concurrency(_) => vec![],
    }
}

/// A concurrency key: its limit and lease duration, and what its live leases hold now.
fn reply_concurrency(call: &Call, limiter: &Limiter, held: &concurrency::Held) {
    call.reply_map(8, call.resp3());
    call.reply_name(c"algorithm");
    call.reply_name(c"concurrency");
    for (name, value) in [
        (c"limit", limiter.params.limit),
        (c"lease_ms", limiter.params.period_ms),
        (c"remaining", held.remaining),
        (c"reset_after_ms", held.reset_after_ms),
        (c"updated_at_ms", limiter.last_ms),
        (c"leases", held.leases),
        (c"held", held.cost),
    ] {
        call.reply_name(name);
        call.reply_integer(i64::try_from(value).unwrap_or(i64::MAX));
    }
}

fn run(call: &Call) -> c_int {
    if call.argc() != 2 {
        return call.error(&ArgError::WrongArity.message("ratelimit.info", &[]));
    }
    let mut key = Key::open(call.ctx, call.raw_arg(1), false);
    let limiter = match key.slot() {
        Slot::Empty => None,
        Slot::WrongType => return call.error(error::WRONG_TYPE),
        Slot::Limiter(handle) => match handle.kind() {
            // Read in place: a lease set is not copied to be described.
            Kind::Leases => {
                if let Some(held) = concurrency::held(&handle, now_ms()) {
                    reply_concurrency(call, &handle, &held);
                }
                return raw::REDISMODULE_OK as c_int;
            }
            Kind::Rate(algorithm) => Some((algorithm, Limiter::clone(&handle))),
        },
    };
    drop(key);
    let Some((algorithm, mut limiter)) = limiter else {
        call.reply_null();
        return raw::REDISMODULE_OK as c_int;
    };
    let now = now_ms();
    let request = Request {
        algorithm,
        params: limiter.params,
        cost: 0,
        now_ms: now,
    };
    // What a COST 0 PEEK answers now: a block too.
    let (outcome, _, _) = match check_blocking(Some(&mut limiter), &request, false, None, &mut None)
    {
        Ok(decided) => decided,
        Err(_) => return call.error(error::INTERNAL),
    };
    let decision = outcome.decision;
    let mut own = own_fields(&limiter);
    // A block that has not ended, at the time it is read at.
    if limiter.blocked_at(outcome.t_ms) {
        own.push((c"blocked_until_ms", limiter.blocked_until_ms));
    }
    let resp3 = call.resp3();
    call.reply_map(7 + own.len(), resp3);
    call.reply_name(c"algorithm");
    let algorithm = CString::new(algorithm.name()).unwrap_or_default();
    call.reply_name(&algorithm);
    let common = [
        (c"limit", limiter.params.limit),
        (c"period_ms", limiter.params.period_ms),
        (c"burst", limiter.params.capacity),
        (c"remaining", decision.remaining),
        (c"reset_after_ms", decision.reset_after_ms),
        (c"updated_at_ms", limiter.last_ms),
    ];
    for (name, value) in common.into_iter().chain(own) {
        call.reply_name(name);
        call.reply_integer(i64::try_from(value).unwrap_or(i64::MAX));
    }
    raw::REDISMODULE_OK as c_int
}
