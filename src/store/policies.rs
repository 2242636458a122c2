//! The policies in the RDB: module auxiliary data beside the keys, written before them.
//!
//! Stored format (one string buffer; changing it needs a new version byte, handled here for
//! every version ever written):
//! ```text
//! u8  version              2 (1: without the block)
//! u32 count (LE)
//! per policy, sorted by name:
//!   u8 name length, the name (1 to 64 bytes of A-Z a-z 0-9 _ - .)
//!   u8 algorithm (as in core/src/codec/), u64 limit, u64 period_ms, u64 capacity (LE), u8 mode (0 enforce, 1 shadow)
//!   version 2: u64 block_ms (LE; 0: no BLOCK)
//! ```
//! Decoding refuses anything `RATELIMIT.POLICY SET` could not have defined.
//!
//! The table is replaced, not merged, when a dataset is loaded (an RDB at start-up or by
//! `DEBUG RELOAD`, a replica's full sync, an AOF): [`loading`] sets the current table aside when
//! loading starts and puts it back if loading fails. An RDB saved without policies carries no
//! aux field on Redis 7.2+ (`aux_save2`), so it loads on a server without the module; Redis 7.0
//! writes the field always.

use std::ffi::c_int;
use std::sync::Mutex;

use redis_module::raw;
use redis_ratelimit_core::algorithms::{Algorithm, Kind, Params, MAX_PERIOD_MS};
use redis_ratelimit_core::policy::{self, Definitions, Mode, Policy, Table};

use crate::api::rm;
use crate::config::MAX_MAX_LOG_LIMIT;
use crate::log::{guarded, log_warning};

const VERSION: u8 = 2;

/// The table's definitions in the stored format.
pub fn encode(definitions: &[(Box<[u8]>, Policy)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + definitions.len() * 40);
    out.push(VERSION);
    out.extend_from_slice(&(definitions.len() as u32).to_le_bytes());
    for (name, policy) in definitions {
        out.push(name.len() as u8);
        out.extend_from_slice(name);
        out.push(policy.kind.index() as u8);
        for value in [
            policy.params.limit,
            policy.params.period_ms,
            policy.params.capacity,
        ] {
            out.extend_from_slice(&value.to_le_bytes());
        }
        out.push(match policy.mode {
            Mode::Enforce => 0,
            Mode::Shadow => 1,
        });
        out.extend_from_slice(&policy.block_ms.unwrap_or(0).to_le_bytes());
    }
    out
}

/// Why stored policies were refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    Version(u8),
    Length,
    Name,
    Duplicate,
    Algorithm,
    Params,
    Mode,
}

/// Decodes and validates stored policies.
pub fn decode(bytes: &[u8]) -> Result<Definitions, DecodeError> {
    let mut rest = bytes;
    let mut take = |n: usize| -> Result<&[u8], DecodeError> {
        let (head, tail) = rest.split_at_checked(n).ok_or(DecodeError::Length)?;
        rest = tail;
        Ok(head)
    };
    let version = take(1)?[0];
    if !(1..=VERSION).contains(&version) {
        return Err(DecodeError::Version(version));
    }
    let count = u32::from_le_bytes(take(4)?.try_into().map_err(|_| DecodeError::Length)?);
    let word = |bytes: &[u8]| u64::from_le_bytes(bytes.try_into().unwrap_or([0; 8]));
    let mut definitions: Definitions = Vec::new();
    for _ in 0..count {
        let len = usize::from(take(1)?[0]);
        let name = take(len)?;
        if !policy::valid_name(name) {
            return Err(DecodeError::Name);
        }
        let kind = Kind::from_index(take(1)?[0]).ok_or(DecodeError::Algorithm)?;
        let (limit, period_ms, capacity) = (word(take(8)?), word(take(8)?), word(take(8)?));
        let burst = kind.is_bucket().then_some(capacity);
        let params = Params::new(limit, period_ms, burst).map_err(|_| DecodeError::Params)?;
        if params.capacity != capacity
            || (kind == Kind::Rate(Algorithm::SlidingLog) && limit > MAX_MAX_LOG_LIMIT as u64)
        {
            return Err(DecodeError::Params);
        }
        let mode = match take(1)?[0] {
            0 => Mode::Enforce,
            1 => Mode::Shadow,
            _ => return Err(DecodeError::Mode),
        };
        let block_ms = if version >= 2 {
            match word(take(8)?) {
                0 => None,
                ms if ms <= MAX_PERIOD_MS => Some(ms),
                _ => return Err(DecodeError::Params),
            }
        } else {
            None
        };
        // Written sorted: a name out of order is a repeated (or a damaged) one.
        if definitions.last().is_some_and(|(last, _)| **last >= *name) {
            return Err(DecodeError::Duplicate);
        }
        definitions.push((
            name.into(),
            Policy {
                kind,
                params,
                mode,
                block_ms,
            },
        ));
    }
    if !rest.is_empty() {
        return Err(DecodeError::Length);
    }
    Ok(definitions)
}

