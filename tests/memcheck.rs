//! Memory-safety suite: every command and every data-type callback of the module, a few calls
//! each, for `make memcheck`. tests/memcheck.sh runs this file with the servers under valgrind
//! memcheck (`RATELIMIT_SERVER_WRAPPER`, see tests/common) and fails on any invalid access or use
//! of uninitialised memory with a frame in the module. Without a wrapper it is a quick smoke test
//! of `cargo test --release`.
//!
//! Few calls, many paths: valgrind runs the server 30-50x slower, so each path gets a handful of
//! calls, not thousands. The assertions are about shape only (a decision is six integers, an
//! error is an error, a round trip keeps the digest, the server keeps answering); exact values are
//! the business of the other suites. Where the right answer is still being decided (a key named
//! twice in CHECKALL or RESET) nothing is asserted but that the server survives.
//!
//! Covered: CHECK and PEEK on all five algorithms (BURST, COST 0, AT, rejections, parameter
//! changes, time going backwards, a sliding log of many runs), every argument error once, binary
//! and huge arguments, WRONGTYPE, algorithm mismatch, RESP3 replies, CHECKALL (rejections, errors,
//! repeated keys, COMMAND GETKEYS), RESET (repeated and missing keys), INFO, APPLY (valid, crafted
//! and corrupt payloads), DUMP/RESTORE round trips and ~440 corrupt payloads with a valid CRC
//! (bit flips, random bytes, fields at extremes, truncations, extensions, broken framing: most
//! reach the module's rdb_load, the same limiters as APPLY payloads its other decoder), COPY, RENAME, MOVE, SWAPDB, MEMORY USAGE, DEBUG
//! DIGEST(-VALUE), DEBUG RELOAD, expiry, FLUSHALL, MULTI/EXEC, Lua, the module config, INFO,
//! OOM refusals, AOF rewrite without RDB preamble (aof_rewrite) and its replay (APPLY), restart,
//! and a replica (full sync through rdb_save/rdb_load, then APPLY and verbatim RESET).

mod common;

use common::{future_base_ms, is_bucket, reply6, send, Server};
use redis::{Cmd, Connection, Value};
use std::thread;
use std::time::{Duration, Instant};

const ALGORITHMS: [&str; 5] = [
    "token-bucket",
    "leaky-bucket",
    "fixed-window",
    "sliding-window",
    "sliding-log",
];
const HOUR_MS: u64 = 3_600_000;

// ---------------------------------------------------------------------------------------------
// Helpers

/// A command from a space-separated line (no argument contains a space).
fn line(text: &str) -> Cmd {
    let mut parts = text.split(' ');
    let mut cmd = redis::cmd(parts.next().expect("a command name"));
    for part in parts {
        cmd.arg(part);
    }
    cmd
}

fn one(con: &mut Connection, cmd: &Cmd) -> Value {
    send(con, std::slice::from_ref(cmd)).remove(0)
}

fn run(con: &mut Connection, text: &str) -> Value {
    one(con, &line(text))
}

fn is_error(value: &Value) -> bool {
    matches!(value, Value::ServerError(_))
}

fn assert_error(con: &mut Connection, text: &str) {
    let value = run(con, text);
    assert!(is_error(&value), "{text}: expected an error, got {value:?}");
}

/// A CHECK/PEEK decision (six integers in RESP2).
fn decision(con: &mut Connection, text: &str) -> [i64; 6] {
    let value = run(con, text);
    assert!(!is_error(&value), "{text}: {value:?}");
    reply6(&value)
}

fn int(con: &mut Connection, text: &str) -> i64 {
    match run(con, text) {
        Value::Int(n) => n,
        other => panic!("{text}: not an integer: {other:?}"),
    }
}

fn exists(con: &mut Connection, key: &str) -> bool {
    int(con, &format!("EXISTS {key}")) == 1
}

/// The server answers PING on a new connection (it did not crash or hang).
fn assert_alive(server: &Server) {
    let pong: String = redis::cmd("PING")
        .query(&mut server.client())
        .unwrap_or_else(|e| panic!("the server stopped answering: {e}\n{}", server.log_tail(30)));
    assert_eq!(pong, "PONG");
}

/// `DEBUG DIGEST-VALUE key...`, one digest per key.
fn digests(con: &mut Connection, keys: &[String]) -> Vec<String> {
    let mut cmd = redis::cmd("DEBUG");
    cmd.arg("DIGEST-VALUE").arg(keys);
    cmd.query(con).expect("DEBUG DIGEST-VALUE")
}

/// A CHECKALL decision (RESP2): the overall decision, then one per key, six integers each.
fn checkall_decision(value: &Value, numkeys: usize) {
    match value {
        Value::Array(items) if items.len() == numkeys + 1 => items.iter().for_each(|d| {
            reply6(d);
        }),
        other => panic!("not a CHECKALL reply for {numkeys} keys: {other:?}"),
    }
}

/// `EVAL`/`EVAL_RO script numkeys keys... args...`; the reply, errors included.
fn eval(con: &mut Connection, command: &str, script: &str, keys: &[&str], args: &[&str]) -> Value {
    let mut cmd = redis::cmd(command);
    cmd.arg(script).arg(keys.len()).arg(keys).arg(args);
    one(con, &cmd)
}

/// RATELIMIT.INFO of an existing limiter: a non-empty array (RESP2).
fn assert_info(con: &mut Connection, key: &str) {
    match run(con, &format!("RATELIMIT.INFO {key}")) {
        Value::Array(items) if !items.is_empty() => {}
        other => panic!("RATELIMIT.INFO {key}: {other:?}"),
    }
}

/// `BURST 5` for buckets, nothing for windows.
fn burst(algorithm: &str) -> &'static str {
    if is_bucket(algorithm) {
        " BURST 5"
    } else {
        ""
    }
}

/// A few CHECKs per algorithm on `prefix:<algorithm>` at `base`: returns the keys.
fn populate(con: &mut Connection, prefix: &str, base: u64) -> Vec<String> {
    let mut keys = Vec::new();
    for algorithm in ALGORITHMS {
        let key = format!("{prefix}:{algorithm}");
        let b = burst(algorithm);
        for (i, cost) in [1, 2, 1].into_iter().enumerate() {
            let at = base + 7 * i as u64;
            decision(
                con,
                &format!("RATELIMIT.CHECK {key} {algorithm} 10 1h{b} COST {cost} AT {at}"),
            );
        }
        keys.push(key);
    }
    keys
}

