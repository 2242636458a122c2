//! `INFO ratelimit`: `ratelimit_policies:N`, then one line per policy,
//! `ratelimit_policy_<name>:calls=..,allowed=..,rejected=..,shadow_rejected=..`, counted for CHECK
//! and CHECKALL (not PEEK, not a call refused with an error): allowed and rejected are the answer
//! for that limit (in CHECKALL whether the request was admitted), shadow_rejected the requests a
//! shadow policy's limit would have rejected. `CONFIG RESETSTAT` zeroes them and the per-algorithm
//! calls, allowed and rejected (not the live keys); one refused by ACL changes nothing.

use super::{
    algorithm_figures, call_cmd, check_cmd, checkall_cmd, define, policy_figures, Figures, SpecArg,
};
use crate::common;

use std::collections::BTreeMap;

use common::model::Spec;
use common::{decision, future_base_ms, run, run_ok, send_one, show_value, Server};
use redis::{Connection, Value};
use redis_ratelimit_core::algorithms::Algorithm;

fn figures(calls: u64, allowed: u64, rejected: u64, shadow_rejected: u64) -> Figures {
    Figures {
        calls,
        allowed,
        rejected,
        shadow_rejected,
        blocked: 0,
    }
}

/// The CHECKALL's overall `allowed`.
fn checkall(con: &mut Connection, keys: &[&str], specs: &[SpecArg], at: u64) -> i64 {
    let reply = send_one(con, &checkall_cmd(keys, specs, 1, at));
    let rows: Vec<Vec<i64>> = redis::from_redis_value(&reply)
        .unwrap_or_else(|_| panic!("{keys:?}: {}", show_value(&reply)));
    rows[0][0]
}

/// The known sequence of [`info_lines_count_each_policys_answers`]; see the counts there.
fn known_sequence(con: &mut Connection, at: u64) {
    // tb: a token bucket of 3; sh: a fixed window of 2, in shadow mode; idle: never called.
    define(
        con,
        "tb",
        &Spec::new(Algorithm::TokenBucket, 3, 3_600_000),
        false,
    );
    define(
        con,
        "sh",
        &Spec::new(Algorithm::FixedWindow, 2, 3_600_000),
        true,
    );
    define(
        con,
        "idle",
        &Spec::new(Algorithm::SlidingLog, 5, 60_000),
        false,
    );
    let allowed: Vec<i64> = (0..5)
        .map(|_| decision(con, &check_cmd("a", "tb", 1, at))[0])
        .collect();
    assert_eq!(allowed, [1, 1, 1, 0, 0]);
    // Not counted: PEEKs, and a call answered with an error.
    decision(con, &call_cmd("RATELIMIT.PEEK", "a", "tb", 1, at));
    decision(con, &call_cmd("RATELIMIT.PEEK", "s", "sh", 1, at));
    run_ok(con, "SET plain x");
    assert!(common::is_error(&send_one(
        con,
        &check_cmd("plain", "tb", 1, at)
    )));
    // COST 0 fits an empty bucket: allowed.
    assert_eq!(decision(con, &check_cmd("a", "tb", 0, at))[0], 1);
    // Four through the shadow policy: all answered admitted, the last two over its limit.
    for _ in 0..4 {
        assert_eq!(decision(con, &check_cmd("s", "sh", 1, at))[0], 1);
    }
    let tb = || SpecArg::Policy("tb".into());
    let sh = || SpecArg::Policy("sh".into());
    // Fresh keys: admitted.
    assert_eq!(checkall(con, &["c1", "c2"], &[tb(), sh()], at), 1);
    // a is empty: rejected; s is full: its shadow limit rejects too.
    assert_eq!(checkall(con, &["a", "s"], &[tb(), sh()], at), 0);
    // c1 has tokens; s is full (shadow): admitted.
    assert_eq!(checkall(con, &["c1", "s"], &[tb(), sh()], at), 1);
    // Inline: no policy's.
    let inline = SpecArg::Inline(Spec::new(Algorithm::TokenBucket, 3, 3_600_000));
    assert_eq!(checkall(con, &["x"], &[inline], at), 1);
}

