//! RATELIMIT.CHECK, PEEK, RESET and INFO through a real redis-server: the SPEC's contract.

mod common;

use common::{future_base_ms, now_ms, Server};
use redis::{Connection, Value};

fn args(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// Runs `command` (a whitespace-separated line) and returns the six-integer reply.
fn six(con: &mut Connection, line: &str) -> Vec<i64> {
    let words = args(line);
    redis::cmd(words[0])
        .arg(&words[1..])
        .query(con)
        .unwrap_or_else(|e| panic!("{line}: {e}"))
}

/// Runs `line` and returns the error it must answer as `CODE detail`.
fn error(con: &mut Connection, line: &str) -> String {
    let words = args(line);
    match redis::cmd(words[0]).arg(&words[1..]).query::<Value>(con) {
        Ok(value) => panic!("{line}: expected an error, got {value:?}"),
        Err(e) => format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or("")),
    }
}

fn dbsize(con: &mut Connection) -> i64 {
    redis::cmd("DBSIZE").query(con).unwrap()
}

fn pexpiretime(con: &mut Connection, key: &str) -> i64 {
    redis::cmd("PEXPIRETIME").arg(key).query(con).unwrap()
}

/// Runs a SPEC worked-example table (AT offsets from an aligned future base) on a fresh key.
fn table(con: &mut Connection, key: &str, spec: &str, rows: &[(u64, u64, [i64; 6])]) {
    let base = future_base_ms();
    for (at, cost, expected) in rows {
        let line = format!("RATELIMIT.CHECK {key} {spec} COST {cost} AT {}", base + at);
        let reply = six(con, &line);
        assert_eq!(reply, expected, "{spec}: AT +{at} COST {cost}");
        if reply[0] == 1 && *cost > 0 {
            // Every stored key expires at t + reset_after_ms.
            let t = base + at;
            assert_eq!(
                pexpiretime(con, key),
                (t + reply[4] as u64) as i64,
                "{line}"
            );
        }
    }
}

#[test]
fn spec_worked_examples() {
    let server = Server::start();
    let mut con = server.client();
    table(
        &mut con,
        "tb",
        "token-bucket 3 1000",
        &[
            (0, 1, [1, 3, 2, 0, 334, 0]),
            (0, 1, [1, 3, 1, 0, 667, 0]),
            (0, 1, [1, 3, 0, 0, 1000, 0]),
            (0, 1, [0, 3, 0, 334, 1000, 0]),
            (331, 1, [0, 3, 0, 3, 669, 0]),
            (400, 2, [0, 3, 1, 267, 600, 0]),
            (1000, 0, [1, 3, 3, 0, 0, 0]),
        ],
    );
    table(
        &mut con,
        "lb",
        "leaky-bucket 3 1000",
        &[
            (0, 1, [1, 3, 2, 0, 334, 0]),
            (0, 1, [1, 3, 1, 0, 667, 334]),
            (0, 1, [1, 3, 0, 0, 1000, 667]),
            (0, 1, [0, 3, 0, 334, 1000, 0]),
            (331, 1, [0, 3, 0, 3, 669, 0]),
            (1500, 1, [1, 3, 2, 0, 334, 0]),
        ],
    );
    table(
        &mut con,
        "fw",
        "fixed-window 2 1000",
        &[
            (100, 1, [1, 2, 1, 0, 900, 0]),
            (200, 1, [1, 2, 0, 0, 800, 0]),
            (300, 1, [0, 2, 0, 700, 700, 0]),
            (999, 0, [1, 2, 0, 0, 1, 0]),
            (1000, 2, [1, 2, 0, 0, 1000, 0]),
            (1001, 3, [0, 2, 0, -1, 999, 0]),
        ],
    );
    table(
        &mut con,
        "sw",
        "sliding-window 2 1000",
        &[
            (0, 1, [1, 2, 1, 0, 2000, 0]),
            (100, 1, [1, 2, 0, 0, 1900, 0]),
            (200, 1, [0, 2, 0, 1300, 1800, 0]),
            (1500, 1, [1, 2, 0, 0, 1500, 0]),
            (1999, 1, [0, 2, 0, 1, 1001, 0]),
            (2000, 1, [1, 2, 0, 0, 2000, 0]),
        ],
    );
    table(
        &mut con,
        "sl",
        "sliding-log 2 1000",
        &[
            (0, 1, [1, 2, 1, 0, 1000, 0]),
            (0, 1, [1, 2, 0, 0, 1000, 0]),
            (500, 1, [0, 2, 0, 500, 500, 0]),
            (1000, 1, [1, 2, 1, 0, 1000, 0]),
            (1000, 1, [1, 2, 0, 0, 1000, 0]),
            (1400, 1, [0, 2, 0, 600, 600, 0]),
        ],
    );
}

