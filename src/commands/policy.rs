//! `RATELIMIT.POLICY SET|GET|DEL|LIST`: limits defined on the server by name, and how a call's
//! `POLICY name` is resolved to the limit it applies.
//!
//! ```text
//! RATELIMIT.POLICY SET name algorithm limit period [BURST capacity] [SHADOW]   -> OK
//! RATELIMIT.POLICY SET name concurrency limit lease-duration [SHADOW]         -> OK
//! RATELIMIT.POLICY GET name    -> algorithm, limit, period_ms, burst, mode (nil if none);
//!                                 a concurrency policy: algorithm, limit, lease_ms, mode
//! RATELIMIT.POLICY DEL name    -> 1 if it existed, else 0
//! RATELIMIT.POLICY LIST        -> the names, sorted
//! ```
//!
//! SET and DEL are replicated as they were called (they are deterministic) and only when they
//! change something: a SET of the very definition a name has, or a DEL of a missing name, writes
//! nothing. The policies are saved in the RDB beside the keys (`store/policies.rs`); for an AOF
//! without an RDB preamble, [`reemit`] writes every definition into the new AOF when a rewrite
//! starts.

use std::ffi::{c_int, CString};
use std::sync::Arc;

use redis_module::raw;
use redis_ratelimit_core::algorithms::{Algorithm, Kind, Params};
use redis_ratelimit_core::error::{self, ArgError};
use redis_ratelimit_core::parse::{parse_policy_set, LeaseLimit, LimitArg};
use redis_ratelimit_core::policy::{self, Counters, Mode, Policy, SetOutcome};

use super::call::{handler, replicate_verbatim, Call};
use super::registry::{Arg, ArgType, Command, Container, Keys, LIMIT_SPEC};
use crate::api::{has, rm};
use crate::config::{max_log_limit, max_policies, MAX_MAX_LOG_LIMIT, MAX_MAX_POLICIES};
use crate::log::log_warning;

const SET_ARGS: [Arg; 7] = [
    Arg::new(c"name", ArgType::String),
    LIMIT_SPEC[0],
    LIMIT_SPEC[1],
    LIMIT_SPEC[2],
    LIMIT_SPEC[3],
    LIMIT_SPEC[4],
    Arg::flag(c"SHADOW"),
];
const NAME_ARG: [Arg; 1] = [Arg::new(c"name", ArgType::String)];

/// Defining and removing policies is for operators, not tenants: `@admin` (and `@dangerous`),
/// beside `@ratelimit`, so that `+@ratelimit -@admin` checks but does not define.
pub(crate) const SET: Command = Command {
    name: c"set",
    flags: c"write deny-oom admin",
    arity: -6,
    keys: Keys::None,
    summary: c"Defines a named limit (replacing one of that name)",
    complexity: c"O(1)",
    args: &SET_ARGS,
    acl: "admin dangerous slow ratelimit",
    counted: false,
    handler: handler!(run_set),
};

pub(crate) const GET: Command = Command {
    name: c"get",
    flags: c"readonly fast",
    arity: 3,
    keys: Keys::None,
    summary: c"Answers a named limit's definition",
    complexity: c"O(1)",
    args: &NAME_ARG,
    acl: "read fast ratelimit",
    counted: false,
    handler: handler!(run_get),
};

pub(crate) const DEL: Command = Command {
    name: c"del",
    flags: c"write admin",
    arity: 3,
    keys: Keys::None,
    summary: c"Removes a named limit (the keys it was used on keep their state)",
    complexity: c"O(1)",
    args: &NAME_ARG,
    acl: "admin dangerous slow ratelimit",
    counted: false,
    handler: handler!(run_del),
};

pub(crate) const LIST: Command = Command {
    name: c"list",
    flags: c"readonly",
    arity: 2,
    keys: Keys::None,
    summary: c"Answers the names of the defined limits, sorted",
    complexity: c"O(N log N) for N policies",
    args: &[],
    acl: "read slow ratelimit",
    counted: false,
    handler: handler!(run_list),
};

pub(crate) const CONTAINER: Container = Container {
    name: CONTAINER_NAME,
    summary: c"Named limits defined on the server: SET, GET, DEL, LIST",
    subcommands: &[&SET, &GET, &DEL, &LIST],
};

const CONTAINER_NAME: &std::ffi::CStr = c"ratelimit.policy";

/// The policy a call went through, if any: its mode and counters.
pub(crate) type Through = Option<(Mode, Arc<Counters>)>;

/// The limit a call applies, resolved from its arguments.
pub(crate) struct Resolved {
    pub algorithm: Algorithm,
    pub params: Params,
    /// How long a rejection blocks the key (`BLOCK`), if at all.
    pub block_ms: Option<u64>,
    /// The policy the call named: its mode and counters.
    pub through: Through,
}

