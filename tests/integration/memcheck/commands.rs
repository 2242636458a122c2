//! Under memcheck: CHECK, PEEK and INFO on every algorithm with every option, every argument
//! error once, RESP3 replies, CHECKALL, RESET, CL.THROTTLE and GCRA, blocks, refunds, policies
//! and leases.

use redis::Value;
use redis_ratelimit_core::algorithms::Algorithm;

use super::{assert_alive, assert_info, burst, checkall_decision, eval, HOUR_MS};
use crate::common::{
    cmd_line, digests, exists, future_base_ms, int, is_bucket, is_error, reply6, run, run_error,
    run_ok, send, send_one, six, Server,
};

#[test]
fn check_peek_and_info_on_every_algorithm() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    for (index, algorithm) in Algorithm::ALL.map(Algorithm::name).into_iter().enumerate() {
        let key = format!("cp:{algorithm}");
        let b = burst(algorithm);
        let at = |offset: u64| base + offset;
        // PEEK on a missing key creates nothing.
        six(
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
            // The server's clock, and lower-case options. Per day, so that the key is still
            // there for its INFO below: with 1s a fixed window's key expires at the next whole
            // second, and a bucket's 600 ms later, which a call under valgrind can outlast.
            format!("RATELIMIT.CHECK now:{key} {algorithm} 5 1d"),
            format!("RATELIMIT.CHECK now:{key} {algorithm} 5 1d cost 2"),
            format!("RATELIMIT.PEEK now:{key} {algorithm} 5 1d"),
        ] {
            six(&mut con, &text);
        }
        if is_bucket(algorithm) {
            // BURST below, equal to and above the limit, on the same key.
            for capacity in [1, 3, 50] {
                six(
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
        let other = Algorithm::ALL[(index + 1) % Algorithm::ALL.len()].name();
        run_error(&mut con, &format!("RATELIMIT.CHECK {key} {other} 3 1h"));
        run_error(&mut con, &format!("RATELIMIT.PEEK {key} {other} 3 1h"));
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
        six(
            &mut con,
            &format!(
                "RATELIMIT.CHECK max:{key} {algorithm} {limit} 3650d{big_burst} COST 100000 \
                 AT 9007199254740991"
            ),
        );
        // A key written at a time long past expires at once.
        six(
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
        cmds.push(cmd_line(&format!(
            "RATELIMIT.CHECK log sliding-log 1000 1h COST {cost} AT {t}"
        )));
    }
    for offset in [HOUR_MS / 2, HOUR_MS, HOUR_MS + 1_300_000, 5 * HOUR_MS] {
        cmds.push(cmd_line(&format!(
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
    run_ok(&mut con, "SET str v");
    six(&mut con, "RATELIMIT.CHECK tb token-bucket 3 1h");
    for command in ["RATELIMIT.CHECK", "RATELIMIT.PEEK"] {
        for args in [
            "",
            " k",
            " k token-bucket",
            " k token-bucket 3",
            " k leaky-window 3 1h",
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
            run_error(&mut con, &format!("{command}{args}"));
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
        "RATELIMIT.CHECKALL 2 k l token-bucket 3 1h leaky-window 3 1h",
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
        run_error(&mut con, text);
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
            let reply = send_one(&mut con, &cmd);
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
        assert!(is_error(&send_one(&mut con, &cmd)));
        let mut cmd = redis::cmd("RATELIMIT.APPLY");
        cmd.arg("k").arg(bad);
        assert!(is_error(&send_one(&mut con, &cmd)));
        let mut cmd = redis::cmd("RATELIMIT.CHECKALL");
        cmd.arg(bad).arg("k").arg("token-bucket").arg("3").arg("1h");
        assert!(is_error(&send_one(&mut con, &cmd)));
    }
    // The empty key, the 0xff key and the huge key are real keys: remove them.
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    run_error(
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
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
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
    run_error(&mut con, "RATELIMIT.CHECK r3:x leaky-window 1 1h");
    run_error(
        &mut con,
        "RATELIMIT.CHECK r3:token-bucket fixed-window 1 1h",
    );
    run_error(&mut con, "RATELIMIT.CHECKALL 0 r3:x token-bucket 1 1h");
    assert_eq!(
        int(
            &mut con,
            &cmd_line("RATELIMIT.RESET r3:token-bucket missing")
        ),
        1
    );
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
    run_error(
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
    // More keys than the module's inline lists hold (8): its lists on the heap, with and
    // without a key named twice, admitted and refused.
    for (names, cost) in [
        ((1..=9).map(|i| format!("m:{i}")).collect::<Vec<_>>(), 1),
        {
            let mut names: Vec<String> = (1..=11).map(|i| format!("m:{i}")).collect();
            names.insert(4, "m:2".into());
            (names, 2)
        },
    ] {
        let specs = names
            .iter()
            .enumerate()
            .map(|(i, _)| ["token-bucket 3 1h", "fixed-window 5 1h", "sliding-log 4 1h"][i % 3])
            .collect::<Vec<_>>()
            .join(" ");
        for at in [base + 3, base + 4] {
            let text = format!(
                "RATELIMIT.CHECKALL {} {} {specs} COST {cost} AT {at}",
                names.len(),
                names.join(" ")
            );
            let reply = run(&mut con, &text);
            if !is_error(&reply) {
                checkall_decision(&reply, names.len());
            }
        }
    }
    let _ = run(
        &mut con,
        "RATELIMIT.RESET m:1 m:2 m:3 m:4 m:5 m:6 m:7 m:8 m:9 m:2 m:10",
    );
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
    six(&mut con, "RATELIMIT.CHECK a token-bucket 3 1h");
    let removed = int(&mut con, &cmd_line("RATELIMIT.RESET a a a"));
    assert!(removed >= 1, "RESET a a a removed {removed}");
    assert!(!exists(&mut con, "a"));
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        let key = format!("k:{algorithm}");
        // A sliding log of several runs, so its value owns a heap buffer.
        for i in 0..4 {
            six(
                &mut con,
                &format!(
                    "RATELIMIT.CHECK {key} {algorithm} 10 1h{} AT {}",
                    burst(algorithm),
                    base + 1000 * i
                ),
            );
        }
        six(
            &mut con,
            &format!("RATELIMIT.CHECK other:{algorithm} {algorithm} 10 1h"),
        );
        let text = format!(
            "RATELIMIT.RESET {key} missing1 {key} other:{algorithm} missing2 {key} other:{algorithm}"
        );
        let removed = int(&mut con, &cmd_line(&text));
        assert!(removed >= 2, "{text}: {removed}");
        assert!(!exists(&mut con, &key));
        assert!(!exists(&mut con, &format!("other:{algorithm}")));
    }
    assert_eq!(
        int(&mut con, &cmd_line("RATELIMIT.RESET missing missing")),
        0
    );
    // All or nothing: a key of another type among repeated limiter keys removes nothing.
    six(&mut con, "RATELIMIT.CHECK b fixed-window 3 1h");
    run_ok(&mut con, "SET str v");
    run_error(&mut con, "RATELIMIT.RESET b b str b");
    assert!(exists(&mut con, "b"));
    // Inside MULTI and from Lua, where the context differs.
    let replies = send(
        &mut con,
        &[
            cmd_line("MULTI"),
            cmd_line("RATELIMIT.RESET b b"),
            cmd_line("RATELIMIT.CHECK b sliding-log 3 1h"),
            cmd_line("RATELIMIT.RESET b missing b"),
            cmd_line("EXEC"),
        ],
    );
    assert!(replies.iter().all(|r| !is_error(r)), "{replies:?}");
    six(&mut con, "RATELIMIT.CHECK c leaky-bucket 3 1h");
    let script = "return redis.call('RATELIMIT.RESET', KEYS[1], KEYS[1], KEYS[2])";
    let reply = eval(&mut con, "EVAL", script, &["c", "d"], &[]);
    assert!(!is_error(&reply), "{reply:?}");
    assert!(!exists(&mut con, "c"));
    assert_alive(&server);
}

#[test]
fn cl_throttle_and_gcra() {
    let server = Server::start();
    let mut con = server.client();
    run_ok(&mut con, "SET str v");
    // Periods of a minute: both keys outlive the test under valgrind (with 1 s periods `g` expired
    // about 300 ms in, before the RESET below counts it).
    for line in [
        "CL.THROTTLE t 4 10 60",
        "CL.THROTTLE t 4 10 60 3",
        "CL.THROTTLE t 4 10 60 0",
        "CL.THROTTLE t 4 10 60 9",
        "CL.THROTTLE t 0 1 315360000",
        "GCRA g 4 10 60",
        "GCRA g 4 10 30 TOKENS 2",
        "GCRA g 9 1 1e-6",
        "RATELIMIT.CHECK t gcra 10 60s BURST 5",
        "RATELIMIT.INFO g",
    ] {
        let reply = run(&mut con, line);
        assert!(!is_error(&reply), "{line}: {reply:?}");
    }
    for line in [
        "CL.THROTTLE t",
        "CL.THROTTLE t -1 1 1",
        "CL.THROTTLE t 1 0 1",
        "CL.THROTTLE t 1 1 0",
        "CL.THROTTLE t 1 1 1 1 1",
        "CL.THROTTLE str 1 1 1",
        "GCRA g 1 1",
        "GCRA g x 1 1",
        "GCRA g 1 1 nan",
        "GCRA g 1 1 1 TOKENS",
        "GCRA g 1 1 1 TOKENS 0",
        "GCRA g 1 1 999999999999",
        "GCRA str 1 1 1",
        "RATELIMIT.CHECK t token-bucket 10 1s",
    ] {
        run_error(&mut con, line);
    }
    run_ok(&mut con, "DEBUG RELOAD");
    assert_eq!(
        int(
            &mut con,
            redis::cmd("RATELIMIT.RESET").arg(&["t", "g", "t"])
        ),
        2
    );
    assert_alive(&server);
}

#[test]
fn blocks_refunds_policies_and_leases() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        let key = format!("b:{algorithm}");
        let spec = format!("{algorithm} 2 1s BLOCK 5s");
        let at = |ms: u64| base + ms;
        // Filled, blocked (the limiter moves to the boxed form), asked during the block, refunded,
        // read, and cleared by the first consuming call after it (back to the smallest form).
        assert_eq!(
            six(
                &mut con,
                &format!("RATELIMIT.CHECK {key} {spec} COST 2 AT {}", at(0))
            )[0],
            1
        );
        assert_eq!(
            six(
                &mut con,
                &format!("RATELIMIT.CHECK {key} {spec} AT {}", at(10))
            )[0],
            0
        );
        six(
            &mut con,
            &format!("RATELIMIT.PEEK {key} {spec} COST 0 AT {}", at(20)),
        );
        six(
            &mut con,
            &format!("RATELIMIT.CHECK {key} {algorithm} 9 1s AT {}", at(30)),
        );
        six(
            &mut con,
            &format!("RATELIMIT.REFUND {key} {spec} COST 1 AT {}", at(40)),
        );
        assert_info(&mut con, &key);
        assert_eq!(
            six(
                &mut con,
                &format!("RATELIMIT.CHECK {key} {spec} AT {}", at(6_000))
            )[0],
            1
        );
        assert_info(&mut con, &key);
        // Refunds: of more than was taken (the key is deleted), on a missing key, errors.
        six(
            &mut con,
            &format!("RATELIMIT.REFUND {key} {spec} COST 1000 AT {}", at(6_000)),
        );
        six(
            &mut con,
            &format!("RATELIMIT.REFUND missing:{algorithm} {spec} COST 1"),
        );
        run_error(&mut con, &format!("RATELIMIT.REFUND {key} {spec}"));
        run_error(
            &mut con,
            &format!("RATELIMIT.CHECK {key} {algorithm} 2 1s BLOCK 0"),
        );
        // A CHECKALL that blocks one of its keys, then meets the block.
        let all = format!(
            "RATELIMIT.CHECKALL 2 {{c}}:{algorithm} {{c}}:x {algorithm} 1 1s BLOCK 2s \
             token-bucket 5 1s AT {}",
            at(0)
        );
        for _ in 0..3 {
            send_one(&mut con, &cmd_line(&all));
        }
    }
    // Policies: defined, replaced, read, applied, listed and removed; their errors.
    run_ok(
        &mut con,
        "RATELIMIT.POLICY SET p sliding-window 5 1s BLOCK 1m",
    );
    run_ok(
        &mut con,
        "RATELIMIT.POLICY SET p sliding-window 5 1s BLOCK 1m SHADOW",
    );
    run_ok(&mut con, "RATELIMIT.POLICY SET q concurrency 2 1m");
    run(&mut con, "RATELIMIT.POLICY GET p");
    run(&mut con, "RATELIMIT.POLICY LIST");
    for _ in 0..7 {
        six(&mut con, "RATELIMIT.CHECK pk POLICY p");
    }
    send_one(
        &mut con,
        &cmd_line("RATELIMIT.CHECKALL 2 {p}a {p}b POLICY p POLICY p"),
    );
    run_error(&mut con, "RATELIMIT.CHECK pk POLICY nothere");
    run_error(&mut con, "RATELIMIT.POLICY SET bad:name fixed-window 1 1s");
    run(&mut con, "INFO ratelimit");
    // Leases: taken, renewed, refused, read, released, expired; their errors.
    for i in 0..50 {
        six(
            &mut con,
            &format!("RATELIMIT.ACQUIRE jobs 40 1m ID job-{i} AT {base}"),
        );
    }
    six(
        &mut con,
        &format!(
            "RATELIMIT.ACQUIRE jobs 40 1m ID job-3 COST 2 AT {}",
            base + 1
        ),
    );
    six(&mut con, "RATELIMIT.ACQUIRE jq POLICY q ID a");
    assert_info(&mut con, "jobs");
    for i in 0..45 {
        run(
            &mut con,
            &format!("RATELIMIT.RELEASE jobs ID job-{i} AT {}", base + 2),
        );
    }
    six(
        &mut con,
        &format!("RATELIMIT.ACQUIRE jobs 40 1m ID late AT {}", base + 120_000),
    );
    run_error(&mut con, "RATELIMIT.ACQUIRE jobs 0 1m ID x");
    run_error(&mut con, "RATELIMIT.ACQUIRE jobs 2 1m ID x COST 0");
    run_error(&mut con, "RATELIMIT.CHECK jobs token-bucket 2 1s");
    run_error(&mut con, "RATELIMIT.ACQUIRE {c}:x 2 1m ID x");
    run_ok(&mut con, "DEBUG RELOAD");
    assert_info(&mut con, "jobs");
    run_ok(&mut con, "RATELIMIT.POLICY DEL p");
    run(&mut con, "RATELIMIT.RESET jobs jq pk");
    assert_alive(&server);
}

/// Limit specs given as one argument: every command, valid and malformed, and lists of words
/// past their inline room (a spec of 30 words; a CHECKALL of 10 keys with 7-word specs).
#[test]
fn specs_of_one_argument_valid_malformed_and_past_the_inline_room() {
    let server = Server::start();
    let mut con = server.client();
    run_ok(&mut con, "RATELIMIT.POLICY SET api gcra 5 1s");
    let call = |name: &str, args: &[&str]| {
        let mut cmd = redis::cmd(name);
        for arg in args {
            cmd.arg(*arg);
        }
        cmd
    };
    let spec = "token-bucket 10 1s BURST 20 BLOCK 1m";
    let long = format!("{spec}{}", " BURST 2".repeat(12));
    let mut cmds = vec![
        call("RATELIMIT.CHECK", &["o:1", spec, "COST", "2"]),
        call("RATELIMIT.PEEK", &["o:1", spec]),
        call("RATELIMIT.TAKE", &["o:1", spec, "MAX", "3"]),
        call("RATELIMIT.REFUND", &["o:1", spec, "COST", "1"]),
        call("RATELIMIT.CHECK", &["o:2", "POLICY api"]),
        call("RATELIMIT.CHECK", &["o:3", &long]),
        call("RATELIMIT.CHECK", &["o:3", " fixed-window 1 1s"]),
        call("RATELIMIT.CHECK", &["o:3", "fixed-window\t1 1s"]),
        call("RATELIMIT.CHECK", &["o:3", "fixed-window 1 1s COST 1"]),
        call("RATELIMIT.TAKE", &["o:3", "fixed-window 1"]),
    ];
    let keys: Vec<String> = (0..10).map(|i| format!("{{o}}:{i}")).collect();
    let mut checkall = vec!["10".to_string()];
    checkall.extend(keys.iter().cloned());
    checkall.extend((0..10).map(|_| spec.to_string()));
    let args: Vec<&str> = checkall.iter().map(String::as_str).collect();
    cmds.push(call("RATELIMIT.CHECKALL", &args));
    let mut bad = args.clone();
    bad[14] = "token-bucket 10 1s BURST";
    cmds.push(call("RATELIMIT.CHECKALL", &bad));
    let replies = send(&mut con, &cmds);
    for (i, reply) in replies.iter().enumerate() {
        let refused = matches!(i, 5..=9 | 11);
        assert_eq!(is_error(reply), refused, "{i}: {reply:?}");
    }
    checkall_decision(&replies[10], 10);
    assert_alive(&server);
}
