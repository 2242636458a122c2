//! The one binary encoding of a limiter, shared by RDB, AOF rewrite, replication and digests.
//!
//! Layout (little-endian), encoding version 1:
//! ```text
//! u8  algorithm            0 token-bucket .. 4 sliding-log, 5 gcra
//! u64 limit, u64 period_ms, u64 capacity, u64 last_ms
//! token-bucket:   u128 tokens_scaled
//! leaky-bucket:   u128 level_scaled
//! fixed-window:   u64 window_start_ms, u64 count
//! sliding-window: u64 window_start_ms, u64 current, u64 previous
//! sliding-log:    u64 runs, then per run u64 timestamp_ms, u64 count (oldest first)
//! gcra:           u128 ahead_scaled
//! concurrency:    u64 leases, then per lease (in order of expiry, then id) u64 expiry_ms,
//!                 u64 cost, u8 id length, the id (period_ms is the lease duration)
//! ```
//! A replicated or rewritten write is a [`Change`]: a kind byte, then either a whole limiter
//! (`1`), or, for the sliding log whose whole state can be large, the entries one call appended
//! (`2`: u64 limit, u64 period_ms, u64 t_ms, u64 cost), or a bucket, window or gcra in the 32 bytes
//! (four little-endian u64) it takes in memory (`3`, see `value.rs`): 33 bytes in all, so Redis
//! keeps the replicated argument in one allocation (it does up to 44 bytes). Commands replicate
//! `3` where it fits and `1` otherwise; AOF rewrites write `1`. A sliding log's refund is `4`:
//! u64 t_ms, u64 cost, the newest entries it gave back. A block started by a rejection is `5`:
//! u64 blocked_until_ms (the key's state is unchanged).
//!
//! A blocked limiter's encoding ends with a trailer, u64 blocked_until_ms (> last_ms); an
//! unblocked one has none, so its bytes are those of every earlier version. A module older than
//! blocks refuses a blocked key's trailer (bytes left over): upgrade replicas before their master.
//!
//! A concurrency key replicates its leases one call at a time: an admitted ACQUIRE is `6`
//! (u64 limit, u64 t_ms, u64 expiry_ms, u64 cost, then the lease id: the rest of the payload),
//! a RELEASE that released a lease `7` (u64 t_ms, then the id). A concurrency key is never
//! blocked: its encoding has no trailer. Both drop the leases expired at
//! `t_ms` first, as the call did; the lease duration is `expiry_ms − t_ms`.
//!
//! Decoding validates everything a command could never have stored, so a corrupt RDB payload,
//! RESTORE or AOF line is refused, never trusted: parameters within docs/algorithms.md's bounds,
//! and a state that the calls which store one leave under the parameters stored with it, at
//! `last_ms`, their time: an admitted call of cost `c ≥ 1`, or a `RATELIMIT.REFUND` that gave
//! something back without leaving the key fresh (a fresh state is never stored):
//! ```text
//! token-bucket    tokens < C·P             below a full bucket (a call takes c·P; a refund stops
//!                                          short of full, or the key is deleted)
//! leaky-bucket    0 < level ≤ C·P          within the capacity, not empty
//! gcra            0 < ahead ≤ C·P          within the tolerance, the TAT ahead of last_ms
//! fixed-window    1 ≤ count ≤ L            the window of last_ms, not empty
//! sliding-window  current + previous ≥ 1, previous ≤ 10^12 and previous·(P − e) + current·P
//!                 ≤ L·P, e = last_ms − window_start (the estimate the call was admitted under,
//!                 which a refund only lowers)
//! sliding-log     1 ≤ entries ≤ L, none after last_ms, the oldest after last_ms − P
//! concurrency     1 ≤ leases ≤ 10^6, distinct ids of 1 to 128 bytes, each cost 1 ≤ c ≤ L and
//!                 their sum ≤ L, each expiry in (last_ms, last_ms + 3650 days], in order
//! ```
//!
//! Stored formats: the RDB encoding, the [`Change`] kinds and the 33-byte packed form are what
//! users' data lives in (RDB files, AOF files, replication streams): changing one needs a new
//! encoding version (`store::ENCODING_VERSION`, or a new `Change` kind), with the old one still
//! read. tests/integration/fixtures/ pins them byte for byte.

use crate::algorithms::concurrency::{self, Lease, Leases, MAX_ID_LEN};
use crate::algorithms::{
    Algorithm, Kind, Limiter, Params, SlidingLog, State, MAX_AMOUNT, MAX_PERIOD_MS, TIME_LIMIT_MS,
};

/// Bytes of the fixed-size head: algorithm, limit, period, capacity, last.
const HEAD_LEN: usize = 1 + 4 * 8;

/// Why a payload was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The payload ends early or has bytes left over.
    Length,
    /// An unknown algorithm byte.
    Algorithm,
    /// Parameters outside the bounds of docs/algorithms.md.
    Params,
    /// A state no command could have produced.
    State,
}

/// Where an encoding is written: a `Vec`, or a stack buffer on the hot path.
pub trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// The largest change a command replicates: a lease's (a kind byte, four words and an id of up
/// to [`MAX_ID_LEN`] bytes).
const STACK_BUF_LEN: usize = 1 + 32 + MAX_ID_LEN;

/// A fixed stack buffer, large enough for every change a command replicates. Its bytes are not
/// initialised until written (every CHECK makes one: zeroing it would cost as much as the write).
pub struct StackBuf {
    bytes: [std::mem::MaybeUninit<u8>; STACK_BUF_LEN],
    len: usize,
    overflowed: bool,
}

