//! Client-side decisions: batches (TAKE ahead, admit locally, refund at the hold's end) lose no
//! unit to a dropped future, a timeout or a late reply; the denial cache answers what
//! per-request calls answer; a batched decision's delay_ms is never less than a per-request
//! CHECK's.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use redis_ratelimit_client::{Algorithm, Call, Limit, Options, RateLimiter, Source};

/// Blocks the server for about `ms` ms with a busy script (another connection).
async fn busy(server: &Server, ms: u64) -> tokio::task::JoinHandle<()> {
    let mut conn = multiplexed(server, false).await;
    tokio::spawn(async move {
        let script = "local s = redis.call('TIME') local t0 = s[1] * 1000000 + s[2] \
                      while true do local n = redis.call('TIME') \
                      if n[1] * 1000000 + n[2] - t0 > tonumber(ARGV[1]) * 1000 then break end end \
                      return 1";
        let _: redis::Value = redis::cmd("EVAL")
            .arg(script)
            .arg(0)
            .arg(ms)
            .query_async(&mut conn)
            .await
            .unwrap();
    })
}

/// What the key has consumed, per a PEEK (a fixed window of `limit`).
async fn consumed(server: &Server, key: &str, limit: u64) -> u64 {
    let mut conn = multiplexed(server, false).await;
    let words = words(&format!(
        "RATELIMIT.PEEK {key} fixed-window {limit} 1h COST 0"
    ));
    let reply = raw(&mut conn, &words).await.unwrap();
    limit - six(&reply, false)[2] as u64
}

fn admitted(d: &redis_ratelimit_client::Decision) -> u64 {
    if d.allowed && matches!(d.source, Source::Module | Source::Library | Source::Local) {
        d.granted
    } else {
        0
    }
}

/// Issue 39's repro: a batched check dropped while its TAKE waits behind a busy script; then
/// close(): the units consumed in Redis are the units admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_batched_check_loses_no_grant() {
    let Some(server) = module_server() else {
        return;
    };
    for timeout_ms in [1_000, 100] {
        let key = format!("drop:{timeout_ms}");
        let options = Options {
            timeout: Duration::from_millis(timeout_ms),
            ..Options::default()
        };
        let limiter = RateLimiter::new(manager(&server, false).await, options).unwrap();
        let limit = Limit::new(Algorithm::FixedWindow, 100, "1h")
            .unwrap()
            .batch("1s")
            .unwrap();
        let mut total = 0;
        for _ in 0..40 {
            total += admitted(&limiter.check(&key, &limit, 1).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(1300)).await; // the rest is refunded
        assert_eq!(
            consumed(&server, &key, 100).await,
            total,
            "after the hold's refund"
        );
        let script = busy(&server, 300).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The caller gives up after 50 ms: its future is dropped mid-TAKE.
        let dropped =
            tokio::time::timeout(Duration::from_millis(50), limiter.check(&key, &limit, 1)).await;
        if let Ok(Ok(d)) = &dropped {
            total += admitted(d);
        }
        script.await.unwrap();
        limiter.close().await;
        assert_eq!(limiter.held(), 0);
        assert_eq!(
            consumed(&server, &key, 100).await,
            total,
            "timeout {timeout_ms} ms: consumed == admitted"
        );
    }
}

