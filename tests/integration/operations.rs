//! Operations (docs/operations.md): `INFO ratelimit`, the `ratelimit.rejected` keyspace event and
//! ACL key patterns, against real redis-servers. The module's configuration is in
//! tests/integration/module_configs.rs.

use crate::common;

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use common::{
    check, config_set, expect_error, future_base_ms, parse_info, peek, run_ok, wait_replica_sync,
    Server,
};
use redis::{Connection, RedisResult, Value};
use redis_ratelimit_core::algorithms::{Algorithm, Kind};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// `INFO ratelimit`'s counters as field -> number (without `server` and `apis`, which are text).
fn stats(server: &Server) -> HashMap<String, u64> {
    server
        .info("ratelimit")
        .into_iter()
        .filter(|(k, _)| !matches!(k.as_str(), "ratelimit_server" | "ratelimit_apis"))
        .map(|(k, v)| {
            let n = v
                .parse()
                .unwrap_or_else(|_| panic!("INFO ratelimit {k}:{v} is not a number"));
            (k, n)
        })
        .collect()
}

fn field(algorithm: &str, name: &str) -> String {
    format!("ratelimit_{}_{name}", algorithm.replace('-', "_"))
}

/// Live limiter keys per algorithm, in [`Algorithm::ALL`] order.
fn live_keys(server: &Server) -> [u64; Algorithm::ALL.len()] {
    let stats = stats(server);
    Algorithm::ALL.map(|a| stats[&field(a.name(), "keys")])
}

