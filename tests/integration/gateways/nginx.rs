//! gateways/nginx in Debian's nginx with libnginx-mod-http-lua: gateways/nginx/nginx.conf (the
//! one its README shows), master and workers in the foreground (`daemon off`).

use super::{
    assert_readme_shows, get, gone, install_dir, installed, read, replace_all, repo_file, Gateway,
    Proxy, SLACK,
};
use crate::common;
use common::Server;
use std::fs;
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

pub struct Nginx;

const README: &str = "gateways/nginx/README.md";
const CONF: &str = "gateways/nginx/nginx.conf";

/// The README's nginx.conf for a server on `redis_port`, with `edit`, in a fresh directory:
/// (directory, its nginx.conf, the frontend's port).
fn prepare(
    redis_port: u16,
    edit: &[(&str, &str)],
) -> (std::path::PathBuf, std::path::PathBuf, u16) {
    assert_readme_shows(README, CONF);
    assert_readme_shows(super::GATEWAYS_PAGE, CONF);
    let dir = install_dir("nginx");
    let port = common::free_port();
    let app = common::free_port();
    let mut pairs = vec![
        ("/etc/nginx/redis-ratelimit/", format!("{}/", dir.display())),
        ("127.0.0.1:6379", format!("127.0.0.1:{redis_port}")),
        ("127.0.0.1:8080", format!("127.0.0.1:{port}")),
        ("127.0.0.1:8081", format!("127.0.0.1:{app}")),
    ];
    pairs.extend(edit.iter().map(|(a, b)| (*a, b.to_string())));
    let text = replace_all(read(&repo_file(CONF)), &pairs, CONF);
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, text).expect("writing nginx.conf");
    (dir, conf, port)
}

fn command(dir: &Path, conf: &Path) -> Command {
    let mut command = Command::new("nginx");
    command
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(conf)
        .arg("-g")
        .arg(format!(
            "daemon off; master_process on; pid {0}/nginx.pid; error_log {0}/error.log notice;",
            dir.display()
        ));
    command
}

impl Gateway for Nginx {
    const LIMITS_AT_START: bool = false;

    fn available() -> bool {
        installed(
            "command -v nginx && test -e /usr/lib/nginx/modules/ngx_http_lua_module.so",
            &["nginx", "libnginx-mod-http-lua"],
        )
    }

    fn start(redis_port: u16, edit: &[(&str, &str)]) -> Proxy {
        let (dir, conf, port) = prepare(redis_port, edit);
        let log = dir.join("error.log");
        Proxy::spawn("nginx", command(&dir, &conf), dir, log, port)
    }

