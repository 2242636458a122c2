//! gateways/haproxy in Debian's haproxy: gateways/haproxy/haproxy.cfg and rules.lua (the ones its
//! README shows), in the foreground (`-db`).

use super::{
    assert_readme_shows, install_dir, installed, read, replace_all, repo_file, Gateway, Proxy,
};
use crate::common;
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

impl Gateway for Haproxy {
    const LIMITS_AT_START: bool = true;

    fn available() -> bool {
        installed("command -v haproxy", &["haproxy"])
    }

    fn start(redis_port: u16, edit: &[(&str, &str)]) -> Proxy {
        let (dir, cfg, port) = prepare(redis_port, edit);
        let log = dir.join("stdio.log");
        Proxy::spawn("haproxy", command(&cfg), dir, log, port)
    }

    fn check(redis_port: u16, edit: &[(&str, &str)]) -> (bool, String) {
        let (dir, cfg, _) = prepare(redis_port, edit);
        let output = command(&cfg).arg("-c").output().expect("haproxy -c");
        common::remove_dir(&dir);
        let text = String::from_utf8_lossy(&output.stderr).into_owned()
            + &String::from_utf8_lossy(&output.stdout);
        (output.status.success(), text)
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
