//! The throughput phase: redis-benchmark runs of every case, round by round, with the in-server
//! cost per call of each run.

use std::process::Command;
use std::time::Instant;

use crate::model::*;
use crate::parse::{parse_benchmark_csv, parse_cmdstat, BenchLine};
use crate::resp::{self, Load};
use crate::{Bench, Case};

impl Bench<'_> {
    /// One run of `requests` calls (redis-benchmark, or the bench's own clients for a case over
    /// RESP3 and its RESP2 twin), with the in-server cost of the case's
    /// command over exactly that run.
    fn measure(
        &mut self,
        case: &Case,
        pipeline: u32,
        keyspace: Option<u64>,
        requests: u64,
        expect_allowed: bool,
    ) -> Result<Sample, String> {
        let side = case.subject.side();
        let counted = case
            .subject
            .algorithm()
            .filter(|_| case.subject.counted_by_module());
        // After the reset: `CONFIG RESETSTAT` zeroes the module's decision counters too.
        self.resetstat_on(side)?;
        let decisions_before = match counted {
            Some(a) => Some(self.module_decisions(a)?),
            None => None,
        };
        let (seconds, line) = match case.resp {
            None => self.run_benchmark(case, pipeline, keyspace, requests)?,
            Some(protocol) => {
                self.run_own_clients(case, protocol, pipeline, keyspace, requests, expect_allowed)?
            }
        };
        let cmdstat_name = case.subject.cmdstat();
        let stats = parse_cmdstat(&self.info_on(side, "commandstats")?, cmdstat_name)
            .ok_or_else(|| format!("INFO commandstats has no cmdstat_{cmdstat_name}"))?;
        if stats.failed_calls > 0 || stats.rejected_calls > 0 || stats.calls < requests {
            return Err(format!(
                "{}: {} calls for {requests} requests, {} failed, {} rejected by Redis",
                case.subject.label(),
                stats.calls,
                stats.failed_calls,
                stats.rejected_calls
            ));
        }
        if let (Some(before), Some(a)) = (decisions_before, counted) {
            let after = self.module_decisions(a)?;
            let (allowed, rejected) = (after.0 - before.0, after.1 - before.1);
            let wrong = if expect_allowed { rejected } else { allowed };
            if wrong > 0 {
                return Err(format!(
                    "{}: {allowed} calls admitted and {rejected} rejected; expected all {}",
                    case.subject.label(),
                    if expect_allowed {
                        "admitted"
                    } else {
                        "rejected"
                    }
                ));
            }
        }
        Ok(Sample {
            requests,
            seconds,
            rps: line.rps,
            avg_ms: line.avg_ms,
            p50_ms: line.p50_ms,
            p99_ms: line.p99_ms,
            usec_per_call: stats.usec_per_call,
        })
    }

    /// One redis-benchmark run (RESP2): its length in seconds and what it printed.
    fn run_benchmark(
        &self,
        case: &Case,
        pipeline: u32,
        keyspace: Option<u64>,
        requests: u64,
    ) -> Result<(f64, BenchLine), String> {
        let mut command = if self.config.pin {
            let mut taskset = Command::new("taskset");
            taskset.args(["-c", "1", "redis-benchmark"]);
            taskset
        } else {
            Command::new("redis-benchmark")
        };
        command
            .args(["-h", "127.0.0.1"])
            .args(["-p", &self.port_of(case.subject.side()).to_string()])
            .args(["-c", &self.config.clients.to_string()])
            .args(["-P", &pipeline.to_string()])
            .args(["-n", &requests.to_string()]);
        if let Some(keys) = keyspace {
            command.args(["-r", &keys.to_string()]);
        }
        command.arg("--csv").args(&case.command);
        let started = Instant::now();
        let output = command
            .output()
            .map_err(|e| format!("running redis-benchmark: {e} (install redis-tools)"))?;
        let seconds = started.elapsed().as_secs_f64();
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            return Err(format!(
                "redis-benchmark {:?} failed ({}): {}{}",
                case.command,
                output.status,
                String::from_utf8_lossy(&output.stderr).trim(),
                stdout.trim()
            ));
        }
        Ok((seconds, parse_benchmark_csv(&stdout)?))
    }

    /// One run of the bench's own clients (as many as redis-benchmark's, on its CPU when
    /// pinned) speaking RESP `protocol`: its length and throughput (no latencies), after checking
    /// that every reply was an admission (or a rejection) as meant.
    fn run_own_clients(
        &self,
        case: &Case,
        protocol: u8,
        pipeline: u32,
        keyspace: Option<u64>,
        requests: u64,
        expect_allowed: bool,
    ) -> Result<(f64, BenchLine), String> {
        let load = Load {
            port: self.port_of(case.subject.side()),
            clients: self.config.clients as usize,
            pipeline: pipeline as usize,
            protocol,
            calls: requests,
            keyspace,
            cpu: self.config.pin.then_some(1),
        };
        let outcome = resp::drive(&load, case.encoder(), || Ok(()))
            .map_err(|e| format!("{} over RESP{protocol}: {e}", case.subject.label()))?;
        let b = &outcome.batch;
        if let Some(error) = &b.first_error {
            return Err(format!(
                "{} over RESP{protocol} answered an error: {error}",
                case.subject.label()
            ));
        }
        if let Some(first) = case.subject.expect_first(expect_allowed) {
            let right = if first == 1 { b.allowed } else { b.rejected };
            if right != requests {
                return Err(format!(
                    "{} over RESP{protocol}: {right} of {requests} replies began with {first}",
                    case.subject.label()
                ));
            }
        }
        let seconds = outcome.seconds.max(1e-9);
        Ok((
            seconds,
            BenchLine {
                rps: requests as f64 / seconds,
                avg_ms: f64::NAN,
                p50_ms: f64::NAN,
                p99_ms: f64::NAN,
                max_ms: f64::NAN,
            },
        ))
    }

    /// Calibrates the length of each case with a short warm-up run, then measures every case
    /// `reps` times, round by round (A B C ... A B C ...), starting each round one case later.
    pub(crate) fn measure_round_robin(
        &mut self,
        name: &str,
        cases: &[Case],
        pipeline: u32,
        keyspace: Option<u64>,
        expect_allowed: bool,
    ) -> Result<Vec<Vec<Sample>>, String> {
        let per_batch = u64::from(self.config.clients) * u64::from(pipeline);
        let warm_up = if pipeline > 1 { 8 * per_batch } else { 1_500 };
        let mut requests = Vec::new();
        for case in cases {
            let sample = self.measure(case, pipeline, keyspace, warm_up, expect_allowed)?;
            let n = (sample.rps * self.config.run_secs) as u64;
            let n = n.clamp(warm_up, 20_000_000);
            requests.push(n.div_ceil(per_batch) * per_batch);
        }
        let mut samples = vec![Vec::new(); cases.len()];
        for rep in 0..self.config.reps {
            let round = Instant::now();
            for k in 0..cases.len() {
                let i = (k + rep) % cases.len();
                let sample =
                    self.measure(&cases[i], pipeline, keyspace, requests[i], expect_allowed)?;
                samples[i].push(sample);
            }
            eprintln!(
                "bench:   {name}: round {}/{} in {:.1}s",
                rep + 1,
                self.config.reps,
                round.elapsed().as_secs_f64()
            );
        }
        Ok(samples)
    }

    /// Throughput, latency and cost per call: consuming calls over the random keyspace and
    /// rejected calls on hot keys, at pipeline 16 and 1.
    pub(crate) fn throughput_phase(&mut self) -> Result<Vec<CaseResult>, String> {
        self.flushall()?;
        let keys = self.config.keys;
        let subjects = limiter_subjects(self.has_cell());
        let random: Vec<Case> = subjects
            .iter()
            .copied()
            .chain([Subject::SetPxat, Subject::Incr, Subject::Ping])
            .map(|s| self.consuming(s, "rl:"))
            .collect();
        let hot: Vec<Case> = subjects
            .iter()
            .copied()
            .chain([Subject::Incr])
            .map(|s| self.rejected(s))
            .collect();
        let filling = Instant::now();
        for case in &random {
            self.populate(case, keys)?;
        }
        for case in &hot {
            self.exhaust(case)?;
        }
        let cell_keys = if self.has_cell() {
            format!(" (and {} on redis-cell's)", self.dbsize_on(Side::Cell)?)
        } else {
            String::new()
        };
        eprintln!(
            "bench:   filled {} keys{cell_keys} in {:.1}s",
            self.dbsize()?,
            filling.elapsed().as_secs_f64()
        );
        // The library, the scripts and redis-cell keep no statistics of their decisions: check
        // once that they admit as meant (the hot keys were checked by `exhaust`).
        for case in &random {
            if case.subject.is_limiter() && !case.subject.counted_by_module() {
                let reply = self.call_on(case.subject.side(), &case.with_key(0))?;
                if reply.allowed() != case.subject.expect_first(true) {
                    return Err(format!("{} did not admit: {reply:?}", case.subject.label()));
                }
            }
        }
        let mut results = Vec::new();
        for group in [
            Group::Random { pipeline: 16 },
            Group::Hot { pipeline: 16 },
            Group::Random { pipeline: 1 },
            Group::Hot { pipeline: 1 },
        ] {
            let (cases, keyspace) = if group.is_random() {
                (&random, Some(keys))
            } else {
                (&hot, None)
            };
            let samples = self.measure_round_robin(
                &group.id(),
                cases,
                group.pipeline(),
                keyspace,
                group.is_random(),
            )?;
            for (case, samples) in cases.iter().zip(samples) {
                results.push(case.result(group, samples));
            }
        }
        Ok(results)
    }
}
