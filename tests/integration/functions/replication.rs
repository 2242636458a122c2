//! The library's writes replicate as effects: a replica holds the master's state and serves the
//! read-only functions; calls that change nothing write (and so replicate) nothing.

use redis::Value;
use redis_ratelimit_core::algorithms::Algorithm;

use super::engines::{algorithms, fcall, keyspace, library_only, seed, words};
use super::limits::Limit;
use crate::common::rng::Rng;
use crate::common::{
    error_text, future_base_ms, send, send_one, show_value, try_reply6, wait_replica_sync, Server,
    DAY_MS,
};

#[test]
fn a_replica_holds_the_masters_state_and_serves_read_only_calls() {
    let (master, mut con) = library_only(Server::builder());
    let replica = Server::builder().no_module().start();
    replica.replica_of(&master);
    let algorithms = algorithms();
    let mut rng = Rng::with_stream(seed(), 300);
    let base = future_base_ms();
    // With the server's clock: long periods, so nothing expires while the test runs.
    let mut cmds = Vec::new();
    for round in 0..300 {
        let algorithm = algorithms[round % algorithms.len()];
        let burst = rng.chance(50).then(|| rng.range(1, 30));
        let limit = Limit::new(
            algorithm,
            rng.range(3, 20),
            rng.pick(&[3_600_000, DAY_MS]),
            burst,
        );
        let key = format!("clock:{}:{}", algorithm.name(), rng.range(0, 4));
        cmds.push(fcall(
            "check",
            &[&key],
            &limit.args(rng.range(0, 3), None, &mut rng),
        ));
        if round % 7 == 0 {
            // The key twice, with another key between.
            let second = format!("clock:fixed-window:{}", rng.range(0, 4));
            let mut args = limit.spec_args(&mut rng);
            args.extend(words("fixed-window 100 1h"));
            args.extend(limit.spec_args(&mut rng));
            args.extend(words("COST 1"));
            cmds.push(fcall("checkall", &[&key, &second, &key], &args));
        }
    }
    // With AT: sliding logs that slide over thousands of entries (dead records reclaimed, runs
    // at one ms extended in place) and every algorithm stepping through its windows.
    for (i, &algorithm) in algorithms.iter().enumerate() {
        let limit = Limit::new(algorithm, 50, 200, None);
        let key = format!("at:{}", algorithm.name());
        let mut at = base + i as u64;
        for _ in 0..2000 {
            at += rng.range(0, 6);
            cmds.push(fcall(
                "check",
                &[&key],
                &limit.args(rng.range(0, 2), Some(at), &mut rng),
            ));
        }
    }
    // With AT, refunds between the checks: every algorithm given back, logs long enough to be
    // read in chunks written whole by a refund (the refunded header) and extended again.
    for (i, &algorithm) in algorithms.iter().enumerate() {
        let limit = Limit::new(algorithm, 300, 1000, None);
        let key = format!("refund:{}", algorithm.name());
        let mut at = base + i as u64;
        for _ in 0..1500 {
            at += rng.range(0, 6);
            if rng.chance(20) {
                let when = at.saturating_sub(rng.range(0, 3)) + rng.range(0, 3);
                let args = limit.refund_args(rng.range(0, 4), Some(when), &mut rng);
                cmds.push(fcall("refund", &[&key], &args));
            } else {
                let args = limit.args(rng.range(0, 2), Some(at), &mut rng);
                cmds.push(fcall("check", &[&key], &args));
            }
        }
        // A refund of everything deletes the key (DEL is replicated).
        let emptied = format!("refund-emptied:{}", algorithm.name());
        for (command, cost) in [("check", 2), ("refund", 5)] {
            let args = limit.refund_args(cost, Some(base), &mut rng);
            cmds.push(fcall(command, &[&emptied], &args));
        }
    }
    cmds.push(fcall(
        "reset",
        &["clock:token-bucket:0", "clock:token-bucket:0", "none"],
        &[],
    ));
    let replies = send(&mut con, &cmds);
    let failed: Vec<String> = replies.iter().filter_map(error_text).collect();
    assert!(failed.is_empty(), "errors: {failed:?}");
    wait_replica_sync(&master, &replica);

    let mut replica_con = replica.client();
    let on_master = keyspace(&mut con);
    let on_replica = keyspace(&mut replica_con);
    assert!(on_master.len() >= 20, "{} keys", on_master.len());
    assert_eq!(on_master.len(), on_replica.len());
    for (key, state) in &on_master {
        assert_eq!(
            on_replica.get(key),
            Some(state),
            "key {}",
            String::from_utf8_lossy(key)
        );
        assert!(
            matches!(state.1, Value::Int(ms) if ms > 0),
            "no expiry: {state:?}"
        );
    }
    // The AT keys' INFO is the same on both (every `last` is ahead of both clocks).
    for algorithm in &algorithms {
        for prefix in ["at", "refund"] {
            let info = fcall("info", &[&format!("{prefix}:{}", algorithm.name())], &[]);
            let (m, r) = (send_one(&mut con, &info), send_one(&mut replica_con, &info));
            assert!(matches!(m, Value::Array(_)), "{}", show_value(&m));
            assert_eq!(m, r);
        }
        let emptied = format!("refund-emptied:{}", algorithm.name());
        assert!(!on_master.contains_key(emptied.as_bytes()), "{emptied}");
    }

    // Read-only calls work on the replica; writing ones do not, and change nothing.
    let peek = fcall(
        "peek",
        &["at:token-bucket"],
        &words("token-bucket 50 200 COST 1"),
    );
    assert!(try_reply6(&send_one(&mut replica_con, &peek)).is_some());
    let mut check_ro = redis::cmd("FCALL_RO");
    check_ro
        .arg("ratelimit_check")
        .arg(1)
        .arg("at:token-bucket")
        .arg(words("token-bucket 50 200"));
    // FCALL_RO refuses a function that may write (on a replica Redis says READONLY first).
    let refused = error_text(&send_one(&mut con, &check_ro)).expect("FCALL_RO of a writer");
    assert!(refused.contains("write flag"), "{refused}");
    let refused = error_text(&send_one(&mut replica_con, &check_ro)).expect("FCALL_RO of a writer");
    assert!(refused.starts_with("READONLY"), "{refused}");
    let check = fcall("check", &["new"], &words("token-bucket 50 200"));
    let refused = error_text(&send_one(&mut replica_con, &check)).expect("FCALL on a replica");
    assert!(refused.starts_with("READONLY"), "{refused}");
    assert_eq!(keyspace(&mut replica_con), on_replica);
    assert_eq!(keyspace(&mut con), on_master);
}

