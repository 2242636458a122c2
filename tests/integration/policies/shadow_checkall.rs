//! CHECKALL with shadow specs: the request is admitted iff every enforce spec admits it; if
//! admitted, it is consumed from every spec whose own decision admits (a rejecting shadow spec
//! consumes nothing); if not, nothing is consumed anywhere. Each limit's reply is its own decision
//! with a shadow rejection answered as admitted, and the overall reply combines them as before.
//!
//! The model: the limits decided in order on a copy of the keys (the crate's pure cores, through
//! `common::model`), each seeing what the admitted ones before it consumed; the copy kept iff
//! every enforce limit admits.

use super::{checkall_cmd, define, seed, shadowed, stored, SpecArg};
use crate::common;

use common::model::{overall, Model, Spec};
use common::rng::Rng;
use common::{future_base_ms, info_int, limiter_info, send_one, show_cmd, show_value, Server};
use redis::Connection;
use redis_ratelimit_core::algorithms::Algorithm;

/// What the rule above gives for one CHECKALL.
struct Expected {
    /// The reply: the overall decision, then each limit's.
    reply: Vec<Vec<i64>>,
    admitted: bool,
    /// How many shadow specs rejected (answered admitted).
    shadow_rejected: usize,
}

/// The rule above for one CHECKALL of `limits` (each a spec and whether it is in shadow mode);
/// `model` keeps what it consumes.
fn expected(
    model: &mut Model,
    keys: &[&str],
    limits: &[(Spec, bool)],
    cost: u64,
    at_ms: u64,
) -> Expected {
    let mut trial = model.clone();
    let decisions: Vec<[i64; 6]> = keys
        .iter()
        .zip(limits)
        .map(|(key, (spec, _))| trial.check(key, &spec.request(cost, at_ms)).to_array())
        .collect();
    let admitted = decisions
        .iter()
        .zip(limits)
        .all(|(decision, (_, shadow))| *shadow || decision[0] == 1);
    if admitted {
        *model = trial;
    }
    let shadow_rejected = decisions
        .iter()
        .zip(limits)
        .filter(|(decision, (_, shadow))| *shadow && decision[0] == 0)
        .count();
    let answers: Vec<[i64; 6]> = decisions
        .iter()
        .zip(limits)
        .map(|(decision, (_, shadow))| {
            if *shadow {
                shadowed(*decision)
            } else {
                *decision
            }
        })
        .collect();
    let reply = std::iter::once(overall(&answers).to_vec())
        .chain(answers.iter().map(|answer| answer.to_vec()))
        .collect();
    Expected {
        reply,
        admitted,
        shadow_rejected,
    }
}

fn rows(con: &mut Connection, cmd: &redis::Cmd) -> Vec<Vec<i64>> {
    let reply = send_one(con, cmd);
    redis::from_redis_value(&reply)
        .unwrap_or_else(|_| panic!("{}: {}", show_cmd(cmd), show_value(&reply)))
}

/// A fixed window's `count` (what was consumed in it), 0 for a missing key.
fn count(con: &mut Connection, key: &str) -> i64 {
    limiter_info(con, key).map_or(0, |info| info_int(&info, "count"))
}

/// One branch of the rule: keys filled first, then one CHECKALL of cost 1.
struct Case {
    what: &'static str,
    /// CHECKs through a policy before the CHECKALL.
    fill: &'static [(&'static str, &'static str)],
    keys: &'static [&'static str],
    policies: &'static [&'static str],
    admitted: bool,
    /// How many shadow specs reject.
    shadow_rejected: usize,
    /// Each key's count after the CHECKALL.
    counts: &'static [(&'static str, i64)],
}

