//! What the crate's tests share: servers from the workspace's test kit (free loopback ports,
//! killed on Drop), async connections to them, and the raw replies of twin keys.
#![allow(dead_code)]

pub mod twin;

use std::path::PathBuf;

use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::Value;
pub use redis_ratelimit_testkit::{skip, Server};

/// Whether the module library can be loaded: `$RATELIMIT_MODULE`, else the workspace's
/// release or debug build (what the kit's `module_path` looks for); else the test skips.
pub fn module_available() -> bool {
    if let Some(path) = std::env::var_os("RATELIMIT_MODULE") {
        return PathBuf::from(path).is_file();
    }
    let root = redis_ratelimit_testkit::repo_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    ["release", "debug"]
        .iter()
        .any(|p| target.join(p).join("libredis_ratelimit.so").is_file())
}

/// A server with the module, or `None` (the test is recorded as skipped).
pub fn module_server() -> Option<Server> {
    if !module_available() {
        skip("no module library (build it with `make build` or set RATELIMIT_MODULE)");
        return None;
    }
    Some(Server::start())
}

pub fn url(server: &Server, resp3: bool) -> String {
    format!(
        "redis://127.0.0.1:{}/?protocol={}",
        server.port(),
        if resp3 { "resp3" } else { "resp2" }
    )
}

pub async fn multiplexed(server: &Server, resp3: bool) -> MultiplexedConnection {
    redis::Client::open(url(server, resp3))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

pub async fn manager(server: &Server, resp3: bool) -> ConnectionManager {
    redis::Client::open(url(server, resp3))
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap()
}

/// A raw command's reply (an error reply as `Err(text)`).
pub async fn raw<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    words: &[String],
) -> Result<Value, String> {
    let mut cmd = redis::Cmd::new();
    for word in words {
        cmd.arg(word.as_str());
    }
    cmd.query_async::<Value>(conn)
        .await
        .map_err(|e| format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or("")))
}

pub fn words(text: &str) -> Vec<String> {
    text.split_whitespace().map(String::from).collect()
}

/// Integers of a value: the six fields of a decision from a RESP2 array or a RESP3 map (by
/// name, `granted` first for TAKE).
pub fn six(value: &Value, take: bool) -> [i64; 6] {
    let field = |v: &Value| match v {
        Value::Int(n) => *n,
        Value::Boolean(b) => i64::from(*b),
        other => panic!("not an integer: {other:?}"),
    };
    match value {
        Value::Array(items) => std::array::from_fn(|i| field(&items[i])),
        Value::Map(pairs) => {
            let names = [
                if take { "granted" } else { "allowed" },
                "limit",
                "remaining",
                "retry_after_ms",
                "reset_after_ms",
                "delay_ms",
            ];
            std::array::from_fn(|i| {
                let (_, v) = pairs
                    .iter()
                    .find(|(k, _)| match k {
                        Value::SimpleString(s) => s == names[i],
                        Value::BulkString(b) => b == names[i].as_bytes(),
                        _ => false,
                    })
                    .unwrap_or_else(|| panic!("no {} in {value:?}", names[i]));
                field(v)
            })
        }
        other => panic!("not a decision: {other:?}"),
    }
}

/// A decision's six fields as the RESP2 reply has them (`granted` first for TAKE).
pub fn fields(d: &redis_ratelimit_client::Decision, take: bool) -> [i64; 6] {
    [
        if take {
            d.granted as i64
        } else {
            i64::from(d.allowed)
        },
        d.limit as i64,
        d.remaining as i64,
        d.retry_after_ms,
        d.reset_after_ms as i64,
        d.delay_ms as i64,
    ]
}

/// A small seeded generator (xorshift), so a failing sequence can be replayed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A base time well in the future of the server's clock, so `AT` times decide.
pub fn base_ms() -> u64 {
    redis_ratelimit_testkit::future_base_ms()
}