/// Wait until every one of `fields` of `INFO persistence` is `0` (a rewrite or save finished).
fn wait_persistence_idle(server: &Server, fields: &[&str]) {
    let deadline = Instant::now() + common::scaled(Duration::from_secs(20));
    loop {
        let info = server.info("persistence");
        if fields
            .iter()
            .all(|f| info.get(*f).map(String::as_str) == Some("0"))
        {
            return;
        }
        assert!(Instant::now() < deadline, "still busy: {info:?}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// A small deterministic generator (splitmix64): the same mutations on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

// ---------------------------------------------------------------------------------------------
// CHECK, PEEK, INFO: every algorithm, every option, every error

#[test]
fn check_peek_and_info_on_every_algorithm() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    for (index, algorithm) in ALGORITHMS.into_iter().enumerate() {
        let key = format!("cp:{algorithm}");
        let b = burst(algorithm);
        let at = |offset: u64| base + offset;
        // PEEK on a missing key creates nothing.
        decision(
            &mut con,
            &format!("RATELIMIT.PEEK {key} {algorithm} 3 1h{b} AT {}", at(0)),
        );
        assert!(!exists(&mut con, &key));
        for text in [
            format!("RATELIMIT.CHECK {key} {algorithm} 3 1h{b} AT {}", at(0)),
            format!(
                "RATELIMIT.CHECK {key} {algorithm} 3 1h{b} COST 2 AT {}",
                at(10)
            ),
            format!(
                "RATELIMIT.CHECK {key} {algorithm} 3 1h{b} COST 0 AT {}",
                at(20)
            ),
            // Rejected, then a cost above the capacity (retry_after_ms -1).
            format!(
                "RATELIMIT.CHECK {key} {algorithm} 3 1h{b} COST 3 AT {}",
                at(30)
            ),
            format!(
                "RATELIMIT.CHECK {key} {algorithm} 3 1h{b} COST 1000 AT {}",
                at(40)
            ),
            format!(
                "RATELIMIT.PEEK {key} {algorithm} 3 1h{b} COST 1 AT {}",
                at(50)
            ),
            // Parameter changes: limit, period, burst, everything; then back.
            format!("RATELIMIT.CHECK {key} {algorithm} 10 1h{b} AT {}", at(60)),
            format!("RATELIMIT.CHECK {key} {algorithm} 10 30m AT {}", at(70)),
            format!("RATELIMIT.CHECK {key} {algorithm} 2 1s AT {}", at(80)),
            format!(
                "RATELIMIT.PEEK {key} {algorithm} 1 7ms COST 0 AT {}",
                at(90)
            ),
            format!("RATELIMIT.CHECK {key} {algorithm} 3 1h{b} AT {}", at(100)),
            // Time going backwards, then past one and two periods.
            format!("RATELIMIT.CHECK {key} {algorithm} 3 1h{b} AT {}", at(0)),
            format!("RATELIMIT.CHECK {key} {algorithm} 3 1h{b} AT 0"),
            format!(
                "RATELIMIT.CHECK {key} {algorithm} 3 1h{b} AT {}",
                at(HOUR_MS + 5)
            ),
            format!(
                "RATELIMIT.CHECK {key} {algorithm} 3 1h{b} AT {}",
                at(3 * HOUR_MS)
            ),
            // The server's clock, and lower-case options.
            format!("RATELIMIT.CHECK now:{key} {algorithm} 5 1s"),
            format!("RATELIMIT.CHECK now:{key} {algorithm} 5 1s cost 2"),
            format!("RATELIMIT.PEEK now:{key} {algorithm} 5 1s"),
        ] {
            decision(&mut con, &text);
        }
        if is_bucket(algorithm) {
            // BURST below, equal to and above the limit, on the same key.
            for capacity in [1, 3, 50] {
                decision(
                    &mut con,
                    &format!(
                        "RATELIMIT.CHECK {key} {algorithm} 3 1h BURST {capacity} AT {}",
                        at(3 * HOUR_MS + capacity)
                    ),
                );
            }
        }
        assert_info(&mut con, &key);
        assert_info(&mut con, &format!("now:{key}"));
        // Another algorithm on the same key is an error, for CHECK and PEEK alike.
        let other = ALGORITHMS[(index + 1) % ALGORITHMS.len()];
        assert_error(&mut con, &format!("RATELIMIT.CHECK {key} {other} 3 1h"));
        assert_error(&mut con, &format!("RATELIMIT.PEEK {key} {other} 3 1h"));
        // The largest accepted values.
        let big_burst = if is_bucket(algorithm) {
            " BURST 1000000000000"
        } else {
            ""
        };
        let limit = if algorithm == "sliding-log" {
            "100000"
        } else {
            "1000000000000"
        };
        decision(
            &mut con,
            &format!(
                "RATELIMIT.CHECK max:{key} {algorithm} {limit} 3650d{big_burst} COST 100000 \
                 AT 9007199254740991"
            ),
        );
        // A key written at a time long past expires at once.
        decision(
            &mut con,
            &format!("RATELIMIT.CHECK past:{key} {algorithm} 3 1s{b} AT 1000"),
        );
    }
    assert!(matches!(
        run(&mut con, "RATELIMIT.INFO missing"),
        Value::Nil
    ));

    // A sliding log of many runs: gaps of 1 ms to 20 minutes (1- to 3-byte varints), several
    // entries in one millisecond, then entries leaving the window.
    let mut t = base;
    let mut cmds = Vec::new();
    for i in 0..60u64 {
        t += [1, 3, 70, 9_000, 1_200_000][i as usize % 5];
        let cost = 1 + i % 3;
        cmds.push(line(&format!(
            "RATELIMIT.CHECK log sliding-log 1000 1h COST {cost} AT {t}"
        )));
    }
    for offset in [HOUR_MS / 2, HOUR_MS, HOUR_MS + 1_300_000, 5 * HOUR_MS] {
        cmds.push(line(&format!(
            "RATELIMIT.CHECK log sliding-log 1000 1h AT {}",
            t + offset
        )));
    }
    for reply in send(&mut con, &cmds) {
        reply6(&reply);
    }
    assert_info(&mut con, "log");
    assert_alive(&server);
}

#[test]
fn every_argument_error_once_and_errors_create_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let _: () = redis::cmd("SET")
        .arg("str")
        .arg("v")
        .query(&mut con)
        .unwrap();
    decision(&mut con, "RATELIMIT.CHECK tb token-bucket 3 1h");
    for command in ["RATELIMIT.CHECK", "RATELIMIT.PEEK"] {
        for args in [
            "",
            " k",
            " k token-bucket",
            " k token-bucket 3",
            " k gcra 3 1h",
            " k sliding 3 1h",
            " k token-bucket 0 1h",
            " k token-bucket 1000000000001 1h",
            " k token-bucket -1 1h",
            " k token-bucket 1.5 1h",
            " k token-bucket 99999999999999999999999999 1h",
            " k token-bucket 3 0",
            " k token-bucket 3 1x",
            " k token-bucket 3 1msx",
            " k token-bucket 3 3651d",
            " k token-bucket 3 99999999999999999999d",
            " k token-bucket 3 1h BURST 0",
            " k token-bucket 3 1h BURST x",
            " k fixed-window 3 1h BURST 5",
            " k sliding-log 3 1h BURST 5",
            " k token-bucket 3 1h COST -1",
            " k token-bucket 3 1h COST 1000000000001",
            " k token-bucket 3 1h AT 9007199254740992",
            " k token-bucket 3 1h AT x",
            " k token-bucket 3 1h FOO 1",
            " k token-bucket 3 1h BURST",
            " k token-bucket 3 1h COST",
            " k token-bucket 3 1h AT",
            " k token-bucket 3 1h COST 1 COST 1",
            " k token-bucket 3 1h BURST 1 BURST 2",
            " k token-bucket 3 1h AT 1 AT 1",
            " k sliding-log 100001 1h",
            " str token-bucket 3 1h",
            " tb fixed-window 3 1h",
        ] {
            assert_error(&mut con, &format!("{command}{args}"));
        }
    }
    for text in [
        "RATELIMIT.RESET",
        "RATELIMIT.RESET str",
        "RATELIMIT.RESET tb str",
        "RATELIMIT.INFO",
        "RATELIMIT.INFO k k",
        "RATELIMIT.INFO str",
        "RATELIMIT.CHECKALL",
        "RATELIMIT.CHECKALL 1",
        "RATELIMIT.CHECKALL 1 k",
        "RATELIMIT.CHECKALL 1 k token-bucket 3",
        "RATELIMIT.CHECKALL 0 k token-bucket 3 1h",
        "RATELIMIT.CHECKALL x k token-bucket 3 1h",
        "RATELIMIT.CHECKALL -1 k token-bucket 3 1h",
        "RATELIMIT.CHECKALL 5 k token-bucket 3 1h",
        "RATELIMIT.CHECKALL 99999999999999999999 k token-bucket 3 1h",
        "RATELIMIT.CHECKALL 2 k l token-bucket 3 1h",
        "RATELIMIT.CHECKALL 2 k l token-bucket 3 1h COST 1 fixed-window 3 1h",
        "RATELIMIT.CHECKALL 2 k l fixed-window 3 1h BURST 2 token-bucket 3 1h",
        "RATELIMIT.CHECKALL 2 k l token-bucket 3 1h BURST 2 BURST 3 token-bucket 3 1h",
        "RATELIMIT.CHECKALL 2 k l token-bucket 3 1h BURST token-bucket 3 1h",
        "RATELIMIT.CHECKALL 2 k l token-bucket 0 1h token-bucket 3 1h",
        "RATELIMIT.CHECKALL 2 k l token-bucket 3 1h gcra 3 1h",
        "RATELIMIT.CHECKALL 2 k l token-bucket 3 1h token-bucket 3 1h FOO 1",
        "RATELIMIT.CHECKALL 2 k l token-bucket 3 1h sliding-log 100001 1h",
        "RATELIMIT.CHECKALL 2 k str token-bucket 3 1h token-bucket 3 1h",
        "RATELIMIT.CHECKALL 2 k tb token-bucket 3 1h fixed-window 3 1h",
        "RATELIMIT.APPLY",
        "RATELIMIT.APPLY k",
        "RATELIMIT.APPLY k x y",
        "RATELIMIT.APPLY k garbage",
        "RATELIMIT.APPLY str garbage",
    ] {
        assert_error(&mut con, text);
    }
    // Binary junk, empty strings and a huge argument.
    let huge_number = "9".repeat(100_000);
    let junk: [&[u8]; 5] = [
        b"",
        b"\xff\xfe\x00",
        b"\x00",
        huge_number.as_bytes(),
        b"1h\x00",
    ];
    for bad in junk {
        for position in 0..4 {
            let mut args: Vec<&[u8]> = vec![b"k", b"token-bucket", b"3", b"1h"];
            args[position] = bad;
            let mut cmd = redis::cmd("RATELIMIT.CHECK");
            for arg in &args {
                cmd.arg(*arg);
            }
            let reply = one(&mut con, &cmd);
            assert!(
                is_error(&reply) || position == 0,
                "{args:?}: expected an error, got {reply:?}"
            );
        }
        let mut cmd = redis::cmd("RATELIMIT.CHECK");
        cmd.arg("k")
            .arg("token-bucket")
            .arg("3")
            .arg("1h")
            .arg("COST")
            .arg(bad);
        assert!(is_error(&one(&mut con, &cmd)));
        let mut cmd = redis::cmd("RATELIMIT.APPLY");
        cmd.arg("k").arg(bad);
        assert!(is_error(&one(&mut con, &cmd)));
        let mut cmd = redis::cmd("RATELIMIT.CHECKALL");
        cmd.arg(bad).arg("k").arg("token-bucket").arg("3").arg("1h");
        assert!(is_error(&one(&mut con, &cmd)));
    }
    // The empty key, the 0xff key and the huge key are real keys: remove them.
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    assert_error(
        &mut con,
        "RATELIMIT.CHECK k token-bucket 3 1h COST 1000000000001",
    );
    assert!(!exists(&mut con, "k"));
    assert!(!exists(&mut con, "l"));
    assert_alive(&server);
}

#[test]
fn resp3_replies() {
    let server = Server::start();
    let mut con = server.client_resp3();
    let base = future_base_ms();
    for algorithm in ALGORITHMS {
        let b = burst(algorithm);
        for text in [
            format!("RATELIMIT.CHECK r3:{algorithm} {algorithm} 2 1h{b} AT {base}"),
            format!("RATELIMIT.PEEK r3:{algorithm} {algorithm} 2 1h{b} COST 0 AT {base}"),
            format!("RATELIMIT.CHECK r3:{algorithm} {algorithm} 2 1h{b} COST 5 AT {base}"),
            // The overall decision's six fields, then `limits`.
            format!("RATELIMIT.CHECKALL 1 r3:{algorithm} {algorithm} 2 1h{b} AT {base}"),
        ] {
            match run(&mut con, &text) {
                Value::Map(fields) => {
                    assert!(fields.len() >= 6, "{text}: {fields:?}");
                    assert!(
                        matches!(fields[0].1, Value::Boolean(_)),
                        "{text}: {fields:?}"
                    );
                }
                other => panic!("{text}: not a map: {other:?}"),
            }
        }
        let info = run(&mut con, &format!("RATELIMIT.INFO r3:{algorithm}"));
        assert!(
            matches!(&info, Value::Map(f) if !f.is_empty())
                || matches!(&info, Value::Array(f) if !f.is_empty()),
            "{info:?}"
        );
    }
    assert!(matches!(
        run(&mut con, "RATELIMIT.INFO missing"),
        Value::Nil
    ));
    assert_error(&mut con, "RATELIMIT.CHECK r3:x gcra 1 1h");
    assert_error(
        &mut con,
        "RATELIMIT.CHECK r3:token-bucket fixed-window 1 1h",
    );
    assert_error(&mut con, "RATELIMIT.CHECKALL 0 r3:x token-bucket 1 1h");
    assert_eq!(int(&mut con, "RATELIMIT.RESET r3:token-bucket missing"), 1);
    assert_alive(&server);
}

// ---------------------------------------------------------------------------------------------
// CHECKALL and RESET

#[test]
fn checkall_rejections_errors_and_repeated_keys() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    let all = "RATELIMIT.CHECKALL 5 a:1 a:2 a:3 a:4 a:5 token-bucket 10 1h BURST 12 \
               leaky-bucket 10 1h BURST 8 fixed-window 10 1h sliding-window 10 1h sliding-log 10 1h";
    for (i, cost) in [1, 4, 4, 4, 0, 20].into_iter().enumerate() {
        let text = format!("{all} COST {cost} AT {}", base + i as u64);
        checkall_decision(&run(&mut con, &text), 5);
    }
    checkall_decision(&run(&mut con, &format!("{all} AT {}", base + HOUR_MS)), 5);
    let text = "RATELIMIT.CHECKALL 2 now:1 now:2 fixed-window 1 1s token-bucket 5 1m";
    checkall_decision(&run(&mut con, text), 2);
    for i in 1..=5 {
        assert_info(&mut con, &format!("a:{i}"));
    }
    // One key's stored algorithm differs: an error, and nothing else changes.
    let before = digests(&mut con, &["a:1".into(), "a:2".into()]);
    assert_error(
        &mut con,
        "RATELIMIT.CHECKALL 2 a:1 a:2 token-bucket 10 1h BURST 12 fixed-window 10 1h",
    );
    assert_eq!(digests(&mut con, &["a:1".into(), "a:2".into()]), before);
    // A key named twice (new and existing, same and different algorithms): an error or a
    // decision, not asserted; the server must survive and keep answering.
    let log3 = "sliding-log 5 1h sliding-log 5 1h sliding-log 5 1h";
    for (numkeys, text) in [
        (2, "2 r r token-bucket 3 1h token-bucket 3 1h".to_string()),
        (2, "2 r r token-bucket 3 1h token-bucket 3 1h".to_string()),
        (2, "2 q q token-bucket 3 1h fixed-window 3 1h".to_string()),
        (3, format!("3 s s s {log3} COST 2")),
        (3, format!("3 s s s {log3} COST 2")),
        (
            3,
            "3 a:5 x a:5 sliding-log 10 1h leaky-bucket 3 1h sliding-log 10 1h".to_string(),
        ),
        (
            2,
            "2 a:1 a:1 token-bucket 10 1h BURST 12 token-bucket 5 1m COST 0".to_string(),
        ),
    ] {
        let text = format!("RATELIMIT.CHECKALL {text} AT {}", base + 2);
        let reply = run(&mut con, &text);
        if !is_error(&reply) {
            checkall_decision(&reply, numkeys);
        }
    }
    for key in ["r", "q", "s", "x", "a:1", "a:5"] {
        let _ = run(&mut con, &format!("RATELIMIT.INFO {key}"));
        let _ = run(&mut con, &format!("DEBUG DIGEST-VALUE {key}"));
        let _ = run(&mut con, &format!("MEMORY USAGE {key}"));
    }
    // The keys are declared through the getkeys API and the key spec.
    for text in [
        "COMMAND GETKEYS RATELIMIT.CHECKALL 2 k1 k2 token-bucket 1 1s fixed-window 1 1s",
        "COMMAND GETKEYSANDFLAGS RATELIMIT.CHECKALL 1 k1 token-bucket 1 1s",
        "COMMAND GETKEYS RATELIMIT.CHECK k1 token-bucket 1 1s",
        "COMMAND GETKEYS RATELIMIT.RESET k1 k2 k1",
        "COMMAND INFO RATELIMIT.CHECKALL RATELIMIT.CHECK RATELIMIT.RESET",
        "COMMAND DOCS RATELIMIT.CHECKALL",
    ] {
        let reply = run(&mut con, text);
        assert!(!is_error(&reply), "{text}: {reply:?}");
    }
    for text in [
        "COMMAND GETKEYS RATELIMIT.CHECKALL 0 k1 token-bucket 1 1s",
        "COMMAND GETKEYS RATELIMIT.CHECKALL 9 k1 token-bucket 1 1s",
        "COMMAND GETKEYS RATELIMIT.CHECKALL x k1 token-bucket 1 1s",
    ] {
        // Redis may answer an error or an empty list for keys it cannot find.
        let _ = run(&mut con, text);
    }
    assert_alive(&server);
}

