//! `RATELIMIT.CHECKALL numkeys key [key ...] algorithm limit period [BURST capacity] [...]
//! [COST cost] [AT unix-ms]`: several limits in one atomic, all-or-nothing call.
//!
//! Every key is first evaluated without writing (PEEK semantics). Only if every key admits the
//! request is each one evaluated again, this time writing its state and expiry and replicating the
//! write exactly as CHECK does; PEEK equals the CHECK that follows, so the second pass admits too.
//! If any key rejects, nothing is written anywhere.
//!
//! A key may be named more than once: each occurrence is a limit of its own, decided and consumed
//! in order, exactly as the same CHECKs one after the other would be (the second sees what the
//! first consumed), and still all or nothing. The command opens one handle per distinct key.
//!
//! The keys are declared two ways, because the legacy first/last/step triple cannot express
//! `numkeys`. The command is registered with `getkeys-api` and answers Redis's key-position
//! requests itself (Redis 7.0 uses that for cluster slot checks; it works on every Redis and
//! Valkey); where `RedisModule_SetCommandInfo` exists (7.0+) it also gets a `numkeys` key spec
//! (begin search at index 1, keynum 0, first key 1, step 1), which `COMMAND INFO`/`COMMAND DOCS`
//! show and which Redis prefers for `COMMAND GETKEYS` and ACL key checks. Both name the same
//! arguments, `2 ..= numkeys + 1`.

use std::ffi::{c_int, CStr};
use std::ptr;

use redis_module::raw;

use super::check::{evaluate, notify_rejected, replicate_write};
use super::keyspec::{end, INFO_VERSION};
use super::parse::{parse_checkall, parse_integer};
use super::{guard, now_ms, Call, KeyGroups};
use crate::algorithms::{self, Decision, Limiter, Outcome, Request, Write};
use crate::api::{has, rm};
use crate::config::max_log_limit;
use crate::error;
use crate::stats;
use crate::store::{Key, Slot};

/// The command's name, as registered.
pub const NAME: &CStr = c"ratelimit.checkall";

/// The flags it is registered with (`getkeys-api`: see the module comment).
pub const FLAGS: &CStr = c"write deny-oom getkeys-api";

/// The first key is argument 2, after `numkeys`.
const FIRST_KEY: usize = 2;

pub(crate) unsafe extern "C" fn checkall_command(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    guard(ctx, argv, argc, run)
}

