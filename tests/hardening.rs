//! A rate limiter is a security control: these tests attack it through a real server.
//!
//! - Contention: many connections, MULTI/EXEC and Lua scripts hammering one key at one instant admit
//!   exactly the limit (the capacity for buckets), and replicas end up bit-identical.
//! - Time: `AT` going backwards, far into the past or the future never admits more than the limit;
//!   the largest accepted parameters compute exactly.
//! - Hostile input: thousands of random argument vectors (huge and negative numbers, NUL bytes,
//!   non-UTF-8, duplicated options, wrong arity) get an error or a valid reply, never a crash, and
//!   no error creates a key; a RESTORE of a corrupt limiter with a valid checksum is refused.
//! - Memory: `ratelimit.max-log-limit` bounds a sliding log (a client's, not the master's stream or
//!   an AOF replay), a full log stays under 4 bytes per entry, `maxmemory` with `noeviction` answers OOM without breaking anything, eviction policies
//!   do evict limiters (an evicted one is fresh), and a million expiring keys give their memory
//!   back.
//!
//! Three tests here first reproduced bugs, since fixed: a bucket expiry wrapping past u64, and
//! RATELIMIT.APPLY accepting a sliding-log append beyond `max-log-limit` or the log's limit.
//!
//! Crashes, AOF/RDB reloads and failover are in tests/persistence.rs; the argument parser and the
//! codec are also fuzzed with libFuzzer (fuzz/).

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use common::{future_base_ms, is_bucket, now_ms, reply6, send, wait_replica_sync, Limit, Server};
use redis::{Cmd, Connection, Value};
use redis_ratelimit::algorithms::{self, Algorithm, Limiter, Params, Request, Write};
use redis_ratelimit::codec::Change;

const ALGORITHMS: [&str; 5] = [
    "token-bucket",
    "leaky-bucket",
    "fixed-window",
    "sliding-window",
    "sliding-log",
];

const MAX_AMOUNT: u64 = 1_000_000_000_000;
const MAX_PERIOD_MS: u64 = 3650 * 86_400_000;
const TIME_LIMIT_MS: u64 = 1 << 53;
const DEFAULT_MAX_LOG_LIMIT: u64 = 100_000;

// ---------------------------------------------------------------------------------------------
// Helpers

fn send_one(con: &mut Connection, cmd: &Cmd) -> Value {
    send(con, std::slice::from_ref(cmd)).remove(0)
}

fn check(con: &mut Connection, cmd: &Cmd) -> [i64; 6] {
    reply6(&send_one(con, cmd))
}

fn error_text(value: &Value) -> Option<String> {
    match value {
        Value::ServerError(error) => Some(format!(
            "{} {}",
            error.code(),
            error.details().unwrap_or_default()
        )),
        _ => None,
    }
}

fn int(con: &mut Connection, cmd: &Cmd) -> i64 {
    match send_one(con, cmd) {
        Value::Int(n) => n,
        other => panic!("not an integer: {other:?}"),
    }
}

fn dbsize(con: &mut Connection) -> i64 {
    int(con, &redis::cmd("DBSIZE"))
}

fn digest(con: &mut Connection, key: &str) -> String {
    let digests: Vec<String> = redis::cmd("DEBUG")
        .arg("DIGEST-VALUE")
        .arg(key)
        .query(con)
        .expect("DEBUG DIGEST-VALUE");
    digests.into_iter().next().expect("one digest")
}

fn pexpiretime(con: &mut Connection, key: &str) -> i64 {
    int(con, redis::cmd("PEXPIRETIME").arg(key))
}

/// `RATELIMIT.INFO key` as field -> value (`None` for a missing key).
fn limiter_info(con: &mut Connection, key: &str) -> Option<BTreeMap<String, Value>> {
    match send_one(con, redis::cmd("RATELIMIT.INFO").arg(key)) {
        Value::Nil => None,
        Value::Array(items) => Some(
            items
                .chunks(2)
                .map(|pair| {
                    let name = match &pair[0] {
                        Value::SimpleString(s) => s.clone(),
                        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                        other => panic!("field name {other:?}"),
                    };
                    (name, pair[1].clone())
                })
                .collect(),
        ),
        other => panic!("RATELIMIT.INFO {key}: {other:?}"),
    }
}

fn info_int(info: &BTreeMap<String, Value>, field: &str) -> i64 {
    match info.get(field) {
        Some(Value::Int(n)) => *n,
        other => panic!("INFO field {field}: {other:?}"),
    }
}

/// Every key's digest, expiry and RATELIMIT.INFO on `replica` equal `master`'s.
fn assert_replica_matches(master: &Server, replica: &Server, keys: &[String]) {
    wait_replica_sync(master, replica);
    let (mut m, mut r) = (master.client(), replica.client());
    for key in keys {
        assert_eq!(
            digest(&mut m, key),
            digest(&mut r, key),
            "{key}: replica digest differs"
        );
        assert_eq!(
            pexpiretime(&mut m, key),
            pexpiretime(&mut r, key),
            "{key}: expiry"
        );
        assert_eq!(
            limiter_info(&mut m, key),
            limiter_info(&mut r, key),
            "{key}: RATELIMIT.INFO"
        );
    }
    assert_eq!(dbsize(&mut m), dbsize(&mut r));
}

