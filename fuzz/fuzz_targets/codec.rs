//! Fuzzes the one binary codec of a limiter: `codec::decode` (what `rdb_load` and RESTORE trust) and
//! `Change::decode` (what `RATELIMIT.APPLY` trusts: replication, AOF replay, AOF rewrites).
//!
//! Input: the payload bytes, as they would sit in an RDB string buffer or an APPLY argument.
//!
//! Beyond "never panics" (built with overflow checks), it checks:
//! - round trip: a payload that decodes re-encodes to bytes that decode to the same value, and that
//!   encoding is a fixpoint; the packed form commands replicate (`encode_write`) decodes the same;
//! - whatever decodes is safe to use: the cores run on it (with its own and with changed
//!   parameters, at its own time and later) without a panic, and every state they then store encodes
//!   and decodes again, so a key that a crafted payload installed cannot later make RDB or a
//!   replica refuse the keys derived from it;
//! - what `rdb_load` stores: a limiter that fits a compact word (`core/src/compact.rs`) comes back
//!   from it whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_ratelimit_core::algorithms::concurrency::{self, Acquire, Released};
use redis_ratelimit_core::algorithms::{
    block::{self, Blocking},
    sliding_log, Kind, Limiter, Params, Request, State, Write, MAX_PERIOD_MS, TIME_LIMIT_MS,
};
use redis_ratelimit_core::codec::{self, Change};
use redis_ratelimit_core::compact;

/// `ratelimit.max-log-limit`'s default: the largest sliding log a CHECK creates.
const DEFAULT_MAX_LOG_LIMIT: u64 = 100_000;

fuzz_target!(|data: &[u8]| {
    if let Ok(limiter) = codec::decode(data) {
        let bytes = codec::to_bytes(&limiter);
        let again = codec::decode(&bytes).expect("a re-encoded limiter decodes");
        assert_eq!(again, limiter);
        assert_eq!(
            codec::to_bytes(&again),
            bytes,
            "the encoding is not a fixpoint"
        );
        // The digest, AOF rewrite and replication all encode through `Change`.
        let change = Change::Replace(limiter.clone());
        assert_eq!(Change::decode(&change.to_bytes()), Ok(change));
        let _ = limiter.expires_at_ms();
        if let Some(word) = compact::compact(&limiter) {
            assert_eq!(compact::expand(word), limiter, "the compact word");
            compact::release(word);
        }
        exercise(limiter);
    }
    if let Ok(change) = Change::decode(data) {
        let bytes = change.to_bytes();
        assert_eq!(Change::decode(&bytes).as_ref(), Ok(&change));
        match change {
            Change::Replace(limiter) => {
                // The form commands replicate (packed for buckets and windows) decodes the same.
                let mut replicated = Vec::new();
                codec::encode_write(&limiter, &mut replicated);
                assert_eq!(
                    Change::decode(&replicated),
                    Ok(Change::Replace(limiter.clone()))
                );
                exercise(limiter)
            }
            Change::LogAppend { params, t_ms, cost } => {
                // RATELIMIT.APPLY refuses what no admitted call could have written: a log above
                // `ratelimit.max-log-limit` or an append beyond the log's limit.
                if params.limit > DEFAULT_MAX_LOG_LIMIT
                    || !sliding_log::append_fits(None, &params, t_ms, cost)
                {
                    return;
                }
                // RATELIMIT.APPLY on a missing key.
                let mut created = None;
                let (Write::Created, Some(limiter)) = (
                    sliding_log::append(None, &params, t_ms, cost, &mut created),
                    created,
                ) else {
                    panic!("an append to nothing creates the key");
                };
                assert_eq!(
                    codec::decode(&codec::to_bytes(&limiter)).as_ref(),
                    Ok(&limiter)
                );
                exercise(limiter);
            }
            Change::LeaseAcquire {
                params,
                t_ms,
                cost,
                id,
            } => {
                // RATELIMIT.APPLY on a missing key: an admitted ACQUIRE creates it.
                let request = Acquire {
                    params,
                    id: &id,
                    cost,
                    now_ms: t_ms,
                };
                let mut created = None;
                let (acquired, write) =
                    concurrency::acquire(None, &request, 100_000, true, &mut created)
                        .expect("a decoded acquire is valid");
                assert!(
                    acquired.decision.allowed,
                    "a decoded acquire fits its limit"
                );
                let (Write::Created, Some(limiter)) = (write, created) else {
                    panic!("an acquire on nothing creates the key");
                };
                assert_eq!(
                    codec::decode(&codec::to_bytes(&limiter)).as_ref(),
                    Ok(&limiter)
                );
                exercise(limiter);
            }
            // These apply to a stored key only (APPLY refuses them on a missing one); what
            // they leave is a limiter the `Replace` arm above decodes and exercises.
            Change::LogRefund { .. } | Change::Block { .. } | Change::LeaseRelease { .. } => {}
        }
    }
});

