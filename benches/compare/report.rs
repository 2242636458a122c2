//! The run's results as Markdown (with the targets' pass/fail), JSON and an SVG bar chart.

use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::model::*;
use crate::parse::Summary;

const P16: Group = Group::Random { pipeline: 16 };
const P1: Group = Group::Random { pipeline: 1 };
const HOT16: Group = Group::Hot { pipeline: 16 };
const HOT1: Group = Group::Hot { pipeline: 1 };

/// Algorithms whose memory per key has the 130-byte target.
const SMALL_STATE: [usize; 4] = [0, 1, 2, 3];
const MEMORY_LIMIT_BYTES: f64 = 130.0;

/// One target of issue 4, evaluated.
#[derive(Clone, Debug)]
pub struct Target {
    pub name: String,
    pub measured: String,
    pub threshold: String,
    /// `None` when this run did not measure it.
    pub pass: Option<bool>,
}

fn ratio(a: Option<Summary>, b: Option<Summary>) -> Option<f64> {
    let (a, b) = (a?, b?);
    (b.median > 0.0).then(|| a.median / b.median)
}

fn rps(results: &Results, group: Group, subject: Subject) -> Option<Summary> {
    results.case(group, subject)?.rps()
}

fn usec(results: &Results, group: Group, subject: Subject) -> Option<Summary> {
    results.case(group, subject)?.usec()
}

fn x(value: Option<f64>) -> String {
    value.map_or("n/a".into(), |v| format!("{v:.2}x"))
}

/// `median [min..max]` in thousands.
fn kilo(s: Option<Summary>) -> String {
    s.map_or("n/a".into(), |s| {
        format!(
            "{:.1} [{:.1}..{:.1}]",
            s.median / 1e3,
            s.min / 1e3,
            s.max / 1e3
        )
    })
}

fn plain(s: Option<Summary>, decimals: usize) -> String {
    s.map_or("n/a".into(), |s| {
        format!(
            "{:.d$} [{:.d$}..{:.d$}]",
            s.median,
            s.min,
            s.max,
            d = decimals
        )
    })
}

fn median(s: Option<Summary>, decimals: usize) -> String {
    s.map_or("n/a".into(), |s| format!("{:.d$}", s.median, d = decimals))
}

fn verdict(pass: Option<bool>) -> &'static str {
    match pass {
        Some(true) => "PASS",
        Some(false) => "**FAIL**",
        None => "n/a",
    }
}

