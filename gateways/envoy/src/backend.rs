//! Where decisions are made: the module's `RATELIMIT.CHECK` and `RATELIMIT.CHECKALL` (or the
//! Functions library's, where the module cannot load), through the Rust client crate
//! `redis-ratelimit-client`, which bounds every call by a timeout, guards Redis with a breaker (a
//! stalled server costs one timeout per cool-down, not one per request), keeps the optional denial
//! cache and decides locally when asked to. [`Backend`] is the seam; [`ClientBackend`] is the
//! crate on one server (a self-reconnecting connection) or on a Redis Cluster.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis_ratelimit_client as client;

use crate::config::{Algorithm, Spec};

/// One decision of the module: its six-integer reply (docs/commands.md, "The reply").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Decision {
    pub allowed: bool,
    pub limit: i64,
    pub remaining: i64,
    pub retry_after_ms: i64,
    pub reset_after_ms: i64,
    pub delay_ms: i64,
    /// Answered by the client's denial cache, without Redis.
    pub from_cache: bool,
}

/// One command of a request's pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// `RATELIMIT.CHECK key spec COST cost`: one decision.
    Check { key: String, spec: Spec, cost: u64 },
    /// `RATELIMIT.CHECKALL n keys... specs... COST cost`: the overall decision, then one per key.
    CheckAll {
        keys: Vec<String>,
        specs: Vec<Spec>,
        cost: u64,
    },
}

impl Call {
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
    /// Whether the breaker is open now.
    fn breaker_open(&self) -> bool {
        false
    }
    /// Counters of the client (`commands` sent, decisions by source: `module`, `cache`...).
    fn counters(&self) -> Vec<(String, u64)> {
        Vec::new()
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

/// How to reach Redis (envoyproxy/ratelimit's `REDIS_*` settings) and what the client does when it
/// cannot.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    /// `redis://`, `rediss://` or `unix://` URLs: one for a single server, the seed nodes for a
    /// cluster.
    pub urls: Vec<String>,
    pub cluster: bool,
    pub timeout: Duration,
    pub breaker_failures: u32,
    pub breaker_cool_down: Duration,
    /// Refusals the denial cache keeps (0: off).
    pub denial_cache: usize,
    /// Decide in process with the core's algorithms while Redis is unreachable.
    pub local_fallback: bool,
    /// With the local fallback: the share of each limit this instance admits.
    pub local_share: f64,
    /// TLS (`rediss://` URLs): the CA to trust instead of the system's, and a client certificate
    /// and key for mutual TLS, all PEM.
    pub tls: Option<TlsFiles>,
}

/// envoyproxy/ratelimit's `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT`, `REDIS_TLS_CLIENT_KEY`,
/// read at start.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    pub ca_cert: Option<Vec<u8>>,
    pub client_cert_and_key: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsFiles {
    fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self.client_cert_and_key.as_ref().map(|(cert, key)| {
                redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }
            }),
            root_cert: self.ca_cert.clone(),
        }
    }
}

enum Limiter {
    Single(client::RateLimiter<ConnectionManager>, ConnectionManager),
    Cluster(client::RateLimiter<ClusterConnection>, ClusterConnection),
}

/// The client crate's `RateLimiter` on one server or a cluster, connected on first use (the
/// service starts, and reports not serving, while Redis is not there yet).
pub struct ClientBackend {
    settings: RedisSettings,
    limiter: RwLock<Option<Arc<Limiter>>>,
    connecting: tokio::sync::Mutex<()>,
}

fn to_client_spec(spec: &Spec) -> Result<client::LimitSpec, BackendError> {
    let bad = |e: client::Error| BackendError::Command(e.to_string());
    Ok(match spec {
        Spec::Inline {
            algorithm,
            limit,
            period_ms,
            burst,
            block_ms,
        } => {
            let algorithm = match algorithm {
                Algorithm::TokenBucket => client::Algorithm::TokenBucket,
                Algorithm::LeakyBucket => client::Algorithm::LeakyBucket,
                Algorithm::FixedWindow => client::Algorithm::FixedWindow,
                Algorithm::SlidingWindow => client::Algorithm::SlidingWindow,
                Algorithm::SlidingLog => client::Algorithm::SlidingLog,
                Algorithm::Gcra => client::Algorithm::Gcra,
            };
            let mut l = client::Limit::new(algorithm, *limit, *period_ms).map_err(bad)?;
            if let Some(b) = burst {
                l = l.burst(*b).map_err(bad)?;
            }
            if let Some(b) = block_ms {
                l = l.block(*b).map_err(bad)?;
            }
            client::LimitSpec::Limit(l)
        }
        Spec::Policy(name) => {
            client::LimitSpec::Policy(client::Policy::new(name.clone()).map_err(bad)?)
        }
    })
}

