//! examples/fastapi and examples/express: the same API in two ecosystems, held to the same
//! answers. Each test runs once per app (the `both!` macro below).

use serde_json::{json, Value};

use super::harness::{get, ready, request, unreachable_redis_url, App, Example, Response};
use crate::common::{skip, Server};

/// `examples` unless the test names another.
const POLICY: &str = "examples";

/// The apps' first test plan: a request without a key, six with key `a`, one with `b`, then on
/// `c`: a GET, a failing job (a 500: refunded), a GET.
fn limits_plan() -> Value {
    let mut rounds = vec![json!([get("")])];
    rounds.extend((0..6).map(|_| json!([get("a")])));
    rounds.push(json!([get("b")]));
    rounds.push(json!([get("c")]));
    rounds.push(json!([request(
        "POST",
        "/jobs",
        "c",
        Some(json!({ "fail": true, "work_ms": 0 }))
    )]));
    rounds.push(json!([get("c")]));
    Value::Array(rounds)
}

/// What a limited 200 must carry: the policy's `q` and `w`, and `r` as given; `t` within the
/// time a sliding window of 10 s can take to become fresh again (20 s).
fn assert_admitted(response: &Response, policy: &str, q: u64, w: u64, r: u64) {
    assert_eq!(response.status, 200, "{response:?}");
    assert_eq!(
        response.header("ratelimit-policy"),
        Some(format!("\"{policy}\";q={q};w={w}").as_str()),
        "{response:?}"
    );
    let (name, remaining, t) = response.ratelimit().expect("a RateLimit header");
    assert_eq!((name.as_str(), remaining), (policy, r), "{response:?}");
    assert!(
        (1..=2 * w).contains(&t),
        "t={t} out of 1..={}: {response:?}",
        2 * w
    );
    assert_eq!(response.header("retry-after"), None, "{response:?}");
}

/// Whether a request without a key is limited by the client's address (Express: the package's
/// middleware does it) or refused with a 401 (FastAPI).
fn keyless_limited(example: Example) -> bool {
    matches!(example, Example::Express)
}

/// The answers every engine must give to [`limits_plan`], checked field by field: they are
/// the same for the module and the library, and for both apps but for the keyless request.
fn assert_limits(example: Example, rounds: &[Vec<Response>]) {
    let responses: Vec<&Response> = rounds.iter().map(|round| &round[0]).collect();
    let no_key = responses[0];
    if keyless_limited(example) {
        // Counted under the client's address, as any caller.
        assert_admitted(no_key, POLICY, 5, 10, 4);
    } else {
        assert_eq!(no_key.status, 401, "{no_key:?}");
        assert_eq!(no_key.header("ratelimit"), None, "not limited: {no_key:?}");
    }
    for (i, response) in responses[1..6].iter().enumerate() {
        assert_admitted(response, POLICY, 5, 10, 4 - i as u64);
        assert_eq!(response.body, json!("ok"));
    }
    let sixth = responses[6];
    assert_eq!(
        sixth.status, 429,
        "the 6th request of a key within 10 s: {sixth:?}"
    );
    let (name, remaining, t) = sixth.ratelimit().expect("a RateLimit header on the 429");
    assert_eq!((name.as_str(), remaining), (POLICY, 0), "{sixth:?}");
    let retry_after = sixth.retry_after().expect("Retry-After on the 429");
    assert_eq!(
        t, retry_after,
        "RateLimit's t is Retry-After on a 429: {sixth:?}"
    );
    let retry_ms = sixth.body["retry_after_ms"]
        .as_u64()
        .expect("retry_after_ms");
    // At most 12 s: the 6th fits again 2 s into the next window, when the 5 weigh 4.
    assert!((1..=12_000).contains(&retry_ms), "{sixth:?}");
    assert_eq!(retry_after, retry_ms.div_ceil(1000), "{sixth:?}");
    assert_eq!(
        sixth.body["policy"], POLICY,
        "the body names the policy: {sixth:?}"
    );
    assert_eq!(
        sixth.header("ratelimit-policy"),
        Some("\"examples\";q=5;w=10")
    );
    assert_admitted(responses[7], POLICY, 5, 10, 4); // another key is unaffected
    assert_admitted(responses[8], POLICY, 5, 10, 4);
    let failed = responses[9];
    assert_eq!(failed.status, 500, "the failing job: {failed:?}");
    let (_, remaining, _) = failed.ratelimit().expect("the refund's headers on the 500");
    assert_eq!(remaining, 4, "the 500 shows the refund: {failed:?}");
    // The failed job's cost was given back: the next request finds 3 left, not 2.
    assert_admitted(responses[10], POLICY, 5, 10, 3);
}

