//! What the integration tests share: the harness that runs a real `redis-server` with the module
//! ([`Server`], in `server.rs` and `launch.rs`), calls and their replies (`calls.rs`: [`Limit`],
//! [`send`], [`reply6`], [`limiter_info`]...), a seeded generator ([`rng::Rng`]), the pure-core
//! model of stored keys ([`model::Model`]), DUMP payload surgery (`dump.rs`) and a real Redis
//! Cluster of such servers ([`cluster::Cluster`]).
//!
//! Every [`Server`] gets a free loopback port (never 6379) and a fresh temporary directory, and is
//! killed (and its directory removed) on Drop, also when the test panics. Children are spawned from
//! one long-lived thread with `PR_SET_PDEATHSIG`, so even a killed test binary leaves none behind.
//!
//! ```ignore
//! mod common;
//! use common::Server;
//!
//! let server = Server::start(); // with the module
//! let mut con = server.client();
//! let durable = Server::builder()
//!     .config(&[("appendonly", "yes"), ("appendfsync", "always")])
//!     .start();
//! let refused = Server::builder()
//!     .module_args(&["max-log-limit", "0"])
//!     .start_expecting_failure();
//! ```
//!
//! Environment: `RATELIMIT_MODULE` (the module to load; `make test` sets it), `RATELIMIT_SERVER`
//! (the server binary, e.g. `valkey-server` or a path; `REDIS_SERVER` is its older name; default
//! `redis-server` from PATH; `make test-matrix` runs the suites once per server),
//! `RATELIMIT_KEEP_TEST_DIRS=1` (keep the temporary directories for inspection).
//!
//! Running the servers under a tool (`make memcheck`, tests/memcheck.sh):
//! `RATELIMIT_SERVER_WRAPPER` is a command prefix, split on whitespace, put in front of the server
//! binary, e.g. `valgrind --tool=memcheck --log-file=/abs/dir/valgrind.%p.log`. Give the tool's
//! log an absolute path: the server runs in its temporary directory, removed on Drop. The wrapper
//! must keep the server's pid (valgrind does: it runs the program in its own process), since the
//! harness checks `INFO server`'s `process_id` and signals that pid. Under a wrapper every timeout
//! (start-up, replica sync, client reads, exit after SHUTDOWN or SIGTERM) is multiplied by
//! `RATELIMIT_TIMEOUT_SCALE` (default 20 with a wrapper, 1 without), so a server running 30-50x
//! slower is waited for and stops gracefully (SIGTERM, never SIGKILL first), letting the tool write
//! its final report; `RATELIMIT_READY_TIMEOUT_MS` overrides the start-up timeout alone.
//!
//! A crate of its own (`redis-ratelimit-testkit`), a dev-dependency of the module that
//! tests/integration and benches/compare use as `common`.

mod calls;
pub mod cluster;
pub mod dump;
mod launch;
pub mod model;
pub mod rng;
mod server;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

pub use calls::*;
pub use launch::server_binary;
pub use launch::{free_port, make_temp_dir, remove_dir, spawn_child};
pub use server::{
    master_and_replica, module_path, ready_timeout, scaled, server_wrapper, wait_replica_sync,
    FailedStart, Server, ServerBuilder, CLIENT_TIMEOUT, READY_TIMEOUT, SYNC_TIMEOUT,
};

// The contract's bounds (docs/algorithms.md, "Notation"), written out here rather than taken from
// the crate, so the tests hold the module to them.

/// Largest accepted `limit`, `BURST` and `COST`: 10^12.
pub const MAX_AMOUNT: u64 = 1_000_000_000_000;
/// One day in ms.
pub const DAY_MS: u64 = 86_400_000;
/// Largest accepted period: 3650 days.
pub const MAX_PERIOD_MS: u64 = 3650 * DAY_MS;
/// Every `AT` (and every time) stays below 2^53 ms.
pub const TIME_LIMIT_MS: u64 = 1 << 53;
/// `ratelimit.max-log-limit` by default: the largest sliding-log limit.
pub const DEFAULT_MAX_LOG_LIMIT: u64 = 100_000;

/// The repository's root (the test kit is its folder `testkit/`).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit/ sits in the repository")
        .to_path_buf()
}

/// redis-cell 0.5.0, compiled, when ../shared/peers/ (beside the repository) has it; `None`, with
/// the test recorded as skipped ([`skip`]), in a fresh clone.
pub fn redis_cell() -> Option<PathBuf> {
    let path = repo_root().join("../shared/peers/libredis_cell.so");
    if path.is_file() {
        Some(path.canonicalize().unwrap())
    } else {
        skip("../shared/peers/libredis_cell.so is absent: no comparison with redis-cell");
        None
    }
}

