//! Integration-test harness: runs a real `redis-server` with the module as a child process.
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
//! let durable = Server::builder().config(&[("appendonly", "yes"), ("appendfsync", "always")]).start();
//! ```
//!
//! Environment: `RATELIMIT_MODULE` (the module to load; `make test` sets it), `REDIS_SERVER` (the
//! server binary, default `redis-server` from PATH), `RATELIMIT_KEEP_TEST_DIRS=1` (keep the
//! temporary directories for inspection).
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
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs;
use std::io;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::{Cmd, Connection, ConnectionLike, Value};

/// How long a starting server may take to answer PING (unscaled: see [`ready_timeout`]).
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a replica may take to reach its master's offset (unscaled: see [`scaled`]).
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(10);
/// Read/write timeout of the connections [`Server::client`] returns, so a hung server fails the
/// test instead of blocking it forever (unscaled: see [`scaled`]).
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// The command prefix of `$RATELIMIT_SERVER_WRAPPER` (split on whitespace); empty when unset.
pub fn server_wrapper() -> Vec<OsString> {
    std::env::var("RATELIMIT_SERVER_WRAPPER")
        .unwrap_or_default()
        .split_whitespace()
        .map(OsString::from)
        .collect()
}

/// `timeout` times `$RATELIMIT_TIMEOUT_SCALE`, which defaults to 20 under a server wrapper (a
/// server under valgrind runs 30-50x slower) and to 1 without one.
pub fn scaled(timeout: Duration) -> Duration {
    static SCALE: OnceLock<u32> = OnceLock::new();
    let scale = *SCALE.get_or_init(|| {
        let default = if server_wrapper().is_empty() { 1 } else { 20 };
        std::env::var("RATELIMIT_TIMEOUT_SCALE")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(default)
    });
    timeout * scale
}