/// How many sliding-window decisions `INFO ratelimit` counts.
fn sliding_window_calls(server: &Server) -> u64 {
    server
        .info_field("ratelimit", "ratelimit_sliding_window_calls")
        .parse()
        .unwrap()
}

macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod fastapi {
            $(#[test] fn $name() { super::$name(super::Example::FastApi) })*
        }
        mod express {
            $(#[test] fn $name() { super::$name(super::Example::Express) })*
        }
    };
}

both!(
    limits_each_key_with_coherent_headers_and_refunds_failed_jobs,
    falls_back_to_the_functions_library_with_the_same_answers,
    uses_an_existing_policy_as_is_and_a_shadow_one_admits_and_logs,
    fails_open_by_default_and_closed_when_set,
    never_admits_more_jobs_than_the_lease_limit,
    never_admits_more_jobs_than_the_lease_limit_through_the_library,
);

fn limits_each_key_with_coherent_headers_and_refunds_failed_jobs(example: Example) {
    if let Err(why) = ready(example) {
        return skip(&why);
    }
    let server = Server::start();
    let app = App::start(example, &server.url(), &[]);
    let log = app.wait_log("engine: the module");
    assert!(
        log.contains("policy 'examples' did not exist: defined it as sliding-window 5 10s"),
        "{log}"
    );
    assert!(log.contains("requests fail open"), "{log}");
    let definition: Vec<redis::Value> = redis::cmd("RATELIMIT.POLICY")
        .arg("GET")
        .arg(POLICY)
        .query(&mut server.client())
        .unwrap();
    let text = format!("{definition:?}");
    for part in ["sliding-window", "int(5)", "int(10000)", "enforce"] {
        assert!(text.contains(part), "{text}");
    }
    let rounds = app.drive(&limits_plan());
    assert_limits(example, &rounds);
    // Decided: 6 on a, 1 on b, 3 on c, and the keyless one where it is limited (a 401 is not
    // counted).
    assert_eq!(
        sliding_window_calls(&server),
        10 + u64::from(keyless_limited(example))
    );
    if keyless_limited(example) {
        // Past the limit, a keyless caller is refused like any other.
        let more = app.drive(&Value::Array((0..5).map(|_| json!([get("")])).collect()));
        let statuses: Vec<u16> = more.iter().map(|round| round[0].status).collect();
        assert_eq!(statuses, [200, 200, 200, 200, 429], "{more:?}");
    }
}

fn falls_back_to_the_functions_library_with_the_same_answers(example: Example) {
    if let Err(why) = ready(example) {
        return skip(&why);
    }
    let server = Server::start_without_module();
    let app = App::start(example, &server.url(), &[]);
    let log = app.wait_log("engine: the Functions library");
    assert!(
        log.contains("loaded the Functions library 'ratelimit'"),
        "{log}"
    );
    assert_limits(example, &app.drive(&limits_plan()));
    // The library's keys, under its own prefix.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut server.client())
        .unwrap();
    assert!(keys.contains(&"fn:api:a".to_string()), "{keys:?}");
    // A second app finds the library loaded and uses it as is.
    let second = App::start(example, &server.url(), &[]);
    let log = second.wait_log("engine: the Functions library");
    assert!(!log.contains("loaded the Functions library"), "{log}");
    assert_admitted(&second.drive(&json!([[get("d")]]))[0][0], POLICY, 5, 10, 4);
    let exists: u64 = redis::cmd("EXISTS")
        .arg("fn:api:d")
        .query(&mut server.client())
        .unwrap();
    assert_eq!(exists, 1);
}

