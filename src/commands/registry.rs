//! One declaration per command ([`Command`]: name, flags, arity, keys, documentation, handler),
//! kept next to its handler, and the one place that hands them to Redis ([`register`]).
//!
//! Keys are declared twice, as Redis asks: the legacy first/last/step triple at creation (the
//! fallback Redis uses for cluster routing where it finds nothing better), and a key spec through
//! `RedisModule_SetCommandInfo` (Redis 7.0+), which ACL read/write key permissions (`%R~…`),
//! `COMMAND INFO` and `COMMAND DOCS` use. A command whose keys follow a `numkeys` argument cannot
//! be described by the triple: it is registered with `getkeys-api` and answers Redis's key-position
//! requests itself (see `checkall`).

use std::ffi::{c_int, CStr, CString};
use std::ptr;

use redis_module::raw;

use crate::api::{has, rm};

/// The `extern "C"` entry point of a command.
pub(crate) type Handler = unsafe extern "C" fn(
    *mut raw::RedisModuleCtx,
    *mut *mut raw::RedisModuleString,
    c_int,
) -> c_int;

/// A command's two entry points, made by `handler!` from one body: `counting` counts each call
/// (`stats::count_call`) before running it, `plain` does not. [`register`] picks one.
#[derive(Clone, Copy)]
pub(crate) struct Handlers {
    pub plain: Handler,
    pub counting: Handler,
}

/// The entry point Redis calls for `command`: the counting one for a [`Command::counted`].
fn entry(command: &Command) -> Handler {
    if command.counted {
        command.handler.counting
    } else {
        command.handler.plain
    }
}

/// Key flags of a key that is read and updated in place (as `INCR`'s).
pub(crate) const KEY_UPDATED: u32 =
    raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_UPDATE;
/// Key flags of a key that is only read.
pub(crate) const KEY_READ: u32 = raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS;
/// Key flags of a key that is removed (as `DEL`'s).
pub(crate) const KEY_REMOVED: u32 = raw::REDISMODULE_CMD_KEY_RM | raw::REDISMODULE_CMD_KEY_DELETE;
/// Key flags of a key whose value is replaced by one given in the arguments.
pub(crate) const KEY_OVERWRITTEN: u32 =
    raw::REDISMODULE_CMD_KEY_OW | raw::REDISMODULE_CMD_KEY_UPDATE;

/// Where a command's keys are.
#[derive(Clone, Copy)]
pub(crate) enum Keys {
    /// Argument 1, and with `rest` every argument after it.
    First { rest: bool, flags: u32 },
    /// Argument 1 and every second argument after it (key-value pairs).
    Pairs { flags: u32 },
    /// A count at argument 1, then that many keys (the command needs `getkeys-api`).
    Counted { flags: u32 },
    /// No key (a command about the server's policies).
    None,
}

impl Keys {
    /// The legacy `(first, last, step)` triple.
    fn range(self) -> (c_int, c_int, c_int) {
        match self {
            Keys::First { rest: false, .. } => (1, 1, 1),
            Keys::First { rest: true, .. } => (1, -1, 1),
            Keys::Pairs { .. } => (1, -1, 2),
            Keys::Counted { .. } | Keys::None => (0, 0, 0),
        }
    }

    fn key_spec(self) -> raw::RedisModuleCommandKeySpec {
        let mut spec: raw::RedisModuleCommandKeySpec = terminator();
        if matches!(self, Keys::None) {
            return spec;
        }
        spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
        spec.bs.index.pos = 1;
        match self {
            Keys::First { rest, flags } => {
                spec.flags = u64::from(flags);
                spec.find_keys_type =
                    raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
                spec.fk.range.lastkey = if rest { -1 } else { 0 };
                spec.fk.range.keystep = 1;
                spec.fk.range.limit = 0;
            }
            Keys::Pairs { flags } => {
                spec.flags = u64::from(flags);
                spec.find_keys_type =
                    raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
                spec.fk.range.lastkey = -1;
                spec.fk.range.keystep = 2;
                spec.fk.range.limit = 0;
            }
            Keys::None => {}
            Keys::Counted { flags } => {
                spec.flags = u64::from(flags);
                spec.notes = c"one limiter key per limit spec, in the same order".as_ptr();
                spec.find_keys_type =
                    raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
                spec.fk.keynum.keynumidx = 0;
                spec.fk.keynum.firstkey = 1;
                spec.fk.keynum.keystep = 1;
            }
        }
        spec
    }
}

