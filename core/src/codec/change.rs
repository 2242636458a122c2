//! `ratelimit.apply`'s payloads, the [`Change`] kinds: what replication and AOF rewrites carry.

use crate::algorithms::concurrency::MAX_ID_LEN;
use crate::algorithms::{Limiter, Params, MAX_AMOUNT, MAX_PERIOD_MS, TIME_LIMIT_MS};

use super::buf::{require, Reader, Sink, StackBuf};
use super::limiter::{decode, encode, DecodeError};

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
pub(super) fn put_tagged_words(tag: u8, words: [u64; 4], out: &mut impl Sink) {
    let mut bytes = [0u8; 33];
    bytes[0] = tag;
    for (chunk, word) in bytes[1..].chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    out.put(&bytes);
}

/// Decodes and validates a packed limiter: the bounds checked are [`decode`]'s.
pub(super) fn decode_packed(bytes: &[u8]) -> Result<Limiter, DecodeError> {
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

pub(super) const REPLACE: u8 = 1;
pub(super) const LOG_APPEND: u8 = 2;
pub(super) const PACKED: u8 = 3;
pub(super) const LOG_REFUND: u8 = 4;
pub(super) const BLOCK: u8 = 5;
pub(super) const LEASE_ACQUIRE: u8 = 6;
pub(super) const LEASE_RELEASE: u8 = 7;

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
