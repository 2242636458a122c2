//! The gateways' Lua modules (gateways/nginx, gateways/haproxy) in the real proxies from Debian,
//! installed here where missing (as `make deps` installs redis-server; skipped with the reason
//! when apt-get cannot), each started on free loopback ports as a foreground process group that
//! Drop kills, and a watchdog kills when the test process dies without a Drop (SIGKILL), in front
//! of a stand-in application, against a server the test starts. Every
//! proxy runs the configuration its README shows (gateways/*/nginx.conf, haproxy.cfg, rules.lua,
//! which the README includes word for word), with only its addresses and paths replaced.
//!
//! The scenarios are the same for both proxies (this file); nginx.rs and haproxy.rs say how each
//! starts.

mod coalescing;
mod haproxy;
mod nginx;

use crate::common;

use common::Server;
use std::fs;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

/// The configuration's `timeout_ms`.
const TIMEOUT_MS: u64 = 50;
/// The edit of the tests that are not about timeouts: 50 ms can pass on a loaded machine, and a
/// request would then be failed open instead of decided.
const CALM: (&str, &str) = ("timeout_ms = 50", "timeout_ms = 2000");
/// What a request may take beyond `timeout_ms` on a loaded machine: generous, since it only has
/// to tell a bounded request from one waiting for a stalled Redis (60 s without the bound).
const SLACK: Duration = Duration::from_secs(2);

