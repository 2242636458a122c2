//! `RATELIMIT.CHECKALL` against a real redis-server, checked against docs/algorithms.md's model
//! (testkit/src/model.rs): each key decides as CHECK would (the pure cores of
//! `redis_ratelimit_core::algorithms`, whose arithmetic other tests hold to the worked examples and the
//! Lua references), and the call as a whole is all-or-nothing, with the overall decision built
//! from the per-key ones by the rules of docs/algorithms.md ("CHECKALL"), re-implemented in the
//! model independently of the module's own `combine`.
//!
//! `RATELIMIT_CHECKALL_SEQUENCES` sets how many random sequences run (default 150);
//! `RATELIMIT_CHECKALL_SEED` replays one sequence.

use crate::common;

use std::time::Duration;

use common::model::{checkall_reply, Model, Spec};
use common::rng::{parse_seed, Rng};
use common::{
    assert_replica_matches, cmd_error, cmd_line, exists, future_base_ms, info_int, limiter_info,
    master_and_replica, run_ok, show_cmd, snapshot, Server,
};
use redis::Value;
use redis_ratelimit_core::algorithms::{Algorithm, Request};

// ---------------------------------------------------------------------------------------------
// Random limits and costs

fn random_spec(rng: &mut Rng, algorithm: Algorithm) -> Spec {
    let limit = rng.range(1, 5);
    let burst = (algorithm.is_bucket() && rng.chance(40)).then(|| rng.range(1, 7));
    Spec {
        algorithm,
        limit,
        period_ms: rng.pick(&[500, 1000, 2000, 60_000]),
        burst,
    }
}

fn random_cost(rng: &mut Rng) -> u64 {
    match rng.range(1, 100) {
        1..=10 => 0,
        11..=75 => 1,
        76..=95 => rng.range(2, 3),
        _ => rng.range(6, 12), // above most limits: retry_after -1
    }
}

// ---------------------------------------------------------------------------------------------
// Talking to the server

fn checkall_cmd(keys: &[&str], specs: &[Spec], cost: u64, at_ms: u64) -> redis::Cmd {
    let mut cmd = redis::cmd("RATELIMIT.CHECKALL");
    cmd.arg(keys.len()).arg(keys);
    for spec in specs {
        cmd.arg(spec.args());
    }
    cmd.arg("COST").arg(cost).arg("AT").arg(at_ms);
    cmd
}

fn check_cmd(key: &str, spec: &Spec, cost: u64, at_ms: u64) -> redis::Cmd {
    let mut cmd = redis::cmd("RATELIMIT.CHECK");
    cmd.arg(key)
        .arg(spec.args())
        .arg("COST")
        .arg(cost)
        .arg("AT")
        .arg(at_ms);
    cmd
}

