//! `RATELIMIT.CHECKALL`'s arguments: its keys, then one limit spec per key.

use crate::algorithms::Algorithm;
use crate::error::ArgError;
use crate::few::{Few, FEW_KEYS};
use crate::integer::parse_integer;

use super::check::parse_call;
use super::spec::{
    finish_spec, is_policy, option, option_name, parse_rate_head, spec_start, LimitArg, OptionName,
    OptionValues,
};
use super::words::{is_one_argument_spec, push_spec_words};

/// How many words a CHECKALL reads inline once its one-argument specs are split (as the
/// command's arguments: numkeys, eight keys, eight specs of up to five words, COST, AT, room).
pub const CHECKALL_WORDS: usize = 64;

/// `RATELIMIT.CHECKALL` arguments after the command name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckAllArgs<'a> {
    /// How many keys follow `numkeys` (at least 1); they are arguments `2 ..= numkeys + 1`.
    pub numkeys: usize,
    /// One limit per key, in the keys' order (inline up to [`FEW_KEYS`]).
    pub specs: Few<LimitArg<'a>, FEW_KEYS>,
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
pub(super) fn count_specs(args: &[&[u8]]) -> usize {
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
    let mut specs = Few::new();
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

/// Where a CHECKALL's one-argument specs would be: after its keys, from `Some(first)` on, if
/// numkeys is valid and some argument there holds a space (else `None`: nothing to split, and the
/// parser names a bad numkeys).
#[inline(always)]
pub fn one_argument_specs_from(args: &[&[u8]]) -> Option<usize> {
    let (numkeys, rest) = args.split_first()?;
    let numkeys = parse_integer(numkeys).filter(|n| *n >= 1 && *n < rest.len() as u64)?;
    let first = 1 + numkeys as usize;
    args[first..]
        .iter()
        .any(|arg| is_one_argument_spec(arg))
        .then_some(first)
}

/// Reads a CHECKALL's arguments (numkeys first) with `read`: as they are, or with each
/// one-argument spec split into its words ([`split_checkall`]). The error is a malformed
/// one-argument spec's, in the spec it is (none past the keys' count), its position in `args`.
#[inline(always)]
pub fn read_checkall<'a, T>(
    args: &[&'a [u8]],
    read: impl FnOnce(&[&'a [u8]]) -> T,
) -> Result<T, CheckAllError> {
    let Some(first) = one_argument_specs_from(args) else {
        return Ok(read(args));
    };
    let mut words: Few<&'a [u8], CHECKALL_WORDS> = Few::new();
    split_checkall(args, first, &mut words)?;
    Ok(read(&words))
}

/// `args` into `words`, with every one-argument spec after the keys (from `first` on, see
/// [`one_argument_specs_from`]) split into its words (see `words`). Specs start after the keys,
/// and then wherever the grammar reads one (as `count_specs` does: an option name and its
/// value, else a spec, of one argument, or `POLICY name`, or three words).
pub fn split_checkall<'a, const N: usize>(
    args: &[&'a [u8]],
    first: usize,
    words: &mut Few<&'a [u8], N>,
) -> Result<(), CheckAllError> {
    let numkeys = first - 1;
    for &arg in &args[..first] {
        words.push(arg);
    }
    let (mut i, mut spec) = (first, 0);
    while let Some(&word) = args.get(i) {
        let taken = if option(word).is_some() {
            2
        } else {
            spec += 1;
            if is_one_argument_spec(word) {
                push_spec_words(word, i, words).map_err(|error| CheckAllError {
                    error,
                    spec: (spec <= numkeys).then_some(spec),
                })?;
                i += 1;
                continue;
            }
            if is_policy(word) {
                2
            } else {
                3
            }
        };
        for &arg in args.iter().skip(i).take(taken) {
            words.push(arg);
        }
        i += taken;
    }
    Ok(())
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