#[test]
fn info_lines_count_each_policys_answers() {
    let server = Server::start();
    let mut con = server.client();
    let at = future_base_ms();
    known_sequence(&mut con, at);
    let expected: BTreeMap<String, Figures> = [
        // 5 CHECKs (3 allowed, 2 rejected), COST 0 (allowed), 3 CHECKALLs (2 admitted).
        ("tb", figures(9, 6, 3, 0)),
        // 4 CHECKs, all answered allowed, 2 over the limit; 3 CHECKALLs, 2 admitted, and its
        // limit rejected in 2 of them (the second one rejected by tb anyway).
        ("sh", figures(7, 6, 1, 4)),
        ("idle", figures(0, 0, 0, 0)),
    ]
    .into_iter()
    .map(|(name, f)| (name.to_string(), f))
    .collect();
    assert_eq!(policy_figures(&server), expected);
    // The lines as INFO writes them, sorted by name, after the count.
    let text: String = redis::cmd("INFO").arg("ratelimit").query(&mut con).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .skip_while(|line| !line.starts_with("ratelimit_policies:"))
        .collect();
    assert_eq!(
        lines,
        [
            "ratelimit_policies:3",
            "ratelimit_policy_idle:calls=0,allowed=0,rejected=0,shadow_rejected=0,blocked=0",
            "ratelimit_policy_sh:calls=7,allowed=6,rejected=1,shadow_rejected=4,blocked=0",
            "ratelimit_policy_tb:calls=9,allowed=6,rejected=3,shadow_rejected=0,blocked=0",
        ],
        "{text}"
    );
    // Per algorithm, each limit of a CHECKALL counts whether the request was admitted:
    // token-bucket 6 CHECKs (4 allowed) + 4 CHECKALL limits (3 admitted), keys a, c1, x;
    // fixed-window 4 CHECKs (answered allowed) + 3 CHECKALL limits (2 admitted), keys s, c2.
    assert_eq!(algorithm_figures(&server, "token-bucket"), [10, 7, 3, 3]);
    assert_eq!(algorithm_figures(&server, "fixed-window"), [7, 6, 1, 2]);
    assert_eq!(algorithm_figures(&server, "sliding-log"), [0, 0, 0, 0]);

    // A replaced policy keeps its counters; a deleted one's line goes, and a new policy of that
    // name counts from 0.
    define(
        &mut con,
        "tb",
        &Spec::new(Algorithm::TokenBucket, 30, 3_600_000),
        false,
    );
    assert_eq!(policy_figures(&server)["tb"], figures(9, 6, 3, 0));
    assert_eq!(run(&mut con, "RATELIMIT.POLICY DEL sh"), Value::Int(1));
    assert!(!policy_figures(&server).contains_key("sh"));
    define(
        &mut con,
        "sh",
        &Spec::new(Algorithm::FixedWindow, 2, 3_600_000),
        true,
    );
    assert_eq!(policy_figures(&server)["sh"], Figures::default());
}

/// Every counter CONFIG RESETSTAT is about: the policies' lines and the per-algorithm figures.
fn counters(server: &Server) -> (BTreeMap<String, Figures>, Vec<[u64; 4]>) {
    let algorithms = Algorithm::ALL
        .iter()
        .map(|a| algorithm_figures(server, a.name()))
        .collect();
    (policy_figures(server), algorithms)
}

/// `CONFIG RESETSTAT` as `con`, then a round trip, so the module has seen the command run.
fn resetstat(con: &mut Connection) -> Value {
    let reply = run(con, "CONFIG RESETSTAT");
    run_ok(con, "PING");
    reply
}

#[test]
fn config_resetstat_zeroes_the_counters_and_a_refused_one_changes_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let at = future_base_ms();
    known_sequence(&mut con, at);
    let before = counters(&server);
    assert_eq!(before.0["tb"], figures(9, 6, 3, 0));

    // Refused by ACL: nothing is reset, neither the module's counters nor Redis's.
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("noreset")
        .arg(&["on", ">secret", "~*", "+@all", "-config|resetstat"])
        .query(&mut con)
        .unwrap();
    let mut refused = server.client();
    let _: () = redis::cmd("AUTH")
        .arg("noreset")
        .arg("secret")
        .query(&mut refused)
        .unwrap();
    let reply = resetstat(&mut refused);
    assert!(
        common::error_text(&reply).is_some_and(|e| e.starts_with("NOPERM")),
        "{}",
        show_value(&reply)
    );
    assert_eq!(counters(&server), before, "a refused CONFIG RESETSTAT");
    assert!(server
        .info("commandstats")
        .contains_key("cmdstat_ratelimit.check"));

    // A real one: every policy's figures and the per-algorithm calls, allowed and rejected are
    // 0; the live keys and the policies stay.
    assert_eq!(resetstat(&mut con), Value::Okay);
    let (policies, algorithms) = counters(&server);
    assert_eq!(policies.keys().collect::<Vec<_>>(), ["idle", "sh", "tb"]);
    assert!(
        policies.values().all(|f| *f == Figures::default()),
        "{policies:?}"
    );
    for (algorithm, (now, then)) in Algorithm::ALL.iter().zip(algorithms.iter().zip(&before.1)) {
        assert_eq!(*now, [0, 0, 0, then[3]], "{}", algorithm.name());
    }
    assert_eq!(algorithm_figures(&server, "token-bucket")[3], 3);

    // Calls after it count from 0: a, empty, rejects; c1 (one token left after the sequence's
    // two CHECKALLs) admits.
    assert_eq!(decision(&mut con, &check_cmd("a", "tb", 1, at))[0], 0);
    assert_eq!(decision(&mut con, &check_cmd("c1", "tb", 1, at))[0], 1);
    assert_eq!(decision(&mut con, &check_cmd("s", "sh", 1, at))[0], 1);
    let (policies, _) = counters(&server);
    assert_eq!(policies["tb"], figures(2, 1, 1, 0));
    assert_eq!(policies["sh"], figures(1, 1, 0, 1));
    assert_eq!(algorithm_figures(&server, "token-bucket")[..3], [2, 1, 1]);

    // A refused one after calls, then a real one with nothing counted since: both leave what is
    // there (the first) or 0 (the second).
    let after = counters(&server);
    resetstat(&mut refused);
    assert_eq!(counters(&server), after);
    assert_eq!(resetstat(&mut con), Value::Okay);
    assert_eq!(counters(&server).0["tb"], Figures::default());
    assert_eq!(resetstat(&mut con), Value::Okay);
    assert_eq!(counters(&server).0["tb"], Figures::default());
}

