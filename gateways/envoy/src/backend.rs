//! Where decisions are made: the module's `RATELIMIT.CHECK` and `RATELIMIT.CHECKALL`, sent in one
//! pipeline per request. [`Backend`] is the seam (tests and the bench use it too); [`RedisBackend`]
//! speaks to one server (a pool of self-reconnecting multiplexed connections) or to a Redis
//! Cluster, bounds every round trip by a timeout and guards it with a breaker, so a stalled server
//! costs one timeout per cool-down instead of one per request.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::Value;

/// One decision of the module: its six-integer reply (docs/commands.md, "The reply").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Decision {
    pub allowed: bool,
    pub limit: i64,
    pub remaining: i64,
    pub retry_after_ms: i64,
    pub reset_after_ms: i64,
    pub delay_ms: i64,
}

/// One command of a request's pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// `RATELIMIT.CHECK key spec... COST cost`: one decision.
    Check {
        key: String,
        spec: Vec<String>,
        cost: u64,
    },
    /// `RATELIMIT.CHECKALL n keys... specs... COST cost`: the overall decision, then one per key.
    CheckAll {
        keys: Vec<String>,
        specs: Vec<Vec<String>>,
        cost: u64,
    },
}

impl Call {
    pub fn to_cmd(&self) -> redis::Cmd {
        match self {
            Call::Check { key, spec, cost } => {
                let mut cmd = redis::cmd("RATELIMIT.CHECK");
                cmd.arg(key).arg(spec).arg("COST").arg(*cost);
                cmd
            }
            Call::CheckAll { keys, specs, cost } => {
                let mut cmd = redis::cmd("RATELIMIT.CHECKALL");
                cmd.arg(keys.len()).arg(keys);
                for spec in specs {
                    cmd.arg(spec);
                }
                cmd.arg("COST").arg(*cost);
                cmd
            }
        }
    }

    /// How many decisions its reply holds.
    pub fn reply_len(&self) -> usize {
        match self {
            Call::Check { .. } => 1,
            Call::CheckAll { keys, .. } => 1 + keys.len(),
        }
    }

    pub fn keys(&self) -> Vec<&str> {
        match self {
            Call::Check { key, .. } => vec![key.as_str()],
            Call::CheckAll { keys, .. } => keys.iter().map(String::as_str).collect(),
        }
    }
}

/// Why a round trip gave no decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendError {
    /// Not connected, the connection broke, or Redis answered the pipeline with an error.
    Unavailable(String),
    /// No reply within the timeout.
    Timeout(Duration),
    /// The breaker is open after recent failures: Redis was not asked.
    BreakerOpen,
    /// Redis refused a command (an `ERR` reply: a policy that does not exist, a key of another
    /// type): a configuration or deployment mistake, not an outage.
    Command(String),
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendError::Unavailable(e) => write!(f, "redis unavailable: {e}"),
            BackendError::Timeout(d) => write!(f, "redis did not answer within {d:?}"),
            BackendError::BreakerOpen => write!(
                f,
                "redis breaker open after recent failures: not asking until its cool-down ends"
            ),
            BackendError::Command(e) => write!(f, "redis refused a command: {e}"),
        }
    }
}

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What decides: the calls of one request, in one round trip.
pub trait Backend: Send + Sync + 'static {
    /// The decisions of every call, in order (`Call::reply_len` each).
    fn execute<'a>(
        &'a self,
        calls: &'a [Call],
    ) -> BoxFuture<'a, Result<Vec<Vec<Decision>>, BackendError>>;
    /// Whether Redis answers a PING now.
    fn ping(&self) -> BoxFuture<'_, bool>;
    /// Whether keys must share a slot to share a CHECKALL, and the slot of a key.
    fn slot_of(&self, _key: &str) -> Option<u16> {
        None
    }
}

/// Reads one six-integer decision.
pub fn parse_decision(value: &Value) -> Result<Decision, String> {
    let Value::Array(items) = value else {
        return Err(format!("expected a six-integer reply, got {value:?}"));
    };
    if items.len() < 6 {
        return Err(format!("expected six integers, got {}", items.len()));
    }
    let mut n = [0i64; 6];
    for (slot, item) in n.iter_mut().zip(items) {
        *slot = match item {
            Value::Int(i) => *i,
            Value::Boolean(b) => i64::from(*b),
            other => return Err(format!("expected an integer, got {other:?}")),
        };
    }
    Ok(Decision {
        allowed: n[0] == 1,
        limit: n[1],
        remaining: n[2],
        retry_after_ms: n[3],
        reset_after_ms: n[4],
        delay_ms: n[5],
    })
}

