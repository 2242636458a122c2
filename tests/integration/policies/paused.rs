//! A rewrite without the RDB preamble that starts while writes are paused (issue 30): the module
//! writes the definitions into the AOF once the pause is over, never during it (Redis aborts on
//! anything propagated while writes are paused). Three ways into it: `CLIENT PAUSE WRITE` then
//! `BGREWRITEAOF`; a rewrite scheduled behind a slow BGSAVE that starts inside a pause; and a
//! `FAILOVER` whose pause a scheduled rewrite starts in. Each time the server lives through it,
//! and a restart from the AOF alone holds every definition.

use super::{all_definitions, define};
use crate::common;

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use common::model::Spec;
use common::{config_set, run_ok, scaled, Server};
use redis::Connection;
use redis_ratelimit_core::algorithms::Algorithm;

type Definitions = BTreeMap<String, BTreeMap<String, String>>;

/// A server whose AOF holds commands only, synced at every write.
fn aof_server() -> Server {
    Server::builder()
        .config(&[
            ("appendonly", "yes"),
            ("appendfsync", "always"),
            ("aof-use-rdb-preamble", "no"),
        ])
        .start()
}

/// One policy per algorithm, one in shadow mode; answers what POLICY GET says of them.
fn define_policies(con: &mut Connection) -> Definitions {
    for (i, algorithm) in Algorithm::ALL.into_iter().enumerate() {
        let spec = Spec::new(algorithm, 5 + i as u64, 1000 * (1 + i as u64));
        define(con, &format!("paused.{}", algorithm.name()), &spec, i == 2);
    }
    let definitions = all_definitions(con);
    assert_eq!(definitions.len(), Algorithm::ALL.len());
    definitions
}

/// Enough keys that a fork child which waits `rdb-key-save-delay` µs per key runs for a while.
fn fill(con: &mut Connection, keys: usize) {
    let mut pipe = redis::pipe();
    for i in 0..keys {
        pipe.cmd("SET").arg(format!("filler:{i}")).arg(i).ignore();
    }
    let _: () = pipe.query(con).expect("SET the fillers");
}

/// Waits until `condition` holds, polling; panics with `what` after `timeout` ([`scaled`]).
fn wait_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + scaled(timeout);
    while !condition() {
        assert!(Instant::now() < deadline, "still waiting: {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// The rewrite ended well, the server still runs, writes are let through again, and the
/// definitions reach the AOF: kill -9 and a start from that AOF alone gives every one back.
fn unpause_and_restart_from_the_aof(server: &mut Server, before: &Definitions, what: &str) {
    server.wait_persistence_idle(&["aof_rewrite_in_progress", "aof_rewrite_scheduled"]);
    assert!(server.is_running(), "{what}: the server died");
    assert_eq!(
        server.info_field("persistence", "aof_last_bgrewrite_status"),
        "ok",
        "{what}"
    );
    run_ok(&mut server.client(), "CLIENT UNPAUSE");
    // The definitions are written at most a timer's turn after the pause ends.
    wait_until(
        &format!("{what}: the definitions in the incremental AOF"),
        Duration::from_secs(10),
        || {
            let incr = super::persistence::current_incr(server).to_ascii_lowercase();
            incr.matches("ratelimit.policy").count() >= before.len()
        },
    );
    server.kill9();
    server.start_again();
    assert_eq!(&all_definitions(&mut server.client()), before, "{what}");
}

/// The reproduction: a client pauses writes, then a rewrite starts at once.
#[test]
fn a_rewrite_that_starts_while_writes_are_paused_keeps_the_server_and_the_definitions() {
    let mut server = aof_server();
    let mut con = server.client();
    let before = define_policies(&mut con);
    run_ok(&mut con, "CLIENT PAUSE 30000 WRITE");
    let reply: String = redis::cmd("BGREWRITEAOF").query(&mut con).unwrap();
    assert!(reply.contains("started"), "{reply}");
    // The timer the fork armed comes round during the pause (every 100 ms): let it, a few times.
    thread::sleep(Duration::from_millis(500));
    unpause_and_restart_from_the_aof(&mut server, &before, "CLIENT PAUSE, then BGREWRITEAOF");
}

/// No operator types the pause: a rewrite scheduled behind a slow BGSAVE starts inside one.
#[test]
fn a_rewrite_scheduled_behind_a_bgsave_that_starts_in_a_pause_keeps_the_server() {
    let mut server = aof_server();
    let mut con = server.client();
    let before = define_policies(&mut con);
    fill(&mut con, 400);
    // 400 keys at 4 ms each: the BGSAVE, and the rewrite after it, take over a second and a half.
    config_set(&mut con, "rdb-key-save-delay", "4000").unwrap();
    run_ok(&mut con, "BGSAVE");
    let reply: String = redis::cmd("BGREWRITEAOF").query(&mut con).unwrap();
    assert!(reply.contains("scheduled"), "{reply}");
    run_ok(&mut con, "CLIENT PAUSE 30000 WRITE");
    wait_until(
        "the scheduled rewrite to start",
        Duration::from_secs(20),
        || server.info_field("persistence", "aof_rewrite_scheduled") == "0",
    );
    config_set(&mut con, "rdb-key-save-delay", "0").unwrap();
    unpause_and_restart_from_the_aof(&mut server, &before, "a rewrite scheduled behind a BGSAVE");
}

/// `FAILOVER` pauses writes until its replica has caught up; with the replica frozen, it waits
/// until its timeout, and a rewrite scheduled behind a BGSAVE starts in that pause.
#[test]
fn a_rewrite_that_starts_during_a_failover_keeps_the_server_and_the_definitions() {
    let mut master = aof_server();
    let replica = Server::start();
    replica.replica_of(&master);
    let mut con = master.client();
    let before = define_policies(&mut con);
    fill(&mut con, 400);
    common::wait_replica_sync(&master, &replica);
    // The full sync's child may still be running once the replica is in sync (Redis 8 reaps
    // it later): a BGSAVE now would be refused.
    wait_until("the sync's child to exit", Duration::from_secs(10), || {
        master.info_field("persistence", "rdb_bgsave_in_progress") == "0"
    });
    config_set(&mut con, "rdb-key-save-delay", "4000").unwrap();
    run_ok(&mut con, "BGSAVE");
    let reply: String = redis::cmd("BGREWRITEAOF").query(&mut con).unwrap();
    assert!(reply.contains("scheduled"), "{reply}");
    replica.pause();
    let failover = redis::cmd("FAILOVER")
        .arg("TIMEOUT")
        .arg(scaled(Duration::from_secs(5)).as_millis() as u64)
        .query::<String>(&mut con);
    assert_eq!(failover.as_deref(), Ok("OK"), "FAILOVER");
    wait_until(
        "the scheduled rewrite to start",
        Duration::from_secs(20),
        || master.info_field("persistence", "aof_rewrite_scheduled") == "0",
    );
    // The failover times out (the replica never answers) and lets writes through again.
    wait_until("the failover to give up", Duration::from_secs(30), || {
        master.info_field("replication", "master_failover_state") == "no-failover"
    });
    replica.resume();
    assert_eq!(master.info_field("replication", "role"), "master");
    config_set(&mut con, "rdb-key-save-delay", "0").unwrap();
    unpause_and_restart_from_the_aof(&mut master, &before, "a rewrite during FAILOVER");
}
