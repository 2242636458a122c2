// Loading and matching, without Redis: every example of envoyproxy/ratelimit's README (the
// configuration as it is printed there, and the match it states), every error its loader gives,
// and our extension's.

use super::*;

fn load(text: &str) -> Result<Config, ConfigError> {
    Config::load(
        &[Source {
            name: "test.yaml".into(),
            text: text.into(),
        }],
        LoadOptions::default(),
    )
}

fn load_ok(text: &str) -> Config {
    load(text).unwrap_or_else(|e| panic!("{e}"))
}

fn load_err(text: &str) -> String {
    match load(text) {
        Ok(_) => panic!("loaded, expected an error:\n{text}"),
        Err(e) => e.to_string(),
    }
}

/// The limit a descriptor resolves to: (requests_per_unit, unit) or None.
fn limit_of(config: &Config, domain: &str, entries: &[(&str, &str)]) -> Option<(u32, Unit)> {
    config
        .get_limit(domain, entries)
        .map(|m| (m.limit.requests_per_unit, m.limit.unit.unwrap()))
}

fn stats_key(config: &Config, domain: &str, entries: &[(&str, &str)]) -> String {
    config.get_limit(domain, entries).unwrap().stats_key
}

// Example 1: two values of one key, each 500/s.
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

#[test]
fn example_1_matches_each_value() {
    let c = load_ok(EXAMPLE_1);
    assert_eq!(
        limit_of(&c, "mongo_cps", &[("database", "users")]),
        Some((500, Unit::Second))
    );
    assert_eq!(
        limit_of(&c, "mongo_cps", &[("database", "default")]),
        Some((500, Unit::Second))
    );
    assert_eq!(limit_of(&c, "mongo_cps", &[("database", "other")]), None);
    assert_eq!(limit_of(&c, "unknown", &[("database", "users")]), None);
}

// Example 2: nested descriptors; a key without a value matches any value.
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

#[test]
fn example_2_nested_and_any_value() {
    let c = load_ok(EXAMPLE_2);
    for number in ["2061111111", "2062222222"] {
        assert_eq!(
            limit_of(
                &c,
                "messaging",
                &[("message_type", "marketing"), ("to_number", number)]
            ),
            Some((5, Unit::Day))
        );
        assert_eq!(
            limit_of(&c, "messaging", &[("to_number", number)]),
            Some((100, Unit::Day))
        );
    }
    // The placeholder level has no limit of its own.
    assert_eq!(
        limit_of(&c, "messaging", &[("message_type", "marketing")]),
        None
    );
    assert_eq!(
        limit_of(
            &c,
            "messaging",
            &[("message_type", "transactional"), ("to_number", "1")]
        ),
        None
    );
}

// Example 3: the most specific match first (key_value before key).
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

#[test]
fn example_3_most_specific_first() {
    let c = load_ok(EXAMPLE_3);
    assert_eq!(
        limit_of(&c, "edge_proxy_per_ip", &[("remote_address", "50.0.0.1")]),
        Some((10, Unit::Second))
    );
    assert_eq!(
        limit_of(&c, "edge_proxy_per_ip", &[("remote_address", "50.0.0.5")]),
        Some((0, Unit::Second))
    );
}

// Example 4: a limit applies only at the depth of the request's descriptor.
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

#[test]
fn example_4_depth_must_match() {
    let request = [("key", "value"), ("subkey", "subvalue")];
    assert_eq!(
        limit_of(&load_ok(EXAMPLE_4_FLAT), "example4", &request),
        None
    );
    assert_eq!(
        limit_of(&load_ok(EXAMPLE_4_NESTED), "example4", &request),
        Some((300, Unit::Second))
    );
}

// Example 5: unlimited.
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

#[test]
fn example_5_unlimited() {
    let c = load_ok(EXAMPLE_5);
    let ldap = c.get_limit("internal", &[("ldap", "x")]).unwrap();
    assert!(ldap.limit.unlimited);
    assert_eq!(ldap.limit.spec, None);
    assert_eq!(
        limit_of(&c, "internal", &[("azure", "x")]),
        Some((100, Unit::Minute))
    );
}

