//! The module's configuration (docs/operations.md): `ratelimit.max-log-limit` as a load argument,
//! a config directive and at run time, `CONFIG SET`/`GET`/`REWRITE`, and the servers that refuse
//! to load the module with a bad value.

use crate::common;

use std::fs;
use std::time::{Duration, Instant};

use common::{
    check, config_get, config_set, dbsize, expect_error, future_base_ms, module_path, peek, run_ok,
    Server, ServerBuilder,
};
use redis::{Connection, RedisResult, Value};

/// Asserts that a server with the module and these options refuses to start: it exits non-zero
/// within 5 s, its log saying "Can't load module" and each of `reasons`.
fn assert_refuses_to_start(builder: ServerBuilder, reasons: &[&str]) {
    let what = format!("{builder:?}");
    let started = Instant::now();
    let failed = builder.start_expecting_failure();
    let log = failed.log;
    assert!(
        !failed.status.success(),
        "{what}: exit status {}\n{log}",
        failed.status
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{what}: took {:?} to give up",
        started.elapsed()
    );
    assert!(
        log.contains("Can't load module"),
        "{what}: no 'Can't load module' line\n{log}"
    );
    for reason in reasons {
        assert!(
            log.contains(reason),
            "{what}: the log does not say {reason:?}\n{log}"
        );
    }
}

#[test]
fn max_log_limit_default_and_effect() {
    let server = Server::start();
    let mut con = server.client();
    // One time ahead for every call: on the server's clock `tb` (100001 a second) would expire
    // 1 ms after its call, and the key count below would depend on whether the active expire
    // cycle had run.
    let at = future_base_ms().to_string();
    // Name/value pairs, in the order of the server's config table.
    let all: std::collections::BTreeMap<String, String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("ratelimit.*")
        .query(&mut con)
        .unwrap();
    let expected = [
        ("ratelimit.max-log-limit", "100000"),
        ("ratelimit.max-policies", "10000"),
        ("ratelimit.max-leases", "100000"),
    ];
    assert_eq!(
        all,
        expected
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .into()
    );

    assert_eq!(
        check(
            &mut con,
            "log:a",
            &["sliding-log", "100000", "1s", "AT", &at]
        )
        .unwrap()[0],
        1
    );
    let message = expect_error(
        check(
            &mut con,
            "log:b",
            &["sliding-log", "100001", "1s", "AT", &at],
        ),
        "ERR",
        "limit above the default",
    );
    assert!(
        message.contains("ratelimit.max-log-limit 100000"),
        "{message}"
    );
    // The bound applies to the sliding log only.
    assert_eq!(
        check(&mut con, "tb", &["token-bucket", "100001", "1s", "AT", &at]).unwrap()[0],
        1
    );

    config_set(&mut con, "ratelimit.max-log-limit", "50000").unwrap();
    assert_eq!(config_get(&mut con, "ratelimit.max-log-limit"), "50000");
    let message = expect_error(
        peek(
            &mut con,
            "log:c",
            &["sliding-log", "50001", "1s", "AT", &at],
        ),
        "ERR",
        "limit above the new bound",
    );
    assert!(
        message.contains("exceeds ratelimit.max-log-limit 50000"),
        "{message}"
    );
    assert_eq!(
        check(
            &mut con,
            "log:c",
            &["sliding-log", "50000", "1s", "AT", &at]
        )
        .unwrap()[0],
        1
    );
    // Lowering the bound leaves stored keys alone; calls naming a larger limit are refused.
    assert_eq!(dbsize(&mut con), 3);
    expect_error(
        check(
            &mut con,
            "log:a",
            &["sliding-log", "100000", "1s", "AT", &at],
        ),
        "ERR",
        "stored key, limit above the new bound",
    );

    // The bounds themselves are accepted.
    for value in ["1", "10000000"] {
        config_set(&mut con, "ratelimit.max-log-limit", value).unwrap();
        assert_eq!(config_get(&mut con, "ratelimit.max-log-limit"), value);
    }
    assert_eq!(
        check(
            &mut con,
            "log:d",
            &["sliding-log", "10000000", "1s", "AT", &at]
        )
        .unwrap()[0],
        1
    );
}

