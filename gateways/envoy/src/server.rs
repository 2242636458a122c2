//! The running service: gRPC (`ShouldRateLimit` and `grpc.health.v1.Health`) on `GRPC_PORT`,
//! HTTP on `PORT` (`/healthcheck`, `/json`, `/metrics`, `/rlconfig`), the configuration poller and
//! the Redis health probe.

use std::collections::hash_map::DefaultHasher;
use std::convert::Infallible;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic_health::ServingStatus;

use crate::backend::{Backend, ClientBackend};
use crate::config::{read_dir_sources, Config, LoadOptions, Source};
use crate::json;
use crate::log::{log, Level};
use crate::service::{RateLimiter, ServiceError};
use crate::settings::Settings;
use crate::stats::Stats;

/// The gRPC service name Envoy's `rate_limit_service` calls.
pub const SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

struct Grpc {
    limiter: Arc<RateLimiter>,
}

#[tonic::async_trait]
impl RateLimitService for Grpc {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let req = request.into_inner();
        match self.limiter.should_rate_limit(&req).await {
            Ok(response) => Ok(tonic::Response::new(response)),
            Err(ServiceError::InvalidRequest(m)) => Err(tonic::Status::invalid_argument(m)),
            Err(ServiceError::Redis(e)) => {
                log(
                    Level::Warn,
                    "redis error",
                    &[("error", &e.to_string()), ("domain", &req.domain)],
                );
                Err(tonic::Status::unavailable(e.to_string()))
            }
        }
    }
}

/// Shared state of the HTTP side.
struct Shared {
    limiter: Arc<RateLimiter>,
    redis_up: AtomicBool,
    config_ok: AtomicBool,
    healthy_with_config: bool,
}

impl Shared {
    fn healthy(&self) -> bool {
        self.redis_up.load(Ordering::Relaxed)
            && (!self.healthy_with_config || self.config_ok.load(Ordering::Relaxed))
    }
}

/// A started service: where it listens, and how to stop it.
pub struct Running {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub limiter: Arc<RateLimiter>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Stops every task and waits for them.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }

    pub fn stop_signal(&self) -> watch::Sender<bool> {
        self.shutdown.clone()
    }
}

fn fingerprint(sources: &[Source]) -> u64 {
    let mut h = DefaultHasher::new();
    for s in sources {
        s.name.hash(&mut h);
        s.text.hash(&mut h);
    }
    h.finish()
}

/// Loads the configuration directory once.
pub fn load_config(settings: &Settings) -> Result<(Config, u64), String> {
    let sources = read_dir_sources(&settings.config_dir, settings.ignore_dot_files)
        .map_err(|e| e.to_string())?;
    let print = fingerprint(&sources);
    let config = Config::load(
        &sources,
        LoadOptions {
            merge_domains: settings.merge_domains,
        },
    )
    .map_err(|e| e.to_string())?;
    Ok((config, print))
}

/// Starts the service with the Redis backend the settings name. The first configuration must
/// load; later bad files are logged and the running configuration stays.
pub async fn start(settings: Settings) -> Result<Running, String> {
    let backend = ClientBackend::new(settings.redis.clone());
    start_with_backend(settings, backend).await
}