// Example 6: shadow mode on one value.
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

#[test]
fn example_6_shadow_mode() {
    let c = load_ok(EXAMPLE_6);
    let a = c
        .get_limit(
            "example6",
            &[("service", "auth-service"), ("user", "user-a")],
        )
        .unwrap();
    assert!(a.limit.shadow_mode);
    assert_eq!(a.limit.requests_per_unit, 10);
    let b = c
        .get_limit(
            "example6",
            &[("service", "auth-service"), ("user", "user-b")],
        )
        .unwrap();
    assert!(!b.limit.shadow_mode);
    assert_eq!(b.limit.requests_per_unit, 20);
}

// Example 7: replaces.
pub(crate) const EXAMPLE_7: &str = r#"
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

#[test]
fn example_7_replaces_loads_names() {
    let c = load_ok(EXAMPLE_7);
    let first = c
        .get_limit("example7", &[("key_1", "value_1"), ("user", "bkthomps")])
        .unwrap();
    assert_eq!(first.limit.name, "specific_limit");
    let second = c
        .get_limit("example7", &[("key_2", "value_2"), ("user", "bkthomps")])
        .unwrap();
    assert_eq!(second.limit.replaces, vec!["specific_limit".to_owned()]);
    assert_eq!(second.limit.requests_per_unit, 10);
}

// Example 8: detailed_metric.
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

#[test]
fn example_8_detailed_metric_keys() {
    let c = load_ok(EXAMPLE_8);
    assert_eq!(
        stats_key(&c, "example8", &[("key1", "unspecified_value")]),
        "example8.key1_unspecified_value"
    );
    assert_eq!(
        stats_key(&c, "example8", &[("key1", "unspecified_value2")]),
        "example8.key1_unspecified_value2"
    );
    assert_eq!(
        stats_key(&c, "example8", &[("key1", "value1")]),
        "example8.key1_value1"
    );
    assert_eq!(
        limit_of(&c, "example8", &[("key1", "value1")]),
        Some((20, Unit::Minute))
    );
    assert_eq!(
        limit_of(&c, "example8", &[("key1", "x")]),
        Some((10, Unit::Minute))
    );
}

#[test]
fn without_detailed_metric_unspecified_values_roll_up() {
    let c = load_ok(&EXAMPLE_8.replace("    detailed_metric: true\n", ""));
    assert_eq!(stats_key(&c, "example8", &[("key1", "x")]), "example8.key1");
}

// Example 9: wildcards, trailing, middle and several.
const EXAMPLE_9_TRAILING: &str = r#"
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

#[test]
fn example_9_wildcards() {
    let c = load_ok(EXAMPLE_9_TRAILING);
    for v in ["value1", "value2", "valueXYZ", "value"] {
        assert_eq!(
            limit_of(&c, "example9", &[("key1", v)]),
            Some((20, Unit::Minute)),
            "{v}"
        );
    }
    assert_eq!(limit_of(&c, "example9", &[("key1", "valu")]), None);
    // Without share_threshold each value counts on its own (its own key); the stats keep the
    // pattern.
    assert_eq!(
        stats_key(&c, "example9", &[("key1", "value1")]),
        "example9.key1_value*"
    );

    let c = load_ok(EXAMPLE_9_MIDDLE);
    for v in ["/api/123/action", "/api/user-id/action"] {
        assert!(limit_of(&c, "example9", &[("path", v)]).is_some(), "{v}");
    }
    assert_eq!(
        limit_of(&c, "example9", &[("path", "/api/123/other")]),
        None
    );

    let c = load_ok(EXAMPLE_9_MULTIPLE);
    for v in ["/api/v1/resource/123/action", "/api/v2/resource/456/action"] {
        assert!(limit_of(&c, "example9", &[("route", v)]).is_some(), "{v}");
    }
    assert_eq!(
        limit_of(&c, "example9", &[("route", "/api/v1/resource/123/other")]),
        None
    );
}

