//! The local fallback (`OnError::Local`) decides with the core crate's own algorithms: random
//! calls of CHECK, PEEK, REFUND and TAKE give the module's six fields at the same `AT`, and the
//! in-process state exists exactly while the module's key does, expiring at its PEXPIRETIME.

mod common;

use std::time::Duration;

use common::twin::random_limit;
use common::*;
use redis::Value;
use redis_ratelimit_client::local::LocalLimiter;
use redis_ratelimit_client::{Algorithm, Call, Limit, OnError, Options, RateLimiter, Source};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_algorithms_equal_the_module_with_at() {
    let Some(server) = module_server() else {
        return;
    };
    let mut conn = multiplexed(&server, false).await;
    for seed in 1..=3u64 {
        let mut rng = Rng::new(100 + seed);
        let mut local = LocalLimiter::default();
        let mut at = base_ms();
        for round in 0..30 {
            let key = format!("loc:{seed}:{round}");
            // Sometimes the parameters change under the same key (the carry-over rules).
            let mut limit = random_limit(&mut rng);
            for step in 0..40 {
                if rng.below(10) == 0 {
                    let next = random_limit(&mut rng);
                    if next.algorithm() == limit.algorithm() {
                        limit = next;
                    }
                }
                // Mostly forward, sometimes back in time (evaluated at max(call, last)).
                at = if rng.below(8) == 0 {
                    at.saturating_sub(rng.below(200))
                } else {
                    at + rng.below(400)
                };
                let cost = rng.below(4);
                let what = format!(
                    "seed {seed} round {round} step {step} {:?} at {at} cost {cost}",
                    limit.args()
                );
                let mut args = vec![key.clone()];
                args.extend(limit.args().iter().cloned());
                let (verb, got) = match rng.below(4) {
                    0 => (
                        "CHECK",
                        local
                            .check(&key, &limit, cost, at)
                            .map(|f| (f.allowed as u64, f)),
                    ),
                    1 => (
                        "PEEK",
                        local
                            .peek(&key, &limit, cost, at)
                            .map(|f| (f.allowed as u64, f)),
                    ),
                    2 => (
                        "REFUND",
                        local
                            .refund(&key, &limit, cost, at)
                            .map(|f| (f.allowed as u64, f)),
                    ),
                    _ => ("TAKE", local.take(&key, &limit, cost.max(1), at)),
                };
                let (first, f) = got.unwrap();
                let word = if verb == "TAKE" { "MAX" } else { "COST" };
                let n = if verb == "TAKE" { cost.max(1) } else { cost };
                args.extend([word.to_string(), n.to_string(), "AT".into(), at.to_string()]);
                let mut words = vec![format!("RATELIMIT.{verb}")];
                words.extend(args);
                let reply = raw(&mut conn, &words).await.unwrap();
                let got = [
                    first as i64,
                    f.limit as i64,
                    f.remaining as i64,
                    f.retry_after_ms,
                    f.reset_after_ms as i64,
                    f.delay_ms as i64,
                ];
                if std::env::var_os("TRACE").is_some() && seed == 1 && round == 4 {
                    eprintln!(
                        "{verb} {what} local {got:?} module {:?}",
                        six(&reply, verb == "TAKE")
                    );
                }
                assert_eq!(got, six(&reply, verb == "TAKE"), "{verb} {what}");
                // The key exists exactly while the local state does, expiring at the same time.
                let expiry: i64 = redis::cmd("PEXPIRETIME")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let local_expiry = local.expires_at_ms(&key).map_or(-2, |e| e as i64);
                assert_eq!(expiry, local_expiry, "{what}: PEXPIRETIME");
            }
        }
    }
}

/// A leaky bucket's TAKE: `delay_ms` is the wait of the last granted unit (issue 39), in
/// process as in the module: a fresh `leaky-bucket 2 1s BURST 4`, `TAKE MAX 6` grants 4 with
/// `delay_ms` 1500.
#[test]
fn a_local_leaky_take_reports_the_last_units_wait() {
    let limit = Limit::new(Algorithm::LeakyBucket, 2, "1s")
        .unwrap()
        .burst(4)
        .unwrap();
    let mut local = LocalLimiter::default();
    let (granted, fields) = local.take("k", &limit, 6, 1_000_000).unwrap();
    assert_eq!((granted, fields.delay_ms), (4, 1500));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fallback_decides_in_process_while_redis_is_stalled() {
    let server = Server::start_without_module();
    let options = Options {
        on_error: OnError::Local,
        timeout: Duration::from_millis(100),
        local_share: 0.5,
        ..Options::default()
    };
    let limiter = RateLimiter::new(manager(&server, false).await, options).unwrap();
    let limit = Limit::new(Algorithm::FixedWindow, 10, "1h").unwrap();
    assert_eq!(
        limiter.check("f", &limit, 1).await.unwrap().source,
        Source::Library
    );
    server.pause();
    let at = base_ms();
    let mut admitted = 0;
    for i in 0..8 {
        let d = limiter
            .check("f", &limit, Call::cost(1).at(at + i))
            .await
            .unwrap();
        assert_eq!(d.source, Source::Fallback);
        assert_eq!(d.limit, 5, "the limit scaled by local_share");
        admitted += u64::from(d.allowed);
    }
    assert_eq!(admitted, 5);
    let pairs = [("f2", limit.clone()), ("f3", limit.clone())];
    let d = limiter.check_all(&pairs, 1).await.unwrap();
    assert_eq!(
        (d.source, d.allowed, d.limits.len()),
        (Source::Fallback, true, 2)
    );
    server.resume();
    // Redis answers again: after the cool-down the probe closes the breaker.
    let mut back = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if limiter.check("f", &limit, 1).await.unwrap().source == Source::Library {
            back = true;
            break;
        }
    }
    assert!(back, "Redis decides again once it answers");
    let _ = Value::Nil;
}
