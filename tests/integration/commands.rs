//! RATELIMIT.CHECK, PEEK, RESET and INFO through a real redis-server: the contract of
//! docs/algorithms.md and docs/commands.md.

use crate::common;

use std::collections::BTreeMap;

use common::{
    cmd_line, dbsize, exists, future_base_ms, info_int, int, limiter_info, now_ms, pexpiretime,
    run_error, run_ok, six, Server,
};
use redis::{Connection, Value};
use redis_ratelimit_core::algorithms::Algorithm;

/// One call of a worked example (docs/algorithms.md, "Worked examples") and the reply it must
/// get. `at` is an offset from an aligned future base; the other fields are the reply's.
#[derive(Clone, Copy, Debug)]
struct Step {
    at: u64,
    cost: u64,
    allowed: bool,
    limit: i64,
    remaining: i64,
    retry_after: i64,
    reset_after: i64,
    delay: i64,
}

impl Step {
    /// The six integers of the reply.
    fn reply(&self) -> [i64; 6] {
        [
            i64::from(self.allowed),
            self.limit,
            self.remaining,
            self.retry_after,
            self.reset_after,
            self.delay,
        ]
    }
}

/// Runs a worked example on a fresh key: `RATELIMIT.CHECK key <limit> COST cost AT base + at` per
/// step, each reply the step's; every consuming call leaves the key expiring at
/// `t + reset_after_ms`.
fn timeline(con: &mut Connection, key: &str, limit: &str, steps: &[Step]) {
    let base = future_base_ms();
    for step in steps {
        let t = base + step.at;
        let line = format!("RATELIMIT.CHECK {key} {limit} COST {} AT {t}", step.cost);
        let reply = six(con, &line);
        assert_eq!(reply, step.reply(), "{limit}: {step:?}");
        if step.allowed && step.cost > 0 {
            assert_eq!(
                pexpiretime(con, key),
                (t + step.reset_after as u64) as i64,
                "{line}"
            );
        }
    }
}

