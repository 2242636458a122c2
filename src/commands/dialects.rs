//! The rate-limit commands users' code already speaks, on the module's `gcra` limiter:
//!
//! - `CL.THROTTLE key max_burst count_per_period period_s [quantity]`, redis-cell's command;
//! - `GCRA key max_burst tokens_per_period period [TOKENS count]`, the command proposed for Redis
//!   8.8 and since withdrawn (registered only where the server has no `GCRA` of its own).
//!
//! Both answer `[limited, max_burst + 1, remaining, retry_after_s, reset_after_s]`: `limited` 1 when
//! rejected; `retry_after_s` -1 when admitted and when the request can never pass (a cost above
//! `max_burst + 1`); whole seconds, rounded up. A key they write is a `gcra` limiter like any other
//! (`RATELIMIT.INFO`, `RESET`, RDB, AOF and replication as effects), with the capacity
//! `max_burst + 1` and the emission interval `period / count`:
//! - `CL.THROTTLE` stores `limit = count_per_period`, `period = period_s` seconds;
//! - `GCRA` rounds the interval to the nearest microsecond (at least 1), as the proposal does, and
//!   stores it as `limit = 1000` per `period = interval` ms (1000 per `interval` ms is one per
//!   `interval` µs).

use std::ffi::c_int;

use redis_module::raw;
use redis_ratelimit_core::algorithms::{
    Algorithm, Decision, Params, Request, MAX_AMOUNT, MAX_PERIOD_MS,
};
use redis_ratelimit_core::integer::parse_integer;
use redis_ratelimit_core::policy::Mode;

use super::call::{handler, now_ms, Call};
use super::decide::decide;
use super::registry::{Arg, ArgType, Command, Keys, KEY_UPDATED};

/// A dialect call, parsed: the limit and the cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DialectCall {
    pub params: Params,
    pub cost: u64,
}

/// The largest `max_burst`: its capacity `max_burst + 1` is within the module's bound.
const MAX_BURST: u64 = MAX_AMOUNT - 1;
/// The longest `CL.THROTTLE` period, in seconds (3650 days).
const MAX_PERIOD_S: u64 = MAX_PERIOD_MS / 1000;

/// `CL.THROTTLE` arguments after the key: `max_burst count_per_period period_s [quantity]`.
///
/// Integers as every argument of the module (plain decimal digits): redis-cell also takes signs
/// and answers nonsense for negative values; here they are errors.
pub fn parse_throttle(args: &[&[u8]]) -> Result<DialectCall, String> {
    if !(3..=4).contains(&args.len()) {
        return Err("ERR wrong number of arguments for 'cl.throttle' command".to_string());
    }
    let number = |bytes: &[u8], min: u64, max: u64, what: &str| {
        parse_integer(bytes)
            .filter(|value| (min..=max).contains(value))
            .ok_or_else(|| format!("ERR {what} must be an integer from {min} to {max}"))
    };
    let max_burst = number(args[0], 0, MAX_BURST, "max_burst")?;
    let count = number(args[1], 1, MAX_AMOUNT, "count per period")?;
    let period_s = number(args[2], 1, MAX_PERIOD_S, "period (seconds)")?;
    let cost = match args.get(3) {
        Some(bytes) => number(bytes, 0, MAX_AMOUNT, "quantity")?,
        None => 1,
    };
    let params = Params::new(count, period_s * 1000, Some(max_burst + 1))
        .map_err(|_| "ERR invalid CL.THROTTLE parameters".to_string())?;
    Ok(DialectCall { params, cost })
}

