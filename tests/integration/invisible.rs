//! "A call that changes nothing is invisible": no keyspace signal (WATCH, client tracking), no
//! dirty count, no replication. And the calls that do change a key signal it exactly then.
//!
//! Each no-op kind is checked two ways, against a key another client watches:
//! - WATCH: the watching client's `EXEC` still runs (a signalled key would abort it, nil);
//! - client tracking: a RESP3 client that read the key gets no `invalidate` push for it.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{
    digest, future_base_ms, info_int, limiter_info, master_and_replica, run, run_ok, Server,
};
use redis::{Connection, Value};
use redis_ratelimit_core::algorithms::Algorithm;

/// `allowed` of a six-integer CHECK reply (or of a CHECKALL's overall decision).
fn allowed(reply: &Value) -> i64 {
    let Value::Array(items) = reply else {
        panic!("not an array: {reply:?}")
    };
    match &items[0] {
        Value::Int(allowed) => *allowed,
        Value::Array(_) => allowed(&items[0]),
        other => panic!("unexpected {other:?}"),
    }
}

/// The changes since the last save: a write would count.
fn dirty(con: &mut Connection) -> i64 {
    let info: String = redis::cmd("INFO").arg("persistence").query(con).unwrap();
    common::parse_info(&info)["rdb_changes_since_last_save"]
        .parse()
        .unwrap()
}

/// A RESP3 connection with client tracking on, speaking raw RESP so push messages are seen.
struct Tracker {
    stream: TcpStream,
}

impl Tracker {
    fn new(server: &Server) -> Tracker {
        let stream = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut tracker = Tracker { stream };
        tracker.call(&["HELLO", "3"], "proto");
        tracker.call(&["CLIENT", "TRACKING", "on"], "+OK");
        tracker
    }

    /// Sends a command and reads until `until` appears; returns what was read.
    fn call(&mut self, args: &[&str], until: &str) -> String {
        let mut frame = format!("*{}\r\n", args.len());
        for arg in args {
            frame.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        self.stream.write_all(frame.as_bytes()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut read = Vec::new();
        let mut buffer = [0u8; 4096];
        while !String::from_utf8_lossy(&read).contains(until) {
            assert!(Instant::now() < deadline, "no {until:?} in {read:?}");
            let n = self.stream.read(&mut buffer).unwrap();
            assert!(n > 0, "connection closed");
            read.extend_from_slice(&buffer[..n]);
        }
        String::from_utf8_lossy(&read).into_owned()
    }

    /// Reads `key` so the server tracks it for this client.
    fn track(&mut self, key: &str) {
        self.call(&["EXISTS", key], ":");
    }

    /// Whether an invalidation arrived since the last call: a push is written to the client's
    /// buffer before the reply to any later command, so a PING flushes it out.
    fn invalidated(&mut self) -> bool {
        self.call(&["PING"], "+PONG").contains("invalidate")
    }
}

/// Whether `line`, sent by another client, signals `key`: by WATCH + EXEC and by tracking.
/// Both must agree.
fn signals(server: &Server, key: &str, line: &str) -> bool {
    let mut watcher = server.client();
    let mut other = server.client();
    let mut tracker = Tracker::new(server);
    tracker.track(key);
    run_ok(&mut watcher, &format!("WATCH {key}"));
    let _ = run(&mut other, line);
    run_ok(&mut watcher, "MULTI");
    run_ok(&mut watcher, "PING");
    let aborted = run_ok(&mut watcher, "EXEC") == Value::Nil;
    let invalidated = tracker.invalidated();
    assert_eq!(
        aborted, invalidated,
        "{line}: WATCH says {aborted}, tracking says {invalidated}"
    );
    aborted
}

/// `line` at `t`: `AT t` after a CHECK, PEEK, CHECKALL or REFUND, any other line as it is.
/// Every call of a test at one time: on the server's clock an hour's fixed window can end between
/// the call that fills a key and the one that must be rejected.
fn at(t: u64, line: &str) -> String {
    let takes_at = ["CHECK", "PEEK", "CHECKALL", "REFUND"]
        .iter()
        .any(|name| line.starts_with(&format!("RATELIMIT.{name} ")));
    if takes_at {
        format!("{line} AT {t}")
    } else {
        line.to_string()
    }
}

/// Sets up a key holding each algorithm's limiter (the key is the algorithm's name) with no room
/// left (limit 1, one consumed) at `t`.
fn exhausted(con: &mut Connection, t: u64) {
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        let reply = run_ok(
            con,
            &at(t, &format!("RATELIMIT.CHECK {algorithm} {algorithm} 1 1h")),
        );
        assert_eq!(allowed(&reply), 1);
    }
    // And one blocked for an hour by its second call.
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        for expected in [1, 0] {
            let line = at(
                t,
                &format!("RATELIMIT.CHECK blocked:{algorithm} {algorithm} 1 1h BLOCK 1h"),
            );
            assert_eq!(allowed(&run_ok(con, &line)), expected, "{line}");
        }
        let info = limiter_info(con, &format!("blocked:{algorithm}")).expect("stored");
        assert!(info.contains_key("blocked_until_ms"), "{info:?}");
    }
    run_ok(con, "SET str value");
}

