//! gateways/nginx in Debian's nginx with libnginx-mod-http-lua: gateways/nginx/nginx.conf (the
//! one its README shows), master and workers in the foreground (`daemon off`).

use super::{
    assert_readme_shows, install_dir, installed, read, replace_all, repo_file, Gateway, Proxy,
};
use crate::common;
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
