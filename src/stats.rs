//! Counters for `INFO ratelimit`: plain relaxed atomics, no allocation, no scan.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

use redis_ratelimit_core::algorithms::Kind;

const N: usize = Kind::EVERY.len();

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const ZERO_I: AtomicI64 = AtomicI64::new(0);

static ALLOWED: [AtomicU64; N] = [ZERO; N];
static REJECTED: [AtomicU64; N] = [ZERO; N];
/// The rejections a penalty block caused (counted in `REJECTED` too).
static BLOCKED: [AtomicU64; N] = [ZERO; N];
/// Live limiter values per algorithm (created minus freed); signed so a free racing a create on a
/// background thread never wraps.
static KEYS: [AtomicI64; N] = [ZERO_I; N];

/// Calls of the commands that count decisions (CHECK, CHECKALL, ACQUIRE and the dialects) since the
/// counters were last reset: Redis counts the same calls in their `INFO commandstats` lines,
/// which is how a `CONFIG RESETSTAT` is told from one that was refused (`commands/resetstat.rs`).
static CALLS: AtomicU64 = AtomicU64::new(0);

/// Counts one call of a command that counts decisions, whatever it answers.
#[inline(always)]
pub fn count_call() {
    CALLS.fetch_add(1, Relaxed);
}

/// The calls counted by [`count_call`] since the last reset.
pub fn calls() -> u64 {
    CALLS.load(Relaxed)
}

/// Counts one decision.
pub fn count_decision(kind: impl Into<Kind>, allowed: bool) {
    let table = if allowed { &ALLOWED } else { &REJECTED };
    table[kind.into().index()].fetch_add(1, Relaxed);
}

/// Counts a rejection caused by a block (besides [`count_decision`]).
pub fn count_blocked(kind: impl Into<Kind>) {
    BLOCKED[kind.into().index()].fetch_add(1, Relaxed);
}

pub fn key_created(kind: impl Into<Kind>) {
    KEYS[kind.into().index()].fetch_add(1, Relaxed);
}

pub fn key_freed(kind: impl Into<Kind>) {
    KEYS[kind.into().index()].fetch_sub(1, Relaxed);
}

/// One algorithm's figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Figures {
    pub calls: u64,
    pub allowed: u64,
    pub rejected: u64,
    pub blocked: u64,
    pub keys: u64,
}

/// The figures of `kind` now.
pub fn figures(kind: impl Into<Kind>) -> Figures {
    let i = kind.into().index();
    let allowed = ALLOWED[i].load(Relaxed);
    let rejected = REJECTED[i].load(Relaxed);
    Figures {
        calls: allowed + rejected,
        allowed,
        rejected,
        blocked: BLOCKED[i].load(Relaxed),
        keys: KEYS[i].load(Relaxed).max(0) as u64,
    }
}

/// The counters a `CONFIG RESETSTAT` zeroes (not the live keys), at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub calls: u64,
    allowed: [u64; N],
    rejected: [u64; N],
    blocked: [u64; N],
}

/// The counters now.
pub fn snapshot() -> Snapshot {
    Snapshot {
        calls: CALLS.load(Relaxed),
        allowed: std::array::from_fn(|i| ALLOWED[i].load(Relaxed)),
        rejected: std::array::from_fn(|i| REJECTED[i].load(Relaxed)),
        blocked: std::array::from_fn(|i| BLOCKED[i].load(Relaxed)),
    }
}

/// Takes `earlier` (a [`snapshot`]) off the counters: they then count from that moment on.
pub fn subtract(earlier: &Snapshot) {
    let sub = |counter: &AtomicU64, value: u64| {
        let _ = counter.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(value)));
    };
    sub(&CALLS, earlier.calls);
    for i in 0..N {
        sub(&ALLOWED[i], earlier.allowed[i]);
        sub(&REJECTED[i], earlier.rejected[i]);
        sub(&BLOCKED[i], earlier.blocked[i]);
    }
}
