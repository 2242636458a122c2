//! gateways/haproxy in Debian's haproxy: gateways/haproxy/haproxy.cfg and rules.lua (the ones its
//! README shows), in the foreground (`-db`).

use super::{
    assert_readme_shows, install_dir, installed, read, replace_all, repo_file, Gateway, Proxy,
};
use crate::common;
use common::Server;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Haproxy;

const README: &str = "gateways/haproxy/README.md";
const CFG: &str = "gateways/haproxy/haproxy.cfg";
const RULES: &str = "gateways/haproxy/rules.lua";

/// `edit`'s pairs that occur in `text` (an edit names a line of either file).
fn edits_in<'a>(text: &str, edit: &[(&'a str, &str)]) -> Vec<(&'a str, String)> {
    edit.iter()
        .filter(|(from, _)| text.contains(from))
        .map(|(a, b)| (*a, b.to_string()))
        .collect()
}

/// The README's haproxy.cfg and rules.lua for a server on `redis_port`, with `edit`, in a fresh
/// directory: (directory, its haproxy.cfg, the frontend's port).
fn prepare(redis_port: u16, edit: &[(&str, &str)]) -> (PathBuf, PathBuf, u16) {
    for page in [README, super::GATEWAYS_PAGE] {
        assert_readme_shows(page, CFG);
        assert_readme_shows(page, RULES);
    }
    let dir = install_dir("haproxy");
    let port = common::free_port();
    let app = common::free_port();
    let lib = format!("{}/", dir.display());
    let rules = read(&repo_file(RULES));
    let cfg = read(&repo_file(CFG));
    for (from, _) in edit {
        assert!(
            rules.contains(from) || cfg.contains(from),
            "neither file has {from:?}"
        );
    }
    let mut pairs = vec![
        ("/etc/haproxy/redis-ratelimit/", lib.clone()),
        ("127.0.0.1:6379", format!("127.0.0.1:{redis_port}")),
    ];
    pairs.extend(edits_in(&rules, edit));
    std::fs::write(dir.join("rules.lua"), replace_all(rules, &pairs, RULES)).expect("rules.lua");
    let mut pairs = vec![
        ("/etc/haproxy/redis-ratelimit/", lib),
        ("127.0.0.1:8080", format!("127.0.0.1:{port}")),
        ("127.0.0.1:8081", format!("127.0.0.1:{app}")),
    ];
    pairs.extend(edits_in(&cfg, edit));
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, replace_all(cfg, &pairs, CFG)).expect("haproxy.cfg");
    (dir, path, port)
}

fn command(cfg: &Path) -> Command {
    let mut command = Command::new("haproxy");
    command.arg("-db").arg("-f").arg(cfg);
    command
}