impl Default for StackBuf {
    fn default() -> Self {
        StackBuf {
            // SAFETY: an array of `MaybeUninit` is valid uninitialised (made so in one piece: an
            // array of `uninit()` elements was zeroed on every CHECK).
            bytes: unsafe {
                std::mem::MaybeUninit::<[std::mem::MaybeUninit<u8>; STACK_BUF_LEN]>::uninit()
                    .assume_init()
            },
            len: 0,
            overflowed: false,
        }
    }
}

impl StackBuf {
    /// The bytes written, or `None` if they did not fit.
    pub fn as_slice(&self) -> Option<&[u8]> {
        // SAFETY: the first `len` bytes were written by `put` (`len` never exceeds the buffer).
        let written =
            unsafe { std::slice::from_raw_parts(self.bytes.as_ptr().cast::<u8>(), self.len) };
        (!self.overflowed).then_some(written)
    }
}

impl Sink for StackBuf {
    fn put(&mut self, bytes: &[u8]) {
        match self.bytes.get_mut(self.len..self.len + bytes.len()) {
            Some(room) => {
                // SAFETY: `room` is `bytes.len()` writable bytes of the buffer, which `bytes` (a
                // shared borrow) cannot overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        room.as_mut_ptr().cast::<u8>(),
                        bytes.len(),
                    )
                };
                self.len += bytes.len();
            }
            None => self.overflowed = true,
        }
    }
}

/// Appends the encoding of `limiter` to `out`.
pub fn encode(limiter: &Limiter, out: &mut impl Sink) {
    out.put(&[limiter.kind().index() as u8]);
    for value in [
        limiter.params.limit,
        limiter.params.period_ms,
        limiter.params.capacity,
        limiter.last_ms,
    ] {
        out.put(&value.to_le_bytes());
    }
    match &limiter.state {
        State::TokenBucket { tokens_scaled: v }
        | State::LeakyBucket { level_scaled: v }
        | State::Gcra { ahead_scaled: v } => out.put(&v.to_le_bytes()),
        State::FixedWindow {
            window_start_ms,
            count,
        } => {
            out.put(&window_start_ms.to_le_bytes());
            out.put(&count.to_le_bytes());
        }
        State::SlidingWindow {
            window_start_ms,
            current,
            previous,
        } => {
            for value in [*window_start_ms, *current, *previous] {
                out.put(&value.to_le_bytes());
            }
        }
        State::SlidingLog(log) => {
            out.put(&(log.runs().count() as u64).to_le_bytes());
            for (timestamp_ms, count) in log.runs() {
                out.put(&timestamp_ms.to_le_bytes());
                out.put(&count.to_le_bytes());
            }
        }
        State::Concurrency(leases) => {
            out.put(&(leases.len() as u64).to_le_bytes());
            for (id, lease) in leases.iter() {
                out.put(&lease.expiry_ms.to_le_bytes());
                out.put(&lease.cost.to_le_bytes());
                out.put(&[id.len() as u8]);
                out.put(id);
            }
        }
    }
    if limiter.blocked_until_ms != 0 {
        out.put(&limiter.blocked_until_ms.to_le_bytes());
    }
}

/// The encoding of `limiter` as a new buffer.
pub fn to_bytes(limiter: &Limiter) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEAD_LEN + 24);
    encode(limiter, &mut out);
    out
}

/// A cursor over a payload.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let (head, rest) = self
            .bytes
            .split_first_chunk::<N>()
            .ok_or(DecodeError::Length)?;
        self.bytes = rest;
        Ok(*head)
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        self.take::<8>().map(u64::from_le_bytes)
    }

    fn u128(&mut self) -> Result<u128, DecodeError> {
        self.take::<16>().map(u128::from_le_bytes)
    }
}

impl<'a> Reader<'a> {
    fn slice(&mut self, len: usize) -> Result<&'a [u8], DecodeError> {
        let (head, rest) = self
            .bytes
            .split_at_checked(len)
            .ok_or(DecodeError::Length)?;
        self.bytes = rest;
        Ok(head)
    }
}

fn require(condition: bool) -> Result<(), DecodeError> {
    if condition {
        Ok(())
    } else {
        Err(DecodeError::State)
    }
}

/// Decodes and validates one limiter.
pub fn decode(bytes: &[u8]) -> Result<Limiter, DecodeError> {
    let mut reader = Reader { bytes };
    let [algorithm] = reader.take::<1>()?;
    let kind = Kind::from_index(algorithm).ok_or(DecodeError::Algorithm)?;
    let limit = reader.u64()?;
    let period_ms = reader.u64()?;
    let capacity = reader.u64()?;
    let last_ms = reader.u64()?;
    let burst = kind.is_bucket().then_some(capacity);
    let params = Params::new(limit, period_ms, burst).map_err(|_| DecodeError::Params)?;
    if params.capacity != capacity || last_ms >= TIME_LIMIT_MS {
        return Err(DecodeError::Params);
    }
    let algorithm = match kind {
        Kind::Rate(algorithm) => algorithm,
        Kind::Leases => {
            let leases = decode_leases(&mut reader, &params, last_ms)?;
            return finish_decode(
                reader,
                params,
                last_ms,
                State::Concurrency(Box::new(leases)),
            );
        }
    };
    let state = match algorithm {
        Algorithm::TokenBucket => State::TokenBucket {
            tokens_scaled: reader.u128()?,
        },
        Algorithm::LeakyBucket => State::LeakyBucket {
            level_scaled: reader.u128()?,
        },
        Algorithm::Gcra => State::Gcra {
            ahead_scaled: reader.u128()?,
        },
        Algorithm::FixedWindow => State::FixedWindow {
            window_start_ms: reader.u64()?,
            count: reader.u64()?,
        },
        Algorithm::SlidingWindow => State::SlidingWindow {
            window_start_ms: reader.u64()?,
            current: reader.u64()?,
            previous: reader.u64()?,
        },
        Algorithm::SlidingLog => {
            let runs = reader.u64()?;
            // Each run takes 16 bytes: a count beyond the payload is corrupt, not a reason to allocate.
            require(runs <= (reader.bytes.len() / 16) as u64)?;
            let mut pairs = Vec::with_capacity(runs as usize);
            for _ in 0..runs {
                let timestamp_ms = reader.u64()?;
                let count = reader.u64()?;
                pairs.push((timestamp_ms, count));
            }
            State::SlidingLog(SlidingLog::from_runs(pairs).map_err(|_| DecodeError::State)?)
        }
    };
    finish_decode(reader, params, last_ms, state)
}