/// Waits (up to 5 s) until the live-key counts equal `expected`.
fn wait_live_keys(server: &Server, expected: [u64; Algorithm::ALL.len()], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let keys = live_keys(server);
        if keys == expected {
            return;
        }
        if Instant::now() >= deadline {
            panic!("{what}: live keys {keys:?}, expected {expected:?}");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------------
// INFO ratelimit
// ---------------------------------------------------------------------------------------------

#[test]
fn info_section_has_every_field() {
    let server = Server::start();
    let text: String = redis::cmd("INFO")
        .arg("ratelimit")
        .query(&mut server.client())
        .unwrap();
    assert!(text.starts_with("# ratelimit\r\n"), "{text}");
    let fields = parse_info(&text);
    // The server and its optional APIs, five counters per algorithm, and the count of policies
    // (a line each follows when there are some).
    assert_eq!(fields.len(), 3 + 5 * Kind::EVERY.len(), "{text}");
    assert_eq!(fields["ratelimit_policies"], "0");
    assert!(
        fields["ratelimit_server"].starts_with("redis ")
            || fields["ratelimit_server"].starts_with("valkey ")
    );
    assert!(
        fields["ratelimit_apis"].contains("SetCommandInfo"),
        "{text}"
    );
    for algorithm in Kind::EVERY.map(Kind::name) {
        for name in ["calls", "allowed", "rejected", "blocked", "keys"] {
            assert_eq!(
                fields.get(&field(algorithm, name)).map(String::as_str),
                Some("0")
            );
        }
    }
    // Module sections are part of INFO everything, not of plain INFO.
    let everything: String = redis::cmd("INFO")
        .arg("everything")
        .query(&mut server.client())
        .unwrap();
    assert!(everything.contains("ratelimit_token_bucket_calls:0"));
}

#[test]
fn info_counts_decisions_per_algorithm() {
    let server = Server::start();
    let mut con = server.client();
    // Every call at one time: on the server's clock an hour's fixed window could end between
    // the calls and admit a third.
    let t = future_base_ms().to_string();
    for (i, algorithm) in Algorithm::ALL.map(Algorithm::name).iter().enumerate() {
        // Limit 2 per hour: i+2 calls, 2 allowed, i rejected (so each algorithm differs).
        let spec = [*algorithm, "2", "1h", "AT", &t];
        for _ in 0..i + 2 {
            check(&mut con, algorithm, &spec).unwrap();
        }
        // Not decisions: PEEK, errors, a call on a key of another type.
        peek(&mut con, algorithm, &spec).unwrap();
        check(&mut con, algorithm, &[*algorithm, "0", "1h"]).unwrap_err();
        check(&mut con, algorithm, &["no-such-algorithm", "2", "1h"]).unwrap_err();
    }
    run_ok(&mut con, "SET plain x");
    check(&mut con, "plain", &["token-bucket", "2", "1h"]).unwrap_err();
    // COST 0 asks without consuming, but it is a decision (allowed when it fits).
    check(
        &mut con,
        "token-bucket:zero",
        &["token-bucket", "2", "1h", "COST", "0", "AT", &t],
    )
    .unwrap();

    let stats = stats(&server);
    for (i, algorithm) in Algorithm::ALL.map(Algorithm::name).iter().enumerate() {
        let zero = u64::from(*algorithm == "token-bucket");
        let i = i as u64;
        assert_eq!(
            stats[&field(algorithm, "calls")],
            i + 2 + zero,
            "{algorithm}"
        );
        assert_eq!(stats[&field(algorithm, "allowed")], 2 + zero, "{algorithm}");
        assert_eq!(stats[&field(algorithm, "rejected")], i, "{algorithm}");
        assert_eq!(stats[&field(algorithm, "keys")], 1, "{algorithm}");
    }
}

#[test]
fn info_live_keys_follow_every_way_a_key_comes_and_goes() {
    let server = Server::start();
    let mut con = server.client();
    let hour = ["1", "1h"];
    // Created at a time ahead: on the server's clock the fixed windows' keys would all expire
    // at the end of the hour, which can fall within the test and change the counts.
    let t = future_base_ms().to_string();
    let create = |con: &mut Connection, key: &str, algorithm: &str| {
        assert_eq!(
            check(con, key, &[algorithm, hour[0], hour[1], "AT", &t]).unwrap()[0],
            1,
            "{key}"
        );
    };
    // Three of each algorithm.
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        for n in 0..3 {
            create(&mut con, &format!("{algorithm}:{n}"), algorithm);
        }
    }
    wait_live_keys(&server, [3; Algorithm::ALL.len()], "after creating");
    // Rejections, PEEK and COST 0 create nothing.
    create_nothing(&mut con);
    wait_live_keys(
        &server,
        [3; Algorithm::ALL.len()],
        "after calls that store nothing",
    );

    // COPY adds one; COPY REPLACE over a limiter of another algorithm swaps one for the other.
    run_ok(&mut con, "COPY token-bucket:0 copy:1");
    wait_live_keys(&server, [4, 3, 3, 3, 3, 3], "COPY");
    run_ok(&mut con, "COPY sliding-log:0 copy:1 REPLACE");
    wait_live_keys(&server, [3, 3, 3, 3, 4, 3], "COPY REPLACE");
    // RENAME, MOVE and SWAPDB keep the values.
    run_ok(&mut con, "RENAME copy:1 copy:2");
    run_ok(&mut con, "MOVE copy:2 1");
    run_ok(&mut con, "SWAPDB 0 1");
    run_ok(&mut con, "SWAPDB 0 1");
    wait_live_keys(&server, [3, 3, 3, 3, 4, 3], "RENAME, MOVE, SWAPDB");
    // DUMP + RESTORE adds one.
    let dump: Vec<u8> = redis::cmd("DUMP")
        .arg("leaky-bucket:0")
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg("restored")
        .arg(0)
        .arg(dump)
        .query(&mut con)
        .unwrap();
    wait_live_keys(&server, [3, 4, 3, 3, 4, 3], "RESTORE");

    // DEL, UNLINK, RATELIMIT.RESET, overwriting with SET.
    run_ok(&mut con, "DEL token-bucket:0");
    run_ok(&mut con, "UNLINK leaky-bucket:0");
    run_ok(
        &mut con,
        "RATELIMIT.RESET fixed-window:0 sliding-window:0 missing",
    );
    run_ok(&mut con, "SET sliding-log:0 overwritten");
    wait_live_keys(&server, [2, 3, 2, 2, 3, 3], "DEL, UNLINK, RESET, SET");

    // DEBUG RELOAD (save, empty, load the RDB): no double counting.
    run_ok(&mut con, "DEBUG RELOAD");
    wait_live_keys(&server, [2, 3, 2, 2, 3, 3], "DEBUG RELOAD");
    run_ok(&mut con, "DEBUG RELOAD");
    wait_live_keys(&server, [2, 3, 2, 2, 3, 3], "a second DEBUG RELOAD");

    // Expiry: a 50 ms limiter is gone within the active expire cycle.
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        check(
            &mut con,
            &format!("short:{algorithm}"),
            &[algorithm, "1", "50ms"],
        )
        .unwrap();
    }
    wait_live_keys(&server, [2, 3, 2, 2, 3, 3], "expiry");

    // FLUSHDB of the other db, FLUSHALL, FLUSHALL ASYNC.
    run_ok(&mut con, "SELECT 1");
    run_ok(&mut con, "FLUSHDB");
    run_ok(&mut con, "SELECT 0");
    wait_live_keys(
        &server,
        [2, 3, 2, 2, 2, 3],
        "FLUSHDB of db 1 (holds copy:2)",
    );
    run_ok(&mut con, "FLUSHALL");
    wait_live_keys(&server, [0; Algorithm::ALL.len()], "FLUSHALL");
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        for n in 0..50 {
            create(&mut con, &format!("{algorithm}:{n}"), algorithm);
        }
    }
    wait_live_keys(&server, [50; Algorithm::ALL.len()], "after creating again");
    run_ok(&mut con, "FLUSHALL ASYNC");
    wait_live_keys(&server, [0; Algorithm::ALL.len()], "FLUSHALL ASYNC");
}

