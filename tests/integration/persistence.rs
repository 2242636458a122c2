//! A limiter must not forget: crashes, AOF rewrites, RDB reloads and failover give every key's
//! state back exactly.
//!
//! A key's state is compared through everything that shows it: `DEBUG DIGEST-VALUE` (the encoded
//! limiter), `PEXPIRETIME`, `RATELIMIT.INFO`, and `RATELIMIT.PEEK` probes, which answer what the
//! next CHECK would (so "the limiter continues exactly": no reset, no extra burst).

use crate::common;

use std::collections::BTreeMap;
use std::fs;
use std::thread;
use std::time::Duration;

use common::model::Spec;
use common::{
    dbsize, future_base_ms, info_fields, master_and_replica, reply6, send, wait_replica_sync,
    Limit, Server,
};
use redis::{Cmd, Connection, Value};
use redis_ratelimit_core::algorithms::Algorithm;

// ---------------------------------------------------------------------------------------------
// Helpers

/// Runs CHECKs, asserting that none is an error.
fn run(con: &mut Connection, cmds: &[Cmd]) -> Vec<[i64; 6]> {
    send(con, cmds).iter().map(reply6).collect()
}

/// One key and how to probe it.
#[derive(Clone, Debug)]
struct Probe {
    key: String,
    limit: Limit,
    /// Written with the server's clock: RATELIMIT.INFO's `remaining` and `reset_after_ms` are
    /// then judged against a moving clock, and are left out of comparisons.
    clock: bool,
}

/// Everything observable about one key.
#[derive(Debug, PartialEq)]
struct KeyState {
    digest: String,
    expires_at_ms: i64,
    info: Option<BTreeMap<String, Value>>,
    /// PEEKs at increasing times and costs: what the next CHECKs would answer.
    peeks: Vec<[i64; 6]>,
}

fn probe_times(base: u64) -> [(u64, u64); 4] {
    [
        (base + 600, 1),
        (base + 600, 3),
        (base + 1_300, 1),
        (base + 3_000, 2),
    ]
}

fn state_of(con: &mut Connection, probe: &Probe, base: u64) -> KeyState {
    let key = probe.key.as_str();
    let mut cmds = vec![
        redis::cmd("DEBUG").arg("DIGEST-VALUE").arg(key).clone(),
        redis::cmd("PEXPIRETIME").arg(key).clone(),
        redis::cmd("RATELIMIT.INFO").arg(key).clone(),
    ];
    for (at, cost) in probe_times(base) {
        cmds.push(probe.limit.peek(key, cost, Some(at)));
    }
    let replies = send(con, &cmds);
    let digest = match &replies[0] {
        Value::Array(d) => match &d[0] {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            Value::SimpleString(s) => s.clone(),
            other => panic!("digest {other:?}"),
        },
        other => panic!("DEBUG DIGEST-VALUE {key}: {other:?}"),
    };
    let expires_at_ms = match replies[1] {
        Value::Int(n) => n,
        ref other => panic!("PEXPIRETIME {key}: {other:?}"),
    };
    let info = info_fields(&replies[2]).map(|mut info| {
        if probe.clock {
            info.remove("remaining");
            info.remove("reset_after_ms");
        }
        info
    });
    KeyState {
        digest,
        expires_at_ms,
        info,
        peeks: replies[3..].iter().map(reply6).collect(),
    }
}

fn snapshot(server: &Server, probes: &[Probe], base: u64) -> Vec<(String, KeyState)> {
    let mut con = server.client();
    let states: Vec<(String, KeyState)> = probes
        .iter()
        .map(|probe| (probe.key.clone(), state_of(&mut con, probe, base)))
        .collect();
    for (key, state) in &states {
        assert!(
            state.expires_at_ms > 0,
            "{key} is missing or never expires: {state:?}"
        );
        assert!(state.info.is_some(), "{key} has no state");
    }
    states
}