/// The repository's file `path`.
fn repo_file(path: &str) -> PathBuf {
    common::repo_root().join(path)
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// `text` with each `(from, to)` replaced; panics if `from` is missing (the README's file
/// changed under the test).
fn replace_all(mut text: String, pairs: &[(&str, String)], file: &str) -> String {
    for (from, to) in pairs {
        assert!(text.contains(from), "{file} no longer contains {from:?}");
        text = text.replace(from, to);
    }
    text
}

/// The docs' page of the gateways, which shows the same configurations as the READMEs.
const GATEWAYS_PAGE: &str = "docs/gateways.md";

/// The README shows `file` (a path in the repository) word for word in a code block.
fn assert_readme_shows(readme: &str, file: &str) {
    let text = read(&repo_file(file));
    let page = read(&repo_file(readme));
    assert!(
        page.contains(text.trim_end()),
        "{readme} must show {file} as it is (the tests run that file)"
    );
}

/// Whether the shell test `present` (e.g. `command -v nginx`) passes; if not, installs
/// `packages` with apt-get (as root), else records the skip and answers false.
fn installed(present: &str, packages: &[&str]) -> bool {
    static APT: Mutex<()> = Mutex::new(());
    let _one_at_a_time = APT.lock().unwrap_or_else(|e| e.into_inner());
    let on_path = |test: &str| {
        Command::new("sh")
            .args(["-c", &format!("{{ {test}; }} >/dev/null 2>&1")])
            .status()
            .is_ok_and(|s| s.success())
    };
    if on_path(present) {
        return true;
    }
    // SAFETY: getuid(2) takes no arguments and cannot fail.
    if unsafe { libc::getuid() } != 0 {
        common::skip(&format!(
            "`{present}` fails and apt-get needs root: apt-get install {}",
            packages.join(" ")
        ));
        return false;
    }
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let mut install = vec!["install", "-y", "-q"];
    install.extend_from_slice(packages);
    if !(apt(&install) || apt(&["update", "-q"]) && apt(&install)) || !on_path(present) {
        common::skip(&format!(
            "`{present}` fails, and apt-get install {} failed",
            packages.join(" ")
        ));
        return false;
    }
    true
}

/// A directory laid out as the README's install step lays out /etc/<proxy>/redis-ratelimit/:
/// the core, the proxy's module and the Functions library as functions.lua.
fn install_dir(proxy: &str) -> PathBuf {
    let dir = common::make_temp_dir();
    let copy = |from: &str, to: &str| {
        fs::copy(repo_file(from), dir.join(to)).unwrap_or_else(|e| panic!("copying {from}: {e}"));
    };
    copy("gateways/lua/ratelimit_core.lua", "ratelimit_core.lua");
    copy(&format!("gateways/{proxy}/ratelimit.lua"), "ratelimit.lua");
    copy("lua-reference/functions/ratelimit.lua", "functions.lua");
    dir
}

/// What the watchdog runs: the first line it reads names the process group to watch; at the end
/// of its input it kills that group. It ignores the terminal's signals (^C reaches the test's
/// process group, not the proxy's).
const WATCHDOG: &str = "trap '' INT TERM HUP QUIT; read -r group || exit 0; read -r _; \
                        kill -s KILL -- \"-$group\"";

/// A proxy's watchdog: `sh` reading a pipe whose one writer is this test process. The kernel
/// closes that end when this process dies, however it dies (SIGKILL runs no Drop), and the
/// watchdog then kills the proxy's process group. The proxy's own process has
/// `PR_SET_PDEATHSIG` (common::spawn_child), but nginx's workers do not: without the watchdog
/// they outlive their killed master, still serving.
struct Watchdog {
    child: Child,
    pipe: fs::File,
}

impl Watchdog {
    fn start() -> Watchdog {
        let mut fds = [0; 2];
        // SAFETY: pipe2(2) writes two descriptors into the array of two it is given.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
        assert_eq!(rc, 0, "pipe2: {}", io::Error::last_os_error());
        // SAFETY: two descriptors pipe2 has just opened, owned by nothing else (close-on-exec: no
        // other child of this process keeps the write end past its exec).
        let (read_end, write_end) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let child = Command::new("sh")
            .args(["-c", WATCHDOG, "watchdog"])
            .stdin(Stdio::from(read_end))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("starting a proxy's watchdog (sh)");
        Watchdog {
            child,
            pipe: fs::File::from(write_end),
        }
    }

    /// From now on the group `group` dies with this process.
    fn watch(&mut self, group: u32) {
        writeln!(self.pipe, "{group}").expect("writing to the watchdog");
    }
}

impl Drop for Watchdog {
    /// The watchdog stopped before its proxy: it never kills a group after Drop has reaped it.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A proxy: a foreground process leading its own process group (nginx's master and workers),
/// killed with its group on Drop, or by its watchdog when the test process dies without a Drop.
pub struct Proxy {
    child: Option<Child>,
    watchdog: Option<Watchdog>,
    /// The port of the limited frontend (the README's 8080).
    pub port: u16,
    dir: PathBuf,
    log: PathBuf,
    name: &'static str,
}

impl Proxy {
    /// Spawns `command` (in `dir`, output into `log` too) and waits until `port` accepts.
    fn spawn(
        name: &'static str,
        mut command: Command,
        dir: PathBuf,
        log: PathBuf,
        port: u16,
    ) -> Proxy {
        let out = fs::File::create(dir.join("stdio.log")).expect("stdio.log");
        command
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("stdio.log"))
            .stderr(out)
            .process_group(0);
        let mut watchdog = Watchdog::start();
        let child = common::spawn_child(command).unwrap_or_else(|e| panic!("starting {name}: {e}"));
        watchdog.watch(child.id());
        let mut proxy = Proxy {
            child: Some(child),
            watchdog: Some(watchdog),
            port,
            dir,
            log,
            name,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return proxy;
            }
            if let Some(status) = proxy
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                proxy.child = None;
                panic!(
                    "{name} exited ({status}) before listening:\n{}",
                    proxy.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{name} does not listen on {port}:\n{}",
                proxy.log()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its log and whatever it printed.
    pub fn log(&self) -> String {
        let mut text = fs::read_to_string(&self.log).unwrap_or_default();
        let stdio = fs::read_to_string(self.dir.join("stdio.log")).unwrap_or_default();
        if self.log != self.dir.join("stdio.log") && !stdio.is_empty() {
            text.push_str("--- stdout/stderr ---\n");
            text.push_str(&stdio);
        }
        text
    }

    /// GET `path` with `headers`.
    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        get(self.port, path, headers)
    }

    /// The processes of its group (nginx's master and workers), each as (pid, start time).
    pub fn processes(&self) -> Vec<(i32, u64)> {
        let group = self.child.as_ref().expect("a running proxy").id() as i32;
        let mut found = Vec::new();
        for entry in fs::read_dir("/proc").expect("/proc") {
            let Some(pid) = entry
                .ok()
                .and_then(|e| e.file_name().to_str()?.parse::<i32>().ok())
            else {
                continue;
            };
            if let Some((_, pgrp, started)) = stat(pid) {
                if pgrp == group {
                    found.push((pid, started));
                }
            }
        }
        found
    }
}

/// /proc/`pid`/stat's state, process group and start time (in clock ticks since boot), if the
/// process exists.
fn stat(pid: i32) -> Option<(char, i32, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's name, in parentheses (which may hold spaces): fields 3, 4, 5, ...
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let pgrp = fields.get(2)?.parse().ok()?;
    let started = fields.get(19)?.parse().ok()?;
    Some((state, pgrp, started))
}

/// Whether the process `pid` that started at `started` is gone: no such pid, another process of
/// that pid, or a zombie (whoever inherited it may never reap it: this machine's init does not).
fn gone((pid, started): (i32, u64)) -> bool {
    match stat(pid) {
        None => true,
        Some((state, _, since)) => state == 'Z' || since != started,
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        drop(self.watchdog.take());
        if let Some(mut child) = self.child.take() {
            let group = child.id() as libc::pid_t;
            // SAFETY: kill(2) with plain integers; the group is the one our child leads (it is not
            // reaped yet, so its id names no other group).
            unsafe { libc::kill(-group, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(10));
            }
            // Whatever is left of the group (workers of a master that did not wait for them).
            // SAFETY: as above.
            unsafe { libc::kill(-group, libc::SIGKILL) };
            let _ = child.kill();
            let _ = child.wait();
        }
        if thread::panicking() {
            eprintln!(
                "--- {} log ({}) ---\n{}",
                self.name,
                self.dir.display(),
                self.log()
            );
        }
        if std::env::var_os("RATELIMIT_KEEP_TEST_DIRS").is_none() {
            common::remove_dir(&self.dir);
        }
    }
}

/// An HTTP response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub elapsed: Duration,
}

impl Response {
    /// The header `name` (case-insensitive), if present once; panics if it is there twice.
    pub fn header(&self, name: &str) -> Option<&str> {
        let mut found = self
            .headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name));
        let first = found.next().map(|(_, v)| v.as_str());
        assert!(found.next().is_none(), "{name} twice in {self:?}");
        first
    }
}