/// How long a starting server may take to answer PING: `$RATELIMIT_READY_TIMEOUT_MS`, else
/// [`READY_TIMEOUT`] [`scaled`].
pub fn ready_timeout() -> Duration {
    std::env::var("RATELIMIT_READY_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .map(Duration::from_millis)
        .unwrap_or_else(|| scaled(READY_TIMEOUT))
}

const MODULE_FILE: &str = "libredis_ratelimit.so";
const DAY_MS: u64 = 86_400_000;

/// The module library to load: `$RATELIMIT_MODULE` if set, else the release build, else the
/// debug build. Panics if none exists.
pub fn module_path() -> PathBuf {
    if let Some(path) = std::env::var_os("RATELIMIT_MODULE") {
        let path = PathBuf::from(path);
        return path.canonicalize().unwrap_or_else(|e| {
            panic!(
                "RATELIMIT_MODULE={}: {e}; build it with `make build`",
                path.display()
            )
        });
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let candidates = [
        target.join("release").join(MODULE_FILE),
        target.join("debug").join(MODULE_FILE),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "no module library: none of {candidates:?} exists; run `make build` \
             (or `cargo build --release`), or set RATELIMIT_MODULE"
            )
        })
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

/// Options for a [`Server`]; start it with [`ServerBuilder::start`].
#[derive(Clone, Debug, Default)]
pub struct ServerBuilder {
    config: Vec<(String, String)>,
    module_args: Vec<String>,
    no_module: bool,
}

impl ServerBuilder {
    /// Extra configuration directives (`--name value`), applied after the harness defaults so
    /// they win: `&[("appendonly", "yes"), ("maxmemory", "10mb")]`. Module configs
    /// (`ratelimit.max-log-limit`) work here too.
    pub fn config(mut self, pairs: &[(&str, &str)]) -> Self {
        self.config
            .extend(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self
    }

    /// Arguments passed to the module at load time (`--loadmodule <path> args...`).
    pub fn module_args(mut self, args: &[&str]) -> Self {
        self.module_args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// Start a plain redis-server without the module (baselines, harness tests).
    pub fn no_module(mut self) -> Self {
        self.no_module = true;
        self
    }

    /// Start the server and wait until it answers PING.
    pub fn start(self) -> Server {
        let dir = make_temp_dir();
        let args = self.server_args(&dir);
        for _ in 0..20 {
            let port = free_port();
            match launch(&args, port, &dir) {
                Ok(child) => {
                    return Server {
                        child: Some(child),
                        port,
                        dir,
                        args,
                        paused: AtomicBool::new(false),
                    }
                }
                Err(LaunchError::PortClash) => continue,
                Err(LaunchError::Failed(message)) => {
                    remove_dir(&dir);
                    panic!("{message}");
                }
            }
        }
        remove_dir(&dir);
        panic!("redis-server: every port tried was already in use");
    }

    /// The command line after `--port`: the harness defaults, the module, then the caller's config.
    fn server_args(&self, dir: &Path) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        let mut directive = |name: &str, values: &[OsString]| {
            args.push(format!("--{name}").into());
            args.extend(values.iter().cloned());
        };
        directive("bind", &["127.0.0.1".into()]);
        directive("daemonize", &["no".into()]);
        directive("dir", &[dir.into()]);
        directive("logfile", &[dir.join("redis.log").into()]);
        directive("save", &["".into()]);
        directive("appendonly", &["no".into()]);
        directive("enable-debug-command", &["local".into()]);
        // A command that fails while its effects are propagated (to replicas/AOF) crashes the
        // server instead of diverging silently. Exists from 7.0, the oldest Redis we support.
        directive("propagation-error-behavior", &["panic".into()]);
        // Full syncs start at once instead of waiting 5 s for more replicas (7.0 default).
        directive("repl-diskless-sync-delay", &["0".into()]);
        if !self.no_module {
            let mut values: Vec<OsString> = vec![module_path().into()];
            values.extend(self.module_args.iter().map(OsString::from));
            directive("loadmodule", &values);
        }
        for (name, value) in &self.config {
            directive(name, &[value.into()]);
        }
        args
    }
}

/// A running `redis-server` child process on 127.0.0.1, with its own temporary directory.
pub struct Server {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    args: Vec<OsString>,
    paused: AtomicBool,
}

impl Server {
    /// Options for a server; finish with [`ServerBuilder::start`].
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }

    /// A server with the module loaded and the harness defaults.
    pub fn start() -> Server {
        Self::builder().start()
    }

    /// A server without the module.
    pub fn start_without_module() -> Server {
        Self::builder().no_module().start()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's working directory (RDB, AOF, log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The process id, while the server runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The whole log file (plus anything the process printed to stdout/stderr).
    pub fn log(&self) -> String {
        read_logs(&self.dir)
    }

    /// The last `lines` lines of [`Server::log`].
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log(), lines)
    }

    /// A new RESP2 connection with [`CLIENT_TIMEOUT`] read/write timeouts.
    pub fn client(&self) -> redis::Connection {
        self.connect(&self.url(), scaled(CLIENT_TIMEOUT))
    }

    /// A new RESP2 connection whose connect, read and write timeouts are `timeout`.
    pub fn client_with_timeout(&self, timeout: Duration) -> redis::Connection {
        self.connect(&self.url(), timeout)
    }

    /// A new RESP3 connection (`HELLO 3`), with [`CLIENT_TIMEOUT`] timeouts.
    pub fn client_resp3(&self) -> redis::Connection {
        self.connect(
            &format!("{}?protocol=resp3", self.url()),
            scaled(CLIENT_TIMEOUT),
        )
    }

    fn connect(&self, url: &str, timeout: Duration) -> redis::Connection {
        let connection = redis::Client::open(url)
            .and_then(|client| client.get_connection_with_timeout(timeout))
            .unwrap_or_else(|e| {
                panic!("connecting to {url}: {e}\n{}", self.log_tail(20));
            });
        connection
            .set_read_timeout(Some(timeout))
            .expect("set read timeout");
        connection
            .set_write_timeout(Some(timeout))
            .expect("set write timeout");
        connection
    }

    /// `INFO <section>` as field -> value.
    pub fn info(&self, section: &str) -> HashMap<String, String> {
        let text: String = redis::cmd("INFO")
            .arg(section)
            .query(&mut self.client())
            .unwrap_or_else(|e| panic!("INFO {section} on port {}: {e}", self.port));
        parse_info(&text)
    }

    /// One field of `INFO <section>`; panics if it is missing.
    pub fn info_field(&self, section: &str, field: &str) -> String {
        self.info(section)
            .remove(field)
            .unwrap_or_else(|| panic!("INFO {section} on port {} has no {field}", self.port))
    }

    /// Graceful stop: `SHUTDOWN SAVE` (writes an RDB even with `save ""`) or `SHUTDOWN NOSAVE`
    /// (the AOF, if enabled, is still flushed), then wait for the process to exit.
    /// Does nothing if the server is not running.
    pub fn stop(&mut self, save: bool) {
        self.resume();
        if self.child.is_none() {
            return;
        }
        let reply = redis::Client::open(self.url())
            .and_then(|client| client.get_connection_with_timeout(scaled(CLIENT_TIMEOUT)))
            .and_then(|mut con| {
                redis::cmd("SHUTDOWN")
                    .arg(if save { "SAVE" } else { "NOSAVE" })
                    .query::<redis::Value>(&mut con)
            });
        // On success the server closes the connection without replying; an error reply means
        // it refused (and keeps running).
        if let Err(e) = &reply {
            if e.code().is_some() {
                panic!(
                    "SHUTDOWN on port {} refused: {e}\n{}",
                    self.port,
                    self.log_tail(20)
                );
            }
        }
        let child = self.child.as_mut().expect("checked above");
        let timeout = scaled(Duration::from_secs(30));
        if wait_for_exit(child, timeout).is_none() {
            panic!(
                "redis-server on port {} still runs {timeout:?} after SHUTDOWN\n{}",
                self.port,
                self.log_tail(20)
            );
        }
        self.child = None;
    }

    /// Start the stopped (or killed) server again with the same directory, port and arguments,
    /// so it reloads its RDB/AOF. Connections made before are dead: get new ones.
    pub fn start_again(&mut self) {
        assert!(
            self.child.is_none(),
            "start_again: the server is still running"
        );
        // The port was ours a moment ago; if something else holds it, wait for it to go.
        let deadline = Instant::now() + ready_timeout();
        loop {
            match launch(&self.args, self.port, &self.dir) {
                Ok(child) => {
                    self.child = Some(child);
                    return;
                }
                Err(LaunchError::PortClash) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(100))
                }
                Err(LaunchError::PortClash) => {
                    panic!("restarting redis-server: port {} stays in use", self.port)
                }
                Err(LaunchError::Failed(message)) => panic!("{message}"),
            }
        }
    }

    /// [`stop`](Server::stop) with `SHUTDOWN SAVE`, then [`start_again`](Server::start_again).
    pub fn restart(&mut self) {
        self.stop(true);
        self.start_again();
    }

    /// Crash the server: SIGKILL and reap it (no save, no AOF flush). Follow with
    /// [`start_again`](Server::start_again) to recover from what reached the disk.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Freeze the process (SIGSTOP) until [`resume`](Server::resume): it accepts TCP connections
    /// (the kernel queues them) but answers nothing.
    pub fn pause(&self) {
        let pid = self.running_pid("pause");
        // SAFETY: kill(2) has no memory effects; pid is our own unreaped child.
        assert_eq!(
            unsafe { libc::kill(pid, libc::SIGSTOP) },
            0,
            "SIGSTOP {pid}"
        );
        self.paused.store(true, Ordering::SeqCst);
        // Signals are delivered asynchronously: wait until the process is really stopped.
        let deadline = Instant::now() + Duration::from_secs(2);
        while process_state(pid) != Some('T') && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// Continue a paused process (SIGCONT). Does nothing if it is not paused.
    pub fn resume(&self) {
        if self.paused.swap(false, Ordering::SeqCst) {
            if let Some(child) = &self.child {
                // SAFETY: as in pause.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGCONT) };
            }
        }
    }

    /// Make this server a replica of `master` and wait until it is in sync.
    pub fn replica_of(&self, master: &Server) {
        let _: () = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(master.port())
            .query(&mut self.client())
            .unwrap_or_else(|e| panic!("REPLICAOF on port {}: {e}", self.port));
        wait_replica_sync(master, self);
    }

    /// Stop replicating (`REPLICAOF NO ONE`).
    pub fn promote(&self) {
        let _: () = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query(&mut self.client())
            .unwrap_or_else(|e| panic!("REPLICAOF NO ONE on port {}: {e}", self.port));
    }

    fn running_pid(&self, what: &str) -> libc::pid_t {
        let child = self.child.as_ref();
        let child = child.unwrap_or_else(|| panic!("{what}: the server is not running"));
        child.id() as libc::pid_t
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id() as libc::pid_t;
            // SAFETY: as in pause. SIGCONT first: a stopped process would not act on SIGTERM.
            unsafe {
                libc::kill(pid, libc::SIGCONT);
                libc::kill(pid, libc::SIGTERM);
            }
            // Under a wrapper (valgrind) the exit takes longer: the tool writes its report.
            if wait_for_exit(&mut child, scaled(Duration::from_secs(3))).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if thread::panicking() {
            eprintln!(
                "--- redis-server on port {} ({}), log tail ---\n{}",
                self.port,
                self.dir.display(),
                self.log_tail(30)
            );
        }
        if std::env::var_os("RATELIMIT_KEEP_TEST_DIRS").is_none() {
            remove_dir(&self.dir);
        }
    }
}