fn assert_same(before: &[(String, KeyState)], after: &[(String, KeyState)], what: &str) {
    assert_eq!(before.len(), after.len());
    for ((key, b), (_, a)) in before.iter().zip(after) {
        assert_eq!(b, a, "{what}: {key} changed");
    }
}

/// Writes a varied state: for every algorithm, a key used at several times and costs, one whose
/// parameters change, one filled to the brim, and one written with the server's clock; for the
/// sliding log also runs longer than 2048 entries at one ms and hundreds of distinct timestamps.
/// `round` varies the keys and times, so a second round adds to the first.
fn populate(server: &Server, base: u64, round: u64) -> Vec<Probe> {
    let mut con = server.client();
    let mut probes = Vec::new();
    let t = base + 10 * round;
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        let main = Limit::new(algorithm, 10, "1000", Some(15));
        let key = format!("{algorithm}:used");
        run(
            &mut con,
            &[
                main.check(&key, 2, Some(t)),
                main.check(&key, 1, Some(t + 100)),
                main.check(&key, 4, Some(t + 250)),
                main.check(&key, 0, Some(t + 260)),
                main.check(&key, 1, Some(t)),
            ],
        );
        probes.push(Probe {
            key,
            limit: main.clone(),
            clock: false,
        });

        let changed = Limit::new(algorithm, 20, "2s", Some(25));
        let key = format!("{algorithm}:changed:{round}");
        run(
            &mut con,
            &[
                main.check(&key, 3, Some(t + 50)),
                changed.check(&key, 5, Some(t + 400)),
            ],
        );
        probes.push(Probe {
            key,
            limit: changed,
            clock: false,
        });

        let full = Limit::new(algorithm, 5, "1500", Some(5));
        let key = format!("{algorithm}:full");
        let cmds: Vec<Cmd> = (0..7).map(|_| full.check(&key, 1, Some(t + 200))).collect();
        run(&mut con, &cmds);
        probes.push(Probe {
            key,
            limit: full,
            clock: false,
        });

        // Blocked by its third call, for longer than the probes look ahead: the block and the
        // state under it must both come back.
        let blocking = Limit::new(algorithm, 2, "1000", Some(2)).with_block("5s");
        let key = format!("{algorithm}:blocked:{round}");
        run(
            &mut con,
            &[
                blocking.check(&key, 2, Some(t + 100)),
                blocking.check(&key, 1, Some(t + 150)),
                blocking.check(&key, 1, Some(t + 300)),
            ],
        );
        probes.push(Probe {
            key,
            limit: blocking,
            clock: false,
        });

        // An hour-long limit on the server's own clock: nothing expires during the test.
        let hourly = Limit::new(algorithm, 100, "1h", Some(100));
        let key = format!("{algorithm}:clock");
        run(&mut con, &[hourly.check(&key, 7 + round, None)]);
        probes.push(Probe {
            key,
            limit: hourly,
            clock: true,
        });
    }
    let log = Limit::new("sliding-log", 20_000, "1h", None);
    let key = "sliding-log:long".to_string();
    let mut cmds = vec![log.check(&key, 5_000, Some(t))];
    cmds.extend((1..=400).map(|i| log.check(&key, 1 + i % 3, Some(t + i))));
    run(&mut con, &cmds);
    probes.push(Probe {
        key,
        limit: log,
        clock: false,
    });
    probes
}

/// `BGREWRITEAOF` and wait until it is done.
fn rewrite_aof(server: &Server) {
    let _: String = redis::cmd("BGREWRITEAOF")
        .query(&mut server.client())
        .expect("BGREWRITEAOF");
    server.wait_persistence_idle(&["aof_rewrite_in_progress", "aof_rewrite_scheduled"]);
    assert_eq!(
        server.info_field("persistence", "aof_last_bgrewrite_status"),
        "ok"
    );
}

/// The AOF's base file (Redis 7's multi-part AOF under appendonlydir/).
fn aof_base(server: &Server) -> (String, Vec<u8>) {
    aof_file(server, ".base.")
}