#[test]
fn resp3_replies_are_maps_with_a_boolean() {
    let server = Server::start();
    let mut con = server.client_resp3();
    let at = future_base_ms();
    let reply: Value = redis::cmd("RATELIMIT.CHECK")
        .arg(args(&format!("k token-bucket 3 1000 AT {at}")))
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
        let _: Value = redis::cmd("RATELIMIT.CHECK")
            .arg(args(&format!("k token-bucket 3 1000 AT {at}")))
            .query(&mut con)
            .unwrap();
    }
    let Value::Map(pairs) = redis::cmd("RATELIMIT.PEEK")
        .arg(args(&format!("k token-bucket 3 1000 AT {at}")))
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
        ("RATELIMIT.CHECK k gcra 10 1s", "unknown algorithm"),
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
            "unknown option",
        ),
        ("RATELIMIT.CHECK k sliding-log 100001 1s", "max-log-limit"),
        ("RATELIMIT.PEEK k token-bucket 0 1s", "limit"),
        ("RATELIMIT.RESET", "wrong number of arguments"),
        ("RATELIMIT.INFO", "wrong number of arguments"),
        ("RATELIMIT.INFO a b", "wrong number of arguments"),
    ];
    for (line, needle) in cases {
        let message = error(&mut con, line);
        assert!(message.contains(needle), "{line}: {message}");
        assert!(message.starts_with("ERR "), "{line}: {message}");
    }
    assert_eq!(dbsize(&mut con), 0, "an error created a key");
}

