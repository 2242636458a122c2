//! The timing loop the core's benchmarks share (no framework: `std::time::Instant` and
//! `std::hint::black_box`).
//!
//! Each case runs its call in rounds: the calls of a round are timed together, and the case's
//! figure is the median of the rounds' nanoseconds per call, with the fastest and the slowest
//! round beside it. A round's length is found first (the calls double until a round takes
//! `ROUND` or more). Every call says whether it was admitted, and every round checks that all of
//! them were admitted, or all rejected, as the case means: a benchmark that stopped measuring what
//! it names fails instead of printing a figure.
//!
//! Run by `cargo bench -p redis-ratelimit-core` (`make bench` runs it first): 15 rounds of
//! 20 ms or more per case, `BENCH_QUICK=1` 5 rounds of 5 ms. Run without `--bench` (`cargo test
//! --benches`) it calls each case a few times and prints nothing but a line: a smoke test.

// Each bench binary uses part of this module.
#![allow(dead_code)]

use std::hint::black_box;
use std::time::{Duration, Instant};

/// How the binary was started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// `cargo test --benches`: a few calls per case, no figures.
    Smoke,
    Quick,
    Full,
}

/// One measured case: its name and the median, least and greatest ns per call of its rounds.
struct Row {
    name: String,
    median: f64,
    min: f64,
    max: f64,
    calls: u64,
}

/// The cases of one bench binary and what they measured; printed as a Markdown table by
/// [`Bench::finish`].
pub struct Bench {
    title: String,
    mode: Mode,
    rows: Vec<Row>,
    notes: Vec<String>,
}

impl Bench {
    /// A bench titled `title` (the algorithm), its mode from the command line and `BENCH_QUICK`.
    pub fn new(title: &str) -> Bench {
        let bench = std::env::args().skip(1).any(|a| a == "--bench");
        let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let mode = match (bench, quick) {
            (false, _) => Mode::Smoke,
            (true, true) => Mode::Quick,
            (true, false) => Mode::Full,
        };
        Bench {
            title: title.to_string(),
            mode,
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Whether this run measures (not a smoke test): what sizes to build, for instance.
    pub fn measuring(&self) -> bool {
        self.mode != Mode::Smoke
    }

    /// Times `call` on `state`; every call must answer `admitted` (true: admitted).
    pub fn case<S>(
        &mut self,
        name: &str,
        state: &mut S,
        admitted: bool,
        mut call: impl FnMut(&mut S) -> bool,
    ) {
        let (rounds, round) = match self.mode {
            Mode::Smoke => (1, Duration::ZERO),
            Mode::Quick => (5, Duration::from_millis(5)),
            Mode::Full => (15, Duration::from_millis(20)),
        };
        let mut run = |calls: u64, state: &mut S| -> Duration {
            let mut answered = 0u64;
            let started = Instant::now();
            for _ in 0..calls {
                answered += u64::from(black_box(call(black_box(&mut *state))) == admitted);
            }
            let elapsed = started.elapsed();
            assert_eq!(
                answered,
                calls,
                "{}: {name}: {} of {calls} calls were not {}",
                self.title,
                calls - answered,
                if admitted { "admitted" } else { "rejected" }
            );
            elapsed
        };
        let mut calls = 1u64;
        while run(calls, state) < round && calls < 1 << 30 {
            calls *= 2;
        }
        if self.mode == Mode::Smoke {
            run(3, state);
            return;
        }
        let mut per_call: Vec<f64> = (0..rounds)
            .map(|_| run(calls, state).as_nanos() as f64 / calls as f64)
            .collect();
        per_call.sort_by(f64::total_cmp);
        self.rows.push(Row {
            name: name.to_string(),
            median: per_call[per_call.len() / 2],
            min: per_call[0],
            max: per_call[per_call.len() - 1],
            calls,
        });
    }

    /// A table printed under the timings (what a structure's memory comes to, for instance).
    pub fn table(&mut self, title: &str, head: &[&str], rows: &[Vec<String>]) {
        let mut text = format!(
            "{title}\n\n| {} |\n|{}\n",
            head.join(" | "),
            "---|".repeat(head.len())
        );
        for row in rows {
            text.push_str(&format!("| {} |\n", row.join(" | ")));
        }
        self.notes.push(text);
    }

    /// Prints the table (or, in a smoke test, one line).
    pub fn finish(self) {
        if self.mode == Mode::Smoke {
            println!("{}: every case ran (cargo bench measures them)", self.title);
            return;
        }
        println!("### {} (ns per call)\n", self.title);
        println!("| case | median | fastest..slowest round | calls per round |");
        println!("|---|---|---|---|");
        for row in &self.rows {
            println!(
                "| {} | {:.1} | {:.1}..{:.1} | {} |",
                row.name, row.median, row.min, row.max, row.calls
            );
        }
        println!();
        for note in &self.notes {
            println!("{note}");
        }
    }
}

pub mod rate;
