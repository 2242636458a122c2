//! Policies are part of the dataset: they survive DEBUG RELOAD (their counters too), a restart
//! from the RDB, and a restart from the AOF with and without the RDB preamble (without it, the
//! rewrite writes the definitions into the AOF it goes on with), also when the AOF is switched on
//! at run time; the keys used through them come back exactly. An RDB whose policy record is
//! damaged (with a valid checksum) is refused at load with a log line, not loaded and not a crash.

use super::{all_definitions, check_cmd, define, list, policy_figures, stored, Figures};
use crate::common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use common::model::Spec;
use common::{decision, future_base_ms, run, run_ok, send_one, Server};
use redis::{Connection, Value};
use redis_ratelimit_core::algorithms::Algorithm;

/// One policy per algorithm, two in shadow mode, BURST where it applies.
fn policies() -> Vec<(String, Spec, bool)> {
    Algorithm::ALL
        .into_iter()
        .enumerate()
        .map(|(i, algorithm)| {
            let burst = algorithm.is_bucket().then_some(4 + i as u64);
            let spec = Spec {
                burst,
                ..Spec::new(algorithm, 3, 60_000 * (1 + i as u64))
            };
            (format!("persist.{}", algorithm.name()), spec, i % 3 == 1)
        })
        .collect()
}

/// Defines [`policies`] and runs a few CHECKs through each (more than the limit, so some are
/// rejected); answers the keys.
fn populate(con: &mut Connection, at: u64) -> Vec<String> {
    policies()
        .iter()
        .map(|(name, spec, shadow)| {
            define(con, name, spec, *shadow);
            let key = format!("key:{name}");
            for step in 0..6 {
                decision(con, &check_cmd(&key, name, 1, at + step * 7));
            }
            key
        })
        .collect()
}

/// What must come back: every definition, and every key's DUMP, PEXPIRETIME and RATELIMIT.INFO.
#[derive(Debug, PartialEq)]
struct Dataset {
    definitions: BTreeMap<String, BTreeMap<String, String>>,
    keys: Vec<(Value, Value, Value)>,
}

fn dataset(server: &Server, keys: &[String]) -> Dataset {
    let mut con = server.client();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    Dataset {
        definitions: all_definitions(&mut con),
        keys: stored(&mut con, &keys),
    }
}

/// What the next CHECK through each policy would answer (PEEKs), to compare with the CHECKs made
/// after a reload.
fn next_answers(con: &mut Connection, keys: &[String], at: u64) -> Vec<Value> {
    keys.iter()
        .zip(policies())
        .map(|(key, (name, _, _))| {
            send_one(con, &super::call_cmd("RATELIMIT.PEEK", key, &name, 2, at))
        })
        .collect()
}

fn checks(con: &mut Connection, keys: &[String], at: u64) -> Vec<Value> {
    keys.iter()
        .zip(policies())
        .map(|(key, (name, _, _))| send_one(con, &check_cmd(key, &name, 2, at)))
        .collect()
}

#[test]
fn policies_and_their_counters_survive_debug_reload_and_a_restart() {
    let mut server = Server::start();
    let mut con = server.client();
    let at = future_base_ms();
    let keys = populate(&mut con, at);
    assert_eq!(all_definitions(&mut con).len(), policies().len());
    let before = dataset(&server, &keys);
    let counters = policy_figures(&server);
    assert!(counters.values().all(|f| f.calls == 6), "{counters:?}");

    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).unwrap();
    assert_eq!(dataset(&server, &keys), before, "DEBUG RELOAD");
    // The counters are kept by name.
    assert_eq!(policy_figures(&server), counters, "DEBUG RELOAD");

    // A new one, a replaced one and a deleted one, then SHUTDOWN SAVE and start again.
    define(&mut con, "late", &Spec::new(Algorithm::Gcra, 9, 900), true);
    let (first, spec, _) = &policies()[0];
    define(&mut con, first, &Spec { limit: 7, ..*spec }, false);
    assert_eq!(
        run(
            &mut con,
            &format!("RATELIMIT.POLICY DEL {}", policies()[5].0)
        ),
        Value::Int(1)
    );
    let before = dataset(&server, &keys);
    server.restart();
    let mut con = server.client();
    assert_eq!(dataset(&server, &keys), before, "SHUTDOWN SAVE and restart");
    // A fresh process counts from 0.
    assert!(
        policy_figures(&server)
            .values()
            .all(|f| *f == Figures::default()),
        "{:?}",
        policy_figures(&server)
    );
    // The restarted server checks through them: what it answers is what the keys hold.
    let five = &keys[..5];
    let expected: Vec<Value> = next_answers(&mut con, five, at + 100);
    assert_eq!(checks(&mut con, five, at + 100), expected);
}

