//! The compact form of a bucket, a window or a GCRA limiter: one 64-bit word per key, holding the
//! time of its last call and its state, beside the index of a shared entry that holds what the
//! keys of one parameter set have in common (the algorithm, the parameters, an epoch).
//!
//! ```text
//! bits            field
//! 0..3            6: this form (the 32-byte form's first 3 bits are an algorithm's index, or 7)
//! 3..14           entry index
//! 14..14+T        last_ms − the entry's epoch start           (T: the entry's time bits)
//! 14+T..64        the state: a bucket's scaled amount, a fixed window's count, or a sliding
//!                 window's current count then its previous one (A bits each)
//! ```
//!
//! `A` is the width of the largest amount the parameters allow (`C·P` for a bucket, `L` for a
//! window count) and `T = 50 − A` (`50 − 2A` for a sliding window). An epoch is an aligned span of
//! `2^T` ms, so a key's `last_ms` is exact, and its entry is `(algorithm, L, P, C, epoch)`.
//! Parameters are stored once per entry instead of once per key. A limiter that does not fit
//! (parameters too wide for the 50 bits, a state beyond its parameters' bounds, a full table)
//! keeps the 32-byte form of `value.rs`. docs/operations.md says which parameters fit.
//!
//! The word is the module value itself: Redis keeps a module value as an opaque pointer and only
//! ever hands it back to the type's callbacks, so a word whose low bits (`110`) no aligned pointer
//! has is stored in place of one, and a key costs no allocation of its own.
//!
//! Stored formats: the word is not one. It never leaves the process (RDB, AOF, replication, DUMP
//! and digests encode the limiter through `codec/`), so it may change from one build to the
//! next without an encoding version; the formats that are stored are pinned by
//! tests/integration/fixtures/.
//!
//! Entries are reference-counted by the words that use them (each word holds one reference).
//! Only Redis's main thread assigns entries and takes references. Redis's lazyfree thread frees
//! values too, and so drops references: every value of a `FLUSHALL`/`FLUSHDB ASYNC`, of a plain
//! `FLUSHALL`/`FLUSHDB` under `lazyfree-lazy-user-flush yes`, of a replica's flush before a full
//! sync under `replica-lazy-flush yes`; and the value of an `UNLINK` (or a delete under the other
//! `lazyfree-lazy-*` settings) whose free effort is above Redis's threshold of 64, which ours,
//! declaring no `free_effort`, are not today (their effort counts as 1). So counts are atomics, a
//! slot is reassigned only once its count is seen at zero, and a count that reaches zero on any
//! thread marks its slot in `FREE`, where the main thread finds it.
//!
//! The rule: a new parameter set gets an entry, and its key a word, whenever some slot's count is
//! zero (a count dropped on another thread: once that release has returned). The search visits
//! every slot, starting after the one assigned last, so a slot released a moment ago, which may
//! still be found by its parameters, is the last to be given to another parameter set.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::algorithms::{Algorithm, Kind, Limiter, Params, State};

/// The first three bits of a compact word.
const TAG: u64 = 6;
const TAG_BITS: u32 = 3;
const INDEX_BITS: u32 = 11;
/// Entries in the table.
pub const ENTRIES: usize = 1 << INDEX_BITS;
const PAYLOAD_AT: u32 = TAG_BITS + INDEX_BITS;
/// Bits for the time and the state together.
const PAYLOAD_BITS: u32 = 64 - PAYLOAD_AT;
/// How many epochs the keys of one parameter set may span: `T` is at least the width of a key's
/// lifetime (a bucket's full refill, two windows) minus this many bits, so a parameter set's live
/// keys use at most `2^5 + 1` entries (most use one or two: keys live far shorter than a full
/// refill).
const MAX_EPOCH_SPREAD_BITS: u32 = 5;
/// Words of [`FREE`].
const FREE_WORDS: usize = ENTRIES / 64;

/// Whether a module value is a compact word (else it points to a 32-byte value).
#[inline(always)]
pub fn is_compact(value: u64) -> bool {
    value & 7 == TAG
}

#[inline(always)]
fn mask(width: u32) -> u64 {
    (1u64 << width) - 1
}

fn width(value: u128) -> u32 {
    128 - value.leading_zeros()
}

