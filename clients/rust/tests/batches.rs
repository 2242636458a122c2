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

// -- the bound of docs/guarantees.md ("Client-side decisions") --------------------------------

/// A day boundary two days ahead: aligned to every period used here.
fn t0() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    (now / 86_400 + 2) * 86_400_000
}

/// The most per-request CHECKs can admit in [s, s + w): unit costs from a fresh key, each
/// admitted as early as it can be (a PEEK first, so a BLOCK never starts).
struct Envelope {
    limit: Limit,
    t0: u64,
    aligned: bool,
    memo: std::collections::HashMap<(u64, u64), u64>,
}

impl Envelope {
    fn new(limit: &Limit, t0: u64) -> Envelope {
        let aligned = matches!(
            limit.algorithm(),
            Algorithm::FixedWindow | Algorithm::SlidingWindow
        );
        Envelope {
            limit: limit.clone(),
            t0,
            aligned,
            memo: Default::default(),
        }
    }

    fn most(&mut self, s: u64, w: u64) -> u64 {
        let period = self.limit.period_ms();
        let phase = if self.aligned {
            (s - self.t0) % period
        } else {
            0
        };
        if let Some(n) = self.memo.get(&(phase, w)) {
            return *n;
        }
        let mut local = redis_ratelimit_client::local::LocalLimiter::default();
        let start = self.t0 + 10 * period + phase;
        let mut admitted = 0;
        for t in start..start + w {
            while local.peek("k", &self.limit, 1, t).unwrap().allowed {
                assert!(local.check("k", &self.limit, 1, t).unwrap().allowed);
                admitted += 1;
            }
        }
        self.memo.insert((phase, w), admitted);
        admitted
    }
}

/// Requests from three limiters (each its own connection) on one key at random `AT` times with
/// bursts and pauses: the admissions `(t, cost)`, the units all hold after each call `(t,
/// held)`, the limiters. Every unit a client took is admitted, refunded or still held.
async fn run_clients(
    server: &Server,
    limit: &Limit,
    seed: u64,
    t0: u64,
) -> (
    Vec<(u64, u64)>,
    Vec<(u64, u64)>,
    Vec<RateLimiter<redis::aio::ConnectionManager>>,
) {
    let mut rng = Rng::new(seed);
    let options = Options {
        // A loaded machine must not turn a slow reply into the fail-open answer.
        timeout: Duration::from_secs(5),
        on_error: redis_ratelimit_client::OnError::Closed,
        ..Options::default()
    };
    let mut limiters = Vec::new();
    for _ in 0..3 {
        limiters.push(RateLimiter::new(manager(server, false).await, options.clone()).unwrap());
    }
    let key = format!("bound:{}:{seed}", limit.algorithm().name());
    let (mut admissions, mut held) = (Vec::new(), Vec::new());
    let mut admitted = [0u64; 3];
    let mut now = t0 + 3_600_000;
    let pick = |rng: &mut Rng, of: &[u64]| of[rng.below(of.len() as u64) as usize];
    for _ in 0..900 {
        now += if rng.below(50) != 0 {
            pick(&mut rng, &[0, 0, 0, 1, 1, 2, 5])
        } else {
            pick(&mut rng, &[60, 200, 900])
        };
        let which = rng.below(3) as usize;
        let cost = pick(&mut rng, &[1, 1, 1, 1, 2, 3]);
        let d = limiters[which]
            .check(&key, limit, Call::cost(cost).at(now))
            .await
            .unwrap();
        if d.allowed {
            assert!(
                d.granted == cost && matches!(d.source, Source::Local | Source::Module),
                "{d:?}"
            );
            admissions.push((now, cost));
            admitted[which] += cost;
        }
        held.push((now, limiters.iter().map(|l| l.held()).sum()));
    }
    // Every request is at most batch_max: all go through the batch.
    for (limiter, units) in limiters.iter().zip(admitted) {
        let stats = limiter.stats();
        let n = |name: &str| stats.get(name).copied().unwrap_or(0);
        assert_eq!(
            n("taken"),
            units + n("refunded") + limiter.held(),
            "{stats:?}, {units} admitted"
        );
    }
    (admissions, held, limiters)
}

