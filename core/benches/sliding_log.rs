//! `cargo bench -p redis-ratelimit-core --bench sliding_log`: the sliding log's decision, in the
//! cases of every rate algorithm (common/rate.rs), then as the log grows: a log of `L` entries at
//! distinct milliseconds, limit `L` per `L` ms, so that a consuming call one millisecond after the
//! newest entry drops the oldest and appends one (the log stays full), and a call at the newest
//! entry's millisecond is rejected. With each size, the heap bytes the log holds.

mod common;

use common::rate::{admitted, created, request, T0};
use redis_ratelimit_core::algorithms::{Algorithm, Limiter, State};

/// A log of `entries` entries, one a millisecond from [`T0`] on, limit `entries` per
/// `entries` ms: full.
fn full_log(entries: u64) -> Limiter {
    let mut limiter = created(&request(Algorithm::SlidingLog, entries, entries, T0));
    for i in 1..entries {
        let call = request(Algorithm::SlidingLog, entries, entries, T0 + i);
        assert!(admitted(Some(&mut limiter), &call, true));
    }
    limiter
}

fn main() {
    let mut bench = common::Bench::new("sliding-log");
    common::rate::cases(&mut bench, Algorithm::SlidingLog);
    let sizes: &[u64] = if bench.measuring() {
        &[10, 100, 1_000, 10_000, 100_000]
    } else {
        &[10, 1_000]
    };
    let mut memory = Vec::new();
    for &entries in sizes {
        let log = full_log(entries);
        if let State::SlidingLog(entries_of) = &log.state {
            memory.push(vec![
                entries.to_string(),
                entries_of.heap_bytes().to_string(),
                format!("{:.2}", entries_of.heap_bytes() as f64 / entries as f64),
            ]);
        }
        let mut rejected = (log.clone(), T0 + entries - 1);
        let mut sliding = (log, T0 + entries - 1);
        bench.case(
            &format!("consuming, a full log of {entries} entries sliding by 1 ms"),
            &mut sliding,
            true,
            |(limiter, at)| {
                *at += 1;
                admitted(
                    Some(limiter),
                    &request(Algorithm::SlidingLog, entries, entries, *at),
                    true,
                )
            },
        );
        bench.case(
            &format!("rejected, a full log of {entries} entries"),
            &mut rejected,
            false,
            |(limiter, at)| {
                admitted(
                    Some(limiter),
                    &request(Algorithm::SlidingLog, entries, entries, *at),
                    true,
                )
            },
        );
    }
    bench.table(
        "Heap bytes of a full log (what `MEMORY USAGE` adds for it), entries a millisecond apart:",
        &["entries", "heap bytes", "bytes an entry"],
        &memory,
    );
    bench.finish();
}
