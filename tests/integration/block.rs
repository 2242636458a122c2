//! `BLOCK duration` through a real server: the worked examples of docs/algorithms.md ("Blocks"),
//! random sequences against a model of blocks written here from that page's definitions (over
//! the algorithms' own cores, which the other tests check), and what a block does to INFO,
//! RESET, REFUND, CHECKALL, policies, events, replication and memory.

use crate::common;

use std::collections::BTreeMap;

use common::rng::{seed_from_env, Rng};
use common::{
    assert_replica_matches, decision, exists, future_base_ms, info_int, limiter_info,
    master_and_replica, pexpiretime, run_ok, send, six, Limit, Server,
};
use redis::Value;
use redis_ratelimit_core::algorithms::{self, Algorithm, Decision, Limiter, Params, Request};

#[test]
fn the_worked_examples_of_the_algorithms_page_hold() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    // Each group of rows is one key; `CHECK COST 1 without BLOCK` is the key's limit without it.
    let rows = common::worked_examples("Blocks");
    assert!(rows.len() >= 15, "{} rows", rows.len());
    for common::WorkedRow {
        limit,
        at,
        call,
        reply: expected,
    } in rows
    {
        let key = format!("doc:{limit}");
        let (call, without_block) = match call.strip_suffix(" without BLOCK") {
            Some(call) => (call.to_string(), true),
            None => (call, false),
        };
        let (name, cost) = call.split_once(" COST ").expect("a call with COST");
        let mut args: Vec<&str> = limit.split(' ').collect();
        if without_block {
            let at = args.iter().position(|a| *a == "BLOCK").expect("a BLOCK");
            args.drain(at..at + 2);
        }
        let mut cmd = redis::cmd(&format!("RATELIMIT.{name}"));
        cmd.arg(&key)
            .arg(args)
            .arg("COST")
            .arg(cost)
            .arg("AT")
            .arg(base + at);
        assert_eq!(
            decision(&mut con, &cmd),
            expected,
            "{limit}: {call} AT {at}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The model: docs/algorithms.md's "Blocks", over the algorithms' cores.

#[derive(Default)]
struct Model {
    /// Each key's limiter (its block left at 0: the model keeps blocks apart) and block end.
    keys: BTreeMap<String, (Option<Limiter>, u64)>,
}

impl Model {
    /// One call; `commit` for CHECK. Returns the reply and the key's expiry (0: no key).
    fn call(
        &mut self,
        key: &str,
        request: &Request,
        commit: bool,
        block_ms: Option<u64>,
    ) -> Decision {
        let (stored, until) = self.keys.entry(key.to_string()).or_default();
        let t = stored
            .as_ref()
            .map_or(request.now_ms, |l| request.now_ms.max(l.last_ms));
        let blocked = |own: &Decision, until: u64| {
            let left = (until - t) as i64;
            Decision {
                allowed: false,
                limit: own.limit,
                remaining: 0,
                retry_after_ms: if own.retry_after_ms == -1 {
                    -1
                } else {
                    own.retry_after_ms.max(left)
                },
                reset_after_ms: own.reset_after_ms.max(left as u64),
                delay_ms: 0,
            }
        };
        if t < *until {
            let mut copy = stored.clone();
            let (own, _) = algorithms::check(copy.as_mut(), request, false, &mut None).unwrap();
            return blocked(&own.decision, *until);
        }
        let mut created = None;
        let (outcome, _) =
            algorithms::check(stored.as_mut(), request, commit, &mut created).unwrap();
        if let Some(limiter) = created {
            *stored = Some(limiter);
        }
        let own = outcome.decision;
        match block_ms {
            Some(d) if commit && request.cost > 0 && !own.allowed && own.retry_after_ms >= 0 => {
                *until = t + d;
                blocked(&own, *until)
            }
            _ => own,
        }
    }

    /// When the key expires: its state's fresh time or its block's end, whichever is later.
    fn expires_at(&self, key: &str) -> Option<u64> {
        let (stored, until) = self.keys.get(key)?;
        stored.as_ref().map(|l| l.expires_at_ms().max(*until))
    }
}

#[test]
fn random_calls_answer_as_the_model_of_blocks() {
    let server = Server::start();
    let mut con = server.client();
    let mut rng = Rng::new(seed_from_env("RATELIMIT_BLOCK_SEED", || 0xb10c));
    let base = future_base_ms();
    let mut model = Model::default();
    let blocks = [None, Some(300), Some(1_000), Some(4_000)];
    let mut blocked_replies = 0;
    for (k, algorithm) in Algorithm::ALL.iter().cycle().take(18).enumerate() {
        let key = format!("rand:{k}:{}", algorithm.name());
        let limit = 1 + rng.below(4);
        let period = [500, 1_000, 2_000][rng.below(3) as usize];
        let mut now = base;
        for _ in 0..60 {
            now += rng.below(period / 3);
            // Mostly the key's own parameters; sometimes a changed limit, as a stale client.
            let limit = if rng.below(8) == 0 { limit + 1 } else { limit };
            let burst = algorithm.is_bucket().then(|| limit + rng.below(2));
            let params = Params::new(limit, period, burst).unwrap();
            let cost = rng.below(limit + 2);
            let block_ms = blocks[rng.below(4) as usize];
            let peek = rng.below(5) == 0;
            let request = Request {
                algorithm: *algorithm,
                params,
                cost,
                now_ms: now,
            };
            let expected = model.call(&key, &request, !peek, block_ms);
            let mut spec = Limit::new(algorithm.name(), limit, &period.to_string(), burst);
            if let Some(d) = block_ms {
                spec = spec.with_block(&d.to_string());
            }
            let cmd = if peek {
                spec.peek(&key, cost, Some(now))
            } else {
                spec.check(&key, cost, Some(now))
            };
            let reply = decision(&mut con, &cmd);
            let want = [
                expected.allowed as i64,
                expected.limit as i64,
                expected.remaining as i64,
                expected.retry_after_ms,
                expected.reset_after_ms as i64,
                expected.delay_ms as i64,
            ];
            assert_eq!(reply, want, "{key}: {}", common::show_cmd(&cmd));
            blocked_replies += (reply[0] == 0 && reply[3] > 0) as u32;
            let expiry = model.expires_at(&key).map_or(-2, |at| at as i64);
            assert_eq!(pexpiretime(&mut con, &key), expiry, "{key}: expiry");
        }
    }
    assert!(blocked_replies > 50, "only {blocked_replies} rejections");
}

// ---------------------------------------------------------------------------------------------
// What a block does to the other commands.

/// A key of `algorithm` whose limit (1 a second) is exhausted at `t`, then blocked for 10 s by
/// a second call; returns the block's end.
fn blocked_key(con: &mut redis::Connection, key: &str, algorithm: &str, t: u64) -> u64 {
    let check = format!("RATELIMIT.CHECK {key} {algorithm} 1 1s BLOCK 10s AT");
    assert_eq!(six(con, &format!("{check} {t}"))[0], 1);
    let rejected = six(con, &format!("{check} {}", t + 100));
    assert_eq!(rejected[..4], [0, 1, 0, 10_000], "{key}");
    t + 10_100
}

#[test]
fn info_shows_the_block_reset_lifts_it_and_refund_does_not() {
    let server = Server::start();
    let mut con = server.client();
    let t = future_base_ms();
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        let key = format!("k:{algorithm}");
        let until = blocked_key(&mut con, &key, algorithm, t);
        let info = limiter_info(&mut con, &key).expect("stored");
        assert_eq!(info_int(&info, "blocked_until_ms"), until as i64);
        assert_eq!(info_int(&info, "remaining"), 0);
        assert_eq!(pexpiretime(&mut con, &key), until as i64);
        // A refund gives back, and the key stays blocked (its reply shows the block).
        let refund = six(
            &mut con,
            &format!(
                "RATELIMIT.REFUND {key} {algorithm} 1 1s COST 1 AT {}",
                t + 200
            ),
        );
        assert_eq!(refund[..4], [0, 1, 0, 9_900], "{key}: refund");
        let info = limiter_info(&mut con, &key).expect("a refund does not delete a blocked key");
        assert_eq!(info_int(&info, "blocked_until_ms"), until as i64);
        let check = format!("RATELIMIT.CHECK {key} {algorithm} 1 1s AT {}", t + 9_000);
        assert_eq!(six(&mut con, &check)[0], 0, "{key}: still blocked");
        // RESET lifts it: the key is gone, and the next call is a fresh key's.
        assert_eq!(
            run_ok(&mut con, &format!("RATELIMIT.RESET {key}")),
            Value::Int(1)
        );
        assert_eq!(six(&mut con, &check)[0], 1, "{key}: after RESET");
        assert!(
            !limiter_info(&mut con, &key)
                .unwrap()
                .contains_key("blocked_until_ms"),
            "{key}"
        );
    }
}

#[test]
fn a_block_ends_on_time_and_the_next_consuming_call_clears_it() {
    let server = Server::start();
    let mut con = server.client();
    let t = future_base_ms();
    let until = blocked_key(&mut con, "k", "token-bucket", t);
    let blocked: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("k")
        .query(&mut con)
        .unwrap();
    let at = |ms: u64| format!("RATELIMIT.CHECK k token-bucket 1 1s BLOCK 10s AT {ms}");
    assert_eq!(six(&mut con, &at(until - 1))[..4], [0, 1, 0, 1]);
    // The bucket refilled long ago: the last ms of the block waits for the block alone.
    let peek = format!("RATELIMIT.PEEK k token-bucket 1 1s COST 0 AT {until}");
    assert_eq!(six(&mut con, &peek), [1, 1, 1, 0, 0, 0]);
    assert_eq!(six(&mut con, &at(until)), [1, 1, 0, 0, 1_000, 0]);
    let info = limiter_info(&mut con, "k").unwrap();
    assert!(!info.contains_key("blocked_until_ms"), "{info:?}");
    assert_eq!(pexpiretime(&mut con, "k"), (until + 1_000) as i64);
    // A key no longer blocked is stored in the compact form again.
    let unblocked: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("k")
        .query(&mut con)
        .unwrap();
    run_ok(
        &mut con,
        &format!("RATELIMIT.CHECK fresh token-bucket 1 1s AT {t}"),
    );
    let fresh: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("fresh")
        .query(&mut con)
        .unwrap();
    assert_eq!(unblocked, fresh);
    // docs/operations.md ("Memory per key"): a blocked key costs 144 bytes more.
    assert_eq!(blocked - fresh, 144, "blocked {blocked}, fresh {fresh}");
}

#[test]
fn checkall_blocks_the_keys_whose_limits_reject() {
    let server = Server::start();
    let mut con = server.client();
    let t = future_base_ms();
    let all = |ms: u64| {
        format!(
            "RATELIMIT.CHECKALL 3 a b c fixed-window 1 1s BLOCK 5s token-bucket 1 1s BLOCK 8s \
             BURST 3 sliding-window 5 1s AT {ms}"
        )
    };
    let reply = send(&mut con, &[common::cmd_line(&all(t))]);
    // The sliding window's count weighs on for two periods.
    assert_eq!(common::reply6(&first(&reply[0])), [1, 1, 0, 0, 2_000, 0]);
    // `a` rejects: it is blocked, `b` (room left) and `c` (no BLOCK) are not, nothing consumed.
    let reply = send(&mut con, &[common::cmd_line(&all(t + 10))]);
    let limits = items(&reply[0]);
    assert_eq!(common::reply6(&limits[0]), [0, 1, 0, 5_000, 5_000, 0]);
    assert_eq!(common::reply6(&limits[1]), [0, 1, 0, 5_000, 5_000, 0]);
    assert_eq!(common::reply6(&limits[2])[0], 1);
    assert_eq!(common::reply6(&limits[3])[0], 1);
    let info = limiter_info(&mut con, "a").unwrap();
    assert_eq!(info_int(&info, "blocked_until_ms"), (t + 5_010) as i64);
    for key in ["b", "c"] {
        let info = limiter_info(&mut con, key).unwrap();
        assert!(!info.contains_key("blocked_until_ms"), "{key}: {info:?}");
    }
    // After a's window, a's block still rejects the whole request.
    let reply = send(&mut con, &[common::cmd_line(&all(t + 2_000))]);
    assert_eq!(common::reply6(&first(&reply[0]))[..4], [0, 1, 0, 3_010]);
    assert_eq!(info_int(&limiter_info(&mut con, "b").unwrap(), "tokens"), 2);
    // A key named twice is blocked once, by the first limit that starts a block.
    run_ok(
        &mut con,
        &format!("RATELIMIT.CHECK d fixed-window 1 1s AT {t}"),
    );
    let twice = format!(
        "RATELIMIT.CHECKALL 2 d d fixed-window 1 1s BLOCK 3s fixed-window 1 1s BLOCK 9s AT {}",
        t + 10
    );
    run_ok(&mut con, &twice);
    let info = limiter_info(&mut con, "d").unwrap();
    assert_eq!(info_int(&info, "blocked_until_ms"), (t + 3_010) as i64);
}

/// The overall decision of a RESP2 CHECKALL reply.
fn first(reply: &Value) -> Value {
    items(reply)[0].clone()
}

fn items(reply: &Value) -> Vec<Value> {
    match reply {
        Value::Array(items) => items.clone(),
        other => panic!("not an array: {other:?}"),
    }
}

#[test]
fn a_policy_carries_its_block_and_info_counts_the_blocked_calls() {
    let server = Server::start();
    let mut con = server.client();
    let t = future_base_ms();
    run_ok(
        &mut con,
        "RATELIMIT.POLICY SET login fixed-window 1 1m BLOCK 15m",
    );
    run_ok(
        &mut con,
        "RATELIMIT.POLICY SET trial fixed-window 1 1m BLOCK 15m SHADOW",
    );
    let get = run_ok(&mut con, "RATELIMIT.POLICY GET login");
    let fields = items(&get);
    assert_eq!(common::show_value(&fields[10]), "block_ms");
    assert_eq!(fields[11], Value::Int(900_000));
    let without = run_ok(&mut con, "RATELIMIT.POLICY SET plain fixed-window 1 1m");
    assert_eq!(without, Value::Okay);
    assert_eq!(
        items(&run_ok(&mut con, "RATELIMIT.POLICY GET plain"))[11],
        Value::Int(0)
    );
    for (i, key) in ["alice", "bob"].iter().enumerate() {
        let policy = ["login", "trial"][i];
        let call = |ms: u64| format!("RATELIMIT.CHECK {key} POLICY {policy} AT {ms}");
        assert_eq!(six(&mut con, &call(t))[0], 1);
        // The rejection that starts the block, then two calls the block rejects.
        for ms in [t + 1, t + 70_000, t + 80_000] {
            let reply = six(&mut con, &call(ms));
            // The shadow policy answers admitted; its key is blocked all the same.
            assert_eq!(reply[0], i as i64, "{key} at {ms}");
        }
        let info = limiter_info(&mut con, key).unwrap();
        assert_eq!(info_int(&info, "blocked_until_ms"), (t + 900_001) as i64);
    }
    let info = server.info("ratelimit");
    assert_eq!(info["ratelimit_fixed_window_blocked"], "4");
    assert_eq!(info["ratelimit_fixed_window_rejected"], "3");
    let login = &info["ratelimit_policy_login"];
    assert!(
        login.contains("allowed=1,rejected=3,") && login.ends_with(",blocked=2"),
        "{login}"
    );
    let trial = &info["ratelimit_policy_trial"];
    assert!(
        trial.contains("allowed=4,rejected=0,") && trial.contains("shadow_rejected=3"),
        "{trial}"
    );
    assert!(trial.ends_with(",blocked=2"), "{trial}");
    // BLOCK is the policy's: a call through it may not add one.
    let error = common::run_error(&mut con, "RATELIMIT.CHECK x POLICY login BLOCK 1s");
    assert_eq!(
        error,
        "ERR BLOCK cannot be given with POLICY: the policy sets the limit"
    );
}

#[test]
fn a_block_raises_its_events_once_and_blocked_calls_are_rejections() {
    let server = Server::builder()
        .config(&[("notify-keyspace-events", "Kd")])
        .start();
    let mut subscriber = server.client();
    subscriber
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut pubsub = subscriber.as_pubsub();
    pubsub.psubscribe("__keyspace@0__:*").unwrap();
    let mut con = server.client();
    let t = future_base_ms();
    blocked_key(&mut con, "k", "fixed-window", t);
    six(
        &mut con,
        &format!(
            "RATELIMIT.CHECK k fixed-window 1 1s BLOCK 10s AT {}",
            t + 200
        ),
    );
    // PEEK raises nothing; a marker rejection (a cost above the limit) ends the list.
    six(
        &mut con,
        &format!("RATELIMIT.PEEK k fixed-window 1 1s AT {}", t + 300),
    );
    six(&mut con, "RATELIMIT.CHECK marker fixed-window 1 1s COST 2");
    let mut events = Vec::new();
    loop {
        let message = pubsub.get_message().expect("a keyspace event");
        let channel = message.get_channel_name().to_string();
        let payload: String = message.get_payload().unwrap();
        if channel.ends_with(":marker") {
            break;
        }
        events.push(payload);
    }
    assert_eq!(
        events,
        [
            "ratelimit.rejected",
            "ratelimit.blocked",
            "ratelimit.rejected"
        ]
    );
}

#[test]
fn replicas_and_reloads_hold_the_block_exactly() {
    let (master, replica) = master_and_replica();
    let mut con = master.client();
    let t = future_base_ms();
    let mut keys = Vec::new();
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        let key = format!("r:{algorithm}");
        blocked_key(&mut con, &key, algorithm, t);
        keys.push(key);
    }
    run_ok(
        &mut con,
        &format!(
            "RATELIMIT.CHECKALL 2 r:x r:y fixed-window 1 1s BLOCK 4s fixed-window 5 1s AT {t}"
        ),
    );
    run_ok(
        &mut con,
        &format!(
            "RATELIMIT.CHECKALL 2 r:x r:y fixed-window 1 1s BLOCK 4s fixed-window 5 1s AT {}",
            t + 1
        ),
    );
    keys.extend(["r:x".to_string(), "r:y".to_string()]);
    assert_replica_matches(&master, &replica, &keys);
    let mut rcon = replica.client();
    let info = limiter_info(&mut rcon, "r:x").unwrap();
    assert_eq!(info_int(&info, "blocked_until_ms"), (t + 4_001) as i64);
    // What DEBUG RELOAD (an RDB round trip) brings back.
    let before: Vec<_> = keys
        .iter()
        .map(|k| (limiter_info(&mut con, k), pexpiretime(&mut con, k)))
        .collect();
    run_ok(&mut con, "DEBUG RELOAD");
    let after: Vec<_> = keys
        .iter()
        .map(|k| (limiter_info(&mut con, k), pexpiretime(&mut con, k)))
        .collect();
    assert_eq!(before, after);
    assert!(keys.iter().all(|k| exists(&mut con, k)));
}

