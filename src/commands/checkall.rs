//! `RATELIMIT.CHECKALL numkeys key [key ...] algorithm limit period [BURST capacity] [...]
//! [COST cost] [AT unix-ms]`: several limits in one atomic, all-or-nothing call.
//!
//! Every limit is first decided without writing (a PEEK, or for a key named twice a CHECK on a
//! copy). Only if every limit admits the request is each one evaluated again, this time writing
//! its state and expiry and replicating the write exactly as CHECK does; the first pass decided
//! on the same states, so the second admits too. If any limit rejects, nothing is written.
//!
//! A key may be named more than once: each occurrence is a limit of its own, decided and consumed
//! in order, exactly as the same CHECKs one after the other would be (the second sees what the
//! first consumed), and still all or nothing. The command opens one handle per distinct key.
//!
//! The keys are declared two ways, because the legacy first/last/step triple cannot express
//! `numkeys`. The command is registered with `getkeys-api` and answers Redis's key-position
//! requests itself (Redis 7.0 uses that for cluster slot checks; it works on every Redis and
//! Valkey); where `RedisModule_SetCommandInfo` exists (7.0+) it also gets a `numkeys` key spec
//! (begin search at index 1, keynum 0, first key 1, step 1; see `registry`), which
//! `COMMAND INFO`/`COMMAND DOCS`
//! show and which Redis prefers for `COMMAND GETKEYS` and ACL key checks. Both name the same
//! arguments, `2 ..= numkeys + 1`.

use std::ffi::c_int;

use redis_module::raw;
use redis_ratelimit_core::algorithms::block::{blocked_answer, check_blocking, Blocking};
use redis_ratelimit_core::algorithms::{Decision, Limiter, Request};
use redis_ratelimit_core::codec::Change;
use redis_ratelimit_core::error;
use redis_ratelimit_core::few::{Few, FEW_KEYS};
use redis_ratelimit_core::integer::parse_integer;
use redis_ratelimit_core::parse::{
    one_argument_specs_from, parse_checkall, split_checkall, CheckAllArgs, CheckAllError,
    CHECKALL_WORDS,
};
use redis_ratelimit_core::policy::{self, Mode};

use super::call::{handler, now_ms, Call, KeyGroups};
use super::decide::{evaluate, Evaluation};
use super::policy::{resolve, Through};
use super::registry::{Arg, ArgType, Command, Keys, KEY_UPDATED, LIMIT};
use super::txn::refused;
use super::txn::{Event, Txn};
use crate::api::{has, rm};
use crate::config::max_log_limit;
use crate::store::Slot;

const NAME: &str = "ratelimit.checkall";

/// The first key is argument 2, after `numkeys`.
const FIRST_KEY: usize = 2;

/// The arguments: `numkeys key [key ...] limit-spec [limit-spec ...] [COST cost] [AT unix-ms]`.
const ARGS: [Arg; 5] = [
    Arg::new(c"numkeys", ArgType::Integer),
    Arg::new(c"key", ArgType::Key).multiple(),
    Arg::one_of(c"limit", &LIMIT).multiple(),
    Arg::option(c"COST", c"cost", ArgType::Integer),
    Arg::option(c"AT", c"unix-ms", ArgType::UnixTime),
];

pub(crate) const COMMAND: Command = Command {
    name: c"ratelimit.checkall",
    // getkeys-api: the keys follow `numkeys` (see the module comment).
    flags: c"write deny-oom getkeys-api",
    // Every shorter call is answered by the parser, which names what is missing.
    arity: -2,
    keys: Keys::Counted { flags: KEY_UPDATED },
    summary: c"Checks a request against several limits at once: admitted only if every limit \
               admits it, then consumed from all of them",
    complexity: c"O(N) for N keys (sliding-log keys: O(log size) each)",
    args: &ARGS,
    acl: "write slow ratelimit",
    counted: true,
    handler: handler!(run),
};

/// One limit of the call: what it applies, and how its answer counts.
struct Limit {
    request: Request,
    /// How long a rejection blocks the key (`BLOCK`), if at all.
    block_ms: Option<u64>,
    /// The policy the limit named: its mode and counters.
    through: Through,
    /// Its policy's mode, else enforced.
    mode: Mode,
}

/// The arguments a CHECKALL reads in place without allocating: numkeys, eight keys with a
/// spec of five words each (`algorithm limit period BURST capacity`), `COST` and `AT`, and room
/// to spare. A longer call's go on the heap.
const INLINE_ARGS: usize = 64;

/// `parse_checkall` of a call's words once its specs given as one argument are split: out of
/// line, so that the parse of every call stays inlined in `run`.
#[inline(never)]
fn parse_again<'a>(
    words: &[&'a [u8]],
    max_log_limit: u64,
) -> Result<CheckAllArgs<'a>, CheckAllError> {
    parse_checkall(words, max_log_limit)
}