/// The limit `limit` names: a spec as it is, a policy looked up in the server's table (locked
/// only then). The error is the reply: an unknown or malformed name, or a sliding-log policy
/// above `ratelimit.max-log-limit` (which refuses the same limit written inline).
#[inline(always)]
pub(crate) fn resolve(limit: &LimitArg) -> Result<Resolved, String> {
    match *limit {
        LimitArg::Inline(spec) => Ok(Resolved {
            algorithm: spec.algorithm,
            params: spec.params,
            block_ms: spec.block_ms,
            through: None,
        }),
        LimitArg::Policy(name) => {
            let found = policy::table().get(name);
            let Some((found, counters)) = found else {
                return Err(if policy::valid_name(name) {
                    error::no_such_policy(name)
                } else {
                    ArgError::PolicyName.message("", &[])
                });
            };
            let Kind::Rate(algorithm) = found.kind else {
                return Err(error::policy_kind(name, found.kind.name()));
            };
            let max = max_log_limit();
            if algorithm == Algorithm::SlidingLog && found.params.limit > max {
                let limit = found.params.limit;
                return Err(ArgError::LogLimit { limit, max }.message("", &[]));
            }
            Ok(Resolved {
                algorithm,
                params: found.params,
                block_ms: found.block_ms,
                through: Some((found.mode, counters)),
            })
        }
    }
}

/// The limit and lease duration an ACQUIRE's `limit` names, and the policy it went through. The
/// error is the reply: an unknown or malformed name, or a policy of a rate limit.
pub(crate) fn resolve_lease(limit: &LeaseLimit) -> Result<(Params, Through), String> {
    match *limit {
        LeaseLimit::Inline(params) => Ok((params, None)),
        LeaseLimit::Policy(name) => {
            let found = policy::table().get(name);
            let Some((found, counters)) = found else {
                return Err(if policy::valid_name(name) {
                    error::no_such_policy(name)
                } else {
                    ArgError::PolicyName.message("", &[])
                });
            };
            if found.kind != Kind::Leases {
                return Err(error::policy_kind(name, found.kind.name()));
            }
            Ok((found.params, Some((found.mode, counters))))
        }
    }
}

/// The arguments after `RATELIMIT.POLICY <subcommand>`.
fn args_after(call: &Call) -> Vec<&[u8]> {
    (2..call.argc()).map(|i| call.bytes(i)).collect()
}

fn run_set(call: &Call) -> c_int {
    let args = args_after(call);
    // The master's stream and an AOF being loaded were accepted under the master's (or an
    // earlier) settings: held to the hard caps only, so a lower local setting cannot make a
    // replica or a restarted server drop a definition.
    let replayed = call.replayed();
    let log_bound = if replayed {
        MAX_MAX_LOG_LIMIT as u64
    } else {
        max_log_limit()
    };
    let definition = match parse_policy_set(&args, log_bound) {
        Ok(definition) => definition,
        Err(error) => return call.error(&error.message("ratelimit.policy|set", &args)),
    };
    let policy = Policy {
        kind: definition.kind,
        params: definition.params,
        mode: if definition.shadow {
            Mode::Shadow
        } else {
            Mode::Enforce
        },
        block_ms: definition.block_ms,
    };
    let max = if replayed {
        MAX_MAX_POLICIES as u64
    } else {
        max_policies()
    };
    let outcome = policy::table().set(definition.name, policy, max as usize);
    match outcome {
        SetOutcome::Full => return call.error(&error::too_many_policies(max)),
        SetOutcome::Added | SetOutcome::Replaced => replicate_verbatim(call),
        SetOutcome::Unchanged => {}
    }
    call.reply_name(c"OK");
    raw::REDISMODULE_OK as c_int
}