#[test]
fn reset_with_repeated_and_missing_keys() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    // The case that once read freed memory: the same key named three times.
    decision(&mut con, "RATELIMIT.CHECK a token-bucket 3 1h");
    let removed = int(&mut con, "RATELIMIT.RESET a a a");
    assert!(removed >= 1, "RESET a a a removed {removed}");
    assert!(!exists(&mut con, "a"));
    for algorithm in ALGORITHMS {
        let key = format!("k:{algorithm}");
        // A sliding log of several runs, so its value owns a heap buffer.
        for i in 0..4 {
            decision(
                &mut con,
                &format!(
                    "RATELIMIT.CHECK {key} {algorithm} 10 1h{} AT {}",
                    burst(algorithm),
                    base + 1000 * i
                ),
            );
        }
        decision(
            &mut con,
            &format!("RATELIMIT.CHECK other:{algorithm} {algorithm} 10 1h"),
        );
        let text = format!(
            "RATELIMIT.RESET {key} missing1 {key} other:{algorithm} missing2 {key} other:{algorithm}"
        );
        let removed = int(&mut con, &text);
        assert!(removed >= 2, "{text}: {removed}");
        assert!(!exists(&mut con, &key));
        assert!(!exists(&mut con, &format!("other:{algorithm}")));
    }
    assert_eq!(int(&mut con, "RATELIMIT.RESET missing missing"), 0);
    // All or nothing: a key of another type among repeated limiter keys removes nothing.
    decision(&mut con, "RATELIMIT.CHECK b fixed-window 3 1h");
    let _: () = redis::cmd("SET")
        .arg("str")
        .arg("v")
        .query(&mut con)
        .unwrap();
    assert_error(&mut con, "RATELIMIT.RESET b b str b");
    assert!(exists(&mut con, "b"));
    // Inside MULTI and from Lua, where the context differs.
    let replies = send(
        &mut con,
        &[
            line("MULTI"),
            line("RATELIMIT.RESET b b"),
            line("RATELIMIT.CHECK b sliding-log 3 1h"),
            line("RATELIMIT.RESET b missing b"),
            line("EXEC"),
        ],
    );
    assert!(replies.iter().all(|r| !is_error(r)), "{replies:?}");
    decision(&mut con, "RATELIMIT.CHECK c leaky-bucket 3 1h");
    let script = "return redis.call('RATELIMIT.RESET', KEYS[1], KEYS[1], KEYS[2])";
    let reply = eval(&mut con, "EVAL", script, &["c", "d"], &[]);
    assert!(!is_error(&reply), "{reply:?}");
    assert!(!exists(&mut con, "c"));
    assert_alive(&server);
}

