//! Counters for `INFO ratelimit`: plain relaxed atomics, no allocation, no scan.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

use crate::algorithms::Algorithm;

const N: usize = Algorithm::ALL.len();

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const ZERO_I: AtomicI64 = AtomicI64::new(0);

static ALLOWED: [AtomicU64; N] = [ZERO; N];
static REJECTED: [AtomicU64; N] = [ZERO; N];
/// Live limiter values per algorithm (created minus freed); signed so a free racing a create on a
/// background thread never wraps.
static KEYS: [AtomicI64; N] = [ZERO_I; N];

/// Counts one decision.
pub fn count_decision(algorithm: Algorithm, allowed: bool) {
    let table = if allowed { &ALLOWED } else { &REJECTED };
    table[algorithm.index()].fetch_add(1, Relaxed);
}

pub fn key_created(algorithm: Algorithm) {
    KEYS[algorithm.index()].fetch_add(1, Relaxed);
}

pub fn key_freed(algorithm: Algorithm) {
    KEYS[algorithm.index()].fetch_sub(1, Relaxed);
}

/// One algorithm's figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Figures {
    pub calls: u64,
    pub allowed: u64,
    pub rejected: u64,
    pub keys: u64,
}

/// The figures of `algorithm` now.
pub fn figures(algorithm: Algorithm) -> Figures {
    let i = algorithm.index();
    let allowed = ALLOWED[i].load(Relaxed);
    let rejected = REJECTED[i].load(Relaxed);
    Figures {
        calls: allowed + rejected,
        allowed,
        rejected,
        keys: KEYS[i].load(Relaxed).max(0) as u64,
    }
}
