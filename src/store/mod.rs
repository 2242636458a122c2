//! The module data type `ratelimit`: a limiter per key, in one of two forms (a compact word,
//! `compact.rs`, or a 32-byte value, `value.rs`), with its RDB, AOF, digest, memory and copy
//! callbacks, and the key access used by the commands.

pub mod policies;

// A stored limiter's forms and its binary encoding live in the core crate (no Redis).

use std::cell::Cell;
use std::ffi::{c_int, c_void, CStr};
use std::os::raw::c_char;
use std::ptr;

use redis_module::native_types::RedisType;
use redis_module::raw;
use redis_ratelimit_core::algorithms::{Kind, Limiter};
use redis_ratelimit_core::{codec, compact, value};

use crate::api::rm;
use crate::log::{guarded, log_warning};
use crate::stats;
use value::{Holder, LimiterRef, Value};

/// Bumped when the RDB layout changes; `rdb_load` handles every version up to this one.
///
/// Stored formats: the RDB encoding (`core/src/codec/`) is what users' RDB files hold, and the AOF
/// rewrite's `APPLY_COMMAND` payload what their AOF files hold; changing either needs a new
/// encoding version (or `Change` kind), with every older one still read.
/// tests/integration/fixtures/ pins version 1 byte for byte.
pub const ENCODING_VERSION: c_int = 1;

/// The command an AOF rewrite writes a key as: `ratelimit.apply key payload`, the payload a
/// [`codec::Change`] replacing the whole limiter. The store owns what it writes; the apply command
/// registers under this name to read it back.
pub const APPLY_COMMAND: &CStr = c"ratelimit.apply";

/// [`APPLY_COMMAND`]'s short name, the one commands replicate their writes under
/// (`rla key payload`): three bytes in every replicated write.
pub const APPLY_SHORT_NAME: &CStr = c"rla";

/// The data type, exactly 9 characters as Redis requires.
pub static LIMITER_TYPE: RedisType = RedisType::new(
    "ratelimit",
    ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        // The policies, before the keys (store/policies.rs).
        aux_load: Some(policies::aux_load),
        aux_save: Some(policies::aux_save),
        aux_save_triggers: raw::REDISMODULE_AUX_BEFORE_RDB as c_int,
        free_effort: None,
        unlink: None,
        copy: Some(copy),
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: None,
        copy2: None,
        aux_save2: Some(policies::aux_save2),
    },
);

fn raw_type() -> *mut raw::RedisModuleType {
    *LIMITER_TYPE.raw_type.borrow()
}

/// Hands a new limiter to Redis as a module value pointer: a compact word when it fits one (the
/// word itself, in place of a pointer: see `compact.rs`), else a pointer to a 32-byte [`Value`].
pub(crate) fn into_value(limiter: Limiter) -> *mut c_void {
    stats::key_created(limiter.kind());
    match compact::compact(&limiter) {
        Some(word) => word_value(word),
        None => Box::into_raw(Box::new(Value::new(limiter))).cast(),
    }
}

// A word travels as a pointer-sized value.
const _: () = assert!(std::mem::size_of::<*mut c_void>() == std::mem::size_of::<u64>());

/// A compact word as a module value: a pointer without provenance, never dereferenced (Redis only
/// hands it back to us, and `stored` reads its address).
fn word_value(word: u64) -> *mut c_void {
    ptr::without_provenance_mut(word as usize)
}

/// A module value pointer's target, read-only.
enum Stored<'a> {
    Compact(u64),
    Full(&'a Value),
}

impl Stored<'_> {
    fn read(&self) -> std::borrow::Cow<'_, Limiter> {
        match self {
            Stored::Compact(word) => std::borrow::Cow::Owned(compact::expand(*word)),
            Stored::Full(value) => value.read(),
        }
    }
}

unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guarded("rdb_load", ptr::null_mut(), || {
        if encver != 1 {
            log_warning(&format!(
                "ratelimit: cannot load encoding version {encver} (this module reads 1); \
                 upgrade the module"
            ));
            return ptr::null_mut();
        }
        let mut len = 0usize;
        // SAFETY: rdb is the IO handle Redis passed us; len receives the buffer's length.
        let buffer = unsafe { rm!(RedisModule_LoadStringBuffer)(rdb, &mut len) };
        // SAFETY: as above.
        if buffer.is_null() || unsafe { rm!(RedisModule_IsIOError)(rdb) } != 0 {
            return ptr::null_mut();
        }
        // SAFETY: Redis returned `len` readable bytes at `buffer`, ours to free.
        let decoded = codec::decode(unsafe { std::slice::from_raw_parts(buffer.cast(), len) });
        // SAFETY: the buffer was allocated by Redis for us and is not used after this.
        unsafe { rm!(RedisModule_Free)(buffer.cast()) };
        match decoded {
            Ok(limiter) => into_value(limiter),
            Err(error) => {
                log_warning(&format!(
                    "ratelimit: refusing corrupt limiter in RDB: {error:?}"
                ));
                ptr::null_mut()
            }
        }
    })
}