fn sequences() -> u64 {
    std::env::var("RATELIMIT_CHECKALL_SEQUENCES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150)
}

// ---------------------------------------------------------------------------------------------
// Tests

/// Random sequences over 1 to 4 keys of mixed algorithms, CHECKALLs over random subsets in random
/// orders interleaved with single-key CHECKs: every reply equals the model's, and whenever any key
/// rejects, no key changes at all (DUMP payload and absolute expiry).
#[test]
fn random_sequences_follow_the_model() {
    follow_the_model(1..=4, sequences(), "seq");
}

/// The same over 9 to 40 keys: more than the module handles on the stack (`FEW_KEYS`, 8), so
/// its lists move to the heap, and a key named again makes the call's keys repeat there.
#[test]
fn random_sequences_of_many_keys_follow_the_model() {
    follow_the_model(9..=40, sequences().div_ceil(10), "many");
}

/// Runs `sequences` random sequences (see above) of a number of keys in `counts`, the keys
/// named with `prefix`.
fn follow_the_model(counts: std::ops::RangeInclusive<u64>, sequences: u64, prefix: &str) {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    let seeds: Vec<u64> = match std::env::var("RATELIMIT_CHECKALL_SEED") {
        Ok(seed) => vec![parse_seed(&seed).expect("RATELIMIT_CHECKALL_SEED")],
        Err(_) => (1..=sequences).collect(),
    };
    let (mut admitted, mut refused, mut steps) = (0, 0, 0);
    for seed in seeds {
        let mut rng = Rng::new(seed);
        let mut model = Model::default();
        let count = rng.range(*counts.start(), *counts.end()) as usize;
        let keys: Vec<String> = (0..count).map(|i| format!("{prefix}{seed}:k{i}")).collect();
        let mut specs: Vec<Spec> = (0..count)
            .map(|_| {
                let algorithm = rng.pick(&Algorithm::ALL);
                random_spec(&mut rng, algorithm)
            })
            .collect();
        let mut at = base + rng.range(0, 5_000);
        for step in 0..40 {
            steps += 1;
            // Time mostly moves forward, in bursts and gaps; now and then a call comes late.
            match rng.range(1, 100) {
                1..=30 => {}
                31..=90 => at += rng.range(1, 400),
                91..=95 => at += rng.range(1_000, 3_000),
                _ => at = at.saturating_sub(rng.range(1, 300)).max(base),
            }
            if rng.chance(5) {
                // New parameters for one key (same algorithm): the state carries over.
                let i = rng.range(0, count as u64 - 1) as usize;
                specs[i] = random_spec(&mut rng, specs[i].algorithm);
            }
            let cost = random_cost(&mut rng);
            let context = format!("seed {seed} step {step}");
            if rng.chance(20) {
                let i = rng.range(0, count as u64 - 1) as usize;
                let reply: Vec<i64> = check_cmd(&keys[i], &specs[i], cost, at)
                    .query(&mut con)
                    .unwrap_or_else(|e| panic!("{context}: CHECK: {e}"));
                let expected = model.check(&keys[i], &specs[i].request(cost, at));
                assert_eq!(reply, expected.to_array(), "{context}: CHECK {}", keys[i]);
                continue;
            }
            let mut order: Vec<usize> = (0..count).collect();
            rng.shuffle(&mut order);
            order.truncate(rng.range(1, count as u64) as usize);
            let mut chosen: Vec<Spec> = order.iter().map(|&i| specs[i]).collect();
            if rng.chance(15) {
                // A key named again, with its own limit or another of the same algorithm.
                let i = rng.pick(&order);
                let spec = if rng.chance(50) {
                    specs[i]
                } else {
                    random_spec(&mut rng, specs[i].algorithm)
                };
                let at = rng.range(0, order.len() as u64) as usize;
                order.insert(at, i);
                chosen.insert(at, spec);
            }
            let names: Vec<&str> = order.iter().map(|&i| keys[i].as_str()).collect();
            let requests: Vec<Request> = chosen.iter().map(|s| s.request(cost, at)).collect();
            let before = snapshot(&mut con, &keys);
            let cmd = checkall_cmd(&names, &chosen, cost, at);
            let reply: Vec<Vec<i64>> = cmd
                .query(&mut con)
                .unwrap_or_else(|e| panic!("{context}: {}: {e}", show_cmd(&cmd)));
            let expected = checkall_reply(&model.checkall(&names, &requests));
            assert_eq!(reply, expected, "{context}: {}", show_cmd(&cmd));
            if reply[0][0] == 1 {
                admitted += 1;
            } else {
                refused += 1;
                assert_eq!(
                    snapshot(&mut con, &keys),
                    before,
                    "{context}: a rejected CHECKALL changed a key: {}",
                    show_cmd(&cmd)
                );
            }
            if names.len() == 1 {
                assert_eq!(reply[0], reply[1], "{context}: one key: overall = its own");
            }
        }
    }
    eprintln!("{steps} steps, {admitted} CHECKALLs admitted, {refused} refused");
    assert!(
        admitted > 0 && refused > 0,
        "the sequences never admit or never refuse"
    );
}

/// `CHECKALL 1 key <args>` is `CHECK key <args>`: the same reply (as the overall decision and as
/// the key's own) and the same stored state and expiry, over random sequences, with the options
/// in random order.
#[test]
fn checkall_of_one_key_equals_check() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    for seed in 1..=sequences() / 2 {
        let mut rng = Rng::new(seed ^ 0xC4EC_CA11);
        let algorithm = rng.pick(&Algorithm::ALL);
        let mut spec = random_spec(&mut rng, algorithm);
        let (one, all) = (format!("one{seed}"), format!("all{seed}"));
        let mut at = base + rng.range(0, 5_000);
        for step in 0..30 {
            at += rng.pick(&[0, 0, 1, 50, 200, 700, 1500]);
            if rng.chance(5) {
                spec = random_spec(&mut rng, algorithm);
            }
            // The arguments after the key, options shuffled (BURST among them).
            let mut options: Vec<[String; 2]> = vec![
                ["COST".into(), random_cost(&mut rng).to_string()],
                ["AT".into(), at.to_string()],
            ];
            if let Some(burst) = spec.burst {
                options.push(["burst".into(), burst.to_string()]);
            }
            rng.shuffle(&mut options);
            let mut tail = vec![
                spec.algorithm.name().to_string(),
                spec.limit.to_string(),
                spec.period_ms.to_string(),
            ];
            tail.extend(options.into_iter().flatten());
            let check: Vec<i64> = redis::cmd("RATELIMIT.CHECK")
                .arg(&one)
                .arg(&tail)
                .query(&mut con)
                .unwrap_or_else(|e| panic!("seed {seed} step {step}: CHECK {tail:?}: {e}"));
            let checkall: Vec<Vec<i64>> = redis::cmd("RATELIMIT.CHECKALL")
                .arg(1)
                .arg(&all)
                .arg(&tail)
                .query(&mut con)
                .unwrap_or_else(|e| panic!("seed {seed} step {step}: CHECKALL {tail:?}: {e}"));
            assert_eq!(
                checkall,
                vec![check.clone(), check],
                "seed {seed} step {step}: {tail:?}"
            );
            assert_eq!(
                snapshot(&mut con, std::slice::from_ref(&all)),
                snapshot(&mut con, std::slice::from_ref(&one)),
                "seed {seed} step {step}: stored state differs"
            );
        }
    }
}

