//! Lease functions on other keys and bad lease arguments: the module's errors, word for word.

use super::{acquire_args, lease_cmd, library_acquire, release_args, Engine};
use crate::common::{
    error_text, exists, future_base_ms, send, send_one, try_reply6, TIME_LIMIT_MS,
};
use crate::functions::engines::{assert_same_error, both_engines, fcall, native, words};
use redis::{Cmd, Value};

/// Rate-limit functions on a lease key, lease functions on a rate key and `concurrency` named as
/// an algorithm answer the module's errors; other types and forged sorted sets are WRONGTYPE;
/// RESET removes a lease key.
#[test]
fn lease_keys_and_rate_keys_refuse_each_others_calls() {
    let (_server, mut con) = both_engines();
    let t = future_base_ms();
    let setup = [
        lease_cmd(
            Engine::Module,
            "acquire",
            "lease",
            &acquire_args(3, 60_000, b"a", 1, Some(t)),
        ),
        lease_cmd(
            Engine::Library,
            "acquire",
            "f:lease",
            &acquire_args(3, 60_000, b"a", 1, Some(t)),
        ),
        native("check", &["rate"], &words("sliding-log 5 1h")),
        fcall("check", &["f:rate"], &words("sliding-log 5 1h")),
        redis::cmd("HSET").arg(&["hash", "f", "v"]).clone(),
        redis::cmd("SET").arg(&["plain", "hello"]).clone(),
        redis::cmd("ZADD").arg(&["zset", "1", "=a"]).clone(),
        // A sorted set with some of a lease key's fields, or one out of range.
        redis::cmd("ZADD")
            .arg(&["forged", "-3", "!limit", "-1000", "!lease_ms", "5", "=a"])
            .clone(),
        redis::cmd("ZADD")
            .arg(&[
                "forged2",
                "-3",
                "!limit",
                "-1000",
                "!lease_ms",
                "-1",
                "!last",
                "5",
                "!cost",
            ])
            .clone(),
    ];
    assert!(send(&mut con, &setup)
        .iter()
        .all(|r| error_text(r).is_none()));
    let lease_args = acquire_args(3, 60_000, b"b", 1, Some(t));
    let mut pairs: Vec<(Cmd, Cmd, String)> = Vec::new();
    for (command, args) in [
        ("check", "token-bucket 3 1s"),
        ("peek", "sliding-log 3 1s COST 0"),
        ("refund", "fixed-window 3 1s COST 1"),
        ("check", "concurrency 3 1s"),
        ("peek", "CONCURRENCY 3 1s BURST 5"),
        ("check", "concurrency 0 1s"),
        ("check", "concurrency 3 0"),
        ("refund", "concurrency 3 1s COST 1"),
    ] {
        pairs.push((
            native(command, &["lease"], &words(args)),
            fcall(command, &["f:lease"], &words(args)),
            format!("{command} {args}"),
        ));
    }
    for (keys, args) in [
        (["rate", "lease"], "sliding-log 5 1h token-bucket 3 1s"),
        (["lease", "rate"], "token-bucket 3 1s sliding-log 5 1h"),
    ] {
        let fkeys: Vec<String> = keys.iter().map(|k| format!("f:{k}")).collect();
        let fkeys: Vec<&str> = fkeys.iter().map(String::as_str).collect();
        pairs.push((
            native("checkall", &keys, &words(args)),
            fcall("checkall", &fkeys, &words(args)),
            format!("checkall {keys:?} {args}"),
        ));
    }
    // The error names the key: the same (missing) keys on both.
    let args = words("sliding-log 5 1h concurrency 3 1s");
    pairs.push((
        native("checkall", &["a", "b"], &args),
        fcall("checkall", &["a", "b"], &args),
        "checkall naming concurrency".to_string(),
    ));
    for (command, args) in [
        ("acquire", lease_args.clone()),
        ("release", release_args(b"a", None)),
    ] {
        pairs.push((
            lease_cmd(Engine::Module, command, "rate", &args),
            lease_cmd(Engine::Library, command, "f:rate", &args),
            format!("{command} on a sliding log"),
        ));
    }
    for (module, library, what) in pairs {
        assert_same_error(&mut con, module, library, &what);
    }
    const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
    for key in ["hash", "plain", "zset", "forged", "forged2", "lease"] {
        for cmd in [
            lease_cmd(Engine::Library, "acquire", key, &lease_args),
            lease_cmd(Engine::Library, "release", key, &release_args(b"a", None)),
            fcall("info", &[key], &[]),
            fcall("check", &[key], &words("token-bucket 3 1s")),
            fcall("reset", &["f:lease", key], &[]),
        ] {
            assert_eq!(
                error_text(&send_one(&mut con, &cmd)).as_deref(),
                Some(WRONGTYPE),
                "{key}: {}",
                crate::common::show_cmd(&cmd)
            );
        }
    }
    // The module does not read the library's lease key.
    for cmd in [
        lease_cmd(Engine::Module, "acquire", "f:lease", &lease_args),
        lease_cmd(
            Engine::Module,
            "release",
            "f:lease",
            &release_args(b"a", None),
        ),
        native("info", &["f:lease"], &[]),
    ] {
        assert_eq!(
            error_text(&send_one(&mut con, &cmd)).as_deref(),
            Some(WRONGTYPE)
        );
    }
    // RESET removes lease keys on both engines, a key named twice once.
    assert_eq!(
        send_one(&mut con, &native("reset", &["lease", "lease", "rate"], &[])),
        Value::Int(2)
    );
    assert_eq!(
        send_one(
            &mut con,
            &fcall("reset", &["f:lease", "f:lease", "f:rate"], &[])
        ),
        Value::Int(2)
    );
    assert!(!exists(&mut con, "f:lease"));
}