/// An entry: a parameter set in one epoch. `shape` is 0 for a slot never assigned, else the
/// algorithm's index + 1, `T` << 8 and `A` << 16. All fields are atomics so that a background
/// thread reading a value's algorithm (to count its release) never races with the main thread;
/// the main thread changes a slot's fields only while no word refers to it.
struct Entry {
    refs: AtomicU64,
    shape: AtomicU32,
    limit: AtomicU64,
    period_ms: AtomicU64,
    capacity: AtomicU64,
    epoch_ms: AtomicU64,
}

static TABLE: [Entry; ENTRIES] = [const {
    Entry {
        refs: AtomicU64::new(0),
        shape: AtomicU32::new(0),
        limit: AtomicU64::new(0),
        period_ms: AtomicU64::new(0),
        capacity: AtomicU64::new(0),
        epoch_ms: AtomicU64::new(0),
    }
}; ENTRIES];

/// The entry used last, tried first by [`compact`].
static RECENT: AtomicU32 = AtomicU32::new(0);

/// One bit per slot, set when its count may be zero: every slot starts free; the release that
/// brings a count to zero sets its bit (on whichever thread it runs), the retain that takes a
/// count from zero clears it (main thread). A bit can be stale, set on a slot in use again (a
/// release on another thread that set it after the main thread's retain had cleared it), never
/// missing: a slot whose count is zero has its bit set once its last release has returned.
/// [`find_free`] confirms a bit against the count and clears stale ones.
static FREE: [AtomicU64; FREE_WORDS] = [const { AtomicU64::new(u64::MAX) }; FREE_WORDS];

/// The widths of an entry's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    algorithm: Algorithm,
    time_bits: u32,
    amount_bits: u32,
}

impl Shape {
    /// The shape of a parameter set, if its keys fit a word.
    fn of(algorithm: Algorithm, params: &Params) -> Option<Shape> {
        let (amount_bits, fields, lifetime_ms) = match algorithm {
            Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra => {
                let full = params.capacity_scaled();
                let lifetime = full.div_ceil(u128::from(params.limit));
                (width(full), 1, lifetime)
            }
            Algorithm::FixedWindow => (width(params.limit.into()), 1, params.period_ms.into()),
            Algorithm::SlidingWindow => (
                width(params.limit.into()),
                2,
                2 * u128::from(params.period_ms),
            ),
            Algorithm::SlidingLog => return None,
        };
        let time_bits = PAYLOAD_BITS.checked_sub(amount_bits * fields)?;
        (width(lifetime_ms) <= time_bits + MAX_EPOCH_SPREAD_BITS).then_some(Shape {
            algorithm,
            time_bits,
            amount_bits,
        })
    }

    fn encode(self) -> u32 {
        (self.algorithm.index() as u32 + 1) | self.time_bits << 8 | self.amount_bits << 16
    }

    fn decode(bits: u32) -> Option<Shape> {
        let algorithm = Algorithm::from_index(((bits & 0xff) as u8).checked_sub(1)?)?;
        Some(Shape {
            algorithm,
            time_bits: bits >> 8 & 0xff,
            amount_bits: bits >> 16 & 0xff,
        })
    }

    /// The state's bits, if it fits this shape (a window's start must be the one `last_ms` is in,
    /// as the 32-byte form requires).
    #[inline(always)]
    fn amount(self, limiter: &Limiter) -> Option<u64> {
        let fits = |v: u128| (v >> self.amount_bits == 0).then_some(v as u64);
        let start = || limiter.params.window_start(limiter.last_ms);
        match &limiter.state {
            State::TokenBucket { tokens_scaled: v }
            | State::LeakyBucket { level_scaled: v }
            | State::Gcra { ahead_scaled: v } => fits(*v),
            State::FixedWindow {
                window_start_ms,
                count,
            } if *window_start_ms == start() => fits((*count).into()),
            State::SlidingWindow {
                window_start_ms,
                current,
                previous,
            } if *window_start_ms == start() => {
                Some(fits((*current).into())? | fits((*previous).into())? << self.amount_bits)
            }
            _ => None,
        }
    }
}

impl Entry {
    fn shape(&self) -> Option<Shape> {
        Shape::decode(self.shape.load(Ordering::Relaxed))
    }

    fn params(&self) -> Params {
        Params {
            limit: self.limit.load(Ordering::Relaxed),
            period_ms: self.period_ms.load(Ordering::Relaxed),
            capacity: self.capacity.load(Ordering::Relaxed),
        }
    }

