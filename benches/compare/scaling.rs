//! The scaling phase: the cost per call as the keyspace grows (the sliding log as its limit grows
//! and the leases as they grow are the core's own benchmarks: core/benches/).

use std::time::Instant;

use crate::model::*;
use crate::parse::Summary;
use crate::{Bench, Case};

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
}
