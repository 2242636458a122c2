//! `make bench`: the native commands against the Functions library, the Lua reference scripts
//! and redis-cell.
//!
//! Starts its own redis-server with the module (the integration tests' harness), loads the
//! `lua-reference/` scripts and the Functions library (`lua-reference/functions/ratelimit.lua`)
//! into it and, when `../shared/peers/libredis_cell.so` exists, starts a second redis-server with
//! redis-cell alone (both register `CL.THROTTLE`). Then it measures, interleaving the cases of each
//! comparison round by round so that a machine whose load drifts skews every case alike:
//! - throughput and latency with `redis-benchmark` (50 clients, pipeline 16 and 1): consuming
//!   calls over a random keyspace, rejected calls on one exhausted hot key; each algorithm's
//!   `RATELIMIT.CHECK` against `FCALL ratelimit_check` and its Lua script, `gcra` also with the
//!   module's `CL.THROTTLE` and redis-cell's, with `SET k v PXAT t`, `INCR` and `PING` as floors;
//! - the in-server cost per call (`INFO commandstats`, usec_per_call) of every run;
//! - memory per key (`used_memory` delta over many keys, and `MEMORY USAGE`): module, library,
//!   Lua scripts, `SET k v PXAT t`, and a `CL.THROTTLE` key of ours and of redis-cell;
//! - the cost per call as the keyspace grows;
//! - every algorithm's CHECK from clients speaking RESP2 and RESP3 (`HELLO 3`), with the bench's
//!   own load generator (resp.rs), since redis-benchmark speaks RESP2 only;
//! - consuming calls of `SET k v PXAT t`, `INCR` and every CHECK without and then with a replica
//!   attached (a second redis-server with the module, replicating from ours, on CPU 1 when
//!   pinned, killed afterwards), as a master runs in production.
//!
//! Writes `target/bench/results.md` (also printed: the tables docs/benchmarks.md quotes) and
//! `results.json` (every repetition). The algorithms' own speed, without Redis (the sliding log
//! as it grows, the leases as they grow), is the core's benchmarks' (core/benches/).
//! `BENCH_QUICK=1` makes a smoke run of about a minute; `BENCH_REPS` and `BENCH_RUN_SECS` override
//! the repetitions (5 by default, 3 in quick mode) and the target length of one redis-benchmark
//! run (0.25 s by default). More short rounds resist the host's drift better than a few long ones.
//! `BENCH_ONLY=replica` (a comma-separated list of `memory`, `throughput`, `resp`, `scaling`,
//! `replica`) runs only those phases and writes `results-only.md` and `results-only.json`
//! instead, so a partial run never passes for a whole one (`scaling` reads `throughput`'s figures).
//! redis-server is pinned to CPU 0 and redis-benchmark to CPU 1 when `taskset` and two CPUs are
//! there; `BENCH_PIN=0` turns that off.
//!
//! Run without `--bench` (as `cargo test --bench compare` does), or with `--self-test`, it only
//! checks its parsers and report writers on canned tool output, without any server. With
//! `--drive` first it is a load generator that speaks RESP2 or RESP3 (drive.rs), which
//! `make profile` uses.

use redis_ratelimit_testkit as common;
mod drive;
mod machine;
mod memory;
mod model;
mod parse;
mod production;
mod report;
mod resp;
mod scaling;
mod selftest;
mod setup;
mod throughput;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Instant;

use common::Server;
use machine::{command_output, load_average, machine_before};
use model::*;

/// redis-cell, compiled, beside the repository (see its README there).
const REDIS_CELL: &str = "../shared/peers/libredis_cell.so";

/// The gap between the entries of the logs whose memory is measured.
const LOG_GAP_MS: u64 = 1000;

/// Settings of one run.
#[derive(Clone, Debug)]
struct Config {
    quick: bool,
    reps: usize,
    clients: u32,
    /// Random keyspace of the throughput cases.
    keys: u64,
    /// Target length of one measured redis-benchmark run.
    run_secs: f64,
    /// Keys filled to measure memory per key (buckets, windows, SET)...
    memory_keys: u64,
    /// ...and the count at which the marginal measurement starts (same power-of-two bracket).
    memory_marginal_from: u64,
    /// Keys filled with 100-entry logs.
    log_memory_keys: u64,
    /// Keyspace sizes of the scaling runs, besides `keys` (whose figures come from the
    /// throughput runs at pipeline 16). Every subject runs at every size.
    scaling_keys: Vec<u64>,
    /// Pin redis-server to CPU 0 and redis-benchmark to CPU 1, so they do not take turns on one
    /// core (`BENCH_PIN=0` turns it off; needs `taskset` and two CPUs).
    pin: bool,
    /// The phases to run (`BENCH_ONLY`); `None`: all of them.
    only: Option<Vec<String>>,
}

