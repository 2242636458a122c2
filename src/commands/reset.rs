//! `RATELIMIT.RESET key [key ...]`: removes limiter keys; replies the number removed.

use std::ffi::c_int;

use redis_module::raw;
use redis_ratelimit_core::error::{self, ArgError};

use super::call::{handler, Call, KeyGroups};
use super::registry::{Arg, ArgType, Command, Keys, KEY_REMOVED};
use super::txn::Txn;
use crate::store::Slot;

const ARGS: [Arg; 1] = [Arg::new(c"key", ArgType::Key).multiple()];

pub(crate) const COMMAND: Command = Command {
    name: c"ratelimit.reset",
    flags: c"write",
    arity: -2,
    keys: Keys::First {
        rest: true,
        flags: KEY_REMOVED,
    },
    summary: c"Removes limiter keys; answers how many were removed",
    complexity: c"O(N) for N keys",
    args: &ARGS,
    acl: "keyspace write slow ratelimit",
    counted: false,
    handler: handler!(run),
};

fn run(call: &Call) -> c_int {
    if call.argc() < 2 {
        return call.error(&ArgError::WrongArity.message("ratelimit.reset", &[]));
    }
    // One handle per distinct key: a key named twice is removed once, as DEL counts it, and no
    // handle outlives the value another one deleted.
    let names: Vec<&[u8]> = (1..call.argc()).map(|i| call.bytes(i)).collect();
    let mut txns: Vec<Txn> = KeyGroups::of(&names)
        .first
        .iter()
        .map(|&i| Txn::open(call, call.raw_arg(1 + i), true))
        .collect();
    // All or nothing: any key of another type fails the whole call before anything is removed.
    if txns
        .iter_mut()
        .any(|txn| matches!(txn.slot(), Slot::WrongType))
    {
        return call.error(error::WRONG_TYPE);
    }
    let mut removed = 0;
    for txn in &mut txns {
        if matches!(txn.slot(), Slot::Limiter(_)) {
            txn.delete();
            // Deterministic: the command itself replicates, once.
            if removed == 0 {
                txn.replicate_verbatim();
            }
            removed += 1;
        }
    }
    Txn::commit_all(&mut txns);
    call.reply_integer(removed);
    raw::REDISMODULE_OK as c_int
}
