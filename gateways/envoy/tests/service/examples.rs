//! envoyproxy/ratelimit's README examples, each configuration as printed there, each giving the
//! outcome the README states, through Envoy's gRPC API.

use super::*;

const EXAMPLE_1: &str = r#"
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_1_each_value_has_its_own_500_per_second() {
    let mut rls = Rls::start(&[("example1.yaml", EXAMPLE_1)], &[]).await;
    fresh_window(1, Duration::from_millis(950)).await;
    let mut req = one("mongo_cps", "database", "users");
    req.hits_addend = 500;
    let r = rls.call(req.clone()).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        500
    );
    let r = rls.call(one("mongo_cps", "database", "users")).await;
    assert_eq!(r.overall_code, OVER, "the 501st in the second");
    // "default" has its own 500.
    let r = rls.call(one("mongo_cps", "database", "default")).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 499);
    // A value the configuration does not name has no limit.
    let r = rls.call(one("mongo_cps", "database", "other")).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].current_limit, None);
}

const EXAMPLE_2: &str = r#"
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_2_five_marketing_messages_a_day_per_number() {
    let mut rls = Rls::start(&[("example2.yaml", EXAMPLE_2)], &[]).await;
    fresh_window(86_400, Duration::from_secs(10)).await;
    let both = |number: &str| {
        request(
            "messaging",
            vec![
                descriptor(&[("message_type", "marketing"), ("to_number", number)]),
                descriptor(&[("to_number", number)]),
            ],
        )
    };
    for i in 0..5 {
        let r = rls.call(both("2061111111")).await;
        assert_eq!(r.overall_code, OK, "marketing message {i}");
        assert_eq!(r.statuses[0].limit_remaining, 4 - i);
        assert_eq!(r.statuses[1].limit_remaining, 99 - i);
    }
    let r = rls.call(both("2061111111")).await;
    assert_eq!(
        r.overall_code, OVER,
        "the sixth marketing message of the day"
    );
    assert_eq!(codes(&r), vec![OVER, OK]);
    // Refused as a whole, it took nothing from the 100 a day (the atomic decision).
    assert_eq!(r.statuses[1].limit_remaining, 95);
    // Another number has its own five.
    let r = rls.call(both("2062222222")).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 4);
    // Non-marketing messages to the first number: 95 left of the 100.
    let r = rls
        .call(request(
            "messaging",
            vec![descriptor(&[("to_number", "2061111111")])],
        ))
        .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 94);
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().unit,
        4, // DAY
    );
}

const EXAMPLE_3: &str = r#"
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_3_the_most_specific_match_wins() {
    let mut rls = Rls::start(&[("example3.yaml", EXAMPLE_3)], &[]).await;
    fresh_window(1, Duration::from_millis(950)).await;
    // Few calls, so that they all fall in one second: nine at once, the tenth, the eleventh.
    let mut nine = one("edge_proxy_per_ip", "remote_address", "50.0.0.1");
    nine.hits_addend = 9;
    assert_eq!(rls.call(nine).await.overall_code, OK);
    let r = rls
        .call(one("edge_proxy_per_ip", "remote_address", "50.0.0.1"))
        .await;
    assert_eq!(r.overall_code, OK, "the 10th in the second");
    let r = rls
        .call(one("edge_proxy_per_ip", "remote_address", "50.0.0.1"))
        .await;
    assert_eq!(r.overall_code, OVER, "the 11th in the second");
    let r = rls
        .call(one("edge_proxy_per_ip", "remote_address", "50.0.0.5"))
        .await;
    assert_eq!(
        r.overall_code, OVER,
        "the black-listed address, from its first request"
    );
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        0
    );
}

const EXAMPLE_4_FLAT: &str = r#"
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
"#;

const EXAMPLE_4_NESTED: &str = r#"
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_4_the_depth_of_the_request_must_match() {
    let req = || {
        request(
            "example4",
            vec![descriptor(&[("key", "value"), ("subkey", "subvalue")])],
        )
    };
    let mut rls = Rls::start(&[("example4.yaml", EXAMPLE_4_FLAT)], &[]).await;
    let r = rls.call(req()).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(
        r.statuses[0].current_limit, None,
        "no match: two entries, one level"
    );

    let mut rls = Rls::start(&[("example4.yaml", EXAMPLE_4_NESTED)], &[]).await;
    let r = rls.call(req()).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        300
    );
}

