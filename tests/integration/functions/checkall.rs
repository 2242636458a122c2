//! Random CHECKALLs on both engines: keys named two or three times, mixed algorithms, BURST in
//! any spec, now and then an algorithm the key does not hold; and the same with BLOCK in most
//! specs (blocks started whether or not the request is admitted, once per key).

use std::fmt::Write as _;

use redis::Value;

use super::engines::{
    algorithms, both_engines, both_infos, fcall, native, same_info, same_reply, seed,
};
use super::limits::{block_duration, with_block, Limit};
use crate::common::rng::Rng;
use crate::common::{error_text, future_base_ms, send, show_value, try_reply6, DAY_MS};
use crate::equivalence::sequences::LuaReference;

#[test]
fn checkall_answers_as_the_module_with_repeated_keys_and_wrong_algorithms() {
    random_checkalls(100, false);
}

#[test]
fn checkall_with_blocks_answers_as_the_module() {
    random_checkalls(110, true);
}

/// 60 groups of 40 random CHECKALLs on three keys; `with_blocks`: a BLOCK duration for most
/// keys, named by most of their specs (the rest of the calls are the same generator's).
fn random_checkalls(stream: u64, with_blocks: bool) {
    let (_server, mut con) = both_engines();
    let seed = seed();
    let base = future_base_ms();
    let algorithms = algorithms();
    let mut rng = Rng::with_stream(seed, stream);
    let mut calls = 0;
    let mut admitted = 0;
    let mut repeated = 0;
    let mut errors = 0;
    for group in 0..60 {
        // Three keys per group, each with its own algorithm and changing parameters.
        let names = ["a", "b", "c"];
        let mut limits: Vec<Limit> = (0..3)
            .map(|_| {
                let algorithm = rng.pick(&algorithms);
                let period = rng.pick(&[3, 50, 1000, 60_000]);
                let limit = rng.range(1, 8).min(algorithm.bound(period));
                let burst = rng.chance(50).then(|| rng.range(1, 10));
                Limit::new(algorithm, limit, period, burst)
            })
            .collect();
        let blocks: Vec<Option<u64>> = limits
            .iter()
            .map(|limit| {
                (with_blocks && rng.chance(70))
                    .then(|| block_duration(limit.params.period, &mut rng))
            })
            .collect();
        let nkeys: Vec<String> = names.iter().map(|k| format!("n:{group}:{k}")).collect();
        let fkeys: Vec<String> = names.iter().map(|k| format!("f:{group}:{k}")).collect();
        let start = base + rng.range(0, DAY_MS);
        let mut cursor = start;
        let mut history = String::new();
        for _ in 0..40 {
            let count = rng.range(1, 4) as usize;
            let picked: Vec<usize> = (0..count).map(|_| rng.index(3)).collect();
            if picked
                .iter()
                .enumerate()
                .any(|(i, k)| picked[..i].contains(k))
            {
                repeated += 1;
            }
            for &k in &picked {
                if rng.chance(10) {
                    limits[k].params.limit = rng.range(1, 8);
                    limits[k].params.period = rng.pick(&[3, 50, 1000, 1001, 60_000]);
                }
            }
            let mut args = Vec::new();
            for (i, &k) in picked.iter().enumerate() {
                let mut limit = limits[k];
                if rng.chance(3) {
                    limit.algorithm = rng.pick(&algorithms); // most likely another algorithm
                    limit.params.burst = limit.params.burst.filter(|_| limit.algorithm.is_bucket());
                }
                let block = blocks[k].filter(|_| rng.chance(80));
                let spelled = if i + 1 < count {
                    limit.spec_args(&mut rng)
                } else {
                    let cost = match rng.below(10) {
                        0 => 0,
                        1..=5 => 1,
                        6..=8 => rng.range(2, 4),
                        _ => rng.range(5, 12),
                    };
                    let step = match rng.below(10) {
                        0..=2 => 0,
                        3..=7 => rng.range(1, 40),
                        8 => rng.range(500, 3000),
                        _ => 0,
                    };
                    let at = if rng.chance(10) {
                        cursor.saturating_sub(rng.range(1, 100)).max(start)
                    } else {
                        cursor + step
                    };
                    cursor = cursor.max(at);
                    limit.args(cost, Some(at), &mut rng)
                };
                args.extend(match block {
                    Some(ms) => with_block(spelled, ms, &mut rng),
                    None => spelled,
                });
            }
            let n: Vec<&str> = picked.iter().map(|&k| nkeys[k].as_str()).collect();
            let f: Vec<&str> = picked.iter().map(|&k| fkeys[k].as_str()).collect();
            let mut cmds = vec![native("checkall", &n, &args), fcall("checkall", &f, &args)];
            for k in 0..3 {
                cmds.push(redis::cmd("PEXPIRETIME").arg(&nkeys[k]).clone());
                cmds.push(redis::cmd("PEXPIRETIME").arg(&fkeys[k]).clone());
            }
            let replies = send(&mut con, &cmds);
            let picked_names: Vec<&str> = picked.iter().map(|&k| names[k]).collect();
            let _ = writeln!(
                history,
                "  CHECKALL {count} {} {}\n    module  {}\n    library {}",
                picked_names.join(" "),
                args.join(" "),
                show_value(&replies[0]),
                show_value(&replies[1])
            );
            assert!(
                same_reply(&replies[0], &replies[1]),
                "FUNCTIONS_SEED={seed:#x}, group {group}: CHECKALL differs\n{history}"
            );
            for (k, expiries) in replies[2..].chunks_exact(2).enumerate() {
                assert_eq!(
                    expiries[0], expiries[1],
                    "FUNCTIONS_SEED={seed:#x}, group {group}: PEXPIRETIME of key {} differs\n\
                     {history}",
                    names[k]
                );
            }
            // A limit of another algorithm may have created the key: reset it now and then.
            let mismatch = error_text(&replies[1]).is_some_and(|e| e.contains("limiter, not"));
            if mismatch && rng.chance(50) {
                let removed = send(
                    &mut con,
                    &[native("reset", &n, &[]), fcall("reset", &f, &[])],
                );
                assert_eq!(removed[0], removed[1], "RESET after\n{history}");
            }
            calls += 1;
            match &replies[0] {
                Value::Array(items) if try_reply6(&items[0]).is_some_and(|r| r[0] == 1) => {
                    admitted += 1
                }
                Value::ServerError(_) => errors += 1,
                _ => {}
            }
        }
        for (k, name) in names.iter().enumerate() {
            let (module, library) = both_infos(&mut con, &nkeys[k], &fkeys[k]);
            assert!(
                same_info(&module, &library),
                "group {group} key {name}: INFO module {} library {}\n{history}",
                show_value(&module),
                show_value(&library)
            );
        }
    }
    let info: String = redis::cmd("INFO").arg("ratelimit").query(&mut con).unwrap();
    let blocked: u64 = info
        .lines()
        .filter(|line| line.starts_with("ratelimit_") && line.contains("_blocked:"))
        .filter_map(|line| line.split(':').nth(1)?.trim().parse::<u64>().ok())
        .sum();
    println!(
        "{calls} CHECKALLs: {admitted} admitted, {repeated} with a repeated key, {errors} errors, \
         {blocked} limits rejected by a block"
    );
    assert!(admitted > calls / 10 && repeated > calls / 5 && errors > 0);
    if with_blocks {
        assert!(blocked > calls as u64 / 20, "too few blocks");
    } else {
        assert!(admitted > calls / 5 && blocked == 0);
    }
}
