//! The two engines on one server and calls to them: the library as `make functions` loads it,
//! `RATELIMIT.X key args` and its `FCALL ratelimit_x 1 key args`, and the module's error texts
//! as the library words them.

use std::collections::HashMap;
use std::sync::OnceLock;

use redis::{Cmd, Connection, Value};
use redis_ratelimit_core::algorithms::Algorithm;

use crate::common::rng::seed_from_env;
use crate::common::{error_text, send, show_value, Server, ServerBuilder};

/// The library, as `make functions` loads it.
pub const LIBRARY: &str = include_str!("../../../lua-reference/functions/ratelimit.lua");

const DEFAULT_SEED: u64 = 0xF0_0C71_0275;
const DEFAULT_CALLS: usize = 4000;

/// `$FUNCTIONS_SEED`, else [`DEFAULT_SEED`] (printed once).
pub fn seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| seed_from_env("FUNCTIONS_SEED", || DEFAULT_SEED))
}

/// `$FUNCTIONS_CALLS`, else [`DEFAULT_CALLS`]: the calls per algorithm of the equivalence run.
pub fn calls_per_algorithm() -> usize {
    std::env::var("FUNCTIONS_CALLS").map_or(DEFAULT_CALLS, |text| {
        text.trim()
            .parse()
            .unwrap_or_else(|e| panic!("FUNCTIONS_CALLS={text:?}: {e}"))
    })
}

/// The algorithms the library implements: all the module's.
pub fn algorithms() -> Vec<Algorithm> {
    Algorithm::ALL.to_vec()
}

/// `FUNCTION LOAD REPLACE` of the library.
pub fn load_library(con: &mut Connection) {
    let name: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(LIBRARY)
        .query(con)
        .expect("FUNCTION LOAD of lua-reference/functions/ratelimit.lua");
    assert_eq!(name, "ratelimit");
}

/// A server with the module and the library.
pub fn both_engines() -> (Server, Connection) {
    library_on(Server::builder())
}

/// A server with the library only.
pub fn library_only(builder: ServerBuilder) -> (Server, Connection) {
    library_on(builder.no_module())
}

fn library_on(builder: ServerBuilder) -> (Server, Connection) {
    let server = builder.start();
    let mut con = server.client();
    load_library(&mut con);
    (server, con)
}

/// The library's call for a module command: `RATELIMIT.X key args` is
/// `FCALL ratelimit_x 1 key args` (`FCALL_RO` for the read-only peek and info).
pub fn fcall(function: &str, keys: &[&str], args: &[String]) -> Cmd {
    let mut cmd = redis::cmd(if function == "peek" || function == "info" {
        "FCALL_RO"
    } else {
        "FCALL"
    });
    cmd.arg(format!("ratelimit_{function}"))
        .arg(keys.len())
        .arg(keys)
        .arg(args);
    cmd
}

/// The module's command: `RATELIMIT.X keys args` (CHECKALL with its key count).
pub fn native(command: &str, keys: &[&str], args: &[String]) -> Cmd {
    let mut cmd = redis::cmd(&format!("RATELIMIT.{}", command.to_uppercase()));
    if command == "checkall" {
        cmd.arg(keys.len());
    }
    cmd.arg(keys).arg(args);
    cmd
}

/// `RATELIMIT.INFO nkey` and `FCALL_RO ratelimit_info 1 fkey`: (module, library).
pub fn both_infos(con: &mut Connection, nkey: &str, fkey: &str) -> (Value, Value) {
    let mut replies = send(
        con,
        &[native("info", &[nkey], &[]), fcall("info", &[fkey], &[])],
    );
    let library = replies.pop().expect("two replies");
    (replies.pop().expect("two replies"), library)
}

/// Equal INFO replies, but for the fields the library cannot always answer exactly: gcra's
/// `tat` and a block's `blocked_until_ms` (ms since the epoch) at or beyond 2^53, reachable only
/// with `AT` near 2^53, are Lua doubles there, at most 1 ms off (docs/functions.md, "Where it
/// differs from the module").
pub fn same_info(module: &Value, library: &Value) -> bool {
    let (Value::Array(m), Value::Array(l)) = (module, library) else {
        return module == library;
    };
    let is_tat = |name: &Value| match name {
        Value::SimpleString(text) => text == "tat" || text == "blocked_until_ms",
        Value::BulkString(bytes) => bytes == b"tat" || bytes == b"blocked_until_ms",
        _ => false,
    };
    m.len() == l.len()
        && m.iter().zip(l).enumerate().all(|(i, pair)| match pair {
            (a, b) if a == b => true,
            (Value::Int(a), Value::Int(b)) => {
                i > 0 && is_tat(&m[i - 1]) && *a >= super::EXACT as i64 && (a - b).abs() <= 1
            }
            _ => false,
        })
}

/// The module's error text as the library words it: the function's name where the module names
/// its command.
pub fn as_library_error(module: &str) -> String {
    let mut text = module
        .replace("RATELIMIT.RESET it", "ratelimit_reset it")
        .replace("RATELIMIT.REFUND needs", "ratelimit_refund needs")
        .replace("RATELIMIT.TAKE needs", "ratelimit_take needs")
        .replace(
            "use RATELIMIT.ACQUIRE and RATELIMIT.RELEASE",
            "use ratelimit_acquire and ratelimit_release",
        )
        .replace("(RATELIMIT.RELEASE)", "(ratelimit_release)");
    for command in [
        "check", "peek", "checkall", "refund", "reset", "info", "acquire", "release", "take",
    ] {
        text = text.replace(
            &format!("'ratelimit.{command}'"),
            &format!("'ratelimit_{command}'"),
        );
    }
    text
}

/// Equal replies: equal values, or errors whose texts agree once the names are mapped.
pub fn same_reply(module: &Value, library: &Value) -> bool {
    match (error_text(module), error_text(library)) {
        (Some(m), Some(l)) => as_library_error(&m) == l,
        (None, None) => module == library,
        _ => false,
    }
}

/// The module's error for `module` and the library's for `library`, sent together: the library
/// must answer the module's text ([`as_library_error`]). Panics, naming `what`, otherwise (also
/// when the module does not refuse).
pub fn assert_same_error(con: &mut Connection, module: Cmd, library: Cmd, what: &str) {
    let replies = send(con, &[module, library]);
    let module = error_text(&replies[0])
        .unwrap_or_else(|| panic!("{what}: the module answered {}", show_value(&replies[0])));
    assert_eq!(
        error_text(&replies[1]),
        Some(as_library_error(&module)),
        "{what}"
    );
}

/// The words of `line` (split on spaces), as command arguments.
pub fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_string).collect()
}

/// Every key's value (`GET`: the library's keys are strings) and absolute expiry.
pub fn keyspace(con: &mut Connection) -> HashMap<Vec<u8>, (Value, Value)> {
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(con).unwrap();
    let mut cmds = Vec::new();
    for key in &keys {
        cmds.push(redis::cmd("GET").arg(key).clone());
        cmds.push(redis::cmd("PEXPIRETIME").arg(key).clone());
    }
    let values = send(con, &cmds);
    keys.into_iter()
        .zip(values.chunks_exact(2))
        .map(|(key, pair)| (key, (pair[0].clone(), pair[1].clone())))
        .collect()
}
