//! The 32-byte form of a stored limiter (and the payload buckets and windows replicate as), and
//! the handle commands change a stored limiter through, whatever its form.
//!
//! Buckets and windows are bit-packed into 32 bytes (jemalloc's 32-byte class): every field has a
//! bound (docs/algorithms.md), so its width is fixed. The sliding log, whose entries live on the
//! heap anyway, stays a boxed [`Limiter`].
//!
//! ```text
//! bits    field
//! 0..3    algorithm (its index; 7 marks a boxed limiter)
//! 3..56   last_ms           (< 2^53)
//! 56..96  limit             (<= 10^12 < 2^40)
//! 96..135 period_ms         (<= 3650 days < 2^39)
//! token/leaky bucket: 135..175 capacity (< 2^40), 175..254 tokens/level scaled (<= C·P < 2^79)
//! fixed window:       135..175 count
//! sliding window:     135..175 current, 175..215 previous
//! ```
//! A window's start is not stored: it is the window holding `last_ms` (the codec checks the same).
//!
//! Most buckets and windows do not even take these 32 bytes: `compact.rs` stores them in one word
//! beside an entry shared by the keys of the same parameters. This form is for the rest, and for
//! the replication payload of every bucket and window.
//!
//! Stored formats: this layout is also payload kind `3` (`codec/change.rs`), which replication streams
//! and AOF files hold: changing it needs a new `Change` kind (the old one still decoded) and so
//! an encoding change; tests/integration/fixtures/ pins it byte for byte.

use std::borrow::Cow;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};

use crate::algorithms::{Algorithm, Kind, Limiter, Params, State};
use crate::compact;

const ALGORITHM_BITS: u32 = 3;
const TIME_BITS: u32 = 53;
const AMOUNT_BITS: u32 = 40;
const PERIOD_BITS: u32 = 39;
const SCALED_BITS: u32 = 79;
/// The algorithm tag of a boxed limiter.
const BOXED: u128 = 7;

/// A stored limiter: 32 bytes, packed or pointing to a boxed limiter. The first word says which:
/// its first 3 bits are the packed algorithm's index, or `BOXED` (7).
#[repr(C)]
pub struct Value {
    /// The first packed word, or [`BOXED`] alone.
    head: u64,
    /// Read only as the form `head` names: written together with it, and only by [`Value::new`]
    /// and [`Value::set_words`].
    rest: Rest,
}

/// The 24 bytes after a [`Value`]'s head: the other three packed words, or the boxed limiter as
/// a typed pointer (made by `Box::into_raw`, owned by the value), never an integer.
#[repr(C)]
union Rest {
    packed: [u64; 3],
    boxed: *mut Limiter,
}

/// A [`Value`] read: its packed words, or its boxed limiter.
enum Form {
    Packed([u64; 4]),
    Boxed(*mut Limiter),
}

/// Bit positions of the fields (see the module comment).
const ALGORITHM_AT: u32 = 0;
const LAST_AT: u32 = ALGORITHM_AT + ALGORITHM_BITS;
const LIMIT_AT: u32 = LAST_AT + TIME_BITS;
const PERIOD_AT: u32 = LIMIT_AT + AMOUNT_BITS;
const FIRST_AT: u32 = PERIOD_AT + PERIOD_BITS;
const SECOND_AT: u32 = FIRST_AT + AMOUNT_BITS;
const _: () = assert!(SECOND_AT + SCALED_BITS <= 256);

/// The 256 bits as two `u128` halves, so every field is one or two shifts.
#[inline(always)]
fn halves(words: &[u64; 4]) -> [u128; 2] {
    [
        u128::from(words[0]) | u128::from(words[1]) << 64,
        u128::from(words[2]) | u128::from(words[3]) << 64,
    ]
}

#[inline(always)]
fn mask(width: u32) -> u128 {
    u128::MAX >> (128 - width)
}

/// The `width`-bit field at bit `at`.
#[inline(always)]
fn get(bits: &[u128; 2], at: u32, width: u32) -> u128 {
    let value = if at >= 128 {
        bits[1] >> (at - 128)
    } else if at + width <= 128 {
        bits[0] >> at
    } else {
        bits[0] >> at | bits[1] << (128 - at)
    };
    value & mask(width)
}