/// Reads a call's reply: a CHECK's decision, or CHECKALL's overall decision and one per key.
pub fn parse_reply(
    call: &Call,
    value: &Result<Value, String>,
) -> Result<Vec<Decision>, BackendError> {
    let value = match value {
        Ok(value) => value,
        Err(e) => return Err(BackendError::Command(e.clone())),
    };
    let bad = |e: String| BackendError::Command(format!("unexpected reply: {e}"));
    match call {
        Call::Check { .. } => Ok(vec![parse_decision(value).map_err(bad)?]),
        Call::CheckAll { keys, .. } => {
            let Value::Array(items) = value else {
                return Err(bad(format!("{value:?}")));
            };
            if items.len() != keys.len() + 1 {
                return Err(bad(format!(
                    "CHECKALL of {} keys answered {} decisions",
                    keys.len(),
                    items.len()
                )));
            }
            items
                .iter()
                .map(|item| parse_decision(item).map_err(bad))
                .collect()
        }
    }
}

/// Redis Cluster's key slot: CRC16 (XMODEM) of the key, or of its hash tag, modulo 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// The breaker: after `threshold` failures in a row (or one timeout) it opens for `cool_down`;
/// then one request probes, and its outcome closes or reopens it.
pub struct Breaker {
    threshold: u32,
    cool_down: Duration,
    state: Mutex<BreakerState>,
    pub opened: AtomicU64,
}

#[derive(Default)]
struct BreakerState {
    failures: u32,
    open_until: Option<Instant>,
    probing: bool,
}

impl Breaker {
    pub fn new(threshold: u32, cool_down: Duration) -> Breaker {
        Breaker {
            threshold: threshold.max(1),
            cool_down,
            state: Mutex::new(BreakerState::default()),
            opened: AtomicU64::new(0),
        }
    }

    /// Whether a call may go to Redis now.
    pub fn admit(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match s.open_until {
            None => true,
            Some(until) if Instant::now() < until => false,
            Some(_) => {
                if s.probing {
                    false
                } else {
                    s.probing = true;
                    true
                }
            }
        }
    }

    pub fn success(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        *s = BreakerState::default();
    }

    pub fn failure(&self, timed_out: bool) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.failures += 1;
        s.probing = false;
        if timed_out || s.failures >= self.threshold || s.open_until.is_some() {
            s.open_until = Some(Instant::now() + self.cool_down);
            self.opened.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn is_open(&self) -> bool {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.open_until.is_some()
    }
}

/// How to reach Redis (envoyproxy/ratelimit's `REDIS_*` settings).
#[derive(Debug, Clone)]
pub struct RedisSettings {
    /// `redis://`, `rediss://` or `unix://` URLs: one for a single server, the seed nodes for a
    /// cluster.
    pub urls: Vec<String>,
    pub cluster: bool,
    pub pool_size: usize,
    pub timeout: Duration,
    pub breaker_failures: u32,
    pub breaker_cool_down: Duration,
}

enum Conn {
    Single(Vec<ConnectionManager>),
    Cluster(ClusterConnection),
}

/// The module on one server or a cluster.
pub struct RedisBackend {
    settings: RedisSettings,
    conn: RwLock<Option<Arc<Conn>>>,
    next: AtomicUsize,
    pub breaker: Breaker,
    connecting: tokio::sync::Mutex<()>,
}

impl RedisBackend {
    pub fn new(settings: RedisSettings) -> Arc<RedisBackend> {
        Arc::new(RedisBackend {
            breaker: Breaker::new(settings.breaker_failures, settings.breaker_cool_down),
            settings,
            conn: RwLock::new(None),
            next: AtomicUsize::new(0),
            connecting: tokio::sync::Mutex::new(()),
        })
    }