const EXAMPLE_5: &str = r#"
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_5_unlimited_is_ok_with_max_remaining_and_never_asks_redis() {
    let mut rls = Rls::start(&[("example5.yaml", EXAMPLE_5)], &[]).await;
    let mut req = one("internal", "ldap", "any");
    req.hits_addend = 1_000_000;
    let calls_before = rls
        .running()
        .limiter
        .stats
        .redis_calls
        .load(std::sync::atomic::Ordering::Relaxed);
    let r = rls.call(req).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    assert_eq!(r.statuses[0].current_limit, None);
    let calls_after = rls
        .running()
        .limiter
        .stats
        .redis_calls
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        calls_before, calls_after,
        "an unlimited descriptor is decided locally"
    );
    let mut con = rls.redis.client();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    assert!(keys.is_empty(), "{keys:?}");
    fresh_window(60, Duration::from_secs(5)).await;
    let r = rls.call(one("internal", "azure", "x")).await;
    assert_eq!(r.statuses[0].limit_remaining, 99);
}

const EXAMPLE_6: &str = r#"
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_6_shadow_mode_never_limits_but_counts() {
    let mut rls = Rls::start(&[("example6.yaml", EXAMPLE_6)], &[]).await;
    fresh_window(1, Duration::from_millis(950)).await;
    let user = |u: &str| {
        request(
            "example6",
            vec![descriptor(&[("service", "auth-service"), ("user", u)])],
        )
    };
    let mut a = user("user-a");
    a.hits_addend = 10;
    assert_eq!(rls.call(a).await.overall_code, OK);
    for _ in 0..3 {
        let r = rls.call(user("user-a")).await;
        assert_eq!(r.overall_code, OK, "user-a is never limited");
        assert_eq!(r.statuses[0].code, OK);
    }
    assert_eq!(rls.stat("example6.service.user_user-a", "shadow_mode"), 3);
    assert_eq!(rls.stat("example6.service.user_user-a", "over_limit"), 3);
    let mut b = user("user-b");
    b.hits_addend = 20;
    assert_eq!(rls.call(b).await.overall_code, OK);
    assert_eq!(
        rls.call(user("user-b")).await.overall_code,
        OVER,
        "user-b is limited to 20"
    );
}

const EXAMPLE_7: &str = r#"
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_7_replaces_drops_the_named_limit() {
    let mut rls = Rls::start(&[("example7.yaml", EXAMPLE_7)], &[]).await;
    fresh_window(1, Duration::from_millis(950)).await;
    let first = || descriptor(&[("key_1", "value_1"), ("user", "bkthomps")]);
    let second = || descriptor(&[("key_2", "value_2"), ("user", "bkthomps")]);
    // Both: 10 a second, since the 5 a second is replaced and not counted (nine at once, the
    // tenth, the eleventh: few calls, all in one second).
    let mut nine = request("example7", vec![first(), second()]);
    nine.hits_addend = 9;
    let r = rls.call(nine).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].current_limit, None, "replaced");
    assert_eq!(r.statuses[1].limit_remaining, 1);
    let r = rls.call(request("example7", vec![first(), second()])).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[1].limit_remaining, 0);
    let r = rls.call(request("example7", vec![first(), second()])).await;
    assert_eq!(r.overall_code, OVER);
    // (key_1, value_1), (user, bkthomps) alone: its 5 a second untouched.
    let r = rls.call(request("example7", vec![first()])).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 4);
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().name,
        "specific_limit"
    );
}

const EXAMPLE_8: &str = r#"
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_8_detailed_metric_keys_each_value() {
    let mut rls = Rls::start(&[("example8.yaml", EXAMPLE_8)], &[]).await;
    fresh_window(60, Duration::from_secs(5)).await;
    for v in ["unspecified_value", "unspecified_value2", "value1"] {
        rls.call(one("example8", "key1", v)).await;
    }
    for key in [
        "example8.key1_unspecified_value",
        "example8.key1_unspecified_value2",
        "example8.key1_value1",
    ] {
        assert_eq!(rls.stat(key, "total_hits"), 1, "{key}");
    }
    assert_eq!(rls.stat("example8.key1", "total_hits"), 0);
    let r = rls.call(one("example8", "key1", "value1")).await;
    assert_eq!(r.statuses[0].limit_remaining, 18, "20 a minute for value1");
    let r = rls.call(one("example8", "key1", "other")).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 9,
        "10 a minute for the others"
    );
    let (status, metrics) = rls.http("GET", "/metrics", "").await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains(r#"ratelimit_service_rate_limit_total_hits{domain="example8",key="key1_unspecified_value"} 1"#),
        "{metrics}"
    );
}

const EXAMPLE_9: &str = r#"
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#;

const EXAMPLE_9_MIDDLE: &str = r#"
domain: example9
descriptors:
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#;

