//! Memory: `ratelimit.max-log-limit` bounds a sliding log and a full log stays under 4 bytes per
//! entry; `maxmemory` with `noeviction` answers OOM without breaking anything; eviction policies do
//! evict limiters (an evicted one is fresh); a million expiring keys give their memory back.

use crate::common;

use std::thread;
use std::time::{Duration, Instant};

use common::{
    config_set, dbsize, decision, digest, error_text, future_base_ms, info_int, int, limiter_info,
    reply6, send, send_one, Limit, Server, DEFAULT_MAX_LOG_LIMIT,
};
use redis::{Cmd, Connection, Value};
use redis_ratelimit_core::algorithms::{Algorithm, Params};
use redis_ratelimit_core::codec::Change;

#[test]
fn max_log_limit_bounds_a_sliding_log_and_a_full_log_costs_under_4_bytes_an_entry() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    // The default bound: 100000 is accepted, one more is refused and creates nothing.
    let reply = send_one(
        &mut con,
        &Limit::new("sliding-log", DEFAULT_MAX_LOG_LIMIT + 1, "1d", None).check(
            "log",
            1,
            Some(base),
        ),
    );
    let error = error_text(&reply).expect("refused");
    assert!(error.contains("max-log-limit"), "{error}");
    assert_eq!(dbsize(&mut con), 0);

    // A full log: 100000 entries 700 ms apart (2-byte records), all inside the day.
    const GAP_MS: u64 = 700;
    let limit = Limit::new("sliding-log", DEFAULT_MAX_LOG_LIMIT, "1d", None);
    for chunk in (0..DEFAULT_MAX_LOG_LIMIT)
        .collect::<Vec<_>>()
        .chunks(10_000)
    {
        let cmds: Vec<Cmd> = chunk
            .iter()
            .map(|i| limit.check("log", 1, Some(base + i * GAP_MS)))
            .collect();
        for value in send(&mut con, &cmds) {
            assert_eq!(reply6(&value)[0], 1);
        }
    }
    let last = base + (DEFAULT_MAX_LOG_LIMIT - 1) * GAP_MS;
    assert_eq!(
        decision(&mut con, &limit.check("log", 1, Some(last))),
        [
            0,
            DEFAULT_MAX_LOG_LIMIT as i64,
            0,
            86_400_000 - (DEFAULT_MAX_LOG_LIMIT - 1) as i64 * GAP_MS as i64,
            86_400_000,
            0
        ]
    );
    let info = limiter_info(&mut con, "log").expect("stored");
    assert_eq!(info_int(&info, "entries"), DEFAULT_MAX_LOG_LIMIT as i64);
    let usage = int(&mut con, redis::cmd("MEMORY").arg("USAGE").arg("log"));
    eprintln!(
        "a full sliding log: MEMORY USAGE {usage} bytes, {:.2} per entry",
        usage as f64 / DEFAULT_MAX_LOG_LIMIT as f64
    );
    assert!(
        usage < 4 * DEFAULT_MAX_LOG_LIMIT as i64,
        "MEMORY USAGE {usage} for {DEFAULT_MAX_LOG_LIMIT} entries"
    );
    // The server's own accounting agrees that the log is that small: an empty server uses about
    // 0.9 MB here.
    let used: i64 = server.info_field("memory", "used_memory").parse().unwrap();
    eprintln!("used_memory with the full log: {used}");
    assert!(used < 3_000_000, "used_memory {used}");
}

#[test]
fn a_lower_max_log_limit_set_at_run_time_is_enforced() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    config_set(&mut con, "ratelimit.max-log-limit", "1000")
        .expect("CONFIG SET ratelimit.max-log-limit");
    let over = send_one(
        &mut con,
        &Limit::new("sliding-log", 1001, "1s", None).check("log", 1, Some(base)),
    );
    assert!(
        error_text(&over).is_some_and(|e| e.contains("max-log-limit")),
        "{over:?}"
    );
    let at = decision(
        &mut con,
        &Limit::new("sliding-log", 1000, "1s", None).check("log", 1, Some(base)),
    );
    assert_eq!(at[0], 1);
    // Other algorithms are not bounded by it.
    let window = decision(
        &mut con,
        &Limit::new("sliding-window", 1_000_000, "1s", None).check("window", 1, Some(base)),
    );
    assert_eq!(window[0], 1);
}