/// kill -9, start again from the AOF, and compare.
fn crash_and_compare(server: &mut Server, keys: &[String], what: &str) {
    let before = dataset(server, keys);
    server.kill9();
    server.start_again();
    assert_eq!(dataset(server, keys), before, "{what}");
}

fn rewrite_aof(server: &Server) {
    // One already running or scheduled refuses a BGREWRITEAOF: let it finish first.
    server.wait_persistence_idle(&["aof_rewrite_in_progress", "aof_rewrite_scheduled"]);
    let _: String = redis::cmd("BGREWRITEAOF")
        .query(&mut server.client())
        .expect("BGREWRITEAOF");
    server.wait_persistence_idle(&["aof_rewrite_in_progress", "aof_rewrite_scheduled"]);
    assert_eq!(
        server.info_field("persistence", "aof_last_bgrewrite_status"),
        "ok"
    );
}

fn policies_survive_aof_restarts(preamble: &str) {
    let mut server = Server::builder()
        .config(&[
            ("appendonly", "yes"),
            ("appendfsync", "always"),
            ("aof-use-rdb-preamble", preamble),
        ])
        .start();
    let at = future_base_ms();
    let keys = populate(&mut server.client(), at);
    // From the incremental AOF alone.
    crash_and_compare(&mut server, &keys, "kill -9 before any rewrite");
    // From a rewritten AOF: its base (keys, and with the preamble the policies), then what the
    // rewrite wrote after it; changes after the rewrite on top.
    rewrite_aof(&server);
    let mut con = server.client();
    define(
        &mut con,
        "after.rewrite",
        &Spec::new(Algorithm::FixedWindow, 4, 1000),
        false,
    );
    let (name, spec, _) = &policies()[2];
    define(&mut con, name, &Spec { limit: 11, ..*spec }, true);
    assert_eq!(
        run(
            &mut con,
            &format!("RATELIMIT.POLICY DEL {}", policies()[3].0)
        ),
        Value::Int(1)
    );
    crash_and_compare(
        &mut server,
        &keys,
        &format!("after BGREWRITEAOF (preamble {preamble})"),
    );
    // And a rewrite of what was itself loaded from the AOF, with nothing after it.
    rewrite_aof(&server);
    crash_and_compare(
        &mut server,
        &keys,
        &format!("after a second rewrite (preamble {preamble})"),
    );
    assert_eq!(
        all_definitions(&mut server.client()).len(),
        policies().len()
    );
}

#[test]
fn policies_survive_aof_restarts_with_the_rdb_preamble() {
    policies_survive_aof_restarts("yes");
}

#[test]
fn policies_survive_aof_restarts_without_the_rdb_preamble() {
    policies_survive_aof_restarts("no");
}

/// `CONFIG SET appendonly yes` on a server that has policies: the AOF it writes (a rewrite
/// first) holds them. A second server started on that AOF alone has them.
fn policies_reach_an_aof_switched_on_at_run_time(preamble: &str) {
    // `appendfsync always`: the write after the switch is in the file before its reply. (Under
    // `everysec` a busy disk lets Redis postpone the write by up to 2 s, and the kill -9 below
    // then loses it, as it may in production.)
    let mut server = Server::builder()
        .config(&[
            ("aof-use-rdb-preamble", preamble),
            ("appendfsync", "always"),
        ])
        .start();
    let mut con = server.client();
    let at = future_base_ms();
    let keys = populate(&mut con, at);
    common::config_set(&mut con, "appendonly", "yes").unwrap();
    server.wait_persistence_idle(&["aof_rewrite_in_progress", "aof_rewrite_scheduled"]);
    assert_eq!(server.info_field("persistence", "aof_enabled"), "1");
    assert_eq!(
        server.info_field("persistence", "aof_last_bgrewrite_status"),
        "ok"
    );
    // A write after the rewrite, into the incremental file.
    define(
        &mut con,
        "after.switch",
        &Spec::new(Algorithm::SlidingLog, 2, 1000),
        false,
    );
    let before = dataset(&server, &keys);
    server.kill9();
    // No RDB was ever saved (`save ""`): the second server loads the AOF directory.
    assert!(!server.dir().join("dump.rdb").exists());
    let dir = server.dir().to_string_lossy().into_owned();
    let second = Server::builder()
        .config(&[
            ("dir", dir.as_str()),
            ("appendonly", "yes"),
            ("aof-use-rdb-preamble", preamble),
        ])
        .start();
    assert_eq!(dataset(&second, &keys), before, "preamble {preamble}");
}

