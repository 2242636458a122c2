//! `CL.THROTTLE` (redis-cell) and `GCRA` (the withdrawn Redis 8.8 proposal) on the module's `gcra`
//! limiter: the same replies as redis-cell on random sequences (when ../shared/peers/ has it), the
//! proposal's worked examples, one key type behind all three front ends, what redis-cell gets
//! wrong answered as a Redis command should (WRONGTYPE, OOM), and the load argument `dialects`
//! that chooses which of the two the module registers.

use crate::common;

use std::thread;
use std::time::Duration;

use common::rng::Rng;
use common::{future_base_ms, redis_cell, Server};
use redis::{Connection, Value};

fn throttle(con: &mut Connection, key: &str, args: &[u64]) -> Vec<i64> {
    redis::cmd("CL.THROTTLE")
        .arg(key)
        .arg(args)
        .query(con)
        .unwrap_or_else(|e| panic!("CL.THROTTLE {key} {args:?}: {e}"))
}

fn gcra(con: &mut Connection, key: &str, args: &[&str]) -> Vec<i64> {
    redis::cmd("GCRA")
        .arg(key)
        .arg(args)
        .query(con)
        .unwrap_or_else(|e| panic!("GCRA {key} {args:?}: {e}"))
}

fn error(con: &mut Connection, command: &str, args: &[&str]) -> String {
    match redis::cmd(command).arg(args).query::<Value>(con) {
        Ok(value) => panic!("{command} {args:?}: expected an error, got {value:?}"),
        Err(e) => e.to_string(),
    }
}

/// A burst at one instant, then rejection, on `CL.THROTTLE key 4 1 1` (5 at once, one a second):
/// the fields redis-cell's own test table gives.
#[test]
fn throttle_answers_as_redis_cell_documents() {
    let server = Server::start();
    let mut con = server.client();
    // A request larger than the burst can never pass.
    assert_eq!(throttle(&mut con, "k", &[4, 1, 1, 6]), [1, 5, 5, -1, 0]);
    for remaining in (0..5).rev() {
        let reset = 5 - remaining;
        assert_eq!(
            throttle(&mut con, "k", &[4, 1, 1]),
            [0, 5, remaining, -1, reset]
        );
    }
    assert_eq!(throttle(&mut con, "k", &[4, 1, 1]), [1, 5, 0, 1, 5]);
    // Quantity 0 asks without consuming, and creates nothing.
    assert_eq!(throttle(&mut con, "k", &[4, 1, 1, 0]), [0, 5, 0, -1, 5]);
    assert_eq!(throttle(&mut con, "fresh", &[4, 1, 1, 0]), [0, 5, 5, -1, 0]);
    let exists: i64 = redis::cmd("EXISTS").arg("fresh").query(&mut con).unwrap();
    assert_eq!(exists, 0);
    // The key is a gcra limiter, with a TTL at the moment it is fresh again.
    let pttl: i64 = redis::cmd("PTTL").arg("k").query(&mut con).unwrap();
    assert!((4_000..=5_000).contains(&pttl), "PTTL {pttl}");
    let info: Vec<Value> = redis::cmd("RATELIMIT.INFO")
        .arg("k")
        .query(&mut con)
        .unwrap();
    assert_eq!(info[1], Value::SimpleString("gcra".into()), "{info:?}");
}