/// Redis 7.0's aux_save: the field is written whether or not there are policies.
pub(crate) unsafe extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, when: c_int) {
    guarded("aux_save", (), || {
        if when == raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
            // SAFETY: Redis's IO handle for this callback.
            unsafe { save(rdb, &policy::table().definitions()) };
        }
    })
}

/// Redis 7.2+'s aux_save2: nothing is written (not even the field) when there is no policy.
pub(crate) unsafe extern "C" fn aux_save2(rdb: *mut raw::RedisModuleIO, when: c_int) {
    guarded("aux_save", (), || {
        let definitions = policy::table().definitions();
        if when == raw::REDISMODULE_AUX_BEFORE_RDB as c_int && !definitions.is_empty() {
            // SAFETY: Redis's IO handle for this callback.
            unsafe { save(rdb, &definitions) };
        }
    })
}

/// # Safety
/// `rdb` must be the IO handle of an aux_save callback.
unsafe fn save(rdb: *mut raw::RedisModuleIO, definitions: &[(Box<[u8]>, Policy)]) {
    let bytes = encode(definitions);
    // SAFETY: guaranteed by the caller; the buffer outlives the call.
    unsafe { rm!(RedisModule_SaveStringBuffer)(rdb, bytes.as_ptr().cast(), bytes.len()) };
}

pub(crate) unsafe extern "C" fn aux_load(
    rdb: *mut raw::RedisModuleIO,
    _encver: c_int,
    when: c_int,
) -> c_int {
    let refused = raw::REDISMODULE_ERR as c_int;
    guarded("aux_load", refused, || {
        if when != raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
            return raw::REDISMODULE_OK as c_int;
        }
        let mut len = 0usize;
        // SAFETY: Redis's IO handle; len receives the buffer's length.
        let buffer = unsafe { rm!(RedisModule_LoadStringBuffer)(rdb, &mut len) };
        // SAFETY: as above.
        if buffer.is_null() || unsafe { rm!(RedisModule_IsIOError)(rdb) } != 0 {
            return refused;
        }
        // SAFETY: Redis returned `len` readable bytes at `buffer`, ours to free.
        let decoded = decode(unsafe { std::slice::from_raw_parts(buffer.cast(), len) });
        // SAFETY: the buffer was allocated by Redis for us and is not used after this.
        unsafe { rm!(RedisModule_Free)(buffer.cast()) };
        match decoded {
            Ok(definitions) => {
                let mut table = policy::table();
                let counters = table.replace(Table::from_definitions(definitions));
                table.adopt_counters(&counters);
                raw::REDISMODULE_OK as c_int
            }
            Err(error) => {
                log_warning(&format!(
                    "ratelimit: refusing corrupt policies in RDB: {error:?}"
                ));
                refused
            }
        }
    })
}

/// The table set aside while a dataset loads (see the module comment).
static SET_ASIDE: Mutex<Option<Table>> = Mutex::new(None);

