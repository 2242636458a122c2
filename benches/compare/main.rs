//! `make bench`: the native commands against their Lua reference scripts, on one redis-server.
//!
//! Starts its own redis-server with the module (the integration tests' harness), loads the
//! `lua-reference/` scripts and measures, interleaving the cases of each comparison round by round
//! so that a machine whose load drifts skews every case alike:
//! - throughput and latency with `redis-benchmark` (50 clients, pipeline 16 and 1): consuming
//!   CHECKs over a random keyspace, rejected CHECKs on one exhausted hot key, each algorithm's
//!   native command against its Lua script, with `SET k v PXAT t`, `INCR` and `PING` as floors;
//! - the in-server cost per call (`INFO commandstats`, usec_per_call) of every run;
//! - memory per key (`used_memory` delta over many keys, and `MEMORY USAGE`);
//! - the cost per call as the keyspace grows, and as the sliding log's limit grows.
//!
//! Writes `target/bench/results.md` (also printed), `results.json` and `throughput.svg`.
//! `BENCH_QUICK=1` makes a smoke run of about a minute; `BENCH_REPS` and `BENCH_RUN_SECS` override
//! the repetitions (5 by default, 3 in quick mode) and the target length of one redis-benchmark
//! run (0.25 s by default). More short rounds resist the host's drift better than a few long ones.
//! redis-server is pinned to CPU 0 and redis-benchmark to CPU 1 when `taskset` and two CPUs are
//! there; `BENCH_PIN=0` turns that off.
//!
//! Run without `--bench` (as `cargo test --bench compare` does), or with `--self-test`, it only
//! checks its parsers and report writers on canned tool output, without any server.