/// `E`: enforce, a fixed window of 2 per hour; `S`: shadow, a fixed window of 1 per hour. Every
/// call is at one instant, so a window's count is what was consumed in it.
const CASES: [Case; 7] = [
    Case {
        what: "every spec admits: consumed everywhere",
        fill: &[],
        keys: &["a1", "a2"],
        policies: &["E", "S"],
        admitted: true,
        shadow_rejected: 0,
        counts: &[("a1", 1), ("a2", 1)],
    },
    Case {
        what:
            "the enforce spec admits, the shadow spec rejects: admitted, the shadow key untouched",
        fill: &[("b2", "S")],
        keys: &["b1", "b2"],
        policies: &["E", "S"],
        admitted: true,
        shadow_rejected: 1,
        counts: &[("b1", 1), ("b2", 1)],
    },
    Case {
        what: "the enforce spec rejects, the shadow spec admits: rejected, nothing consumed",
        fill: &[("c1", "E"), ("c1", "E")],
        keys: &["c1", "c2"],
        policies: &["E", "S"],
        admitted: false,
        shadow_rejected: 0,
        counts: &[("c1", 2), ("c2", 0)],
    },
    Case {
        what: "both reject: rejected, nothing consumed",
        fill: &[("d1", "E"), ("d1", "E"), ("d2", "S")],
        keys: &["d1", "d2"],
        policies: &["E", "S"],
        admitted: false,
        shadow_rejected: 1,
        counts: &[("d1", 2), ("d2", 1)],
    },
    Case {
        what: "shadow specs only, one rejects: admitted, consumed from the other",
        fill: &[("e2", "S")],
        keys: &["e1", "e2"],
        policies: &["S", "S"],
        admitted: true,
        shadow_rejected: 1,
        counts: &[("e1", 1), ("e2", 1)],
    },
    Case {
        what: "a key named twice, its second shadow spec rejecting: consumed once",
        fill: &[],
        keys: &["f", "f"],
        policies: &["S", "S"],
        admitted: true,
        shadow_rejected: 1,
        counts: &[("f", 1)],
    },
    Case {
        what: "a key named twice, enforce then shadow (limit 1, rejecting): consumed once",
        fill: &[],
        keys: &["g", "g"],
        policies: &["E", "S"],
        admitted: true,
        shadow_rejected: 1,
        counts: &[("g", 1)],
    },
];

#[test]
fn checkall_consumes_from_the_admitting_specs_iff_every_enforce_spec_admits() {
    let server = Server::start();
    let mut con = server.client();
    let at = future_base_ms();
    let e = Spec::new(Algorithm::FixedWindow, 2, 3_600_000);
    let s = Spec::new(Algorithm::FixedWindow, 1, 3_600_000);
    define(&mut con, "E", &e, false);
    define(&mut con, "S", &s, true);
    let limit_of = |policy: &str| if policy == "E" { (e, false) } else { (s, true) };
    let mut model = Model::default();
    for case in &CASES {
        for (key, policy) in case.fill {
            let reply = common::decision(&mut con, &super::check_cmd(key, policy, 1, at));
            let (spec, shadow) = limit_of(policy);
            let mut want = model.check(key, &spec.request(1, at)).to_array();
            if shadow {
                want = shadowed(want);
            }
            assert_eq!(reply, want, "{}: filling {key}", case.what);
        }
        let before = stored(&mut con, case.keys);
        let specs: Vec<SpecArg> = case
            .policies
            .iter()
            .map(|p| SpecArg::Policy(p.to_string()))
            .collect();
        let limits: Vec<(Spec, bool)> = case.policies.iter().map(|p| limit_of(p)).collect();
        let reply = rows(&mut con, &checkall_cmd(case.keys, &specs, 1, at));
        let want = expected(&mut model, case.keys, &limits, 1, at);
        assert_eq!(
            (want.admitted, want.shadow_rejected),
            (case.admitted, case.shadow_rejected),
            "{}: the model disagrees",
            case.what
        );
        assert_eq!(reply, want.reply, "{}", case.what);
        assert_eq!(reply[0][0], i64::from(case.admitted), "{}", case.what);
        for (key, expected_count) in case.counts {
            assert_eq!(
                count(&mut con, key),
                *expected_count,
                "{}: {key}",
                case.what
            );
        }
        if !case.admitted {
            assert_eq!(stored(&mut con, case.keys), before, "{}", case.what);
        }
        // A shadow spec that rejects answers admitted, with nothing left and no wait.
        for (row, (_, shadow)) in reply[1..].iter().zip(&limits) {
            if *shadow {
                assert_eq!((row[0], row[3]), (1, 0), "{}: {row:?}", case.what);
            }
        }
    }
    // What a rejected request leaves: c2 was never created.
    assert!(!common::exists(&mut con, "c2"));
}