/// An `INFO ratelimit` sent in one pipeline with the `CONFIG RESETSTAT` before it (one write,
/// so the server reads them all before its event loop turns) shows the counters after the reset:
/// the policies' lines and the per-algorithm figures alike, with the calls between them (a lease
/// and a dialect: every kind of command whose calls the module counts) counted from 0.
#[test]
fn info_pipelined_after_config_resetstat_shows_the_counters_reset() {
    let server = Server::start();
    let mut con = server.client();
    let at = future_base_ms();
    known_sequence(&mut con, at);
    run_ok(&mut con, "RATELIMIT.ACQUIRE lk 2 60000 ID j1");
    run_ok(&mut con, "CL.THROTTLE th 5 10 60");
    assert_eq!(policy_figures(&server)["tb"], figures(9, 6, 3, 0));
    assert_eq!(algorithm_figures(&server, "token-bucket")[0], 10);
    assert_eq!(algorithm_figures(&server, "concurrency")[0], 1);
    assert_eq!(algorithm_figures(&server, "gcra")[0], 1);

    let text = |words: &[&str]| {
        let mut cmd = redis::cmd(words[0]);
        cmd.arg(&words[1..]);
        cmd
    };
    let replies = common::send(
        &mut con,
        &[
            text(&["CONFIG", "RESETSTAT"]),
            text(&["RATELIMIT.ACQUIRE", "lk", "2", "60000", "ID", "j2"]),
            text(&["CL.THROTTLE", "th", "5", "10", "60"]),
            text(&["INFO", "ratelimit"]),
            check_cmd("c1", "tb", 1, at),
            text(&["INFO", "ratelimit"]),
        ],
    );
    assert_eq!(replies[0], Value::Okay, "{}", show_value(&replies[0]));
    let info = |reply: &Value| -> BTreeMap<String, String> {
        let text: String = redis::from_redis_value(reply).expect("INFO text");
        common::parse_info(&text).into_iter().collect()
    };
    let reset = info(&replies[3]);
    for name in ["tb", "sh", "idle"] {
        assert_eq!(
            reset[&format!("ratelimit_policy_{name}")],
            "calls=0,allowed=0,rejected=0,shadow_rejected=0,blocked=0",
            "{reset:?}"
        );
    }
    for (algorithm, calls) in [
        ("token_bucket", "0"),
        ("fixed_window", "0"),
        ("gcra", "1"),
        ("concurrency", "1"),
    ] {
        assert_eq!(
            [
                &reset[&format!("ratelimit_{algorithm}_calls")],
                &reset[&format!("ratelimit_{algorithm}_allowed")],
                &reset[&format!("ratelimit_{algorithm}_rejected")],
            ],
            [calls, calls, "0"],
            "{algorithm}: {reset:?}"
        );
    }
    // The live keys stay: a, c1, x (token bucket).
    assert_eq!(reset["ratelimit_token_bucket_keys"], "3");
    // c1 has a token left: one call, allowed, counted from 0.
    let after = info(&replies[5]);
    assert_eq!(
        after["ratelimit_policy_tb"],
        "calls=1,allowed=1,rejected=0,shadow_rejected=0,blocked=0"
    );
    assert_eq!(after["ratelimit_token_bucket_calls"], "1");
    assert_eq!(policy_figures(&server)["tb"], figures(1, 1, 0, 0));
}
