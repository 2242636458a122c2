//! `RATELIMIT.POLICY SET`'s arguments.

use crate::algorithms::{Kind, Params};
use crate::error::{ArgError, Options as Expected};
use crate::policy;

use super::spec::{finish_params, option, parse_spec_head, OptionName, OptionValues};

/// `RATELIMIT.POLICY SET` arguments after `SET`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyDefinition<'a> {
    pub name: &'a [u8],
    /// What the policy limits: a rate of one algorithm, or leases (`concurrency`).
    pub kind: Kind,
    /// `limit` and `period_ms` (the lease duration for leases) and the capacity.
    pub params: Params,
    /// `BLOCK duration`, in ms (rate limits only).
    pub block_ms: Option<u64>,
    pub shadow: bool,
}

/// `name algorithm limit period [BURST capacity] [SHADOW]`, the options in any order, each once.
pub fn parse_policy_set<'a>(
    args: &[&'a [u8]],
    max_log_limit: u64,
) -> Result<PolicyDefinition<'a>, ArgError> {
    let Some((&name, spec_args)) = args.split_first() else {
        return Err(ArgError::WrongArity);
    };
    if !policy::valid_name(name) {
        return Err(ArgError::PolicyName);
    }
    let (kind, limit, period_ms) = parse_spec_head(spec_args).map_err(|e| e.shifted(1))?;
    let mut options = OptionValues::default();
    let mut shadow = false;
    let mut i = 4;
    while let Some(word) = args.get(i) {
        if word.eq_ignore_ascii_case(b"SHADOW") {
            if shadow {
                return Err(ArgError::Duplicate("SHADOW"));
            }
            shadow = true;
            i += 1;
            continue;
        }
        match option(word) {
            Some(option @ (OptionName::Burst | OptionName::Block)) => {
                options.set(option, args.get(i + 1))?
            }
            _ => {
                return Err(ArgError::UnknownOption {
                    at: i,
                    after_period: i == 4,
                    expected: Expected::PolicySet,
                })
            }
        }
        i += 2;
    }
    Ok(PolicyDefinition {
        name,
        kind,
        params: finish_params(
            kind,
            limit,
            period_ms,
            (options.burst, options.block_ms),
            max_log_limit,
        )?,
        block_ms: options.block_ms,
        shadow,
    })
}
