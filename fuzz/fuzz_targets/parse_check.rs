//! Fuzzes `parse_check`, the parser of `RATELIMIT.CHECK/PEEK key <args...>`, then runs every
//! argument vector it accepts through the cores as the command would.
//!
//! Input: the arguments after the key, separated by `\n` (so seeds are readable text; every other
//! byte, NUL and non-UTF-8 included, can appear inside an argument).
//!
//! Beyond "never panics" (built with overflow checks, so an overflow is a crash too), it checks:
//! - an accepted vector is well-formed: plain decimal digits, known names, each option once, the
//!   bounds of docs/commands.md; `ratelimit.max-log-limit` changes nothing but the sliding-log bound;
//! - the canonical rendering of what was parsed parses to the same thing;
//! - on a fresh key at one instant: PEEK equals the CHECK that follows, replies are consistent, no
//!   more than the limit (capacity for buckets) is admitted, every stored state survives the codec
//!   (RDB, AOF rewrite, replication, RESTORE) unchanged, and the key is fresh again `reset_after_ms`
//!   later;
//! - a spec given as one argument parses as its words (the same result and error message), and an
//!   accepted vector's leading spec words joined into one argument parse to the same thing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_ratelimit_core::algorithms::{
    self, Algorithm, Limiter, Outcome, Request, Write, MAX_AMOUNT, MAX_PERIOD_MS, TIME_LIMIT_MS,
};
use redis_ratelimit_core::codec::{self, Change};
use redis_ratelimit_core::error::ArgError;
use redis_ratelimit_core::parse::{is_one_argument_spec, parse_check, read_call, CheckArgs};

const DEFAULT_MAX_LOG_LIMIT: u64 = 100_000;
const SMALL_MAX_LOG_LIMIT: u64 = 7;
/// The server's clock for calls without `AT` (any fixed time will do).
const CLOCK_MS: u64 = 1_796_169_600_000;

fuzz_target!(|data: &[u8]| {
    let args: Vec<&[u8]> = data.split(|byte| *byte == b'\n').collect();
    let parsed = parse_check(&args, DEFAULT_MAX_LOG_LIMIT);
    // `ratelimit.max-log-limit` decides only whether a sliding log's limit is accepted.
    let small = parse_check(&args, SMALL_MAX_LOG_LIMIT);
    match (&parsed, &small) {
        (Ok(accepted), Err(ArgError::LogLimit { limit, max })) => {
            assert_eq!(accepted.spec.algorithm, Algorithm::SlidingLog);
            assert_eq!(
                (*limit, *max),
                (accepted.spec.params.limit, SMALL_MAX_LOG_LIMIT)
            );
        }
        (
            Err(ArgError::LogLimit { limit, max }),
            Err(ArgError::LogLimit {
                limit: small_limit,
                max: small_max,
            }),
        ) => {
            assert_eq!(
                (*max, *small_max),
                (DEFAULT_MAX_LOG_LIMIT, SMALL_MAX_LOG_LIMIT)
            );
            assert_eq!(limit, small_limit);
            assert!(*limit > DEFAULT_MAX_LOG_LIMIT);
        }
        _ => assert_eq!(parsed, small),
    }
    check_one_argument_spec(&args, &parsed);
    if let Ok(accepted) = parsed {
        check_well_formed(&args, &accepted);
        check_canonical_round_trip(&accepted);
        run_cores(&accepted);
    }
});

/// A one-argument spec (`args[0]` holding a space) reads as its words; else `args` as they are.
/// And the words of an accepted spec (its head and the BURST and BLOCK right after it), joined,
/// read as they did.
fn check_one_argument_spec(args: &[&[u8]], parsed: &Result<CheckArgs, ArgError>) {
    let read = read_call(args, |words| {
        let parsed = parse_check(words, DEFAULT_MAX_LOG_LIMIT);
        let message = parsed.as_ref().err().map(|e| e.message("c", words));
        (parsed, message)
    });
    match read {
        Ok((by_words, message)) if is_one_argument_spec(args[0]) => {
            let mut words: Vec<&[u8]> = args[0].split(|b| *b == b' ').collect();
            words.extend_from_slice(&args[1..]);
            let split = parse_check(&words, DEFAULT_MAX_LOG_LIMIT);
            assert_eq!(by_words, split);
            assert_eq!(message, split.err().map(|e| e.message("c", &words)));
        }
        Ok((as_is, _)) => assert_eq!(&as_is, parsed),
        Err(error) => {
            assert!(is_one_argument_spec(args[0]), "{error:?}");
            let message = error.message("c", args);
            assert!(message.starts_with("ERR "), "{message}");
        }
    }
    let Ok(accepted) = parsed else {
        return;
    };
    let mut end = 3;
    while args.get(end).is_some_and(|name| {
        name.eq_ignore_ascii_case(b"BURST") || name.eq_ignore_ascii_case(b"BLOCK")
    }) {
        end += 2;
    }
    let joined = args[..end].join(&b' ');
    let mut one: Vec<&[u8]> = vec![&joined];
    one.extend_from_slice(&args[end..]);
    let read = read_call(&one, |words| parse_check(words, DEFAULT_MAX_LOG_LIMIT));
    assert_eq!(read, Ok(Ok(*accepted)), "{one:?}");
}