#[test]
fn info_counts_checkall_once_per_limit() {
    let server = Server::start();
    let mut con = server.client();
    // Both at one time: an hour's fixed window could end between them on the server's clock.
    let t = future_base_ms();
    let mut checkall = |keys: [&str; 2]| -> Vec<Vec<i64>> {
        redis::cmd("RATELIMIT.CHECKALL")
            .arg(2)
            .arg(&keys)
            .arg(&["token-bucket", "2", "1h", "fixed-window", "1", "1h", "AT"])
            .arg(t)
            .query(&mut con)
            .unwrap()
    };
    assert_eq!(checkall(["a", "b"])[0][0], 1);
    assert_eq!(checkall(["a", "b"])[0][0], 0);
    let stats = stats(&server);
    for algorithm in ["token-bucket", "fixed-window"] {
        assert_eq!(stats[&field(algorithm, "calls")], 2, "{algorithm}");
        assert_eq!(stats[&field(algorithm, "allowed")], 1, "{algorithm}");
        assert_eq!(stats[&field(algorithm, "rejected")], 1, "{algorithm}");
        assert_eq!(stats[&field(algorithm, "keys")], 1, "{algorithm}");
    }
}

/// Calls that must not store anything (on keys `nothing:*`).
fn create_nothing(con: &mut Connection) {
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        let key = format!("nothing:{algorithm}");
        peek(con, &key, &[algorithm, "1", "1h"]).unwrap();
        check(con, &key, &[algorithm, "1", "1h", "COST", "0"]).unwrap();
        assert_eq!(
            check(con, &key, &[algorithm, "1", "1h", "COST", "2"]).unwrap()[0],
            0
        );
    }
    let nothing: Vec<String> = redis::cmd("KEYS").arg("nothing:*").query(con).unwrap();
    assert!(nothing.is_empty(), "{nothing:?}");
}

#[test]
fn info_live_keys_after_restart_and_on_a_replica() {
    let mut master = Server::start();
    let mut con = master.client();
    // Keys written at a time ahead: on the server's clock the fixed windows' would expire at the
    // end of the hour, which a full sync and a restart can reach.
    let t = future_base_ms().to_string();
    for (i, algorithm) in Algorithm::ALL.map(Algorithm::name).iter().enumerate() {
        for n in 0..=i {
            check(
                &mut con,
                &format!("{algorithm}:{n}"),
                &[algorithm, "5", "1h", "AT", &t],
            )
            .unwrap();
        }
    }
    let expected = [1, 2, 3, 4, 5, 6];
    wait_live_keys(&master, expected, "master");

    // The replica loads the master's RDB (full sync), then follows the stream.
    let replica = Server::start();
    replica.replica_of(&master);
    wait_live_keys(&replica, expected, "replica after the full sync");
    let replica_stats = stats(&replica);
    assert_eq!(
        replica_stats[&field("token-bucket", "calls")],
        0,
        "decisions are the master's"
    );
    check(
        &mut con,
        "token-bucket:new",
        &["token-bucket", "5", "1h", "AT", &t],
    )
    .unwrap();
    check(
        &mut con,
        "sliding-log:new",
        &["sliding-log", "5", "1h", "AT", &t],
    )
    .unwrap();
    run_ok(&mut con, "RATELIMIT.RESET fixed-window:0");
    wait_replica_sync(&master, &replica);
    let expected = [2, 2, 2, 4, 6, 6];
    wait_live_keys(&master, expected, "master after more writes");
    wait_live_keys(&replica, expected, "replica after more writes");
    drop(replica);

    // A restart loads the RDB: the keys are counted once; decisions start again from zero.
    master.restart();
    wait_live_keys(&master, expected, "after a restart");
    assert_eq!(stats(&master)[&field("token-bucket", "calls")], 0);
}