#[test]
fn wildcard_match_edges() {
    let parts = |p: &str| p.split('*').map(str::to_owned).collect::<Vec<_>>();
    assert!(wildcard_match(&parts("a*"), "a"));
    assert!(wildcard_match(&parts("a*b"), "ab"));
    assert!(!wildcard_match(&parts("ab*ba"), "aba"));
    assert!(wildcard_match(&parts("*"), ""));
    assert!(wildcard_match(&parts("x*y*z"), "xyz"));
    assert!(!wildcard_match(&parts("x*y*z"), "xzy"));
    // Prefix and suffix match, a middle part is missing.
    assert!(!wildcard_match(&parts("x*y*z"), "xaaz"));
    assert!(!wildcard_match(
        &parts("/api/*/resource/*/action"),
        "/api/v1/other/123/action"
    ));
    assert!(wildcard_match(&parts("exact"), "exact"));
    assert!(!wildcard_match(&parts("exact"), "exactly"));
}

#[test]
fn explicit_value_wins_over_wildcard() {
    let c = load_ok(
        r#"
domain: d
descriptors:
  - key: k
    value: v*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: v1
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    rate_limit: {unit: second, requests_per_unit: 3}
"#,
    );
    assert_eq!(limit_of(&c, "d", &[("k", "v1")]), Some((2, Unit::Second)));
    assert_eq!(limit_of(&c, "d", &[("k", "v2")]), Some((1, Unit::Second)));
    assert_eq!(limit_of(&c, "d", &[("k", "w")]), Some((3, Unit::Second)));
}

// Example 10: value_to_metric.
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

#[test]
fn example_10_value_to_metric() {
    let c = load_ok(EXAMPLE_10);
    assert_eq!(
        stats_key(
            &c,
            "example10",
            &[
                ("route", "api"),
                ("http_method", "GET"),
                ("subject_id", "123")
            ]
        ),
        "example10.route_api.http_method_GET.subject_id"
    );
    assert_eq!(
        stats_key(
            &c,
            "example10",
            &[
                ("route", "web"),
                ("http_method", "POST"),
                ("subject_id", "456")
            ]
        ),
        "example10.route_web.http_method_POST.subject_id"
    );
    let plain = load_ok(&EXAMPLE_10.replace("value_to_metric: true", "value_to_metric: false"));
    assert_eq!(
        stats_key(
            &plain,
            "example10",
            &[
                ("route", "api"),
                ("http_method", "GET"),
                ("subject_id", "123")
            ]
        ),
        "example10.route.http_method.subject_id"
    );

    let c = load_ok(EXAMPLE_10_WILDCARD);
    assert_eq!(
        stats_key(
            &c,
            "example10_wildcard",
            &[
                ("user", "alice"),
                ("action", "readfile"),
                ("resource", "documents")
            ]
        ),
        "example10_wildcard.user_alice.action_readfile.resource"
    );
}

#[test]
fn detailed_metric_takes_precedence_over_value_to_metric() {
    let c = load_ok(
        r#"
domain: d
descriptors:
  - key: k
    value_to_metric: true
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
"#,
    );
    assert_eq!(stats_key(&c, "d", &[("k", "v")]), "d.k_v");
}

// Example 11: share_threshold.
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

const EXAMPLE_11_METRICS: &str = r#"
domain: example11_metrics
descriptors:
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit:
          unit: minute
          requests_per_unit: 60
"#;

#[test]
fn example_11_share_threshold_patterns() {
    let c = load_ok(EXAMPLE_11);
    let shared = c
        .get_limit("example11", &[("files", "files/a.pdf")])
        .unwrap();
    assert_eq!(shared.share_patterns, vec![Some("files/*".to_owned())]);
    let alone = c
        .get_limit("example11", &[("files_no_share", "files_no_share/a.pdf")])
        .unwrap();
    assert_eq!(alone.share_patterns, vec![None]);

    // share_threshold wins over value_to_metric: the metric keeps the pattern (as
    // envoyproxy/ratelimit's code and tests do; its README prints it without the `/*`).
    let c = load_ok(EXAMPLE_11_METRICS);
    let m = c
        .get_limit(
            "example11_metrics",
            &[("route", "api/v1"), ("method", "GET")],
        )
        .unwrap();
    assert_eq!(m.stats_key, "example11_metrics.route_api/*.method");
    assert_eq!(m.share_patterns, vec![Some("api/*".to_owned()), None]);
}