/// A per-second and a per-hour limit, as in docs/commands.md ("RATELIMIT.CHECKALL"). A request
/// the per-second limit refuses consumes nothing from the per-hour one; the reply shows which
/// limit refused.
#[test]
fn all_or_nothing_with_per_key_views() {
    let server = Server::start();
    let mut con = server.client();
    let t = future_base_ms();
    let call = |con: &mut redis::Connection, at: u64, cost: u64| -> Vec<Vec<i64>> {
        redis::cmd("RATELIMIT.CHECKALL")
            .arg(2)
            .arg("{u1}:sec")
            .arg("{u1}:hour")
            .arg(&["fixed-window", "2", "1s", "token-bucket", "100", "1h"])
            .arg("COST")
            .arg(cost)
            .arg("AT")
            .arg(at)
            .query(con)
            .expect("CHECKALL")
    };
    assert_eq!(
        call(&mut con, t, 1),
        [
            [1, 2, 1, 0, 36_000, 0],
            [1, 2, 1, 0, 1000, 0],
            [1, 100, 99, 0, 36_000, 0]
        ]
    );
    assert_eq!(
        call(&mut con, t + 1, 1),
        [
            [1, 2, 0, 0, 71_999, 0],
            [1, 2, 0, 0, 999, 0],
            [1, 100, 98, 0, 71_999, 0]
        ]
    );
    let before = snapshot(&mut con, &["{u1}:sec".into(), "{u1}:hour".into()]);
    // The per-second window is full: refused, and the hour keeps its 98.
    assert_eq!(
        call(&mut con, t + 2, 1),
        [
            [0, 2, 0, 998, 107_998, 0],
            [0, 2, 0, 998, 998, 0],
            [1, 100, 97, 0, 107_998, 0]
        ]
    );
    assert_eq!(
        snapshot(&mut con, &["{u1}:sec".into(), "{u1}:hour".into()]),
        before
    );
    // COST 0 asks everywhere and consumes nothing.
    assert_eq!(call(&mut con, t + 2, 0)[2], [1, 100, 98, 0, 71_998, 0]);
    // A cost above the per-second limit can never pass: -1 overall.
    assert_eq!(call(&mut con, t + 1000, 3)[0], [0, 2, 2, -1, 179_000, 0]);
    // Next second: admitted again, and the hour pays.
    assert_eq!(call(&mut con, t + 1000, 1)[2], [1, 100, 97, 0, 107_000, 0]);
}

