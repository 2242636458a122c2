//! The commands: parse argv in place, call a core, reply, notify and replicate.
//!
//! Handlers are raw `extern "C"` functions registered with `RedisModule_CreateCommand`: they read
//! the arguments where Redis keeps them and reply with the raw reply calls, so a call allocates
//! nothing beyond what Redis itself does. Every handler runs inside [`guard`], so a panic becomes an
//! error reply instead of aborting the server.

pub mod apply;
pub mod check;
pub mod checkall;
pub mod info;
pub(crate) mod keyspec;
pub mod parse;
pub mod reset;

use std::ffi::{c_int, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw;

use crate::algorithms::Decision;
use crate::api::{has, rm};
use crate::error;
use crate::store::log_warning;

/// A command's context and arguments, as Redis passed them.
#[derive(Clone, Copy)]
pub struct Call {
    pub ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: usize,
}

impl Call {
    /// The number of arguments, the command name included.
    pub fn argc(&self) -> usize {
        self.argc
    }

    /// Argument `i` as Redis holds it.
    pub fn string(&self, i: usize) -> *mut raw::RedisModuleString {
        assert!(i < self.argc, "argument index out of range");
        // SAFETY: argv holds argc valid pointers for the duration of the command.
        unsafe { *self.argv.add(i) }
    }

    /// Argument `i`'s bytes, borrowed in place.
    pub fn bytes(&self, i: usize) -> &[u8] {
        let mut len = 0usize;
        // SAFETY: a valid string of this command; Redis keeps it alive until the command returns.
        let ptr = unsafe { rm!(RedisModule_StringPtrLen)(self.string(i), &mut len) };
        if ptr.is_null() {
            return &[];
        }
        // SAFETY: StringPtrLen returned `len` readable bytes that live as long as the argument.
        unsafe { std::slice::from_raw_parts(ptr.cast(), len) }
    }

    /// The command comes from the master over the replication link, or from an AOF being
    /// loaded: a write this server must reproduce, not a client's request.
    pub fn replayed(&self) -> bool {
        self.context_flags()
            & (raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING)
            != 0
    }

    /// The client speaks RESP3 (`HELLO 3`).
    pub fn resp3(&self) -> bool {
        self.context_flags() & raw::REDISMODULE_CTX_FLAGS_RESP3 != 0
    }

    fn context_flags(&self) -> u32 {
        // SAFETY: the command's context.
        unsafe { rm!(RedisModule_GetContextFlags)(self.ctx) as u32 }
    }

    /// Replies with an error (`message` starts with its code, e.g. `ERR`).
    pub fn error(&self, message: &str) -> c_int {
        let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
        // SAFETY: the command's context and a NUL-terminated string; Redis copies it.
        unsafe { rm!(RedisModule_ReplyWithError)(self.ctx, message.as_ptr()) };
        raw::REDISMODULE_OK as c_int
    }

    pub fn reply_integer(&self, value: i64) {
        // SAFETY: the command's context.
        unsafe { rm!(RedisModule_ReplyWithLongLong)(self.ctx, value) };
    }

    pub fn reply_null(&self) {
        // SAFETY: the command's context.
        unsafe { rm!(RedisModule_ReplyWithNull)(self.ctx) };
    }

    /// A field name in a RESP3 map or a RESP2 field/value array.
    pub fn reply_name(&self, name: &std::ffi::CStr) {
        // SAFETY: the command's context and a NUL-terminated static string.
        unsafe { rm!(RedisModule_ReplyWithSimpleString)(self.ctx, name.as_ptr()) };
    }

    /// Opens an array (RESP2) of `len` elements.
    pub fn reply_array(&self, len: usize) {
        // SAFETY: the command's context.
        unsafe { rm!(RedisModule_ReplyWithArray)(self.ctx, len as _) };
    }

    /// Opens a map of `pairs` entries (RESP3), or a flat field/value array (RESP2).
    pub fn reply_map(&self, pairs: usize, resp3: bool) {
        if resp3 {
            // SAFETY: the command's context.
            unsafe { rm!(RedisModule_ReplyWithMap)(self.ctx, pairs as _) };
        } else {
            self.reply_array(2 * pairs);
        }
    }

    /// The six fields of a decision: an array of integers (RESP2) or a map with a boolean
    /// `allowed` (RESP3). `extra` more map entries follow, written by the caller (RESP3 only).
    pub fn reply_decision(&self, decision: &Decision, resp3: bool, extra: usize) {
        let fields = decision.to_array();
        if !resp3 {
            self.reply_array(fields.len());
            for value in fields {
                self.reply_integer(value);
            }
            return;
        }
        // SAFETY: the command's context.
        unsafe { rm!(RedisModule_ReplyWithMap)(self.ctx, (fields.len() + extra) as _) };
        for (name, value) in DECISION_FIELDS.iter().zip(fields) {
            self.reply_name(name);
            if *name == c"allowed" {
                // SAFETY: the command's context.
                unsafe { rm!(RedisModule_ReplyWithBool)(self.ctx, c_int::from(decision.allowed)) };
            } else {
                self.reply_integer(value);
            }
        }
    }
}

/// The distinct keys of a command that takes several, so it opens one handle per key: a second
/// handle on a key would keep pointing at a value the first one replaced or deleted.
#[derive(Debug, PartialEq, Eq)]
pub struct KeyGroups {
    /// The position of each distinct key's first occurrence, in order.
    pub first: Vec<usize>,
    /// For each position, the index in `first` of its key.
    pub group: Vec<usize>,
}

impl KeyGroups {
    /// Groups `names` by equal bytes, in O(n log n).
    pub fn of(names: &[&[u8]]) -> KeyGroups {
        let mut order: Vec<usize> = (0..names.len()).collect();
        // Stable: among equal names the earliest position comes first.
        order.sort_by(|&a, &b| names[a].cmp(names[b]));
        let mut leader = vec![0; names.len()];
        for (rank, &i) in order.iter().enumerate() {
            leader[i] = match rank.checked_sub(1).map(|r| order[r]) {
                Some(previous) if names[previous] == names[i] => leader[previous],
                _ => i,
            };
        }
        let mut first = Vec::new();
        let mut group = vec![0; names.len()];
        for i in 0..names.len() {
            group[i] = if leader[i] == i {
                first.push(i);
                first.len() - 1
            } else {
                group[leader[i]]
            };
        }
        KeyGroups { first, group }
    }

    /// Some key occurs more than once.
    pub fn repeats(&self) -> bool {
        self.first.len() < self.group.len()
    }
}

/// The reply fields' names, in order.
pub const DECISION_FIELDS: [&std::ffi::CStr; 6] = [
    c"allowed",
    c"limit",
    c"remaining",
    c"retry_after_ms",
    c"reset_after_ms",
    c"delay_ms",
];

/// Runs a command body; a panic is logged and answered with an error, never unwound into Redis.
pub fn guard(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    body: fn(&Call) -> c_int,
) -> c_int {
    let call = Call {
        ctx,
        argv,
        argc: usize::try_from(argc).unwrap_or(0),
    };
    catch_unwind(AssertUnwindSafe(|| body(&call))).unwrap_or_else(|_| {
        log_warning("ratelimit: a command panicked; answered with an error");
        call.error(error::INTERNAL)
    })
}

/// The server's clock in ms: frozen per command, MULTI and script where Redis offers it (7.2+),
/// else read once per command.
pub fn now_ms() -> u64 {
    let ms = if has!(RedisModule_CachedMicroseconds) {
        // SAFETY: present, and callable from the main thread without a context.
        unsafe { rm!(RedisModule_CachedMicroseconds)() / 1000 }
    } else {
        // SAFETY: as above.
        unsafe { rm!(RedisModule_Milliseconds)() }
    };
    u64::try_from(ms).unwrap_or(0)
}

/// Replicates (and appends to the AOF) `ratelimit.apply key payload`.
pub(crate) fn replicate_apply(call: &Call, key: *mut raw::RedisModuleString, payload: &[u8]) {
    // SAFETY: a registered command; "sb" = a key string and a buffer, both valid for the call.
    let status = unsafe {
        rm!(RedisModule_Replicate)(
            call.ctx,
            c"ratelimit.apply".as_ptr(),
            c"sb".as_ptr(),
            key,
            payload.as_ptr().cast::<std::ffi::c_char>(),
            payload.len(),
        )
    };
    if status != raw::REDISMODULE_OK as c_int {
        log_warning("ratelimit: could not replicate a limiter write");
    }
}

/// Replicates the command as it was called (for deterministic commands).
pub fn replicate_verbatim(call: &Call) {
    // SAFETY: the command's context.
    unsafe { rm!(RedisModule_ReplicateVerbatim)(call.ctx) };
}

#[cfg(test)]
mod tests {
    use super::KeyGroups;

    #[test]
    fn repeated_keys_share_the_group_of_their_first_occurrence() {
        let names: [&[u8]; 6] = [b"b", b"a", b"b", b"c", b"a", b"b"];
        let groups = KeyGroups::of(&names);
        assert_eq!(groups.first, [0, 1, 3]);
        assert_eq!(groups.group, [0, 1, 0, 2, 1, 0]);
        assert!(groups.repeats());
        let single = KeyGroups::of(&[b"x"]);
        assert_eq!((single.first, single.group), (vec![0], vec![0]));
        assert!(!KeyGroups::of(&[b"x", b"y"]).repeats());
        assert_eq!(KeyGroups::of(&[]).first, Vec::<usize>::new());
    }
}
