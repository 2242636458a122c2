//! redis-ratelimit: distributed rate limiting as native Redis commands.
//!
//! Registration only: the module, its data type, its commands and its INFO section. The
//! arithmetic lives in the core crate (`redis_ratelimit_core`: the algorithms, argument parsing,
//! the binary codec), the Redis glue in the `commands` and `store` modules.

#![warn(clippy::undocumented_unsafe_blocks)]

mod api;
pub(crate) mod commands;

pub(crate) mod config;
pub(crate) mod log;
pub(crate) mod server;
pub(crate) mod stats;
pub(crate) mod store;

use std::ffi::{c_int, CStr};
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::{raw, Context, RedisString, Status};
use redis_ratelimit_core::algorithms::Kind;
use redis_ratelimit_core::policy;

use crate::store::LIMITER_TYPE;

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    if let Some(name) = api::missing_required() {
        ctx.log_warning(&format!(
            "ratelimit: this server lacks {name}; Redis 7.0 or later is required"
        ));
        return Status::Err;
    }
    // Module configs (`ratelimit.*`): load arguments set their initial values, then Redis applies
    // the `ratelimit.*` directives; any bad value refuses the load. The load argument `dialects`
    // chooses the dialect commands to register.
    let dialect_names: Vec<std::borrow::Cow<'_, str>> = commands::dialects::COMMANDS
        .iter()
        .map(|command| command.name.to_string_lossy())
        .collect();
    let names: Vec<&str> = dialect_names.iter().map(|name| name.as_ref()).collect();
    let wanted = match config::load(ctx.ctx, args, &names) {
        Ok(wanted) => wanted,
        Err(why) => {
            ctx.log_warning(&format!("ratelimit: {why}; the module is not loaded"));
            return Status::Err;
        }
    };
    // SAFETY: called once from OnLoad with the module's context.
    unsafe {
        // HANDLE_IO_ERRORS: rdb_load reports a truncated RDB instead of Redis aborting.
        // NO_IMPLICIT_SIGNAL_MODIFIED: only a call that writes signals its key (store::Key).
        api::rm!(RedisModule_SetModuleOptions)(
            ctx.ctx,
            (raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS
                | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED) as c_int,
        );
    }
    // SAFETY: OnLoad context; replaces the crate's default INFO callback with ours.
    unsafe { api::rm!(RedisModule_RegisterInfoFunc)(ctx.ctx, Some(info)) };
    let server = server::detect(ctx.ctx);
    if !commands::field_names::make(ctx.ctx) {
        ctx.log_notice("ratelimit: RESP3 replies send their keys as simple strings");
    }
    let category = commands::registry::add_acl_category(ctx.ctx);
    for command in commands::COMMANDS {
        if let Err(why) = commands::registry::register(ctx.ctx, command) {
            ctx.log_warning(&format!("ratelimit: {why}; the module is not loaded"));
            return Status::Err;
        }
    }
    for command in commands::COMMANDS.iter().filter(|command| command.counted) {
        commands::resetstat::counted(command.name);
    }
    if let Err(why) = commands::registry::register_container(ctx.ctx, &commands::policy::CONTAINER)
    {
        ctx.log_warning(&format!("ratelimit: {why}; the module is not loaded"));
        return Status::Err;
    }
    // A dataset being loaded replaces the policies (store/policies.rs); an AOF rewrite without
    // an RDB preamble gets them written into it (commands/policy.rs).
    for (id, callback) in [
        (
            raw::REDISMODULE_EVENT_LOADING,
            on_loading as unsafe extern "C" fn(_, _, _, _),
        ),
        (raw::REDISMODULE_EVENT_FORK_CHILD, on_fork),
    ] {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        // SAFETY: the OnLoad context, and callbacks that live as long as the module.
        let status =
            unsafe { api::rm!(RedisModule_SubscribeToServerEvent)(ctx.ctx, event, Some(callback)) };
        if status != raw::REDISMODULE_OK as c_int {
            ctx.log_warning("ratelimit: cannot follow the server's loading and fork events; the module is not loaded");
            return Status::Err;
        }
    }
    // The dialects the load arguments ask for, unless the server (GCRA in a future Redis) or
    // another module (redis-cell's CL.THROTTLE) has the name already: theirs stays, and the log
    // says which is in use.
    let mut registered = Vec::new();
    for (command, wanted) in commands::dialects::COMMANDS.into_iter().zip(wanted) {
        let name = command.name.to_string_lossy();
        if !wanted {
            ctx.log_notice(&format!(
                "ratelimit: {name} not registered (load argument dialects)"
            ));
            continue;
        }
        match commands::registry::command_exists(ctx.ctx, command.name) {
            Some(false) => {
                if let Err(why) = commands::registry::register(ctx.ctx, command) {
                    ctx.log_warning(&format!("ratelimit: {why}; the module is not loaded"));
                    return Status::Err;
                }
                commands::resetstat::counted(command.name);
                ctx.log_notice(&format!("ratelimit: {name} is the module's"));
                registered.push(name);
            }
            Some(true) => ctx.log_notice(&format!(
                "ratelimit: the server already has {name}; that one stays in use"
            )),
            None => ctx.log_warning(&format!(
                "ratelimit: cannot tell whether the server has {name}; not registered"
            )),
        }
    }
    if !commands::resetstat::register(ctx.ctx) {
        ctx.log_notice("ratelimit: CONFIG RESETSTAT will not reset the module's counters here");
    }
    ctx.log_notice(&format!(
        "ratelimit: loaded on {}; optional APIs in use: {}; ACL category @ratelimit: {}; \
         dialects registered: {}",
        server.release,
        if server.apis.is_empty() {
            "none"
        } else {
            &server.apis
        },
        if category {
            "yes"
        } else {
            "no (needs Redis 7.4+ or Valkey 8)"
        },
        if registered.is_empty() {
            "none".to_string()
        } else {
            registered.join(", ")
        }
    ));
    Status::Ok
}

