//! Every error reply the module sends, in one place. Each names the argument at fault.

use crate::algorithms::ParamsError;

pub const WRONG_TYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
pub const UNKNOWN_ALGORITHM: &str = "expected token-bucket, leaky-bucket, fixed-window, \
     sliding-window, sliding-log or gcra";
pub const LIMIT: &str = "ERR limit must be an integer from 1 to 1000000000000";
pub const PERIOD: &str = "ERR period must be an integer from 1 ms to 3650 days, in ms or \
     with a unit ms, s, m, h or d (250ms, 1s, 15m, 1h, 1d)";
pub const BURST: &str = "ERR BURST must be an integer from 1 to 1000000000000";
pub const BURST_ON_WINDOW: &str = "ERR BURST applies only to token-bucket, leaky-bucket and gcra";
pub const COST: &str = "ERR COST must be an integer from 0 to 1000000000000";
pub const AT: &str = "ERR AT must be a time in ms since the Unix epoch, below 2^53";
pub const NUMKEYS: &str = "ERR numkeys must be an integer from 1 to the number of keys given";
pub const UNKNOWN_OPTION: &str = "expected BURST, BLOCK, COST or AT";
pub const UNKNOWN_POLICY_CALL_OPTION: &str = "expected COST or AT";
pub const UNKNOWN_POLICY_OPTION: &str = "expected BURST, BLOCK or SHADOW";
pub const UNKNOWN_ACQUIRE_OPTION: &str = "expected ID, COST or AT";
pub const UNKNOWN_RELEASE_OPTION: &str = "expected ID or AT";
pub const LEASE_DURATION: &str = "ERR lease-duration must be an integer from 1 ms to 3650 days, \
     in ms or with a unit ms, s, m, h or d (250ms, 1s, 15m, 1h, 1d)";
pub const LEASE_COST: &str = "ERR COST must be an integer from 1 to 1000000000000 (a lease holds \
     at least 1)";
pub const LEASE_ID: &str = "ERR lease id must be 1 to 128 bytes";
pub const LEASE_ID_MISSING: &str = "ERR ID lease-id is required: the id the lease is held under";
pub const CONCURRENCY_CALL: &str = "ERR concurrency limits are held by leases: use \
     RATELIMIT.ACQUIRE and RATELIMIT.RELEASE";
pub const BLOCK_ON_CONCURRENCY: &str =
    "ERR BLOCK applies only to rate limits: a concurrency limit has nothing to block";
pub const REFUND_COST: &str = "ERR RATELIMIT.REFUND needs COST: how much to give back";
pub const UNKNOWN_TAKE_OPTION: &str = "expected BURST, BLOCK, MAX or AT";
pub const UNKNOWN_POLICY_TAKE_OPTION: &str = "expected MAX or AT";
pub const TAKE_MAX: &str = "ERR MAX must be an integer from 1 to 1000000000000";
pub const TAKE_MAX_MISSING: &str = "ERR RATELIMIT.TAKE needs MAX: the most units to take";
pub const BLOCK: &str = "ERR BLOCK must be a duration from 1 ms to 3650 days, in ms or with a \
     unit ms, s, m, h or d (250ms, 1s, 15m, 1h, 1d)";
pub const POLICY_NAME: &str =
    "ERR policy name must be 1 to 64 bytes of A-Z, a-z, 0-9, '_', '-' and '.'";
pub const SPEC_EMPTY_WORD: &str = "has an empty word: separate its words by single spaces";
pub const SPEC_WHITESPACE: &str = "has a tab or a newline: separate its words by single spaces";
pub const SPEC_CALL_OPTION: &str = "as arguments of its own, not inside it";
pub const SPEC_INCOMPLETE: &str = "is incomplete: one argument holds a whole spec, algorithm \
     limit period [BURST capacity] [BLOCK duration] or POLICY name";
pub const STATE: &str = "ERR invalid limiter state payload";
pub const INTERNAL: &str = "ERR internal error in ratelimit module (see the server log)";

