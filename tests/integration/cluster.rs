//! A real Redis Cluster on loopback: 3 masters and 3 replicas, every node with the module loaded,
//! created with `redis-cli --cluster create`. A cluster-aware client (the `redis` crate) runs CHECK
//! over keys spread across all masters and CHECKALL over hash-tagged keys; keys in different
//! slots get `CROSSSLOT`; a slot holding limiter keys is moved with `redis-cli --cluster reshard`
//! and its keys arrive intact; then the master holding them is killed, its replica takes over,
//! and every limit continues exactly where it was (each reply equals the model of
//! docs/algorithms.md, testkit/src/model.rs).
//!
//! The cluster is testkit/src/cluster.rs's: every server is a `common::Server`, killed on Drop
//! (also on panic); every external command and every wait is bounded.

use crate::common;

use std::time::Instant;

use common::cluster::{
    cluster_address, redis_cli, route, run_bounded, slot, wait_for, Cluster, CLUSTER_TIMEOUT,
};
use common::model::{checkall_reply, Model, Spec};
use common::{dbsize, future_base_ms, reply6, snapshot, wait_replica_sync};
use redis::cluster::ClusterConnection;
use redis::Value;
use redis_ratelimit_core::algorithms::{Algorithm, Request};

// ---------------------------------------------------------------------------------------------
// The workload: CHECK over many keys, CHECKALL over hash-tagged groups

const SINGLE_SPECS: [Spec; 5] = [
    Spec::new(Algorithm::TokenBucket, 4, 3_600_000),
    Spec::new(Algorithm::LeakyBucket, 4, 3_600_000),
    Spec::new(Algorithm::FixedWindow, 4, 3_600_000),
    Spec::new(Algorithm::SlidingWindow, 4, 3_600_000),
    Spec::new(Algorithm::SlidingLog, 4, 3_600_000),
];

/// Per user: a per-second, a per-hour and a per-day limit, checked together.
const GROUP_SPECS: [Spec; 3] = [
    Spec::new(Algorithm::FixedWindow, 3, 1000),
    Spec::new(Algorithm::TokenBucket, 5, 3_600_000),
    Spec::new(Algorithm::SlidingLog, 4, 86_400_000),
];

const SINGLE_KEYS: usize = 300;

fn single_key(i: usize) -> String {
    format!("limit:{i}")
}

fn group_keys(tag: &str) -> Vec<String> {
    ["sec", "hour", "day"]
        .iter()
        .map(|suffix| format!("{{{tag}}}:{suffix}"))
        .collect()
}

fn checkall_cmd(keys: &[String], specs: &[Spec], at_ms: u64) -> redis::Cmd {
    let mut cmd = redis::cmd("RATELIMIT.CHECKALL");
    cmd.arg(keys.len()).arg(keys);
    for spec in specs {
        cmd.arg(spec.args());
    }
    cmd.arg("AT").arg(at_ms);
    cmd
}

fn as_rows(value: Value) -> Vec<Vec<i64>> {
    redis::from_redis_value(&value).expect("a CHECKALL reply")
}

/// One round: CHECK every single key once, CHECKALL every group once; every reply must equal
/// the model's. `default_routing` groups go through the client's own routing (it routes by the
/// second argument, `numkeys`, and follows `MOVED`); the others are sent to their slot's master.
/// Answers how many CHECKs and how many CHECKALLs were admitted.
fn round(
    con: &mut ClusterConnection,
    model: &mut Model,
    groups: &[String],
    at_ms: u64,
    phase: &str,
) -> (usize, usize) {
    let (mut checks, mut checkalls) = (0, 0);
    for i in 0..SINGLE_KEYS {
        let key = single_key(i);
        let spec = SINGLE_SPECS[i % SINGLE_SPECS.len()];
        let reply: Vec<i64> = redis::cmd("RATELIMIT.CHECK")
            .arg(&key)
            .arg(spec.args())
            .arg("AT")
            .arg(at_ms)
            .query(con)
            .unwrap_or_else(|e| panic!("{phase}: CHECK {key}: {e}"));
        let expected = model.check(&key, &spec.request(1, at_ms)).to_array();
        assert_eq!(reply, expected, "{phase}: CHECK {key}");
        checks += usize::from(reply[0] == 1);
    }
    for (n, tag) in groups.iter().enumerate() {
        let keys = group_keys(tag);
        let cmd = checkall_cmd(&keys, &GROUP_SPECS, at_ms);
        let reply = if n % 4 == 0 {
            cmd.query::<Value>(con)
        } else {
            con.route_command(&cmd, route(&keys[0]))
        }
        .map(as_rows)
        .unwrap_or_else(|e| panic!("{phase}: CHECKALL {keys:?}: {e}"));
        let requests: Vec<Request> = GROUP_SPECS.iter().map(|s| s.request(1, at_ms)).collect();
        let expected = checkall_reply(&model.checkall(&keys, &requests));
        assert_eq!(reply, expected, "{phase}: CHECKALL {keys:?}");
        checkalls += usize::from(reply[0][0] == 1);
    }
    (checks, checkalls)
}

