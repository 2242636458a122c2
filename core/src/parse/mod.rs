//! Argument parsing: pure functions over byte slices, so they can be fuzzed without Redis.
//!
//! One file per command family, over what they share (`spec.rs`: a limit spec, a period, the
//! options and their values): `check.rs` (CHECK, PEEK, REFUND, TAKE), `checkall.rs`,
//! `lease.rs` (ACQUIRE, RELEASE), `policy.rs` (POLICY SET); `words.rs` splits a limit spec given
//! as one argument into its words, which the parsers then read. Every parser is named here.

mod check;
mod checkall;
mod lease;
mod policy;
mod spec;
mod words;

pub use check::{parse_call, parse_check, parse_refund, parse_take, CallArgs, CheckArgs};
pub use checkall::{
    one_argument_specs_from, parse_checkall, parse_numkeys, read_checkall, split_checkall,
    CheckAllArgs, CheckAllError, CHECKALL_WORDS,
};
pub use lease::{parse_acquire, parse_release, AcquireArgs, LeaseLimit, ReleaseArgs, LEASE_ID_MAX};
pub use policy::{parse_policy_set, PolicyDefinition};
pub use spec::{parse_period, LimitArg, LimitSpec};
pub use words::{is_one_argument_spec, read_call, split_call, CALL_WORDS};

#[cfg(test)]
mod tests;
