//! What the example tests share: installing an example once (`run.sh install`), starting it
//! through `run.sh` on a free port in a process group of its own (killed on Drop, and by the
//! kernel if the test binary dies), and the HTTP drivers: httpx for the FastAPI app, Node's own
//! `fetch` for the Express app (each app is driven by its ecosystem's client).

use std::collections::HashMap;
use std::fs;
use std::io::Read;
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{free_port, make_temp_dir, remove_dir, spawn_child};

/// How long a first install may take (pip or npm from the registry).
const INSTALL_TIMEOUT: Duration = Duration::from_secs(600);
/// How long an app may take to listen once installed (uvicorn imports FastAPI: about 1 s).
const START_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Example {
    FastApi,
    Express,
    Prometheus,
}

impl Example {
    pub fn name(self) -> &'static str {
        match self {
            Example::FastApi => "fastapi",
            Example::Express => "express",
            Example::Prometheus => "prometheus",
        }
    }

    pub fn dir(self) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("examples")
            .join(self.name())
    }

    /// `run.sh install`, once per test run: Ok, or why the example cannot run here.
    pub fn installed(self) -> Result<(), String> {
        static DONE: [OnceLock<Result<(), String>>; 3] =
            [OnceLock::new(), OnceLock::new(), OnceLock::new()];
        DONE[self as usize]
            .get_or_init(|| {
                let mut command = Command::new("bash");
                command.arg(self.dir().join("run.sh")).arg("install");
                let (success, output) = run(command, INSTALL_TIMEOUT)?;
                if success {
                    return Ok(());
                }
                let hint = match self {
                    Example::FastApi => "python3 with venv, and PyPI",
                    Example::Express => "node 20+ and npm, and the npm registry",
                    Example::Prometheus => "apt-get and Debian's archive",
                };
                // The whole output to the test's log; one line for the skip (make test counts
                // the skip log's lines): the first that says error, else the last.
                eprintln!(
                    "examples/{}/run.sh install:\n{}",
                    self.name(),
                    tail(&output, 40)
                );
                let lines = || output.lines().map(str::trim).filter(|l| !l.is_empty());
                let error = lines()
                    .find(|l| l.to_ascii_lowercase().contains("error"))
                    .or_else(|| lines().next_back())
                    .unwrap_or("no output");
                Err(format!(
                    "examples/{}/run.sh install failed (it needs {hint}): {error}",
                    self.name()
                ))
            })
            .clone()
    }
}

/// Runs `command` to its end within `timeout`: whether it succeeded, and its stdout and stderr.
pub fn run(mut command: Command, timeout: Duration) -> Result<(bool, String), String> {
    let dir = make_temp_dir();
    let log = dir.join("output.log");
    let file = fs::File::create(&log).expect("create a log file");
    command
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("clone a file handle"))
        .stderr(file)
        .process_group(0);
    let what = format!("{command:?}");
    let mut child = spawn_child(command).map_err(|e| format!("cannot run {what}: {e}"))?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for a child") {
            break Some(status);
        }
        if Instant::now() > deadline {
            kill_group(&mut child);
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    let output = fs::read_to_string(&log).unwrap_or_default();
    remove_dir(&dir);
    match status {
        Some(status) => Ok((status.success(), output)),
        None => {
            eprintln!("{what}:\n{}", tail(&output, 40));
            Err(format!("{what} did not finish within {timeout:?}"))
        }
    }
}

/// SIGTERM to the child's process group, then SIGKILL if it is still there after 3 s.
fn kill_group(child: &mut Child) {
    let group = child.id() as libc::pid_t;
    // SAFETY: kill(2) with a negative pid signals that process group; the group is the child's
    // own (process_group(0)), so nothing else is signalled.
    unsafe { libc::kill(-group, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: as above; whatever of the group is left (a child of the app) is killed too.
    unsafe { libc::kill(-group, libc::SIGKILL) };
    let _ = child.wait();
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// An example started through its `run.sh` on a free port, killed (with its process group) on
/// Drop.
pub struct App {
    pub example: Example,
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
}

impl App {
    /// Starts `example` against `redis_url` with `env` added, and waits until it listens.
    pub fn start(example: Example, redis_url: &str, env: &[(&str, &str)]) -> App {
        let port = free_port();
        let dir = make_temp_dir();
        let log = fs::File::create(dir.join("app.log")).expect("create the app's log");
        let mut command = Command::new("bash");
        command
            .arg(example.dir().join("run.sh"))
            .env("REDIS_URL", redis_url)
            .env("PORT", port.to_string())
            .env("HOST", "127.0.0.1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone a file handle"))
            .stderr(log)
            .process_group(0);
        let child = spawn_child(command)
            .unwrap_or_else(|e| panic!("cannot run {}/run.sh: {e}", example.name()));
        let mut app = App {
            example,
            port,
            child: Some(child),
            dir,
        };
        app.wait_listening();
        app
    }

    fn wait_listening(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let child = self.child.as_mut().expect("running");
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "examples/{}/run.sh exited ({status}) before listening on {}:\n{}",
                    self.example.name(),
                    self.port,
                    tail(&self.log(), 30)
                );
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "examples/{}/run.sh did not listen on {} within {START_TIMEOUT:?}:\n{}",
                self.example.name(),
                self.port,
                tail(&self.log(), 30)
            );
            thread::sleep(Duration::from_millis(25));
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What the app printed so far.
    pub fn log(&self) -> String {
        let mut text = String::new();
        let _ =
            fs::File::open(self.dir.join("app.log")).and_then(|mut f| f.read_to_string(&mut text));
        text
    }

    /// Waits (up to 5 s) until the app's log has a line containing `what`; the log.
    pub fn wait_log(&self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let log = self.log();
            if log.contains(what) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "examples/{} never logged {what:?}; its log:\n{log}",
                self.example.name()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `plan`'s rounds of requests (see drive.py) with the app's ecosystem's client
    /// (httpx, or Node's `fetch`); what came back, per round.
    pub fn drive(&self, plan: &Value) -> Vec<Vec<Response>> {
        drive(self.example, &self.url(), plan, &self.log_on_failure())
    }

    fn log_on_failure(&self) -> String {
        format!(
            "examples/{}'s log:\n{}",
            self.example.name(),
            tail(&self.log(), 40)
        )
    }
}

impl Drop for App {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_group(&mut child);
        }
        if thread::panicking() {
            eprintln!("{}", self.log_on_failure());
        }
        remove_dir(&self.dir);
    }
}

