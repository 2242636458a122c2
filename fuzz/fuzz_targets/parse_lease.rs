//! Fuzzes `parse_acquire` and `parse_release`, the parsers of `RATELIMIT.ACQUIRE/RELEASE key
//! <args...>`, then runs every ACQUIRE they accept through the concurrency core as the command
//! would, with a RELEASE of the same id after it.
//!
//! Input: the arguments after the key, separated by `\n` (as for `parse_check`).
//!
//! Beyond "never panics" (built with overflow checks), it checks: an accepted vector holds an id
//! of 1 to 128 bytes, a cost of 1 to 10^12 and an `AT` below 2^53, and a limit and lease duration
//! within their bounds; a committing ACQUIRE answers what a non-committing one does, an admitted
//! lease set survives the codec unchanged, a RELEASE right after releases the lease and empties
//! the key, and one after the lease's expiry releases nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_ratelimit_core::algorithms::concurrency::{self, Acquire, Released};
use redis_ratelimit_core::algorithms::{Write, MAX_AMOUNT, MAX_PERIOD_MS, TIME_LIMIT_MS};
use redis_ratelimit_core::codec;
use redis_ratelimit_core::parse::{parse_acquire, parse_release, LeaseLimit};

/// The server's clock for calls without `AT` (any fixed time will do).
const CLOCK_MS: u64 = 1_796_169_600_000;

fuzz_target!(|data: &[u8]| {
    let args: Vec<&[u8]> = data.split(|byte| *byte == b'\n').collect();
    if let Ok(release) = parse_release(&args) {
        assert!((1..=128).contains(&release.id.len()));
        assert!(release.at_ms.is_none_or(|at| at < TIME_LIMIT_MS));
    }
    let Ok(parsed) = parse_acquire(&args) else {
        return;
    };
    assert!((1..=128).contains(&parsed.id.len()));
    assert!((1..=MAX_AMOUNT).contains(&parsed.cost));
    assert!(parsed.at_ms.is_none_or(|at| at < TIME_LIMIT_MS));
    let LeaseLimit::Inline(params) = parsed.limit else {
        return;
    };
    assert!((1..=MAX_AMOUNT).contains(&params.limit));
    assert!((1..=MAX_PERIOD_MS).contains(&params.period_ms));
    let request = Acquire {
        params,
        id: parsed.id,
        cost: parsed.cost,
        now_ms: parsed.at_ms.unwrap_or(CLOCK_MS),
    };
    let (peeked, _) =
        concurrency::acquire(None, &request, 100_000, false, &mut None).expect("valid");
    let mut created = None;
    let (acquired, write) =
        concurrency::acquire(None, &request, 100_000, true, &mut created).expect("valid");
    assert_eq!(peeked, acquired);
    let decision = acquired.decision;
    assert_eq!(decision.allowed, parsed.cost <= params.limit);
    assert_eq!(decision.allowed, decision.retry_after_ms == 0);
    assert!(decision.remaining <= decision.limit);
    let (Write::Created, Some(mut limiter)) = (write, created) else {
        assert!(!decision.allowed);
        return;
    };
    assert_eq!(
        codec::decode(&codec::to_bytes(&limiter)).as_ref(),
        Ok(&limiter)
    );
    assert_eq!(limiter.expires_at_ms(), acquired.expiry_ms);
    // Released at its expiry: nothing left to release.
    let mut expired = limiter.clone();
    let (_, released) = concurrency::release(&mut expired, parsed.id, acquired.expiry_ms).unwrap();
    assert_eq!(released, Released::Nothing);
    let (_, released) = concurrency::release(&mut limiter, parsed.id, acquired.t_ms).unwrap();
    assert_eq!(released, Released::Emptied);
});