/// The options a place in the arguments takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Options {
    /// A call with a limit spec: `BURST`, `BLOCK`, `COST`, `AT`.
    Call,
    /// A call with `POLICY name`: `COST`, `AT`.
    PolicyCall,
    /// `RATELIMIT.POLICY SET`: `BURST`, `BLOCK`, `SHADOW`.
    PolicySet,
    /// `RATELIMIT.ACQUIRE`: `ID`, `COST`, `AT`.
    Acquire,
    /// `RATELIMIT.RELEASE`: `ID`, `AT`.
    Release,
    /// `RATELIMIT.TAKE` with a limit spec: `BURST`, `BLOCK`, `MAX`, `AT`.
    Take,
    /// `RATELIMIT.TAKE` with `POLICY name`: `MAX`, `AT`.
    PolicyTake,
}

/// What is wrong with a limit spec given as one argument (see `parse::read_call`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecWordsError {
    /// Two spaces in a row, or one at an end.
    EmptyWord,
    /// A tab, newline, carriage return, vertical tab or form feed.
    Whitespace,
    /// `COST`, `AT` or `MAX`: an option of the call, which follows the spec.
    CallOption(&'static str),
    /// Less than `algorithm limit period`, or a `BURST` or `BLOCK` without its value.
    Incomplete,
}

