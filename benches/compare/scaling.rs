//! The scaling phases: the cost per call as the keyspace grows, and as the sliding log's limit
//! grows.

use std::time::{Duration, Instant};

use crate::common::now_ms;
use crate::model::*;
use crate::parse::{parse_cmdstat, Summary};
use crate::{resp, Bench, Case};

impl Bench<'_> {
    /// usec_per_call of consuming calls (pipeline 16) over 1k and 1M keys; the figures over the
    /// throughput runs' keyspace (100k) come from those runs (`measured`).
    pub(crate) fn scaling_phase(
        &mut self,
        measured: &[CaseResult],
    ) -> Result<Vec<ScalingResult>, String> {
        let subjects: Vec<Subject> = std::iter::once(Subject::SetPxat)
            .chain((0..ALGORITHMS.len()).map(Subject::Native))
            .collect();
        let point = |keys: u64, samples: &[Sample]| {
            let usec: Vec<f64> = samples.iter().map(|s| s.usec_per_call).collect();
            let rps: Vec<f64> = samples.iter().map(|s| s.rps).collect();
            (keys, Summary::of(&usec), Summary::of(&rps))
        };
        let mut results: Vec<ScalingResult> = subjects
            .iter()
            .map(|&subject| ScalingResult {
                subject,
                points: measured
                    .iter()
                    .filter(|c| c.subject == subject && c.group == (Group::Random { pipeline: 16 }))
                    .map(|c| point(self.config.keys, &c.samples))
                    .collect(),
            })
            .collect();
        for keys in self.config.scaling_keys.clone() {
            self.flushall()?;
            let cases: Vec<Case> = subjects
                .iter()
                .map(|&s| self.consuming(s, "scale:"))
                .collect();
            let filling = Instant::now();
            for case in &cases {
                self.populate(case, keys)?;
            }
            eprintln!(
                "bench:   scaling: filled {} keys in {:.1}s",
                self.dbsize()?,
                filling.elapsed().as_secs_f64()
            );
            let samples =
                self.measure_round_robin(&format!("{keys} keys"), &cases, 16, Some(keys), true)?;
            for (subject, samples) in subjects.iter().zip(samples) {
                if let Some(result) = results.iter_mut().find(|r| r.subject == *subject) {
                    result.points.push(point(keys, &samples));
                }
            }
        }
        for result in &mut results {
            result.points.sort_by_key(|p| p.0);
        }
        self.flushall()?;
        Ok(results)
    }

    /// The sliding log's cost per call with `L` entries at distinct ms in the log, for growing
    /// `L`: consuming calls that slide the window by one ms (one entry out, one in) and rejected
    /// calls on the full log, native against sliding_log.lua.
    pub(crate) fn log_scaling_phase(&mut self) -> Result<Vec<LogScalingResult>, String> {
        self.flushall()?;
        let base = now_ms() + 3_600_000;
        let lua_sha = self.sha("sliding_log");
        let limits = self.config.log_limits.clone();
        let calls = self.config.log_calls;
        // Per limit and kind (native, Lua): the next AT of a consuming call.
        let mut next_at: Vec<[u64; 2]> = Vec::new();
        let mut results: Vec<LogScalingResult> = Vec::new();
        let budget = Duration::from_secs(if self.config.quick { 10 } else { 25 });
        let mut live = Vec::new(); // per limit and kind: still measured (filled in time)
        for &limit in &limits {
            let mut result = LogScalingResult {
                limit,
                ..LogScalingResult::default()
            };
            let mut ok = [true, true];
            for (kind, ok) in ok.iter_mut().enumerate() {
                let started = Instant::now();
                let mut done = 0;
                while done < limit {
                    let chunk = (limit - done).min(10_000);
                    let sha = lua_sha.clone();
                    let from = done;
                    self.pipeline(chunk, Some(1), move |i, buf| {
                        resp::encode(buf, &log_call(kind, &sha, limit, limit, base + from + i))
                    })?;
                    done += chunk;
                    if started.elapsed() > budget && done < limit {
                        *ok = false;
                        result.note = Some(format!(
                            "{} log not filled: {done} of {limit} entries in {:.0}s",
                            if kind == 0 { "native" } else { "Lua" },
                            started.elapsed().as_secs_f64()
                        ));
                        break;
                    }
                }
            }
            next_at.push([base + limit; 2]);
            live.push(ok);
            results.push(result);
        }
        let mut samples: Vec<[Vec<f64>; 4]> = vec![Default::default(); limits.len()];
        for rep in 0..self.config.reps {
            let round = Instant::now();
            for (li, &limit) in limits.iter().enumerate() {
                for kind in 0..2 {
                    if !live[li][kind] {
                        continue;
                    }
                    let sha = lua_sha.clone();
                    let from = next_at[li][kind];
                    let started = Instant::now();
                    // Consuming: each call one ms later, one entry leaves and one enters.
                    self.resetstat()?;
                    self.pipeline(calls, Some(1), move |i, buf| {
                        resp::encode(buf, &log_call(kind, &sha, limit, limit, from + i))
                    })?;
                    samples[li][2 * kind].push(self.log_usec(kind)?);
                    next_at[li][kind] = from + calls;
                    // Rejected: at the newest entry's ms, the log is full.
                    let sha = lua_sha.clone();
                    let last = from + calls - 1;
                    self.resetstat()?;
                    self.pipeline(calls, Some(0), move |_, buf| {
                        resp::encode(buf, &log_call(kind, &sha, limit, limit, last))
                    })?;
                    samples[li][2 * kind + 1].push(self.log_usec(kind)?);
                    if started.elapsed() > budget {
                        live[li][kind] = false;
                        results[li].note = Some(format!(
                            "{} calls at limit {limit} took {:.0}s: stopped",
                            if kind == 0 { "native" } else { "Lua" },
                            started.elapsed().as_secs_f64()
                        ));
                    }
                }
            }
            eprintln!(
                "bench:   sliding-log limits: round {}/{} in {:.1}s",
                rep + 1,
                self.config.reps,
                round.elapsed().as_secs_f64()
            );
        }
        for (result, s) in results.iter_mut().zip(samples) {
            result.native_consume = Summary::of(&s[0]);
            result.native_reject = Summary::of(&s[1]);
            result.lua_consume = Summary::of(&s[2]);
            result.lua_reject = Summary::of(&s[3]);
        }
        self.flushall()?;
        Ok(results)
    }

    fn log_usec(&mut self, kind: usize) -> Result<f64, String> {
        let name = if kind == 0 {
            "ratelimit.check"
        } else {
            "evalsha"
        };
        parse_cmdstat(&self.info("commandstats")?, name)
            .map(|s| s.usec_per_call)
            .ok_or_else(|| format!("INFO commandstats has no cmdstat_{name}"))
    }
}

/// A sliding-log call `AT at` with limit and period `limit` (ms): native (kind 0) or Lua.
fn log_call(kind: usize, sha: &str, limit: u64, period: u64, at: u64) -> Vec<String> {
    if kind == 0 {
        vec![
            "RATELIMIT.CHECK".into(),
            format!("slog:n:{limit}"),
            "sliding-log".into(),
            limit.to_string(),
            period.to_string(),
            "AT".into(),
            at.to_string(),
        ]
    } else {
        vec![
            "EVALSHA".into(),
            sha.into(),
            "1".into(),
            format!("slog:l:{limit}"),
            limit.to_string(),
            period.to_string(),
            limit.to_string(),
            "1".into(),
            at.to_string(),
        ]
    }
}
