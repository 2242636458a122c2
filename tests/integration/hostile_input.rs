//! Hostile input: thousands of random argument vectors (huge and negative numbers, NUL bytes,
//! non-UTF-8, duplicated options, wrong arity) get an error or a valid reply, never a crash, and
//! no error creates a key; RATELIMIT.APPLY cannot grow a sliding log past `max-log-limit` (a
//! client's, not the master's stream or an AOF replay); a RESTORE of a corrupt limiter with a
//! valid checksum is refused, and so are APPLY and RESTORE of states no command could have
//! stored (a count above the limit, a level above the capacity, a TAT beyond the tolerance).
//!
//! The argument parser and the codec are also fuzzed with libFuzzer (fuzz/).
//! `HARDENING_SEED=<n>` (decimal or 0x hex) replays a randomized run; the seed is printed.
//!
//! One file per subject: `arguments` (random argument vectors), `log_limit` (APPLY and
//! `max-log-limit`), `states` (corrupt and impossible limiter states through RESTORE and APPLY)
//! and `lease_sets` (crafted lease sets).

mod arguments;
mod lease_sets;
mod log_limit;
mod states;

use crate::common;
use common::dump::Dump;
use redis::Connection;

fn le(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `DUMP key`, taken apart; its limiter must begin with `head` and be `len` bytes long.
fn dump(con: &mut Connection, key: &str, head: &[u8], len: usize) -> (Vec<u8>, Dump) {
    let payload: Vec<u8> = redis::cmd("DUMP").arg(key).query(con).expect("DUMP");
    let dump = Dump::parse(&payload);
    assert!(
        dump.limiter.starts_with(head) && dump.limiter.len() == len,
        "{key}: the limiter's layout: {:?}",
        dump.limiter
    );
    (payload, dump)
}
