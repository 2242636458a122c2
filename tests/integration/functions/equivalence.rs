//! The library answers as the module: on random sequences with `AT` (replies, expiries, INFO,
//! RESET), on long sliding logs, and with the server's clock.

use std::fmt::Write as _;
use std::time::Instant;

use redis::{Connection, Value};
use redis_ratelimit_core::algorithms::Algorithm;

use super::engines::{
    algorithms, both_engines, both_infos, calls_per_algorithm, fcall, native, same_info, seed,
    words,
};
use super::limits::{gen_blocked_sequence, gen_sequence, Call, Limit};
use crate::common::rng::Rng;
use crate::common::{
    dbsize, error_text, future_base_ms, int, now_ms, reply6, send, show_value, try_reply6, DAY_MS,
};

/// What one call of a sequence answered, `[module, library]`.
struct Step {
    peek: [Value; 2],
    check: [Value; 2],
    expiry: [Value; 2],
}

/// `module <reply> library <reply>`.
fn both(replies: &[Value; 2]) -> String {
    format!(
        "module {} library {}",
        show_value(&replies[0]),
        show_value(&replies[1])
    )
}

/// PEEK, CHECK and PEXPIRETIME on both engines for every call, in one pipeline.
fn run_sequence(con: &mut Connection, nkey: &str, fkey: &str, calls: &[Call]) -> Vec<Step> {
    let mut cmds = Vec::with_capacity(calls.len() * 6);
    for call in calls {
        for command in ["peek", "check"] {
            cmds.push(native(command, &[nkey], &call.args));
            cmds.push(fcall(command, &[fkey], &call.args));
        }
        cmds.push(redis::cmd("PEXPIRETIME").arg(nkey).clone());
        cmds.push(redis::cmd("PEXPIRETIME").arg(fkey).clone());
    }
    let replies = send(con, &cmds);
    let mut replies = replies.into_iter();
    let mut pair = || [(); 2].map(|_| replies.next().expect("six replies a call"));
    calls
        .iter()
        .map(|_| Step {
            peek: pair(),
            check: pair(),
            expiry: pair(),
        })
        .collect()
}

/// The first call where the engines differ, or where an expiry is not `t + reset_after`.
/// `blocks`: the calls that name BLOCK (none when shorter): a rejection that starts a block
/// answers the block, the PEEK before it the algorithm alone.
fn first_difference(calls: &[Call], steps: &[Step], blocks: &[bool]) -> Option<(usize, String)> {
    let mut last: Option<u64> = None;
    for (i, (call, s)) in calls.iter().zip(steps).enumerate() {
        let starts_block = blocks.get(i) == Some(&true)
            && try_reply6(&s.check[0]).is_some_and(|r| r[0] == 0)
            && try_reply6(&s.peek[0]).is_some_and(|r| r[0] == 0);
        let what = if s.check[0] != s.check[1] {
            format!("CHECK: {}", both(&s.check))
        } else if s.peek[0] != s.peek[1] || (s.peek[0] != s.check[0] && !starts_block) {
            format!(
                "PEEK: {}, then CHECK {}",
                both(&s.peek),
                show_value(&s.check[0])
            )
        } else if s.expiry[0] != s.expiry[1] {
            format!("PEXPIRETIME: {}", both(&s.expiry))
        } else if let Some(error) = error_text(&s.check[0]) {
            format!("both refused: {error}")
        } else {
            let reply = reply6(&s.check[0]);
            if reply[0] == 0 || !call.consumes_if_allowed {
                continue;
            }
            let t = last.map_or(call.at, |last| last.max(call.at));
            last = Some(t);
            let want = i64::try_from(u128::from(t) + reply[4] as u128).unwrap_or(i64::MAX);
            if s.expiry[1] == Value::Int(want) {
                continue;
            }
            format!(
                "expiry {} != t + reset_after = {want}",
                show_value(&s.expiry[1])
            )
        };
        return Some((i, what));
    }
    None
}

