//! The map keys of the RESP3 replies, made once at load as call replies: sending one costs a
//! single copy of its bytes, where `ReplyWithSimpleString` costs several appends and a `strlen`,
//! so a RESP3 reply costs about what the RESP2 array does.

use std::ffi::c_int;
use std::sync::OnceLock;

use redis_module::raw;

use crate::api::{has, rm};

/// The keys, as `ECHO` replies (bulk strings: clients read them as the strings they are).
pub(crate) struct FieldNames {
    pub decision: [*mut raw::RedisModuleCallReply; 6],
    pub limits: *mut raw::RedisModuleCallReply,
    /// `RedisModule_ReplyWithCallReply`, found present when the keys were made: a RESP3
    /// reply sends six keys through it, without looking it up each time.
    send: SendReply,
}

type SendReply =
    unsafe extern "C" fn(*mut raw::RedisModuleCtx, *mut raw::RedisModuleCallReply) -> c_int;

impl FieldNames {
    /// Sends `key`, one of these replies, as the next element of the command's reply.
    #[inline(always)]
    pub(crate) fn send(&self, ctx: *mut raw::RedisModuleCtx, key: *mut raw::RedisModuleCallReply) {
        // SAFETY: a command's context and a reply made at load and never freed.
        unsafe { (self.send)(ctx, key) };
    }
}

// SAFETY: the replies are written once at load and only read afterwards, on Redis's main
// thread; nothing ever frees or changes them.
unsafe impl Send for FieldNames {}
// SAFETY: as above.
unsafe impl Sync for FieldNames {}

static NAMES: OnceLock<FieldNames> = OnceLock::new();

/// The cached keys, once [`make`] succeeded.
pub(crate) fn get() -> Option<&'static FieldNames> {
    NAMES.get()
}

/// Makes the keys (from OnLoad). Without them (an API missing, a refused call) replies send
/// their keys as simple strings: the same map to a client.
pub(crate) fn make(ctx: *mut raw::RedisModuleCtx) -> bool {
    // SAFETY: the API table is written once at load and only read afterwards.
    let Some(send) = (unsafe { raw::RedisModule_ReplyWithCallReply }) else {
        return false;
    };
    if !(has!(RedisModule_Call) && has!(RedisModule_CallReplyType)) {
        return false;
    }
    let echo = |name: &std::ffi::CStr| -> Option<*mut raw::RedisModuleCallReply> {
        // SAFETY: the OnLoad context; "c" takes one NUL-terminated string. The reply is kept
        // for the module's lifetime and never freed: freeing it later would touch the load
        // context, which is gone by then.
        let reply =
            unsafe { rm!(RedisModule_Call)(ctx, c"ECHO".as_ptr(), c"c".as_ptr(), name.as_ptr()) };
        // SAFETY: a reply RM_Call returned (checked for null first).
        let is_string = !reply.is_null()
            && unsafe { rm!(RedisModule_CallReplyType)(reply) } as isize
                == raw::REDISMODULE_REPLY_STRING;
        is_string.then_some(reply)
    };
    let mut decision = [std::ptr::null_mut(); 6];
    for (slot, name) in decision.iter_mut().zip(DECISION_FIELDS) {
        match echo(name) {
            Some(reply) => *slot = reply,
            None => return false,
        }
    }
    let Some(limits) = echo(c"limits") else {
        return false;
    };
    NAMES
        .set(FieldNames {
            decision,
            limits,
            send,
        })
        .is_ok()
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
