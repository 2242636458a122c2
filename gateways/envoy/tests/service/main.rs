//! The service end to end: a real redis-server with the module (testkit), the service started
//! in-process on free ports, and Envoy's own generated gRPC client (envoy-types) sending
//! `ShouldRateLimit`, as Envoy's rate limit filter does.

mod examples;
mod failures;
mod features;
mod readme;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_ratelimit_rls::envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use redis_ratelimit_rls::envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use redis_ratelimit_rls::envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use redis_ratelimit_rls::envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use redis_ratelimit_rls::envoy_types::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse,
};
use redis_ratelimit_rls::envoy_types::pb::google::protobuf::UInt64Value;
use redis_ratelimit_rls::server::{self, Running};
use redis_ratelimit_rls::settings::Settings;
use redis_ratelimit_testkit as testkit;
use tonic::transport::Channel;

pub const OK: i32 = Code::Ok as i32;
pub const OVER: i32 = Code::OverLimit as i32;

/// A temporary configuration directory (removed on Drop).
pub struct ConfigDir {
    pub path: PathBuf,
}

impl ConfigDir {
    pub fn new(files: &[(&str, &str)]) -> ConfigDir {
        let path = testkit::make_temp_dir();
        for (name, text) in files {
            std::fs::write(path.join(name), text).unwrap();
        }
        ConfigDir { path }
    }

    pub fn write(&self, name: &str, text: &str) {
        // Write then rename, as a deployment swaps a file: the poller never sees half a file.
        let tmp = self.path.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.path.join(name)).unwrap();
    }
}

impl Drop for ConfigDir {
    fn drop(&mut self) {
        testkit::remove_dir(&self.path);
    }
}

/// The service's settings for a test: free ports on loopback, the given Redis and config.
pub fn settings(redis_urls: &str, config: &Path, extra: &[(&str, &str)]) -> Settings {
    let mut vars: HashMap<String, String> = [
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", redis_urls),
        ("REDIS_TIMEOUT", "2s"),
        ("RLS_CONFIG_POLL_INTERVAL", "50ms"),
        ("RLS_HEALTH_INTERVAL", "100ms"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    for (k, v) in extra {
        vars.insert((*k).to_owned(), (*v).to_owned());
    }
    let args = vec!["--config".to_owned(), config.display().to_string()];
    Settings::from_env_and_args(&vars, &args).unwrap()
}

/// A running service with its Redis and config, and a connected Envoy client.
pub struct Rls {
    pub running: Option<Running>,
    pub client: RateLimitServiceClient<Channel>,
    pub config: ConfigDir,
    pub redis: testkit::Server,
}

impl Rls {
    pub async fn start(files: &[(&str, &str)], extra: &[(&str, &str)]) -> Rls {
        let redis = testkit::Server::start();
        let config = ConfigDir::new(files);
        let url = format!("127.0.0.1:{}", redis.port());
        let running = server::start(settings(&url, &config.path, extra))
            .await
            .unwrap();
        let client = connect(&running).await;
        let rls = Rls {
            running: Some(running),
            client,
            config,
            redis,
        };
        rls.wait_healthy().await;
        rls
    }

    pub fn running(&self) -> &Running {
        self.running.as_ref().unwrap()
    }

    pub async fn call(&mut self, req: RateLimitRequest) -> RateLimitResponse {
        self.client
            .should_rate_limit(req)
            .await
            .unwrap_or_else(|s| panic!("ShouldRateLimit failed: {s:?}"))
            .into_inner()
    }

    pub async fn try_call(
        &mut self,
        req: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        self.client
            .should_rate_limit(req)
            .await
            .map(|r| r.into_inner())
    }

    pub async fn http(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        http(self.running().http_addr, method, path, body).await
    }

    pub async fn wait_healthy(&self) {
        wait_until(Duration::from_secs(10), || async {
            self.http("GET", "/healthcheck", "").await.0 == 200
        })
        .await;
    }

    pub fn stat(&self, key: &str, stat: &str) -> u64 {
        self.running().limiter.stats.value(key, stat)
    }
}

impl Drop for Rls {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            let _ = running.stop_signal().send(true);
        }
    }
}

pub async fn connect(running: &Running) -> RateLimitServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{}", running.grpc_addr))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(20))
        .connect()
        .await
        .unwrap();
    RateLimitServiceClient::new(channel)
}

/// A minimal HTTP/1.1 request over a fresh connection.
pub async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream =
        tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
            .await
            .unwrap()
            .unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&raw).to_string();
    let status: u16 = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Polls `ready` until it holds, failing after `limit`.
pub async fn wait_until<F, Fut>(limit: Duration, mut ready: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if ready().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not ready within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits, if needed, until at least `room` is left in the current epoch-aligned window of
/// `unit_s` seconds, so that a test's calls all fall in one window.
pub async fn fresh_window(unit_s: u64, room: Duration) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let unit_ms = unit_s * 1000;
    let left = unit_ms - now % unit_ms;
    if left < room.as_millis() as u64 {
        tokio::time::sleep(Duration::from_millis(left + 5)).await;
    }
}

pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

pub fn descriptor_cost(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: hits }),
        ..descriptor(entries)
    }
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

/// One descriptor, one entry.
pub fn one(domain: &str, key: &str, value: &str) -> RateLimitRequest {
    request(domain, vec![descriptor(&[(key, value)])])
}

pub fn codes(r: &RateLimitResponse) -> Vec<i32> {
    r.statuses.iter().map(|s| s.code).collect()
}