/// Sets the `width`-bit field at bit `at` (initially zero) and returns what of `value` is wider
/// than the field: zero when it fits. The caller ORs these and drops the bits unless all are zero.
#[inline(always)]
fn put(bits: &mut [u128; 2], at: u32, width: u32, value: u128) -> u128 {
    if at >= 128 {
        bits[1] |= value << (at - 128);
    } else {
        bits[0] |= value << at;
        if at + width > 128 {
            bits[1] |= value >> (128 - at);
        }
    }
    value >> width
}

/// The 32-byte packed form of `limiter`, when it has one (every bucket and window within the
/// bounds of docs/algorithms.md; never a sliding log). Replication sends it as is.
pub fn pack(limiter: &Limiter) -> Option<[u64; 4]> {
    // A blocked limiter carries its block's end too: it takes the boxed form.
    if limiter.blocked_until_ms != 0 {
        return None;
    }
    let mut bits = [0u128; 2];
    let params = &limiter.params;
    // A window's start is not stored: it must be the window of `last_ms` (one division, which
    // buckets do not pay).
    let window_start = || params.window_start(limiter.last_ms);
    let mut excess = put(
        &mut bits,
        ALGORITHM_AT,
        ALGORITHM_BITS,
        limiter.kind().index() as u128,
    ) | put(&mut bits, LAST_AT, TIME_BITS, limiter.last_ms.into())
        | put(&mut bits, LIMIT_AT, AMOUNT_BITS, params.limit.into())
        | put(&mut bits, PERIOD_AT, PERIOD_BITS, params.period_ms.into());
    excess |= match &limiter.state {
        State::TokenBucket { tokens_scaled: v }
        | State::LeakyBucket { level_scaled: v }
        | State::Gcra { ahead_scaled: v } => {
            put(&mut bits, FIRST_AT, AMOUNT_BITS, params.capacity.into())
                | put(&mut bits, SECOND_AT, SCALED_BITS, *v)
        }
        State::FixedWindow {
            window_start_ms,
            count,
        } if *window_start_ms == window_start() => {
            put(&mut bits, FIRST_AT, AMOUNT_BITS, (*count).into())
        }
        State::SlidingWindow {
            window_start_ms,
            current,
            previous,
        } if *window_start_ms == window_start() => {
            put(&mut bits, FIRST_AT, AMOUNT_BITS, (*current).into())
                | put(&mut bits, SECOND_AT, AMOUNT_BITS, (*previous).into())
        }
        _ => return None,
    };
    (excess == 0).then_some([
        bits[0] as u64,
        (bits[0] >> 64) as u64,
        bits[1] as u64,
        (bits[1] >> 64) as u64,
    ])
}

/// Inlined: a CHECK on a packed value unpacks it into its handle, in place (`make profile`).
#[inline(always)]
fn unpack(words: &[u64; 4]) -> Limiter {
    let bits = halves(words);
    let field = |at, width| get(&bits, at, width) as u64;
    let last_ms = field(LAST_AT, TIME_BITS);
    let limit = field(LIMIT_AT, AMOUNT_BITS);
    let period_ms = field(PERIOD_AT, PERIOD_BITS);
    let mut params = Params {
        limit,
        period_ms,
        capacity: limit,
    };
    let window_start_ms = params.window_start(last_ms);
    let state = match Algorithm::from_index(field(ALGORITHM_AT, ALGORITHM_BITS) as u8) {
        Some(Algorithm::TokenBucket) => {
            params.capacity = field(FIRST_AT, AMOUNT_BITS);
            State::TokenBucket {
                tokens_scaled: get(&bits, SECOND_AT, SCALED_BITS),
            }
        }
        Some(Algorithm::LeakyBucket) => {
            params.capacity = field(FIRST_AT, AMOUNT_BITS);
            State::LeakyBucket {
                level_scaled: get(&bits, SECOND_AT, SCALED_BITS),
            }
        }
        Some(Algorithm::Gcra) => {
            params.capacity = field(FIRST_AT, AMOUNT_BITS);
            State::Gcra {
                ahead_scaled: get(&bits, SECOND_AT, SCALED_BITS),
            }
        }
        Some(Algorithm::FixedWindow) => State::FixedWindow {
            window_start_ms,
            count: field(FIRST_AT, AMOUNT_BITS),
        },
        Some(Algorithm::SlidingWindow) => State::SlidingWindow {
            window_start_ms,
            current: field(FIRST_AT, AMOUNT_BITS),
            previous: field(SECOND_AT, AMOUNT_BITS),
        },
        // Only `pack` writes these words, and it never packs a log or an unknown tag.
        _ => unreachable!("packed limiter with tag of a boxed one"),
    };
    Limiter {
        params,
        last_ms,
        state,
        blocked_until_ms: 0,
    }
}