#[test]
fn noeviction_maxmemory_answers_oom_to_checks_and_nothing_breaks() {
    let server = Server::builder()
        .config(&[("maxmemory-policy", "noeviction")])
        .start();
    let mut con = server.client();
    let base = future_base_ms();
    let limits: Vec<Limit> = Algorithm::ALL
        .iter()
        .map(|a| Limit::new(a.name(), 10, "1000", Some(10)))
        .collect();
    let keys: Vec<String> = limits
        .iter()
        .map(|l| format!("oom:{}", l.algorithm))
        .collect();
    for (limit, key) in limits.iter().zip(&keys) {
        assert_eq!(decision(&mut con, &limit.check(key, 3, Some(base)))[0], 1);
    }
    let digests: Vec<String> = keys.iter().map(|k| digest(&mut con, k)).collect();
    // Some ballast, then a cap below what is used: every deny-oom command is refused now.
    let _: () = redis::cmd("SET")
        .arg("ballast")
        .arg(vec![b'x'; 2_000_000])
        .query(&mut con)
        .unwrap();
    let cap_below_use = |con: &mut Connection, cap: fn(u64) -> u64| {
        // Valkey 8 frees a DEL's value in the background (lazyfree-lazy-user-del yes): read the
        // memory in use once nothing is pending, or the cap lands above what is left.
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.info_field("memory", "lazyfree_pending_objects") != "0" {
            assert!(Instant::now() < deadline, "lazy frees still pending");
            thread::sleep(Duration::from_millis(10));
        }
        let used: u64 = server.info_field("memory", "used_memory").parse().unwrap();
        config_set(con, "maxmemory", &cap(used).to_string()).unwrap();
    };
    // Half the ballast below: what is freed meanwhile (a closed connection's buffers, under load)
    // cannot bring the use back under the cap (200 kB once proved too little), deleting the
    // ballast does.
    cap_below_use(&mut con, |used| used - 1_000_000);
    for (limit, key) in limits.iter().zip(&keys) {
        for target in [format!("{key}:new"), key.clone()] {
            let reply = send_one(&mut con, &limit.check(&target, 1, Some(base)));
            let error = error_text(&reply).unwrap_or_else(|| panic!("{target}: {reply:?}"));
            assert!(error.starts_with("OOM"), "{target}: {error}");
        }
        // Reads keep working: PEEK and INFO answer from the unchanged state.
        let peek = decision(&mut con, &limit.peek(key, 1, Some(base)));
        assert_eq!(peek[0], 1);
        assert!(limiter_info(&mut con, key).is_some());
    }
    let apply = send_one(
        &mut con,
        redis::cmd("RATELIMIT.APPLY").arg("oom:apply").arg(
            Change::LogAppend {
                params: Params::new(5, 1000, None).unwrap(),
                t_ms: base,
                cost: 1,
            }
            .to_bytes(),
        ),
    );
    assert!(
        error_text(&apply).is_some_and(|e| e.starts_with("OOM")),
        "{apply:?}"
    );
    let checkall = send_one(
        &mut con,
        redis::cmd("RATELIMIT.CHECKALL")
            .arg(2)
            .arg(&keys[2])
            .arg("oom:checkall")
            .arg(&[
                "fixed-window",
                "10",
                "1000",
                "fixed-window",
                "10",
                "1000",
                "AT",
            ])
            .arg(base),
    );
    assert!(
        error_text(&checkall).is_some_and(|e| e.starts_with("OOM")),
        "{checkall:?}"
    );
    assert_eq!(
        dbsize(&mut con),
        keys.len() as i64 + 1,
        "the limiters and the ballast, nothing new"
    );
    for (key, before) in keys.iter().zip(&digests) {
        assert_eq!(&digest(&mut con, key), before, "{key} changed under OOM");
    }
    // Freeing memory brings everything back, with the state as it was.
    let _: i64 = redis::cmd("DEL").arg("ballast").query(&mut con).unwrap();
    for (limit, key) in limits.iter().zip(&keys) {
        let reply = decision(&mut con, &limit.check(key, 1, Some(base)));
        assert_eq!(reply[..3], [1, 10, 6], "{key}");
        assert_eq!(
            decision(&mut con, &limit.check(&format!("{key}:new"), 1, Some(base)))[0],
            1
        );
    }
    // RESET is not refused under OOM: it frees memory.
    // Half the use, for the same reason (no ballast left to go by).
    cap_below_use(&mut con, |used| used / 2);
    let new_key = send_one(&mut con, &limits[0].check("oom:again", 1, Some(base)));
    assert!(
        error_text(&new_key).is_some_and(|e| e.starts_with("OOM")),
        "{new_key:?}"
    );
    let removed = int(&mut con, redis::cmd("RATELIMIT.RESET").arg(&keys));
    assert_eq!(removed, keys.len() as i64);
}

