//! The run's results: Markdown tables (the ones docs/benchmarks.md quotes) and JSON (every
//! repetition, json.rs).

mod json;

use std::fmt::Write as _;

pub use json::json;

use crate::model::*;
use crate::parse::Summary;

const P16: Group = Group::Random { pipeline: 16 };
const P1: Group = Group::Random { pipeline: 1 };
const HOT16: Group = Group::Hot { pipeline: 16 };
const ALONE: Group = Group::Replica { attached: false };
const REPLICATED: Group = Group::Replica { attached: true };

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

/// Throughput of `a` over `b`'s, medians.
fn speedup(results: &Results, a: (Group, Subject), b: (Group, Subject)) -> Option<f64> {
    ratio(rps(results, a.0, a.1), rps(results, b.0, b.1))
}

/// usec_per_call of `a` over `b`'s, medians.
fn dearer(results: &Results, a: (Group, Subject), b: (Group, Subject)) -> Option<f64> {
    ratio(usec(results, a.0, a.1), usec(results, b.0, b.1))
}

fn x(value: Option<f64>) -> String {
    value.map_or("n/a".into(), |v| format!("{v:.2}x"))
}

/// `median [min..max]` in thousands.
fn kilo(s: Option<Summary>) -> String {
    plain(
        s.map(|s| Summary {
            median: s.median / 1e3,
            min: s.min / 1e3,
            max: s.max / 1e3,
        }),
        1,
    )
}

/// `median [min..max]`.
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

/// Writes a table under a `####` title and its introduction; nothing when it has no rows.
fn table(md: &mut String, title: &str, intro: &str, head: &[&str], rows: &[Vec<String>]) {
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(md, "#### {title}\n");
    if !intro.is_empty() {
        let _ = writeln!(md, "{intro}\n");
    }
    let _ = writeln!(md, "| {} |", head.join(" | "));
    let _ = writeln!(md, "|{}", "---|".repeat(head.len()));
    for row in rows {
        let _ = writeln!(md, "| {} |", row.join(" | "));
    }
    md.push('\n');
}

pub fn markdown(results: &Results) -> String {
    let mut md = String::new();
    header(&mut md, results);
    let keys = count(results.keyspace);
    table(
        &mut md,
        "Module, Functions library and Lua scripts (kreq/s, pipeline 16)",
        &format!("Consuming calls over {keys} random keys, rejected calls on one hot key."),
        &[
            "algorithm",
            "calls",
            "module",
            "library",
            "Lua script",
            "module / Lua",
            "module / library",
            "library / Lua",
            "usec/call: module / library / Lua",
        ],
        &scripts_rows(results),
    );
    table(
        &mut md,
        "The module against the built-in floors (pipeline 16)",
        &format!(
            "Consuming calls over {keys} random keys against `SET k v PXAT t`; rejected calls on \
             one hot key against `INCR` on one hot key; latency at pipeline 1, consuming."
        ),
        &[
            "command",
            "consuming kreq/s",
            "vs SET PXAT",
            "usec/call",
            "usec vs SET PXAT",
            "rejected kreq/s",
            "vs INCR",
            "P1 p50 / p99 ms",
        ],
        &floor_rows(results),
    );
    table(
        &mut md,
        "`CL.THROTTLE`: the module against redis-cell (pipeline 16)",
        "",
        &[
            "command",
            "consuming kreq/s",
            "vs redis-cell",
            "usec/call",
            "rejected kreq/s",
            "vs redis-cell",
            "bytes per added key",
        ],
        &throttle_rows(results),
    );
    table(
        &mut md,
        &format!(
            "Without and with a replica attached (consuming, {keys} random keys, pipeline 16)"
        ),
        "A second redis-server (the same binary and module, unmeasured) replicates from the \
         measured one: a CHECK replicates the state it wrote, `SET` and `INCR` themselves.",
        &[
            "command",
            "kreq/s alone",
            "kreq/s with a replica",
            "with / alone",
            "vs SET PXAT: alone / with a replica",
            "usec vs SET PXAT: alone / with a replica",
        ],
        &replica_rows(results),
    );
    table(
        &mut md,
        "RESP2 and RESP3 clients (`RATELIMIT.CHECK`, pipeline 16)",
        &format!(
            "{} clients of the bench's own load generator, `HELLO 3` first for RESP3 (a map with \
             a boolean `allowed`; RESP2: six integers).",
            results.clients
        ),
        &[
            "algorithm",
            "calls",
            "RESP2 kreq/s",
            "RESP3 kreq/s",
            "RESP3 / RESP2",
            "usec RESP3 / RESP2",
        ],
        &resp_rows(results),
    );
    table(
        &mut md,
        "Memory per key (`rl:` + 12 digits: 15-byte names)",
        &format!(
            "Average: the `used_memory` delta over all the keys (hash tables included). Per added \
             key: the delta between two counts in the same power-of-two bracket. Each key holds \
             one call of `{MEMORY_LIMIT}` per `{MEMORY_PERIOD_MS}` ms (burst = limit), or \
             `CL.THROTTLE key {}`; the last token-bucket row has the consuming cases' parameters, \
             too wide for a word.",
            THROTTLE_MEMORY_ARGS.join(" ")
        ),
        &[
            "keys",
            "count",
            "average / key",
            "per added key",
            "vs SET PXAT",
            "MEMORY USAGE",
        ],
        &memory_rows(results),
    );
    scaling(&mut md, results);
    for note in &results.notes {
        let _ = writeln!(md, "Note: {note}\n");
    }
    md
}

