//! `CONFIG RESETSTAT` zeroes the module's counters (`INFO ratelimit`'s calls, allowed and
//! rejected per algorithm and per policy), as it zeroes `INFO commandstats`.
//!
//! Redis tells modules nothing of it, so the module sees the command go by (a command filter,
//! which runs before the command) and takes a snapshot of its counters; once the command has run
//! (a one-shot callback of the event loop) it checks that it did run, and then takes the snapshot
//! off the counters, which so count from the moment of the reset. A `CONFIG RESETSTAT` that was
//! refused (ACL, a client without the right) changes nothing.
//!
//! How it knows: Redis counts every call of CHECK, CHECKALL and the dialects in their
//! `commandstats` lines, and the module counts the same calls (`stats::count_call`). Without a
//! reset since the module's last one, Redis's count equals the module's; after a reset at the
//! snapshot, Redis's count is the module's minus the snapshot's. A snapshot of no call holds no
//! decision either, so there is nothing to tell apart then. Not seen: a `CONFIG RESETSTAT` queued
//! in a MULTI (the filter sees it when it is queued, before it runs).

use std::collections::HashMap;
use std::ffi::{c_void, CStr, CString};
use std::sync::Mutex;

use redis_module::raw;
use redis_ratelimit_core::policy::{self, Figures};

use crate::api::{has, rm};
use crate::stats;

/// What the counters were when a `CONFIG RESETSTAT` went by.
struct Snapshot {
    decisions: stats::Snapshot,
    policies: HashMap<Box<[u8]>, Figures>,
}

/// The snapshots of the `CONFIG RESETSTAT`s seen since the last check, oldest first.
static PENDING: Mutex<Vec<Snapshot>> = Mutex::new(Vec::new());

/// The commands whose calls `stats::count_call` counts, as Redis names their commandstats lines
/// (`cmdstat_<name>`): the `counted` ones the module registered.
static COUNTED: Mutex<Vec<CString>> = Mutex::new(Vec::new());

