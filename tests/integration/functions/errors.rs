//! Every bad argument gets the module's message (with the function's name for the command's),
//! the library's own refusals (its exact range, FCALL's key count), and `WRONGTYPE` for keys of
//! the other engine or of another type.

use redis::Value;

use super::engines::{assert_same_error, both_engines, fcall, native, words};
use crate::common::{
    dbsize, error_text, int, now_ms, send, send_one, show_cmd, show_value, try_reply6,
};

/// Policies are the module's: the library refuses a call that names one, in every form.
#[test]
fn a_call_naming_a_policy_is_refused_by_the_library() {
    let (_server, mut con) = both_engines();
    let text = "the ratelimit functions library has no policies: give the limit as algorithm \
                limit period [BURST capacity] (see docs/functions.md)";
    for (command, keys, line, prefix) in [
        ("check", &["k"][..], "POLICY api", "ERR "),
        ("peek", &["k"], "policy api COST 0", "ERR "),
        (
            "checkall",
            &["a", "b"],
            "fixed-window 1 1s POLICY api",
            "ERR limit spec 2 (key 'b'): ",
        ),
        (
            "checkall",
            &["a", "b"],
            "POLICY api fixed-window 1 1s",
            "ERR limit spec 1 (key 'a'): ",
        ),
    ] {
        let reply = send_one(&mut con, &fcall(command, keys, &words(line)));
        assert_eq!(
            error_text(&reply),
            Some(format!("{prefix}{text}")),
            "{command} {line}"
        );
    }
    assert_eq!(dbsize(&mut con), 0);
}

