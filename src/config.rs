//! Module configuration values read on the hot path.

use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

/// Default `ratelimit.max-log-limit`: the largest limit a sliding log accepts.
pub const DEFAULT_MAX_LOG_LIMIT: i64 = 100_000;

/// `ratelimit.max-log-limit`.
pub static MAX_LOG_LIMIT: AtomicI64 = AtomicI64::new(DEFAULT_MAX_LOG_LIMIT);

/// The current `ratelimit.max-log-limit`.
pub fn max_log_limit() -> u64 {
    MAX_LOG_LIMIT.load(Relaxed).max(1) as u64
}
