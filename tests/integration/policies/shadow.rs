//! Shadow mode: a shadow policy is evaluated and stored as its enforce twin is (a request the limit
//! rejects is not counted), and a rejection is answered as admitted (`allowed` 1,
//! `retry_after_ms` 0, the other fields as enforcement answers them); it raises
//! `ratelimit.shadow-rejected` instead of `ratelimit.rejected`, and INFO counts it as
//! `shadow_rejected`. Flipping a policy between modes changes nothing stored. CHECKALL with shadow
//! specs is in shadow_checkall.rs.

use super::{
    algorithm_figures, call_cmd, check_cmd, checkall_cmd, define, get, policy_figures, seed,
    shadowed, stored, Figures, SpecArg,
};
use crate::common;

use std::time::Duration;

use common::model::Spec;
use common::rng::Rng;
use common::{decision, future_base_ms, run_ok, send_one, show_value, Server};
use redis::Connection;
use redis_ratelimit_core::algorithms::Algorithm;

#[test]
fn a_shadow_policy_answers_as_its_enforce_twin_with_rejections_admitted_and_stores_the_same() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    let seed = seed();
    let mut checks = 0;
    for (stream, algorithm) in Algorithm::ALL.into_iter().enumerate() {
        let mut rng = Rng::with_stream(seed, 200 + stream as u64);
        let name = algorithm.name();
        let random_spec = |rng: &mut Rng| Spec {
            algorithm,
            limit: rng.range(1, 5),
            period_ms: rng.pick(&[100, 1000, 5000, 60_000]),
            burst: (algorithm.is_bucket() && rng.chance(50)).then(|| rng.range(1, 8)),
        };
        let mut spec = random_spec(&mut rng);
        let (enforce, shadow) = (format!("enf.{name}"), format!("shd.{name}"));
        define(&mut con, &enforce, &spec, false);
        define(&mut con, &shadow, &spec, true);
        let (enforce_key, shadow_key) = (format!("e:{name}"), format!("s:{name}"));
        let mut at = base + rng.range(0, 10_000);
        let (mut enforced, mut rejected) = (0u64, 0u64);
        for step in 0..200 {
            let context = format!("{name} step {step}");
            match rng.range(1, 100) {
                1..=35 => {}
                36..=85 => at += rng.range(1, 300),
                86..=92 => at += rng.range(1_000, 10_000),
                _ => at = at.saturating_sub(rng.range(1, 400)).max(base),
            }
            if rng.chance(4) {
                // Both policies get the same new parameters; the shadow one stays in shadow mode.
                spec = random_spec(&mut rng);
                define(&mut con, &enforce, &spec, false);
                define(&mut con, &shadow, &spec, true);
                continue;
            }
            let cost = match rng.range(1, 100) {
                1..=10 => 0,
                11..=80 => 1,
                81..=95 => rng.range(2, 3),
                _ => spec.burst.unwrap_or(spec.limit) + 1,
            };
            // PEEK answers what the CHECK would: rewritten too.
            let command = if rng.chance(10) {
                "RATELIMIT.PEEK"
            } else {
                "RATELIMIT.CHECK"
            };
            let enforced_reply = decision(
                &mut con,
                &call_cmd(command, &enforce_key, &enforce, cost, at),
            );
            let shadow_reply =
                decision(&mut con, &call_cmd(command, &shadow_key, &shadow, cost, at));
            assert_eq!(
                shadow_reply,
                shadowed(enforced_reply),
                "{context}: {command} COST {cost} AT {at}"
            );
            assert_eq!(
                stored(&mut con, &[&shadow_key]),
                stored(&mut con, &[&enforce_key]),
                "{context}: the shadow key holds another state"
            );
            if command == "RATELIMIT.CHECK" {
                enforced += 1;
                rejected += u64::from(enforced_reply[0] == 0);
            }
        }
        assert!(
            rejected > 20 && enforced - rejected > 20,
            "{name}: {rejected} of {enforced} rejected"
        );
        checks += enforced;
        let figures = policy_figures(&server);
        let (e, s) = (figures[&enforce], figures[&shadow]);
        assert_eq!(
            e,
            Figures {
                calls: enforced,
                allowed: enforced - rejected,
                rejected,
                shadow_rejected: 0,
                blocked: 0
            },
            "{enforce}"
        );
        // Every call answered admitted; what enforcement rejected counted as shadow_rejected.
        assert_eq!(
            s,
            Figures {
                calls: enforced,
                allowed: enforced,
                rejected: 0,
                shadow_rejected: rejected,
                blocked: 0
            },
            "{shadow}"
        );
        // The per-algorithm counters count the answers: the shadow calls all as allowed.
        let [calls, allowed, refused, keys] = algorithm_figures(&server, name);
        assert_eq!(
            [calls, allowed, refused],
            [2 * enforced, enforced + (enforced - rejected), rejected],
            "{name}: INFO ratelimit"
        );
        assert_eq!(keys, 2, "{name}: live keys");
    }
    eprintln!("{checks} CHECKs through shadow policies");
}