/// Loading a dataset: the policies it holds replace the server's.
unsafe extern "C" fn on_loading(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut std::ffi::c_void,
) {
    let _ = std::panic::catch_unwind(|| store::policies::loading(subevent));
}

/// A fork: when it is an AOF rewrite without an RDB preamble, the policies are written into the
/// AOF the rewrite continues (see `commands::policy::reemit`). Not from here: the fork may run
/// inside a command (`BGREWRITEAOF`, `CONFIG SET appendonly yes`), and what a module replicates
/// during a command is propagated with that command, in one MULTI. A timer runs the writes at
/// the next turn of the event loop, outside any command, still into the new AOF file; one timer
/// at a time, as it writes every definition there is when it runs.
unsafe extern "C" fn on_fork(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut std::ffi::c_void,
) {
    if subevent != raw::REDISMODULE_SUBEVENT_FORK_CHILD_BORN {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        if !policy::table().is_empty()
            && server::aof_rewrite_without_preamble(ctx)
            && !REEMIT_PENDING.swap(true, Ordering::Relaxed)
            && !arm_reemit(ctx, 0)
        {
            REEMIT_PENDING.store(false, Ordering::Relaxed);
        }
    });
}

/// Whether a [`reemit`] timer is armed.
static REEMIT_PENDING: AtomicBool = AtomicBool::new(false);

/// How often [`reemit`] looks again while writes are paused.
const REEMIT_RETRY_MS: i64 = 100;

/// Arms the [`reemit`] timer; false where the server has no timers.
fn arm_reemit(ctx: *mut raw::RedisModuleCtx, delay_ms: i64) -> bool {
    if !api::has!(RedisModule_CreateTimer) {
        return false;
    }
    // SAFETY: a context Redis passed us; a callback that lives as long as the module; no data.
    unsafe { api::rm!(RedisModule_CreateTimer)(ctx, delay_ms, Some(reemit), std::ptr::null_mut()) };
    true
}

/// The timer [`on_fork`] sets: the policies written into the replication stream and the AOF.
/// Never while writes are paused (`CLIENT PAUSE WRITE`, `FAILOVER`, a cluster manual failover;
/// a rewrite scheduled behind a BGSAVE can start inside one): Redis aborts on anything
/// propagated then, so the timer looks again every [`REEMIT_RETRY_MS`] until the pause ends.
/// The definitions then go into the AOF after the pause's other writes, which are none.
unsafe extern "C" fn reemit(ctx: *mut raw::RedisModuleCtx, _data: *mut std::ffi::c_void) {
    let _ = std::panic::catch_unwind(|| {
        // Paused: looked at again later (without timers, given up: never propagate in a pause).
        let retry = server::writes_paused();
        if retry && arm_reemit(ctx, REEMIT_RETRY_MS) {
            return;
        }
        REEMIT_PENDING.store(false, Ordering::Relaxed);
        if !retry {
            commands::policy::reemit(ctx);
        }
    });
}

