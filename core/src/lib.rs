//! The core of redis-ratelimit: everything the module does that needs no Redis API.
//!
//! - [`algorithms`]: the rate-limiting state machines, pure `(state, params, now, cost) ->
//!   Decision`, and the leases of the concurrency limit;
//! - [`parse`], [`integer`]: the commands' arguments read from byte slices;
//! - [`error`]: the text of every error reply;
//! - [`few`]: the short lists of a command of several keys, inline up to [`few::FEW_KEYS`];
//! - [`policy`]: named policies, their modes and counters;
//! - [`value`], [`compact`], [`codec`]: a stored limiter's forms in memory (a 32-byte value, one
//!   word per key beside a shared entry) and its one binary encoding (RDB, AOF, replication).
//!
//! The module (the root crate) adds the Redis glue: commands, the data type, configs, INFO.
//! The fuzz targets and the integration tests' kit use this crate directly.

pub mod algorithms;
pub mod codec;
pub mod compact;
pub mod error;
pub mod few;
pub mod integer;
pub mod parse;
pub mod policy;
pub mod value;