impl Config {
    fn from_env() -> Config {
        let quick = env_flag("BENCH_QUICK");
        let mut config = if quick {
            Config {
                quick,
                reps: 3,
                clients: 50,
                keys: 20_000,
                run_secs: 0.2,
                memory_keys: 16_000,
                memory_marginal_from: 9_000,
                log_memory_keys: 300,
                scaling_keys: vec![1_000],
                pin: false,
                only: None,
            }
        } else {
            Config {
                quick,
                reps: 5,
                clients: 50,
                keys: 100_000,
                run_secs: 0.25,
                memory_keys: 32_000,
                memory_marginal_from: 17_000,
                log_memory_keys: 600,
                scaling_keys: vec![1_000, 1_000_000],
                pin: false,
                only: None,
            }
        };
        config.pin = std::env::var("BENCH_PIN").map_or(true, |v| v != "0")
            && thread::available_parallelism().is_ok_and(|n| n.get() >= 2)
            && command_output("taskset", &["--version"]).is_some();
        if let Some(reps) = env_number("BENCH_REPS") {
            config.reps = (reps as usize).max(1);
        }
        if let Some(secs) = std::env::var("BENCH_RUN_SECS")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
        {
            config.run_secs = secs.max(0.05);
        }
        config.only = std::env::var("BENCH_ONLY")
            .ok()
            .filter(|v| !v.is_empty())
            .map(|v| v.split(',').map(|p| p.trim().to_string()).collect());
        config
    }

    /// Whether phase `name` runs.
    fn runs(&self, name: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|p| p == name))
    }
}

/// Runs phase `name` if `BENCH_ONLY` selects it (see [`Config::runs`]), saying how long it took.
fn phase<T>(
    config: &Config,
    name: &str,
    label: &str,
    run: impl FnOnce() -> Result<T, String>,
) -> Result<Option<T>, String> {
    if !config.runs(name) {
        return Ok(None);
    }
    let started = Instant::now();
    let result = run()?;
    eprintln!(
        "bench: {label} done in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    Ok(Some(result))
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "--drive") {
        if let Err(message) = drive::run(&args) {
            eprintln!("drive: {message}");
            std::process::exit(1);
        }
        return;
    }
    if args.iter().any(|a| a == "--self-test") || !args.iter().any(|a| a == "--bench") {
        selftest::run();
        return;
    }
    let config = Config::from_env();
    let out_dir = target_dir().join("bench");
    if let Err(message) = run(&config, &out_dir) {
        eprintln!("bench: {message}");
        std::process::exit(1);
    }
}

/// Cargo's target directory (`CARGO_TARGET_DIR` or `target/` of the repository).
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

fn lua_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("lua-reference")
}

