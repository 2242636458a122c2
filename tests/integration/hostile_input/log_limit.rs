//! RATELIMIT.APPLY cannot grow a sliding log past `max-log-limit` (a client's, not the master's
//! stream or an AOF replay), and every state APPLY accepts survives a reload.

use crate::common;
use common::{
    assert_replica_matches, config_set, dbsize, decision, digest, error_text, future_base_ms,
    info_int, limiter_info, run_ok, send_one, Limit, Server, MAX_AMOUNT,
};
use redis::Value;
use redis_ratelimit_core::algorithms::Params;
use redis_ratelimit_core::codec::Change;

#[test]
fn apply_cannot_grow_a_sliding_log_past_max_log_limit() {
    let server = Server::start();
    let mut con = server.client();
    let payload = Change::LogAppend {
        params: Params::new(MAX_AMOUNT, 1000, None).unwrap(),
        t_ms: future_base_ms(),
        cost: 10_000_000,
    }
    .to_bytes();
    let reply = send_one(
        &mut con,
        redis::cmd("RATELIMIT.APPLY").arg("bomb").arg(payload),
    );
    assert!(error_text(&reply).is_some(), "accepted: {reply:?}");
    assert_eq!(dbsize(&mut con), 0);
}

#[test]
fn a_lower_max_log_limit_on_a_replica_or_at_aof_replay_keeps_the_masters_logs() {
    // The master admits logs of limit 1000; its replica, and later the master itself, run with
    // max-log-limit 10. What the master admitted must still arrive and load exactly.
    let master = Server::builder()
        .config(&[("appendonly", "yes"), ("appendfsync", "always")])
        .start();
    let replica = Server::builder()
        .module_args(&["max-log-limit", "10"])
        .start();
    replica.replica_of(&master);
    let limit = Limit::new("sliding-log", 1000, "1h", None);
    let base = future_base_ms();
    let mut con = master.client();
    for i in 0..60u64 {
        assert_eq!(
            decision(&mut con, &limit.check("log", 1 + i % 3, Some(base + i * 7)))[0],
            1
        );
    }
    let keys = ["log".to_string()];
    assert_replica_matches(&master, &replica, &keys);
    let before = limiter_info(&mut con, "log").expect("stored");
    assert_eq!(info_int(&before, "entries"), 120);

    // A client is still held to the local setting.
    config_set(&mut con, "ratelimit.max-log-limit", "10")
        .expect("CONFIG SET ratelimit.max-log-limit");
    let append = Change::LogAppend {
        params: Params::new(1000, 3_600_000, None).unwrap(),
        t_ms: base + 1000,
        cost: 1,
    }
    .to_bytes();
    let refused = send_one(
        &mut con,
        redis::cmd("RATELIMIT.APPLY").arg("log").arg(&append),
    );
    assert!(error_text(&refused).is_some(), "accepted: {refused:?}");

    // The AOF replayed under the lower setting rebuilds the same log.
    let digest_before = digest(&mut con, "log");
    let reload = send_one(&mut con, redis::cmd("DEBUG").arg("LOADAOF"));
    assert!(matches!(reload, Value::Okay), "DEBUG LOADAOF: {reload:?}");
    assert_eq!(limiter_info(&mut con, "log"), Some(before));
    assert_eq!(digest(&mut con, "log"), digest_before);
}

#[test]
fn every_state_apply_accepts_survives_a_reload() {
    let server = Server::start();
    let mut con = server.client();
    run_ok(&mut con, "SET a 1");
    let append = Change::LogAppend {
        params: Params::new(5, 1000, None).unwrap(),
        t_ms: future_base_ms(),
        cost: 5,
    }
    .to_bytes();
    for _ in 0..2 {
        send_one(
            &mut con,
            redis::cmd("RATELIMIT.APPLY").arg("over").arg(&append),
        );
    }
    run_ok(&mut con, "SET z 2");
    let keys = dbsize(&mut con);
    let reload = send_one(&mut con, redis::cmd("DEBUG").arg("RELOAD"));
    assert!(matches!(reload, Value::Okay), "DEBUG RELOAD: {reload:?}");
    assert_eq!(dbsize(&mut con), keys);
}