/// Every target of the issue, from what the run measured.
pub fn targets(results: &Results) -> Vec<Target> {
    let mut targets = Vec::new();
    let mut push = |name: String, value: Option<f64>, threshold: String, pass: fn(f64) -> bool| {
        targets.push(Target {
            name,
            measured: x(value),
            threshold,
            pass: value.map(pass),
        });
    };
    for (a, (name, _, _)) in ALGORITHMS.iter().enumerate() {
        let native = rps(results, P16, Subject::Native(a));
        push(
            format!("{name}: consuming CHECK, P16, random keys / SET PXAT"),
            ratio(native, rps(results, P16, Subject::SetPxat)),
            ">= 1.00x".into(),
            |r| r >= 1.0,
        );
        push(
            format!("{name}: consuming CHECK, P16, random keys / its Lua script"),
            ratio(native, rps(results, P16, Subject::Lua(a))),
            ">= 4.00x".into(),
            |r| r >= 4.0,
        );
        push(
            format!("{name}: rejected CHECK, P16, hot key / INCR (hot key)"),
            ratio(
                rps(results, HOT16, Subject::Native(a)),
                rps(results, HOT16, Subject::Incr),
            ),
            ">= 0.80x".into(),
            |r| r >= 0.8,
        );
        push(
            format!("{name}: usec_per_call of a consuming CHECK / SET PXAT's"),
            ratio(
                usec(results, P16, Subject::Native(a)),
                usec(results, P16, Subject::SetPxat),
            ),
            "<= 1.10x".into(),
            |r| r <= 1.1,
        );
    }
    for a in SMALL_STATE {
        let name = ALGORITHMS[a].0;
        let memory = results.memory(&format!("{name}/native"));
        // What one more key costs (key, value, TTL); the average with the hash tables' slots
        // is shown beside it.
        let bytes = memory.map(|m| m.marginal.map_or(m.bytes_per_key, |(_, b)| b));
        targets.push(Target {
            name: format!("{name}: memory per key (used_memory delta per added key)"),
            measured: memory.map_or("n/a".into(), |m| match m.marginal {
                Some((_, b)) => format!("{b:.0} B ({:.0} B with hash tables)", m.bytes_per_key),
                None => format!("{:.0} B", m.bytes_per_key),
            }),
            threshold: format!("<= {MEMORY_LIMIT_BYTES:.0} B"),
            pass: bytes.map(|b| b <= MEMORY_LIMIT_BYTES),
        });
    }
    let log = results
        .memory("sliding-log/native-100")
        .map(|m| m.bytes_per_key);
    let zset = results
        .memory("sliding-log/seed-zset-100")
        .map(|m| m.bytes_per_key);
    let log_ratio = log.zip(zset).map(|(l, z)| l / z);
    targets.push(Target {
        name: "sliding-log, 100 entries per key: memory / seed ZSET log's".into(),
        measured: match (log, zset, log_ratio) {
            (Some(l), Some(z), Some(r)) => format!("{l:.0} B / {z:.0} B = {r:.2}x"),
            _ => "n/a".into(),
        },
        threshold: "<= 0.25x".into(),
        pass: log_ratio.map(|r| r <= 0.25),
    });
    let set_scaling = results
        .scaling
        .iter()
        .find(|s| s.subject == Subject::SetPxat);
    for scaling in &results.scaling {
        let Subject::Native(a) = scaling.subject else {
            continue;
        };
        let (Some(first), Some(last)) = (scaling.points.first(), scaling.points.last()) else {
            continue;
        };
        let g = growth(scaling);
        // SET PXAT's own growth between the same keyspace sizes.
        let at = |keys: u64| {
            set_scaling
                .and_then(|s| s.points.iter().find(|p| p.0 == keys))
                .and_then(|p| p.1)
        };
        let set_growth = ratio(at(last.0), at(first.0));
        let allowed = set_growth.map_or(1.25, |s| (s * 1.1).max(1.25));
        targets.push(Target {
            name: format!(
                "{}: usec_per_call with {} keys / with {} keys",
                ALGORITHMS[a].0,
                count(last.0),
                count(first.0)
            ),
            measured: x(g),
            threshold: format!(
                "<= {allowed:.2}x (1.25x, or SET PXAT's own growth {} + 10%)",
                x(set_growth)
            ),
            pass: g.map(|g| g <= allowed),
        });
    }
    let first = results.log_scaling.first();
    let last = results.log_scaling.last();
    if let (Some(first), Some(last)) = (first, last) {
        for (what, get) in [
            (
                "consuming",
                (|r: &LogScalingResult| r.native_consume) as fn(&LogScalingResult) -> _,
            ),
            ("rejected", |r: &LogScalingResult| r.native_reject),
        ] {
            let value = ratio(get(last), get(first));
            targets.push(Target {
                name: format!(
                    "sliding-log: usec_per_call of a {what} CHECK at limit {} / at limit {}",
                    count(last.limit),
                    count(first.limit)
                ),
                measured: x(value),
                threshold: "<= 2.00x".into(),
                pass: value.map(|v| v <= 2.0),
            });
        }
    }
    targets
}

/// usec_per_call at the largest keyspace over that at the smallest.
fn growth(scaling: &ScalingResult) -> Option<f64> {
    let first = scaling.points.first()?;
    let last = scaling.points.last()?;
    ratio(last.1, first.1)
}

/// 1000 -> "1k", 1000000 -> "1M".
pub fn count(n: u64) -> String {
    if n >= 1_000_000 && n % 1_000_000 == 0 {
        format!("{}M", n / 1_000_000)
    } else if n >= 1_000 && n % 1_000 == 0 {
        format!("{}k", n / 1_000)
    } else {
        n.to_string()
    }
}

// ---- Markdown ----------------------------------------------------------------------------

