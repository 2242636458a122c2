//! `RATELIMIT.CHECK key algorithm limit period [BURST capacity] [COST cost] [AT unix-ms]`
//! `RATELIMIT.CHECK key POLICY name [COST cost] [AT unix-ms]`
//! `RATELIMIT.CHECK key "algorithm limit period ..." [COST cost] [AT unix-ms]` (one argument)
//! `RATELIMIT.PEEK  key ...` (the same arguments)

use std::ffi::c_int;
use std::mem::MaybeUninit;

use redis_module::raw;
use redis_ratelimit_core::algorithms::Request;
use redis_ratelimit_core::error::ArgError;
use redis_ratelimit_core::few::Few;
use redis_ratelimit_core::parse::{
    is_one_argument_spec, parse_call, split_call, CallArgs, CALL_WORDS,
};
use redis_ratelimit_core::policy::Mode;

use super::call::{handler, now_ms, Call};
use super::decide::decide;
use super::policy::resolve;
use super::registry::{Arg, ArgType, Command, Keys, KEY_READ, KEY_UPDATED, LIMIT};
use crate::config::max_log_limit;

/// The most arguments a CHECK can meaningfully have (name, key, spec, three options).
const MAX_ARGS: usize = 11;

/// The arguments of CHECK and PEEK.
const ARGS: [Arg; 4] = [
    Arg::new(c"key", ArgType::Key),
    Arg::one_of(c"limit", &LIMIT),
    Arg::option(c"COST", c"cost", ArgType::Integer),
    Arg::option(c"AT", c"unix-ms", ArgType::UnixTime),
];

pub(crate) const CHECK: Command = Command {
    name: c"ratelimit.check",
    flags: c"write deny-oom fast",
    arity: -3,
    keys: Keys::First {
        rest: false,
        flags: KEY_UPDATED,
    },
    summary: c"Checks a request against a limit and consumes its cost if admitted",
    complexity: c"O(1); sliding-log: O(log size)",
    args: &ARGS,
    acl: "write fast ratelimit",
    counted: true,
    handler: handler!(|call| run(call, true)),
};

pub(crate) const PEEK: Command = Command {
    name: c"ratelimit.peek",
    flags: c"readonly fast",
    arity: -3,
    keys: Keys::First {
        rest: false,
        flags: KEY_READ,
    },
    summary: c"Answers what RATELIMIT.CHECK would, without changing anything",
    complexity: c"O(1); sliding-log: O(log size)",
    args: &ARGS,
    acl: "read fast ratelimit",
    counted: false,
    handler: handler!(|call| run(call, false)),
};

/// Parses the arguments of a CHECK-shaped call from position `first` on with `parse` (the core's
/// parser of CHECK's arguments, or TAKE's or REFUND's), read in place; the error is the reply.
/// Inlined, `parse` with it: every CHECK runs this (`make profile`).
#[inline(always)]
pub fn parse_args<'a>(
    call: &'a Call,
    first: usize,
    name: &str,
    parse: fn(&[&'a [u8]], u64) -> Result<CallArgs<'a>, ArgError>,
) -> Result<CallArgs<'a>, String> {
    // Extra arguments are options given twice or unknown: let the parser name them.
    const ROOM: usize = MAX_ARGS + 2;
    let count = call.argc().saturating_sub(first).min(ROOM);
    // Only the arguments there are are written (every CHECK runs this: not the whole array).
    let mut slots = [MaybeUninit::<&[u8]>::uninit(); ROOM];
    for (slot, arg) in slots.iter_mut().zip(call.args_from(first)) {
        slot.write(arg);
    }
    // SAFETY: the first `count` slots (at most `ROOM`) were written just above.
    let slices: &[&'a [u8]] = unsafe { std::slice::from_raw_parts(slots.as_ptr().cast(), count) };
    if call.argc() < 3 {
        return Err(ArgError::WrongArity.message(name, slices));
    }
    // A spec given as one argument is read as its words (an error names positions in what was
    // read: the words, or the argument itself). One parse either way, inlined here.
    let mut split: Few<&[u8], CALL_WORDS> = Few::new();
    let words: &[&'a [u8]] = match slices.first() {
        Some(first) if is_one_argument_spec(first) => {
            if let Err(error) = split_call(slices, &mut split) {
                return Err(error.message(name, slices));
            }
            &split
        }
        _ => slices,
    };
    parse(words, max_log_limit()).map_err(|error| error.message(name, words))
}

fn run(call: &Call, commit: bool) -> c_int {
    let name = if commit {
        "ratelimit.check"
    } else {
        "ratelimit.peek"
    };
    let args = match parse_args(call, 2, name, parse_call) {
        Ok(args) => args,
        Err(message) => return call.error(&message),
    };
    let resolved = match resolve(&args.limit) {
        Ok(resolved) => resolved,
        Err(message) => return call.error(&message),
    };
    let request = Request {
        algorithm: resolved.algorithm,
        params: resolved.params,
        cost: args.cost,
        now_ms: args.at_ms.unwrap_or_else(now_ms),
    };
    let mode = resolved
        .through
        .as_ref()
        .map_or(Mode::Enforce, |(mode, _)| *mode);
    let through = resolved.through.as_ref().map(|(_, counters)| counters);
    let decided = match decide(
        call,
        &request,
        commit,
        mode,
        resolved.block_ms,
        through,
        false,
    ) {
        Ok(decided) => decided,
        Err(message) => return call.error(&message),
    };
    call.reply_decision(&decided, call.resp3(), 0);
    raw::REDISMODULE_OK as c_int
}