#[test]
fn other_types_get_wrongtype_and_other_algorithms_an_error() {
    let server = Server::start();
    let mut con = server.client();
    let _: () = redis::cmd("SET").arg("s").arg("v").query(&mut con).unwrap();
    for line in [
        "RATELIMIT.CHECK s token-bucket 3 1s",
        "RATELIMIT.PEEK s token-bucket 3 1s",
        "RATELIMIT.INFO s",
        "RATELIMIT.RESET s",
    ] {
        assert!(error(&mut con, line).starts_with("WRONGTYPE"), "{line}");
    }
    six(&mut con, "RATELIMIT.CHECK k token-bucket 3 1s");
    let message = error(&mut con, "RATELIMIT.CHECK k fixed-window 3 1s");
    assert!(message.contains("token-bucket"), "{message}");
    // RESET of a mix with another type removes nothing.
    assert!(error(&mut con, "RATELIMIT.RESET k s").starts_with("WRONGTYPE"));
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
    for algorithm in [
        "token-bucket",
        "leaky-bucket",
        "fixed-window",
        "sliding-window",
        "sliding-log",
    ] {
        let key = format!("k:{algorithm}");
        let spec = format!("{key} {algorithm} 3 1000");
        six(&mut con, &format!("RATELIMIT.PEEK {spec} AT {at}"));
        six(&mut con, &format!("RATELIMIT.CHECK {spec} COST 0 AT {at}"));
        let exists: i64 = redis::cmd("EXISTS").arg(&key).query(&mut con).unwrap();
        assert_eq!(exists, 0, "{algorithm}: a fresh key was stored");
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
    let info: Vec<Value> = redis::cmd("RATELIMIT.INFO")
        .arg("fw")
        .query(&mut con)
        .unwrap();
    let limit_at = info
        .iter()
        .position(|v| redis::from_redis_value::<String>(v).ok().as_deref() == Some("limit"))
        .unwrap();
    assert_eq!(info[limit_at + 1], Value::Int(6));
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
    let info: Vec<Value> = redis::cmd("RATELIMIT.INFO")
        .arg("sw")
        .query(&mut con)
        .unwrap();
    let fields: Vec<(String, Value)> = info
        .chunks(2)
        .map(|pair| (redis::from_redis_value(&pair[0]).unwrap(), pair[1].clone()))
        .collect();
    let get = |name: &str| {
        fields
            .iter()
            .find(|(field, _)| field == name)
            .unwrap_or_else(|| panic!("no {name} in {fields:?}"))
            .1
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
fn the_largest_accepted_values_compute_exactly() {
    let server = Server::start();
    let mut con = server.client();
    let at = 9_007_199_254_740_991u64 - 400_000_000_000;
    let max = 1_000_000_000_000u64;
    let reply = six(
        &mut con,
        &format!("RATELIMIT.PEEK k token-bucket {max} 3650d BURST {max} COST {max} AT {at}"),
    );
    assert_eq!(reply, [1, max as i64, 0, 0, 315_360_000_000, 0]);
    let reply = six(
        &mut con,
        &format!("RATELIMIT.CHECK k sliding-window {max} 3650d COST {max} AT {at}"),
    );
    assert_eq!(reply[..4], [1, max as i64, 0, 0]);
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
    let usage: i64 = redis::cmd("MEMORY")
        .arg(&["USAGE", "a"])
        .query(&mut con)
        .unwrap();
    assert!(usage > 0 && usage < 200, "{usage}");
}

/// RESET answers what DEL answers for the same arguments, repeated keys included, for every
/// algorithm's key (once a use-after-free: each repeated key had its own handle on a value the
/// first delete had freed).
#[test]
fn reset_with_repeated_keys_counts_as_del() {
    let server = Server::start();
    let mut con = server.client();
    let algorithms = [
        "token-bucket",
        "leaky-bucket",
        "fixed-window",
        "sliding-window",
        "sliding-log",
    ];
    let fill = |con: &mut Connection, prefix: &str| {
        for (i, algorithm) in algorithms.iter().enumerate() {
            six(
                con,
                &format!("RATELIMIT.CHECK {prefix}{i} {algorithm} 3 1h"),
            );
        }
    };
    let count = |con: &mut Connection, line: &str| -> i64 {
        let words = args(line);
        redis::cmd(words[0]).arg(&words[1..]).query(con).unwrap()
    };
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
    let _: () = redis::cmd("SET").arg("s").arg("v").query(&mut con).unwrap();
    assert!(error(&mut con, "RATELIMIT.RESET r0 r0 s r0").starts_with("WRONGTYPE"));
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
    let field = |info: &[Value], name: &str| -> Value {
        info.chunks(2)
            .find(|pair| redis::from_redis_value::<String>(&pair[0]).ok().as_deref() == Some(name))
            .map(|pair| pair[1].clone())
            .unwrap_or_else(|| panic!("no {name} in {info:?}"))
    };
    six(&mut con, "RATELIMIT.CHECK pk fixed-window 1 100ms");
    let dump: Vec<u8> = redis::cmd("DUMP").arg("pk").query(&mut con).unwrap();
    let persisted: i64 = redis::cmd("PERSIST").arg("pk").query(&mut con).unwrap();
    assert_eq!(persisted, 1);
    let _: () = redis::cmd("RESTORE")
        .arg("rk")
        .arg(0)
        .arg(&dump)
        .query(&mut con)
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    for key in ["pk", "rk"] {
        let pttl: i64 = redis::cmd("PTTL").arg(key).query(&mut con).unwrap();
        assert_eq!(pttl, -1, "{key}");
        let info: Vec<Value> = redis::cmd("RATELIMIT.INFO")
            .arg(key)
            .query(&mut con)
            .unwrap();
        assert!(
            !info.is_empty(),
            "{key}: INFO answered nil for an existing key"
        );
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
        // A consuming call stores a new state with an expiry.
        assert_eq!(
            six(
                &mut con,
                &format!("RATELIMIT.CHECK {key} fixed-window 1 100ms")
            )[0],
            1
        );
        let pttl: i64 = redis::cmd("PTTL").arg(key).query(&mut con).unwrap();
        assert!((1..=100).contains(&pttl), "{key}: PTTL {pttl}");
    }
}
