//! What the commands' arguments share: a limit spec (`algorithm limit period [BURST capacity]
//! [BLOCK duration]`), a period, the options (`COST`, `AT`, ...) and their values.

use crate::algorithms::{Algorithm, Kind, Params, MAX_AMOUNT, MAX_PERIOD_MS, TIME_LIMIT_MS};
use crate::error::ArgError;
use crate::integer::parse_integer;

/// One limit: the algorithm and its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitSpec {
    pub algorithm: Algorithm,
    pub params: Params,
    /// `BLOCK duration`, in ms: how long a rejection blocks the key (see `algorithms::block`).
    pub block_ms: Option<u64>,
}

/// A period: integer ms, or an integer with a unit `ms`, `s`, `m`, `h`, `d` (case-insensitive).
#[inline(always)]
pub fn parse_period(bytes: &[u8]) -> Option<u64> {
    let (number, scale): (&[u8], u64) = match bytes {
        [number @ .., m, s] if m.eq_ignore_ascii_case(&b'm') && s.eq_ignore_ascii_case(&b's') => {
            (number, 1)
        }
        [number @ .., unit] if !unit.is_ascii_digit() => {
            let scale = match unit.to_ascii_lowercase() {
                b's' => 1_000,
                b'm' => 60_000,
                b'h' => 3_600_000,
                b'd' => 86_400_000,
                _ => return None,
            };
            (number, scale)
        }
        number => (number, 1),
    };
    parse_integer(number)?
        .checked_mul(scale)
        .filter(|ms| (1..=MAX_PERIOD_MS).contains(ms))
}

#[inline(always)]
pub(super) fn amount(bytes: &[u8], min: u64, error: ArgError) -> Result<u64, ArgError> {
    parse_integer(bytes)
        .filter(|value| (min..=MAX_AMOUNT).contains(value))
        .ok_or(error)
}

/// `kind limit period` at the front of `args` (`kind`: an algorithm, or `concurrency`).
#[inline(always)]
pub(super) fn parse_spec_head(args: &[&[u8]]) -> Result<(Kind, u64, u64), ArgError> {
    let [kind, limit, period, ..] = args else {
        return Err(ArgError::WrongArity);
    };
    let kind = Kind::parse(kind).ok_or(ArgError::UnknownAlgorithm {
        at: 0,
        after_period: false,
    })?;
    let limit = amount(limit, 1, ArgError::Limit)?;
    let period = parse_period(period).ok_or(ArgError::Period)?;
    Ok((kind, limit, period))
}

/// The parameters of a limit of `kind`, applying the BURST and BLOCK rules and the sliding-log
/// bound.
#[inline(always)]
pub(super) fn finish_params(
    kind: Kind,
    limit: u64,
    period_ms: u64,
    (burst, block_ms): (Option<u64>, Option<u64>),
    max_log_limit: u64,
) -> Result<Params, ArgError> {
    if burst.is_some() && !kind.is_bucket() {
        return Err(ArgError::BurstOnWindow);
    }
    if block_ms.is_some() && kind == Kind::Leases {
        return Err(ArgError::BlockOnConcurrency);
    }
    if kind == Kind::Rate(Algorithm::SlidingLog) && limit > max_log_limit {
        return Err(ArgError::LogLimit {
            limit,
            max: max_log_limit,
        });
    }
    Ok(Params::new(limit, period_ms, burst)?)
}

/// Builds a rate limit's spec (see [`finish_params`]).
#[inline(always)]
pub(super) fn finish_spec(
    algorithm: Algorithm,
    limit: u64,
    period_ms: u64,
    options: (Option<u64>, Option<u64>),
    max_log_limit: u64,
) -> Result<LimitSpec, ArgError> {
    let params = finish_params(algorithm.into(), limit, period_ms, options, max_log_limit)?;
    Ok(LimitSpec {
        algorithm,
        params,
        block_ms: options.1,
    })
}

/// Options recognised case-insensitively.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum OptionName {
    Burst,
    Block,
    Cost,
    At,
}

pub(super) fn option(name: &[u8]) -> Option<OptionName> {
    [
        (OptionName::Burst, "BURST"),
        (OptionName::Block, "BLOCK"),
        (OptionName::Cost, "COST"),
        (OptionName::At, "AT"),
    ]
    .into_iter()
    .find(|(_, text)| text.as_bytes().eq_ignore_ascii_case(name))
    .map(|(option, _)| option)
}

pub(super) fn option_name(option: OptionName) -> &'static str {
    match option {
        OptionName::Burst => "BURST",
        OptionName::Block => "BLOCK",
        OptionName::Cost => "COST",
        OptionName::At => "AT",
    }
}

/// The value of one option, checked for its range.
pub(super) fn option_value(option: OptionName, bytes: &[u8]) -> Result<u64, ArgError> {
    match option {
        OptionName::Burst => amount(bytes, 1, ArgError::Burst),
        OptionName::Block => parse_period(bytes).ok_or(ArgError::Block),
        OptionName::Cost => amount(bytes, 0, ArgError::Cost),
        OptionName::At => parse_integer(bytes)
            .filter(|at| *at < TIME_LIMIT_MS)
            .ok_or(ArgError::At),
    }
}

/// Shared `COST` and `AT` (and, for CHECK, `BURST` and `BLOCK`) collected from option pairs.
#[derive(Default)]
pub(super) struct OptionValues {
    pub(super) burst: Option<u64>,
    pub(super) block_ms: Option<u64>,
    pub(super) cost: Option<u64>,
    pub(super) at_ms: Option<u64>,
}

impl OptionValues {
    pub(super) fn set(
        &mut self,
        option: OptionName,
        bytes: Option<&&[u8]>,
    ) -> Result<(), ArgError> {
        let name = option_name(option);
        let bytes = bytes.ok_or(ArgError::MissingValue(name))?;
        let value = option_value(option, bytes)?;
        let slot = match option {
            OptionName::Burst => &mut self.burst,
            OptionName::Block => &mut self.block_ms,
            OptionName::Cost => &mut self.cost,
            OptionName::At => &mut self.at_ms,
        };
        if slot.replace(value).is_some() {
            return Err(ArgError::Duplicate(name));
        }
        Ok(())
    }
}

/// A rate limit's `algorithm limit period` at the front of `args`: concurrency is refused (its
/// leases are taken by RATELIMIT.ACQUIRE).
#[inline(always)]
pub(super) fn parse_rate_head(args: &[&[u8]]) -> Result<(Algorithm, u64, u64), ArgError> {
    match parse_spec_head(args)? {
        (Kind::Rate(algorithm), limit, period_ms) => Ok((algorithm, limit, period_ms)),
        (Kind::Leases, ..) => Err(ArgError::ConcurrencyCall),
    }
}

/// The limit a call applies: written out, or a policy's, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitArg<'a> {
    Inline(LimitSpec),
    /// `POLICY name`: the name as given (looked up, and checked, by the command).
    Policy(&'a [u8]),
}

/// `POLICY`, the word that starts a spec naming a policy (case-insensitive).
pub(super) fn is_policy(word: &[u8]) -> bool {
    word.eq_ignore_ascii_case(b"POLICY")
}

/// Where a spec must start. `COST` or `AT` there means a spec is missing.
pub(super) fn spec_start<'a, 'b>(args: &'a [&'b [u8]]) -> Result<&'a [&'b [u8]], ArgError> {
    match args.first().and_then(|name| option(name)) {
        Some(OptionName::Cost | OptionName::At) => Err(ArgError::WrongArity),
        _ => Ok(args),
    }
}