/// `GCRA` arguments after the key: `max_burst tokens_per_period period [TOKENS count]`, with the
/// proposal's rules and error texts where they apply, and the module's bounds beyond them.
pub fn parse_gcra(args: &[&[u8]]) -> Result<DialectCall, String> {
    if !(3..=5).contains(&args.len()) {
        return Err("ERR wrong number of arguments for 'gcra' command".to_string());
    }
    // The proposal's error texts, each naming the argument it is about.
    let integer = |bytes: &[u8], name: &str| {
        std::str::from_utf8(bytes)
            .ok()
            .and_then(|text| text.parse::<i64>().ok())
            .ok_or_else(|| format!("ERR {name} is not an integer or out of range"))
    };
    let at_least_one = |value: i64, name: &str| {
        if value < 1 {
            Err(format!(
                "ERR {name} is out of range, must be between 1 and {}",
                i64::MAX
            ))
        } else {
            Ok(value)
        }
    };
    let max_burst = integer(args[0], "max_burst")?;
    if max_burst < 0 {
        return Err("ERR max_burst is out of range, must be 0 or more".to_string());
    }
    let tokens_per_period =
        at_least_one(integer(args[1], "tokens_per_period")?, "tokens_per_period")?;
    let period = std::str::from_utf8(args[2])
        .ok()
        .and_then(|text| text.trim().parse::<f64>().ok())
        .filter(|value| !value.is_nan())
        .ok_or_else(|| "ERR period is not a valid float".to_string())?;
    if !(period > 0.0 && period < 1e12) {
        return Err("ERR period must be > 0 and < 1e12".to_string());
    }
    let cost = match &args[3..] {
        [] => 1,
        [token, ..] if !token.eq_ignore_ascii_case(b"TOKENS") => {
            return Err("ERR syntax error".to_string())
        }
        [_] => return Err("ERR Missing TOKENS value".to_string()),
        [_, count] => at_least_one(integer(count, "TOKENS")?, "TOKENS")? as u64,
        _ => unreachable!("at most five arguments"),
    };
    // The emission interval in µs, rounded to the nearest (at least 1), as the proposal does.
    let interval_us = ((period * 1e6 / tokens_per_period as f64) + 0.5)
        .floor()
        .max(1.0);
    if interval_us > MAX_PERIOD_MS as f64 {
        return Err(format!(
            "ERR GCRA: period / tokens_per_period must be at most {MAX_PERIOD_MS} microseconds \
             (3650 days / 1000)"
        ));
    }
    if max_burst as u64 > MAX_BURST || cost > MAX_AMOUNT {
        return Err(format!(
            "ERR GCRA: max_burst must be at most {MAX_BURST} and TOKENS at most {MAX_AMOUNT}"
        ));
    }
    let params = Params::new(1000, interval_us as u64, Some(max_burst as u64 + 1))
        .map_err(|_| "ERR invalid GCRA parameters".to_string())?;
    Ok(DialectCall { params, cost })
}

/// Whole seconds, rounded up, of a duration in ms.
fn seconds(ms: u64) -> i64 {
    i64::try_from(ms.div_ceil(1000)).unwrap_or(i64::MAX)
}

/// `[limited, max_burst + 1, remaining, retry_after_s, reset_after_s]` of a decision.
pub fn dialect_reply(decision: &Decision) -> [i64; 5] {
    let retry_after = if decision.allowed || decision.retry_after_ms < 0 {
        -1
    } else {
        seconds(decision.retry_after_ms as u64)
    };
    [
        i64::from(!decision.allowed),
        i64::try_from(decision.limit).unwrap_or(i64::MAX),
        i64::try_from(decision.remaining).unwrap_or(i64::MAX),
        retry_after,
        seconds(decision.reset_after_ms),
    ]
}

const THROTTLE_ARGS: [Arg; 5] = [
    Arg::new(c"key", ArgType::Key),
    Arg::new(c"max_burst", ArgType::Integer),
    Arg::new(c"count_per_period", ArgType::Integer),
    Arg::new(c"period", ArgType::Integer),
    Arg::new(c"quantity", ArgType::Integer).optional(),
];

pub(crate) const THROTTLE: Command = Command {
    name: c"cl.throttle",
    flags: c"write deny-oom fast",
    arity: -5,
    keys: Keys::First {
        rest: false,
        flags: KEY_UPDATED,
    },
    summary: c"redis-cell's rate limiter (GCRA): admits a request and says what is left",
    complexity: c"O(1)",
    args: &THROTTLE_ARGS,
    acl: "write fast ratelimit",
    counted: true,
    handler: handler!(|call| run(call, parse_throttle)),
};

const GCRA_ARGS: [Arg; 5] = [
    Arg::new(c"key", ArgType::Key),
    Arg::new(c"max_burst", ArgType::Integer),
    Arg::new(c"tokens_per_period", ArgType::Integer),
    Arg::new(c"period", ArgType::String),
    Arg::option(c"TOKENS", c"count", ArgType::Integer),
];

pub(crate) const GCRA: Command = Command {
    name: c"gcra",
    flags: c"write deny-oom fast",
    arity: -5,
    keys: Keys::First {
        rest: false,
        flags: KEY_UPDATED,
    },
    summary: c"Rate limiting with GCRA: admits a request and says what is left",
    complexity: c"O(1)",
    args: &GCRA_ARGS,
    acl: "write fast ratelimit",
    counted: true,
    handler: handler!(|call| run(call, parse_gcra)),
};

/// The dialect commands, registered where the server has no command of their name.
pub(crate) const COMMANDS: [&Command; 2] = [&THROTTLE, &GCRA];

/// The most arguments a dialect call can have after its key.
const MAX_ARGS: usize = 5;