/// What, where and how: the lines `results.md` keeps and the page leaves to it.
fn header(md: &mut String, results: &Results) {
    let m = &results.machine;
    let _ = writeln!(md, "### Results: {}\n", m.date_utc);
    let _ = writeln!(
        md,
        "Machine: {} ({} cores), Linux {}, redis-server {}; module {}.  ",
        m.cpu_model, m.nproc, m.kernel, m.redis_version, m.module_revision
    );
    let _ = writeln!(
        md,
        "Run: {} mode, {} repetitions interleaved round by round, {} clients, about {:.2} s a \
         run, {:.0} s in all; load average {} before, {} after; {}.  ",
        if results.quick { "quick" } else { "full" },
        results.repetitions,
        results.clients,
        results.run_seconds_target,
        results.total_seconds,
        m.load_before,
        m.load_after,
        if results.pinned {
            "redis-server on CPU 0, the clients on CPU 1"
        } else {
            "not pinned"
        }
    );
    let _ = writeln!(
        md,
        "Cells: median [min..max] of the repetitions; ratios of medians. Consuming: \
         `{CONSUME_LIMIT}` per `{CONSUME_PERIOD_MS}` ms, every call admitted and written; \
         `CL.THROTTLE key {}`. Rejected: limit {REJECT_LIMIT}, exhausted; `CL.THROTTLE key {}`. \
         {}\n",
        THROTTLE_ARGS.join(" "),
        THROTTLE_REJECT_ARGS.join(" "),
        match &results.redis_cell {
            Some(cell) => format!("{cell} on a second redis-server, in the same rounds."),
            None => "redis-cell was not measured (`../shared/peers/` absent).".into(),
        }
    );
}

fn scripts_rows(results: &Results) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for (a, (name, _, _)) in ALGORITHMS.iter().enumerate() {
        let (native, library, lua) = (Subject::Native(a), Subject::Library(a), Subject::Lua(a));
        for (group, calls) in [(P16, "consuming"), (HOT16, "rejected")] {
            if results.case(group, native).is_none() {
                continue;
            }
            let k = |s| median(rps(results, group, s).map(|r| r.median / 1e3).map(flat), 1);
            let u = |s| median(usec(results, group, s), 1);
            rows.push(vec![
                name.to_string(),
                calls.into(),
                k(native),
                k(library),
                k(lua),
                x(speedup(results, (group, native), (group, lua))),
                x(speedup(results, (group, native), (group, library))),
                x(speedup(results, (group, library), (group, lua))),
                format!("{} / {} / {}", u(native), u(library), u(lua)),
            ]);
        }
    }
    rows
}

fn flat(v: f64) -> Summary {
    Summary {
        median: v,
        min: v,
        max: v,
    }
}

fn floor_rows(results: &Results) -> Vec<Vec<String>> {
    let mut subjects: Vec<Subject> = (0..ALGORITHMS.len()).map(Subject::Native).collect();
    subjects.extend([
        Subject::Throttle,
        Subject::SetPxat,
        Subject::Incr,
        Subject::Ping,
    ]);
    let set = (P16, Subject::SetPxat);
    subjects
        .into_iter()
        .filter(|&s| results.case(P16, s).is_some())
        .map(|s| {
            let limiter = s.is_limiter();
            let p1 = results.case(P1, s);
            vec![
                s.label(),
                kilo(rps(results, P16, s)),
                if limiter {
                    x(speedup(results, (P16, s), set))
                } else {
                    String::new()
                },
                plain(usec(results, P16, s), 2),
                if s == Subject::SetPxat {
                    String::new()
                } else {
                    x(dearer(results, (P16, s), set))
                },
                results
                    .case(HOT16, s)
                    .map_or(String::new(), |c| kilo(c.rps())),
                if limiter {
                    x(speedup(results, (HOT16, s), (HOT16, Subject::Incr)))
                } else {
                    String::new()
                },
                format!(
                    "{} / {}",
                    median(p1.and_then(CaseResult::p50), 3),
                    median(p1.and_then(CaseResult::p99), 3)
                ),
            ]
        })
        .collect()
}