#[test]
fn an_evicted_limiter_is_a_fresh_limiter_and_volatile_policies_evict_limiters_first() {
    // Every stored limiter has a TTL, so `volatile-*` policies count it as evictable, before any
    // key without a TTL; `allkeys-*` evict it like anything else. Either way an evicted limiter
    // is gone: the next CHECK meets a fresh one and admits again. This is what docs/guarantees.md
    // warns about.
    for policy in ["volatile-lru", "allkeys-lru"] {
        let server = Server::builder()
            .config(&[("maxmemory-policy", policy), ("maxmemory-samples", "10")])
            .start();
        let mut con = server.client();
        let base = future_base_ms();
        let limit = Limit::new("fixed-window", 1, "1h", None);
        // 500 exhausted limiters with 4 KB names: about 2 MB of them.
        let keys: Vec<String> = (0..500)
            .map(|i| format!("limiter:{i}:{}", "x".repeat(4_000)))
            .collect();
        let cmds: Vec<Cmd> = keys.iter().map(|k| limit.check(k, 1, Some(base))).collect();
        assert!(run_all_admitted(&mut con, &cmds));
        // Cap memory a little above what is used, then write 1.5 MB of data without a TTL.
        let used: u64 = server.info_field("memory", "used_memory").parse().unwrap();
        config_set(&mut con, "maxmemory", &(used + 300_000).to_string()).unwrap();
        let mut data_written = 0;
        for i in 0..30 {
            let reply = send_one(
                &mut con,
                redis::cmd("SET")
                    .arg(format!("data:{i}"))
                    .arg(vec![b'd'; 50_000]),
            );
            if matches!(reply, Value::Okay) {
                data_written += 1;
            }
        }
        // Stop evicting, then look at what is left. (`evicted_keys` is read after: the server
        // may evict once more before it runs the CONFIG SET, or the INFO.)
        config_set(&mut con, "maxmemory", "0").unwrap();
        let evicted: u64 = server.info_field("stats", "evicted_keys").parse().unwrap();
        let mut exists = redis::pipe();
        for key in &keys {
            exists.cmd("EXISTS").arg(key);
        }
        let present: Vec<i64> = exists.query(&mut con).unwrap();
        let missing: Vec<&String> = keys
            .iter()
            .zip(&present)
            .filter(|(_, p)| **p == 0)
            .map(|(k, _)| k)
            .collect();
        eprintln!(
            "{policy}: {evicted} keys evicted, {} of 500 limiters among them, {data_written} of \
             30 data keys written",
            missing.len()
        );
        assert!(!missing.is_empty(), "{policy}: no limiter was evicted");
        if policy.starts_with("volatile") {
            // Only keys with a TTL go: the limiters, never the data.
            assert_eq!(missing.len() as u64, evicted, "{policy}");
            assert_eq!(data_written, 30, "{policy}");
            let data: i64 = int(&mut con, &redis::cmd("DBSIZE")) - (500 - missing.len() as i64);
            assert_eq!(data, 30, "{policy}: data keys were evicted");
        }
        // An evicted limiter admits again what it had already admitted; one that stayed does not.
        for (key, present) in keys.iter().zip(&present) {
            let reply = decision(&mut con, &limit.check(key, 1, Some(base)));
            assert_eq!(
                reply[0],
                i64::from(*present == 0),
                "{policy}: {}",
                &key[..12]
            );
        }
    }
}

