//! The arguments of the commands of one key and one limit: CHECK and PEEK, REFUND and TAKE.

use crate::error::{ArgError, Options as Expected};
use crate::few::Few;

use super::spec::{
    finish_spec, is_policy, option, option_name, parse_rate_head, LimitArg, LimitSpec, OptionName,
    OptionValues,
};
use super::words::CALL_WORDS;

/// `RATELIMIT.CHECK` / `PEEK` arguments after the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckArgs {
    pub spec: LimitSpec,
    pub cost: u64,
    /// `AT`: evaluate at this time instead of the server's clock.
    pub at_ms: Option<u64>,
}

/// `algorithm limit period [BURST capacity] [COST cost] [AT unix-ms]`, options in any order.
#[inline(always)]
pub fn parse_check(args: &[&[u8]], max_log_limit: u64) -> Result<CheckArgs, ArgError> {
    let (algorithm, limit, period_ms) = parse_rate_head(args)?;
    let mut options = OptionValues::default();
    let mut i = 3;
    while let Some(name) = args.get(i) {
        let option = option(name).ok_or(ArgError::UnknownOption {
            at: i,
            after_period: i == 3,
            expected: Expected::Call,
        })?;
        options.set(option, args.get(i + 1))?;
        i += 2;
    }
    let spec = finish_spec(
        algorithm,
        limit,
        period_ms,
        (options.burst, options.block_ms),
        max_log_limit,
    )?;
    Ok(CheckArgs {
        spec,
        cost: options.cost.unwrap_or(1),
        at_ms: options.at_ms,
    })
}

/// `RATELIMIT.CHECK` / `PEEK` arguments after the key, with a limit spec or a policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallArgs<'a> {
    pub limit: LimitArg<'a>,
    pub cost: u64,
    /// `AT`: evaluate at this time instead of the server's clock.
    pub at_ms: Option<u64>,
}

/// `algorithm limit period [BURST capacity] [COST cost] [AT unix-ms]` (see [`parse_check`]) or
/// `POLICY name [COST cost] [AT unix-ms]`, options in any order, each once. Inlined: every
/// CHECK's arguments, whose result is then read where it is made (`make profile`).
#[inline(always)]
pub fn parse_call<'a>(args: &[&'a [u8]], max_log_limit: u64) -> Result<CallArgs<'a>, ArgError> {
    let Some(name) = args.first().filter(|word| is_policy(word)).and(args.get(1)) else {
        if args.first().is_some_and(|word| is_policy(word)) {
            return Err(ArgError::WrongArity);
        }
        return parse_check(args, max_log_limit).map(|parsed| CallArgs {
            limit: LimitArg::Inline(parsed.spec),
            cost: parsed.cost,
            at_ms: parsed.at_ms,
        });
    };
    let mut options = OptionValues::default();
    let mut i = 2;
    while let Some(word) = args.get(i) {
        match option(word) {
            Some(option @ (OptionName::Burst | OptionName::Block)) => {
                return Err(ArgError::OptionWithPolicy(option_name(option)))
            }
            Some(option) => options.set(option, args.get(i + 1))?,
            None => {
                return Err(ArgError::UnknownOption {
                    at: i,
                    after_period: false,
                    expected: Expected::PolicyCall,
                })
            }
        }
        i += 2;
    }
    Ok(CallArgs {
        limit: LimitArg::Policy(name),
        cost: options.cost.unwrap_or(1),
        at_ms: options.at_ms,
    })
}

/// `RATELIMIT.REFUND` arguments after the key: those of [`parse_call`], `COST` required.
pub fn parse_refund<'a>(args: &[&'a [u8]], max_log_limit: u64) -> Result<CallArgs<'a>, ArgError> {
    let parsed = parse_call(args, max_log_limit)?;
    // The options come in pairs after the limit (checked by parse_call): a COST among them.
    let first_option = match parsed.limit {
        LimitArg::Inline(_) => 3,
        LimitArg::Policy(_) => 2,
    };
    let cost_given = args
        .iter()
        .skip(first_option)
        .step_by(2)
        .any(|name| option(name) == Some(OptionName::Cost));
    if !cost_given {
        return Err(ArgError::RefundCost);
    }
    Ok(parsed)
}

/// `RATELIMIT.TAKE` arguments after the key: CHECK's (see [`parse_call`]), with `MAX n`, required,
/// from 1 to 10^12, where CHECK takes `COST` (which TAKE refuses). `cost` holds `MAX`.
pub fn parse_take<'a>(args: &[&'a [u8]], max_log_limit: u64) -> Result<CallArgs<'a>, ArgError> {
    let through_policy = args.first().is_some_and(|word| is_policy(word));
    let first_option = if through_policy { 2 } else { 3 };
    let expected = if through_policy {
        Expected::PolicyTake
    } else {
        Expected::Take
    };
    // CHECK's parser reads the words with MAX as COST; a COST as given is no option of TAKE.
    // Copied inline (a longer call, always refused, spills).
    let mut words: Few<&[u8], CALL_WORDS> = args.iter().copied().collect();
    let mut max_given = false;
    for at in (first_option..words.len()).step_by(2) {
        match words[at] {
            word if word.eq_ignore_ascii_case(b"MAX") => {
                words[at] = b"COST";
                max_given = true;
            }
            word if option(word) == Some(OptionName::Cost) => {
                return Err(ArgError::UnknownOption {
                    at,
                    after_period: at == 3,
                    expected,
                })
            }
            _ => {}
        }
    }
    let parsed = parse_call(&words, max_log_limit).map_err(|error| match error {
        ArgError::Cost => ArgError::TakeMax,
        ArgError::MissingValue("COST") => ArgError::MissingValue("MAX"),
        ArgError::Duplicate("COST") => ArgError::Duplicate("MAX"),
        ArgError::UnknownOption {
            at, after_period, ..
        } => ArgError::UnknownOption {
            at,
            after_period,
            expected,
        },
        other => other,
    })?;
    match parsed.cost {
        _ if !max_given => Err(ArgError::TakeMaxMissing),
        0 => Err(ArgError::TakeMax),
        _ => Ok(parsed),
    }
}
