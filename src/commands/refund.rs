//! `RATELIMIT.REFUND key algorithm limit period [BURST capacity] COST cost [AT unix-ms]`
//! `RATELIMIT.REFUND key POLICY name COST cost [AT unix-ms]`
//!
//! Gives back up to `cost` units that earlier calls consumed (a request that failed, a job that
//! was cancelled), under the parameters the key holds (see `algorithms::refund`). The reply is
//! what `PEEK ... COST 0` answers right after. A refund on a missing or fresh key, or one with
//! nothing to give back, changes nothing (no write, no replication, no keyspace signal); one that
//! leaves the key equivalent to a fresh one deletes it. The write is replicated as effects: the
//! packed state (or the whole limiter), a sliding log's `LogRefund`, or `DEL`.

use std::ffi::c_int;

use redis_module::raw;
use redis_ratelimit_core::algorithms::{self, Algorithm, Kind, Refunded, Request};
use redis_ratelimit_core::codec::{encode_packed, encode_write, Change, Sink, StackBuf};
use redis_ratelimit_core::error;
use redis_ratelimit_core::parse::parse_refund;
use redis_ratelimit_core::policy::Mode;

use super::call::{handler, now_ms, Call};
use super::check::parse_args;
use super::policy::resolve;
use super::registry::{Arg, ArgType, Command, Keys, KEY_UPDATED, LIMIT};
use super::txn::refused;
use super::txn::Txn;
use crate::store::Slot;

const ARGS: [Arg; 4] = [
    Arg::new(c"key", ArgType::Key),
    Arg::one_of(c"limit", &LIMIT),
    Arg::keyword(c"COST", c"cost", ArgType::Integer),
    Arg::option(c"AT", c"unix-ms", ArgType::UnixTime),
];

pub(crate) const COMMAND: Command = Command {
    name: c"ratelimit.refund",
    flags: c"write fast",
    // The key and a spec of one argument; the parser names what else is missing.
    arity: -3,
    keys: Keys::First {
        rest: false,
        flags: KEY_UPDATED,
    },
    summary: c"Gives back cost that earlier calls consumed",
    complexity: c"O(1); sliding-log: O(log size)",
    args: &ARGS,
    acl: "write fast ratelimit",
    counted: false,
    handler: handler!(run),
};

fn run(call: &Call) -> c_int {
    let args = match parse_args(call, 2, "ratelimit.refund", parse_refund) {
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
    let mut txn = Txn::open(call, call.raw_arg(1), true);
    let mut stored = match txn.slot() {
        Slot::WrongType => return call.error(error::WRONG_TYPE),
        Slot::Empty => None,
        Slot::Limiter(limiter) => Some(limiter),
    };
    let refunded = algorithms::refund(stored.as_deref_mut(), &request);
    let mut payload = StackBuf::default();
    // What the key needs once the limiter is stored: a new expiry, or deletion.
    let (outcome, after) = match (refunded, stored) {
        (Err(mismatch), _) => {
            return call.error(&error::algorithm_mismatch(
                mismatch.stored.name(),
                request.algorithm.name(),
            ));
        }
        (Ok((outcome, Refunded::Nothing)), _) => (outcome, None),
        (Ok((outcome, Refunded::Updated)), Some(mut handle)) => {
            let packed = match handle.store() {
                Ok(packed) => packed,
                Err(why) => return call.error(&refused(why)),
            };
            if handle.kind() == Kind::Rate(Algorithm::SlidingLog) {
                Change::LogRefund {
                    t_ms: outcome.t_ms,
                    cost: request.cost,
                }
                .encode(&mut payload);
            } else {
                match packed {
                    Some(words) => encode_packed(&words, &mut payload),
                    None => encode_write(&handle, &mut payload),
                }
            }
            (outcome, Some(Some(handle.expires_at_ms())))
        }
        (Ok((outcome, Refunded::Emptied)), _) => (outcome, Some(None)),
        (Ok((outcome, Refunded::Updated)), None) => (outcome, None),
    };
    match after {
        Some(Some(expires_at_ms)) => {
            txn.expire_at(expires_at_ms);
            if let Some(bytes) = payload.as_slice() {
                txn.replicate().put(bytes);
            }
        }
        Some(None) => {
            txn.delete();
            txn.replicate_del();
        }
        None => {}
    }
    txn.commit();
    let mode = resolved
        .through
        .as_ref()
        .map_or(Mode::Enforce, |(mode, _)| *mode);
    let (answer, _) = redis_ratelimit_core::policy::answer(outcome.decision, mode);
    call.reply_decision(&answer, call.resp3(), 0);
    raw::REDISMODULE_OK as c_int
}
