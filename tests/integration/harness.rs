//! Tests of the test harness itself (testkit/): they start plain redis-servers without the
//! module, so they hold whatever state src/ is in.

use crate::common;

use common::{future_base_ms, now_ms, wait_replica_sync, Server};
use std::path::PathBuf;
use std::time::Duration;

fn set(server: &Server, key: &str, value: &str) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query(&mut server.client())
        .expect("SET");
}

fn get(server: &Server, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut server.client())
        .expect("GET")
}

/// True while a process with this pid exists (a zombie counts: it is not reaped).
fn process_exists(pid: u32) -> bool {
    PathBuf::from(format!("/proc/{pid}")).exists()
}

#[test]
fn starts_answers_and_stops() {
    let mut server = Server::start_without_module();
    assert_ne!(server.port(), 6379);
    assert!(server.dir().is_dir());
    let pong: String = redis::cmd("PING").query(&mut server.client()).unwrap();
    assert_eq!(pong, "PONG");
    assert_eq!(
        server.info_field("server", "process_id"),
        server.pid().unwrap().to_string()
    );
    assert!(server.log().contains("Ready to accept connections"));

    let pid = server.pid().unwrap();
    server.stop(false);
    assert!(!server.is_running());
    assert!(!process_exists(pid));
    server.start_again();
    let pong: String = redis::cmd("PING").query(&mut server.client()).unwrap();
    assert_eq!(pong, "PONG");
}

#[test]
fn debug_command_is_enabled_and_nothing_persists_by_default() {
    let server = Server::start_without_module();
    let config: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("save")
        .query(&mut server.client())
        .unwrap();
    assert_eq!(config, ["save", ""]);
    assert_eq!(server.info_field("persistence", "aof_enabled"), "0");
    set(&server, "k", "v");
    let digest: String = redis::cmd("DEBUG")
        .arg("DIGEST-VALUE")
        .arg("k")
        .query::<Vec<String>>(&mut server.client())
        .unwrap()
        .remove(0);
    assert_eq!(digest.len(), 40);
}

#[test]
fn two_servers_are_independent() {
    let a = Server::start_without_module();
    let b = Server::start_without_module();
    assert_ne!(a.port(), b.port());
    assert_ne!(a.dir(), b.dir());
    set(&a, "k", "a");
    set(&b, "k", "b");
    assert_eq!(get(&a, "k").as_deref(), Some("a"));
    assert_eq!(get(&b, "k").as_deref(), Some("b"));
}

#[test]
fn config_pairs_are_applied() {
    let server = Server::builder()
        .no_module()
        .config(&[("maxmemory", "10mb"), ("appendonly", "yes")])
        .start();
    assert_eq!(server.info_field("memory", "maxmemory"), "10485760");
    assert_eq!(server.info_field("persistence", "aof_enabled"), "1");
}

#[test]
fn restart_keeps_data_with_appendonly() {
    let mut server = Server::builder()
        .no_module()
        .config(&[("appendonly", "yes"), ("appendfsync", "always")])
        .start();
    set(&server, "k", "before restart");
    server.restart();
    assert_eq!(get(&server, "k").as_deref(), Some("before restart"));

    // With appendfsync always, even a crash loses nothing.
    set(&server, "k2", "before crash");
    server.kill9();
    assert!(!server.is_running());
    server.start_again();
    assert_eq!(get(&server, "k2").as_deref(), Some("before crash"));
}

#[test]
fn restart_reloads_the_rdb_without_appendonly() {
    let mut server = Server::start_without_module();
    set(&server, "k", "v");
    server.restart(); // SHUTDOWN SAVE
    assert_eq!(get(&server, "k").as_deref(), Some("v"));
    assert!(server.dir().join("dump.rdb").is_file());

    server.stop(false); // SHUTDOWN NOSAVE: the write below is lost
    server.start_again();
    set(&server, "lost", "v");
    server.stop(false);
    server.start_again();
    assert_eq!(get(&server, "lost"), None);
    assert_eq!(get(&server, "k").as_deref(), Some("v"));
}