/// The calls and replies as redis-cli lines.
fn describe(nkey: &str, fkey: &str, calls: &[Call], steps: &[Step]) -> String {
    let mut out = String::new();
    for (call, s) in calls.iter().zip(steps) {
        let args = call.args.join(" ");
        for (engine, command) in [
            (0, format!("RATELIMIT.CHECK {nkey}")),
            (1, format!("FCALL ratelimit_check 1 {fkey}")),
        ] {
            let _ = writeln!(
                out,
                "  {command} {args}\n    -> {} (PEEK {}) expires {}",
                show_value(&s.check[engine]),
                show_value(&s.peek[engine]),
                show_value(&s.expiry[engine]),
            );
        }
    }
    out
}

#[test]
fn the_library_answers_as_the_module_on_random_sequences() {
    let started = Instant::now();
    let (_server, mut con) = both_engines();
    let seed = seed();
    let base = future_base_ms();
    let per_algorithm = calls_per_algorithm();
    for algorithm in algorithms() {
        let name = algorithm.name();
        let mut rng = Rng::with_stream(seed, algorithm.index() as u64);
        let (mut done, mut sequences, mut allowed, mut rejected) = (0, 0, 0, 0);
        while done < per_algorithm {
            let len = rng.range(10, 80) as usize;
            let calls = gen_sequence(algorithm, &mut rng, base, len);
            let nkey = format!("n:{name}:{sequences}");
            let fkey = format!("f:{name}:{sequences}");
            let steps = run_sequence(&mut con, &nkey, &fkey, &calls);
            if let Some((i, what)) = first_difference(&calls, &steps, &[]) {
                panic!(
                    "FUNCTIONS_SEED={seed:#x}, {name}, sequence {sequences}, call {i}: {what}\n{}",
                    describe(&nkey, &fkey, &calls, &steps)
                );
            }
            for s in &steps {
                match reply6(&s.check[0]) {
                    [1, ..] => allowed += 1,
                    _ => rejected += 1,
                }
            }
            // The stored state: INFO evaluates at max(now, last), and every `last` is ahead of
            // the server's clock, so both answer for the same time.
            let (module, library) = both_infos(&mut con, &nkey, &fkey);
            assert!(
                same_info(&module, &library),
                "FUNCTIONS_SEED={seed:#x}, {name}, sequence {sequences}: INFO module {} \
                 != library {}\n{}",
                show_value(&module),
                show_value(&library),
                describe(&nkey, &fkey, &calls, &steps)
            );
            done += len;
            sequences += 1;
        }
        println!(
            "{name}: {done} calls on {sequences} keys, {allowed} allowed, {rejected} rejected"
        );
    }
    // RESET answers alike, and removes every key of both engines.
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    let (nkeys, fkeys): (Vec<&str>, Vec<&str>) = keys
        .iter()
        .map(String::as_str)
        .partition(|k| k.starts_with("n:"));
    let removed_module = int(&mut con, &native("reset", &nkeys, &[]));
    let removed_library = int(&mut con, &fcall("reset", &fkeys, &[]));
    assert_eq!(removed_module, removed_library);
    assert_eq!(removed_library as usize, fkeys.len());
    assert_eq!(dbsize(&mut con), 0);
    println!("{:?} in all", started.elapsed());
}

/// BLOCK on the random sequences: on all, most or some calls of a sequence (a call without it on
/// a blocked key is still rejected), durations from 1 ms to 3650 days (blocks ending past 2^53
/// near the top), parameter changes, COST 0 and PEEK during blocks: the same replies, expiries
/// (the block's end when it outlasts the state) and INFO (`blocked_until_ms`). The module's
/// `_blocked` counter says blocks decided calls.
#[test]
fn blocks_answer_as_the_module_on_random_sequences() {
    let (_server, mut con) = both_engines();
    let seed = seed();
    let base = future_base_ms();
    let per_algorithm = calls_per_algorithm() / 2;
    for algorithm in algorithms() {
        let name = algorithm.name();
        let mut rng = Rng::with_stream(seed, 600 + algorithm.index() as u64);
        let (mut done, mut sequences) = (0, 0);
        while done < per_algorithm {
            let len = rng.range(10, 80) as usize;
            let (calls, blocks) = gen_blocked_sequence(algorithm, &mut rng, base, len);
            let nkey = format!("n:block:{name}:{sequences}");
            let fkey = format!("f:block:{name}:{sequences}");
            let steps = run_sequence(&mut con, &nkey, &fkey, &calls);
            if let Some((i, what)) = first_difference(&calls, &steps, &blocks) {
                panic!(
                    "FUNCTIONS_SEED={seed:#x}, {name}, sequence {sequences}, call {i}: {what}\n{}",
                    describe(&nkey, &fkey, &calls, &steps)
                );
            }
            let (module, library) = both_infos(&mut con, &nkey, &fkey);
            assert!(
                same_info(&module, &library),
                "FUNCTIONS_SEED={seed:#x}, {name}, sequence {sequences}: INFO module {} \
                 != library {}\n{}",
                show_value(&module),
                show_value(&library),
                describe(&nkey, &fkey, &calls, &steps)
            );
            done += len;
            sequences += 1;
        }
        let info: String = redis::cmd("INFO").arg("ratelimit").query(&mut con).unwrap();
        let field = format!("ratelimit_{}_blocked:", name.replace('-', "_"));
        let blocked: u64 = info
            .lines()
            .find_map(|line| line.strip_prefix(field.as_str()))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in INFO ratelimit:\n{info}"));
        println!("{name}: {done} calls on {sequences} keys, {blocked} rejected by a block");
        assert!(
            per_algorithm < 1000 || blocked as usize >= per_algorithm / 20,
            "{name}: too few calls decided by a block ({blocked})"
        );
    }
}

