//! What the lease functions write: calls that change nothing write nothing (master and replica),
//! MULTI/EXEC and `maxmemory`, and the flags the functions are registered with.

use super::{acquire_args, lease_cmd, library_acquire, library_release, release_args, Engine};
use crate::common::{
    config_set, digest, error_text, future_base_ms, int, pexpiretime, send, send_one, show_value,
    try_reply6, wait_replica_sync, Server, TIME_LIMIT_MS,
};
use crate::functions::engines::{fcall, library_only, words};
use redis::{Connection, Value};

/// A rejected ACQUIRE (full, a renewal that does not fit, a cost above the limit), a RELEASE of
/// nothing (an unknown id, an expired lease, a missing key), INFO and every error change
/// nothing: the dirty counter, the value and the expiry stay as they were, on the master and on
/// its replica. The admitted calls do write.
#[test]
fn calls_that_change_nothing_write_nothing() {
    let (server, mut con) = library_only(Server::builder());
    let replica = Server::builder().no_module().start();
    replica.replica_of(&server);
    let t = future_base_ms();
    let dirty = |server: &Server| server.info_field("persistence", "rdb_changes_since_last_save");
    let before = dirty(&server);
    for (id, cost, at) in [("a", 1, t), ("b", 2, t + 10), ("c", 3, t + 20)] {
        let reply = send_one(
            &mut con,
            &library_acquire("q", 6, 60_000, id.as_bytes(), cost, Some(at)),
        );
        assert_eq!(
            try_reply6(&reply).map(|r| r[0]),
            Some(1),
            "{}",
            show_value(&reply)
        );
    }
    // One that expires: at t + 100 it holds nothing, and stays stored until a write.
    send_one(
        &mut con,
        &library_acquire("q", 7, 50, b"e", 1, Some(t + 30)),
    );
    assert_ne!(dirty(&server), before, "admitted acquires write");
    send_one(&mut con, &redis::cmd("SET").arg(&["tb", "x"]).clone());
    let state = |con: &mut Connection| {
        send(
            con,
            &[
                redis::cmd("DUMP").arg("q").clone(),
                redis::cmd("PEXPIRETIME").arg("q").clone(),
                redis::cmd("ZCARD").arg("q").clone(),
            ],
        )
    };
    let (dirty0, state0) = (dirty(&server), state(&mut con));
    let at = Some(t + 100);
    let mut calls = vec![
        library_acquire("q", 6, 60_000, b"d", 1, at),
        library_acquire("q", 6, 60_000, b"a", 2, at),
        library_acquire("q", 6, 60_000, b"d", 7, at),
        library_acquire("q", 2, 60_000, b"d", 1, at),
        library_acquire("q", 6, 60_000, b"b", 5, at),
        library_release("q", b"nobody", at),
        library_release("q", b"e", at),
        library_release("missing", b"a", at),
        library_release("q", b"a", Some(t + 70_000)),
        fcall("info", &["q"], &[]),
        fcall("info", &["missing"], &[]),
        lease_cmd(
            Engine::Library,
            "acquire",
            "q",
            &[b"6".to_vec(), b"1s".to_vec()],
        ),
        lease_cmd(
            Engine::Library,
            "acquire",
            "q",
            &acquire_args(6, 1000, b"", 1, at),
        ),
        lease_cmd(
            Engine::Library,
            "acquire",
            "q",
            &acquire_args(6, 1000, b"z", 0, at),
        ),
        lease_cmd(Engine::Library, "release", "q", &[b"ID".to_vec()]),
        lease_cmd(
            Engine::Library,
            "acquire",
            "tb",
            &acquire_args(6, 1000, b"z", 1, at),
        ),
        lease_cmd(Engine::Library, "release", "tb", &release_args(b"z", at)),
        fcall("check", &["q"], &words("token-bucket 5 1s")),
        fcall("peek", &["q"], &words("token-bucket 5 1s")),
        fcall("refund", &["q"], &words("token-bucket 5 1s COST 1")),
        fcall("check", &["q"], &words("concurrency 5 1s")),
    ];
    calls.push(library_acquire(
        "q",
        6,
        60_000,
        b"late",
        1,
        Some(TIME_LIMIT_MS - 1),
    ));
    let replies = send(&mut con, &calls);
    let rejected = replies
        .iter()
        .filter(|r| try_reply6(r).is_some_and(|r| r[0] == 0))
        .count();
    let zeros = replies.iter().filter(|r| **r == Value::Int(0)).count();
    let errors = replies.iter().filter(|r| error_text(r).is_some()).count();
    assert_eq!((rejected, zeros, errors), (5, 4, 11), "{replies:?}");
    assert_eq!((dirty(&server), state(&mut con)), (dirty0, state0.clone()));
    wait_replica_sync(&server, &replica);
    assert_eq!(
        state(&mut replica.client()),
        state0,
        "the replica holds the same"
    );
    // A release that does release drops the expired lease with it.
    assert_eq!(
        send_one(&mut con, &library_release("q", b"a", at)),
        Value::Int(1)
    );
    assert_eq!(
        int(&mut con, redis::cmd("ZCOUNT").arg(&["q", "0", "+inf"])),
        2
    );
    wait_replica_sync(&server, &replica);
    assert_eq!(digest(&mut con, "q"), digest(&mut replica.client(), "q"));
}