/// Wait until `replica` is linked to `master` and has processed everything the master has
/// sent (equal replication offsets). Panics after [`SYNC_TIMEOUT`] ([`scaled`]).
pub fn wait_replica_sync(master: &Server, replica: &Server) {
    let timeout = scaled(SYNC_TIMEOUT);
    let deadline = Instant::now() + timeout;
    loop {
        let master_offset = master.info("replication").remove("master_repl_offset");
        let r = replica.info("replication");
        let linked = r.get("master_link_status").map(String::as_str) == Some("up");
        if linked && master_offset.is_some() && r.get("slave_repl_offset") == master_offset.as_ref()
        {
            return;
        }
        if Instant::now() >= deadline {
            panic!(
                "replica on port {} not in sync with master on port {} after {timeout:?}: \
                 master offset {master_offset:?}, replica {r:?}\n--- master log ---\n{}\n\
                 --- replica log ---\n{}",
                replica.port(),
                master.port(),
                master.log_tail(15),
                replica.log_tail(15)
            );
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Parse an INFO reply into field -> value (section headers and blank lines skipped).
pub fn parse_info(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim_end().to_string()))
        .collect()
}

enum LaunchError {
    /// The port was taken before the server could bind it: try another.
    PortClash,
    /// Anything else, with a message that includes the log.
    Failed(String),
}

fn server_binary() -> OsString {
    std::env::var_os("REDIS_SERVER").unwrap_or_else(|| "redis-server".into())
}

/// Spawn redis-server on `port` and wait until it answers PING.
fn launch(args: &[OsString], port: u16, dir: &Path) -> Result<Child, LaunchError> {
    let sizes_before = log_sizes(dir);
    let stdio = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("stdio.log"))
        .map_err(|e| LaunchError::Failed(format!("creating {}: {e}", dir.display())))?;
    let stdio_err = stdio.try_clone().expect("clone a file handle");
    let wrapper = server_wrapper();
    let mut command = match wrapper.split_first() {
        Some((tool, tool_args)) => {
            let mut command = Command::new(tool);
            command.args(tool_args).arg(server_binary());
            command
        }
        None => Command::new(server_binary()),
    };
    command
        .arg("--port")
        .arg(port.to_string())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(stdio)
        .stderr(stdio_err);
    let mut child = spawn_child(command).map_err(|e| {
        LaunchError::Failed(format!(
            "cannot run {:?} {:?}: {e} (install it with `make deps`, or set REDIS_SERVER)",
            wrapper,
            server_binary()
        ))
    })?;
    let pid = child.id();
    let timeout = ready_timeout();
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let new_log = logs_since(dir, sizes_before);
            if new_log.contains("Address already in use") {
                return Err(LaunchError::PortClash);
            }
            return Err(LaunchError::Failed(format!(
                "redis-server on port {port} exited at start-up ({status})\n{}",
                tail(&new_log, 30)
            )));
        }
        if answers_as(port, pid) {
            return Ok(child);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(LaunchError::Failed(format!(
                "redis-server on port {port} did not answer PING within {timeout:?}\n{}",
                tail(&read_logs(dir), 30)
            )));
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// True when the server on `port` answers PING (so it finished loading) and is process `pid`
/// (not some other server that got the port first).
fn answers_as(port: u16, pid: u32) -> bool {
    let timeout = scaled(Duration::from_millis(500));
    let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}/")) else {
        return false;
    };
    let Ok(mut con) = client.get_connection_with_timeout(timeout) else {
        return false;
    };
    let _ = con.set_read_timeout(Some(timeout));
    if redis::cmd("PING").query::<String>(&mut con).as_deref() != Ok("PONG") {
        return false;
    }
    let Ok(info) = redis::cmd("INFO").arg("server").query::<String>(&mut con) else {
        return false;
    };
    parse_info(&info).get("process_id") == Some(&pid.to_string())
}