/// A small deterministic generator (xorshift64*), so a failing run can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// Random bytes, fewer than `max`.
    fn bytes(&mut self, max: u64) -> Vec<u8> {
        let len = self.below(max);
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// The seed of a randomized test: `$HARDENING_SEED` to replay one, else the clock.
fn seed() -> u64 {
    let seed = std::env::var("HARDENING_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(now_ms);
    eprintln!("HARDENING_SEED={seed}");
    seed
}

fn master_and_replica() -> (Server, Server) {
    let master = Server::start();
    let replica = Server::start();
    replica.replica_of(&master);
    (master, replica)
}

// ---------------------------------------------------------------------------------------------
// 1. Contention

/// Connections hammering the same keys at once.
const CONNECTIONS: usize = 8;
/// What one key admits at one instant: the limit of a window or a log, the capacity of a bucket.
const CAPACITY: u64 = 150;

/// One limit per algorithm; the buckets refill slowly (3 per second) but hold `CAPACITY`, so
/// admitting more than the capacity at one instant would show.
fn contention_limits() -> Vec<Limit> {
    ALGORITHMS
        .iter()
        .map(|algorithm| {
            if is_bucket(algorithm) {
                Limit::new(algorithm, 3, "1s", Some(CAPACITY))
            } else {
                Limit::new(algorithm, CAPACITY, "1s", None)
            }
        })
        .collect()
}

/// Exactly the capacity was admitted, each admitted reply left a distinct `remaining` (so no two
/// callers were handed the same unit), and every rejection says when to retry.
fn assert_exactly_capacity(limit: &Limit, replies: &[[i64; 6]]) {
    let capacity = limit.capacity() as i64;
    let admitted: Vec<&[i64; 6]> = replies.iter().filter(|r| r[0] == 1).collect();
    assert_eq!(
        admitted.len() as i64,
        capacity,
        "{}: admitted {} of {} at one instant (capacity {capacity})",
        limit.algorithm,
        admitted.len(),
        replies.len()
    );
    let mut remaining: Vec<i64> = admitted.iter().map(|r| r[2]).collect();
    remaining.sort_unstable();
    assert_eq!(
        remaining,
        (0..capacity).collect::<Vec<_>>(),
        "{}: remaining",
        limit.algorithm
    );
    for reply in replies {
        assert_eq!(
            reply[1], capacity,
            "{}: limit field {reply:?}",
            limit.algorithm
        );
        if reply[0] == 0 {
            assert_eq!(reply[2], 0, "{}: {reply:?}", limit.algorithm);
            assert!(reply[3] >= 1, "{}: retry_after {reply:?}", limit.algorithm);
        }
    }
}

/// Runs `per_connection` on `CONNECTIONS` threads released at once; returns every CHECK reply
/// per limit (index into `limits`).
fn contend(
    server: &Server,
    limits: &[Limit],
    per_connection: impl Fn(usize, &mut Connection) -> Vec<(usize, [i64; 6])> + Send + Sync + 'static,
) -> Vec<Vec<[i64; 6]>> {
    let barrier = Arc::new(Barrier::new(CONNECTIONS));
    let work = Arc::new(per_connection);
    let threads: Vec<_> = (0..CONNECTIONS)
        .map(|i| {
            let mut con = server.client();
            let barrier = Arc::clone(&barrier);
            let work = Arc::clone(&work);
            thread::spawn(move || {
                barrier.wait();
                work(i, &mut con)
            })
        })
        .collect();
    let mut per_limit = vec![Vec::new(); limits.len()];
    for thread in threads {
        for (index, reply) in thread.join().expect("a contending connection panicked") {
            per_limit[index].push(reply);
        }
    }
    per_limit
}

#[test]
fn pipelined_checks_from_many_connections_admit_exactly_the_capacity() {
    let (master, replica) = master_and_replica();
    let limits = contention_limits();
    let at = future_base_ms() + 500;
    let keys: Vec<String> = ALGORITHMS.iter().map(|a| format!("pipe:{a}")).collect();
    let (shared_limits, shared_keys) = (limits.clone(), keys.clone());
    // Each connection pipelines 60 CHECKs per key, interleaving the keys: 8 x 60 = 480 > 150.
    let replies = contend(&master, &limits, move |_, con| {
        let mut cmds = Vec::new();
        let mut index = Vec::new();
        for _ in 0..60 {
            for (i, limit) in shared_limits.iter().enumerate() {
                cmds.push(limit.check(&shared_keys[i], 1, Some(at)));
                index.push(i);
            }
        }
        let mut out = Vec::new();
        // Three pipelines per connection, so the connections' batches interleave in the server.
        for (chunk, chunk_index) in cmds.chunks(100).zip(index.chunks(100)) {
            for (value, i) in send(con, chunk).iter().zip(chunk_index) {
                out.push((*i, reply6(value)));
            }
        }
        out
    });
    for (limit, replies) in limits.iter().zip(&replies) {
        assert_eq!(replies.len(), CONNECTIONS * 60);
        assert_exactly_capacity(limit, replies);
    }
    assert_replica_matches(&master, &replica, &keys);
}

#[test]
fn checks_inside_multi_exec_admit_exactly_the_capacity() {
    let (master, replica) = master_and_replica();
    let limits = contention_limits();
    let at = future_base_ms() + 700;
    let keys: Vec<String> = ALGORITHMS.iter().map(|a| format!("multi:{a}")).collect();
    let (shared_limits, shared_keys) = (limits.clone(), keys.clone());
    // Each connection runs 4 transactions of 15 CHECKs per key: 8 x 60 = 480 per key.
    let replies = contend(&master, &limits, move |_, con| {
        let mut out = Vec::new();
        for _ in 0..4 {
            let mut pipe = redis::pipe();
            pipe.atomic();
            let mut index = Vec::new();
            for _ in 0..15 {
                for (i, limit) in shared_limits.iter().enumerate() {
                    pipe.add_command(limit.check(&shared_keys[i], 1, Some(at)));
                    index.push(i);
                }
            }
            let results: Vec<Value> = pipe.query(con).expect("MULTI/EXEC");
            assert_eq!(results.len(), index.len());
            out.extend(index.into_iter().zip(results.iter().map(reply6)));
        }
        out
    });
    for (limit, replies) in limits.iter().zip(&replies) {
        assert_exactly_capacity(limit, replies);
    }
    assert_replica_matches(&master, &replica, &keys);
}

/// Calls `RATELIMIT.CHECK KEYS[1] ARGV[2..]` ARGV[1] times and returns every reply.
const LUA_CHECKS: &str = r#"
local replies = {}
for i = 1, tonumber(ARGV[1]) do
    replies[i] = redis.call('RATELIMIT.CHECK', KEYS[1], unpack(ARGV, 2))
end
return replies
"#;

#[test]
fn checks_from_lua_scripts_admit_exactly_the_capacity() {
    let (master, replica) = master_and_replica();
    let limits = contention_limits();
    let at = future_base_ms() + 900;
    let keys: Vec<String> = ALGORITHMS.iter().map(|a| format!("lua:{a}")).collect();
    let (shared_limits, shared_keys) = (limits.clone(), keys.clone());
    // Each connection pipelines 5 EVALs of 12 CHECKs per key: 8 x 60 = 480 per key.
    let replies = contend(&master, &limits, move |_, con| {
        let mut cmds = Vec::new();
        let mut index = Vec::new();
        for _ in 0..5 {
            for (i, limit) in shared_limits.iter().enumerate() {
                let check = limit.check(&shared_keys[i], 1, Some(at));
                let mut eval = redis::cmd("EVAL");
                eval.arg(LUA_CHECKS).arg(1).arg(&shared_keys[i]).arg(12);
                for arg in check.args_iter().skip(2) {
                    if let redis::Arg::Simple(bytes) = arg {
                        eval.arg(bytes);
                    }
                }
                cmds.push(eval);
                index.push(i);
            }
        }
        let mut out = Vec::new();
        for (value, i) in send(con, &cmds).iter().zip(index) {
            let Value::Array(replies) = value else {
                panic!("EVAL: {value:?}");
            };
            assert_eq!(replies.len(), 12);
            out.extend(replies.iter().map(|reply| (i, reply6(reply))));
        }
        out
    });
    for (limit, replies) in limits.iter().zip(&replies) {
        assert_exactly_capacity(limit, replies);
    }
    assert_replica_matches(&master, &replica, &keys);
}

// ---------------------------------------------------------------------------------------------
// 4. Time

#[test]
fn time_going_backwards_or_far_away_never_admits_more_than_the_limit() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    let far_future = TIME_LIMIT_MS - 1;
    for algorithm in ALGORITHMS {
        let limit = Limit::new(algorithm, 5, "1s", Some(5));
        let key = format!("time:{algorithm}");
        let t0 = base + 500;
        let admitted = (0..8)
            .map(|_| check(&mut con, &limit.check(&key, 1, Some(t0))))
            .filter(|reply| reply[0] == 1)
            .count();
        assert_eq!(admitted, 5, "{algorithm}");
        let rejected_at_t0 = check(&mut con, &limit.check(&key, 1, Some(t0)));
        assert_eq!(rejected_at_t0[0], 0);
        // Earlier times are evaluated at the key's last time: the very same rejection.
        for at in [t0 - 1, t0 - 499, base - 1_000_000_000, 1_000, 1, 0] {
            let reply = check(&mut con, &limit.check(&key, 1, Some(at)));
            assert_eq!(reply, rejected_at_t0, "{algorithm} AT {at} after AT {t0}");
            let peek = check(&mut con, &limit.peek(&key, 1, Some(at)));
            assert_eq!(peek, rejected_at_t0, "{algorithm} PEEK AT {at}");
        }
        // The farthest future accepted: a fresh limiter's worth, and not a unit more.
        let admitted = (0..8)
            .map(|_| check(&mut con, &limit.check(&key, 1, Some(far_future))))
            .filter(|reply| reply[0] == 1)
            .count();
        assert_eq!(admitted, 5, "{algorithm} at the farthest future");
        let rejected_far = check(&mut con, &limit.check(&key, 1, Some(far_future)));
        assert_eq!(rejected_far[0], 0);
        // Back from the far future to now: still evaluated there, still rejected.
        for at in [base, 0] {
            let reply = check(&mut con, &limit.check(&key, 1, Some(at)));
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

/// The in-process model of one key: the crate's pure cores, driven like the server drives them.
/// Returns the reply and the time the call was evaluated at.
fn model_call(stored: &mut Option<Limiter>, limit: &Limit, cost: u64, at: u64) -> ([i64; 6], u64) {
    let algorithm = Algorithm::parse(limit.algorithm.as_bytes()).expect("an algorithm");
    let period_ms: u64 = limit.period.trim_end_matches("ms").parse().expect("ms");
    let request = Request {
        algorithm,
        params: Params::new(limit.limit, period_ms, limit.burst).expect("valid"),
        cost,
        now_ms: at,
    };
    let (outcome, write) =
        algorithms::check(stored.as_mut(), &request, true).expect("same algorithm");
    if let Write::Created(limiter) = write {
        *stored = Some(limiter);
    }
    (outcome.decision.to_array(), outcome.t_ms)
}

#[test]
fn random_times_and_costs_match_the_cores_and_never_over_admit() {
    // Every call's reply is the one the pure core gives for the same sequence (so the server's
    // time handling adds nothing of its own: a call is evaluated at `max(call, last)`, `last` being
    // the last admission's time), admissions never go back in time, and no more than the
    // capacity is admitted at one time (a window's new period starts it afresh).
    let server = Server::start();
    let mut con = server.client();
    let mut rng = Rng::new(seed());
    let base = future_base_ms();
    for algorithm in ALGORITHMS {
        let limits = [
            Limit::new(algorithm, 4, "1000ms", Some(6)),
            Limit::new(algorithm, 4, "1000ms", Some(3)),
            Limit::new(algorithm, 9, "250ms", Some(9)),
        ];
        let key = format!("walk:{algorithm}");
        let mut model: Option<Limiter> = None;
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
                rng.pick(&limits[1..])
            };
            let latest = model.as_ref().map_or(base, |m| m.last_ms);
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
            let cost = rng.pick(&[0, 1, 1, 1, 2, 3, 7]).to_owned();
            // A key written at a time long past has expired in the server (by its clock): the
            // next call starts a fresh limiter (the SPEC's "a call AT a time long past expires at
            // once"), so the count of admissions starts again too.
            if model
                .as_ref()
                .is_some_and(|m| m.expires_at_ms() <= now_ms())
            {
                model = None;
                admitted_t = 0;
            }
            let (reply, t) = model_call(&mut model, limit, cost, at);
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
        let model = model.expect("something was admitted");
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
    for t in [base, TIME_LIMIT_MS - 1] {
        let w = (t as u128) - (t as u128) % p;
        let t128 = t as u128;
        // Buckets: limit, capacity and cost all 10^12, the longest period.
        for algorithm in ["token-bucket", "leaky-bucket"] {
            let limit = Limit::new(algorithm, MAX_AMOUNT, "3650d", Some(MAX_AMOUNT));
            let key = format!("max:{algorithm}:{t}");
            let first = check(&mut con, &limit.check(&key, MAX_AMOUNT, Some(t)));
            // Empty (or full) after one call: refills (drains) in C·P / L = P ms.
            assert_eq!(first, [1, big(c), 0, 0, big(p), 0], "{algorithm} AT {t}");
            assert_eq!(pexpiretime(&mut con, &key), big(t128 + p));
            let second = check(&mut con, &limit.check(&key, 1, Some(t)));
            // One unit is P scaled: back in ⌈P / L⌉ = 1 ms.
            assert_eq!(second, [0, big(c), 0, 1, big(p), 0], "{algorithm} AT {t}");
            if t + 1 < TIME_LIMIT_MS {
                // 1 ms later L = 10^12 scaled units flowed: ⌊L / P⌋ = 3 requests' worth.
                let later = check(&mut con, &limit.check(&key, 3, Some(t + 1)));
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
            check(&mut con, &limit.check(&key, MAX_AMOUNT, Some(t))),
            [1, big(c), 0, 0, end, 0]
        );
        assert_eq!(
            check(&mut con, &limit.check(&key, 1, Some(t))),
            [0, big(c), 0, end, end, 0]
        );
        assert_eq!(pexpiretime(&mut con, &key), big(w + p));
        // Sliding window: full now; the next unit fits 1 ms into the next window, where the
        // previous count weighs (P − 1)/P of 10^12.
        let limit = Limit::new("sliding-window", MAX_AMOUNT, "3650d", None);
        let key = format!("max:sliding:{t}");
        let reset = big(w + 2 * p - t128);
        assert_eq!(
            check(&mut con, &limit.check(&key, MAX_AMOUNT, Some(t))),
            [1, big(c), 0, 0, reset, 0]
        );
        assert_eq!(
            check(&mut con, &limit.check(&key, 1, Some(t))),
            [0, big(c), 0, big(w + p - t128 + 1), reset, 0]
        );
        assert_eq!(pexpiretime(&mut con, &key), big(w + 2 * p));
        // Sliding log: the largest log the default max-log-limit allows, at one ms.
        let n = DEFAULT_MAX_LOG_LIMIT;
        let limit = Limit::new("sliding-log", n, "3650d", None);
        let key = format!("max:log:{t}");
        assert_eq!(
            check(&mut con, &limit.check(&key, n, Some(t))),
            [1, n as i64, 0, 0, big(p), 0]
        );
        assert_eq!(
            check(&mut con, &limit.check(&key, 1, Some(t))),
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
        let first = check(&mut con, &limit.check(&key, 100_000_000, None));
        assert_eq!(first[0], 1);
        assert!(
            pexpiretime(&mut con, &key) > now_ms() as i64,
            "{algorithm}: the key expires at once"
        );
        let second = check(&mut con, &limit.check(&key, 100_000_000, None));
        assert_eq!(
            second[0], 0,
            "{algorithm}: a second full bucket was admitted"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 5. Hostile input

fn hostile_number(rng: &mut Rng) -> Vec<u8> {
    const NUMBERS: &[&[u8]] = &[
        b"0",
        b"1",
        b"2",
        b"7",
        b"1000",
        b"-1",
        b"-0",
        b"+1",
        b"1e3",
        b"1.5",
        b" 1",
        b"1 ",
        b"0x10",
        b"007",
        b"1000000000000",
        b"1000000000001",
        b"315360000000",
        b"9007199254740991",
        b"9007199254740992",
        b"9223372036854775807",
        b"9223372036854775808",
        b"18446744073709551615",
        b"18446744073709551616",
        b"99999999999999999999999999999",
        b"",
        b"\0",
        b"1\x001",
        b"\xff\xfe",
        b"\xc3\xa9",
        b"NaN",
        b"inf",
    ];
    match rng.below(10) {
        0 => (0..rng.below(25) + 1)
            .map(|_| b'0' + rng.below(10) as u8)
            .collect(),
        1 => rng.bytes(12),
        2 if rng.chance(3) => vec![b'9'; 100_000],
        3 => format!("{}", future_base_ms() + rng.below(10_000)).into_bytes(),
        _ => rng.pick(NUMBERS).to_vec(),
    }
}

fn hostile_period(rng: &mut Rng) -> Vec<u8> {
    const UNITS: &[&[u8]] = &[
        b"", b"ms", b"s", b"m", b"h", b"d", b"MS", b"S", b"D", b"w", b"sec", b" s", b"s\0",
    ];
    let mut period = if rng.chance(60) {
        rng.pick(&[&b"1"[..], b"250", b"15", b"1000", b"3650", b"3651", b"0"])
            .to_vec()
    } else {
        hostile_number(rng)
    };
    let unit: &&[u8] = rng.pick(UNITS);
    period.extend_from_slice(unit);
    period
}

fn hostile_word(rng: &mut Rng, words: &[&str]) -> Vec<u8> {
    let word = rng.pick(words).as_bytes().to_vec();
    match rng.below(8) {
        0 => word.to_ascii_uppercase(),
        1 => {
            let mut w = word;
            w.push(0);
            w
        }
        2 => rng.bytes(16),
        3 => Vec::new(),
        _ => word,
    }
}

fn hostile_check_args(rng: &mut Rng) -> Vec<Vec<u8>> {
    let mut args = vec![
        hostile_word(
            rng,
            &[
                "token-bucket",
                "leaky-bucket",
                "fixed-window",
                "sliding-window",
                "sliding-log",
                "Token-Bucket",
                "gcra",
                "token_bucket",
            ],
        ),
        if rng.chance(50) {
            rng.pick(&[&b"1"[..], b"5", b"100", b"100000", b"100001"])
                .to_vec()
        } else {
            hostile_number(rng)
        },
        hostile_period(rng),
    ];
    for _ in 0..rng.below(5) {
        args.push(hostile_word(
            rng,
            &["BURST", "COST", "AT", "cost", "at", "LIMIT"],
        ));
        args.push(hostile_number(rng));
    }
    match rng.below(10) {
        0 => args.truncate(rng.below(args.len() as u64) as usize),
        1 => {
            args.pop();
        }
        2 => args.push(hostile_number(rng)),
        _ => {}
    }
    args
}

/// A payload for RATELIMIT.APPLY: a real change (as a CHECK would replicate it), often damaged.
fn hostile_payload(rng: &mut Rng) -> Vec<u8> {
    let base = future_base_ms();
    let algorithm = *rng.pick(&Algorithm::ALL);
    let mut payload = if rng.chance(20) {
        rng.bytes(90)
    } else if algorithm == Algorithm::SlidingLog && rng.chance(50) {
        Change::LogAppend {
            params: Params::new(1 + rng.below(10), 1 + rng.below(5_000), None).expect("valid"),
            t_ms: base + rng.below(1_000),
            cost: 1 + rng.below(3),
        }
        .to_bytes()
    } else {
        let burst = algorithm.is_bucket().then(|| 1 + rng.below(10));
        let params = Params::new(1 + rng.below(10), 1 + rng.below(5_000), burst).expect("valid");
        let mut stored = None;
        for _ in 0..1 + rng.below(4) {
            let request = Request {
                algorithm,
                params,
                cost: rng.below(3),
                now_ms: base + rng.below(3_000),
            };
            if let Ok((_, Write::Created(limiter))) =
                algorithms::check(stored.as_mut(), &request, true)
            {
                stored = Some(limiter);
            }
        }
        match stored {
            Some(limiter) => Change::Replace(limiter).to_bytes(),
            None => rng.bytes(60),
        }
    };
    // Damage: flip bytes, truncate or extend.
    match rng.below(4) {
        0 if !payload.is_empty() => {
            for _ in 0..1 + rng.below(3) {
                let i = rng.below(payload.len() as u64) as usize;
                payload[i] ^= 1 << rng.below(8);
            }
        }
        1 if !payload.is_empty() => payload.truncate(rng.below(payload.len() as u64) as usize),
        2 => payload.extend(rng.bytes(9)),
        _ => {}
    }
    payload
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Check,
    Peek,
    Reset,
    Info,
    Apply,
}

/// An error reply, or a reply of the command's shape whose fields are consistent.
fn assert_valid_reply(kind: Kind, args: &[Vec<u8>], value: &Value) {
    let shown = || {
        args.iter()
            .map(|a| String::from_utf8_lossy(&a[..a.len().min(40)]).into_owned())
            .collect::<Vec<_>>()
    };
    if let Value::ServerError(error) = value {
        assert!(
            matches!(error.code(), "ERR" | "WRONGTYPE"),
            "{kind:?} {:?}: unexpected error {error:?}",
            shown()
        );
        assert!(
            !error
                .details()
                .unwrap_or_default()
                .contains("internal error"),
            "{kind:?} {:?}: a panic was caught: {error:?}",
            shown()
        );
        return;
    }
    match kind {
        Kind::Check | Kind::Peek => {
            let [allowed, limit, remaining, retry, reset, delay] = reply6(value);
            let ok = (allowed == 0 || allowed == 1)
                && limit >= 1
                && (0..=limit).contains(&remaining)
                && retry >= -1
                && (allowed == 1) == (retry == 0)
                && reset >= 0
                && delay >= 0;
            assert!(ok, "{kind:?} {:?}: inconsistent reply {value:?}", shown());
        }
        Kind::Reset => assert!(matches!(value, Value::Int(n) if *n >= 0), "{value:?}"),
        Kind::Info => assert!(
            matches!(value, Value::Nil)
                || matches!(value, Value::Array(a) if a.len() % 2 == 0 && !a.is_empty()),
            "{:?}: {value:?}",
            shown()
        ),
        Kind::Apply => assert!(matches!(value, Value::Okay), "{:?}: {value:?}", shown()),
    }
}

#[test]
fn random_argument_vectors_get_an_error_or_a_valid_reply_and_errors_create_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let mut rng = Rng::new(seed());
    let _: () = redis::cmd("SET")
        .arg("h:string")
        .arg("not a limiter")
        .query(&mut con)
        .unwrap();
    let pool: Vec<Vec<u8>> = (0..6)
        .map(|i| format!("h:{i}").into_bytes())
        .chain([b"h:string".to_vec(), Vec::new(), b"h:\0\xff".to_vec()])
        .collect();
    let (mut errors, mut replies) = (0, 0);
    for _batch in 0..30 {
        let mut cmds = Vec::new();
        let mut sent = Vec::new();
        for _ in 0..200 {
            let kind = *rng.pick(&[
                Kind::Check,
                Kind::Check,
                Kind::Check,
                Kind::Check,
                Kind::Peek,
                Kind::Peek,
                Kind::Reset,
                Kind::Info,
                Kind::Apply,
                Kind::Apply,
            ]);
            let key = rng.pick(&pool).clone();
            let (name, args): (&str, Vec<Vec<u8>>) = match kind {
                Kind::Check | Kind::Peek => {
                    let mut args = vec![key];
                    args.extend(hostile_check_args(&mut rng));
                    if rng.chance(3) {
                        args.clear();
                    }
                    let name = if kind == Kind::Check {
                        "RATELIMIT.CHECK"
                    } else {
                        "RATELIMIT.PEEK"
                    };
                    (name, args)
                }
                Kind::Reset => (
                    "RATELIMIT.RESET",
                    (0..rng.below(4)).map(|_| rng.pick(&pool).clone()).collect(),
                ),
                Kind::Info => (
                    "RATELIMIT.INFO",
                    (0..rng.below(3)).map(|_| rng.pick(&pool).clone()).collect(),
                ),
                Kind::Apply => {
                    let mut args = vec![key, hostile_payload(&mut rng)];
                    match rng.below(10) {
                        0 => args.truncate(rng.below(2) as usize),
                        1 => args.push(hostile_payload(&mut rng)),
                        _ => {}
                    }
                    ("RATELIMIT.APPLY", args)
                }
            };
            let mut cmd = redis::cmd(name);
            for arg in &args {
                cmd.arg(arg.as_slice());
            }
            cmds.push(redis::cmd("DBSIZE"));
            cmds.push(cmd);
            cmds.push(redis::cmd("DBSIZE"));
            sent.push((kind, args));
        }
        let values = send(&mut con, &cmds);
        for (triple, (kind, args)) in values.chunks(3).zip(&sent) {
            let (Value::Int(before), Value::Int(after)) = (&triple[0], &triple[2]) else {
                panic!("DBSIZE: {triple:?}");
            };
            assert_valid_reply(*kind, args, &triple[1]);
            if matches!(triple[1], Value::ServerError(_)) {
                errors += 1;
                // Keys may expire in between, never appear.
                assert!(
                    after <= before,
                    "{kind:?} {args:?} answered an error and created a key"
                );
            } else {
                replies += 1;
            }
        }
        let pong: String = redis::cmd("PING")
            .query(&mut con)
            .expect("the server is up");
        assert_eq!(pong, "PONG");
    }
    eprintln!("{errors} error replies, {replies} valid replies");
    assert!(
        errors > 1_000 && replies > 300,
        "{errors} errors, {replies} replies"
    );
    let string: String = redis::cmd("GET").arg("h:string").query(&mut con).unwrap();
    assert_eq!(string, "not a limiter");
    assert!(
        !server.log().contains("panicked"),
        "a callback panicked:\n{}",
        server.log_tail(30)
    );
}

#[test]
fn apply_cannot_grow_a_sliding_log_past_max_log_limit() {
    let server = Server::start();
    let mut con = server.client();
    let payload = Change::LogAppend {
        params: Params::new(MAX_AMOUNT, 1000, None).unwrap(),
        t_ms: future_base_ms(),
        cost: 10_000_000,
    }
    .to_bytes();
    let reply = send_one(
        &mut con,
        redis::cmd("RATELIMIT.APPLY").arg("bomb").arg(payload),
    );
    assert!(error_text(&reply).is_some(), "accepted: {reply:?}");
    assert_eq!(dbsize(&mut con), 0);
}

#[test]
fn a_lower_max_log_limit_on_a_replica_or_at_aof_replay_keeps_the_masters_logs() {
    // The master admits logs of limit 1000; its replica, and later the master itself, run with
    // max-log-limit 10. What the master admitted must still arrive and load exactly.
    let master = Server::builder()
        .config(&[("appendonly", "yes"), ("appendfsync", "always")])
        .start();
    let replica = Server::builder()
        .module_args(&["max-log-limit", "10"])
        .start();
    replica.replica_of(&master);
    let limit = Limit::new("sliding-log", 1000, "1h", None);
    let base = future_base_ms();
    let mut con = master.client();
    for i in 0..60u64 {
        assert_eq!(
            check(&mut con, &limit.check("log", 1 + i % 3, Some(base + i * 7)))[0],
            1
        );
    }
    let keys = ["log".to_string()];
    assert_replica_matches(&master, &replica, &keys);
    let before = limiter_info(&mut con, "log").expect("stored");
    assert_eq!(info_int(&before, "entries"), 120);

    // A client is still held to the local setting.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("ratelimit.max-log-limit")
        .arg("10")
        .query(&mut con)
        .expect("CONFIG SET ratelimit.max-log-limit");
    let append = Change::LogAppend {
        params: Params::new(1000, 3_600_000, None).unwrap(),
        t_ms: base + 1000,
        cost: 1,
    }
    .to_bytes();
    let refused = send_one(
        &mut con,
        redis::cmd("RATELIMIT.APPLY").arg("log").arg(&append),
    );
    assert!(error_text(&refused).is_some(), "accepted: {refused:?}");

    // The AOF replayed under the lower setting rebuilds the same log.
    let digest_before = digest(&mut con, "log");
    let reload = send_one(&mut con, redis::cmd("DEBUG").arg("LOADAOF"));
    assert!(matches!(reload, Value::Okay), "DEBUG LOADAOF: {reload:?}");
    assert_eq!(limiter_info(&mut con, "log"), Some(before));
    assert_eq!(digest(&mut con, "log"), digest_before);
}

#[test]
fn every_state_apply_accepts_survives_a_reload() {
    let server = Server::start();
    let mut con = server.client();
    let _: () = redis::cmd("SET").arg("a").arg("1").query(&mut con).unwrap();
    let append = Change::LogAppend {
        params: Params::new(5, 1000, None).unwrap(),
        t_ms: future_base_ms(),
        cost: 5,
    }
    .to_bytes();
    for _ in 0..2 {
        send_one(
            &mut con,
            redis::cmd("RATELIMIT.APPLY").arg("over").arg(&append),
        );
    }
    let _: () = redis::cmd("SET").arg("z").arg("2").query(&mut con).unwrap();
    let keys = dbsize(&mut con);
    let reload = send_one(&mut con, redis::cmd("DEBUG").arg("RELOAD"));
    assert!(matches!(reload, Value::Okay), "DEBUG RELOAD: {reload:?}");
    assert_eq!(dbsize(&mut con), keys);
}

/// CRC-64/Jones as Redis computes the DUMP trailer (reflected, polynomial 0xad93d23594c935a9).
fn crc64(bytes: &[u8]) -> u64 {
    const REFLECTED_POLY: u64 = 0x95ac_9329_ac4b_c9b5;
    let mut crc = 0u64;
    for &byte in bytes {
        crc ^= u64::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ REFLECTED_POLY
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// A DUMP payload whose limiter bytes at `at..at+len` are replaced by `body`, with its length
/// prefix (one byte: our buffers are shorter than 64) and its CRC trailer made valid again.
fn redump(payload: &[u8], at: usize, len: usize, body: &[u8]) -> Vec<u8> {
    // The buffer's length is the byte just before it: a 6-bit length below 64, else the low byte
    // of a 14-bit one whose high bits are 0 (the limiters here are shorter than 256 bytes).
    assert_eq!(usize::from(payload[at - 1]), len, "the length prefix");
    assert!(body.len() < 256 && (len < 64) == (body.len() < 64));
    let mut out = payload[..at - 1].to_vec();
    out.push(body.len() as u8);
    out.extend_from_slice(body);
    out.extend_from_slice(&payload[at + len..payload.len() - 8]);
    let crc = crc64(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn le(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn find(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the limiter's bytes in the DUMP payload")
}

/// `RESTORE key <expires_at_ms> payload REPLACE ABSTTL`: the expiry matters to DEBUG DIGEST-VALUE.
fn restore(con: &mut Connection, key: &str, expires_at_ms: i64, payload: &[u8]) -> Value {
    send_one(
        con,
        redis::cmd("RESTORE")
            .arg(key)
            .arg(expires_at_ms)
            .arg(payload)
            .arg("REPLACE")
            .arg("ABSTTL"),
    )
}

#[test]
fn restore_of_a_corrupt_limiter_with_a_valid_checksum_is_refused() {
    assert_eq!(
        crc64(b"123456789"),
        0xe9c6_d914_c4b8_d9ca,
        "CRC-64/Jones check value"
    );
    let server = Server::start();
    let mut con = server.client();
    // Uncompressed, so the limiter's bytes appear verbatim in DUMP.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("rdbcompression")
        .arg("no")
        .query(&mut con)
        .unwrap();
    let base = future_base_ms();
    let far = (base + 86_400_000) as i64;
    let dump = |con: &mut Connection, key: &str| -> Vec<u8> {
        redis::cmd("DUMP").arg(key).query(con).expect("DUMP")
    };
    let refused = |con: &mut Connection, what: &str, payload: &[u8]| {
        let reply = restore(con, "restored", far, payload);
        let error = error_text(&reply).unwrap_or_else(|| panic!("{what}: accepted {reply:?}"));
        assert!(
            error.contains("Bad data format") || error.contains("checksum"),
            "{what}: {error}"
        );
        assert_eq!(int(con, redis::cmd("EXISTS").arg("restored")), 0, "{what}");
        let pong: String = redis::cmd("PING").query(con).expect("up");
        assert_eq!(pong, "PONG");
    };

    // A token bucket: 7 per 1000 ms, capacity 9, 2 taken: 7000 scaled tokens.
    let tb = Limit::new("token-bucket", 7, "1000", Some(9));
    check(&mut con, &tb.check("tb", 2, Some(base)));
    let payload = dump(&mut con, "tb");
    let head = |algorithm: u8, limit: u64, period: u64, capacity: u64, last: u64| {
        let mut bytes = vec![algorithm];
        bytes.extend(le(&[limit, period, capacity, last]));
        bytes
    };
    let at = find(&payload, &head(0, 7, 1000, 9, base));
    let tokens = |scaled: u128| scaled.to_le_bytes().to_vec();
    let body = |head: Vec<u8>, state: Vec<u8>| [head, state].concat();
    // The payload as dumped restores, and a valid edit with a recomputed CRC restores too: the
    // CRC here is right, so the refusals below are about the contents.
    let tb_expiry = pexpiretime(&mut con, "tb");
    assert!(matches!(
        restore(&mut con, "restored", tb_expiry, &payload),
        Value::Okay
    ));
    assert_eq!(digest(&mut con, "restored"), digest(&mut con, "tb"));
    let edited = redump(
        &payload,
        at,
        49,
        &body(head(0, 7, 1000, 9, base), tokens(8000)),
    );
    assert!(matches!(
        restore(&mut con, "restored", far, &edited),
        Value::Okay
    ));
    assert_eq!(
        info_int(&limiter_info(&mut con, "restored").unwrap(), "tokens"),
        8
    );
    let _: i64 = redis::cmd("DEL").arg("restored").query(&mut con).unwrap();
    // The same edit without fixing the CRC is refused by Redis itself.
    let mut stale = payload.clone();
    stale[at + 33] ^= 1;
    refused(&mut con, "stale CRC", &stale);

    let corrupt_buckets = [
        (
            "tokens above the capacity",
            body(head(0, 7, 1000, 9, base), tokens(9001)),
        ),
        (
            "tokens u128::MAX",
            body(head(0, 7, 1000, 9, base), tokens(u128::MAX)),
        ),
        (
            "level above the capacity",
            body(head(1, 7, 1000, 9, base), tokens(9001)),
        ),
        (
            "unknown algorithm 5",
            body(head(5, 7, 1000, 9, base), tokens(7000)),
        ),
        (
            "unknown algorithm 255",
            body(head(255, 7, 1000, 9, base), tokens(7000)),
        ),
        ("limit 0", body(head(0, 0, 1000, 9, base), tokens(0))),
        (
            "limit above 10^12",
            body(head(0, MAX_AMOUNT + 1, 1000, 9, base), tokens(0)),
        ),
        ("period 0", body(head(0, 7, 0, 9, base), tokens(0))),
        (
            "period above 3650 days",
            body(head(0, 7, MAX_PERIOD_MS + 1, 9, base), tokens(0)),
        ),
        ("capacity 0", body(head(0, 7, 1000, 0, base), tokens(0))),
        (
            "capacity above 10^12",
            body(head(0, 7, 1000, MAX_AMOUNT + 1, base), tokens(0)),
        ),
        (
            "time at 2^53",
            body(head(0, 7, 1000, 9, TIME_LIMIT_MS), tokens(0)),
        ),
        (
            "a window read as a bucket's bytes",
            body(head(2, 7, 1000, 7, base), tokens(7000)),
        ),
        (
            "truncated by one byte",
            body(head(0, 7, 1000, 9, base), tokens(7000)[..15].to_vec()),
        ),
        (
            "one byte too many",
            body(head(0, 7, 1000, 9, base), [tokens(7000), vec![0]].concat()),
        ),
    ];
    for (what, bytes) in &corrupt_buckets {
        refused(&mut con, what, &redump(&payload, at, 49, bytes));
    }

    // A fixed window: 5 per 1000 ms, one taken in the window starting at `base`.
    let fw = Limit::new("fixed-window", 5, "1000", None);
    check(&mut con, &fw.check("fw", 1, Some(base + 250)));
    let payload = dump(&mut con, "fw");
    let at = find(&payload, &head(2, 5, 1000, 5, base + 250));
    for (what, state) in [
        ("an unaligned window", le(&[base + 1, 1])),
        ("another window than last's", le(&[base + 1000, 1])),
        ("a count above 10^12", le(&[base, MAX_AMOUNT + 1])),
    ] {
        refused(
            &mut con,
            what,
            &redump(
                &payload,
                at,
                49,
                &body(head(2, 5, 1000, 5, base + 250), state),
            ),
        );
    }

    // A sliding log: 10 per 1000 ms; two entries at base, one at base + 5.
    let sl = Limit::new("sliding-log", 10, "1000", None);
    check(&mut con, &sl.check("sl", 2, Some(base)));
    check(&mut con, &sl.check("sl", 1, Some(base + 5)));
    let payload = dump(&mut con, "sl");
    let sl_head = head(4, 10, 1000, 10, base + 5);
    let at = find(&payload, &sl_head);
    let runs = |runs: &[(u64, u64)], claimed: u64| {
        let mut state = le(&[claimed]);
        for (ts, count) in runs {
            state.extend(le(&[*ts, *count]));
        }
        body(sl_head.clone(), state)
    };
    assert_eq!(
        payload[at..at + 73],
        runs(&[(base, 2), (base + 5, 1)], 2)[..],
        "the log's layout"
    );
    let valid = redump(&payload, at, 73, &runs(&[(base, 1), (base + 5, 1)], 2));
    assert!(matches!(
        restore(&mut con, "restored", far, &valid),
        Value::Okay
    ));
    let _: i64 = redis::cmd("DEL").arg("restored").query(&mut con).unwrap();
    for (what, bytes) in [
        ("runs out of order", runs(&[(base + 5, 1), (base, 2)], 2)),
        ("an empty run", runs(&[(base, 0), (base + 5, 1)], 2)),
        ("a run above 2048", runs(&[(base, 2049), (base + 5, 1)], 2)),
        (
            "more entries than the limit",
            runs(&[(base, 9), (base + 5, 2)], 2),
        ),
        ("an entry after last", runs(&[(base, 2), (base + 6, 1)], 2)),
        (
            "an entry out of the window",
            runs(&[(base - 1000, 2), (base + 5, 1)], 2),
        ),
        (
            "more runs claimed than present",
            runs(&[(base, 2), (base + 5, 1)], 3),
        ),
        (
            "a huge run count",
            runs(&[(base, 2), (base + 5, 1)], u64::MAX),
        ),
        (
            "fewer runs claimed than present",
            runs(&[(base, 2), (base + 5, 1)], 1),
        ),
    ] {
        refused(&mut con, what, &redump(&payload, at, 73, &bytes));
    }

    // Nothing refused left a trace; the originals are intact.
    assert_eq!(dbsize(&mut con), 3);
    assert_eq!(
        info_int(&limiter_info(&mut con, "sl").unwrap(), "entries"),
        3
    );
}

// ---------------------------------------------------------------------------------------------
// 6. Memory

#[test]
fn max_log_limit_bounds_a_sliding_log_and_a_full_log_costs_under_4_bytes_an_entry() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    // The default bound: 100000 is accepted, one more is refused and creates nothing.
    let reply = send_one(
        &mut con,
        &Limit::new("sliding-log", DEFAULT_MAX_LOG_LIMIT + 1, "1d", None).check(
            "log",
            1,
            Some(base),
        ),
    );
    let error = error_text(&reply).expect("refused");
    assert!(error.contains("max-log-limit"), "{error}");
    assert_eq!(dbsize(&mut con), 0);

    // A full log: 100000 entries 700 ms apart (2-byte records), all inside the day.
    const GAP_MS: u64 = 700;
    let limit = Limit::new("sliding-log", DEFAULT_MAX_LOG_LIMIT, "1d", None);
    for chunk in (0..DEFAULT_MAX_LOG_LIMIT)
        .collect::<Vec<_>>()
        .chunks(10_000)
    {
        let cmds: Vec<Cmd> = chunk
            .iter()
            .map(|i| limit.check("log", 1, Some(base + i * GAP_MS)))
            .collect();
        for value in send(&mut con, &cmds) {
            assert_eq!(reply6(&value)[0], 1);
        }
    }
    let last = base + (DEFAULT_MAX_LOG_LIMIT - 1) * GAP_MS;
    assert_eq!(
        check(&mut con, &limit.check("log", 1, Some(last))),
        [
            0,
            DEFAULT_MAX_LOG_LIMIT as i64,
            0,
            86_400_000 - (DEFAULT_MAX_LOG_LIMIT - 1) as i64 * GAP_MS as i64,
            86_400_000,
            0
        ]
    );
    let info = limiter_info(&mut con, "log").expect("stored");
    assert_eq!(info_int(&info, "entries"), DEFAULT_MAX_LOG_LIMIT as i64);
    let usage = int(&mut con, redis::cmd("MEMORY").arg("USAGE").arg("log"));
    eprintln!(
        "a full sliding log: MEMORY USAGE {usage} bytes, {:.2} per entry",
        usage as f64 / DEFAULT_MAX_LOG_LIMIT as f64
    );
    assert!(
        usage < 4 * DEFAULT_MAX_LOG_LIMIT as i64,
        "MEMORY USAGE {usage} for {DEFAULT_MAX_LOG_LIMIT} entries"
    );
    // The server's own accounting agrees that the log is that small: an empty server uses about
    // 0.9 MB here.
    let used: i64 = server.info_field("memory", "used_memory").parse().unwrap();
    eprintln!("used_memory with the full log: {used}");
    assert!(used < 3_000_000, "used_memory {used}");
}

#[test]
fn a_lower_max_log_limit_set_at_run_time_is_enforced() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("ratelimit.max-log-limit")
        .arg(1000)
        .query(&mut con)
        .expect("CONFIG SET ratelimit.max-log-limit");
    let over = send_one(
        &mut con,
        &Limit::new("sliding-log", 1001, "1s", None).check("log", 1, Some(base)),
    );
    assert!(
        error_text(&over).is_some_and(|e| e.contains("max-log-limit")),
        "{over:?}"
    );
    let at = check(
        &mut con,
        &Limit::new("sliding-log", 1000, "1s", None).check("log", 1, Some(base)),
    );
    assert_eq!(at[0], 1);
    // Other algorithms are not bounded by it.
    let window = check(
        &mut con,
        &Limit::new("sliding-window", 1_000_000, "1s", None).check("window", 1, Some(base)),
    );
    assert_eq!(window[0], 1);
}

#[test]
fn noeviction_maxmemory_answers_oom_to_checks_and_nothing_breaks() {
    let server = Server::builder()
        .config(&[("maxmemory-policy", "noeviction")])
        .start();
    let mut con = server.client();
    let base = future_base_ms();
    let limits: Vec<Limit> = ALGORITHMS
        .iter()
        .map(|a| Limit::new(a, 10, "1000", Some(10)))
        .collect();
    let keys: Vec<String> = ALGORITHMS.iter().map(|a| format!("oom:{a}")).collect();
    for (limit, key) in limits.iter().zip(&keys) {
        assert_eq!(check(&mut con, &limit.check(key, 3, Some(base)))[0], 1);
    }
    let digests: Vec<String> = keys.iter().map(|k| digest(&mut con, k)).collect();
    // Some ballast, then a cap below what is used: every deny-oom command is refused now.
    let _: () = redis::cmd("SET")
        .arg("ballast")
        .arg(vec![b'x'; 2_000_000])
        .query(&mut con)
        .unwrap();
    let cap_below_use = |con: &mut Connection| {
        let used: u64 = server.info_field("memory", "used_memory").parse().unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(used - 200_000)
            .query(con)
            .unwrap();
    };
    cap_below_use(&mut con);
    for (limit, key) in limits.iter().zip(&keys) {
        for target in [format!("{key}:new"), key.clone()] {
            let reply = send_one(&mut con, &limit.check(&target, 1, Some(base)));
            let error = error_text(&reply).unwrap_or_else(|| panic!("{target}: {reply:?}"));
            assert!(error.starts_with("OOM"), "{target}: {error}");
        }
        // Reads keep working: PEEK and INFO answer from the unchanged state.
        let peek = check(&mut con, &limit.peek(key, 1, Some(base)));
        assert_eq!(peek[0], 1);
        assert!(limiter_info(&mut con, key).is_some());
    }
    let apply = send_one(
        &mut con,
        redis::cmd("RATELIMIT.APPLY").arg("oom:apply").arg(
            Change::LogAppend {
                params: Params::new(5, 1000, None).unwrap(),
                t_ms: base,
                cost: 1,
            }
            .to_bytes(),
        ),
    );
    assert!(
        error_text(&apply).is_some_and(|e| e.starts_with("OOM")),
        "{apply:?}"
    );
    let checkall = send_one(
        &mut con,
        redis::cmd("RATELIMIT.CHECKALL")
            .arg(2)
            .arg(&keys[2])
            .arg("oom:checkall")
            .arg(&[
                "fixed-window",
                "10",
                "1000",
                "fixed-window",
                "10",
                "1000",
                "AT",
            ])
            .arg(base),
    );
    assert!(
        error_text(&checkall).is_some_and(|e| e.starts_with("OOM")),
        "{checkall:?}"
    );
    assert_eq!(
        dbsize(&mut con),
        6,
        "the limiters and the ballast, nothing new"
    );
    for (key, before) in keys.iter().zip(&digests) {
        assert_eq!(&digest(&mut con, key), before, "{key} changed under OOM");
    }
    // Freeing memory brings everything back, with the state as it was.
    let _: i64 = redis::cmd("DEL").arg("ballast").query(&mut con).unwrap();
    for (limit, key) in limits.iter().zip(&keys) {
        let reply = check(&mut con, &limit.check(key, 1, Some(base)));
        assert_eq!(reply[..3], [1, 10, 6], "{key}");
        assert_eq!(
            check(&mut con, &limit.check(&format!("{key}:new"), 1, Some(base)))[0],
            1
        );
    }
    // RESET is not refused under OOM: it frees memory.
    cap_below_use(&mut con);
    let new_key = send_one(&mut con, &limits[0].check("oom:again", 1, Some(base)));
    assert!(
        error_text(&new_key).is_some_and(|e| e.starts_with("OOM")),
        "{new_key:?}"
    );
    let removed = int(&mut con, redis::cmd("RATELIMIT.RESET").arg(&keys));
    assert_eq!(removed, 5);
}

#[test]
fn an_evicted_limiter_is_a_fresh_limiter_and_volatile_policies_evict_limiters_first() {
    // Every stored limiter has a TTL, so `volatile-*` policies count it as evictable, before any
    // key without a TTL; `allkeys-*` evict it like anything else. Either way an evicted limiter
    // is gone: the next CHECK meets a fresh one and admits again. This is what README's
    // "Guarantees" warns about.
    for policy in ["volatile-lru", "allkeys-lru"] {
        let server = Server::builder()
            .config(&[("maxmemory-policy", policy), ("maxmemory-samples", "10")])
            .start();
        let mut con = server.client();
        let base = future_base_ms();
        let limit = Limit::new("fixed-window", 1, "1h", None);
        // 500 exhausted limiters with 4 KB names: about 2 MB of them.
        let keys: Vec<String> = (0..500)
            .map(|i| format!("limiter:{i}:{}", "x".repeat(4_000)))
            .collect();
        let cmds: Vec<Cmd> = keys.iter().map(|k| limit.check(k, 1, Some(base))).collect();
        assert!(run_all_admitted(&mut con, &cmds));
        // Cap memory a little above what is used, then write 1.5 MB of data without a TTL.
        let used: u64 = server.info_field("memory", "used_memory").parse().unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(used + 300_000)
            .query(&mut con)
            .unwrap();
        let mut data_written = 0;
        for i in 0..30 {
            let reply = send_one(
                &mut con,
                redis::cmd("SET")
                    .arg(format!("data:{i}"))
                    .arg(vec![b'd'; 50_000]),
            );
            if matches!(reply, Value::Okay) {
                data_written += 1;
            }
        }
        let evicted: u64 = server.info_field("stats", "evicted_keys").parse().unwrap();
        // Stop evicting, then look at what is left.
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(0)
            .query(&mut con)
            .unwrap();
        let mut exists = redis::pipe();
        for key in &keys {
            exists.cmd("EXISTS").arg(key);
        }
        let present: Vec<i64> = exists.query(&mut con).unwrap();
        let missing: Vec<&String> = keys
            .iter()
            .zip(&present)
            .filter(|(_, p)| **p == 0)
            .map(|(k, _)| k)
            .collect();
        eprintln!(
            "{policy}: {evicted} keys evicted, {} of 500 limiters among them, {data_written} of \
             30 data keys written",
            missing.len()
        );
        assert!(!missing.is_empty(), "{policy}: no limiter was evicted");
        if policy.starts_with("volatile") {
            // Only keys with a TTL go: the limiters, never the data.
            assert_eq!(missing.len() as u64, evicted, "{policy}");
            assert_eq!(data_written, 30, "{policy}");
            let data: i64 = int(&mut con, &redis::cmd("DBSIZE")) - (500 - missing.len() as i64);
            assert_eq!(data, 30, "{policy}: data keys were evicted");
        }
        // An evicted limiter admits again what it had already admitted; one that stayed does not.
        for (key, present) in keys.iter().zip(&present) {
            let reply = check(&mut con, &limit.check(key, 1, Some(base)));
            assert_eq!(
                reply[0],
                i64::from(*present == 0),
                "{policy}: {}",
                &key[..12]
            );
        }
    }
}

/// Runs CHECKs in one pipeline; true when all were admitted.
fn run_all_admitted(con: &mut Connection, cmds: &[Cmd]) -> bool {
    send(con, cmds).iter().all(|value| reply6(value)[0] == 1)
}

#[test]
fn a_million_expiring_keys_give_their_memory_back() {
    // Fast expiry: more cron runs and a bigger active-expire effort, so a million keys vanish
    // within seconds of their expiry instead of tens of seconds.
    let server = Server::builder()
        .config(&[("hz", "100"), ("active-expire-effort", "10")])
        .start();
    let mut con = server.client();
    let memory = |field: &str| -> i64 { server.info_field("memory", field).parse().unwrap() };
    let baseline = memory("used_memory");
    const KEYS: u64 = 1_000_000;
    const CONNECTIONS: u64 = 4;
    let started = Instant::now();
    let threads: Vec<_> = (0..CONNECTIONS)
        .map(|c| {
            let mut con = server.client();
            thread::spawn(move || {
                let mut cmds = Vec::with_capacity(5_000);
                let mut k = c;
                while k < KEYS {
                    // 1 per 2 s, every algorithm: each key expires 2 s (sliding window: up to
                    // 4 s) after its CHECK.
                    let algorithm = ALGORITHMS[(k % 5) as usize];
                    cmds.push(Limit::new(algorithm, 1, "2000", Some(1)).check(
                        &format!("soak:{k}"),
                        1,
                        None,
                    ));
                    k += CONNECTIONS;
                    if cmds.len() == 5_000 || k >= KEYS {
                        for value in send(&mut con, &cmds) {
                            assert_eq!(reply6(&value)[0], 1);
                        }
                        cmds.clear();
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("a soak connection panicked");
    }
    let live = dbsize(&mut con);
    let peak = memory("used_memory");
    eprintln!(
        "{KEYS} CHECKs in {:?}; {live} keys live after, used_memory {baseline} -> {peak}",
        started.elapsed()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while dbsize(&mut con) > 0 {
        assert!(
            Instant::now() < deadline,
            "{} keys still there 30 s later",
            dbsize(&mut con)
        );
        thread::sleep(Duration::from_millis(100));
    }
    // The key tables shrink in the next cron runs.
    let mut used = memory("used_memory");
    let settle = Instant::now() + Duration::from_secs(5);
    while used > baseline + 1_000_000 && Instant::now() < settle {
        thread::sleep(Duration::from_millis(100));
        used = memory("used_memory");
    }
    eprintln!(
        "all expired after {:?}: used_memory {used} (baseline {baseline}, peak {peak})",
        started.elapsed()
    );
    assert!(
        peak > baseline + 10_000_000,
        "the soak did not allocate: {peak}"
    );
    // Slack: 1 MB for the client buffers and the key tables' smallest sizes; a leak of even 16
    // bytes per limiter would be 16 MB.
    assert!(
        used < baseline + 1_000_000,
        "used_memory {used} did not return near the baseline {baseline}"
    );
    let stats = server.info("ratelimit");
    for algorithm in ALGORITHMS {
        let field = format!("ratelimit_{}_keys", algorithm.replace('-', "_"));
        assert_eq!(
            stats.get(&field).map(String::as_str),
            Some("0"),
            "{field}: {stats:?}"
        );
    }
}