fn uses_an_existing_policy_as_is_and_a_shadow_one_admits_and_logs(example: Example) {
    if let Err(why) = ready(example) {
        return skip(&why);
    }
    let server = Server::start();
    let mut con = server.client();
    // A sliding window, whose estimate does not drop when an hour ends between the requests
    // below (the apps call on the server's clock): a fixed window would admit a fourth then.
    let defined: String = redis::cmd("RATELIMIT.POLICY")
        .arg(&["SET", "login", "sliding-window", "3", "1h", "SHADOW"][..])
        .query(&mut con)
        .unwrap();
    assert_eq!(defined, "OK");
    let app = App::start(example, &server.url(), &[("RATELIMIT_POLICY", "login")]);
    let log = app.wait_log("engine: the module");
    assert!(log.contains("using the existing policy 'login'"), "{log}");
    assert!(log.contains("mode shadow"), "{log}");
    let rounds = app.drive(&Value::Array((0..5).map(|_| json!([get("s")])).collect()));
    for (i, round) in rounds.iter().enumerate() {
        let response = &round[0];
        assert_eq!(
            response.status, 200,
            "shadow mode admits every request: {response:?}"
        );
        assert_eq!(
            response.header("ratelimit-policy"),
            Some("\"login\";q=3;w=3600"),
            "{response:?}"
        );
        // Shadow mode answers as enforcement would, but admitted: nothing is counted past 3.
        let (_, remaining, _) = response.ratelimit().unwrap();
        assert_eq!(remaining, 2u64.saturating_sub(i as u64), "{response:?}");
    }
    let log = app.wait_log("would have rejected api:s");
    assert_eq!(
        log.matches("shadow policy 'login' would have rejected api:s")
            .count(),
        2,
        "requests 4 and 5 would have been rejected:\n{log}"
    );
    let line = server.info_field("ratelimit", "ratelimit_policy_login");
    assert!(
        line.contains("allowed=5,rejected=0,shadow_rejected=2"),
        "{line}"
    );
}

fn fails_open_by_default_and_closed_when_set(example: Example) {
    if let Err(why) = ready(example) {
        return skip(&why);
    }
    let nowhere = unreachable_redis_url();
    let open = App::start(example, &nowhere, &[]);
    let closed = App::start(example, &nowhere, &[("RATELIMIT_FAIL", "closed")]);
    let log = open.wait_log("Redis is unreachable");
    assert!(log.contains("requests fail open"), "{log}");
    let log = closed.wait_log("Redis is unreachable");
    assert!(log.contains("requests fail closed (503)"), "{log}");
    let admitted = &open.drive(&json!([[get("k")]]))[0][0];
    assert_eq!(admitted.status, 200, "failing open: {admitted:?}");
    assert_eq!(
        admitted.header("ratelimit"),
        None,
        "no decision, no headers"
    );
    let refused = &closed.drive(&json!([[get("k")]]))[0][0];
    assert_eq!(refused.status, 503, "failing closed: {refused:?}");
    // Without a key: limited by the address where the app does (so 503 failing closed), else
    // still a 401.
    let keyless = closed.drive(&json!([[get("")]]))[0][0].status;
    assert_eq!(keyless, if keyless_limited(example) { 503 } else { 401 });
}

/// Per key, the most jobs running at once, from the apps' own start and finish times.
fn peak_in_flight(responses: &[&Response]) -> usize {
    let mut events: Vec<(f64, i32)> = Vec::new();
    for r in responses.iter().filter(|r| r.status == 200) {
        // A finish at the very ms of another's start is not an overlap: finishes sort first.
        events.push((r.body["started_at_ms"].as_f64().unwrap(), 1));
        events.push((r.body["finished_at_ms"].as_f64().unwrap(), -1));
    }
    events.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let (mut now, mut peak) = (0, 0);
    for (_, step) in events {
        now += step;
        peak = peak.max(now);
    }
    peak as usize
}

