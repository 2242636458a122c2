//! `RATELIMIT.TAKE` (partial grants, issue 35) through a real server: on random states of all six
//! algorithms it grants exactly the largest cost a PEEK admits and leaves the state the CHECK of
//! that cost leaves (twin keys, one driven by TAKE, the other by PEEKs and CHECKs, compared by DUMP
//! and PEXPIRETIME after every call); its replies under RESP2 and RESP3; shadow policies; its
//! errors; a refusal writes nothing; replicas hold what the master holds.

use crate::common;

use common::rng::{seed_from_env, Rng};
use common::{
    assert_replica_matches, decision, master_and_replica, run_error, send, snapshot, Limit, Server,
};
use redis::{Cmd, Connection, Value};
use redis_ratelimit_core::algorithms::Algorithm;

/// `RATELIMIT.TAKE key <limit> MAX max AT at`.
fn take_cmd(limit: &Limit, key: &str, max: u64, at_ms: u64) -> Cmd {
    let mut cmd = redis::cmd("RATELIMIT.TAKE");
    cmd.arg(key)
        .arg(limit.algorithm)
        .arg(limit.limit)
        .arg(&limit.period);
    if let Some(burst) = limit.burst {
        cmd.arg("BURST").arg(burst);
    }
    if let Some(block) = &limit.block {
        cmd.arg("BLOCK").arg(block);
    }
    cmd.arg("MAX").arg(max).arg("AT").arg(at_ms);
    cmd
}

/// A random limit: small amounts (so the grants' edges come often), a BURST for a bucket now
/// and then, a BLOCK now and then.
fn random_limit(rng: &mut Rng, algorithm: &'static str) -> Limit {
    let limit = rng.range(1, 12);
    let period = rng.pick(&["100ms", "1s", "7s", "1m"]);
    let burst = rng.chance(50).then(|| rng.range(1, 15));
    let limit = Limit::new(algorithm, limit, period, burst);
    if rng.chance(20) {
        limit.with_block("2s")
    } else {
        limit
    }
}

fn period_ms(limit: &Limit) -> u64 {
    match limit.period.as_str() {
        "100ms" => 100,
        "1s" => 1000,
        "7s" => 7000,
        _ => 60_000,
    }
}

/// What TAKE must grant: the largest cost up to `max` that a PEEK of `twin` admits at `at_ms`.
/// Checks on the way that admission is monotone in the cost.
fn expected_grant(con: &mut Connection, limit: &Limit, twin: &str, max: u64, at_ms: u64) -> u64 {
    let peeks: Vec<Cmd> = (1..=max)
        .map(|cost| limit.command("RATELIMIT.PEEK", twin, cost, Some(at_ms)))
        .collect();
    let admitted: Vec<bool> = send(con, &peeks)
        .iter()
        .map(|reply| common::reply6(reply)[0] == 1)
        .collect();
    let granted = admitted.iter().take_while(|admitted| **admitted).count();
    assert!(
        admitted[granted..].iter().all(|admitted| !admitted),
        "{limit:?} at {at_ms}: admission is not monotone in the cost: {admitted:?}"
    );
    granted as u64
}