/// Rejections, COST 0, PEEK, INFO, errors and refunds with nothing to give back write nothing:
/// the dirty counter stays, nothing is replicated, every value and expiry stays.
#[test]
fn calls_that_change_nothing_write_nothing() {
    let (server, mut con) = library_only(Server::builder());
    let at = future_base_ms();
    let names: Vec<&str> = algorithms().into_iter().map(Algorithm::name).collect();
    let setup: Vec<_> = names
        .iter()
        .map(|&name| {
            let args = words(&format!("{name} 2 1h COST 2 AT {at}"));
            fcall("check", &[name], &args)
        })
        .collect();
    let replies = send(&mut con, &setup);
    assert!(replies
        .iter()
        .all(|r| try_reply6(r).is_some_and(|r| r[0] == 1)));
    let dirty = |server: &Server| server.info_field("persistence", "rdb_changes_since_last_save");
    let before = (dirty(&server), keyspace(&mut con));
    let mut calls = Vec::new();
    for &name in &names {
        for cost in [1, 0, 3] {
            let args = words(&format!("{name} 2 1h COST {cost} AT {}", at + 5));
            calls.push(fcall("check", &[name], &args));
            calls.push(fcall("peek", &[name], &args));
            let mut twice = words(&format!("{name} 2 1h"));
            twice.extend(args.clone());
            calls.push(fcall("checkall", &[name, name], &twice));
        }
        calls.push(fcall("info", &[name], &[]));
        // Nothing to give back: COST 0, and an hour later (a full bucket, an empty queue, a
        // passed window, a sliding window's previous count only, a log out of its window).
        for (cost, later) in [(0, 5), (1, 3_600_000), (5, 3_600_000)] {
            let args = words(&format!("{name} 2 1h COST {cost} AT {}", at + later));
            calls.push(fcall("refund", &[name], &args));
        }
        calls.push(fcall("refund", &[name], &words(&format!("{name} 2 1h"))));
        calls.push(fcall("check", &[name], &words("leaky-window 1 1s")));
        calls.push(fcall("check", &[name], &words("fixed-window 0 1s")));
        let other = if name == "fixed-window" {
            "token-bucket"
        } else {
            "fixed-window"
        };
        calls.push(fcall("check", &[name], &words(&format!("{other} 5 1h"))));
    }
    calls.push(fcall("reset", &["missing", "missing2"], &[]));
    calls.push(fcall(
        "refund",
        &["missing"],
        &words("sliding-log 3 1s COST 3"),
    ));
    calls.push(fcall(
        "check",
        &["nothing-yet"],
        &words("sliding-log 3 1s COST 0"),
    ));
    calls.push(fcall(
        "check",
        &["nothing-yet"],
        &words("sliding-log 3 1s COST 4"),
    ));
    let replies = send(&mut con, &calls);
    let answered = replies.iter().filter(|r| try_reply6(r).is_some()).count();
    let errors = replies.iter().filter(|r| error_text(r).is_some()).count();
    assert!(
        answered >= 30 && errors >= 15,
        "{answered} answers, {errors} errors"
    );
    assert_eq!((dirty(&server), keyspace(&mut con)), before);
}