/// RESP3: the overall decision is a map with a `limits` array of per-key maps.
#[test]
fn resp3_reply_is_a_map_with_limits() {
    let server = Server::start();
    let mut con = server.client_resp3();
    let t = future_base_ms();
    let reply: Value = redis::cmd("RATELIMIT.CHECKALL")
        .arg(2)
        .arg("a")
        .arg("b")
        .arg(&["sliding-log", "1", "1s", "leaky-bucket", "3", "1s"])
        .arg("AT")
        .arg(t)
        .query(&mut con)
        .expect("CHECKALL");
    let Value::Map(fields) = reply else {
        panic!("not a map: {reply:?}");
    };
    let names: Vec<String> = fields
        .iter()
        .map(|(name, _)| redis::from_redis_value(name).expect("a name"))
        .collect();
    assert_eq!(
        names,
        [
            "allowed",
            "limit",
            "remaining",
            "retry_after_ms",
            "reset_after_ms",
            "delay_ms",
            "limits"
        ]
    );
    assert_eq!(fields[0].1, Value::Boolean(true));
    assert_eq!(fields[2].1, Value::Int(0));
    let Value::Array(limits) = &fields[6].1 else {
        panic!("limits is not an array: {:?}", fields[6].1);
    };
    assert_eq!(limits.len(), 2);
    for (limit, expected) in limits
        .iter()
        .zip([[1, 1, 0, 0, 1000, 0], [1, 3, 2, 0, 334, 0]])
    {
        let Value::Map(fields) = limit else {
            panic!("a limit is not a map: {limit:?}");
        };
        assert_eq!(fields.len(), 6);
        assert_eq!(fields[0].1, Value::Boolean(true));
        let values: Vec<i64> = fields[1..]
            .iter()
            .map(|(_, v)| redis::from_redis_value(v).expect("an integer"))
            .collect();
        assert_eq!(values, expected[1..]);
    }
}

/// Every bad call gets an error and changes nothing: bad arguments, a key given twice, a key of
/// another type, a key holding another algorithm.
#[test]
fn errors_change_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let t = future_base_ms().to_string();
    let keys: Vec<String> = ["x", "y", "str"].map(String::from).to_vec();
    let _: Vec<i64> = redis::cmd("RATELIMIT.CHECK")
        .arg(&["x", "token-bucket", "3", "1s", "AT", &t])
        .query(&mut con)
        .unwrap();
    run_ok(&mut con, "SET str v");
    let before = snapshot(&mut con, &keys);
    let cases = [
        ("0 x fixed-window 1 1s", "numkeys"),
        ("x x fixed-window 1 1s", "numkeys"),
        ("9 x y fixed-window 1", "numkeys"),
        (
            "2 x y token-bucket 3 1s",
            "2 keys need 2 limit specs (one per key, in order); found 1",
        ),
        (
            "2 x y token-bucket 3 1s COST 1 AT 5",
            "2 keys need 2 limit specs (one per key, in order); found 1",
        ),
        (
            "1 x token-bucket 3 1s fixed-window 1 1s",
            "1 key needs 1 limit spec (one per key, in order); found 2",
        ),
        (
            "2 y x fixed-window 1 1s BURST 2 token-bucket 3 1s",
            "BURST applies only",
        ),
        (
            "2 y x leaky-window 1 1s token-bucket 3 1s",
            "unknown algorithm 'leaky-window'",
        ),
        (
            "2 y x fixed-window 1 1 minute token-bucket 3 1s",
            "limit spec 2 (key 'x'): unknown algorithm 'minute'",
        ),
        ("2 y x fixed-window 1 1s token-bucket 3 1s COST -1", "COST"),
        (
            "2 y x fixed-window 1 1s token-bucket 3 1s LIMIT 1",
            "unknown option 'LIMIT'",
        ),
        ("2 y str fixed-window 1 1s fixed-window 1 1s", "WRONGTYPE"),
        (
            "2 y x fixed-window 1 1s sliding-log 3 1s",
            "holds a token-bucket limiter, not sliding-log",
        ),
    ];
    for (args, needle) in cases {
        let cmd = cmd_line(&format!("RATELIMIT.CHECKALL {args} AT {t}"));
        let error = cmd_error(&mut con, &cmd);
        assert!(
            error.contains(needle),
            "{args:?}: {error:?} lacks {needle:?}"
        );
        assert_eq!(snapshot(&mut con, &keys), before, "{args:?} changed a key");
    }
    let error = cmd_error(&mut con, &cmd_line("RATELIMIT.CHECKALL 1 x"));
    assert!(error.contains("wrong number of arguments"), "{error}");
}