/// `INFO ratelimit`: calls, allowed, rejected (and of them, blocked) and live keys per algorithm.
unsafe extern "C" fn info(ctx: *mut raw::RedisModuleInfoCtx, for_crash_report: c_int) {
    /// Field names per algorithm (Redis prefixes them with `ratelimit_`).
    const FIELDS: [[&CStr; 5]; 7] = [
        [
            c"token_bucket_calls",
            c"token_bucket_allowed",
            c"token_bucket_rejected",
            c"token_bucket_blocked",
            c"token_bucket_keys",
        ],
        [
            c"leaky_bucket_calls",
            c"leaky_bucket_allowed",
            c"leaky_bucket_rejected",
            c"leaky_bucket_blocked",
            c"leaky_bucket_keys",
        ],
        [
            c"fixed_window_calls",
            c"fixed_window_allowed",
            c"fixed_window_rejected",
            c"fixed_window_blocked",
            c"fixed_window_keys",
        ],
        [
            c"sliding_window_calls",
            c"sliding_window_allowed",
            c"sliding_window_rejected",
            c"sliding_window_blocked",
            c"sliding_window_keys",
        ],
        [
            c"sliding_log_calls",
            c"sliding_log_allowed",
            c"sliding_log_rejected",
            c"sliding_log_blocked",
            c"sliding_log_keys",
        ],
        [
            c"gcra_calls",
            c"gcra_allowed",
            c"gcra_rejected",
            c"gcra_blocked",
            c"gcra_keys",
        ],
        // ACQUIREs (RELEASE decides nothing; no lease is ever blocked: `_blocked` stays 0).
        [
            c"concurrency_calls",
            c"concurrency_allowed",
            c"concurrency_rejected",
            c"concurrency_blocked",
            c"concurrency_keys",
        ],
    ];
    let _ = std::panic::catch_unwind(|| {
        // A `CONFIG RESETSTAT` earlier in this client's pipeline has run: the counters shown are
        // those after it. Not in a crash report (it locks and asks the server for its stats).
        if for_crash_report == 0 {
            commands::resetstat::apply_pending();
        }
        // SAFETY: Redis's INFO context for this callback; names are static and NUL-terminated.
        unsafe { api::rm!(RedisModule_InfoAddSection)(ctx, c"".as_ptr()) };
        if let Some(server) = server::get() {
            for (name, value) in [(c"server", &server.release), (c"apis", &server.apis)] {
                if let Ok(value) = std::ffi::CString::new(value.as_str()) {
                    // SAFETY: as above; Redis copies the value.
                    unsafe {
                        api::rm!(RedisModule_InfoAddFieldCString)(
                            ctx,
                            name.as_ptr(),
                            value.as_ptr().cast_mut(),
                        )
                    };
                }
            }
        }
        for (kind, names) in Kind::EVERY.into_iter().zip(FIELDS) {
            let figures = stats::figures(kind);
            let values = [
                figures.calls,
                figures.allowed,
                figures.rejected,
                figures.blocked,
                figures.keys,
            ];
            for (name, value) in names.into_iter().zip(values) {
                // SAFETY: as above.
                unsafe { api::rm!(RedisModule_InfoAddFieldULongLong)(ctx, name.as_ptr(), value) };
            }
        }
        // Not in a crash report: the table's lock may be held by the code that crashed.
        if for_crash_report == 0 {
            // SAFETY: as above.
            unsafe { policy_fields(ctx) };
        }
    });
}

/// `ratelimit_policies:<count>`, then one line per policy in Redis's `cmdstat_` style:
/// `ratelimit_policy_<name>:calls=..,allowed=..,rejected=..,shadow_rejected=..,blocked=..`,
/// sorted by name.
///
/// # Safety
/// `ctx` must be the INFO callback's context.
unsafe fn policy_fields(ctx: *mut raw::RedisModuleInfoCtx) {
    let lines: Vec<(std::ffi::CString, policy::Figures)> = {
        let table = policy::table();
        table
            .sorted()
            .into_iter()
            .filter_map(|(name, entry)| {
                let mut field = b"policy_".to_vec();
                field.extend_from_slice(name);
                std::ffi::CString::new(field)
                    .ok()
                    .map(|field| (field, entry.counters.figures()))
            })
            .collect()
    };
    // SAFETY: guaranteed by the caller; the names are static and NUL-terminated.
    unsafe {
        api::rm!(RedisModule_InfoAddFieldULongLong)(ctx, c"policies".as_ptr(), lines.len() as u64)
    };
    for (field, figures) in lines {
        // SAFETY: as above; a dict field is opened, filled and closed in turn.
        unsafe {
            api::rm!(RedisModule_InfoBeginDictField)(ctx, field.as_ptr());
            for (name, value) in [
                (c"calls", figures.calls),
                (c"allowed", figures.allowed),
                (c"rejected", figures.rejected),
                (c"shadow_rejected", figures.shadow_rejected),
                (c"blocked", figures.blocked),
            ] {
                api::rm!(RedisModule_InfoAddFieldULongLong)(ctx, name.as_ptr(), value);
            }
            api::rm!(RedisModule_InfoEndDictField)(ctx);
        }
    }
}