#[test]
fn config_set_refuses_bad_values() {
    let server = Server::start();
    let mut con = server.client();
    config_set(&mut con, "ratelimit.max-log-limit", "1234").unwrap();
    for bad in [
        "abc",
        "0",
        "-1",
        "10000001",
        "99999999999999999999",
        "1.5",
        "",
        "12k",
    ] {
        let message = expect_error(
            config_set(&mut con, "ratelimit.max-log-limit", bad),
            "ERR",
            &format!("CONFIG SET ratelimit.max-log-limit {bad:?}"),
        );
        assert!(
            message.contains("ratelimit.max-log-limit"),
            "{bad:?}: {message}"
        );
        assert_eq!(
            config_get(&mut con, "ratelimit.max-log-limit"),
            "1234",
            "{bad:?} changed the value"
        );
    }
    let message = expect_error(
        config_set(&mut con, "ratelimit.max-log-limit", "0"),
        "ERR",
        "zero",
    );
    assert!(message.contains("between 1 and 10000000"), "{message}");
    expect_error(
        config_set(&mut con, "ratelimit.no-such-config", "1"),
        "ERR",
        "unknown config",
    );
}

#[test]
fn load_arguments_set_the_initial_value() {
    for args in [
        ["max-log-limit", "50000"],
        ["ratelimit.max-log-limit", "50000"],
        ["MAX-LOG-LIMIT", "50000"],
    ] {
        let server = Server::builder().module_args(&args).start();
        let mut con = server.client();
        assert_eq!(
            config_get(&mut con, "ratelimit.max-log-limit"),
            "50000",
            "{args:?}"
        );
        expect_error(
            check(&mut con, "log", &["sliding-log", "50001", "1s"]),
            "ERR",
            "above the load argument",
        );
        // Still settable at run time.
        config_set(&mut con, "ratelimit.max-log-limit", "60000").unwrap();
        assert_eq!(
            check(&mut con, "log", &["sliding-log", "50001", "1s"]).unwrap()[0],
            1
        );
    }
}

#[test]
fn config_directive_sets_the_value_and_wins_over_load_arguments() {
    let server = Server::builder()
        .config(&[("ratelimit.max-log-limit", "70000")])
        .start();
    assert_eq!(
        config_get(&mut server.client(), "ratelimit.max-log-limit"),
        "70000"
    );

    let server = Server::builder()
        .module_args(&["max-log-limit", "50000"])
        .config(&[("ratelimit.max-log-limit", "70000")])
        .start();
    assert_eq!(
        config_get(&mut server.client(), "ratelimit.max-log-limit"),
        "70000"
    );
}

/// A server with these load arguments for the module.
fn loading_with(args: &[&str]) -> ServerBuilder {
    Server::builder().module_args(args)
}

#[test]
fn bad_load_arguments_refuse_to_load() {
    let refused = "the module is not loaded";
    assert_refuses_to_start(
        loading_with(&["max-log-limit", "abc"]),
        &[
            "load argument 'max-log-limit': 'abc' refused",
            "from 1 to 10000000",
            refused,
        ],
    );
    assert_refuses_to_start(
        loading_with(&["max-log-limit", "0"]),
        &["'0' refused", refused],
    );
    assert_refuses_to_start(
        loading_with(&["ratelimit.max-log-limit", "10000001"]),
        &["'10000001' refused", refused],
    );
    assert_refuses_to_start(
        loading_with(&["max-log-limit", "-5"]),
        &["'-5' refused", refused],
    );
    assert_refuses_to_start(
        loading_with(&["max-log-limit"]),
        &["'max-log-limit' has no value", refused],
    );
    assert_refuses_to_start(
        loading_with(&["max-log-limt", "5"]),
        &["unknown load argument 'max-log-limt'", refused],
    );
    assert_refuses_to_start(
        loading_with(&["max-log-limit", "5", "max-log-limit", "6"]),
        &["given more than once", refused],
    );
}