/// The rest of [`decode`] after the state: the block, then nothing left over.
fn finish_decode(
    mut reader: Reader,
    params: Params,
    last_ms: u64,
    state: State,
) -> Result<Limiter, DecodeError> {
    // A blocked limiter's block: after its start (`last_ms` at the latest), at most 3650 days
    // after a time below 2^53.
    let blocked_until_ms = match reader.bytes.len() {
        0 => 0,
        8 => reader.u64()?,
        _ => return Err(DecodeError::Length),
    };
    require(
        blocked_until_ms == 0
            || (blocked_until_ms > last_ms && blocked_until_ms < TIME_LIMIT_MS + MAX_PERIOD_MS),
    )?;
    let limiter = Limiter {
        params,
        last_ms,
        state,
        blocked_until_ms,
    };
    require(storable(&limiter))?;
    Ok(limiter)
}

/// Whether `limiter`'s state is one the calls that store a state can leave (the bounds of the
/// module comment); a blocked limiter may also hold a fresh state (a refund during its block).
fn storable(limiter: &Limiter) -> bool {
    let params = &limiter.params;
    let (last_ms, period_ms) = (limiter.last_ms, params.period_ms);
    let period = u128::from(period_ms);
    let full = params.capacity_scaled();
    // At least 1 unless blocked.
    let least = u128::from(limiter.blocked_until_ms == 0);
    match &limiter.state {
        State::TokenBucket { tokens_scaled } => {
            *tokens_scaled < full || (least == 0 && *tokens_scaled == full)
        }
        State::LeakyBucket { level_scaled: v } | State::Gcra { ahead_scaled: v } => {
            (least..=full).contains(v)
        }
        State::FixedWindow {
            window_start_ms,
            count,
        } => {
            *window_start_ms == params.window_start(last_ms)
                && (least as u64..=params.limit).contains(count)
        }
        State::SlidingWindow {
            window_start_ms,
            current,
            previous,
        } => {
            if *window_start_ms != params.window_start(last_ms) || *previous > MAX_AMOUNT {
                return false;
            }
            // Below 2^104 each: no overflow.
            let elapsed = u128::from(last_ms - window_start_ms);
            let estimate =
                u128::from(*previous) * (period - elapsed) + u128::from(*current) * period;
            u128::from((*current).max(*previous)) >= least
                && estimate <= u128::from(params.limit) * period
        }
        State::SlidingLog(log) => {
            let oldest = log.oldest_ms();
            (least as u64..=params.limit).contains(&log.len())
                && log.newest_ms().is_none_or(|newest| newest <= last_ms)
                && oldest.is_none_or(|oldest| oldest + period_ms > last_ms)
        }
        // Held to its bounds by `decode_leases`; never blocked.
        State::Concurrency(_) => limiter.blocked_until_ms == 0,
    }
}

/// The leases of a concurrency limiter stored at `last_ms` under `params`, held to what the calls
/// that store them leave (the module comment's bounds).
fn decode_leases(
    reader: &mut Reader,
    params: &Params,
    last_ms: u64,
) -> Result<Leases, DecodeError> {
    let count = reader.u64()?;
    // Each lease takes 18 bytes at least: a count beyond the payload is corrupt.
    require(
        (1..=concurrency::LEASES_CAP).contains(&count) && count <= (reader.bytes.len() / 18) as u64,
    )?;
    let mut leases = Leases::new();
    let mut previous: Option<(u64, &[u8])> = None;
    let mut held = 0u64;
    for _ in 0..count {
        let expiry_ms = reader.u64()?;
        let cost = reader.u64()?;
        let [len] = reader.take::<1>()?;
        let id = reader.slice(usize::from(len))?;
        require(
            (1..=MAX_ID_LEN).contains(&id.len())
                && expiry_ms > last_ms
                && expiry_ms - last_ms <= MAX_PERIOD_MS
                && (1..=params.limit).contains(&cost)
                && previous.is_none_or(|previous| previous < (expiry_ms, id)),
        )?;
        previous = Some((expiry_ms, id));
        // At most 10^6 costs of at most 10^12 each: no overflow.
        held += cost;
        require(leases.insert(id, Lease { cost, expiry_ms }) == Ok(None))?;
    }
    require(held <= params.limit)?;
    Ok(leases)
}

/// Writes `Change::Replace(limiter)` without owning the limiter, packed (kind `3`) when it can
/// be: the form commands replicate.
pub fn encode_write(limiter: &Limiter, out: &mut impl Sink) {
    match crate::value::pack(limiter) {
        Some(words) => encode_packed(&words, out),
        None => encode_replace(limiter, out),
    }
}

/// Writes `Change::Replace` of the limiter packed in `words` (kind `3`).
pub fn encode_packed(words: &[u64; 4], out: &mut impl Sink) {
    put_tagged_words(PACKED, *words, out);
}