// ---------------------------------------------------------------------------------------------
// The data type: DUMP/RESTORE, corrupt payloads, APPLY payloads, COPY, digests, reload

/// CRC-64/Jones as Redis computes the DUMP trailer (reflected, polynomial 0xad93d23594c935a9,
/// init 0, no final xor).
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

/// `body` (a DUMP payload without its CRC) with its CRC-64 trailer appended.
fn with_crc(mut body: Vec<u8>) -> Vec<u8> {
    let crc = crc64(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    body
}

/// An RDB length at `pos`: (value, bytes it took). `None` for the encoded-string forms.
fn read_rdb_len(bytes: &[u8], pos: usize) -> Option<(u64, usize)> {
    let first = *bytes.get(pos)?;
    match first >> 6 {
        0 => Some((u64::from(first & 0x3f), 1)),
        1 => Some((
            (u64::from(first & 0x3f) << 8) | u64::from(*bytes.get(pos + 1)?),
            2,
        )),
        _ if first == 0x80 => {
            let b: [u8; 4] = bytes.get(pos + 1..pos + 5)?.try_into().ok()?;
            Some((u64::from(u32::from_be_bytes(b)), 5))
        }
        _ if first == 0x81 => {
            let b: [u8; 8] = bytes.get(pos + 1..pos + 9)?.try_into().ok()?;
            Some((u64::from_be_bytes(b), 9))
        }
        _ => None,
    }
}

fn write_rdb_len(len: usize) -> Vec<u8> {
    if len < 64 {
        vec![len as u8]
    } else if len < 16_384 {
        vec![0x40 | (len >> 8) as u8, len as u8]
    } else {
        let mut out = vec![0x80];
        out.extend_from_slice(&(len as u32).to_be_bytes());
        out
    }
}

/// A module value's DUMP payload (with `rdbcompression no`), split around the limiter's bytes.
struct Dump {
    /// Type byte, module id, string opcode: everything before the buffer's length.
    head: Vec<u8>,
    /// The limiter's encoding, as the module's rdb_save wrote it.
    limiter: Vec<u8>,
    /// EOF opcode and RDB version, before the CRC.
    tail: Vec<u8>,
}

impl Dump {
    fn parse(payload: &[u8]) -> Dump {
        const RDB_TYPE_MODULE_2: u8 = 7;
        const OPCODE_STRING: u64 = 5;
        assert_eq!(payload[0], RDB_TYPE_MODULE_2, "a module value: {payload:?}");
        let (_, id_len) = read_rdb_len(payload, 1).expect("the module id");
        let opcode_at = 1 + id_len;
        let (opcode, opcode_len) = read_rdb_len(payload, opcode_at).expect("an opcode");
        assert_eq!(opcode, OPCODE_STRING, "a string buffer first: {payload:?}");
        let len_at = opcode_at + opcode_len;
        let (len, len_len) =
            read_rdb_len(payload, len_at).expect("a plain string (rdbcompression no)");
        let start = len_at + len_len;
        let end = start + len as usize;
        Dump {
            head: payload[..len_at].to_vec(),
            limiter: payload[start..end].to_vec(),
            tail: payload[end..payload.len() - 8].to_vec(),
        }
    }

    /// A payload holding `limiter` instead, its length and CRC made valid.
    fn with_limiter(&self, limiter: &[u8]) -> Vec<u8> {
        let mut body = self.head.clone();
        body.extend(write_rdb_len(limiter.len()));
        body.extend_from_slice(limiter);
        body.extend_from_slice(&self.tail);
        with_crc(body)
    }

    /// The payload without its CRC.
    fn body(&self) -> Vec<u8> {
        let mut body = self.head.clone();
        body.extend(write_rdb_len(self.limiter.len()));
        body.extend_from_slice(&self.limiter);
        body.extend_from_slice(&self.tail);
        body
    }
}

/// Corrupt variants of a limiter encoding: bit flips, random bytes, truncations, extensions,
/// and fields set to extremes (every 8-byte field after the algorithm byte).
fn corrupt_limiters(limiter: &[u8], rng: &mut Rng) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for _ in 0..6 {
        let mut m = limiter.to_vec();
        let at = rng.below(m.len());
        m[at] ^= 1 << rng.below(8);
        out.push(m);
    }
    for _ in 0..3 {
        let mut m = limiter.to_vec();
        let at = rng.below(m.len());
        m[at] = rng.next() as u8;
        out.push(m);
    }
    // The algorithm byte: every other algorithm and an unknown one.
    for algorithm in [0u8, 1, 2, 3, 4, 5, 0xff] {
        if algorithm != limiter[0] {
            let mut m = limiter.to_vec();
            m[0] = algorithm;
            out.push(m);
        }
    }
    // Fields at extremes: 0, all ones, 2^53, one above the accepted bounds.
    let mut field = 1;
    while field + 8 <= limiter.len() && field <= 1 + 8 * 9 {
        for value in [0u64, u64::MAX, 1 << 53, 1_000_000_000_001] {
            let mut m = limiter.to_vec();
            m[field..field + 8].copy_from_slice(&value.to_le_bytes());
            out.push(m);
        }
        field += 8;
    }
    // Truncated (to nothing, one byte, mid-field, one byte short) and extended.
    for len in [0, 1, 9, limiter.len() / 2, limiter.len() - 1] {
        out.push(limiter[..len].to_vec());
    }
    for extra in [1, 8, 16, 200] {
        let mut m = limiter.to_vec();
        m.extend((0..extra).map(|_| rng.next() as u8));
        out.push(m);
    }
    out
}