#[test]
fn calls_that_change_nothing_signal_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let t = future_base_ms();
    exhausted(&mut con, t);
    let before = dirty(&mut con);
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        let key = algorithm;
        let other = if algorithm == "fixed-window" {
            "token-bucket"
        } else {
            "fixed-window"
        };
        for line in [
            // Rejected.
            format!("RATELIMIT.CHECK {key} {algorithm} 1 1h"),
            // COST 0, on a key that exists.
            format!("RATELIMIT.CHECK {key} {algorithm} 1 1h COST 0"),
            // COST 0 with other parameters (they are stored only by a consuming call).
            format!("RATELIMIT.CHECK {key} {algorithm} 50 1h COST 0"),
            // Another algorithm than the key holds.
            format!("RATELIMIT.CHECK {key} {other} 5 1h"),
            // A bad argument.
            format!("RATELIMIT.CHECK {key} {algorithm} 0 1h"),
            format!("RATELIMIT.PEEK {key} {algorithm} 1 1h"),
            format!("RATELIMIT.INFO {key}"),
            // A CHECKALL rejected by this key: the other key had room, and is not touched.
            format!("RATELIMIT.CHECKALL 2 {key} free {algorithm} 1 1h token-bucket 5 1h"),
            format!("RATELIMIT.CHECKALL 2 free {key} token-bucket 5 1h {algorithm} 1 1h"),
            // A CHECKALL that fails on this key's algorithm after the first key was decided.
            format!("RATELIMIT.CHECKALL 2 free {key} token-bucket 5 1h {other} 5 1h"),
            // The same key twice: rejected as a whole.
            format!("RATELIMIT.CHECKALL 2 {key} {key} {algorithm} 1 1h {algorithm} 1 1h"),
            // A RESET that refuses (another key is a string).
            format!("RATELIMIT.RESET {key} str"),
            // A REFUND that gives back nothing, or that refuses.
            format!("RATELIMIT.REFUND {key} {algorithm} 1 1h COST 0"),
            format!("RATELIMIT.REFUND {key} {other} 1 1h COST 1"),
            format!("RATELIMIT.REFUND {key} {algorithm} 1 1h"),
            // A rejection without BLOCK on an exhausted key, with BLOCK on a blocked one.
            format!("RATELIMIT.CHECK blocked:{key} {algorithm} 1 1h"),
            format!("RATELIMIT.CHECK blocked:{key} {algorithm} 1 1h BLOCK 1h"),
            format!("RATELIMIT.CHECK blocked:{key} {algorithm} 1 1h BLOCK 2h COST 0"),
            format!("RATELIMIT.CHECK blocked:{key} {algorithm} 50 1h BLOCK 1h"),
            format!("RATELIMIT.PEEK blocked:{key} {algorithm} 1 1h BLOCK 1h"),
            format!("RATELIMIT.CHECKALL 2 blocked:{key} free {algorithm} 1 1h BLOCK 1h token-bucket 5 1h"),
            format!("RATELIMIT.CHECKALL 2 free blocked:{key} token-bucket 5 1h {algorithm} 1 1h BLOCK 1h"),
        ] {
            let line = at(t, &line);
            if let Some(blocked) = line.split(' ').find(|word| word.starts_with("blocked:")) {
                assert!(!signals(&server, blocked, &line), "{line} signalled {blocked}");
                assert!(!signals(&server, "free", &line), "{line} signalled free");
                continue;
            }
            assert!(!signals(&server, key, &line), "{line} signalled {key}");
            // Neither was the key of the CHECKALL that had room.
            assert!(!signals(&server, "free", &line), "{line} signalled free");
        }
    }
    for line in [
        "RATELIMIT.CHECK str token-bucket 1 1h",
        "RATELIMIT.CHECKALL 2 free str token-bucket 5 1h token-bucket 5 1h",
    ] {
        let line = at(t, line);
        assert!(!signals(&server, "str", &line), "{line} signalled str");
        assert!(!signals(&server, "free", &line), "{line} signalled free");
    }
    // Calls on a key that does not exist and that they do not create.
    for line in [
        "RATELIMIT.RESET missing",
        "RATELIMIT.RESET missing missing",
        "RATELIMIT.CHECK missing token-bucket 1 1h COST 0",
        "RATELIMIT.CHECK missing token-bucket 1 1h COST 2",
        "RATELIMIT.PEEK missing sliding-log 1 1h",
        "RATELIMIT.INFO missing",
        "RATELIMIT.REFUND missing token-bucket 1 1h COST 1",
    ] {
        let line = at(t, line);
        assert!(!signals(&server, "missing", &line), "{line} signalled");
    }
    assert_eq!(run_ok(&mut con, "EXISTS missing free"), Value::Int(0));
    assert_eq!(dirty(&mut con), before, "a no-op call counted as a change");
}

