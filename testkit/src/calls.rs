//! Calls to a server and their replies: limits as CHECK names them, commands from text, pipelines
//! that keep error replies in place, and readers for the replies the tests look at.

use std::collections::BTreeMap;

use redis::{Cmd, Connection, ConnectionLike, RedisResult, Value};

use super::server::{wait_replica_sync, Server};

/// The algorithms that take `BURST` (the buckets and gcra).
pub fn is_bucket(algorithm: &str) -> bool {
    algorithm.ends_with("bucket") || algorithm == "gcra"
}

/// One limit as CHECK names it.
#[derive(Clone, Debug)]
pub struct Limit {
    pub algorithm: &'static str,
    pub limit: u64,
    pub period: String,
    pub burst: Option<u64>,
    /// `BLOCK duration`, as given.
    pub block: Option<String>,
}

impl Limit {
    pub fn new(algorithm: &'static str, limit: u64, period: &str, burst: Option<u64>) -> Limit {
        Limit {
            algorithm,
            limit,
            period: period.to_string(),
            burst: burst.filter(|_| is_bucket(algorithm)),
            block: None,
        }
    }

    /// The same limit with `BLOCK duration`.
    pub fn with_block(mut self, duration: &str) -> Limit {
        self.block = Some(duration.to_string());
        self
    }

    /// The most that can be admitted at one instant: the capacity of a bucket, else the limit.
    pub fn capacity(&self) -> u64 {
        self.burst.unwrap_or(self.limit)
    }

    pub fn command(&self, name: &str, key: &str, cost: u64, at_ms: Option<u64>) -> Cmd {
        let mut cmd = redis::cmd(name);
        cmd.arg(key)
            .arg(self.algorithm)
            .arg(self.limit)
            .arg(&self.period);
        if let Some(burst) = self.burst {
            cmd.arg("BURST").arg(burst);
        }
        if let Some(block) = &self.block {
            cmd.arg("BLOCK").arg(block);
        }
        cmd.arg("COST").arg(cost);
        if let Some(at) = at_ms {
            cmd.arg("AT").arg(at);
        }
        cmd
    }

    pub fn check(&self, key: &str, cost: u64, at_ms: Option<u64>) -> Cmd {
        self.command("RATELIMIT.CHECK", key, cost, at_ms)
    }

    pub fn peek(&self, key: &str, cost: u64, at_ms: Option<u64>) -> Cmd {
        self.command("RATELIMIT.PEEK", key, cost, at_ms)
    }
}

/// `RATELIMIT.CHECK key args...` (`args` after the key), error replies as `Err`.
pub fn check(con: &mut Connection, key: &str, args: &[&str]) -> RedisResult<Vec<i64>> {
    redis::cmd("RATELIMIT.CHECK").arg(key).arg(args).query(con)
}

/// `RATELIMIT.PEEK key args...`, error replies as `Err`.
pub fn peek(con: &mut Connection, key: &str, args: &[&str]) -> RedisResult<Vec<i64>> {
    redis::cmd("RATELIMIT.PEEK").arg(key).arg(args).query(con)
}

/// Asserts `result` is an error whose code is `code`, and returns its text.
pub fn expect_error<T: std::fmt::Debug>(result: RedisResult<T>, code: &str, what: &str) -> String {
    match result {
        Ok(value) => panic!("{what}: expected a {code} error, got {value:?}"),
        Err(e) => {
            assert_eq!(e.code(), Some(code), "{what}: {e}");
            e.to_string()
        }
    }
}

/// `CONFIG GET name`: its one value.
pub fn config_get(con: &mut Connection, name: &str) -> String {
    let pairs: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query(con)
        .unwrap_or_else(|e| panic!("CONFIG GET {name}: {e}"));
    assert_eq!(pairs.len(), 2, "CONFIG GET {name}: {pairs:?}");
    pairs[1].clone()
}

pub fn config_set(con: &mut Connection, name: &str, value: &str) -> RedisResult<()> {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(con)
}

/// A command from a line of text, split on whitespace (no argument contains any):
/// `cmd_line("RATELIMIT.CHECK k token-bucket 3 1s")`.
pub fn cmd_line(text: &str) -> Cmd {
    let mut words = text.split_whitespace();
    let mut cmd = redis::cmd(words.next().expect("a command name"));
    for word in words {
        cmd.arg(word);
    }
    cmd
}

