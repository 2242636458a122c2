//! A call through an enforce policy is exactly the inline call with the policy's parameters: on
//! twin keys (`pol:...` called through policies, `inl:...` with the same limits written out),
//! every reply, DUMP payload, PEXPIRETIME and RATELIMIT.INFO is the same after every call, over
//! seeded random sequences of every algorithm with `AT` times (bursts in one ms, gaps, time going
//! backwards), COST 0 and costs above the capacity, PEEKs, calls on a key of another algorithm,
//! and `POLICY SET` replacing a policy's parameters mid-sequence (the inline twin switching to the
//! same new parameters). The writes reach a replica identically, and the per-algorithm counters
//! count the policy calls as the inline ones.

use super::{
    algorithm_figures, check_cmd, checkall_cmd, define, inline_cmd, policy_figures, seed, stored,
    Figures, SpecArg,
};
use crate::common;

use common::model::Spec;
use common::rng::Rng;
use common::{
    assert_replica_matches, error_text, master_and_replica, send, show_cmd, show_value, try_reply6,
    wait_replica_sync,
};
use redis::{Cmd, Connection, Value};
use redis_ratelimit_core::algorithms::Algorithm;

/// Small limits (so that sequences reject often), now and then a large one; periods from 1 ms to
/// an hour; BURST below and above the limit.
fn random_spec(rng: &mut Rng, algorithm: Algorithm) -> Spec {
    let limit = if rng.chance(10) {
        rng.range(20, 500)
    } else {
        rng.range(1, 6)
    };
    let burst = (algorithm.is_bucket() && rng.chance(50)).then(|| rng.range(1, 10));
    Spec {
        algorithm,
        limit,
        period_ms: rng.pick(&[1, 250, 1000, 1500, 60_000, 3_600_000]),
        burst,
    }
}

/// COST 0, mostly 1, sometimes a few, now and then more than the capacity.
fn random_cost(rng: &mut Rng, spec: &Spec) -> u64 {
    match rng.range(1, 100) {
        1..=10 => 0,
        11..=70 => 1,
        71..=90 => rng.range(2, 3),
        _ => spec.burst.unwrap_or(spec.limit) + rng.range(1, 5),
    }
}

/// The next time: the same ms, a step forward, a gap, or a late call (before the last one).
fn next_time(rng: &mut Rng, at: u64, base: u64) -> u64 {
    match rng.range(1, 100) {
        1..=30 => at,
        31..=80 => at + rng.range(1, 400),
        81..=88 => at + rng.range(1_000, 5_000),
        _ => at.saturating_sub(rng.range(1, 500)).max(base),
    }
}

/// Sends `cmds` (a call through a policy, then its inline twin) followed by the state of both
/// keys; asserts the two replies are the same and so is everything stored. Returns the reply.
fn same_on_twins(
    con: &mut Connection,
    cmds: [Cmd; 2],
    keys: &[(&str, &str)],
    context: &str,
) -> Value {
    let replies = send(con, &cmds);
    let (through, inline) = (&replies[0], &replies[1]);
    assert_eq!(
        show_value(through),
        show_value(inline),
        "{context}: {} and {} answer differently",
        show_cmd(&cmds[0]),
        show_cmd(&cmds[1])
    );
    for (policy_key, inline_key) in keys {
        assert_eq!(
            stored(con, &[policy_key]),
            stored(con, &[inline_key]),
            "{context}: after {}: {policy_key} and {inline_key} hold different states",
            show_cmd(&cmds[0])
        );
    }
    through.clone()
}

/// What a sequence did, for the counters and to show it covered what it should.
#[derive(Default, Debug)]
struct Tally {
    allowed: u64,
    rejected: u64,
    errors: u64,
    peeks: u64,
    replaced: u64,
}

