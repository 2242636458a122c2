//! The conformance vectors (`tests/vectors/v1.json`, generated from the core crate; the format
//! is in tests/vectors/README.md) replayed on a real server by three engines, each on keys of
//! its own:
//!
//! - the module: every vector (`RATELIMIT.CHECK`, `PEEK`, `TAKE`, `REFUND`, `RESET` with `AT`);
//! - the Functions library `lua-reference/functions/ratelimit.lua` (`FCALL ratelimit_*`): every
//!   timeline within its exactness bound (bucket and GCRA `C·P`, sliding-window `L·P` below
//!   2^53, docs/functions.md "Where it differs from the module"), that is all but the `largest`
//!   timelines of those four algorithms;
//! - the reference scripts `lua-reference/<algorithm>.lua` (`EVALSHA sha 1 key L P C cost t`):
//!   the timelines made only of what they implement (CHECK with any cost, PEEK with COST 0,
//!   which is a CHECK of COST 0, and RESET, which is a `DEL`), without BLOCK, within the same
//!   exactness bound.
//!
//! After every call: the reply, integer for integer; `PEXPIRETIME` of the key (the vector's
//! `expires_at_ms`, -2 when nothing is stored); and for the module and the library the key's
//! `INFO` (the vector's `info`: the stored parameters, `last`, the state in requests, a block).
//! The reference scripts keep their state in a hash of their own layout: only their replies and
//! expiries are compared.

use std::collections::BTreeMap;
use std::time::Instant;

use redis::{Cmd, Connection, Value};
use serde_json::Value as Json;

use crate::common::{send, show_value, Server};

const VECTORS: &str = include_str!("../vectors/v1.json");
const LIBRARY: &str = include_str!("../../lua-reference/functions/ratelimit.lua");
const EXACT: u128 = 1 << 53;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    Module,
    Library,
    Reference,
}

/// The timelines of the file, its version checked.
fn groups() -> Vec<Json> {
    let file: Json = serde_json::from_str(VECTORS).expect("tests/vectors/v1.json is JSON");
    assert_eq!(file["version"], 1, "tests/vectors/v1.json: version");
    file["groups"].as_array().expect("groups").clone()
}

