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