#[test]
fn calls_that_change_a_key_signal_it() {
    let server = Server::start();
    let mut con = server.client();
    let t = future_base_ms();
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        let key = algorithm;
        let check = at(t, &format!("RATELIMIT.CHECK {key} {algorithm} 10 1h"));
        // Created, then updated.
        assert!(signals(&server, key, &check), "{check} (create)");
        assert!(signals(&server, key, &check), "{check} (update)");
        let all = at(
            t,
            &format!("RATELIMIT.CHECKALL 2 {key} other {algorithm} 10 1h fixed-window 5 1h"),
        );
        assert!(signals(&server, key, &all), "{all}");
        assert!(signals(&server, "other", &all), "{all}");
        // Each key once, whichever of its occurrences.
        let twice = at(
            t,
            &format!("RATELIMIT.CHECKALL 2 {key} {key} {algorithm} 10 1h {algorithm} 10 1h"),
        );
        assert!(signals(&server, key, &twice), "{twice}");
        // A rejection that starts a block writes it, inline and in a CHECKALL.
        let fill = at(t, &format!("RATELIMIT.CHECK b:{key} {algorithm} 1 1h"));
        assert!(signals(&server, &format!("b:{key}"), &fill), "{fill}");
        let block = at(
            t,
            &format!("RATELIMIT.CHECK b:{key} {algorithm} 1 1h BLOCK 1m"),
        );
        assert!(signals(&server, &format!("b:{key}"), &block), "{block}");
        let fill = at(t, &format!("RATELIMIT.CHECK c:{key} {algorithm} 1 1h"));
        assert!(signals(&server, &format!("c:{key}"), &fill), "{fill}");
        let all = at(
            t,
            &format!(
                "RATELIMIT.CHECKALL 2 d:{key} c:{key} fixed-window 5 1h {algorithm} 1 1h BLOCK 1m"
            ),
        );
        assert!(signals(&server, &format!("c:{key}"), &all), "{all}");
        assert!(
            !signals(&server, &format!("c:{key}"), &all),
            "{all}, blocked"
        );
        assert_eq!(run_ok(&mut con, &format!("EXISTS d:{key}")), Value::Int(0));
        let refund = at(
            t,
            &format!("RATELIMIT.REFUND {key} {algorithm} 10 1h COST 1"),
        );
        assert!(signals(&server, key, &refund), "{refund}");
        let reset = format!("RATELIMIT.RESET {key} {key} missing");
        assert!(signals(&server, key, &reset), "{reset}");
        assert_eq!(run_ok(&mut con, &format!("EXISTS {key}")), Value::Int(0));
        run_ok(&mut con, "DEL other");
    }
}

#[test]
fn writes_still_count_and_replicate() {
    let (master, replica) = master_and_replica();
    let mut con = master.client();
    let before = dirty(&mut con);
    // At one time ahead: on the server's clock `a` would expire at the end of the hour, maybe
    // before the replica is read.
    let t = future_base_ms();
    run_ok(&mut con, &at(t, "RATELIMIT.CHECK k token-bucket 1 1h"));
    run_ok(&mut con, &at(t, "RATELIMIT.CHECK k token-bucket 1 1h")); // rejected
    run_ok(
        &mut con,
        &at(
            t,
            "RATELIMIT.CHECKALL 2 a a fixed-window 2 1h fixed-window 2 1h",
        ),
    );
    assert!(dirty(&mut con) > before);
    common::wait_replica_sync(&master, &replica);
    let mut on_replica = replica.client();
    for key in ["k", "a"] {
        assert_eq!(digest(&mut con, key), digest(&mut on_replica, key), "{key}");
    }
    let info = limiter_info(&mut on_replica, "a").expect("a is on the replica");
    assert_eq!(info_int(&info, "count"), 2, "both occurrences replicated");
}
