//! The twin-key runs shared by tests/twins.rs and tests/cluster.rs.
#![allow(dead_code)]

use super::*;
use redis::Value;
use redis_ratelimit_client::{Algorithm, Call, Limit, Policy, RateLimiter, Source};

const ALGORITHMS: [Algorithm; 6] = Algorithm::ALL;

pub fn random_limit(rng: &mut Rng) -> Limit {
    let algorithm = ALGORITHMS[rng.below(6) as usize];
    let mut limit = Limit::new(algorithm, 1 + rng.below(6), 100 + rng.below(1900)).unwrap();
    if algorithm.is_bucket() && rng.below(2) == 0 {
        limit = limit.burst(1 + rng.below(8)).unwrap();
    }
    if rng.below(5) == 0 {
        limit = limit.block(50 + rng.below(500)).unwrap();
    }
    limit
}

/// The raw command for `verb` on `key` (the module's, or the library's FCALL on `fn:key`).
pub fn raw_words(library: bool, verb: &str, keys: &[&str], args: &[String]) -> Vec<String> {
    if library {
        let function = format!("ratelimit_{}", verb.to_lowercase());
        let mut words = vec![
            if verb == "PEEK" { "FCALL_RO" } else { "FCALL" }.to_string(),
            function,
            keys.len().to_string(),
        ];
        words.extend(keys.iter().map(|k| format!("fn:{k}")));
        words.extend(args.iter().cloned());
        words
    } else {
        let mut words = vec![format!("RATELIMIT.{verb}")];
        if verb == "CHECKALL" {
            words.push(keys.len().to_string());
        }
        words.extend(keys.iter().map(|k| k.to_string()));
        words.extend(args.iter().cloned());
        words
    }
}

fn multi_fields(value: &Value) -> Vec<[i64; 6]> {
    match value {
        Value::Array(items) => items.iter().map(|v| six(v, false)).collect(),
        Value::Map(pairs) => {
            let mut out = vec![six(value, false)];
            let limits = pairs
                .iter()
                .find(|(k, _)| {
                    matches!(k, Value::SimpleString(s) if s == "limits")
                        || matches!(k, Value::BulkString(b) if b == b"limits")
                })
                .map(|(_, v)| v)
                .expect("limits");
            let Value::Array(limits) = limits else {
                panic!("limits: {limits:?}")
            };
            out.extend(limits.iter().map(|v| six(v, false)));
            out
        }
        other => panic!("not a CHECKALL reply: {other:?}"),
    }
}

/// Random calls of every method through `limiter` on keys `a...`, raw on twins `b...`.
pub async fn run_twins<C: redis_ratelimit_client::Connection, R: redis::aio::ConnectionLike>(
    limiter: &RateLimiter<C>,
    raw_conn: &mut R,
    library: bool,
    tag: &str,
    seed: u64,
    steps: usize,
) {
    let source = if library {
        Source::Library
    } else {
        Source::Module
    };
    let mut rng = Rng::new(seed);
    let mut at = base_ms();
    for round in 0..steps / 20 {
        let limit = random_limit(&mut rng);
        let second = random_limit(&mut rng);
        let (a, b) = (format!("{{{tag}}}:a{round}"), format!("{{{tag}}}:b{round}"));
        let (a2, b2) = (
            format!("{{{tag}}}:a{round}x"),
            format!("{{{tag}}}:b{round}x"),
        );
        for step in 0..20 {
            at += rng.below(300);
            let cost = rng.below(4);
            let what = format!(
                "seed {seed} round {round} step {step} {:?} at {at} cost {cost}",
                limit.args()
            );
            let tail = |word: &str, n: u64| {
                vec![word.to_string(), n.to_string(), "AT".into(), at.to_string()]
            };
            let mut args = limit.args().to_vec();
            match rng.below(7) {
                0 | 1 => {
                    let d = limiter
                        .check(&a, &limit, Call::cost(cost).at(at))
                        .await
                        .unwrap();
                    args.extend(tail("COST", cost));
                    let r = raw(raw_conn, &raw_words(library, "CHECK", &[&b], &args))
                        .await
                        .unwrap();
                    assert_eq!(fields(&d, false), six(&r, false), "CHECK {what}");
                    assert_eq!(
                        (d.source, d.period_ms),
                        (source, limit.period_ms()),
                        "{what}"
                    );
                    assert_eq!(d.granted, if d.allowed { cost } else { 0 });
                }
                2 => {
                    let d = limiter
                        .peek(&a, &limit, Call::cost(cost).at(at))
                        .await
                        .unwrap();
                    args.extend(tail("COST", cost));
                    let r = raw(raw_conn, &raw_words(library, "PEEK", &[&b], &args))
                        .await
                        .unwrap();
                    assert_eq!(fields(&d, false), six(&r, false), "PEEK {what}");
                }
                3 => {
                    let most = 1 + rng.below(6);
                    let d = limiter
                        .take(&a, &limit, Call::cost(most).at(at))
                        .await
                        .unwrap();
                    args.extend(tail("MAX", most));
                    let r = raw(raw_conn, &raw_words(library, "TAKE", &[&b], &args))
                        .await
                        .unwrap();
                    assert_eq!(fields(&d, true), six(&r, true), "TAKE {what}");
                    assert_eq!(d.allowed, d.granted > 0);
                }
                4 => {
                    let d = limiter
                        .refund(&a, &limit, Call::cost(cost).at(at))
                        .await
                        .unwrap();
                    args.extend(tail("COST", cost));
                    let r = raw(raw_conn, &raw_words(library, "REFUND", &[&b], &args))
                        .await
                        .unwrap();
                    assert_eq!(fields(&d, false), six(&r, false), "REFUND {what}");
                }
                5 => {
                    let pairs = [(a.as_str(), limit.clone()), (a2.as_str(), second.clone())];
                    let d = limiter
                        .check_all(&pairs, Call::cost(cost).at(at))
                        .await
                        .unwrap();
                    let mut args = limit.args().to_vec();
                    args.extend(second.args().iter().cloned());
                    args.extend(tail("COST", cost));
                    let r = raw(raw_conn, &raw_words(library, "CHECKALL", &[&b, &b2], &args))
                        .await
                        .unwrap();
                    let mut got = vec![fields(&d.overall, false)];
                    got.extend(d.limits.iter().map(|l| fields(l, false)));
                    assert_eq!(got, multi_fields(&r), "CHECKALL {what}");
                    assert_eq!(d.limits[1].period_ms, second.period_ms());
                }
                _ => {
                    if rng.below(4) == 0 {
                        let n = limiter.reset(&[&a, &a2]).await.unwrap();
                        let r = raw(raw_conn, &raw_words(library, "RESET", &[&b, &b2], &[]))
                            .await
                            .unwrap();
                        assert_eq!(Value::Int(n as i64), r, "RESET {what}");
                    }
                }
            }
        }
    }
}