/// Calls on a blocked key write nothing, whatever they name: CHECK with or without BLOCK, with
/// other parameters or a longer BLOCK, COST 0, a cost above the limit, PEEK, CHECKALL (its own
/// BLOCK too), INFO, a refund with nothing to give back. Then the block's replica: the same
/// value and absolute expiry.
#[test]
fn calls_on_a_blocked_key_write_nothing_and_the_block_replicates() {
    let (server, mut con) = library_only(Server::builder());
    let replica = Server::builder().no_module().start();
    replica.replica_of(&server);
    let at = future_base_ms();
    let names: Vec<&str> = algorithms().into_iter().map(Algorithm::name).collect();
    let mut setup = Vec::new();
    for &name in &names {
        for (cost, block) in [(2, ""), (1, "BLOCK 1h")] {
            let args = words(&format!("{name} 2 1s COST {cost} {block} AT {at}"));
            setup.push(fcall("check", &[name], &args));
        }
    }
    let replies = send(&mut con, &setup);
    assert!(replies
        .chunks_exact(2)
        .all(|r| try_reply6(&r[0]).is_some_and(|r| r[0] == 1)
            && try_reply6(&r[1]).is_some_and(|r| r[0] == 0 && r[3] == 3_600_000)));
    let dirty = |server: &Server| server.info_field("persistence", "rdb_changes_since_last_save");
    let before = (dirty(&server), keyspace(&mut con));
    let mut calls = Vec::new();
    for &name in &names {
        let during = at + 2000; // the window and the bucket have refilled: only the block rejects
        for line in [
            format!("{name} 2 1s"),
            format!("{name} 2 1s BLOCK 1h"),
            format!("{name} 2 1s BLOCK 10d"),
            format!("{name} 100 1m"),
            format!("{name} 2 1s COST 0 BLOCK 1h"),
            format!("{name} 2 1s COST 3 BLOCK 1h"),
        ] {
            let args = words(&format!("{line} AT {during}"));
            calls.push(fcall("check", &[name], &args));
            calls.push(fcall("peek", &[name], &args));
            let mut twice = words(&format!("{name} 2 1s BLOCK 1h"));
            twice.extend(args.clone());
            calls.push(fcall("checkall", &[name, name], &twice));
        }
        calls.push(fcall("info", &[name], &[]));
        let args = words(&format!("{name} 2 1s COST 0 AT {during}"));
        calls.push(fcall("refund", &[name], &args));
    }
    let replies = send(&mut con, &calls);
    for reply in &replies {
        if let Some(r) = try_reply6(reply) {
            assert_eq!((r[0], r[2]), (0, 0), "{}", show_value(reply));
        }
    }
    assert_eq!((dirty(&server), keyspace(&mut con)), before);
    wait_replica_sync(&server, &replica);
    let mut replica_con = replica.client();
    assert_eq!(keyspace(&mut replica_con), before.1);
}