// ---------------------------------------------------------------------------------------------
// The ratelimit.rejected keyspace event
// ---------------------------------------------------------------------------------------------

/// Subscribes `pubsub` to `patterns`, with a 5 s read timeout.
fn subscribe(pubsub: &mut redis::PubSub<'_>, patterns: &[&str]) {
    for pattern in patterns {
        pubsub.psubscribe(*pattern).unwrap();
    }
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
}

/// The next `(channel, payload)` on a subscribed connection.
fn next_message(pubsub: &mut redis::PubSub<'_>) -> (String, String) {
    let message = pubsub.get_message().expect("no keyspace event within 5 s");
    (
        message.get_channel_name().to_string(),
        message.get_payload().unwrap(),
    )
}

#[test]
fn rejection_raises_a_module_keyspace_event() {
    let server = Server::builder()
        .config(&[("notify-keyspace-events", "KEd$")])
        .start();
    let mut con = server.client();
    let mut sub_con = server.client();
    let mut sub = sub_con.as_pubsub();
    subscribe(&mut sub, &["__keyspace@0__:*", "__keyevent@0__:*"]);

    // Allowed calls, PEEK and COST 0 raise nothing; the SET marks where the rejection follows.
    // Every call at one time: on the server's clock an hour's fixed window could end between the
    // call that fills a key and the one that must be rejected.
    let t = future_base_ms().to_string();
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        let key = format!("api:{algorithm}");
        let spec = [algorithm, "1", "1h", "AT", &t];
        assert_eq!(check(&mut con, &key, &spec).unwrap()[0], 1);
        assert_eq!(peek(&mut con, &key, &spec).unwrap()[0], 0);
        check(
            &mut con,
            &key,
            &[algorithm, "1", "1h", "COST", "0", "AT", &t],
        )
        .unwrap();
        run_ok(&mut con, &format!("SET marker {algorithm}"));
        assert_eq!(check(&mut con, &key, &spec).unwrap()[0], 0);

        let expected = [
            ("__keyspace@0__:marker".to_string(), "set".to_string()),
            ("__keyevent@0__:set".to_string(), "marker".to_string()),
            (
                format!("__keyspace@0__:{key}"),
                "ratelimit.rejected".to_string(),
            ),
            ("__keyevent@0__:ratelimit.rejected".to_string(), key.clone()),
        ];
        for want in expected {
            assert_eq!(next_message(&mut sub), want, "{algorithm}");
        }
    }

    // CHECKALL: a rejection raises the event on the keys that violate their limit only.
    {
        let reply: Vec<Vec<i64>> = redis::cmd("RATELIMIT.CHECKALL")
            .arg(2)
            .arg("multi:fresh")
            .arg("api:token-bucket")
            .arg(&[
                "token-bucket",
                "1",
                "1h",
                "token-bucket",
                "1",
                "1h",
                "AT",
                &t,
            ])
            .query(&mut con)
            .unwrap();
        assert_eq!(
            (reply[0][0], reply[1][0], reply[2][0]),
            (0, 1, 0),
            "{reply:?}"
        );
        run_ok(&mut con, "SET marker end");
        let expected = [
            ("__keyspace@0__:api:token-bucket", "ratelimit.rejected"),
            ("__keyevent@0__:ratelimit.rejected", "api:token-bucket"),
            ("__keyspace@0__:marker", "set"),
        ];
        for (channel, payload) in expected {
            assert_eq!(
                next_message(&mut sub),
                (channel.into(), payload.into()),
                "CHECKALL"
            );
        }
    }
}

#[test]
fn no_event_unless_module_events_are_enabled() {
    let server = Server::builder()
        .config(&[("notify-keyspace-events", "K$")])
        .start();
    let mut con = server.client();
    let mut sub_con = server.client();
    let mut sub = sub_con.as_pubsub();
    subscribe(&mut sub, &["__keyspace@0__:*"]);
    let spec = ["token-bucket", "1", "1h"];
    check(&mut con, "api", &spec).unwrap();
    assert_eq!(check(&mut con, "api", &spec).unwrap()[0], 0);
    run_ok(&mut con, "SET marker 1");
    assert_eq!(
        next_message(&mut sub),
        ("__keyspace@0__:marker".into(), "set".into()),
        "the rejection raised an event although module events ('d') are off"
    );

    // Switched on at run time.
    config_set(&mut con, "notify-keyspace-events", "Kd").unwrap();
    assert_eq!(check(&mut con, "api", &spec).unwrap()[0], 0);
    assert_eq!(
        next_message(&mut sub),
        ("__keyspace@0__:api".into(), "ratelimit.rejected".into())
    );
}