#[test]
fn every_bad_argument_gets_the_modules_message() {
    let (_server, mut con) = both_engines();
    let check_vectors = [
        "",
        "token-bucket",
        "token-bucket 10",
        "leaky-window 10 1s",
        "sliding-logs 1 1s",
        "fixed-window 0 1s",
        "fixed-window -1 1s",
        "fixed-window 1000000000001 1s",
        "fixed-window 99999999999999999999999 1s",
        "fixed-window 1.0 1s",
        "fixed-window 10 0",
        "fixed-window 10 0s",
        "fixed-window 10 3651d",
        "fixed-window 10 1w",
        "fixed-window 10 1.5s",
        "fixed-window 10 s",
        "fixed-window 10 -1s",
        "fixed-window 10 1mss",
        "fixed-window 10 1s BURST 5",
        "FIXED-WINDOW 10 1S cost 1 at 5 burst 2",
        "token-bucket 10 1s BURST 0",
        "token-bucket 10 1s BURST x",
        "token-bucket 10 1s BURST",
        "token-bucket 10 1s BURST 2 BURST 3",
        "token-bucket 10 1s COST -1",
        "token-bucket 10 1s COST 1000000000001",
        "token-bucket 10 1s COST",
        "token-bucket 10 1s COST 1 COST 2",
        "token-bucket 10 1s COST x COST 2",
        "token-bucket 10 1s COST 1 COST x",
        "token-bucket 10 1s AT 9007199254740992",
        "token-bucket 10 1s AT 1e3",
        "token-bucket 10 1s AT",
        "token-bucket 10 1s AT 1 AT 2",
        "token-bucket 10 1s LIMIT 3",
        "token-bucket 10 1s COST 1 AT 2 BURST 3 COST 4",
        "sliding-log 100001 1s",
        "sliding-log 1000000000000 1s COST 1",
        "gcra-bucket 10 1s",
        "gcra 0 1s",
        "gcra 10 0ms",
        "gcra 10 1s BURST 0",
        "GCRA 10 1s burst 1000000000001",
        "gcra 10 1s BURST 2 BURST 3",
        "gcra 10 1s COST 1000000000001",
        "sliding-window 100 1 minute",
        "sliding-window 100 15 Secs COST 1",
        "sliding-window 100 15 fortnights",
        "sliding-window 100 15s minute",
        "sliding-window 100 15 COST 1 minute",
        "fixed-window 5 1s yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy",
        "fixed-window 5 1s a\u{1}\u{ff}b",
        "sliding-windows 100 1m",
        // BLOCK: a duration as a period is, once, among the options in any order.
        "fixed-window 10 1s BLOCK",
        "fixed-window 10 1s BLOCK 0",
        "fixed-window 10 1s BLOCK 0s",
        "fixed-window 10 1s BLOCK 3651d",
        "fixed-window 10 1s BLOCK 1w",
        "fixed-window 10 1s BLOCK -1s",
        "fixed-window 10 1s BLOCK 1.5s",
        "fixed-window 10 1s BLOCK x",
        "fixed-window 10 1s block 1s BLOCK 2s",
        "token-bucket 10 1s BLOCK 1s BURST 2 block 1m",
        "fixed-window 10 1s BLOCK 1s BURST 2",
        "fixed-window 10 1s BLOCK 1s COST 1 minute",
        "fixed-window 10 1s BLOCK 1 minute",
        "sliding-log 100001 1s BLOCK 1s",
        "token-bucket 10 1s BLOCK x COST y",
        "token-bucket 10 1s COST y BLOCK x",
    ];
    for line in check_vectors {
        let args = words(line);
        for command in ["check", "peek", "refund"] {
            let (module, library) = (
                native(command, &["k"], &args),
                fcall(command, &["k"], &args),
            );
            assert_same_error(&mut con, module, library, &format!("{command} k {line}"));
        }
    }
    // REFUND takes CHECK's arguments (the errors above), COST required.
    let refund_vectors = [
        "token-bucket 10 1s",
        "token-bucket 10 1s AT 5",
        "TOKEN-BUCKET 10 1S burst 2 at 5",
        "gcra 10 1s BURST 5",
        "sliding-log 3 1h",
        "fixed-window 10 1s COST",
        "fixed-window 10 1s COST x",
        "fixed-window 10 1s cost 1 COST 1",
        "fixed-window 10 1s COST 1 BURST 2",
        "fixed-window 10 1s BLOCK 1s",
        "fixed-window 10 1s BLOCK x COST 1",
        "fixed-window 10 1s COST 1 BLOCK 1s BLOCK 1s",
        "fixed-window 10 1s COST 1 AT 9007199254740992",
        "token-bucket 10 1s AT COST",
        "token-bucket 10 1s BURST COST 1",
        "fixed-window 10 1s LIMIT 3 COST 1",
        "sliding-log 100001 1s COST 1",
        "sliding-windows 100 1m COST 1",
        "sliding-window 100 1 minute COST 1",
    ];
    for line in refund_vectors {
        let args = words(line);
        let (module, library) = (
            native("refund", &["k"], &args),
            fcall("refund", &["k"], &args),
        );
        assert_same_error(&mut con, module, library, &format!("refund k {line}"));
    }
    let checkall_vectors = [
        ("k", "fixed-window 1"),
        ("", "k fixed-window 1 1s"),
        ("a b c d", ""),
        (
            "a b",
            "fixed-window 1 1s fixed-window 1 1s fixed-window 1 1s",
        ),
        ("a b c", "fixed-window 1 1s fixed-window 1 1s"),
        ("a b", "fixed-window 1 1s COST 1 AT 5 x"),
        ("a b", "fixed-window 1 1s fixed-window 1"),
        ("a b", "token-bucket 1 1s BURST 2 BURST 3 fixed-window 1 1s"),
        ("a b", "fixed-window 1 1s BURST 2 fixed-window 1 1s"),
        ("a b", "token-bucket 1 1s fixed-window 1 1s BURST 2"),
        ("a b", "token-bucket 1 1s BURST"),
        ("a b", "token-bucket 1 1s BURST x fixed-window 1 1s"),
        ("a b", "leaky-window 1 1s fixed-window 1 1s"),
        ("a b", "fixed-window 1 1s sliding-logs 1 1s"),
        ("a b", "fixed-window 1 0 fixed-window 1 1s"),
        (
            "a b c",
            "fixed-window 1 1s fixed-window 0 1s fixed-window 1 1s",
        ),
        ("a b", "fixed-window 1 1s fixed-window 1 1s COST 1 COST 2"),
        ("a b", "fixed-window 1 1s fixed-window 1 1s COST x"),
        ("a b", "fixed-window 1 1s fixed-window 1 1s AT"),
        ("a b", "fixed-window 1 1s fixed-window 1 1s LIMIT 2"),
        ("a b", "sliding-log 100001 1s fixed-window 1 1s"),
        (
            "a b",
            "fixed-window 1 1s token-bucket 1 1s COST 1 BURST 2 BURST 3",
        ),
        ("k", "token-bucket 10 1s at 5 cost 2 burst 0"),
        ("a b", "gcra 1 1s BURST x fixed-window 1 1s"),
        ("a b", "fixed-window 1 1s gcra 1 1s BURST 2 BURST 3"),
        ("k", "fixed-window 10 1s BURST 5"),
        ("a b", "sliding-window 100 1m"),
        ("a b", "sliding-window 100 1m COST 2"),
        ("a", "sliding-window 100 1m fixed-window 5 1s"),
        ("a b c", "token-bucket 1 1s BURST 2 fixed-window 1 1h AT 5"),
        ("a b", "sliding-window 100 1 minute fixed-window 10 1h"),
        ("a b", "fixed-window 100 1m fixed-window 10 1 hour"),
        // BLOCK in a spec: after its period, with BURST in any order, each once.
        ("a b", "fixed-window 1 1s BLOCK fixed-window 1 1s"),
        ("a b", "fixed-window 1 1s BLOCK 0 fixed-window 1 1s"),
        (
            "a b",
            "fixed-window 1 1s BLOCK 1s BLOCK 2s fixed-window 1 1s",
        ),
        (
            "a b",
            "token-bucket 1 1s BLOCK 1s BURST 2 BLOCK 2s fixed-window 1 1s",
        ),
        (
            "a b",
            "token-bucket 1 1s BURST 2 BLOCK 1s BURST 3 fixed-window 1 1s",
        ),
        (
            "a b",
            "fixed-window 1 1s BLOCK 1s BURST 2 fixed-window 1 1s",
        ),
        (
            "a b",
            "token-bucket 1 1s BLOCK 1s BURST x fixed-window 1 1s",
        ),
        ("a b", "fixed-window 1 1s BLOCK 1s sliding-logs 1 1s"),
        ("a b", "fixed-window 1 1s BLOCK 1s fixed-window 1 1 hour"),
        ("a b", "fixed-window 1 1s fixed-window 1 1s BLOCK 3651d"),
        ("a b", "fixed-window 1 1s fixed-window 1 1s COST 1 BLOCK x"),
        (
            "a b",
            "fixed-window 1 1s fixed-window 1 1s BLOCK 1s COST 1 BLOCK 1s",
        ),
        ("a b", "fixed-window 1 1s fixed-window 1 1s BLOCK"),
        ("a b", "fixed-window 1 1s BLOCK 1s COST 1"),
        (
            "a b c",
            "fixed-window 1 1s BLOCK 1s fixed-window 1 1s BLOCK 1s",
        ),
        ("a b", "token-bucket 100 1m BURST 5 minute 10 1h"),
        (
            "a b",
            "token-bucket 100 1m fixed-window 10 1h fixed-window 1 1s",
        ),
    ];
    for (keys, line) in checkall_vectors {
        let keys = words(keys);
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let args = words(line);
        let (module, library) = (
            native("checkall", &keys, &args),
            fcall("checkall", &keys, &args),
        );
        assert_same_error(
            &mut con,
            module,
            library,
            &format!("CHECKALL {keys:?} {line}"),
        );
    }
    for (command, keys, args) in [
        ("info", vec!["k"], words("extra")),
        ("reset", vec![], vec![]),
    ] {
        let (module, library) = (native(command, &keys, &args), fcall(command, &keys, &args));
        assert_same_error(&mut con, module, library, command);
    }
    assert_eq!(dbsize(&mut con), 0, "an error created a key");

    // Where only the library refuses: its exact range, and FCALL's own key count.
    let lua_only = [
        (
            fcall(
                "check",
                &["k"],
                &words("token-bucket 10 1d BURST 1000000000000"),
            ),
            "ERR BURST (or limit, without BURST) times the period in ms must be below 2^53",
        ),
        (
            fcall("peek", &["k"], &words("leaky-bucket 1000000000000 10s")),
            "ERR BURST (or limit, without BURST) times the period in ms must be below 2^53",
        ),
        (
            fcall("check", &["k"], &words("gcra 1 1d BURST 1000000000000")),
            "ERR BURST (or limit, without BURST) times the period in ms must be below 2^53",
        ),
        (
            fcall("check", &["k"], &words("sliding-window 1000000000000 10s")),
            "ERR limit times the period in ms must be below 2^53",
        ),
        (
            fcall(
                "checkall",
                &["a", "b"],
                &words("fixed-window 1 1s sliding-window 1000000000 1d"),
            ),
            "ERR limit spec 2 (key 'b'): limit times the period in ms must be below 2^53",
        ),
        (
            fcall(
                "refund",
                &["k"],
                &words("token-bucket 10 1d BURST 1000000000000 COST 1"),
            ),
            "ERR BURST (or limit, without BURST) times the period in ms must be below 2^53",
        ),
        (
            fcall("check", &[], &words("fixed-window 1 1s")),
            "ERR ratelimit_check takes exactly one key",
        ),
        (
            fcall("refund", &["a", "b"], &words("fixed-window 1 1s COST 1")),
            "ERR ratelimit_refund takes exactly one key",
        ),
        (
            fcall("info", &["a", "b"], &[]),
            "ERR ratelimit_info takes exactly one key",
        ),
    ];
    for (cmd, prefix) in lua_only {
        let error = error_text(&send_one(&mut con, &cmd)).unwrap_or_default();
        assert!(error.starts_with(prefix), "{}: {error}", show_cmd(&cmd));
    }
    // The same limits are fine where the product stays below 2^53. Both calls at one time: the
    // replies' reset_after_ms differ by the milliseconds between the two calls otherwise.
    let at = now_ms().to_string();
    for (i, line) in [
        "token-bucket 10 9007ms BURST 1000000000000",
        "gcra 1000000000000 9007ms",
        "fixed-window 1000000000000 3650d COST 1000000000000",
    ]
    .into_iter()
    .enumerate()
    {
        let (fkey, nkey) = (format!("ok{i}"), format!("ok{i}n"));
        let mut args = words(line);
        args.extend(["AT".to_string(), at.clone()]);
        let replies = send(
            &mut con,
            &[
                fcall("check", &[&fkey], &args),
                native("check", &[&nkey], &args),
            ],
        );
        assert!(
            try_reply6(&replies[0]).is_some(),
            "{line}: {}",
            show_value(&replies[0])
        );
        assert_eq!(replies[0], replies[1], "{line}");
    }
}