/// Runs CHECKs in one pipeline; true when all were admitted.
fn run_all_admitted(con: &mut Connection, cmds: &[Cmd]) -> bool {
    send(con, cmds).iter().all(|value| reply6(value)[0] == 1)
}

#[test]
fn a_million_expiring_keys_give_their_memory_back() {
    // Fast expiry: more cron runs and a bigger active-expire effort, so a million keys vanish
    // within seconds of their expiry instead of tens of seconds.
    let server = Server::builder()
        .config(&[("hz", "100"), ("active-expire-effort", "10")])
        .start();
    let mut con = server.client();
    let memory = |field: &str| -> i64 { server.info_field("memory", field).parse().unwrap() };
    let baseline = memory("used_memory");
    const KEYS: u64 = 1_000_000;
    const CONNECTIONS: u64 = 4;
    let started = Instant::now();
    let threads: Vec<_> = (0..CONNECTIONS)
        .map(|c| {
            let mut con = server.client();
            thread::spawn(move || {
                let mut cmds = Vec::with_capacity(5_000);
                let mut k = c;
                while k < KEYS {
                    // 1 per 10 s, every algorithm: each key expires 10 s (sliding window: up to
                    // 20 s) after its CHECK, so however slowly a loaded machine sends them,
                    // 10 s of CHECKs are live at once (2 s once left the peak under 10 MB).
                    let algorithm = Algorithm::ALL[(k % 5) as usize].name();
                    cmds.push(Limit::new(algorithm, 1, "10000", Some(1)).check(
                        &format!("soak:{k}"),
                        1,
                        None,
                    ));
                    k += CONNECTIONS;
                    if cmds.len() == 5_000 || k >= KEYS {
                        for value in send(&mut con, &cmds) {
                            assert_eq!(reply6(&value)[0], 1);
                        }
                        cmds.clear();
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("a soak connection panicked");
    }
    let live = dbsize(&mut con);
    // The server's own peak: on a loaded machine the first keys expire before the last are
    // written, so used_memory after the soak can be far below what it reached.
    let peak = memory("used_memory_peak");
    eprintln!(
        "{KEYS} CHECKs in {:?}; {live} keys live after, used_memory {baseline} -> {peak}",
        started.elapsed()
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while dbsize(&mut con) > 0 {
        assert!(
            Instant::now() < deadline,
            "{} keys still there 60 s later",
            dbsize(&mut con)
        );
        thread::sleep(Duration::from_millis(100));
    }
    // The key tables shrink in the next cron runs.
    let mut used = memory("used_memory");
    let settle = Instant::now() + Duration::from_secs(5);
    while used > baseline + 1_000_000 && Instant::now() < settle {
        thread::sleep(Duration::from_millis(100));
        used = memory("used_memory");
    }
    eprintln!(
        "all expired after {:?}: used_memory {used} (baseline {baseline}, peak {peak})",
        started.elapsed()
    );
    assert!(
        peak > baseline + 10_000_000,
        "the soak did not allocate: {peak}"
    );
    // Slack: 1 MB for the client buffers and the key tables' smallest sizes; a leak of even 16
    // bytes per limiter would be 16 MB.
    assert!(
        used < baseline + 1_000_000,
        "used_memory {used} did not return near the baseline {baseline}"
    );
    let stats = server.info("ratelimit");
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        let field = format!("ratelimit_{}_keys", algorithm.replace('-', "_"));
        assert_eq!(
            stats.get(&field).map(String::as_str),
            Some("0"),
            "{field}: {stats:?}"
        );
    }
}