#[test]
fn flipping_a_policy_between_modes_changes_nothing_stored() {
    let server = Server::start();
    let mut con = server.client();
    let at = future_base_ms();
    for algorithm in Algorithm::ALL {
        let name = format!("flip.{}", algorithm.name());
        let key = format!("flip:{}", algorithm.name());
        let spec = Spec::new(algorithm, 2, 60_000);
        define(&mut con, &name, &spec, true);
        // Filled, then one more: rejected by the limit, admitted by shadow mode.
        for _ in 0..2 {
            assert_eq!(decision(&mut con, &check_cmd(&key, &name, 1, at))[0], 1);
        }
        let admitted = decision(&mut con, &check_cmd(&key, &name, 1, at + 1));
        assert_eq!((admitted[0], admitted[3]), (1, 0), "{name}: {admitted:?}");
        let before = stored(&mut con, &[&key]);

        // Enforce mode: the same state, now answered with the rejection.
        define(&mut con, &name, &spec, false);
        assert_eq!(get(&mut con, &name).unwrap()["mode"], "enforce");
        assert_eq!(
            stored(&mut con, &[&key]),
            before,
            "{name}: SET changed the key"
        );
        let rejected = decision(&mut con, &check_cmd(&key, &name, 1, at + 1));
        assert!(rejected[0] == 0 && rejected[3] > 0, "{name}: {rejected:?}");
        assert_eq!(shadowed(rejected), admitted, "{name}");

        // And back: admitted again, still nothing stored changed.
        define(&mut con, &name, &spec, true);
        assert_eq!(
            stored(&mut con, &[&key]),
            before,
            "{name}: SET changed the key"
        );
        assert_eq!(
            decision(&mut con, &check_cmd(&key, &name, 1, at + 1)),
            admitted
        );
        assert_eq!(stored(&mut con, &[&key]), before, "{name}");
        // The counters span both modes: 5 calls, 1 rejected in enforce mode, 2 in shadow mode.
        assert_eq!(
            policy_figures(&server)[&name],
            Figures {
                calls: 5,
                allowed: 4,
                rejected: 1,
                shadow_rejected: 2,
                blocked: 0
            },
            "{name}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Keyspace events

/// Subscribes to every keyspace and keyevent channel of db 0, with a 5 s read timeout.
fn subscribe(pubsub: &mut redis::PubSub<'_>) {
    pubsub.psubscribe("__keyspace@0__:*").unwrap();
    pubsub.psubscribe("__keyevent@0__:*").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
}

/// Every `(channel, payload)` published before the events of a `SET marker <n>` sent now,
/// sorted (only how many of each matter, not their order).
fn events_until_marker(
    con: &mut Connection,
    pubsub: &mut redis::PubSub<'_>,
    n: &mut u32,
) -> Vec<(String, String)> {
    *n += 1;
    run_ok(con, &format!("SET marker {n}"));
    let mut events = Vec::new();
    loop {
        let message = pubsub.get_message().expect("no keyspace event within 5 s");
        let event = (
            message.get_channel_name().to_string(),
            message.get_payload::<String>().unwrap(),
        );
        match (event.0.as_str(), event.1.as_str()) {
            ("__keyspace@0__:marker", "set") => continue,
            ("__keyevent@0__:set", "marker") => break,
            _ => events.push(event),
        }
    }
    events.sort();
    events
}

/// The two messages of `event` on `key` (its keyspace and keyevent channels), sorted.
fn raised(event: &str, key: &str) -> Vec<(String, String)> {
    all(&[(event, key)])
}

/// The messages of several events, sorted as [`events_until_marker`] answers them.
fn all(events: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut messages: Vec<(String, String)> = events
        .iter()
        .flat_map(|(event, key)| {
            [
                (format!("__keyspace@0__:{key}"), event.to_string()),
                (format!("__keyevent@0__:{event}"), key.to_string()),
            ]
        })
        .collect();
    messages.sort();
    messages
}

const REJECTED: &str = "ratelimit.rejected";
const SHADOW_REJECTED: &str = "ratelimit.shadow-rejected";

#[test]
fn shadow_rejections_raise_ratelimit_shadow_rejected_and_no_ratelimit_rejected() {
    let server = Server::builder()
        .config(&[("notify-keyspace-events", "KEd$")])
        .start();
    let mut con = server.client();
    let mut sub_con = server.client();
    let mut sub = sub_con.as_pubsub();
    subscribe(&mut sub);
    let at = future_base_ms();
    let mut marker = 0;
    let one = Spec::new(Algorithm::FixedWindow, 1, 3_600_000);
    define(&mut con, "ev.enf", &one, false);
    define(&mut con, "ev.shd", &one, true);
    let check = |con: &mut Connection, key: &str, policy: &str, cost: u64| {
        decision(con, &check_cmd(key, policy, cost, at))[0]
    };

    // Admitted calls raise nothing.
    assert_eq!(check(&mut con, "k:enf", "ev.enf", 1), 1);
    assert_eq!(check(&mut con, "k:shd", "ev.shd", 1), 1);
    assert_eq!(events_until_marker(&mut con, &mut sub, &mut marker), []);
    // A rejection through an enforce policy: ratelimit.rejected, as inline.
    assert_eq!(check(&mut con, "k:enf", "ev.enf", 1), 0);
    assert_eq!(
        events_until_marker(&mut con, &mut sub, &mut marker),
        raised(REJECTED, "k:enf")
    );
    // Shadow mode: admitted, and its own event only.
    assert_eq!(check(&mut con, "k:shd", "ev.shd", 1), 1);
    assert_eq!(
        events_until_marker(&mut con, &mut sub, &mut marker),
        raised(SHADOW_REJECTED, "k:shd")
    );
    // Neither PEEK nor COST 0 (which fits) raises one.
    let peek = decision(
        &mut con,
        &call_cmd("RATELIMIT.PEEK", "k:shd", "ev.shd", 1, at),
    );
    assert_eq!(peek[0], 1, "{peek:?}");
    assert_eq!(check(&mut con, "k:shd", "ev.shd", 0), 1);
    assert_eq!(events_until_marker(&mut con, &mut sub, &mut marker), []);

    // CHECKALL: ratelimit.rejected once per key with a rejecting enforce spec when the request
    // is rejected; ratelimit.shadow-rejected once per key with a rejecting shadow spec.
    let enf = || SpecArg::Policy("ev.enf".into());
    let shd = || SpecArg::Policy("ev.shd".into());
    let mut checkall = |keys: &[&str], specs: &[SpecArg]| -> i64 {
        let reply = send_one(&mut con, &checkall_cmd(keys, specs, 1, at));
        let rows: Vec<Vec<i64>> = redis::from_redis_value(&reply)
            .unwrap_or_else(|_| panic!("{keys:?}: {}", show_value(&reply)));
        rows[0][0]
    };
    // k:enf and k:shd are full. Rejected: both events.
    assert_eq!(checkall(&["k:enf", "k:shd"], &[enf(), shd()]), 0);
    // Admitted by a fresh enforce key: the shadow one's event only.
    assert_eq!(checkall(&["fresh:1", "k:shd"], &[enf(), shd()]), 1);
    // A key named twice whose second shadow spec rejects: one event.
    assert_eq!(checkall(&["twice", "twice"], &[shd(), shd()]), 1);
    // A full key named twice with enforce specs: one ratelimit.rejected.
    assert_eq!(checkall(&["k:enf", "k:enf"], &[enf(), enf()]), 0);
    // A full key with an enforce and a shadow spec: one of each.
    assert_eq!(checkall(&["k:enf", "k:enf"], &[enf(), shd()]), 0);
    assert_eq!(
        events_until_marker(&mut con, &mut sub, &mut marker),
        all(&[
            (REJECTED, "k:enf"),
            (SHADOW_REJECTED, "k:shd"),
            (SHADOW_REJECTED, "k:shd"),
            (SHADOW_REJECTED, "twice"),
            (REJECTED, "k:enf"),
            (REJECTED, "k:enf"),
            (SHADOW_REJECTED, "k:enf"),
        ])
    );
    // A rejected request whose shadow key admits: only the enforce key's event.
    let reply = send_one(
        &mut con,
        &checkall_cmd(&["k:enf", "fresh:2"], &[enf(), shd()], 1, at),
    );
    let rows: Vec<Vec<i64>> = redis::from_redis_value(&reply).unwrap();
    assert_eq!((rows[0][0], rows[2][0]), (0, 1), "{rows:?}");
    assert_eq!(
        events_until_marker(&mut con, &mut sub, &mut marker),
        raised(REJECTED, "k:enf")
    );
}