#[test]
fn take_grants_the_largest_cost_a_peek_admits_and_leaves_what_that_check_leaves() {
    let (master, replica) = master_and_replica();
    let mut con = master.client();
    let seed = seed_from_env("RATELIMIT_TAKE_SEED", || 0x7A4E_0035);
    let mut rng = Rng::new(seed);
    let base = common::future_base_ms();
    let mut keys = Vec::new();
    let (mut partial, mut refused, mut full) = (0, 0, 0);
    for round in 0..36 {
        let algorithm = Algorithm::ALL[round % Algorithm::ALL.len()].name();
        let limit = random_limit(&mut rng, algorithm);
        let (key, twin) = (format!("take:{round}"), format!("twin:{round}"));
        let mut at = base + rng.below(1000);
        for step in 0..30 {
            // Mostly forward, sometimes late (a call before the key's last is evaluated at it).
            at = if rng.chance(10) {
                at.saturating_sub(rng.below(period_ms(&limit)))
            } else {
                at + rng.below(period_ms(&limit) / 2 + 1)
            };
            let what = format!("seed {seed:#x}, {limit:?}, step {step} at {at}");
            if rng.chance(25) {
                // A plain CHECK on both, to reach more states.
                let cost = rng.below(limit.capacity() + 2);
                let replies = send(
                    &mut con,
                    &[
                        limit.command("RATELIMIT.CHECK", &key, cost, Some(at)),
                        limit.command("RATELIMIT.CHECK", &twin, cost, Some(at)),
                    ],
                );
                assert_eq!(replies[0], replies[1], "{what}: CHECK COST {cost}");
            } else {
                let max = rng.range(1, limit.capacity() + 3);
                let granted = expected_grant(&mut con, &limit, &twin, max, at);
                let reply = decision(&mut con, &take_cmd(&limit, &key, max, at));
                // A leaky bucket's delay_ms is the wait of the last granted unit: the queue
                // ahead of it once the others are queued, a PEEK's reset_after_ms.
                let last_delay = (limit.algorithm == "leaky-bucket" && granted > 1).then(|| {
                    let ahead = limit.command("RATELIMIT.PEEK", &twin, granted - 1, Some(at));
                    decision(&mut con, &ahead)[4]
                });
                // A refusal is the CHECK of one unit, which cannot pass.
                let check = limit.command("RATELIMIT.CHECK", &twin, granted.max(1), Some(at));
                let mut checked = decision(&mut con, &check);
                assert_eq!(checked[0], i64::from(granted > 0), "{what}");
                assert_eq!(reply[0], granted as i64, "{what}: MAX {max}");
                if let Some(delay) = last_delay {
                    assert!(
                        delay >= checked[5],
                        "{what}: the last unit waits less than the first"
                    );
                    checked[5] = delay;
                }
                assert_eq!(reply[1..], checked[1..], "{what}: MAX {max}");
                match granted {
                    0 => refused += 1,
                    g if g == max => full += 1,
                    _ => partial += 1,
                }
            }
            let states = snapshot(&mut con, &[key.clone(), twin.clone()]);
            assert_eq!(states[0], states[1], "{what}: DUMP and PEXPIRETIME");
        }
        keys.extend([key, twin]);
    }
    // The sequences reach every kind of answer, often.
    assert!(
        partial >= 50 && refused >= 50 && full >= 50,
        "partial {partial}, refused {refused}, full {full}"
    );
    assert_replica_matches(&master, &replica, &keys);
}

#[test]
fn take_replies_with_granted_first_under_resp2_and_resp3() {
    let server = Server::start();
    let at = common::future_base_ms();
    let limit = Limit::new("fixed-window", 5, "1s", None);
    let mut con = server.client();
    assert_eq!(
        decision(&mut con, &take_cmd(&limit, "k2", 3, at)),
        [3, 5, 2, 0, 1000, 0]
    );
    assert_eq!(
        decision(&mut con, &take_cmd(&limit, "k2", 3, at + 10)),
        [2, 5, 0, 0, 990, 0]
    );
    // Nothing left: a refusal, its wait the one unit's.
    assert_eq!(
        decision(&mut con, &take_cmd(&limit, "k2", 3, at + 20)),
        [0, 5, 0, 980, 980, 0]
    );
    let mut resp3 = server.client_resp3();
    let reply: Value = take_cmd(&limit, "k3", 4, at).query(&mut resp3).unwrap();
    let Value::Map(pairs) = reply else {
        panic!("not a map: {reply:?}")
    };
    let fields: Vec<(String, Value)> = pairs
        .into_iter()
        .map(|(name, value)| (redis::from_redis_value(&name).unwrap(), value))
        .collect();
    let names: Vec<&str> = fields.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "granted",
            "limit",
            "remaining",
            "retry_after_ms",
            "reset_after_ms",
            "delay_ms"
        ]
    );
    assert_eq!(fields[0].1, Value::Int(4), "granted is an integer");
    assert_eq!(fields[2].1, Value::Int(1));
}