fn run(call: &Call) -> c_int {
    if is_keys_position_request(call) {
        report_keys(call);
        return raw::REDISMODULE_OK as c_int;
    }
    // Up to `FEW_KEYS` keys, every list below is on the stack: nothing is allocated.
    let args: Few<&[u8], INLINE_ARGS> = call.args_from(1).collect();
    // Specs given as one argument are read as their words (an error names positions in what was
    // read). Words alone: only their parse's error pays for the look (no algorithm holds a
    // space, so a spec of one argument fails the words' parse). One parse call, inlined here.
    let max_log_limit = max_log_limit();
    let mut split: Few<&[u8], CHECKALL_WORDS> = Few::new();
    let mut parsed = parse_checkall(&args, max_log_limit);
    if parsed.is_err() {
        if let Some(first) = one_argument_specs_from(&args) {
            if let Err(error) = split_checkall(&args, first, &mut split) {
                return call.error(&error.message(NAME, &args));
            }
            parsed = parse_again(&split, max_log_limit);
        }
    }
    let words: &[&[u8]] = if split.is_empty() { &args } else { &split };
    let parsed = match parsed {
        Ok(parsed) => parsed,
        Err(error) => return call.error(&error.message(NAME, words)),
    };
    let count = parsed.numkeys;
    let now_ms = parsed.at_ms.unwrap_or_else(now_ms);
    let mut limits: Few<Limit, FEW_KEYS> = Few::new();
    for spec in &parsed.specs {
        let resolved = match resolve(spec) {
            Ok(resolved) => resolved,
            Err(message) => return call.error(&message),
        };
        limits.push(Limit {
            request: Request {
                algorithm: resolved.algorithm,
                params: resolved.params,
                cost: parsed.cost,
                now_ms,
            },
            block_ms: resolved.block_ms,
            mode: resolved
                .through
                .as_ref()
                .map_or(Mode::Enforce, |(mode, _)| *mode),
            through: resolved.through,
        });
    }
    // One transaction per distinct key (see `KeyGroups`); a key named twice takes both its specs.
    let groups = KeyGroups::of(&args[1..=count]);
    let mut txns: Few<Txn, FEW_KEYS> = Few::new();
    for &i in &groups.first {
        txns.push(Txn::open(call, call.raw_arg(FIRST_KEY + i), true));
    }

    // First pass: decide every limit without writing. An error (WRONGTYPE, another algorithm)
    // is the reply, and nothing has changed.
    let mut evaluations: Few<Evaluation, FEW_KEYS> = Few::new();
    if let Err(message) = decide(&mut txns, &groups, &limits, &mut evaluations) {
        return call.error(&message);
    }
    // Admitted when every limit enforced admits; a limit in shadow mode never rejects.
    let admitted = evaluations.iter().zip(&limits).all(|(evaluation, limit)| {
        evaluation.outcome.decision.allowed || limit.mode == Mode::Shadow
    });

    if admitted {
        // Second pass: consume from every limit that admits, in order (a shadow limit that
        // rejects consumes nothing, as a rejected CHECK does). Each limit was just decided on
        // the state the ones before it leave, so every one admits again.
        for (i, limit) in limits.iter().enumerate() {
            let decided = &mut evaluations[i].outcome;
            if !decided.decision.allowed {
                continue;
            }
            let txn = &mut txns[groups.group[i]];
            let evaluation = match evaluate(txn, &limit.request, true, None) {
                Ok(evaluation) => evaluation,
                Err(message) => return call.error(&message),
            };
            debug_assert_eq!(evaluation.outcome.decision, decided.decision);
            *decided = evaluation.outcome;
        }
    }
    // Blocks: a limit with BLOCK that its algorithm rejected (a cost it can ever admit, on a key
    // not blocked already) blocks its key, whether or not the request was admitted (a shadow
    // limit stores what enforcement would). Once per key, the first such limit's (the key's
    // `ratelimit.blocked` is raised then); nothing else of the key changes, whatever the limits
    // before it were decided on.
    for (i, limit) in limits.iter().enumerate() {
        let (evaluation, txn) = (&mut evaluations[i], &mut txns[groups.group[i]]);
        let outcome = &mut evaluation.outcome;
        let starts = parsed.cost > 0
            && !outcome.decision.allowed
            && outcome.decision.retry_after_ms >= 0
            && evaluation.blocking == Blocking::None
            && !txn.notifies(Event::Blocked);
        let Some(block_ms) = limit.block_ms.filter(|_| starts) else {
            continue;
        };
        let until_ms = outcome.t_ms.saturating_add(block_ms);
        match block_key(txn, until_ms) {
            Ok(true) => {
                txn.notify(Event::Blocked);
                outcome.decision = blocked_answer(&outcome.decision, until_ms, outcome.t_ms);
            }
            Ok(false) => {}
            Err(message) => return call.error(&message),
        }
    }
    // One decision per limit, counted by its key's transaction: admitted (consumed) or not,
    // whatever the key alone would say; a policy also counts what its own limit would have
    // rejected in shadow mode. A limit its key's block rejected counts as blocked too.
    // Once per key (events are raised once): `ratelimit.rejected` for the keys with an enforced
    // limit that rejected (when the request is rejected), `ratelimit.shadow-rejected` for those
    // with a shadow limit that would have.
    for (i, (limit, evaluation)) in limits.iter().zip(&evaluations).enumerate() {
        let refused = !evaluation.outcome.decision.allowed;
        let shadowed = limit.mode == Mode::Shadow && refused;
        let txn = &mut txns[groups.group[i]];
        txn.count(
            limit.request.algorithm.into(),
            admitted,
            evaluation.blocking == Blocking::Blocked,
            limit
                .through
                .as_ref()
                .map(|(_, counters)| (&**counters, shadowed)),
        );
        if refused && limit.mode == Mode::Enforce && !admitted {
            txn.notify(Event::Rejected);
        }
        if shadowed {
            txn.notify(Event::ShadowRejected);
        }
    }
    Txn::commit_all(&mut txns);

    // Each limit's answer: its own decision, a shadow limit's rejection answered as admitted.
    let decisions: Few<Decision, FEW_KEYS> = evaluations
        .iter()
        .zip(&limits)
        .map(|(evaluation, limit)| policy::answer(evaluation.outcome.decision, limit.mode).0)
        .collect();
    reply(call, &combine(&decisions), &decisions);
    raw::REDISMODULE_OK as c_int
}