/// A malformed argument vector. A variant that names an argument holds its position in the
/// arguments its message is given (see [`ArgError::message`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgError {
    WrongArity,
    /// `args[at]` is no algorithm; `after_period`: it comes right after a spec's period.
    UnknownAlgorithm {
        at: usize,
        after_period: bool,
    },
    Limit,
    Period,
    Burst,
    BurstOnWindow,
    Cost,
    At,
    NumKeys,
    /// `args[at]` is no option (of those `expected`); `after_period`: it comes right after the
    /// spec's period.
    UnknownOption {
        at: usize,
        after_period: bool,
        expected: Options,
    },
    /// `BLOCK`'s duration.
    Block,
    /// `BURST` or `BLOCK` in a call that names a policy.
    OptionWithPolicy(&'static str),
    /// A `RATELIMIT.REFUND` without `COST`.
    RefundCost,
    /// A `RATELIMIT.TAKE` whose `MAX` is outside 1 to 10^12.
    TakeMax,
    /// A `RATELIMIT.TAKE` without `MAX`.
    TakeMaxMissing,
    /// A policy name outside the rule of [`crate::policy::valid_name`].
    PolicyName,
    /// A CHECKALL of `keys` keys with `specs` limit specs.
    SpecCount {
        keys: usize,
        specs: usize,
    },
    /// The option was given without its value.
    MissingValue(&'static str),
    /// The option was given more than once.
    Duplicate(&'static str),
    /// A sliding-log limit above `ratelimit.max-log-limit`.
    LogLimit {
        limit: u64,
        max: u64,
    },
    /// A lease duration outside the period bounds.
    LeaseDuration,
    /// An ACQUIRE's `COST` outside 1 to 10^12.
    LeaseCost,
    /// A lease id of no accepted length.
    LeaseId,
    /// An ACQUIRE or RELEASE without `ID`.
    LeaseIdMissing,
    /// A rate-limit call (CHECK, PEEK, CHECKALL, REFUND) naming `concurrency`.
    ConcurrencyCall,
    /// `BLOCK` on a concurrency policy.
    BlockOnConcurrency,
    /// `args[at]` is a limit spec given as one argument that the grammar cannot take.
    SpecWords {
        at: usize,
        problem: SpecWordsError,
    },
}

impl From<ParamsError> for ArgError {
    fn from(error: ParamsError) -> ArgError {
        match error {
            ParamsError::Limit => ArgError::Limit,
            ParamsError::Period => ArgError::Period,
            ParamsError::Burst => ArgError::Burst,
        }
    }
}

impl ArgError {
    /// The error reply, `ERR ...` (for arity: Redis's own wording, given the command name).
    /// `args` are the arguments the positions of [`ArgError::UnknownAlgorithm`] and
    /// [`ArgError::UnknownOption`] refer to (the parser's input; `&[]` for the other variants).
    pub fn message(&self, command: &str, args: &[&[u8]]) -> String {
        let fixed = match *self {
            ArgError::WrongArity => {
                return format!("ERR wrong number of arguments for '{command}' command")
            }
            ArgError::MissingValue(option) => return format!("ERR {option} needs a value"),
            ArgError::Duplicate(option) => return format!("ERR {option} given more than once"),
            ArgError::LogLimit { limit, max } => {
                return format!(
                    "ERR sliding-log limit {limit} exceeds ratelimit.max-log-limit {max}"
                )
            }
            ArgError::UnknownAlgorithm { at, after_period } => {
                return unknown("algorithm", UNKNOWN_ALGORITHM, args, at, after_period)
            }
            ArgError::UnknownOption {
                at,
                after_period,
                expected,
            } => {
                let expected = match expected {
                    Options::Call => UNKNOWN_OPTION,
                    Options::PolicyCall => UNKNOWN_POLICY_CALL_OPTION,
                    Options::PolicySet => UNKNOWN_POLICY_OPTION,
                    Options::Acquire => UNKNOWN_ACQUIRE_OPTION,
                    Options::Release => UNKNOWN_RELEASE_OPTION,
                    Options::Take => UNKNOWN_TAKE_OPTION,
                    Options::PolicyTake => UNKNOWN_POLICY_TAKE_OPTION,
                };
                return unknown("option", expected, args, at, after_period);
            }
            ArgError::SpecCount { keys, specs } => {
                let (noun, verb) = if keys == 1 {
                    ("key", "needs")
                } else {
                    ("keys", "need")
                };
                let plural = if keys == 1 { "" } else { "s" };
                return format!(
                    "ERR {keys} {noun} {verb} {keys} limit spec{plural} (one per key, in order); \
                     found {specs}"
                );
            }
            ArgError::SpecWords { at, problem } => {
                let spec = shown(args.get(at).copied().unwrap_or_default());
                return match problem {
                    SpecWordsError::EmptyWord => {
                        format!("ERR limit spec '{spec}' {SPEC_EMPTY_WORD}")
                    }
                    SpecWordsError::Whitespace => {
                        format!("ERR limit spec '{spec}' {SPEC_WHITESPACE}")
                    }
                    SpecWordsError::CallOption(option) => format!(
                        "ERR {option} goes after the limit spec '{spec}' {SPEC_CALL_OPTION}"
                    ),
                    SpecWordsError::Incomplete => {
                        format!("ERR limit spec '{spec}' {SPEC_INCOMPLETE}")
                    }
                };
            }
            ArgError::Limit => LIMIT,
            ArgError::Period => PERIOD,
            ArgError::Burst => BURST,
            ArgError::BurstOnWindow => BURST_ON_WINDOW,
            ArgError::Cost => COST,
            ArgError::At => AT,
            ArgError::NumKeys => NUMKEYS,
            ArgError::OptionWithPolicy(option) => {
                return format!(
                    "ERR {option} cannot be given with POLICY: the policy sets the limit"
                )
            }
            ArgError::Block => BLOCK,
            ArgError::RefundCost => REFUND_COST,
            ArgError::TakeMax => TAKE_MAX,
            ArgError::TakeMaxMissing => TAKE_MAX_MISSING,
            ArgError::PolicyName => POLICY_NAME,
            ArgError::LeaseDuration => LEASE_DURATION,
            ArgError::LeaseCost => LEASE_COST,
            ArgError::LeaseId => LEASE_ID,
            ArgError::LeaseIdMissing => LEASE_ID_MISSING,
            ArgError::ConcurrencyCall => CONCURRENCY_CALL,
            ArgError::BlockOnConcurrency => BLOCK_ON_CONCURRENCY,
        };
        fixed.to_string()
    }

    /// The same error, its position `by` arguments further on (the parser saw a tail of them).
    pub fn shifted(self, by: usize) -> ArgError {
        match self {
            ArgError::UnknownAlgorithm { at, after_period } => ArgError::UnknownAlgorithm {
                at: at + by,
                after_period,
            },
            ArgError::UnknownOption {
                at,
                after_period,
                expected,
            } => ArgError::UnknownOption {
                at: at + by,
                after_period,
                expected,
            },
            ArgError::SpecWords { at, problem } => ArgError::SpecWords {
                at: at + by,
                problem,
            },
            other => other,
        }
    }
}

/// The longest part of an argument an error shows.
const SHOWN_BYTES: usize = 32;

/// An argument as an error shows it: its first `SHOWN_BYTES` (32) bytes, each byte outside
/// printable ASCII as `?`, then `...` if it was longer.
pub fn shown(bytes: &[u8]) -> String {
    let mut text: String = bytes
        .iter()
        .take(SHOWN_BYTES)
        .map(|&b| {
            if (0x20..0x7f).contains(&b) {
                b as char
            } else {
                '?'
            }
        })
        .collect();
    if bytes.len() > SHOWN_BYTES {
        text.push_str("...");
    }
    text
}

/// `ERR unknown <what> '<arg>': <expected>`, with a hint when the word follows a period given
/// as a bare number (`1 minute`): the unit belongs in the period's own argument.
fn unknown(what: &str, expected: &str, args: &[&[u8]], at: usize, after_period: bool) -> String {
    let word = args.get(at).copied().unwrap_or_default();
    let mut message = format!("ERR unknown {what} '{}': {expected}", shown(word));
    let period = at.checked_sub(1).and_then(|i| args.get(i)).copied();
    if let Some(number) = period.filter(|p| after_period && is_digits(p)) {
        let number = shown(number);
        match unit_meant(word) {
            Some(unit) => message.push_str(&format!(
                "; a period takes its unit in the same argument: {number}{unit}, not '{number} {}'",
                shown(word)
            )),
            None => message.push_str(&format!(
                "; a period takes its unit in the same argument: {number}ms, {number}s, \
                 {number}m, {number}h or {number}d"
            )),
        }
    }
    message
}

fn is_digits(bytes: &[u8]) -> bool {
    !bytes.is_empty() && bytes.iter().all(u8::is_ascii_digit)
}

/// The period unit a word spells out (`minute`, `secs`, `h`...), if any.
fn unit_meant(word: &[u8]) -> Option<&'static str> {
    const UNITS: [(&str, &[&str]); 5] = [
        (
            "ms",
            &["ms", "msec", "msecs", "millisecond", "milliseconds"],
        ),
        ("s", &["s", "sec", "secs", "second", "seconds"]),
        ("m", &["m", "min", "mins", "minute", "minutes"]),
        ("h", &["h", "hr", "hrs", "hour", "hours"]),
        ("d", &["d", "day", "days"]),
    ];
    UNITS.into_iter().find_map(|(unit, words)| {
        words
            .iter()
            .any(|w| w.as_bytes().eq_ignore_ascii_case(word))
            .then_some(unit)
    })
}

/// A call names a policy that is not defined.
pub fn no_such_policy(name: &[u8]) -> String {
    format!("ERR no such policy '{}'", shown(name))
}

/// A new policy past `ratelimit.max-policies`.
pub fn too_many_policies(max: u64) -> String {
    format!(
        "ERR too many policies: ratelimit.max-policies is {max} (RATELIMIT.POLICY DEL one, or \
         raise it)"
    )
}

/// The error for a key holding another algorithm than the call names.
pub fn algorithm_mismatch(stored: &str, named: &str) -> String {
    if stored == "concurrency" {
        return "ERR key holds a concurrency limiter: use RATELIMIT.ACQUIRE and RATELIMIT.RELEASE \
                (or RATELIMIT.RESET it to change algorithm)"
            .to_string();
    }
    format!("ERR key holds a {stored} limiter, not {named}: RATELIMIT.RESET it to change algorithm")
}

/// A call names a policy of the other kind: a concurrency policy to a rate-limit call
/// (`concurrency`), or a rate limit's to ACQUIRE.
pub fn policy_kind(name: &[u8], algorithm: &str) -> String {
    if algorithm == "concurrency" {
        format!(
            "ERR policy '{}' is a concurrency limit: use RATELIMIT.ACQUIRE and RATELIMIT.RELEASE",
            shown(name)
        )
    } else {
        format!(
            "ERR policy '{}' is a {algorithm} limit, not concurrency: RATELIMIT.ACQUIRE takes a \
             concurrency policy",
            shown(name)
        )
    }
}

/// A new lease on a key that holds `ratelimit.max-leases` live ones already.
pub fn too_many_leases(max: u64) -> String {
    format!(
        "ERR key holds ratelimit.max-leases ({max}) live leases: release some (RATELIMIT.RELEASE), \
         or raise it"
    )
}