fn run(config: &Config, out_dir: &Path) -> Result<(), String> {
    let started = Instant::now();
    let mut results = Results {
        quick: config.quick,
        repetitions: config.reps,
        clients: config.clients,
        keyspace: config.keys,
        run_seconds_target: config.run_secs,
        machine: machine_before(),
        ..Results::default()
    };
    let server = Server::start();
    let cell_path = Path::new(env!("CARGO_MANIFEST_DIR")).join(REDIS_CELL);
    let cell_server = if cell_path.is_file() {
        let path = cell_path.canonicalize().unwrap_or(cell_path.clone());
        let cell = Server::builder()
            .no_module()
            .config(&[("loadmodule", &path.to_string_lossy())])
            .start();
        eprintln!(
            "bench: redis-cell ({}) on a second redis-server, port {}",
            path.display(),
            cell.port()
        );
        results.redis_cell = Some(format!("redis-cell ({REDIS_CELL})"));
        Some(cell)
    } else {
        eprintln!("bench: {REDIS_CELL} is absent: redis-cell is not measured (skipped)");
        None
    };
    if config.pin {
        // Every thread of the servers (their background threads included) on CPU 0: they take
        // turns, one measured at a time.
        for s in std::iter::once(&server).chain(cell_server.as_ref()) {
            let pid = s.pid().map(|pid| pid.to_string()).unwrap_or_default();
            if command_output("taskset", &["-a", "-p", "-c", "0", &pid]).is_none() {
                return Err(format!(
                    "taskset could not pin redis-server {pid}; try BENCH_PIN=0"
                ));
            }
        }
    }
    results.pinned = config.pin;
    eprintln!(
        "bench: redis-server {} with the module on port {} ({} mode, {} repetitions)",
        results.machine.redis_version,
        server.port(),
        if config.quick { "quick" } else { "full" },
        config.reps
    );
    let mut bench = Bench::new(&server, cell_server.as_ref(), config.clone())?;

    if let Some(memory) = phase(config, "memory", "memory", || bench.memory_phase())? {
        results.memory = memory;
    }
    if let Some(cases) = phase(config, "throughput", "throughput", || {
        bench.throughput_phase()
    })? {
        results.cases = cases;
    }
    if let Some(resp) = phase(config, "resp", "RESP2 and RESP3 clients", || {
        bench.resp_phase()
    })? {
        results.cases.extend(resp);
    }
    if let Some(scaling) = phase(config, "scaling", "keyspace scaling", || {
        bench.scaling_phase(&results.cases)
    })? {
        results.scaling = scaling;
    }
    // Last: once a replica has been attached, the server keeps feeding its replication backlog.
    if let Some(replica) = phase(config, "replica", "without and with a replica", || {
        bench.replica_phase()
    })? {
        results.cases.extend(replica);
        results.replica = true;
    }

    results.notes = bench.notes.clone();
    let busy = results
        .machine
        .load_before
        .split_whitespace()
        .next()
        .and_then(|l| l.parse::<f64>().ok())
        .filter(|&load| load > 0.5 * results.machine.nproc as f64);
    if let Some(load) = busy {
        results.notes.push(format!(
            "the machine was busy before the run (1-minute load average {load} on {} cores): \
             expect noisy figures and wide min..max ranges",
            results.machine.nproc
        ));
    }
    drop(bench);
    drop(cell_server);
    drop(server);
    results.machine.load_after = load_average();
    results.total_seconds = started.elapsed().as_secs_f64();

    let markdown = report::markdown(&results);
    let json = report::json(&results);
    fs::create_dir_all(out_dir).map_err(|e| format!("creating {}: {e}", out_dir.display()))?;
    let files = if config.only.is_some() {
        vec![
            ("results-only.md", markdown.as_str()),
            ("results-only.json", json.as_str()),
        ]
    } else {
        vec![
            ("results.md", markdown.as_str()),
            ("results.json", json.as_str()),
        ]
    };
    for &(name, text) in &files {
        let path = out_dir.join(name);
        fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    println!("{markdown}");
    let names: Vec<&str> = files.iter().map(|(name, _)| *name).collect();
    eprintln!(
        "bench: {:.0}s in all; wrote {}/{}",
        results.total_seconds,
        out_dir.display(),
        names.join(", ")
    );
    Ok(())
}

/// One command case of the throughput and scaling phases.
#[derive(Clone, Debug)]
struct Case {
    subject: Subject,
    /// Command and arguments; `__rand_int__` marks the key's random part.
    command: Vec<String>,
    /// `None`: sent by redis-benchmark (RESP2); `Some(protocol)`: by the bench's own clients
    /// ([`resp::drive`]), which send `HELLO 3` first when the protocol is 3.
    resp: Option<u8>,
}

impl Case {
    /// This case's result in `group`, from its measured samples.
    fn result(&self, group: Group, samples: Vec<Sample>) -> CaseResult {
        CaseResult {
            group,
            subject: self.subject,
            command: self.command.clone(),
            samples,
        }
    }

    /// The same command, sent by the bench's own clients in RESP `protocol`.
    fn over_resp(mut self, protocol: u8) -> Case {
        self.resp = Some(protocol);
        self
    }

    /// A producer of the command in RESP for key number `i`: the encoded template with the
    /// 12 digits written over each `__rand_int__` (as long as the digits, so lengths hold).
    fn encoder(&self) -> impl Fn(u64, &mut Vec<u8>) + Send + 'static {
        let mut template = Vec::new();
        resp::encode(&mut template, &self.command);
        let marker = b"__rand_int__";
        let spots: Vec<usize> = (0..template.len().saturating_sub(marker.len() - 1))
            .filter(|&at| template[at..].starts_with(marker))
            .collect();
        move |i, buf| {
            let start = buf.len();
            buf.extend_from_slice(&template);
            let digits = format!("{i:012}");
            for &at in &spots {
                buf[start + at..start + at + marker.len()].copy_from_slice(digits.as_bytes());
            }
        }
    }

    /// The command with `__rand_int__` replaced as redis-benchmark does (12 digits).
    fn with_key(&self, i: u64) -> Vec<String> {
        let digits = format!("{i:012}");
        self.command
            .iter()
            .map(|a| a.replace("__rand_int__", &digits))
            .collect()
    }
}

/// The measuring side of a run: our server, a connection to it, the scripts and the library
/// loaded, and redis-cell's server when there is one; its phases are in setup.rs (the servers, the
/// cases, filling keys), throughput.rs, memory.rs and scaling.rs.
struct Bench<'a> {
    server: &'a Server,
    con: redis::Connection,
    /// redis-cell's server and a connection to it.
    cell: Option<(&'a Server, redis::Connection)>,
    config: Config,
    /// Lua file stem -> SHA1.
    shas: HashMap<String, String>,
    notes: Vec<String>,
}