fn u(call: &Json, field: &str) -> u64 {
    call[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {call}"))
}

fn op(call: &Json) -> &str {
    call["op"].as_str().expect("op")
}

/// `algorithm limit period [BURST c] [BLOCK d]`.
fn spec_args(call: &Json) -> Vec<String> {
    let mut args = vec![
        call["algorithm"].as_str().expect("algorithm").to_string(),
        u(call, "limit").to_string(),
        u(call, "period_ms").to_string(),
    ];
    if let Some(burst) = call["burst"].as_u64() {
        args.extend(["BURST".into(), burst.to_string()]);
    }
    if let Some(block) = call["block_ms"].as_u64() {
        args.extend(["BLOCK".into(), block.to_string()]);
    }
    args
}

/// The limits of a call are within what the Lua engines compute exactly.
fn exact_in_lua(call: &Json) -> bool {
    if op(call) == "reset" {
        return true;
    }
    let (limit, period) = (
        u128::from(u(call, "limit")),
        u128::from(u(call, "period_ms")),
    );
    let capacity = call["burst"].as_u64().map_or(limit, u128::from);
    match call["algorithm"].as_str() {
        Some("token-bucket" | "leaky-bucket" | "gcra") => capacity * period < EXACT,
        Some("sliding-window") => limit * period < EXACT,
        _ => true,
    }
}

/// What the reference scripts implement.
fn in_reference_subset(call: &Json) -> bool {
    match op(call) {
        "check" | "reset" => call["block_ms"].is_null(),
        "peek" => call["block_ms"].is_null() && u(call, "cost") == 0,
        _ => false,
    }
}

/// Whether `engine` replays `group`, all of it or nothing (a call left out would change the
/// state the next ones see).
fn replays(engine: Engine, group: &Json) -> bool {
    let calls = group["calls"].as_array().expect("calls");
    match engine {
        Engine::Module => true,
        Engine::Library => calls.iter().all(exact_in_lua),
        Engine::Reference => calls
            .iter()
            .all(|call| exact_in_lua(call) && in_reference_subset(call)),
    }
}

fn reference_file(algorithm: &str) -> String {
    format!(
        "{}/lua-reference/{}.lua",
        env!("CARGO_MANIFEST_DIR"),
        algorithm.replace('-', "_")
    )
}

/// The call as `engine` is called (`shas`: the reference scripts by algorithm).
fn command(engine: Engine, call: &Json, key: &str, shas: &BTreeMap<String, String>) -> Cmd {
    let name = op(call);
    if name == "reset" {
        return match engine {
            Engine::Module => redis::cmd("RATELIMIT.RESET").arg(key).clone(),
            Engine::Library => redis::cmd("FCALL")
                .arg("ratelimit_reset")
                .arg(1)
                .arg(key)
                .clone(),
            Engine::Reference => redis::cmd("DEL").arg(key).clone(),
        };
    }
    let amount = if name == "take" {
        ["MAX".to_string(), u(call, "max").to_string()]
    } else {
        ["COST".to_string(), u(call, "cost").to_string()]
    };
    let at = u(call, "at");
    match engine {
        Engine::Module => {
            let mut cmd = redis::cmd(&format!("RATELIMIT.{}", name.to_uppercase()));
            cmd.arg(key)
                .arg(spec_args(call))
                .arg(&amount)
                .arg("AT")
                .arg(at);
            cmd
        }
        Engine::Library => {
            let mut cmd = redis::cmd(if name == "peek" { "FCALL_RO" } else { "FCALL" });
            cmd.arg(format!("ratelimit_{name}"))
                .arg(1)
                .arg(key)
                .arg(spec_args(call))
                .arg(&amount)
                .arg("AT")
                .arg(at);
            cmd
        }
        Engine::Reference => {
            let algorithm = call["algorithm"].as_str().expect("algorithm");
            let limit = u(call, "limit");
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&shas[algorithm])
                .arg(1)
                .arg(key)
                .arg(limit)
                .arg(u(call, "period_ms"))
                .arg(call["burst"].as_u64().unwrap_or(limit))
                .arg(u(call, "cost"))
                .arg(at);
            cmd
        }
    }
}

fn info_command(engine: Engine, key: &str) -> Option<Cmd> {
    match engine {
        Engine::Module => Some(redis::cmd("RATELIMIT.INFO").arg(key).clone()),
        Engine::Library => Some(
            redis::cmd("FCALL_RO")
                .arg("ratelimit_info")
                .arg(1)
                .arg(key)
                .clone(),
        ),
        Engine::Reference => None,
    }
}

/// A reply's integers, or its text when it is not an array of integers.
fn ints(value: &Value) -> Result<Vec<i64>, String> {
    match value {
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::Int(n) => Ok(*n),
                _ => Err(show_value(value)),
            })
            .collect(),
        _ => Err(show_value(value)),
    }
}

/// An INFO reply (field/value pairs) as text by name; `None` for nil.
fn info_map(value: &Value) -> Result<Option<BTreeMap<String, String>>, String> {
    let items = match value {
        Value::Nil => return Ok(None),
        Value::Array(items) if items.len() % 2 == 0 => items,
        other => return Err(show_value(other)),
    };
    Ok(Some(
        items
            .chunks_exact(2)
            .map(|pair| (show_value(&pair[0]), show_value(&pair[1])))
            .collect(),
    ))
}

/// The vector's `info` as text by name.
fn expected_info(stored: &Json) -> Option<BTreeMap<String, String>> {
    let info = stored.get("info")?.as_object()?;
    Some(
        info.iter()
            .map(|(name, value)| {
                let text = value
                    .as_str()
                    .map_or_else(|| value.to_string(), str::to_string);
                (name.clone(), text)
            })
            .collect(),
    )
}