/// Corrupt variants of a whole DUMP payload body (framing included), CRC fixed afterwards.
fn corrupt_bodies(body: &[u8], rng: &mut Rng) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for _ in 0..6 {
        let mut m = body.to_vec();
        let at = rng.below(m.len());
        m[at] ^= 1 << rng.below(8);
        out.push(m);
    }
    for len in [
        1,
        2,
        10,
        11,
        12,
        body.len() / 2,
        body.len() - 3,
        body.len() - 2,
    ] {
        out.push(body[..len.min(body.len())].to_vec());
    }
    // Bytes inserted before the EOF opcode, and the EOF opcode replaced.
    let eof = body.len() - 3;
    for insert in [vec![0u8], vec![5, 1, 0], vec![2, 7], vec![0xff; 9]] {
        let mut m = body[..eof].to_vec();
        m.extend(insert);
        m.extend_from_slice(&body[eof..]);
        out.push(m);
    }
    let mut m = body.to_vec();
    m[eof] = 5;
    out.push(m);
    out
}

/// `RESTORE key 0 payload REPLACE` (no expiry).
fn restore(con: &mut Connection, key: &str, payload: &[u8]) -> Value {
    restore_at(con, key, 0, payload)
}

/// `RESTORE key <expires_at_ms> payload REPLACE ABSTTL` (0: no expiry). The expiry matters to
/// DEBUG DIGEST-VALUE.
fn restore_at(con: &mut Connection, key: &str, expires_at_ms: i64, payload: &[u8]) -> Value {
    let mut cmd = redis::cmd("RESTORE");
    cmd.arg(key)
        .arg(expires_at_ms.max(0))
        .arg(payload)
        .arg("REPLACE")
        .arg("ABSTTL");
    one(con, &cmd)
}