/// The stored value behind a module value.
///
/// # Safety
/// `value` must be a value made by [`into_value`] and still owned by Redis.
unsafe fn stored<'a>(value: *const c_void) -> Stored<'a> {
    let bits = value.addr() as u64;
    if compact::is_compact(bits) {
        Stored::Compact(bits)
    } else {
        // SAFETY: not a compact word (whose low bits no aligned pointer has), so a pointer to a
        // `Value` made by `into_value`, valid as long as Redis owns it (guaranteed by the caller).
        Stored::Full(unsafe { &*value.cast::<Value>() })
    }
}

/// Frees a value made by [`into_value`] and returns what it held.
///
/// # Safety
/// `value` must be a pointer made by [`into_value`], no longer used by anyone.
unsafe fn free_value(value: *mut c_void) -> Kind {
    // SAFETY: guaranteed by the caller.
    match unsafe { stored(value) } {
        Stored::Compact(word) => {
            // Read before the release: once released, the entry may be reassigned.
            let algorithm = compact::algorithm(word);
            compact::release(word);
            Kind::Rate(algorithm)
        }
        Stored::Full(_) => {
            // SAFETY: a `Box<Value>` made by `into_value`, released once here.
            let value = unsafe { Box::from_raw(value.cast::<Value>()) };
            value.kind()
        }
    }
}

unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guarded("rdb_save", (), || {
        // SAFETY: Redis passes a value of our type.
        let bytes = codec::to_bytes(&unsafe { stored(value) }.read());
        // SAFETY: rdb is Redis's IO handle; the buffer outlives the call.
        unsafe { rm!(RedisModule_SaveStringBuffer)(rdb, bytes.as_ptr().cast(), bytes.len()) };
    })
}

unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    guarded("aof_rewrite", (), || {
        let mut bytes = Vec::new();
        // SAFETY: Redis passes a value of our type.
        codec::encode_replace(&unsafe { stored(value) }.read(), &mut bytes);
        // SAFETY: a registered command, "sb" = key string + buffer, both valid for the call.
        unsafe {
            rm!(RedisModule_EmitAOF)(
                aof,
                APPLY_COMMAND.as_ptr(),
                c"sb".as_ptr(),
                key,
                bytes.as_ptr().cast::<c_char>(),
                bytes.len(),
            )
        };
    })
}

unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    guarded("mem_usage", 0, || {
        // SAFETY: Redis passes a value of our type.
        match unsafe { stored(value) } {
            // The word is the module value: no allocation of its own.
            Stored::Compact(_) => 0,
            Stored::Full(value) => value.memory_bytes(),
        }
    })
}

unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guarded("digest", (), || {
        // SAFETY: Redis passes a value of our type.
        let bytes = codec::to_bytes(&unsafe { stored(value) }.read());
        // SAFETY: md is Redis's digest handle; the buffer is valid for the call.
        unsafe {
            rm!(RedisModule_DigestAddStringBuffer)(
                md,
                bytes.as_ptr().cast_mut().cast(),
                bytes.len(),
            );
            rm!(RedisModule_DigestEndSequence)(md);
        }
    })
}

unsafe extern "C" fn free(value: *mut c_void) {
    guarded("free", (), || {
        // SAFETY: Redis hands back ownership of a pointer made by `into_value`, exactly once.
        stats::key_freed(unsafe { free_value(value) });
    })
}

unsafe extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    guarded("copy", ptr::null_mut(), || {
        // SAFETY: Redis passes a value of our type.
        into_value(unsafe { stored(value) }.read().into_owned())
    })
}

/// What a key holds.
pub enum Slot<'a> {
    Empty,
    /// A limiter; a change made through it is stored by `LimiterRef::store`, never on drop.
    Limiter(LimiterRef<'a>),
    WrongType,
}

/// The key holds another type.
struct WrongType;

/// An open key, closed on drop.
///
/// The module sets `REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED`, so closing a key opened for
/// writing does not by itself tell Redis it changed (WATCH, client tracking). A key that was
/// written through this handle ([`Key::set`], [`Key::expire_at`], [`Key::delete`]) signals the
/// change once, when it closes; a call that writes nothing stays invisible.
///
/// A command holds at most one handle per key: Redis caches the value in the handle, so a
/// second handle on the same key would keep pointing at a value the first one replaced or
/// deleted.
pub struct Key {
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    key: *mut raw::RedisModuleKey,
    written: Cell<bool>,
}

impl Key {
    /// Opens `name` for reading, or for reading and writing.
    pub(crate) fn open(
        ctx: *mut raw::RedisModuleCtx,
        name: *mut raw::RedisModuleString,
        write: bool,
    ) -> Key {
        let mode = if write {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        };
        // SAFETY: ctx and name are the command's own; the key is closed on drop.
        let key = unsafe { rm!(RedisModule_OpenKey)(ctx, name, mode as c_int) };
        Key {
            ctx,
            name,
            key: key.cast(),
            written: Cell::new(false),
        }
    }

