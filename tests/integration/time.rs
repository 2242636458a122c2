//! Time: `AT` going backwards, far into the past or into the future never admits more than the
//! limit, and the server's replies are the pure cores' for any sequence of times and costs; the
//! largest accepted parameters compute exactly, and a bucket refilling for longer than u64 ms is
//! not forgotten.
//!
//! `HARDENING_SEED=<n>` (decimal or 0x hex) replays a randomized run; the seed is printed.

use crate::common;

use common::model::Model;
use common::rng::{seed_from_env, Rng};
use common::{
    dbsize, decision, digest, error_text, future_base_ms, now_ms, pexpiretime, reply6, send,
    send_one, Limit, Server, DEFAULT_MAX_LOG_LIMIT, MAX_AMOUNT, MAX_PERIOD_MS, TIME_LIMIT_MS,
};
use redis::Connection;
use redis_ratelimit_core::algorithms::{Algorithm, Params, Request};

/// How many of 8 CHECKs of cost 1 `AT at` are admitted.
fn admitted(con: &mut Connection, limit: &Limit, key: &str, at: u64) -> usize {
    (0..8)
        .map(|_| decision(con, &limit.check(key, 1, Some(at))))
        .filter(|reply| reply[0] == 1)
        .count()
}

#[test]
fn time_going_backwards_or_far_away_never_admits_more_than_the_limit() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    let far_future = TIME_LIMIT_MS - 1;
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        let limit = Limit::new(algorithm, 5, "1s", Some(5));
        let key = format!("time:{algorithm}");
        let t0 = base + 500;
        assert_eq!(admitted(&mut con, &limit, &key, t0), 5, "{algorithm}");
        let rejected_at_t0 = decision(&mut con, &limit.check(&key, 1, Some(t0)));
        assert_eq!(rejected_at_t0[0], 0);
        // Earlier times are evaluated at the key's last time: the very same rejection.
        for at in [t0 - 1, t0 - 499, base - 1_000_000_000, 1_000, 1, 0] {
            let reply = decision(&mut con, &limit.check(&key, 1, Some(at)));
            assert_eq!(reply, rejected_at_t0, "{algorithm} AT {at} after AT {t0}");
            let peek = decision(&mut con, &limit.peek(&key, 1, Some(at)));
            assert_eq!(peek, rejected_at_t0, "{algorithm} PEEK AT {at}");
        }
        // The farthest future accepted: a fresh limiter's worth, and not a unit more.
        assert_eq!(
            admitted(&mut con, &limit, &key, far_future),
            5,
            "{algorithm} at the farthest future"
        );
        let rejected_far = decision(&mut con, &limit.check(&key, 1, Some(far_future)));
        assert_eq!(rejected_far[0], 0);
        // Back from the far future to now: still evaluated there, still rejected.
        for at in [base, 0] {
            let reply = decision(&mut con, &limit.check(&key, 1, Some(at)));
            assert_eq!(
                reply, rejected_far,
                "{algorithm} AT {at} after the far future"
            );
        }
        // Its expiry is computed without wrapping: t + reset_after_ms exactly.
        assert_eq!(
            pexpiretime(&mut con, &key),
            (far_future + rejected_far[4] as u64) as i64,
            "{algorithm}"
        );
        // One past the largest time is refused and changes nothing.
        let before = digest(&mut con, &key);
        let reply = send_one(&mut con, &limit.check(&key, 1, Some(TIME_LIMIT_MS)));
        assert!(
            error_text(&reply).is_some_and(|e| e.contains("AT")),
            "{reply:?}"
        );
        assert_eq!(digest(&mut con, &key), before);
    }
}

/// The request the server makes of the pure core for a CHECK of `limit` (its period in ms).
fn request(limit: &Limit, cost: u64, at: u64) -> Request {
    let algorithm = Algorithm::parse(limit.algorithm.as_bytes()).expect("an algorithm");
    let period_ms: u64 = limit.period.trim_end_matches("ms").parse().expect("ms");
    Request {
        algorithm,
        params: Params::new(limit.limit, period_ms, limit.burst).expect("valid"),
        cost,
        now_ms: at,
    }
}

