//! Logging through Redis's log, from any code of the module, and the type callbacks' panic guard
//! (a leaf: it uses nothing of ours).

use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use redis_module::raw;

/// Logs `message` at the `warning` level (the crate's logger allocates a CString too; fine off
/// the hot path). Does nothing before `RedisModule_Init` filled the API table.
pub fn log_warning(message: &str) {
    if let Ok(message) = CString::new(message) {
        // SAFETY: the API table is written once at load, before any caller, and only read since.
        if let Some(log) = unsafe { raw::RedisModule_Log } {
            // SAFETY: a NULL context logs as the module; both strings are NUL-terminated.
            unsafe {
                log(
                    ptr::null_mut(),
                    c"warning".as_ptr(),
                    c"%s".as_ptr(),
                    message.as_ptr(),
                )
            };
        }
    }
}

/// Runs a type callback, turning a panic into `fallback`, logged (never unwinding into Redis).
pub(crate) fn guarded<T>(name: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        log_warning(&format!("ratelimit: {name} callback panicked"));
        fallback
    })
}