/// The type of a documented argument.
#[derive(Clone, Copy)]
pub(crate) enum ArgType {
    Key,
    String,
    Integer,
    UnixTime,
    Block,
    OneOf,
    PureToken,
}

/// One argument as `COMMAND DOCS` shows it.
#[derive(Clone, Copy)]
pub(crate) struct Arg {
    name: &'static CStr,
    kind: ArgType,
    token: Option<&'static CStr>,
    optional: bool,
    multiple: bool,
    subargs: &'static [Arg],
}

impl Arg {
    pub(crate) const fn new(name: &'static CStr, kind: ArgType) -> Arg {
        Arg {
            name,
            kind,
            token: None,
            optional: false,
            multiple: false,
            subargs: &[],
        }
    }

    /// An optional `TOKEN value` pair.
    pub(crate) const fn option(token: &'static CStr, name: &'static CStr, kind: ArgType) -> Arg {
        let mut arg = Arg::new(name, kind);
        arg.token = Some(token);
        arg.optional = true;
        arg
    }

    /// A group of arguments.
    pub(crate) const fn block(name: &'static CStr, subargs: &'static [Arg]) -> Arg {
        let mut arg = Arg::new(name, ArgType::Block);
        arg.subargs = subargs;
        arg
    }

    /// One of several arguments (or groups).
    pub(crate) const fn one_of(name: &'static CStr, subargs: &'static [Arg]) -> Arg {
        let mut arg = Arg::new(name, ArgType::OneOf);
        arg.subargs = subargs;
        arg
    }

    /// A `TOKEN value` pair that must be given.
    pub(crate) const fn keyword(token: &'static CStr, name: &'static CStr, kind: ArgType) -> Arg {
        let mut arg = Arg::new(name, kind);
        arg.token = Some(token);
        arg
    }

    /// A word alone (`SHADOW`), optional.
    pub(crate) const fn flag(token: &'static CStr) -> Arg {
        let mut arg = Arg::new(token, ArgType::PureToken);
        arg.token = Some(token);
        arg.optional = true;
        arg
    }

    /// Given once or more.
    pub(crate) const fn multiple(mut self) -> Arg {
        self.multiple = true;
        self
    }

    /// May be left out.
    pub(crate) const fn optional(mut self) -> Arg {
        self.optional = true;
        self
    }
}

/// The arguments of a limit spec after the key:
/// `algorithm limit period [BURST capacity] [BLOCK duration]`.
pub(crate) const LIMIT_SPEC: [Arg; 5] = [
    Arg::new(c"algorithm", ArgType::String),
    Arg::new(c"limit", ArgType::Integer),
    Arg::new(c"period", ArgType::String),
    Arg::option(c"BURST", c"capacity", ArgType::Integer),
    Arg::option(c"BLOCK", c"duration", ArgType::String),
];

/// A limit a call applies: a limit spec, or `POLICY name`, or either as one argument of words
/// separated by single spaces (`"sliding-window 100 1m"`).
pub(crate) const LIMIT: [Arg; 3] = [
    Arg::block(c"limit-spec", &LIMIT_SPEC),
    Arg::keyword(c"POLICY", c"name", ArgType::String),
    Arg::new(c"one-argument-spec", ArgType::String),
];

/// A command of the module.
pub(crate) struct Command {
    /// Its name, lower-case as registered.
    pub name: &'static CStr,
    /// Redis's command flags (`write deny-oom fast`, ...).
    pub flags: &'static CStr,
    /// Redis's arity: the exact argument count, or its negated minimum (the name included).
    pub arity: c_int,
    pub keys: Keys,
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    pub args: &'static [Arg],
    /// ACL categories (`write fast ratelimit`, ...), set where the server lets modules set them
    /// (7.2+, Valkey); `ratelimit`, the module's own category, only where modules may add one
    /// (7.4+, Valkey 8), and left out on servers that cannot.
    pub acl: &'static str,
    /// Every call is counted (`stats::count_call`, first thing in its handler: registration
    /// gives it its counting handler), as Redis counts it in `INFO commandstats`: how a
    /// `CONFIG RESETSTAT` that ran is told from one that was refused (`resetstat.rs`). CHECK,
    /// CHECKALL, ACQUIRE, TAKE and the dialects.
    pub counted: bool,
    pub handler: Handlers,
}

