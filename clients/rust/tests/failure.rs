//! Failure: a stalled server (SIGSTOP) costs a call at most the timeout, then the breaker
//! answers at once and one probe per cool-down goes to Redis; a killed server likewise; both
//! recover by themselves. Open answers admit (`Source::Error`), closed ones are
//! `Error::Unavailable`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use redis_ratelimit_client::{Algorithm, Error, Limit, OnError, Options, RateLimiter, Source};

fn commands<C: redis_ratelimit_client::Connection>(limiter: &RateLimiter<C>) -> u64 {
    limiter.stats().get("commands").copied().unwrap_or(0)
}

/// Calls until one is decided by Redis again (bounded: 10 s).
async fn until_redis_decides<C: redis_ratelimit_client::Connection>(
    limiter: &RateLimiter<C>,
    limit: &Limit,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(d) = limiter.check("k", limit, 1).await {
            if d.source.is_server() {
                return;
            }
        }
        assert!(Instant::now() < deadline, "Redis never decided again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_costs_one_timeout_per_cooldown_and_recovers() {
    stall(Server::start_without_module(), Source::Library).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_of_the_module_costs_one_timeout_per_cooldown_and_recovers() {
    let Some(server) = module_server() else {
        return;
    };
    stall(server, Source::Module).await;
}

/// The stall of `server`, whose engine answers as `engine` before and after.
async fn stall(server: Server, engine: Source) {
    let timeout = Duration::from_millis(100);
    let cooldown = Duration::from_millis(300);
    let options = Options {
        timeout,
        breaker_cooldown: cooldown,
        ..Options::default()
    };
    let limiter = RateLimiter::new(manager(&server, false).await, options).unwrap();
    let closed = RateLimiter::new(
        manager(&server, true).await,
        Options {
            on_error: OnError::Closed,
            timeout,
            breaker_cooldown: cooldown,
            ..Options::default()
        },
    )
    .unwrap();
    let local = RateLimiter::new(
        manager(&server, false).await,
        Options {
            on_error: OnError::Local,
            timeout,
            breaker_cooldown: cooldown,
            ..Options::default()
        },
    )
    .unwrap();
    let limit = Limit::new(Algorithm::SlidingWindow, 100, "1m").unwrap();
    assert_eq!(limiter.check("k", &limit, 1).await.unwrap().source, engine);
    assert!(closed.check("k", &limit, 1).await.unwrap().allowed);
    // Nothing refills it during the test: its remaining count is exact.
    let log = Limit::new(Algorithm::SlidingLog, 100, "1h").unwrap();
    assert_eq!(local.check("l", &log, 1).await.unwrap().source, engine);

    server.pause();
    // Each call is bounded by the timeout (generous slack for a loaded machine).
    let sent_before = commands(&limiter);
    for _ in 0..3 {
        let started = Instant::now();
        let d = limiter.check("k", &limit, 1).await.unwrap();
        assert!(
            started.elapsed() < timeout + Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        assert_eq!((d.source, d.allowed, d.remaining), (Source::Error, true, 0));
    }
    assert_eq!(
        commands(&limiter) - sent_before,
        3,
        "three calls reached the stalled server"
    );
    assert!(limiter.breaker_open(), "three failures open the breaker");
    // Open: calls answer without touching Redis; one probe per cool-down.
    let started = Instant::now();
    let sent_before = commands(&limiter);
    let mut calls = 0;
    while started.elapsed() < Duration::from_millis(1000) {
        let d = limiter.check("k", &limit, 1).await.unwrap();
        assert_eq!(d.source, Source::Error);
        calls += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let probes = commands(&limiter) - sent_before;
    let most = started.elapsed().as_millis() as u64 / cooldown.as_millis() as u64 + 1;
    assert!(
        calls > 20 && probes >= 1 && probes <= most,
        "{calls} calls, {probes} probes, at most {most}"
    );
    // Failing closed: the caller is told.
    for _ in 0..4 {
        let error = closed.check("k", &limit, 1).await.unwrap_err();
        assert!(matches!(error, Error::Unavailable(_)), "{error}");
    }
    // Deciding in process, with the limit's own count from an empty start.
    for n in 1..=4 {
        let d = local.check("l", &log, 1).await.unwrap();
        assert_eq!(
            (d.source, d.allowed, d.remaining),
            (Source::Fallback, true, 100 - n)
        );
    }
    // A call that decides nothing is told too, whatever on_error.
    assert!(matches!(
        limiter.reset(&["k"]).await,
        Err(Error::Unavailable(_))
    ));

    server.resume();
    until_redis_decides(&limiter, &limit).await;
    assert!(!limiter.breaker_open());
    let deadline = Instant::now() + Duration::from_secs(10);
    while closed.check("k", &limit, 1).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the closed limiter never recovered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_fails_fast_and_the_limiter_reconnects() {
    let mut server = Server::start_without_module();
    let options = Options {
        breaker_cooldown: Duration::from_millis(200),
        ..Options::default()
    };
    let limiter = RateLimiter::new(manager(&server, false).await, options).unwrap();
    let limit = Limit::new(Algorithm::TokenBucket, 10, "1s").unwrap();
    assert!(limiter
        .check("k", &limit, 1)
        .await
        .unwrap()
        .source
        .is_server());
    server.kill9();
    for _ in 0..10 {
        let started = Instant::now();
        let d = limiter.check("k", &limit, 1).await.unwrap();
        assert_eq!(d.source, Source::Error);
        assert!(started.elapsed() < Duration::from_millis(100) + Duration::from_secs(1));
    }
    assert!(limiter.breaker_open());
    // Back on the same port: a new server (no library): loaded again, and deciding.
    server.start_again();
    until_redis_decides(&limiter, &limit).await;
    assert_eq!(
        limiter.check("k", &limit, 1).await.unwrap().source,
        Source::Library
    );
}