#[test]
fn bad_config_directives_refuse_to_load() {
    assert_refuses_to_start(
        Server::builder().config(&[("ratelimit.max-log-limit", "abc")]),
        &[
            "Issue during loading of configuration ratelimit.max-log-limit",
            "couldn't be parsed into an integer",
            "the module is not loaded",
        ],
    );
    assert_refuses_to_start(
        Server::builder().config(&[("ratelimit.max-log-limit", "0")]),
        &["between 1 and 10000000", "the module is not loaded"],
    );
    // A bad load argument is refused even when a directive would override it.
    assert_refuses_to_start(
        loading_with(&["max-log-limit", "abc"]).config(&[("ratelimit.max-log-limit", "5")]),
        &["'abc' refused"],
    );
}

#[test]
fn module_load_at_run_time_validates_too() {
    let server = Server::builder()
        .no_module()
        .config(&[("enable-module-command", "yes")])
        .start();
    let mut con = server.client();
    let path = module_path().to_string_lossy().into_owned();
    let load = |con: &mut Connection, args: &[&str]| -> RedisResult<()> {
        redis::cmd("MODULE").arg(args).query(con)
    };
    expect_error(
        load(&mut con, &["LOAD", &path, "max-log-limit", "abc"]),
        "ERR",
        "MODULE LOAD with a bad argument",
    );
    expect_error(
        load(
            &mut con,
            &["LOADEX", &path, "CONFIG", "ratelimit.max-log-limit", "0"],
        ),
        "ERR",
        "MODULE LOADEX with a bad config",
    );
    let log = server.log();
    assert!(log.contains("'abc' refused"), "{log}");
    assert!(
        log.contains("between 1 and 10000000"),
        "no reason for the bad CONFIG in the log\n{log}"
    );
    load(
        &mut con,
        &[
            "LOADEX",
            &path,
            "CONFIG",
            "ratelimit.max-log-limit",
            "7",
            "ARGS",
            "max-log-limit",
            "9",
        ],
    )
    .unwrap();
    assert_eq!(config_get(&mut con, "ratelimit.max-log-limit"), "7");
    assert_eq!(
        check(&mut con, "k", &["sliding-log", "7", "1s"]).unwrap()[0],
        1
    );
    // A second load is refused, and the log says why.
    expect_error(
        load(&mut con, &["LOAD", &path]),
        "ERR",
        "MODULE LOAD of a loaded module",
    );
    let log = server.log();
    assert!(
        log.contains("ratelimit: the module is already loaded"),
        "no reason for the refused second load in the log\n{log}"
    );
    let modules = run_ok(&mut con, "MODULE LIST");
    let Value::Array(modules) = modules else {
        panic!("{modules:?}")
    };
    // Ours once; Redis 8 lists its built-in modules (vectorset) beside it.
    let ours = modules
        .iter()
        .filter(|module| format!("{module:?}").contains("\"ratelimit\""))
        .count();
    assert_eq!(ours, 1, "{modules:?}");
    assert_eq!(
        check(&mut con, "k", &["sliding-log", "7", "1s"]).unwrap()[0],
        1
    );
}

#[test]
fn config_rewrite_keeps_the_value() {
    // The module is loaded by the configuration file, with a load argument.
    let mut server = Server::builder()
        .no_module()
        .config_file(&format!(
            "loadmodule {} max-log-limit 50000\n",
            module_path().display()
        ))
        .start();
    let mut con = server.client();
    assert_eq!(config_get(&mut con, "ratelimit.max-log-limit"), "50000");
    config_set(&mut con, "ratelimit.max-log-limit", "1234").unwrap();
    run_ok(&mut con, "CONFIG REWRITE");
    let text = fs::read_to_string(server.dir().join("redis.conf")).unwrap();
    assert!(
        text.lines().any(|l| l == "ratelimit.max-log-limit 1234"),
        "CONFIG REWRITE wrote\n{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("loadmodule ") && l.ends_with(" max-log-limit 50000")),
        "CONFIG REWRITE lost the load arguments\n{text}"
    );
    server.stop(false);

    // Started again from the rewritten file: the directive wins over the load argument.
    server.start_again();
    let mut con = server.client();
    assert_eq!(config_get(&mut con, "ratelimit.max-log-limit"), "1234");
    expect_error(
        check(&mut con, "log", &["sliding-log", "1235", "1s"]),
        "ERR",
        "above the rewritten value",
    );
}