/// One request of a plan: `GET /` (or `method path`) with `X-API-Key: key` (none if empty).
pub fn request(method: &str, path: &str, key: &str, json: Option<Value>) -> Value {
    let mut r = serde_json::json!({ "method": method, "path": path });
    if !key.is_empty() {
        r["key"] = key.into();
    }
    if let Some(json) = json {
        r["json"] = json;
    }
    r
}

pub fn get(key: &str) -> Value {
    request("GET", "/", key, None)
}

/// One response, as drive.py reports it.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: Value,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    /// `RateLimit: "<policy>";r=<r>;t=<t>` as (policy, r, t).
    pub fn ratelimit(&self) -> Option<(String, u64, u64)> {
        let value = self.header("ratelimit")?;
        let mut parts = value.split(';');
        let policy = parts.next()?.trim_matches('"').to_string();
        let field = |name: &str, part: Option<&str>| -> Option<u64> {
            part?.strip_prefix(name)?.parse().ok()
        };
        Some((
            policy,
            field("r=", parts.next())?,
            field("t=", parts.next())?,
        ))
    }

    /// `Retry-After` in seconds.
    pub fn retry_after(&self) -> Option<u64> {
        self.header("retry-after").map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("Retry-After {v:?} is not whole seconds"))
        })
    }
}

/// Runs `example`'s driver: drive.py with the FastAPI example's python (httpx is in its
/// virtualenv), or drive.mjs with node (fetch is Node's own) for the Express app.
pub fn drive(example: Example, base_url: &str, plan: &Value, context: &str) -> Vec<Vec<Response>> {
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/examples");
    let (mut command, script) = match example {
        Example::Express => (Command::new("node"), "drive.mjs"),
        _ => (
            Command::new(Example::FastApi.dir().join(".venv/bin/python")),
            "drive.py",
        ),
    };
    command
        .arg(scripts.join(script))
        .arg(base_url)
        .arg(plan.to_string());
    command.stdin(Stdio::null());
    let output = command.output().unwrap_or_else(|e| panic!("{script}: {e}"));
    // The clients' own timeouts (20 s a request) bound how long this takes.
    assert!(
        output.status.success(),
        "{script} {base_url} failed on plan {plan}:\n{}\n{context}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rounds: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{script} prints JSON ({e})"));
    rounds
        .as_array()
        .expect("rounds")
        .iter()
        .map(|round| {
            round
                .as_array()
                .expect("a round")
                .iter()
                .map(|r| Response {
                    status: r["status"].as_u64().expect("status") as u16,
                    headers: r["headers"]
                        .as_object()
                        .expect("headers")
                        .iter()
                        .map(|(k, v)| {
                            (k.to_ascii_lowercase(), v.as_str().unwrap_or("").to_string())
                        })
                        .collect(),
                    body: r["body"].clone(),
                })
                .collect()
        })
        .collect()
}

/// `example` installed (for the FastAPI app, with its httpx driver), and the redis-server on PATH under test: Ok, or
/// why the test skips. (Under `make test-matrix`'s other servers the examples skip: they test
/// the apps, not the server.)
pub fn ready(example: Example) -> Result<(), String> {
    if crate::snippets::other_server().is_some() {
        return Err("the examples run on the redis-server on PATH, not RATELIMIT_SERVER's".into());
    }
    example.installed()
}

/// A loopback URL where nothing listens: Redis unreachable.
pub fn unreachable_redis_url() -> String {
    format!("redis://127.0.0.1:{}", free_port())
}