/// GET `path` on 127.0.0.1:`port` (HTTP/1.1, Connection: close), with a 30 s bound.
pub fn get(port: u16, path: &str, headers: &[(&str, &str)]) -> Response {
    let started = Instant::now();
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("connecting to 127.0.0.1:{port}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream
        .write_all(request.as_bytes())
        .expect("sending the request");
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .unwrap_or_else(|e| panic!("reading the response to {path}: {e}"));
    let elapsed = started.elapsed();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP response to {path}: {text:?}"));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect::<Vec<_>>();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        unchunk(body)
    } else {
        body.to_string()
    };
    Response {
        status,
        headers,
        body,
        elapsed,
    }
}

fn unchunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// How a scenario starts a proxy of one kind.
pub trait Gateway {
    /// Starts one in front of the Redis on `redis_port`, on free ports, with its README's
    /// configuration after `edit` (an extra replacement a test makes, e.g. a bad option).
    fn start(redis_port: u16, edit: &[(&str, &str)]) -> Proxy;
    /// Checks a configuration with the proxy's own check (`nginx -t`, `haproxy -c`) after
    /// `edit`: its success and output.
    fn check(redis_port: u16, edit: &[(&str, &str)]) -> (bool, String);
    /// Whether the proxy is installed (or could be).
    fn available() -> bool;
    /// Whether a bad limit stops the proxy at start (else it is found at first use).
    const LIMITS_AT_START: bool;
}

// ---- the scenarios -------------------------------------------------------------------------

fn t_of(field: &str) -> u64 {
    field
        .rsplit(";t=")
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no t= in {field:?}"))
}

/// 200s with the fields, then 429s with Retry-After, for one key, a CHECKALL and a policy; no
/// limit without a key.
pub fn answers_200s_then_429s<G: Gateway>() {
    if !G::available() {
        return;
    }
    let server = Server::start();
    let proxy = G::start(server.port(), &[CALM]);

    // No key: not limited, not counted, no fields.
    let free = proxy.get("/api/x", &[]);
    assert_eq!(free.status, 200, "{free:?}");
    assert_eq!(free.body, "hello from the app\n");
    assert_eq!(free.header("RateLimit-Policy"), None, "{free:?}");

    for n in 1..=100u64 {
        let r = proxy.get("/api/x", &[("X-API-Key", "alice")]);
        assert_eq!(r.status, 200, "request {n}: {r:?}");
        assert_eq!(r.body, "hello from the app\n");
        assert_eq!(r.header("RateLimit-Policy"), Some("\"default\";q=100;w=60"));
        let field = r.header("RateLimit").expect("RateLimit");
        assert!(
            field.starts_with(&format!("\"default\";r={};t=", 100 - n)),
            "request {n}: {field}"
        );
        assert!((1..=120).contains(&t_of(field)), "{field}");
        assert_eq!(r.header("Retry-After"), None);
    }
    let refused = proxy.get("/api/x", &[("X-API-Key", "alice")]);
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(
        refused.header("RateLimit-Policy"),
        Some("\"default\";q=100;w=60")
    );
    let field = refused.header("RateLimit").expect("RateLimit");
    assert!(field.starts_with("\"default\";r=0;t="), "{field}");
    let retry: u64 = refused
        .header("Retry-After")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=120).contains(&retry), "{refused:?}");
    assert_eq!(t_of(field), retry);
    assert_eq!(refused.header("Content-Type"), Some("application/json"));
    let body: serde_json::Value = serde_json::from_str(&refused.body).expect("a JSON body");
    assert_eq!(body["error"], "rate limited");
    assert_eq!(body["policy"], "default");
    let retry_ms = body["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert_eq!(retry_ms.div_ceil(1000), retry, "{body}");
    // Another key is counted apart; the key the README composes is in Redis.
    assert_eq!(proxy.get("/api/x", &[("X-API-Key", "bob")]).status, 200);
    let exists: i64 = redis::cmd("EXISTS")
        .arg("api:alice")
        .query(&mut server.client())
        .unwrap();
    assert_eq!(exists, 1);

    // Two limits in one CHECKALL: the per-second one refuses (by the sixth request, unless this
    // machine is so slow that a token comes back between two: then a few later).
    let first = proxy.get("/search", &[]);
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(
        first.header("RateLimit-Policy"),
        Some("\"sec\";q=5;w=1, \"hour\";q=1000;w=3600")
    );
    let field = first.header("RateLimit").unwrap();
    assert!(
        field.starts_with("\"sec\";r=4;t=1, \"hour\";r=999;t="),
        "{field}"
    );
    let refused = (0..50)
        .map(|_| proxy.get("/search", &[]))
        .find(|r| r.status != 200)
        .expect("the per-second limit refuses");
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.header("Retry-After"), Some("1"));
    let field = refused.header("RateLimit").unwrap();
    assert!(field.starts_with("\"sec\";r=0;t=1, \"hour\";r="), "{field}");
    let body: serde_json::Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(body["policy"], "sec", "the limit that refused");

    // A policy the server defines: its parameters in the fields.
    let _: () = redis::cmd("RATELIMIT.POLICY")
        .arg(&["SET", "upload", "token-bucket", "3", "1m"])
        .query(&mut server.client())
        .unwrap();
    for n in 1..=3u64 {
        let r = proxy.get("/upload", &[("X-Tenant", "acme")]);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("RateLimit-Policy"), Some("\"upload\";q=3;w=60"));
        assert!(r
            .header("RateLimit")
            .unwrap()
            .starts_with(&format!("\"upload\";r={};", 3 - n)));
    }
    let refused = proxy.get("/upload", &[("X-Tenant", "acme")]);
    assert_eq!(refused.status, 429, "{refused:?}");
    let retry: u64 = refused.header("Retry-After").unwrap().parse().unwrap();
    assert!((1..=20).contains(&retry), "a token every 20 s: {refused:?}");
}