// ---------------------------------------------------------------------------------------------
// ACL
// ---------------------------------------------------------------------------------------------

fn login(server: &Server, user: &str) -> Connection {
    let mut con = server.client();
    let _: () = redis::cmd("AUTH")
        .arg(user)
        .arg("secret")
        .query(&mut con)
        .unwrap_or_else(|e| panic!("AUTH {user}: {e}"));
    con
}

/// RATELIMIT.CHECKALL is registered on this build.
/// What `token-bucket 10 1h` has left on `key` (a `COST 0` PEEK).
fn remaining(con: &mut Connection, key: &str) -> i64 {
    peek(con, key, &["token-bucket", "10", "1h", "COST", "0"]).unwrap()[2]
}

fn checkall(con: &mut Connection, keys: &[&str]) -> RedisResult<Value> {
    let mut cmd = redis::cmd("RATELIMIT.CHECKALL");
    cmd.arg(keys.len()).arg(keys);
    for _ in keys {
        cmd.arg("token-bucket").arg(10).arg("1h");
    }
    cmd.query(con)
}

#[test]
fn acl_key_patterns_restrict_every_command() {
    let server = Server::start();
    let mut admin = server.client();
    run_ok(
        &mut admin,
        "ACL SETUSER tenant1 on >secret resetkeys ~tenant1:* -@all \
         +ratelimit.check +ratelimit.checkall +ratelimit.peek +ratelimit.reset \
         +ratelimit.info",
    );
    let spec = ["token-bucket", "10", "1h"];
    check(&mut admin, "tenant2:api", &spec).unwrap();
    let mut con = login(&server, "tenant1");

    // Its own keys: every command.
    assert_eq!(check(&mut con, "tenant1:api", &spec).unwrap()[0], 1);
    assert_eq!(peek(&mut con, "tenant1:api", &spec).unwrap()[0], 1);
    let info: Vec<Value> = redis::cmd("RATELIMIT.INFO")
        .arg("tenant1:api")
        .query(&mut con)
        .unwrap();
    assert!(!info.is_empty());
    let removed: i64 = redis::cmd("RATELIMIT.RESET")
        .arg("tenant1:api")
        .query(&mut con)
        .unwrap();
    assert_eq!(removed, 1);

    // Anyone else's: NOPERM, and nothing changes.
    let denied = |result: RedisResult<Value>, what: &str| {
        let message = expect_error(result, "NOPERM", what);
        assert!(message.to_lowercase().contains("key"), "{what}: {message}");
    };
    let run = |con: &mut Connection, args: &[&str]| -> RedisResult<Value> {
        redis::cmd(args[0]).arg(&args[1..]).query(con)
    };
    denied(
        run(
            &mut con,
            &["RATELIMIT.CHECK", "tenant2:api", spec[0], spec[1], spec[2]],
        ),
        "CHECK",
    );
    denied(
        run(
            &mut con,
            &["RATELIMIT.PEEK", "tenant2:api", spec[0], spec[1], spec[2]],
        ),
        "PEEK",
    );
    denied(run(&mut con, &["RATELIMIT.INFO", "tenant2:api"]), "INFO");
    denied(run(&mut con, &["RATELIMIT.RESET", "tenant2:api"]), "RESET");
    denied(
        run(&mut con, &["RATELIMIT.RESET", "tenant1:x", "tenant2:api"]),
        "RESET of both",
    );
    denied(
        run(
            &mut con,
            &["RATELIMIT.CHECK", "tenant10:api", spec[0], spec[1], spec[2]],
        ),
        "prefix",
    );
    // Commands it was not granted.
    let message = expect_error(
        run(&mut con, &["RATELIMIT.APPLY", "tenant1:api", "x"]),
        "NOPERM",
        "APPLY",
    );
    assert!(message.contains("ratelimit.apply"), "{message}");
    expect_error(run(&mut con, &["rla", "tenant1:api", "x"]), "NOPERM", "rla");
    expect_error(run(&mut con, &["GET", "tenant1:api"]), "NOPERM", "GET");
    assert_eq!(
        remaining(&mut admin, "tenant2:api"),
        9,
        "tenant2:api changed"
    );

    {
        let value = checkall(&mut con, &["tenant1:a", "tenant1:b"]).unwrap();
        assert!(
            matches!(value, Value::Array(ref items) if items.len() == 3),
            "{value:?}"
        );
        denied(
            checkall(&mut con, &["tenant1:a", "tenant2:api"]),
            "CHECKALL",
        );
        denied(
            checkall(&mut con, &["tenant2:api"]),
            "CHECKALL of another tenant only",
        );
        assert_eq!(
            remaining(&mut admin, "tenant1:a"),
            9,
            "one CHECKALL consumed"
        );
    }
}