/// The module's own ACL category, holding every command applications call.
pub(crate) const ACL_CATEGORY: &CStr = c"ratelimit";

static ACL_CATEGORY_ADDED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Adds the `@ratelimit` ACL category where the server lets modules add one (Redis 7.4+,
/// Valkey 8). Call from OnLoad, before the commands are registered.
pub(crate) fn add_acl_category(ctx: *mut raw::RedisModuleCtx) -> bool {
    if !has!(RedisModule_AddACLCategory) {
        return false;
    }
    // SAFETY: the OnLoad context and a static NUL-terminated name.
    let added = unsafe { rm!(RedisModule_AddACLCategory)(ctx, ACL_CATEGORY.as_ptr()) }
        == raw::REDISMODULE_OK as c_int;
    ACL_CATEGORY_ADDED.store(added, std::sync::atomic::Ordering::Relaxed);
    added
}

/// A command whose subcommands are commands of their own (`RATELIMIT.POLICY SET`, ...): each
/// with its flags, arity, ACL categories and documentation, under the ACL name
/// `container|subcommand`.
pub(crate) struct Container {
    pub name: &'static CStr,
    pub summary: &'static CStr,
    /// The subcommands; each [`Command::name`] is the subcommand's own (`set`), and its arity
    /// counts the container's name too, as Redis counts it.
    pub subcommands: &'static [&'static Command],
}

/// Registers `command` (from `RedisModule_OnLoad`). An error means it could not be created; a
/// refused key spec or documentation only weakens ACL and `COMMAND DOCS`, and is logged.
pub(crate) fn register(ctx: *mut raw::RedisModuleCtx, command: &Command) -> Result<(), String> {
    let (first, last, step) = command.keys.range();
    // SAFETY: the OnLoad context; the name and flags are static NUL-terminated strings and the
    // handler lives as long as the module.
    let status = unsafe {
        rm!(RedisModule_CreateCommand)(
            ctx,
            command.name.as_ptr(),
            Some(entry(command)),
            command.flags.as_ptr(),
            first,
            last,
            step,
        )
    };
    if status != raw::REDISMODULE_OK as c_int {
        return Err(format!("could not register {:?}", command.name));
    }
    finish(ctx, command, command.name);
    Ok(())
}

/// Registers a container and its subcommands (from `RedisModule_OnLoad`; Redis 7.0+).
pub(crate) fn register_container(
    ctx: *mut raw::RedisModuleCtx,
    container: &Container,
) -> Result<(), String> {
    if !(has!(RedisModule_GetCommand) && has!(RedisModule_CreateSubcommand)) {
        return Err(format!(
            "this server cannot register subcommands, so not {:?}",
            container.name
        ));
    }
    // SAFETY: the OnLoad context and static NUL-terminated strings; a container has no handler.
    let status = unsafe {
        rm!(RedisModule_CreateCommand)(ctx, container.name.as_ptr(), None, c"".as_ptr(), 0, 0, 0)
    };
    if status != raw::REDISMODULE_OK as c_int {
        return Err(format!("could not register {:?}", container.name));
    }
    // SAFETY: the OnLoad context and the command just created under this static name.
    let parent = unsafe { rm!(RedisModule_GetCommand)(ctx, container.name.as_ptr()) };
    if parent.is_null() {
        return Err(format!(
            "RedisModule_GetCommand does not find {:?}",
            container.name
        ));
    }
    if has!(RedisModule_SetCommandInfo) {
        let info = raw::RedisModuleCommandInfo {
            version: &INFO_VERSION,
            summary: container.summary.as_ptr(),
            complexity: c"Depends on subcommand".as_ptr(),
            since: c"0.1.0".as_ptr(),
            history: ptr::null_mut(),
            tips: ptr::null(),
            arity: -2,
            key_specs: ptr::null_mut(),
            args: ptr::null_mut(),
        };
        // SAFETY: a command of this module and an info struct of static strings; Redis copies
        // what it keeps.
        unsafe { rm!(RedisModule_SetCommandInfo)(parent, &info) };
    }
    for command in container.subcommands {
        let (first, last, step) = command.keys.range();
        // SAFETY: the container just created; static NUL-terminated strings; the handler lives as
        // long as the module.
        let status = unsafe {
            rm!(RedisModule_CreateSubcommand)(
                parent,
                command.name.as_ptr(),
                Some(entry(command)),
                command.flags.as_ptr(),
                first,
                last,
                step,
            )
        };
        if status != raw::REDISMODULE_OK as c_int {
            return Err(format!(
                "could not register {:?} {:?}",
                container.name, command.name
            ));
        }
        let full = format!(
            "{}|{}",
            container.name.to_string_lossy(),
            command.name.to_string_lossy()
        );
        let full = CString::new(full).map_err(|e| e.to_string())?;
        finish(ctx, command, &full);
    }
    Ok(())
}