#[test]
fn a_refusal_writes_nothing_unless_it_starts_a_block() {
    let (master, replica) = master_and_replica();
    let mut con = master.client();
    let at = common::future_base_ms();
    let limit = Limit::new("token-bucket", 2, "1s", None);
    assert_eq!(decision(&mut con, &take_cmd(&limit, "k", 5, at))[0], 2);
    common::wait_replica_sync(&master, &replica);
    let offset = master.info_field("replication", "master_repl_offset");
    let before = snapshot(&mut con, &["k".to_string()]);
    assert_eq!(decision(&mut con, &take_cmd(&limit, "k", 1, at + 1))[0], 0);
    assert_eq!(
        master.info_field("replication", "master_repl_offset"),
        offset
    );
    assert_eq!(snapshot(&mut con, &["k".to_string()]), before);
    // With BLOCK, the refusal starts the block, as the CHECK of one unit would.
    let blocking = limit.clone().with_block("10s");
    let refused = decision(&mut con, &take_cmd(&blocking, "k", 1, at + 2));
    assert_eq!(refused, [0, 2, 0, 10_000, 10_000, 0]);
    // Blocked: the tokens that have since refilled are refused until the block ends.
    assert_eq!(
        decision(&mut con, &take_cmd(&blocking, "k", 1, at + 5_000))[0],
        0
    );
    assert_eq!(
        decision(&mut con, &take_cmd(&blocking, "k", 9, at + 10_002))[0],
        2
    );
    assert_replica_matches(&master, &replica, &["k".to_string()]);
}

#[test]
fn a_shadow_policy_grants_max_and_stores_what_enforcement_would() {
    let server = Server::start();
    let mut con = server.client();
    let at = common::future_base_ms();
    for (name, shadow) in [("enforced", ""), ("shadowed", " SHADOW")] {
        common::run_ok(
            &mut con,
            &format!("RATELIMIT.POLICY SET {name} sliding-window 5 1s{shadow}"),
        );
    }
    let take = |key: &str, policy: &str, max: u64, at: u64| {
        redis::cmd("RATELIMIT.TAKE")
            .arg(&[key, "POLICY", policy, "MAX"])
            .arg(max)
            .arg("AT")
            .arg(at)
            .clone()
    };
    for (max, offset) in [(3, 0), (4, 10), (2, 20)] {
        let enforced = decision(&mut con, &take("e", "enforced", max, at + offset));
        let shadowed = decision(&mut con, &take("s", "shadowed", max, at + offset));
        assert_eq!(shadowed[0], max as i64);
        assert_eq!(shadowed[1..3], enforced[1..3]);
        let states = snapshot(&mut con, &["e".to_string(), "s".to_string()]);
        assert_eq!(states[0], states[1], "MAX {max}");
    }
    // Grants of 3, then 2 of 4, then none of 2: two short of what the shadow policy granted.
    let info = common::parse_info(
        &redis::cmd("INFO")
            .arg("ratelimit")
            .query::<String>(&mut con)
            .unwrap(),
    );
    let line = |name: &str| info[&format!("ratelimit_policy_{name}")].clone();
    assert!(
        line("shadowed").contains("shadow_rejected=2"),
        "{}",
        line("shadowed")
    );
    assert!(
        line("enforced").contains("rejected=1"),
        "{}",
        line("enforced")
    );
}

