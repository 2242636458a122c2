//! `ratelimit_acquire` and `ratelimit_release` answer as `RATELIMIT.ACQUIRE` and
//! `RATELIMIT.RELEASE`: on seeded random sequences (renewals with other costs, releases, expiry,
//! times going backwards and near 2^53, costs above the limit, limits changing, many ids, long
//! and binary ids), on docs/algorithms.md's worked table, in their errors; calls that change
//! nothing write nothing; racing clients never hold more than the limit; a key holds at most
//! 100000 live leases; what a lease costs in memory.
//!
//! The helpers both engines are driven through are here; the tests, one file per subject:
//! `sequences` (random sequences and the worked table), `writes` (what writes, MULTI,
//! maxmemory and the function flags), `errors` (wrong keys and bad arguments) and `limits`
//! (racing clients, the most leases a key holds, memory).

mod errors;
mod limits;
mod sequences;
mod writes;

use crate::common::rng::Rng;
use redis::Cmd;

/// The two engines.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Engine {
    Module,
    Library,
}

/// `RATELIMIT.<COMMAND> key args` or `FCALL ratelimit_<command> 1 key args` (binary arguments).
fn lease_cmd(engine: Engine, command: &str, key: &str, args: &[Vec<u8>]) -> Cmd {
    let mut cmd = match engine {
        Engine::Module => redis::cmd(&format!("RATELIMIT.{}", command.to_uppercase())),
        Engine::Library => {
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(format!("ratelimit_{command}")).arg(1);
            cmd
        }
    };
    cmd.arg(key);
    for arg in args {
        cmd.arg(arg.as_slice());
    }
    cmd
}

/// `limit duration ID id [COST n] [AT t]` as the module's tests spell it.
fn acquire_args(
    limit: u64,
    duration_ms: u64,
    id: &[u8],
    cost: u64,
    at: Option<u64>,
) -> Vec<Vec<u8>> {
    let mut args = vec![
        limit.to_string().into_bytes(),
        duration_ms.to_string().into_bytes(),
        b"ID".to_vec(),
        id.to_vec(),
        b"COST".to_vec(),
        cost.to_string().into_bytes(),
    ];
    if let Some(at) = at {
        args.extend([b"AT".to_vec(), at.to_string().into_bytes()]);
    }
    args
}

fn release_args(id: &[u8], at: Option<u64>) -> Vec<Vec<u8>> {
    let mut args = vec![b"ID".to_vec(), id.to_vec()];
    if let Some(at) = at {
        args.extend([b"AT".to_vec(), at.to_string().into_bytes()]);
    }
    args
}

/// The library's ACQUIRE and RELEASE with the module's test signatures (tests/integration/leases.rs).
fn library_acquire(key: &str, limit: u64, d: u64, id: &[u8], cost: u64, at: Option<u64>) -> Cmd {
    lease_cmd(
        Engine::Library,
        "acquire",
        key,
        &acquire_args(limit, d, id, cost, at),
    )
}

fn library_release(key: &str, id: &[u8], at: Option<u64>) -> Cmd {
    lease_cmd(Engine::Library, "release", key, &release_args(id, at))
}

/// `id`, `Id`, `ID`...: option names are case-insensitive.
fn spelled(rng: &mut Rng, word: &str) -> Vec<u8> {
    match rng.below(3) {
        0 => word.to_lowercase().into_bytes(),
        1 => word.to_uppercase().into_bytes(),
        _ => word
            .chars()
            .enumerate()
            .map(|(i, c)| {
                if i == 0 {
                    c.to_ascii_uppercase()
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect::<String>()
            .into_bytes(),
    }
}

/// A lease duration as clients write it: ms, or with a unit when it is a whole one.
fn duration_arg(rng: &mut Rng, ms: u64) -> Vec<u8> {
    let text = if ms % 1000 == 0 && rng.chance(40) {
        format!("{}{}", ms / 1000, if rng.chance(50) { "s" } else { "S" })
    } else if rng.chance(20) {
        format!("{ms}ms")
    } else {
        ms.to_string()
    };
    text.into_bytes()
}

/// Options in a random order, names in any case.
fn options(rng: &mut Rng, pairs: Vec<(&str, Vec<u8>)>) -> Vec<Vec<u8>> {
    let mut pairs = pairs;
    rng.shuffle(&mut pairs);
    pairs
        .into_iter()
        .flat_map(|(name, value)| [spelled(rng, name), value])
        .collect()
}