fn run(call: &Call, parse: fn(&[&[u8]]) -> Result<DialectCall, String>) -> c_int {
    let count = call.argc().saturating_sub(2);
    let mut slices: [&[u8]; MAX_ARGS + 1] = [&[]; MAX_ARGS + 1];
    let count = count.min(slices.len());
    for (i, slot) in slices[..count].iter_mut().enumerate() {
        *slot = call.bytes(2 + i);
    }
    let parsed = if call.argc() < 2 {
        Err(parse(&[]).unwrap_err())
    } else {
        parse(&slices[..count])
    };
    let parsed = match parsed {
        Ok(parsed) => parsed,
        Err(message) => return call.error(&message),
    };
    let request = Request {
        algorithm: Algorithm::Gcra,
        params: parsed.params,
        cost: parsed.cost,
        now_ms: now_ms(),
    };
    let decision = match decide(call, &request, true, Mode::Enforce, None, None, false) {
        Ok(decided) => decided,
        Err(message) => return call.error(&message),
    };
    let reply = dialect_reply(&decision);
    call.reply_array(reply.len());
    for value in reply {
        call.reply_integer(value);
    }
    raw::REDISMODULE_OK as c_int
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<&[u8]> {
        line.split(' ').map(str::as_bytes).collect()
    }

    #[test]
    fn throttle_arguments() {
        let call = parse_throttle(&args("4 1 60")).unwrap();
        assert_eq!(call.params, Params::new(1, 60_000, Some(5)).unwrap());
        assert_eq!(call.cost, 1);
        assert_eq!(parse_throttle(&args("0 10 1 0")).unwrap().cost, 0);
        for (line, needle) in [
            ("4 1", "wrong number of arguments"),
            ("4 1 60 1 1", "wrong number of arguments"),
            ("x 1 60", "max_burst"),
            ("-1 1 60", "max_burst"),
            ("4 0 60", "count per period"),
            ("4 1 0", "period"),
            ("4 1 315360001", "period"),
            ("4 1 60 -1", "quantity"),
        ] {
            let error = parse_throttle(&args(line)).unwrap_err();
            assert!(
                error.starts_with("ERR ") && error.contains(needle),
                "{line}: {error}"
            );
        }
    }

    #[test]
    fn gcra_arguments() {
        // 10 per 1 s: an interval of 100,000 µs, stored as 1000 per 100,000 ms.
        let call = parse_gcra(&args("4 10 1")).unwrap();
        assert_eq!(call.params, Params::new(1000, 100_000, Some(5)).unwrap());
        // Rounded to the nearest µs: 1 s / 3 is 333,333.33 µs.
        assert_eq!(
            parse_gcra(&args("0 3 1")).unwrap().params.period_ms,
            333_333
        );
        assert_eq!(
            parse_gcra(&args("0 3 2")).unwrap().params.period_ms,
            666_667
        );
        // At least 1 µs.
        assert_eq!(
            parse_gcra(&args("0 10 0.000001")).unwrap().params.period_ms,
            1
        );
        assert_eq!(parse_gcra(&args("2 1 0.5 TOKENS 3")).unwrap().cost, 3);
        assert_eq!(parse_gcra(&args("2 1 0.5 tokens 3")).unwrap().cost, 3);
        for (line, error) in [
            ("4 10", "ERR wrong number of arguments for 'gcra' command"),
            ("x 10 1", "ERR max_burst is not an integer or out of range"),
            (
                "-1 10 1",
                "ERR max_burst is out of range, must be 0 or more",
            ),
            (
                "4 0 1",
                "ERR tokens_per_period is out of range, must be between 1 and 9223372036854775807",
            ),
            (
                "4 1.5 1",
                "ERR tokens_per_period is not an integer or out of range",
            ),
            (
                "1 10 1 TOKENS 0",
                "ERR TOKENS is out of range, must be between 1 and 9223372036854775807",
            ),
            (
                "1 10 1 TOKENS x",
                "ERR TOKENS is not an integer or out of range",
            ),
            ("1 10 abc", "ERR period is not a valid float"),
            ("1 10 0", "ERR period must be > 0 and < 1e12"),
            ("1 10 1e12", "ERR period must be > 0 and < 1e12"),
            ("1 10 1 COUNT 2", "ERR syntax error"),
            ("1 10 1 TOKENS", "ERR Missing TOKENS value"),
        ] {
            assert_eq!(parse_gcra(&args(line)).unwrap_err(), error, "{line}");
        }
        assert!(parse_gcra(&args("1 1 999999999999"))
            .unwrap_err()
            .contains("at most"));
    }

    #[test]
    fn replies_round_up_to_whole_seconds() {
        let decision = |allowed, retry, reset| Decision {
            allowed,
            limit: 5,
            remaining: 2,
            retry_after_ms: retry,
            reset_after_ms: reset,
            delay_ms: 0,
        };
        assert_eq!(dialect_reply(&decision(true, 0, 2000)), [0, 5, 2, -1, 2]);
        assert_eq!(dialect_reply(&decision(true, 0, 2001)), [0, 5, 2, -1, 3]);
        assert_eq!(dialect_reply(&decision(false, 1, 999)), [1, 5, 2, 1, 1]);
        assert_eq!(dialect_reply(&decision(false, 1000, 0)), [1, 5, 2, 1, 0]);
        assert_eq!(dialect_reply(&decision(false, -1, 5000)), [1, 5, 2, -1, 5]);
    }
}