    /// The key's content. `&mut self`: the view it hands out may change the value, so there is
    /// one at a time per handle (and one handle per key, see [`Key`]). Inlined: the caller's
    /// slot is built in place, not copied out (`make profile`).
    #[inline(always)]
    pub fn slot(&mut self) -> Slot<'_> {
        match self.value() {
            Ok(None) => Slot::Empty,
            // SAFETY: the key's value, made by `into_value` and valid while the key is open and
            // holds it; the returned view borrows this handle mutably, so no other view of it
            // exists and the value cannot be replaced through the handle while the view lives.
            Ok(Some(value)) => match unsafe { stored(value) } {
                Stored::Compact(word) => Slot::Limiter(LimiterRef::compact(word, &*self)),
                // SAFETY: as above: not a compact word, so a `Value` of ours, borrowed once.
                Stored::Full(_) => Slot::Limiter(unsafe { &mut *value.cast::<Value>() }.limiter()),
            },
            Err(WrongType) => Slot::WrongType,
        }
    }

    /// The key's value if it holds ours (`None` when empty).
    fn value(&self) -> Result<Option<*mut c_void>, WrongType> {
        // Our type first, the common case: ModuleTypeGetType answers NULL for a NULL key (a
        // missing key opened read-only), an empty key and a key of any other type alike.
        let ours = raw_type();
        // SAFETY: an open key or NULL, both accepted.
        let kind = unsafe { rm!(RedisModule_ModuleTypeGetType)(self.key) };
        if !ours.is_null() && kind == ours {
            // SAFETY: the key holds our type, whose values are made by `into_value`.
            let value = unsafe { rm!(RedisModule_ModuleTypeGetValue)(self.key) };
            return Ok(Some(value));
        }
        // SAFETY: KeyType accepts NULL and answers EMPTY.
        match unsafe { rm!(RedisModule_KeyType)(self.key) } as isize {
            raw::REDISMODULE_KEYTYPE_EMPTY => Ok(None),
            _ => Err(WrongType),
        }
    }

    /// Stores a new limiter in the (write-opened) key.
    pub fn set(&self, limiter: Limiter) -> bool {
        let value = into_value(limiter);
        // SAFETY: the key is open for writing; Redis takes ownership of `value` on success.
        let status = unsafe { rm!(RedisModule_ModuleTypeSetValue)(self.key, raw_type(), value) };
        if status != raw::REDISMODULE_OK as c_int {
            // SAFETY: Redis refused the value, so it is still ours.
            unsafe { free(value) };
            return false;
        }
        self.written.set(true);
        true
    }

    /// Sets the key's absolute expiry (ms since the epoch).
    pub fn expire_at(&self, at_ms: u64) {
        // SAFETY: an open, non-empty key.
        unsafe {
            rm!(RedisModule_SetAbsExpire)(self.key, i64::try_from(at_ms).unwrap_or(i64::MAX))
        };
        self.written.set(true);
    }

    /// Deletes the key.
    pub fn delete(&self) {
        // SAFETY: an open key.
        unsafe { rm!(RedisModule_DeleteKey)(self.key) };
        self.written.set(true);
    }

    /// Puts `new` in the key in place of its value and returns that value (ours from then on);
    /// `None` (nothing changed) if Redis refused: only a key opened for writing takes a new value.
    fn replace_value(&self, new: *mut c_void) -> Option<*mut c_void> {
        let mut old = ptr::null_mut();
        // SAFETY: an open key holding our type; on success Redis keeps `new` and hands back the
        // value it held.
        let status =
            unsafe { rm!(RedisModule_ModuleTypeReplaceValue)(self.key, raw_type(), new, &mut old) };
        if status != raw::REDISMODULE_OK as c_int {
            return None;
        }
        self.written.set(true);
        Some(old)
    }
}

impl Holder for Key {
    fn store_word(&self, word: u64) -> bool {
        // The old word's reference already passed to the new one: nothing to free.
        self.replace_value(word_value(word)).is_some()
    }

    fn store_full(&self, value: Value) -> bool {
        let new = Box::into_raw(Box::new(value)).cast::<c_void>();
        match self.replace_value(new) {
            Some(old) => {
                // SAFETY: the replaced word, made by `into_value` and no longer in the key. The
                // algorithm stays the same, so the key counts are unchanged.
                unsafe { free_value(old) };
                true
            }
            None => {
                // SAFETY: Redis refused `new`, so it is still ours.
                unsafe { free_value(new) };
                false
            }
        }
    }
}

impl Key {
    /// Closes the key now (signalling a change once if it was written); the handle is of no
    /// use afterwards. A key not closed this way closes when it drops.
    #[inline(always)]
    pub fn close(&mut self) {
        if self.written.replace(false) {
            // SAFETY: the command's context and its own key name, both valid for the command.
            unsafe { rm!(RedisModule_SignalModifiedKey)(self.ctx, self.name) };
        }
        if !self.key.is_null() {
            // SAFETY: an open key, closed once: the pointer is cleared right after.
            unsafe { rm!(RedisModule_CloseKey)(self.key) };
            self.key = ptr::null_mut();
        }
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        self.close();
    }
}
