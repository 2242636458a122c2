//! The library where a server restricts its callers: inside MULTI/EXEC, under ACL key patterns
//! (its keys are declared) and over `maxmemory` (no function has `allow-oom`).

use std::time::Duration;

use redis::Value;

use super::engines::{fcall, keyspace, library_only, words};
use crate::common::{
    config_set, error_text, exists, future_base_ms, send_one, show_cmd, try_reply6, Server,
};

#[test]
fn multi_acl_and_maxmemory() {
    let (server, mut con) =
        library_only(Server::builder().config(&[("maxmemory-policy", "noeviction")]));
    // At one time ahead: on the server's clock the hour's window could end between the
    // transaction that fills `multi` and the PEEK under OOM that must find it full.
    let args = words(&format!("fixed-window 3 1h AT {}", future_base_ms()));

    // MULTI/EXEC: four checks against a limit of three.
    let mut pipe = redis::pipe();
    pipe.atomic();
    for _ in 0..4 {
        pipe.add_command(fcall("check", &["multi"], &args));
    }
    let replies: Vec<Vec<i64>> = pipe.query(&mut con).expect("EXEC");
    let allowed: Vec<i64> = replies.iter().map(|r| r[0]).collect();
    assert_eq!(allowed, [1, 1, 1, 0]);
    assert_eq!(replies[3][2], 0);

    // Keys are declared: COMMAND GETKEYS sees them, and ACL key patterns restrict them.
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("FCALL")
        .arg("ratelimit_checkall")
        .arg(2)
        .arg(&["{t}:a", "{t}:b"])
        .arg(words("fixed-window 1 1s fixed-window 1 1m"))
        .query(&mut con)
        .unwrap();
    assert_eq!(keys, ["{t}:a", "{t}:b"]);
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "tenant1", "on", ">secret", "~tenant1:*", "+@all"])
        .query(&mut con)
        .expect("ACL SETUSER");
    let mut tenant = redis::Client::open(format!(
        "redis://tenant1:secret@127.0.0.1:{}/",
        server.port()
    ))
    .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(10)))
    .expect("connect as tenant1");
    let own = send_one(&mut tenant, &fcall("check", &["tenant1:a"], &args));
    assert!(try_reply6(&own).is_some());
    for cmd in [
        fcall("check", &["tenant2:a"], &args),
        fcall("peek", &["other"], &args),
        fcall("info", &["other"], &[]),
        fcall("reset", &["tenant1:a", "other"], &[]),
        fcall("refund", &["other"], &words("fixed-window 3 1h COST 1")),
        fcall(
            "checkall",
            &["tenant1:a", "tenant2:b"],
            &words("fixed-window 3 1h fixed-window 3 1h"),
        ),
    ] {
        let error = error_text(&send_one(&mut tenant, &cmd)).expect("refused");
        assert!(error.starts_with("NOPERM"), "{error}");
    }
    for key in ["tenant2:a", "tenant2:b", "other"] {
        assert!(!exists(&mut con, key), "{key}");
    }

    // Over maxmemory: a check (a refund too) is refused with OOM and changes nothing; peek and
    // info answer.
    let before = keyspace(&mut con);
    config_set(&mut con, "maxmemory", "1").unwrap();
    for cmd in [
        fcall("check", &["multi"], &args),
        fcall("check", &["fresh"], &args),
        fcall("checkall", &["multi"], &args),
        fcall("refund", &["multi"], &words("fixed-window 3 1h COST 1")),
        fcall("reset", &["multi"], &[]),
    ] {
        let error = error_text(&send_one(&mut con, &cmd)).expect("OOM");
        assert!(error.starts_with("OOM"), "{}: {error}", show_cmd(&cmd));
    }
    let peek = send_one(&mut con, &fcall("peek", &["multi"], &args));
    assert_eq!(try_reply6(&peek).expect("peek under OOM")[..3], [0, 3, 0]);
    let mut peek_rw = redis::cmd("FCALL");
    peek_rw.arg("ratelimit_peek").arg(1).arg("multi").arg(&args);
    assert!(
        try_reply6(&send_one(&mut con, &peek_rw)).is_some(),
        "FCALL of a no-writes function"
    );
    assert!(matches!(
        send_one(&mut con, &fcall("info", &["multi"], &[])),
        Value::Array(_)
    ));
    assert_eq!(keyspace(&mut con), before);
    config_set(&mut con, "maxmemory", "0").unwrap();
    let fresh = send_one(&mut con, &fcall("check", &["fresh"], &args));
    assert!(try_reply6(&fresh).is_some_and(|r| r[0] == 1));
}
