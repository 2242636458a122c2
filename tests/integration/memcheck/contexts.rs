//! Under memcheck: the contexts a command runs in. MULTI/EXEC, Lua, the module config, INFO, OOM
//! refusals, AOF rewrite without RDB preamble (aof_rewrite) and its replay (APPLY), restart, and a
//! replica (full sync through rdb_save/rdb_load, then APPLY and verbatim RESET).

use redis::Value;
use redis_ratelimit_core::algorithms::Algorithm;

use super::{assert_alive, assert_info, burst, checkall_decision, eval, populate};
use crate::common::{
    cmd_line, digests, exists, future_base_ms, is_error, run, run_error, send, six,
    wait_replica_sync, Server,
};

#[test]
fn transactions_scripts_configs_and_oom() {
    let server = Server::builder()
        .module_args(&["max-log-limit", "5000"])
        .config(&[("notify-keyspace-events", "KEA")])
        .start();
    let mut con = server.client();
    let replies = send(
        &mut con,
        &[
            cmd_line("MULTI"),
            cmd_line("RATELIMIT.CHECK m token-bucket 3 1h"),
            cmd_line("RATELIMIT.CHECKALL 2 m n token-bucket 3 1h sliding-log 3 1h"),
            cmd_line("RATELIMIT.PEEK m token-bucket 3 1h"),
            cmd_line("RATELIMIT.CHECK m fixed-window 3 1h"),
            cmd_line("RATELIMIT.INFO n"),
            cmd_line("RATELIMIT.RESET m"),
            cmd_line("EXEC"),
        ],
    );
    assert!(
        matches!(replies.last(), Some(Value::Array(_))),
        "{replies:?}"
    );
    for (command, script, keys) in [
        (
            "EVAL",
            "return redis.call('RATELIMIT.CHECK', KEYS[1], 'sliding-window', ARGV[1], '1h')",
            &["l"][..],
        ),
        (
            "EVAL",
            "return redis.call('RATELIMIT.CHECKALL', 2, KEYS[1], KEYS[2], 'leaky-bucket', 3, \
             '1h', 'sliding-log', ARGV[1], '1h')",
            &["l2", "l3"],
        ),
        (
            "EVAL",
            "return redis.call('RATELIMIT.PEEK', KEYS[1], 'sliding-window', 3, '1h')",
            &["l"],
        ),
        (
            "EVAL",
            "return redis.call('RATELIMIT.INFO', KEYS[1])",
            &["l"],
        ),
        (
            "EVAL",
            "return redis.pcall('RATELIMIT.CHECK', KEYS[1], 'gcra', 3, '1h')",
            &["l"],
        ),
        (
            "EVAL",
            "return redis.pcall('RATELIMIT.CHECK', KEYS[1], 'fixed-window', 3, '1h')",
            &["l"],
        ),
        (
            "EVAL_RO",
            "return redis.call('RATELIMIT.PEEK', KEYS[1], 'sliding-window', 3, '1h')",
            &["l"],
        ),
        (
            "EVAL_RO",
            "return redis.pcall('RATELIMIT.CHECK', KEYS[1], 'sliding-window', 3, '1h')",
            &["l"],
        ),
        (
            "EVAL",
            "return redis.call('RATELIMIT.RESET', KEYS[1], KEYS[2], KEYS[1])",
            &["l", "l2"],
        ),
    ] {
        let _ = eval(&mut con, command, script, keys, &["3"]);
    }
    // The module config: valid, invalid and its effect.
    for text in [
        "CONFIG GET ratelimit.*",
        "CONFIG SET ratelimit.max-log-limit 3",
        "CONFIG GET ratelimit.max-log-limit",
    ] {
        let reply = run(&mut con, text);
        assert!(!is_error(&reply), "{text}: {reply:?}");
    }
    for text in [
        "CONFIG SET ratelimit.max-log-limit 0",
        "CONFIG SET ratelimit.max-log-limit x",
        "CONFIG SET ratelimit.max-log-limit 10000001",
        "CONFIG SET ratelimit.max-log-limit -1",
        "RATELIMIT.CHECK big sliding-log 4 1h",
    ] {
        run_error(&mut con, text);
    }
    six(&mut con, "RATELIMIT.CHECK big sliding-log 3 1h");
    let _ = run(&mut con, "CONFIG SET ratelimit.max-log-limit 100000");
    for section in [
        "ratelimit",
        "modules",
        "everything",
        "keyspace",
        "commandstats",
    ] {
        let info: String = redis::cmd("INFO").arg(section).query(&mut con).unwrap();
        assert!(!info.is_empty());
    }
    let _ = run(&mut con, "MODULE LIST");
    let _ = run(&mut con, "CONFIG REWRITE");
    // Out of memory: every writing command is refused; reads and RESET still work.
    let _ = run(&mut con, "CONFIG SET maxmemory 1");
    for text in [
        "RATELIMIT.CHECK oom token-bucket 3 1h",
        "RATELIMIT.CHECKALL 1 oom token-bucket 3 1h",
        "RATELIMIT.APPLY oom x",
    ] {
        run_error(&mut con, text);
    }
    let _ = run(&mut con, "RATELIMIT.PEEK oom token-bucket 3 1h");
    let _ = run(&mut con, "RATELIMIT.RESET big big");
    let _ = run(&mut con, "CONFIG SET maxmemory 0");
    six(&mut con, "RATELIMIT.CHECK oom token-bucket 3 1h");
    assert_alive(&server);
}