/// Sets a created command's ACL categories and documentation (`name`: its full name, as
/// `RedisModule_GetCommand` finds it).
fn finish(ctx: *mut raw::RedisModuleCtx, command: &Command, name: &CStr) {
    if let Err(why) = set_acl_categories(ctx, command, name) {
        crate::log::log_warning(&format!("ratelimit: {why} for {name:?}"));
    }
    if let Err(why) = describe(ctx, command, name) {
        crate::log::log_warning(&format!(
            "ratelimit: {why}; {name:?} keeps its legacy key range"
        ));
    }
}

/// Puts the command in its ACL categories, where the server has the API.
fn set_acl_categories(
    ctx: *mut raw::RedisModuleCtx,
    command: &Command,
    name: &CStr,
) -> Result<(), String> {
    if !(has!(RedisModule_GetCommand) && has!(RedisModule_SetCommandACLCategories)) {
        return Ok(());
    }
    let own = ACL_CATEGORY.to_string_lossy();
    let added = ACL_CATEGORY_ADDED.load(std::sync::atomic::Ordering::Relaxed);
    let categories = command
        .acl
        .split(' ')
        .filter(|category| added || *category != own)
        .collect::<Vec<_>>()
        .join(" ");
    let categories = std::ffi::CString::new(categories).map_err(|e| e.to_string())?;
    // SAFETY: the OnLoad context and a command just created under this name.
    let handle = unsafe { rm!(RedisModule_GetCommand)(ctx, name.as_ptr()) };
    if handle.is_null() {
        return Err("RedisModule_GetCommand does not find it".to_string());
    }
    // SAFETY: a command of this module and a NUL-terminated string Redis reads during the call.
    let status = unsafe { rm!(RedisModule_SetCommandACLCategories)(handle, categories.as_ptr()) };
    if status != raw::REDISMODULE_OK as c_int {
        return Err(format!(
            "the server refused the ACL categories {categories:?}"
        ));
    }
    Ok(())
}

/// Whether the server already has a command of this name (its own, or another module's), as
/// `COMMAND INFO` tells: from OnLoad, before registering a command another may own. `None` when
/// it cannot tell.
pub(crate) fn command_exists(ctx: *mut raw::RedisModuleCtx, name: &CStr) -> Option<bool> {
    if !(has!(RedisModule_Call)
        && has!(RedisModule_CallReplyType)
        && has!(RedisModule_CallReplyArrayElement)
        && has!(RedisModule_FreeCallReply))
    {
        return None;
    }
    // SAFETY: the OnLoad context; "cc" takes two NUL-terminated strings. The reply is freed below.
    let reply = unsafe {
        rm!(RedisModule_Call)(
            ctx,
            c"COMMAND".as_ptr(),
            c"cc".as_ptr(),
            c"INFO".as_ptr(),
            name.as_ptr(),
        )
    };
    if reply.is_null() {
        return None;
    }
    // SAFETY: a live reply: its first element (`COMMAND INFO` of one name answers one), whose type
    // is read before the reply is freed, once.
    let exists = unsafe {
        let element = rm!(RedisModule_CallReplyArrayElement)(reply, 0);
        let exists = !element.is_null()
            && rm!(RedisModule_CallReplyType)(element) as isize == raw::REDISMODULE_REPLY_ARRAY;
        rm!(RedisModule_FreeCallReply)(reply);
        exists
    };
    Some(exists)
}

/// The layout version of the command-info structs this module passes.
static INFO_VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
    version: 1,
    sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
    sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
    sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
};