/// Leases, and the errors of a caller's mistake, on one key and its twin.
pub async fn leases_and_errors<
    C: redis_ratelimit_client::Connection,
    R: redis::aio::ConnectionLike,
>(
    limiter: &RateLimiter<C>,
    raw_conn: &mut R,
    library: bool,
) {
    let at_args = |id: &str| words(&format!("2 10s ID {id} COST 1"));
    for id in ["x", "y", "z"] {
        let d = limiter.acquire("lease:a", 2, "10s", id, 1).await.unwrap();
        let r = raw(
            raw_conn,
            &raw_words(library, "ACQUIRE", &["lease:b"], &at_args(id)),
        )
        .await
        .unwrap();
        assert_eq!(fields(&d, false)[..3], six(&r, false)[..3], "ACQUIRE {id}");
        assert_eq!(d.period_ms, 10_000);
    }
    assert!(limiter.release("lease:a", "x").await.unwrap());
    assert!(!limiter.release("lease:a", "x").await.unwrap());
    let r = raw(
        raw_conn,
        &raw_words(library, "RELEASE", &["lease:b"], &words("ID x")),
    )
    .await
    .unwrap();
    assert_eq!(r, Value::Int(1));
    // The lease guard: refused while the limit is full, released on drop (by a task).
    let refused = limiter.lease("lease:a", 2, "10s", 1).await;
    assert!(
        refused.is_ok(),
        "one lease left: {refused:?}",
        refused = refused.as_ref().err()
    );
    let second = limiter.lease("lease:a", 2, "10s", 1).await;
    assert!(
        matches!(second, Err(redis_ratelimit_client::Error::RateLimited(_))),
        "full"
    );
    drop(refused);
    let mut released = false;
    for _ in 0..200 {
        if limiter.lease("lease:a", 2, "10s", 1).await.is_ok() {
            released = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(released, "the dropped lease was released by its task");

    // A key of another type: the server's error, named as Redis names it.
    let _: () = redis::cmd("SET")
        .arg(if library { "fn:str" } else { "str" })
        .arg("x")
        .query_async(raw_conn)
        .await
        .unwrap();
    let limit = Limit::new(Algorithm::FixedWindow, 3, "1s").unwrap();
    let error = limiter.check("str", &limit, 1).await.unwrap_err();
    assert!(
        matches!(&error, redis_ratelimit_client::Error::Server(t) if t.contains("WRONGTYPE")),
        "{error}"
    );
    // The caller's mistakes, before anything is sent.
    let error = limiter.check("", &limit, 1).await.unwrap_err();
    assert!(error.to_string().starts_with("key:"), "{error}");
    let error = limiter.take("k", &limit, 0).await.unwrap_err();
    assert!(error.to_string().starts_with("max:"), "{error}");
    let error = limiter
        .check("k", &limit, 2_000_000_000_000)
        .await
        .unwrap_err();
    assert!(error.to_string().starts_with("cost:"), "{error}");
    assert!(Limit::new(Algorithm::FixedWindow, 0, "1s")
        .unwrap_err()
        .to_string()
        .starts_with("limit:"));
    assert!(Limit::new(Algorithm::FixedWindow, 1, "1y")
        .unwrap_err()
        .to_string()
        .starts_with("period:"));
    assert!(Limit::new(Algorithm::FixedWindow, 1, "1s")
        .unwrap()
        .burst(2)
        .unwrap_err()
        .to_string()
        .starts_with("burst:"));
    assert!(Policy::new("a:b")
        .unwrap_err()
        .to_string()
        .starts_with("name:"));
}
