//! `rls-bench`: load for the service, and the baseline it is measured against.
//!
//! ```text
//! rls-bench grpc     --redis-port P [--descriptors 1|3] [--clients C] [--requests N] [--keys K]
//!                    [--algorithm fixed-window|sliding-window|...] [--warm]
//! rls-bench baseline --redis-port P [--descriptors 1|3] [--clients C] [--requests N] [--keys K]
//! ```
//!
//! `grpc` starts the service in process on a free loopback port (its Redis the server on port P,
//! which must have the module) and sends `ShouldRateLimit` requests from C concurrent gRPC clients
//! (Envoy's generated client), each request 1 or 3 descriptors (user, tenant, route) over K
//! distinct values, every one admitted; it prints requests/s and latency percentiles. `baseline`
//! sends what envoyproxy/ratelimit's fixed-window cache sends per request: one pipeline of
//! `INCRBY key hits` + `EXPIRE key unit` per descriptor. `--warm` first makes every key once
//! (unmeasured), so that a measured run creates none. `RLS_BENCH_READY` is a shell command run
//! once the warm-up is done and the clients are connected (the profile script turns callgrind's
//! instrumentation on there).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_ratelimit_rls::envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use redis_ratelimit_rls::envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use redis_ratelimit_rls::envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use redis_ratelimit_rls::envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use redis_ratelimit_rls::settings::Settings;

struct Args {
    mode: String,
    redis_port: u16,
    descriptors: usize,
    clients: usize,
    requests: u64,
    keys: u64,
    algorithm: String,
    warm: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mode = it
        .next()
        .ok_or("usage: rls-bench grpc|baseline --redis-port P ...")?;
    if mode != "grpc" && mode != "baseline" {
        return Err(format!("unknown mode '{mode}': grpc or baseline"));
    }
    let mut args = Args {
        mode,
        redis_port: 0,
        descriptors: 1,
        clients: 16,
        requests: 20_000,
        keys: 10_000,
        algorithm: "fixed-window".into(),
        warm: false,
    };
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        let number = |name: &str, v: String| -> Result<u64, String> {
            v.parse()
                .map_err(|_| format!("{name}: expected a number, got '{v}'"))
        };
        match flag.as_str() {
            "--redis-port" => {
                let v = value("--redis-port")?;
                args.redis_port = number("--redis-port", v)? as u16;
            }
            "--descriptors" => {
                let v = value("--descriptors")?;
                args.descriptors = number("--descriptors", v)? as usize;
                if !(1..=3).contains(&args.descriptors) {
                    return Err("--descriptors: 1, 2 or 3".into());
                }
            }
            "--clients" => {
                let v = value("--clients")?;
                args.clients = number("--clients", v)?.max(1) as usize;
            }
            "--requests" => {
                let v = value("--requests")?;
                args.requests = number("--requests", v)?;
            }
            "--keys" => {
                let v = value("--keys")?;
                args.keys = number("--keys", v)?.max(1);
            }
            "--algorithm" => args.algorithm = value("--algorithm")?,
            "--warm" => args.warm = true,
            other => return Err(format!("unknown argument '{other}'")),
        }
    }
    if args.redis_port == 0 {
        return Err("--redis-port is required".into());
    }
    Ok(args)
}

const KEYS: [&str; 3] = ["user", "tenant", "route"];

fn value_of(i: u64, d: usize, keys: u64) -> String {
    // A permutation of 0..keys for i in 0..keys (7919 is prime: keep `keys` no multiple of it),
    // so the warm-up makes every key a measured run uses.
    format!("v{}", (i.wrapping_mul(7919) + d as u64 * 1013) % keys)
}

fn request_for(i: u64, descriptors: usize, keys: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: (0..descriptors)
            .map(|d| RateLimitDescriptor {
                entries: vec![Entry {
                    key: KEYS[d].into(),
                    value: value_of(i, d, keys),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

fn ready_hook() {
    if let Ok(cmd) = std::env::var("RLS_BENCH_READY") {
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(&cmd)
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!("rls-bench: RLS_BENCH_READY failed: {cmd}");
        }
    }
}

/// Runs `requests` calls of `one(i)` from `clients` tasks; returns (elapsed, latencies in µs).
async fn drive<F, Fut>(clients: usize, requests: u64, start: u64, one: F) -> (Duration, Vec<u64>)
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    let next = Arc::new(AtomicU64::new(0));
    let one = Arc::new(one);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let next = next.clone();
        let one = one.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests {
                    break;
                }
                let t = Instant::now();
                if let Err(e) = one(c, start + i).await {
                    eprintln!("rls-bench: request failed: {e}");
                    std::process::exit(1);
                }
                lat.push(t.elapsed().as_micros() as u64);
            }
            lat
        }));
    }
    let mut all = Vec::with_capacity(requests as usize);
    for t in tasks {
        all.extend(t.await.unwrap_or_default());
    }
    (started.elapsed(), all)
}

