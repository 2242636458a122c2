//! Access to the Redis module API's function pointers.
//!
//! The pointers are filled by `RedisModule_Init`; one the running server lacks is `None`. Every API
//! used unconditionally is checked at load time ([`missing_required`]), so [`rm!`] calls those
//! without a check; an optional one is checked (with [`has!`] first), and if it were ever missing
//! [`rm!`] panics, and the command guard turns that into an error reply.

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

/// Defines [`missing_required`] and [`rm!`] from the list of required APIs (`$d`: a `$`, for
/// the inner macro's own variables).
macro_rules! required {
    ($d:tt; $($name:ident),* $(,)?) => {
        /// The first required API the running server lacks, if any.
        pub fn missing_required() -> Option<&'static str> {
            $(if !has!($name) { return Some(stringify!($name)); })*
            None
        }

        /// The function pointer of a module API, e.g. `rm!(RedisModule_OpenKey)(ctx, name, mode)`.
        /// A required one (see `missing_required`) is taken as it is; another one is checked,
        /// and if the running server lacks it, this panics, and the command guard turns that
        /// into an error reply.
        macro_rules! rm {
            $(($name) => {{
                // SAFETY: the pointer tables are written once by RedisModule_Init, before any
                // command runs, and only read afterwards, on Redis's main thread.
                #[allow(unused_unsafe)]
                match unsafe { redis_module::raw::$name } {
                    Some(function) => function,
                    // SAFETY: a required API: OnLoad refused the module unless it was present
                    // (`missing_required`), and nothing writes the table after it.
                    None => unsafe { std::hint::unreachable_unchecked() },
                }
            }};)*
            ($d other:ident) => {{
                // SAFETY: as above.
                #[allow(unused_unsafe)]
                let function = match unsafe { redis_module::raw::$d other } {
                    Some(function) => function,
                    None => $crate::api::absent(stringify!($d other)),
                };
                function
            }};
        }
        pub(crate) use rm;
    };
}

#[cold]
pub fn absent(name: &str) -> ! {
    panic!("module API {name} is not available on this server")
}

// The APIs every server this module loads on has: `OnLoad` refuses the module when one is
// missing (`missing_required`), before anything of the module can run, and the table is never
// written again, so [`rm!`] calls them without checking (the commands call a dozen per call).
required!($;
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