#[test]
fn the_readme_examples_load_together_as_files() {
    let sources: Vec<Source> = [
        EXAMPLE_1,
        EXAMPLE_2,
        EXAMPLE_3,
        EXAMPLE_4_NESTED,
        EXAMPLE_5,
        EXAMPLE_6,
        EXAMPLE_7,
        EXAMPLE_8,
        EXAMPLE_9_TRAILING,
        EXAMPLE_10,
        EXAMPLE_10_WILDCARD,
        EXAMPLE_11,
        EXAMPLE_11_METRICS,
    ]
    .iter()
    .enumerate()
    .map(|(i, text)| Source {
        name: format!("example{i}.yaml"),
        text: (*text).into(),
    })
    .collect();
    let c = Config::load(&sources, LoadOptions::default()).unwrap();
    assert_eq!(c.domains().count(), 13);
}

// The errors of envoyproxy/ratelimit's loader, each naming the file and the field.

#[test]
fn empty_domain() {
    let e = load_err("descriptors:\n  - key: k\n");
    assert_eq!(e, "test.yaml: domain: config file cannot have empty domain");
    assert_eq!(
        load_err("domain: \"\"\n"),
        "test.yaml: domain: config file cannot have empty domain"
    );
}

#[test]
fn duplicate_domain_unless_merged() {
    let a = Source {
        name: "a.yaml".into(),
        text: "domain: test-domain\ndescriptors:\n  - key: k1\n    rate_limit: {unit: second, requests_per_unit: 1}\n".into(),
    };
    let b = Source {
        name: "b.yaml".into(),
        text: "domain: test-domain\ndescriptors:\n  - key: k2\n    rate_limit: {unit: second, requests_per_unit: 2}\n".into(),
    };
    let e = Config::load(&[a, b], LoadOptions::default()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "b.yaml: domain: duplicate domain 'test-domain' in config file"
    );

    let a = Source {
        name: "a.yaml".into(),
        text: "domain: test-domain\ndescriptors:\n  - key: k1\n    rate_limit: {unit: second, requests_per_unit: 1}\n".into(),
    };
    let b = Source {
        name: "b.yaml".into(),
        text: "domain: test-domain\ndescriptors:\n  - key: k2\n    rate_limit: {unit: second, requests_per_unit: 2}\n".into(),
    };
    let c = Config::load(
        &[a, b],
        LoadOptions {
            merge_domains: true,
        },
    )
    .unwrap();
    assert_eq!(
        limit_of(&c, "test-domain", &[("k2", "x")]),
        Some((2, Unit::Second))
    );
    // Merged, a key both files define is a duplicate.
    let a = Source {
        name: "a.yaml".into(),
        text: "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n".into(),
    };
    let b = Source {
        name: "b.yaml".into(),
        text: "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n".into(),
    };
    let e = Config::load(
        &[a, b],
        LoadOptions {
            merge_domains: true,
        },
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "b.yaml: descriptors[0]: duplicate descriptor composite key 'test-domain.key1_value1'"
    );
}

#[test]
fn empty_key() {
    assert_eq!(
        load_err("domain: d\ndescriptors:\n  - value: v\n"),
        "test.yaml: descriptors[0].key: descriptor has empty key"
    );
    assert_eq!(
        load_err("domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: \"\"\n"),
        "test.yaml: descriptors[0].descriptors[0].key: descriptor has empty key"
    );
}

