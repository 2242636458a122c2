//! The Redis Functions library `lua-reference/functions/ratelimit.lua` (the module's commands
//! for servers that cannot load modules) against the module itself, on real servers.
//!
//! - Equivalence (tests/integration/functions/equivalence.rs): one server with both engines, the module on
//!   keys `n:...` and the library on keys `f:...`. Seeded random sequences with `AT` (every
//!   algorithm the library has, parameter changes, COST 0, costs above the capacity, same-ms runs,
//!   times going backwards, times just below 2^53; the generator of tests/integration/equivalence.rs) get the
//!   same PEEK and CHECK replies, the same `PEXPIRETIME` after every call and the same INFO at the
//!   end. gcra's theoretical arrival time is kept as a time through parameter changes, also
//!   2^53 scaled units and more ahead. Without `AT` both engines stay consistent on the same
//!   workload (equal decisions and `remaining`, durations within the time between the calls).
//! - CHECKALL (checkall.rs): random CHECKALLs (keys named more than once, mixed algorithms, wrong
//!   algorithms) get the same replies and expiries.
//! - BLOCK (block.rs, and with BLOCK in the random sequences of equivalence.rs, checkall.rs and
//!   refund.rs): a block's start, its replies (PEEK, COST 0, other parameters, calls without
//!   BLOCK), REFUND during it, its end, its expiry, INFO's `blocked_until_ms`, blocks in
//!   CHECKALL, long logs, blocks ending past 2^53.
//! - REFUND (refund.rs): the random sequences with refunds between their calls (random costs,
//!   more than was consumed, COST 0, missing keys, other parameters than the stored ones, times
//!   going backwards) and long sliding logs refunded and extended again get the same REFUND, PEEK
//!   and CHECK replies, expiries, key existence and INFO; an admitted CHECK followed by a REFUND
//!   of its cost leaves every PEEK as before it, and the key absent where it was fresh.
//! - Replication as effects (replication.rs): a replica's keys (value and absolute expiry) equal
//!   the master's; FCALL_RO of peek and info works on the replica, of check does not; calls that
//!   change nothing write nothing, calls on a blocked key neither; a block replicates.
//! - MULTI, ACL key patterns, `maxmemory` (contexts.rs): OOM refuses check, peek still answers.
//! - Errors (errors.rs): every bad argument gets the module's message (with the function's name
//!   for the command's); keys of the other engine or type are `WRONGTYPE`.
//! - Memory (memory.rs): bytes per key and per sliding-log entry against the module and the
//!   seed's ZSET (printed with `--nocapture`).
//! - Redis Cluster (cluster.rs): 3 masters with the module, the library loaded on each; every
//!   function through a cluster client on keys of every master, CHECKALL on hash-tagged keys,
//!   `CROSSSLOT` for keys in different slots, every reply the module's.
//!
//! - TAKE (take.rs): random sequences of TAKE and CHECK of every algorithm, BLOCK among them, get
//!   the same replies, expiries and INFO from `ratelimit_take` as from `RATELIMIT.TAKE`; its bad
//!   arguments the same errors.
//! - The payload (payload.rs): the committed lua-reference/functions/ratelimit.lua is what its
//!   parts (lua-reference/functions/src/) and the module's error texts assemble to.
//!
//! The engines and calls to them are in engines.rs, limits spelled as clients spell them in
//! limits.rs. `FUNCTIONS_SEED=<n>` (decimal or 0x-hex) replays another seed, `FUNCTIONS_CALLS=<n>`
//! sets the calls per algorithm of the equivalence run (default 4000).

mod block;
mod checkall;
mod cluster;
mod contexts;
mod engines;
mod equivalence;
mod errors;
mod leases;
mod limits;
mod memory;
mod payload;
mod refund;
mod replication;
mod take;

/// Lua doubles are exact below 2^53: the library (like the reference scripts) refuses bucket
/// `C·P` and sliding-window `L·P` at or above it. Bounds the generated limits.
const EXACT: u64 = 1 << 53;