/// A command as text, for failure messages (binary arguments shown lossily).
pub fn show_cmd(cmd: &Cmd) -> String {
    cmd.args_iter()
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            redis::Arg::Cursor => "<cursor>".to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A reply as redis-cli would show it, for failure messages.
pub fn show_value(value: &Value) -> String {
    match value {
        Value::Int(n) => n.to_string(),
        Value::Nil => "nil".into(),
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Okay => "OK".into(),
        Value::ServerError(e) => format!("(error) {} {}", e.code(), e.details().unwrap_or("")),
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(show_value).collect();
            format!("[{}]", parts.join(", "))
        }
        other => format!("{other:?}"),
    }
}

/// Sends `cmds` in one pipeline and returns every reply, error replies included (as
/// `Value::ServerError`), in order.
pub fn send(con: &mut Connection, cmds: &[Cmd]) -> Vec<Value> {
    let mut packed = Vec::new();
    for cmd in cmds {
        cmd.write_packed_command(&mut packed);
    }
    con.req_packed_commands(&packed, 0, cmds.len())
        .expect("the connection works")
}

/// One command's reply, an error reply included (as `Value::ServerError`).
pub fn send_one(con: &mut Connection, cmd: &Cmd) -> Value {
    send(con, std::slice::from_ref(cmd)).remove(0)
}

/// The reply to a line of text ([`cmd_line`]), an error reply included.
pub fn run(con: &mut Connection, text: &str) -> Value {
    send_one(con, &cmd_line(text))
}

/// The reply to a line of text, which must not be an error.
pub fn run_ok(con: &mut Connection, text: &str) -> Value {
    let value = run(con, text);
    if let Some(error) = error_text(&value) {
        panic!("{text}: {error}");
    }
    value
}

pub fn is_error(value: &Value) -> bool {
    matches!(value, Value::ServerError(_))
}

/// An error reply as `CODE detail`; `None` for any other reply.
pub fn error_text(value: &Value) -> Option<String> {
    match value {
        Value::ServerError(error) => Some(format!(
            "{} {}",
            error.code(),
            error.details().unwrap_or_default()
        )),
        _ => None,
    }
}

/// The error `cmd` must be answered with, as `CODE detail`; panics on any other reply.
pub fn cmd_error(con: &mut Connection, cmd: &Cmd) -> String {
    let value = send_one(con, cmd);
    error_text(&value)
        .unwrap_or_else(|| panic!("{}: expected an error, got {value:?}", show_cmd(cmd)))
}

/// [`cmd_error`] of a line of text.
pub fn run_error(con: &mut Connection, text: &str) -> String {
    cmd_error(con, &cmd_line(text))
}

/// A CHECK/PEEK reply (RESP2) as its six integers; panics on anything else.
pub fn reply6(value: &Value) -> [i64; 6] {
    let Value::Array(items) = value else {
        panic!("not a six-integer reply: {value:?}");
    };
    let ints: Vec<i64> = items
        .iter()
        .map(|item| match item {
            Value::Int(n) => *n,
            other => panic!("not an integer in a CHECK reply: {other:?} in {value:?}"),
        })
        .collect();
    ints.try_into()
        .unwrap_or_else(|_| panic!("not six fields: {value:?}"))
}

/// A CHECK/PEEK reply (RESP2) as its six integers; `None` for any other reply (an error, nil, a
/// CHECKALL reply...).
pub fn try_reply6(value: &Value) -> Option<[i64; 6]> {
    match value {
        Value::Array(items)
            if items.len() == 6 && items.iter().all(|item| matches!(item, Value::Int(_))) =>
        {
            Some(reply6(value))
        }
        _ => None,
    }
}

/// The six integers a CHECK or PEEK answers; panics, naming the command, on an error reply.
pub fn decision(con: &mut Connection, cmd: &Cmd) -> [i64; 6] {
    let value = send_one(con, cmd);
    if let Some(error) = error_text(&value) {
        panic!("{}: {error}", show_cmd(cmd));
    }
    reply6(&value)
}

/// [`decision`] of a line of text: `six(&mut con, "RATELIMIT.CHECK k token-bucket 3 1s")`.
pub fn six(con: &mut Connection, text: &str) -> [i64; 6] {
    decision(con, &cmd_line(text))
}