fn throttle_rows(results: &Results) -> Vec<Vec<String>> {
    let cell = Subject::Cell;
    [Subject::Throttle, Subject::Native(GCRA), cell]
        .into_iter()
        .filter(|&s| results.case(P16, s).is_some())
        .map(|s| {
            let vs = |group| {
                if s == cell {
                    String::new()
                } else {
                    x(speedup(results, (group, s), (group, cell)))
                }
            };
            let memory_id = match s {
                Subject::Native(a) => format!("{}/native", ALGORITHMS[a].0),
                other => other.id(),
            };
            let label = match s {
                Subject::Native(_) => "RATELIMIT.CHECK ... gcra".to_string(),
                other => other.label(),
            };
            vec![
                label,
                kilo(rps(results, P16, s)),
                vs(P16),
                plain(usec(results, P16, s), 2),
                kilo(rps(results, HOT16, s)),
                vs(HOT16),
                bytes(results.bytes_per_key(&memory_id)),
            ]
        })
        .collect()
}

fn replica_rows(results: &Results) -> Vec<Vec<String>> {
    let subjects = [Subject::SetPxat, Subject::Incr]
        .into_iter()
        .chain((0..ALGORITHMS.len()).map(Subject::Native));
    subjects
        .filter(|&s| results.case(ALONE, s).is_some() && results.case(REPLICATED, s).is_some())
        .map(|s| {
            let pair = |f: &dyn Fn(Group) -> Option<f64>| {
                if s == Subject::SetPxat {
                    String::new()
                } else {
                    format!("{} / {}", x(f(ALONE)), x(f(REPLICATED)))
                }
            };
            vec![
                s.label(),
                kilo(rps(results, ALONE, s)),
                kilo(rps(results, REPLICATED, s)),
                x(speedup(results, (REPLICATED, s), (ALONE, s))),
                pair(&|g| speedup(results, (g, s), (g, Subject::SetPxat))),
                pair(&|g| dearer(results, (g, s), (g, Subject::SetPxat))),
            ]
        })
        .collect()
}

fn resp_rows(results: &Results) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for (a, (name, _, _)) in ALGORITHMS.iter().enumerate() {
        let s = Subject::Native(a);
        for (hot, calls) in [(false, "consuming"), (true, "rejected")] {
            let two = Group::Resp { protocol: 2, hot };
            let three = Group::Resp { protocol: 3, hot };
            if results.case(two, s).is_none() {
                continue;
            }
            rows.push(vec![
                name.to_string(),
                calls.into(),
                kilo(rps(results, two, s)),
                kilo(rps(results, three, s)),
                x(speedup(results, (three, s), (two, s))),
                x(dearer(results, (three, s), (two, s))),
            ]);
        }
    }
    rows
}

fn memory_rows(results: &Results) -> Vec<Vec<String>> {
    let set = results
        .memory("set-pxat")
        .and_then(|m| m.marginal)
        .map(|(_, b)| b);
    results
        .memory
        .iter()
        .map(|m| {
            let (added, vs_set) = match m.marginal {
                Some((from, b)) => (
                    format!("{b:.0} B ({}..{})", count(from), count(m.keys)),
                    match set {
                        Some(set) if m.id != "set-pxat" => format!("{:+.0} B", b - set),
                        _ => String::new(),
                    },
                ),
                None => (String::new(), String::new()),
            };
            vec![
                m.label.clone(),
                count(m.keys),
                format!("{:.0} B", m.bytes_per_key),
                added,
                vs_set,
                m.memory_usage.map_or(String::new(), |b| format!("{b} B")),
            ]
        })
        .collect()
}

/// usec_per_call of consuming calls as the keyspace grows: one column a size.
fn scaling(md: &mut String, results: &Results) {
    let mut sizes: Vec<u64> = results
        .scaling
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut head: Vec<String> = vec!["command".into()];
    head.extend(sizes.iter().map(|&k| format!("{} keys", count(k))));
    head.push("largest / smallest".into());
    let rows: Vec<Vec<String>> = results
        .scaling
        .iter()
        .map(|s| {
            let mut row = vec![s.subject.label()];
            for &k in &sizes {
                let point = s.points.iter().find(|p| p.0 == k);
                row.push(point.map_or("not run".into(), |p| plain(p.1, 2)));
            }
            let (first, last) = (s.points.first(), s.points.last());
            row.push(x(first.zip(last).and_then(|(f, l)| ratio(l.1, f.1))));
            row
        })
        .collect();
    let head: Vec<&str> = head.iter().map(String::as_str).collect();
    table(
        md,
        "Cost per call as the keyspace grows (consuming, pipeline 16; usec_per_call)",
        "",
        &head,
        &rows,
    );
}
