//! `RATELIMIT.TAKE key algorithm limit period [BURST capacity] [BLOCK duration] MAX n [AT unix-ms]`
//! `RATELIMIT.TAKE key POLICY name MAX n [AT unix-ms]`
//!
//! A partial grant: the largest `g <= n` that `CHECK ... COST g` would admit at that moment,
//! consumed. `g > 0` is that CHECK in every respect (state, expiry, replication, INFO, events); `g
//! = 0` is the CHECK of cost 1 it could not admit (a rejection: nothing written, a `BLOCK` started).
//! The reply is CHECK's with `granted` (`g`) in place of `allowed`.

use std::ffi::c_int;

use redis_module::raw;
use redis_ratelimit_core::algorithms::{largest_grant, last_unit_delay_ms, Decision, Request};
use redis_ratelimit_core::parse::parse_take;
use redis_ratelimit_core::policy::Mode;

use super::call::{handler, now_ms, Call};
use super::check::parse_args;
use super::decide::{decide, evaluate};
use super::policy::resolve;
use super::registry::{Arg, ArgType, Command, Keys, KEY_UPDATED, LIMIT};
use super::txn::Txn;

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
    // The key and a spec of one argument; the parser names what else is missing.
    arity: -3,
    keys: Keys::First {
        rest: false,
        flags: KEY_UPDATED,
    },
    summary: c"Grants and consumes the largest cost up to MAX that a CHECK would admit",
    complexity: c"O(log MAX); sliding-log: O(log MAX * log size)",
    args: &ARGS,
    acl: "write fast ratelimit",
    counted: true,
    handler: handler!(run),
};

fn run(call: &Call) -> c_int {
    let args = match parse_args(call, 2, NAME, parse_take) {
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
    // What enforcement grants, asked of the key as it stands (PEEKs: nothing written), and the
    // wait of its last unit (the reply's delay_ms) when the grant's CHECK reports the first's.
    let mut txn = Txn::open(call, call.raw_arg(1), false);
    let mut peek = |cost| {
        evaluate(&mut txn, &request(cost), false, resolved.block_ms)
            .map(|evaluation| evaluation.outcome.decision)
    };
    let granted = match largest_grant(max, |cost| peek(cost).map(|decision| decision.allowed)) {
        Ok(granted) => granted,
        Err(message) => return call.error(&message),
    };
    let last_delay_ms = match last_unit_delay_ms(resolved.algorithm, granted, &mut peek) {
        Ok(delay_ms) => delay_ms,
        Err(message) => return call.error(&message),
    };
    // Read only and never committed: nothing is stored.
    drop(txn);
    // Shadow mode grants MAX; enforcement would have granted less.
    let shadow_short = mode == Mode::Shadow && granted < max;
    let through = resolved.through.as_ref().map(|(_, counters)| counters);
    // A refusal is the CHECK of one unit, which cannot pass.
    let request = request(granted.max(1));
    let decided = match decide(
        call,
        &request,
        true,
        mode,
        resolved.block_ms,
        through,
        shadow_short,
    ) {
        Ok(decided) => decided,
        Err(message) => return call.error(&message),
    };
    let answered = if mode == Mode::Shadow { max } else { granted };
    let decided = match last_delay_ms {
        Some(delay_ms) if decided.allowed => Decision {
            delay_ms,
            ..decided
        },
        _ => decided,
    };
    call.reply_fields(&decided, Some(answered), call.resp3(), 0);
    raw::REDISMODULE_OK as c_int
}
