//! Memory-safety suite: every command and every data-type callback of the module, a few calls
//! each, for `make memcheck`. tests/memcheck.sh runs this file with the servers under valgrind
//! memcheck (`RATELIMIT_SERVER_WRAPPER`, see testkit/) and fails on any invalid access or use
//! of uninitialised memory with a frame in the module. Without a wrapper it is a quick smoke test
//! of `cargo test --profile tests`.
//!
//! Few calls, many paths: valgrind runs the server 30-50x slower, so each path gets a handful of
//! calls, not thousands. The assertions are about shape only (a decision is six integers, an
//! error is an error, a round trip keeps the digest, the server keeps answering); exact values are
//! the business of the other suites. Where the right answer is still being decided (a key named
//! twice in CHECKALL or RESET) nothing is asserted but that the server survives.
//!
//! Covered: CHECK and PEEK on all six algorithms (BURST, COST 0, AT, rejections, parameter
//! changes, time going backwards, a sliding log of many runs), every argument error once, binary
//! and huge arguments, WRONGTYPE, algorithm mismatch, RESP3 replies, CHECKALL (rejections, errors,
//! repeated keys, COMMAND GETKEYS), RESET (repeated and missing keys), INFO, APPLY (valid, crafted
//! and corrupt payloads), DUMP/RESTORE round trips and ~440 corrupt payloads with a valid CRC
//! (bit flips, random bytes, fields at extremes, truncations, extensions, broken framing: most
//! reach the module's rdb_load, the same limiters as APPLY payloads its other decoder), COPY,
//! RENAME, MOVE, SWAPDB, MEMORY USAGE, DEBUG DIGEST(-VALUE), DEBUG RELOAD, expiry, FLUSHALL,
//! MULTI/EXEC, Lua, the module config, INFO, OOM refusals, AOF rewrite without RDB preamble
//! (aof_rewrite) and its replay (APPLY), restart, and a replica (full sync through
//! rdb_save/rdb_load, then APPLY and verbatim RESET).
//!
//! The tests are grouped by what they exercise: the commands (tests/integration/memcheck/commands.rs), the data
//! type (tests/integration/memcheck/data_type.rs) and the contexts a command runs in
//! (tests/integration/memcheck/contexts.rs); all run as `cargo test --profile tests --test integration -- memcheck::`.

use crate::common;

mod commands;
mod contexts;
mod data_type;

use common::{is_bucket, reply6, run, send_one, six, Server};
use redis::{Connection, Value};
use redis_ratelimit_core::algorithms::Algorithm;

const HOUR_MS: u64 = 3_600_000;

// ---------------------------------------------------------------------------------------------
// Helpers shared by the groups

/// The server answers PING on a new connection (it did not crash or hang).
fn assert_alive(server: &Server) {
    let pong: String = redis::cmd("PING")
        .query(&mut server.client())
        .unwrap_or_else(|e| panic!("the server stopped answering: {e}\n{}", server.log_tail(30)));
    assert_eq!(pong, "PONG");
}

/// A CHECKALL decision (RESP2): the overall decision, then one per key, six integers each.
fn checkall_decision(value: &Value, numkeys: usize) {
    match value {
        Value::Array(items) if items.len() == numkeys + 1 => items.iter().for_each(|d| {
            reply6(d);
        }),
        other => panic!("not a CHECKALL reply for {numkeys} keys: {other:?}"),
    }
}

/// `EVAL`/`EVAL_RO script numkeys keys... args...`; the reply, errors included.
fn eval(con: &mut Connection, command: &str, script: &str, keys: &[&str], args: &[&str]) -> Value {
    let mut cmd = redis::cmd(command);
    cmd.arg(script).arg(keys.len()).arg(keys).arg(args);
    send_one(con, &cmd)
}

/// RATELIMIT.INFO of an existing limiter: a non-empty array (RESP2).
fn assert_info(con: &mut Connection, key: &str) {
    match run(con, &format!("RATELIMIT.INFO {key}")) {
        Value::Array(items) if !items.is_empty() => {}
        other => panic!("RATELIMIT.INFO {key}: {other:?}"),
    }
}

/// `BURST 5` for buckets, nothing for windows.
fn burst(algorithm: &str) -> &'static str {
    if is_bucket(algorithm) {
        " BURST 5"
    } else {
        ""
    }
}

/// A few CHECKs per algorithm on `prefix:<algorithm>` at `base`: returns the keys.
fn populate(con: &mut Connection, prefix: &str, base: u64) -> Vec<String> {
    let mut keys = Vec::new();
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        let key = format!("{prefix}:{algorithm}");
        let b = burst(algorithm);
        for (i, cost) in [1, 2, 1].into_iter().enumerate() {
            let at = base + 7 * i as u64;
            six(
                con,
                &format!("RATELIMIT.CHECK {key} {algorithm} 10 1h{b} COST {cost} AT {at}"),
            );
        }
        keys.push(key);
    }
    keys
}