/// Under load: concurrent batched checks, a third of them dropped at random moments, busy
/// scripts stalling the server past the timeout now and then (late replies): after close(),
/// consumed == admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_futures_and_late_replies_under_load_lose_nothing() {
    let Some(server) = module_server() else {
        return;
    };
    let limiter = RateLimiter::new(manager(&server, false).await, Options::default()).unwrap();
    let limit = Limit::new(Algorithm::FixedWindow, 1_000_000, "1h")
        .unwrap()
        .batch("200ms")
        .unwrap()
        .batch_max(50)
        .unwrap();
    let total = Arc::new(AtomicU64::new(0));
    let mut rng = Rng::new(7);
    let mut scripts = Vec::new();
    for wave in 0..30u64 {
        if wave % 6 == 3 {
            scripts.push(busy(&server, 150 + rng.below(150)).await);
        }
        let mut tasks = Vec::new();
        for _ in 0..40 {
            let (limiter, limit, total) = (limiter.clone(), limit.clone(), total.clone());
            let cancel_after = if rng.below(3) == 0 {
                Some(rng.below(40))
            } else {
                None
            };
            tasks.push(tokio::spawn(async move {
                let call = limiter.check("load", &limit, 1);
                let d = match cancel_after {
                    Some(ms) => match tokio::time::timeout(Duration::from_millis(ms), call).await {
                        Ok(d) => d,
                        Err(_) => return,
                    },
                    None => call.await,
                };
                total.fetch_add(admitted(&d.unwrap()), Ordering::SeqCst);
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(rng.below(60))).await;
    }
    for script in scripts {
        script.await.unwrap();
    }
    limiter.close().await;
    let stats = limiter.stats();
    let admitted = total.load(Ordering::SeqCst);
    assert!(admitted > 500, "{admitted} admitted: {stats:?}");
    assert_eq!(
        consumed(&server, "load", 1_000_000).await,
        admitted,
        "{stats:?}"
    );
}

/// Three limiters on one key, each batching: never more admitted than the limit, and the
/// key's accounting is exact once they close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batching_limiters_never_admit_more_than_the_limit() {
    let Some(server) = module_server() else {
        return;
    };
    let limit = Limit::new(Algorithm::FixedWindow, 50, "1h")
        .unwrap()
        .batch("1s")
        .unwrap()
        .batch_max(8)
        .unwrap();
    let mut limiters = Vec::new();
    for _ in 0..3 {
        limiters.push(RateLimiter::new(manager(&server, false).await, Options::default()).unwrap());
    }
    let mut total = 0;
    for i in 0..200 {
        total += admitted(&limiters[i % 3].check("three", &limit, 1).await.unwrap());
    }
    assert!((30..=50).contains(&total), "{total} admitted");
    for limiter in &limiters {
        limiter.close().await;
    }
    assert_eq!(consumed(&server, "three", 50).await, total);
}

/// The denial cache on key `a`, per-request calls on the twin `b`, the same calls at the same
/// `AT`: the same admissions and grants one by one (limits with and without BLOCK).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_limiter_answers_what_per_request_calls_answer() {
    let Some(server) = module_server() else {
        return;
    };
    let options = Options {
        denial_cache: 1000,
        ..Options::default()
    };
    let limiter = RateLimiter::new(manager(&server, true).await, options).unwrap();
    let plain = RateLimiter::new(manager(&server, true).await, Options::default()).unwrap();
    let mut rng = Rng::new(21);
    let mut at = base_ms();
    for round in 0..40 {
        let limit = common::twin::random_limit(&mut rng);
        for step in 0..30 {
            at += rng.below(120);
            let cost = 1 + rng.below(3);
            let (a, b) = (format!("dc:a{round}"), format!("dc:b{round}"));
            let call = Call::cost(cost).at(at);
            let (x, y) = if rng.below(3) == 0 {
                (
                    limiter.take(&a, &limit, call).await.unwrap(),
                    plain.take(&b, &limit, call).await.unwrap(),
                )
            } else {
                (
                    limiter.check(&a, &limit, call).await.unwrap(),
                    plain.check(&b, &limit, call).await.unwrap(),
                )
            };
            assert_eq!(
                (x.allowed, x.granted),
                (y.allowed, y.granted),
                "round {round} step {step} {:?}",
                limit.args()
            );
            if x.source == Source::Cache {
                assert!(
                    x.retry_after_ms <= y.retry_after_ms || y.retry_after_ms < 0,
                    "never a longer wait"
                );
            }
        }
    }
    assert!(
        limiter.stats().get("cache").copied().unwrap_or(0) > 50,
        "{:?}",
        limiter.stats()
    );
}

/// A leaky bucket's batched admissions report the last TAKE's delay_ms counted down: never
/// less than the wait a per-request CHECK gives the same request on a twin key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_delay_is_never_less_than_a_per_request_checks() {
    let Some(server) = module_server() else {
        return;
    };
    let limiter = RateLimiter::new(manager(&server, false).await, Options::default()).unwrap();
    let plain = RateLimiter::new(manager(&server, false).await, Options::default()).unwrap();
    let limit = Limit::new(Algorithm::LeakyBucket, 20, "1s")
        .unwrap()
        .burst(40)
        .unwrap()
        .batch("100ms")
        .unwrap();
    let inline = Limit::new(Algorithm::LeakyBucket, 20, "1s")
        .unwrap()
        .burst(40)
        .unwrap();
    let mut rng = Rng::new(5);
    let mut at = base_ms();
    let mut compared = 0;
    for step in 0..400 {
        at += rng.below(30);
        let x = limiter
            .check("lb:a", &limit, Call::cost(1).at(at))
            .await
            .unwrap();
        let y = plain
            .check("lb:b", &inline, Call::cost(1).at(at))
            .await
            .unwrap();
        if x.allowed && y.allowed {
            assert!(
                x.delay_ms >= y.delay_ms,
                "step {step}: batched {} < per-request {}",
                x.delay_ms,
                y.delay_ms
            );
            compared += 1;
        }
    }
    assert!(
        compared > 100 && limiter.stats().get("local").copied().unwrap_or(0) > 20,
        "{:?}",
        limiter.stats()
    );
    limiter.close().await;
}