#[test]
fn keys_of_the_other_engine_or_type_are_wrongtype_and_reset_counts_like_del() {
    let (_server, mut con) = both_engines();
    let args = words("token-bucket 5 1h");
    let setup = [
        native("check", &["module-key"], &args),
        fcall("check", &["library-key"], &args),
        fcall("check", &["library-log"], &words("sliding-log 5 1h")),
        redis::cmd("HSET").arg(&["hash", "f", "v"]).clone(),
        redis::cmd("SET").arg(&["plain", "hello"]).clone(),
        redis::cmd("SET").arg(&["empty", ""]).clone(),
        redis::cmd("SET").arg(&["lookalike", "rl:tb 1 2"]).clone(),
        redis::cmd("SET").arg(&["lookalike-log", "rl:sl"]).clone(),
        redis::cmd("SET")
            .arg(&["lookalike-refunded-log", "rl:sr"])
            .clone(),
    ];
    let replies = send(&mut con, &setup);
    assert!(replies.iter().all(|r| error_text(r).is_none()));
    const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
    for key in [
        "module-key",
        "hash",
        "plain",
        "empty",
        "lookalike",
        "lookalike-log",
        "lookalike-refunded-log",
    ] {
        for cmd in [
            fcall("check", &[key], &args),
            fcall("peek", &[key], &args),
            fcall("info", &[key], &[]),
            fcall(
                "checkall",
                &["library-key", key],
                &words("token-bucket 5 1h token-bucket 5 1h"),
            ),
            fcall("reset", &["library-key", key], &[]),
            fcall("refund", &[key], &words("token-bucket 5 1h COST 1")),
        ] {
            assert_eq!(
                error_text(&send_one(&mut con, &cmd)).as_deref(),
                Some(WRONGTYPE),
                "{key}: {}",
                show_cmd(&cmd)
            );
        }
    }
    for cmd in [
        native("check", &["library-key"], &args),
        native(
            "refund",
            &["library-key"],
            &words("token-bucket 5 1h COST 1"),
        ),
        native("info", &["library-log"], &[]),
        native("reset", &["module-key", "library-key"], &[]),
    ] {
        assert_eq!(
            error_text(&send_one(&mut con, &cmd)).as_deref(),
            Some(WRONGTYPE),
            "{}",
            show_cmd(&cmd)
        );
    }
    // Another algorithm on a limiter key: the module's message, with the function's name.
    let log = words("sliding-log 5 1h");
    assert_same_error(
        &mut con,
        native("check", &["module-key"], &log),
        fcall("check", &["library-key"], &log),
        "another algorithm",
    );
    assert_same_error(
        &mut con,
        native("refund", &["module-key"], &words("sliding-log 5 1h COST 1")),
        fcall(
            "refund",
            &["library-key"],
            &words("sliding-log 5 1h COST 1"),
        ),
        "another algorithm, refunded",
    );
    let library = error_text(&send_one(
        &mut con,
        &fcall("check", &["library-log"], &args),
    ));
    assert_eq!(
        library.as_deref(),
        Some("ERR key holds a sliding-log limiter, not token-bucket: ratelimit_reset it to change algorithm")
    );
    // RESET: a key named twice counts once, a missing one not at all; nothing else is touched.
    assert_eq!(
        send_one(&mut con, &fcall("info", &["missing"], &[])),
        Value::Nil
    );
    let removed = send_one(
        &mut con,
        &fcall(
            "reset",
            &["library-key", "missing", "library-key", "library-log"],
            &[],
        ),
    );
    assert_eq!(removed, Value::Int(2));
    let exists = redis::cmd("EXISTS")
        .arg(&["library-key", "library-log", "module-key", "hash", "plain"])
        .clone();
    assert_eq!(int(&mut con, &exists), 3);
}