/// Plain decimal digits (no sign, space, fraction or exponent) and their value.
fn decimal(bytes: &[u8]) -> u64 {
    assert!(
        !bytes.is_empty() && bytes.iter().all(u8::is_ascii_digit),
        "accepted a number that is not plain decimal: {bytes:?}"
    );
    std::str::from_utf8(bytes).unwrap().parse().unwrap()
}

/// A period as accepted: plain decimal digits and a known unit, in ms.
fn period(bytes: &[u8]) -> u64 {
    let digits = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    let scale = match bytes[digits..].to_ascii_lowercase().as_slice() {
        b"" | b"ms" => 1,
        b"s" => 1_000,
        b"m" => 60_000,
        b"h" => 3_600_000,
        b"d" => 86_400_000,
        unit => panic!("accepted a period unit {unit:?}"),
    };
    decimal(&bytes[..digits]) * scale
}

fn check_well_formed(args: &[&[u8]], accepted: &CheckArgs) {
    let algorithm = accepted.spec.algorithm;
    let params = accepted.spec.params;
    assert!(
        args.len() % 2 == 1 && (3..=11).contains(&args.len()),
        "{args:?}"
    );
    assert_eq!(Algorithm::parse(args[0]), Some(algorithm));
    assert_eq!(decimal(args[1]), params.limit);
    assert_eq!(period(args[2]), params.period_ms);
    assert!((1..=MAX_AMOUNT).contains(&params.limit));
    assert!((1..=MAX_PERIOD_MS).contains(&params.period_ms));
    assert!((1..=MAX_AMOUNT).contains(&params.capacity));
    assert!(accepted.cost <= MAX_AMOUNT);
    assert!(accepted.at_ms.is_none_or(|at| at < TIME_LIMIT_MS));
    if algorithm == Algorithm::SlidingLog {
        assert!(params.limit <= DEFAULT_MAX_LOG_LIMIT);
    }
    let (mut burst, mut block, mut cost, mut at) = (None, None, None, None);
    for pair in args[3..].chunks(2) {
        let (slot, value) = match pair[0].to_ascii_uppercase().as_slice() {
            b"BURST" => (&mut burst, decimal(pair[1])),
            b"BLOCK" => (&mut block, period(pair[1])),
            b"COST" => (&mut cost, decimal(pair[1])),
            b"AT" => (&mut at, decimal(pair[1])),
            name => panic!("accepted an option {name:?}"),
        };
        assert!(slot.replace(value).is_none(), "accepted a duplicate option");
    }
    assert_eq!(accepted.spec.block_ms, block);
    assert!(block.is_none_or(|ms| (1..=MAX_PERIOD_MS).contains(&ms)));
    assert!(burst.is_none() || algorithm.is_bucket());
    assert_eq!(params.capacity, burst.unwrap_or(params.limit));
    assert_eq!(accepted.cost, cost.unwrap_or(1));
    assert_eq!(accepted.at_ms, at);
}

/// What was parsed, rendered canonically (upper-case names, options reversed), parses the same.
fn check_canonical_round_trip(accepted: &CheckArgs) {
    let params = accepted.spec.params;
    let mut rendered = vec![
        accepted.spec.algorithm.name().to_ascii_uppercase(),
        params.limit.to_string(),
        format!("{}ms", params.period_ms),
    ];
    if let Some(at) = accepted.at_ms {
        rendered.extend(["at".to_string(), at.to_string()]);
    }
    rendered.extend(["Cost".to_string(), accepted.cost.to_string()]);
    if accepted.spec.algorithm.is_bucket() {
        rendered.extend(["BURST".to_string(), params.capacity.to_string()]);
    }
    if let Some(ms) = accepted.spec.block_ms {
        rendered.extend(["block".to_string(), format!("{ms}ms")]);
    }
    let args: Vec<&[u8]> = rendered.iter().map(String::as_bytes).collect();
    assert_eq!(
        parse_check(&args, DEFAULT_MAX_LOG_LIMIT).as_ref(),
        Ok(accepted)
    );
}