/// The five tables of docs/algorithms.md, "Worked examples", a row a step (laid out by hand).
#[rustfmt::skip]
#[test]
fn spec_worked_examples() {
    let server = Server::start();
    let mut con = server.client();

    // Token bucket, 3 per second: one token every 333⅓ ms, 1000 scaled units a request. Three
    // requests empty the bucket, the fourth waits ⌈1000/3⌉ ms; later calls see the refill; COST 0
    // on a refilled bucket answers as a fresh key and stores nothing.
    timeline(&mut con, "tb", "token-bucket 3 1000", &[
        Step { at: 0,    cost: 1, allowed: true,  limit: 3, remaining: 2, retry_after: 0,   reset_after: 334,  delay: 0 },
        Step { at: 0,    cost: 1, allowed: true,  limit: 3, remaining: 1, retry_after: 0,   reset_after: 667,  delay: 0 },
        Step { at: 0,    cost: 1, allowed: true,  limit: 3, remaining: 0, retry_after: 0,   reset_after: 1000, delay: 0 },
        Step { at: 0,    cost: 1, allowed: false, limit: 3, remaining: 0, retry_after: 334, reset_after: 1000, delay: 0 },
        Step { at: 331,  cost: 1, allowed: false, limit: 3, remaining: 0, retry_after: 3,   reset_after: 669,  delay: 0 },
        Step { at: 400,  cost: 2, allowed: false, limit: 3, remaining: 1, retry_after: 267, reset_after: 600,  delay: 0 },
        Step { at: 1000, cost: 0, allowed: true,  limit: 3, remaining: 3, retry_after: 0,   reset_after: 0,    delay: 0 },
    ]);

    // Leaky bucket, 3 per second: the same arithmetic as the token bucket, but admitted requests
    // queue: each waits (delay) behind those before it until the queue is full.
    timeline(&mut con, "lb", "leaky-bucket 3 1000", &[
        Step { at: 0,    cost: 1, allowed: true,  limit: 3, remaining: 2, retry_after: 0,   reset_after: 334,  delay: 0 },
        Step { at: 0,    cost: 1, allowed: true,  limit: 3, remaining: 1, retry_after: 0,   reset_after: 667,  delay: 334 },
        Step { at: 0,    cost: 1, allowed: true,  limit: 3, remaining: 0, retry_after: 0,   reset_after: 1000, delay: 667 },
        Step { at: 0,    cost: 1, allowed: false, limit: 3, remaining: 0, retry_after: 334, reset_after: 1000, delay: 0 },
        Step { at: 331,  cost: 1, allowed: false, limit: 3, remaining: 0, retry_after: 3,   reset_after: 669,  delay: 0 },
        Step { at: 1500, cost: 1, allowed: true,  limit: 3, remaining: 2, retry_after: 0,   reset_after: 334,  delay: 0 },
    ]);

    // Fixed window, 2 per second: windows [0, 1000), [1000, 2000); a full window rejects until
    // it ends, COST 0 still fits, and a cost above the limit can never pass (retry_after -1).
    timeline(&mut con, "fw", "fixed-window 2 1000", &[
        Step { at: 100,  cost: 1, allowed: true,  limit: 2, remaining: 1, retry_after: 0,   reset_after: 900,  delay: 0 },
        Step { at: 200,  cost: 1, allowed: true,  limit: 2, remaining: 0, retry_after: 0,   reset_after: 800,  delay: 0 },
        Step { at: 300,  cost: 1, allowed: false, limit: 2, remaining: 0, retry_after: 700, reset_after: 700,  delay: 0 },
        Step { at: 999,  cost: 0, allowed: true,  limit: 2, remaining: 0, retry_after: 0,   reset_after: 1,    delay: 0 },
        Step { at: 1000, cost: 2, allowed: true,  limit: 2, remaining: 0, retry_after: 0,   reset_after: 1000, delay: 0 },
        Step { at: 1001, cost: 3, allowed: false, limit: 2, remaining: 0, retry_after: -1,  reset_after: 999,  delay: 0 },
    ]);

    // Sliding window, 2 per second: the previous window's count weighs what is left of it, so a
    // request fits once enough of the previous window has slid out.
    timeline(&mut con, "sw", "sliding-window 2 1000", &[
        Step { at: 0,    cost: 1, allowed: true,  limit: 2, remaining: 1, retry_after: 0,    reset_after: 2000, delay: 0 },
        Step { at: 100,  cost: 1, allowed: true,  limit: 2, remaining: 0, retry_after: 0,    reset_after: 1900, delay: 0 },
        Step { at: 200,  cost: 1, allowed: false, limit: 2, remaining: 0, retry_after: 1300, reset_after: 1800, delay: 0 },
        Step { at: 1500, cost: 1, allowed: true,  limit: 2, remaining: 0, retry_after: 0,    reset_after: 1500, delay: 0 },
        Step { at: 1999, cost: 1, allowed: false, limit: 2, remaining: 0, retry_after: 1,    reset_after: 1001, delay: 0 },
        Step { at: 2000, cost: 1, allowed: true,  limit: 2, remaining: 0, retry_after: 0,    reset_after: 2000, delay: 0 },
    ]);

    // Sliding log, 2 per second: every entry counts, two in one millisecond included; a request
    // fits when the oldest entry leaves the window (0, t].
    timeline(&mut con, "sl", "sliding-log 2 1000", &[
        Step { at: 0,    cost: 1, allowed: true,  limit: 2, remaining: 1, retry_after: 0,   reset_after: 1000, delay: 0 },
        Step { at: 0,    cost: 1, allowed: true,  limit: 2, remaining: 0, retry_after: 0,   reset_after: 1000, delay: 0 },
        Step { at: 500,  cost: 1, allowed: false, limit: 2, remaining: 0, retry_after: 500, reset_after: 500,  delay: 0 },
        Step { at: 1000, cost: 1, allowed: true,  limit: 2, remaining: 1, retry_after: 0,   reset_after: 1000, delay: 0 },
        Step { at: 1000, cost: 1, allowed: true,  limit: 2, remaining: 0, retry_after: 0,   reset_after: 1000, delay: 0 },
        Step { at: 1400, cost: 1, allowed: false, limit: 2, remaining: 0, retry_after: 600, reset_after: 600,  delay: 0 },
    ]);
}

