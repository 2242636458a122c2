//! The run as JSON: the machine, the settings and every repetition of every case, memory and
//! scaling figure (`results.json`, kept beside the tables in benches/results/).

use serde_json::{json, Value};

use crate::model::*;
use crate::parse::Summary;

fn summary(s: Option<Summary>) -> Value {
    s.map_or(
        Value::Null,
        |s| json!({ "median": s.median, "min": s.min, "max": s.max }),
    )
}

pub fn json(results: &Results) -> String {
    let m = &results.machine;
    let cases: Vec<Value> = results
        .cases
        .iter()
        .map(|c| {
            json!({
                "group": c.group.id(),
                "pipeline": c.group.pipeline(),
                "subject": c.subject.id(),
                "label": c.subject.label(),
                "command": c.command,
                "rps": summary(c.rps()),
                "usec_per_call": summary(c.usec()),
                "p50_ms": summary(c.p50()),
                "p99_ms": summary(c.p99()),
                "samples": c.samples.iter().map(|s| json!({
                    "requests": s.requests,
                    "seconds": s.seconds,
                    "rps": s.rps,
                    "avg_ms": s.avg_ms,
                    "p50_ms": s.p50_ms,
                    "p99_ms": s.p99_ms,
                    "usec_per_call": s.usec_per_call,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let memory: Vec<Value> = results
        .memory
        .iter()
        .map(|m| {
            json!({
                "id": m.id,
                "label": m.label,
                "keys": m.keys,
                "calls_per_key": m.calls_per_key,
                "used_memory_bytes_per_key": m.bytes_per_key,
                "marginal_from_keys": m.marginal.map(|(from, _)| from),
                "marginal_bytes_per_key": m.marginal.map(|(_, b)| b),
                "memory_usage_bytes": m.memory_usage,
            })
        })
        .collect();
    let scaling: Vec<Value> = results
        .scaling
        .iter()
        .map(|s| {
            json!({
                "subject": s.subject.id(),
                "points": s.points.iter().map(|(k, u, r)| json!({
                    "keys": k,
                    "usec_per_call": summary(*u),
                    "rps": summary(*r),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let value = json!({
        "machine": {
            "date_utc": m.date_utc,
            "cpu_model": m.cpu_model,
            "nproc": m.nproc,
            "kernel": m.kernel,
            "redis_server": m.redis_version,
            "module_revision": m.module_revision,
            "load_average_before": m.load_before,
            "load_average_after": m.load_after,
        },
        "mode": if results.quick { "quick" } else { "full" },
        "repetitions": results.repetitions,
        "clients": results.clients,
        "keyspace": results.keyspace,
        "run_seconds_target": results.run_seconds_target,
        "pinned": results.pinned,
        "redis_cell": results.redis_cell,
        "replica_phase": results.replica,
        "total_seconds": results.total_seconds,
        "consume_args": { "limit": CONSUME_LIMIT, "period_ms": CONSUME_PERIOD_MS },
        "reject_args": { "limit": REJECT_LIMIT, "period_ms": CONSUME_PERIOD_MS },
        "throttle_args": THROTTLE_ARGS,
        "throttle_reject_args": THROTTLE_REJECT_ARGS,
        "memory_args": { "limit": MEMORY_LIMIT, "period_ms": MEMORY_PERIOD_MS, "throttle": THROTTLE_MEMORY_ARGS },
        "cases": cases,
        "memory": memory,
        "scaling": scaling,
        "notes": results.notes,
    });
    serde_json::to_string_pretty(&value).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}