/// MULTI/EXEC admits exactly the limit; over `maxmemory` acquire is refused with OOM and
/// changes nothing while release (declared `allow-oom`, as the module's RELEASE runs over
/// maxmemory) gives leases back; the function flags say so.
#[test]
fn multi_maxmemory_and_flags() {
    let (_server, mut con) =
        library_only(Server::builder().config(&[("maxmemory-policy", "noeviction")]));
    let t = future_base_ms();
    let mut pipe = redis::pipe();
    pipe.atomic();
    for i in 0..4 {
        pipe.add_command(library_acquire(
            "m",
            3,
            60_000,
            format!("r{i}").as_bytes(),
            1,
            Some(t),
        ));
    }
    let replies: Vec<Vec<i64>> = pipe.query(&mut con).expect("EXEC");
    assert_eq!(
        replies.iter().map(|r| r[0]).collect::<Vec<_>>(),
        [1, 1, 1, 0]
    );
    let before = (digest(&mut con, "m"), pexpiretime(&mut con, "m"));
    config_set(&mut con, "maxmemory", "1").unwrap();
    for cmd in [
        library_acquire("m", 3, 60_000, b"r0", 1, Some(t + 1)),
        library_acquire("fresh", 3, 60_000, b"r0", 1, Some(t)),
    ] {
        let error = error_text(&send_one(&mut con, &cmd)).expect("OOM");
        assert!(error.starts_with("OOM"), "{error}");
    }
    assert_eq!((digest(&mut con, "m"), pexpiretime(&mut con, "m")), before);
    assert!(matches!(
        send_one(&mut con, &fcall("info", &["m"], &[])),
        Value::Array(_)
    ));
    assert_eq!(
        send_one(&mut con, &library_release("m", b"r1", Some(t + 2))),
        Value::Int(1)
    );
    config_set(&mut con, "maxmemory", "0").unwrap();
    let listed = send_one(
        &mut con,
        redis::cmd("FUNCTION").arg(&["LIST", "LIBRARYNAME", "ratelimit"]),
    );
    assert_eq!(
        function_flags(&listed, "ratelimit_acquire"),
        Vec::<String>::new()
    );
    assert_eq!(function_flags(&listed, "ratelimit_release"), ["allow-oom"]);
}

/// `field` of a RESP2 field/value list.
fn field<'a>(pairs: &'a Value, name: &str) -> Option<&'a Value> {
    let Value::Array(items) = pairs else {
        return None;
    };
    items
        .chunks_exact(2)
        .find(|pair| show_value(&pair[0]) == name)
        .map(|pair| &pair[1])
}

/// A function's flags in a `FUNCTION LIST` reply.
fn function_flags(listed: &Value, function: &str) -> Vec<String> {
    let Value::Array(libraries) = listed else {
        panic!("FUNCTION LIST: {}", show_value(listed))
    };
    let Some(Value::Array(functions)) = field(&libraries[0], "functions") else {
        panic!("no functions: {}", show_value(listed))
    };
    let found = functions
        .iter()
        .find(|f| field(f, "name").is_some_and(|n| show_value(n) == function))
        .unwrap_or_else(|| panic!("no {function}"));
    match field(found, "flags") {
        Some(Value::Array(flags)) => flags.iter().map(show_value).collect(),
        other => panic!("flags: {other:?}"),
    }
}