#[test]
fn resp3_replies_are_maps_with_a_boolean() {
    let server = Server::start();
    let mut con = server.client_resp3();
    let at = future_base_ms();
    let reply: Value = cmd_line(&format!("RATELIMIT.CHECK k token-bucket 3 1000 AT {at}"))
        .query(&mut con)
        .unwrap();
    let Value::Map(pairs) = reply else {
        panic!("expected a map, got {reply:?}");
    };
    let expected = [
        ("allowed", Value::Boolean(true)),
        ("limit", Value::Int(3)),
        ("remaining", Value::Int(2)),
        ("retry_after_ms", Value::Int(0)),
        ("reset_after_ms", Value::Int(334)),
        ("delay_ms", Value::Int(0)),
    ];
    assert_eq!(pairs.len(), expected.len());
    for ((name, value), (expected_name, expected_value)) in pairs.iter().zip(expected) {
        assert_eq!(
            redis::from_redis_value::<String>(name).unwrap(),
            expected_name
        );
        assert_eq!(value, &expected_value, "{expected_name}");
    }
    // A rejection says `false`.
    for _ in 0..3 {
        let _: Value = cmd_line(&format!("RATELIMIT.CHECK k token-bucket 3 1000 AT {at}"))
            .query(&mut con)
            .unwrap();
    }
    let Value::Map(pairs) = cmd_line(&format!("RATELIMIT.PEEK k token-bucket 3 1000 AT {at}"))
        .query(&mut con)
        .unwrap()
    else {
        panic!("expected a map");
    };
    assert_eq!(pairs[0].1, Value::Boolean(false));
}

#[test]
fn bad_arguments_are_named_and_create_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let cases = [
        ("RATELIMIT.CHECK k", "wrong number of arguments"),
        (
            "RATELIMIT.CHECK k token-bucket 10",
            "wrong number of arguments",
        ),
        (
            "RATELIMIT.CHECK k leaky-window 10 1s",
            "unknown algorithm 'leaky-window'",
        ),
        (
            "RATELIMIT.CHECK k sliding-window 100 1 minute",
            "unknown option 'minute': expected BURST, BLOCK, COST or AT; a period takes its unit in the \
             same argument: 1m, not '1 minute'",
        ),
        ("RATELIMIT.CHECK k token-bucket 0 1s", "limit"),
        ("RATELIMIT.CHECK k token-bucket -1 1s", "limit"),
        ("RATELIMIT.CHECK k token-bucket 1.5 1s", "limit"),
        ("RATELIMIT.CHECK k token-bucket 1e3 1s", "limit"),
        ("RATELIMIT.CHECK k token-bucket 1000000000001 1s", "limit"),
        ("RATELIMIT.CHECK k token-bucket 10 0", "period"),
        ("RATELIMIT.CHECK k token-bucket 10 1w", "period"),
        ("RATELIMIT.CHECK k token-bucket 10 3651d", "period"),
        ("RATELIMIT.CHECK k token-bucket 10 1s BURST 0", "BURST"),
        (
            "RATELIMIT.CHECK k token-bucket 10 1s BURST",
            "BURST needs a value",
        ),
        (
            "RATELIMIT.CHECK k fixed-window 10 1s BURST 5",
            "BURST applies only",
        ),
        ("RATELIMIT.CHECK k token-bucket 10 1s COST -1", "COST"),
        (
            "RATELIMIT.CHECK k token-bucket 10 1s COST 1000000000001",
            "COST",
        ),
        (
            "RATELIMIT.CHECK k token-bucket 10 1s COST 1 COST 1",
            "COST given more than once",
        ),
        (
            "RATELIMIT.CHECK k token-bucket 10 1s AT 9007199254740992",
            "AT",
        ),
        ("RATELIMIT.CHECK k token-bucket 10 1s AT -5", "AT"),
        (
            "RATELIMIT.CHECK k token-bucket 10 1s NOW 5",
            "unknown option 'NOW'",
        ),
        ("RATELIMIT.CHECK k sliding-log 100001 1s", "max-log-limit"),
        ("RATELIMIT.PEEK k token-bucket 0 1s", "limit"),
        ("RATELIMIT.RESET", "wrong number of arguments"),
        ("RATELIMIT.INFO", "wrong number of arguments"),
        ("RATELIMIT.INFO a b", "wrong number of arguments"),
    ];
    for (line, needle) in cases {
        let message = run_error(&mut con, line);
        assert!(message.contains(needle), "{line}: {message}");
        assert!(message.starts_with("ERR "), "{line}: {message}");
    }
    assert_eq!(dbsize(&mut con), 0, "an error created a key");
}