/// A loading event: `REDISMODULE_SUBEVENT_LOADING_*`.
pub(crate) fn loading(subevent: u64) {
    let mut aside = SET_ASIDE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    match subevent {
        raw::REDISMODULE_SUBEVENT_LOADING_RDB_START
        | raw::REDISMODULE_SUBEVENT_LOADING_AOF_START
        | raw::REDISMODULE_SUBEVENT_LOADING_REPL_START => {
            let current = policy::table().replace(Table::default());
            // A second start before an end keeps the first table set aside.
            aside.get_or_insert(current);
        }
        raw::REDISMODULE_SUBEVENT_LOADING_ENDED => {
            // The loaded policies keep the counters of the names they had.
            if let Some(before) = aside.take() {
                policy::table().adopt_counters(&before);
            }
        }
        raw::REDISMODULE_SUBEVENT_LOADING_FAILED => {
            if let Some(before) = aside.take() {
                policy::table().replace(before);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policies() -> Definitions {
        vec![
            (
                b"api.read"[..].into(),
                Policy {
                    kind: Kind::Rate(Algorithm::TokenBucket),
                    params: Params::new(10, 1000, Some(20)).unwrap(),
                    mode: Mode::Enforce,
                    block_ms: None,
                },
            ),
            (
                b"login"[..].into(),
                Policy {
                    kind: Kind::Rate(Algorithm::SlidingLog),
                    params: Params::new(3, 3_600_000, None).unwrap(),
                    mode: Mode::Shadow,
                    block_ms: None,
                },
            ),
        ]
    }

    #[test]
    fn version_1_without_blocks_still_loads() {
        // What the first version wrote: no block after the mode.
        let mut v1 = vec![1u8, 1, 0, 0, 0, 5];
        v1.extend_from_slice(b"login");
        v1.push(Algorithm::FixedWindow.index() as u8);
        for value in [3u64, 60_000, 3] {
            v1.extend_from_slice(&value.to_le_bytes());
        }
        v1.push(1);
        let decoded = decode(&v1).unwrap();
        assert_eq!(decoded.len(), 1);
        assert_eq!(decoded[0].1.block_ms, None);
        assert_eq!(decoded[0].1.mode, Mode::Shadow);
        // And a block round-trips in version 2.
        let mut blocked = policies();
        blocked[0].1.block_ms = Some(900_000);
        assert_eq!(decode(&encode(&blocked)), Ok(blocked));
    }

    #[test]
    fn policies_round_trip_and_an_empty_table_is_five_bytes() {
        let bytes = encode(&policies());
        assert_eq!(decode(&bytes), Ok(policies()));
        assert_eq!(encode(&[]), [VERSION, 0, 0, 0, 0]);
        assert_eq!(decode(&encode(&[])), Ok(vec![]));
    }

    #[test]
    fn what_policy_set_could_not_define_is_refused() {
        let good = encode(&policies());
        for len in 0..good.len() {
            assert!(decode(&good[..len]).is_err(), "prefix of {len}");
        }
        let mut padded = good.clone();
        padded.push(0);
        assert_eq!(decode(&padded), Err(DecodeError::Length));
        let damaged = |at: usize, byte: u8| {
            let mut bytes = good.clone();
            bytes[at] = byte;
            decode(&bytes)
        };
        assert_eq!(damaged(0, 3), Err(DecodeError::Version(3)));
        assert_eq!(damaged(0, 0), Err(DecodeError::Version(0)));
        // A block longer than 3650 days (the first policy's block, after its mode).
        let mut long = good.clone();
        let at = 5 + 1 + 8 + 1 + 24 + 1;
        long[at..at + 8].copy_from_slice(&(3650 * 86_400_000u64 + 1).to_le_bytes());
        assert_eq!(decode(&long), Err(DecodeError::Params));
        // The first name's first byte, its algorithm, its mode.
        assert_eq!(damaged(6, b':'), Err(DecodeError::Name));
        assert_eq!(damaged(5 + 1 + 8, 9), Err(DecodeError::Algorithm));
        assert_eq!(damaged(5 + 1 + 8 + 1 + 24, 2), Err(DecodeError::Mode));
        // A limit of 0.
        let mut zero = good.clone();
        zero[15..23].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(decode(&zero), Err(DecodeError::Params));
        // A window with a capacity other than its limit.
        let mut window = policies();
        window[1].1.params.capacity = 4;
        assert_eq!(decode(&encode(&window)), Err(DecodeError::Params));
        // The same name twice, or out of order.
        let mut twice = policies();
        twice[1].0 = twice[0].0.clone();
        assert_eq!(decode(&encode(&twice)), Err(DecodeError::Duplicate));
        let mut reversed = policies();
        reversed.reverse();
        assert_eq!(decode(&encode(&reversed)), Err(DecodeError::Duplicate));
    }
}