/// The first file of the AOF directory whose name holds `part` (`.base.`, `.incr.`).
fn aof_file(server: &Server, part: &str) -> (String, Vec<u8>) {
    let dir = server.dir().join("appendonlydir");
    let entry = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .find(|path| path.to_string_lossy().contains(part))
        .unwrap_or_else(|| panic!("no AOF file with {part}"));
    let name = entry.file_name().unwrap().to_string_lossy().into_owned();
    (name, fs::read(&entry).expect("read the AOF file"))
}

/// kill -9, start again from what reached the disk, and compare.
fn crash_and_compare(server: &mut Server, probes: &[Probe], base: u64, what: &str) {
    let before = snapshot(server, probes, base);
    let keys = dbsize(&mut server.client());
    server.kill9();
    server.start_again();
    assert_eq!(dbsize(&mut server.client()), keys, "{what}: key count");
    assert_same(&before, &snapshot(server, probes, base), what);
}

// ---------------------------------------------------------------------------------------------
// Crashes and reloads

fn kill9_restores_every_key_exactly(preamble: &str) {
    let mut server = Server::builder()
        .config(&[
            ("appendonly", "yes"),
            ("appendfsync", "always"),
            ("aof-use-rdb-preamble", preamble),
        ])
        .start();
    let base = future_base_ms();
    // Only the incremental AOF (RATELIMIT.APPLY lines) holds the keys.
    let mut probes = populate(&server, base, 0);
    // Commands log their writes under APPLY's short name; buckets and windows in 33 bytes.
    let (name, bytes) = aof_file(&server, ".incr.");
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("$3\r\nrla\r\n"), "no rla in {name}");
    assert!(
        text.contains("\r\n$33\r\n\x03"),
        "no 33-byte payload in {name}"
    );
    assert!(!text.contains("ratelimit.apply"), "{name}");
    crash_and_compare(&mut server, &probes, base, "kill -9 (incremental AOF)");

    // The rewritten base holds them now, plus later writes in a new incremental file.
    rewrite_aof(&server);
    let (name, bytes) = aof_base(&server);
    if preamble == "yes" {
        assert!(name.ends_with(".base.rdb"), "{name}");
    } else {
        assert!(name.ends_with(".base.aof"), "{name}");
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            text.contains("ratelimit.apply"),
            "no RATELIMIT.APPLY in {name}"
        );
    }
    probes.extend(populate(&server, base, 1));
    crash_and_compare(
        &mut server,
        &probes,
        base,
        &format!("kill -9 after BGREWRITEAOF (aof-use-rdb-preamble {preamble})"),
    );
    // And a rewrite of what was itself loaded from a rewrite.
    rewrite_aof(&server);
    crash_and_compare(&mut server, &probes, base, "kill -9 after a second rewrite");
}

#[test]
fn kill9_with_appendfsync_always_restores_every_key_exactly() {
    kill9_restores_every_key_exactly("yes");
}

#[test]
fn kill9_restores_every_key_exactly_from_an_aof_without_rdb_preamble() {
    kill9_restores_every_key_exactly("no");
}

#[test]
fn debug_reload_save_and_restart_restore_every_key_exactly() {
    let mut server = Server::start();
    let base = future_base_ms();
    let mut probes = populate(&server, base, 0);

    let before = snapshot(&server, &probes, base);
    let _: () = redis::cmd("DEBUG")
        .arg("RELOAD")
        .query(&mut server.client())
        .expect("DEBUG RELOAD");
    assert_same(&before, &snapshot(&server, &probes, base), "DEBUG RELOAD");

    // SAVE, then a crash: the RDB alone brings everything back.
    probes.extend(populate(&server, base, 1));
    let _: () = redis::cmd("SAVE")
        .query(&mut server.client())
        .expect("SAVE");
    crash_and_compare(&mut server, &probes, base, "SAVE then kill -9");

    // SHUTDOWN SAVE and start again.
    let before = snapshot(&server, &probes, base);
    server.restart();
    assert_same(
        &before,
        &snapshot(&server, &probes, base),
        "SHUTDOWN SAVE and restart",
    );
}