/// Declares the key spec, arity and documentation, where the server has the API.
fn describe(
    ctx: *mut raw::RedisModuleCtx,
    command: &Command,
    name: &CStr,
) -> Result<(), &'static str> {
    if !(has!(RedisModule_GetCommand) && has!(RedisModule_SetCommandInfo)) {
        return Ok(());
    }
    // SAFETY: the OnLoad context and a command just created under this name.
    let handle = unsafe { rm!(RedisModule_GetCommand)(ctx, name.as_ptr()) };
    if handle.is_null() {
        return Err("RedisModule_GetCommand does not find it");
    }
    let mut key_specs = [command.keys.key_spec(), terminator()];
    let mut storage = Vec::new();
    let info = raw::RedisModuleCommandInfo {
        version: &INFO_VERSION,
        summary: command.summary.as_ptr(),
        complexity: command.complexity.as_ptr(),
        since: c"0.1.0".as_ptr(),
        history: ptr::null_mut(),
        tips: ptr::null(),
        arity: command.arity,
        // A keyless command declares no key spec (the array is its terminator alone).
        key_specs: if matches!(command.keys, Keys::None) {
            key_specs[1..].as_mut_ptr()
        } else {
            key_specs.as_mut_ptr()
        },
        args: raw_args(command.args, &mut storage),
    };
    // SAFETY: a command of this module, and an info struct whose pointers (into `key_specs`,
    // `storage` and static strings) outlive the call; Redis copies what it keeps.
    let status = unsafe { rm!(RedisModule_SetCommandInfo)(handle, &info) };
    if status != raw::REDISMODULE_OK as c_int {
        return Err("RedisModule_SetCommandInfo refused its key spec");
    }
    Ok(())
}

/// `args` as a terminated C array, kept alive in `storage` (each array's heap buffer stays where
/// it is when `storage` grows). Null for no arguments.
fn raw_args(
    args: &[Arg],
    storage: &mut Vec<Vec<raw::RedisModuleCommandArg>>,
) -> *mut raw::RedisModuleCommandArg {
    use raw::{
        RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK as BLOCK,
        RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER as INTEGER,
        RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY as KEY,
        RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF as ONEOF,
        RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN as PURE_TOKEN,
        RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING as STRING,
        RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_UNIX_TIME as UNIX_TIME,
    };
    if args.is_empty() {
        return ptr::null_mut();
    }
    let mut list: Vec<raw::RedisModuleCommandArg> = Vec::with_capacity(args.len() + 1);
    for arg in args {
        let mut flags = raw::REDISMODULE_CMD_ARG_NONE;
        if arg.optional {
            flags |= raw::REDISMODULE_CMD_ARG_OPTIONAL;
        }
        if arg.multiple {
            flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE;
        }
        let mut entry: raw::RedisModuleCommandArg = terminator();
        entry.name = arg.name.as_ptr();
        entry.type_ = match arg.kind {
            ArgType::Key => KEY,
            ArgType::String => STRING,
            ArgType::Integer => INTEGER,
            ArgType::UnixTime => UNIX_TIME,
            ArgType::Block => BLOCK,
            ArgType::OneOf => ONEOF,
            ArgType::PureToken => PURE_TOKEN,
        };
        // Every command has one key spec; key arguments refer to it.
        entry.key_spec_index = if matches!(arg.kind, ArgType::Key) {
            0
        } else {
            -1
        };
        entry.token = arg.token.map_or(ptr::null(), CStr::as_ptr);
        entry.flags = flags as c_int;
        entry.subargs = raw_args(arg.subargs, storage);
        list.push(entry);
    }
    list.push(terminator());
    let pointer = list.as_mut_ptr();
    storage.push(list);
    pointer
}

/// The C structs of the command-info API whose all-zero value is valid: null pointers, zero
/// integers and the zero (`INVALID`/`OMITTED`) enum values. The all-zero value ends their arrays.
///
/// # Safety
/// Implement only for `repr(C)` structs of integers, raw pointers and C enums (integers).
unsafe trait ZeroIsValid {}

// SAFETY: bindgen structs of integers, raw pointers, unions of such, and C enums.
unsafe impl ZeroIsValid for raw::RedisModuleCommandKeySpec {}
// SAFETY: as above.
unsafe impl ZeroIsValid for raw::RedisModuleCommandArg {}

/// The all-zero value of a command-info struct: its array terminator.
fn terminator<T: ZeroIsValid>() -> T {
    // SAFETY: `T: ZeroIsValid` guarantees the all-zero bit pattern is a valid `T`.
    unsafe { std::mem::zeroed() }
}