/// Calls on a decoded limiter with its own parameters and with changed ones, now and later.
fn exercise(limiter: Limiter) {
    let Kind::Rate(algorithm) = limiter.kind() else {
        return exercise_leases(limiter);
    };
    let own = limiter.params;
    let half = Params::new(
        own.limit,
        (own.period_ms / 2).max(1),
        burst(&limiter, own.capacity),
    )
    .expect("valid");
    let double = Params::new(
        own.limit.div_ceil(2),
        (own.period_ms * 2).min(MAX_PERIOD_MS),
        burst(
            &limiter,
            own.capacity.saturating_mul(2).min(own.limit.max(1) * 2),
        ),
    );
    let double = double.unwrap_or(own);
    let last = limiter.last_ms;
    let calls = [
        (own, 1, last),
        (own, 0, last.saturating_sub(own.period_ms)),
        (half, 1, last + 1),
        (double, own.limit, last + own.period_ms / 3),
        (own, 2, last.saturating_add(own.period_ms)),
        (own, 1, limiter.expires_at_ms()),
    ];
    let mut stored = Some(limiter);
    for (params, cost, now_ms) in calls {
        if now_ms >= TIME_LIMIT_MS {
            continue;
        }
        let request = Request {
            algorithm,
            params,
            cost,
            now_ms,
        };
        // With a `BLOCK` of one period: a decoded block is honoured, a rejection starts one.
        let block_ms = Some(own.period_ms);
        let mut copy = stored.clone();
        let (peeked, _, _) =
            block::check_blocking(copy.as_mut(), &request, false, block_ms, &mut None)
                .expect("one algorithm");
        let mut created = None;
        let (outcome, write, blocking) =
            block::check_blocking(stored.as_mut(), &request, true, block_ms, &mut created)
                .expect("one algorithm");
        if blocking == Blocking::None {
            assert_eq!(peeked, outcome, "PEEK and CHECK disagree");
        } else {
            // Both reject; the CHECK that starts a block answers the block's wait.
            assert!(!peeked.decision.allowed && !outcome.decision.allowed);
        }
        let decision = outcome.decision;
        assert!(decision.remaining <= decision.limit);
        assert_eq!(decision.allowed, decision.retry_after_ms == 0);
        if let (Write::Created, Some(created)) = (write, created) {
            stored = Some(created);
        }
        if outcome.consumed || matches!(blocking, Blocking::Started(_)) {
            let limiter = stored.as_ref().expect("stored");
            assert_eq!(
                codec::decode(&codec::to_bytes(limiter)).as_ref(),
                Ok(limiter),
                "a state the cores stored does not decode"
            );
        }
    }
}

/// The `BURST` to pass for this limiter's algorithm (windows and the log take none).
fn burst(limiter: &Limiter, capacity: u64) -> Option<u64> {
    limiter.kind().is_bucket().then_some(capacity.max(1))
}

/// ACQUIREs and RELEASEs on a decoded lease set: renewals of its leases, new ones, changed
/// limits and durations, at its own time and later; every state they store decodes again.
fn exercise_leases(limiter: Limiter) {
    let own = limiter.params;
    let State::Concurrency(leases) = &limiter.state else {
        return;
    };
    let ids: Vec<Vec<u8>> = leases.iter().take(3).map(|(id, _)| id.to_vec()).collect();
    let last = limiter.last_ms;
    let smaller =
        Params::new(own.limit.div_ceil(2), (own.period_ms / 2).max(1), None).expect("valid");
    let mut stored = Some(limiter);
    let fresh_id = b"fuzz-new-lease".to_vec();
    let calls = [
        (own, 1, last),
        (smaller, own.limit, last + 1),
        (
            own,
            own.limit.div_ceil(3),
            last.saturating_add(own.period_ms / 2),
        ),
        (own, 1, last.saturating_add(own.period_ms)),
    ];
    for (i, (params, cost, now_ms)) in calls.into_iter().enumerate() {
        if now_ms >= TIME_LIMIT_MS {
            continue;
        }
        let id = ids.get(i).unwrap_or(&fresh_id);
        let request = Acquire {
            params,
            id,
            cost,
            now_ms,
        };
        let peeked =
            concurrency::acquire(stored.clone().as_mut(), &request, 100_000, false, &mut None);
        let mut created = None;
        let result = concurrency::acquire(stored.as_mut(), &request, 100_000, true, &mut created);
        assert_eq!(
            peeked.map(|(acquired, _)| acquired),
            result
                .as_ref()
                .map(|(acquired, _)| *acquired)
                .map_err(|e| *e),
            "a committing ACQUIRE answers what a non-committing one does"
        );
        let Ok((acquired, write)) = result else {
            continue;
        };
        let decision = acquired.decision;
        assert!(decision.remaining <= decision.limit);
        assert_eq!(decision.allowed, decision.retry_after_ms == 0);
        if let (Write::Created, Some(created)) = (write, created) {
            stored = Some(created);
        }
        if let Some(limiter) = &stored {
            assert_eq!(
                codec::decode(&codec::to_bytes(limiter)).as_ref(),
                Ok(limiter),
                "a lease set the cores stored does not decode"
            );
        }
    }
    for id in ids.iter().chain([&fresh_id]) {
        let Some(limiter) = stored.as_mut() else {
            return;
        };
        match concurrency::release(limiter, id, last.saturating_add(1)) {
            Ok((_, Released::Emptied)) => stored = None,
            Ok(_) => assert_eq!(
                codec::decode(&codec::to_bytes(limiter)).as_ref(),
                Ok(&*limiter),
                "a lease set a release left does not decode"
            ),
            Err(error) => panic!("{error:?}"),
        }
    }
}