#[test]
fn random_times_and_costs_match_the_cores_and_never_over_admit() {
    // Every call's reply is the one the pure core gives for the same sequence (so the server's
    // time handling adds nothing of its own: a call is evaluated at `max(call, last)`, `last` being
    // the last admission's time), admissions never go back in time, and no more than the
    // capacity is admitted at one time (a window's new period starts it afresh).
    let server = Server::start();
    let mut con = server.client();
    let mut rng = Rng::new(seed_from_env("HARDENING_SEED", now_ms));
    let base = future_base_ms();
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        let limits = [
            Limit::new(algorithm, 4, "1000ms", Some(6)),
            Limit::new(algorithm, 4, "1000ms", Some(3)),
            Limit::new(algorithm, 9, "250ms", Some(9)),
        ];
        let key = format!("walk:{algorithm}");
        // The in-process model of the key: the crate's pure cores, driven as the server drives
        // them.
        let mut model = Model::default();
        // The time of the last admission, what was admitted at it and the most that may be.
        let mut admitted_t = 0;
        let mut admitted_at_t = 0u64;
        let mut bound = 0u64;
        let mut period = limits[0].period.clone();
        let mut cmds = Vec::new();
        let mut expected = Vec::new();
        for step in 0..400 {
            let limit = if step % 50 < 40 {
                &limits[0]
            } else {
                rng.pick_ref(&limits[1..])
            };
            let latest = model.limiter(&key).map_or(base, |m| m.last_ms);
            let at = if step == 0 {
                base
            } else {
                match rng.below(10) {
                    0 => rng.below(2_000_000),                             // far past
                    1 => TIME_LIMIT_MS - 1 - rng.below(1_000),             // far future
                    2 | 3 => latest.saturating_sub(rng.below(3_000)),      // backwards
                    _ => (latest + rng.below(400)).min(TIME_LIMIT_MS - 1), // forwards
                }
            };
            let cost = rng.pick(&[0, 1, 1, 1, 2, 3, 7]);
            // A key written at a time long past has expired in the server (by its clock): the
            // next call starts a fresh limiter (docs/algorithms.md: "a key written at a time long
            // past expires at once"), so the count of admissions starts again too.
            if model
                .limiter(&key)
                .is_some_and(|m| m.expires_at_ms() <= now_ms())
            {
                model.forget(&key);
                admitted_t = 0;
            }
            let outcome = model.outcome(&key, &request(limit, cost, at));
            let (reply, t) = (outcome.decision.to_array(), outcome.t_ms);
            assert!(t >= at, "{algorithm}: AT {at} evaluated at {t}");
            // A window's new period starts it afresh; otherwise only a later time refills.
            let window_restarts = algorithm.ends_with("window") && limit.period != period;
            if reply[0] == 1 && cost > 0 {
                assert!(
                    t >= admitted_t,
                    "{algorithm}: admitted at {t} after admitting at {admitted_t}"
                );
                if t > admitted_t || window_restarts {
                    admitted_t = t;
                    admitted_at_t = 0;
                    bound = 0;
                }
                period = limit.period.clone();
                bound = bound.max(limit.capacity());
                admitted_at_t += cost;
                assert!(
                    admitted_at_t <= bound,
                    "{algorithm}: {admitted_at_t} admitted at {t}, above {bound}"
                );
            }
            cmds.push(limit.check(&key, cost, Some(at)));
            expected.push((at, cost, reply));
        }
        let replies = send(&mut con, &cmds);
        for (value, (at, cost, want)) in replies.iter().zip(&expected) {
            assert_eq!(reply6(value), *want, "{algorithm} AT {at} COST {cost}");
        }
        let model = model.limiter(&key).expect("something was admitted");
        let expires = pexpiretime(&mut con, &key);
        assert_eq!(expires, model.expires_at_ms() as i64, "{algorithm}: expiry");
    }
}