/// The proposal's `GCRA key max_burst tokens_per_period period [TOKENS count]`, worked by hand:
/// `GCRA k 2 1 2` is one token every 2 s with bursts of 3 (a tolerance of 6 s).
#[test]
fn gcra_worked_examples() {
    let server = Server::start();
    let mut con = server.client();
    // [limited, max_burst + 1, remaining, retry_after_s, reset_after_s]
    assert_eq!(gcra(&mut con, "g", &["2", "1", "2"]), [0, 3, 2, -1, 2]);
    assert_eq!(gcra(&mut con, "g", &["2", "1", "2"]), [0, 3, 1, -1, 4]);
    assert_eq!(gcra(&mut con, "g", &["2", "1", "2"]), [0, 3, 0, -1, 6]);
    // Full: the next token in 2 s; the TAT stays at 6 s.
    assert_eq!(gcra(&mut con, "g", &["2", "1", "2"]), [1, 3, 0, 2, 6]);
    // Two tokens at once need 4 s; four never fit.
    assert_eq!(
        gcra(&mut con, "g", &["2", "1", "2", "TOKENS", "2"]),
        [1, 3, 0, 4, 6]
    );
    assert_eq!(
        gcra(&mut con, "g", &["2", "1", "2", "TOKENS", "4"]),
        [1, 3, 0, -1, 6]
    );
    // A fractional period: 0.5 s per 5 tokens is one every 100,000 µs, burst of 1.
    assert_eq!(gcra(&mut con, "h", &["0", "5", "0.5"]), [0, 1, 0, -1, 1]);
    assert_eq!(gcra(&mut con, "h", &["0", "5", "0.5"]), [1, 1, 0, 1, 1]);
    // The proposal's errors, each naming its argument.
    for (args, expected) in [
        (&["1", "10"][..], "wrong number of arguments"),
        (
            &["1", "10", "1", "TOKENS", "1", "x"],
            "wrong number of arguments",
        ),
        (
            &["x", "10", "1"],
            "max_burst is not an integer or out of range",
        ),
        (
            &["-1", "10", "1"],
            "max_burst is out of range, must be 0 or more",
        ),
        (
            &["4", "0", "1"],
            "tokens_per_period is out of range, must be between 1 and",
        ),
        (
            &["1", "10", "1", "TOKENS", "0"],
            "TOKENS is out of range, must be between 1 and",
        ),
        (&["1", "10", "abc"], "period is not a valid float"),
        (&["1", "10", "0"], "period must be > 0 and < 1e12"),
        (&["1", "10", "1e12"], "period must be > 0 and < 1e12"),
        (&["1", "10", "1", "COUNT", "2"], "syntax error"),
        (&["1", "10", "1", "TOKENS"], "Missing TOKENS value"),
    ] {
        let mut full = vec!["e"];
        full.extend_from_slice(args);
        let message = error(&mut con, "GCRA", &full);
        assert!(message.contains(expected), "GCRA {args:?}: {message}");
    }
}

/// One limiter behind three front ends: where their parameters coincide, `CL.THROTTLE`, `GCRA`
/// and `RATELIMIT.CHECK ... gcra` share the key and its state; `gcra` answers as the token bucket
/// with the same parameters (its other side); other types get WRONGTYPE.
#[test]
fn one_limiter_three_front_ends() {
    let server = Server::start();
    let mut con = server.client();
    // 10 per 10 s, bursts of 3: one each front end in turn on one key.
    assert_eq!(throttle(&mut con, "k", &[2, 10, 10]), [0, 3, 2, -1, 1]);
    assert_eq!(gcra(&mut con, "k", &["2", "10", "10"]), [0, 3, 1, -1, 2]);
    let check: Vec<i64> = redis::cmd("RATELIMIT.CHECK")
        .arg(&["k", "gcra", "10", "10s", "BURST", "3"])
        .query(&mut con)
        .unwrap();
    assert_eq!(&check[..3], [1, 3, 0]);
    assert_eq!(throttle(&mut con, "k", &[2, 10, 10]), [1, 3, 0, 1, 3]);

    // With AT: gcra and token-bucket answer alike on the same calls.
    let base = future_base_ms();
    let mut rng = Rng::new(7);
    for round in 0..200 {
        let at = base + round * rng.range(0, 400);
        let cost = rng.range(0, 4);
        let call = |con: &mut Connection, key: &str, algorithm: &str| -> Vec<i64> {
            redis::cmd("RATELIMIT.CHECK")
                .arg(&[key, algorithm, "5", "2s", "BURST", "4"])
                .arg("COST")
                .arg(cost)
                .arg("AT")
                .arg(at)
                .query(con)
                .unwrap()
        };
        assert_eq!(
            call(&mut con, "as-gcra", "gcra"),
            call(&mut con, "as-bucket", "token-bucket"),
            "round {round}"
        );
    }

    // Type safety where redis-cell aborts the server: a string key, another algorithm.
    let _: () = redis::cmd("SET").arg("s").arg("v").query(&mut con).unwrap();
    assert!(error(&mut con, "CL.THROTTLE", &["s", "1", "1", "1"]).starts_with("WRONGTYPE"));
    assert!(error(&mut con, "GCRA", &["s", "1", "1", "1"]).starts_with("WRONGTYPE"));
    assert!(
        error(&mut con, "CL.THROTTLE", &["as-bucket", "1", "1", "1"])
            .contains("holds a token-bucket limiter, not gcra")
    );
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");
}