#[test]
fn other_types_get_wrongtype_and_other_algorithms_an_error() {
    let server = Server::start();
    let mut con = server.client();
    run_ok(&mut con, "SET s v");
    for line in [
        "RATELIMIT.CHECK s token-bucket 3 1s",
        "RATELIMIT.PEEK s token-bucket 3 1s",
        "RATELIMIT.INFO s",
        "RATELIMIT.RESET s",
    ] {
        assert!(run_error(&mut con, line).starts_with("WRONGTYPE"), "{line}");
    }
    // Per hour: k must outlive the calls below (per second it is full again, and gone, 334 ms
    // after its call).
    six(&mut con, "RATELIMIT.CHECK k token-bucket 3 1h");
    let message = run_error(&mut con, "RATELIMIT.CHECK k fixed-window 3 1s");
    assert!(message.contains("token-bucket"), "{message}");
    // RESET of a mix with another type removes nothing.
    assert!(run_error(&mut con, "RATELIMIT.RESET k s").starts_with("WRONGTYPE"));
    let removed: i64 = redis::cmd("RATELIMIT.RESET")
        .arg(&["k", "missing"])
        .query(&mut con)
        .unwrap();
    assert_eq!(removed, 1);
    assert_eq!(dbsize(&mut con), 1, "only the string is left");
}

#[test]
fn peek_and_cost_zero_change_nothing_and_store_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let at = future_base_ms();
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        let key = format!("k:{algorithm}");
        let spec = format!("{key} {algorithm} 3 1000");
        six(&mut con, &format!("RATELIMIT.PEEK {spec} AT {at}"));
        six(&mut con, &format!("RATELIMIT.CHECK {spec} COST 0 AT {at}"));
        assert!(
            !exists(&mut con, &key),
            "{algorithm}: a fresh key was stored"
        );
        six(&mut con, &format!("RATELIMIT.CHECK {spec} AT {at}"));
        let dump: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut con).unwrap();
        let expiry = pexpiretime(&mut con, &key);
        let peeked = six(
            &mut con,
            &format!("RATELIMIT.PEEK {spec} COST 2 AT {}", at + 10),
        );
        six(
            &mut con,
            &format!("RATELIMIT.CHECK {spec} COST 0 AT {}", at + 10),
        );
        six(
            &mut con,
            &format!("RATELIMIT.CHECK {spec} COST 9 AT {}", at + 10),
        );
        let after: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut con).unwrap();
        assert_eq!(dump, after, "{algorithm}: state changed");
        assert_eq!(
            expiry,
            pexpiretime(&mut con, &key),
            "{algorithm}: TTL changed"
        );
        // PEEK answers exactly what the CHECK that follows answers.
        let checked = six(
            &mut con,
            &format!("RATELIMIT.CHECK {spec} COST 2 AT {}", at + 10),
        );
        assert_eq!(peeked, checked, "{algorithm}");
    }
}

#[test]
fn time_never_runs_backwards_for_a_key() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    // The second call is stamped 900 ms earlier: it is evaluated at the first call's time.
    let first = six(
        &mut con,
        &format!("RATELIMIT.CHECK k token-bucket 1 1000 AT {}", base + 1000),
    );
    assert_eq!(first, [1, 1, 0, 0, 1000, 0]);
    let earlier = six(
        &mut con,
        &format!("RATELIMIT.CHECK k token-bucket 1 1000 AT {}", base + 100),
    );
    assert_eq!(earlier, [0, 1, 0, 1000, 1000, 0]);
    assert_eq!(pexpiretime(&mut con, "k"), (base + 2000) as i64);
}

