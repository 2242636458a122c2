//! Policies on replicas: a full sync gives a replica exactly the master's policies (its own
//! earlier ones are gone), POLICY SET/DEL reach it, it answers GET, LIST and PEEK through them
//! read-only and refuses SET, DEL and CHECK; a promoted replica checks through them. FLUSHALL
//! keeps them. A SET of the definition a name already has, or a DEL of a missing name, replicates
//! nothing (the master's replication offset and AOF do not move); a real change does.

use super::{all_definitions, call_cmd, check_cmd, define, list, set_cmd, stored};
use crate::common;

use common::model::Spec;
use common::{
    cmd_error, dbsize, decision, future_base_ms, run, run_ok, send_one, show_value,
    wait_replica_sync, Server,
};
use redis::Value;
use redis_ratelimit_core::algorithms::Algorithm;

fn spec(algorithm: Algorithm, limit: u64) -> Spec {
    Spec::new(algorithm, limit, 60_000)
}

#[test]
fn a_full_sync_gives_a_replica_exactly_the_masters_policies() {
    let master = Server::start();
    let mut m = master.client();
    let at = future_base_ms();

    // A replica of a master without policies has none, whatever it had.
    let empty = Server::start();
    define(&mut empty.client(), "own", &spec(Algorithm::Gcra, 1), false);
    empty.replica_of(&master);
    assert_eq!(list(&mut empty.client()), Vec::<String>::new());

    define(&mut m, "shared", &spec(Algorithm::TokenBucket, 3), false);
    define(&mut m, "watch", &spec(Algorithm::SlidingLog, 2), true);
    for _ in 0..3 {
        decision(&mut m, &check_cmd("k1", "shared", 1, at));
        decision(&mut m, &check_cmd("k2", "watch", 1, at));
    }
    let keys = ["k1".to_string(), "k2".to_string()];
    // Policies defined on the master reach the replica in the stream.
    wait_replica_sync(&master, &empty);
    assert_eq!(
        all_definitions(&mut empty.client()),
        all_definitions(&mut m)
    );

    // Full syncs: to disk, and diskless into a swapped database. Each replica first has its own
    // policies, one of them under a name the master uses with another definition.
    let on_disk = Server::start();
    let swapdb = Server::builder()
        .config(&[("repl-diskless-load", "swapdb")])
        .start();
    for replica in [&on_disk, &swapdb] {
        let mut r = replica.client();
        define(&mut r, "mine", &spec(Algorithm::FixedWindow, 9), false);
        define(&mut r, "shared", &spec(Algorithm::TokenBucket, 99), true);
        replica.replica_of(&master);
        common::assert_replica_matches(&master, replica, &keys);
        assert_eq!(
            all_definitions(&mut replica.client()),
            all_definitions(&mut m)
        );
    }

    // Later changes follow: a new one, a replaced one, a deleted one.
    define(&mut m, "late", &spec(Algorithm::LeakyBucket, 4), false);
    define(&mut m, "watch", &spec(Algorithm::SlidingLog, 5), false);
    assert_eq!(run(&mut m, "RATELIMIT.POLICY DEL shared"), Value::Int(1));
    for replica in [&empty, &on_disk, &swapdb] {
        wait_replica_sync(&master, replica);
        assert_eq!(
            all_definitions(&mut replica.client()),
            all_definitions(&mut m)
        );
        assert_eq!(list(&mut replica.client()), ["late", "watch"]);
    }

    // A read-only replica: GET, LIST and PEEK through a policy answer as on the master; SET,
    // DEL and CHECK are refused (READONLY) and change nothing.
    let mut r = on_disk.client();
    let peek = call_cmd("RATELIMIT.PEEK", "k2", "watch", 1, at + 5);
    assert_eq!(
        show_value(&send_one(&mut r, &peek)),
        show_value(&send_one(&mut m, &peek))
    );
    let refused = [
        set_cmd("new", &spec(Algorithm::Gcra, 1), false),
        set_cmd("watch", &spec(Algorithm::SlidingLog, 1), true),
        common::cmd_line("RATELIMIT.POLICY DEL watch"),
        check_cmd("k2", "watch", 1, at + 5),
    ];
    for cmd in &refused {
        let error = cmd_error(&mut r, cmd);
        assert!(
            error.starts_with("READONLY"),
            "{}: {error}",
            common::show_cmd(cmd)
        );
    }
    assert_eq!(all_definitions(&mut r), all_definitions(&mut m));
    assert_eq!(stored(&mut r, &["k2"]), stored(&mut m, &["k2"]));

    // FLUSHALL removes the keys, not the policies (on the replica too).
    run_ok(&mut m, "FLUSHALL");
    wait_replica_sync(&master, &on_disk);
    assert_eq!(dbsize(&mut m), 0);
    assert_eq!(dbsize(&mut r), 0);
    assert_eq!(list(&mut m), ["late", "watch"]);
    assert_eq!(list(&mut r), ["late", "watch"]);
}