fn run(call: &Call) -> c_int {
    if is_keys_position_request(call) {
        report_keys(call);
        return raw::REDISMODULE_OK as c_int;
    }
    let args: Vec<&[u8]> = (1..call.argc()).map(|i| call.bytes(i)).collect();
    let parsed = match parse_checkall(&args, max_log_limit()) {
        Ok(parsed) => parsed,
        Err(error) => return call.error(&error.message("ratelimit.checkall", &args)),
    };
    let count = parsed.numkeys;
    let now_ms = parsed.at_ms.unwrap_or_else(now_ms);
    let requests: Vec<Request> = parsed
        .specs
        .iter()
        .map(|spec| Request {
            algorithm: spec.algorithm,
            params: spec.params,
            cost: parsed.cost,
            now_ms,
        })
        .collect();
    let key_name = |i: usize| call.string(FIRST_KEY + i);
    // One handle per distinct key (see `KeyGroups`); a key named twice takes both its specs.
    let groups = KeyGroups::of(&args[1..=count]);
    let keys: Vec<Key> = groups
        .first
        .iter()
        .map(|&i| Key::open(call.ctx, key_name(i), true))
        .collect();

    // First pass: decide every limit without writing. An error (WRONGTYPE, another algorithm)
    // is the reply, and nothing has changed.
    let outcomes = match decide(&keys, &groups, &requests) {
        Ok(outcomes) => outcomes,
        Err(message) => return call.error(&message),
    };
    let admitted = outcomes.iter().all(|outcome| outcome.decision.allowed);
    let mut outcomes = outcomes;

    if admitted {
        // Second pass: consume everywhere, in order. Each limit was just decided on the state
        // the ones before it leave, so every one admits again.
        for (i, request) in requests.iter().enumerate() {
            let key = &keys[groups.group[i]];
            let outcome = match evaluate(key, request, true) {
                Ok(outcome) => outcome,
                Err(message) => return call.error(&message),
            };
            debug_assert_eq!(outcome.decision, outcomes[i].decision);
            if outcome.consumed {
                replicate_write(call, key_name(i), request, &outcome, key);
            }
            outcomes[i] = outcome;
        }
    }
    // Closed before the events: a subscriber to keyspace events may touch the keys.
    drop(keys);
    if !admitted {
        // Once per key, for the keys with a limit that rejected.
        let mut rejected = vec![false; groups.first.len()];
        for (outcome, &group) in outcomes.iter().zip(&groups.group) {
            rejected[group] |= !outcome.decision.allowed;
        }
        for (&first, rejected) in groups.first.iter().zip(rejected) {
            if rejected {
                notify_rejected(call, key_name(first));
            }
        }
    }
    // One decision per limit: admitted (consumed) or not, whatever the key alone would say.
    for request in &requests {
        stats::decision(request.algorithm, admitted);
    }

    let decisions: Vec<Decision> = outcomes.iter().map(|outcome| outcome.decision).collect();
    reply(call, &combine(&decisions), &decisions);
    raw::REDISMODULE_OK as c_int
}