/// Declares a registered command whose calls `stats::count_call` counts (from OnLoad), by the
/// name it was registered with.
pub(crate) fn counted(command: &CStr) {
    let mut line = b"cmdstat_".to_vec();
    line.extend_from_slice(command.to_bytes());
    if let Ok(line) = CString::new(line) {
        lock(&COUNTED).push(line);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Registers the filter (from OnLoad). False when the server lacks an API it needs: then
/// `CONFIG RESETSTAT` leaves the module's counters as they are.
pub(crate) fn register(ctx: *mut raw::RedisModuleCtx) -> bool {
    let needed = has!(RedisModule_RegisterCommandFilter)
        && has!(RedisModule_CommandFilterArgsCount)
        && has!(RedisModule_CommandFilterArgGet)
        && has!(RedisModule_EventLoopAddOneShot)
        && has!(RedisModule_GetServerInfo)
        && has!(RedisModule_ServerInfoGetFieldC)
        && has!(RedisModule_FreeServerInfo);
    if !needed {
        return false;
    }
    // SAFETY: the OnLoad context and a filter that lives as long as the module.
    let filter = unsafe {
        rm!(RedisModule_RegisterCommandFilter)(
            ctx,
            Some(filter),
            raw::REDISMODULE_CMDFILTER_NOSELF as i32,
        )
    };
    !filter.is_null()
}

/// Runs before every command: is it `CONFIG RESETSTAT`? Every command pays for this, so the
/// test that rules out nearly all of them (two arguments) comes first, with nothing else set up.
unsafe extern "C" fn filter(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    // SAFETY: the API table is written once at load and only read afterwards.
    let Some(count) = (unsafe { raw::RedisModule_CommandFilterArgsCount }) else {
        return;
    };
    // SAFETY: Redis's filter context, valid during the callback.
    if unsafe { count(fctx) } == 2 {
        // SAFETY: as above.
        unsafe { two_arguments(fctx) };
    }
}

/// A command of two arguments went by: is it `CONFIG RESETSTAT`?
///
/// # Safety
/// `fctx` must be the filter context Redis passed [`filter`], valid during the callback.
#[cold]
#[inline(never)]
unsafe fn two_arguments(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    let _ = std::panic::catch_unwind(|| {
        let arg = |pos: i32| -> &[u8] {
            // SAFETY: as above; a position below the count.
            let string = unsafe { rm!(RedisModule_CommandFilterArgGet)(fctx, pos) };
            if string.is_null() {
                return &[];
            }
            let mut len = 0usize;
            // SAFETY: a string of the command, alive during the callback.
            let ptr = unsafe { rm!(RedisModule_StringPtrLen)(string, &mut len) };
            if ptr.is_null() {
                return &[];
            }
            // SAFETY: StringPtrLen returned `len` readable bytes, alive during the callback.
            unsafe { std::slice::from_raw_parts(ptr.cast(), len) }
        };
        if arg(0).eq_ignore_ascii_case(b"config") && arg(1).eq_ignore_ascii_case(b"resetstat") {
            seen();
        }
    });
}

/// A `CONFIG RESETSTAT` is about to run: remember the counters, and check once it has run.
fn seen() {
    let snapshot = Snapshot {
        decisions: stats::snapshot(),
        policies: policy::table().figures(),
    };
    let mut pending = lock(&PENDING);
    pending.push(snapshot);
    if pending.len() == 1 {
        // SAFETY: a callback that lives as long as the module; no data.
        unsafe { rm!(RedisModule_EventLoopAddOneShot)(Some(check), std::ptr::null_mut()) };
    }
}

/// After the `CONFIG RESETSTAT`s seen: applies the latest that ran.
unsafe extern "C" fn check(_data: *mut c_void) {
    let _ = std::panic::catch_unwind(apply_pending);
}

/// Applies the latest of the `CONFIG RESETSTAT`s seen that ran, if any, and forgets them. Called
/// from the one-shot [`check`] and before `INFO ratelimit` reads the counters: an `INFO` sent in
/// the same pipeline as the `CONFIG RESETSTAT` runs before the event loop's one-shot, and would
/// otherwise show the counters from before the reset. A reset is applied only once it has run
/// (Redis's count tells), so checking early is as safe as checking late.
pub(crate) fn apply_pending() {
    let pending = {
        let mut pending = lock(&PENDING);
        if pending.is_empty() {
            return;
        }
        std::mem::take(&mut *pending)
    };
    let Some(redis_calls) = redis_calls() else {
        return;
    };
    let ours = stats::calls();
    let reset = pending.iter().rev().find(|snapshot| {
        let at = snapshot.decisions.calls;
        at > 0 && ours.checked_sub(at) == Some(redis_calls)
    });
    if let Some(snapshot) = reset {
        stats::subtract(&snapshot.decisions);
        policy::table().subtract(&snapshot.policies);
    }
}

/// The calls Redis counted of the commands `stats::count_call` counts.
fn redis_calls() -> Option<u64> {
    // SAFETY: a NULL context (the data is freed below) and a static section name.
    let info =
        unsafe { rm!(RedisModule_GetServerInfo)(std::ptr::null_mut(), c"commandstats".as_ptr()) };
    if info.is_null() {
        return None;
    }
    let total = lock(&COUNTED).iter().try_fold(0u64, |total, line| {
        // SAFETY: `info` is live until freed below; the name is NUL-terminated.
        let value = unsafe { rm!(RedisModule_ServerInfoGetFieldC)(info, line.as_ptr()) };
        if value.is_null() {
            return Some(total); // not called since the last reset: Redis shows no line
        }
        // SAFETY: a non-null result is a NUL-terminated string owned by `info`.
        let text = unsafe { CStr::from_ptr(value) }.to_bytes();
        Some(total + calls_field(text)?)
    });
    // SAFETY: the data GetServerInfo returned, freed once, with the NULL context it was made with.
    unsafe { rm!(RedisModule_FreeServerInfo)(std::ptr::null_mut(), info) };
    total
}

/// `calls=N` at the start of a commandstats value (`calls=5,usec=..,...`).
fn calls_field(text: &[u8]) -> Option<u64> {
    let rest = text.strip_prefix(b"calls=")?;
    let end = rest.iter().position(|b| *b == b',').unwrap_or(rest.len());
    redis_ratelimit_core::integer::parse_integer(&rest[..end])
}

#[cfg(test)]
mod tests {
    use super::calls_field;

    #[test]
    fn the_calls_field_is_read_from_a_commandstats_line() {
        assert_eq!(
            calls_field(b"calls=12,usec=40,usec_per_call=3.33,rejected_calls=0,failed_calls=1"),
            Some(12)
        );
        assert_eq!(calls_field(b"calls=7"), Some(7));
        assert_eq!(calls_field(b"usec=7"), None);
        assert_eq!(calls_field(b"calls=x,usec=1"), None);
    }
}