    /// The word for `limiter` on this entry (number `index`), if the entry is its parameter set
    /// and epoch and the state fits.
    #[inline(always)]
    fn word(&self, index: usize, limiter: &Limiter) -> Option<u64> {
        if limiter.blocked_until_ms != 0 {
            return None;
        }
        let shape = self.shape()?;
        if Kind::Rate(shape.algorithm) != limiter.kind() || self.params() != limiter.params {
            return None;
        }
        let since = limiter
            .last_ms
            .checked_sub(self.epoch_ms.load(Ordering::Relaxed))?;
        if since >> shape.time_bits != 0 {
            return None;
        }
        let amount = shape.amount(limiter)?;
        Some(TAG | (index as u64) << TAG_BITS | (since | amount << shape.time_bits) << PAYLOAD_AT)
    }
}

fn index(word: u64) -> usize {
    (word >> TAG_BITS) as usize & (ENTRIES - 1)
}

/// The compact word for a new value holding `limiter`, taking a reference on its entry; `None`
/// when it does not fit (see the module comment).
pub fn compact(limiter: &Limiter) -> Option<u64> {
    // A blocked limiter carries its block's end too: no word holds it.
    if limiter.blocked_until_ms != 0 {
        return None;
    }
    let recent = RECENT.load(Ordering::Relaxed) as usize % ENTRIES;
    let word = match TABLE[recent].word(recent, limiter) {
        Some(word) => word,
        None => {
            let Kind::Rate(algorithm) = limiter.kind() else {
                return None;
            };
            let shape = Shape::of(algorithm, &limiter.params)?;
            shape.amount(limiter)?;
            let epoch_ms = limiter.last_ms & !mask(shape.time_bits);
            let index = assign(shape, limiter.params, epoch_ms)?;
            RECENT.store(index as u32, Ordering::Relaxed);
            TABLE[index].word(index, limiter)?
        }
    };
    retain(word);
    Some(word)
}

/// The word for `limiter`, changed from the one `word` held, which it takes the place of: on the
/// same entry the reference passes to it; on another it takes one there and drops `word`'s.
/// `None` when it no longer fits; `word` keeps its reference then.
pub fn rewrite(word: u64, limiter: &Limiter) -> Option<u64> {
    let at = index(word);
    if let Some(same) = TABLE[at].word(at, limiter) {
        return Some(same);
    }
    let moved = compact(limiter)?;
    release(word);
    Some(moved)
}

/// Takes another reference on `word`'s entry (main thread).
#[inline(always)]
pub fn retain(word: u64) {
    let at = index(word);
    if TABLE[at].refs.fetch_add(1, Ordering::AcqRel) == 0 {
        // In use again: no longer a free slot.
        FREE[at / 64].fetch_and(!(1 << (at % 64)), Ordering::AcqRel);
    }
}

/// Drops `word`'s reference on its entry (the word is being freed or replaced; any thread).
#[inline(always)]
pub fn release(word: u64) {
    let at = index(word);
    let previous = TABLE[at].refs.fetch_sub(1, Ordering::AcqRel);
    // A second release of one reference would wrap the count and keep the slot forever.
    debug_assert!(previous > 0, "entry {at} released more often than retained");
    if previous == 1 {
        // After the count: whoever reads the bit (Acquire) sees the count at zero.
        FREE[at / 64].fetch_or(1 << (at % 64), Ordering::Release);
    }
}

/// The algorithm of the limiter `word` holds.
pub fn algorithm(word: u64) -> Algorithm {
    TABLE[index(word)]
        .shape()
        .map_or(Algorithm::TokenBucket, |shape| shape.algorithm)
}

/// The limiter `word` holds.
pub fn expand(word: u64) -> Limiter {
    let entry = &TABLE[index(word)];
    // A word always names an entry it holds a reference on, so the entry is assigned.
    let shape = entry
        .shape()
        .expect("a compact word names an assigned entry");
    let params = entry.params();
    let payload = word >> PAYLOAD_AT;
    let last_ms = entry.epoch_ms.load(Ordering::Relaxed) + (payload & mask(shape.time_bits));
    let amount = payload >> shape.time_bits;
    let state = match shape.algorithm {
        Algorithm::TokenBucket => State::TokenBucket {
            tokens_scaled: amount.into(),
        },
        Algorithm::LeakyBucket => State::LeakyBucket {
            level_scaled: amount.into(),
        },
        Algorithm::Gcra => State::Gcra {
            ahead_scaled: amount.into(),
        },
        Algorithm::FixedWindow => State::FixedWindow {
            window_start_ms: params.window_start(last_ms),
            count: amount,
        },
        Algorithm::SlidingWindow => State::SlidingWindow {
            window_start_ms: params.window_start(last_ms),
            current: amount & mask(shape.amount_bits),
            previous: amount >> shape.amount_bits,
        },
        Algorithm::SlidingLog => {
            unreachable!("a log is never compact (Shape::of)")
        }
    };
    Limiter {
        params,
        last_ms,
        state,
        blocked_until_ms: 0,
    }
}