#[test]
fn parameters_given_on_a_call_win_and_are_carried_over() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    // A token bucket of 10 per second holding 4 tokens, re-read as 10 per 2 s: 8 scaled
    // tokens per request... in requests it keeps 4, clamped to a new capacity of 3.
    six(
        &mut con,
        &format!("RATELIMIT.CHECK tb token-bucket 10 1s COST 6 AT {base}"),
    );
    let reply = six(
        &mut con,
        &format!("RATELIMIT.CHECK tb token-bucket 10 2s BURST 3 COST 0 AT {base}"),
    );
    assert_eq!(reply, [1, 3, 3, 0, 0, 0], "clamped to the new capacity");
    let reply = six(
        &mut con,
        &format!("RATELIMIT.CHECK tb token-bucket 10 2s BURST 20 COST 0 AT {base}"),
    );
    assert_eq!(reply[2], 4, "keeps its 4 tokens under a larger capacity");
    // A fixed window keeps its count under the same period and starts afresh under another.
    six(
        &mut con,
        &format!("RATELIMIT.CHECK fw fixed-window 5 1s COST 4 AT {base}"),
    );
    let same = six(
        &mut con,
        &format!("RATELIMIT.PEEK fw fixed-window 6 1s COST 0 AT {base}"),
    );
    assert_eq!(same[2], 2);
    let other = six(
        &mut con,
        &format!("RATELIMIT.PEEK fw fixed-window 6 2s COST 0 AT {base}"),
    );
    assert_eq!(other[2], 6);
    // The stored parameters change only on a consuming call.
    six(
        &mut con,
        &format!("RATELIMIT.CHECK fw fixed-window 6 1s COST 1 AT {base}"),
    );
    let info = limiter_info(&mut con, "fw").expect("fw is stored");
    assert_eq!(info_int(&info, "limit"), 6);
}

#[test]
fn info_reports_the_stored_state() {
    let server = Server::start();
    let mut con = server.client();
    let nil: Value = redis::cmd("RATELIMIT.INFO")
        .arg("missing")
        .query(&mut con)
        .unwrap();
    assert_eq!(nil, Value::Nil);
    // Use the server's clock: INFO answers for now.
    six(&mut con, "RATELIMIT.CHECK sw sliding-window 10 1h COST 3");
    let fields = limiter_info(&mut con, "sw").expect("sw is stored");
    let get = |name: &str| {
        fields
            .get(name)
            .unwrap_or_else(|| panic!("no {name} in {fields:?}"))
            .clone()
    };
    assert_eq!(
        redis::from_redis_value::<String>(&get("algorithm")).unwrap(),
        "sliding-window"
    );
    assert_eq!(get("limit"), Value::Int(10));
    assert_eq!(get("period_ms"), Value::Int(3_600_000));
    assert_eq!(get("burst"), Value::Int(10));
    assert_eq!(get("remaining"), Value::Int(7));
    assert_eq!(get("count"), Value::Int(3));
    assert_eq!(get("previous"), Value::Int(0));
    let updated: i64 = redis::from_redis_value(&get("updated_at_ms")).unwrap();
    assert!(
        (updated - now_ms() as i64).abs() < 5_000,
        "updated_at_ms {updated}"
    );
    let window_start: i64 = redis::from_redis_value(&get("window_start")).unwrap();
    assert_eq!(window_start % 3_600_000, 0);
    // RESP3: a map.
    let mut con3 = server.client_resp3();
    let map: Value = redis::cmd("RATELIMIT.INFO")
        .arg("sw")
        .query(&mut con3)
        .unwrap();
    assert!(
        matches!(map, Value::Map(ref pairs) if pairs.len() == fields.len()),
        "{map:?}"
    );
}

#[test]
fn server_clock_is_used_without_at() {
    let server = Server::start();
    let mut con = server.client();
    let before = now_ms() as i64;
    let reply = six(&mut con, "RATELIMIT.CHECK k fixed-window 5 1h");
    let after = now_ms() as i64;
    assert_eq!(reply[..4], [1, 5, 4, 0]);
    // Expires at the end of the current aligned hour.
    let expiry = pexpiretime(&mut con, "k");
    let hour = 3_600_000;
    assert_eq!(expiry % hour, 0);
    assert!(expiry > before && expiry <= after + hour, "{expiry}");
}

#[test]
fn keys_expire_when_they_become_fresh() {
    let server = Server::start();
    let mut con = server.client();
    six(&mut con, "RATELIMIT.CHECK k token-bucket 10 100ms");
    let pttl: i64 = redis::cmd("PTTL").arg("k").query(&mut con).unwrap();
    // A tenth of the bucket refills in 10 ms (-2: already expired on a slow machine; never -1).
    assert!(pttl <= 10 && pttl != -1, "PTTL {pttl}");
    std::thread::sleep(std::time::Duration::from_millis(50));
    let exists: i64 = redis::cmd("EXISTS").arg("k").query(&mut con).unwrap();
    assert_eq!(exists, 0);
}

