//! `BLOCK duration` in the library as in the module, step by step on every algorithm: the
//! rejection that starts a block, its replies (CHECK, PEEK, COST 0, other parameters, a call
//! without BLOCK, a BLOCK that would extend it), REFUND during a block (a key left fresh stays),
//! its end, no block for a cost that can never pass, the expiry covering the block, INFO's
//! `blocked_until_ms`; in CHECKALL (once per key, whatever the request's outcome); long sliding
//! logs blocked, refunded and extended. After every step: the same reply, `PEXPIRETIME`,
//! `EXISTS` and INFO on both engines.

use std::fmt::Write as _;

use redis::{Connection, Value};
use redis_ratelimit_core::algorithms::Algorithm;

use super::engines::{algorithms, both_engines, fcall, native, same_info, same_reply, words};
use crate::common::{future_base_ms, send, show_value, try_reply6};

/// What a step answered on the library, after checking that the module answered the same.
struct Answer {
    reply: Value,
    expiry: Value,
    value: Value,
}

/// Runs `command keys line` on both engines (the module's keys `n:<key>`, the library's
/// `f:<key>`), then compares the replies and every key's expiry, existence and INFO.
fn step(
    con: &mut Connection,
    history: &mut String,
    command: &str,
    keys: &[&str],
    line: &str,
) -> Answer {
    let args = words(line);
    let nkeys: Vec<String> = keys.iter().map(|k| format!("n:{k}")).collect();
    let fkeys: Vec<String> = keys.iter().map(|k| format!("f:{k}")).collect();
    let n: Vec<&str> = nkeys.iter().map(String::as_str).collect();
    let f: Vec<&str> = fkeys.iter().map(String::as_str).collect();
    let mut cmds = vec![native(command, &n, &args), fcall(command, &f, &args)];
    for (nk, fk) in n.iter().zip(&f) {
        for what in ["PEXPIRETIME", "EXISTS"] {
            cmds.push(redis::cmd(what).arg(*nk).clone());
            cmds.push(redis::cmd(what).arg(*fk).clone());
        }
        cmds.push(native("info", &[nk], &[]));
        cmds.push(fcall("info", &[fk], &[]));
        cmds.push(redis::cmd("GET").arg(*fk).clone());
    }
    let replies = send(con, &cmds);
    let _ = writeln!(
        history,
        "  {command} {} {line}\n    module  {}\n    library {}",
        keys.join(" "),
        show_value(&replies[0]),
        show_value(&replies[1])
    );
    assert!(
        same_reply(&replies[0], &replies[1]),
        "the replies differ:\n{history}"
    );
    for (k, r) in replies[2..].chunks_exact(7).enumerate() {
        let key = keys[k];
        assert_eq!(r[0], r[1], "PEXPIRETIME of {key}:\n{history}");
        assert_eq!(r[2], r[3], "EXISTS of {key}:\n{history}");
        assert!(
            same_info(&r[4], &r[5]),
            "INFO of {key}: module {} library {}\n{history}",
            show_value(&r[4]),
            show_value(&r[5])
        );
    }
    Answer {
        reply: replies[1].clone(),
        expiry: replies[3].clone(),
        value: replies[8].clone(),
    }
}

fn blocked_value(value: &Value) -> bool {
    matches!(value, Value::BulkString(bytes) if bytes.starts_with(b"rl:bk "))
}

fn reply(answer: &Answer) -> [i64; 6] {
    try_reply6(&answer.reply).unwrap_or_else(|| panic!("{}", show_value(&answer.reply)))
}

/// INFO's `blocked_until_ms` on the library's key, if it shows one.
fn blocked_until(con: &mut Connection, key: &str) -> Option<i64> {
    let info = send(con, &[fcall("info", &[&format!("f:{key}")], &[])]);
    let Value::Array(items) = &info[0] else {
        return None;
    };
    items
        .chunks_exact(2)
        .find_map(|pair| match (&pair[0], &pair[1]) {
            (Value::SimpleString(name), Value::Int(n)) if name == "blocked_until_ms" => Some(*n),
            _ => None,
        })
}