fn apply(con: &mut Connection, key: &str, payload: &[u8]) -> Value {
    let mut cmd = redis::cmd("RATELIMIT.APPLY");
    cmd.arg(key).arg(payload);
    one(con, &cmd)
}

/// A key a corrupt payload was accepted into: use it every way there is, then remove it.
fn exercise_and_remove(con: &mut Connection, key: &str) {
    for algorithm in ALGORITHMS {
        let _ = run(con, &format!("RATELIMIT.PEEK {key} {algorithm} 3 1h"));
        let _ = run(con, &format!("RATELIMIT.CHECK {key} {algorithm} 3 1h"));
    }
    for text in [
        format!("RATELIMIT.INFO {key}"),
        format!("DEBUG DIGEST-VALUE {key}"),
        format!("MEMORY USAGE {key}"),
        format!("DUMP {key}"),
        format!("COPY {key} {key}:copy"),
        format!("DEL {key} {key}:copy"),
    ] {
        let _ = run(con, &text);
    }
}

#[test]
fn dump_restore_and_corrupt_payloads_never_crash() {
    assert_eq!(
        crc64(b"123456789"),
        0xe9c6_d914_c4b8_d9ca,
        "CRC-64/Jones check value"
    );
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    // Uncompressed, so the limiter's bytes appear verbatim in DUMP.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("rdbcompression")
        .arg("no")
        .query(&mut con)
        .unwrap();
    let mut keys = populate(&mut con, "d", base);
    // A sliding log of many runs: a longer buffer (two-byte length).
    for i in 0..12 {
        decision(
            &mut con,
            &format!(
                "RATELIMIT.CHECK d:log sliding-log 100 1h AT {}",
                base + 100 * i
            ),
        );
    }
    keys.push("d:log".into());
    let mut rng = Rng(0x6d65_6d63_6865_636b);
    let mut accepted = 0;
    let mut refused = 0;
    for key in &keys {
        let payload: Vec<u8> = redis::cmd("DUMP").arg(key).query(&mut con).unwrap();
        let dump = Dump::parse(&payload);
        assert_eq!(
            dump.with_limiter(&dump.limiter),
            payload,
            "the DUMP is understood"
        );
        // Round trip: same digest.
        let copy = format!("{key}:restored");
        let expires_at_ms = int(&mut con, &format!("PEXPIRETIME {key}"));
        assert!(matches!(
            restore_at(&mut con, &copy, expires_at_ms, &payload),
            Value::Okay
        ));
        assert_eq!(
            digests(&mut con, std::slice::from_ref(key)),
            digests(&mut con, std::slice::from_ref(&copy))
        );
        // The limiter's bytes corrupted, the DUMP framing and CRC valid: the module's rdb_load
        // decodes them. The same bytes as an APPLY payload reach the replication decoder.
        let mut apply_payload = vec![1u8];
        apply_payload.extend_from_slice(&dump.limiter);
        assert!(!is_error(&apply(&mut con, "applied", &apply_payload)));
        exercise_and_remove(&mut con, "applied");
        for limiter in corrupt_limiters(&dump.limiter, &mut rng) {
            match restore(&mut con, "bad", &dump.with_limiter(&limiter)) {
                Value::Okay => {
                    accepted += 1;
                    exercise_and_remove(&mut con, "bad");
                }
                Value::ServerError(_) => refused += 1,
                other => panic!("RESTORE of a corrupt payload: {other:?}"),
            }
            let mut apply_payload = vec![1u8];
            apply_payload.extend_from_slice(&limiter);
            if !is_error(&apply(&mut con, "bad", &apply_payload)) {
                exercise_and_remove(&mut con, "bad");
            }
        }
        // The framing corrupted (module id, opcodes, lengths, EOF, version), CRC valid.
        for body in corrupt_bodies(&dump.body(), &mut rng) {
            match restore(&mut con, "bad", &with_crc(body)) {
                Value::Okay => {
                    accepted += 1;
                    exercise_and_remove(&mut con, "bad");
                }
                Value::ServerError(_) => refused += 1,
                other => panic!("RESTORE of a corrupt payload: {other:?}"),
            }
        }
        // A wrong CRC: refused by Redis before the module sees it.
        let mut wrong = payload.clone();
        let last = wrong.len() - 1;
        wrong[last] ^= 1;
        assert!(is_error(&restore(&mut con, "bad", &wrong)));
        assert!(!exists(&mut con, "bad"));
    }
    eprintln!("corrupt RESTORE payloads: {refused} refused, {accepted} accepted");
    assert!(refused > 100, "{refused} refused");
    // The corrupt limiters reached the module's rdb_load, which logs what it refuses (a RESTORE
    // refused by Redis alone, for a bad CRC or framing, would prove nothing about the decoder).
    assert!(
        server.log().contains("refusing corrupt limiter"),
        "no corrupt limiter reached the module's rdb_load (its warning is missing from the log)"
    );
    // Sliding-log appends as APPLY payloads: valid, and with every field at an extreme.
    let mut append = vec![2u8];
    for value in [10u64, HOUR_MS, base + 50_000, 2] {
        append.extend_from_slice(&value.to_le_bytes());
    }
    for key in ["d:log", "fresh", "d:token-bucket"] {
        let _ = apply(&mut con, key, &append);
    }
    for field in 0..4 {
        for value in [0u64, u64::MAX, 1 << 53, 10_000_001] {
            let mut m = append.clone();
            m[1 + 8 * field..9 + 8 * field].copy_from_slice(&value.to_le_bytes());
            let _ = apply(&mut con, "d:log", &m);
        }
    }
    for len in [1, 9, append.len() - 1] {
        assert!(is_error(&apply(&mut con, "fresh2", &append[..len])));
    }
    let mut longer = append.clone();
    longer.push(0);
    assert!(is_error(&apply(&mut con, "fresh2", &longer)));
    assert_info(&mut con, "d:log");
    assert_alive(&server);
}