#[test]
fn a_sliding_log_counts_same_millisecond_entries_in_at_most_16_bytes_each() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    // 100,000 entries with distinct timestamps.
    let mut pipe = redis::pipe();
    for i in 0..100_000u64 {
        pipe.cmd("RATELIMIT.CHECK")
            .arg(&["log", "sliding-log", "100000", "1h", "AT"])
            .arg(base + i)
            .ignore();
    }
    let () = pipe.query(&mut con).unwrap();
    let peek = six(
        &mut con,
        &format!(
            "RATELIMIT.PEEK log sliding-log 100000 1h AT {}",
            base + 100_000
        ),
    );
    assert_eq!(peek, [0, 100_000, 0, 3_500_000, 3_600_000 - 1, 0]);
    let usage: i64 = redis::cmd("MEMORY")
        .arg(&["USAGE", "log"])
        .query(&mut con)
        .unwrap();
    assert!(
        usage <= 16 * 100_000,
        "MEMORY USAGE {usage} for 100k entries"
    );
    // Entries at the same ms are counted, never collapsed.
    let at = base + 200_000;
    for _ in 0..3 {
        six(
            &mut con,
            &format!("RATELIMIT.CHECK same sliding-log 3 1s AT {at}"),
        );
    }
    let fourth = six(
        &mut con,
        &format!("RATELIMIT.CHECK same sliding-log 3 1s AT {at}"),
    );
    assert_eq!(fourth, [0, 3, 0, 1000, 1000, 0]);
}

#[test]
fn reset_removes_limiters_and_counts_them() {
    let server = Server::start();
    let mut con = server.client();
    six(&mut con, "RATELIMIT.CHECK a fixed-window 3 1h");
    six(&mut con, "RATELIMIT.CHECK b sliding-log 3 1h");
    let removed: i64 = redis::cmd("RATELIMIT.RESET")
        .arg(&["a", "b", "c"])
        .query(&mut con)
        .unwrap();
    assert_eq!(removed, 2);
    assert_eq!(dbsize(&mut con), 0);
    // A reset key is a fresh limiter.
    assert_eq!(six(&mut con, "RATELIMIT.CHECK a fixed-window 3 1h")[2], 2);
}

#[test]
fn copy_and_memory_usage_work_on_limiters() {
    let server = Server::start();
    let mut con = server.client();
    six(&mut con, "RATELIMIT.CHECK a token-bucket 3 1h");
    let copied: i64 = redis::cmd("COPY").arg(&["a", "b"]).query(&mut con).unwrap();
    assert_eq!(copied, 1);
    let digests: Vec<String> = redis::cmd("DEBUG")
        .arg(&["DIGEST-VALUE", "a", "b"])
        .query(&mut con)
        .unwrap();
    assert_eq!(digests[0], digests[1]);
    let usage = |con: &mut Connection, key: &str| -> i64 {
        redis::cmd("MEMORY")
            .arg(&["USAGE", key])
            .query(con)
            .unwrap()
    };
    // What a server adds around a module value differs (Redis: the key and its entry; Valkey
    // 8.1: nothing, so a limiter kept in the value's own word shows 0): compare, don't assume.
    let (original, copy) = (usage(&mut con, "a"), usage(&mut con, "b"));
    assert_eq!(original, copy);
    assert!((0..200).contains(&original), "{original}");
    for at in 0..20 {
        six(
            &mut con,
            &format!(
                "RATELIMIT.CHECK log sliding-log 100 1h AT {}",
                1_900_000_000_000u64 + at
            ),
        );
    }
    // A log's entries are heap of its own, which every server counts.
    let log = usage(&mut con, "log");
    assert!(
        log >= original + 20 * 8,
        "log {log}, a limiter in a word {original}"
    );
}