#[test]
fn checks_through_a_policy_equal_inline_checks_on_twin_keys() {
    let (master, replica) = master_and_replica();
    let mut con = master.client();
    let base = common::future_base_ms();
    let seed = seed();
    let mut all_keys = Vec::new();
    for (stream, algorithm) in Algorithm::ALL.into_iter().enumerate() {
        let mut rng = Rng::with_stream(seed, stream as u64);
        let name = algorithm.name();
        // Two keys per algorithm, each with its own policy; and a policy of another algorithm,
        // whose calls on these keys are refused (the same error as inline).
        let mut specs: Vec<Spec> = (0..2).map(|_| random_spec(&mut rng, algorithm)).collect();
        let policies: Vec<String> = (0..2).map(|i| format!("eq.{name}.{i}")).collect();
        for (policy, spec) in policies.iter().zip(&specs) {
            define(&mut con, policy, spec, false);
        }
        let other = Algorithm::ALL[(stream + 1) % Algorithm::ALL.len()];
        let other_spec = random_spec(&mut rng, other);
        let other_policy = format!("other.{name}");
        define(&mut con, &other_policy, &other_spec, false);
        let keys: Vec<(String, String)> = (0..2)
            .map(|i| (format!("pol:{name}:{i}"), format!("inl:{name}:{i}")))
            .collect();
        let before = algorithm_figures(&master, name);
        let mut tally = Tally::default();
        let mut per_policy = [Figures::default(); 2];
        let mut at = base + rng.range(0, 10_000);
        for step in 0..250 {
            let context = format!("{name} step {step}");
            at = next_time(&mut rng, at, base);
            let i = rng.index(2);
            let (policy_key, inline_key) = (keys[i].0.as_str(), keys[i].1.as_str());
            let twins = [(policy_key, inline_key)];
            let roll = rng.range(1, 100);
            if roll <= 5 {
                // A new definition for the policy; the inline twin follows it.
                specs[i] = random_spec(&mut rng, algorithm);
                define(&mut con, &policies[i], &specs[i], false);
                tally.replaced += 1;
                continue;
            }
            if roll <= 7 {
                // Through a policy of another algorithm: refused alike, nothing changes.
                let cost = random_cost(&mut rng, &other_spec);
                let reply = same_on_twins(
                    &mut con,
                    [
                        check_cmd(policy_key, &other_policy, cost, at),
                        inline_cmd("RATELIMIT.CHECK", inline_key, &other_spec, cost, at),
                    ],
                    &twins,
                    &context,
                );
                // A fresh key takes any algorithm: only a stored one refuses.
                if error_text(&reply).is_some() {
                    tally.errors += 1;
                } else {
                    // It created the key under the other algorithm: drop both twins.
                    let _: i64 = redis::cmd("DEL")
                        .arg(policy_key)
                        .arg(inline_key)
                        .query(&mut con)
                        .unwrap();
                }
                continue;
            }
            let spec = specs[i];
            let cost = random_cost(&mut rng, &spec);
            let command = if roll <= 20 {
                "RATELIMIT.PEEK"
            } else {
                "RATELIMIT.CHECK"
            };
            let through = super::call_cmd(command, policy_key, &policies[i], cost, at);
            let inline = inline_cmd(command, inline_key, &spec, cost, at);
            let reply = same_on_twins(&mut con, [through, inline], &twins, &context);
            let reply =
                try_reply6(&reply).unwrap_or_else(|| panic!("{context}: {}", show_value(&reply)));
            if command == "RATELIMIT.PEEK" {
                tally.peeks += 1;
                continue;
            }
            let counted = &mut per_policy[i];
            counted.calls += 1;
            if reply[0] == 1 {
                tally.allowed += 1;
                counted.allowed += 1;
            } else {
                tally.rejected += 1;
                counted.rejected += 1;
            }
        }
        eprintln!("{name}: {tally:?}");
        assert!(
            tally.allowed > 20 && tally.rejected > 20 && tally.peeks > 10 && tally.replaced > 3,
            "{name}: the sequence does not cover what it should: {tally:?}"
        );
        // Each CHECK of a pair counted once for the policy and once inline, alike.
        let after = algorithm_figures(&master, name);
        let checks = tally.allowed + tally.rejected;
        assert_eq!(
            [
                after[0] - before[0],
                after[1] - before[1],
                after[2] - before[2]
            ],
            [2 * checks, 2 * tally.allowed, 2 * tally.rejected],
            "{name}: INFO ratelimit calls, allowed, rejected"
        );
        let figures = policy_figures(&master);
        for (policy, counted) in policies.iter().zip(per_policy) {
            assert_eq!(figures[policy], counted, "{policy}");
        }
        all_keys.extend(keys.into_iter().flat_map(|(p, i)| [p, i]));
    }
    // Replicated alike: the replica holds what the master holds.
    wait_replica_sync(&master, &replica);
    assert_replica_matches(&master, &replica, &all_keys);
}