/// The limiter `words` pack, if they are what [`pack`] makes: a packable algorithm, parameters
/// within bounds, and no bit set outside the algorithm's fields. The state's own bounds (a
/// bucket beyond its capacity) are the codec's to check.
pub fn unpacked(words: &[u64; 4]) -> Option<Limiter> {
    let bits = halves(words);
    let field = |at, width| get(&bits, at, width) as u64;
    let algorithm = Algorithm::from_index(field(ALGORITHM_AT, ALGORITHM_BITS) as u8)?;
    if algorithm == Algorithm::SlidingLog {
        return None;
    }
    let burst = algorithm.is_bucket().then(|| field(FIRST_AT, AMOUNT_BITS));
    // Valid parameters first: unpacking divides by the period.
    Params::new(
        field(LIMIT_AT, AMOUNT_BITS),
        field(PERIOD_AT, PERIOD_BITS),
        burst,
    )
    .ok()?;
    let limiter = unpack(words);
    (pack(&limiter) == Some(*words)).then_some(limiter)
}

impl Value {
    /// Stores `limiter` packed when it fits, else boxed.
    pub fn new(limiter: Limiter) -> Value {
        match pack(&limiter) {
            Some(words) => Value::packed(words),
            None => Value {
                head: BOXED as u64,
                rest: Rest {
                    boxed: Box::into_raw(Box::new(limiter)),
                },
            },
        }
    }

    /// The value holding `words`, made by [`pack`] (so their head is never [`BOXED`]).
    fn packed(words: [u64; 4]) -> Value {
        debug_assert_ne!(
            u128::from(words[0]) & BOXED,
            BOXED,
            "pack never tags a word BOXED"
        );
        Value {
            head: words[0],
            rest: Rest {
                packed: [words[1], words[2], words[3]],
            },
        }
    }

    /// Which form the value has, with its words or its limiter.
    #[inline(always)]
    fn form(&self) -> Form {
        if u128::from(self.head) & BOXED == BOXED {
            // SAFETY: a head of BOXED is only ever written by `new`, together with `rest.boxed`;
            // `packed` and `set_words` write heads made by `pack`, whose first 3 bits are an
            // algorithm's index (at most 5), together with `rest.packed`.
            Form::Boxed(unsafe { self.rest.boxed })
        } else {
            // SAFETY: any other head is written together with `rest.packed` (as above).
            let [b, c, d] = unsafe { self.rest.packed };
            Form::Packed([self.head, b, c, d])
        }
    }

    fn boxed(&self) -> Option<*mut Limiter> {
        match self.form() {
            Form::Boxed(pointer) => Some(pointer),
            Form::Packed(_) => None,
        }
    }

    /// Replaces a packed value's words with `words`, made by [`pack`].
    fn set_words(&mut self, words: [u64; 4]) {
        debug_assert!(self.boxed().is_none(), "a boxed value is never repacked");
        debug_assert_ne!(
            u128::from(words[0]) & BOXED,
            BOXED,
            "pack never tags a word BOXED"
        );
        self.head = words[0];
        self.rest = Rest {
            packed: [words[1], words[2], words[3]],
        };
    }

    /// The packed words (`None` when boxed).
    #[cfg(test)]
    fn words(&self) -> Option<[u64; 4]> {
        match self.form() {
            Form::Packed(words) => Some(words),
            Form::Boxed(_) => None,
        }
    }