const EXAMPLE_9_MULTIPLE: &str = r#"
domain: example9
descriptors:
  - key: route
    value: /api/*/resource/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_9_wildcards_match_and_count_each_value() {
    let mut rls = Rls::start(&[("example9.yaml", EXAMPLE_9)], &[]).await;
    fresh_window(60, Duration::from_secs(5)).await;
    let mut twenty = one("example9", "key1", "value1");
    twenty.hits_addend = 20;
    assert_eq!(rls.call(twenty).await.overall_code, OK);
    assert_eq!(
        rls.call(one("example9", "key1", "value1"))
            .await
            .overall_code,
        OVER
    );
    // Without share_threshold each matching value has its own 20.
    for v in ["value2", "valueXYZ"] {
        let r = rls.call(one("example9", "key1", v)).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].limit_remaining, 19, "{v}");
    }
    let r = rls.call(one("example9", "key1", "other")).await;
    assert_eq!(r.statuses[0].current_limit, None);

    let mut rls = Rls::start(&[("example9.yaml", EXAMPLE_9_MIDDLE)], &[]).await;
    for (v, limited) in [
        ("/api/123/action", true),
        ("/api/user-id/action", true),
        ("/api/123/other", false),
    ] {
        let r = rls.call(one("example9", "path", v)).await;
        assert_eq!(r.statuses[0].current_limit.is_some(), limited, "{v}");
    }
    let mut rls = Rls::start(&[("example9.yaml", EXAMPLE_9_MULTIPLE)], &[]).await;
    for (v, limited) in [
        ("/api/v1/resource/123/action", true),
        ("/api/v2/resource/456/action", true),
        ("/api/v2/resource/456", false),
        ("/api/v2/other/456/action", false),
    ] {
        let r = rls.call(one("example9", "route", v)).await;
        assert_eq!(r.statuses[0].current_limit.is_some(), limited, "{v}");
    }
}

const EXAMPLE_10: &str = r#"
domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit:
              unit: minute
              requests_per_unit: 60
"#;

const EXAMPLE_10_WILDCARD: &str = r#"
domain: example10_wildcard
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit:
              unit: minute
              requests_per_unit: 100
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_10_value_to_metric_names_the_values() {
    let mut rls = Rls::start(
        &[
            ("example10.yaml", EXAMPLE_10),
            ("example10_wildcard.yaml", EXAMPLE_10_WILDCARD),
        ],
        &[],
    )
    .await;
    rls.call(request(
        "example10",
        vec![descriptor(&[
            ("route", "api"),
            ("http_method", "GET"),
            ("subject_id", "123"),
        ])],
    ))
    .await;
    rls.call(request(
        "example10",
        vec![descriptor(&[
            ("route", "web"),
            ("http_method", "POST"),
            ("subject_id", "456"),
        ])],
    ))
    .await;
    rls.call(request(
        "example10_wildcard",
        vec![descriptor(&[
            ("user", "alice"),
            ("action", "readfile"),
            ("resource", "documents"),
        ])],
    ))
    .await;
    assert_eq!(
        rls.stat(
            "example10.route_api.http_method_GET.subject_id",
            "total_hits"
        ),
        1
    );
    assert_eq!(
        rls.stat(
            "example10.route_web.http_method_POST.subject_id",
            "total_hits"
        ),
        1
    );
    assert_eq!(
        rls.stat(
            "example10_wildcard.user_alice.action_readfile.resource",
            "total_hits"
        ),
        1
    );
}

const EXAMPLE_11: &str = r#"
domain: example11
descriptors:
  # With share_threshold: true, all files/* matches share the same threshold
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10

  # Without share_threshold, each files_no_share/* match has its own isolated threshold
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit:
      unit: hour
      requests_per_unit: 10
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_11_share_threshold_shares_one_counter() {
    let mut rls = Rls::start(&[("example11.yaml", EXAMPLE_11)], &[]).await;
    fresh_window(3600, Duration::from_secs(10)).await;
    for _ in 0..5 {
        assert_eq!(
            rls.call(one("example11", "files", "files/a.pdf"))
                .await
                .overall_code,
            OK
        );
        assert_eq!(
            rls.call(one("example11", "files", "files/b.csv"))
                .await
                .overall_code,
            OK
        );
    }
    let r = rls.call(one("example11", "files", "files/c.txt")).await;
    assert_eq!(r.overall_code, OVER, "5 + 5 of a shared 10 an hour");

    for _ in 0..10 {
        assert_eq!(
            rls.call(one("example11", "files_no_share", "files_no_share/a.pdf"))
                .await
                .overall_code,
            OK
        );
    }
    assert_eq!(
        rls.call(one("example11", "files_no_share", "files_no_share/a.pdf"))
            .await
            .overall_code,
        OVER
    );
    let r = rls
        .call(one("example11", "files_no_share", "files_no_share/b.csv"))
        .await;
    assert_eq!(r.overall_code, OK, "b.csv has its own 10");
    assert_eq!(r.statuses[0].limit_remaining, 9);
}