#[test]
fn replica_follows_master() {
    let master = Server::start_without_module();
    let replica = Server::start_without_module();
    set(&master, "before", "1");
    replica.replica_of(&master);
    assert_eq!(get(&replica, "before").as_deref(), Some("1"));

    for i in 0..100 {
        set(&master, &format!("k{i}"), &i.to_string());
    }
    wait_replica_sync(&master, &replica);
    assert_eq!(get(&replica, "k99").as_deref(), Some("99"));
    assert_eq!(replica.info_field("replication", "role"), "slave");

    replica.promote();
    assert_eq!(replica.info_field("replication", "role"), "master");
}

#[test]
fn pause_freezes_and_resume_continues() {
    let server = Server::start_without_module();
    let mut con = server.client_with_timeout(Duration::from_millis(300));
    server.pause();
    assert!(redis::cmd("PING").query::<String>(&mut con).is_err());
    server.resume();
    let pong: String = redis::cmd("PING").query(&mut server.client()).unwrap();
    assert_eq!(pong, "PONG");
}

#[test]
fn drop_leaves_no_process_and_no_directory() {
    let server = Server::start_without_module();
    let (pid, dir) = (server.pid().unwrap(), server.dir().to_path_buf());
    drop(server);
    assert!(!process_exists(pid), "redis-server {pid} survived Drop");
    assert!(!dir.exists(), "{} survived Drop", dir.display());

    // A paused server is killed too.
    let server = Server::start_without_module();
    let pid = server.pid().unwrap();
    server.pause();
    drop(server);
    assert!(
        !process_exists(pid),
        "paused redis-server {pid} survived Drop"
    );
}

#[test]
fn a_panicking_test_leaves_no_process() {
    let (tx, rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let server = Server::start_without_module();
        tx.send(server.pid().unwrap()).unwrap();
        panic!("deliberate panic with a live server");
    })
    .join();
    assert!(outcome.is_err());
    let pid = rx.recv().unwrap();
    assert!(!process_exists(pid), "redis-server {pid} survived a panic");
}

#[test]
fn resp3_client_speaks_resp3() {
    let server = Server::start_without_module();
    let reply: redis::Value = redis::cmd("HELLO")
        .query(&mut server.client_resp3())
        .unwrap();
    assert!(matches!(reply, redis::Value::Map(_)), "{reply:?}");
}

#[test]
fn future_base_is_an_aligned_day_ahead() {
    // The clock read before and after: a base taken in the last ms of a day is only just over
    // a day ahead of that ms, and less than a day ahead of a later reading.
    let before = now_ms();
    let base = future_base_ms();
    let after = now_ms();
    assert_eq!(base % 86_400_000, 0);
    assert!(base > before + 86_400_000);
    assert!(base <= after + 2 * 86_400_000);
}

#[test]
fn a_server_that_refuses_to_start_gives_its_status_and_log() {
    let failed = Server::builder()
        .no_module()
        .config(&[("no-such-directive", "1")])
        .start_expecting_failure();
    assert!(!failed.status.success(), "{}", failed.status);
    assert!(failed.log.contains("no-such-directive"), "{}", failed.log);
}

#[test]
fn a_config_file_is_read_first_and_read_again_on_restart() {
    let mut server = Server::builder()
        .no_module()
        .config_file("maxmemory 10mb\nappendonly yes\n")
        .start();
    // The file is read; the harness defaults given after it win (appendonly no).
    assert_eq!(server.info_field("memory", "maxmemory"), "10485760");
    assert_eq!(server.info_field("persistence", "aof_enabled"), "0");
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "20mb"])
        .query(&mut server.client())
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("REWRITE")
        .query(&mut server.client())
        .unwrap();
    let text = std::fs::read_to_string(server.dir().join("redis.conf")).unwrap();
    assert!(text.contains("maxmemory 20mb"), "{text}");
    server.stop(false);
    server.start_again();
    assert_eq!(server.info_field("memory", "maxmemory"), "20971520");
}

#[test]
fn crc64_is_crc64_jones() {
    // The check value of CRC-64/Jones, the CRC of DUMP payloads (common::dump).
    assert_eq!(common::dump::crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
}