/// Random CHECKALLs over 1 to 3 keys whose specs are enforce policies, shadow policies or inline
/// limits (policies switched between modes and given new parameters on the way): every reply is
/// the model's, and a rejected request changes no key.
#[test]
fn random_checkalls_with_shadow_policies_follow_the_model() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    let seed = seed();
    let (mut admitted, mut refused, mut shadow_rejections) = (0, 0, 0);
    for sequence in 0..40u64 {
        let mut rng = Rng::with_stream(seed, 300 + sequence);
        let count = rng.range(1, 3) as usize;
        let random_spec = |rng: &mut Rng, algorithm: Algorithm| Spec {
            algorithm,
            limit: rng.range(1, 4),
            period_ms: rng.pick(&[500, 1000, 60_000]),
            burst: (algorithm.is_bucket() && rng.chance(40)).then(|| rng.range(1, 6)),
        };
        // Per key: its spec, and its policy's name and mode (no policy: inline).
        let mut limits: Vec<(Spec, Option<String>, bool)> = (0..count)
            .map(|i| {
                let algorithm = rng.pick(&Algorithm::ALL);
                let spec = random_spec(&mut rng, algorithm);
                let policy = rng.chance(80).then(|| format!("sc.{sequence}.{i}"));
                (spec, policy, rng.chance(50))
            })
            .collect();
        for (spec, policy, shadow) in &limits {
            if let Some(policy) = policy {
                define(&mut con, policy, spec, *shadow);
            }
        }
        let keys: Vec<String> = (0..count).map(|i| format!("sc:{sequence}:{i}")).collect();
        let all_keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut model = Model::default();
        let mut at = base + rng.range(0, 10_000);
        for step in 0..30 {
            let context = format!("sequence {sequence} step {step}");
            at += rng.pick(&[0, 0, 1, 50, 300, 1200]);
            if rng.chance(10) {
                let i = rng.index(count);
                let (spec, policy, shadow) = &mut limits[i];
                if rng.chance(50) {
                    *shadow = !*shadow;
                } else {
                    *spec = random_spec(&mut rng, spec.algorithm);
                }
                if let Some(policy) = policy {
                    define(&mut con, policy, spec, *shadow);
                }
            }
            let mut order: Vec<usize> = (0..count).collect();
            rng.shuffle(&mut order);
            order.truncate(rng.range(1, count as u64) as usize);
            if rng.chance(20) {
                let again = rng.pick(&order);
                let at = rng.index(order.len() + 1);
                order.insert(at, again);
            }
            let cost = rng.pick(&[0, 1, 1, 1, 2, 5]);
            let names: Vec<&str> = order.iter().map(|&i| keys[i].as_str()).collect();
            let specs: Vec<SpecArg> = order
                .iter()
                .map(|&i| match &limits[i].1 {
                    Some(policy) => SpecArg::Policy(policy.clone()),
                    None => SpecArg::Inline(limits[i].0),
                })
                .collect();
            // An inline spec is always enforced.
            let modelled: Vec<(Spec, bool)> = order
                .iter()
                .map(|&i| (limits[i].0, limits[i].1.is_some() && limits[i].2))
                .collect();
            let before = stored(&mut con, &all_keys);
            let cmd = checkall_cmd(&names, &specs, cost, at);
            let reply = rows(&mut con, &cmd);
            let want = expected(&mut model, &names, &modelled, cost, at);
            assert_eq!(reply, want.reply, "{context}: {}", show_cmd(&cmd));
            shadow_rejections += want.shadow_rejected;
            if want.admitted {
                admitted += 1;
            } else {
                refused += 1;
                assert_eq!(
                    stored(&mut con, &all_keys),
                    before,
                    "{context}: a rejected request changed a key: {}",
                    show_cmd(&cmd)
                );
            }
        }
    }
    eprintln!("{admitted} admitted, {refused} refused, {shadow_rejections} shadow rejections");
    assert!(
        admitted > 200 && refused > 100 && shadow_rejections > 50,
        "the sequences do not cover what they should"
    );
}