/// Writes `tag` and four little-endian words, built on the stack and written at once: the two
/// changes every consuming call replicates (a packed limiter, a log append) have this shape.
fn put_tagged_words(tag: u8, words: [u64; 4], out: &mut impl Sink) {
    let mut bytes = [0u8; 33];
    bytes[0] = tag;
    for (chunk, word) in bytes[1..].chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    out.put(&bytes);
}

/// Decodes and validates a packed limiter: the bounds checked are [`decode`]'s.
fn decode_packed(bytes: &[u8]) -> Result<Limiter, DecodeError> {
    let mut reader = Reader { bytes };
    let words = [reader.u64()?, reader.u64()?, reader.u64()?, reader.u64()?];
    if !reader.bytes.is_empty() {
        return Err(DecodeError::Length);
    }
    let limiter = crate::value::unpacked(&words).ok_or(DecodeError::Params)?;
    let mut full = StackBuf::default();
    encode(&limiter, &mut full);
    decode(full.as_slice().ok_or(DecodeError::Length)?)
}

/// Writes `Change::Replace(limiter)` without owning the limiter.
pub fn encode_replace(limiter: &Limiter, out: &mut impl Sink) {
    out.put(&[REPLACE]);
    encode(limiter, out);
}

/// A write to replay: on replicas (replication), at AOF load and from AOF rewrites.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Store this limiter.
    Replace(Limiter),
    /// A sliding log admitted `cost` entries at `t_ms` under `params`.
    LogAppend {
        params: Params,
        t_ms: u64,
        cost: u64,
    },
    /// A sliding log gave back its `cost` newest entries at `t_ms` (`RATELIMIT.REFUND`).
    LogRefund { t_ms: u64, cost: u64 },
    /// The key is blocked until `until_ms` (a rejection with `BLOCK`); nothing else changed.
    Block { until_ms: u64 },
    /// A concurrency key admitted (or renewed) `id`'s lease of `cost` at `t_ms` under `params`
    /// (`period_ms`: the lease duration), after dropping the leases expired at `t_ms`.
    LeaseAcquire {
        params: Params,
        t_ms: u64,
        cost: u64,
        id: Vec<u8>,
    },
    /// A concurrency key released `id`'s live lease at `t_ms`, dropping the expired ones.
    LeaseRelease { t_ms: u64, id: Vec<u8> },
}

const REPLACE: u8 = 1;
const LOG_APPEND: u8 = 2;
const PACKED: u8 = 3;
const LOG_REFUND: u8 = 4;
const BLOCK: u8 = 5;
const LEASE_ACQUIRE: u8 = 6;
const LEASE_RELEASE: u8 = 7;

/// Writes the `Change::LeaseAcquire` of these values without owning the id.
pub fn encode_lease_acquire(params: &Params, t_ms: u64, cost: u64, id: &[u8], out: &mut impl Sink) {
    out.put(&[LEASE_ACQUIRE]);
    for value in [params.limit, t_ms, t_ms + params.period_ms, cost] {
        out.put(&value.to_le_bytes());
    }
    out.put(id);
}

/// Writes the `Change::LeaseRelease` of these values without owning the id.
pub fn encode_lease_release(t_ms: u64, id: &[u8], out: &mut impl Sink) {
    out.put(&[LEASE_RELEASE]);
    out.put(&t_ms.to_le_bytes());
    out.put(id);
}

impl Change {
    /// Writes the change to `out`.
    pub fn encode(&self, out: &mut impl Sink) {
        match self {
            Change::Replace(limiter) => encode_replace(limiter, out),
            Change::LogAppend { params, t_ms, cost } => put_tagged_words(
                LOG_APPEND,
                [params.limit, params.period_ms, *t_ms, *cost],
                out,
            ),
            Change::LogRefund { t_ms, cost } => {
                out.put(&[LOG_REFUND]);
                out.put(&t_ms.to_le_bytes());
                out.put(&cost.to_le_bytes());
            }
            Change::Block { until_ms } => {
                out.put(&[BLOCK]);
                out.put(&until_ms.to_le_bytes());
            }
            Change::LeaseAcquire {
                params,
                t_ms,
                cost,
                id,
            } => encode_lease_acquire(params, *t_ms, *cost, id, out),
            Change::LeaseRelease { t_ms, id } => encode_lease_release(*t_ms, id, out),
        }
    }

