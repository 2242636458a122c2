//! A command's call: its context and arguments as Redis passed them, read in place, and the
//! replies written to it; the handlers made from a command's body ([`handler!`]), the panic guard
//! they run it in ([`guard`]), and the server's clock ([`now_ms`]).

use std::ffi::{c_int, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw;
use redis_ratelimit_core::algorithms::Decision;
use redis_ratelimit_core::error;
use redis_ratelimit_core::few::{Few, FEW_KEYS};

use super::field_names::{self, DECISION_FIELDS};
use crate::api::{has, rm};
use crate::log::log_warning;
use crate::stats;

/// The command handlers Redis calls, made from `$body: fn(&Call) -> c_int` run inside [`guard`]:
/// one that counts each call (`stats::count_call`) and one that does not. Registration picks
/// the counting one for a command [`counted`](super::registry::Command::counted).
macro_rules! handler {
    ($body:expr) => {{
        unsafe extern "C" fn plain(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            argv: *mut *mut redis_module::raw::RedisModuleString,
            argc: std::ffi::c_int,
        ) -> std::ffi::c_int {
            // SAFETY: Redis calls a command handler on its main thread with the command's context
            // and `argc` arguments, all valid until the handler returns.
            unsafe { $crate::commands::call::guard(ctx, argv, argc, false, $body) }
        }
        unsafe extern "C" fn counting(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            argv: *mut *mut redis_module::raw::RedisModuleString,
            argc: std::ffi::c_int,
        ) -> std::ffi::c_int {
            // SAFETY: as above.
            unsafe { $crate::commands::call::guard(ctx, argv, argc, true, $body) }
        }
        $crate::commands::registry::Handlers {
            plain: plain as $crate::commands::registry::Handler,
            counting: counting as $crate::commands::registry::Handler,
        }
    }};
}
pub(crate) use handler;

/// A command's context and arguments, as Redis passed them. Made only by [`guard`], whose caller
/// vouches for the pointers, so its safe methods can read them.
#[derive(Clone, Copy)]
pub(crate) struct Call {
    pub ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: usize,
}

impl Call {
    /// The number of arguments, the command name included.
    pub fn argc(&self) -> usize {
        self.argc
    }

    /// Argument `i` as Redis holds it (to pass back to Redis: a key name, a replicated argument).
    pub fn raw_arg(&self, i: usize) -> *mut raw::RedisModuleString {
        assert!(i < self.argc, "argument index out of range");
        // SAFETY: argv holds argc valid pointers for the duration of the command.
        unsafe { *self.argv.add(i) }
    }

    /// Every argument as Redis holds it, the command name first.
    pub fn raw_args(&self) -> &[*mut raw::RedisModuleString] {
        if self.argc == 0 {
            return &[];
        }
        // SAFETY: argv holds argc valid pointers for the duration of the command, which a
        // `Call` (made by `guard` for one command) does not outlive.
        unsafe { std::slice::from_raw_parts(self.argv, self.argc) }
    }

    /// Argument `i`'s bytes, borrowed in place.
    pub fn bytes(&self, i: usize) -> &[u8] {
        self.bytes_of(self.raw_arg(i))
    }

    /// The bytes of the arguments from position `first` on (0: the command name), in order.
    #[inline(always)]
    pub fn args_from(&self, first: usize) -> impl Iterator<Item = &[u8]> {
        self.raw_args()
            .iter()
            .skip(first)
            .map(|&arg| self.bytes_of(arg))
    }

    /// The bytes of `arg`, borrowed in place. Private: `arg` is always one of this call's
    /// arguments ([`raw_args`](Call::raw_args), [`raw_arg`](Call::raw_arg)), which the safety of
    /// the read below rests on.
    #[inline(always)]
    fn bytes_of(&self, arg: *mut raw::RedisModuleString) -> &[u8] {
        let mut len = 0usize;
        // SAFETY: a valid string of this command; Redis keeps it alive until the command returns.
        let ptr = unsafe { rm!(RedisModule_StringPtrLen)(arg, &mut len) };
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

    /// A bulk string.
    pub fn reply_bulk(&self, bytes: &[u8]) {
        // SAFETY: the command's context and `bytes.len()` readable bytes; Redis copies them.
        unsafe {
            rm!(RedisModule_ReplyWithStringBuffer)(self.ctx, bytes.as_ptr().cast(), bytes.len())
        };
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
    /// Inlined: every CHECK's reply (`make profile`).
    #[inline(always)]
    pub fn reply_decision(&self, decision: &Decision, resp3: bool, extra: usize) {
        self.reply_fields(decision, None, resp3, extra);
    }

    /// [`reply_decision`](Call::reply_decision)'s fields, the first one `allowed` or, given
    /// `granted` (TAKE), `granted`: that integer in its place, under RESP3 too. Inlined, so a
    /// CHECK's reply (`granted` none) is written without the branches it does not take.
    #[inline(always)]
    pub fn reply_fields(
        &self,
        decision: &Decision,
        granted: Option<u64>,
        resp3: bool,
        extra: usize,
    ) {
        let mut fields = decision.to_array();
        if let Some(granted) = granted {
            fields[0] = i64::try_from(granted).unwrap_or(i64::MAX);
        }
        if resp3 {
            self.reply_map_of(&fields, granted.is_some(), decision.allowed, extra);
        } else {
            self.reply_array_of(&fields);
        }
    }

    /// The six fields as a RESP2 array of integers.
    #[inline(always)]
    fn reply_array_of(&self, fields: &[i64; 6]) {
        self.reply_array(fields.len());
        for &value in fields {
            self.reply_integer(value);
        }
    }

    /// The six fields as a RESP3 map of `extra` more entries: `allowed` a boolean, or with
    /// `granted` the integer `granted`, then the five integers under their names.
    #[inline(always)]
    fn reply_map_of(&self, fields: &[i64; 6], granted: bool, allowed: bool, extra: usize) {
        // SAFETY: the command's context.
        unsafe { rm!(RedisModule_ReplyWithMap)(self.ctx, (fields.len() + extra) as _) };
        let cached = field_names::get();
        if granted {
            self.reply_name(c"granted");
            self.reply_integer(fields[0]);
        } else {
            match cached {
                Some(names) => names.send(self.ctx, names.decision[0]),
                None => self.reply_name(DECISION_FIELDS[0]),
            }
            // SAFETY: the command's context.
            unsafe { rm!(RedisModule_ReplyWithBool)(self.ctx, c_int::from(allowed)) };
        }
        for i in 1..fields.len() {
            match cached {
                Some(names) => names.send(self.ctx, names.decision[i]),
                None => self.reply_name(DECISION_FIELDS[i]),
            }
            self.reply_integer(fields[i]);
        }
    }
}

/// The distinct keys of a command that takes several, so it opens one handle per key: a second
/// handle on a key would keep pointing at a value the first one replaced or deleted. Up to
/// [`FEW_KEYS`] keys, made without allocating.
#[derive(Debug, PartialEq, Eq)]
pub struct KeyGroups {
    /// The position of each distinct key's first occurrence, in order.
    pub first: Few<usize, FEW_KEYS>,
    /// For each position, the index in `first` of its key.
    pub group: Few<usize, FEW_KEYS>,
}

impl KeyGroups {
    /// Groups `names` by equal bytes: up to [`FEW_KEYS`] names, each against the distinct ones
    /// before it (no sort, nothing allocated); more, in O(n log n).
    pub fn of(names: &[&[u8]]) -> KeyGroups {
        if names.len() > FEW_KEYS {
            return KeyGroups::sorted(names);
        }
        let mut first: Few<usize, FEW_KEYS> = Few::new();
        let mut group = Few::new();
        for (i, name) in names.iter().enumerate() {
            match first.iter().position(|&f| names[f] == *name) {
                Some(g) => group.push(g),
                None => {
                    group.push(first.len());
                    first.push(i);
                }
            }
        }
        KeyGroups { first, group }
    }

    /// [`of`](KeyGroups::of) for many names, through a sort of their positions.
    fn sorted(names: &[&[u8]]) -> KeyGroups {
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
        let mut first = Few::new();
        let mut group = Few::filled(0, names.len());
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

    /// Some key is named more than once.
    pub fn repeated(&self) -> bool {
        self.first.len() < self.group.len()
    }
}

/// Runs a command body; a panic is logged and answered with an error, never unwound into Redis.
///
/// # Safety
/// `ctx` must be a command's context and `argv` hold `argc` valid strings, all valid until this
/// returns (what Redis passes a command handler).
/// With `counted`, the call is counted first (`stats::count_call`), whatever it answers.
#[inline(always)]
pub(crate) unsafe fn guard(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    counted: bool,
    body: fn(&Call) -> c_int,
) -> c_int {
    if counted {
        stats::count_call();
    }
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
pub(crate) fn now_ms() -> u64 {
    let ms = if has!(RedisModule_CachedMicroseconds) {
        // SAFETY: present, and callable from the main thread without a context.
        unsafe { rm!(RedisModule_CachedMicroseconds)() / 1000 }
    } else {
        // SAFETY: as above.
        unsafe { rm!(RedisModule_Milliseconds)() }
    };
    u64::try_from(ms).unwrap_or(0)
}

/// Replicates the command as it was called (for deterministic commands).
pub(crate) fn replicate_verbatim(call: &Call) {
    // SAFETY: the command's context.
    unsafe { rm!(RedisModule_ReplicateVerbatim)(call.ctx) };
}

#[cfg(test)]
mod tests {
    use super::{Few, KeyGroups};

    #[test]
    fn repeated_keys_share_the_group_of_their_first_occurrence() {
        let names: [&[u8]; 6] = [b"b", b"a", b"b", b"c", b"a", b"b"];
        let groups = KeyGroups::of(&names);
        assert_eq!(groups.first, [0, 1, 3]);
        assert_eq!(groups.group, [0, 1, 0, 2, 1, 0]);
        assert!(groups.repeated());
        let single = KeyGroups::of(&[b"x"]);
        assert_eq!(
            (single.first, single.group),
            (Few::from([0]), Few::from([0]))
        );
        assert_eq!(KeyGroups::of(&[b"x", b"y"]).first, [0, 1]);
        assert!(!KeyGroups::of(&[b"x", b"y"]).repeated());
        assert_eq!(KeyGroups::of(&[]).first, Vec::<usize>::new());
    }

    /// Beyond `FEW_KEYS` names the groups come from a sort: the same groups as the scan's.
    #[test]
    fn many_keys_group_as_a_few_do() {
        for count in [1, 7, 8, 9, 12, 30] {
            for distinct in [1, 3, 8, 40] {
                let owned: Vec<Vec<u8>> = (0..count)
                    .map(|i: usize| format!("k{}", (i * 7 + i / 3) % distinct).into_bytes())
                    .collect();
                let names: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
                let groups = KeyGroups::of(&names);
                // Naively: each name's group is the rank of its first occurrence among firsts.
                let mut first: Vec<usize> = Vec::new();
                let mut group = Vec::new();
                for (i, name) in names.iter().enumerate() {
                    match first.iter().position(|&f| names[f] == *name) {
                        Some(g) => group.push(g),
                        None => {
                            group.push(first.len());
                            first.push(i);
                        }
                    }
                }
                assert_eq!(groups.first, first, "{count} names, {distinct} distinct");
                assert_eq!(groups.group, group, "{count} names, {distinct} distinct");
                assert_eq!(KeyGroups::sorted(&names), groups);
            }
        }
    }
}
