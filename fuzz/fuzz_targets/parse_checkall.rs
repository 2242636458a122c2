//! Fuzzes `parse_checkall`, the parser of `RATELIMIT.CHECKALL numkeys key [key ...] spec [spec ...]
//! [COST cost] [AT unix-ms]` (each spec inline, with `BURST` and `BLOCK`, or `POLICY name`), whose index arithmetic over a variable number of specs is where a
//! parser would slice out of bounds.
//!
//! Input: the arguments after the command name, separated by `\n` (as for `parse_check`).
//!
//! Beyond "never panics", it checks that an accepted vector has one spec per key, each within the
//! bounds of docs/commands.md, and that a CHECKALL of one key parses exactly as a CHECK of the same
//! arguments (docs/commands.md: "a `CHECKALL` of one key is a `CHECK`"), policies included, and
//! with its specs given as one argument each (`read_checkall`) too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_ratelimit_core::algorithms::{MAX_AMOUNT, MAX_PERIOD_MS, TIME_LIMIT_MS};
use redis_ratelimit_core::parse::{parse_call, parse_checkall, read_call, read_checkall, LimitArg};

const MAX_LOG_LIMIT: u64 = 100_000;

fuzz_target!(|data: &[u8]| {
    let args: Vec<&[u8]> = data.split(|byte| *byte == b'\n').collect();
    let result = parse_checkall(&args, MAX_LOG_LIMIT);
    if let Err(error) = &result {
        // Every error names what is wrong, and a spec's the key it belongs to.
        let message = error.message("ratelimit.checkall", &args);
        assert!(message.starts_with("ERR "), "{message}");
        if let Some(spec) = error.spec {
            assert!((1..args.len()).contains(&spec), "{error:?}");
        }
    }
    if let Ok(parsed) = result {
        assert!(parsed.numkeys >= 1);
        assert_eq!(parsed.specs.len(), parsed.numkeys);
        // numkeys, the keys, then per spec at least its three arguments, or two for `POLICY name`.
        let least: usize = parsed
            .specs
            .iter()
            .map(|spec| match spec {
                LimitArg::Inline(_) => 3,
                _ => 2,
            })
            .sum();
        assert!(args.len() >= 1 + parsed.numkeys + least);
        for spec in &parsed.specs {
            let LimitArg::Inline(spec) = spec else {
                // `POLICY name`: the name is checked where it is looked up.
                continue;
            };
            let params = spec.params;
            assert!((1..=MAX_AMOUNT).contains(&params.limit));
            assert!((1..=MAX_PERIOD_MS).contains(&params.period_ms));
            assert!((1..=MAX_AMOUNT).contains(&params.capacity));
            assert!(spec.algorithm.is_bucket() || params.capacity == params.limit);
            assert!(spec
                .block_ms
                .is_none_or(|ms| (1..=MAX_PERIOD_MS).contains(&ms)));
        }
        assert!(parsed.cost <= MAX_AMOUNT);
        assert!(parsed.at_ms.is_none_or(|at| at < TIME_LIMIT_MS));
    }
    // One key: the same as CHECK with the arguments after the key.
    let mut one: Vec<&[u8]> = vec![b"1", b"key"];
    one.extend_from_slice(&args);
    let as_checkall = parse_checkall(&one, MAX_LOG_LIMIT);
    let as_check = parse_call(&args, MAX_LOG_LIMIT);
    // Read with one-argument specs split, the same: CHECKALL's spec is CHECK's.
    let split_all = read_checkall(&one, |words| parse_checkall(words, MAX_LOG_LIMIT));
    let split_check = read_call(&args, |words| parse_call(words, MAX_LOG_LIMIT));
    match (&split_all, &split_check) {
        (Ok(Ok(all)), Ok(Ok(check))) => {
            assert_eq!(all.specs, [check.limit]);
            assert_eq!((all.cost, all.at_ms), (check.cost, check.at_ms));
        }
        (Ok(Ok(all)), _) => panic!("CHECKALL of one key {all:?} but CHECK {split_check:?}"),
        (_, Ok(Ok(check))) => panic!("CHECK {check:?} but CHECKALL of one key {split_all:?}"),
        _ => {}
    }
    if let Err(error) = &split_all {
        let message = error.message("ratelimit.checkall", &one);
        assert!(message.starts_with("ERR "), "{message}");
    }
    match (&as_checkall, &as_check) {
        (Ok(all), Ok(check)) => {
            assert_eq!(all.specs, [check.limit]);
            assert_eq!((all.cost, all.at_ms), (check.cost, check.at_ms));
        }
        (Err(_), Err(_)) => {}
        _ => panic!("CHECKALL of one key {as_checkall:?} but CHECK {as_check:?}"),
    }
});