/// Long runs on single sliding logs: thousands of entries slide through, so the library's dead
/// records are reclaimed many times, runs at one ms grow in place, limits and periods change.
#[test]
fn long_sliding_logs_answer_as_the_module() {
    let (_server, mut con) = both_engines();
    let seed = seed();
    let base = future_base_ms();
    let mut rng = Rng::with_stream(seed, 400);
    for key in 0..8u64 {
        let limits = [1, 5, 50, 500];
        let periods = [20, 200, 1000, 60_000];
        let mut limit = Limit::new(
            Algorithm::SlidingLog,
            rng.pick(&limits),
            rng.pick(&periods),
            None,
        );
        let mut at = base + key * 7;
        let mut calls = Vec::new();
        for _ in 0..1500 {
            if rng.chance(1) {
                limit.params.limit = rng.pick(&limits);
                limit.params.period = rng.pick(&periods);
            }
            let period = limit.params.period;
            at += match rng.below(10) {
                0..=2 => 0,
                3..=8 => rng.range(1, period / 10 + 1),
                _ => rng.range(0, 2 * period),
            };
            let cost = match rng.below(10) {
                0 => 0,
                1..=6 => 1,
                _ => rng.range(2, 10),
            };
            calls.push(Call::new(&limit, cost, at, &mut rng));
        }
        let (nkey, fkey) = (format!("n:log:{key}"), format!("f:log:{key}"));
        let steps = run_sequence(&mut con, &nkey, &fkey, &calls);
        if let Some((i, what)) = first_difference(&calls, &steps, &[]) {
            let from = i.saturating_sub(20);
            panic!(
                "FUNCTIONS_SEED={seed:#x}, log {key}, call {i}: {what}\ncalls {from}..={i}:\n{}",
                describe(&nkey, &fkey, &calls[from..=i], &steps[from..=i])
            );
        }
        let (module, library) = both_infos(&mut con, &nkey, &fkey);
        assert_eq!(module, library, "log {key}: INFO");
    }
}