fn never_admits_more_jobs_than_the_lease_limit(example: Example) {
    if let Err(why) = ready(example) {
        return skip(&why);
    }
    let server = Server::start();
    // Room for every request in the rate limit: only the leases refuse.
    let _: String = redis::cmd("RATELIMIT.POLICY")
        .arg(&["SET", POLICY, "sliding-window", "100", "10s"][..])
        .query(&mut server.client())
        .unwrap();
    let app = App::start(example, &server.url(), &[]);
    app.wait_log("engine: the module");
    jobs_hold_leases(&app, &server, "jobs:");
}

fn never_admits_more_jobs_than_the_lease_limit_through_the_library(example: Example) {
    if let Err(why) = ready(example) {
        return skip(&why);
    }
    let server = Server::start_without_module();
    // The example's config with room for every request in the rate limit (the library takes
    // the limit inline, from the config): only the leases refuse.
    let dir = crate::common::make_temp_dir();
    let mut config: Value = serde_json::from_slice(
        &std::fs::read(example.dir().join("ratelimit.json")).expect("the example's config"),
    )
    .expect("the config is JSON");
    config["limit"] = json!("sliding-window 100 10s");
    // A config that names the library file names it from the new place (both apps' packages
    // ship their own copy, so neither config does today).
    if let Some(path) = config.get("functions_library").and_then(Value::as_str) {
        let library = example.dir().join(path);
        config["functions_library"] = json!(library.canonicalize().unwrap());
    }
    let path = dir.join("ratelimit.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let app = App::start(
        example,
        &server.url(),
        &[("RATELIMIT_CONFIG", path.to_str().unwrap())],
    );
    app.wait_log("engine: the Functions library");
    jobs_hold_leases(&app, &server, "fn:jobs:");
    drop(app);
    crate::common::remove_dir(&dir);
}

/// 8 jobs at once on each of two keys, then one more: per key, never more than the config's 2
/// running at once, the others 429; every lease released (the lease keys `<prefix>j1`, `j2`
/// gone) so the last job runs.
fn jobs_hold_leases(app: &App, server: &Server, prefix: &str) {
    let mut con = server.client();
    let job = |key: &str| request("POST", "/jobs", key, Some(json!({ "work_ms": 300 })));
    let burst: Vec<Value> = (0..16)
        .map(|i| job(if i % 2 == 0 { "j1" } else { "j2" }))
        .collect();
    let rounds = app.drive(&json!([burst, [job("j1")]]));
    for key in ["j1", "j2"] {
        let mine: Vec<&Response> = rounds[0]
            .iter()
            .enumerate()
            .filter(|(i, _)| (*i % 2 == 0) == (key == "j1"))
            .map(|(_, r)| r)
            .collect();
        let admitted = mine.iter().filter(|r| r.status == 200).count();
        let refused = mine.iter().filter(|r| r.status == 429).count();
        assert_eq!(admitted + refused, 8, "{mine:?}");
        assert!(
            admitted >= 1 && refused >= 1,
            "8 at once on a limit of 2: {mine:?}"
        );
        let peak = peak_in_flight(&mine);
        assert!(
            peak <= 2,
            "{peak} jobs of {key} ran at once, limit 2: {mine:?}"
        );
        for r in mine.iter().filter(|r| r.status == 429) {
            assert_eq!(r.body["error"], "too many jobs in flight", "{r:?}");
            assert!(r.retry_after().is_some_and(|s| s <= 30), "{r:?}");
        }
    }
    // Every lease was released (the last release deletes the key), so the next job runs.
    assert_eq!(rounds[1][0].status, 200, "{:?}", rounds[1][0]);
    for key in ["j1", "j2"] {
        let left: u64 = redis::cmd("EXISTS")
            .arg(format!("{prefix}{key}"))
            .query(&mut con)
            .unwrap();
        assert_eq!(left, 0, "leases left behind on {prefix}{key}");
    }
}
