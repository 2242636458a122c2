//! [`Server`]: a `redis-server` child process with the module, on a free loopback port, in its own
//! temporary directory; [`ServerBuilder`] sets its options. See the module docs of `common`.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use std::collections::HashMap;

use super::launch::{
    free_port, launch, make_temp_dir, process_state, read_logs, remove_dir, tail, wait_for_exit,
    LaunchError, ServerArgs,
};
use super::parse_info;

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
        .unwrap_or_else(|| super::repo_root().join("target"));
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

/// Options for a [`Server`]; start it with [`ServerBuilder::start`] (or, for a server that must
/// refuse to start, [`ServerBuilder::start_expecting_failure`]).
#[derive(Clone, Debug, Default)]
pub struct ServerBuilder {
    config: Vec<(String, String)>,
    module_args: Vec<String>,
    no_module: bool,
    config_file: Option<String>,
    rdb: Option<PathBuf>,
}

/// How a server that refused to start ended: see [`ServerBuilder::start_expecting_failure`].
#[derive(Debug)]
pub struct FailedStart {
    pub status: ExitStatus,
    /// What it logged (log file, stdout and stderr) before it exited.
    pub log: String,
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

    /// A configuration file with this text: written as `redis.conf` in the server's directory
    /// and given first on the command line, so the harness defaults and [`config`](Self::config)
    /// override it. It is the file `CONFIG REWRITE` rewrites and
    /// [`start_again`](Server::start_again) reads again.
    pub fn config_file(mut self, text: &str) -> Self {
        self.config_file = Some(text.to_string());
        self
    }

    /// An RDB file for the server to load at start-up: copied into its directory as `dump.rdb`
    /// (the default `dbfilename`) before it starts.
    pub fn rdb(mut self, path: &Path) -> Self {
        self.rdb = Some(path.to_path_buf());
        self
    }

    /// Start the server and wait until it answers PING.
    pub fn start(self) -> Server {
        let dir = make_temp_dir();
        let args = self.server_args(&dir);
        match launch_on_a_free_port(&args, &dir) {
            Ok((child, port)) => Server {
                child: Some(child),
                port,
                dir,
                args,
                paused: AtomicBool::new(false),
            },
            Err((error, port)) => {
                remove_dir(&dir);
                panic!("{}", error.message(port));
            }
        }
    }

    /// Start a server that must refuse to start (a bad load argument or config): waits until it
    /// exits, and answers its exit status and log. Panics if it answers PING instead, or neither
    /// exits nor answers within the start-up timeout.
    pub fn start_expecting_failure(self) -> FailedStart {
        let dir = make_temp_dir();
        let args = self.server_args(&dir);
        let mut outcome = launch_on_a_free_port(&args, &dir);
        if let Ok((child, _)) = &mut outcome {
            let _ = child.kill();
            let _ = child.wait();
        }
        let log_tail = tail(&read_logs(&dir), 30);
        remove_dir(&dir);
        match outcome {
            Err((LaunchError::Exited { status, log }, _)) => FailedStart { status, log },
            Err((error, port)) => panic!("{}", error.message(port)),
            Ok((_, port)) => {
                panic!("redis-server on port {port} started: it should refuse to\n{log_tail}")
            }
        }
    }

    /// The command line but `--port`: the configuration file, if any, then the harness defaults,
    /// the module and the caller's config. Copies the RDB file to load, if any, into `dir`.
    fn server_args(&self, dir: &Path) -> ServerArgs {
        if let Some(rdb) = &self.rdb {
            let to = dir.join("dump.rdb");
            fs::copy(rdb, &to)
                .unwrap_or_else(|e| panic!("copying {} to {}: {e}", rdb.display(), to.display()));
        }
        let config_file = self.config_file.as_ref().map(|text| {
            let path = dir.join("redis.conf");
            fs::write(&path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
            path
        });
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
        ServerArgs {
            config_file,
            directives: args,
        }
    }
}

/// [`launch`] on free ports until one is not taken by someone else meanwhile (20 tries).
fn launch_on_a_free_port(
    args: &ServerArgs,
    dir: &Path,
) -> Result<(Child, u16), (LaunchError, u16)> {
    let mut port = 0;
    for _ in 0..20 {
        port = free_port();
        match launch(args, port, dir) {
            Ok(child) => return Ok((child, port)),
            Err(LaunchError::PortClash) => continue,
            Err(error) => return Err((error, port)),
        }
    }
    Err((LaunchError::PortClash, port))
}

/// A running `redis-server` child process on 127.0.0.1, with its own temporary directory.
pub struct Server {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    args: ServerArgs,
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
                Err(error) => panic!("{}", error.message(self.port)),
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
        // SAFETY: kill(2) takes plain integers and touches no memory of ours; pid is our own
        // child, not yet reaped (`self.child` holds it), so it names no other process.
        let status = unsafe { libc::kill(pid, libc::SIGSTOP) };
        assert_eq!(status, 0, "SIGSTOP {pid}");
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
                // SAFETY: as in pause: our own child, not yet reaped.
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

    /// Wait until every one of `fields` of `INFO persistence` is `0`, e.g.
    /// `["aof_rewrite_in_progress", "aof_rewrite_scheduled"]` (a rewrite or save finished).
    /// Panics after 20 s ([`scaled`]).
    pub fn wait_persistence_idle(&self, fields: &[&str]) {
        let deadline = Instant::now() + scaled(Duration::from_secs(20));
        loop {
            let info = self.info("persistence");
            if fields
                .iter()
                .all(|f| info.get(*f).map(String::as_str) == Some("0"))
            {
                return;
            }
            assert!(Instant::now() < deadline, "still busy: {info:?}");
            thread::sleep(Duration::from_millis(20));
        }
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

/// A server with the module and a replica of it, in sync.
pub fn master_and_replica() -> (Server, Server) {
    let master = Server::start();
    let replica = Server::start();
    replica.replica_of(&master);
    (master, replica)
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