/// gcra keeps its theoretical arrival time as a point in time: through limit, period and BURST
/// changes, rounded up, never clamped, also 2^53 scaled units and more ahead (a limit raised a
/// trillionfold), with COST 0, a cost above the capacity and a time going backwards.
#[test]
fn gcra_keeps_its_tat_as_time_through_parameter_changes() {
    let (_server, mut con) = both_engines();
    let base = future_base_ms();
    let script = [
        ("gcra 1 1d BURST 3", 3, 0), // the TAT 3 days ahead
        ("gcra 1 1d BURST 3", 1, 1000),
        ("gcra 1000000000000 1 BURST 1", 0, 1000), // 2.6e20 units ahead: rejected, even COST 0
        ("gcra 1000000000000 1ms BURST 1", 1, 2000),
        ("gcra 1000000000000 1 BURST 1", 2, 2000), // above the capacity: never
        ("GCRA 1000000000000 1 burst 1", 1, 500),  // backwards: evaluated at 2000
        ("gcra 7 3s BURST 9000000", 1, 3000),      // the same TAT in sevenths of a ms
        ("gcra 1000000 1s", 1, 3001),              // rounded up; beyond the tolerance
        ("gcra 1000000 1s", 0, 3001),
        ("gcra 7 3s BURST 9000000", 2, 3002),
        ("gcra 3 1s", 1, 3 * DAY_MS + 10_000), // the TAT has passed: a fresh key
        ("gcra 3 1s BURST 1", 1, 3 * DAY_MS + 10_000),
    ];
    let calls: Vec<Call> = script
        .iter()
        .map(|&(line, cost, at)| {
            let mut args = words(line);
            args.extend(["COST".to_string(), cost.to_string()]);
            args.extend(["AT".to_string(), (base + at).to_string()]);
            Call {
                args,
                consumes_if_allowed: cost > 0,
                at: base + at,
            }
        })
        .collect();
    let (nkey, fkey) = ("n:gcra:tat", "f:gcra:tat");
    let steps = run_sequence(&mut con, nkey, fkey, &calls);
    if let Some((i, what)) = first_difference(&calls, &steps, &[]) {
        panic!("call {i}: {what}\n{}", describe(nkey, fkey, &calls, &steps));
    }
    // 259,199,000 ms ahead, at 10^12 units per ms: past 2^53 units, and exact.
    assert_eq!(
        reply6(&steps[2].check[1]),
        [0, 1, 0, 259_199_000, 259_199_000, 0],
        "{}",
        describe(nkey, fkey, &calls, &steps)
    );
    let (module, library) = both_infos(&mut con, nkey, fkey);
    assert_eq!(module, library);
}

// ---------------------------------------------------------------------------------------------
// The server's clock

/// A period of at least `ms` whose current window ends more than two minutes from now, so a
/// window boundary cannot fall between the two engines' calls.
fn safe_period(now: u64, ms: u64) -> u64 {
    (0..)
        .map(|k| ms + k * 60_000)
        .find(|p| now % p < p - 120_000)
        .expect("some period fits")
}

#[test]
fn without_at_both_engines_stay_consistent() {
    let (_server, mut con) = both_engines();
    let mut rng = Rng::with_stream(seed(), 200);
    let period = safe_period(now_ms(), 3_600_000);
    for algorithm in algorithms() {
        let limit = Limit::new(algorithm, 5, period, Some(40));
        let name = algorithm.name();
        let (nkey, fkey) = (format!("n:clock:{name}"), format!("f:clock:{name}"));
        let mut widest = 0;
        let mut seen_rejected = false;
        for i in 0..80 {
            let cost = if i % 9 == 8 { 0 } else { rng.range(1, 3) };
            let args = limit.args(cost, None, &mut rng);
            let cmds = [
                native("check", &[&nkey], &args),
                fcall("check", &[&fkey], &args),
                redis::cmd("PEXPIRETIME").arg(&nkey).clone(),
                redis::cmd("PEXPIRETIME").arg(&fkey).clone(),
            ];
            let sent = Instant::now();
            let replies = send(&mut con, &cmds);
            // The two calls ran within this many ms of each other.
            let apart = sent.elapsed().as_millis() as i64 + 1;
            widest = widest.max(apart);
            let (m, f) = (reply6(&replies[0]), reply6(&replies[1]));
            let context = format!(
                "{name} call {i} ({}): module {m:?} library {f:?}",
                args.join(" ")
            );
            assert_eq!(
                m[..3],
                f[..3],
                "allowed, limit, remaining differ: {context}"
            );
            for field in 3..6 {
                assert!(
                    (m[field] - f[field]).abs() <= widest + apart,
                    "field {field} apart by more than {} ms: {context}",
                    widest + apart
                );
            }
            let expiry = |value: &Value| -> i64 { redis::from_redis_value(value).unwrap() };
            let (em, ef) = (expiry(&replies[2]), expiry(&replies[3]));
            assert!(
                (em - ef).abs() <= widest + 1,
                "expiries {em} and {ef} more than {widest} ms apart: {context}"
            );
            seen_rejected |= m[0] == 0;
        }
        assert!(
            seen_rejected,
            "{name}: the workload never reached the limit"
        );
    }
}
