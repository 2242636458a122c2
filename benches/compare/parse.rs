//! Parsing what the tools print: `redis-benchmark --csv`, `INFO` and `INFO commandstats`, plus
//! the median/min/max summaries every cell of the report shows.

/// One `redis-benchmark --csv` result line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BenchLine {
    pub rps: f64,
    pub avg_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// Parses `redis-benchmark --csv` output: a header line naming the columns, then one quoted line
/// per test (one here: a single custom command). Columns are found by name, so the order may
/// change between versions; `rps` is required, the latency columns default to NaN when absent.
pub fn parse_benchmark_csv(text: &str) -> Result<BenchLine, String> {
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('"'))
        .map(split_csv);
    let header = lines
        .next()
        .ok_or_else(|| format!("no CSV header in redis-benchmark output: {text:?}"))?;
    let row = lines
        .next()
        .ok_or_else(|| format!("no CSV result line in redis-benchmark output: {text:?}"))?;
    let column = |name: &str| -> Option<f64> {
        let i = header.iter().position(|h| h == name)?;
        row.get(i)?.parse().ok()
    };
    let rps = column("rps").ok_or_else(|| format!("no rps column in {text:?}"))?;
    if !(rps.is_finite() && rps > 0.0) {
        return Err(format!("redis-benchmark reported rps {rps}"));
    }
    Ok(BenchLine {
        rps,
        avg_ms: column("avg_latency_ms").unwrap_or(f64::NAN),
        p50_ms: column("p50_latency_ms").unwrap_or(f64::NAN),
        p99_ms: column("p99_latency_ms").unwrap_or(f64::NAN),
        max_ms: column("max_latency_ms").unwrap_or(f64::NAN),
    })
}

/// Splits one CSV line of double-quoted fields (redis-benchmark quotes every field; a quote
/// inside a field is doubled).
fn split_csv(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    fields.push(field);
    fields
}

/// `INFO` text as field -> value: the test harness's parser.
pub use crate::common::parse_info;

/// One `cmdstat_<name>` line of `INFO commandstats`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CmdStat {
    pub calls: u64,
    pub usec: u64,
    pub usec_per_call: f64,
    pub failed_calls: u64,
    pub rejected_calls: u64,
}

/// The `cmdstat_<command>` entry of an `INFO commandstats` reply (`None` when the command was
/// not called since the last `CONFIG RESETSTAT`).
pub fn parse_cmdstat(text: &str, command: &str) -> Option<CmdStat> {
    let info = parse_info(text);
    let line = info.get(&format!("cmdstat_{command}"))?;
    let mut stat = CmdStat::default();
    for pair in line.split(',') {
        let (name, value) = pair.split_once('=')?;
        match name {
            "calls" => stat.calls = value.parse().ok()?,
            "usec" => stat.usec = value.parse().ok()?,
            "usec_per_call" => stat.usec_per_call = value.parse().ok()?,
            "failed_calls" => stat.failed_calls = value.parse().ok()?,
            "rejected_calls" => stat.rejected_calls = value.parse().ok()?,
            _ => {}
        }
    }
    // usec_per_call is printed with two decimals: recompute it exactly.
    if stat.calls > 0 {
        stat.usec_per_call = stat.usec as f64 / stat.calls as f64;
    }
    Some(stat)
}

/// Median, min and max of a few repetitions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// `None` for no (finite) values. An even count takes the mean of the middle two.
    pub fn of(values: &[f64]) -> Option<Summary> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Summary {
            median,
            min: v[0],
            max: v[n - 1],
        })
    }
}