    /// The limiter, to read or change; a change is stored by [`LimiterRef::store`]. Inlined:
    /// the caller's handle is built in place (`make profile`).
    #[inline(always)]
    pub fn limiter(&mut self) -> LimiterRef<'_> {
        match self.form() {
            // SAFETY: the pointer was made by `Box::into_raw` in `new` and is owned by this value,
            // which `&mut self` borrows whole for the handle's lifetime.
            Form::Boxed(pointer) => LimiterRef::Boxed(unsafe { &mut *pointer }),
            Form::Packed(words) => LimiterRef::Packed {
                limiter: ManuallyDrop::new(unpack(&words)),
                value: self,
            },
        }
    }

    /// The limiter, read-only: borrowed when boxed, unpacked when packed.
    pub fn read(&self) -> Cow<'_, Limiter> {
        match self.form() {
            // SAFETY: as in `limiter`, borrowed for as long as `&self`.
            Form::Boxed(pointer) => Cow::Borrowed(unsafe { &*pointer }),
            Form::Packed(words) => Cow::Owned(unpack(&words)),
        }
    }

    /// A copy of the limiter.
    #[cfg(test)]
    pub fn to_limiter(&self) -> Limiter {
        self.read().into_owned()
    }

    /// What the limiter holds, without unpacking.
    pub fn kind(&self) -> Kind {
        match self.boxed() {
            // SAFETY: as in `limiter`.
            Some(pointer) => unsafe { (*pointer).kind() },
            None => Kind::Rate(
                Algorithm::from_index((self.head & BOXED as u64) as u8)
                    .unwrap_or(Algorithm::TokenBucket),
            ),
        }
    }

    /// Bytes held, for `MEMORY USAGE`.
    pub fn memory_bytes(&self) -> usize {
        let boxed = match self.boxed() {
            Some(pointer) => {
                // SAFETY: as in `limiter`.
                let limiter = unsafe { &*pointer };
                let heap = match &limiter.state {
                    State::SlidingLog(log) => log.heap_bytes(),
                    State::Concurrency(leases) => {
                        std::mem::size_of::<crate::algorithms::Leases>() + leases.heap_bytes()
                    }
                    _ => 0,
                };
                std::mem::size_of::<Limiter>() + heap
            }
            None => 0,
        };
        std::mem::size_of::<Value>() + boxed
    }
}

impl Drop for Value {
    fn drop(&mut self) {
        if let Some(pointer) = self.boxed() {
            // SAFETY: made by `Box::into_raw` in `new`, released exactly once here.
            drop(unsafe { Box::from_raw(pointer) });
        }
    }
}

/// Where a compact word is stored: the open key, whose module value the word is.
pub trait Holder {
    /// Replaces the key's word with `word` (which has taken over its reference, see
    /// [`compact::rewrite`]); false if the key refused it.
    fn store_word(&self, word: u64) -> bool;
    /// Replaces the key's word with `value` (the same limiter, in the wider form), releasing the
    /// word; false if the key refused it (the key keeps its word, `value` is dropped).
    fn store_full(&self, value: Value) -> bool;
}

/// The key refused a changed limiter: it keeps what it held before the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused;

/// A limiter borrowed from a stored value, to read or change.
///
/// Nothing is written back when it drops: a change is stored by [`LimiterRef::store`], the one
/// write of a changed limiter (the commands' write path calls it). A packed or compact limiter
/// is changed on a copy, which a handle dropped without `store` leaves unwritten; a boxed one
/// (a sliding log, a lease set, a blocked limiter) is changed where it lives, which `store`
/// then has nothing more to do for.
pub enum LimiterRef<'a> {
    Packed {
        value: &'a mut Value,
        limiter: ManuallyDrop<Limiter>,
    },
    Boxed(&'a mut Limiter),
    /// A compact word (`compact.rs`), the key's value itself.
    Compact {
        word: u64,
        limiter: ManuallyDrop<Limiter>,
        holder: &'a dyn Holder,
    },
}

