//! The run's results as Markdown (tables of the comparisons), JSON and an SVG bar chart.

use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::model::*;
use crate::parse::Summary;

const P16: Group = Group::Random { pipeline: 16 };
const P1: Group = Group::Random { pipeline: 1 };
const HOT16: Group = Group::Hot { pipeline: 16 };
const HOT1: Group = Group::Hot { pipeline: 1 };
const ALONE: Group = Group::Replica { attached: false };
const REPLICATED: Group = Group::Replica { attached: true };

/// The subjects of the replica phase, in table order.
fn replica_subjects() -> Vec<Subject> {
    [Subject::SetPxat, Subject::Incr]
        .into_iter()
        .chain((0..ALGORITHMS.len()).map(Subject::Native))
        .collect()
}

fn resp_group(protocol: u8, hot: bool) -> Group {
    Group::Resp { protocol, hot }
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

/// Throughput of `a` over `b`'s, medians, in one workload.
fn speedup(results: &Results, group: Group, a: Subject, b: Subject) -> Option<f64> {
    ratio(rps(results, group, a), rps(results, group, b))
}

/// Throughput of one case over another's, across workloads.
fn speedup_across(results: &Results, a: (Group, Subject), b: (Group, Subject)) -> Option<f64> {
    ratio(rps(results, a.0, a.1), rps(results, b.0, b.1))
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

fn bytes(b: Option<f64>) -> String {
    b.map_or("n/a".into(), |b| format!("{b:.0} B"))
}

/// One comparison the run measured: what over what, and by how much.
#[derive(Clone, Debug)]
pub struct Ratio {
    pub id: String,
    pub description: String,
    pub value: Option<f64>,
}

/// Every ratio the report states, from what the run measured (the JSON lists them all).
pub fn ratios(results: &Results) -> Vec<Ratio> {
    let mut out = Vec::new();
    let mut push = |id: String, description: String, value: Option<f64>| {
        out.push(Ratio {
            id,
            description,
            value,
        });
    };
    for (group, what) in [
        (P16, "consuming calls over random keys, pipeline 16"),
        (HOT16, "rejected calls on a hot key, pipeline 16"),
    ] {
        let g = group.id();
        for (a, &(name, _, _)) in ALGORITHMS.iter().enumerate() {
            let (native, library, lua) = (Subject::Native(a), Subject::Library(a), Subject::Lua(a));
            push(
                format!("{name}/module-over-library/{g}"),
                format!("{name}: RATELIMIT.CHECK throughput / FCALL ratelimit_check's, {what}"),
                speedup(results, group, native, library),
            );
            push(
                format!("{name}/library-over-lua/{g}"),
                format!("{name}: FCALL ratelimit_check throughput / its Lua script's, {what}"),
                speedup(results, group, library, lua),
            );
            push(
                format!("{name}/module-over-lua/{g}"),
                format!("{name}: RATELIMIT.CHECK throughput / its Lua script's, {what}"),
                speedup(results, group, native, lua),
            );
        }
        push(
            format!("cl-throttle/ours-over-redis-cell/{g}"),
            format!("CL.THROTTLE throughput, ours / redis-cell's, {what}"),
            speedup(results, group, Subject::Throttle, Subject::Cell),
        );
        push(
            format!("gcra/check-over-redis-cell/{g}"),
            format!("RATELIMIT.CHECK gcra throughput / redis-cell's CL.THROTTLE, {what}"),
            speedup(results, group, Subject::Native(GCRA), Subject::Cell),
        );
    }
    for subject in limiter_subjects(true) {
        if !matches!(subject, Subject::Native(_) | Subject::Throttle) {
            continue;
        }
        let label = subject.label();
        push(
            format!("{}/over-set-pxat/{}", subject.id(), P16.id()),
            format!("{label}: consuming throughput / SET PXAT's, random keys, pipeline 16"),
            speedup(results, P16, subject, Subject::SetPxat),
        );
        push(
            format!("{}/usec-over-set-pxat/{}", subject.id(), P16.id()),
            format!("{label}: usec_per_call of a consuming call / SET PXAT's"),
            ratio(
                usec(results, P16, subject),
                usec(results, P16, Subject::SetPxat),
            ),
        );
        push(
            format!("{}/over-incr/{}", subject.id(), HOT16.id()),
            format!("{label}: rejected throughput on a hot key / INCR's on a hot key, pipeline 16"),
            speedup(results, HOT16, subject, Subject::Incr),
        );
    }
    for subject in replica_subjects() {
        let label = subject.label();
        push(
            format!("{}/replica-over-alone/random-p16", subject.id()),
            format!("{label}: consuming throughput with a replica attached / without"),
            speedup_across(results, (REPLICATED, subject), (ALONE, subject)),
        );
        if subject.is_limiter() {
            for (group, with) in [(ALONE, "without a replica"), (REPLICATED, "with a replica")] {
                push(
                    format!("{}/over-set-pxat/{}", subject.id(), group.id()),
                    format!("{label}: consuming throughput / SET PXAT's, {with}"),
                    speedup(results, group, subject, Subject::SetPxat),
                );
                push(
                    format!("{}/usec-over-set-pxat/{}", subject.id(), group.id()),
                    format!("{label}: usec_per_call of a consuming call / SET PXAT's, {with}"),
                    ratio(
                        usec(results, group, subject),
                        usec(results, group, Subject::SetPxat),
                    ),
                );
            }
        }
    }
    for a in 0..ALGORITHMS.len() {
        let subject = Subject::Native(a);
        for (hot, calls) in [(false, "consuming"), (true, "rejected")] {
            let (two, three) = (resp_group(2, hot), resp_group(3, hot));
            push(
                format!("{}/resp3-over-resp2/{}", subject.id(), three.id()),
                format!(
                    "{}: {calls} throughput from RESP3 clients / from RESP2 clients",
                    subject.label()
                ),
                speedup_across(results, (three, subject), (two, subject)),
            );
            push(
                format!("{}/usec-resp3-over-resp2/{}", subject.id(), three.id()),
                format!(
                    "{}: usec_per_call of a {calls} call from RESP3 clients / RESP2 clients",
                    subject.label()
                ),
                ratio(usec(results, three, subject), usec(results, two, subject)),
            );
        }
    }
    let memory_ratio = |a: &str, b: &str| {
        results
            .bytes_per_key(a)
            .zip(results.bytes_per_key(b))
            .map(|(a, b)| a / b)
    };
    push(
        "memory/cl-throttle/ours-over-redis-cell".into(),
        "bytes per CL.THROTTLE key, ours / redis-cell's".into(),
        memory_ratio("cl-throttle/ours", "cl-throttle/redis-cell"),
    );
    for (a, &(name, _, _)) in ALGORITHMS.iter().enumerate() {
        let (native, library) = if a == SLIDING_LOG {
            (
                "sliding-log/native-100".to_string(),
                "sliding-log/library-100".to_string(),
            )
        } else {
            (format!("{name}/native"), format!("{name}/library"))
        };
        push(
            format!("memory/{name}/module-over-library"),
            format!("bytes per {name} key, module / library"),
            memory_ratio(&native, &library),
        );
    }
    for log in ["native", "library"] {
        push(
            format!("memory/sliding-log/{log}-over-seed-zset"),
            format!("bytes per 100-entry sliding log, {log} / the seed ZSET script's"),
            memory_ratio(
                &format!("sliding-log/{log}-100"),
                "sliding-log/seed-zset-100",
            ),
        );
    }
    for scaling in &results.scaling {
        let (Some(first), Some(last)) = (scaling.points.first(), scaling.points.last()) else {
            continue;
        };
        push(
            format!("{}/usec-growth", scaling.subject.id()),
            format!(
                "{}: usec_per_call with {} keys / with {} keys",
                scaling.subject.label(),
                count(last.0),
                count(first.0)
            ),
            growth(scaling),
        );
    }
    if let (Some(first), Some(last)) = (results.log_scaling.first(), results.log_scaling.last()) {
        for (what, get) in log_columns() {
            push(
                format!("sliding-log/usec-growth/{}", what.replace(' ', "-")),
                format!(
                    "sliding-log, {what}: usec_per_call at limit {} / at limit {}",
                    count(last.limit),
                    count(first.limit)
                ),
                ratio(get(last), get(first)),
            );
        }
    }
    out
}

type LogColumn = (&'static str, fn(&LogScalingResult) -> Option<Summary>);

/// The sliding-log scaling table's columns.
fn log_columns() -> [LogColumn; 4] {
    [
        ("native consuming", |r| r.native_consume),
        ("native rejected", |r| r.native_reject),
        ("Lua consuming", |r| r.lua_consume),
        ("Lua rejected", |r| r.lua_reject),
    ]
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
         exhausted first. Module: `RATELIMIT.CHECK`. Library: `FCALL ratelimit_check` of \
         `lua-reference/functions/ratelimit.lua`. Lua: `EVALSHA` of \
         `lua-reference/<algorithm>.lua` with the server's clock (empty `now_ms`). \
         `CL.THROTTLE key {}` (consuming) and `CL.THROTTLE key {}` (rejected).  ",
        THROTTLE_ARGS.join(" "),
        THROTTLE_REJECT_ARGS.join(" ")
    );
    match &results.redis_cell {
        Some(cell) => {
            let _ = writeln!(
                md,
                "{cell} ran on a second redis-server (the same binary and settings{}), in the \
                 same interleaved rounds: it registers `CL.THROTTLE` as the module does, so the \
                 two cannot share a server.\n",
                if results.pinned { ", on CPU 0 too" } else { "" }
            );
        }
        None => md.push_str(
            "redis-cell was not measured: `../shared/peers/libredis_cell.so` is absent.\n\n",
        ),
    }

    comparisons_markdown(&mut md, results);

    let _ = writeln!(
        md,
        "#### Every command, consuming calls over {} random keys (kreq/s; usec_per_call from \
         INFO commandstats)\n",
        count(results.keyspace)
    );
    md.push_str(
        "| command | P16 kreq/s | vs its Lua script | vs INCR | vs SET PXAT | P16 usec/call | \
         usec vs SET PXAT | P1 kreq/s | P1 p50 / p99 ms |\n",
    );
    md.push_str("|---|---|---|---|---|---|---|---|---|\n");
    let set_usec = usec(results, P16, Subject::SetPxat);
    for subject in table_subjects(true) {
        let Some(case) = results.case(P16, subject) else {
            continue;
        };
        let vs = |other: Subject| x(ratio(case.rps(), rps(results, P16, other)));
        let vs_lua = match subject {
            Subject::Native(a) | Subject::Library(a) => vs(Subject::Lua(a)),
            _ => String::new(),
        };
        let (vs_incr, vs_set, vs_set_usec) = match subject {
            Subject::Incr | Subject::Ping => (
                String::new(),
                String::new(),
                x(ratio(case.usec(), set_usec)),
            ),
            Subject::SetPxat => (vs(Subject::Incr), String::new(), String::new()),
            _ => (
                vs(Subject::Incr),
                vs(Subject::SetPxat),
                x(ratio(case.usec(), set_usec)),
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
        "\n#### Every command, rejected calls on one hot key over its limit (no write, no \
         replication)\n\n",
    );
    md.push_str(
        "| command | P16 kreq/s | vs its Lua script | vs INCR | P16 usec/call | P1 kreq/s | \
         P1 p50 / p99 ms |\n",
    );
    md.push_str("|---|---|---|---|---|---|---|\n");
    for subject in table_subjects(false) {
        let Some(case) = results.case(HOT16, subject) else {
            continue;
        };
        let vs = |other: Subject| x(ratio(case.rps(), rps(results, HOT16, other)));
        let vs_lua = match subject {
            Subject::Native(a) | Subject::Library(a) => vs(Subject::Lua(a)),
            _ => String::new(),
        };
        let vs_incr = if subject.is_limiter() {
            vs(Subject::Incr)
        } else {
            String::new()
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
        let _ = write!(
            md,
            "Each key holds one call: `{MEMORY_LIMIT}` per `{MEMORY_PERIOD_MS}` ms for the module, \
             the library and the scripts (burst = limit), `CL.THROTTLE key {}` for both \
             `CL.THROTTLE`s. The module keeps such a key as one word beside an entry shared by \
             the keys of the same parameters; parameters too wide for a word (the last token-bucket \
             row) take its 32-byte form.\n\n",
            THROTTLE_MEMORY_ARGS.join(" "),
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
        let zset = results.bytes_per_key("sliding-log/seed-zset-100");
        let logs: Vec<String> = [("native", "the module's"), ("library", "the library's")]
            .iter()
            .filter_map(|(id, whose)| {
                let b = results.bytes_per_key(&format!("sliding-log/{id}-100"))?;
                Some(format!(
                    "{whose} {b:.0} B ({} the seed ZSET script's)",
                    x(zset.map(|z| b / z))
                ))
            })
            .collect();
        if !logs.is_empty() {
            let _ = writeln!(
                md,
                "\nA sliding log of 100 entries: {}; the seed ZSET script's {}.",
                logs.join(", "),
                bytes(zset)
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
        md.push_str("| limit |");
        for (what, _) in log_columns() {
            let _ = write!(md, " {what} |");
        }
        md.push_str(" note |\n|---|---|---|---|---|---|\n");
        for r in &results.log_scaling {
            let _ = write!(md, "| {} |", count(r.limit));
            for (_, get) in log_columns() {
                let _ = write!(md, " {} |", plain(get(r), 2));
            }
            let _ = writeln!(md, " {} |", r.note.as_deref().unwrap_or(""));
        }
        if let (Some(first), Some(last)) = (results.log_scaling.first(), results.log_scaling.last())
        {
            let _ = write!(md, "| {} / {} |", count(last.limit), count(first.limit));
            for (_, get) in log_columns() {
                let _ = write!(md, " {} |", x(ratio(get(last), get(first))));
            }
            md.push_str(" |\n");
        }
    }

    if !results.lease_scaling.is_empty() {
        md.push_str(
            "\n#### Concurrency: cost per call as the live leases grow (usec_per_call; one key \
             holding `leases` leases of 16-byte ids; a new lease is acquired then released, so \
             the set stays at that size)\n\n",
        );
        md.push_str(
            "| live leases | ACQUIRE (new) | RELEASE | ACQUIRE (renewal) | MEMORY USAGE | \
             used_memory per lease |\n|---|---|---|---|---|---|\n",
        );
        for r in &results.lease_scaling {
            let per_lease = r
                .used_memory_per_lease
                .map_or_else(String::new, |b| format!("{b:.1} B"));
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {per_lease} |",
                count(r.leases),
                plain(r.acquire, 2),
                plain(r.release, 2),
                plain(r.renew, 2),
                r.memory_usage
            );
        }
    }

    for note in &results.notes {
        let _ = writeln!(md, "\nNote: {note}");
    }
    md
}

/// The two comparisons of the report's head: the module against the library and the Lua
/// scripts, and `CL.THROTTLE` against redis-cell's.
fn comparisons_markdown(md: &mut String, results: &Results) {
    let _ = writeln!(
        md,
        "#### Module, Functions library and Lua scripts (kreq/s at pipeline 16)\n\n\
         Consuming calls over {} random keys, and rejected calls on one hot key.\n",
        count(results.keyspace)
    );
    md.push_str(
        "| algorithm | calls | module kreq/s | library kreq/s | Lua script kreq/s | \
         module / library | library / Lua | usec/call: module / library / Lua |\n",
    );
    md.push_str("|---|---|---|---|---|---|---|---|\n");
    for (a, (name, _, _)) in ALGORITHMS.iter().enumerate() {
        let (native, library, lua) = (Subject::Native(a), Subject::Library(a), Subject::Lua(a));
        for (group, calls) in [(P16, "consuming"), (HOT16, "rejected")] {
            let k = |subject| median(rps(results, group, subject).map(thousands), 1);
            let u = |subject| median(usec(results, group, subject), 1);
            let _ = writeln!(
                md,
                "| {name} | {calls} | {} | {} | {} | {} | {} | {} / {} / {} |",
                k(native),
                k(library),
                k(lua),
                x(speedup(results, group, native, library)),
                x(speedup(results, group, library, lua)),
                u(native),
                u(library),
                u(lua),
            );
        }
    }
    let memory_row = |label: &str, native: &str, library: &str, lua: Option<&str>| {
        let (n, l) = (
            results.bytes_per_key(native),
            results.bytes_per_key(library),
        );
        let z = lua.and_then(|id| results.bytes_per_key(id));
        format!(
            "| {label} | {} | {} | {} | {} |\n",
            bytes(n),
            bytes(l),
            bytes(z),
            x(n.zip(l).map(|(n, l)| n / l))
        )
    };
    md.push_str(
        "\nMemory per added key (see the memory table below):\n\n\
         | key | module | library | Lua script | module / library |\n|---|---|---|---|---|\n",
    );
    for (a, (name, _, _)) in ALGORITHMS.iter().enumerate() {
        md.push_str(&if a == SLIDING_LOG {
            memory_row(
                "sliding-log, 100 entries",
                "sliding-log/native-100",
                "sliding-log/library-100",
                Some("sliding-log/lua-zset-100"),
            )
        } else {
            let lua = format!("{name}/lua");
            memory_row(
                name,
                &format!("{name}/native"),
                &format!("{name}/library"),
                Some(&lua),
            )
        });
    }

    md.push_str("\n#### `CL.THROTTLE`: the module against redis-cell (pipeline 16)\n\n");
    if results.redis_cell.is_none() {
        md.push_str("redis-cell not measured (`../shared/peers/` absent).\n\n");
    }
    let cell_bytes = results.bytes_per_key(&Subject::Cell.id());
    md.push_str(
        "| command | consuming kreq/s | vs redis-cell | usec/call | rejected (hot key) kreq/s | \
         vs redis-cell | bytes per added key | vs redis-cell |\n",
    );
    md.push_str("|---|---|---|---|---|---|---|---|\n");
    for subject in [Subject::Throttle, Subject::Native(GCRA), Subject::Cell] {
        let (vs, vs_hot) = if subject == Subject::Cell {
            (String::new(), String::new())
        } else {
            (
                x(speedup(results, P16, subject, Subject::Cell)),
                x(speedup(results, HOT16, subject, Subject::Cell)),
            )
        };
        let memory_id = match subject {
            Subject::Native(a) => format!("{}/native", ALGORITHMS[a].0),
            other => other.id(),
        };
        let b = results.bytes_per_key(&memory_id);
        let vs_bytes = match (subject, b, cell_bytes) {
            (Subject::Cell, _, _) => String::new(),
            (_, Some(b), Some(c)) => format!("{:+.0} B", b - c),
            _ => "n/a".into(),
        };
        let label = match subject {
            Subject::Native(GCRA) => "RATELIMIT.CHECK ... gcra".to_string(),
            other => other.label(),
        };
        let _ = writeln!(
            md,
            "| {label} | {} | {vs} | {} | {} | {vs_hot} | {} | {vs_bytes} |",
            kilo(rps(results, P16, subject)),
            plain(usec(results, P16, subject), 2),
            kilo(rps(results, HOT16, subject)),
            bytes(b),
        );
    }
    md.push('\n');
    replica_markdown(md, results);
    resp_markdown(md, results);
}

/// Consuming calls without and with a replica attached, each CHECK against `SET PXAT` in the
/// same setting.
fn replica_markdown(md: &mut String, results: &Results) {
    if !results.replica {
        return;
    }
    let _ = writeln!(
        md,
        "#### Without and with a replica attached (consuming calls over {} random keys, pipeline \
         16)\n\n\
         The same server measured alone, then with a second redis-server (the same binary and \
         module, unmeasured{}) replicating from it: every write is also sent down the replication \
         stream, as on a master in production. A CHECK replicates the state it wrote; `SET` and \
         `INCR` replicate themselves.\n",
        count(results.keyspace),
        if results.pinned { ", on CPU 1" } else { "" }
    );
    md.push_str(
        "| command | kreq/s alone | kreq/s with a replica | with / alone | vs SET PXAT alone | \
         vs SET PXAT with a replica | usec/call alone | usec/call with a replica | usec vs SET \
         PXAT: alone / with a replica |\n",
    );
    md.push_str("|---|---|---|---|---|---|---|---|---|\n");
    for subject in replica_subjects() {
        if results.case(ALONE, subject).is_none() && results.case(REPLICATED, subject).is_none() {
            continue;
        }
        let vs_set = |group: Group| {
            if subject == Subject::SetPxat {
                String::new()
            } else {
                x(speedup(results, group, subject, Subject::SetPxat))
            }
        };
        let usec_vs_set = if subject == Subject::SetPxat {
            String::new()
        } else {
            let u = |group: Group| {
                x(ratio(
                    usec(results, group, subject),
                    usec(results, group, Subject::SetPxat),
                ))
            };
            format!("{} / {}", u(ALONE), u(REPLICATED))
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {usec_vs_set} |",
            subject.label(),
            kilo(rps(results, ALONE, subject)),
            kilo(rps(results, REPLICATED, subject)),
            x(speedup_across(
                results,
                (REPLICATED, subject),
                (ALONE, subject)
            )),
            vs_set(ALONE),
            vs_set(REPLICATED),
            plain(usec(results, ALONE, subject), 2),
            plain(usec(results, REPLICATED, subject), 2),
        );
    }
    md.push('\n');
}

/// Every algorithm's CHECK from RESP2 and RESP3 clients (the bench's own, both).
fn resp_markdown(md: &mut String, results: &Results) {
    let measured = results
        .cases
        .iter()
        .any(|c| matches!(c.group, Group::Resp { .. }));
    if !measured {
        return;
    }
    let _ = writeln!(
        md,
        "#### RESP2 and RESP3 clients (`RATELIMIT.CHECK`, pipeline 16)\n\n\
         {} clients of the bench's own load generator, which sends `HELLO 3` first on each \
         connection for RESP3 (redis-benchmark speaks RESP2 only): a RESP3 client gets the \
         decision as a map with a boolean `allowed`, a RESP2 client as six integers. Consuming \
         calls over {} random keys, rejected calls on one hot key.\n",
        results.clients,
        count(results.keyspace)
    );
    md.push_str(
        "| algorithm | calls | RESP2 kreq/s | RESP3 kreq/s | RESP3 / RESP2 | usec/call: RESP2 \
         / RESP3 | usec RESP3 / RESP2 |\n",
    );
    md.push_str("|---|---|---|---|---|---|---|\n");
    for (a, (name, _, _)) in ALGORITHMS.iter().enumerate() {
        let subject = Subject::Native(a);
        for (hot, calls) in [(false, "consuming"), (true, "rejected")] {
            let (two, three) = (resp_group(2, hot), resp_group(3, hot));
            if results.case(two, subject).is_none() {
                continue;
            }
            let _ = writeln!(
                md,
                "| {name} | {calls} | {} | {} | {} | {} / {} | {} |",
                kilo(rps(results, two, subject)),
                kilo(rps(results, three, subject)),
                x(speedup_across(results, (three, subject), (two, subject))),
                median(usec(results, two, subject), 2),
                median(usec(results, three, subject), 2),
                x(ratio(
                    usec(results, three, subject),
                    usec(results, two, subject)
                )),
            );
        }
    }
    md.push('\n');
}

fn thousands(s: Summary) -> Summary {
    Summary {
        median: s.median / 1e3,
        min: s.min / 1e3,
        max: s.max / 1e3,
    }
}

/// Rows in table order: the limiters (each algorithm's module, library and Lua script, then the
/// two `CL.THROTTLE`s), then the floors.
fn table_subjects(random: bool) -> Vec<Subject> {
    let mut subjects = limiter_subjects(true);
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
    let lease_scaling: Vec<Value> = results
        .lease_scaling
        .iter()
        .map(|r| {
            json!({
                "leases": r.leases,
                "acquire_usec_per_call": summary_json(r.acquire),
                "release_usec_per_call": summary_json(r.release),
                "renew_usec_per_call": summary_json(r.renew),
                "memory_usage_bytes": r.memory_usage,
                "used_memory_per_lease_bytes": r.used_memory_per_lease,
            })
        })
        .collect();
    let ratios: Vec<Value> = ratios(results)
        .iter()
        .map(|r| {
            json!({
                "id": r.id,
                "description": r.description,
                "value": r.value,
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
        "memory_args": { "limit": MEMORY_LIMIT, "period_ms": MEMORY_PERIOD_MS, "throttle": THROTTLE_MEMORY_ARGS },
        "throttle_reject_args": THROTTLE_REJECT_ARGS,
        "cases": cases,
        "memory": memory,
        "scaling": scaling,
        "sliding_log_scaling": log_scaling,
        "lease_scaling": lease_scaling,
        "ratios": ratios,
        "notes": results.notes,
    });
    serde_json::to_string_pretty(&value).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

// ---- SVG ---------------------------------------------------------------------------------

/// A labelled group of bars, each a color and a throughput summary.
type BarGroup = (String, Vec<(&'static str, Option<Summary>)>);

const NATIVE_COLOR: &str = "#2b6cb0";
const THROTTLE_COLOR: &str = "#63b3ed";
const LIBRARY_COLOR: &str = "#38a169";
const LUA_COLOR: &str = "#dd6b20";
const CELL_COLOR: &str = "#805ad5";
const FLOOR_COLOR: &str = "#718096";
const REPLICA_COLOR: &str = "#d53f8c";

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
    let with_replica = results.case(REPLICATED, Subject::SetPxat).is_some();
    let (width, height) = (980, if with_replica { 950 } else { 660 });
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
        (NATIVE_COLOR, "module: RATELIMIT.CHECK"),
        (LIBRARY_COLOR, "Functions library (FCALL)"),
        (LUA_COLOR, "Lua reference script (EVALSHA)"),
        (THROTTLE_COLOR, "module: CL.THROTTLE"),
        (CELL_COLOR, "redis-cell: CL.THROTTLE"),
        (FLOOR_COLOR, "built-in floors"),
        (REPLICA_COLOR, "with a replica attached"),
    ];
    for (i, (color, label)) in legend.iter().enumerate() {
        let (lx, ly) = (70 + (i % 4) * 220, 30 + (i / 4) * 18);
        let _ = writeln!(
            svg,
            r#"<rect x="{lx}" y="{ly}" width="12" height="12" fill="{color}"/><text x="{}" y="{}" font-size="12">{label}</text>"#,
            lx + 18,
            ly + 10
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
                        (LIBRARY_COLOR, rps(results, group, Subject::Library(a))),
                        (LUA_COLOR, rps(results, group, Subject::Lua(a))),
                    ],
                )
            })
            .collect();
        // gcra's group also holds the two CL.THROTTLEs, which compute it.
        if let Some((_, gcra)) = groups.get_mut(GCRA) {
            gcra.push((THROTTLE_COLOR, rps(results, group, Subject::Throttle)));
            if results.case(group, Subject::Cell).is_some() {
                gcra.push((CELL_COLOR, rps(results, group, Subject::Cell)));
            }
        }
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
        70.0,
        &format!(
            "Consuming calls, {} random keys, pipeline 16",
            count(results.keyspace)
        ),
        &groups(P16, &[Subject::SetPxat, Subject::Incr, Subject::Ping]),
    );
    panel(
        &mut svg,
        360.0,
        "Rejected calls, one hot key over its limit, pipeline 16",
        &groups(HOT16, &[Subject::Incr]),
    );
    if with_replica {
        let bars: Vec<BarGroup> = replica_subjects()
            .into_iter()
            .map(|subject| {
                let (label, color) = match subject {
                    Subject::SetPxat => ("SET PXAT".to_string(), FLOOR_COLOR),
                    Subject::Incr => ("INCR".to_string(), FLOOR_COLOR),
                    Subject::Native(a) => (ALGORITHMS[a].0.to_string(), NATIVE_COLOR),
                    other => (other.label(), NATIVE_COLOR),
                };
                (
                    label,
                    vec![
                        (color, rps(results, ALONE, subject)),
                        (REPLICA_COLOR, rps(results, REPLICATED, subject)),
                    ],
                )
            })
            .collect();
        panel(
            &mut svg,
            650.0,
            &format!(
                "Consuming calls, {} random keys, pipeline 16: alone, then with a replica attached",
                count(results.keyspace)
            ),
            &bars,
        );
    }
    svg.push_str("</svg>\n");
    svg
}
