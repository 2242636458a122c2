//! `RATELIMIT.REFUND` through a real server: the worked examples of docs/algorithms.md
//! ("Refunds"), random sequences against a model of the refund written here from that page's
//! definitions (independent of the module's own arithmetic), the inverse of an admitted CHECK,
//! replication, persistence, and what changes nothing.

use crate::common;

use std::collections::BTreeMap;

use common::rng::{seed_from_env, Rng};
use common::{
    assert_replica_matches, decision, exists, future_base_ms, limiter_info, master_and_replica,
    pexpiretime, run_error, send, Limit, Server,
};
use redis::Cmd;
use redis_ratelimit_core::algorithms::{
    self, Algorithm, Limiter, Params, Request, SlidingLog, State, Write,
};

/// A REFUND command of `limit` on `key`.
fn refund_cmd(limit: &Limit, key: &str, cost: u64, at_ms: u64) -> Cmd {
    limit.command("RATELIMIT.REFUND", key, cost, Some(at_ms))
}

#[test]
fn the_worked_examples_of_the_algorithms_page_hold() {
    let server = Server::start();
    let mut con = server.client();
    // A base a whole number of days ahead: every period of the tables divides a day.
    let base = future_base_ms();
    // The "Refunds" table: each group of rows is one key, each row a call.
    let rows = common::worked_examples("Refunds");
    assert!(rows.len() >= 15, "{} rows", rows.len());
    for row in rows {
        let (limit, at, expected) = (row.limit, row.at, row.reply);
        let (call, cost) = row.call.split_once(" COST ").expect("a call with COST");
        let cost: u64 = cost.parse().expect("cost");
        let key = format!("doc:{limit}");
        let mut cmd = redis::cmd(&format!("RATELIMIT.{call}"));
        cmd.arg(&key)
            .arg(limit.split(' ').collect::<Vec<_>>())
            .arg("COST")
            .arg(cost)
            .arg("AT")
            .arg(base + at);
        let reply = decision(&mut con, &cmd);
        assert_eq!(reply, expected, "{limit}: {call} COST {cost} AT {at}");
        // A reply with nothing left to refill or slide is a deleted key.
        if call == "REFUND" && expected[4] == 0 {
            assert!(!exists(&mut con, &key), "{limit}: fresh after the refund");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The model: the refund as docs/algorithms.md defines it, on the model's stored limiter.

/// The state `limiter` holds at `t_ms` under its own parameters (docs/algorithms.md, "One call,
/// step by step", step 2), written out here rather than taken from the cores.
fn advanced(limiter: &Limiter, t_ms: u64) -> State {
    let p = &limiter.params;
    let elapsed = u128::from(t_ms - limiter.last_ms);
    let window = |t: u64| t - t % p.period_ms;
    match &limiter.state {
        State::TokenBucket { tokens_scaled } => State::TokenBucket {
            tokens_scaled: (tokens_scaled + elapsed * u128::from(p.limit)).min(p.capacity_scaled()),
        },
        State::LeakyBucket { level_scaled } => State::LeakyBucket {
            level_scaled: level_scaled.saturating_sub(elapsed * u128::from(p.limit)),
        },
        State::Gcra { ahead_scaled } => State::Gcra {
            ahead_scaled: ahead_scaled.saturating_sub(elapsed * u128::from(p.limit)),
        },
        State::FixedWindow {
            window_start_ms,
            count,
        } => State::FixedWindow {
            window_start_ms: window(t_ms),
            count: if *window_start_ms == window(t_ms) {
                *count
            } else {
                0
            },
        },
        State::SlidingWindow {
            window_start_ms,
            current,
            previous,
        } => {
            let now = window(t_ms);
            let (current, previous) = if *window_start_ms == now {
                (*current, *previous)
            } else if *window_start_ms + p.period_ms == now {
                (0, *current)
            } else {
                (0, 0)
            };
            State::SlidingWindow {
                window_start_ms: now,
                current,
                previous,
            }
        }
        State::SlidingLog(log) => {
            let live: Vec<(u64, u64)> = log
                .runs()
                .filter(|(ts, _)| ts + p.period_ms > t_ms)
                .collect();
            State::SlidingLog(SlidingLog::from_runs(live).unwrap_or_default())
        }
        State::Concurrency(_) => unreachable!("REFUND refuses a concurrency key"),
    }
}

/// Whether `state` is that of a fresh key under `params`.
fn fresh(state: &State, params: &Params) -> bool {
    match state {
        State::TokenBucket { tokens_scaled } => *tokens_scaled >= params.capacity_scaled(),
        State::LeakyBucket { level_scaled } => *level_scaled == 0,
        State::Gcra { ahead_scaled } => *ahead_scaled == 0,
        State::FixedWindow { count, .. } => *count == 0,
        State::SlidingWindow {
            current, previous, ..
        } => *current == 0 && *previous == 0,
        State::SlidingLog(log) => log.is_empty(),
        State::Concurrency(leases) => leases.is_empty(),
    }
}

/// The refund of `cost` on `state` (docs/algorithms.md, "Refunds", the table).
fn refunded(state: &State, params: &Params, cost: u64) -> State {
    let units = u128::from(cost) * u128::from(params.period_ms);
    match state.clone() {
        State::TokenBucket { tokens_scaled } => State::TokenBucket {
            tokens_scaled: (tokens_scaled + units).min(params.capacity_scaled()),
        },
        State::LeakyBucket { level_scaled } => State::LeakyBucket {
            level_scaled: level_scaled.saturating_sub(units),
        },
        State::Gcra { ahead_scaled } => State::Gcra {
            ahead_scaled: ahead_scaled.saturating_sub(units),
        },
        State::FixedWindow {
            window_start_ms,
            count,
        } => State::FixedWindow {
            window_start_ms,
            count: count.saturating_sub(cost),
        },
        State::SlidingWindow {
            window_start_ms,
            current,
            previous,
        } => State::SlidingWindow {
            window_start_ms,
            current: current.saturating_sub(cost),
            previous,
        },
        State::SlidingLog(log) => {
            let mut runs: Vec<(u64, u64)> = log.runs().collect();
            let mut left = cost;
            while left > 0 {
                let Some(last) = runs.last_mut() else { break };
                let take = last.1.min(left);
                last.1 -= take;
                left -= take;
                if last.1 == 0 {
                    runs.pop();
                }
            }
            State::SlidingLog(SlidingLog::from_runs(runs).unwrap_or_default())
        }
        State::Concurrency(_) => unreachable!("REFUND refuses a concurrency key"),
    }
}

/// What the server must answer for a REFUND on `stored` (updating it): the COST 0 PEEK of the
/// call's parameters right after.
fn model_refund(stored: &mut Option<Limiter>, request: &Request) -> [i64; 6] {
    let Some(limiter) = stored.clone() else {
        return peek(
            stored,
            &Request {
                cost: 0,
                ..*request
            },
        );
    };
    let t_ms = request.now_ms.max(limiter.last_ms);
    let state = advanced(&limiter, t_ms);
    let params = limiter.params;
    if !fresh(&state, &params) {
        let after = refunded(&state, &params, request.cost);
        if fresh(&after, &params) {
            *stored = None;
        } else if after != state {
            *stored = Some(Limiter {
                params,
                last_ms: t_ms,
                state: after,
                blocked_until_ms: 0,
            });
        }
    }
    peek(
        stored,
        &Request {
            cost: 0,
            now_ms: t_ms,
            ..*request
        },
    )
}

/// A COST 0 PEEK through the cores, on a copy.
fn peek(stored: &Option<Limiter>, request: &Request) -> [i64; 6] {
    let mut copy = stored.clone();
    let (outcome, write) =
        algorithms::check(copy.as_mut(), request, false, &mut None).expect("same algorithm");
    assert!(matches!(write, Write::Nothing));
    outcome.decision.to_array()
}

/// A limit as the commands name it, and as the cores take it.
#[derive(Clone, Debug)]
struct Lim {
    limit: Limit,
    algorithm: Algorithm,
    params: Params,
}

impl Lim {
    fn request(&self, cost: u64, now_ms: u64) -> Request {
        Request {
            algorithm: self.algorithm,
            params: self.params,
            cost,
            now_ms,
        }
    }
}

/// A random limit of `algorithm` (small, so that refunds and limits meet often).
fn random_limit(rng: &mut Rng, algorithm: Algorithm) -> Lim {
    let limit = rng.range(1, 12);
    let period_ms = [250, 1_000, 2_000, 60_000][rng.index(4)];
    let burst = algorithm
        .is_bucket()
        .then(|| rng.range(1, 16))
        .filter(|_| rng.chance(70));
    Lim {
        limit: Limit::new(algorithm.name(), limit, &format!("{period_ms}ms"), burst),
        algorithm,
        params: Params::new(limit, period_ms, burst).unwrap(),
    }
}

/// A CHECK through the cores, storing what it creates.
fn model_check(stored: &mut Option<Limiter>, request: &Request) -> [i64; 6] {
    let mut created = None;
    let (outcome, _) =
        algorithms::check(stored.as_mut(), request, true, &mut created).expect("same algorithm");
    if let Some(limiter) = created {
        *stored = Some(limiter);
    }
    outcome.decision.to_array()
}

#[test]
fn random_refunds_answer_as_the_documented_model() {
    let seed = seed_from_env("RATELIMIT_REFUND_SEED", || 0x2e7f);
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    let mut rng = Rng::new(seed);
    for (n, algorithm) in Algorithm::ALL.into_iter().enumerate() {
        for sequence in 0..12 {
            let key = format!("r:{n}:{sequence}");
            let mut limit = random_limit(&mut rng, algorithm);
            let mut at = base + rng.below(10_000);
            let mut stored: Option<Limiter> = None;
            for step in 0..60 {
                // Time moves on, now and then backwards; the limit changes now and then.
                at = (at + rng.log_uniform(1, 3_000)).saturating_sub(if rng.chance(10) {
                    rng.below(2_000)
                } else {
                    0
                });
                if rng.chance(8) {
                    limit = random_limit(&mut rng, algorithm);
                }
                let capacity = limit.limit.capacity();
                let cost = match rng.below(10) {
                    0 => 0,
                    1 => capacity + 1,
                    _ => rng.range(1, capacity),
                };
                let request = limit.request(cost, at);
                let what = format!(
                    "seed {seed:#x} {key} step {step}: {:?} COST {cost} AT {at}",
                    limit.limit
                );
                if rng.chance(40) {
                    let reply = decision(&mut con, &refund_cmd(&limit.limit, &key, cost, at));
                    let expected = model_refund(&mut stored, &request);
                    assert_eq!(reply, expected, "REFUND {what}");
                } else {
                    let reply = decision(&mut con, &limit.limit.check(&key, cost, Some(at)));
                    let expected = model_check(&mut stored, &request);
                    assert_eq!(reply, expected, "CHECK {what}");
                }
                assert_eq!(exists(&mut con, &key), stored.is_some(), "EXISTS {what}");
                if let Some(limiter) = &stored {
                    assert_eq!(
                        pexpiretime(&mut con, &key),
                        limiter.expires_at_ms() as i64,
                        "PEXPIRETIME {what}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_refund_of_an_admitted_check_answers_as_before_it() {
    let seed = seed_from_env("RATELIMIT_REFUND_SEED", || 0x51de);
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    let mut rng = Rng::new(seed);
    for (n, algorithm) in Algorithm::ALL.into_iter().enumerate() {
        for sequence in 0..30 {
            let key = format!("inv:{n}:{sequence}");
            let limit = random_limit(&mut rng, algorithm).limit;
            let mut at = base + rng.below(5_000);
            for _ in 0..rng.range(0, 6) {
                at += rng.below(800);
                send(&mut con, &[limit.check(&key, rng.range(1, 3), Some(at))]);
            }
            at += rng.below(800);
            let probes: Vec<Cmd> = [0, 1, 2, limit.capacity(), limit.capacity() + 1]
                .into_iter()
                .map(|cost| limit.peek(&key, cost, Some(at)))
                .collect();
            let before: Vec<_> = send(&mut con, &probes);
            let existed = exists(&mut con, &key);
            let fresh_before = decision(&mut con, &limit.peek(&key, 0, Some(at)))[4] == 0;
            let cost = rng.range(1, limit.capacity());
            let reply = decision(&mut con, &limit.check(&key, cost, Some(at)));
            if reply[0] == 0 {
                continue;
            }
            decision(&mut con, &refund_cmd(&limit, &key, cost, at));
            assert_eq!(
                send(&mut con, &probes),
                before,
                "{key} {limit:?} COST {cost} AT {at}"
            );
            if !existed || fresh_before {
                assert!(!exists(&mut con, &key), "{key}: absent again");
            }
        }
    }
}

#[test]
fn refunds_reach_replicas_and_survive_restarts_exactly() {
    let (master, replica) = master_and_replica();
    let mut con = master.client();
    let base = future_base_ms();
    let mut keys = Vec::new();
    for algorithm in Algorithm::ALL {
        for (i, cost) in [2u64, 5, 50].into_iter().enumerate() {
            let key = format!("rep:{}:{i}", algorithm.name());
            let limit = Limit::new(
                algorithm.name(),
                5,
                "1m",
                algorithm.is_bucket().then_some(8),
            );
            send(
                &mut con,
                &[
                    limit.check(&key, 3, Some(base)),
                    limit.check(&key, 2, Some(base + 10)),
                    refund_cmd(&limit, &key, cost, base + 20),
                ],
            );
            keys.push(key);
        }
    }
    assert_replica_matches(&master, &replica, &keys);
    let before: BTreeMap<String, _> = keys
        .iter()
        .map(|key| (key.clone(), limiter_info(&mut con, key)))
        .collect();
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).unwrap();
    for key in &keys {
        assert_eq!(
            limiter_info(&mut con, key),
            before[key],
            "{key} after DEBUG RELOAD"
        );
    }
}

#[test]
fn refunds_replay_from_the_aof() {
    let mut server = Server::builder()
        .config(&[("appendonly", "yes"), ("appendfsync", "always")])
        .start();
    let mut con = server.client();
    let base = future_base_ms();
    let log = Limit::new("sliding-log", 5, "1m", None);
    let bucket = Limit::new("token-bucket", 5, "1m", None);
    send(
        &mut con,
        &[
            log.check("log", 3, Some(base)),
            log.check("log", 1, Some(base + 5)),
            refund_cmd(&log, "log", 2, base + 9),
            bucket.check("tb", 4, Some(base)),
            refund_cmd(&bucket, "tb", 1, base + 1),
            bucket.check("gone", 1, Some(base)),
            refund_cmd(&bucket, "gone", 1, base),
        ],
    );
    let before = [limiter_info(&mut con, "log"), limiter_info(&mut con, "tb")];
    assert!(before.iter().all(Option::is_some));
    drop(con);
    server.kill9();
    server.start_again();
    let mut con = server.client();
    assert_eq!(
        [limiter_info(&mut con, "log"), limiter_info(&mut con, "tb")],
        before
    );
    assert!(
        !exists(&mut con, "gone"),
        "the refund that emptied it replays as DEL"
    );
}

#[test]
fn refund_errors_are_named_and_change_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    decision(
        &mut con,
        &Limit::new("fixed-window", 3, "1m", None).check("fw", 1, Some(base)),
    );
    redis::cmd("SET")
        .arg("str")
        .arg("v")
        .exec(&mut con)
        .unwrap();
    let before = limiter_info(&mut con, "fw");
    for (line, expected) in [
        (
            "RATELIMIT.REFUND fw fixed-window 3 1m",
            "ERR RATELIMIT.REFUND needs COST: how much to give back",
        ),
        (
            "RATELIMIT.REFUND fw fixed-window 3 1m AT 5",
            "ERR RATELIMIT.REFUND needs COST: how much to give back",
        ),
        (
            "RATELIMIT.REFUND fw token-bucket 3 1m COST 1",
            "ERR key holds a fixed-window limiter, not token-bucket: RATELIMIT.RESET it to change algorithm",
        ),
        (
            "RATELIMIT.REFUND str fixed-window 3 1m COST 1",
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ),
        (
            "RATELIMIT.REFUND fw fixed-window 3 1m COST -1",
            "ERR COST must be an integer from 0 to 1000000000000",
        ),
        (
            "RATELIMIT.REFUND fw POLICY nothere COST 1",
            "ERR no such policy 'nothere'",
        ),
        (
            "RATELIMIT.REFUND fw",
            "ERR wrong number of arguments for 'ratelimit.refund' command",
        ),
    ] {
        assert_eq!(run_error(&mut con, line), expected, "{line}");
    }
    assert_eq!(limiter_info(&mut con, "fw"), before);
    // Through a policy: the policy's limit.
    redis::cmd("RATELIMIT.POLICY")
        .arg(&["SET", "p", "fixed-window", "3", "1m"])
        .exec(&mut con)
        .unwrap();
    let mut cmd = redis::cmd("RATELIMIT.REFUND");
    cmd.arg(&["fw", "POLICY", "p", "COST", "1", "AT"]).arg(base);
    assert_eq!(decision(&mut con, &cmd), [1, 3, 3, 0, 0, 0]);
    assert!(!exists(&mut con, "fw"));
}