    fn current(&self) -> Option<Arc<Conn>> {
        self.conn.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Connects if not connected (one attempt at a time; the others fail at once).
    async fn connect(&self) -> Result<Arc<Conn>, BackendError> {
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        let Ok(_guard) = self.connecting.try_lock() else {
            return Err(BackendError::Unavailable("connecting".into()));
        };
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        let timeout = self.settings.timeout;
        let attempt = async {
            if self.settings.cluster {
                let client = redis::cluster::ClusterClient::builder(self.settings.urls.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .retries(1)
                    .build()?;
                Ok::<_, redis::RedisError>(Conn::Cluster(client.get_async_connection().await?))
            } else {
                let client = redis::Client::open(self.settings.urls[0].as_str())?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(timeout)
                    .set_response_timeout(timeout)
                    .set_number_of_retries(1)
                    .set_max_delay(1000);
                let mut pool = Vec::with_capacity(self.settings.pool_size);
                for _ in 0..self.settings.pool_size.max(1) {
                    pool.push(
                        ConnectionManager::new_with_config(client.clone(), config.clone()).await?,
                    );
                }
                Ok(Conn::Single(pool))
            }
        };
        let conn = match tokio::time::timeout(timeout, attempt).await {
            Err(_) => return Err(BackendError::Timeout(timeout)),
            Ok(Err(e)) => return Err(BackendError::Unavailable(e.to_string())),
            Ok(Ok(conn)) => Arc::new(conn),
        };
        *self.conn.write().unwrap_or_else(|p| p.into_inner()) = Some(conn.clone());
        Ok(conn)
    }

    async fn round_trip(
        &self,
        conn: &Conn,
        pipe: &redis::Pipeline,
        n: usize,
    ) -> redis::RedisResult<Vec<Result<Value, String>>> {
        match conn {
            Conn::Single(pool) => {
                let i = self.next.fetch_add(1, Ordering::Relaxed) % pool.len();
                let mut con = pool[i].clone();
                let values = con.req_packed_commands(pipe, 0, n).await?;
                Ok(values
                    .into_iter()
                    .map(|v| match v {
                        Value::ServerError(e) => Err(format!("{e:?}")),
                        v => Ok(v),
                    })
                    .collect())
            }
            Conn::Cluster(cluster) => {
                // The cluster client routes a pipeline only when all its keys share a slot: send
                // each command (each is one slot) on its own, all at once.
                let sends = pipe.cmd_iter().map(|cmd| {
                    let mut con = cluster.clone();
                    async move {
                        match con.req_packed_command(cmd).await {
                            Ok(Value::ServerError(e)) => Ok(Err(format!("{e:?}"))),
                            Ok(v) => Ok(Ok(v)),
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    redis::ErrorKind::ResponseError
                                        | redis::ErrorKind::ExtensionError
                                ) =>
                            {
                                Ok(Err(e.to_string()))
                            }
                            Err(e) => Err(e),
                        }
                    }
                });
                futures_util::future::join_all(sends)
                    .await
                    .into_iter()
                    .collect()
            }
        }
    }
}

impl Backend for RedisBackend {
    fn execute<'a>(
        &'a self,
        calls: &'a [Call],
    ) -> BoxFuture<'a, Result<Vec<Vec<Decision>>, BackendError>> {
        Box::pin(async move {
            if calls.is_empty() {
                return Ok(Vec::new());
            }
            if !self.breaker.admit() {
                return Err(BackendError::BreakerOpen);
            }
            let conn = match self.connect().await {
                Ok(conn) => conn,
                Err(e) => {
                    self.breaker.failure(matches!(e, BackendError::Timeout(_)));
                    return Err(e);
                }
            };
            let mut pipe = redis::pipe();
            for call in calls {
                pipe.add_command(call.to_cmd());
            }
            let timeout = self.settings.timeout;
            let replies =
                match tokio::time::timeout(timeout, self.round_trip(&conn, &pipe, calls.len()))
                    .await
                {
                    Err(_) => {
                        self.breaker.failure(true);
                        return Err(BackendError::Timeout(timeout));
                    }
                    Ok(Err(e)) => {
                        let timed_out = e.is_timeout();
                        self.breaker.failure(timed_out);
                        return Err(if timed_out {
                            BackendError::Timeout(timeout)
                        } else {
                            BackendError::Unavailable(e.to_string())
                        });
                    }
                    Ok(Ok(replies)) => replies,
                };
            self.breaker.success();
            if replies.len() != calls.len() {
                return Err(BackendError::Command(format!(
                    "{} replies to {} commands",
                    replies.len(),
                    calls.len()
                )));
            }
            calls
                .iter()
                .zip(&replies)
                .map(|(call, reply)| parse_reply(call, reply))
                .collect()
        })
    }

    fn ping(&self) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            let Ok(conn) = self.connect().await else {
                return false;
            };
            let mut pipe = redis::pipe();
            pipe.cmd("PING");
            let timeout = self.settings.timeout.min(Duration::from_secs(1));
            matches!(
                tokio::time::timeout(timeout, self.round_trip(&conn, &pipe, 1)).await,
                Ok(Ok(ref v)) if matches!(v.first(), Some(Ok(Value::SimpleString(_))) | Some(Ok(Value::Okay)))
            )
        })
    }

    fn slot_of(&self, key: &str) -> Option<u16> {
        self.settings.cluster.then(|| key_slot(key.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis_cluster() {
        // Values from CLUSTER KEYSLOT.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_eq!(key_slot(b"123456789"), 0x31C3 % 16384);
    }

    #[test]
    fn breaker_opens_on_timeout_and_probes_once() {
        let b = Breaker::new(3, Duration::from_millis(50));
        assert!(b.admit());
        b.failure(false);
        b.failure(false);
        assert!(b.admit(), "two failures of three stay closed");
        b.failure(true);
        assert!(!b.admit(), "a timeout opens it");
        std::thread::sleep(Duration::from_millis(60));
        assert!(b.admit(), "after the cool-down one probe");
        assert!(!b.admit(), "and only one");
        b.success();
        assert!(b.admit());
        assert!(!b.is_open());
    }

    #[test]
    fn replies_parse() {
        let six = |a| Value::Array([a, 5, 4, 0, 1000, 0].map(Value::Int).to_vec());
        let call = Call::CheckAll {
            keys: vec!["a".into(), "b".into()],
            specs: vec![],
            cost: 1,
        };
        let d = parse_reply(&call, &Ok(Value::Array(vec![six(1), six(1), six(1)]))).unwrap();
        assert_eq!(d.len(), 3);
        assert!(d[0].allowed);
        assert!(parse_reply(&call, &Ok(Value::Array(vec![six(1)]))).is_err());
        assert!(parse_reply(&call, &Ok(Value::Int(3))).is_err());
        assert_eq!(
            parse_reply(&call, &Err("ERR no such policy".into())),
            Err(BackendError::Command("ERR no such policy".into()))
        );
    }
}