#[path = "../../tests/common/mod.rs"]
mod common;
mod model;
mod parse;
mod report;
mod resp;
mod selftest;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::Server;
use model::*;
use parse::{parse_benchmark_csv, parse_cmdstat, parse_info, Summary};

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
    /// Sliding-log limits (entries per key) of the log scaling runs.
    log_limits: Vec<u64>,
    /// Calls per repetition and limit in the log scaling runs.
    log_calls: u64,
    /// Pin redis-server to CPU 0 and redis-benchmark to CPU 1, so they do not take turns on one
    /// core (`BENCH_PIN=0` turns it off; needs `taskset` and two CPUs).
    pin: bool,
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
                log_limits: vec![10, 100, 1_000, 10_000],
                log_calls: 2_000,
                pin: false,
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
                log_limits: vec![10, 100, 1_000, 10_000, 100_000],
                log_calls: 5_000,
                pin: false,
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
        config
    }
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
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
    if config.pin {
        // Every thread of the server (its background threads included) on CPU 0.
        let pid = server.pid().map(|pid| pid.to_string()).unwrap_or_default();
        if command_output("taskset", &["-a", "-p", "-c", "0", &pid]).is_none() {
            return Err(format!(
                "taskset could not pin redis-server {pid}; try BENCH_PIN=0"
            ));
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
    let mut bench = Bench::new(&server, config.clone())?;

    let phase = Instant::now();
    results.memory = bench.memory_phase()?;
    eprintln!(
        "bench: memory done in {:.0}s",
        phase.elapsed().as_secs_f64()
    );

    let phase = Instant::now();
    results.cases = bench.throughput_phase()?;
    eprintln!(
        "bench: throughput done in {:.0}s",
        phase.elapsed().as_secs_f64()
    );

    let phase = Instant::now();
    results.scaling = bench.scaling_phase(&results.cases)?;
    eprintln!(
        "bench: keyspace scaling done in {:.0}s",
        phase.elapsed().as_secs_f64()
    );

    let phase = Instant::now();
    results.log_scaling = bench.log_scaling_phase()?;
    eprintln!(
        "bench: sliding-log scaling done in {:.0}s",
        phase.elapsed().as_secs_f64()
    );

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
    drop(server);
    results.machine.load_after = load_average();
    results.total_seconds = started.elapsed().as_secs_f64();

    let markdown = report::markdown(&results);
    let json = report::json(&results);
    let svg = report::svg(&results);
    fs::create_dir_all(out_dir).map_err(|e| format!("creating {}: {e}", out_dir.display()))?;
    for (name, text) in [
        ("results.md", markdown.as_str()),
        ("results.json", json.as_str()),
        ("throughput.svg", svg.as_str()),
    ] {
        let path = out_dir.join(name);
        fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    println!("{markdown}");
    eprintln!(
        "bench: {:.0}s in all; wrote {}/results.md, results.json, throughput.svg",
        results.total_seconds,
        out_dir.display()
    );
    Ok(())
}

/// One command case of the throughput and scaling phases.
#[derive(Clone, Debug)]
struct Case {
    subject: Subject,
    /// Command and arguments; `__rand_int__` marks the key's random part.
    command: Vec<String>,
}

impl Case {
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

struct Bench<'a> {
    server: &'a Server,
    con: redis::Connection,
    config: Config,
    /// Lua file stem -> SHA1.
    shas: HashMap<String, String>,
    notes: Vec<String>,
}

impl<'a> Bench<'a> {
    fn new(server: &'a Server, config: Config) -> Result<Bench<'a>, String> {
        let mut con = server.client();
        let mut shas = HashMap::new();
        let dir = lua_dir();
        let mut stems: Vec<&str> = ALGORITHMS.iter().map(|a| a.1).collect();
        stems.push("seed_sliding_log");
        for stem in stems {
            let path = dir.join(format!("{stem}.lua"));
            let body = fs::read_to_string(&path)
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
            let sha: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(body)
                .query(&mut con)
                .map_err(|e| format!("SCRIPT LOAD {}: {e}", path.display()))?;
            shas.insert(stem.to_string(), sha);
        }
        Ok(Bench {
            server,
            con,
            config,
            shas,
            notes: Vec::new(),
        })
    }

    fn port(&self) -> u16 {
        self.server.port()
    }

    fn sha(&self, stem: &str) -> String {
        self.shas[stem].clone()
    }

    fn query<T: redis::FromRedisValue>(&mut self, cmd: &mut redis::Cmd) -> Result<T, String> {
        cmd.query(&mut self.con).map_err(|e| format!("{e}"))
    }

    fn info(&mut self, section: &str) -> Result<String, String> {
        self.query(redis::cmd("INFO").arg(section))
    }

    fn resetstat(&mut self) -> Result<(), String> {
        self.query(redis::cmd("CONFIG").arg("RESETSTAT"))
    }

    fn flushall(&mut self) -> Result<(), String> {
        self.query::<()>(redis::cmd("FLUSHALL").arg("SYNC"))?;
        // Let serverCron settle (client buffers, incremental rehashing) before measuring.
        thread::sleep(Duration::from_millis(200));
        Ok(())
    }

    fn used_memory(&mut self) -> Result<u64, String> {
        let info = parse_info(&self.info("memory")?);
        info.get("used_memory")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| "INFO memory has no used_memory".to_string())
    }

    /// `used_memory` once serverCron has finished the incremental rehashing that a fill may
    /// have started (until then the old keyspace and expiry tables are still allocated):
    /// `DEBUG HTSTATS 0` lists a "rehashing target" table while one is in progress.
    fn settled_used_memory(&mut self) -> Result<u64, String> {
        for _ in 0..50 {
            thread::sleep(Duration::from_millis(100));
            let stats: String = self.query(redis::cmd("DEBUG").arg("HTSTATS").arg(0))?;
            if !stats.contains("rehashing") {
                return self.used_memory();
            }
        }
        self.notes
            .push("the keyspace was still rehashing 5 s after a fill".into());
        self.used_memory()
    }

    fn dbsize(&mut self) -> Result<u64, String> {
        self.query(&mut redis::cmd("DBSIZE"))
    }

    /// `ratelimit_<alg>_allowed` and `_rejected` of `INFO ratelimit`.
    fn module_decisions(&mut self, algorithm: usize) -> Result<(u64, u64), String> {
        let info = parse_info(&self.info("ratelimit")?);
        let name = ALGORITHMS[algorithm].0.replace('-', "_");
        let field = |f: &str| -> u64 {
            info.get(&format!("ratelimit_{name}_{f}"))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        Ok((field("allowed"), field("rejected")))
    }

    /// Sends `count` commands, `produce(i, buf)` appending the i-th in RESP, pipelined on a
    /// fresh connection; fails on any error reply or on any CHECK-shaped reply whose `allowed` is
    /// not `expect_allowed`.
    fn pipeline<F>(
        &self,
        count: u64,
        expect_allowed: Option<bool>,
        produce: F,
    ) -> Result<(), String>
    where
        F: Fn(u64, &mut Vec<u8>) + Send + 'static,
    {
        let outcome = resp::pipeline(self.port(), count, produce)
            .map_err(|e| format!("pipelined calls: {e}"))?;
        if let Some(error) = outcome.first_error {
            return Err(format!("pipelined calls answered an error: {error}"));
        }
        match expect_allowed {
            Some(true) if outcome.rejected > 0 => Err(format!(
                "{} of {count} calls meant to be admitted were rejected",
                outcome.rejected
            )),
            Some(false) if outcome.allowed > 0 => Err(format!(
                "{} of {count} calls meant to be rejected were admitted",
                outcome.allowed
            )),
            _ => Ok(()),
        }
    }

    fn call(&self, args: &[String]) -> Result<resp::Reply, String> {
        match resp::call(self.port(), args) {
            Ok(resp::Reply::Error(e)) => Err(format!("{args:?}: {e}")),
            Ok(reply) => Ok(reply),
            Err(e) => Err(format!("{args:?}: {e}")),
        }
    }

    // ---- cases ---------------------------------------------------------------------------

    fn consuming(&self, subject: Subject, prefix: &str) -> Case {
        let key = |tag: &str, kind: &str| format!("{prefix}{tag}:{kind}:__rand_int__");
        let command: Vec<String> = match subject {
            Subject::Native(a) => vec![
                "RATELIMIT.CHECK".into(),
                key(ALGORITHMS[a].2, "n"),
                ALGORITHMS[a].0.into(),
                CONSUME_LIMIT.into(),
                CONSUME_PERIOD_MS.into(),
            ],
            Subject::Lua(a) => vec![
                "EVALSHA".into(),
                self.sha(ALGORITHMS[a].1),
                "1".into(),
                key(ALGORITHMS[a].2, "l"),
                CONSUME_LIMIT.into(),
                CONSUME_PERIOD_MS.into(),
                CONSUME_LIMIT.into(),
                "1".into(),
                String::new(),
            ],
            Subject::SetPxat => vec![
                "SET".into(),
                format!("{prefix}set:__rand_int__"),
                "v".into(),
                "PXAT".into(),
                FAR_FUTURE_MS.into(),
            ],
            Subject::Incr => vec!["INCR".into(), format!("{prefix}incr:__rand_int__")],
            Subject::Ping => vec!["PING".into()],
        };
        Case { subject, command }
    }

    fn rejected(&self, subject: Subject) -> Case {
        let command: Vec<String> = match subject {
            Subject::Native(a) => vec![
                "RATELIMIT.CHECK".into(),
                format!("hot:{}:n", ALGORITHMS[a].2),
                ALGORITHMS[a].0.into(),
                REJECT_LIMIT.into(),
                CONSUME_PERIOD_MS.into(),
            ],
            Subject::Lua(a) => vec![
                "EVALSHA".into(),
                self.sha(ALGORITHMS[a].1),
                "1".into(),
                format!("hot:{}:l", ALGORITHMS[a].2),
                REJECT_LIMIT.into(),
                CONSUME_PERIOD_MS.into(),
                REJECT_LIMIT.into(),
                "1".into(),
                String::new(),
            ],
            Subject::Incr => vec!["INCR".into(), "hot:incr".into()],
            Subject::Ping => vec!["PING".into()],
            Subject::SetPxat => vec![
                "SET".into(),
                "hot:set".into(),
                "v".into(),
                "PXAT".into(),
                FAR_FUTURE_MS.into(),
            ],
        };
        Case { subject, command }
    }

    /// Creates every key of a random-keyspace case (one call per key), so that measured calls
    /// update live keys.
    fn populate(&self, case: &Case, keys: u64) -> Result<(), String> {
        if !case.command.iter().any(|a| a.contains("__rand_int__")) {
            return Ok(());
        }
        let expect = case.subject.algorithm().map(|_| true);
        self.pipeline(keys, expect, case.encoder())
            .map_err(|e| format!("populating {}: {e}", case.subject.label()))
    }

    /// Exhausts a hot key (its first call is admitted), then checks that the next is rejected.
    fn exhaust(&self, case: &Case) -> Result<(), String> {
        if case.subject.algorithm().is_none() {
            return Ok(());
        }
        self.call(&case.command)?;
        let reply = self.call(&case.command)?;
        if reply.allowed() != Some(0) {
            return Err(format!(
                "{}: the hot key still admits after being exhausted: {reply:?}",
                case.subject.label()
            ));
        }
        Ok(())
    }

    /// One redis-benchmark run of `requests` calls, with the in-server cost of the case's
    /// command over exactly that run.
    fn measure(
        &mut self,
        case: &Case,
        pipeline: u32,
        keyspace: Option<u64>,
        requests: u64,
        expect_allowed: bool,
    ) -> Result<Sample, String> {
        let decisions_before = match case.subject {
            Subject::Native(a) => Some(self.module_decisions(a)?),
            _ => None,
        };
        self.resetstat()?;
        let mut command = if self.config.pin {
            let mut taskset = Command::new("taskset");
            taskset.args(["-c", "1", "redis-benchmark"]);
            taskset
        } else {
            Command::new("redis-benchmark")
        };
        command
            .args(["-h", "127.0.0.1", "-p", &self.port().to_string()])
            .args(["-c", &self.config.clients.to_string()])
            .args(["-P", &pipeline.to_string()])
            .args(["-n", &requests.to_string()]);
        if let Some(keys) = keyspace {
            command.args(["-r", &keys.to_string()]);
        }
        command.arg("--csv").args(&case.command);
        let started = Instant::now();
        let output = command
            .output()
            .map_err(|e| format!("running redis-benchmark: {e} (install redis-tools)"))?;
        let seconds = started.elapsed().as_secs_f64();
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            return Err(format!(
                "redis-benchmark {:?} failed ({}): {}{}",
                case.command,
                output.status,
                String::from_utf8_lossy(&output.stderr).trim(),
                stdout.trim()
            ));
        }
        let line = parse_benchmark_csv(&stdout)?;
        let cmdstat_name = case.subject.cmdstat();
        let stats = parse_cmdstat(&self.info("commandstats")?, cmdstat_name)
            .ok_or_else(|| format!("INFO commandstats has no cmdstat_{cmdstat_name}"))?;
        if stats.failed_calls > 0 || stats.rejected_calls > 0 || stats.calls < requests {
            return Err(format!(
                "{}: {} calls for {requests} requests, {} failed, {} rejected by Redis",
                case.subject.label(),
                stats.calls,
                stats.failed_calls,
                stats.rejected_calls
            ));
        }
        if let (Some(before), Subject::Native(a)) = (decisions_before, case.subject) {
            let after = self.module_decisions(a)?;
            let (allowed, rejected) = (after.0 - before.0, after.1 - before.1);
            let wrong = if expect_allowed { rejected } else { allowed };
            if wrong > 0 {
                return Err(format!(
                    "{}: {allowed} calls admitted and {rejected} rejected; expected all {}",
                    case.subject.label(),
                    if expect_allowed {
                        "admitted"
                    } else {
                        "rejected"
                    }
                ));
            }
        }
        Ok(Sample {
            requests,
            seconds,
            rps: line.rps,
            avg_ms: line.avg_ms,
            p50_ms: line.p50_ms,
            p99_ms: line.p99_ms,
            usec_per_call: stats.usec_per_call,
        })
    }

    /// Calibrates the length of each case with a short warm-up run, then measures every case
    /// `reps` times, round by round (A B C ... A B C ...), starting each round one case later.
    fn measure_round_robin(
        &mut self,
        name: &str,
        cases: &[Case],
        pipeline: u32,
        keyspace: Option<u64>,
        expect_allowed: bool,
    ) -> Result<Vec<Vec<Sample>>, String> {
        let per_batch = u64::from(self.config.clients) * u64::from(pipeline);
        let warm_up = if pipeline > 1 { 8 * per_batch } else { 1_500 };
        let mut requests = Vec::new();
        for case in cases {
            let sample = self.measure(case, pipeline, keyspace, warm_up, expect_allowed)?;
            let n = (sample.rps * self.config.run_secs) as u64;
            let n = n.clamp(warm_up, 20_000_000);
            requests.push(n.div_ceil(per_batch) * per_batch);
        }
        let mut samples = vec![Vec::new(); cases.len()];
        for rep in 0..self.config.reps {
            let round = Instant::now();
            for k in 0..cases.len() {
                let i = (k + rep) % cases.len();
                let sample =
                    self.measure(&cases[i], pipeline, keyspace, requests[i], expect_allowed)?;
                samples[i].push(sample);
            }
            eprintln!(
                "bench:   {name}: round {}/{} in {:.1}s",
                rep + 1,
                self.config.reps,
                round.elapsed().as_secs_f64()
            );
        }
        Ok(samples)
    }

    // ---- phases --------------------------------------------------------------------------

    /// Throughput, latency and cost per call: consuming calls over the random keyspace and
    /// rejected calls on hot keys, at pipeline 16 and 1.
    fn throughput_phase(&mut self) -> Result<Vec<CaseResult>, String> {
        self.flushall()?;
        let keys = self.config.keys;
        let mut subjects = Vec::new();
        for a in 0..ALGORITHMS.len() {
            subjects.push(Subject::Native(a));
            subjects.push(Subject::Lua(a));
        }
        let random: Vec<Case> = subjects
            .iter()
            .copied()
            .chain([Subject::SetPxat, Subject::Incr, Subject::Ping])
            .map(|s| self.consuming(s, "rl:"))
            .collect();
        let hot: Vec<Case> = subjects
            .iter()
            .copied()
            .chain([Subject::Incr])
            .map(|s| self.rejected(s))
            .collect();
        let filling = Instant::now();
        for case in &random {
            self.populate(case, keys)?;
        }
        for case in &hot {
            self.exhaust(case)?;
        }
        eprintln!(
            "bench:   filled {} keys in {:.1}s",
            self.dbsize()?,
            filling.elapsed().as_secs_f64()
        );
        // Lua scripts keep no statistics: check once that they admit / reject as meant.
        for case in &random {
            if let Subject::Lua(_) = case.subject {
                let reply = self.call(&case.with_key(0))?;
                if reply.allowed() != Some(1) {
                    return Err(format!("{} did not admit: {reply:?}", case.subject.label()));
                }
            }
        }
        let mut results = Vec::new();
        for group in [
            Group::Random { pipeline: 16 },
            Group::Hot { pipeline: 16 },
            Group::Random { pipeline: 1 },
            Group::Hot { pipeline: 1 },
        ] {
            let (cases, keyspace) = if group.is_random() {
                (&random, Some(keys))
            } else {
                (&hot, None)
            };
            let samples = self.measure_round_robin(
                &group.id(),
                cases,
                group.pipeline(),
                keyspace,
                group.is_random(),
            )?;
            for (case, samples) in cases.iter().zip(samples) {
                results.push(CaseResult {
                    group,
                    subject: case.subject,
                    command: case.command.clone(),
                    samples,
                });
            }
        }
        Ok(results)
    }

    /// `used_memory` delta per key over many keys in the same state, and `MEMORY USAGE` of one.
    fn memory_phase(&mut self) -> Result<Vec<MemoryResult>, String> {
        let keys = self.config.memory_keys;
        let marginal_from = Some(self.config.memory_marginal_from);
        let mut results = Vec::new();
        // Every kind uses the same key names ("rl:" and 12 digits, 15 bytes), one kind at a time
        // on an empty server.
        let key = |i: u64| format!("rl:{i:012}");
        let set_case = move |i: u64| {
            vec![
                "SET".to_string(),
                key(i),
                "v".into(),
                "PXAT".into(),
                FAR_FUTURE_MS.into(),
            ]
        };
        results.push(self.memory_of(
            "set-pxat",
            "SET k v PXAT t",
            keys,
            1,
            marginal_from,
            None,
            set_case,
        )?);
        for (a, &(name, stem, _)) in ALGORITHMS.iter().enumerate() {
            if a == 4 {
                continue; // the log is measured with 100 entries below
            }
            let native = move |i: u64| {
                vec![
                    "RATELIMIT.CHECK".to_string(),
                    key(i),
                    name.to_string(),
                    CONSUME_LIMIT.into(),
                    CONSUME_PERIOD_MS.into(),
                ]
            };
            results.push(self.memory_of(
                &format!("{name}/native"),
                &format!("{name} native"),
                keys,
                1,
                marginal_from,
                Some(true),
                native,
            )?);
            let sha = self.sha(stem);
            let lua = move |i: u64| {
                vec![
                    "EVALSHA".to_string(),
                    sha.clone(),
                    "1".into(),
                    key(i),
                    CONSUME_LIMIT.into(),
                    CONSUME_PERIOD_MS.into(),
                    CONSUME_LIMIT.into(),
                    "1".into(),
                    String::new(),
                ]
            };
            results.push(self.memory_of(
                &format!("{name}/lua"),
                &format!("{name} Lua (HASH)"),
                keys,
                1,
                marginal_from,
                Some(true),
                lua,
            )?);
        }
        // Logs of 100 entries a second apart (a record of 2 bytes in the native log), an hour
        // ahead of the server's clock, 1-day window.
        let log_keys = self.config.log_memory_keys;
        let entries = 100;
        let base = now_ms() + 3_600_000;
        let at = move |c: u64| base + c / log_keys * LOG_GAP_MS;
        let produce = |shape: fn(u64, u64) -> Vec<String>| move |c: u64| shape(c % log_keys, at(c));
        results.push(self.memory_of(
            "sliding-log/native-100",
            "sliding-log native, 100 entries",
            log_keys,
            entries,
            None,
            Some(true),
            produce(|i, at| {
                vec![
                    "RATELIMIT.CHECK".to_string(),
                    format!("rl:{i:012}"),
                    "sliding-log".into(),
                    "1000".into(),
                    "86400000".into(),
                    "AT".into(),
                    at.to_string(),
                ]
            }),
        )?);
        let seed = self.sha("seed_sliding_log");
        results.push(self.memory_of(
            "sliding-log/seed-zset-100",
            "seed ZSET log (seed_sliding_log.lua), 100 entries",
            log_keys,
            entries,
            None,
            Some(true),
            move |c: u64| {
                vec![
                    "EVALSHA".to_string(),
                    seed.clone(),
                    "1".into(),
                    format!("rl:{:012}", c % log_keys),
                    "1000".into(),
                    at(c).to_string(),
                    "86400000".into(),
                ]
            },
        )?);
        let lua_log = self.sha("sliding_log");
        results.push(self.memory_of(
            "sliding-log/lua-zset-100",
            "sliding_log.lua ZSET, 100 entries",
            log_keys,
            entries,
            None,
            Some(true),
            move |c: u64| {
                vec![
                    "EVALSHA".to_string(),
                    lua_log.clone(),
                    "1".into(),
                    format!("rl:{:012}", c % log_keys),
                    "1000".into(),
                    "86400000".into(),
                    "1000".into(),
                    "1".into(),
                    at(c).to_string(),
                ]
            },
        )?);
        Ok(results)
    }

    /// Fills `keys` keys with `calls_per_key` calls each (`produce(c)` the c-th call) on an empty
    /// server and measures the `used_memory` delta per key. With `marginal_from`, the keys are
    /// filled in two steps, `used_memory` read between them, and the second step's delta per key
    /// is the marginal cost of a key: both counts lie between the same powers of two, so the hash
    /// tables of the keyspace and of the expiries keep their size and only the keys count.
    #[allow(clippy::too_many_arguments)]
    fn memory_of<F>(
        &mut self,
        id: &str,
        label: &str,
        keys: u64,
        calls_per_key: u64,
        marginal_from: Option<u64>,
        expect_allowed: Option<bool>,
        produce: F,
    ) -> Result<MemoryResult, String>
    where
        F: Fn(u64) -> Vec<String> + Send + Sync + 'static,
    {
        self.flushall()?;
        let before = self.settled_used_memory()?;
        let first = produce(0);
        let produce = Arc::new(produce);
        let split = marginal_from.filter(|&k| k < keys && calls_per_key == 1);
        let mut middle = None;
        let mut done = 0;
        for stop in split.into_iter().chain([keys]) {
            let produce = Arc::clone(&produce);
            let from = done * calls_per_key;
            self.pipeline(
                (stop - done) * calls_per_key,
                expect_allowed,
                move |c, buf| resp::encode(buf, &produce(from + c)),
            )
            .map_err(|e| format!("memory of {label}: {e}"))?;
            if stop < keys {
                middle = Some(self.settled_used_memory()?);
            }
            done = stop;
        }
        let after = self.settled_used_memory()?;
        let live = self.dbsize()?;
        if live != keys {
            return Err(format!(
                "memory of {label}: {live} keys live after filling {keys}"
            ));
        }
        let key_arg = first
            .iter()
            .find(|a| a.starts_with("rl:"))
            .cloned()
            .unwrap_or_default();
        let memory_usage: Option<i64> = self
            .query(
                redis::cmd("MEMORY")
                    .arg("USAGE")
                    .arg(&key_arg)
                    .arg("SAMPLES")
                    .arg(0),
            )
            .ok();
        let bytes_per_key = (after as f64 - before as f64) / keys as f64;
        let marginal = split
            .zip(middle)
            .map(|(from, middle)| (from, (after as f64 - middle as f64) / (keys - from) as f64));
        eprintln!(
            "bench:   memory {label}: {bytes_per_key:.1} B/key over {keys} keys{}",
            marginal.map_or(String::new(), |(_, m)| format!(", {m:.1} B marginal"))
        );
        Ok(MemoryResult {
            id: id.to_string(),
            label: label.to_string(),
            keys,
            calls_per_key,
            bytes_per_key,
            marginal,
            memory_usage,
        })
    }

    /// usec_per_call of consuming calls (pipeline 16) over 1k and 1M keys; the figures over the
    /// throughput runs' keyspace (100k) come from those runs (`measured`).
    fn scaling_phase(&mut self, measured: &[CaseResult]) -> Result<Vec<ScalingResult>, String> {
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

    /// The sliding log's cost per call with `L` entries at distinct ms in the log, for growing
    /// `L`: consuming calls that slide the window by one ms (one entry out, one in) and rejected
    /// calls on the full log, native against sliding_log.lua.
    fn log_scaling_phase(&mut self) -> Result<Vec<LogScalingResult>, String> {
        self.flushall()?;
        let base = now_ms() + 3_600_000;
        let lua_sha = self.sha("sliding_log");
        let limits = self.config.log_limits.clone();
        let calls = self.config.log_calls;
        // Per limit and kind (native, Lua): the next AT of a consuming call.
        let mut next_at: Vec<[u64; 2]> = Vec::new();
        let mut results: Vec<LogScalingResult> = Vec::new();
        let budget = Duration::from_secs(if self.config.quick { 10 } else { 25 });
        let mut live = Vec::new(); // per limit and kind: still measured (filled in time)
        for &limit in &limits {
            let mut result = LogScalingResult {
                limit,
                ..LogScalingResult::default()
            };
            let mut ok = [true, true];
            for (kind, ok) in ok.iter_mut().enumerate() {
                let started = Instant::now();
                let mut done = 0;
                while done < limit {
                    let chunk = (limit - done).min(10_000);
                    let sha = lua_sha.clone();
                    let from = done;
                    self.pipeline(chunk, Some(true), move |i, buf| {
                        resp::encode(buf, &log_call(kind, &sha, limit, limit, base + from + i))
                    })?;
                    done += chunk;
                    if started.elapsed() > budget && done < limit {
                        *ok = false;
                        result.note = Some(format!(
                            "{} log not filled: {done} of {limit} entries in {:.0}s",
                            if kind == 0 { "native" } else { "Lua" },
                            started.elapsed().as_secs_f64()
                        ));
                        break;
                    }
                }
            }
            next_at.push([base + limit; 2]);
            live.push(ok);
            results.push(result);
        }
        let mut samples: Vec<[Vec<f64>; 4]> = vec![Default::default(); limits.len()];
        for rep in 0..self.config.reps {
            let round = Instant::now();
            for (li, &limit) in limits.iter().enumerate() {
                for kind in 0..2 {
                    if !live[li][kind] {
                        continue;
                    }
                    let sha = lua_sha.clone();
                    let from = next_at[li][kind];
                    let started = Instant::now();
                    // Consuming: each call one ms later, one entry leaves and one enters.
                    self.resetstat()?;
                    self.pipeline(calls, Some(true), move |i, buf| {
                        resp::encode(buf, &log_call(kind, &sha, limit, limit, from + i))
                    })?;
                    samples[li][2 * kind].push(self.log_usec(kind)?);
                    next_at[li][kind] = from + calls;
                    // Rejected: at the newest entry's ms, the log is full.
                    let sha = lua_sha.clone();
                    let last = from + calls - 1;
                    self.resetstat()?;
                    self.pipeline(calls, Some(false), move |_, buf| {
                        resp::encode(buf, &log_call(kind, &sha, limit, limit, last))
                    })?;
                    samples[li][2 * kind + 1].push(self.log_usec(kind)?);
                    if started.elapsed() > budget {
                        live[li][kind] = false;
                        results[li].note = Some(format!(
                            "{} calls at limit {limit} took {:.0}s: stopped",
                            if kind == 0 { "native" } else { "Lua" },
                            started.elapsed().as_secs_f64()
                        ));
                    }
                }
            }
            eprintln!(
                "bench:   sliding-log limits: round {}/{} in {:.1}s",
                rep + 1,
                self.config.reps,
                round.elapsed().as_secs_f64()
            );
        }
        for (result, s) in results.iter_mut().zip(samples) {
            result.native_consume = Summary::of(&s[0]);
            result.native_reject = Summary::of(&s[1]);
            result.lua_consume = Summary::of(&s[2]);
            result.lua_reject = Summary::of(&s[3]);
        }
        self.flushall()?;
        Ok(results)
    }

    fn log_usec(&mut self, kind: usize) -> Result<f64, String> {
        let name = if kind == 0 {
            "ratelimit.check"
        } else {
            "evalsha"
        };
        parse_cmdstat(&self.info("commandstats")?, name)
            .map(|s| s.usec_per_call)
            .ok_or_else(|| format!("INFO commandstats has no cmdstat_{name}"))
    }
}

/// A sliding-log call `AT at` with limit and period `limit` (ms): native (kind 0) or Lua.
fn log_call(kind: usize, sha: &str, limit: u64, period: u64, at: u64) -> Vec<String> {
    if kind == 0 {
        vec![
            "RATELIMIT.CHECK".into(),
            format!("slog:n:{limit}"),
            "sliding-log".into(),
            limit.to_string(),
            period.to_string(),
            "AT".into(),
            at.to_string(),
        ]
    } else {
        vec![
            "EVALSHA".into(),
            sha.into(),
            "1".into(),
            format!("slog:l:{limit}"),
            limit.to_string(),
            period.to_string(),
            limit.to_string(),
            "1".into(),
            at.to_string(),
        ]
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

// ---- the machine -------------------------------------------------------------------------

fn machine_before() -> model::Machine {
    let cpu_model = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let redis_version = command_output("redis-server", &["--version"])
        .map(|v| {
            let field = |name: &str| {
                v.split_whitespace()
                    .find_map(|w| w.strip_prefix(name))
                    .unwrap_or("?")
                    .to_string()
            };
            format!("{} ({})", field("v="), field("malloc="))
        })
        .unwrap_or_else(|| "unknown".into());
    let module_revision = command_output("git", &["describe", "--always", "--dirty"])
        .unwrap_or_else(|| "unknown".into());
    model::Machine {
        date_utc: utc_now(),
        cpu_model,
        nproc: thread::available_parallelism().map_or(0, |n| n.get()),
        kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        redis_version,
        module_revision,
        load_before: load_average(),
        load_after: String::new(),
    }
}

fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let output = Command::new(program)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// The 1, 5 and 15 minute load averages.
fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// `YYYY-MM-DD HH:MM UTC`.
fn utc_now() -> String {
    let secs = now_ms() / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60
    )
}
