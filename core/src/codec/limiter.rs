//! A limiter's encoding (the layout above): what RDB, DUMP/RESTORE, digests and a whole
//! replicated or rewritten write hold, and its validating decoder.

use crate::algorithms::concurrency::{self, Lease, Leases, MAX_ID_LEN};
use crate::algorithms::{
    Algorithm, Kind, Limiter, Params, SlidingLog, State, MAX_AMOUNT, MAX_PERIOD_MS, TIME_LIMIT_MS,
};

use super::buf::{require, Reader, Sink};

/// Bytes of the fixed-size head: algorithm, limit, period, capacity, last.
pub(super) const HEAD_LEN: usize = 1 + 4 * 8;

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
pub(super) fn finish_decode(
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
pub(super) fn storable(limiter: &Limiter) -> bool {
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
pub(super) fn decode_leases(
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
