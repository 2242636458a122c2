//! Redis stalled (SIGSTOP) or killed, the failure modes, the breaker, health; and a Redis Cluster.

use super::*;

use std::time::Instant;

const LIMIT: &str = r#"
domain: f
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 1000
  - key: tenant
    rate_limit:
      unit: day
      requests_per_unit: 1000
"#;

async fn grpc_serving(rls: &Rls) -> bool {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let channel = Channel::from_shared(format!("http://{}", rls.running().grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let reply = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: server::SERVICE_NAME.into(),
        })
        .await
        .unwrap()
        .into_inner();
    reply.status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_costs_one_timeout_then_the_breaker_answers_at_once() {
    let mut rls = Rls::start(
        &[("f.yaml", LIMIT)],
        &[
            ("REDIS_TIMEOUT", "2s"),
            ("RLS_BREAKER_FAILURES", "1"),
            ("RLS_BREAKER_COOL_DOWN", "30s"),
        ],
    )
    .await;
    assert_eq!(rls.call(one("f", "user", "a")).await.overall_code, OK);
    rls.redis.pause();
    let started = Instant::now();
    let e = rls.try_call(one("f", "user", "a")).await.unwrap_err();
    let first = started.elapsed();
    assert_eq!(e.code(), tonic::Code::Unavailable);
    assert!(
        e.message().contains("timed out") || e.message().contains("no reply within"),
        "{}",
        e.message()
    );
    assert!(
        first >= Duration::from_millis(1500),
        "waited the timeout: {first:?}"
    );
    assert!(
        first < Duration::from_secs(15),
        "bounded by the timeout: {first:?}"
    );
    // The breaker is open: the next calls do not wait.
    for _ in 0..20 {
        let started = Instant::now();
        let e = rls.try_call(one("f", "user", "a")).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable);
        assert!(e.message().contains("breaker open"), "{}", e.message());
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }
    // Health reports it.
    wait_until(Duration::from_secs(10), || async {
        rls.http("GET", "/healthcheck", "").await.0 == 500
    })
    .await;
    assert!(!grpc_serving(&rls).await);
    let (_, metrics) = rls.http("GET", "/metrics", "").await;
    assert!(
        metrics.contains("redis_ratelimit_rls_breaker_open 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("ratelimit_service_should_rate_limit_error{err_type=\"redis_error\"} 21"),
        "{metrics}"
    );
    rls.redis.resume();
    rls.wait_healthy().await;
    assert!(grpc_serving(&rls).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_closes_after_the_cool_down_when_redis_is_back() {
    let mut rls = Rls::start(
        &[("f.yaml", LIMIT)],
        &[
            ("REDIS_TIMEOUT", "300ms"),
            ("RLS_BREAKER_COOL_DOWN", "500ms"),
        ],
    )
    .await;
    rls.redis.pause();
    assert!(rls.try_call(one("f", "user", "b")).await.is_err());
    rls.redis.resume();
    wait_until(Duration::from_secs(10), || async {
        rls.client
            .clone()
            .should_rate_limit(one("f", "user", "b"))
            .await
            .is_ok()
    })
    .await;
    let r = rls.call(one("f", "user", "b")).await;
    assert_eq!(r.overall_code, OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_is_unavailable_or_ok_as_configured() {
    let mut rls = Rls::start(&[("f.yaml", LIMIT)], &[("REDIS_TIMEOUT", "500ms")]).await;
    assert_eq!(rls.call(one("f", "user", "a")).await.overall_code, OK);
    rls.redis.kill9();
    let started = Instant::now();
    let e = rls.try_call(one("f", "user", "a")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable);
    assert!(started.elapsed() < Duration::from_secs(5));
    wait_until(Duration::from_secs(10), || async {
        rls.http("GET", "/healthcheck", "").await.0 == 500
    })
    .await;

    let mut open = Rls::start(
        &[("f.yaml", LIMIT)],
        &[("REDIS_TIMEOUT", "500ms"), ("RLS_ON_REDIS_ERROR", "ok")],
    )
    .await;
    open.redis.kill9();
    for _ in 0..3 {
        let r = open
            .call(request(
                "f",
                vec![descriptor(&[("user", "a")]), descriptor(&[("tenant", "t")])],
            ))
            .await;
        assert_eq!(r.overall_code, OK, "fails open");
        assert_eq!(codes(&r), vec![OK, OK]);
    }
    assert_eq!(
        open.running()
            .limiter
            .stats
            .failed_open
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_started_before_redis_serves_once_redis_is_up() {
    // Redis is not there yet: the service starts, reports not serving, answers UNAVAILABLE.
    let port = testkit::free_port();
    let dir = ConfigDir::new(&[("f.yaml", LIMIT)]);
    let running = server::start(settings(
        &format!("127.0.0.1:{port}"),
        &dir.path,
        &[
            ("REDIS_TIMEOUT", "300ms"),
            ("RLS_BREAKER_COOL_DOWN", "100ms"),
        ],
    ))
    .await
    .unwrap();
    let mut client = connect(&running).await;
    let e = client
        .should_rate_limit(one("f", "user", "a"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable);
    assert_eq!(
        http(running.http_addr, "GET", "/healthcheck", "").await.0,
        500
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_decides_per_slot_group_or_atomically_with_the_domain_tag() {
    let cluster = testkit::cluster::Cluster::start(3, 0);
    let urls: Vec<String> = cluster
        .live()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let dir = ConfigDir::new(&[("f.yaml", LIMIT)]);
    fresh_window(86_400, Duration::from_secs(20)).await;
    let both = || {
        request(
            "f",
            vec![descriptor(&[("user", "a")]), descriptor(&[("tenant", "t")])],
        )
    };

    // Default: keys grouped by slot (here on different nodes), each group atomic.
    let running = server::start(settings(
        &urls.join(","),
        &dir.path,
        &[("REDIS_TYPE", "cluster")],
    ))
    .await
    .unwrap();
    let mut client = connect(&running).await;
    wait_until(Duration::from_secs(20), || {
        let mut c = client.clone();
        async move {
            let r = c.should_rate_limit(both()).await;
            if let Err(e) = &r {
                eprintln!("cluster not ready: {e:?}");
            }
            r.is_ok()
        }
    })
    .await;
    let mut req = both();
    req.hits_addend = 10;
    let r = client.should_rate_limit(req).await.unwrap().into_inner();
    assert_eq!(codes(&r), vec![OK, OK]);
    assert_eq!(r.statuses[0].limit_remaining, 989);
    let mut con = cluster.client();
    let user: i64 = {
        let v: Vec<i64> = redis::cmd("RATELIMIT.PEEK")
            .arg(
                &[
                    "f_user_a_fixed-window:86400000",
                    "fixed-window",
                    "1000",
                    "1d",
                    "COST",
                    "0",
                ][..],
            )
            .query(&mut con)
            .unwrap();
        v[2]
    };
    assert_eq!(user, 989);
    running.stop().await;

    // With the domain hash tag every key of the domain is on one slot: one CHECKALL.
    let running = server::start(settings(
        &urls.join(","),
        &dir.path,
        &[
            ("REDIS_TYPE", "cluster"),
            ("RLS_CLUSTER_KEYS", "domain-tag"),
        ],
    ))
    .await
    .unwrap();
    let mut client = connect(&running).await;
    wait_until(Duration::from_secs(20), || {
        let mut c = client.clone();
        async move { c.should_rate_limit(one("f", "user", "z")).await.is_ok() }
    })
    .await;
    let mut req = request(
        "f",
        vec![descriptor(&[("user", "b")]), descriptor(&[("tenant", "u")])],
    );
    req.hits_addend = 1000;
    assert_eq!(
        client
            .should_rate_limit(req)
            .await
            .unwrap()
            .into_inner()
            .overall_code,
        OK
    );
    // The user is full; a request for both is refused and takes nothing from a fresh tenant.
    let r = client
        .should_rate_limit(request(
            "f",
            vec![descriptor(&[("user", "b")]), descriptor(&[("tenant", "v")])],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(codes(&r), vec![OVER, OK]);
    assert_eq!(
        r.statuses[1].limit_remaining, 1000,
        "atomic across the cluster"
    );
    let stored: i64 = redis::cmd("EXISTS")
        .arg("{f}_tenant_v_fixed-window:86400000")
        .query(&mut con)
        .unwrap();
    assert_eq!(stored, 0, "nothing was stored for the fresh tenant");
    running.stop().await;
}

fn client_counter(rls: &Rls, what: &str) -> u64 {
    rls.running()
        .limiter
        .backend()
        .counters()
        .into_iter()
        .find(|(k, _)| k == what)
        .map_or(0, |(_, n)| n)
}

const ONE_A_DAY: &str =
    "domain: flood\ndescriptors:\n  - key: ip\n    rate_limit: {unit: day, requests_per_unit: 1}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_denial_cache_answers_a_flood_of_refusals_without_redis() {
    const FLOOD: u64 = 1000;
    let mut with = Rls::start(
        &[("flood.yaml", ONE_A_DAY)],
        &[("RLS_DENIAL_CACHE", "10000")],
    )
    .await;
    let mut without = Rls::start(&[("flood.yaml", ONE_A_DAY)], &[]).await;
    fresh_window(86_400, Duration::from_secs(30)).await;
    for rls in [&mut with, &mut without] {
        assert_eq!(
            rls.call(one("flood", "ip", "10.0.0.1")).await.overall_code,
            OK
        );
        let before = client_counter(rls, "commands");
        for _ in 0..FLOOD {
            assert_eq!(
                rls.call(one("flood", "ip", "10.0.0.1")).await.overall_code,
                OVER
            );
        }
        let commands = client_counter(rls, "commands") - before;
        eprintln!("flood of {FLOOD} refusals: {commands} Redis commands");
    }
    let cached = client_counter(&with, "commands");
    let plain = client_counter(&without, "commands");
    assert!(
        plain >= FLOOD,
        "without the cache every refusal asks Redis: {plain}"
    );
    assert!(
        cached * 100 <= plain,
        "at least 100x fewer commands with the denial cache: {cached} vs {plain}"
    );
    assert!(with.stat("flood.ip", "over_limit_with_local_cache") >= FLOOD - 1);
    // A different client is not refused by another's cached refusal.
    assert_eq!(
        with.call(one("flood", "ip", "10.0.0.2")).await.overall_code,
        OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_fallback_decides_while_redis_is_down() {
    let mut rls = Rls::start(
        &[("f.yaml", "domain: f\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 3}\n")],
        &[("RLS_ON_REDIS_ERROR", "local"), ("REDIS_TIMEOUT", "300ms")],
    )
    .await;
    fresh_window(86_400, Duration::from_secs(30)).await;
    assert_eq!(rls.call(one("f", "user", "a")).await.overall_code, OK);
    rls.redis.kill9();
    let mut codes_seen = Vec::new();
    for _ in 0..5 {
        codes_seen.push(rls.call(one("f", "user", "a")).await.overall_code);
    }
    // In process, from a fresh state: three pass, then refused (never an error).
    assert_eq!(codes_seen, vec![OK, OK, OK, OVER, OVER]);
    assert!(client_counter(&rls, "fallback") >= 5);
}