/// Every limit's decision, without writing. A key named once is peeked at. A key named more
/// than once is decided on a copy of its limiter, limit after limit, each one seeing what the
/// admitted ones before it consumed: what the same CHECKs in sequence would answer.
fn decide(keys: &[Key], groups: &KeyGroups, requests: &[Request]) -> Result<Vec<Outcome>, String> {
    let mut occurrences = vec![0usize; keys.len()];
    for &group in &groups.group {
        occurrences[group] += 1;
    }
    let mut copies: Vec<Option<Option<Limiter>>> = vec![None; keys.len()];
    let mut outcomes = Vec::with_capacity(requests.len());
    for (request, &group) in requests.iter().zip(&groups.group) {
        let key = &keys[group];
        if occurrences[group] == 1 {
            outcomes.push(evaluate(key, request, false)?);
            continue;
        }
        let copy = match &mut copies[group] {
            Some(copy) => copy,
            empty => empty.insert(match key.slot() {
                Slot::WrongType => return Err(error::WRONG_TYPE.to_string()),
                Slot::Empty => None,
                Slot::Limiter(limiter) => {
                    let copy = Limiter::clone(&limiter);
                    limiter.unchanged();
                    Some(copy)
                }
            }),
        };
        let (outcome, write) =
            algorithms::check(copy.as_mut(), request, true).map_err(|mismatch| {
                error::algorithm_mismatch(mismatch.stored.name(), request.algorithm.name())
            })?;
        if let Write::Created(limiter) = write {
            *copy = Some(limiter);
        }
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// The overall decision: allowed only if all allow; `remaining` the least; `retry_after_ms` the
/// greatest, or -1 if any key's is -1; `reset_after_ms` and `delay_ms` the greatest; `limit` that
/// of the first key with the least remaining.
pub fn combine(decisions: &[Decision]) -> Decision {
    let Some(least) = decisions.iter().min_by_key(|decision| decision.remaining) else {
        return Decision::default();
    };
    let never = decisions
        .iter()
        .any(|decision| decision.retry_after_ms == -1);
    Decision {
        allowed: decisions.iter().all(|decision| decision.allowed),
        limit: least.limit,
        remaining: least.remaining,
        retry_after_ms: if never {
            -1
        } else {
            decisions
                .iter()
                .map(|d| d.retry_after_ms)
                .max()
                .unwrap_or(0)
        },
        reset_after_ms: decisions
            .iter()
            .map(|d| d.reset_after_ms)
            .max()
            .unwrap_or(0),
        delay_ms: decisions.iter().map(|d| d.delay_ms).max().unwrap_or(0),
    }
}

/// RESP2: an array of `1 + numkeys` decisions, the overall one first. RESP3: the overall map with
/// a `limits` array of per-key maps.
fn reply(call: &Call, overall: &Decision, decisions: &[Decision]) {
    let resp3 = call.resp3();
    if resp3 {
        call.reply_decision(overall, true, 1);
        call.reply_name(c"limits");
        call.reply_array(decisions.len());
    } else {
        call.reply_array(1 + decisions.len());
        call.reply_decision(overall, false, 0);
    }
    for decision in decisions {
        call.reply_decision(decision, resp3, 0);
    }
}

/// Redis asks which arguments are keys (cluster routing, ACL, `COMMAND GETKEYS`).
fn is_keys_position_request(call: &Call) -> bool {
    // SAFETY: the command's context.
    has!(RedisModule_IsKeysPositionRequest)
        && unsafe { rm!(RedisModule_IsKeysPositionRequest)(call.ctx) } != 0
}

/// Key flags: read and written, the value used and updated (as `INCR`'s key).
const KEY_FLAGS: u32 =
    raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_UPDATE;

/// Reports arguments `2 ..= numkeys + 1` as keys, as the key spec does; nothing when `numkeys` is
/// not a positive integer or names more keys than there are arguments (the command then fails).
fn report_keys(call: &Call) {
    if call.argc() <= FIRST_KEY {
        return;
    }
    let Some(count) = parse_integer(call.bytes(1)) else {
        return;
    };
    if count == 0 || count > (call.argc() - FIRST_KEY) as u64 {
        return;
    }
    for pos in FIRST_KEY..FIRST_KEY + count as usize {
        let pos = pos as c_int;
        // SAFETY: a key-position request's context; pos is a valid argument index.
        unsafe {
            if has!(RedisModule_KeyAtPosWithFlags) {
                rm!(RedisModule_KeyAtPosWithFlags)(call.ctx, pos, KEY_FLAGS as c_int);
            } else {
                rm!(RedisModule_KeyAtPos)(call.ctx, pos);
            }
        }
    }
}

fn arg(
    name: &'static CStr,
    type_: raw::RedisModuleCommandArgType,
    token: Option<&'static CStr>,
    flags: u32,
) -> raw::RedisModuleCommandArg {
    raw::RedisModuleCommandArg {
        name: name.as_ptr(),
        type_,
        key_spec_index: -1,
        token: token.map_or(ptr::null(), CStr::as_ptr),
        summary: ptr::null(),
        since: ptr::null(),
        flags: flags as c_int,
        deprecated_since: ptr::null(),
        subargs: ptr::null_mut(),
        display_text: ptr::null(),
    }
}

/// Declares CHECKALL's keys (a `numkeys` key spec), arity and arguments with
/// `RedisModule_SetCommandInfo`, where the server has it. Call after the command is created.
/// Without it (or if it fails) the `getkeys-api` callback alone declares the keys.
pub(crate) fn declare_keys(ctx: *mut raw::RedisModuleCtx) -> Result<(), &'static str> {
    if !(has!(RedisModule_GetCommand) && has!(RedisModule_SetCommandInfo)) {
        return Ok(());
    }
    // SAFETY: the OnLoad context and a registered command's NUL-terminated name.
    let command = unsafe { rm!(RedisModule_GetCommand)(ctx, NAME.as_ptr()) };
    if command.is_null() {
        return Err("ratelimit.checkall is not registered");
    }
    let mut spec: raw::RedisModuleCommandKeySpec = end();
    spec.notes = c"one limiter key per limit spec, in the same order".as_ptr();
    spec.flags = u64::from(KEY_FLAGS);
    spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    spec.bs.index.pos = FIRST_KEY as c_int - 1;
    spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
    spec.fk.keynum.keynumidx = 0;
    spec.fk.keynum.firstkey = 1;
    spec.fk.keynum.keystep = 1;
    let mut key_specs = [spec, end()];

    use raw::{
        RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK as BLOCK,
        RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER as INTEGER,
        RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY as KEY,
        RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING as STRING,
        RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_UNIX_TIME as UNIX_TIME,
        REDISMODULE_CMD_ARG_MULTIPLE as MULTIPLE, REDISMODULE_CMD_ARG_NONE as NONE,
        REDISMODULE_CMD_ARG_OPTIONAL as OPTIONAL,
    };
    let mut limit_args = [
        arg(c"algorithm", STRING, None, NONE),
        arg(c"limit", INTEGER, None, NONE),
        arg(c"period", STRING, None, NONE),
        arg(c"capacity", INTEGER, Some(c"BURST"), OPTIONAL),
        end(),
    ];
    let mut key = arg(c"key", KEY, None, MULTIPLE);
    key.key_spec_index = 0;
    let mut limits = arg(c"limit-spec", BLOCK, None, MULTIPLE);
    limits.subargs = limit_args.as_mut_ptr();
    let mut args = [
        arg(c"numkeys", INTEGER, None, NONE),
        key,
        limits,
        arg(c"cost", INTEGER, Some(c"COST"), OPTIONAL),
        arg(c"unix-ms", UNIX_TIME, Some(c"AT"), OPTIONAL),
        end(),
    ];
    let info = raw::RedisModuleCommandInfo {
        version: &INFO_VERSION,
        summary: c"Checks a request against several limits at once: admitted only if every \
                   limit admits it, then consumed from all of them"
            .as_ptr(),
        complexity: c"O(N) for N keys (sliding-log keys: O(log size) each)".as_ptr(),
        since: c"0.1.0".as_ptr(),
        history: ptr::null_mut(),
        tips: ptr::null(),
        // Every shorter call is answered by the parser, which names what is missing.
        arity: -2,
        key_specs: key_specs.as_mut_ptr(),
        args: args.as_mut_ptr(),
    };
    // SAFETY: a command of this module, and an info struct whose pointers (all into the arrays
    // above or static strings) outlive the call; Redis copies what it keeps.
    let status = unsafe { rm!(RedisModule_SetCommandInfo)(command, &info) };
    if status != raw::REDISMODULE_OK as c_int {
        return Err("RedisModule_SetCommandInfo refused ratelimit.checkall's key spec");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(allowed: bool, limit: u64, remaining: u64, retry: i64, reset: u64) -> Decision {
        Decision {
            allowed,
            limit,
            remaining,
            retry_after_ms: retry,
            reset_after_ms: reset,
            delay_ms: 0,
        }
    }

    #[test]
    fn the_overall_decision_follows_the_spec() {
        let a = decision(true, 10, 4, 0, 600);
        let b = decision(false, 3, 0, 250, 900);
        let c = decision(false, 5, 0, 400, 100);
        let overall = combine(&[a, b, c]);
        assert!(!overall.allowed);
        // The first key with the least remaining gives the limit.
        assert_eq!((overall.limit, overall.remaining), (3, 0));
        assert_eq!(overall.retry_after_ms, 400);
        assert_eq!(overall.reset_after_ms, 900);
        let never = decision(false, 2, 2, -1, 0);
        assert_eq!(combine(&[b, never, c]).retry_after_ms, -1);
        let mut queued = a;
        queued.delay_ms = 70;
        let all = combine(&[a, queued]);
        assert!(all.allowed);
        assert_eq!((all.delay_ms, all.retry_after_ms), (70, 0));
        assert_eq!(combine(&[a]), a);
    }
}