#[test]
fn every_bad_lease_argument_gets_the_modules_message() {
    let (_server, mut con) = both_engines();
    let acquire_vectors = [
        "",
        "3",
        "3 1s",
        "3 1s ID",
        "0 1s ID a",
        "1000000000001 1s ID a",
        "-1 1s ID a",
        "x 1s ID a",
        "3 0 ID a",
        "3 0s ID a",
        "3 3651d ID a",
        "3 1w ID a",
        "3 1.5s ID a",
        "3 -1s ID a",
        "3 1 minute ID a",
        "3 1s COST 1",
        "3 1s AT 5 COST 2",
        "3 1s ID a ID b",
        "3 1s id a Id b",
        "3 1s ID a COST 0",
        "3 1s ID a COST -1",
        "3 1s ID a COST 1000000000001",
        "3 1s ID a COST x",
        "3 1s ID a COST",
        "3 1s ID a COST 1 COST 2",
        "3 1s ID a AT",
        "3 1s ID a AT 9007199254740992",
        "3 1s ID a AT 1e3",
        "3 1s ID a AT 1 AT 2",
        "3 1s ID a BURST 1",
        "3 1s ID a BLOCK 1s",
        "3 1s ID a SHADOW",
        "3 1s ID a COST 1 AT 5 ID b COST 3 AT 6",
        "3 1s ID a COST 1 AT 5 ID b COST 3 AT 6 EXTRA",
        "3 1s yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy a",
        "3 1s a\u{1}\u{ff}b 1",
        "token-bucket 3 1s ID a",
    ];
    let long_id = vec![b'x'; 129];
    for args in [
        acquire_args(3, 1000, &long_id, 1, None),
        vec![b"3".to_vec(), b"1s".to_vec(), b"ID".to_vec(), vec![]],
    ] {
        assert_same_error(
            &mut con,
            lease_cmd(Engine::Module, "acquire", "k", &args),
            lease_cmd(Engine::Library, "acquire", "k", &args),
            "acquire: an id of no accepted length",
        );
    }
    let release_vectors = [
        "",
        "ID",
        "AT 5",
        "ID a COST 1",
        "ID a AT",
        "ID a AT x",
        "ID a AT 9007199254740992",
        "ID a ID b",
        "ID a FOO",
        "ID a AT 5 FOO",
        "ID a AT 5 FOO bar",
        "ID a AT 5 ID b",
        "ID a AT 5 AT 6",
        "AT 5 ID a AT 6 ID b",
    ];
    for (verb, vectors) in [
        ("acquire", &acquire_vectors[..]),
        ("release", &release_vectors),
    ] {
        for line in vectors {
            let args: Vec<Vec<u8>> = words(line).into_iter().map(String::into_bytes).collect();
            assert_same_error(
                &mut con,
                lease_cmd(Engine::Module, verb, "k", &args),
                lease_cmd(Engine::Library, verb, "k", &args),
                &format!("{verb} k {line}"),
            );
        }
    }
    assert_eq!(crate::common::dbsize(&mut con), 0, "an error created a key");

    // The library's own: no policies, its exact range, FCALL's key count.
    let policy = "ERR the ratelimit functions library has no policies: give the limit as limit \
                  lease-duration (see docs/functions.md)";
    let lua_only = [
        (
            lease_cmd(
                Engine::Library,
                "acquire",
                "k",
                &bytes_of("POLICY jobs ID a"),
            ),
            policy,
        ),
        (
            lease_cmd(Engine::Library, "acquire", "k", &bytes_of("policy jobs")),
            policy,
        ),
        (
            library_acquire("k", 3, 1000, b"a", 1, Some(TIME_LIMIT_MS - 1000)),
            "ERR AT (or the key's last write, if later) plus lease-duration must be below 2^53",
        ),
        (
            fcall("acquire", &[], &words("3 1s ID a")),
            "ERR ratelimit_acquire takes exactly one key",
        ),
        (
            fcall("release", &["a", "b"], &words("ID a")),
            "ERR ratelimit_release takes exactly one key",
        ),
    ];
    for (cmd, prefix) in lua_only {
        let error = error_text(&send_one(&mut con, &cmd)).unwrap_or_default();
        assert!(
            error.starts_with(prefix),
            "{}: {error}",
            crate::common::show_cmd(&cmd)
        );
    }
    // Just below the bound is fine, and a later call on that key is held to the key's time.
    let reply = send_one(
        &mut con,
        &library_acquire("k", 3, 1000, b"a", 1, Some(TIME_LIMIT_MS - 1001)),
    );
    assert_eq!(try_reply6(&reply), Some([1, 3, 2, 0, 1000, 0]));
    let error = error_text(&send_one(
        &mut con,
        &library_acquire("k", 3, 1001, b"b", 1, Some(5)),
    ));
    assert!(error.is_some_and(|e| e.contains("below 2^53")));
}

fn bytes_of(line: &str) -> Vec<Vec<u8>> {
    words(line).into_iter().map(String::into_bytes).collect()
}