impl<'a> LimiterRef<'a> {
    /// The limiter in a key's compact word.
    pub fn compact(word: u64, holder: &'a dyn Holder) -> LimiterRef<'a> {
        LimiterRef::Compact {
            word,
            limiter: ManuallyDrop::new(compact::expand(word)),
            holder,
        }
    }
}

/// Stores `limiter`, changed from what `word` held, in its key: as a word when it still fits one,
/// else in the 32-byte form.
fn store_compact(word: u64, limiter: &Limiter, holder: &dyn Holder) -> Result<(), Refused> {
    match compact::rewrite(word, limiter) {
        Some(same) if same == word => Ok(()),
        Some(changed) => {
            if holder.store_word(changed) {
                return Ok(());
            }
            // The key keeps `word`: its reference comes back, the new word's goes.
            compact::retain(word);
            compact::release(changed);
            Err(Refused)
        }
        None => match holder.store_full(Value::new(limiter.clone())) {
            true => Ok(()),
            false => Err(Refused),
        },
    }
}

impl LimiterRef<'_> {
    /// Stores the limiter as changed through this handle, in the smallest form it fits where it
    /// is packed or compact (a limiter a block started on takes the boxed form), and returns its
    /// packed form, to replicate as it is. `None` for a boxed limiter (changed in place already)
    /// or one that no longer packs. [`Refused`] if the key refused the changed value: it keeps
    /// the old one.
    #[inline]
    pub fn store(&mut self) -> Result<Option<[u64; 4]>, Refused> {
        match self {
            LimiterRef::Packed { value, limiter } => {
                let Some(packed) = pack(limiter) else {
                    // No longer packable (a block started): the boxed form, in place.
                    **value = Value::new(Limiter::clone(limiter));
                    return Ok(None);
                };
                value.set_words(packed);
                Ok(Some(packed))
            }
            LimiterRef::Compact {
                word,
                limiter,
                holder,
            } => {
                store_compact(*word, limiter, *holder)?;
                Ok(pack(limiter))
            }
            LimiterRef::Boxed(_) => Ok(None),
        }
    }
}

/// Drops the copy a packed or compact handle changes: it holds a bucket's or a window's state
/// (no heap), unless a caller replaced it whole. Written out rather than left to the drop glue,
/// which is a call on every CHECK (`make profile`).
impl Drop for LimiterRef<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        if let LimiterRef::Packed { limiter, .. } | LimiterRef::Compact { limiter, .. } = self {
            if limiter.state.owns_heap() {
                // SAFETY: the handle's own copy, dropped once, here, as the handle goes.
                unsafe { ManuallyDrop::drop(limiter) };
            }
        }
    }
}

impl Deref for LimiterRef<'_> {
    type Target = Limiter;

    fn deref(&self) -> &Limiter {
        match self {
            LimiterRef::Packed { limiter, .. } | LimiterRef::Compact { limiter, .. } => limiter,
            LimiterRef::Boxed(limiter) => limiter,
        }
    }
}