pub async fn start_with_backend(
    settings: Settings,
    backend: Arc<dyn Backend>,
) -> Result<Running, String> {
    let stats = Arc::new(Stats::default());
    let (config, print) = load_config(&settings)?;
    stats.config_load_success.fetch_add(1, Ordering::Relaxed);
    log(
        Level::Info,
        "configuration loaded",
        &[
            ("dir", &settings.config_dir.display().to_string()),
            ("files", &config.files.join(",")),
        ],
    );
    let limiter = Arc::new(RateLimiter::new(
        config,
        backend.clone(),
        stats.clone(),
        settings.options.clone(),
    ));
    let shared = Arc::new(Shared {
        config_ok: AtomicBool::new(!limiter.config().is_empty()),
        limiter: limiter.clone(),
        redis_up: AtomicBool::new(false),
        healthy_with_config: settings.healthy_with_config,
    });
    let (shutdown, shutdown_rx) = watch::channel(false);
    let mut tasks = Vec::new();

    let grpc_listener = TcpListener::bind((settings.grpc_host.as_str(), settings.grpc_port))
        .await
        .map_err(|e| {
            format!(
                "GRPC_HOST/GRPC_PORT {}:{}: {e}",
                settings.grpc_host, settings.grpc_port
            )
        })?;
    let http_listener = TcpListener::bind((settings.host.as_str(), settings.port))
        .await
        .map_err(|e| format!("HOST/PORT {}:{}: {e}", settings.host, settings.port))?;
    let grpc_addr = grpc_listener.local_addr().map_err(|e| e.to_string())?;
    let http_addr = http_listener.local_addr().map_err(|e| e.to_string())?;

    let (reporter, health_service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(SERVICE_NAME, ServingStatus::NotServing)
        .await;
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;

    // The Redis probe: drives both health endpoints.
    {
        let shared = shared.clone();
        let backend = backend.clone();
        let interval = settings.health_interval;
        let mut stop = shutdown_rx.clone();
        tasks.push(tokio::spawn(async move {
            let mut last: Option<bool> = None;
            loop {
                let up = backend.ping().await;
                shared.redis_up.store(up, Ordering::Relaxed);
                let healthy = shared.healthy();
                if last != Some(healthy) {
                    let status = if healthy {
                        ServingStatus::Serving
                    } else {
                        ServingStatus::NotServing
                    };
                    reporter.set_service_status(SERVICE_NAME, status).await;
                    reporter.set_service_status("", status).await;
                    log(
                        if healthy { Level::Info } else { Level::Warn },
                        if healthy { "healthy" } else { "not healthy" },
                        &[("redis_up", if up { "true" } else { "false" })],
                    );
                    last = Some(healthy);
                }
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = stop.changed() => break,
                }
            }
        }));
    }

    // The configuration poller.
    {
        let shared = shared.clone();
        let settings = settings.clone();
        let mut stop = shutdown_rx.clone();
        tasks.push(tokio::spawn(async move {
            let mut last_print = print;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(settings.reload_interval) => {}
                    _ = stop.changed() => break,
                }
                let sources =
                    match read_dir_sources(&settings.config_dir, settings.ignore_dot_files) {
                        Ok(s) => s,
                        Err(e) => {
                            log(
                                Level::Error,
                                "configuration not reloaded",
                                &[("error", &e.to_string())],
                            );
                            continue;
                        }
                    };
                let print = fingerprint(&sources);
                if print == last_print {
                    continue;
                }
                last_print = print;
                let stats = &shared.limiter.stats;
                match Config::load(
                    &sources,
                    LoadOptions {
                        merge_domains: settings.merge_domains,
                    },
                ) {
                    Ok(config) => {
                        log(
                            Level::Info,
                            "configuration reloaded",
                            &[("files", &config.files.join(","))],
                        );
                        shared
                            .config_ok
                            .store(!config.is_empty(), Ordering::Relaxed);
                        shared.limiter.set_config(config);
                        stats.config_load_success.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        log(
                            Level::Error,
                            "configuration not reloaded: the running one stays",
                            &[("error", &e.to_string())],
                        );
                        stats.config_load_error.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }

    // gRPC.
    {
        let grpc = RateLimitServiceServer::new(Grpc {
            limiter: limiter.clone(),
        });
        let mut stop = shutdown_rx.clone();
        let incoming = tokio_stream_listener(grpc_listener);
        tasks.push(tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(health_service)
                .add_service(grpc)
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = stop.changed().await;
                })
                .await;
            if let Err(e) = result {
                log(
                    Level::Error,
                    "grpc server stopped",
                    &[("error", &e.to_string())],
                );
            }
        }));
    }

    // HTTP.
    {
        let shared = shared.clone();
        let mut stop = shutdown_rx.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    a = http_listener.accept() => a,
                    _ = stop.changed() => break,
                };
                let Ok((stream, _)) = accepted else { continue };
                let shared = shared.clone();
                let mut stop = stop.clone();
                tokio::spawn(async move {
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let service = hyper::service::service_fn(move |req| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(http(shared, req).await) }
                    });
                    let conn =
                        hyper::server::conn::http1::Builder::new().serve_connection(io, service);
                    tokio::pin!(conn);
                    tokio::select! {
                        _ = conn.as_mut() => {}
                        _ = stop.changed() => conn.as_mut().graceful_shutdown(),
                    }
                });
            }
        }));
    }

    log(
        Level::Info,
        "listening",
        &[
            ("grpc", &grpc_addr.to_string()),
            ("http", &http_addr.to_string()),
        ],
    );
    Ok(Running {
        grpc_addr,
        http_addr,
        limiter,
        shutdown,
        tasks,
    })
}

fn tokio_stream_listener(
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = Result<tokio::net::TcpStream, std::io::Error>> {
    tokio_stream::wrappers::TcpListenerStream::new(listener)
}

fn text(status: StatusCode, body: impl Into<Bytes>, content_type: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

async fn http(shared: Arc<Shared>, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/healthcheck") => {
            if shared.healthy() {
                text(StatusCode::OK, "OK", "text/plain")
            } else {
                text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "NOT OK: redis unreachable or no configuration",
                    "text/plain",
                )
            }
        }
        (Method::GET, "/metrics") => text(
            StatusCode::OK,
            shared.limiter.stats.render(
                shared.redis_up.load(Ordering::Relaxed),
                shared.limiter.backend().breaker_open(),
                &shared.limiter.backend().counters(),
            ),
            "text/plain; version=0.0.4",
        ),
        (Method::GET, "/rlconfig") => {
            let config = shared.limiter.config();
            let mut domains: Vec<&str> = config.domains().collect();
            domains.sort_unstable();
            text(
                StatusCode::OK,
                format!(
                    "files: {}\ndomains: {}\n",
                    config.files.join(", "),
                    domains.join(", ")
                ),
                "text/plain",
            )
        }
        (Method::POST, "/json") => {
            let body = match req.into_body().collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    return text(
                        StatusCode::BAD_REQUEST,
                        format!("cannot read the body: {e}"),
                        "text/plain",
                    )
                }
            };
            let request = match json::request_from_json(&body) {
                Ok(r) => r,
                Err(e) => return text(StatusCode::BAD_REQUEST, e, "text/plain"),
            };
            match shared.limiter.should_rate_limit(&request).await {
                Ok(response) => {
                    let status = if response.overall_code
                        == envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code::OverLimit as i32
                    {
                        StatusCode::TOO_MANY_REQUESTS
                    } else {
                        StatusCode::OK
                    };
                    text(
                        status,
                        json::response_to_json(&response),
                        "application/json",
                    )
                }
                Err(ServiceError::InvalidRequest(m)) => {
                    text(StatusCode::BAD_REQUEST, m, "text/plain")
                }
                Err(ServiceError::Redis(e)) => {
                    text(StatusCode::SERVICE_UNAVAILABLE, e.to_string(), "text/plain")
                }
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: /healthcheck, /json (POST), /metrics, /rlconfig",
            "text/plain",
        ),
    }
}
