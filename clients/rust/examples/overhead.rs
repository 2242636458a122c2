//! The crate's cost per call and its batches' decisions per second, against a server of its
//! own (the test kit's: a free loopback port, the module of `RATELIMIT_MODULE`):
//!
//! `cargo run --release -p redis-ratelimit-client --example overhead` (`BENCH_QUICK=1`: fewer
//! calls). Prints two markdown tables:
//! - sequential calls, one connection: `RateLimiter::check` vs the raw redis-rs command
//!   (`RATELIMIT.CHECK` through `query_async`), RESP2 and RESP3, in 40 alternating rounds: the
//!   medians of each side's µs per call and of the rounds' ratios;
//! - one hot key, 64 concurrent callers: decisions per second per request and with batches,
//!   and Redis commands per 1,000 decisions.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis_ratelimit_client::{Algorithm, Limit, Options, RateLimiter, Source};
use redis_ratelimit_testkit::Server;

async fn connect(server: &Server, resp3: bool) -> MultiplexedConnection {
    let protocol = if resp3 { "resp3" } else { "resp2" };
    redis::Client::open(format!(
        "redis://127.0.0.1:{}/?protocol={protocol}",
        server.port()
    ))
    .unwrap()
    .get_multiplexed_async_connection()
    .await
    .unwrap()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

async fn sequential(server: &Server, resp3: bool, calls: u64) -> (f64, f64, f64) {
    // A generous timeout: a hiccup of this shared machine must not turn a call into an open answer.
    let options = Options {
        timeout: Duration::from_secs(2),
        ..Options::default()
    };
    let limiter = RateLimiter::new(connect(server, resp3).await, options).unwrap();
    let mut raw = connect(server, resp3).await;
    let limit = Limit::new(Algorithm::TokenBucket, 1_000_000_000_000, "1s").unwrap();
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..calls / 10 {
        limiter.check("bench:ours", &limit, 1).await.unwrap();
    }
    // Many short rounds, alternating: the machine's noise (other processes) hits both alike.
    let rounds = 40;
    let per_round = calls / rounds;
    let mut ratios = Vec::new();
    for _ in 0..rounds {
        let started = Instant::now();
        for _ in 0..per_round {
            let d = limiter.check("bench:ours", &limit, 1).await.unwrap();
            assert!(d.allowed && d.source.is_server());
        }
        ours.push(started.elapsed().as_secs_f64() * 1e6 / per_round as f64);
        let started = Instant::now();
        for _ in 0..per_round {
            let _: redis::Value = redis::cmd("RATELIMIT.CHECK")
                .arg("bench:raw")
                .arg("token-bucket")
                .arg("1000000000000")
                .arg("1s")
                .arg("COST")
                .arg("1")
                .query_async(&mut raw)
                .await
                .unwrap();
        }
        theirs.push(started.elapsed().as_secs_f64() * 1e6 / per_round as f64);
        ratios.push(ours[ours.len() - 1] / theirs[theirs.len() - 1]);
    }
    (median(ours), median(theirs), median(ratios))
}

/// Decisions per second on one key for `seconds`, and Redis commands per 1,000 decisions.
async fn hot_key(server: &Server, batch: bool, seconds: f64) -> (f64, f64) {
    let options = Options {
        timeout: Duration::from_secs(2),
        ..Options::default()
    };
    let limiter = RateLimiter::new(connect(server, false).await, options).unwrap();
    let key = if batch { "hot:batch" } else { "hot:plain" };
    let mut limit = Limit::new(Algorithm::SlidingWindow, 1_000_000_000, "1s").unwrap();
    if batch {
        limit = limit.batch("50ms").unwrap().batch_max(10_000).unwrap();
    }
    let decisions = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (limiter, limit, decisions) = (limiter.clone(), limit.clone(), decisions.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let d = limiter.check(key, &limit, 1).await.unwrap();
                // Only what Redis (or a batch's units) decided: no open answer counts.
                assert!(d.allowed && matches!(d.source, Source::Module | Source::Local));
                decisions.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    limiter.close().await;
    let n = decisions.load(Ordering::Relaxed) as f64;
    let commands = limiter.stats().get("commands").copied().unwrap_or(0) as f64;
    (n / seconds, commands * 1000.0 / n)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let calls = if quick { 4_000 } else { 40_000 };
    let server = Server::start();
    println!("| sequential call (RATELIMIT.CHECK, one connection) | crate µs/call | raw redis-rs µs/call | ratio |");
    println!("|---|---|---|---|");
    for resp3 in [false, true] {
        let (ours, theirs, ratio) = sequential(&server, resp3, calls).await;
        let protocol = if resp3 { "RESP3" } else { "RESP2" };
        println!(
            "| {protocol}, {calls} calls each in 40 alternating rounds (medians) | {ours:.1} | \
             {theirs:.1} | {ratio:.3}x |"
        );
    }
    let seconds = if quick { 1.0 } else { 3.0 };
    println!();
    println!("| one hot key, 64 concurrent callers, {seconds} s | decisions/s | Redis commands per 1,000 decisions |");
    println!("|---|---|---|");
    for batch in [false, true] {
        let (rate, commands) = hot_key(&server, batch, seconds).await;
        let what = if batch {
            "batches (hold 50 ms)"
        } else {
            "per-request CHECK"
        };
        println!("| {what} | {rate:.0} | {commands:.1} |");
    }
}
