//! RateLimitLayer in an axum app, over real HTTP: the headers the Python and Node middleware
//! send, 429 with Retry-After and the JSON body, keyless requests limited per peer address,
//! 503 when failing closed, no headers when failing open; and the README's app (the example
//! examples/axum_app.rs, which the README shows verbatim), built and run.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use redis_ratelimit_client::tower::RateLimitLayer;
use redis_ratelimit_client::{Algorithm, Decision, Limit, OnError, Options, Policy, RateLimiter};

struct Answer {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

/// One HTTP/1.1 GET on a connection of its own (`headers`: extra request headers).
async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let mut request = hyper::Request::get(path).header("host", "localhost");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = sender
        .send_request(request.body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap().to_string()))
        .collect();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

async fn serve(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

fn handler_app(layer: RateLimitLayer<redis::aio::ConnectionManager>) -> axum::Router {
    // The handler sees the decision in the request's extensions.
    let hello = |request: axum::extract::Request| async move {
        let remaining = request.extensions().get::<Decision>().map(|d| d.remaining);
        format!("hello, remaining {remaining:?}")
    };
    axum::Router::new()
        .route("/", axum::routing::get(hello))
        .layer(layer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_limits_and_sends_the_packages_headers() {
    let Some(server) = module_server() else {
        return;
    };
    let limiter = RateLimiter::new(manager(&server, true).await, Options::default()).unwrap();
    let limit = Limit::new(Algorithm::FixedWindow, 3, "1h").unwrap();
    let addr = serve(handler_app(RateLimitLayer::new(limiter.clone(), limit))).await;

    // Keyless requests: limited per peer address (ip:127.0.0.1).
    let first = get(addr, "/", &[]).await;
    assert_eq!(
        (first.status, first.body.as_str()),
        (200, "hello, remaining Some(2)")
    );
    assert_eq!(first.headers["ratelimit-policy"], r#""default";q=3;w=3600"#);
    assert!(
        first.headers["ratelimit"].starts_with(r#""default";r=2;t="#),
        "{:?}",
        first.headers
    );
    get(addr, "/", &[]).await;
    get(addr, "/", &[]).await;
    let refused = get(addr, "/", &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.headers["content-type"], "application/json");
    assert_eq!(
        refused.headers["ratelimit-policy"],
        r#""default";q=3;w=3600"#
    );
    let retry: u64 = refused.headers["retry-after"].parse().unwrap();
    assert!((1..=3600).contains(&retry), "{retry}"); // the epoch-aligned window's end
    assert_eq!(
        refused.headers["ratelimit"],
        format!(r#""default";r=0;t={retry}"#)
    );
    let body = refused.body;
    assert!(
        body.starts_with(r#"{"error":"rate limited","policy":"default","retry_after_ms":"#),
        "{body}"
    );
    // The identity header: a key of its own.
    let keyed = get(addr, "/", &[("x-api-key", "alice")]).await;
    assert_eq!(keyed.status, 200);
    assert_eq!(
        limiter
            .peek(
                "key:alice",
                &Limit::new(Algorithm::FixedWindow, 3, "1h").unwrap(),
                0
            )
            .await
            .unwrap()
            .remaining,
        2
    );
    assert_eq!(
        limiter
            .peek(
                "ip:127.0.0.1",
                &Limit::new(Algorithm::FixedWindow, 3, "1h").unwrap(),
                0
            )
            .await
            .unwrap()
            .remaining,
        0
    );

    // A policy: its name in the headers, its definition's period.
    limiter
        .policies()
        .set(
            "per-minute",
            &Limit::new(Algorithm::TokenBucket, 5, "1m").unwrap(),
            false,
        )
        .await
        .unwrap();
    let layer = RateLimitLayer::new(limiter.clone(), Policy::new("per-minute").unwrap()).key(|r| {
        r.headers
            .get("x-tenant")
            .and_then(|v| v.to_str().ok())
            .map(|t| format!("tenant:{t}"))
    });
    let addr = serve(handler_app(layer)).await;
    let answer = get(addr, "/", &[("x-tenant", "acme")]).await;
    assert_eq!(
        answer.headers["ratelimit-policy"],
        r#""per-minute";q=5;w=60"#
    );
    assert_eq!(answer.headers["ratelimit"], r#""per-minute";r=4;t=12"#);
    // No key: not limited, no headers.
    let free = get(addr, "/", &[]).await;
    assert_eq!(free.status, 200);
    assert!(!free.headers.contains_key("ratelimit"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_answers_503_closed_and_passes_open() {
    let server = Server::start_without_module();
    let limit = Limit::new(Algorithm::FixedWindow, 3, "1h").unwrap();
    let open = RateLimiter::new(manager(&server, false).await, Options::default()).unwrap();
    let closed = RateLimiter::new(
        manager(&server, false).await,
        Options {
            on_error: OnError::Closed,
            ..Options::default()
        },
    )
    .unwrap();
    let open_addr = serve(handler_app(RateLimitLayer::new(open, limit.clone()))).await;
    let closed_addr = serve(handler_app(RateLimitLayer::new(closed, limit))).await;
    assert_eq!(get(open_addr, "/", &[]).await.status, 200);
    server.pause();
    let answer = get(closed_addr, "/", &[]).await;
    assert_eq!(
        (answer.status, answer.body.as_str()),
        (503, r#"{"error":"rate limiter unavailable"}"#)
    );
    let answer = get(open_addr, "/", &[]).await;
    assert_eq!(answer.status, 200);
    assert!(
        !answer.headers.contains_key("ratelimit-policy"),
        "failing open: nothing known"
    );
    server.resume();
}

/// The README's app: its code block is examples/axum_app.rs, which is built and run here
/// against a server, then asked over HTTP until it refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_app_runs_and_limits() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/axum_app.rs"))
            .unwrap();
    let block = readme
        .split("```rust\n")
        .find_map(|part| {
            part.split("```")
                .next()
                .filter(|code| code.contains("RateLimitLayer::new"))
        })
        .expect("the README has the axum app");
    assert_eq!(
        block, example,
        "the README shows examples/axum_app.rs verbatim"
    );
    let Some(server) = module_server() else {
        return;
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            "redis-ratelimit-client",
            "--example",
            "axum_app",
            "--features",
            "axum",
        ])
        .status()
        .unwrap();
    assert!(status.success());
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| redis_ratelimit_testkit::repo_root().join("target"));
    let port = redis_ratelimit_testkit::free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    /// The app, killed when the test ends (also when an assertion fails).
    struct App(std::process::Child);
    impl Drop for App {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let app = App(Command::new(target.join("debug/examples/axum_app"))
        .env("REDIS_URL", server.url())
        .env("ADDR", addr.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < deadline, "the app never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = get(addr, "/", &[]).await;
    assert_eq!((first.status, first.body.as_str()), (200, "hello\n"));
    assert_eq!(first.headers["ratelimit-policy"], r#""default";q=100;w=60"#);
    let mut statuses = Vec::new();
    for _ in 0..100 {
        statuses.push(get(addr, "/", &[]).await.status);
    }
    drop(app);
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 99);
    assert_eq!(
        statuses.last(),
        Some(&429),
        "the 101st keyless request is refused"
    );
}