/// redis-cell creates keys past `maxmemory`; these refuse, as a write command should.
#[test]
fn new_keys_are_refused_under_oom() {
    let server = Server::builder()
        .config(&[("maxmemory", "1"), ("maxmemory-policy", "noeviction")])
        .start();
    let mut con = server.client();
    assert!(error(&mut con, "CL.THROTTLE", &["k", "1", "1", "1"]).starts_with("OOM"));
    assert!(error(&mut con, "GCRA", &["k", "1", "1", "1"]).starts_with("OOM"));
}

/// Whether the server has a command of this name (`COMMAND INFO` answers nil for none).
fn has_command(con: &mut Connection, name: &str) -> bool {
    let info: Vec<Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg(name)
        .query(con)
        .unwrap();
    !matches!(info.as_slice(), [Value::Nil])
}

/// `loadmodule ... dialects <value>` registers the dialects it names and no other, and the load
/// log says which; the module's own commands are there whatever the value.
#[test]
fn the_dialects_load_argument_chooses_the_commands_registered() {
    for (args, with_throttle, with_gcra, logged) in [
        (&[][..], true, true, "cl.throttle, gcra"),
        (&["dialects", "all"][..], true, true, "cl.throttle, gcra"),
        (&["dialects", "none"][..], false, false, "none"),
        (&["dialects", "cl.throttle"][..], true, false, "cl.throttle"),
        (&["dialects", "GCRA"][..], false, true, "gcra"),
        (
            &["dialects", "gcra,cl.throttle"][..],
            true,
            true,
            "cl.throttle, gcra",
        ),
        (
            &["max-log-limit", "10", "dialects", "none"][..],
            false,
            false,
            "none",
        ),
    ] {
        let server = Server::builder().module_args(args).start();
        let mut con = server.client();
        assert_eq!(
            has_command(&mut con, "cl.throttle"),
            with_throttle,
            "{args:?}"
        );
        assert_eq!(has_command(&mut con, "gcra"), with_gcra, "{args:?}");
        assert!(has_command(&mut con, "ratelimit.check"), "{args:?}");
        if !with_gcra {
            let message = error(&mut con, "GCRA", &["g", "1", "1", "1"]);
            assert!(message.contains("unknown command"), "{args:?}: {message}");
        }
        if with_throttle {
            assert_eq!(throttle(&mut con, "k", &[4, 1, 1])[..3], [0, 5, 4]);
        }
        let log = server.log();
        assert!(
            log.contains(&format!("dialects registered: {logged}")),
            "{args:?}\n{log}"
        );
        for name in ["cl.throttle", "gcra"] {
            let skipped = format!("ratelimit: {name} not registered (load argument dialects)");
            let wanted = if name == "gcra" {
                with_gcra
            } else {
                with_throttle
            };
            assert_eq!(log.contains(&skipped), !wanted, "{args:?} {name}\n{log}");
        }
    }
}

/// A value that names no dialect refuses the load, and the log says why.
#[test]
fn a_bad_dialects_value_refuses_to_start() {
    for (value, reason) in [
        ("cell", "unknown dialect 'cell'"),
        ("none,gcra", "'none' stands alone"),
        ("gcra,", "unknown dialect ''"),
    ] {
        let failed = Server::builder()
            .module_args(&["dialects", value])
            .start_expecting_failure();
        assert!(
            !failed.status.success(),
            "dialects {value}: {}",
            failed.status
        );
        let line = format!(
            "ratelimit: load argument 'dialects': '{value}' refused: {reason}; expected none, \
             all, or one or more of cl.throttle, gcra separated by commas; the module is not loaded"
        );
        assert!(
            failed.log.contains(&line),
            "dialects {value}\n{}",
            failed.log
        );
        assert!(failed.log.contains("Can't load module"), "{}", failed.log);
    }
}

