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
//!
//! The files: `limiter.rs` (a limiter's encoding and its validating decoder), `change.rs` (the
//! [`Change`] payloads), `buf.rs` (the buffers both write to and read from).

mod buf;
mod change;
mod limiter;

pub use buf::{Sink, StackBuf};
pub use change::{
    encode_lease_acquire, encode_lease_release, encode_packed, encode_replace, encode_write, Change,
};
pub use limiter::{decode, encode, to_bytes, DecodeError};

#[cfg(test)]
mod tests;