#[test]
fn duplicate_key() {
    let e = load_err(
        "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n  - key: key1\n    value: value1\n",
    );
    assert_eq!(
        e,
        "test.yaml: descriptors[1]: duplicate descriptor composite key 'test-domain.key1_value1'"
    );
    // Nested: the composite key names the path.
    let e = load_err(
        "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n      - key: b\n",
    );
    assert_eq!(
        e,
        "test.yaml: descriptors[0].descriptors[1]: duplicate descriptor composite key 'd.a.b'"
    );
}

#[test]
fn bad_unit() {
    let e = load_err(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n",
    );
    assert_eq!(
        e,
        "test.yaml: descriptors[0].rate_limit.unit: invalid rate limit unit 'foo'"
    );
    let e = load_err(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 5\n",
    );
    assert_eq!(
        e,
        "test.yaml: descriptors[0].rate_limit.unit: invalid rate limit unit ''"
    );
    let e = load_err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: unknown, requests_per_unit: 5}\n");
    assert!(e.contains("invalid rate limit unit 'unknown'"), "{e}");
}

#[test]
fn every_unit_its_release_accepts() {
    for (text, unit, seconds) in [
        ("second", Unit::Second, 1),
        ("MINUTE", Unit::Minute, 60),
        ("Hour", Unit::Hour, 3600),
        ("day", Unit::Day, 86_400),
        ("week", Unit::Week, 604_800),
        ("month", Unit::Month, 2_592_000),
        ("year", Unit::Year, 31_536_000),
    ] {
        let c = load_ok(&format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: {text}, requests_per_unit: 7}}\n"
        ));
        let m = c.get_limit("d", &[("k", "v")]).unwrap();
        assert_eq!(m.limit.unit, Some(unit));
        assert_eq!(unit.seconds(), seconds);
        assert_eq!(Unit::from_proto(unit.proto()), Some(unit));
        assert_eq!(
            m.limit.spec,
            Some(Spec::Inline {
                algorithm: Algorithm::FixedWindow,
                limit: 7,
                period_ms: seconds * 1000,
                burst: None,
                block_ms: None
            })
        );
    }
}

#[test]
fn unlimited_with_unit() {
    let e = load_err(
        "domain: d\ndescriptors:\n  - key: foo\n    rate_limit:\n      unlimited: true\n      unit: day\n      requests_per_unit: 25\n",
    );
    assert_eq!(
        e,
        "test.yaml: descriptors[0].rate_limit.unit: should not specify rate limit unit when unlimited"
    );
}

#[test]
fn replaces_errors() {
    let e = load_err(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: self\n      replaces:\n        - name: self\n      unit: second\n      requests_per_unit: 5\n",
    );
    assert_eq!(
        e,
        "test.yaml: descriptors[0].rate_limit.replaces[0].name: replaces should not contain name of same descriptor"
    );
    let e = load_err(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: a\n      replaces:\n        - name: b\n        - {}\n      unit: second\n      requests_per_unit: 5\n",
    );
    assert_eq!(
        e,
        "test.yaml: descriptors[0].rate_limit.replaces[1].name: should not have an empty replaces entry"
    );
    // Replaces without a name of its own: the entry is empty and the limit unnamed (allowed).
    load_ok("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      replaces:\n        - name: b\n      unit: second\n      requests_per_unit: 5\n");
}

#[test]
fn unknown_keys() {
    let e = load_err(
        "domain: d\ndescriptors:\n  - key: k\n    ratelimit:\n      unit: day\n      requests_per_unit: 5\n",
    );
    assert_eq!(
        e,
        "test.yaml: descriptors[0].ratelimit: config error, unknown key 'ratelimit'"
    );
    let e = load_err(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
    );
    assert_eq!(
        e,
        "test.yaml: descriptors[0].rate_limit.requestsperunit: config error, unknown key 'requestsperunit'"
    );
}