fn from_client(d: &client::Decision) -> Decision {
    let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    Decision {
        allowed: d.allowed,
        limit: int(d.limit),
        remaining: int(d.remaining),
        retry_after_ms: d.retry_after_ms,
        reset_after_ms: int(d.reset_after_ms),
        delay_ms: int(d.delay_ms),
        from_cache: d.source == client::Source::Cache,
    }
}

fn from_client_error(e: client::Error) -> BackendError {
    match e {
        client::Error::Unavailable(why) => BackendError::Unavailable(why),
        other => BackendError::Command(other.to_string()),
    }
}

async fn decide<C: client::Connection>(
    limiter: &client::RateLimiter<C>,
    call: &Call,
) -> Result<Vec<Decision>, BackendError> {
    match call {
        Call::Check { key, spec, cost } => {
            let spec = to_client_spec(spec)?;
            let d = limiter
                .check(key, &spec, *cost)
                .await
                .map_err(from_client_error)?;
            Ok(vec![from_client(&d)])
        }
        Call::CheckAll { keys, specs, cost } => {
            let mut pairs = Vec::with_capacity(keys.len());
            for (key, spec) in keys.iter().zip(specs) {
                pairs.push((key.as_str(), to_client_spec(spec)?));
            }
            let m = limiter
                .check_all(&pairs, *cost)
                .await
                .map_err(from_client_error)?;
            let mut out = Vec::with_capacity(1 + m.limits.len());
            out.push(from_client(&m.overall));
            out.extend(m.limits.iter().map(from_client));
            Ok(out)
        }
    }
}

impl ClientBackend {
    pub fn new(settings: RedisSettings) -> Arc<ClientBackend> {
        Arc::new(ClientBackend {
            settings,
            limiter: RwLock::new(None),
            connecting: tokio::sync::Mutex::new(()),
        })
    }

