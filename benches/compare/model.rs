//! What the benchmark measures (the cases) and what it found (the results), shared by the runner
//! and the report.

use crate::parse::Summary;

/// `(name on the command line, Lua reference file stem, short key tag)`.
pub const ALGORITHMS: [(&str, &str, &str); 5] = [
    ("token-bucket", "token_bucket", "tb"),
    ("leaky-bucket", "leaky_bucket", "lb"),
    ("fixed-window", "fixed_window", "fw"),
    ("sliding-window", "sliding_window", "sw"),
    ("sliding-log", "sliding_log", "sl"),
];

/// Limit and period of the consuming cases: so high and so long that every call is admitted and
/// no key refills, drains, slides or expires during the run, so that each call reads and
/// rewrites a live key (burst = limit for the buckets).
pub const CONSUME_LIMIT: &str = "100000";
pub const CONSUME_PERIOD_MS: &str = "60000000000";
/// Limit of the rejected cases: one hot key with limit 1 and the same period, exhausted first.
pub const REJECT_LIMIT: &str = "1";
/// `SET ... PXAT` expiry: 2100-01-01.
pub const FAR_FUTURE_MS: &str = "4102444800000";

/// What a case runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Subject {
    Native(usize),
    Lua(usize),
    SetPxat,
    Incr,
    Ping,
}

impl Subject {
    pub fn id(self) -> String {
        match self {
            Subject::Native(a) => format!("{}/native", ALGORITHMS[a].0),
            Subject::Lua(a) => format!("{}/lua", ALGORITHMS[a].0),
            Subject::SetPxat => "set-pxat".into(),
            Subject::Incr => "incr".into(),
            Subject::Ping => "ping".into(),
        }
    }

    pub fn label(self) -> String {
        match self {
            Subject::Native(a) => format!("{} native", ALGORITHMS[a].0),
            Subject::Lua(a) => format!("{} Lua", ALGORITHMS[a].0),
            Subject::SetPxat => "SET k v PXAT t".into(),
            Subject::Incr => "INCR".into(),
            Subject::Ping => "PING".into(),
        }
    }

    /// The `INFO commandstats` entry that counts it.
    pub fn cmdstat(self) -> &'static str {
        match self {
            Subject::Native(_) => "ratelimit.check",
            Subject::Lua(_) => "evalsha",
            Subject::SetPxat => "set",
            Subject::Incr => "incr",
            Subject::Ping => "ping",
        }
    }

    pub fn algorithm(self) -> Option<usize> {
        match self {
            Subject::Native(a) | Subject::Lua(a) => Some(a),
            _ => None,
        }
    }
}

/// A workload shape: which keys, which pipeline depth, admitted or rejected calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Group {
    /// Consuming calls over the random keyspace.
    Random { pipeline: u32 },
    /// Rejected calls on one exhausted hot key.
    Hot { pipeline: u32 },
}

impl Group {
    pub fn id(self) -> String {
        match self {
            Group::Random { pipeline } => format!("random-p{pipeline}"),
            Group::Hot { pipeline } => format!("hot-rejected-p{pipeline}"),
        }
    }

    pub fn pipeline(self) -> u32 {
        match self {
            Group::Random { pipeline } | Group::Hot { pipeline } => pipeline,
        }
    }

    pub fn is_random(self) -> bool {
        matches!(self, Group::Random { .. })
    }
}

/// One measured `redis-benchmark` run.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub requests: u64,
    pub seconds: f64,
    pub rps: f64,
    pub avg_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub usec_per_call: f64,
}

/// Every repetition of one case.
#[derive(Clone, Debug)]
pub struct CaseResult {
    pub group: Group,
    pub subject: Subject,
    /// The command line given to redis-benchmark (after its options).
    pub command: Vec<String>,
    pub samples: Vec<Sample>,
}

impl CaseResult {
    fn summary(&self, field: impl Fn(&Sample) -> f64) -> Option<Summary> {
        Summary::of(&self.samples.iter().map(field).collect::<Vec<_>>())
    }
    pub fn rps(&self) -> Option<Summary> {
        self.summary(|s| s.rps)
    }
    pub fn usec(&self) -> Option<Summary> {
        self.summary(|s| s.usec_per_call)
    }
    pub fn p50(&self) -> Option<Summary> {
        self.summary(|s| s.p50_ms)
    }
    pub fn p99(&self) -> Option<Summary> {
        self.summary(|s| s.p99_ms)
    }
}

/// Memory of one kind of key at a steady state.
#[derive(Clone, Debug)]
pub struct MemoryResult {
    pub id: String,
    pub label: String,
    pub keys: u64,
    /// Calls made per key (entries of a log).
    pub calls_per_key: u64,
    /// `used_memory` after minus before, divided by the keys (hash tables included).
    pub bytes_per_key: f64,
    /// `(from, bytes)`: the `used_memory` delta per key from `from` keys to `keys`, where the
    /// hash tables keep their size: what one more key costs.
    pub marginal: Option<(u64, f64)>,
    /// `MEMORY USAGE` of one sample key.
    pub memory_usage: Option<i64>,
}

/// Cost per call of one subject at several keyspace sizes.
#[derive(Clone, Debug)]
pub struct ScalingResult {
    pub subject: Subject,
    /// `(keys, usec_per_call, rps)` per size.
    pub points: Vec<(u64, Option<Summary>, Option<Summary>)>,
}

/// The sliding log's cost per call with `limit` entries in the log.
#[derive(Clone, Debug, Default)]
pub struct LogScalingResult {
    pub limit: u64,
    pub native_consume: Option<Summary>,
    pub native_reject: Option<Summary>,
    pub lua_consume: Option<Summary>,
    pub lua_reject: Option<Summary>,
    pub note: Option<String>,
}

/// Where and how the run happened.
#[derive(Clone, Debug, Default)]
pub struct Machine {
    pub date_utc: String,
    pub cpu_model: String,
    pub nproc: usize,
    pub kernel: String,
    pub redis_version: String,
    pub module_revision: String,
    pub load_before: String,
    pub load_after: String,
}

/// Everything one run found.
#[derive(Clone, Debug, Default)]
pub struct Results {
    pub machine: Machine,
    pub quick: bool,
    pub repetitions: usize,
    pub clients: u32,
    pub keyspace: u64,
    pub run_seconds_target: f64,
    /// redis-server ran on CPU 0 and redis-benchmark on CPU 1 (`taskset`).
    pub pinned: bool,
    pub total_seconds: f64,
    pub cases: Vec<CaseResult>,
    pub memory: Vec<MemoryResult>,
    pub scaling: Vec<ScalingResult>,
    pub log_scaling: Vec<LogScalingResult>,
    pub notes: Vec<String>,
}

impl Results {
    pub fn case(&self, group: Group, subject: Subject) -> Option<&CaseResult> {
        self.cases
            .iter()
            .find(|c| c.group == group && c.subject == subject)
    }

    pub fn memory(&self, id: &str) -> Option<&MemoryResult> {
        self.memory.iter().find(|m| m.id == id)
    }
}
