//! The arguments of ACQUIRE and RELEASE.

use crate::algorithms::Params;
use crate::error::{ArgError, Options as Expected};

use super::spec::{amount, is_policy, option_value, parse_period, OptionName};

/// The limit an ACQUIRE applies: written out (`limit lease-duration`), or a policy's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseLimit<'a> {
    /// `limit` and `period_ms` the lease duration.
    Inline(Params),
    /// `POLICY name`: the name as given (looked up, and checked, by the command).
    Policy(&'a [u8]),
}

/// `RATELIMIT.ACQUIRE` arguments after the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcquireArgs<'a> {
    pub limit: LeaseLimit<'a>,
    /// `ID`: the lease id, 1 to 128 bytes.
    pub id: &'a [u8],
    /// `COST`: 1 to 10^12, default 1.
    pub cost: u64,
    pub at_ms: Option<u64>,
}

/// `RATELIMIT.RELEASE` arguments after the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReleaseArgs<'a> {
    pub id: &'a [u8],
    pub at_ms: Option<u64>,
}

/// The options of ACQUIRE and RELEASE, recognised case-insensitively.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum LeaseOption {
    Id,
    Cost,
    At,
}

/// `ID lease-id`, `COST n` and `AT unix-ms` from `args[i..]` in pairs, in any order, each once;
/// `with_cost`: COST is one of them (ACQUIRE's, not RELEASE's).
pub(super) fn lease_options<'a>(
    args: &[&'a [u8]],
    mut i: usize,
    with_cost: bool,
) -> Result<LeaseOptions<'a>, ArgError> {
    let (mut id, mut cost, mut at) = (None, None, None);
    while let Some(word) = args.get(i) {
        let option = [
            (LeaseOption::Id, "ID"),
            (LeaseOption::Cost, "COST"),
            (LeaseOption::At, "AT"),
        ]
        .into_iter()
        .find(|(_, name)| name.as_bytes().eq_ignore_ascii_case(word))
        .filter(|(option, _)| with_cost || *option != LeaseOption::Cost);
        let Some((option, name)) = option else {
            return Err(ArgError::UnknownOption {
                at: i,
                after_period: false,
                expected: if with_cost {
                    Expected::Acquire
                } else {
                    Expected::Release
                },
            });
        };
        let value = *args.get(i + 1).ok_or(ArgError::MissingValue(name))?;
        let duplicate = match option {
            LeaseOption::Id => {
                if !(1..=LEASE_ID_MAX).contains(&value.len()) {
                    return Err(ArgError::LeaseId);
                }
                id.replace(value).is_some()
            }
            LeaseOption::Cost => {
                let n = amount(value, 1, ArgError::LeaseCost)?;
                cost.replace(n).is_some()
            }
            LeaseOption::At => {
                let t = option_value(OptionName::At, value)?;
                at.replace(t).is_some()
            }
        };
        if duplicate {
            return Err(ArgError::Duplicate(name));
        }
        i += 2;
    }
    Ok(LeaseOptions {
        id: id.ok_or(ArgError::LeaseIdMissing)?,
        cost,
        at_ms: at,
    })
}

/// The options [`lease_options`] read: the id (required), `COST` and `AT` if given.
pub(super) struct LeaseOptions<'a> {
    id: &'a [u8],
    cost: Option<u64>,
    at_ms: Option<u64>,
}

/// The longest lease id.
pub const LEASE_ID_MAX: usize = 128;

/// `limit lease-duration ID lease-id [COST n] [AT unix-ms]` or
/// `POLICY name ID lease-id [COST n] [AT unix-ms]`, the options in any order, each once.
pub fn parse_acquire<'a>(args: &[&'a [u8]]) -> Result<AcquireArgs<'a>, ArgError> {
    let (limit, first_option) = match args {
        [word, name, ..] if is_policy(word) => (LeaseLimit::Policy(name), 2),
        [word] if is_policy(word) => return Err(ArgError::WrongArity),
        [limit, duration, ..] => {
            let limit = amount(limit, 1, ArgError::Limit)?;
            let lease_ms = parse_period(duration).ok_or(ArgError::LeaseDuration)?;
            (LeaseLimit::Inline(Params::new(limit, lease_ms, None)?), 2)
        }
        _ => return Err(ArgError::WrongArity),
    };
    let options = lease_options(args, first_option, true)?;
    Ok(AcquireArgs {
        limit,
        id: options.id,
        cost: options.cost.unwrap_or(1),
        at_ms: options.at_ms,
    })
}

/// `ID lease-id [AT unix-ms]`, in any order, each once.
pub fn parse_release<'a>(args: &[&'a [u8]]) -> Result<ReleaseArgs<'a>, ArgError> {
    if args.is_empty() {
        return Err(ArgError::WrongArity);
    }
    let options = lease_options(args, 0, false)?;
    Ok(ReleaseArgs {
        id: options.id,
        at_ms: options.at_ms,
    })
}