fn run_get(call: &Call) -> c_int {
    if call.argc() != 3 {
        return call.error(&ArgError::WrongArity.message("ratelimit.policy|get", &[]));
    }
    let name = call.bytes(2);
    let found = policy::table().get(name).map(|(policy, _)| policy);
    let Some(policy) = found else {
        if !policy::valid_name(name) {
            return call.error(error::POLICY_NAME);
        }
        call.reply_null();
        return raw::REDISMODULE_OK as c_int;
    };
    let resp3 = call.resp3();
    if policy.kind == Kind::Leases {
        call.reply_map(4, resp3);
        call.reply_name(c"algorithm");
        reply_text(call, policy.kind.name());
        for (field, value) in [
            (c"limit", policy.params.limit),
            (c"lease_ms", policy.params.period_ms),
        ] {
            call.reply_name(field);
            call.reply_integer(i64::try_from(value).unwrap_or(i64::MAX));
        }
        call.reply_name(c"mode");
        reply_text(call, policy.mode.name());
        return raw::REDISMODULE_OK as c_int;
    }
    call.reply_map(6, resp3);
    call.reply_name(c"algorithm");
    reply_text(call, policy.kind.name());
    for (field, value) in [
        (c"limit", policy.params.limit),
        (c"period_ms", policy.params.period_ms),
        (c"burst", policy.params.capacity),
    ] {
        call.reply_name(field);
        call.reply_integer(i64::try_from(value).unwrap_or(i64::MAX));
    }
    call.reply_name(c"mode");
    reply_text(call, policy.mode.name());
    call.reply_name(c"block_ms");
    call.reply_integer(i64::try_from(policy.block_ms.unwrap_or(0)).unwrap_or(i64::MAX));
    raw::REDISMODULE_OK as c_int
}

fn run_del(call: &Call) -> c_int {
    if call.argc() != 3 {
        return call.error(&ArgError::WrongArity.message("ratelimit.policy|del", &[]));
    }
    let name = call.bytes(2);
    if !policy::valid_name(name) {
        return call.error(error::POLICY_NAME);
    }
    let existed = policy::table().delete(name);
    if existed {
        replicate_verbatim(call);
    }
    call.reply_integer(i64::from(existed));
    raw::REDISMODULE_OK as c_int
}

fn run_list(call: &Call) -> c_int {
    if call.argc() != 2 {
        return call.error(&ArgError::WrongArity.message("ratelimit.policy|list", &[]));
    }
    let names: Vec<Vec<u8>> = policy::table()
        .sorted()
        .keys()
        .map(|name| name.to_vec())
        .collect();
    call.reply_array(names.len());
    for name in names {
        call.reply_bulk(&name);
    }
    raw::REDISMODULE_OK as c_int
}

fn reply_text(call: &Call, text: &str) {
    let text = CString::new(text).unwrap_or_default();
    call.reply_name(&text);
}

/// The arguments of the `RATELIMIT.POLICY SET` that defines `policy` as `name`.
pub(crate) fn set_arguments(name: &[u8], policy: &Policy) -> Vec<Vec<u8>> {
    let mut args = vec![
        b"SET".to_vec(),
        name.to_vec(),
        policy.kind.name().as_bytes().to_vec(),
        policy.params.limit.to_string().into_bytes(),
        format!("{}ms", policy.params.period_ms).into_bytes(),
    ];
    if policy.kind.is_bucket() {
        args.push(b"BURST".to_vec());
        args.push(policy.params.capacity.to_string().into_bytes());
    }
    if let Some(block_ms) = policy.block_ms {
        args.push(b"BLOCK".to_vec());
        args.push(format!("{block_ms}ms").into_bytes());
    }
    if policy.mode == Mode::Shadow {
        args.push(b"SHADOW".to_vec());
    }
    args
}

/// Writes every definition into the replication stream and the AOF, as `RATELIMIT.POLICY SET`
/// commands: run just after an AOF rewrite without an RDB preamble started (from a timer the
/// fork's parent side sets, outside any command; Redis opened the AOF file the rewrite's later
/// writes go to before it forked), since such a rewrite saves keys but not the module's data.
/// Replicas and the AOF take them as no-ops where the definitions are there already.
pub(crate) fn reemit(ctx: *mut raw::RedisModuleCtx) {
    if !(has!(RedisModule_CreateString) && has!(RedisModule_FreeString)) {
        return;
    }
    let definitions = policy::table().definitions();
    for (name, policy) in definitions {
        let args = set_arguments(&name, &policy);
        let strings: Vec<*mut raw::RedisModuleString> = args
            .iter()
            // SAFETY: the event's context; Redis copies the bytes into a new string.
            .map(|arg| unsafe {
                rm!(RedisModule_CreateString)(ctx, arg.as_ptr().cast(), arg.len())
            })
            .collect();
        // SAFETY: a registered command; "v" = an array of strings and its length, valid for
        // the call (Redis takes references of its own).
        let status = unsafe {
            rm!(RedisModule_Replicate)(
                ctx,
                CONTAINER_NAME.as_ptr(),
                c"v".as_ptr(),
                strings.as_ptr(),
                strings.len(),
            )
        };
        for string in strings {
            // SAFETY: made above, freed once.
            unsafe { rm!(RedisModule_FreeString)(ctx, string) };
        }
        if status != raw::REDISMODULE_OK as c_int {
            log_warning("ratelimit: could not write a policy into the rewritten AOF");
        }
    }
}