/// Spawn `command` from one thread that lives as long as the test process, with
/// `PR_SET_PDEATHSIG = SIGKILL`: the kernel kills the server when that thread, i.e. the whole
/// test binary, dies, even by SIGKILL or a timeout. (The signal follows the spawning thread, so
/// spawning from the test's own thread would kill servers shared between tests.)
fn spawn_child(mut command: Command) -> io::Result<Child> {
    type Request = (Command, mpsc::Sender<io::Result<Child>>);
    static SPAWNER: OnceLock<mpsc::Sender<Request>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (requests, incoming) = mpsc::channel::<Request>();
        thread::Builder::new()
            .name("redis-server-spawner".into())
            .spawn(move || {
                for (mut command, reply) in incoming {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("start the redis-server spawner thread");
        requests
    });
    // SAFETY: the closure runs in the forked child before exec and only calls prctl(2), which is
    // async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (reply, result) = mpsc::channel();
    spawner
        .send((command, reply))
        .expect("the redis-server spawner thread is gone");
    result
        .recv()
        .expect("the redis-server spawner thread is gone")
}

/// A loopback port nobody listens on, never handed out twice by this process, and whose cluster
/// bus port (+10000) is free too, so `cluster-enabled yes` works.
fn free_port() -> u16 {
    static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let handed_out = handed_out.get_or_insert_with(HashSet::new);
    for _ in 0..1000 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local address").port();
        drop(listener);
        let usable = port != 6379
            && port <= 55_535
            && !handed_out.contains(&port)
            && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok();
        if usable {
            handed_out.insert(port);
            return port;
        }
    }
    panic!("found no free loopback port");
}