impl DerefMut for LimiterRef<'_> {
    fn deref_mut(&mut self) -> &mut Limiter {
        match self {
            LimiterRef::Packed { limiter, .. } | LimiterRef::Compact { limiter, .. } => limiter,
            LimiterRef::Boxed(limiter) => limiter,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::testing::states;
    use crate::algorithms::{check, Request, SlidingLog, Write, MAX_AMOUNT, MAX_PERIOD_MS};

    fn limiter(algorithm: Algorithm, limit: u64, period_ms: u64, burst: Option<u64>) -> Limiter {
        let params = Params::new(limit, period_ms, burst).unwrap();
        let request = Request {
            algorithm,
            params,
            cost: 1,
            now_ms: (1 << 53) - 1 - 2 * MAX_PERIOD_MS,
        };
        let mut created = None;
        match check(None, &request, true, &mut created).unwrap().1 {
            Write::Created => created.expect("a created limiter"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_field_one_bit_too_wide_is_not_packed() {
        // Each field at the largest value its width holds packs back whole; one more does not
        // pack at all (the value stays boxed), whichever field it is.
        let params = Params {
            limit: 1000,
            period_ms: 1000,
            capacity: 1000,
        };
        let bucket = |params: Params, last_ms: u64, tokens_scaled: u128| Limiter {
            params,
            last_ms,
            state: State::TokenBucket { tokens_scaled },
            blocked_until_ms: 0,
        };
        let window = |count: u64, previous: u64| Limiter {
            params,
            last_ms: 5_000,
            state: State::SlidingWindow {
                window_start_ms: 5_000,
                current: count,
                previous,
            },
            blocked_until_ms: 0,
        };
        let max = |bits: u32| (1u64 << bits) - 1;
        let cases = |extra: u64| {
            [
                bucket(params, max(TIME_BITS) + extra, 7),
                bucket(
                    Params {
                        limit: max(AMOUNT_BITS) + extra,
                        ..params
                    },
                    5,
                    7,
                ),
                bucket(
                    Params {
                        period_ms: max(PERIOD_BITS) + extra,
                        ..params
                    },
                    5,
                    7,
                ),
                bucket(
                    Params {
                        capacity: max(AMOUNT_BITS) + extra,
                        ..params
                    },
                    5,
                    7,
                ),
                bucket(params, 5, (1u128 << SCALED_BITS) - 1 + u128::from(extra)),
                window(max(AMOUNT_BITS) + extra, 3),
                window(3, max(AMOUNT_BITS) + extra),
            ]
        };
        for limiter in cases(0) {
            let packed = pack(&limiter).unwrap_or_else(|| panic!("{limiter:?}"));
            assert_eq!(unpack(&packed), limiter);
        }
        for limiter in cases(1) {
            assert_eq!(pack(&limiter), None, "{limiter:?}");
            let mut value = Value::new(limiter.clone());
            assert!(value.boxed().is_some());
            assert_eq!(*value.limiter(), limiter);
        }
    }

    #[test]
    fn value_is_32_bytes() {
        assert_eq!(std::mem::size_of::<Value>(), 32);
    }

    #[test]
    fn every_algorithm_round_trips_at_the_largest_values() {
        for algorithm in Algorithm::ALL {
            for (limit, period, burst) in [(1, 1, 1), (MAX_AMOUNT, MAX_PERIOD_MS, MAX_AMOUNT)] {
                let burst = algorithm.is_bucket().then_some(burst);
                let mut original = limiter(algorithm, limit, period, burst);
                if let State::SlidingWindow { previous, .. } = &mut original.state {
                    *previous = limit;
                }
                let mut value = Value::new(original.clone());
                assert_eq!(value.to_limiter(), original, "{}", algorithm.name());
                assert_eq!(value.kind(), Kind::Rate(algorithm));
                assert_eq!(*value.limiter(), original);
                assert_eq!(
                    value.boxed().is_some(),
                    algorithm == Algorithm::SlidingLog,
                    "{}",
                    algorithm.name()
                );
            }
        }
    }

    #[test]
    fn changes_through_the_handle_are_stored() {
        let mut value = Value::new(limiter(Algorithm::TokenBucket, 10, 1000, Some(20)));
        let mut handle = value.limiter();
        handle.last_ms += 5;
        if let State::TokenBucket { tokens_scaled } = &mut handle.state {
            *tokens_scaled = 1234;
        }
        let expected = handle.clone();
        assert_eq!(handle.store(), Ok(pack(&expected)));
        drop(handle);
        let stored = value.to_limiter();
        assert_eq!(
            stored.state,
            State::TokenBucket {
                tokens_scaled: 1234
            }
        );
        assert_eq!(stored.params.capacity, 20);
        let mut log = Value::new(Limiter {
            params: Params::new(3, 1000, None).unwrap(),
            last_ms: 7,
            state: State::SlidingLog(SlidingLog::from_runs([(7, 2)]).unwrap()),
            blocked_until_ms: 0,
        });
        log.limiter().last_ms = 9;
        assert_eq!(log.to_limiter().last_ms, 9);
        assert!(log.memory_bytes() > 32);
    }

    #[test]
    fn a_handle_writes_only_when_stored() {
        let original = limiter(Algorithm::FixedWindow, 10, 1000, None);
        let mut value = Value::new(original.clone());
        let words = value.words();
        // A handle dropped without `store` writes nothing, even if something was touched.
        value.limiter().last_ms += 1;
        assert_eq!(value.words(), words);
        assert_eq!(value.to_limiter(), original);
        // Stored, the same change is in the value.
        let mut handle = value.limiter();
        handle.last_ms += 1;
        assert!(handle.store().is_ok());
        drop(handle);
        assert_eq!(value.to_limiter().last_ms, original.last_ms + 1);
        // A block takes the boxed form, in place.
        let mut handle = value.limiter();
        handle.blocked_until_ms = handle.last_ms + 10;
        let blocked = handle.clone();
        assert_eq!(handle.store(), Ok(None));
        drop(handle);
        assert!(value.boxed().is_some());
        assert_eq!(value.to_limiter(), blocked);
    }

    /// A key holding a compact word, as `Key` does in Redis.
    struct TestKey {
        word: std::cell::Cell<u64>,
        full: std::cell::RefCell<Option<Limiter>>,
        /// Refuses every value, as a key Redis would not write.
        refuses: std::cell::Cell<bool>,
    }

    impl Holder for TestKey {
        fn store_word(&self, word: u64) -> bool {
            if self.refuses.get() {
                return false;
            }
            self.word.set(word);
            true
        }

        fn store_full(&self, value: Value) -> bool {
            if self.refuses.get() {
                return false;
            }
            compact::release(self.word.get());
            *self.full.borrow_mut() = Some(value.to_limiter());
            true
        }
    }

    #[test]
    fn a_compact_handle_writes_its_word_or_moves_to_the_wider_form() {
        let _turn = compact::test_turn();
        let original = limiter(Algorithm::Gcra, 9, 4_000, Some(3));
        let key = TestKey {
            word: compact::compact(&original).unwrap().into(),
            full: None.into(),
            refuses: false.into(),
        };
        let handle = || LimiterRef::compact(key.word.get(), &key);
        // Read, or changed and dropped without `store`: the word stays as it was.
        let before = key.word.get();
        assert_eq!(*handle(), original);
        handle().last_ms += 7;
        assert_eq!(key.word.get(), before);
        // Changed within its bounds and stored: the new word, and the 32-byte form to replicate.
        let mut changed = handle();
        changed.last_ms += 7;
        let expected = changed.clone();
        assert_eq!(changed.store(), Ok(pack(&expected)));
        drop(changed);
        assert_eq!(compact::expand(key.word.get()), expected);
        assert!(key.full.borrow().is_none());
        // A key that refuses the change keeps its word, and says so.
        key.refuses.set(true);
        let kept = key.word.get();
        let mut changed = handle();
        changed.last_ms += 1;
        assert_eq!(changed.store(), Err(Refused));
        drop(changed);
        assert_eq!(key.word.get(), kept);
        assert_eq!(compact::expand(kept), expected);
        key.refuses.set(false);
        // A TAT far beyond what a word holds: the key takes the wider form.
        let mut changed = handle();
        changed.state = State::Gcra {
            ahead_scaled: 1 << 60,
        };
        let wide = changed.clone();
        assert_eq!(changed.store(), Ok(pack(&wide)));
        drop(changed);
        assert_eq!(*key.full.borrow(), Some(wide));
    }

    proptest::proptest! {
        /// Any state the cores can produce packs and unpacks to itself.
        #[test]
        fn states_from_random_calls_round_trip(
            algorithm in 0u8..4,
            limit in 1u64..=MAX_AMOUNT,
            period in 1u64..=MAX_PERIOD_MS,
            burst in 1u64..=MAX_AMOUNT,
            calls in proptest::collection::vec((0u64..=MAX_PERIOD_MS, 0u64..=MAX_AMOUNT), 1..20),
        ) {
            let algorithm = Algorithm::from_index(algorithm).unwrap();
            let params = Params::new(limit, period, algorithm.is_bucket().then_some(burst)).unwrap();
            for limiter in states(algorithm, params, 0, &calls) {
                let value = Value::new(limiter.clone());
                proptest::prop_assert!(value.boxed().is_none());
                proptest::prop_assert_eq!(value.to_limiter(), limiter);
            }
        }
    }
}