#[test]
fn copy_move_digest_memory_reload_and_expiry() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    let keys = populate(&mut con, "c", base);
    decision(&mut con, "RATELIMIT.CHECK c:short fixed-window 3 1ms");
    decision(&mut con, "RATELIMIT.CHECK c:short2 sliding-log 3 1ms");
    for key in &keys {
        let copy = format!("{key}:copy");
        assert_eq!(int(&mut con, &format!("COPY {key} {copy}")), 1);
        assert_eq!(
            digests(&mut con, std::slice::from_ref(key)),
            digests(&mut con, std::slice::from_ref(&copy)),
        );
        for text in [
            format!("COPY {key} {key}:copy REPLACE"),
            format!("COPY {key} {key} DB 1"),
            format!("MEMORY USAGE {key}"),
            format!("MEMORY USAGE {key} SAMPLES 0"),
            format!("DEBUG OBJECT {key}"),
            format!("TYPE {key}"),
            format!("OBJECT ENCODING {key}"),
            format!("PEXPIRETIME {key}"),
            format!("RENAME {key}:copy {key}:renamed"),
            format!("MOVE {key}:renamed 2"),
        ] {
            let reply = run(&mut con, &text);
            assert!(!is_error(&reply), "{text}: {reply:?}");
        }
    }
    let _ = run(&mut con, "DEBUG DIGEST");
    let before = digests(&mut con, &keys);
    for text in [
        "SWAPDB 0 1",
        "SWAPDB 0 1",
        "DEBUG RELOAD",
        "CONFIG SET rdbcompression no",
        "DEBUG RELOAD",
    ] {
        let reply = run(&mut con, text);
        assert!(!is_error(&reply), "{text}: {reply:?}");
    }
    assert_eq!(
        digests(&mut con, &keys),
        before,
        "DEBUG RELOAD kept every limiter"
    );
    // Expired keys are freed lazily and actively.
    thread::sleep(Duration::from_millis(20));
    assert!(!exists(&mut con, "c:short"));
    let _ = run(&mut con, "RATELIMIT.INFO c:short2");
    decision(&mut con, "RATELIMIT.CHECK c:short3 token-bucket 3 1ms");
    let _ = run(&mut con, "DEBUG SET-ACTIVE-EXPIRE 1");
    thread::sleep(Duration::from_millis(200));
    // UNLINK, FLUSHDB ASYNC and FLUSHALL free values (in a background thread when large).
    let _ = run(&mut con, &format!("UNLINK {}", keys[0]));
    let _ = run(&mut con, "SELECT 1");
    let _ = run(&mut con, "FLUSHDB ASYNC");
    let _ = run(&mut con, "SELECT 0");
    let reply = run(&mut con, "FLUSHALL");
    assert!(!is_error(&reply), "{reply:?}");
    assert_alive(&server);
}

// ---------------------------------------------------------------------------------------------
// Contexts: MULTI/EXEC, Lua, configs, INFO, OOM