// ---------------------------------------------------------------------------------------------
// Failover

/// The calls after a failover, the same on every server compared: costs and times that run each
/// key dry and past its refills.
fn next_checks(probe: &Probe, base: u64) -> Vec<Cmd> {
    let key = probe.key.as_str();
    let limit = &probe.limit;
    vec![
        limit.check(key, 1, Some(base + 700)),
        limit.check(key, 4, Some(base + 700)),
        limit.check(key, 2, Some(base + 900)),
        limit.check(key, 30, Some(base + 900)),
        limit.check(key, 1, Some(base + 1_400)),
        limit.check(key, 3, Some(base + 2_600)),
        limit.check(key, 0, Some(base + 2_700)),
    ]
}

#[test]
fn a_paused_then_promoted_replica_continues_every_limiter_exactly() {
    let (master, replica) = master_and_replica();
    let base = future_base_ms();
    let mut probes = populate(&master, base, 0);

    // A stream of writes to the master; the replica is frozen (SIGSTOP) for part of it, so it
    // catches up from its backlog once resumed.
    let mut con = master.client();
    let stream: Vec<Limit> = Algorithm::ALL
        .iter()
        .map(|a| Limit::new(a.name(), 50, "1000", Some(80)))
        .collect();
    for batch in 0..30u64 {
        if batch == 10 {
            replica.pause();
        }
        if batch == 20 {
            thread::sleep(Duration::from_millis(300));
            replica.resume();
        }
        let mut cmds = Vec::new();
        for (i, limit) in stream.iter().enumerate() {
            for k in 0..4u64 {
                let key = format!("stream:{}:{k}", limit.algorithm);
                let at = base + batch * 17 + k * 5 + i as u64;
                cmds.push(limit.check(&key, 1 + (batch + k) % 3, Some(at)));
            }
            let hourly = Limit::new(limit.algorithm, 500, "1h", Some(800));
            cmds.push(hourly.check(&format!("stream:{}:clock", limit.algorithm), 1, None));
        }
        run(&mut con, &cmds);
    }
    for limit in &stream {
        for k in 0..4u64 {
            probes.push(Probe {
                key: format!("stream:{}:{k}", limit.algorithm),
                limit: limit.clone(),
                clock: false,
            });
        }
        probes.push(Probe {
            key: format!("stream:{}:clock", limit.algorithm),
            limit: Limit::new(limit.algorithm, 500, "1h", Some(800)),
            clock: true,
        });
    }
    wait_replica_sync(&master, &replica);
    let on_master = snapshot(&master, &probes, base);
    let on_replica = snapshot(&replica, &probes, base);
    assert_same(&on_master, &on_replica, "the replica after SIGSTOP/SIGCONT");

    // Failover: the replica becomes a master. The limiters continue on it exactly where the
    // master's stand: every next CHECK answers what the master answers.
    replica.promote();
    assert_eq!(replica.info_field("replication", "role"), "master");
    let fresh = Server::start();
    let (mut m, mut r, mut f) = (master.client(), replica.client(), fresh.client());
    let mut differs_from_fresh = 0;
    let at_keys: Vec<&Probe> = probes.iter().filter(|p| !p.clock).collect();
    for probe in &at_keys {
        let cmds = next_checks(probe, base);
        let from_master = run(&mut m, &cmds);
        let from_replica = run(&mut r, &cmds);
        assert_eq!(
            from_master, from_replica,
            "{}: the promoted replica diverges",
            probe.key
        );
        if run(&mut f, &cmds) != from_master {
            differs_from_fresh += 1;
        }
    }
    // Each of these keys holds state that shapes the next replies (a reset limiter, as on a server
    // that replayed nothing, would answer otherwise).
    assert_eq!(differs_from_fresh, at_keys.len(), "some keys look fresh");
    // Both now hold the same state again, written independently.
    let keys: Vec<Probe> = at_keys.into_iter().cloned().collect();
    assert_same(
        &snapshot(&master, &keys, base),
        &snapshot(&replica, &keys, base),
        "after the same CHECKs on master and promoted replica",
    );
}

