//! Key specs (Redis 7's `RedisModule_SetCommandInfo`) for the single-key-range commands, so ACL
//! read/write key permissions (`%R~…`, `%W~…`) see PEEK and INFO as read-only and CHECK as a
//! read-write update. The first/last/step triple given at creation stays as the fallback.

use std::ffi::{c_int, CStr};

use redis_module::raw;

use crate::api::{has, rm};

/// The layout version of the command-info structs this module passes.
pub(crate) static INFO_VERSION: raw::RedisModuleCommandInfoVersion =
    raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };

/// The all-zero value of a command-info C struct: its array terminator.
pub(crate) fn end<T>() -> T {
    // SAFETY: only used for the plain C structs of the command-info API, whose all-zero value is
    // valid (null pointers, zero integers, the INVALID/OMITTED enum values).
    unsafe { std::mem::zeroed() }
}

/// `(command, key flags, last key relative to the first: 0 one key, -1 all the rest, arity)`.
const SPECS: [(&CStr, u32, c_int, c_int); 5] = [
    (
        c"ratelimit.check",
        raw::REDISMODULE_CMD_KEY_RW
            | raw::REDISMODULE_CMD_KEY_ACCESS
            | raw::REDISMODULE_CMD_KEY_UPDATE,
        0,
        -5,
    ),
    (
        c"ratelimit.peek",
        raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
        0,
        -5,
    ),
    (
        c"ratelimit.info",
        raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
        0,
        2,
    ),
    (
        c"ratelimit.reset",
        raw::REDISMODULE_CMD_KEY_RM | raw::REDISMODULE_CMD_KEY_DELETE,
        -1,
        -2,
    ),
    (
        c"ratelimit.apply",
        raw::REDISMODULE_CMD_KEY_OW | raw::REDISMODULE_CMD_KEY_UPDATE,
        0,
        3,
    ),
];

/// Declares the key specs where the server has the API; commands keep their legacy key range
/// otherwise (or if a declaration fails, which is reported).
pub(crate) fn declare(ctx: *mut raw::RedisModuleCtx) -> Result<(), &'static CStr> {
    if !(has!(RedisModule_GetCommand) && has!(RedisModule_SetCommandInfo)) {
        return Ok(());
    }
    for (name, flags, last_key, arity) in SPECS {
        let mut spec: raw::RedisModuleCommandKeySpec = end();
        spec.flags = u64::from(flags);
        spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
        spec.bs.index.pos = 1;
        spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
        spec.fk.range.lastkey = last_key;
        spec.fk.range.keystep = 1;
        spec.fk.range.limit = 0;
        let mut key_specs = [spec, end()];
        let mut info: raw::RedisModuleCommandInfo = end();
        info.version = &INFO_VERSION;
        info.arity = arity;
        info.key_specs = key_specs.as_mut_ptr();
        // SAFETY: the OnLoad context and a registered command's static NUL-terminated name.
        let command = unsafe { rm!(RedisModule_GetCommand)(ctx, name.as_ptr()) };
        if command.is_null() {
            return Err(name);
        }
        // SAFETY: `info` and the key specs it points to live until the call returns; Redis
        // copies what it keeps.
        let status = unsafe { rm!(RedisModule_SetCommandInfo)(command, &info) };
        if status != raw::REDISMODULE_OK as c_int {
            return Err(name);
        }
    }
    Ok(())
}