/// The keys are declared: `COMMAND GETKEYS`, `COMMAND INFO`'s key spec, ACL key patterns.
#[test]
fn keys_are_declared() {
    let server = Server::start();
    let mut con = server.client();
    let keys: Vec<String> = cmd_line(
        "COMMAND GETKEYS RATELIMIT.CHECKALL 3 a b c \
         token-bucket 1 1s fixed-window 2 1s sliding-log 3 1m COST 2",
    )
    .query(&mut con)
    .expect("COMMAND GETKEYS");
    assert_eq!(keys, ["a", "b", "c"]);
    let info: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("ratelimit.checkall")
        .query(&mut con)
        .expect("COMMAND INFO");
    let text = format!("{info:?}");
    for needle in ["movablekeys", "write", "denyoom", "keynum", "RW"] {
        assert!(text.contains(needle), "COMMAND INFO lacks {needle}: {text}");
    }

    for user in [
        "ACL SETUSER tenant1 on >secret ~tenant1:* +ratelimit.checkall",
        "ACL SETUSER reader on >secret %R~* +ratelimit.checkall",
    ] {
        let _: () = cmd_line(user).query(&mut con).expect("ACL SETUSER");
    }
    let connect = |user: &str| {
        redis::Client::open(format!(
            "redis://{user}:secret@127.0.0.1:{}/",
            server.port()
        ))
        .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(10)))
        .expect("connect as an ACL user")
    };
    let checkall = |a: &str, b: &str| {
        let mut cmd = redis::cmd("RATELIMIT.CHECKALL");
        cmd.arg(2)
            .arg(a)
            .arg(b)
            .arg(&["fixed-window", "5", "1s", "fixed-window", "5", "1m"]);
        cmd
    };
    let mut tenant = connect("tenant1");
    let reply: Vec<Vec<i64>> = checkall("tenant1:a", "tenant1:b")
        .query(&mut tenant)
        .expect("keys inside the pattern");
    assert_eq!(reply[0][0], 1);
    for (a, b) in [("tenant1:a", "tenant2:b"), ("other", "tenant1:b")] {
        let error = cmd_error(&mut tenant, &checkall(a, b));
        assert!(error.contains("NOPERM"), "{a} {b}: {error}");
    }
    // Keys only readable: CHECKALL writes, so it is refused.
    let error = cmd_error(&mut connect("reader"), &checkall("r1", "r2"));
    assert!(error.contains("NOPERM"), "{error}");
    for key in ["tenant2:b", "other", "r1", "r2"] {
        assert!(!exists(&mut con, key), "{key}");
    }
}

