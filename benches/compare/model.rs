//! What the benchmark measures (the cases) and what it found (the results), shared by the runner
//! and the report.

use crate::parse::Summary;

/// `(name on the command line, Lua reference file stem, short key tag)`. Each has a Lua reference
/// script (`lua-reference/<stem>.lua`) and a function in the Functions library; `gcra` is also the
/// algorithm behind `CL.THROTTLE`.
pub const ALGORITHMS: [(&str, &str, &str); 6] = [
    ("token-bucket", "token_bucket", "tb"),
    ("leaky-bucket", "leaky_bucket", "lb"),
    ("fixed-window", "fixed_window", "fw"),
    ("sliding-window", "sliding_window", "sw"),
    ("sliding-log", "sliding_log", "sl"),
    ("gcra", "gcra", "gc"),
];

/// Index of the sliding log (measured with 100 entries per key in the memory phase).
pub const SLIDING_LOG: usize = 4;
/// Index of `gcra` in [`ALGORITHMS`].
pub const GCRA: usize = 5;

/// Limit and period of the consuming cases: so high and so long that every call is admitted and
/// no key refills, drains, slides or expires during the run, so that each call reads and
/// rewrites a live key (burst = limit for the buckets).
pub const CONSUME_LIMIT: &str = "100000";
pub const CONSUME_PERIOD_MS: &str = "60000000000";
/// The same limit in `CL.THROTTLE`'s terms: `max_burst` 100000, 100000 per 60,000,000 s (an
/// emission interval of 600 s, so that a key lives at least 10 minutes after a call and stays
/// live through the run, where 100000 per 3600 s would let it expire 36 ms after a call).
pub const THROTTLE_ARGS: [&str; 4] = ["100000", "100000", "60000000", "1"];
/// The rejected `CL.THROTTLE`: `max_burst` 0 (a capacity of 1), 1 per 60,000,000 s.
pub const THROTTLE_REJECT_ARGS: [&str; 4] = ["0", "1", "60000000", "1"];
/// Limit and period of the memory phase's keys: a common API limit (100 an hour), whose keys the
/// module keeps as one word beside a shared parameter entry; a key written once lives 36 s, time
/// enough to measure. The consuming cases' parameters are too wide for a word: the memory phase
/// measures that form too, on the token bucket.
pub const MEMORY_LIMIT: &str = "100";
pub const MEMORY_PERIOD_MS: &str = "3600000";
/// The memory phase's `CL.THROTTLE`: `max_burst` 15, 30 an hour (a key written once lives 120 s).
pub const THROTTLE_MEMORY_ARGS: [&str; 4] = ["15", "30", "3600", "1"];
/// Limit of the rejected cases: one hot key with limit 1 and the same period, exhausted first.
pub const REJECT_LIMIT: &str = "1";
/// `SET ... PXAT` expiry: 2100-01-01.
pub const FAR_FUTURE_MS: &str = "4102444800000";

/// Which server a case runs on: ours (the module and the library loaded), or a second one with
/// redis-cell alone (both register `CL.THROTTLE`, so they cannot share a server).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    Ours,
    Cell,
}

/// What a case runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Subject {
    /// `RATELIMIT.CHECK`, any of the six algorithms.
    Native(usize),
    /// `FCALL ratelimit_check` of the Functions library (`lua-reference/functions/ratelimit.lua`).
    Library(usize),
    /// `EVALSHA` of the Lua reference script.
    Lua(usize),
    /// The module's `CL.THROTTLE`.
    Throttle,
    /// redis-cell's `CL.THROTTLE`, on its own server.
    Cell,
    SetPxat,
    Incr,
    Ping,
}

impl Subject {
    pub fn id(self) -> String {
        match self {
            Subject::Native(a) => format!("{}/native", ALGORITHMS[a].0),
            Subject::Library(a) => format!("{}/library", ALGORITHMS[a].0),
            Subject::Lua(a) => format!("{}/lua", ALGORITHMS[a].0),
            Subject::Throttle => "cl-throttle/ours".into(),
            Subject::Cell => "cl-throttle/redis-cell".into(),
            Subject::SetPxat => "set-pxat".into(),
            Subject::Incr => "incr".into(),
            Subject::Ping => "ping".into(),
        }
    }

    pub fn label(self) -> String {
        match self {
            Subject::Native(a) => format!("{} native", ALGORITHMS[a].0),
            Subject::Library(a) => format!("{} library", ALGORITHMS[a].0),
            Subject::Lua(a) => format!("{} Lua", ALGORITHMS[a].0),
            Subject::Throttle => "CL.THROTTLE (ours)".into(),
            Subject::Cell => "CL.THROTTLE (redis-cell)".into(),
            Subject::SetPxat => "SET k v PXAT t".into(),
            Subject::Incr => "INCR".into(),
            Subject::Ping => "PING".into(),
        }
    }