/// Two proxy processes against one Redis admit exactly the limit between them.
pub fn two_processes_share_the_limit<G: Gateway>() {
    if !G::available() {
        return;
    }
    let server = Server::start();
    // 100 an hour: a token comes back every 36 s, far beyond this test's length.
    let _: () = redis::cmd("RATELIMIT.POLICY")
        .arg(&["SET", "upload", "token-bucket", "100", "1h"])
        .query(&mut server.client())
        .unwrap();
    let proxies = [
        G::start(server.port(), &[CALM]),
        G::start(server.port(), &[CALM]),
    ];
    let mut admitted = [0u32; 2];
    let mut refused = [0u32; 2];
    for n in 0..160 {
        let which = n % 2;
        let r = proxies[which].get("/upload", &[("X-Tenant", "shared")]);
        match r.status {
            200 => admitted[which] += 1,
            429 => refused[which] += 1,
            _ => panic!("{r:?}"),
        }
    }
    assert_eq!(admitted[0] + admitted[1], 100, "admitted {admitted:?}");
    assert_eq!(refused[0] + refused[1], 60, "refused {refused:?}");
    assert!(
        admitted[0] > 0 && admitted[1] > 0,
        "both admitted: {admitted:?}"
    );
}

/// While Redis is stopped (SIGSTOP) and after it is killed: each request within timeout_ms (and
/// slack), failing open on /api/ and closed on /login; the breaker keeps most requests from
/// waiting at all; the limits come back when Redis does.
pub fn stall_and_kill_of_redis<G: Gateway>() {
    if !G::available() {
        return;
    }
    let mut server = Server::start();
    // The README's timeout_ms (50): what is bounded here.
    let proxy = G::start(server.port(), &[]);
    let key = [("X-API-Key", "carol")];

    let recovered = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            // Each worker or thread finds out when its cool-down ends: both answer alike first.
            let r = proxy.get("/api/x", &key);
            let login = proxy.get("/login", &[]);
            if r.header("RateLimit").is_some() && login.status == 200 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: no decision 15 s on: {r:?}"
            );
            thread::sleep(Duration::from_millis(50));
        }
    };

    // Decided before (a 50 ms timeout can pass on a loaded machine: then asked again).
    recovered("at the start");

    let bound = Duration::from_millis(TIMEOUT_MS) + SLACK;
    let check_outage = |what: &str| {
        let mut waited = 0;
        let rounds = 20;
        for n in 0..rounds {
            let open = proxy.get("/api/x", &key);
            assert_eq!(open.status, 200, "{what} {n}: fails open: {open:?}");
            assert_eq!(open.body, "hello from the app\n");
            assert_eq!(
                open.header("RateLimit"),
                None,
                "{what}: nothing known: {open:?}"
            );
            let closed = proxy.get("/login", &[]);
            assert_eq!(closed.status, 503, "{what} {n}: fails closed: {closed:?}");
            let body: serde_json::Value = serde_json::from_str(&closed.body).unwrap();
            assert_eq!(body["error"], "rate limiter unavailable");
            for r in [&open, &closed] {
                assert!(r.elapsed < bound, "{what}: a request took {:?}", r.elapsed);
                if r.elapsed >= Duration::from_millis(TIMEOUT_MS) {
                    waited += 1;
                }
            }
        }
        // Without the breaker every request waits out the timeout (40 of them); with it, one per
        // cool-down (1 s) per worker or thread.
        assert!(
            waited <= rounds,
            "{what}: {waited} of {} requests waited",
            2 * rounds
        );
    };
    server.pause();
    check_outage("stalled");
    server.resume();
    recovered("after the stall");

    server.kill9();
    check_outage("killed");
    server.start_again();
    recovered("after the restart");
}