// ---------------------------------------------------------------------------------------------
// Persistence and replication

/// `INFO persistence` fields that are 0 once no AOF rewrite runs or waits.
const REWRITING: [&str; 2] = ["aof_rewrite_in_progress", "aof_rewrite_scheduled"];

#[test]
fn aof_rewrite_replay_and_restart_keep_every_limiter() {
    let mut server = Server::builder()
        .config(&[("appendonly", "yes"), ("aof-use-rdb-preamble", "no")])
        .start();
    let mut con = server.client();
    let base = future_base_ms();
    server.wait_persistence_idle(&REWRITING);
    let mut keys = populate(&mut con, "p", base);
    // The rewrite calls aof_rewrite in a forked child; writes after it are APPLY lines.
    let reply = run(&mut con, "BGREWRITEAOF");
    assert!(!is_error(&reply), "BGREWRITEAOF: {reply:?}");
    server.wait_persistence_idle(&REWRITING);
    keys.extend(populate(&mut con, "p2", base + 1000));
    let _ = run(
        &mut con,
        &format!("RATELIMIT.RESET {} {}", keys[0], keys[0]),
    );
    keys.remove(0);
    let before = digests(&mut con, &keys);
    let reply = run(&mut con, "DEBUG LOADAOF");
    assert!(!is_error(&reply), "DEBUG LOADAOF: {reply:?}");
    assert_eq!(digests(&mut con, &keys), before, "replayed from the AOF");
    // With the RDB preamble: rdb_save in the rewrite child, rdb_load at restart.
    let _ = run(&mut con, "CONFIG SET aof-use-rdb-preamble yes");
    let _ = run(&mut con, "BGREWRITEAOF");
    server.wait_persistence_idle(&REWRITING);
    let _ = run(&mut con, "BGSAVE");
    server.wait_persistence_idle(&["rdb_bgsave_in_progress"]);
    server.restart();
    let mut con = server.client();
    assert_eq!(digests(&mut con, &keys), before, "after a restart");
    assert_alive(&server);
}

#[test]
fn a_replica_holds_the_masters_limiters() {
    let master = Server::start();
    let replica = Server::start();
    let mut con = master.client();
    let base = future_base_ms();
    // Keys that exist before the replica attaches go through the full sync (rdb_save in the
    // master's fork, rdb_load on the replica); later writes as RATELIMIT.APPLY.
    let mut keys = populate(&mut con, "before", base);
    replica.replica_of(&master);
    keys.extend(populate(&mut con, "after", base + 1000));
    let text = format!(
        "RATELIMIT.CHECKALL 3 after:token-bucket after:sliding-log all:new token-bucket 10 1h \
         BURST 5 sliding-log 10 1h fixed-window 3 1s AT {}",
        base + 2000
    );
    checkall_decision(&run(&mut con, &text), 3);
    keys.push("all:new".into());
    // RESET is replicated verbatim, repeated keys included.
    six(&mut con, "RATELIMIT.CHECK gone token-bucket 3 1h");
    let _ = run(
        &mut con,
        "RATELIMIT.RESET gone gone before:sliding-log gone",
    );
    keys.retain(|k| k != "before:sliding-log");
    wait_replica_sync(&master, &replica);
    let mut rcon = replica.client();
    assert_eq!(
        digests(&mut rcon, &keys),
        digests(&mut con, &keys),
        "the replica's limiters"
    );
    assert!(!exists(&mut rcon, "gone"));
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        six(
            &mut rcon,
            &format!(
                "RATELIMIT.PEEK after:{algorithm} {algorithm} 10 1h{}",
                burst(algorithm)
            ),
        );
        assert_info(&mut rcon, &format!("after:{algorithm}"));
    }
    // A replica refuses writes.
    run_error(&mut rcon, "RATELIMIT.CHECK x token-bucket 3 1h");
    assert_alive(&replica);
    assert_alive(&master);
}