/// The largest `admitted(s, w) - envelope(s, w) - held(s)` over window starts `s` (every 10
/// ms) and widths of 100 ms and 1 s (the bound: at most 0), with its window.
fn worst_excess(
    admissions: &[(u64, u64)],
    held: &[(u64, u64)],
    envelope: &mut Envelope,
) -> (i64, u64, u64, u64, u64) {
    let times: Vec<u64> = admissions.iter().map(|a| a.0).collect();
    let mut sums = vec![0u64];
    for (_, cost) in admissions {
        sums.push(sums.last().unwrap() + cost);
    }
    let held_times: Vec<u64> = held.iter().map(|h| h.0).collect();
    let before = |of: &[u64], t: u64| of.partition_point(|&x| x < t);
    let (first, last) = (times[0], *times.last().unwrap());
    let mut worst = (i64::MIN, 0, 0, 0, 0);
    for w in [100, 1000] {
        for s in (first - first % 10..=last).step_by(10) {
            let admitted = sums[before(&times, s + w)] - sums[before(&times, s)];
            let calls = before(&held_times, s);
            let units = if calls > 0 { held[calls - 1].1 } else { 0 };
            let excess = admitted as i64 - envelope.most(s, w) as i64 - units as i64;
            if excess > worst.0 {
                worst = (excess, s, w, admitted, units);
            }
        }
    }
    worst
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_stay_within_the_bound() {
    let Some(server) = module_server() else {
        return;
    };
    let t0 = t0();
    for algorithm in Algorithm::ALL {
        let mut limit = Limit::new(algorithm, 40, "1s").unwrap();
        if algorithm.is_bucket() {
            limit = limit.burst(30).unwrap();
        }
        let limit = limit.batch("50ms").unwrap().batch_max(12).unwrap();
        let mut envelope = Envelope::new(&limit, t0);
        for seed in 0..2 {
            let (admissions, held, limiters) = run_clients(&server, &limit, seed, t0).await;
            let worst = worst_excess(&admissions, &held, &mut envelope);
            assert!(worst.0 <= 0, "{algorithm:?} seed {seed}: window {worst:?}");
            let local: u64 = limiters
                .iter()
                .map(|l| l.stats().get("local").copied().unwrap_or(0))
                .sum();
            assert!(local > 0, "{algorithm:?} seed {seed}: no local admission");
            for limiter in &limiters {
                limiter.close().await; // refunds what it holds
                let stats = limiter.stats();
                let n = |name: &str| stats.get(name).copied().unwrap_or(0);
                assert!(
                    limiter.held() == 0 && n("taken") >= n("refunded"),
                    "{stats:?}"
                );
            }
        }
    }
}

/// As in the Python and Node packages, the denial cache answers check and take only: a
/// check_all asks Redis even for a key whose refusal is cached, and its own refusals are not
/// kept (a later check of the key asks Redis too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_all_always_asks_redis_with_the_denial_cache() {
    let Some(server) = module_server() else {
        return;
    };
    let options = Options {
        denial_cache: 1000,
        ..Options::default()
    };
    let limiter = RateLimiter::new(manager(&server, false).await, options).unwrap();
    // Nothing refills it during the test.
    let two = Limit::new(Algorithm::SlidingLog, 2, "1h").unwrap();
    let at = base_ms();
    let commands = |l: &RateLimiter<_>| l.stats().get("commands").copied().unwrap_or(0);
    for n in 1..=4u64 {
        let d = limiter
            .check("dc:k", &two, Call::cost(1).at(at + n))
            .await
            .unwrap();
        let source = match n {
            1..=3 => Source::Module,
            _ => Source::Cache,
        };
        assert_eq!((d.allowed, d.source), (n <= 2, source), "check {n}: {d:?}");
    }
    let sent = commands(&limiter);
    let m = limiter
        .check_all(&[("dc:k", &two)], Call::cost(1).at(at + 5))
        .await
        .unwrap();
    assert!(!m.allowed && m.source == Source::Module, "{m:?}");
    assert_eq!(commands(&limiter), sent + 1);
    for n in 1..=3u64 {
        let m = limiter
            .check_all(&[("dc:j", &two)], Call::cost(1).at(at + n))
            .await
            .unwrap();
        assert_eq!((m.allowed, m.source), (n <= 2, Source::Module), "{m:?}");
    }
    let d = limiter
        .check("dc:j", &two, Call::cost(1).at(at + 4))
        .await
        .unwrap();
    assert!(!d.allowed && d.source == Source::Module, "{d:?}");
}