/// Redis restarted (killed, started again on its port) between two requests: the connections
/// the proxy kept turn out closed, and the next requests are decided at once, each on a new
/// connection (none fails open, nothing opens the breaker).
pub fn decides_at_once_after_a_restart_of_redis<G: Gateway>() {
    if !G::available() {
        return;
    }
    let mut server = Server::start();
    let proxy = G::start(server.port(), &[CALM]);
    let key = [("X-API-Key", "erin")];
    // Every worker or thread decides once, on the connection it keeps (more requests than
    // workers: any of them may take each).
    for n in 0..8 {
        let r = proxy.get("/api/x", &key);
        assert!(r.header("RateLimit").is_some(), "before {n}: {r:?}");
    }
    server.kill9();
    server.start_again();
    for n in 0..8 {
        let r = proxy.get("/api/x", &key);
        assert_eq!(r.status, 200, "after the restart {n}: {r:?}");
        assert!(
            r.header("RateLimit").is_some(),
            "after the restart {n}: not decided at once: {r:?}\n{}",
            proxy.log()
        );
    }
    assert!(
        !proxy.log().contains("unavailable"),
        "the breaker opened:\n{}",
        proxy.log()
    );
}

/// A server with a password: the limits configured with it are decided; a limit configured with
/// another never rides on a connection the first one authenticated (its requests are a logged
/// 500, however many calls with the right password came before, in any order).
pub fn connections_are_kept_apart_by_password<G: Gateway>() {
    if !G::available() {
        return;
    }
    let server = Server::start();
    let mut admin = server.client();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "s3cret"])
        .query(&mut admin)
        .unwrap();
    let proxy = G::start(
        server.port(),
        &[
            (
                "timeout_ms = 50",
                "timeout_ms = 2000, password = \"s3cret\"",
            ),
            (
                "on_error = \"closed\",",
                "on_error = \"closed\", password = \"wrong\",",
            ),
        ],
    );
    for round in 0..3u64 {
        for n in 1..=5u64 {
            let r = proxy.get("/api/x", &[("X-API-Key", "erin")]);
            assert_eq!(r.status, 200, "round {round}, request {n}: {r:?}");
            let field = r.header("RateLimit").expect("RateLimit");
            let left = 100 - (5 * round + n);
            assert!(
                field.starts_with(&format!("\"default\";r={left};")),
                "{field}"
            );
        }
        for n in 1..=3 {
            let r = proxy.get("/login", &[]);
            assert_eq!(r.status, 500, "round {round}, login {n}: {r:?}");
            assert_eq!(r.body, "{\"error\": \"rate limiter misconfigured\"}");
        }
    }
    let log = proxy.log();
    assert!(log.contains("WRONGPASS"), "{log}");
    // Nothing counted for /login: its calls never reached a command.
    let keys: Vec<String> = redis::cmd("KEYS").arg("login:*").query(&mut admin).unwrap();
    assert!(keys.is_empty(), "{keys:?}");
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", ""])
        .query(&mut admin)
        .unwrap();
}

/// On a server without the module the proxy loads the Functions library and answers the same.
pub fn library_engine_without_the_module<G: Gateway>() {
    if !G::available() {
        return;
    }
    let server = Server::start_without_module();
    let proxy = G::start(server.port(), &[CALM]);
    for n in 1..=100u64 {
        let r = proxy.get("/api/x", &[("X-API-Key", "dave")]);
        assert_eq!(r.status, 200, "request {n}: {r:?}");
        assert_eq!(r.header("RateLimit-Policy"), Some("\"default\";q=100;w=60"));
        assert!(r
            .header("RateLimit")
            .unwrap()
            .starts_with(&format!("\"default\";r={};", 100 - n)));
    }
    let refused = proxy.get("/api/x", &[("X-API-Key", "dave")]);
    assert_eq!(refused.status, 429, "{refused:?}");
    assert!(refused.header("Retry-After").is_some());
    // The library's keys, prefixed; the policy by its fallback (token-bucket 10 1m).
    let exists: i64 = redis::cmd("EXISTS")
        .arg("fn:api:dave")
        .query(&mut server.client())
        .unwrap();
    assert_eq!(exists, 1);
    let libraries: redis::Value = redis::cmd("FUNCTION")
        .arg(&["LIST", "LIBRARYNAME", "ratelimit"])
        .query(&mut server.client())
        .unwrap();
    assert!(
        format!("{libraries:?}").contains("ratelimit_checkall"),
        "{libraries:?}"
    );
    for _ in 0..10 {
        let r = proxy.get("/upload", &[("X-Tenant", "acme")]);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("RateLimit-Policy"), Some("\"upload\";q=10;w=60"));
    }
    assert_eq!(proxy.get("/upload", &[("X-Tenant", "acme")]).status, 429);
    // CHECKALL through ratelimit_checkall.
    for _ in 0..5 {
        assert_eq!(proxy.get("/search", &[]).status, 200);
    }
    assert_eq!(proxy.get("/search", &[]).status, 429);
    let log = proxy.log();
    assert!(log.contains("the Functions library 'ratelimit'"), "{log}");
    assert!(log.contains("loaded the Functions library"), "{log}");
}