/// One call as the command makes it: the PEEK first (it must answer what the CHECK then does).
fn call(stored: &mut Option<Limiter>, request: &Request) -> Outcome {
    let mut copy = stored.clone();
    let (peeked, write) =
        algorithms::check(copy.as_mut(), request, false, &mut None).expect("one algorithm");
    assert!(matches!(write, Write::Nothing));
    assert_eq!(&copy, stored, "PEEK changed the state");
    let mut created = None;
    let (outcome, write) =
        algorithms::check(stored.as_mut(), request, true, &mut created).expect("one algorithm");
    assert_eq!(peeked, outcome, "PEEK and CHECK disagree");
    assert_eq!(write == Write::Created, created.is_some());
    match write {
        Write::Created => {
            let limiter = created.expect("created");
            assert!(stored.is_none() || outcome.consumed);
            *stored = Some(limiter);
        }
        Write::Updated => assert!(outcome.consumed),
        Write::Nothing => assert!(!outcome.consumed),
    }
    outcome
}

fn run_cores(accepted: &CheckArgs) {
    let algorithm = accepted.spec.algorithm;
    let params = accepted.spec.params;
    let cost = accepted.cost;
    let capacity = params.capacity;
    let now_ms = accepted.at_ms.unwrap_or(CLOCK_MS);
    let request = Request {
        algorithm,
        params,
        cost,
        now_ms,
    };
    let mut stored: Option<Limiter> = None;
    let mut admitted: u128 = 0;
    for round in 0..3 {
        let outcome = call(&mut stored, &request);
        let decision = outcome.decision;
        assert_eq!(outcome.t_ms, now_ms, "time moved at one instant");
        assert_eq!(decision.limit, capacity);
        assert!(decision.remaining <= capacity);
        assert_eq!(outcome.consumed, decision.allowed && cost > 0);
        if round == 0 {
            // A fresh key admits exactly what fits in it.
            assert_eq!(decision.allowed, cost <= capacity);
        }
        if decision.allowed {
            assert_eq!(decision.retry_after_ms, 0);
            admitted += u128::from(cost);
        } else if cost > capacity {
            assert_eq!(decision.retry_after_ms, -1);
        } else {
            assert!(decision.retry_after_ms >= 1);
        }
        assert!(
            admitted <= u128::from(capacity),
            "admitted {admitted} above {capacity} at one instant"
        );
        if algorithm != Algorithm::LeakyBucket {
            assert_eq!(decision.delay_ms, 0);
        }
        if outcome.consumed {
            assert!(
                decision.reset_after_ms > 0,
                "a stored key must not expire at once"
            );
            // The key's absolute expiry (saturating, as the command sets it) is after `t`.
            assert!(
                outcome.t_ms.saturating_add(decision.reset_after_ms) > outcome.t_ms,
                "the key's expiry t + reset_after_ms ({} + {}) is not after t",
                outcome.t_ms,
                decision.reset_after_ms
            );
            let limiter = stored.as_ref().expect("a consuming call stores the key");
            // What RDB, AOF rewrite and DUMP/RESTORE write reads back the same.
            assert_eq!(
                codec::decode(&codec::to_bytes(limiter)).as_ref(),
                Ok(limiter)
            );
            // What a replica and the AOF receive is accepted by RATELIMIT.APPLY.
            let change = if algorithm == Algorithm::SlidingLog {
                Change::LogAppend {
                    params,
                    t_ms: outcome.t_ms,
                    cost,
                }
            } else {
                Change::Replace(limiter.clone())
            };
            assert_eq!(Change::decode(&change.to_bytes()), Ok(change));
        }
        // `reset_after_ms` later the key is equivalent to a fresh one.
        let fresh_at = outcome.t_ms.saturating_add(decision.reset_after_ms);
        if fresh_at < TIME_LIMIT_MS {
            let probe = Request {
                cost: 0,
                now_ms: fresh_at,
                ..request
            };
            let mut later = stored.clone();
            let (after, _) =
                algorithms::check(later.as_mut(), &probe, false, &mut None).expect("one algorithm");
            assert_eq!(
                after.decision.remaining, capacity,
                "not fresh at reset_after_ms"
            );
            assert_eq!(after.decision.reset_after_ms, 0);
        }
    }
}
