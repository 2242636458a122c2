//! `RATELIMIT.TAKE key algorithm limit period [BURST capacity] [BLOCK duration] MAX n [AT unix-ms]`
//! `RATELIMIT.TAKE key POLICY name MAX n [AT unix-ms]`
//!
//! A partial grant: the largest `g <= n` that `CHECK ... COST g` would admit at that moment,
//! consumed. `g > 0` is that CHECK in every respect (state, expiry, replication, INFO, events); `g
//! = 0` is the CHECK of cost 1 it could not admit (a rejection: nothing written, a `BLOCK` started).
//! The reply is CHECK's with `granted` (`g`) in place of `allowed`.

use std::ffi::c_int;

use redis_module::raw;

use super::check::parse_call_with;
use super::parse::parse_take;
use super::policy::resolve;
use super::registry::{Arg, ArgType, Command, Keys, KEY_UPDATED, LIMIT};
use super::{decide, evaluate, handler, notify_shadow_rejected, now_ms, Call};
use crate::algorithms::block::Blocking;
use crate::algorithms::{largest_grant, Request};
use crate::policy::Mode;
use crate::stats;
use crate::store::codec::StackBuf;
use crate::store::Key;

const NAME: &str = "ratelimit.take";

const ARGS: [Arg; 4] = [
    Arg::new(c"key", ArgType::Key),
    Arg::one_of(c"limit", &LIMIT),
    Arg::keyword(c"MAX", c"max", ArgType::Integer),
    Arg::option(c"AT", c"unix-ms", ArgType::UnixTime),
];

pub(crate) const COMMAND: Command = Command {
    name: c"ratelimit.take",
    flags: c"write deny-oom fast",
    arity: -4,
    keys: Keys::First {
        rest: false,
        flags: KEY_UPDATED,
    },
    summary: c"Grants and consumes the largest cost up to MAX that a CHECK would admit",
    complexity: c"O(log MAX); sliding-log: O(log MAX * log size)",
    args: &ARGS,
    acl: "write fast ratelimit",
    handler: handler!(run),
};

fn run(call: &Call) -> c_int {
    // Every call Redis counts in this command's `calls` (see `stats::count_call`).
    stats::count_call();
    let args = match parse_call_with(call, 2, NAME, parse_take) {
        Ok(args) => args,
        Err(message) => return call.error(&message),
    };
    let resolved = match resolve(&args.limit) {
        Ok(resolved) => resolved,
        Err(message) => return call.error(&message),
    };
    let max = args.cost;
    // One time for the search and the CHECK that follows it.
    let now_ms = args.at_ms.unwrap_or_else(now_ms);
    let request = |cost| Request {
        algorithm: resolved.algorithm,
        params: resolved.params,
        cost,
        now_ms,
    };
    let mode = resolved
        .through
        .as_ref()
        .map_or(Mode::Enforce, |(mode, _)| *mode);
    // What enforcement grants, asked of the key as it stands (PEEKs: nothing written).
    let granted = {
        let mut key = Key::open(call.ctx, call.raw_arg(1), false);
        let mut payload = StackBuf::default();
        largest_grant(max, |cost| {
            evaluate(
                &mut key,
                &request(cost),
                false,
                resolved.block_ms,
                &mut payload,
            )
            .map(|(outcome, _, _)| outcome.decision.allowed)
        })
    };
    let granted = match granted {
        Ok(granted) => granted,
        Err(message) => return call.error(&message),
    };
    // A refusal is the CHECK of one unit, which cannot pass.
    let (decision, shadowed, blocking) = match decide(
        call,
        &request(granted.max(1)),
        true,
        mode,
        resolved.block_ms,
    ) {
        Ok(decided) => decided,
        Err(message) => return call.error(&message),
    };
    // Shadow mode grants MAX; enforcement would have granted less.
    let shadow_short = mode == Mode::Shadow && granted < max;
    if shadow_short && !shadowed {
        notify_shadow_rejected(call, call.raw_arg(1));
    }
    if let Some((_, counters)) = &resolved.through {
        counters.count(
            decision.allowed,
            shadowed || shadow_short,
            blocking == Blocking::Blocked,
        );
    }
    let answered = if mode == Mode::Shadow { max } else { granted };
    call.reply_fields(&decision, Some(answered), call.resp3(), 0);
    raw::REDISMODULE_OK as c_int
}