/// Replicas reproduce every key exactly (same digest, same absolute expiry); stats count one
/// decision per key; `ratelimit.rejected` goes to the keys that refused, and only to them.
#[test]
fn replication_stats_and_notifications() {
    let (master, replica) = master_and_replica();
    let mut con = master.client();
    let base = future_base_ms();
    let mut rng = Rng::new(77);
    let specs: Vec<Spec> = Algorithm::ALL[..4]
        .iter()
        .map(|&algorithm| random_spec(&mut rng, algorithm))
        .chain([Spec {
            algorithm: Algorithm::SlidingLog,
            limit: 4,
            period_ms: 1000,
            burst: None,
        }])
        .collect();
    let keys: Vec<String> = (0..5).map(|i| format!("r{i}")).collect();
    let mut at = base;
    for _ in 0..200 {
        at += rng.range(0, 300);
        let mut order: Vec<usize> = (0..5).collect();
        rng.shuffle(&mut order);
        order.truncate(rng.range(1, 5) as usize);
        let names: Vec<&str> = order.iter().map(|&i| keys[i].as_str()).collect();
        let chosen: Vec<Spec> = order.iter().map(|&i| specs[i]).collect();
        let _: Vec<Vec<i64>> = checkall_cmd(&names, &chosen, random_cost(&mut rng), at)
            .query(&mut con)
            .expect("CHECKALL");
    }
    // Inside MULTI too.
    let _: Value = redis::pipe()
        .atomic()
        .add_command(checkall_cmd(&["r0", "r4"], &[specs[0], specs[4]], 1, at))
        .add_command(checkall_cmd(&["r4", "r1"], &[specs[4], specs[1]], 1, at))
        .query(&mut con)
        .expect("MULTI");
    // Every key the same on the replica: digest, expiry, RATELIMIT.INFO; and nothing else.
    assert_replica_matches(&master, &replica, &keys);

    // Stats: a fresh server, one refused CHECKALL over three keys, one admitted over two.
    let server = Server::start();
    let mut con = server.client();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "notify-keyspace-events", "Kd"])
        .query(&mut con)
        .unwrap();
    let mut subscriber = server.client();
    subscriber
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut pubsub = subscriber.as_pubsub();
    pubsub.psubscribe("__keyspace@0__:*").unwrap();
    let t = future_base_ms();
    let window = Spec {
        algorithm: Algorithm::FixedWindow,
        limit: 1,
        period_ms: 1000,
        burst: None,
    };
    let bucket = Spec {
        algorithm: Algorithm::TokenBucket,
        limit: 5,
        period_ms: 1000,
        burst: None,
    };
    let reply: Vec<Vec<i64>> = checkall_cmd(&["w1", "b1"], &[window, bucket], 1, t)
        .query(&mut con)
        .unwrap();
    assert_eq!(reply[0][0], 1);
    // w1 and w2 are full (w2 fresh, cost 2 > 1); b1 has room.
    let reply: Vec<Vec<i64>> = checkall_cmd(&["w1", "b1", "w2"], &[window, bucket, window], 2, t)
        .query(&mut con)
        .unwrap();
    assert_eq!(reply.iter().map(|d| d[0]).collect::<Vec<_>>(), [0, 0, 1, 0]);
    // A marker event, so the absence of one for b1 is seen.
    let _: Vec<i64> = check_cmd("marker", &window, 5, t).query(&mut con).unwrap();
    let mut events = Vec::new();
    loop {
        let message = pubsub.get_message().expect("a keyspace event");
        let channel = message.get_channel_name().to_string();
        let payload: String = message.get_payload().unwrap();
        events.push((channel.clone(), payload));
        if channel.ends_with(":marker") {
            break;
        }
    }
    assert_eq!(
        events,
        ["w1", "w2", "marker"].map(|key| (
            format!("__keyspace@0__:{key}"),
            "ratelimit.rejected".to_string()
        ))
    );
    let info = server.info("ratelimit");
    let field = |name: &str| -> u64 {
        info.iter()
            .find(|(key, _)| key.ends_with(name))
            .unwrap_or_else(|| panic!("INFO ratelimit lacks {name}: {info:?}"))
            .1
            .parse()
            .unwrap()
    };
    // fixed-window: w1 admitted, then w1 and w2 refused, then the marker refused.
    assert_eq!(field("fixed_window_allowed"), 1);
    assert_eq!(field("fixed_window_rejected"), 3);
    // token-bucket: b1 admitted once, then part of the refused call (nothing consumed).
    assert_eq!(field("token_bucket_allowed"), 1);
    assert_eq!(field("token_bucket_rejected"), 1);
    assert_eq!(field("token_bucket_calls"), 2);
}