/// The trixie root tests/debian13.sh makes (target/debian13/root, or $DEBIAN13_ROOT), where
/// Debian 13's haproxy (3.0) is installed in it.
fn debian13_root() -> Option<PathBuf> {
    let root = std::env::var_os("DEBIAN13_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_file("target/debian13/root"));
    root.join("usr/sbin/haproxy").is_file().then_some(root)
}

/// Debian 13's haproxy run on this machine through the root's own loader and libraries (as
/// tests/debian13.sh runs its servers): the loader runs it in its own process, so the proxy
/// keeps the pid the harness signals.
fn command_30(cfg: &Path) -> Command {
    let root = debian13_root().expect("the Debian 13 root");
    let libs = ["usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu"]
        .map(|l| root.join(l).display().to_string())
        .join(":");
    let mut command = Command::new(root.join("usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"));
    command
        .arg("--library-path")
        .arg(libs)
        .arg(root.join("usr/sbin/haproxy"))
        .arg("-db")
        .arg("-f")
        .arg(cfg);
    command
}

/// The configuration with `edit` for a server on `redis_port`, run by `command` until the test
/// drops it.
fn start_with(command: fn(&Path) -> Command, redis_port: u16, edit: &[(&str, &str)]) -> Proxy {
    let (dir, cfg, port) = prepare(redis_port, edit);
    let log = dir.join("stdio.log");
    Proxy::spawn("haproxy", command(&cfg), dir, log, port)
}

fn check_with(
    command: fn(&Path) -> Command,
    redis_port: u16,
    edit: &[(&str, &str)],
) -> (bool, String) {
    let (dir, cfg, _) = prepare(redis_port, edit);
    let output = command(&cfg).arg("-c").output().expect("haproxy -c");
    common::remove_dir(&dir);
    let text = String::from_utf8_lossy(&output.stderr).into_owned()
        + &String::from_utf8_lossy(&output.stdout);
    (output.status.success(), text)
}

impl Gateway for Haproxy {
    const LIMITS_AT_START: bool = true;

    fn available() -> bool {
        installed("command -v haproxy", &["haproxy"])
    }

    fn start(redis_port: u16, edit: &[(&str, &str)]) -> Proxy {
        start_with(command, redis_port, edit)
    }

    fn check(redis_port: u16, edit: &[(&str, &str)]) -> (bool, String) {
        check_with(command, redis_port, edit)
    }
}

/// The same configuration in Debian 13's HAProxy 3.0 (where the root is: else a recorded skip).
pub struct Haproxy30;

impl Gateway for Haproxy30 {
    const LIMITS_AT_START: bool = true;

    fn available() -> bool {
        if debian13_root().is_some() {
            return true;
        }
        common::skip(
            "no Debian 13 root with haproxy (target/debian13/root or $DEBIAN13_ROOT, \
             usr/sbin/haproxy in it): HAProxy 3.0 not tested",
        );
        false
    }

    fn start(redis_port: u16, edit: &[(&str, &str)]) -> Proxy {
        start_with(command_30, redis_port, edit)
    }

    fn check(redis_port: u16, edit: &[(&str, &str)]) -> (bool, String) {
        check_with(command_30, redis_port, edit)
    }
}

#[test]
fn haproxy_answers_200s_then_429s_with_the_fields() {
    super::answers_200s_then_429s::<Haproxy>();
}

#[test]
fn haproxy_two_processes_share_the_limit() {
    super::two_processes_share_the_limit::<Haproxy>();
}

#[test]
fn haproxy_bounds_requests_through_a_stall_and_a_kill_of_redis() {
    super::stall_and_kill_of_redis::<Haproxy>();
}

#[test]
fn haproxy_decides_at_once_after_a_restart_of_redis() {
    super::decides_at_once_after_a_restart_of_redis::<Haproxy>();
}

#[test]
fn haproxy_keeps_connections_apart_by_password() {
    super::connections_are_kept_apart_by_password::<Haproxy>();
}

#[test]
fn haproxy_uses_the_library_without_the_module() {
    super::library_engine_without_the_module::<Haproxy>();
}

#[test]
fn haproxy_logs_configuration_errors() {
    super::configuration_errors_are_logged::<Haproxy>();
}

#[test]
fn haproxy_gives_concurrent_requests_their_own_decisions() {
    super::concurrent_requests_get_their_own_decisions::<Haproxy>();
}

/// Its processes die with a killed test process (run by haproxy_dies_with_a_killed_test_process;
/// without it, done at once).
#[test]
fn haproxy_holds_a_proxy_until_killed() {
    super::holds_a_proxy_until_killed::<Haproxy>();
}

#[test]
fn haproxy_dies_with_a_killed_test_process() {
    super::dies_with_a_killed_test_process::<Haproxy>(
        "gateways::haproxy::haproxy_holds_a_proxy_until_killed",
    );
}

/// A rule keyed by a `function(txn)` (rules.lua's "partner": the X-Partner header, lower-cased):
/// the values it maps to one key share a limit, the others are counted apart, each under the key
/// the function returns; without the header it returns nil and the request is not limited.
#[test]
fn haproxy_keys_a_rule_by_a_function_of_the_transaction() {
    if !Haproxy::available() {
        return;
    }
    let server = Server::start();
    let proxy = Haproxy::start(server.port(), &[super::CALM]);
    // "ACME" and "Acme" are one partner: 20 an hour between them.
    for n in 1..=20u64 {
        let partner = if n % 2 == 0 { "Acme" } else { "ACME" };
        let r = proxy.get("/partner/x", &[("X-Partner", partner)]);
        assert_eq!(r.status, 200, "request {n}: {r:?}");
        assert_eq!(
            r.header("RateLimit-Policy"),
            Some("\"default\";q=20;w=3600")
        );
        let field = r.header("RateLimit").expect("RateLimit");
        assert!(
            field.starts_with(&format!("\"default\";r={};", 20 - n)),
            "request {n}: {field}"
        );
    }
    let refused = proxy.get("/partner/x", &[("X-Partner", "acme")]);
    assert_eq!(refused.status, 429, "{refused:?}");
    // Another partner has a limit of its own.
    let other = proxy.get("/partner/x", &[("X-Partner", "globex")]);
    assert_eq!(other.status, 200, "{other:?}");
    assert!(
        other
            .header("RateLimit")
            .expect("RateLimit")
            .starts_with("\"default\";r=19;"),
        "{other:?}"
    );
    // No header: the function returns nil, the request is not limited.
    let free = proxy.get("/partner/x", &[]);
    assert_eq!(free.status, 200, "{free:?}");
    assert_eq!(free.header("RateLimit-Policy"), None, "{free:?}");
    let keys: i64 = redis::cmd("EXISTS")
        .arg(&["partner:acme", "partner:globex"])
        .query(&mut server.client())
        .unwrap();
    assert_eq!(keys, 2, "the keys the function returned");
}

#[test]
fn haproxy_sends_specs_in_the_form_the_module_takes() {
    super::spec_form_follows_the_arity::<Haproxy>();
}

/// A pooled connection idle for longer than a call's timeout (50 ms here), then used again: from
/// HAProxy 2.8 a socket's read times out at its last read plus its timeout, and 3.0 aborts
/// (SIGILL, a BUG_ON in sc_notify) on a socket whose expiry has passed; the module sets the
/// first timeout of a call on a pooled connection from its last read, so that both end at the
/// call's deadline.
fn idle_pooled_connection_is_used_again<G: Gateway>() {
    if !G::available() {
        return;
    }
    let server = Server::start();
    let proxy = G::start(server.port(), &[]);
    for n in 1..=3u64 {
        let r = proxy.get("/api/", &[("X-API-Key", "alice")]);
        assert_eq!(r.status, 200, "request {n}: {r:?}\n{}", proxy.log());
        let field = r.header("RateLimit").expect("RateLimit");
        assert!(
            field.starts_with(&format!("\"default\";r={};", 100 - n)),
            "request {n}: {field}"
        );
        // Idle: six times the call's timeout.
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
}

#[test]
fn haproxy_uses_a_pooled_connection_again_after_an_idle_time() {
    idle_pooled_connection_is_used_again::<Haproxy>();
}

#[test]
fn haproxy30_uses_a_pooled_connection_again_after_an_idle_time() {
    idle_pooled_connection_is_used_again::<Haproxy30>();
}

#[test]
fn haproxy30_answers_200s_then_429s_with_the_fields() {
    super::answers_200s_then_429s::<Haproxy30>();
}

#[test]
fn haproxy30_bounds_requests_through_a_stall_and_a_kill_of_redis() {
    super::stall_and_kill_of_redis::<Haproxy30>();
}

#[test]
fn haproxy30_decides_at_once_after_a_restart_of_redis() {
    super::decides_at_once_after_a_restart_of_redis::<Haproxy30>();
}

#[test]
fn haproxy30_gives_concurrent_requests_their_own_decisions() {
    super::concurrent_requests_get_their_own_decisions::<Haproxy30>();
}