pub fn markdown(results: &Results) -> String {
    let mut md = String::new();
    let m = &results.machine;
    let _ = writeln!(md, "### Results: {}\n", m.date_utc);
    let _ = writeln!(
        md,
        "Machine: {} ({} cores as `nproc` counts them), Linux {}, redis-server {}; module {}.  ",
        m.cpu_model, m.nproc, m.kernel, m.redis_version, m.module_revision
    );
    let _ = writeln!(
        md,
        "Run: {} mode, {} repetitions interleaved round by round, {} redis-benchmark clients, \
         {} random keys, about {:.2} s per run; {:.0} s in all. Load average {} before, {} after: \
         {}  ",
        if results.quick { "quick" } else { "full" },
        results.repetitions,
        results.clients,
        count(results.keyspace),
        results.run_seconds_target,
        results.total_seconds,
        m.load_before,
        m.load_after,
        if results.pinned {
            "redis-server ran on CPU 0 and redis-benchmark on CPU 1 (`taskset`), sharing them \
             only with whatever else was running."
        } else {
            "redis-benchmark and redis-server share these cores with each other and with \
             anything else running."
        }
    );
    let _ = writeln!(
        md,
        "Cells: median [min..max] of the repetitions; ratios compare medians. \
         Consuming calls: limit {CONSUME_LIMIT} per {CONSUME_PERIOD_MS} ms, so every call is \
         admitted and updates a live key. Rejected calls: one hot key, limit {REJECT_LIMIT}, \
         exhausted first. Lua: `EVALSHA` of `lua-reference/<algorithm>.lua` with the server's \
         clock (empty `now_ms`).\n"
    );

    let _ = writeln!(
        md,
        "#### Consuming CHECK over {} random keys (kreq/s; usec_per_call from INFO commandstats)\n",
        count(results.keyspace)
    );
    md.push_str(
        "| command | P16 kreq/s | native/Lua | native/INCR | native/SET PXAT | P16 usec/call | \
         usec vs SET PXAT | P1 kreq/s | P1 p50 / p99 ms |\n",
    );
    md.push_str("|---|---|---|---|---|---|---|---|---|\n");
    let set_usec = usec(results, P16, Subject::SetPxat);
    for subject in table_subjects(true) {
        let Some(case) = results.case(P16, subject) else {
            continue;
        };
        let (vs_lua, vs_incr, vs_set, vs_set_usec) = match subject {
            Subject::Native(a) => (
                x(ratio(case.rps(), rps(results, P16, Subject::Lua(a)))),
                x(ratio(case.rps(), rps(results, P16, Subject::Incr))),
                x(ratio(case.rps(), rps(results, P16, Subject::SetPxat))),
                x(ratio(case.usec(), set_usec)),
            ),
            Subject::Lua(_) | Subject::Incr | Subject::Ping => (
                String::new(),
                String::new(),
                String::new(),
                x(ratio(case.usec(), set_usec)),
            ),
            Subject::SetPxat => (
                String::new(),
                x(ratio(case.rps(), rps(results, P16, Subject::Incr))),
                String::new(),
                String::new(),
            ),
        };
        let p1 = results.case(P1, subject);
        let _ = writeln!(
            md,
            "| {} | {} | {vs_lua} | {vs_incr} | {vs_set} | {} | {vs_set_usec} | {} | {} / {} |",
            subject.label(),
            kilo(case.rps()),
            plain(case.usec(), 2),
            kilo(p1.and_then(CaseResult::rps)),
            median(p1.and_then(CaseResult::p50), 3),
            median(p1.and_then(CaseResult::p99), 3),
        );
    }

    md.push_str(
        "\n#### Rejected CHECK on one hot key over its limit (no write, no replication)\n\n",
    );
    md.push_str(
        "| command | P16 kreq/s | native/Lua | native/INCR | P16 usec/call | P1 kreq/s | \
         P1 p50 / p99 ms |\n",
    );
    md.push_str("|---|---|---|---|---|---|---|\n");
    for subject in table_subjects(false) {
        let Some(case) = results.case(HOT16, subject) else {
            continue;
        };
        let (vs_lua, vs_incr) = match subject {
            Subject::Native(a) => (
                x(ratio(case.rps(), rps(results, HOT16, Subject::Lua(a)))),
                x(ratio(case.rps(), rps(results, HOT16, Subject::Incr))),
            ),
            _ => (String::new(), String::new()),
        };
        let p1 = results.case(HOT1, subject);
        let _ = writeln!(
            md,
            "| {} | {} | {vs_lua} | {vs_incr} | {} | {} | {} / {} |",
            subject.label(),
            kilo(case.rps()),
            plain(case.usec(), 2),
            kilo(p1.and_then(CaseResult::rps)),
            median(p1.and_then(CaseResult::p50), 3),
            median(p1.and_then(CaseResult::p99), 3),
        );
    }

    if !results.memory.is_empty() {
        md.push_str(
            "\n#### Memory per key (key, value and TTL; `rl:` + 12 digits = 15-byte key names)\n\n",
        );
        md.push_str(
            "Average: `used_memory` delta over all the keys, the keyspace's and the expiries' hash \
             tables included. Per added key: the delta between two counts within the same \
             power-of-two bracket, where those tables keep their size.\n\n",
        );
        md.push_str(
            "| keys | count | average / key | per added key | per added key vs SET PXAT | \
             MEMORY USAGE of one key |\n",
        );
        md.push_str("|---|---|---|---|---|---|\n");
        let set_marginal = results
            .memory("set-pxat")
            .and_then(|m| m.marginal)
            .map(|(_, b)| b);
        for m in &results.memory {
            let (marginal, vs_set) = match (m.marginal, set_marginal) {
                (Some((from, b)), Some(set)) if m.id != "set-pxat" => (
                    format!("{b:.0} B ({}..{})", count(from), count(m.keys)),
                    format!("{:+.0} B", b - set),
                ),
                (Some((from, b)), _) => (
                    format!("{b:.0} B ({}..{})", count(from), count(m.keys)),
                    String::new(),
                ),
                (None, _) => (String::new(), String::new()),
            };
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} B | {marginal} | {vs_set} | {} |",
                m.label,
                count(m.keys),
                m.bytes_per_key,
                m.memory_usage.map_or("n/a".into(), |b| format!("{b} B"))
            );
        }
    }

    if !results.scaling.is_empty() {
        let mut sizes: Vec<u64> = results
            .scaling
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        md.push_str(
            "\n#### Cost per call as the keyspace grows (consuming, P16; usec_per_call)\n\n",
        );
        md.push_str("| command |");
        for &k in &sizes {
            let _ = write!(md, " {} keys |", count(k));
        }
        md.push_str(" largest / smallest |\n|---|");
        md.push_str(&"---|".repeat(sizes.len() + 1));
        md.push('\n');
        for s in &results.scaling {
            let _ = write!(md, "| {} |", s.subject.label());
            for &k in &sizes {
                let cell = s
                    .points
                    .iter()
                    .find(|p| p.0 == k)
                    .map_or_else(|| "not run".to_string(), |p| plain(p.1, 2));
                let _ = write!(md, " {cell} |");
            }
            let _ = writeln!(md, " {} |", x(growth(s)));
        }
    }

    if !results.log_scaling.is_empty() {
        md.push_str(
            "\n#### Sliding log: cost per call as its limit grows (usec_per_call; one key holding \
             `limit` entries at distinct ms; consuming calls slide the window by 1 ms)\n\n",
        );
        md.push_str(
            "| limit | native consuming | native rejected | Lua consuming | Lua rejected | note |\n",
        );
        md.push_str("|---|---|---|---|---|---|\n");
        for r in &results.log_scaling {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} |",
                count(r.limit),
                plain(r.native_consume, 2),
                plain(r.native_reject, 2),
                plain(r.lua_consume, 2),
                plain(r.lua_reject, 2),
                r.note.as_deref().unwrap_or("")
            );
        }
    }

    let targets = targets(results);
    let passed = targets.iter().filter(|t| t.pass == Some(true)).count();
    let _ = writeln!(md, "\n#### Targets ({passed} of {} pass)\n", targets.len());
    md.push_str("| target | measured | threshold | result |\n|---|---|---|---|\n");
    for t in &targets {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            t.name,
            t.measured,
            t.threshold,
            verdict(t.pass)
        );
    }
    for note in &results.notes {
        let _ = writeln!(md, "\nNote: {note}");
    }
    md
}