#[test]
fn largest_accepted_values_compute_exactly() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    let p = MAX_PERIOD_MS as u128;
    let c = MAX_AMOUNT as u128;
    let big = |v: u128| i64::try_from(v).expect("fits a reply");
    // Near today, 400·10^9 ms below the largest time, and the largest time itself.
    for t in [base, TIME_LIMIT_MS - 1 - 400_000_000_000, TIME_LIMIT_MS - 1] {
        let w = (t as u128) - (t as u128) % p;
        let t128 = t as u128;
        // Buckets: limit, capacity and cost all 10^12, the longest period.
        for algorithm in ["token-bucket", "leaky-bucket"] {
            let limit = Limit::new(algorithm, MAX_AMOUNT, "3650d", Some(MAX_AMOUNT));
            let key = format!("max:{algorithm}:{t}");
            // Empty (or full) after one call: refills (drains) in C·P / L = P ms. PEEK answers
            // what that CHECK answers.
            let peek = decision(&mut con, &limit.peek(&key, MAX_AMOUNT, Some(t)));
            assert_eq!(
                peek,
                [1, big(c), 0, 0, big(p), 0],
                "{algorithm} PEEK AT {t}"
            );
            let first = decision(&mut con, &limit.check(&key, MAX_AMOUNT, Some(t)));
            assert_eq!(first, [1, big(c), 0, 0, big(p), 0], "{algorithm} AT {t}");
            assert_eq!(pexpiretime(&mut con, &key), big(t128 + p));
            let second = decision(&mut con, &limit.check(&key, 1, Some(t)));
            // One unit is P scaled: back in ⌈P / L⌉ = 1 ms.
            assert_eq!(second, [0, big(c), 0, 1, big(p), 0], "{algorithm} AT {t}");
            if t + 1 < TIME_LIMIT_MS {
                // 1 ms later L = 10^12 scaled units flowed: ⌊L / P⌋ = 3 requests' worth.
                let later = decision(&mut con, &limit.check(&key, 3, Some(t + 1)));
                let expected = if algorithm == "token-bucket" {
                    let tokens = c - 3 * p;
                    [
                        1,
                        big(c),
                        big(tokens / p),
                        0,
                        big((c * p - tokens).div_ceil(c)),
                        0,
                    ]
                } else {
                    // Queued before this request: C·P − L, which drains in P − 1 ms.
                    let level = c * p - c + 3 * p;
                    let delay = (c * p - c).div_ceil(c);
                    [
                        1,
                        big(c),
                        big((c * p - level) / p),
                        0,
                        big(level.div_ceil(c)),
                        big(delay),
                    ]
                };
                assert_eq!(later, expected, "{algorithm} AT {}", t + 1);
            }
        }
        // Fixed window: the whole 10^12 in one call, then nothing until the window ends.
        let limit = Limit::new("fixed-window", MAX_AMOUNT, "3650d", None);
        let key = format!("max:fixed:{t}");
        let end = big(w + p - t128);
        assert_eq!(
            decision(&mut con, &limit.check(&key, MAX_AMOUNT, Some(t))),
            [1, big(c), 0, 0, end, 0]
        );
        assert_eq!(
            decision(&mut con, &limit.check(&key, 1, Some(t))),
            [0, big(c), 0, end, end, 0]
        );
        assert_eq!(pexpiretime(&mut con, &key), big(w + p));
        // Sliding window: full now; the next unit fits 1 ms into the next window, where the
        // previous count weighs (P − 1)/P of 10^12.
        let limit = Limit::new("sliding-window", MAX_AMOUNT, "3650d", None);
        let key = format!("max:sliding:{t}");
        let reset = big(w + 2 * p - t128);
        assert_eq!(
            decision(&mut con, &limit.check(&key, MAX_AMOUNT, Some(t))),
            [1, big(c), 0, 0, reset, 0]
        );
        assert_eq!(
            decision(&mut con, &limit.check(&key, 1, Some(t))),
            [0, big(c), 0, big(w + p - t128 + 1), reset, 0]
        );
        assert_eq!(pexpiretime(&mut con, &key), big(w + 2 * p));
        // Sliding log: the largest log the default max-log-limit allows, at one ms.
        let n = DEFAULT_MAX_LOG_LIMIT;
        let limit = Limit::new("sliding-log", n, "3650d", None);
        let key = format!("max:log:{t}");
        assert_eq!(
            decision(&mut con, &limit.check(&key, n, Some(t))),
            [1, n as i64, 0, 0, big(p), 0]
        );
        assert_eq!(
            decision(&mut con, &limit.check(&key, 1, Some(t))),
            [0, n as i64, 0, big(p), big(p), 0]
        );
        assert_eq!(pexpiretime(&mut con, &key), big(t128 + p));
    }
    // One past each bound is refused, and creates nothing.
    let before = dbsize(&mut con);
    let too_big = [
        vec!["token-bucket", "1000000000001", "1s"],
        vec!["token-bucket", "1", "3651d"],
        vec!["token-bucket", "1", "315360000001"],
        vec!["token-bucket", "1", "1s", "BURST", "1000000000001"],
        vec!["token-bucket", "1", "1s", "COST", "1000000000001"],
        vec!["fixed-window", "1", "1s", "AT", "9007199254740992"],
        vec!["sliding-log", "100001", "1s"],
        vec!["fixed-window", "18446744073709551616", "1s"],
    ];
    for args in too_big {
        let reply = send_one(
            &mut con,
            redis::cmd("RATELIMIT.CHECK").arg("max:refused").arg(&args),
        );
        assert!(error_text(&reply).is_some(), "{args:?}: {reply:?}");
    }
    assert_eq!(dbsize(&mut con), before);
}

#[test]
fn a_bucket_that_refills_for_longer_than_u64_ms_is_not_forgotten() {
    let server = Server::start();
    let mut con = server.client();
    for algorithm in ["token-bucket", "leaky-bucket"] {
        let limit = Limit::new(algorithm, 1, "3650d", Some(100_000_000));
        let key = format!("overflow:{algorithm}");
        // Without AT, so the key's expiry is judged against the server's clock.
        let first = decision(&mut con, &limit.check(&key, 100_000_000, None));
        assert_eq!(first[0], 1);
        assert!(
            pexpiretime(&mut con, &key) > now_ms() as i64,
            "{algorithm}: the key expires at once"
        );
        let second = decision(&mut con, &limit.check(&key, 100_000_000, None));
        assert_eq!(
            second[0], 0,
            "{algorithm}: a second full bucket was admitted"
        );
    }
}