    /// The `INFO commandstats` entry that counts it.
    pub fn cmdstat(self) -> &'static str {
        match self {
            Subject::Native(_) => "ratelimit.check",
            Subject::Library(_) => "fcall",
            Subject::Lua(_) => "evalsha",
            Subject::Throttle | Subject::Cell => "cl.throttle",
            Subject::SetPxat => "set",
            Subject::Incr => "incr",
            Subject::Ping => "ping",
        }
    }

    /// The algorithm it computes (`CL.THROTTLE`'s is `gcra`).
    pub fn algorithm(self) -> Option<usize> {
        match self {
            Subject::Native(a) | Subject::Library(a) | Subject::Lua(a) => Some(a),
            Subject::Throttle | Subject::Cell => Some(GCRA),
            _ => None,
        }
    }

    /// Whether it is a rate limiter (its reply says whether the call was admitted).
    pub fn is_limiter(self) -> bool {
        self.algorithm().is_some()
    }

    /// The first field of its reply when a call is admitted: `allowed` 1 for the module's and
    /// the scripts' six integers, `limited` 0 for `CL.THROTTLE`.
    pub fn admitted_first(self) -> i64 {
        match self {
            Subject::Throttle | Subject::Cell => 0,
            _ => 1,
        }
    }

    /// What the first field of a reply must be (`Some`) when every call is meant to be admitted,
    /// or rejected; `None` for commands that are not limiters.
    pub fn expect_first(self, admitted: bool) -> Option<i64> {
        self.is_limiter().then(|| {
            if admitted {
                self.admitted_first()
            } else {
                1 - self.admitted_first()
            }
        })
    }

    /// Whether the module's `INFO ratelimit` counts its decisions.
    pub fn counted_by_module(self) -> bool {
        matches!(self, Subject::Native(_) | Subject::Throttle)
    }

    pub fn side(self) -> Side {
        match self {
            Subject::Cell => Side::Cell,
            _ => Side::Ours,
        }
    }
}

/// The rate limiters of the throughput phase, in table order: per algorithm the module, the
/// library and the Lua script (`gcra` last); then our `CL.THROTTLE` and redis-cell's (when its
/// server runs).
pub fn limiter_subjects(with_cell: bool) -> Vec<Subject> {
    let mut subjects = Vec::new();
    for a in 0..ALGORITHMS.len() {
        subjects.extend([Subject::Native(a), Subject::Library(a), Subject::Lua(a)]);
    }
    subjects.push(Subject::Throttle);
    if with_cell {
        subjects.push(Subject::Cell);
    }
    subjects
}

/// A workload shape: which keys, which pipeline depth, admitted or rejected calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Group {
    /// Consuming calls over the random keyspace.
    Random { pipeline: u32 },
    /// Rejected calls on one exhausted hot key.
    Hot { pipeline: u32 },
    /// Consuming calls over the random keyspace at pipeline 16, measured in the replica phase
    /// without (`attached: false`) and then with a replica attached to the measured server.
    Replica { attached: bool },
    /// The bench's own clients at pipeline 16 speaking RESP `protocol` (2, or 3 after
    /// `HELLO 3`): consuming calls over the random keyspace, or rejected calls on a hot key.
    Resp { protocol: u8, hot: bool },
}

impl Group {
    pub fn id(self) -> String {
        match self {
            Group::Random { pipeline } => format!("random-p{pipeline}"),
            Group::Hot { pipeline } => format!("hot-rejected-p{pipeline}"),
            Group::Replica { attached: false } => "random-p16-no-replica".into(),
            Group::Replica { attached: true } => "random-p16-replica".into(),
            Group::Resp {
                protocol,
                hot: false,
            } => format!("resp{protocol}-random-p16"),
            Group::Resp {
                protocol,
                hot: true,
            } => format!("resp{protocol}-hot-rejected-p16"),
        }
    }

    pub fn pipeline(self) -> u32 {
        match self {
            Group::Random { pipeline } | Group::Hot { pipeline } => pipeline,
            Group::Replica { .. } | Group::Resp { .. } => 16,
        }
    }

    pub fn is_random(self) -> bool {
        match self {
            Group::Random { .. } | Group::Replica { .. } => true,
            Group::Hot { .. } => false,
            Group::Resp { hot, .. } => !hot,
        }
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
    /// The redis-cell measured on a second server (`None`: ../shared/peers/ is absent).
    pub redis_cell: Option<String>,
    /// Whether the replica phase ran (its cases are in `cases`), and the replica's CPU.
    pub replica: bool,
    pub total_seconds: f64,
    pub cases: Vec<CaseResult>,
    pub memory: Vec<MemoryResult>,
    pub scaling: Vec<ScalingResult>,
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

    /// What one more key of a kind costs: the marginal bytes when measured, else the average.
    pub fn bytes_per_key(&self, id: &str) -> Option<f64> {
        self.memory(id)
            .map(|m| m.marginal.map_or(m.bytes_per_key, |(_, b)| b))
    }
}