/// Redis's allocator inside redis-server (so module memory counts in `used_memory` and
/// `maxmemory`); the system allocator where no Redis is present (unit tests, fuzzing, benches that
/// link the cores). The choice never changes within a process: in the module, Redis's allocator is
/// set up before the first allocation; elsewhere it never is.
pub struct ModuleAlloc;

// SAFETY: delegates every call to one of two valid allocators, chosen identically for an
// allocation and its release.
unsafe impl std::alloc::GlobalAlloc for ModuleAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        if redis_allocator_ready() {
            // SAFETY: forwarded as is.
            unsafe { redis_module::alloc::RedisAlloc.alloc(layout) }
        } else {
            // SAFETY: forwarded as is.
            unsafe { std::alloc::System.alloc(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        if redis_allocator_ready() {
            // SAFETY: allocated by the same allocator (see the type's comment).
            unsafe { redis_module::alloc::RedisAlloc.dealloc(ptr, layout) }
        } else {
            // SAFETY: as above.
            unsafe { std::alloc::System.dealloc(ptr, layout) }
        }
    }
}

fn redis_allocator_ready() -> bool {
    api::has!(RedisModule_Alloc) && api::has!(RedisModule_Free)
}

#[global_allocator]
static ALLOCATOR: ModuleAlloc = ModuleAlloc;

/// The module's name in `MODULE LIST` and its version.
const MODULE_NAME: &CStr = c"ratelimit";
const MODULE_VERSION: c_int = 1;

/// The entry point `loadmodule` and `MODULE LOAD` call.
///
/// Written out rather than generated by the crate's `redis_module!` macro, so that a refused
/// load can say why: the macro returns silently when `RedisModule_Init` fails, and Redis then
/// logs only "initialization failed" (for example on a second `MODULE LOAD` of this module).
///
/// # Safety
/// Called by Redis, once per load, on its main thread, with a valid context and arguments.
#[no_mangle]
pub unsafe extern "C" fn RedisModule_OnLoad(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    let refused = raw::Status::Err as c_int;
    std::panic::catch_unwind(|| {
        // SAFETY: Redis's load context; the name is static and NUL-terminated.
        let status = unsafe {
            raw::Export_RedisModule_Init(
                ctx,
                MODULE_NAME.as_ptr(),
                MODULE_VERSION,
                raw::REDISMODULE_APIVER_1 as c_int,
            )
        };
        if status == raw::Status::Err as c_int {
            log_refused_init();
            return refused;
        }
        let context = Context::new(ctx);
        let _ = redis_module::MODULE_CONTEXT.set_context(&context);
        if LIMITER_TYPE.create_data_type(ctx).is_err() {
            return refused;
        }
        let args = redis_module::decode_args(ctx, argv, argc);
        match init(&context, &args) {
            Status::Ok => raw::Status::Ok as c_int,
            Status::Err => refused,
        }
    })
    .unwrap_or(refused)
}

/// Says why `RedisModule_Init` refused the module (Redis itself says only that it failed).
fn log_refused_init() {
    // SAFETY: RedisModule_Init fills the API table before it can refuse, so the pointers read
    // here are set (or None, and then skipped); the name is static and NUL-terminated.
    let busy = unsafe { raw::RedisModule_IsModuleNameBusy }
        .is_some_and(|busy| unsafe { busy(MODULE_NAME.as_ptr()) } != 0);
    log::log_warning(if busy {
        "ratelimit: the module is already loaded (see MODULE LIST); \
         MODULE UNLOAD is refused for modules with a data type, so restart the server to load \
         another build"
    } else {
        "ratelimit: RedisModule_Init refused the module (this server's module API is too old?)"
    });
}