#[test]
fn transactions_scripts_configs_and_oom() {
    let server = Server::builder()
        .module_args(&["max-log-limit", "5000"])
        .config(&[("notify-keyspace-events", "KEA")])
        .start();
    let mut con = server.client();
    let replies = send(
        &mut con,
        &[
            line("MULTI"),
            line("RATELIMIT.CHECK m token-bucket 3 1h"),
            line("RATELIMIT.CHECKALL 2 m n token-bucket 3 1h sliding-log 3 1h"),
            line("RATELIMIT.PEEK m token-bucket 3 1h"),
            line("RATELIMIT.CHECK m fixed-window 3 1h"),
            line("RATELIMIT.INFO n"),
            line("RATELIMIT.RESET m"),
            line("EXEC"),
        ],
    );
    assert!(
        matches!(replies.last(), Some(Value::Array(_))),
        "{replies:?}"
    );
    for (command, script, keys) in [
        (
            "EVAL",
            "return redis.call('RATELIMIT.CHECK', KEYS[1], 'sliding-window', ARGV[1], '1h')",
            &["l"][..],
        ),
        (
            "EVAL",
            "return redis.call('RATELIMIT.CHECKALL', 2, KEYS[1], KEYS[2], 'leaky-bucket', 3, \
             '1h', 'sliding-log', ARGV[1], '1h')",
            &["l2", "l3"],
        ),
        (
            "EVAL",
            "return redis.call('RATELIMIT.PEEK', KEYS[1], 'sliding-window', 3, '1h')",
            &["l"],
        ),
        (
            "EVAL",
            "return redis.call('RATELIMIT.INFO', KEYS[1])",
            &["l"],
        ),
        (
            "EVAL",
            "return redis.pcall('RATELIMIT.CHECK', KEYS[1], 'gcra', 3, '1h')",
            &["l"],
        ),
        (
            "EVAL",
            "return redis.pcall('RATELIMIT.CHECK', KEYS[1], 'fixed-window', 3, '1h')",
            &["l"],
        ),
        (
            "EVAL_RO",
            "return redis.call('RATELIMIT.PEEK', KEYS[1], 'sliding-window', 3, '1h')",
            &["l"],
        ),
        (
            "EVAL_RO",
            "return redis.pcall('RATELIMIT.CHECK', KEYS[1], 'sliding-window', 3, '1h')",
            &["l"],
        ),
        (
            "EVAL",
            "return redis.call('RATELIMIT.RESET', KEYS[1], KEYS[2], KEYS[1])",
            &["l", "l2"],
        ),
    ] {
        let _ = eval(&mut con, command, script, keys, &["3"]);
    }
    // The module config: valid, invalid and its effect.
    for text in [
        "CONFIG GET ratelimit.*",
        "CONFIG SET ratelimit.max-log-limit 3",
        "CONFIG GET ratelimit.max-log-limit",
    ] {
        let reply = run(&mut con, text);
        assert!(!is_error(&reply), "{text}: {reply:?}");
    }
    for text in [
        "CONFIG SET ratelimit.max-log-limit 0",
        "CONFIG SET ratelimit.max-log-limit x",
        "CONFIG SET ratelimit.max-log-limit 10000001",
        "CONFIG SET ratelimit.max-log-limit -1",
        "RATELIMIT.CHECK big sliding-log 4 1h",
    ] {
        assert_error(&mut con, text);
    }
    decision(&mut con, "RATELIMIT.CHECK big sliding-log 3 1h");
    let _ = run(&mut con, "CONFIG SET ratelimit.max-log-limit 100000");
    for section in [
        "ratelimit",
        "modules",
        "everything",
        "keyspace",
        "commandstats",
    ] {
        let info: String = redis::cmd("INFO").arg(section).query(&mut con).unwrap();
        assert!(!info.is_empty());
    }
    let _ = run(&mut con, "MODULE LIST");
    let _ = run(&mut con, "CONFIG REWRITE");
    // Out of memory: every writing command is refused; reads and RESET still work.
    let _ = run(&mut con, "CONFIG SET maxmemory 1");
    for text in [
        "RATELIMIT.CHECK oom token-bucket 3 1h",
        "RATELIMIT.CHECKALL 1 oom token-bucket 3 1h",
        "RATELIMIT.APPLY oom x",
    ] {
        assert_error(&mut con, text);
    }
    let _ = run(&mut con, "RATELIMIT.PEEK oom token-bucket 3 1h");
    let _ = run(&mut con, "RATELIMIT.RESET big big");
    let _ = run(&mut con, "CONFIG SET maxmemory 0");
    decision(&mut con, "RATELIMIT.CHECK oom token-bucket 3 1h");
    assert_alive(&server);
}

// ---------------------------------------------------------------------------------------------
// Persistence and replication

/// `INFO persistence` fields that are 0 once no AOF rewrite runs or waits.
const REWRITING: [&str; 2] = ["aof_rewrite_in_progress", "aof_rewrite_scheduled"];

#[test]
fn aof_rewrite_replay_and_restart_keep_every_limiter() {
    let mut server = Server::builder()
        .config(&[("appendonly", "yes"), ("aof-use-rdb-preamble", "no")])
        .start();
    let mut con = server.client();
    let base = future_base_ms();
    wait_persistence_idle(&server, &REWRITING);
    let mut keys = populate(&mut con, "p", base);
    // The rewrite calls aof_rewrite in a forked child; writes after it are APPLY lines.
    let reply = run(&mut con, "BGREWRITEAOF");
    assert!(!is_error(&reply), "BGREWRITEAOF: {reply:?}");
    wait_persistence_idle(&server, &REWRITING);
    keys.extend(populate(&mut con, "p2", base + 1000));
    let _ = run(
        &mut con,
        &format!("RATELIMIT.RESET {} {}", keys[0], keys[0]),
    );
    keys.remove(0);
    let before = digests(&mut con, &keys);
    let reply = run(&mut con, "DEBUG LOADAOF");
    assert!(!is_error(&reply), "DEBUG LOADAOF: {reply:?}");
    assert_eq!(digests(&mut con, &keys), before, "replayed from the AOF");
    // With the RDB preamble: rdb_save in the rewrite child, rdb_load at restart.
    let _ = run(&mut con, "CONFIG SET aof-use-rdb-preamble yes");
    let _ = run(&mut con, "BGREWRITEAOF");
    wait_persistence_idle(&server, &REWRITING);
    let _ = run(&mut con, "BGSAVE");
    wait_persistence_idle(&server, &["rdb_bgsave_in_progress"]);
    server.restart();
    let mut con = server.client();
    assert_eq!(digests(&mut con, &keys), before, "after a restart");
    assert_alive(&server);
}

#[test]
fn a_replica_holds_the_masters_limiters() {
    let master = Server::start();
    let replica = Server::start();
    let mut con = master.client();
    let base = future_base_ms();
    // Keys that exist before the replica attaches go through the full sync (rdb_save in the
    // master's fork, rdb_load on the replica); later writes as RATELIMIT.APPLY.
    let mut keys = populate(&mut con, "before", base);
    replica.replica_of(&master);
    keys.extend(populate(&mut con, "after", base + 1000));
    let text = format!(
        "RATELIMIT.CHECKALL 3 after:token-bucket after:sliding-log all:new token-bucket 10 1h \
         BURST 5 sliding-log 10 1h fixed-window 3 1s AT {}",
        base + 2000
    );
    checkall_decision(&run(&mut con, &text), 3);
    keys.push("all:new".into());
    // RESET is replicated verbatim, repeated keys included.
    decision(&mut con, "RATELIMIT.CHECK gone token-bucket 3 1h");
    let _ = run(
        &mut con,
        "RATELIMIT.RESET gone gone before:sliding-log gone",
    );
    keys.retain(|k| k != "before:sliding-log");
    common::wait_replica_sync(&master, &replica);
    let mut rcon = replica.client();
    assert_eq!(
        digests(&mut rcon, &keys),
        digests(&mut con, &keys),
        "the replica's limiters"
    );
    assert!(!exists(&mut rcon, "gone"));
    for algorithm in ALGORITHMS {
        decision(
            &mut rcon,
            &format!(
                "RATELIMIT.PEEK after:{algorithm} {algorithm} 10 1h{}",
                burst(algorithm)
            ),
        );
        assert_info(&mut rcon, &format!("after:{algorithm}"));
    }
    // A replica refuses writes.
    assert_error(&mut rcon, "RATELIMIT.CHECK x token-bucket 3 1h");
    assert_alive(&replica);
    assert_alive(&master);
}
