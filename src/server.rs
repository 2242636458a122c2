//! Which server the module runs on, and which optional module APIs it offers: read once at load,
//! logged, and shown by `INFO ratelimit`.

use std::ffi::{c_char, CStr};
use std::sync::OnceLock;

use redis_module::raw;

use crate::api::{has, rm};

/// The server and its optional APIs, as found at load.
#[derive(Debug)]
pub(crate) struct Server {
    /// `redis` or `valkey`, with its version: `redis 7.0.15`, `valkey 8.0.1`.
    pub release: String,
    /// The optional APIs present, comma-separated (empty when none).
    pub apis: String,
}

static SERVER: OnceLock<Server> = OnceLock::new();

/// The optional APIs the module uses when present (and what each gives), with their presence.
fn optional() -> [(&'static str, bool); 5] {
    [
        // Commands in @read/@write/@fast and @ratelimit (7.2+, Valkey).
        (
            "SetCommandACLCategories",
            has!(RedisModule_SetCommandACLCategories),
        ),
        ("AddACLCategory", has!(RedisModule_AddACLCategory)),
        // A clock frozen per command, MULTI and script (7.2+).
        ("CachedMicroseconds", has!(RedisModule_CachedMicroseconds)),
        // Key specs, arity and COMMAND DOCS (7.0+).
        ("SetCommandInfo", has!(RedisModule_SetCommandInfo)),
        // CHECKALL's keys reported with their flags (7.0+).
        ("KeyAtPosWithFlags", has!(RedisModule_KeyAtPosWithFlags)),
    ]
}

/// Reads the server's name and version (from the `server` section of its INFO) and the APIs it
/// offers. Call once, from OnLoad.
pub(crate) fn detect(ctx: *mut raw::RedisModuleCtx) -> &'static Server {
    SERVER.get_or_init(|| Server {
        release: release(ctx),
        apis: optional()
            .iter()
            .filter(|(_, present)| *present)
            .map(|(name, _)| *name)
            .collect::<Vec<_>>()
            .join(","),
    })
}

/// What [`detect`] found, once it ran.
pub(crate) fn get() -> Option<&'static Server> {
    SERVER.get()
}

fn release(ctx: *mut raw::RedisModuleCtx) -> String {
    if !(has!(RedisModule_GetServerInfo)
        && has!(RedisModule_ServerInfoGetFieldC)
        && has!(RedisModule_FreeServerInfo))
    {
        return "unknown".to_string();
    }
    // SAFETY: the OnLoad context and a static section name; the data is freed below.
    let info = unsafe { rm!(RedisModule_GetServerInfo)(ctx, c"server".as_ptr()) };
    if info.is_null() {
        return "unknown".to_string();
    }
    let field = |name: &CStr| -> Option<String> {
        // SAFETY: `info` is live until freed below; the name is static and NUL-terminated.
        let value: *const c_char =
            unsafe { rm!(RedisModule_ServerInfoGetFieldC)(info, name.as_ptr()) };
        (!value.is_null()).then(|| {
            // SAFETY: a non-null result is a NUL-terminated string owned by `info`.
            unsafe { CStr::from_ptr(value) }
                .to_string_lossy()
                .into_owned()
        })
    };
    // Valkey names itself (and keeps `redis_version` at the Redis release it is compatible with).
    let release = match field(c"server_name").as_deref() {
        Some("valkey") => format!(
            "valkey {}",
            field(c"valkey_version").unwrap_or_else(|| "?".into())
        ),
        _ => format!(
            "redis {}",
            field(c"redis_version").unwrap_or_else(|| "?".into())
        ),
    };
    // SAFETY: the data GetServerInfo returned, freed once.
    unsafe { rm!(RedisModule_FreeServerInfo)(ctx, info) };
    release
}

/// Whether the server has paused writes (`CLIENT PAUSE ... WRITE` or `ALL`, `FAILOVER`, a cluster
/// manual failover), when nothing may be propagated: `RedisModule_AvoidReplicaTraffic` answers
/// exactly the condition Redis asserts on before it propagates (on 7.0 any client pause, from
/// 7.2 and on Valkey the paused `REPLICA` action). Where the call is missing, no pause is known.
pub(crate) fn writes_paused() -> bool {
    // SAFETY: takes no argument and only reads the server's pause state.
    has!(RedisModule_AvoidReplicaTraffic) && unsafe { rm!(RedisModule_AvoidReplicaTraffic)() } != 0
}

/// Whether the fork just made (a `FORK_CHILD` event's parent side) is an AOF rewrite whose AOF
/// holds commands only (`aof-use-rdb-preamble no`): such a rewrite saves the keys but not the
/// module's data. When it cannot tell, it answers yes (writing the policies again is harmless).
pub(crate) fn aof_rewrite_without_preamble(ctx: *mut raw::RedisModuleCtx) -> bool {
    if !(has!(RedisModule_GetServerInfo)
        && has!(RedisModule_ServerInfoGetFieldSigned)
        && has!(RedisModule_FreeServerInfo))
    {
        return true;
    }
    // SAFETY: the event's context and a static section name; the data is freed below.
    let info = unsafe { rm!(RedisModule_GetServerInfo)(ctx, c"persistence".as_ptr()) };
    if info.is_null() {
        return true;
    }
    let mut error = 0;
    // SAFETY: `info` is live until freed below; the name is static and NUL-terminated.
    let rewriting = unsafe {
        rm!(RedisModule_ServerInfoGetFieldSigned)(
            info,
            c"aof_rewrite_in_progress".as_ptr(),
            &mut error,
        )
    };
    // SAFETY: the data GetServerInfo returned, freed once.
    unsafe { rm!(RedisModule_FreeServerInfo)(ctx, info) };
    if error == 0 && rewriting != 1 {
        return false;
    }
    preamble_off(ctx).unwrap_or(true)
}

/// `aof-use-rdb-preamble` is `no` (`None` when it cannot be read).
fn preamble_off(ctx: *mut raw::RedisModuleCtx) -> Option<bool> {
    if !(has!(RedisModule_Call)
        && has!(RedisModule_CallReplyArrayElement)
        && has!(RedisModule_CallReplyStringPtr)
        && has!(RedisModule_FreeCallReply))
    {
        return None;
    }
    // SAFETY: the event's context; "cc" takes two NUL-terminated strings; the reply is freed
    // below, once, after its elements are read.
    unsafe {
        let reply = rm!(RedisModule_Call)(
            ctx,
            c"CONFIG".as_ptr(),
            c"cc".as_ptr(),
            c"GET".as_ptr(),
            c"aof-use-rdb-preamble".as_ptr(),
        );
        if reply.is_null() {
            return None;
        }
        let value = rm!(RedisModule_CallReplyArrayElement)(reply, 1);
        let mut len = 0usize;
        let text = if value.is_null() {
            std::ptr::null()
        } else {
            rm!(RedisModule_CallReplyStringPtr)(value, &mut len)
        };
        let off =
            (!text.is_null()).then(|| std::slice::from_raw_parts(text.cast::<u8>(), len) == b"no");
        rm!(RedisModule_FreeCallReply)(reply);
        off
    }
}