/// Records that the running test skips what it was written for (`what`: the reason, e.g. the
/// server lacks an API, a peer is absent), then the test returns and passes. `make test` counts
/// and names these in its closing total (`N passed, N failed, N skipped`): each skip is a line
/// `<test>: <what>` appended to the file `$RATELIMIT_SKIP_LOG`. It is also printed to stderr as
/// `skipped: <what>`, which `make test-matrix` reads from each server's output.
pub fn skip(what: &str) {
    use std::io::Write;
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("(unnamed test)");
    eprintln!("skipped: {what}");
    if let Some(path) = std::env::var_os("RATELIMIT_SKIP_LOG") {
        let line = format!("{test}: {what}\n");
        // One write of one line: tests run on several threads, and O_APPEND keeps lines whole.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut file| file.write_all(line.as_bytes()))
            .unwrap_or_else(|e| panic!("RATELIMIT_SKIP_LOG={}: {e}", path.to_string_lossy()));
    }
}

/// Wall-clock time in ms since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock before 1970")
        .as_millis() as u64
}

/// A base time for `AT` sequences: a UTC midnight between one and two days ahead of now, so
/// windows of any period dividing a day are aligned to it and nothing stored `AT` it expires
/// during the test.
pub fn future_base_ms() -> u64 {
    (now_ms() / DAY_MS + 2) * DAY_MS
}

/// Parse an INFO reply into field -> value (section headers and blank lines skipped).
pub fn parse_info(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim_end().to_string()))
        .collect()
}

/// One row of a worked-example table of docs/algorithms.md: `| key's limit | AT | call | reply |
/// what happens |`, the limit carried down from the row that names it.
pub struct WorkedRow {
    pub limit: String,
    pub at: u64,
    /// The call cell as written: `CHECK COST 2`, `PEEK COST 0`, `REFUND COST 1`...
    pub call: String,
    pub reply: [i64; 6],
}

/// The text of the section `## {section}` of docs/algorithms.md.
fn algorithms_section(section: &str) -> &'static str {
    let page = include_str!("../../docs/algorithms.md");
    page.split(&format!("\n## {section}\n"))
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .unwrap_or_else(|| panic!("docs/algorithms.md has a {section} section"))
}

/// The rows of the worked-example table in the section `## {section}` of docs/algorithms.md.
pub fn worked_examples(section: &str) -> Vec<WorkedRow> {
    let text = algorithms_section(section);
    let mut rows = Vec::new();
    let mut limit = String::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let is_call = ["CHECK", "PEEK", "REFUND", "TAKE"]
            .iter()
            .any(|name| cells.get(3).is_some_and(|cell| cell.starts_with(name)));
        if cells.len() != 7 || !is_call {
            continue;
        }
        if !cells[1].is_empty() {
            limit = cells[1].trim_matches('`').to_string();
        }
        let reply: Vec<i64> = cells[4]
            .trim_matches(|c| c == '[' || c == ']')
            .split(", ")
            .map(|n| n.parse().expect("reply"))
            .collect();
        rows.push(WorkedRow {
            limit: limit.clone(),
            at: cells[2].parse().expect("AT"),
            call: cells[3].to_string(),
            reply: reply.try_into().expect("six fields"),
        });
    }
    rows
}

/// One row of docs/algorithms.md's Concurrency table: `| AT | call | reply | leases after |`.
pub struct LeaseRow {
    pub at: u64,
    /// `ACQUIRE` or `RELEASE`.
    pub command: String,
    pub id: String,
    /// ACQUIRE's `COST`.
    pub cost: Option<u64>,
    /// Six fields for ACQUIRE, one for RELEASE.
    pub reply: Vec<i64>,
}

/// The Concurrency table of docs/algorithms.md and the `limit` and `lease-duration` its text
/// names (`limit 3`, `lease-duration 1000`).
pub fn lease_worked_examples() -> (u64, u64, Vec<LeaseRow>) {
    let text = algorithms_section("Concurrency");
    let named = |word: &str| -> u64 {
        let after = text
            .split(&format!("`{word} "))
            .nth(1)
            .unwrap_or_else(|| panic!("the Concurrency table names its {word}"));
        after[..after.find('`').expect("closing backquote")]
            .parse()
            .expect("a number")
    };
    let (limit, duration) = (named("limit"), named("lease-duration"));
    let mut rows = Vec::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let Some(words) = cells
            .get(2)
            .map(|cell| cell.split_whitespace().collect::<Vec<_>>())
        else {
            continue;
        };
        if cells.len() != 6 || !matches!(words.first(), Some(&"ACQUIRE" | &"RELEASE")) {
            continue;
        }
        rows.push(LeaseRow {
            at: cells[1].parse().expect("AT"),
            command: words[0].to_string(),
            id: words[1].trim_matches('`').to_string(),
            cost: (words.get(2) == Some(&"COST")).then(|| words[3].parse().expect("COST")),
            reply: cells[3]
                .trim_matches(|c| c == '[' || c == ']')
                .split(", ")
                .map(|n| n.parse().expect("reply"))
                .collect(),
        });
    }
    (limit, duration, rows)
}