#[test]
fn a_replica_that_resyncs_after_a_master_crash_holds_the_masters_state() {
    // The master crashes (kill -9) and restarts from its AOF; its replica reconnects and syncs
    // again: both hold exactly what the master had acknowledged.
    let mut master = Server::builder()
        .config(&[("appendonly", "yes"), ("appendfsync", "always")])
        .start();
    let replica = Server::start();
    replica.replica_of(&master);
    let base = future_base_ms();
    let probes = populate(&master, base, 0);
    wait_replica_sync(&master, &replica);
    let before = snapshot(&master, &probes, base);
    master.kill9();
    master.start_again();
    assert_same(
        &before,
        &snapshot(&master, &probes, base),
        "master after kill -9",
    );
    wait_replica_sync(&master, &replica);
    assert_same(
        &before,
        &snapshot(&replica, &probes, base),
        "replica after the resync",
    );
}

// ---------------------------------------------------------------------------------------------
// Multi-pair `rla`

/// The argument counts of the `rla` commands in an AOF file, in order (3: one key-payload pair).
fn rla_argcs(bytes: &[u8]) -> Vec<usize> {
    let text = String::from_utf8_lossy(bytes);
    let mut argcs = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("\r\n$3\r\nrla\r\n") {
        let at = from + at;
        let head = &text[..at];
        let star = head.rfind('*').expect("a command header");
        argcs.push(head[star + 1..].parse().expect("an argument count"));
        from = at + 1;
    }
    argcs
}

#[test]
fn checkall_replicates_one_multi_pair_rla_per_eight_keys_and_reloads_it() {
    // CHECKALL of 1, 3, 8 and 9 keys: 1, 1, 1 and 2 `rla` commands (the 9th key alone, in the
    // single-pair form old AOFs hold), on the replica as in the AOF; both forms reload exactly.
    let mut master = Server::builder()
        .config(&[("appendonly", "yes"), ("appendfsync", "always")])
        .start();
    let replica = Server::start();
    replica.replica_of(&master);
    let base = future_base_ms();
    let mut con = master.client();
    let (mut keys, mut expected) = (Vec::new(), Vec::new());
    for (round, n) in [1usize, 3, 8, 9].into_iter().enumerate() {
        let names: Vec<String> = (0..n).map(|i| format!("batch{n}:{i}")).collect();
        let mut cmd = redis::cmd("RATELIMIT.CHECKALL");
        cmd.arg(n).arg(&names);
        for i in 0..n {
            let algorithm = Algorithm::ALL[i % Algorithm::ALL.len()];
            cmd.arg(Spec::new(algorithm, 5, 60_000).args());
        }
        cmd.arg("AT").arg(base + round as u64);
        let reply = common::send_one(&mut con, &cmd);
        assert!(
            matches!(reply, Value::Array(_)),
            "CHECKALL of {n} keys: {reply:?}"
        );
        expected.extend(if n > 8 {
            vec![17, 1 + 2 * (n - 8)]
        } else {
            vec![1 + 2 * n]
        });
        keys.extend(names);
    }
    let (name, bytes) = aof_file(&master, ".incr.");
    assert_eq!(rla_argcs(&bytes), expected, "rla commands in {name}");
    common::assert_replica_matches(&master, &replica, &keys);

    let before = common::snapshot(&mut master.client(), &keys);
    assert!(before.iter().all(|(dump, _)| dump.is_some()));
    master.kill9();
    master.start_again();
    assert_eq!(
        common::snapshot(&mut master.client(), &keys),
        before,
        "after kill -9 and a reload of the multi-pair AOF"
    );
}
