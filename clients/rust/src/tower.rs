//! `RateLimitLayer`: a [`tower_layer::Layer`] that limits each HTTP request of an axum, hyper or
//! tonic service, and answers as the Python and Node middleware do:
//!
//! - admitted: the service answers, with `RateLimit-Policy: "name";q=<limit>;w=<period s>` and
//!   `RateLimit: "name";r=<remaining>;t=<s>` (draft-ietf-httpapi-ratelimit-headers);
//! - refused: `429` with those, `Retry-After: <s>` and the JSON body
//!   `{"error":"rate limited","policy":"<name>","retry_after_ms":<ms>}`;
//! - Redis unavailable: `OnError::Open` lets the request through without headers,
//!   `OnError::Closed` answers `503 {"error":"rate limiter unavailable"}`.
//!
//! The decision is put in the request's extensions (`req.extensions().get::<Decision>()`).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};

use crate::connection::Connection;
use crate::types::{Decision, Error, LimitSpec, Source};
use crate::RateLimiter;

/// What a key function sees of a request.
pub struct RequestRef<'a> {
    pub method: &'a http::Method,
    pub uri: &'a http::Uri,
    pub headers: &'a HeaderMap,
    pub extensions: &'a http::Extensions,
}

impl RequestRef<'_> {
    /// The peer's address: axum's `ConnectInfo<SocketAddr>` (with the `axum` feature and
    /// `into_make_service_with_connect_info::<SocketAddr>()`), else a `SocketAddr` a hyper
    /// service put in the extensions.
    pub fn peer(&self) -> Option<SocketAddr> {
        #[cfg(feature = "axum")]
        if let Some(info) = self
            .extensions
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
        {
            return Some(info.0);
        }
        self.extensions.get::<SocketAddr>().copied()
    }
}

/// A request's key: `None` leaves it unlimited and uncounted.
pub type KeyFn = Arc<dyn Fn(&RequestRef<'_>) -> Option<String> + Send + Sync>;

/// The identity header the default key reads.
pub const IDENTITY_HEADER: &str = "x-api-key";

/// The default key: `key:<x-api-key>` where the request has that header, else `ip:<peer
/// address>` (the TCP peer: behind a proxy or load balancer that is the proxy's address, so
/// every client shares one limit; give a key function that reads the header your proxy sets,
/// such as the last `X-Forwarded-For` entry it appended, and trust only that proxy).
pub fn default_key(req: &RequestRef<'_>) -> Option<String> {
    if let Some(value) = req.headers.get(IDENTITY_HEADER) {
        if let Ok(text) = value.to_str() {
            if !text.is_empty() {
                return Some(format!("key:{text}"));
            }
        }
    }
    req.peer().map(|addr| format!("ip:{}", addr.ip()))
}

fn ceil_s(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// The `RateLimit-Policy`, `RateLimit` and (refused) `Retry-After` fields of a decision under
/// `name`, as the Python and Node packages send them; none for a decision of `Source::Error`.
pub fn rate_limit_headers(decision: &Decision, name: &str) -> Vec<(&'static str, String)> {
    if decision.source == Source::Error {
        return Vec::new();
    }
    let mut policy = format!("\"{name}\";q={}", decision.limit);
    if decision.period_ms > 0 {
        policy.push_str(&format!(";w={}", ceil_s(decision.period_ms)));
    }
    let mut fields = vec![("ratelimit-policy", policy)];
    let wait = if decision.allowed {
        i64::try_from(decision.reset_after_ms).unwrap_or(i64::MAX)
    } else {
        decision.retry_after_ms
    };
    if wait >= 0 {
        fields.push((
            "ratelimit",
            format!(
                "\"{name}\";r={};t={}",
                decision.remaining,
                ceil_s(wait as u64)
            ),
        ));
    }
    if !decision.allowed && decision.retry_after_ms >= 0 {
        fields.push((
            "retry-after",
            ceil_s(decision.retry_after_ms as u64).to_string(),
        ));
    }
    fields
}

struct Config<C: Connection> {
    limiter: RateLimiter<C>,
    spec: LimitSpec,
    key: KeyFn,
    name: String,
    cost: u64,
}

/// Limits every request of the service it wraps: `RateLimitLayer::new(limiter, limit)`, with
/// [`key`](RateLimitLayer::key), [`name`](RateLimitLayer::name) and
/// [`cost`](RateLimitLayer::cost).
pub struct RateLimitLayer<C: Connection> {
    config: Arc<Config<C>>,
}

impl<C: Connection> Clone for RateLimitLayer<C> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            config: self.config.clone(),
        }
    }
}