#[test]
fn apply_takes_a_block_only_onto_a_limiter_it_could_follow() {
    use redis_ratelimit_core::codec::Change;
    let server = Server::start();
    let mut con = server.client();
    let t = future_base_ms();
    let apply = |con: &mut redis::Connection, key: &str, until_ms: u64| {
        let payload = Change::Block { until_ms }.to_bytes();
        common::send_one(
            con,
            redis::cmd("RATELIMIT.APPLY")
                .arg(key)
                .arg(payload.as_slice()),
        )
    };
    let refused = Some("ERR invalid limiter state payload".to_string());
    // On nothing: refused, nothing created.
    assert_eq!(
        common::error_text(&apply(&mut con, "k", t + 5_000)),
        refused
    );
    assert!(!exists(&mut con, "k"));
    run_ok(
        &mut con,
        &format!("RATELIMIT.CHECK k fixed-window 1 1s AT {t}"),
    );
    // A block ending at or before the last consuming call: no rejection after it wrote that.
    for until in [t - 1, t] {
        let reply = apply(&mut con, "k", until);
        assert_eq!(common::error_text(&reply), refused, "until {until}");
        assert!(!limiter_info(&mut con, "k")
            .unwrap()
            .contains_key("blocked_until_ms"));
    }
    assert_eq!(apply(&mut con, "k", t + 5_000), Value::Okay);
    let info = limiter_info(&mut con, "k").unwrap();
    assert_eq!(info_int(&info, "blocked_until_ms"), (t + 5_000) as i64);
    assert_eq!(pexpiretime(&mut con, "k"), (t + 5_000) as i64);
}
