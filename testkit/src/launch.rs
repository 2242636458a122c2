//! Starting a redis-server child process: its command line, a free port, a temporary directory,
//! its logs, and waiting for it to answer or to exit. [`super::server`] builds on this.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::parse_info;
use super::server::{ready_timeout, scaled, server_wrapper};

/// A server's command line, without `--port` (chosen per launch).
#[derive(Clone, Debug)]
pub(crate) struct ServerArgs {
    /// A configuration file, given first (redis-server reads it before the directives).
    pub config_file: Option<PathBuf>,
    /// `--name value...` directives.
    pub directives: Vec<OsString>,
}

pub(crate) enum LaunchError {
    /// The port was taken before the server could bind it: try another.
    PortClash,
    /// The process exited before it answered PING: its status and what it logged meanwhile.
    Exited { status: ExitStatus, log: String },
    /// Anything else, with a message that includes the log.
    Failed(String),
}

impl LaunchError {
    /// The message `start` panics with.
    pub fn message(self, port: u16) -> String {
        match self {
            LaunchError::PortClash => {
                format!("redis-server: every port tried was already in use (the last {port})")
            }
            LaunchError::Exited { status, log } => format!(
                "redis-server on port {port} exited at start-up ({status})\n{}",
                tail(&log, 30)
            ),
            LaunchError::Failed(message) => message,
        }
    }
}

/// The server binary: `$RATELIMIT_SERVER` (e.g. `valkey-server`, or a path), else the older name
/// `$REDIS_SERVER`, else `redis-server` from PATH.
pub fn server_binary() -> OsString {
    std::env::var_os("RATELIMIT_SERVER")
        .or_else(|| std::env::var_os("REDIS_SERVER"))
        .unwrap_or_else(|| "redis-server".into())
}

/// Spawn redis-server on `port` and wait until it answers PING.
pub(crate) fn launch(args: &ServerArgs, port: u16, dir: &Path) -> Result<Child, LaunchError> {
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
        .args(&args.config_file)
        .arg("--port")
        .arg(port.to_string())
        .args(&args.directives)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(stdio)
        .stderr(stdio_err);
    let mut child = spawn_child(command).map_err(|e| {
        LaunchError::Failed(format!(
            "cannot run {:?} {:?}: {e} (install it with `make deps`, or set RATELIMIT_SERVER)",
            wrapper,
            server_binary()
        ))
    })?;
    let pid = child.id();
    let timeout = ready_timeout();
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let log = logs_since(dir, sizes_before);
            if log.contains("Address already in use") {
                return Err(LaunchError::PortClash);
            }
            return Err(LaunchError::Exited { status, log });
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
/// spawning from the test's own thread would kill servers shared between tests.) The example
/// tests start their apps through it too.
pub fn spawn_child(mut command: Command) -> io::Result<Child> {
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
pub fn free_port() -> u16 {
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

pub fn make_temp_dir() -> PathBuf {
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

pub fn remove_dir(dir: &Path) {
    let _ = fs::remove_dir_all(dir);
}

/// redis.log followed by whatever the process wrote to stdout/stderr (config errors, crashes
/// before the log file is open).
pub(crate) fn read_logs(dir: &Path) -> String {
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

pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

pub(crate) fn wait_for_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
            _ => return None,
        }
    }
}

/// The state letter of `/proc/<pid>/stat` (`R`, `S`, `T` stopped, `Z`...).
pub(crate) fn process_state(pid: libc::pid_t) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}