    fn current(&self) -> Option<Arc<Limiter>> {
        self.limiter
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn options(&self) -> client::Options {
        client::Options {
            on_error: if self.settings.local_fallback {
                client::OnError::Local
            } else {
                client::OnError::Closed
            },
            timeout: self.settings.timeout,
            engine: client::EngineChoice::Auto,
            breaker_failures: self.settings.breaker_failures,
            breaker_cooldown: self.settings.breaker_cool_down,
            denial_cache: self.settings.denial_cache,
            local_share: self.settings.local_share,
            ..client::Options::default()
        }
    }

    /// Connects if not connected (one attempt at a time).
    async fn connect(&self) -> Result<Arc<Limiter>, BackendError> {
        if let Some(l) = self.current() {
            return Ok(l);
        }
        // Calls that arrive while another connects wait for it (within the timeout).
        let timeout = self.settings.timeout;
        let Ok(_guard) = tokio::time::timeout(timeout, self.connecting.lock()).await else {
            return Err(BackendError::Unavailable("still connecting".into()));
        };
        if let Some(l) = self.current() {
            return Ok(l);
        }
        let attempt = async {
            if self.settings.cluster {
                let mut builder =
                    redis::cluster::ClusterClient::builder(self.settings.urls.clone())
                        .connection_timeout(timeout)
                        .response_timeout(timeout)
                        .retries(1);
                if let Some(tls) = &self.settings.tls {
                    builder = builder.certs(tls.certificates());
                }
                let c = builder.build()?;
                let conn = c.get_async_connection().await?;
                Ok::<_, redis::RedisError>((None, Some(conn)))
            } else {
                let url = self.settings.urls[0].as_str();
                let c = match &self.settings.tls {
                    Some(tls) => redis::Client::build_with_tls(url, tls.certificates())?,
                    None => redis::Client::open(url)?,
                };
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(timeout)
                    .set_response_timeout(timeout)
                    .set_number_of_retries(1)
                    .set_max_delay(1000);
                Ok((
                    Some(ConnectionManager::new_with_config(c, config).await?),
                    None,
                ))
            }
        };
        let limiter = match tokio::time::timeout(timeout, attempt).await {
            Err(_) => return Err(BackendError::Timeout(timeout)),
            Ok(Err(e)) => return Err(BackendError::Unavailable(e.to_string())),
            Ok(Ok((Some(single), _))) => {
                let l = client::RateLimiter::new(single.clone(), self.options())
                    .map_err(|e| BackendError::Command(e.to_string()))?;
                Limiter::Single(l, single)
            }
            Ok(Ok((_, Some(cluster)))) => {
                let l = client::RateLimiter::new(cluster.clone(), self.options())
                    .map_err(|e| BackendError::Command(e.to_string()))?;
                Limiter::Cluster(l, cluster)
            }
            Ok(Ok((None, None))) => return Err(BackendError::Unavailable("no connection".into())),
        };
        let limiter = Arc::new(limiter);
        *self.limiter.write().unwrap_or_else(|p| p.into_inner()) = Some(limiter.clone());
        Ok(limiter)
    }
}

impl Backend for ClientBackend {
    fn execute<'a>(
        &'a self,
        calls: &'a [Call],
    ) -> BoxFuture<'a, Result<Vec<Vec<Decision>>, BackendError>> {
        Box::pin(async move {
            if calls.is_empty() {
                return Ok(Vec::new());
            }
            let limiter = self.connect().await?;
            // The calls of one request at once: on one multiplexed connection they leave in one
            // write, as a pipeline would.
            let results: Vec<Result<Vec<Decision>, BackendError>> = match &*limiter {
                Limiter::Single(l, _) => {
                    futures_util::future::join_all(calls.iter().map(|c| decide(l, c))).await
                }
                Limiter::Cluster(l, _) => {
                    futures_util::future::join_all(calls.iter().map(|c| decide(l, c))).await
                }
            };
            results.into_iter().collect()
        })
    }

    fn ping(&self) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            let Ok(limiter) = self.connect().await else {
                return false;
            };
            let timeout = self.settings.timeout.min(Duration::from_secs(1));
            let ping = async {
                match &*limiter {
                    Limiter::Single(_, conn) => {
                        let mut conn = conn.clone();
                        redis::cmd("PING").query_async::<String>(&mut conn).await
                    }
                    Limiter::Cluster(_, conn) => {
                        let mut conn = conn.clone();
                        redis::cmd("PING").query_async::<String>(&mut conn).await
                    }
                }
            };
            matches!(tokio::time::timeout(timeout, ping).await, Ok(Ok(_)))
        })
    }

    fn slot_of(&self, key: &str) -> Option<u16> {
        self.settings.cluster.then(|| key_slot(key.as_bytes()))
    }

    fn breaker_open(&self) -> bool {
        match self.current().as_deref() {
            Some(Limiter::Single(l, _)) => l.breaker_open(),
            Some(Limiter::Cluster(l, _)) => l.breaker_open(),
            None => false,
        }
    }

    fn counters(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = match self.current().as_deref() {
            Some(Limiter::Single(l, _)) => l.stats().into_iter().collect(),
            Some(Limiter::Cluster(l, _)) => l.stats().into_iter().collect(),
            None => Vec::new(),
        };
        v.sort();
        v
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
        for key in ["foo{}{bar}", "123456789", "{f}_user_a", "a{b}c", "{}", ""] {
            assert_eq!(
                key_slot(key.as_bytes()),
                redis_ratelimit_testkit::cluster::slot(key),
                "{key}"
            );
        }
    }

    #[test]
    fn specs_become_the_clients() {
        let spec = Spec::Inline {
            algorithm: Algorithm::Gcra,
            limit: 10,
            period_ms: 1000,
            burst: Some(20),
            block_ms: Some(5000),
        };
        let client::LimitSpec::Limit(l) = to_client_spec(&spec).unwrap() else {
            panic!("a limit")
        };
        assert_eq!(l.burst_value(), Some(20));
        assert_eq!(l.block_ms(), Some(5000));
        assert!(to_client_spec(&Spec::Policy("bad name".into())).is_err());
    }
}