/// Every limit's decision, without writing, and whether its key's block decided it, into
/// `evaluations`. A key named once is peeked at. A key named more than once is decided on a copy
/// of its limiter, limit after limit, each one seeing what the admitted ones before it consumed:
/// what the same CHECKs in sequence would answer.
fn decide(
    txns: &mut [Txn],
    groups: &KeyGroups,
    limits: &[Limit],
    evaluations: &mut Few<Evaluation, FEW_KEYS>,
) -> Result<(), String> {
    if !groups.repeated() {
        // Every key once: limit `i` is key `i`'s.
        for (limit, txn) in limits.iter().zip(txns) {
            evaluations.push(evaluate(txn, &limit.request, false, None)?);
        }
        return Ok(());
    }
    let mut occurrences: Few<usize, FEW_KEYS> = Few::filled(0, txns.len());
    for &group in &groups.group {
        occurrences[group] += 1;
    }
    let mut copies: Few<Option<Option<Limiter>>, FEW_KEYS> = Few::filled(None, txns.len());
    for (limit, &group) in limits.iter().zip(&groups.group) {
        let request = &limit.request;
        let txn = &mut txns[group];
        if occurrences[group] == 1 {
            evaluations.push(evaluate(txn, request, false, None)?);
            continue;
        }
        let copy = match &mut copies[group] {
            Some(copy) => copy,
            empty => empty.insert(match txn.slot() {
                Slot::WrongType => return Err(error::WRONG_TYPE.to_string()),
                Slot::Empty => None,
                Slot::Limiter(limiter) => Some(Limiter::clone(&limiter)),
            }),
        };
        let mut created = None;
        let (outcome, _, blocking) =
            check_blocking(copy.as_mut(), request, true, None, &mut created).map_err(
                |mismatch| {
                    error::algorithm_mismatch(mismatch.stored.name(), request.algorithm.name())
                },
            )?;
        if let Some(limiter) = created {
            *copy = Some(limiter);
        }
        evaluations.push(Evaluation { outcome, blocking });
    }
    Ok(())
}

/// Blocks the limiter in the transaction's key until `until_ms` (a rejection with BLOCK): stores
/// it, and stages its expiry and its replication as such. False when the key holds no limiter.
fn block_key(txn: &mut Txn, until_ms: u64) -> Result<bool, String> {
    let expires_at_ms = match txn.slot() {
        Slot::Limiter(mut limiter) => {
            limiter.blocked_until_ms = until_ms;
            limiter.store().map_err(refused)?;
            limiter.expires_at_ms()
        }
        Slot::Empty | Slot::WrongType => return Ok(false),
    };
    txn.expire_at(expires_at_ms);
    Change::Block { until_ms }.encode(txn.replicate());
    Ok(true)
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
        match super::field_names::get() {
            Some(names) => names.send(call.ctx, names.limits),
            None => call.reply_name(c"limits"),
        }
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
                rm!(RedisModule_KeyAtPosWithFlags)(call.ctx, pos, KEY_UPDATED as c_int);
            } else {
                rm!(RedisModule_KeyAtPos)(call.ctx, pos);
            }
        }
    }
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