/// A spec of a CHECKALL: through a policy (defined as `spec`) or inline.
#[derive(Clone, Debug)]
struct Limit {
    policy: Option<String>,
    spec: Spec,
}

#[test]
fn checkall_mixing_policies_and_inline_specs_equals_the_all_inline_checkall() {
    let server = common::Server::start();
    let mut con = server.client();
    let base = common::future_base_ms();
    let seed = seed();
    let (mut admitted, mut refused, mut replaced, mut through) = (0, 0, 0, 0);
    for sequence in 0..40u64 {
        let mut rng = Rng::with_stream(seed, 100 + sequence);
        let count = rng.range(1, 4) as usize;
        let mut limits: Vec<Limit> = (0..count)
            .map(|i| {
                let algorithm = rng.pick(&Algorithm::ALL);
                let spec = random_spec(&mut rng, algorithm);
                let policy = rng.chance(60).then(|| format!("ca.{sequence}.{i}"));
                if let Some(policy) = &policy {
                    define(&mut con, policy, &spec, false);
                }
                Limit { policy, spec }
            })
            .collect();
        let keys: Vec<(String, String)> = (0..count)
            .map(|i| (format!("cp:{sequence}:{i}"), format!("ci:{sequence}:{i}")))
            .collect();
        let twins: Vec<(&str, &str)> = keys.iter().map(|(p, i)| (p.as_str(), i.as_str())).collect();
        let mut at = base + rng.range(0, 10_000);
        for step in 0..30 {
            let context = format!("sequence {sequence} step {step}");
            at = next_time(&mut rng, at, base);
            if rng.chance(6) {
                // A policy gets new parameters (its algorithm stays); the inline twin follows.
                let i = rng.index(count);
                let algorithm = limits[i].spec.algorithm;
                limits[i].spec = random_spec(&mut rng, algorithm);
                if let Some(policy) = &limits[i].policy {
                    define(&mut con, policy, &limits[i].spec, false);
                    replaced += 1;
                }
            }
            let mut order: Vec<usize> = (0..count).collect();
            rng.shuffle(&mut order);
            order.truncate(rng.range(1, count as u64) as usize);
            if rng.chance(15) {
                // A key named twice: each occurrence is a limit of its own.
                let again = rng.pick(&order);
                let at = rng.index(order.len() + 1);
                order.insert(at, again);
            }
            let cost = random_cost(&mut rng, &limits[order[0]].spec);
            let policy_keys: Vec<&str> = order.iter().map(|&i| twins[i].0).collect();
            let inline_keys: Vec<&str> = order.iter().map(|&i| twins[i].1).collect();
            let mixed: Vec<SpecArg> = order
                .iter()
                .map(|&i| match &limits[i].policy {
                    Some(policy) => SpecArg::Policy(policy.clone()),
                    None => SpecArg::Inline(limits[i].spec),
                })
                .collect();
            through += mixed
                .iter()
                .filter(|spec| matches!(spec, SpecArg::Policy(_)))
                .count();
            let inline: Vec<SpecArg> = order
                .iter()
                .map(|&i| SpecArg::Inline(limits[i].spec))
                .collect();
            let reply = same_on_twins(
                &mut con,
                [
                    checkall_cmd(&policy_keys, &mixed, cost, at),
                    checkall_cmd(&inline_keys, &inline, cost, at),
                ],
                &twins,
                &context,
            );
            let rows: Vec<Vec<i64>> = redis::from_redis_value(&reply)
                .unwrap_or_else(|_| panic!("{context}: {}", show_value(&reply)));
            if rows[0][0] == 1 {
                admitted += 1;
            } else {
                refused += 1;
            }
        }
    }
    eprintln!("{admitted} admitted, {refused} refused, {through} specs through policies, {replaced} policies replaced");
    assert!(
        admitted > 100 && refused > 100 && through > 300 && replaced > 10,
        "the sequences do not cover what they should"
    );
}