/// What identifies an entry.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct EntryKey {
    algorithm: Algorithm,
    params: Params,
    epoch_ms: u64,
}

impl Entry {
    /// What the entry holds now, if it was ever assigned.
    fn key(&self) -> Option<EntryKey> {
        Some(EntryKey {
            algorithm: self.shape()?.algorithm,
            params: self.params(),
            epoch_ms: self.epoch_ms.load(Ordering::Relaxed),
        })
    }
}

/// A multiply-rotate hash: the keys are a few integers, and hashing runs on every new key.
#[derive(Default)]
struct Mix(u64);

impl Hasher for Mix {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(byte.into());
        }
    }

    fn write_u8(&mut self, value: u8) {
        self.write_u64(value.into());
    }

    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }

    fn write_isize(&mut self, value: isize) {
        self.write_u64(value as u64);
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Which slot holds which entry, and where to start looking for a free slot (main thread only).
struct Slots {
    by_key: HashMap<EntryKey, usize, BuildHasherDefault<Mix>>,
    cursor: usize,
}

static SLOTS: Mutex<Option<Slots>> = Mutex::new(None);

/// The first slot from `start` on (wrapping around) whose count is zero, its bit left set (the
/// caller's retain clears it); `None` when every count is above zero. Main thread only, so a count
/// seen at zero stays there: only the main thread takes references.
fn find_free(start: usize) -> Option<usize> {
    let (first_word, first_bit) = (start / 64, start % 64);
    // Every word from `start`'s on, then `start`'s own word again for the bits before it.
    for step in 0..=FREE_WORDS {
        let at_word = (first_word + step) % FREE_WORDS;
        let mut bits = FREE[at_word].load(Ordering::Acquire);
        if step == 0 {
            bits &= u64::MAX << first_bit;
        } else if step == FREE_WORDS {
            bits &= !(u64::MAX << first_bit);
        }
        while bits != 0 {
            let bit = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let slot = at_word * 64 + bit;
            if TABLE[slot].refs.load(Ordering::Acquire) == 0 {
                return Some(slot);
            }
            // Stale: clear it, then look at the count again. A release racing with the clear
            // either sets the bit after it, or brought the count to zero before a set the clear
            // has read (and so synchronised with): either way the slot stays findable.
            FREE[at_word].fetch_and(!(1 << bit), Ordering::AcqRel);
            if TABLE[slot].refs.load(Ordering::Acquire) == 0 {
                FREE[at_word].fetch_or(1 << bit, Ordering::Release);
                return Some(slot);
            }
        }
    }
    None
}

/// The slot of the entry `(shape, params, epoch_ms)`, assigned now if there is none (`None`: every
/// slot has references). The caller takes the reference.
fn assign(shape: Shape, params: Params, epoch_ms: u64) -> Option<usize> {
    let key = EntryKey {
        algorithm: shape.algorithm,
        params,
        epoch_ms,
    };
    let mut guard = SLOTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let slots = guard.get_or_insert_with(|| Slots {
        by_key: HashMap::default(),
        cursor: 0,
    });
    if let Some(&index) = slots.by_key.get(&key) {
        return Some(index);
    }
    let index = find_free(slots.cursor)?;
    let entry = &TABLE[index];
    if let Some(old) = entry.key() {
        slots.by_key.remove(&old);
    }
    entry.limit.store(params.limit, Ordering::Relaxed);
    entry.period_ms.store(params.period_ms, Ordering::Relaxed);
    entry.capacity.store(params.capacity, Ordering::Relaxed);
    entry.epoch_ms.store(epoch_ms, Ordering::Relaxed);
    entry.shape.store(shape.encode(), Ordering::Relaxed);
    slots.by_key.insert(key, index);
    slots.cursor = (index + 1) % ENTRIES;
    Some(index)
}

/// Entries in use (with at least one reference).
#[cfg(test)]
pub fn entries_in_use() -> usize {
    TABLE
        .iter()
        .filter(|entry| entry.refs.load(Ordering::Relaxed) > 0)
        .count()
}

/// Tests that use the table (it is global) take turns.
#[cfg(test)]
pub(crate) fn test_turn() -> std::sync::MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests;