#[test]
fn a_promoted_replica_checks_through_the_masters_policies() {
    let (mut master, replica) = common::master_and_replica();
    let mut m = master.client();
    let at = future_base_ms();
    let limits = [
        ("fw", spec(Algorithm::FixedWindow, 3), false),
        (
            "tb",
            Spec {
                burst: Some(5),
                ..spec(Algorithm::TokenBucket, 2)
            },
            true,
        ),
    ];
    for (name, spec, shadow) in &limits {
        define(&mut m, name, spec, *shadow);
        for step in 0..4 {
            decision(
                &mut m,
                &check_cmd(&format!("key:{name}"), name, 1, at + step),
            );
        }
    }
    wait_replica_sync(&master, &replica);
    let mut r = replica.client();
    // What the next CHECKs would answer, as the replica holds the keys.
    let next: Vec<[i64; 6]> = limits
        .iter()
        .map(|(name, _, _)| {
            decision(
                &mut r,
                &call_cmd("RATELIMIT.PEEK", &format!("key:{name}"), name, 1, at + 10),
            )
        })
        .collect();
    master.kill9();
    replica.promote();
    assert_eq!(replica.info_field("replication", "role"), "master");
    for ((name, _, _), expected) in limits.iter().zip(next) {
        let reply = decision(&mut r, &check_cmd(&format!("key:{name}"), name, 1, at + 10));
        assert_eq!(reply, expected, "{name} on the promoted replica");
    }
    // It defines policies of its own now.
    define(&mut r, "new", &spec(Algorithm::Gcra, 1), false);
    assert_eq!(list(&mut r), ["fw", "new", "tb"]);
}

/// The master's replication offset and AOF size.
fn written(master: &Server) -> (String, String) {
    (
        master.info_field("replication", "master_repl_offset"),
        master.info_field("persistence", "aof_current_size"),
    )
}

#[test]
fn a_set_of_the_same_definition_or_a_del_of_a_missing_name_replicates_nothing() {
    // No PING to the replica for an hour: the offset moves only with what is replicated.
    let master = Server::builder()
        .config(&[
            ("repl-ping-replica-period", "3600"),
            ("appendonly", "yes"),
            ("appendfsync", "always"),
        ])
        .start();
    let replica = Server::start();
    replica.replica_of(&master);
    let mut m = master.client();
    run_ok(&mut m, "RATELIMIT.POLICY SET p token-bucket 5 1m");
    run_ok(&mut m, "RATELIMIT.POLICY SET s fixed-window 2 1h SHADOW");
    common::config_set(&mut m, "ratelimit.max-policies", "2").unwrap();
    wait_replica_sync(&master, &replica);
    let at = future_base_ms();

    // Each line and how it is answered.
    let changes_nothing = [
        // The same definitions, as given and spelled otherwise.
        ("RATELIMIT.POLICY SET p token-bucket 5 1m", "OK"),
        ("RATELIMIT.POLICY SET p token-bucket 5 60000", "OK"),
        (
            "RATELIMIT.POLICY SET p TOKEN-BUCKET 5 60000ms burst 5",
            "OK",
        ),
        ("RATELIMIT.POLICY SET s fixed-window 2 3600s shadow", "OK"),
        // A missing name; refused definitions; reads.
        ("RATELIMIT.POLICY DEL missing", "0"),
        (
            "RATELIMIT.POLICY SET third gcra 1 1s",
            "(error) ERR too many policies",
        ),
        (
            "RATELIMIT.POLICY SET bad:name gcra 1 1s",
            "(error) ERR policy name",
        ),
        (
            "RATELIMIT.POLICY SET p token-bucket 0 1m",
            "(error) ERR limit",
        ),
        ("RATELIMIT.POLICY GET p", "[algorithm, token-bucket"),
        ("RATELIMIT.POLICY LIST", "[p, s]"),
    ];
    for (line, answer) in changes_nothing {
        let before = written(&master);
        let reply = run(&mut m, line);
        assert!(
            show_value(&reply).starts_with(answer),
            "{line}: {}",
            show_value(&reply)
        );
        // A PEEK through a policy, and a CHECK through an unknown one, write nothing either.
        send_one(&mut m, &call_cmd("RATELIMIT.PEEK", "k", "p", 1, at));
        send_one(&mut m, &check_cmd("k", "missing", 1, at));
        assert_eq!(written(&master), before, "{line} ({})", show_value(&reply));
    }
    assert_eq!(dbsize(&mut m), 0);

    // Real changes move both, and the replica follows each.
    let changes = [
        "RATELIMIT.POLICY SET p token-bucket 5 1m BURST 6",
        "RATELIMIT.POLICY SET s fixed-window 2 1h",
        "RATELIMIT.POLICY DEL p",
        "RATELIMIT.POLICY SET third gcra 1 1s",
    ];
    for line in changes {
        let (offset, aof) = written(&master);
        run_ok(&mut m, line);
        let (offset_after, aof_after) = written(&master);
        let grew = |a: &str, b: &str| b.parse::<u64>().unwrap() > a.parse::<u64>().unwrap();
        assert!(
            grew(&offset, &offset_after),
            "{line}: offset {offset} -> {offset_after}"
        );
        assert!(grew(&aof, &aof_after), "{line}: AOF {aof} -> {aof_after}");
        wait_replica_sync(&master, &replica);
        assert_eq!(
            all_definitions(&mut replica.client()),
            all_definitions(&mut m),
            "{line}"
        );
    }
    assert_eq!(list(&mut m), ["s", "third"]);
}