#[test]
fn a_block_answers_as_the_module_on_every_algorithm() {
    let (_server, mut con) = both_engines();
    let t = future_base_ms();
    for algorithm in algorithms() {
        let name = algorithm.name();
        let key = format!("block:{name}");
        let key = key.as_str();
        let spec = format!("{name} 2 1s");
        let mut history = String::new();
        let mut run =
            |command: &str, line: String| step(&mut con, &mut history, command, &[key], &line);
        // No block on a missing key, nor for a cost that can never pass.
        run("check", format!("{spec} COST 3 BLOCK 5s AT {t}"));
        let first = run("check", format!("{spec} COST 2 BLOCK 5s AT {t}"));
        assert_eq!(reply(&first)[0], 1, "{name}");
        let never = run("check", format!("{spec} COST 3 BLOCK 5s AT {}", t + 50));
        assert_eq!(reply(&never)[3], -1, "{name}");
        assert!(
            !blocked_value(&never.value),
            "{name}: a cost above the limit blocked"
        );
        // Rejected at t+100: blocked until t+5100, the expiry covers the block.
        let started = run("check", format!("{spec} BLOCK 5s AT {}", t + 100));
        let r = reply(&started);
        assert_eq!((r[0], r[2], r[3]), (0, 0, 5000), "{name}: {r:?}");
        assert!(r[4] >= 5000, "{name}: {r:?}");
        assert!(blocked_value(&started.value), "{name}");
        let until = t as i64 + 5100;
        assert_eq!(started.expiry, Value::Int(until), "{name}");
        // A refund during the block gives back, and the key stays blocked (left fresh too).
        let refunded = run("refund", format!("{spec} COST 5 BLOCK 1s AT {}", t + 150));
        let r = reply(&refunded);
        assert_eq!(
            (r[0], r[2], r[3]),
            (0, 0, until - (t as i64 + 150)),
            "{name}"
        );
        assert!(
            blocked_value(&refunded.value),
            "{name}: the refund lifted the block"
        );
        assert_eq!(refunded.expiry, Value::Int(until), "{name}");
        // During the block: every call rejected, nothing written, the block not extended.
        for (command, line) in [
            ("peek", format!("{spec} BLOCK 5s AT {}", t + 200)),
            ("peek", format!("{spec} COST 0 AT {}", t + 300)),
            ("check", format!("{spec} COST 0 BLOCK 5s AT {}", t + 400)),
            ("check", format!("{spec} AT {}", t + 2000)),
            ("check", format!("{name} 100 1s COST 1 AT {}", t + 2100)),
            ("check", format!("{spec} BLOCK 60s AT {}", t + 2200)),
            ("checkall", format!("{spec} BLOCK 1m AT {}", t + 2250)),
            ("check", format!("{spec} COST 3 AT {}", t + 2260)),
        ] {
            let at: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
            let during = run(command, line.clone());
            let answer = match &during.reply {
                Value::Array(items) if command == "checkall" => {
                    try_reply6(&items[1]).expect("a decision")
                }
                _ => reply(&during),
            };
            assert_eq!((answer[0], answer[2]), (0, 0), "{name}: {line}");
            if !line.contains("COST 3") {
                assert_eq!(answer[3], until - at as i64, "{name}: {line}");
            } else {
                assert_eq!(answer[3], -1, "{name}: {line}");
            }
            assert_eq!(during.value, refunded.value, "{name}: {line} wrote");
            assert_eq!(during.expiry, Value::Int(until), "{name}: {line}");
        }
        assert_eq!(blocked_until(&mut con, key), Some(until), "{name}: INFO");
        let mut run =
            |command: &str, line: String| step(&mut con, &mut history, command, &[key], &line);
        run("refund", format!("{spec} COST 1 AT {}", t + 2300));
        run("peek", format!("{spec} COST 0 AT {}", t + 5099));
        // The block ends: the key answers as its algorithm would, and the value loses it.
        let ended = run("check", format!("{spec} BLOCK 5s AT {}", t + 5100));
        assert_eq!(reply(&ended)[0], 1, "{name}");
        assert!(
            !blocked_value(&ended.value),
            "{name}: the block outlived its end"
        );
        // A block again, now started by a call whose limit changed, then a wrong algorithm.
        run("check", format!("{spec} COST 2 BLOCK 10m AT {}", t + 5200));
        run("check", format!("{name} 1 1s BLOCK 10m AT {}", t + 5300));
        let other = if algorithm == Algorithm::Gcra {
            "fixed-window"
        } else {
            "gcra"
        };
        run("check", format!("{other} 2 1s AT {}", t + 5400));
        run("refund", format!("{spec} COST 1 AT {}", t + 5500));
        run("check", format!("{spec} AT {}", t + 605_300));
        run("reset", String::new());
        assert_eq!(blocked_until(&mut con, key), None, "{name}");
    }
}