impl<C: Connection> RateLimitLayer<C> {
    /// Each request checked against `spec` (a `Limit` or a `Policy`) under
    /// [`default_key`]; its name in the headers: the policy's name, else `default`.
    pub fn new(limiter: RateLimiter<C>, spec: impl Into<LimitSpec>) -> Self {
        let spec = spec.into();
        let name = match &spec {
            LimitSpec::Policy(policy) => policy.name().to_string(),
            LimitSpec::Limit(_) => "default".to_string(),
        };
        RateLimitLayer {
            config: Arc::new(Config {
                limiter,
                spec,
                key: Arc::new(default_key),
                name,
                cost: 1,
            }),
        }
    }

    fn with(self, change: impl FnOnce(&mut Config<C>)) -> Self {
        let config = Arc::try_unwrap(self.config).unwrap_or_else(|shared| Config {
            limiter: shared.limiter.clone(),
            spec: shared.spec.clone(),
            key: shared.key.clone(),
            name: shared.name.clone(),
            cost: shared.cost,
        });
        let mut config = config;
        change(&mut config);
        RateLimitLayer {
            config: Arc::new(config),
        }
    }

    /// The key of a request (`None`: not limited).
    pub fn key(
        self,
        key: impl Fn(&RequestRef<'_>) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.with(|c| c.key = Arc::new(key))
    }

    /// The policy's name in the headers: a token of `A-Z a-z 0-9 _ - .`.
    pub fn name(self, name: &str) -> Result<Self, Error> {
        let good = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !good {
            return Err(Error::invalid(
                "name",
                format!("must be a token of A-Z, a-z, 0-9, '_', '-' and '.', not {name:?}"),
            ));
        }
        let name = name.to_string();
        Ok(self.with(|c| c.name = name))
    }

    /// Each request's cost (default 1).
    pub fn cost(self, cost: u64) -> Self {
        self.with(|c| c.cost = cost)
    }
}

impl<S, C: Connection> tower_layer::Layer<S> for RateLimitLayer<C> {
    type Service = RateLimit<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] makes.
pub struct RateLimit<S, C: Connection> {
    inner: S,
    config: Arc<Config<C>>,
}

impl<S: Clone, C: Connection> Clone for RateLimit<S, C> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

fn json<B: From<String>>(
    status: StatusCode,
    body: String,
    fields: &[(&'static str, String)],
) -> Response<B> {
    let mut response = Response::new(B::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    add(headers, fields);
    response
}

fn add(headers: &mut HeaderMap, fields: &[(&'static str, String)]) {
    for (name, value) in fields {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(*name, value);
        }
    }
}

impl<S, C, ReqB, ResB> tower_service::Service<Request<ReqB>> for RateLimit<S, C>
where
    S: tower_service::Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    C: Connection,
    ReqB: Send + 'static,
    ResB: From<String> + Send + 'static,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        // The service that was polled ready answers; a fresh clone stays for the next call.
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let config = self.config.clone();
        Box::pin(async move {
            let key = (config.key)(&RequestRef {
                method: req.method(),
                uri: req.uri(),
                headers: req.headers(),
                extensions: req.extensions(),
            });
            let Some(key) = key.filter(|k| !k.is_empty()) else {
                return inner.call(req).await;
            };
            let decision = match config.limiter.check(&key, &config.spec, config.cost).await {
                Ok(decision) => decision,
                Err(Error::Unavailable(_)) => {
                    return Ok(json(
                        StatusCode::SERVICE_UNAVAILABLE,
                        r#"{"error":"rate limiter unavailable"}"#.to_string(),
                        &[],
                    ))
                }
                Err(error) => {
                    log::error!(
                        "redis_ratelimit: the limit of {key} could not be checked: {error}"
                    );
                    return Ok(json(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        r#"{"error":"rate limiter error"}"#.to_string(),
                        &[],
                    ));
                }
            };
            let fields = rate_limit_headers(&decision, &config.name);
            if !decision.allowed {
                let body = format!(
                    r#"{{"error":"rate limited","policy":"{}","retry_after_ms":{}}}"#,
                    config.name, decision.retry_after_ms
                );
                return Ok(json(StatusCode::TOO_MANY_REQUESTS, body, &fields));
            }
            req.extensions_mut().insert(decision);
            let mut response = inner.call(req).await?;
            add(response.headers_mut(), &fields);
            Ok(response)
        })
    }
}
