//! What the README examples do not show: costs, the atomic decision and its opt-out, headers,
//! reloads, the HTTP endpoints, gRPC health, our algorithms, limit overrides, the binary itself.

use super::*;

use redis_ratelimit_rls::envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;

const TWO_LIMITS: &str = r#"
domain: api
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 3
  - key: tenant
    rate_limit:
      unit: day
      requests_per_unit: 100
"#;

fn user_and_tenant() -> RateLimitRequest {
    request(
        "api",
        vec![
            descriptor(&[("user", "alice")]),
            descriptor(&[("tenant", "acme")]),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_consumes_nothing_atomic() {
    let mut rls = Rls::start(&[("api.yaml", TWO_LIMITS)], &[]).await;
    fresh_window(86_400, Duration::from_secs(10)).await;
    for _ in 0..3 {
        assert_eq!(rls.call(user_and_tenant()).await.overall_code, OK);
    }
    for _ in 0..5 {
        let r = rls.call(user_and_tenant()).await;
        assert_eq!(codes(&r), vec![OVER, OK]);
        assert_eq!(
            r.statuses[1].limit_remaining, 97,
            "the tenant's limit lost nothing"
        );
    }
    let r = rls
        .call(request("api", vec![descriptor(&[("tenant", "acme")])]))
        .await;
    assert_eq!(r.statuses[0].limit_remaining, 96);
    assert_eq!(rls.stat("api.user", "over_limit"), 5);
    assert_eq!(rls.stat("api.user", "total_hits"), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn independent_mode_counts_each_descriptor_as_envoyproxy_does() {
    let mut rls = Rls::start(
        &[("api.yaml", TWO_LIMITS)],
        &[("RLS_DECISION", "independent")],
    )
    .await;
    fresh_window(86_400, Duration::from_secs(10)).await;
    for _ in 0..3 {
        assert_eq!(rls.call(user_and_tenant()).await.overall_code, OK);
    }
    for i in 0..5 {
        let r = rls.call(user_and_tenant()).await;
        assert_eq!(codes(&r), vec![OVER, OK]);
        assert_eq!(
            r.statuses[1].limit_remaining,
            96 - i,
            "the tenant counts every request"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_addend_of_the_request_and_of_each_descriptor() {
    let mut rls = Rls::start(&[("api.yaml", TWO_LIMITS)], &[]).await;
    fresh_window(86_400, Duration::from_secs(10)).await;
    // The request's hits_addend is every descriptor's cost.
    let mut req = user_and_tenant();
    req.hits_addend = 2;
    let r = rls.call(req).await;
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(r.statuses[1].limit_remaining, 98);
    // A descriptor's own hits_addend wins; 0 looks without consuming.
    let r = rls
        .call(request(
            "api",
            vec![
                descriptor_cost(&[("user", "alice")], 0),
                descriptor_cost(&[("tenant", "acme")], 10),
            ],
        ))
        .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 1, "cost 0 consumed nothing");
    assert_eq!(r.statuses[1].limit_remaining, 88);
    // A cost above what is left is refused, and takes nothing.
    let r = rls
        .call(request(
            "api",
            vec![descriptor_cost(&[("user", "alice")], 2)],
        ))
        .await;
    assert_eq!(r.overall_code, OVER);
    let r = rls
        .call(request(
            "api",
            vec![descriptor_cost(&[("user", "alice")], 1)],
        ))
        .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    // Above the module's largest cost: the request is refused as invalid, nothing counted.
    let e = rls
        .try_call(request(
            "api",
            vec![descriptor_cost(&[("tenant", "acme")], 2_000_000_000_000)],
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("hits_addend"), "{}", e.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_carry_the_window_like_envoyproxy() {
    let mut rls = Rls::start(&[("api.yaml", TWO_LIMITS)], &[]).await;
    let r = rls
        .call(request("api", vec![descriptor(&[("user", "bob")])]))
        .await;
    let s = &r.statuses[0];
    let limit = s.current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (3, 4));
    let reset = s.duration_until_reset.as_ref().unwrap();
    let now_s = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let expected = 86_400 - now_s % 86_400;
    assert!(
        (reset.seconds - expected as i64).abs() <= 2,
        "{reset:?} vs {expected}: the end of the epoch-aligned day"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_invalid_arguments() {
    let mut rls = Rls::start(&[("api.yaml", TWO_LIMITS)], &[]).await;
    let e = rls
        .try_call(request("", vec![descriptor(&[("user", "a")])]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(e.message(), "rate limit domain must not be empty");
    let e = rls.try_call(request("api", vec![])).await.unwrap_err();
    assert_eq!(e.message(), "rate limit descriptor list must not be empty");
    // An unknown domain limits nothing.
    let r = rls.call(one("nope", "user", "a")).await;
    assert_eq!(r.overall_code, OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_override_from_envoy_applies_as_a_fixed_window() {
    let mut rls = Rls::start(&[("api.yaml", TWO_LIMITS)], &[]).await;
    fresh_window(60, Duration::from_secs(5)).await;
    let mut d = descriptor(&[("anything", "x")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 2,
        unit: 2, // MINUTE
    });
    for remaining in [1, 0] {
        let r = rls.call(request("api", vec![d.clone()])).await;
        assert_eq!(r.statuses[0].limit_remaining, remaining);
    }
    assert_eq!(
        rls.call(request("api", vec![d.clone()])).await.overall_code,
        OVER
    );
    assert_eq!(rls.stat("api.anything_x", "over_limit"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_envoyproxy_style_and_ietf() {
    let mut rls = Rls::start(
        &[("api.yaml", TWO_LIMITS)],
        &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")],
    )
    .await;
    fresh_window(86_400, Duration::from_secs(10)).await;
    let r = rls.call(user_and_tenant()).await;
    let headers: Vec<(String, String)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    // The descriptor nearest to its limit: the user's 3 a day, 2 left.
    assert_eq!(headers[0], ("RateLimit-Limit".to_owned(), "3".to_owned()));
    assert_eq!(
        headers[1],
        ("RateLimit-Remaining".to_owned(), "2".to_owned())
    );
    assert_eq!(headers[2].0, "RateLimit-Reset");
    let reset: i64 = headers[2].1.parse().unwrap();
    assert!(reset > 0 && reset <= 86_400, "{reset}");

    let mut rls = Rls::start(
        &[("api.yaml", TWO_LIMITS)],
        &[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_LIMIT_HEADER", "x-ratelimit-limit"),
            ("LIMIT_REMAINING_HEADER", "x-ratelimit-remaining"),
            ("LIMIT_RESET_HEADER", "x-ratelimit-reset"),
        ],
    )
    .await;
    let mut req = user_and_tenant();
    req.hits_addend = 3;
    rls.call(req).await;
    let r = rls.call(user_and_tenant()).await;
    assert_eq!(r.overall_code, OVER);
    let names: Vec<&str> = r
        .response_headers_to_add
        .iter()
        .map(|h| h.key.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset"
        ]
    );
    assert_eq!(
        r.response_headers_to_add[1].value, "0",
        "the refusing descriptor"
    );

    let mut rls = Rls::start(
        &[("api.yaml", TWO_LIMITS)],
        &[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("RLS_HEADERS_FORMAT", "ietf"),
        ],
    )
    .await;
    let r = rls.call(user_and_tenant()).await;
    let h: Vec<(String, String)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    assert_eq!(
        h[0],
        (
            "RateLimit-Policy".to_owned(),
            "\"api.user\";q=3;w=86400".to_owned()
        )
    );
    assert_eq!(h[1].0, "RateLimit");
    assert!(h[1].1.starts_with("\"api.user\";r=2;t="), "{}", h[1].1);

    // Off by default.
    let mut rls = Rls::start(&[("api.yaml", TWO_LIMITS)], &[]).await;
    assert!(rls
        .call(user_and_tenant())
        .await
        .response_headers_to_add
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_a_good_file_and_keeps_the_running_config_on_a_bad_one() {
    let mut rls = Rls::start(&[("api.yaml", TWO_LIMITS)], &[]).await;
    fresh_window(86_400, Duration::from_secs(20)).await;
    let r = rls
        .call(request("api", vec![descriptor(&[("user", "carol")])]))
        .await;
    assert_eq!(r.statuses[0].limit_remaining, 2);

    rls.config.write(
        "api.yaml",
        &TWO_LIMITS.replace("requests_per_unit: 3", "requests_per_unit: 50"),
    );
    let stats = rls.running().limiter.stats.clone();
    wait_until(Duration::from_secs(10), || {
        let stats = stats.clone();
        async move {
            stats
                .config_load_success
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 2
        }
    })
    .await;
    let r = rls
        .call(request("api", vec![descriptor(&[("user", "carol")])]))
        .await;
    assert_eq!(
        r.statuses[0].limit_remaining, 48,
        "the same counter, the new limit"
    );

    // A bad file: logged, counted, and the running configuration stays.
    rls.config.write("broken.yaml", "domain: api\n");
    wait_until(Duration::from_secs(10), || {
        let stats = stats.clone();
        async move {
            stats
                .config_load_error
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 1
        }
    })
    .await;
    let r = rls
        .call(request("api", vec![descriptor(&[("user", "carol")])]))
        .await;
    assert_eq!(r.statuses[0].limit_remaining, 47);
    let (_, metrics) = rls.http("GET", "/metrics", "").await;
    assert!(
        metrics.contains("ratelimit_service_config_load_error 1"),
        "{metrics}"
    );

    // Fixed, it loads.
    std::fs::remove_file(rls.config.path.join("broken.yaml")).unwrap();
    rls.config.write("other.yaml", "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n");
    wait_until(Duration::from_secs(10), || {
        let stats = stats.clone();
        async move {
            stats
                .config_load_success
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 3
        }
    })
    .await;
    assert_eq!(
        rls.call(one("other", "k", "v")).await.statuses[0].limit_remaining,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_config_at_start_is_an_error_naming_file_and_field() {
    let redis = testkit::Server::start();
    let dir = ConfigDir::new(&[(
        "bad.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    )]);
    let e = server::start(settings(
        &format!("127.0.0.1:{}", redis.port()),
        &dir.path,
        &[],
    ))
    .await
    .err()
    .unwrap();
    assert_eq!(
        e,
        "bad.yaml: descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight'"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_json_healthcheck_and_grpc_health() {
    let rls = Rls::start(&[("api.yaml", TWO_LIMITS)], &[]).await;
    let body =
        r#"{"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "dave"}]}]}"#;
    for expected in [200, 200, 200, 429] {
        let (status, json) = rls.http("POST", "/json", body).await;
        assert_eq!(status, expected, "{json}");
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["statuses"][0]["currentLimit"]["unit"], "DAY");
        assert_eq!(v["statuses"][0]["currentLimit"]["requestsPerUnit"], 3);
        if expected == 429 {
            assert_eq!(v["overallCode"], "OVER_LIMIT");
        }
    }
    let (status, _) = rls.http("POST", "/json", "{not json").await;
    assert_eq!(status, 400);
    assert_eq!(
        rls.http("GET", "/healthcheck", "").await,
        (200, "OK".to_owned())
    );

    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let channel = Channel::from_shared(format!("http://{}", rls.running().grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let reply = health
        .check(HealthCheckRequest {
            service: server::SERVICE_NAME.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        reply.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

const ALGORITHMS: &str = r#"
domain: algo
descriptors:
  - key: bucket
    rate_limit:
      unit: minute
      requests_per_unit: 10
      redis_ratelimit: {algorithm: token-bucket, burst: 3}
  - key: sliding
    rate_limit:
      unit: hour
      requests_per_unit: 2
      redis_ratelimit: {algorithm: sliding-window}
  - key: blocked
    rate_limit:
      unit: hour
      requests_per_unit: 1
      redis_ratelimit: {block: 1h}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_extension_picks_the_algorithm() {
    let mut rls = Rls::start(&[("algo.yaml", ALGORITHMS)], &[]).await;
    // A token bucket of 10 a minute with a burst of 3: three at once, then refused.
    for remaining in [2, 1, 0] {
        let r = rls.call(one("algo", "bucket", "a")).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].limit_remaining, remaining);
    }
    let r = rls.call(one("algo", "bucket", "a")).await;
    assert_eq!(r.overall_code, OVER);
    let retry = r.statuses[0].duration_until_reset.as_ref().unwrap();
    let retry_ms = retry.seconds * 1000 + i64::from(retry.nanos / 1_000_000);
    assert!(
        retry_ms > 0 && retry_ms <= 6_000,
        "a token every 6 s: {retry:?}"
    );
    let mut con = rls.redis.client();
    let keys: Vec<String> = redis::cmd("KEYS").arg("algo*").query(&mut con).unwrap();
    assert_eq!(keys, vec!["algo_bucket_a_token-bucket:60000".to_owned()]);

    fresh_window(3600, Duration::from_secs(10)).await;
    for code in [OK, OK, OVER] {
        assert_eq!(
            rls.call(one("algo", "sliding", "a")).await.overall_code,
            code
        );
    }
    // A block: the refusal blocks the key for an hour.
    assert_eq!(rls.call(one("algo", "blocked", "a")).await.overall_code, OK);
    assert_eq!(
        rls.call(one("algo", "blocked", "a")).await.overall_code,
        OVER
    );
    let info: Vec<redis::Value> = redis::cmd("RATELIMIT.INFO")
        .arg("algo_blocked_a_fixed-window:3600000")
        .query(&mut con)
        .unwrap();
    assert!(format!("{info:?}").contains("blocked_until_ms"), "{info:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_named_in_the_config_decides() {
    let mut rls = Rls::start(
        &[(
            "p.yaml",
            "domain: p\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 2\n      redis_ratelimit: {policy: two-a-day}\n",
        )],
        &[],
    )
    .await;
    // Not defined yet: Redis refuses the command, the call fails (a deployment mistake, never OK).
    let e = rls.try_call(one("p", "k", "v")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable);
    assert!(e.message().contains("refused a command"), "{}", e.message());
    let mut con = rls.redis.client();
    let _: () = redis::cmd("RATELIMIT.POLICY")
        .arg(&["SET", "two-a-day", "fixed-window", "2", "1d"][..])
        .query(&mut con)
        .unwrap();
    fresh_window(86_400, Duration::from_secs(10)).await;
    for code in [OK, OK, OVER] {
        assert_eq!(rls.call(one("p", "k", "v")).await.overall_code, code);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_runs_on_envoyproxys_environment_variables() {
    let redis = testkit::Server::start();
    let root = testkit::make_temp_dir();
    std::fs::create_dir_all(root.join("ratelimit/config")).unwrap();
    std::fs::write(root.join("ratelimit/config/api.yaml"), TWO_LIMITS).unwrap();
    let grpc_port = testkit::free_port();
    let http_port = testkit::free_port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_redis-ratelimit-rls"))
        .env_clear()
        .env("RUNTIME_ROOT", &root)
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("REDIS_SOCKET_TYPE", "tcp")
        .env("REDIS_URL", format!("127.0.0.1:{}", redis.port()))
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", grpc_port.to_string())
        .env("HOST", "127.0.0.1")
        .env("PORT", http_port.to_string())
        .env("LOG_LEVEL", "info")
        .env("LOG_FORMAT", "json")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let guard = Kill(&mut child);
    let http_addr: std::net::SocketAddr = format!("127.0.0.1:{http_port}").parse().unwrap();
    wait_until(Duration::from_secs(20), || async {
        match tokio::net::TcpStream::connect(http_addr).await {
            Ok(_) => http(http_addr, "GET", "/healthcheck", "").await.0 == 200,
            Err(_) => false,
        }
    })
    .await;
    let channel = Channel::from_shared(format!("http://127.0.0.1:{grpc_port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = RateLimitServiceClient::new(channel);
    let r = client
        .should_rate_limit(request("api", vec![descriptor(&[("user", "erin")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.statuses[0].limit_remaining, 2);
    // SIGTERM: it stops by itself.
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(guard.0.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = guard.0.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running 10 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut log = String::new();
    use std::io::Read;
    guard
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(
        log.contains("\"@message\":\"configuration loaded\""),
        "{log}"
    );
    testkit::remove_dir(&root);
}

/// A CA and a server certificate for 127.0.0.1, made with the openssl command.
fn make_certs(dir: &Path) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("the openssl command");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=rls-test-ca",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_redis_with_a_private_ca() {
    let certs = testkit::make_temp_dir();
    make_certs(&certs);
    let tls_port = testkit::free_port();
    let path = |name: &str| certs.join(name).display().to_string();
    let redis = testkit::Server::builder()
        .config(&[
            ("tls-port", &tls_port.to_string()),
            ("tls-cert-file", &path("server.pem")),
            ("tls-key-file", &path("server.key")),
            ("tls-ca-cert-file", &path("ca.pem")),
            ("tls-auth-clients", "no"),
        ])
        .start();
    let dir = ConfigDir::new(&[("api.yaml", TWO_LIMITS)]);
    let ca = path("ca.pem");
    let running = server::start(settings(
        &format!("127.0.0.1:{tls_port}"),
        &dir.path,
        &[("REDIS_TLS", "true"), ("REDIS_TLS_CACERT", &ca)],
    ))
    .await
    .unwrap();
    let mut client = connect(&running).await;
    wait_until(Duration::from_secs(20), || async {
        http(running.http_addr, "GET", "/healthcheck", "").await.0 == 200
    })
    .await;
    fresh_window(86_400, Duration::from_secs(10)).await;
    let r = client
        .should_rate_limit(request("api", vec![descriptor(&[("user", "tls")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.statuses[0].limit_remaining, 2);
    // The counter is on that server, reached over TLS only (the plain port is another).
    let mut con = redis.client();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("api_user_tls*")
        .query(&mut con)
        .unwrap();
    assert_eq!(keys.len(), 1);
    running.stop().await;

    // Without the CA the server's certificate is not trusted: not serving, UNAVAILABLE.
    let running = server::start(settings(
        &format!("127.0.0.1:{tls_port}"),
        &dir.path,
        &[("REDIS_TLS", "true"), ("REDIS_TIMEOUT", "1s")],
    ))
    .await
    .unwrap();
    let mut client = connect(&running).await;
    let e = client
        .should_rate_limit(request("api", vec![descriptor(&[("user", "tls")])]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable);
    running.stop().await;
    testkit::remove_dir(&certs);
}