/// A hash tag whose slot is `target`.
fn tag_for_slot(target: u16) -> String {
    (0u64..)
        .map(|i| format!("moved{i}"))
        .find(|tag| slot(tag) == target)
        .expect("some tag hashes to every slot")
}

// ---------------------------------------------------------------------------------------------

#[test]
fn cluster_routing_crossslot_resharding_and_failover() {
    let started = Instant::now();
    let mut cluster = Cluster::start(3, 1);
    eprintln!("cluster up in {:.1?}", started.elapsed());
    let base = future_base_ms();
    let mut model = Model::default();
    let mut con = cluster.client();

    // The slot that will be resharded: the lowest slot of the first master (what
    // `redis-cli --cluster reshard --cluster-slots 1` moves), holding a group's keys.
    let first_master = cluster.owner(0);
    let moved_slot = first_master.slots.iter().map(|(a, _)| *a).min().unwrap();
    let moved_tag = tag_for_slot(moved_slot);
    let mut groups: Vec<String> = (0..40).map(|u| format!("user:{u}")).collect();
    groups.push(moved_tag.clone());

    // CHECK over many keys, CHECKALL over hash-tagged groups, two rounds.
    let all = (SINGLE_KEYS, groups.len());
    assert_eq!(round(&mut con, &mut model, &groups, base, "start"), all);
    assert_eq!(
        round(&mut con, &mut model, &groups, base + 10, "start"),
        all
    );
    // A concurrency key in the slot that moves, and one elsewhere: they travel with it.
    let lease_key = format!("{{{moved_tag}}}:jobs");
    assert_eq!(slot(&lease_key), moved_slot);
    let lease = |con: &mut ClusterConnection, key: &str, id: &str, at: u64| {
        let cmd = redis::cmd("RATELIMIT.ACQUIRE")
            .arg(key)
            .arg(2)
            .arg("1d")
            .arg("ID")
            .arg(id)
            .arg("AT")
            .arg(at)
            .clone();
        reply6(&cmd.query::<Value>(con).expect("ACQUIRE"))
    };
    const DAY: i64 = 86_400_000;
    assert_eq!(lease(&mut con, &lease_key, "a", base), [1, 2, 1, 0, DAY, 0]);
    assert_eq!(
        lease(&mut con, "jobs:elsewhere", "a", base),
        [1, 2, 1, 0, DAY, 0]
    );
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    for master in &masters {
        let keys = dbsize(&mut cluster.server(master.port).client());
        assert!(keys > 50, "master {} holds only {keys} keys", master.port);
    }

    // Keys in different slots: CROSSSLOT, from Redis itself, and nothing is written.
    let (a, b) = ("limit:a", "limit:b");
    assert_ne!(slot(a), slot(b));
    let spread = [a.to_string(), b.to_string()];
    let tags = ["{user:1}:sec".to_string(), "{user:2}:sec".to_string()];
    assert_ne!(slot(&tags[0]), slot(&tags[1]));
    let specs = [GROUP_SPECS[0], GROUP_SPECS[1]];
    for keys in [&spread, &tags] {
        let cmd = checkall_cmd(keys, &specs, base);
        let error = cmd.query::<Value>(&mut con).expect_err("CROSSSLOT");
        assert_eq!(error.code(), Some("CROSSSLOT"), "{keys:?}: {error}");
        let owner = cluster.owner(slot(&keys[0]));
        let direct = cmd
            .query::<Value>(&mut cluster.server(owner.port).client())
            .expect_err("CROSSSLOT");
        assert_eq!(direct.code(), Some("CROSSSLOT"), "{keys:?}: {direct}");
    }
    let exists: i64 = redis::cmd("EXISTS").arg(a).query(&mut con).unwrap();
    assert_eq!(exists, 0);

    // Resharding: move the slot with `redis-cli --cluster reshard`; its keys arrive intact.
    let target = masters
        .iter()
        .find(|m| m.id != first_master.id)
        .expect("another master")
        .clone();
    let moved_keys = group_keys(&moved_tag);
    let source = cluster.server(first_master.port);
    let before = snapshot(&mut source.client(), &moved_keys);
    assert!(before.iter().all(|(dump, _)| dump.is_some()));
    let resharding = Instant::now();
    let output = run_bounded(
        redis_cli().args([
            "--cluster",
            "reshard",
            &cluster_address(first_master.port),
            "--cluster-from",
            &first_master.id,
            "--cluster-to",
            &target.id,
            "--cluster-slots",
            "1",
            "--cluster-yes",
        ]),
        CLUSTER_TIMEOUT,
    );
    cluster.wait_healthy();
    eprintln!(
        "slot {moved_slot} resharded in {:.1?}",
        resharding.elapsed()
    );
    assert_eq!(
        cluster.owner(moved_slot).id,
        target.id,
        "reshard moved another slot:\n{output}"
    );
    let arrived = snapshot(&mut cluster.server(target.port).client(), &moved_keys);
    for ((key, (dump, expiry)), (dump_after, expiry_after)) in
        moved_keys.iter().zip(&before).zip(arrived)
    {
        assert_eq!(&dump_after, dump, "{key}: state changed in transit");
        // MIGRATE carries the TTL relative: the expiry may only move later by the transit time.
        assert!(
            (*expiry..*expiry + 5_000).contains(&expiry_after),
            "{key}: expiry {expiry} became {expiry_after}"
        );
    }
    let left: i64 = redis::cmd("CLUSTER")
        .arg("COUNTKEYSINSLOT")
        .arg(moved_slot)
        .query(&mut cluster.server(first_master.port).client())
        .unwrap();
    assert_eq!(left, 0, "keys left behind on the source");
    let mut con = cluster.client();
    assert_eq!(
        round(&mut con, &mut model, &groups, base + 20, "after resharding"),
        all
    );
    assert_eq!(
        lease(&mut con, &lease_key, "b", base + 20),
        [1, 2, 0, 0, DAY, 0]
    );

    // Failover: kill the master now holding the moved slot; its replica takes over and every
    // limit continues exactly.
    let replica = cluster
        .nodes()
        .into_iter()
        .find(|n| n.master_id.as_deref() == Some(target.id.as_str()))
        .expect("the target master's replica");
    // Every write has reached the replica (equal replication offsets) before its master dies.
    // (`WAIT` would not do here: on a new connection it waits for that connection's writes only,
    // which are none.)
    wait_replica_sync(cluster.server(target.port), cluster.server(replica.port));
    let failover = Instant::now();
    drop(con);
    cluster.server_mut(target.port).kill9();
    wait_for("the replica to take over", CLUSTER_TIMEOUT, || {
        let role = cluster
            .server(replica.port)
            .info_field("replication", "role");
        (role == "master")
            .then_some(())
            .ok_or_else(|| format!("port {} is still {role}", replica.port))
    });
    cluster.wait_healthy();
    eprintln!("failover done in {:.1?}", failover.elapsed());
    assert_eq!(cluster.owner(moved_slot).port, replica.port);
    let mut con = cluster.client();
    // The fourth call in the first second: every group's per-second limit refuses (and its hour
    // and day limits keep their state); the single keys still have one left.
    assert_eq!(
        round(&mut con, &mut model, &groups, base + 30, "after failover"),
        (SINGLE_KEYS, 0)
    );
    // A second later: the groups pass again; the single keys are spent (limit 4 per hour).
    assert_eq!(
        round(&mut con, &mut model, &groups, base + 1030, "after failover"),
        (0, groups.len())
    );
    // The leases survived the move and the failover: full until `a` expires.
    assert_eq!(
        lease(&mut con, &lease_key, "c", base + 30),
        [0, 2, 0, DAY - 30, DAY - 10, 0]
    );
    let released: i64 = redis::cmd("RATELIMIT.RELEASE")
        .arg(&lease_key)
        .arg("ID")
        .arg("a")
        .arg("AT")
        .arg(base + 40)
        .query(&mut con)
        .unwrap();
    assert_eq!(released, 1);
    assert_eq!(
        lease(&mut con, "jobs:elsewhere", "b", base + 40),
        [1, 2, 0, 0, DAY, 0]
    );
    // The survivors still refuse keys in different slots.
    let error = checkall_cmd(&spread, &specs, base)
        .query::<Value>(&mut con)
        .expect_err("CROSSSLOT");
    assert_eq!(error.code(), Some("CROSSSLOT"));
    eprintln!("whole test in {:.1?}", started.elapsed());
}