/// `line`'s arguments, separated by `|` (each kept whole, spaces and all).
fn whole_args(line: &str) -> Vec<String> {
    line.split('|').map(str::to_string).collect()
}

/// A limit spec given as one argument: the library answers as the module, in every function,
/// for valid specs and for malformed ones (the same errors), and changes nothing on an error.
#[test]
fn a_one_argument_spec_gets_the_modules_answers() {
    let (_server, mut con) = both_engines();
    let at = now_ms().to_string();
    // Valid: the reply of each engine on a key of its own, at one time.
    let valid = [
        "sliding-window 100 1m",
        "token-bucket 10 1s BURST 20 BLOCK 1m|COST|3",
        "leaky-bucket 5 1s BURST 3",
        "FIXED-WINDOW 3 1S block 1s",
        "sliding-log 4 1s|COST|2",
        "gcra 10 1s BURST 5",
        "token-bucket 10 1s|BURST|20",
    ];
    for (i, line) in valid.into_iter().enumerate() {
        for (command, extra) in [
            ("check", &[][..]),
            ("peek", &[]),
            ("take", &["MAX", "2"]),
            ("refund", &["COST", "1"]),
        ] {
            let mut args = whole_args(line);
            if command != "check" && command != "peek" {
                // TAKE and REFUND take their own MAX and COST.
                if let Some(cost) = args.iter().position(|arg| arg == "COST") {
                    args.truncate(cost);
                }
            }
            args.extend(extra.iter().map(|s| s.to_string()));
            args.extend(["AT".to_string(), at.clone()]);
            let (nkey, fkey) = (format!("n{i}"), format!("f{i}"));
            let replies = send(
                &mut con,
                &[
                    native(command, &[&nkey], &args),
                    fcall(command, &[&fkey], &args),
                ],
            );
            assert!(
                error_text(&replies[0]).is_none(),
                "{command} {line}: {replies:?}"
            );
            assert_eq!(replies[0], replies[1], "{command} {line}");
        }
        // The spec alone, among others of both forms.
        let mut args = whole_args(line);
        args.truncate(1);
        args.extend(words("fixed-window 9 1s"));
        args.extend(whole_args("gcra 9 1s|AT").into_iter().chain([at.clone()]));
        let replies = send(
            &mut con,
            &[
                native("checkall", &[&format!("na{i}"), "nb", "nc"], &args),
                fcall("checkall", &[&format!("fa{i}"), "fb", "fc"], &args),
            ],
        );
        assert!(
            error_text(&replies[0]).is_none(),
            "checkall {line}: {replies:?}"
        );
        assert_eq!(replies[0], replies[1], "checkall {line}");
    }
    let keys = dbsize(&mut con);
    // Malformed (and specs the grammar refuses): the module's error, word for word.
    let malformed = [
        " fixed-window 10 1s",
        "fixed-window 10 1s ",
        "fixed-window  10 1s",
        "fixed-window\t10 1s",
        "fixed-window 10 1s\r",
        "fixed-window 10 1s COST 2",
        "fixed-window 10 1s cost 2|COST|1",
        "gcra 10 1s max 2",
        "fixed-window 10 1s AT 5",
        "fixed-window 10|1s",
        "token-bucket 10 1s BURST|5",
        "token-bucket 10 1s BURST 5 BLOCK|1s",
        "token-bucket 10",
        "leaky-window 10 1s",
        "fixed-window 0 1s",
        "fixed-window 10 1s BURST 5",
        "token-bucket 10 1s BURST 2 BURST 3",
        "sliding-window 100 1 minute",
        "sliding-window 100 1m minute",
        "concurrency 10 1s",
        "fixed-window 5 1s a\u{1}\u{ff}b yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy",
    ];
    for line in malformed {
        for (command, extra) in [
            ("check", &[][..]),
            ("peek", &[]),
            ("take", &["MAX", "2"]),
            ("refund", &["COST", "1"]),
        ] {
            let mut args = whole_args(line);
            args.extend(extra.iter().map(|s| s.to_string()));
            let (module, library) = (
                native(command, &["k"], &args),
                fcall(command, &["k"], &args),
            );
            assert_same_error(&mut con, module, library, &format!("{command} k {line:?}"));
        }
        for (keys, args) in [
            (&["a", "b"][..], format!("{line}|fixed-window 1 1s")),
            (&["a", "b"], format!("fixed-window 1 1s|{line}")),
            (&["a"], format!("fixed-window 1 1s|{line}")),
            (
                &["a", "b", "c"],
                format!("fixed-window|1|1s|{line}|gcra 1 1s"),
            ),
        ] {
            let args = whole_args(&args);
            let (module, library) = (
                native("checkall", keys, &args),
                fcall("checkall", keys, &args),
            );
            assert_same_error(
                &mut con,
                module,
                library,
                &format!("checkall {keys:?} {args:?}"),
            );
        }
    }
    assert_eq!(dbsize(&mut con), keys, "an error changes nothing");
}