fn make_temp_dir() -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    loop {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "redis-ratelimit-test-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let dir = std::env::temp_dir().join(name);
        match fs::create_dir(&dir) {
            Ok(()) => return dir,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => panic!("creating {}: {e}", dir.display()),
        }
    }
}

fn remove_dir(dir: &Path) {
    let _ = fs::remove_dir_all(dir);
}

/// redis.log followed by whatever the process wrote to stdout/stderr (config errors, crashes
/// before the log file is open).
fn read_logs(dir: &Path) -> String {
    let mut text = fs::read_to_string(dir.join("redis.log")).unwrap_or_default();
    let stdio = fs::read_to_string(dir.join("stdio.log")).unwrap_or_default();
    if !stdio.trim().is_empty() {
        text.push_str("--- stdout/stderr ---\n");
        text.push_str(&stdio);
    }
    text
}

const LOG_FILES: [&str; 2] = ["redis.log", "stdio.log"];

fn log_sizes(dir: &Path) -> [u64; 2] {
    LOG_FILES.map(|name| fs::metadata(dir.join(name)).map(|m| m.len()).unwrap_or(0))
}

/// What the log files gained since `sizes` was taken.
fn logs_since(dir: &Path, sizes: [u64; 2]) -> String {
    let mut text = String::new();
    for (name, size) in LOG_FILES.iter().zip(sizes) {
        let bytes = fs::read(dir.join(name)).unwrap_or_default();
        let start = (size as usize).min(bytes.len());
        text.push_str(&String::from_utf8_lossy(&bytes[start..]));
    }
    text
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn wait_for_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
            _ => return None,
        }
    }
}