/// Rows in table order: each algorithm native then Lua, then the floors.
fn table_subjects(random: bool) -> Vec<Subject> {
    let mut subjects = Vec::new();
    for a in 0..ALGORITHMS.len() {
        subjects.push(Subject::Native(a));
        subjects.push(Subject::Lua(a));
    }
    if random {
        subjects.extend([Subject::SetPxat, Subject::Incr, Subject::Ping]);
    } else {
        subjects.push(Subject::Incr);
    }
    subjects
}

// ---- JSON --------------------------------------------------------------------------------

fn summary_json(s: Option<Summary>) -> Value {
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
                "rps": summary_json(c.rps()),
                "usec_per_call": summary_json(c.usec()),
                "p50_ms": summary_json(c.p50()),
                "p99_ms": summary_json(c.p99()),
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
                    "usec_per_call": summary_json(*u),
                    "rps": summary_json(*r),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let log_scaling: Vec<Value> = results
        .log_scaling
        .iter()
        .map(|r| {
            json!({
                "limit": r.limit,
                "native_consuming_usec_per_call": summary_json(r.native_consume),
                "native_rejected_usec_per_call": summary_json(r.native_reject),
                "lua_consuming_usec_per_call": summary_json(r.lua_consume),
                "lua_rejected_usec_per_call": summary_json(r.lua_reject),
                "note": r.note,
            })
        })
        .collect();
    let targets: Vec<Value> = targets(results)
        .iter()
        .map(|t| {
            json!({
                "target": t.name,
                "measured": t.measured,
                "threshold": t.threshold,
                "pass": t.pass,
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
        "total_seconds": results.total_seconds,
        "consume_args": { "limit": CONSUME_LIMIT, "period_ms": CONSUME_PERIOD_MS },
        "reject_args": { "limit": REJECT_LIMIT, "period_ms": CONSUME_PERIOD_MS },
        "cases": cases,
        "memory": memory,
        "scaling": scaling,
        "sliding_log_scaling": log_scaling,
        "targets": targets,
        "notes": results.notes,
    });
    serde_json::to_string_pretty(&value).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

// ---- SVG ---------------------------------------------------------------------------------

/// A labelled group of bars, each a color and a throughput summary.
type BarGroup = (String, Vec<(&'static str, Option<Summary>)>);

const NATIVE_COLOR: &str = "#2b6cb0";
const LUA_COLOR: &str = "#dd6b20";
const FLOOR_COLOR: &str = "#718096";

/// A round axis maximum at or above `v`, and its tick step.
fn axis(v: f64) -> (f64, f64) {
    let v = if v.is_finite() && v > 0.0 { v } else { 1.0 };
    let raw = v / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude);
    ((v / step).ceil() * step, step)
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// One panel: bars (label, color, summary) in groups, from `top`.
fn panel(svg: &mut String, top: f64, title: &str, groups: &[BarGroup]) {
    const LEFT: f64 = 70.0;
    const WIDTH: f64 = 880.0;
    const HEIGHT: f64 = 220.0;
    let max = groups
        .iter()
        .flat_map(|g| g.1.iter())
        .filter_map(|b| b.1.map(|s| s.max))
        .fold(0.0, f64::max)
        / 1e3;
    let (axis_max, step) = axis(max);
    let y = |v: f64| top + 30.0 + HEIGHT - v / axis_max * HEIGHT;
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="{}" font-size="14" font-weight="bold">{}</text>"#,
        top + 16.0,
        escape(title)
    );
    let mut tick = 0.0;
    while tick <= axis_max + step / 2.0 {
        let ty = y(tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{ty:.1}" x2="{:.1}" y2="{ty:.1}" stroke="#e2e8f0"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            LEFT + WIDTH,
            LEFT - 6.0,
            ty + 4.0,
            tick
        );
        tick += step;
    }
    let _ = writeln!(
        svg,
        r#"<text x="16" y="{:.1}" font-size="11" transform="rotate(-90 16 {:.1})" text-anchor="middle">kreq/s</text>"#,
        top + 30.0 + HEIGHT / 2.0,
        top + 30.0 + HEIGHT / 2.0
    );
    let bars: usize = groups.iter().map(|g| g.1.len()).sum();
    let gaps = groups.len().saturating_sub(1);
    let slot = WIDTH / (bars as f64 + gaps as f64 * 0.6 + 0.6);
    let bar_width = slot * 0.8;
    let mut cursor = LEFT + slot * 0.3;
    for (name, group_bars) in groups {
        let start = cursor;
        for (color, summary) in group_bars {
            if let Some(s) = summary {
                let (median, lo, hi) = (s.median / 1e3, s.min / 1e3, s.max / 1e3);
                let (bx, by) = (cursor + (slot - bar_width) / 2.0, y(median));
                let _ = writeln!(
                    svg,
                    r#"<rect x="{bx:.1}" y="{by:.1}" width="{bar_width:.1}" height="{:.1}" fill="{color}"/>"#,
                    y(0.0) - by
                );
                let cx = bx + bar_width / 2.0;
                let _ = writeln!(
                    svg,
                    r#"<line x1="{cx:.1}" y1="{:.1}" x2="{cx:.1}" y2="{:.1}" stroke="black"/><text x="{cx:.1}" y="{:.1}" font-size="10" text-anchor="middle">{median:.0}</text>"#,
                    y(lo),
                    y(hi),
                    y(hi) - 3.0
                );
            }
            cursor += slot;
        }
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"#,
            (start + cursor) / 2.0,
            y(0.0) + 15.0,
            escape(name)
        );
        cursor += slot * 0.6;
    }
    let _ = writeln!(
        svg,
        r#"<line x1="{LEFT}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="black"/>"#,
        y(0.0),
        LEFT + WIDTH
    );
}

pub fn svg(results: &Results) -> String {
    let mut svg = String::new();
    let (width, height) = (980, 640);
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="{width}" height="{height}" fill="white"/>"#
    );
    let m = &results.machine;
    let _ = writeln!(
        svg,
        r#"<text x="70" y="20" font-size="12">redis-ratelimit: {} clients, median of {} runs (whiskers: min..max); {}, {} cores, redis {}, {}</text>"#,
        results.clients,
        results.repetitions,
        escape(&m.cpu_model),
        m.nproc,
        escape(m.redis_version.split_whitespace().next().unwrap_or("?")),
        escape(m.date_utc.split_whitespace().next().unwrap_or("?"))
    );
    let legend = [
        (NATIVE_COLOR, "native RATELIMIT.CHECK"),
        (LUA_COLOR, "Lua reference script (EVALSHA)"),
        (FLOOR_COLOR, "built-in floors"),
    ];
    for (i, (color, label)) in legend.iter().enumerate() {
        let lx = 70 + i * 260;
        let _ = writeln!(
            svg,
            r#"<rect x="{lx}" y="30" width="12" height="12" fill="{color}"/><text x="{}" y="40" font-size="12">{label}</text>"#,
            lx + 18
        );
    }
    let groups = |group: Group, floors: &[Subject]| -> Vec<BarGroup> {
        let mut groups: Vec<BarGroup> = ALGORITHMS
            .iter()
            .enumerate()
            .map(|(a, (name, _, _))| {
                (
                    name.to_string(),
                    vec![
                        (NATIVE_COLOR, rps(results, group, Subject::Native(a))),
                        (LUA_COLOR, rps(results, group, Subject::Lua(a))),
                    ],
                )
            })
            .collect();
        for &floor in floors {
            let label = match floor {
                Subject::SetPxat => "SET PXAT".to_string(),
                other => other.label(),
            };
            groups.push((label, vec![(FLOOR_COLOR, rps(results, group, floor))]));
        }
        groups
    };
    panel(
        &mut svg,
        50.0,
        &format!(
            "Consuming CHECK, {} random keys, pipeline 16",
            count(results.keyspace)
        ),
        &groups(P16, &[Subject::SetPxat, Subject::Incr, Subject::Ping]),
    );
    panel(
        &mut svg,
        340.0,
        "Rejected CHECK, one hot key over its limit, pipeline 16",
        &groups(HOT16, &[Subject::Incr]),
    );
    svg.push_str("</svg>\n");
    svg
}
