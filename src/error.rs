//! Every error reply the module sends, in one place. Each names the argument at fault.

use crate::algorithms::ParamsError;

pub const WRONG_TYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
pub const UNKNOWN_ALGORITHM: &str = "ERR unknown algorithm: expected token-bucket, leaky-bucket, \
     fixed-window, sliding-window, sliding-log or gcra";
pub const LIMIT: &str = "ERR limit must be an integer from 1 to 1000000000000";
pub const PERIOD: &str = "ERR period must be an integer from 1 ms to 3650 days, in ms or \
     with a unit ms, s, m, h or d (250ms, 1s, 15m, 1h, 1d)";
pub const BURST: &str = "ERR BURST must be an integer from 1 to 1000000000000";
pub const BURST_ON_WINDOW: &str = "ERR BURST applies only to token-bucket, leaky-bucket and gcra";
pub const COST: &str = "ERR COST must be an integer from 0 to 1000000000000";
pub const AT: &str = "ERR AT must be a time in ms since the Unix epoch, below 2^53";
pub const NUMKEYS: &str = "ERR numkeys must be an integer from 1 to the number of keys given";
pub const UNKNOWN_OPTION: &str = "ERR unknown option: expected BURST, COST or AT";
pub const STATE: &str = "ERR invalid limiter state payload";
pub const INTERNAL: &str = "ERR internal error in ratelimit module (see the server log)";

/// A malformed argument vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgError {
    WrongArity,
    UnknownAlgorithm,
    Limit,
    Period,
    Burst,
    BurstOnWindow,
    Cost,
    At,
    NumKeys,
    UnknownOption,
    /// The option was given without its value.
    MissingValue(&'static str),
    /// The option was given more than once.
    Duplicate(&'static str),
    /// A sliding-log limit above `ratelimit.max-log-limit`.
    LogLimit {
        limit: u64,
        max: u64,
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
    pub fn message(&self, command: &str) -> String {
        let fixed = match self {
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
            ArgError::UnknownAlgorithm => UNKNOWN_ALGORITHM,
            ArgError::Limit => LIMIT,
            ArgError::Period => PERIOD,
            ArgError::Burst => BURST,
            ArgError::BurstOnWindow => BURST_ON_WINDOW,
            ArgError::Cost => COST,
            ArgError::At => AT,
            ArgError::NumKeys => NUMKEYS,
            ArgError::UnknownOption => UNKNOWN_OPTION,
        };
        fixed.to_string()
    }
}

/// The error for a key holding another algorithm than the call names.
pub fn algorithm_mismatch(stored: &str, named: &str) -> String {
    format!("ERR key holds a {stored} limiter, not {named}: RATELIMIT.RESET it to change algorithm")
}