/// An integer reply; panics on anything else.
pub fn int(con: &mut Connection, cmd: &Cmd) -> i64 {
    match send_one(con, cmd) {
        Value::Int(n) => n,
        other => panic!("{}: not an integer: {other:?}", show_cmd(cmd)),
    }
}

pub fn dbsize(con: &mut Connection) -> i64 {
    int(con, &redis::cmd("DBSIZE"))
}

pub fn exists(con: &mut Connection, key: &str) -> bool {
    int(con, redis::cmd("EXISTS").arg(key)) == 1
}

pub fn pexpiretime(con: &mut Connection, key: &str) -> i64 {
    int(con, redis::cmd("PEXPIRETIME").arg(key))
}

/// `DEBUG DIGEST-VALUE key...`, one digest per key.
pub fn digests(con: &mut Connection, keys: &[String]) -> Vec<String> {
    redis::cmd("DEBUG")
        .arg("DIGEST-VALUE")
        .arg(keys)
        .query(con)
        .expect("DEBUG DIGEST-VALUE")
}

/// `DEBUG DIGEST-VALUE key`.
pub fn digest(con: &mut Connection, key: &str) -> String {
    digests(con, &[key.to_string()]).remove(0)
}

/// What keys hold, byte for byte: each one's DUMP payload (`None` if missing) and absolute expiry.
pub type Snapshot = Vec<(Option<Vec<u8>>, i64)>;

pub fn snapshot(con: &mut Connection, keys: &[String]) -> Snapshot {
    let mut pipe = redis::pipe();
    for key in keys {
        pipe.cmd("DUMP").arg(key).cmd("PEXPIRETIME").arg(key);
    }
    let flat: Vec<Value> = pipe.query(con).expect("DUMP/PEXPIRETIME");
    flat.chunks(2)
        .map(|pair| {
            let dump: Option<Vec<u8>> = redis::from_redis_value(&pair[0]).expect("DUMP payload");
            let expiry: i64 = redis::from_redis_value(&pair[1]).expect("PEXPIRETIME");
            (dump, expiry)
        })
        .collect()
}

/// A `RATELIMIT.INFO` reply (RESP2) as field -> value; `None` for nil (a missing key).
pub fn info_fields(value: &Value) -> Option<BTreeMap<String, Value>> {
    match value {
        Value::Nil => None,
        Value::Array(items) => Some(
            items
                .chunks(2)
                .map(|pair| {
                    let name = match &pair[0] {
                        Value::SimpleString(s) => s.clone(),
                        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                        other => panic!("field name {other:?}"),
                    };
                    (name, pair[1].clone())
                })
                .collect(),
        ),
        other => panic!("not a RATELIMIT.INFO reply: {other:?}"),
    }
}

/// `RATELIMIT.INFO key` as field -> value (`None` for a missing key).
pub fn limiter_info(con: &mut Connection, key: &str) -> Option<BTreeMap<String, Value>> {
    info_fields(&send_one(con, redis::cmd("RATELIMIT.INFO").arg(key)))
}

/// An integer field of [`limiter_info`]; panics if it is missing or not an integer.
pub fn info_int(info: &BTreeMap<String, Value>, field: &str) -> i64 {
    match info.get(field) {
        Some(Value::Int(n)) => *n,
        other => panic!("INFO field {field}: {other:?}"),
    }
}

/// Every key's digest, expiry and RATELIMIT.INFO on `replica` equal `master`'s, and so do the key
/// counts.
pub fn assert_replica_matches(master: &Server, replica: &Server, keys: &[String]) {
    wait_replica_sync(master, replica);
    let (mut m, mut r) = (master.client(), replica.client());
    for key in keys {
        assert_eq!(
            digest(&mut m, key),
            digest(&mut r, key),
            "{key}: replica digest differs"
        );
        assert_eq!(
            pexpiretime(&mut m, key),
            pexpiretime(&mut r, key),
            "{key}: expiry"
        );
        assert_eq!(
            limiter_info(&mut m, key),
            limiter_info(&mut r, key),
            "{key}: RATELIMIT.INFO"
        );
    }
    assert_eq!(dbsize(&mut m), dbsize(&mut r));
}