#[test]
fn checkall_blocks_as_the_module() {
    let (_server, mut con) = both_engines();
    let t = future_base_ms();
    let mut history = String::new();
    let mut run =
        |keys: &[&str], line: String| step(&mut con, &mut history, "checkall", keys, &line);
    // a admits one a second and blocks; b admits plenty.
    let a = "fixed-window 1 1s BLOCK 5s";
    let b = "token-bucket 10 1s BURST 20";
    let admitted = run(&["a", "b"], format!("{a} {b} AT {t}"));
    assert!(
        matches!(&admitted.reply, Value::Array(items) if try_reply6(&items[0]).unwrap()[0] == 1)
    );
    // a rejects: the request is rejected, a is blocked, b unchanged.
    run(&["a", "b"], format!("{a} {b} AT {}", t + 10));
    // a blocked: rejected, whatever its limit says now.
    run(
        &["a", "b"],
        format!("fixed-window 100 1s {b} AT {}", t + 2000),
    );
    run(&["b", "a"], format!("{b} {a} COST 0 AT {}", t + 3000));
    // After the block: admitted again.
    run(&["a", "b"], format!("{a} {b} AT {}", t + 5010));
    // A key named twice with BLOCK: blocked once, by the first limit that rejects.
    run(&["c"], format!("sliding-log 3 1s COST 1 AT {t}"));
    run(
        &["c", "c"],
        format!("sliding-log 3 1s BLOCK 2s sliding-log 3 1s BLOCK 9s COST 2 AT {t}"),
    );
    run(
        &["c", "c"],
        format!(
            "sliding-log 3 1s BLOCK 2s sliding-log 3 1s BLOCK 9s COST 1 AT {}",
            t + 1
        ),
    );
    run(
        &["c", "c"],
        format!(
            "sliding-log 3 1s BLOCK 2s sliding-log 3 1s BLOCK 9s COST 1 AT {}",
            t + 1
        ),
    );
    // BLOCK on a limit that admits while another rejects: no block; on a missing key: none.
    run(
        &["d", "e"],
        format!("gcra 5 1s BLOCK 1m leaky-bucket 1 1s BLOCK 1m COST 2 AT {t}"),
    );
    run(
        &["d", "e", "d"],
        format!("gcra 5 1s BLOCK 1m leaky-bucket 9 1s gcra 5 1s COST 4 AT {t}"),
    );
    run(&["d"], format!("gcra 5 1s COST 1 AT {t}"));
    run(
        &["d", "e", "d"],
        format!(
            "gcra 5 1s leaky-bucket 9 1s gcra 5 1s BLOCK 1m COST 3 AT {}",
            t + 1
        ),
    );
    run(
        &["e", "d"],
        format!("leaky-bucket 9 1s gcra 5 1s COST 0 AT {}", t + 2),
    );
    // COST 0 starts no block; a call without BLOCK after the block's end is the algorithm's.
    run(
        &["f"],
        format!("sliding-window 1 1s BLOCK 1h COST 1 AT {t}"),
    );
    run(
        &["f"],
        format!("sliding-window 1 1s BLOCK 1h COST 0 AT {}", t + 1),
    );
    run(
        &["f"],
        format!("sliding-window 1 1s BLOCK 1h COST 1 AT {}", t + 2),
    );
    run(
        &["f"],
        format!("sliding-window 1 1s COST 1 AT {}", t + 3_600_001),
    );
    run(
        &["f"],
        format!("sliding-window 1 1s COST 1 AT {}", t + 3_600_002),
    );
}

/// Logs longer than the library's first read (128 bytes): blocked, refunded in part and in
/// whole during the block, extended after it, and blocks ending past 2^53.
#[test]
fn long_sliding_logs_and_blocks_near_2_53_answer_as_the_module() {
    let (_server, mut con) = both_engines();
    let t = future_base_ms();
    let mut history = String::new();
    let mut run =
        |command: &str, line: String| step(&mut con, &mut history, command, &["log"], &line);
    let spec = "sliding-log 300 1h";
    for i in 0..300 {
        run("check", format!("{spec} AT {}", t + i * 3));
    }
    let started = run("check", format!("{spec} BLOCK 10m AT {}", t + 1000));
    assert!(blocked_value(&started.value));
    run("refund", format!("{spec} COST 5 AT {}", t + 1001));
    run("peek", format!("{spec} COST 0 AT {}", t + 1002));
    // After the block: entries 5..295 still count; the log is extended and rewritten.
    for i in 0..8 {
        run(
            "check",
            format!("{spec} COST 2 BLOCK 1m AT {}", t + 601_000 + i),
        );
    }
    let ended = run("check", format!("{spec} AT {}", t + 3_600_050));
    assert!(!blocked_value(&ended.value));
    // A full log's cost: it fills the log or is rejected and blocks; the next call blocks.
    run(
        "check",
        format!("{spec} COST 300 BLOCK 1d AT {}", t + 3_601_000),
    );
    let again = run("check", format!("{spec} BLOCK 1d AT {}", t + 3_601_010));
    assert!(blocked_value(&again.value));
    // Every entry refunded during the block: the key stays, empty, until the block ends.
    let emptied = run("refund", format!("{spec} COST 1000 AT {}", t + 3_601_020));
    assert!(blocked_value(&emptied.value));
    run("peek", format!("{spec} AT {}", t + 3_601_030));
    run("check", format!("{spec} AT {}", t + 3_601_010 + 86_400_000));

    // Near 2^53: a block ending past it, its time left exact.
    let top: u64 = (1 << 53) - 1;
    for (i, algorithm) in Algorithm::ALL.iter().enumerate() {
        let name = algorithm.name();
        let key = format!("top:{i}");
        let mut run = |line: String| step(&mut con, &mut history, "check", &[&key], &line);
        run(format!("{name} 1 1d AT {}", top - 1000));
        let blocked = run(format!("{name} 1 1d BLOCK 3650d AT {}", top - 999));
        assert_eq!(reply(&blocked)[3], 3650 * 86_400_000, "{name}");
        let during = run(format!("{name} 1 1d COST 0 AT {}", top - 3));
        assert_eq!(reply(&during)[3], 3650 * 86_400_000 - 996, "{name}");
        step(
            &mut con,
            &mut history,
            "refund",
            &[&key],
            &format!("{name} 1 1d COST 1 AT {top}"),
        );
    }
}
