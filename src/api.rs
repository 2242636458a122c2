//! Access to the Redis module API's function pointers.
//!
//! The pointers are filled by `RedisModule_Init`; one the running server lacks is `None`. Every API
//! used unconditionally is checked at load time ([`missing_required`]), so [`rm!`] never finds a
//! hole at run time; if it ever did, it panics, and the command guard turns that into an error reply.

/// The function pointer of a module API, e.g. `rm!(RedisModule_OpenKey)(ctx, name, mode)`.
macro_rules! rm {
    ($name:ident) => {{
        // SAFETY: the pointer tables are written once by RedisModule_Init, before any command runs,
        // and only read afterwards, on Redis's main thread.
        #[allow(unused_unsafe)]
        let function = match unsafe { redis_module::raw::$name } {
            Some(function) => function,
            None => $crate::api::absent(stringify!($name)),
        };
        function
    }};
}
pub(crate) use rm;

/// Present-or-not check for an optional API.
macro_rules! has {
    ($name:ident) => {{
        // SAFETY: as in `rm!`: written once at load, read-only afterwards.
        #[allow(unused_unsafe)]
        let present = unsafe { redis_module::raw::$name }.is_some();
        present
    }};
}
pub(crate) use has;

#[cold]
pub fn absent(name: &str) -> ! {
    panic!("module API {name} is not available on this server")
}

/// The first required API the running server lacks, if any.
pub fn missing_required() -> Option<&'static str> {
    macro_rules! require {
        ($($name:ident),* $(,)?) => {
            $(if !has!($name) { return Some(stringify!($name)); })*
        };
    }
    require!(
        RedisModule_CreateCommand,
        RedisModule_OpenKey,
        RedisModule_CloseKey,
        RedisModule_KeyType,
        RedisModule_DeleteKey,
        RedisModule_ModuleTypeGetType,
        RedisModule_ModuleTypeGetValue,
        RedisModule_ModuleTypeSetValue,
        RedisModule_ModuleTypeReplaceValue,
        RedisModule_SetAbsExpire,
        RedisModule_StringPtrLen,
        RedisModule_ReplyWithArray,
        RedisModule_ReplyWithLongLong,
        RedisModule_ReplyWithError,
        RedisModule_ReplyWithNull,
        RedisModule_ReplyWithSimpleString,
        RedisModule_ReplyWithMap,
        RedisModule_ReplyWithBool,
        RedisModule_Replicate,
        RedisModule_ReplicateVerbatim,
        RedisModule_SignalModifiedKey,
        RedisModule_SetModuleOptions,
        RedisModule_GetContextFlags,
        RedisModule_Milliseconds,
        RedisModule_NotifyKeyspaceEvent,
        RedisModule_SaveStringBuffer,
        RedisModule_LoadStringBuffer,
        RedisModule_EmitAOF,
        RedisModule_DigestAddStringBuffer,
        RedisModule_DigestEndSequence,
        RedisModule_IsIOError,
        RedisModule_Free,
        RedisModule_ReplyWithStringBuffer,
        RedisModule_GetCommand,
        RedisModule_CreateSubcommand,
        RedisModule_SubscribeToServerEvent,
        RedisModule_InfoBeginDictField,
        RedisModule_InfoEndDictField,
        RedisModule_CreateString,
        RedisModule_FreeString,
    );
    None
}
