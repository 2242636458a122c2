//! The concurrency phase: the cost per call of `RATELIMIT.ACQUIRE` and `RATELIMIT.RELEASE` with
//! 10, 1,000 and 100,000 live leases on one key, and the memory one lease takes.

use std::time::Instant;

use crate::common::now_ms;
use crate::model::*;
use crate::parse::{parse_cmdstat, Summary};
use crate::resp;
use crate::Bench;

/// The limit of the measured keys: never reached, so every ACQUIRE is admitted.
const LEASE_LIMIT: u64 = 1_000_000_000_000;
/// Leases of a day: none expires during the run.
const LEASE_MS: u64 = 86_400_000;

/// `RATELIMIT.ACQUIRE key LEASE_LIMIT LEASE_MS ID id AT at`.
fn acquire(key: &str, id: &str, at: u64) -> Vec<String> {
    [
        "RATELIMIT.ACQUIRE",
        key,
        &LEASE_LIMIT.to_string(),
        &LEASE_MS.to_string(),
        "ID",
        id,
        "AT",
        &at.to_string(),
    ]
    .map(String::from)
    .to_vec()
}

fn release(key: &str, id: &str, at: u64) -> Vec<String> {
    ["RATELIMIT.RELEASE", key, "ID", id, "AT", &at.to_string()]
        .map(String::from)
        .to_vec()
}

/// A 16-byte id, as a request id would be.
fn id(prefix: char, i: u64) -> String {
    format!("{prefix}{i:015}")
}

impl Bench<'_> {
    /// Per number of live leases: usec_per_call of an ACQUIRE of a new id followed by the
    /// RELEASE of it (the set stays at `n`), and of a renewal of a held lease; then the bytes a
    /// lease of a 16-byte id takes at the largest `n`.
    pub(crate) fn lease_phase(&mut self) -> Result<Vec<LeaseScalingResult>, String> {
        self.flushall()?;
        // Room for the one lease the measured calls add beside the largest set.
        self.query::<()>(
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("ratelimit.max-leases")
                .arg(1_000_000),
        )?;
        let base = now_ms() + 3_600_000;
        let calls = self.config.log_calls;
        let sizes = [10u64, 1_000, 100_000];
        let mut results = Vec::new();
        for &n in &sizes {
            let key = format!("lease:{n}");
            let filling = Instant::now();
            let k = key.clone();
            self.pipeline(n, Some(1), move |i, buf| {
                resp::encode(buf, &acquire(&k, &id('f', i), base))
            })?;
            let mut samples: [Vec<f64>; 3] = Default::default();
            for rep in 0..self.config.reps as u64 {
                let at = base + 1 + rep;
                // A new lease, then its release: 2 calls per i.
                let k = key.clone();
                self.resetstat()?;
                self.pipeline(2 * calls, Some(1), move |i, buf| {
                    let new = id('b', i / 2);
                    if i % 2 == 0 {
                        resp::encode(buf, &acquire(&k, &new, at))
                    } else {
                        resp::encode(buf, &release(&k, &new, at))
                    }
                })?;
                let stats = self.info("commandstats")?;
                for (slot, name) in [(0, "ratelimit.acquire"), (1, "ratelimit.release")] {
                    let usec = parse_cmdstat(&stats, name)
                        .map(|s| s.usec_per_call)
                        .ok_or_else(|| format!("INFO commandstats has no cmdstat_{name}"))?;
                    samples[slot].push(usec);
                }
                // Renewals of held leases, spread over the set.
                let k = key.clone();
                self.resetstat()?;
                self.pipeline(calls, Some(1), move |i, buf| {
                    resp::encode(buf, &acquire(&k, &id('f', (i * 7919) % n), at))
                })?;
                let stats = self.info("commandstats")?;
                let usec = parse_cmdstat(&stats, "ratelimit.acquire")
                    .map(|s| s.usec_per_call)
                    .ok_or("INFO commandstats has no cmdstat_ratelimit.acquire")?;
                samples[2].push(usec);
            }
            eprintln!(
                "bench:   leases: {n} live leases filled and measured in {:.1}s",
                filling.elapsed().as_secs_f64()
            );
            let usage: u64 = self.query(redis::cmd("MEMORY").arg("USAGE").arg(&key))?;
            results.push(LeaseScalingResult {
                leases: n,
                acquire: Summary::of(&samples[0]),
                release: Summary::of(&samples[1]),
                renew: Summary::of(&samples[2]),
                memory_usage: usage,
                used_memory_per_lease: None,
            });
        }
        // used_memory over one key of the largest size, against an empty server.
        self.flushall()?;
        let empty = self.settled_used_memory(Side::Ours)?;
        let n = *sizes.last().unwrap_or(&1);
        self.pipeline(n, Some(1), move |i, buf| {
            resp::encode(buf, &acquire("lease:memory", &id('f', i), base))
        })?;
        let full = self.settled_used_memory(Side::Ours)?;
        if let Some(last) = results.last_mut() {
            last.used_memory_per_lease = Some(full.saturating_sub(empty) as f64 / n as f64);
        }
        self.flushall()?;
        self.query::<()>(
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("ratelimit.max-leases")
                .arg(100_000),
        )?;
        Ok(results)
    }
}