/// A bad option of `configure` stops the proxy at start with a message naming it; a bad limit
/// too where the proxy reads its limits at start (HAProxy's rules), else (NGINX's limit{} in a
/// location) it is a 500 and a logged error at first use; so is a limit the server refuses.
pub fn configuration_errors_are_logged<G: Gateway>() {
    if !G::available() {
        return;
    }
    let server = Server::start();
    let (ok, output) = G::check(server.port(), &[("timeout_ms = 50", "timeout_ms = 0")]);
    assert!(!ok, "timeout_ms = 0 accepted:\n{output}");
    assert!(
        output.contains("timeout_ms must be a whole number of ms, at least 1, not 0"),
        "{output}"
    );
    let typo = [("\"fixed-window 5 15m\"", "\"fixed-windw 5 15m\"")];
    let said = "unknown algorithm 'fixed-windw'";
    if G::LIMITS_AT_START {
        let (ok, output) = G::check(server.port(), &typo);
        assert!(!ok, "a bad algorithm accepted:\n{output}");
        assert!(output.contains(said), "{output}");
        // A rule's name is only known when a request uses it.
        let unknown = [("lua.ratelimit login", "lua.ratelimit logn")];
        first_use_is_a_logged_500::<G>(&server, &unknown, "lua.ratelimit logn: no such rule");
    } else {
        first_use_is_a_logged_500::<G>(&server, &typo, said);
    }
    let refused = [("\"fixed-window 5 15m\"", "\"fixed-window 5 15m BURST 2\"")];
    let said = "ERR BURST applies only to token-bucket, leaky-bucket and gcra";
    first_use_is_a_logged_500::<G>(&server, &refused, said);
}

/// With `edit`, /login answers 500 and the log says `said`, once per worker or thread at most.
fn first_use_is_a_logged_500<G: Gateway>(server: &Server, edit: &[(&str, &str)], said: &str) {
    let mut edit = edit.to_vec();
    edit.push(CALM);
    let proxy = G::start(server.port(), &edit);
    let workers = thread::available_parallelism().map_or(1, |n| n.get());
    let requests = 3 * workers + 3;
    for _ in 0..requests {
        let r = proxy.get("/login", &[]);
        assert_eq!(r.status, 500, "{r:?}");
        assert_eq!(r.body, "{\"error\": \"rate limiter misconfigured\"}");
    }
    let log = proxy.log();
    let times = log.matches(said).count();
    assert!(times >= 1, "{said:?} not in the log:\n{log}");
    assert!(
        times <= workers,
        "logged {times} times for {requests} requests:\n{log}"
    );
}

/// Many requests at once (NGINX pipelines a worker's concurrent calls on one connection): each
/// gets its own decision. Eight clients, one API key each, 130 requests apiece: each key admits
/// exactly 100, whose `r=` are 99 down to 0, each once (a reply handed to the wrong request
/// would show as another key's count).
pub fn concurrent_requests_get_their_own_decisions<G: Gateway>() {
    if !G::available() {
        return;
    }
    let server = Server::start();
    let proxy = G::start(server.port(), &[CALM]);
    let port = proxy.port;
    let clients: Vec<_> = (0..8)
        .map(|client| {
            thread::spawn(move || {
                let key = format!("client-{client}");
                let mut remaining = Vec::new();
                let mut refused = 0;
                for _ in 0..130 {
                    let r = get(port, "/api/x", &[("X-API-Key", &key)]);
                    match r.status {
                        200 => {
                            let field = r.header("RateLimit").expect("RateLimit").to_string();
                            let r_value = field
                                .split(";r=")
                                .nth(1)
                                .and_then(|rest| rest.split(';').next())
                                .and_then(|n| n.parse::<u64>().ok())
                                .unwrap_or_else(|| panic!("{field}"));
                            remaining.push(r_value);
                        }
                        429 => refused += 1,
                        _ => panic!("{r:?}"),
                    }
                }
                (remaining, refused)
            })
        })
        .collect();
    for (client, handle) in clients.into_iter().enumerate() {
        let (mut remaining, refused) = handle.join().expect("a client thread");
        remaining.sort_unstable();
        assert_eq!(remaining, (0..100).collect::<Vec<u64>>(), "client {client}");
        assert_eq!(refused, 30, "client {client}");
    }
}

/// The variable that makes `holds_a_proxy_until_killed` hold one: the file to write its
/// processes into.
const HOLDER: &str = "RATELIMIT_TEST_PROXY_HOLDER";