/// With redis-cell loaded first, its `CL.THROTTLE` stays and the module loads beside it.
#[test]
fn a_server_that_has_the_command_keeps_its_own() {
    let Some(cell) = redis_cell() else { return };
    let module = common::module_path();
    let server = Server::builder()
        .no_module()
        .config(&[("loadmodule", cell.to_str().unwrap())])
        .config(&[("loadmodule", module.to_str().unwrap())])
        .start();
    let mut con = server.client();
    let _: () = redis::cmd("SET").arg("s").arg("v").query(&mut con).unwrap();
    // Ours would answer WRONGTYPE; redis-cell answers with its own error text.
    let message = error(&mut con, "CL.THROTTLE", &["k", "1", "0", "1"]);
    assert!(message.contains("Zero rates"), "{message}");
    assert!(server.log().contains("the server already has cl.throttle"));
    assert_eq!(gcra(&mut con, "g", &["1", "1", "1"])[0], 0);
}

/// Random sequences sent to redis-cell and to the module, call for call within a millisecond:
/// every field equal, but for what a millisecond's difference between the two clocks can change
/// exactly at a boundary (a whole second for retry/reset, an emission interval for remaining):
/// counted, bounded, and the key started afresh on both when it happens.
#[test]
fn throttle_equals_redis_cell_on_random_sequences() {
    let Some(cell) = redis_cell() else { return };
    let ours = Server::start();
    let theirs = Server::builder()
        .no_module()
        .config(&[("loadmodule", cell.to_str().unwrap())])
        .start();
    let (mut a, mut b) = (ours.client(), theirs.client());
    let seed: u64 = std::env::var("RATELIMIT_DIALECT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let mut rng = Rng::new(seed);
    let (mut calls, mut boundary, mut slept) = (0u64, 0u64, 0u64);
    for sequence in 0..40 {
        let key = format!("seq{sequence}");
        let max_burst = rng.range(0, 50);
        // Periods from 1 s to a day, emission intervals from 100 ms up.
        let period = [1, 2, 10, 60, 3_600, 86_400][rng.index(6)];
        let count = rng.range(1, (period * 10).min(1_000));
        for _ in 0..rng.range(5, 30) {
            let quantity = rng.range(0, max_burst + 2);
            let args = [max_burst, count, period, quantity];
            let x = throttle(&mut a, &key, &args);
            let y = throttle(&mut b, &key, &args);
            calls += 1;
            let same = x[..3] == y[..3] && x[3] == y[3] && x[4] == y[4];
            if !same {
                // Either the two clocks fell on both sides of the moment the request fits
                // (one admits, one rejects), or of a second or an interval's boundary.
                let near = x[1] == y[1]
                    && (x[0] != y[0]
                        || ((x[2] - y[2]).abs() <= 1
                            && (x[3] - y[3]).abs() <= 1
                            && (x[4] - y[4]).abs() <= 1));
                assert!(
                    near,
                    "seed {seed} {key} CL.THROTTLE {args:?}: ours {x:?}, redis-cell {y:?}"
                );
                boundary += 1;
                let _: i64 = redis::cmd("RATELIMIT.RESET")
                    .arg(&key)
                    .query(&mut a)
                    .unwrap();
                let _: i64 = redis::cmd("DEL").arg(&key).query(&mut b).unwrap();
            }
            // Now and then across emission intervals, when they are short.
            let interval_ms = period * 1000 / count;
            if interval_ms <= 300 && slept < 2_500 && rng.range(0, 9) == 0 {
                let pause = rng.range(interval_ms / 2, interval_ms * 2);
                thread::sleep(Duration::from_millis(pause));
                slept += pause;
            }
        }
    }
    eprintln!("{calls} calls, {boundary} at a boundary, {slept} ms asleep");
    assert!(
        boundary * 20 <= calls,
        "{boundary} of {calls} calls differ: more than a clock's millisecond explains"
    );
}