#[test]
fn non_string_key_and_non_map_list() {
    let e = load_err("0.25: test-domain\ndescriptors:\n  - key: k\n");
    assert_eq!(
        e,
        "test.yaml: config error, key is not of type string: 0.25"
    );
    let e = load_err("domain: d\ndescriptors:\n  - a\n  - b\n");
    assert_eq!(
        e,
        "test.yaml: descriptors[0]: config error, yaml file contains list of type other than map: a"
    );
}

#[test]
fn bad_yaml_names_the_file() {
    let e = load_err("'''\n");
    assert!(
        e.starts_with("test.yaml: error loading config file: "),
        "{e}"
    );
    let e = load_err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: many}\n");
    assert!(
        e.starts_with("test.yaml: error loading config file: "),
        "{e}"
    );
    let e = load_err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n");
    assert!(e.contains("error loading config file"), "{e}");
    let e = load_err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n");
    assert!(e.contains("error loading config file"), "{e}");
    let e = load_err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n");
    assert_eq!(
        e,
        "test.yaml: descriptors[0].rate_limit.requests_per_unit: error checking config"
    );
}

#[test]
fn share_threshold_needs_a_wildcard() {
    let e = load_err(
        "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    );
    assert_eq!(
        e,
        "test.yaml: descriptors[0].share_threshold: share_threshold can only be used with wildcard values (containing '*'), but found key 'k_v'"
    );
}

#[test]
fn values_keep_their_text() {
    let c = load_ok(
        "domain: d\ndescriptors:\n  - key: to_number\n    value: 2061234567\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    );
    assert!(c.get_limit("d", &[("to_number", "2061234567")]).is_some());
}

#[test]
fn metadata_and_quota_mode_are_accepted() {
    let c = load_ok(
        "domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n    metadata:\n      anything: [1, 2.5, {x: y}]\n      0.5: free-form\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    );
    assert!(c.get_limit("d", &[("k", "v")]).unwrap().limit.quota_mode);
}

#[test]
fn an_empty_file_has_an_empty_domain() {
    assert_eq!(
        load_err(""),
        "test.yaml: domain: config file cannot have empty domain"
    );
}

// Our extension, rate_limit.redis_ratelimit.

#[test]
fn extension_every_algorithm() {
    for algorithm in Algorithm::ALL {
        let burst = if algorithm.takes_burst() {
            ", burst: 20"
        } else {
            ""
        };
        let c = load_ok(&format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n      redis_ratelimit: {{algorithm: {}{burst}, block: 15m}}\n",
            algorithm.name().to_uppercase()
        ));
        let spec = c.get_limit("d", &[("k", "v")]).unwrap().limit.spec.clone();
        assert_eq!(
            spec,
            Some(Spec::Inline {
                algorithm,
                limit: 10,
                period_ms: 60_000,
                burst: algorithm.takes_burst().then_some(20),
                block_ms: Some(900_000),
            })
        );
    }
}

#[test]
fn extension_policy() {
    let c = load_ok("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n      redis_ratelimit: {policy: api-default}\n");
    let spec = c.get_limit("d", &[("k", "v")]).unwrap().limit.spec.clone();
    assert_eq!(spec, Some(Spec::Policy("api-default".into())));
    assert_eq!(
        spec.unwrap().args(),
        vec!["POLICY".to_owned(), "api-default".to_owned()]
    );
}

#[test]
fn extension_errors() {
    let base = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n      redis_ratelimit: ";
    let cases = [
        ("{algorithm: leaky}", "descriptors[0].rate_limit.redis_ratelimit.algorithm: unknown algorithm 'leaky'"),
        ("{burst: 5}", "descriptors[0].rate_limit.redis_ratelimit.burst: burst applies to token-bucket, leaky-bucket and gcra, not fixed-window"),
        ("{algorithm: gcra, burst: 0}", "descriptors[0].rate_limit.redis_ratelimit.burst: burst must be an integer from 1 to 1000000000000, got 0"),
        ("{block: 0}", "descriptors[0].rate_limit.redis_ratelimit.block: block must be a duration"),
        ("{block: 3651d}", "descriptors[0].rate_limit.redis_ratelimit.block: block must be a duration"),
        ("{block: 1w}", "descriptors[0].rate_limit.redis_ratelimit.block: block must be a duration"),
        ("{policy: p, algorithm: gcra}", "descriptors[0].rate_limit.redis_ratelimit.policy: a policy defines"),
        ("{policy: ''}", "descriptors[0].rate_limit.redis_ratelimit.policy: policy must be a name"),
    ];
    for (ext, expected) in cases {
        let e = load_err(&format!("{base}{ext}\n"));
        assert!(
            e.starts_with(&format!("test.yaml: {expected}")),
            "{ext}: {e}"
        );
    }
    let e = load_err(&format!("{base}{{algorithm: gcra, brust: 5}}\n"));
    assert!(
        e.contains("error loading config file") && e.contains("brust"),
        "{e}"
    );
    let e = load_err("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      redis_ratelimit: {algorithm: gcra}\n");
    assert_eq!(e, "test.yaml: descriptors[0].rate_limit.redis_ratelimit: has no meaning on an unlimited rate limit");
    let e =
        load_err("domain: d\ndescriptors:\n  - key: k\n    redis_ratelimit: {algorithm: gcra}\n");
    assert_eq!(e, "test.yaml: descriptors[0].redis_ratelimit: config error, 'redis_ratelimit' belongs inside a rate_limit block");
    let e = load_err("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 100001\n      redis_ratelimit: {algorithm: sliding-log}\n");
    assert!(
        e.contains("requests_per_unit must be at most 100000"),
        "{e}"
    );
}

#[test]
fn durations() {
    assert_eq!(parse_duration_ms("250ms"), Some(250));
    assert_eq!(parse_duration_ms("250"), Some(250));
    assert_eq!(parse_duration_ms("2S"), Some(2000));
    assert_eq!(parse_duration_ms("15m"), Some(900_000));
    assert_eq!(parse_duration_ms("1h"), Some(3_600_000));
    assert_eq!(parse_duration_ms("3650d"), Some(MAX_PERIOD_MS));
    assert_eq!(parse_duration_ms("3651d"), None);
    assert_eq!(parse_duration_ms("0s"), None);
    assert_eq!(parse_duration_ms("-1s"), None);
    assert_eq!(parse_duration_ms("1.5s"), None);
    assert_eq!(parse_duration_ms(""), None);
}

#[test]
fn load_dir_reads_yaml_files_recursively_sorted() {
    let dir = std::env::temp_dir().join(format!("rls-config-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("nested")).unwrap();
    std::fs::write(dir.join("a.yaml"), EXAMPLE_1).unwrap();
    std::fs::write(dir.join("nested/b.yml"), EXAMPLE_2).unwrap();
    std::fs::write(dir.join("notes.txt"), "not a config").unwrap();
    std::fs::write(dir.join(".hidden.yaml"), "domain: hidden\n").unwrap();
    let c = Config::load_dir(&dir, LoadOptions::default(), false).unwrap();
    assert_eq!(c.files, vec![".hidden.yaml", "a.yaml", "nested/b.yml"]);
    let c = Config::load_dir(&dir, LoadOptions::default(), true).unwrap();
    assert_eq!(c.files, vec!["a.yaml", "nested/b.yml"]);
    std::fs::write(dir.join("nested/c.yaml"), "domain: mongo_cps\n").unwrap();
    let e = Config::load_dir(&dir, LoadOptions::default(), true).unwrap_err();
    assert_eq!(
        e.to_string(),
        "nested/c.yaml: domain: duplicate domain 'mongo_cps' in config file"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn parse_errors_say_where_on_one_line() {
    assert_eq!(
        load_err("'''\n"),
        "test.yaml: error loading config file: line 1 column 1: unclosed quote"
    );
    assert_eq!(
        load_err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n"),
        "test.yaml: error loading config file: line 4 column 51: invalid u32"
    );
    assert_eq!(
        load_err("domain: d\ndomain: e\n"),
        "test.yaml: error loading config file: line 2 column 1: duplicate mapping key: domain"
    );
}