fn report(args: &Args, elapsed: Duration, mut lat: Vec<u64>) {
    lat.sort_unstable();
    let rps = lat.len() as f64 / elapsed.as_secs_f64();
    println!(
        "mode={} algorithm={} descriptors={} clients={} requests={} rps={:.0} p50_us={} p99_us={} max_us={}",
        args.mode,
        if args.mode == "grpc" { args.algorithm.as_str() } else { "incrby+expire" },
        args.descriptors,
        args.clients,
        lat.len(),
        rps,
        percentile(&lat, 0.50),
        percentile(&lat, 0.99),
        lat.last().copied().unwrap_or(0),
    );
}

async fn run_grpc(args: Args) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("rls-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut yaml = String::from("domain: bench\ndescriptors:\n");
    for key in KEYS {
        yaml.push_str(&format!(
            "  - key: {key}\n    rate_limit:\n      unit: day\n      requests_per_unit: 1000000000\n      redis_ratelimit: {{algorithm: {}}}\n",
            args.algorithm
        ));
    }
    std::fs::write(dir.join("bench.yaml"), yaml).map_err(|e| e.to_string())?;
    let vars: HashMap<String, String> = [
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_TIMEOUT", "5s"),
        ("RLS_CONFIG_POLL_INTERVAL", "1h"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .chain([(
        "REDIS_URL".to_owned(),
        format!("127.0.0.1:{}", args.redis_port),
    )])
    .collect();
    let settings =
        Settings::from_env_and_args(&vars, &["--config".into(), dir.display().to_string()])
            .map_err(|e| e.to_string())?;
    let running = redis_ratelimit_rls::server::start(settings).await?;
    let url = format!("http://{}", running.grpc_addr);
    let mut clients = Vec::new();
    for _ in 0..args.clients {
        let channel = tonic::transport::Channel::from_shared(url.clone())
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        clients.push(RateLimitServiceClient::new(channel));
    }
    let clients = Arc::new(clients);
    let (descriptors, keys) = (args.descriptors, args.keys);
    let call = move |c: usize, i: u64| {
        let mut client = clients[c].clone();
        async move {
            let r = client
                .should_rate_limit(request_for(i, descriptors, keys))
                .await
                .map_err(|s| format!("{s:?}"))?
                .into_inner();
            if r.overall_code != 1 {
                return Err(format!("refused: {r:?}"));
            }
            Ok(())
        }
    };
    if args.warm {
        drive(args.clients, args.keys, 0, call.clone()).await;
    }
    ready_hook();
    let (elapsed, lat) = drive(args.clients, args.requests, 0, call).await;
    report(&args, elapsed, lat);
    running.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

async fn run_baseline(args: Args) -> Result<(), String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/", args.redis_port))
        .map_err(|e| e.to_string())?;
    let conn = client
        .get_multiplexed_tokio_connection()
        .await
        .map_err(|e| e.to_string())?;
    let (descriptors, keys) = (args.descriptors, args.keys);
    let call = move |_c: usize, i: u64| {
        let mut conn = conn.clone();
        async move {
            // envoyproxy/ratelimit's key: prefix, domain, key_value, the window's start.
            let window = 1_796_000_000u64 / 86_400 * 86_400;
            let mut pipe = redis::pipe();
            for (d, name) in KEYS.iter().enumerate().take(descriptors) {
                let key = format!("bench_{name}_{}_{window}", value_of(i, d, keys));
                pipe.cmd("INCRBY").arg(&key).arg(1);
                pipe.cmd("EXPIRE").arg(&key).arg(86_400).ignore();
            }
            let _: Vec<i64> = pipe
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        }
    };
    if args.warm {
        drive(args.clients, args.keys, 0, call.clone()).await;
    }
    ready_hook();
    let (elapsed, lat) = drive(args.clients, args.requests, 0, call).await;
    report(&args, elapsed, lat);
    Ok(())
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rls-bench: {e}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| {
            eprintln!("rls-bench: {e}");
            std::process::exit(1)
        });
    let result = runtime.block_on(async move {
        if args.mode == "grpc" {
            run_grpc(args).await
        } else {
            run_baseline(args).await
        }
    });
    if let Err(e) = result {
        eprintln!("rls-bench: {e}");
        std::process::exit(1);
    }
}