/// Run by `dies_with_a_killed_test_process` in a test process of its own (with HOLDER set; at
/// once done without it): starts a proxy, writes its processes (pid and start time, a line
/// each) into HOLDER's file, and waits to be killed.
pub fn holds_a_proxy_until_killed<G: Gateway>() {
    let Some(path) = std::env::var_os(HOLDER) else {
        return;
    };
    let server = Server::start();
    let proxy = G::start(server.port(), &[]);
    // Served: nginx's workers are up (its master listens before it forks them).
    assert_eq!(proxy.get("/api/x", &[]).status, 200);
    let lines: String = proxy
        .processes()
        .iter()
        .map(|(pid, started)| format!("{pid} {started}\n"))
        .collect();
    let path = PathBuf::from(path);
    let part = path.with_extension("part");
    fs::write(&part, lines).expect("writing the processes");
    fs::rename(&part, &path).expect("renaming the processes' file");
    loop {
        thread::sleep(Duration::from_secs(1));
    }
}

/// A test process SIGKILLed (no Drop runs: `cargo test` killed, a CI timeout) takes its proxy's
/// every process with it within a few seconds: `holder` (the name of the test that calls
/// holds_a_proxy_until_killed for this proxy, e.g. "gateways::nginx::nginx_holds_...") runs in
/// a child test process that is then killed.
pub fn dies_with_a_killed_test_process<G: Gateway>(holder: &str) {
    if !G::available() {
        return;
    }
    let dir = common::make_temp_dir();
    let file = dir.join("processes");
    let out = fs::File::create(dir.join("holder.log")).expect("holder.log");
    let mut command = Command::new(std::env::current_exe().expect("the test binary"));
    command
        .args(["--exact", holder, "--nocapture", "--test-threads=1"])
        .env(HOLDER, &file)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("holder.log"))
        .stderr(out);
    let mut child = common::spawn_child(command).expect("starting the holder");
    let deadline = Instant::now() + Duration::from_secs(60);
    let processes: Vec<(i32, u64)> = loop {
        if let Ok(text) = fs::read_to_string(&file) {
            break text
                .lines()
                .map(|l| {
                    let (pid, started) = l.split_once(' ').expect("pid start");
                    (pid.parse().unwrap(), started.parse().unwrap())
                })
                .collect();
        }
        if let Some(status) = child.try_wait().expect("the holder") {
            panic!(
                "the holder exited ({status}):\n{}",
                fs::read_to_string(dir.join("holder.log")).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "the holder wrote no processes");
        thread::sleep(Duration::from_millis(20));
    };
    // nginx: a master and its workers; HAProxy: one process.
    assert!(!processes.is_empty(), "no processes of the proxy");
    assert!(processes.iter().all(|&p| !gone(p)), "{processes:?}");
    child.kill().expect("SIGKILL to the holder");
    child.wait().expect("reaping the holder");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes.iter().all(|&p| gone(p)) {
        assert!(
            Instant::now() < deadline,
            "10 s after the test process was killed, its proxy lives on: {:?}",
            processes.iter().filter(|&&p| !gone(p)).collect::<Vec<_>>()
        );
        thread::sleep(Duration::from_millis(20));
    }
    common::remove_dir(&dir);
}

/// The core's own tests (gateways/lua/test_core.lua: the reader, the fields, the options'
/// errors, engine detection, the library's loading, policies, CHECKALL, the breaker) under Lua
/// 5.1, the language of NGINX's LuaJIT, and Lua 5.3, HAProxy's.
#[test]
fn the_lua_core_passes_its_tests_in_lua_5_1_and_5_3() {
    for lua in ["lua5.1", "lua5.3"] {
        if !installed(&format!("command -v {lua}"), &[lua]) {
            continue;
        }
        let output = Command::new(lua)
            .arg("gateways/lua/test_core.lua")
            .current_dir(common::repo_root())
            .output()
            .unwrap_or_else(|e| panic!("running {lua}: {e}"));
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.starts_with("ok "),
            "{lua} gateways/lua/test_core.lua:\n{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// The arity `COMMAND INFO RATELIMIT.CHECK` gives (-3: the module takes a spec as one argument,
/// -4: an older one).
fn check_arity(client: &mut redis::Connection) -> i64 {
    let info: redis::Value = redis::cmd("COMMAND")
        .arg(&["INFO", "RATELIMIT.CHECK"])
        .query(client)
        .unwrap();
    match info {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::Array(command)) => match command.get(1) {
                Some(redis::Value::Int(n)) => *n,
                other => panic!("COMMAND INFO: arity {other:?}"),
            },
            other => panic!("COMMAND INFO: {other:?}"),
        },
        other => panic!("COMMAND INFO: {other:?}"),
    }
}

