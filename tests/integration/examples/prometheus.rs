//! examples/prometheus: `INFO ratelimit` reaches Prometheus through prometheus-redis-exporter
//! and the example's `--script`, every counter equal to what the server says.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::harness::{App, Example};
use crate::common::{future_base_ms, skip, Server};

/// `GET /metrics` from the exporter: the exposition text.
fn scrape(app: &App) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", app.port)).expect("connect to the exporter");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read /metrics");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    body.to_string()
}

/// The `redis_script_values` gauges of a scrape, by their `key` label.
fn script_values(metrics: &str) -> HashMap<String, f64> {
    metrics
        .lines()
        .filter_map(|line| line.strip_prefix("redis_script_values{key=\""))
        .map(|rest| {
            let (key, value) = rest.split_once("\"} ").expect("a gauge line");
            (key.to_string(), value.parse().expect("a number"))
        })
        .collect()
}

#[test]
fn the_exporter_shows_every_counter_of_info_ratelimit_per_algorithm_and_per_policy() {
    if let Err(why) = super::harness::ready(Example::Prometheus) {
        return skip(&why);
    }
    let server = Server::start();
    let mut con = server.client();
    let mut call = |args: &[&str]| {
        redis::cmd(args[0])
            .arg(&args[1..])
            .query::<redis::Value>(&mut con)
            .unwrap();
    };
    call(&[
        "RATELIMIT.POLICY",
        "SET",
        "api.search",
        "sliding-window",
        "2",
        "1m",
    ]);
    call(&[
        "RATELIMIT.POLICY",
        "SET",
        "login_v2",
        "fixed-window",
        "1",
        "1h",
        "SHADOW",
    ]);
    call(&[
        "RATELIMIT.POLICY",
        "SET",
        "abuse",
        "token-bucket",
        "1",
        "1h",
        "BLOCK",
        "1h",
    ]);
    // Every call at one time ahead. On the server's clock `user:42` (one a second) expires a
    // second after its call, and the live-key counter with it, maybe between the scrape and the
    // INFO below; and an hour's window could end between the calls.
    let t = future_base_ms().to_string();
    let t = t.as_str();
    for _ in 0..3 {
        call(&[
            "RATELIMIT.CHECK",
            "api:alice",
            "POLICY",
            "api.search",
            "AT",
            t,
        ]);
        call(&[
            "RATELIMIT.CHECK",
            "login:alice",
            "POLICY",
            "login_v2",
            "AT",
            t,
        ]);
        call(&["RATELIMIT.CHECK", "abuser", "POLICY", "abuse", "AT", t]);
        call(&["RATELIMIT.CHECK", "user:42", "gcra", "1", "1s", "AT", t]);
    }
    call(&[
        "RATELIMIT.CHECK",
        "sms:1",
        "sliding-log",
        "3",
        "1h",
        "COST",
        "2",
        "AT",
        t,
    ]);
    // Refused by its second limit (api:alice is full): nothing stored on the first.
    call(&[
        "RATELIMIT.CHECKALL",
        "2",
        "q",
        "api:alice",
        "leaky-bucket",
        "5",
        "1s",
        "POLICY",
        "api.search",
        "AT",
        t,
    ]);

    let exporter = App::start(Example::Prometheus, &server.url(), &[]);
    let metrics = scrape(&exporter);
    assert!(metrics.contains("\nredis_up 1\n"), "{metrics}");
    let exported = script_values(&metrics);
    let info = server.info("ratelimit");

    let mut compared = 0;
    for (field, value) in &info {
        let Ok(value) = value.parse::<f64>() else {
            continue; // ratelimit_server, ratelimit_apis, the policies' lines
        };
        let name = field.strip_prefix("ratelimit_").unwrap();
        let key = match name.rsplit_once('_') {
            _ if name == "policies" => "ratelimit_policies".to_string(),
            Some((algorithm, counter)) => format!("ratelimit:{algorithm}:{counter}"),
            None => panic!("an INFO field without a counter: {field}"),
        };
        assert_eq!(
            exported.get(&key),
            Some(&value),
            "{key} (INFO {field}:{value})"
        );
        compared += 1;
    }
    // 5 counters per algorithm (6, and `concurrency` where the module has leases), and the
    // policy count.
    assert!(compared > 6 * 5, "{compared} counters compared: {info:?}");
    for policy in ["api.search", "login_v2", "abuse"] {
        let line = &info[&format!("ratelimit_policy_{policy}")];
        for pair in line.split(',') {
            let (counter, value) = pair.split_once('=').unwrap();
            let key = format!("ratelimit_policy:{policy}:{counter}");
            assert_eq!(
                exported.get(&key),
                Some(&value.parse().unwrap()),
                "{key} (INFO {line})"
            );
        }
    }
    // The calls above, as the dashboard shows them: per-policy rejections, shadow rejections,
    // blocks.
    let get = |key: &str| exported[key];
    assert_eq!(get("ratelimit_policy:api.search:rejected"), 2.0);
    assert_eq!(get("ratelimit_policy:login_v2:shadow_rejected"), 2.0);
    assert_eq!(get("ratelimit_policy:abuse:blocked"), 1.0);
    assert_eq!(get("ratelimit:gcra:rejected"), 2.0);
    assert_eq!(get("ratelimit:sliding_log:allowed"), 1.0);
    assert_eq!(
        get("ratelimit:leaky_bucket:keys"),
        0.0,
        "a refused CHECKALL stores nothing"
    );
}