#[test]
fn policies_reach_an_aof_switched_on_at_run_time_with_the_rdb_preamble() {
    policies_reach_an_aof_switched_on_at_run_time("yes");
}

#[test]
fn policies_reach_an_aof_switched_on_at_run_time_without_the_rdb_preamble() {
    policies_reach_an_aof_switched_on_at_run_time("no");
}

// ---------------------------------------------------------------------------------------------
// A damaged policy record

/// `rdb` (an RDB file's bytes) with its CRC-64 trailer made valid again.
fn with_valid_crc(mut rdb: Vec<u8>) -> Vec<u8> {
    let body = rdb.len() - 8;
    let crc = common::dump::crc64(&rdb[..body]);
    rdb[body..].copy_from_slice(&crc.to_le_bytes());
    rdb
}

/// A server with the module on the RDB `rdb`, written as dump.rdb into `dir` first.
fn on_rdb(dir: &Path, rdb: &[u8]) -> common::ServerBuilder {
    fs::write(dir.join("dump.rdb"), rdb).expect("write dump.rdb");
    Server::builder().config(&[("dir", &dir.to_string_lossy())])
}

#[test]
fn an_rdb_with_a_damaged_policy_record_is_refused_at_load() {
    const NAME: &[u8] = b"damaged.record";
    let mut server = Server::builder()
        .config(&[("rdbcompression", "no")])
        .start();
    let mut con = server.client();
    run_ok(
        &mut con,
        "RATELIMIT.POLICY SET damaged.record token-bucket 5 1m BURST 9 BLOCK 30s SHADOW",
    );
    let _: () = redis::cmd("SAVE").query(&mut con).unwrap();
    server.kill9();
    let dir = server.dir().to_path_buf();
    let saved = fs::read(dir.join("dump.rdb")).expect("dump.rdb");
    // The record (docs: store/policies.rs): version 2, count 1 (u32 LE), the name's length and
    // bytes, the algorithm, limit, period_ms and capacity (u64 LE), the mode, the block.
    let mut head = vec![2u8, 1, 0, 0, 0, NAME.len() as u8];
    head.extend_from_slice(NAME);
    let at = saved
        .windows(head.len())
        .position(|window| window == head)
        .expect("the policy record, uncompressed, in dump.rdb");
    let name_at = at + 6;
    let algorithm_at = name_at + NAME.len();
    let limit_at = algorithm_at + 1;
    let mode_at = limit_at + 24;
    assert_eq!(saved[limit_at..limit_at + 8], 5u64.to_le_bytes());
    assert_eq!(saved[mode_at], 1, "shadow");
    let block_at = mode_at + 1;
    assert_eq!(saved[block_at..block_at + 8], 30_000u64.to_le_bytes());

    // The file as saved (its CRC recomputed: the same) loads.
    let loaded = on_rdb(&dir, &with_valid_crc(saved.clone())).start();
    assert_eq!(
        all_definitions(&mut loaded.client())
            .into_keys()
            .collect::<Vec<_>>(),
        ["damaged.record"]
    );
    drop(loaded);

    let damages: [(&str, usize, &[u8]); 7] = [
        ("a version never written", at, &[3]),
        ("a ':' in the name", name_at + 3, b":"),
        ("an unknown algorithm", algorithm_at, &[0x63]),
        ("a limit of 0", limit_at, &[0; 8]),
        ("a mode that is neither", mode_at, &[7]),
        ("a count of 2 with one record", at + 1, &[2]),
        ("a block above 3650 days", block_at, &[0xff; 8]),
    ];
    for (what, offset, bytes) in damages {
        let mut damaged = saved.clone();
        damaged[offset..offset + bytes.len()].copy_from_slice(bytes);
        let failed = on_rdb(&dir, &with_valid_crc(damaged)).start_expecting_failure();
        let log = failed.log;
        // Redis exits (with the status redis-check-rdb's verdict gives), not killed by a signal.
        assert!(
            failed.status.code().is_some(),
            "{what}: {}:\n{log}",
            failed.status
        );
        assert!(
            log.contains("ratelimit: refusing corrupt policies in RDB"),
            "{what}: no line from the module:\n{log}"
        );
        assert!(
            !log.contains("crashed by signal") && !log.contains("BUG REPORT"),
            "{what}: crashed:\n{log}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// What a rewrite without the preamble writes

/// The text of the AOF's current incremental file (the manifest's last `type i` file).
pub(super) fn current_incr(server: &Server) -> String {
    let dir = server.dir().join("appendonlydir");
    let manifest = fs::read_to_string(dir.join("appendonly.aof.manifest")).expect("the manifest");
    let file = manifest
        .lines()
        // `file NAME seq N type i`, and Redis 8 adds `startoffset N` (and `endoffset N`).
        .filter(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            words.windows(2).any(|pair| pair == ["type", "i"])
        })
        .filter_map(|line| line.split_whitespace().nth(1))
        .next_back()
        .unwrap_or_else(|| panic!("no incremental file in {manifest}"));
    String::from_utf8_lossy(&fs::read(dir.join(file)).expect("the incremental file")).into_owned()
}

/// `CONFIG SET appendonly yes` (a rewrite starts), then `BGREWRITEAOF`, on a master without the
/// RDB preamble that has a policy; each rewrite starts at once (no other child runs).
/// `after_each` is told the command, and a word of it that no definition holds.
fn switch_on_and_rewrite(master: &Server, after_each: &mut dyn FnMut(&str, &str)) {
    let idle = [
        "rdb_bgsave_in_progress",
        "aof_rewrite_in_progress",
        "aof_rewrite_scheduled",
    ];
    master.wait_persistence_idle(&idle);
    common::config_set(&mut master.client(), "appendonly", "yes").unwrap();
    master.wait_persistence_idle(&idle);
    after_each("CONFIG SET appendonly yes", "appendonly");
    rewrite_aof(master);
    after_each("BGREWRITEAOF", "bgrewriteaof");
}

/// A rewrite without the RDB preamble writes the definitions into the AOF it goes on with, and
/// only them: not the command that started the rewrite, which a restart from that AOF would run
/// (a rewrite at every start after a BGREWRITEAOF; `CONFIG SET appendonly yes` refused while
/// loading, which `propagation-error-behavior panic` turns into a crash at start).
#[test]
fn a_rewrite_without_the_preamble_writes_no_other_command_into_the_aof() {
    let master = Server::builder()
        .config(&[("aof-use-rdb-preamble", "no")])
        .start();
    define(
        &mut master.client(),
        "kept",
        &Spec::new(Algorithm::TokenBucket, 5, 1000),
        false,
    );
    switch_on_and_rewrite(&master, &mut |what, word| {
        let incr = current_incr(&master).to_ascii_lowercase();
        assert!(
            incr.contains("ratelimit.policy"),
            "{what}: no definition in the AOF:\n{incr}"
        );
        assert!(
            !incr.contains(&format!("\r\n{word}\r\n")),
            "{what} is in the AOF:\n{incr}"
        );
    });
}

/// Nor is that command sent to the replicas, which run it: a master's `CONFIG SET appendonly yes`
/// switches every replica's AOF on, its `BGREWRITEAOF` rewrites theirs.
#[test]
fn a_rewrite_without_the_preamble_sends_no_other_command_to_replicas() {
    let master = Server::builder()
        .config(&[("aof-use-rdb-preamble", "no")])
        .start();
    let replica = Server::start();
    replica.replica_of(&master);
    define(
        &mut master.client(),
        "kept",
        &Spec::new(Algorithm::TokenBucket, 5, 1000),
        false,
    );
    switch_on_and_rewrite(&master, &mut |what, _| {
        common::wait_replica_sync(&master, &replica);
        assert_eq!(list(&mut replica.client()), ["kept"], "{what}");
        let ran = replica.info("commandstats");
        for command in ["cmdstat_config|set", "cmdstat_bgrewriteaof"] {
            assert!(
                !ran.contains_key(command),
                "{what}: the replica ran {command}"
            );
        }
        let appendonly = common::config_get(&mut replica.client(), "appendonly");
        assert_eq!(appendonly, "no", "{what}: the replica's appendonly");
    });
}