/// The state letter of /proc/<pid>/stat (`R`, `S`, `T` stopped, `Z`...).
fn process_state(pid: libc::pid_t) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

// Limits as CHECK names them, shared by the hardening and persistence tests.

pub fn is_bucket(algorithm: &str) -> bool {
    algorithm.ends_with("bucket")
}

/// One limit as CHECK names it.
#[derive(Clone, Debug)]
pub struct Limit {
    pub algorithm: &'static str,
    pub limit: u64,
    pub period: String,
    pub burst: Option<u64>,
}

impl Limit {
    pub fn new(algorithm: &'static str, limit: u64, period: &str, burst: Option<u64>) -> Limit {
        Limit {
            algorithm,
            limit,
            period: period.to_string(),
            burst: burst.filter(|_| is_bucket(algorithm)),
        }
    }

    /// The most that can be admitted at one instant: the capacity of a bucket, else the limit.
    pub fn capacity(&self) -> u64 {
        self.burst.unwrap_or(self.limit)
    }

    pub fn command(&self, name: &str, key: &str, cost: u64, at_ms: Option<u64>) -> Cmd {
        let mut cmd = redis::cmd(name);
        cmd.arg(key)
            .arg(self.algorithm)
            .arg(self.limit)
            .arg(&self.period);
        if let Some(burst) = self.burst {
            cmd.arg("BURST").arg(burst);
        }
        cmd.arg("COST").arg(cost);
        if let Some(at) = at_ms {
            cmd.arg("AT").arg(at);
        }
        cmd
    }

    pub fn check(&self, key: &str, cost: u64, at_ms: Option<u64>) -> Cmd {
        self.command("RATELIMIT.CHECK", key, cost, at_ms)
    }

    pub fn peek(&self, key: &str, cost: u64, at_ms: Option<u64>) -> Cmd {
        self.command("RATELIMIT.PEEK", key, cost, at_ms)
    }
}

/// Sends `cmds` in one pipeline and returns every reply, error replies included (as
/// `Value::ServerError`), in order.
pub fn send(con: &mut Connection, cmds: &[Cmd]) -> Vec<Value> {
    let mut packed = Vec::new();
    for cmd in cmds {
        cmd.write_packed_command(&mut packed);
    }
    con.req_packed_commands(&packed, 0, cmds.len())
        .expect("the connection works")
}

/// A CHECK/PEEK reply (RESP2) as its six integers; panics on anything else.
pub fn reply6(value: &Value) -> [i64; 6] {
    let Value::Array(items) = value else {
        panic!("not a six-integer reply: {value:?}");
    };
    let ints: Vec<i64> = items
        .iter()
        .map(|item| match item {
            Value::Int(n) => *n,
            other => panic!("not an integer in a CHECK reply: {other:?} in {value:?}"),
        })
        .collect();
    ints.try_into()
        .unwrap_or_else(|_| panic!("not six fields: {value:?}"))
}
