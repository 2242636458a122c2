//! Argument parsing: pure functions over byte slices, so they can be fuzzed without Redis.
//!
//! One file per command family, over what they share (`spec.rs`: a limit spec, a period, the
//! options and their values): `check.rs` (CHECK, PEEK, REFUND, TAKE), `checkall.rs`,
//! `lease.rs` (ACQUIRE, RELEASE), `policy.rs` (POLICY SET). Every parser is named here.

mod check;
mod checkall;
mod lease;
mod policy;
mod spec;

pub use check::{parse_call, parse_check, parse_refund, parse_take, CallArgs, CheckArgs};
pub use checkall::{parse_checkall, parse_numkeys, CheckAllArgs, CheckAllError};
pub use lease::{parse_acquire, parse_release, AcquireArgs, LeaseLimit, ReleaseArgs, LEASE_ID_MAX};
pub use policy::{parse_policy_set, PolicyDefinition};
pub use spec::{parse_period, LimitArg, LimitSpec};

#[cfg(test)]
mod tests;