    /// `nginx -t` runs no init_by_lua: the check is a start, which `configure` stops.
    fn check(redis_port: u16, edit: &[(&str, &str)]) -> (bool, String) {
        let (dir, conf, port) = prepare(redis_port, edit);
        let log = dir.join("error.log");
        let mut command = command(&dir, &conf);
        let stderr = fs::File::create(dir.join("stderr.log")).expect("stderr.log");
        command.stdout(Stdio::null()).stderr(stderr);
        let mut child = common::spawn_child(command).expect("starting nginx");
        let deadline = Instant::now() + Duration::from_secs(20);
        let started = loop {
            if let Some(status) = child.try_wait().expect("nginx") {
                break status.success();
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() || Instant::now() > deadline {
                // SAFETY: kill(2) with plain integers, on our own child, not yet reaped.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
                let _ = child.wait();
                break true;
            }
            thread::sleep(Duration::from_millis(20));
        };
        let text = fs::read_to_string(&log).unwrap_or_default()
            + &fs::read_to_string(dir.join("stderr.log")).unwrap_or_default();
        common::remove_dir(&dir);
        (started, text)
    }
}

#[test]
fn nginx_answers_200s_then_429s_with_the_fields() {
    super::answers_200s_then_429s::<Nginx>();
}

#[test]
fn nginx_two_processes_share_the_limit() {
    super::two_processes_share_the_limit::<Nginx>();
}

#[test]
fn nginx_bounds_requests_through_a_stall_and_a_kill_of_redis() {
    super::stall_and_kill_of_redis::<Nginx>();
}

#[test]
fn nginx_decides_at_once_after_a_restart_of_redis() {
    super::decides_at_once_after_a_restart_of_redis::<Nginx>();
}

#[test]
fn nginx_keeps_connections_apart_by_password() {
    super::connections_are_kept_apart_by_password::<Nginx>();
}

#[test]
fn nginx_uses_the_library_without_the_module() {
    super::library_engine_without_the_module::<Nginx>();
}

#[test]
fn nginx_logs_configuration_errors() {
    super::configuration_errors_are_logged::<Nginx>();
}

#[test]
fn nginx_gives_concurrent_requests_their_own_decisions() {
    super::concurrent_requests_get_their_own_decisions::<Nginx>();
}

/// Its processes die with a killed test process (run by nginx_dies_with_a_killed_test_process;
/// without it, done at once).
#[test]
fn nginx_holds_a_proxy_until_killed() {
    super::holds_a_proxy_until_killed::<Nginx>();
}

#[test]
fn nginx_dies_with_a_killed_test_process() {
    super::dies_with_a_killed_test_process::<Nginx>(
        "gateways::nginx::nginx_holds_a_proxy_until_killed",
    );
}

/// A worker that exits, at a reload (SIGHUP) and at a graceful stop (SIGQUIT), with calls queued
/// on its timer behind a round trip that a stalled Redis does not answer, ends each of them as
/// its `on_error` says (200 unlimited on /api/, 503 on /login) within its timeout, and exits
/// within about one timeout too: its timer stops, nothing waits for a Redis that never answers.
#[test]
fn nginx_ends_the_calls_queued_in_an_exiting_worker() {
    if !Nginx::available() {
        return;
    }
    const LONG_MS: u64 = 1500;
    let server = Server::start();
    let mut proxy = Nginx::start(server.port(), &[("timeout_ms = 50", "timeout_ms = 1500")]);
    let key: &'static [(&str, &str)] = &[("X-API-Key", "dave")];
    let decided = |proxy: &Proxy, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let r = proxy.get("/api/x", key);
            if r.header("RateLimit").is_some() {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: no decision: {r:?}");
            thread::sleep(Duration::from_millis(50));
        }
    };
    decided(&proxy, "at the start");
    let bound = Duration::from_millis(LONG_MS) + SLACK;
    for (signal, name) in [(libc::SIGHUP, "reload"), (libc::SIGQUIT, "quit")] {
        let master = proxy.child.as_ref().expect("nginx").id() as i32;
        let workers: Vec<_> = proxy
            .processes()
            .into_iter()
            .filter(|&(pid, _)| pid != master)
            .collect();
        server.pause();
        // Calls a few ms apart: the first's round trip stalls, the others queue behind it.
        let port = proxy.port;
        let calls: Vec<_> = (0..16)
            .map(|i| {
                thread::sleep(Duration::from_millis(10));
                thread::spawn(move || {
                    if i % 2 == 0 {
                        ("/api/x", get(port, "/api/x", key))
                    } else {
                        ("/login", get(port, "/login", &[]))
                    }
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(300));
        // SAFETY: kill(2) with plain integers, on our own child, not yet reaped.
        assert_eq!(unsafe { libc::kill(master, signal) }, 0, "{name}: kill");
        let signalled = Instant::now();
        for call in calls {
            let (path, r) = call.join().expect("a client thread");
            // Admitted (open), a request goes on to the app, which at a stop is a server of the
            // same nginx that no longer listens (502).
            let want: &[u16] = match (path, signal) {
                ("/login", _) => &[503],
                (_, libc::SIGHUP) => &[200],
                _ => &[200, 502],
            };
            assert!(
                want.contains(&r.status),
                "{name}: {path} as its on_error says: {r:?}"
            );
            assert_eq!(
                r.header("RateLimit"),
                None,
                "{name}: {path} undecided: {r:?}"
            );
            assert!(r.elapsed < bound, "{name}: {path} took {:?}", r.elapsed);
        }
        // The worker that had them exits (its timer stopped), bounded.
        while !workers.iter().all(|&w| gone(w)) {
            assert!(
                signalled.elapsed() < bound,
                "{name}: a worker lives on {:?} after the signal: {:?}",
                signalled.elapsed(),
                workers.iter().filter(|&&w| !gone(w)).collect::<Vec<_>>()
            );
            thread::sleep(Duration::from_millis(20));
        }
        server.resume();
        if signal == libc::SIGHUP {
            // The new workers decide.
            decided(&proxy, "after the reload");
        } else {
            let mut master = proxy.child.take().expect("nginx");
            let status = master.wait().expect("nginx");
            assert!(status.success(), "{name}: nginx exited with {status}");
        }
    }
}

#[test]
fn nginx_sends_specs_in_the_form_the_module_takes() {
    super::spec_form_follows_the_arity::<Nginx>();
}

/// The commands (each a list of its words) read from `conn` into `buf`, waiting until there are
/// `want` in all or `within` has passed: the commands complete so far.
fn commands_read(
    conn: &mut TcpStream,
    buf: &mut Vec<u8>,
    want: usize,
    within: Duration,
) -> Vec<Vec<String>> {
    use std::io::Read;
    let deadline = Instant::now() + within;
    conn.set_read_timeout(Some(Duration::from_millis(50)))
        .expect("a read timeout");
    loop {
        let commands = resp_commands(buf);
        if commands.len() >= want || Instant::now() >= deadline {
            return commands;
        }
        let mut chunk = [0u8; 4096];
        match conn.read(&mut chunk) {
            Ok(0) => return commands,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("reading the proxy's commands: {e}"),
        }
    }
}

/// The complete RESP commands (arrays of bulk strings) at the start of `buf`.
fn resp_commands(buf: &[u8]) -> Vec<Vec<String>> {
    fn line(buf: &[u8], at: usize) -> Option<(&str, usize)> {
        let end = buf[at..].windows(2).position(|w| w == b"\r\n")? + at;
        Some((
            std::str::from_utf8(&buf[at..end]).expect("RESP text"),
            end + 2,
        ))
    }
    let mut out = Vec::new();
    let mut at = 0;
    'commands: while at < buf.len() {
        let Some((head, mut next)) = line(buf, at) else {
            break;
        };
        let n: usize = head
            .strip_prefix('*')
            .expect("a RESP array")
            .parse()
            .expect("its size");
        let mut words = Vec::new();
        for _ in 0..n {
            let Some((len, from)) = line(buf, next) else {
                break 'commands;
            };
            let len: usize = len
                .strip_prefix('$')
                .expect("a bulk")
                .parse()
                .expect("its size");
            if buf.len() < from + len + 2 {
                break 'commands;
            }
            words.push(String::from_utf8(buf[from..from + len].to_vec()).expect("a word"));
            next = from + len + 2;
        }
        out.push(words);
        at = next;
    }
    out
}

/// A CHECK's reply admitting with `remaining` left of 100, as good as new in 600 ms.
fn admitted(remaining: u32) -> String {
    format!("*6\r\n:1\r\n:100\r\n:{remaining}\r\n:-1\r\n:600\r\n:0\r\n")
}

/// A worker sends a batch of calls while the replies of the batch before it are still due (one
/// connection, the batches pipelined), and finds each batch's replies wherever the receives cut
/// them: a fake Redis holds the first call's replies until the second call's command has come on
/// the same connection, then answers both in one write. Each request gets its own decision.
#[test]
fn nginx_sends_a_batch_before_the_replies_of_the_one_before() {
    if !Nginx::available() {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a fake Redis");
    listener.set_nonblocking(true).expect("non-blocking accept");
    let redis_port = listener.local_addr().expect("its address").port();
    let proxy = Nginx::start(
        redis_port,
        &[
            ("worker_processes auto;", "worker_processes 1;"),
            ("timeout_ms = 50", "timeout_ms = 20000"),
        ],
    );
    let port = proxy.port;
    let first = thread::spawn(move || get(port, "/api/x", &[("X-API-Key", "ann")]));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut conn = loop {
        match listener.accept() {
            Ok((conn, _)) => break conn,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(
                    Instant::now() < deadline,
                    "nginx never connected:\n{}",
                    proxy.log()
                );
                thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    conn.set_nonblocking(false).expect("a blocking connection");
    let mut buf = Vec::new();
    // The first call's batch: the arity asked (the engine's first call), then its CHECK.
    let batch = commands_read(&mut conn, &mut buf, 2, Duration::from_secs(10));
    assert_eq!(
        batch.len(),
        2,
        "the first batch: {batch:?}\n{}",
        proxy.log()
    );
    assert_eq!(batch[0][..2], ["COMMAND", "INFO"], "{batch:?}");
    assert_eq!(batch[1][..2], ["RATELIMIT.CHECK", "api:ann"], "{batch:?}");
    let second = thread::spawn(move || get(port, "/api/x", &[("X-API-Key", "bob")]));
    // The second's: its CHECK (after the arity asked again: no reply has said it yet).
    let batches = commands_read(&mut conn, &mut buf, 4, Duration::from_secs(10));
    assert!(
        batches.len() == 4 && batches[3][..2] == ["RATELIMIT.CHECK", "api:bob"],
        "the second call's batch did not come before the first's replies: {batches:?}"
    );
    // All the replies in one write, each command's in order: COMMAND INFO's (no such command:
    // the words go on), the decisions.
    let replies: String = batches
        .iter()
        .map(|c| match c[..2] {
            [ref a, _] if a == "COMMAND" => "*1\r\n*-1\r\n".to_string(),
            [_, ref key] if key == "api:ann" => admitted(99),
            _ => admitted(42),
        })
        .collect();
    std::io::Write::write_all(&mut conn, replies.as_bytes()).expect("the replies");
    for (call, name, remaining) in [(first, "ann", 99), (second, "bob", 42)] {
        let r = call.join().expect("a client thread");
        assert_eq!(r.status, 200, "{name}: {r:?}\n{}", proxy.log());
        assert_eq!(
            r.header("RateLimit"),
            Some(format!("\"default\";r={remaining};t=1").as_str()),
            "{name}: its own decision: {r:?}"
        );
    }
}

/// An admitted request's fields go out with the upstream's response, and RateLimit fields the
/// upstream sends of its own follow ours (the fields are lists: a client reads both limits).
#[test]
fn nginx_puts_the_fields_before_an_upstreams_own() {
    if !Nginx::available() {
        return;
    }
    let server = Server::start();
    let proxy = Nginx::start(
        server.port(),
        &[
            super::CALM,
            (
                "return 200 \"hello from the app\\n\";",
                "add_header RateLimit '\"app\";r=7;t=3'; return 200 \"hello from the app\\n\";",
            ),
        ],
    );
    let r = proxy.get("/api/x", &[("X-API-Key", "carol")]);
    assert_eq!(r.status, 200, "{r:?}\n{}", proxy.log());
    assert_eq!(r.body, "hello from the app\n", "{r:?}");
    let fields: Vec<&str> = r
        .headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("RateLimit"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert!(
        fields.len() == 2
            && fields[0].starts_with("\"default\";r=99;t=")
            && fields[1] == "\"app\";r=7;t=3",
        "ours, then the upstream's: {r:?}"
    );
}