#[test]
fn acl_read_only_user_can_peek_and_info_but_not_check() {
    let server = Server::start();
    let mut admin = server.client();
    run_ok(
        &mut admin,
        "ACL SETUSER monitor on >secret ~* +ratelimit.peek +ratelimit.info",
    );
    let spec = ["token-bucket", "10", "1h"];
    check(&mut admin, "api", &spec).unwrap();
    let mut con = login(&server, "monitor");
    assert_eq!(remaining(&mut con, "api"), 9);
    let info: Vec<Value> = redis::cmd("RATELIMIT.INFO")
        .arg("api")
        .query(&mut con)
        .unwrap();
    assert!(!info.is_empty());
    // Each with a valid arity: Redis checks the arity before the ACL.
    let apply_args = ["payload"];
    for (command, args) in [
        ("RATELIMIT.CHECK", &spec[..]),
        ("RATELIMIT.RESET", &spec[..]),
        ("RATELIMIT.APPLY", &apply_args[..]),
    ] {
        let message = expect_error(
            redis::cmd(command)
                .arg("api")
                .arg(args)
                .query::<Value>(&mut con),
            "NOPERM",
            command,
        );
        assert!(message.contains("command"), "{command}: {message}");
    }
    {
        let message = expect_error(checkall(&mut con, &["api"]), "NOPERM", "CHECKALL");
        assert!(message.contains("command"), "CHECKALL: {message}");
    }
    assert_eq!(remaining(&mut admin, "api"), 9, "something was consumed");

    // With read-only key permissions (`%R~*`), PEEK and INFO work: their key specs declare the
    // key read-only. CHECK, CHECKALL and RESET write, so the same user gets NOPERM on the key.
    assert!(
        peek_declares_read_only_key(&mut admin),
        "RATELIMIT.PEEK declares no read-only key spec"
    );
    run_ok(
        &mut admin,
        "ACL SETUSER reader on >secret %R~* +ratelimit.peek +ratelimit.info \
         +ratelimit.check +ratelimit.checkall +ratelimit.reset",
    );
    let mut reader = login(&server, "reader");
    assert_eq!(remaining(&mut reader, "api"), 9);
    let info: Value = redis::cmd("RATELIMIT.INFO")
        .arg("api")
        .query(&mut reader)
        .unwrap();
    assert_ne!(info, Value::Nil);
    for (what, result) in [
        ("CHECK", check(&mut reader, "api", &spec).map(|_| ())),
        ("CHECKALL", checkall(&mut reader, &["api"]).map(|_| ())),
        (
            "RESET",
            redis::cmd("RATELIMIT.RESET").arg("api").query(&mut reader),
        ),
    ] {
        let message = expect_error(result, "NOPERM", what);
        assert!(message.to_lowercase().contains("key"), "{what}: {message}");
    }
    assert_eq!(remaining(&mut admin, "api"), 9, "something was consumed");
}

/// `COMMAND INFO ratelimit.peek` shows a key spec with the `RO` flag.
fn peek_declares_read_only_key(con: &mut Connection) -> bool {
    let info: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("ratelimit.peek")
        .query(con)
        .unwrap();
    fn has_ro(value: &Value) -> bool {
        match value {
            Value::Array(items) | Value::Set(items) => items.iter().any(has_ro),
            Value::SimpleString(s) => s == "RO",
            Value::BulkString(b) => b == b"RO",
            Value::Map(pairs) => pairs.iter().any(|(k, v)| has_ro(k) || has_ro(v)),
            _ => false,
        }
    }
    has_ro(&info)
}