#[test]
fn take_refuses_bad_arguments_with_checks_errors_and_its_own() {
    let server = Server::start();
    let mut con = server.client();
    for (line, error) in [
        (
            "k fixed-window 5 1s",
            "ERR RATELIMIT.TAKE needs MAX: the most units to take",
        ),
        (
            "k fixed-window 5 1s MAX 0",
            "ERR MAX must be an integer from 1 to 1000000000000",
        ),
        (
            "k fixed-window 5 1s MAX 1000000000001",
            "ERR MAX must be an integer from 1 to 1000000000000",
        ),
        (
            "k fixed-window 5 1s MAX x",
            "ERR MAX must be an integer from 1 to 1000000000000",
        ),
        ("k fixed-window 5 1s MAX", "ERR MAX needs a value"),
        (
            "k fixed-window 5 1s MAX 1 max 2",
            "ERR MAX given more than once",
        ),
        (
            "k fixed-window 5 1s COST 1",
            "ERR unknown option 'COST': expected BURST, BLOCK, MAX or AT",
        ),
        (
            "k fixed-window 5 1s MAX 2 LIMIT 3",
            "ERR unknown option 'LIMIT': expected BURST, BLOCK, MAX or AT",
        ),
        (
            "k POLICY p COST 2",
            "ERR unknown option 'COST': expected MAX or AT",
        ),
        (
            "k fixed-window 0 1s MAX 1",
            "ERR limit must be an integer from 1 to 1000000000000",
        ),
        (
            "k fixed-window 5 1s BURST 2 MAX 1",
            "ERR BURST applies only to token-bucket, leaky-bucket and gcra",
        ),
        ("k POLICY nope MAX 1", "ERR no such policy 'nope'"),
        (
            "k",
            "ERR wrong number of arguments for 'ratelimit.take' command",
        ),
    ] {
        let words: Vec<&str> = line.split(' ').collect();
        let text = format!("RATELIMIT.TAKE {}", words.join(" "));
        assert_eq!(run_error(&mut con, &text), error, "{line}");
    }
    let _: () = redis::cmd("SET")
        .arg("plain")
        .arg("x")
        .query(&mut con)
        .unwrap();
    assert_eq!(
        run_error(&mut con, "RATELIMIT.TAKE plain fixed-window 5 1s MAX 1"),
        "WRONGTYPE Operation against a key holding the wrong kind of value"
    );
    assert_eq!(common::dbsize(&mut con), 1, "nothing created");
}

#[test]
fn the_worked_examples_of_the_algorithms_page_hold() {
    let server = Server::start();
    let mut con = server.client();
    // A base a whole number of days ahead: every period of the table divides a day.
    let base = common::future_base_ms();
    let rows = common::worked_examples("Partial grants");
    assert!(rows.len() >= 9, "{} rows", rows.len());
    for row in rows {
        let max = row.call.strip_prefix("TAKE MAX ").expect("a TAKE row");
        let mut cmd = redis::cmd("RATELIMIT.TAKE");
        cmd.arg(format!("doc:{}", row.limit))
            .arg(row.limit.split(' ').collect::<Vec<_>>())
            .arg("MAX")
            .arg(max)
            .arg("AT")
            .arg(base + row.at);
        assert_eq!(
            decision(&mut con, &cmd),
            row.reply,
            "{}: {} AT {}",
            row.limit,
            row.call,
            row.at
        );
    }
}

#[test]
fn config_resetstat_zeroes_what_take_counted() {
    let server = Server::start();
    let mut con = server.client();
    let at = common::future_base_ms();
    let limit = Limit::new("fixed-window", 2, "1h", None);
    for (max, granted) in [(1, 1), (5, 1), (5, 0)] {
        assert_eq!(
            decision(&mut con, &take_cmd(&limit, "k", max, at))[0],
            granted
        );
    }
    let figures = |server: &Server| -> Vec<String> {
        let info = server.info("ratelimit");
        ["calls", "allowed", "rejected"]
            .map(|what| info[&format!("ratelimit_fixed_window_{what}")].clone())
            .to_vec()
    };
    assert_eq!(figures(&server), ["3", "2", "1"]);
    // Refused (ACL): nothing is reset. The module tells a reset that ran from a refused one by
    // Redis's counts of the commands it counts, TAKE among them.
    common::run_ok(
        &mut con,
        "ACL SETUSER noreset on >secret ~* +@all -config|resetstat",
    );
    let mut refused = server.client();
    common::run_ok(&mut refused, "AUTH noreset secret");
    let reply = common::run(&mut refused, "CONFIG RESETSTAT");
    assert!(common::error_text(&reply).is_some_and(|e| e.starts_with("NOPERM")));
    common::run_ok(&mut refused, "PING");
    assert_eq!(
        figures(&server),
        ["3", "2", "1"],
        "a refused CONFIG RESETSTAT"
    );
    common::run_ok(&mut con, "CONFIG RESETSTAT");
    // A round trip: the module zeroes its counters once the command has run.
    common::run_ok(&mut con, "PING");
    assert_eq!(figures(&server), ["0", "0", "0"]);
}