/// The arguments of the RATELIMIT.CHECK and CHECKALL calls the slow log holds (everything,
/// with slowlog-log-slower-than 0), oldest first.
fn decisions_sent(client: &mut redis::Connection) -> Vec<Vec<String>> {
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg(&["GET", "-1"])
        .query(client)
        .unwrap();
    let mut calls = Vec::new();
    for entry in entries.iter().rev() {
        let redis::Value::Array(fields) = entry else {
            panic!("SLOWLOG entry {entry:?}")
        };
        let args: Vec<String> = redis::from_redis_value(&fields[3]).unwrap();
        if args[0].starts_with("RATELIMIT.CHECK") {
            calls.push(args);
        }
    }
    calls
}

/// With the module, each spec goes as one argument where the server takes it (its arity -3),
/// else as words (an older module, -4; a user that may not run COMMAND): the same answers either
/// way (every status, field and body of the README's limits, `t` and Retry-After aside), and the
/// form sent as the slow log records it.
pub fn spec_form_follows_the_arity<G: Gateway>() {
    if !G::available() {
        return;
    }
    let mut runs = Vec::new();
    for may_ask in [true, false] {
        let server = Server::start();
        let mut client = server.client();
        let one = may_ask && check_arity(&mut client) == -3;
        for (name, value) in [
            ("slowlog-log-slower-than", "0"),
            ("slowlog-max-len", "10000"),
        ] {
            common::config_set(&mut client, name, value).unwrap();
        }
        if !may_ask {
            let _: () = redis::cmd("ACL")
                .arg(&["SETUSER", "default", "-command"])
                .query(&mut client)
                .unwrap();
        }
        let _: () = redis::cmd("RATELIMIT.POLICY")
            .arg(&["SET", "upload", "token-bucket", "3", "1m"])
            .query(&mut client)
            .unwrap();
        let proxy = G::start(server.port(), &[CALM]);
        let mut answers = Vec::new();
        let requests = [
            ("/api/x", ("X-API-Key", "alice"), 102),
            // One: its remaining a token per 200 ms can change between two.
            ("/search", ("X-Other", "x"), 1),
            ("/upload", ("X-Tenant", "acme"), 4),
        ];
        for (path, header, times) in requests {
            for n in 0..times {
                let r = proxy.get(path, &[header]);
                let without_t = |field: Option<&str>| {
                    field.map(|f| {
                        f.split(", ")
                            .map(|item| item.split(";t=").next().unwrap().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    })
                };
                let body: Option<serde_json::Value> = serde_json::from_str(&r.body).ok();
                answers.push(format!(
                    "{path} {n}: {} {:?} {:?} {} {:?}",
                    r.status,
                    r.header("RateLimit-Policy"),
                    without_t(r.header("RateLimit")),
                    r.header("Retry-After").is_some(),
                    body.map(|b| b["policy"].clone())
                ));
            }
        }
        let calls = decisions_sent(&mut client);
        assert_eq!(calls.len(), 102 + 1 + 4, "{calls:?}\n{}", proxy.log());
        // Each worker's (or thread's) first call goes as words: it asks the arity meanwhile.
        let workers = thread::available_parallelism().map_or(1, |n| n.get());
        let mut as_words = 0;
        for args in &calls {
            let spaced = args.iter().filter(|a| a.contains(' ')).count();
            let specs = if args[0] == "RATELIMIT.CHECKALL" {
                2
            } else {
                1
            };
            if spaced == 0 {
                as_words += 1;
            } else {
                assert_eq!(spaced, specs, "{args:?}");
            }
        }
        let first_calls = if one {
            workers.min(calls.len())
        } else {
            calls.len()
        };
        assert!(
            as_words <= first_calls && (one || as_words == calls.len()),
            "one argument {one}: {as_words} of {} calls as words: {calls:?}",
            calls.len()
        );
        let want = if one {
            [
                "RATELIMIT.CHECK|api:alice|sliding-window 100 1m|COST|1",
                "|token-bucket 5 1s|token-bucket 1000 1h|COST|1",
                "RATELIMIT.CHECK|upload:acme|POLICY upload|COST|1",
            ]
        } else {
            [
                "RATELIMIT.CHECK|api:alice|sliding-window|100|1m|COST|1",
                "|token-bucket|5|1s|token-bucket|1000|1h|COST|1",
                "RATELIMIT.CHECK|upload:acme|POLICY|upload|COST|1",
            ]
        };
        for ((path, _, _), sent) in requests.iter().zip(want) {
            let name = if *path == "/search" {
                "RATELIMIT.CHECKALL"
            } else {
                "RATELIMIT.CHECK"
            };
            let key = sent.split('|').nth(1).unwrap();
            let last = calls
                .iter()
                .rev()
                .find(|a| a[0] == name && (name == "RATELIMIT.CHECKALL" || a[1] == key))
                .unwrap_or_else(|| panic!("no call of {path} in {calls:?}"))
                .join("|");
            assert!(last.ends_with(sent), "{path}: {last} is not …{sent}");
        }
        runs.push(answers);
    }
    assert_eq!(runs[0], runs[1], "one argument or words: the same answers");
}