    /// The change as a new buffer.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        self.encode(&mut out);
        out
    }

    /// Decodes and validates a change.
    pub fn decode(bytes: &[u8]) -> Result<Change, DecodeError> {
        let (kind, rest) = bytes.split_first().ok_or(DecodeError::Length)?;
        match *kind {
            REPLACE => decode(rest).map(Change::Replace),
            PACKED => decode_packed(rest).map(Change::Replace),
            LOG_APPEND => {
                let mut reader = Reader { bytes: rest };
                let limit = reader.u64()?;
                let period_ms = reader.u64()?;
                let t_ms = reader.u64()?;
                let cost = reader.u64()?;
                if !reader.bytes.is_empty() {
                    return Err(DecodeError::Length);
                }
                let params =
                    Params::new(limit, period_ms, None).map_err(|_| DecodeError::Params)?;
                require(t_ms < TIME_LIMIT_MS && cost >= 1 && cost <= limit)?;
                Ok(Change::LogAppend { params, t_ms, cost })
            }
            LOG_REFUND => {
                let mut reader = Reader { bytes: rest };
                let t_ms = reader.u64()?;
                let cost = reader.u64()?;
                if !reader.bytes.is_empty() {
                    return Err(DecodeError::Length);
                }
                require(t_ms < TIME_LIMIT_MS && (1..=MAX_AMOUNT).contains(&cost))?;
                Ok(Change::LogRefund { t_ms, cost })
            }
            BLOCK => {
                let mut reader = Reader { bytes: rest };
                let until_ms = reader.u64()?;
                if !reader.bytes.is_empty() {
                    return Err(DecodeError::Length);
                }
                require(until_ms > 0 && until_ms < TIME_LIMIT_MS + MAX_PERIOD_MS)?;
                Ok(Change::Block { until_ms })
            }
            LEASE_ACQUIRE => {
                let mut reader = Reader { bytes: rest };
                let limit = reader.u64()?;
                let t_ms = reader.u64()?;
                let expiry_ms = reader.u64()?;
                let cost = reader.u64()?;
                let id = reader.bytes;
                require(t_ms < TIME_LIMIT_MS && expiry_ms > t_ms)?;
                let params =
                    Params::new(limit, expiry_ms - t_ms, None).map_err(|_| DecodeError::Params)?;
                require((1..=limit).contains(&cost) && (1..=MAX_ID_LEN).contains(&id.len()))?;
                Ok(Change::LeaseAcquire {
                    params,
                    t_ms,
                    cost,
                    id: id.to_vec(),
                })
            }
            LEASE_RELEASE => {
                let mut reader = Reader { bytes: rest };
                let t_ms = reader.u64()?;
                let id = reader.bytes;
                require(t_ms < TIME_LIMIT_MS && (1..=MAX_ID_LEN).contains(&id.len()))?;
                Ok(Change::LeaseRelease {
                    t_ms,
                    id: id.to_vec(),
                })
            }
            _ => Err(DecodeError::Algorithm),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::{check as run, Request, Write};

    fn built(algorithm: Algorithm, burst: Option<u64>, calls: &[(u64, u64)]) -> Limiter {
        let params = Params::new(5, 1000, burst).unwrap();
        let mut stored: Option<Limiter> = None;
        for &(now_ms, cost) in calls {
            let request = Request {
                algorithm,
                params,
                cost,
                now_ms,
            };
            let mut created = None;
            run(stored.as_mut(), &request, true, &mut created).unwrap();
            if let Some(limiter) = created {
                stored = Some(limiter);
            }
        }
        stored.expect("a consuming call")
    }

    #[test]
    fn every_algorithm_round_trips() {
        for algorithm in Algorithm::ALL {
            let burst = algorithm.is_bucket().then_some(7);
            let limiter = built(algorithm, burst, &[(10, 1), (10, 2), (1500, 1)]);
            let bytes = to_bytes(&limiter);
            assert_eq!(decode(&bytes), Ok(limiter.clone()), "{}", algorithm.name());
            let change = Change::Replace(limiter);
            let mut stack = StackBuf::default();
            change.encode(&mut stack);
            if algorithm != Algorithm::SlidingLog {
                assert_eq!(stack.as_slice(), Some(&change.to_bytes()[..]));
            }
            assert_eq!(Change::decode(&change.to_bytes()), Ok(change));
        }
        let append = Change::LogAppend {
            params: Params::new(5, 1000, None).unwrap(),
            t_ms: 77,
            cost: 5,
        };
        assert_eq!(Change::decode(&append.to_bytes()), Ok(append));
    }

    #[test]
    fn commands_replicate_buckets_and_windows_in_33_bytes() {
        for algorithm in Algorithm::ALL {
            let burst = algorithm.is_bucket().then_some(7);
            let limiter = built(algorithm, burst, &[(10, 1), (10, 2), (1500, 1)]);
            let mut stack = StackBuf::default();
            encode_write(&limiter, &mut stack);
            let bytes = stack.as_slice().expect("fits");
            if algorithm == Algorithm::SlidingLog {
                assert_eq!(bytes, &Change::Replace(limiter).to_bytes()[..]);
                continue;
            }
            assert_eq!(
                (bytes.len(), bytes[0]),
                (33, PACKED),
                "{}",
                algorithm.name()
            );
            assert_eq!(
                Change::decode(bytes),
                Ok(Change::Replace(limiter)),
                "{}",
                algorithm.name()
            );
            for len in 0..bytes.len() {
                assert!(
                    Change::decode(&bytes[..len]).is_err(),
                    "prefix of {len} bytes"
                );
            }
            let mut padded = bytes.to_vec();
            padded.push(0);
            assert_eq!(Change::decode(&padded), Err(DecodeError::Length));
        }
    }

    #[test]
    fn packed_payloads_are_validated_like_full_ones() {
        let limiter = built(Algorithm::FixedWindow, None, &[(10, 1)]);
        let mut stack = StackBuf::default();
        encode_write(&limiter, &mut stack);
        let good = stack.as_slice().unwrap().to_vec();
        let with_word = |i: usize, f: &dyn Fn(u64) -> u64| {
            let mut bytes = good.clone();
            let at = 1 + 8 * i;
            let word = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
            bytes[at..at + 8].copy_from_slice(&f(word).to_le_bytes());
            Change::decode(&bytes)
        };
        // The sliding log's tag, and the boxed tag: never packed.
        assert!(with_word(0, &|w| w & !7 | 4).is_err());
        assert!(with_word(0, &|w| w | 7).is_err());
        // A limit of 0 (bits 56..96) and a period of 0 (bits 96..135).
        assert!(with_word(0, &|w| w & 0x00ff_ffff_ffff_ffff).is_err());
        assert!(with_word(1, &|w| w & !(u64::MAX << 32)).is_err());
        // A bit outside the fixed window's fields, and a count beyond the bounds.
        assert!(with_word(3, &|w| w | 1 << 60).is_err());
        assert!(with_word(2, &|w| w | 0xff_ffff_ffff << 7).is_err());
        // A bucket beyond its capacity.
        let bucket = built(Algorithm::TokenBucket, Some(3), &[(10, 1)]);
        let mut words = crate::value::pack(&bucket).unwrap();
        words[3] |= 1 << 61;
        let mut bytes = vec![PACKED];
        for word in words {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        assert_eq!(Change::decode(&bytes), Err(DecodeError::State));
        assert_eq!(with_word(0, &|w| w), Ok(Change::Replace(limiter)));
    }

    #[test]
    fn truncated_and_padded_payloads_are_refused() {
        let bytes = to_bytes(&built(Algorithm::SlidingLog, None, &[(10, 2), (20, 1)]));
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len]).is_err(), "prefix of {len} bytes");
        }
        let mut padded = bytes.clone();
        padded.push(0);
        assert_eq!(decode(&padded), Err(DecodeError::Length));
    }

    #[test]
    fn impossible_states_are_refused() {
        let mut bytes = to_bytes(&built(Algorithm::TokenBucket, None, &[(10, 1)]));
        // Tokens beyond the capacity.
        bytes[HEAD_LEN..].copy_from_slice(&u128::MAX.to_le_bytes());
        assert_eq!(decode(&bytes), Err(DecodeError::State));
        // Unknown algorithm.
        bytes[0] = 9;
        assert_eq!(decode(&bytes), Err(DecodeError::Algorithm));
        // A huge run count with no runs behind it.
        let mut log = to_bytes(&built(Algorithm::SlidingLog, None, &[(10, 1)]));
        log[HEAD_LEN..HEAD_LEN + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(decode(&log), Err(DecodeError::State));
    }

    /// The limiter one key holds after committing `(now_ms, cost)` calls under `params`.
    fn after(algorithm: Algorithm, params: Params, calls: &[(u64, u64)]) -> Limiter {
        let mut stored: Option<Limiter> = None;
        for &(now_ms, cost) in calls {
            let request = Request {
                algorithm,
                params,
                cost,
                now_ms,
            };
            let mut created = None;
            let (outcome, write) = run(stored.as_mut(), &request, true, &mut created).unwrap();
            assert!(outcome.decision.allowed, "{request:?}");
            if let (Write::Created, Some(limiter)) = (write, created.take()) {
                stored = Some(limiter);
            }
        }
        stored.expect("a consuming call")
    }

    /// `limiter` with another state, through the codec.
    fn with_state(limiter: &Limiter, state: State) -> Result<Limiter, DecodeError> {
        let edited = Limiter {
            state,
            ..limiter.clone()
        };
        decode(&to_bytes(&edited))
    }

    /// Each bound of the module comment, at a value a real call sequence leaves (decoded back) and
    /// one past it (refused). A refund leaves the states between (tested by `refunds_leave_...`).
    #[test]
    fn bucket_states_are_held_to_what_an_admitted_call_leaves() {
        // 7 per second, capacity 9: C·P = 9000 scaled units, one request P = 1000.
        let params = Params::new(7, 1_000, Some(9)).unwrap();
        let refused = Err(DecodeError::State);
        // A token bucket: one request from a full bucket leaves (C − 1)·P; C of them, none.
        let one = after(Algorithm::TokenBucket, params, &[(5_000, 1)]);
        assert_eq!(
            one.state,
            State::TokenBucket {
                tokens_scaled: 8_000
            }
        );
        assert_eq!(decode(&to_bytes(&one)), Ok(one.clone()));
        let all = after(Algorithm::TokenBucket, params, &[(5_000, 9)]);
        assert_eq!(decode(&to_bytes(&all)), Ok(all));
        let tokens = |tokens_scaled| State::TokenBucket { tokens_scaled };
        // A refund stops short of a full bucket (a full one is deleted).
        assert!(with_state(&one, tokens(8_999)).is_ok());
        assert_eq!(with_state(&one, tokens(9_000)), refused, "a full bucket");
        // A leaky bucket and gcra: one request queued (a TAT one interval ahead) at least, the
        // capacity (the tolerance) at most.
        for (algorithm, state) in [
            (
                Algorithm::LeakyBucket,
                (|level_scaled| State::LeakyBucket { level_scaled }) as fn(u128) -> State,
            ),
            (Algorithm::Gcra, |ahead_scaled| State::Gcra { ahead_scaled }),
        ] {
            let one = after(algorithm, params, &[(5_000, 1)]);
            assert_eq!(one.state, state(1_000), "{algorithm:?}");
            let full = after(algorithm, params, &[(5_000, 9)]);
            assert_eq!(full.state, state(9_000), "{algorithm:?}");
            for limiter in [&one, &full] {
                assert_eq!(
                    decode(&to_bytes(limiter)),
                    Ok(limiter.clone()),
                    "{algorithm:?}"
                );
            }
            // A refund leaves less than one request queued, never an empty queue.
            assert!(with_state(&one, state(1)).is_ok(), "{algorithm:?}");
            for beyond in [0, 9_001, u128::MAX] {
                assert_eq!(
                    with_state(&one, state(beyond)),
                    refused,
                    "{algorithm:?} {beyond}"
                );
            }
        }
    }

    #[test]
    fn window_and_log_states_are_held_to_what_an_admitted_call_leaves() {
        let refused = Err(DecodeError::State);
        let params = Params::new(5, 1_000, None).unwrap();
        // A fixed window holds the call's cost, and at most the limit.
        let one = after(Algorithm::FixedWindow, params, &[(5_250, 1)]);
        let full = after(Algorithm::FixedWindow, params, &[(5_250, 5)]);
        for limiter in [&one, &full] {
            assert_eq!(decode(&to_bytes(limiter)), Ok(limiter.clone()));
        }
        let count = |count| State::FixedWindow {
            window_start_ms: 5_000,
            count,
        };
        // The issue's limit 5 with a count of 10^12, and one past the limit; an empty window.
        for beyond in [0, 6, MAX_AMOUNT] {
            assert_eq!(with_state(&one, count(beyond)), refused, "count {beyond}");
        }

        // A sliding window, admitted exactly at its ceiling: 4 in the window before, then 4 at
        // e = 750, where the previous 4 weigh 1: 4·250 + 4·1000 = 5000 = L·P.
        let window = |current, previous| State::SlidingWindow {
            window_start_ms: 5_000,
            current,
            previous,
        };
        let ceiling = after(Algorithm::SlidingWindow, params, &[(4_000, 4), (5_750, 4)]);
        assert_eq!(ceiling.state, window(4, 4));
        assert_eq!(decode(&to_bytes(&ceiling)), Ok(ceiling.clone()));
        assert_eq!(with_state(&ceiling, window(5, 4)), refused);
        assert_eq!(with_state(&ceiling, window(4, 5)), refused);
        // A refund may empty the current window, not both.
        assert!(with_state(&ceiling, window(0, 4)).is_ok());
        assert_eq!(with_state(&ceiling, window(0, 0)), refused);
        // The issue's current = previous = 10^12 under a limit of 5.
        assert_eq!(
            with_state(&ceiling, window(MAX_AMOUNT, MAX_AMOUNT)),
            refused
        );
        // A previous count above the limit is no corruption: a limit lowered since (1000 a
        // second, then 5), and late enough in the window for the previous count to fit.
        let wide = Params::new(1_000, 1_000, None).unwrap();
        let mut lowered = after(Algorithm::SlidingWindow, wide, &[(4_000, 1_000)]);
        let request = Request {
            algorithm: Algorithm::SlidingWindow,
            params,
            cost: 1,
            now_ms: 5_999,
        };
        assert!(
            run(Some(&mut lowered), &request, true, &mut None)
                .unwrap()
                .0
                .decision
                .allowed
        );
        assert_eq!(
            lowered.state,
            State::SlidingWindow {
                window_start_ms: 5_000,
                current: 1,
                previous: 1_000
            }
        );
        assert_eq!(decode(&to_bytes(&lowered)), Ok(lowered.clone()));
        // 4000·1 + 1·1000 = 5000 still fits; 4001 does not.
        let at_end = |previous| State::SlidingWindow {
            window_start_ms: 5_000,
            current: 1,
            previous,
        };
        assert!(with_state(&lowered, at_end(4_000)).is_ok());
        assert_eq!(with_state(&lowered, at_end(4_001)), refused);
        // A previous count is a limit's worth at most: 10^12, reached under the largest limit.
        let largest = Params::new(MAX_AMOUNT, 1_000, None).unwrap();
        let most = after(
            Algorithm::SlidingWindow,
            largest,
            &[(4_000, MAX_AMOUNT), (5_999, 1)],
        );
        assert_eq!(most.state, at_end(MAX_AMOUNT));
        assert_eq!(decode(&to_bytes(&most)), Ok(most.clone()));
        assert_eq!(with_state(&most, at_end(MAX_AMOUNT + 1)), refused);

        // A sliding log: one entry at least, the newest at last_ms, none older than the period.
        let params = Params::new(3, 1_000, None).unwrap();
        let log = after(Algorithm::SlidingLog, params, &[(4_001, 1), (5_000, 2)]);
        assert_eq!(decode(&to_bytes(&log)), Ok(log.clone()));
        let runs =
            |runs: &[(u64, u64)]| State::SlidingLog(SlidingLog::from_runs(runs.to_vec()).unwrap());
        // A refund removes the newest entries and keeps last_ms: the newest may be earlier.
        assert!(with_state(&log, runs(&[(4_001, 1), (4_999, 2)])).is_ok());
        for (what, state) in [
            ("empty", runs(&[])),
            ("newest after last", runs(&[(4_001, 1), (5_001, 2)])),
            ("more than the limit", runs(&[(4_001, 2), (5_000, 2)])),
            (
                "oldest a period before last",
                runs(&[(4_000, 1), (5_000, 2)]),
            ),
        ] {
            assert_eq!(with_state(&log, state), refused, "{what}");
        }
    }

    proptest::proptest! {
        // More cases than the default: a previous count above a lowered limit takes a few
        // hundred sequences to come up (proptest-regressions/codec.txt keeps one).
        #![proptest_config(proptest::test_runner::Config::with_cases(1024))]

        /// Every state the cores store on random call sequences (parameters changing between
        /// calls, tiny limiters and the largest inputs) decodes back whole, as a whole limiter and
        /// in the form commands replicate: the bounds refuse nothing a command can store.
        #[test]
        fn every_state_the_cores_store_decodes(
            states in crate::algorithms::proptests::stored_limiters(),
        ) {
            for limiter in states {
                proptest::prop_assert_eq!(decode(&to_bytes(&limiter)), Ok(limiter.clone()));
                let mut replicated = Vec::new();
                encode_write(&limiter, &mut replicated);
                proptest::prop_assert_eq!(Change::decode(&replicated), Ok(Change::Replace(limiter)));
            }
        }
    }

    proptest::proptest! {
        /// The same on the store's own generator (value.rs): random gaps and costs up to the
        /// largest amounts, for every algorithm.
        #[test]
        fn states_from_random_calls_decode(
            algorithm in 0u8..6,
            limit in 1u64..=MAX_AMOUNT,
            period in 1u64..=crate::algorithms::MAX_PERIOD_MS,
            burst in 1u64..=MAX_AMOUNT,
            calls in proptest::collection::vec(
                (0u64..=crate::algorithms::MAX_PERIOD_MS, 0u64..=MAX_AMOUNT),
                1..20,
            ),
        ) {
            let algorithm = Algorithm::from_index(algorithm).unwrap();
            // A sliding log of a large limit holds as many entries: keep it at the default cap.
            let limit = if algorithm == Algorithm::SlidingLog { limit % 100_000 + 1 } else { limit };
            let params = Params::new(limit, period, algorithm.is_bucket().then_some(burst)).unwrap();
            for limiter in crate::algorithms::testing::states(algorithm, params, 0, &calls) {
                proptest::prop_assert_eq!(decode(&to_bytes(&limiter)), Ok(limiter));
            }
        }
    }

    /// The payloads of tests/integration/fixtures/formats.txt, as redis-server wrote them (its
    /// README.md says how), per key in order.
    fn golden_payloads() -> Vec<(&'static str, Vec<u8>)> {
        let text = include_str!("../../tests/integration/fixtures/formats.txt");
        let mut key = "";
        let mut payloads = Vec::new();
        for line in text.lines() {
            match line.split_once(' ') {
                Some(("key", name)) => key = name,
                Some(("payload", hex)) => {
                    let bytes = (0..hex.len())
                        .step_by(2)
                        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                        .collect();
                    payloads.push((key, bytes));
                }
                _ => {}
            }
        }
        payloads
    }

    /// The stored formats, pinned: each golden payload decodes to the limiter (or the append) the
    /// commands that made it left, and this build encodes that value back to the same bytes, in
    /// the same kind. A failure here means users' RDB files, AOF files or replication streams
    /// would read differently: that takes a new encoding version, not new fixtures.
    #[test]
    fn golden_payloads_decode_to_what_made_them_and_encode_back_the_same() {
        const T: u64 = 4_102_444_800_000; // 2100-01-01
        let limiter = |limit, period_ms, capacity, last_ms, state| {
            Change::Replace(Limiter {
                params: Params {
                    limit,
                    period_ms,
                    capacity,
                },
                last_ms,
                state,
                blocked_until_ms: 0,
            })
        };
        let fixed = |window_start_ms, count| State::FixedWindow {
            window_start_ms,
            count,
        };
        let sliding = |window_start_ms, current, previous| State::SlidingWindow {
            window_start_ms,
            current,
            previous,
        };
        let log = State::SlidingLog(SlidingLog::from_runs([(T, 2), (T + 5, 1)]).unwrap());
        let appended = |t_ms, cost| Change::LogAppend {
            params: Params::new(5, 10_000, None).unwrap(),
            t_ms,
            cost,
        };
        let states = |key: &str| -> Vec<Change> {
            let tb = |limit, period, capacity, tokens_scaled| {
                limiter(
                    limit,
                    period,
                    capacity,
                    T,
                    State::TokenBucket { tokens_scaled },
                )
            };
            match key {
                "word:tb" => vec![tb(10, 1_000, 20, 17_000)],
                "word:lb" => vec![limiter(
                    10,
                    60_000,
                    10,
                    T,
                    State::LeakyBucket {
                        level_scaled: 120_000,
                    },
                )],
                "word:gc" => vec![limiter(
                    30,
                    60_000,
                    5,
                    T,
                    State::Gcra {
                        ahead_scaled: 120_000,
                    },
                )],
                "word:fw" => vec![limiter(100, 3_600_000, 100, T + 250, fixed(T, 5))],
                // After its first call (in the window before), then after its second.
                "word:sw" => vec![
                    limiter(100, 60_000, 100, T - 30_000, sliding(T - 60_000, 7, 0)),
                    limiter(100, 60_000, 100, T + 15_000, sliding(T, 3, 7)),
                ],
                "wide:tb" => vec![tb(1, 86_400_000, 1_000, 999 * 86_400_000)],
                "wide:fw" => vec![limiter(
                    MAX_AMOUNT,
                    315_360_000_000,
                    MAX_AMOUNT,
                    T,
                    fixed(4_099_680_000_000, 1),
                )],
                "wide:sw" => vec![limiter(
                    1_000_000,
                    3_600_000,
                    1_000_000,
                    T,
                    sliding(T, 5, 0),
                )],
                "log:sl" => vec![appended(T, 2), appended(T + 5, 1)],
                other => panic!("formats.txt: unknown key {other}"),
            }
        };
        let payloads = golden_payloads();
        assert_eq!(payloads.len(), 20);
        let mut kinds = [0; 4];
        let mut seen = std::collections::HashMap::<&str, usize>::new();
        for (key, bytes) in &payloads {
            let kind = bytes[0];
            kinds[usize::from(kind)] += 1;
            let decoded = Change::decode(bytes).unwrap_or_else(|e| panic!("{key}: {e:?}"));
            // Kind 1 is the rewrite's whole limiter: the key's final state (for the log, what
            // its appends built); kinds 2 and 3 are the commands' writes, one per call.
            let expected = match (kind, key) {
                (1, &"log:sl") => limiter(5, 10_000, 5, T + 5, log.clone()),
                (1, _) => states(key).pop().unwrap(),
                _ => {
                    let call = seen.entry(key).or_default();
                    *call += 1;
                    states(key).swap_remove(*call - 1)
                }
            };
            assert_eq!(decoded, expected, "{key} kind {kind}");
            let again = match (&decoded, kind) {
                (Change::Replace(limiter), 3) => {
                    let mut packed = Vec::new();
                    encode_write(limiter, &mut packed);
                    packed
                }
                _ => decoded.to_bytes(),
            };
            assert_eq!(&again, bytes, "{key} kind {kind}: encoded differently");
            // The RDB encoding is kind 1 without its kind byte.
            if let (Change::Replace(limiter), 1) = (&decoded, kind) {
                assert_eq!(to_bytes(limiter), bytes[1..], "{key}: the RDB encoding");
            }
        }
        assert_eq!(kinds, [0, 9, 2, 9], "payloads per kind");
    }
}