/// A key named twice is two limits on one key, decided and consumed in order (the second sees
/// what the first consumed), exactly as two CHECKs in a row, and still all or nothing.
#[test]
fn a_key_named_twice_counts_twice() {
    let server = Server::start();
    let mut con = server.client();
    let t = future_base_ms();
    let call = |con: &mut redis::Connection, args: &str, at: u64| -> Vec<Vec<i64>> {
        cmd_line(&format!("RATELIMIT.CHECKALL {args} AT {at}"))
            .query(con)
            .unwrap_or_else(|e| panic!("{args}: {e}"))
    };
    let twice = "2 k k fixed-window 2 1s fixed-window 2 1s";
    assert_eq!(
        call(&mut con, twice, t),
        [
            [1, 2, 0, 0, 1000, 0],
            [1, 2, 1, 0, 1000, 0],
            [1, 2, 0, 0, 1000, 0]
        ]
    );
    let info = limiter_info(&mut con, "k").expect("k is stored");
    assert_eq!(info_int(&info, "count"), 2, "{info:?}");
    // Full: both occurrences rejected.
    assert_eq!(
        call(&mut con, twice, t + 1),
        [
            [0, 2, 0, 999, 999, 0],
            [0, 2, 0, 999, 999, 0],
            [0, 2, 0, 999, 999, 0]
        ]
    );
    // The first occurrence alone would pass, the second cannot: nothing is consumed.
    assert_eq!(
        call(&mut con, "2 c c fixed-window 1 1s fixed-window 1 1s", t),
        [
            [0, 1, 0, 1000, 1000, 0],
            [1, 1, 0, 0, 1000, 0],
            [0, 1, 0, 1000, 1000, 0]
        ]
    );
    assert!(!exists(&mut con, "c"));
    // Between other keys, and with other parameters: the same as the CHECKs in sequence.
    let mixed = "3 a b a token-bucket 2 1s fixed-window 5 1s token-bucket 4 2s";
    let reply = call(&mut con, mixed, t);
    let mut sequence = Vec::new();
    for check in [
        "a2 token-bucket 2 1s",
        "b2 fixed-window 5 1s",
        "a2 token-bucket 4 2s",
    ] {
        let one: Vec<i64> = cmd_line(&format!("RATELIMIT.CHECK {check} AT {t}"))
            .query(&mut con)
            .unwrap();
        sequence.push(one);
    }
    assert_eq!(reply[1..], sequence[..]);
    let snapshot_of = |con: &mut redis::Connection, key: &str| snapshot(con, &[key.to_string()]);
    assert_eq!(snapshot_of(&mut con, "a"), snapshot_of(&mut con, "a2"));
    assert_eq!(snapshot_of(&mut con, "b"), snapshot_of(&mut con, "b2"));
    // Two algorithms on one key: the second is refused as the second CHECK would be.
    let error = cmd_error(
        &mut con,
        &cmd_line("RATELIMIT.CHECKALL 2 n n token-bucket 2 1s fixed-window 2 1s"),
    );
    assert!(
        error.contains("holds a token-bucket limiter, not fixed-window"),
        "{error}"
    );
    assert!(!exists(&mut con, "n"));
}

/// An error inside a limit spec names the spec and its key; numkeys is named before the count of
/// the other arguments.
#[test]
fn errors_name_the_spec() {
    let server = Server::start();
    let mut con = server.client();
    let cases = [
        (
            "2 x y token-bucket 3 1s fixed-window 1 1s BURST 2",
            "limit spec 2 (key 'y'): BURST applies only to token-bucket, leaky-bucket and gcra",
        ),
        (
            "2 x y fixed-window 1 1s BURST 2 token-bucket 3 1s",
            "limit spec 1 (key 'x'): BURST applies only",
        ),
        (
            "2 x y token-bucket 3 1s token-bucket 3 1y",
            "limit spec 2 (key 'y'): period must be",
        ),
        ("0 k", "numkeys must be"),
        ("0", "numkeys must be"),
    ];
    for (args, needle) in cases {
        let error = cmd_error(&mut con, &cmd_line(&format!("RATELIMIT.CHECKALL {args}")));
        assert!(
            error.contains(needle),
            "{args:?}: {error:?} lacks {needle:?}"
        );
    }
}