/// Replays one timeline on `key`: every difference, described.
fn replay(
    con: &mut Connection,
    engine: Engine,
    group: &Json,
    key: &str,
    shas: &BTreeMap<String, String>,
) -> Vec<String> {
    let calls = group["calls"].as_array().expect("calls");
    let per_call = if engine == Engine::Reference { 2 } else { 3 };
    let mut cmds = Vec::with_capacity(calls.len() * per_call);
    for call in calls {
        cmds.push(command(engine, call, key, shas));
        cmds.push(redis::cmd("PEXPIRETIME").arg(key).clone());
        cmds.extend(info_command(engine, key));
    }
    let values = send(con, &cmds);
    let mut problems = Vec::new();
    for (i, (call, got)) in calls.iter().zip(values.chunks_exact(per_call)).enumerate() {
        let at = format!("{} call {i} ({call})", group["name"]);
        let reply_ok = match (&call["reply"], &got[0]) {
            (Json::Number(n), Value::Int(count)) => n.as_i64() == Some(*count),
            (Json::Array(want), value) => {
                let want: Vec<i64> = want.iter().filter_map(Json::as_i64).collect();
                ints(value).is_ok_and(|have| have == want)
            }
            _ => false,
        };
        if !reply_ok {
            problems.push(format!(
                "{at}: replied {}, the core {}",
                show_value(&got[0]),
                call["reply"]
            ));
        }
        let stored = &call["stored"];
        let expiry = stored["expires_at_ms"].as_i64().unwrap_or(-2);
        if got[1] != Value::Int(expiry) {
            problems.push(format!(
                "{at}: PEXPIRETIME {}, the core {expiry}",
                show_value(&got[1])
            ));
        }
        if per_call == 3 {
            match info_map(&got[2]) {
                Ok(info) if info == expected_info(stored) => {}
                Ok(info) => problems.push(format!(
                    "{at}: INFO {info:?}, the core {:?}",
                    expected_info(stored)
                )),
                Err(text) => problems.push(format!("{at}: INFO replied {text}")),
            }
        }
    }
    problems
}

/// Replays every timeline `engine` implements, on a server of its own: the vectors replayed.
fn replay_all(engine: Engine) -> usize {
    let started = Instant::now();
    let server = Server::start();
    let mut con = server.client();
    let mut shas = BTreeMap::new();
    match engine {
        Engine::Module => {}
        Engine::Library => {
            let name: String = redis::cmd("FUNCTION")
                .arg("LOAD")
                .arg("REPLACE")
                .arg(LIBRARY)
                .query(&mut con)
                .expect("FUNCTION LOAD of lua-reference/functions/ratelimit.lua");
            assert_eq!(name, "ratelimit");
        }
        Engine::Reference => {
            for algorithm in [
                "token-bucket",
                "leaky-bucket",
                "fixed-window",
                "sliding-window",
                "sliding-log",
                "gcra",
            ] {
                let path = reference_file(algorithm);
                let script =
                    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
                let sha: String = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(script)
                    .query(&mut con)
                    .unwrap_or_else(|e| panic!("SCRIPT LOAD {path}: {e}"));
                shas.insert(algorithm.to_string(), sha);
            }
        }
    }
    let (mut replayed, mut timelines, mut problems) = (0, 0, Vec::new());
    for group in groups().iter().filter(|group| replays(engine, group)) {
        let key = format!("{engine:?}:{}", group["key"].as_str().expect("key"));
        problems.extend(replay(&mut con, engine, group, &key, &shas));
        replayed += group["calls"].as_array().expect("calls").len();
        timelines += 1;
    }
    println!(
        "{engine:?}: {replayed} vectors in {timelines} timelines replayed in {:.2?}",
        started.elapsed()
    );
    assert!(
        problems.is_empty(),
        "{engine:?} differs from the core's vectors in {} places (regenerate with `cargo run -p \
         redis-ratelimit-core --example vectors > tests/vectors/v1.json` only if the core is \
         right):\n{}",
        problems.len(),
        problems
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    replayed
}

#[test]
fn module_replays_every_vector() {
    let total: usize = groups()
        .iter()
        .map(|group| group["calls"].as_array().expect("calls").len())
        .sum();
    assert_eq!(replay_all(Engine::Module), total);
}

#[test]
fn functions_library_replays_every_vector_within_its_bounds() {
    // All but the 10^12 × 3650 days timelines of the buckets, GCRA and the sliding window.
    assert!(replay_all(Engine::Library) >= 1000);
}

#[test]
fn reference_scripts_replay_the_checks() {
    // The CHECK-only timelines of every algorithm, and the CHECKs near 2^53.
    assert!(replay_all(Engine::Reference) >= 250);
}