/// RESET answers what DEL answers for the same arguments, repeated keys included, for every
/// algorithm's key (once a use-after-free: each repeated key had its own handle on a value the
/// first delete had freed).
#[test]
fn reset_with_repeated_keys_counts_as_del() {
    let server = Server::start();
    let mut con = server.client();
    let algorithms = Algorithm::ALL.map(Algorithm::name);
    let fill = |con: &mut Connection, prefix: &str| {
        for (i, algorithm) in algorithms.iter().enumerate() {
            six(
                con,
                &format!("RATELIMIT.CHECK {prefix}{i} {algorithm} 3 1h"),
            );
        }
    };
    let count = |con: &mut Connection, line: &str| int(con, &cmd_line(line));
    for (i, _) in algorithms.iter().enumerate() {
        for keys in [
            format!("{i} {i} {i}"),
            format!("{i} missing {i} missing"),
            format!("missing {i} {i}"),
        ] {
            fill(&mut con, "r");
            fill(&mut con, "d");
            let reset = count(
                &mut con,
                &format!(
                    "RATELIMIT.RESET {}",
                    keys.replace(&i.to_string(), &format!("r{i}"))
                ),
            );
            let del = count(
                &mut con,
                &format!("DEL {}", keys.replace(&i.to_string(), &format!("d{i}"))),
            );
            assert_eq!(reset, del, "{keys}");
            assert_eq!(reset, 1, "{keys}");
        }
    }
    fill(&mut con, "r");
    assert_eq!(
        count(&mut con, "RATELIMIT.RESET r0 r1 r0 r2 r1 r3 r4 r4"),
        5
    );
    assert_eq!(count(&mut con, "EXISTS r0 r1 r2 r3 r4"), 0);
    // A string among repeated keys: nothing removed.
    fill(&mut con, "r");
    run_ok(&mut con, "SET s v");
    assert!(run_error(&mut con, "RATELIMIT.RESET r0 r0 s r0").starts_with("WRONGTYPE"));
    assert_eq!(count(&mut con, "EXISTS r0"), 1);
    // The server is still whole.
    six(&mut con, "RATELIMIT.CHECK r0 token-bucket 3 1h");
}

/// A limiter key that outlives its state (`PERSIST`, `RESTORE key 0`) is still described by
/// INFO: its stored parameters and state, and a fresh key's `remaining` and `reset_after_ms`.
/// The next consuming call gives it an expiry again.
#[test]
fn info_describes_a_key_whose_state_is_already_fresh() {
    let server = Server::start();
    let mut con = server.client();
    let field = |info: &BTreeMap<String, Value>, name: &str| -> Value {
        info.get(name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} in {info:?}"))
    };
    // 200 ms ahead of the server's clock, so the key cannot expire before PERSIST reaches it
    // (on the clock itself a call in the last ms of a 100 ms window left it 1 ms), and in the
    // past well before the sleep below ends.
    let ahead = now_ms() + 200;
    six(
        &mut con,
        &format!("RATELIMIT.CHECK pk fixed-window 1 100ms AT {ahead}"),
    );
    let persisted: i64 = redis::cmd("PERSIST").arg("pk").query(&mut con).unwrap();
    assert_eq!(persisted, 1);
    let dump: Vec<u8> = redis::cmd("DUMP").arg("pk").query(&mut con).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg("rk")
        .arg(0)
        .arg(&dump)
        .query(&mut con)
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    // The next consuming call at a base ahead (its own 100 ms window), so its expiry is exact.
    let base = future_base_ms();
    for key in ["pk", "rk"] {
        let pttl: i64 = redis::cmd("PTTL").arg(key).query(&mut con).unwrap();
        assert_eq!(pttl, -1, "{key}");
        let info = limiter_info(&mut con, key)
            .unwrap_or_else(|| panic!("{key}: INFO answered nil for an existing key"));
        assert_eq!(
            field(&info, "algorithm"),
            Value::SimpleString("fixed-window".into())
        );
        assert_eq!(field(&info, "limit"), Value::Int(1), "{key}");
        assert_eq!(field(&info, "period_ms"), Value::Int(100), "{key}");
        // As stored: one request in its (now past) window.
        assert_eq!(field(&info, "count"), Value::Int(1), "{key}");
        // As a fresh key now.
        assert_eq!(field(&info, "remaining"), Value::Int(1), "{key}");
        assert_eq!(field(&info, "reset_after_ms"), Value::Int(0), "{key}");
        // A consuming call stores a new state with an expiry: the end of its window. (On the
        // server's clock the key could expire before it was read, PTTL 0 or -2.)
        assert_eq!(
            six(
                &mut con,
                &format!("RATELIMIT.CHECK {key} fixed-window 1 100ms AT {base}")
            ),
            [1, 1, 0, 0, 100, 0],
            "{key}"
        );
        assert_eq!(pexpiretime(&mut con, key), base as i64 + 100, "{key}");
    }
}
