//! Argument parsing: pure functions over byte slices, so they can be fuzzed without Redis.

use crate::algorithms::{Algorithm, Kind, Params, MAX_AMOUNT, MAX_PERIOD_MS, TIME_LIMIT_MS};
use crate::error::{ArgError, Options as Expected};
use crate::policy;

/// One limit: the algorithm and its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitSpec {
    pub algorithm: Algorithm,
    pub params: Params,
    /// `BLOCK duration`, in ms: how long a rejection blocks the key (see `algorithms::block`).
    pub block_ms: Option<u64>,
}

/// `RATELIMIT.CHECK` / `PEEK` arguments after the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckArgs {
    pub spec: LimitSpec,
    pub cost: u64,
    /// `AT`: evaluate at this time instead of the server's clock.
    pub at_ms: Option<u64>,
}

/// Kept here for the commands' callers: the function lives in the leaf `integer.rs`.
pub use crate::integer::parse_integer;

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
fn amount(bytes: &[u8], min: u64, error: ArgError) -> Result<u64, ArgError> {
    parse_integer(bytes)
        .filter(|value| (min..=MAX_AMOUNT).contains(value))
        .ok_or(error)
}

/// `kind limit period` at the front of `args` (`kind`: an algorithm, or `concurrency`).
#[inline(always)]
fn parse_spec_head(args: &[&[u8]]) -> Result<(Kind, u64, u64), ArgError> {
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
fn finish_params(
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
fn finish_spec(
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
enum OptionName {
    Burst,
    Block,
    Cost,
    At,
}

fn option(name: &[u8]) -> Option<OptionName> {
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

fn option_name(option: OptionName) -> &'static str {
    match option {
        OptionName::Burst => "BURST",
        OptionName::Block => "BLOCK",
        OptionName::Cost => "COST",
        OptionName::At => "AT",
    }
}

/// The value of one option, checked for its range.
fn option_value(option: OptionName, bytes: &[u8]) -> Result<u64, ArgError> {
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
struct OptionValues {
    burst: Option<u64>,
    block_ms: Option<u64>,
    cost: Option<u64>,
    at_ms: Option<u64>,
}

impl OptionValues {
    fn set(&mut self, option: OptionName, bytes: Option<&&[u8]>) -> Result<(), ArgError> {
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
fn parse_rate_head(args: &[&[u8]]) -> Result<(Algorithm, u64, u64), ArgError> {
    match parse_spec_head(args)? {
        (Kind::Rate(algorithm), limit, period_ms) => Ok((algorithm, limit, period_ms)),
        (Kind::Leases, ..) => Err(ArgError::ConcurrencyCall),
    }
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

/// The limit a call applies: written out, or a policy's, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitArg<'a> {
    Inline(LimitSpec),
    /// `POLICY name`: the name as given (looked up, and checked, by the command).
    Policy(&'a [u8]),
}

/// `RATELIMIT.CHECK` / `PEEK` arguments after the key, with a limit spec or a policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallArgs<'a> {
    pub limit: LimitArg<'a>,
    pub cost: u64,
    /// `AT`: evaluate at this time instead of the server's clock.
    pub at_ms: Option<u64>,
}

/// `POLICY`, the word that starts a spec naming a policy (case-insensitive).
fn is_policy(word: &[u8]) -> bool {
    word.eq_ignore_ascii_case(b"POLICY")
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
    let mut words = args.to_vec();
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
enum LeaseOption {
    Id,
    Cost,
    At,
}

/// `ID lease-id`, `COST n` and `AT unix-ms` from `args[i..]` in pairs, in any order, each once;
/// `with_cost`: COST is one of them (ACQUIRE's, not RELEASE's).
fn lease_options<'a>(
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
struct LeaseOptions<'a> {
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

/// `RATELIMIT.CHECKALL` arguments after the command name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckAllArgs<'a> {
    /// How many keys follow `numkeys` (at least 1); they are arguments `2 ..= numkeys + 1`.
    pub numkeys: usize,
    /// One limit per key, in the keys' order.
    pub specs: Vec<LimitArg<'a>>,
    /// The shared `COST`.
    pub cost: u64,
    /// The shared `AT`.
    pub at_ms: Option<u64>,
}

/// `numkeys` of a CHECKALL, given how many arguments follow it: an integer from 1 to the number
/// of keys given (some argument must follow the keys).
pub fn parse_numkeys(numkeys: &[u8], after: usize) -> Result<usize, ArgError> {
    parse_integer(numkeys)
        .filter(|n| *n >= 1 && *n < after as u64)
        .map(|n| n as usize)
        .ok_or(ArgError::NumKeys)
}

/// How many limit specs the arguments after a CHECKALL's keys hold, read as the grammar reads
/// them: an option name (`BURST`, `COST`, `AT`) and its value, or a spec's three arguments.
fn count_specs(args: &[&[u8]]) -> usize {
    let (mut specs, mut i) = (0, 0);
    while let Some(word) = args.get(i) {
        if option(word).is_some() {
            i += 2;
        } else {
            specs += 1;
            i += if is_policy(word) { 2 } else { 3 };
        }
    }
    specs
}

/// `numkeys key [key ...] spec [spec ...] [COST cost] [AT unix-ms]`, where each spec is
/// `algorithm limit period [BURST capacity]` or `POLICY name`.
///
/// One spec per key, in order. Every spec but the last is `algorithm limit period` with an
/// optional `BURST capacity` right after it, or `POLICY name`; the last spec and the shared
/// options follow the grammar of [`parse_call`] exactly (options in any order, each once), so a
/// CHECKALL of one key takes the very arguments a CHECK takes after its key.
pub fn parse_checkall<'a>(
    args: &[&'a [u8]],
    max_log_limit: u64,
) -> Result<CheckAllArgs<'a>, CheckAllError> {
    let Some((numkeys, rest)) = args.split_first() else {
        return Err(ArgError::WrongArity.into());
    };
    // A numkeys that is no count at all is named first, whatever follows it.
    if parse_integer(numkeys).is_none_or(|n| n == 0) {
        return Err(ArgError::NumKeys.into());
    }
    // A key and the shortest spec (`POLICY name`).
    if rest.len() < 3 {
        return Err(ArgError::WrongArity.into());
    }
    let numkeys = parse_numkeys(numkeys, rest.len())?;
    // Too few arguments for one spec a key, or the options where a spec should be: say how many
    // specs there are (a spec whose own arguments are missing is a wrong number of arguments).
    let wrong_count = |error: ArgError| match count_specs(&rest[numkeys..]) {
        specs if error == ArgError::WrongArity && specs != numkeys => ArgError::SpecCount {
            keys: numkeys,
            specs,
        },
        _ => error,
    };
    if numkeys * 3 > rest.len() {
        return Err(wrong_count(ArgError::WrongArity).into());
    }
    let mut specs = Vec::with_capacity(numkeys);
    let mut i = numkeys;
    // The spec before ended with its period (no BURST or BLOCK, not a policy): the hint of an
    // unknown algorithm right after it.
    let mut after_period = false;
    for spec in 1..numkeys {
        // Positions in `args`, whose first argument is numkeys.
        let offset = 1 + i;
        let in_spec = move |error: ArgError| CheckAllError::in_spec(error.shifted(offset), spec);
        let head = spec_start(&rest[i..])
            .map_err(|error| CheckAllError::in_spec(wrong_count(error), spec - 1))?;
        if head.first().is_some_and(|word| is_policy(word)) {
            let name = head
                .get(1)
                .ok_or_else(|| CheckAllError::in_spec(wrong_count(ArgError::WrongArity), spec))?;
            specs.push(LimitArg::Policy(name));
            i += 2;
            after_period = false;
            if let Some(option @ (OptionName::Burst | OptionName::Block)) =
                rest.get(i).and_then(|word| option(word))
            {
                return Err(in_spec(ArgError::OptionWithPolicy(option_name(option))));
            }
            continue;
        }
        let (algorithm, limit, period_ms) = parse_rate_head(head).map_err(|error| match error {
            ArgError::UnknownAlgorithm { at, .. } => {
                in_spec(ArgError::UnknownAlgorithm { at, after_period })
            }
            error => in_spec(error),
        })?;
        i += 3;
        after_period = true;
        // The spec's own options, right after its period, each once: BURST and BLOCK.
        let mut options = OptionValues::default();
        while let Some(option @ (OptionName::Burst | OptionName::Block)) =
            rest.get(i).and_then(|name| option(name))
        {
            options.set(option, rest.get(i + 1)).map_err(in_spec)?;
            i += 2;
            after_period = false;
        }
        let spec = finish_spec(
            algorithm,
            limit,
            period_ms,
            (options.burst, options.block_ms),
            max_log_limit,
        )
        .map_err(in_spec)?;
        specs.push(LimitArg::Inline(spec));
    }
    let tail = spec_start(&rest[i..])
        .map_err(|error| CheckAllError::in_spec(wrong_count(error), numkeys - 1))?;
    let last = parse_call(tail, max_log_limit).map_err(|error| match error.shifted(1 + i) {
        // Another spec after the last one: more specs than keys.
        ArgError::UnknownOption { at, .. }
            if Algorithm::parse(args[at]).is_some() || is_policy(args[at]) =>
        {
            ArgError::SpecCount {
                keys: numkeys,
                specs: count_specs(&rest[numkeys..]),
            }
            .into()
        }
        // The shared options and what follows the last spec belong to no spec.
        error @ (ArgError::Cost
        | ArgError::At
        | ArgError::UnknownOption { .. }
        | ArgError::MissingValue("COST" | "AT")
        | ArgError::Duplicate("COST" | "AT")) => error.into(),
        ArgError::UnknownAlgorithm { at, .. } => {
            CheckAllError::in_spec(ArgError::UnknownAlgorithm { at, after_period }, numkeys)
        }
        error => CheckAllError::in_spec(error, numkeys),
    })?;
    specs.push(last.limit);
    Ok(CheckAllArgs {
        numkeys,
        specs,
        cost: last.cost,
        at_ms: last.at_ms,
    })
}

/// A CHECKALL argument error, with the limit spec it is in (numbered from 1, as the keys are).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckAllError {
    pub error: ArgError,
    pub spec: Option<usize>,
}

impl CheckAllError {
    /// `error` in spec `spec` (0: not in a spec; a wrong arity or count of specs is never a
    /// spec's).
    fn in_spec(error: ArgError, spec: usize) -> CheckAllError {
        let whole = matches!(error, ArgError::WrongArity | ArgError::SpecCount { .. });
        let spec = (spec > 0 && !whole).then_some(spec);
        CheckAllError { error, spec }
    }

    /// The error reply; one in a spec names the spec and its key (`args` as parsed, numkeys
    /// first), e.g. `ERR limit spec 2 (key 'b'): BURST applies only to ...`.
    pub fn message(&self, command: &str, args: &[&[u8]]) -> String {
        let message = self.error.message(command, args);
        let Some(spec) = self.spec else {
            return message;
        };
        let key = String::from_utf8_lossy(args.get(spec).copied().unwrap_or_default());
        let what = message.strip_prefix("ERR ").unwrap_or(&message);
        format!("ERR limit spec {spec} (key '{key}'): {what}")
    }
}

impl From<ArgError> for CheckAllError {
    fn from(error: ArgError) -> CheckAllError {
        CheckAllError { error, spec: None }
    }
}

/// Where a spec must start. `COST` or `AT` there means a spec is missing.
fn spec_start<'a, 'b>(args: &'a [&'b [u8]]) -> Result<&'a [&'b [u8]], ArgError> {
    match args.first().and_then(|name| option(name)) {
        Some(OptionName::Cost | OptionName::At) => Err(ArgError::WrongArity),
        _ => Ok(args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<CheckArgs, ArgError> {
        let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        parse_check(&args, 100_000)
    }

    #[test]
    fn algorithm_names_are_whole_and_case_insensitive() {
        for kind in Kind::EVERY {
            let name = kind.name();
            assert_eq!(Kind::parse(name.as_bytes()), Some(kind));
            let upper = name.to_ascii_uppercase();
            assert_eq!(Kind::parse(upper.as_bytes()), Some(kind));
            // A prefix or an extension of a name is no name.
            assert_eq!(Kind::parse(&name.as_bytes()[..name.len() - 1]), None);
            assert_eq!(Kind::parse(format!("{name}s").as_bytes()), None);
        }
        for bad in [
            &b""[..],
            b"s",
            b"sliding",
            b"sliding-bucket",
            b"gcr",
            b"\xff",
            // The length and first letter of a name, another name's tail or a typo.
            b"token-window",
            b"leaky-window",
            b"fixed-bucket",
            b"sliding-windov",
            b"sliding-lag",
            b"gcrb",
            b"Tokenxbucket",
        ] {
            assert_eq!(Kind::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn algorithm_names_parse_as_a_linear_search_would() {
        let reference = |name: &[u8]| {
            Kind::EVERY
                .into_iter()
                .find(|a| a.name().as_bytes().eq_ignore_ascii_case(name))
        };
        for kind in Kind::EVERY {
            let name = kind.name().as_bytes();
            // What the fast comparison relies on: lowercase letters and '-', at most 16 bytes.
            assert!(name.len() <= 16);
            assert!(name.iter().all(|b| b.is_ascii_lowercase() || *b == b'-'));
            // Every byte value at every position, and every name at every other's length.
            for at in 0..name.len() {
                for byte in 0..=255u8 {
                    let mut changed = name.to_vec();
                    changed[at] = byte;
                    assert_eq!(Kind::parse(&changed), reference(&changed), "{changed:?}");
                }
            }
            for other in Kind::EVERY {
                let mut mixed = other.name().as_bytes().to_vec();
                mixed.resize(name.len(), b'-');
                assert_eq!(Kind::parse(&mixed), reference(&mixed), "{mixed:?}");
            }
        }
    }

    #[test]
    fn periods_take_units() {
        assert_eq!(parse_period(b"250"), Some(250));
        assert_eq!(parse_period(b"250ms"), Some(250));
        assert_eq!(parse_period(b"1s"), Some(1000));
        assert_eq!(parse_period(b"15M"), Some(900_000));
        assert_eq!(parse_period(b"1h"), Some(3_600_000));
        assert_eq!(parse_period(b"3650d"), Some(MAX_PERIOD_MS));
        for bad in [
            &b"0"[..],
            b"0s",
            b"3651d",
            b"s",
            b"1w",
            b"1 s",
            b"-1s",
            b"1.5s",
        ] {
            assert_eq!(parse_period(bad), None, "{bad:?}");
        }
    }

    proptest::proptest! {
        /// The per-call parsers agree with the standard library's reading of the same text.
        #[test]
        fn integers_and_periods_read_as_std_reads_them(
            digits in "[0-9]{0,25}",
            unit in proptest::sample::select(vec!["", "ms", "MS", "mS", "s", "S", "m", "h", "d", "D", "x", "sm", "msx", " s", "0s"]),
            noise in proptest::option::of("[-+ .a-z0-9]{1,3}"),
        ) {
            let text = format!("{digits}{}{unit}", noise.unwrap_or_default());
            let expected_integer = if text.bytes().all(|b| b.is_ascii_digit()) {
                text.parse::<u64>().ok()
            } else {
                None
            };
            proptest::prop_assert_eq!(parse_integer(text.as_bytes()), expected_integer);
            let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
            let scale = match text[split..].to_ascii_lowercase().as_str() {
                "" | "ms" => Some(1),
                "s" => Some(1_000),
                "m" => Some(60_000),
                "h" => Some(3_600_000),
                "d" => Some(86_400_000),
                _ => None,
            };
            let expected_period = scale
                .and_then(|scale| text[..split].parse::<u64>().ok()?.checked_mul(scale))
                .filter(|ms| (1..=MAX_PERIOD_MS).contains(ms));
            proptest::prop_assert_eq!(parse_period(text.as_bytes()), expected_period);
        }
    }

    #[test]
    fn options_come_in_any_order_once_each() {
        let args = parse("TOKEN-BUCKET 10 1s at 5 cost 2 burst 20").unwrap();
        assert_eq!(args.spec.algorithm, Algorithm::TokenBucket);
        assert_eq!(args.spec.params, Params::new(10, 1000, Some(20)).unwrap());
        assert_eq!((args.cost, args.at_ms), (2, Some(5)));
        assert_eq!(parse("fixed-window 10 1s").unwrap().cost, 1);
        assert_eq!(
            parse("fixed-window 10 1s COST 1 COST 2"),
            Err(ArgError::Duplicate("COST"))
        );
        assert_eq!(
            parse("fixed-window 10 1s COST"),
            Err(ArgError::MissingValue("COST"))
        );
        assert_eq!(
            parse("fixed-window 10 1s LIMIT 3"),
            Err(ArgError::UnknownOption {
                at: 3,
                after_period: true,
                expected: Expected::Call,
            })
        );
    }

    #[test]
    fn every_bad_argument_is_named() {
        assert_eq!(
            parse("gcra-bucket 10 1s"),
            Err(ArgError::UnknownAlgorithm {
                at: 0,
                after_period: false
            })
        );
        assert_eq!(parse("fixed-window 0 1s"), Err(ArgError::Limit));
        assert_eq!(parse("fixed-window 1000000000001 1s"), Err(ArgError::Limit));
        assert_eq!(parse("fixed-window 10 0"), Err(ArgError::Period));
        assert_eq!(
            parse("fixed-window 10 1s BURST 5"),
            Err(ArgError::BurstOnWindow)
        );
        assert_eq!(parse("token-bucket 10 1s BURST 0"), Err(ArgError::Burst));
        assert_eq!(parse("token-bucket 10 1s COST -1"), Err(ArgError::Cost));
        assert_eq!(
            parse("token-bucket 10 1s AT 9007199254740992"),
            Err(ArgError::At)
        );
        assert_eq!(parse("token-bucket 10"), Err(ArgError::WrongArity));
        assert_eq!(
            parse("sliding-log 100001 1s"),
            Err(ArgError::LogLimit {
                limit: 100_001,
                max: 100_000
            })
        );
        assert!(parse("token-bucket 1000000000000 3650d BURST 1000000000000 COST 1000000000000 AT 9007199254740991").is_ok());
    }

    fn parse_all(line: &str) -> Result<CheckAllArgs<'_>, ArgError> {
        parse_all_in_spec(line).map_err(|error| error.error)
    }

    fn parse_all_in_spec(line: &str) -> Result<CheckAllArgs<'_>, CheckAllError> {
        let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        parse_checkall(&args, 100_000)
    }

    #[test]
    fn checkall_takes_one_spec_per_key_then_shared_options() {
        let args = parse_all(
            "3 a b c token-bucket 10 1s BURST 20 fixed-window 100 1h sliding-log 5 1m AT 7 COST 2",
        )
        .unwrap();
        assert_eq!(args.numkeys, 3);
        assert_eq!(
            args.specs,
            [
                LimitArg::Inline(LimitSpec {
                    algorithm: Algorithm::TokenBucket,
                    params: Params::new(10, 1000, Some(20)).unwrap(),
                    block_ms: None,
                }),
                LimitArg::Inline(LimitSpec {
                    algorithm: Algorithm::FixedWindow,
                    params: Params::new(100, 3_600_000, None).unwrap(),
                    block_ms: None,
                }),
                LimitArg::Inline(LimitSpec {
                    algorithm: Algorithm::SlidingLog,
                    params: Params::new(5, 60_000, None).unwrap(),
                    block_ms: None,
                }),
            ]
        );
        assert_eq!((args.cost, args.at_ms), (2, Some(7)));
        // The last spec takes its BURST among the options, as CHECK does.
        let args = parse_all("2 a b fixed-window 1 1s leaky-bucket 3 1s COST 0 burst 9").unwrap();
        assert_eq!(
            args.specs[1],
            LimitArg::Inline(LimitSpec {
                algorithm: Algorithm::LeakyBucket,
                params: Params::new(3, 1000, Some(9)).unwrap(),
                block_ms: None,
            })
        );
        assert_eq!(args.cost, 0);
    }

    #[test]
    fn checkall_of_one_key_parses_like_check() {
        for tail in [
            "token-bucket 10 1s",
            "TOKEN-BUCKET 10 1s at 5 cost 2 burst 20",
            "fixed-window 10 1s COST 1 COST 2",
            "fixed-window 10 1s COST",
            "fixed-window 10 1s LIMIT 3",
            "fixed-window 10 1s BURST 5",
            "gcra 10 1s",
            "sliding-log 100001 1s",
            "token-bucket 10 1s AT 9007199254740992",
        ] {
            let check_args: Vec<&[u8]> = tail.split(' ').map(str::as_bytes).collect();
            let line = format!("1 k {tail}");
            let all_args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
            match (parse(tail), parse_checkall(&all_args, 100_000)) {
                (Ok(check), Ok(all)) => {
                    assert_eq!(all.specs, [LimitArg::Inline(check.spec)], "{tail}");
                    assert_eq!((all.cost, all.at_ms), (check.cost, check.at_ms), "{tail}");
                }
                (Err(check), Err(all)) => assert_eq!(
                    check.message("c", &check_args),
                    all.error.message("c", &all_args),
                    "{tail}"
                ),
                (check, all) => panic!("{tail}: {check:?} {all:?}"),
            }
        }
    }

    #[test]
    fn checkall_names_its_bad_arguments() {
        assert_eq!(parse_all("1 k fixed-window 1"), Err(ArgError::WrongArity));
        assert_eq!(parse_all("0 k fixed-window 1 1s"), Err(ArgError::NumKeys));
        assert_eq!(parse_all("-1 k fixed-window 1 1s"), Err(ArgError::NumKeys));
        assert_eq!(parse_all("x k fixed-window 1 1s"), Err(ArgError::NumKeys));
        assert_eq!(
            parse_all("3 a b fixed-window 1 1s fixed-window 1 1s"),
            Err(ArgError::SpecCount { keys: 3, specs: 2 })
        );
        assert_eq!(parse_all("9 a b c d"), Err(ArgError::NumKeys));
        // A missing spec: the options come where a spec should.
        assert_eq!(
            parse_all("2 a b fixed-window 1 1s COST 1 AT 5 x"),
            Err(ArgError::WrongArity)
        );
        assert_eq!(
            parse_all("2 a b fixed-window 1 1s fixed-window 1"),
            Err(ArgError::WrongArity)
        );
        assert_eq!(
            parse_all("2 a b token-bucket 1 1s BURST 2 BURST 3 fixed-window 1 1s"),
            Err(ArgError::Duplicate("BURST"))
        );
        assert_eq!(
            parse_all("2 a b fixed-window 1 1s BURST 2 fixed-window 1 1s"),
            Err(ArgError::BurstOnWindow)
        );
        assert_eq!(
            parse_all("2 a b token-bucket 1 1s BURST"),
            Err(ArgError::MissingValue("BURST"))
        );
        assert_eq!(
            parse_all("2 a b token-bucket 1 1s BURST x fixed-window 1 1s"),
            Err(ArgError::Burst)
        );
        assert_eq!(
            parse_all("2 a b gcr 1 1s fixed-window 1 1s"),
            Err(ArgError::UnknownAlgorithm {
                at: 3,
                after_period: false
            })
        );
        assert_eq!(
            parse_all("2 a b fixed-window 1 0 fixed-window 1 1s"),
            Err(ArgError::Period)
        );
        assert_eq!(
            parse_all("2 a b fixed-window 1 1s fixed-window 1 1s COST 1 COST 2"),
            Err(ArgError::Duplicate("COST"))
        );
        assert_eq!(
            parse_all("2 a b fixed-window 1 1s fixed-window 1 1s fixed-window 1 1s"),
            Err(ArgError::SpecCount { keys: 2, specs: 3 })
        );
        assert_eq!(
            parse_all("2 a b sliding-log 100001 1s fixed-window 1 1s"),
            Err(ArgError::LogLimit {
                limit: 100_001,
                max: 100_000
            })
        );
    }

    #[test]
    fn checkall_errors_name_the_spec_they_are_in() {
        let message = |line: &str| {
            let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
            parse_checkall(&args, 100_000)
                .unwrap_err()
                .message("ratelimit.checkall", &args)
        };
        assert_eq!(
            message("2 a b token-bucket 1 1s fixed-window 1 1s BURST 2"),
            "ERR limit spec 2 (key 'b'): BURST applies only to token-bucket, leaky-bucket and gcra"
        );
        assert_eq!(
            message("2 a b fixed-window 1 1s BURST 2 token-bucket 1 1s"),
            "ERR limit spec 1 (key 'a'): BURST applies only to token-bucket, leaky-bucket and gcra"
        );
        assert!(
            message("3 a b c fixed-window 1 1s fixed-window 0 1s fixed-window 1 1s")
                .starts_with("ERR limit spec 2 (key 'b'): limit must be")
        );
        assert!(message("2 a b fixed-window 1 1s sliding-logs 1 1s")
            .starts_with("ERR limit spec 2 (key 'b'): unknown algorithm"));
        assert_eq!(
            message("2 a b token-bucket 1 1s BURST 2 BURST 3 fixed-window 1 1s"),
            "ERR limit spec 1 (key 'a'): BURST given more than once"
        );
        // Shared options and arity belong to no spec.
        assert!(message("2 a b fixed-window 1 1s fixed-window 1 1s COST x").starts_with("ERR COST"));
        assert_eq!(
            message("2 a b fixed-window 1 1s fixed-window 1"),
            "ERR wrong number of arguments for 'ratelimit.checkall' command"
        );
        // numkeys is named before the arity is counted.
        assert!(message("0").starts_with("ERR numkeys"));
        assert!(message("0 k").starts_with("ERR numkeys"));
        assert!(message("x k fixed-window").starts_with("ERR numkeys"));
        assert_eq!(parse_all("1 k"), Err(ArgError::WrongArity));
    }

    #[test]
    fn unknown_words_are_named_and_a_unit_after_a_bare_period_is_explained() {
        let check = |line: &str| {
            let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
            parse_check(&args, 100_000)
                .unwrap_err()
                .message("ratelimit.check", &args)
        };
        assert_eq!(
            check("sliding-window 100 1 minute"),
            "ERR unknown option 'minute': expected BURST, BLOCK, COST or AT; a period takes its unit in \
             the same argument: 1m, not '1 minute'"
        );
        assert_eq!(
            check("fixed-window 5 15 Secs"),
            "ERR unknown option 'Secs': expected BURST, BLOCK, COST or AT; a period takes its unit in \
             the same argument: 15s, not '15 Secs'"
        );
        assert_eq!(
            check("fixed-window 5 15 fortnights"),
            "ERR unknown option 'fortnights': expected BURST, BLOCK, COST or AT; a period takes its unit \
             in the same argument: 15ms, 15s, 15m, 15h or 15d"
        );
        // No hint after a period with its unit, or after another option's value.
        assert_eq!(
            check("fixed-window 5 15s minute"),
            "ERR unknown option 'minute': expected BURST, BLOCK, COST or AT"
        );
        assert_eq!(
            check("fixed-window 5 15s COST 1 minute"),
            "ERR unknown option 'minute': expected BURST, BLOCK, COST or AT"
        );
        assert_eq!(
            check("sliding-windows 100 1m"),
            "ERR unknown algorithm 'sliding-windows': expected token-bucket, leaky-bucket, \
             fixed-window, sliding-window, sliding-log or gcra"
        );
        // Long or binary words are shown in part.
        let long = format!("fixed-window 5 1s {}\u{7}x", "y".repeat(40));
        assert_eq!(
            check(&long),
            format!(
                "ERR unknown option '{}...': expected BURST, BLOCK, COST or AT",
                "y".repeat(32)
            )
        );
        assert_eq!(
            check("fixed-window 5 1s a\u{1}b"),
            "ERR unknown option 'a?b': expected BURST, BLOCK, COST or AT"
        );
    }

    #[test]
    fn checkall_says_how_many_specs_it_found() {
        let message = |line: &str| {
            let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
            parse_checkall(&args, 100_000)
                .unwrap_err()
                .message("ratelimit.checkall", &args)
        };
        assert_eq!(
            message("2 a b sliding-window 100 1m"),
            "ERR 2 keys need 2 limit specs (one per key, in order); found 1"
        );
        assert_eq!(
            message("2 a b sliding-window 100 1m COST 2"),
            "ERR 2 keys need 2 limit specs (one per key, in order); found 1"
        );
        assert_eq!(
            message("1 a sliding-window 100 1m fixed-window 5 1s"),
            "ERR 1 key needs 1 limit spec (one per key, in order); found 2"
        );
        assert_eq!(
            message("3 a b c token-bucket 1 1s BURST 2 fixed-window 1 1h AT 5"),
            "ERR 3 keys need 3 limit specs (one per key, in order); found 2"
        );
        // A bare period in a spec that is not the last: its unit is taken for the next spec.
        assert_eq!(
            message("2 a b sliding-window 100 1 minute fixed-window 10 1h"),
            "ERR limit spec 2 (key 'b'): unknown algorithm 'minute': expected token-bucket, \
             leaky-bucket, fixed-window, sliding-window, sliding-log or gcra; a period takes its \
             unit in the same argument: 1m, not '1 minute'"
        );
        assert_eq!(
            message("2 a b fixed-window 100 1m fixed-window 10 1 hour"),
            "ERR unknown option 'hour': expected BURST, BLOCK, COST or AT; a period takes its unit in \
             the same argument: 1h, not '1 hour'"
        );
        // A spec whose own arguments are missing is still a wrong number of arguments.
        assert_eq!(
            message("2 a b fixed-window 1 1s fixed-window 1"),
            "ERR wrong number of arguments for 'ratelimit.checkall' command"
        );
    }

    #[test]
    fn numkeys_leaves_room_for_the_specs() {
        assert_eq!(parse_numkeys(b"1", 4), Ok(1));
        assert_eq!(parse_numkeys(b"2", 8), Ok(2));
        assert_eq!(parse_numkeys(b"2", 7), Ok(2));
        assert_eq!(parse_numkeys(b"7", 7), Err(ArgError::NumKeys));
        assert_eq!(parse_numkeys(b"0", 8), Err(ArgError::NumKeys));
        assert_eq!(parse_numkeys(b"+1", 8), Err(ArgError::NumKeys));
        assert_eq!(
            parse_numkeys(b"99999999999999999999", 8),
            Err(ArgError::NumKeys)
        );
    }
}
