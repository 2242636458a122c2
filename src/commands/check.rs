//! `RATELIMIT.CHECK key algorithm limit period [BURST capacity] [COST cost] [AT unix-ms]`
//! `RATELIMIT.PEEK  key algorithm limit period [BURST capacity] [COST cost] [AT unix-ms]`

use std::ffi::c_int;

use redis_module::raw;

use super::parse::{parse_check, CheckArgs};
use super::{guard, now_ms, replicate_apply, Call};
use crate::algorithms::{self, Algorithm, Outcome, Request, Write};
use crate::api::rm;
use crate::config::max_log_limit;
use crate::error::{self, ArgError};
use crate::stats;
use crate::store::codec::{encode_replace, Change, StackBuf};
use crate::store::{Key, Slot};

/// The most arguments a CHECK can meaningfully have (name, key, spec, three options).
const MAX_ARGS: usize = 11;

pub(crate) unsafe extern "C" fn check_command(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    guard(ctx, argv, argc, |call| run(call, true))
}

pub(crate) unsafe extern "C" fn peek_command(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    guard(ctx, argv, argc, |call| run(call, false))
}

/// Parses the arguments after the key of a CHECK-shaped call.
pub fn parse_call(call: &Call, first: usize, name: &str) -> Result<CheckArgs, String> {
    let count = call.argc().saturating_sub(first);
    // Extra arguments are options given twice or unknown: let the parser name them.
    let mut slices: [&[u8]; MAX_ARGS + 2] = [&[]; MAX_ARGS + 2];
    let count = count.min(slices.len());
    for (i, slot) in slices[..count].iter_mut().enumerate() {
        *slot = call.bytes(first + i);
    }
    let result = if call.argc() < 5 {
        Err(ArgError::WrongArity)
    } else {
        parse_check(&slices[..count], max_log_limit())
    };
    result.map_err(|error| error.message(name))
}

fn run(call: &Call, commit: bool) -> c_int {
    let name = if commit {
        "ratelimit.check"
    } else {
        "ratelimit.peek"
    };
    let args = match parse_call(call, 2, name) {
        Ok(args) => args,
        Err(message) => return call.error(&message),
    };
    let request = Request {
        algorithm: args.spec.algorithm,
        params: args.spec.params,
        cost: args.cost,
        now_ms: args.at_ms.unwrap_or_else(now_ms),
    };
    let key_name = call.string(1);
    let key = Key::open(call.ctx, key_name, commit);
    let outcome = match evaluate(&key, &request, commit) {
        Ok(outcome) => outcome,
        Err(message) => return call.error(&message),
    };
    if commit && outcome.consumed {
        replicate_write(call, key_name, &request, &outcome, &key);
    }
    // Closed before the event: a subscriber to keyspace events may touch the key.
    drop(key);
    if commit {
        let allowed = outcome.decision.allowed;
        stats::decision(request.algorithm, allowed);
        if !allowed {
            notify_rejected(call, key_name);
        }
    }
    call.reply_decision(&outcome.decision, call.resp3(), 0);
    raw::REDISMODULE_OK as c_int
}

/// Decides on one open key and, with `commit`, writes the result into it (state and expiry).
/// The error is the reply to send (WRONGTYPE, another algorithm).
pub fn evaluate(key: &Key, request: &Request, commit: bool) -> Result<Outcome, String> {
    let mut stored = match key.slot() {
        Slot::Empty => None,
        Slot::Limiter(limiter) => Some(limiter),
        Slot::WrongType => return Err(error::WRONG_TYPE.to_string()),
    };
    let (outcome, write) =
        algorithms::check(stored.as_deref_mut(), request, commit).map_err(|mismatch| {
            error::algorithm_mismatch(mismatch.stored.name(), request.algorithm.name())
        })?;
    // Store an in-place update before anything reads the key again; skip the write-back of a
    // limiter the call left as it was.
    match (stored, &write) {
        (Some(handle), Write::None) => handle.unchanged(),
        (stored, _) => drop(stored),
    }
    let written = match write {
        Write::None => false,
        Write::Updated => true,
        Write::Created(limiter) => key.set(limiter),
    };
    if written {
        // Saturating: a bucket refilling over more than u64 ms must not wrap into the past.
        key.expire_at(outcome.t_ms.saturating_add(outcome.decision.reset_after_ms));
    }
    Ok(outcome)
}

/// Sends replicas and the AOF the write this call made, with its explicit time.
pub(crate) fn replicate_write(
    call: &Call,
    key_name: *mut raw::RedisModuleString,
    request: &Request,
    outcome: &Outcome,
    key: &Key,
) {
    let mut payload = StackBuf::default();
    if request.algorithm == Algorithm::SlidingLog {
        Change::LogAppend {
            params: request.params,
            t_ms: outcome.t_ms,
            cost: request.cost,
        }
        .encode(&mut payload);
    } else if let Some(limiter) = key.read() {
        encode_replace(&limiter, &mut payload);
    }
    if let Some(bytes) = payload.as_slice() {
        replicate_apply(call, key_name, bytes);
    }
}

/// Raises the `ratelimit.rejected` keyspace event (Redis drops it unless module events are on).
pub(crate) fn notify_rejected(call: &Call, key_name: *mut raw::RedisModuleString) {
    // SAFETY: the command's context, a static NUL-terminated event name and the command's key.
    unsafe {
        rm!(RedisModule_NotifyKeyspaceEvent)(
            call.ctx,
            raw::REDISMODULE_NOTIFY_MODULE,
            c"ratelimit.rejected".as_ptr(),
            key_name,
        )
    };
}
