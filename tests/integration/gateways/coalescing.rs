//! Many requests of one proxy worker at once. NGINX coalesces the calls a worker makes to Redis
//! at the same time (its background timer writes every queued call's command in one send and
//! wakes each with its own reply); HAProxy decides each on a pooled connection of its thread. Either way a
//! burst at one key admits exactly the limit, and a stalled Redis leaves no request waiting
//! beyond timeout_ms.

use super::haproxy::Haproxy;
use super::nginx::Nginx;
use super::{get, Gateway, Response, CALM, SLACK, TIMEOUT_MS};
use crate::common;

use common::Server;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

/// Concurrent clients of a burst.
const CLIENTS: usize = 32;
/// Requests each client sends, one after another.
const EACH: usize = 5;

/// `CLIENTS` threads released together, each sending `EACH` GETs of `path` with `headers`.
fn burst(port: u16, path: &'static str, headers: &'static [(&str, &str)]) -> Vec<Response> {
    let start = Arc::new(Barrier::new(CLIENTS));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let start = Arc::clone(&start);
            thread::spawn(move || {
                start.wait();
                (0..EACH)
                    .map(|_| get(port, path, headers))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    clients
        .into_iter()
        .flat_map(|c| c.join().expect("a client thread"))
        .collect()
}

/// Connections the server has accepted so far (asked on `client`, one connection throughout).
fn connections(client: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("stats").query(client).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no total_connections_received in {info}"))
}

/// One worker (NGINX) or thread (HAProxy) at a time: 160 requests at one key from 32 clients
/// at once, under the README's 100 a minute, admit exactly 100 (each decided: with its field)
/// and refuse 60. Answers the connections the proxy opened to Redis meanwhile.
fn burst_admits_exactly_the_limit<G: Gateway>(edit: &[(&str, &str)]) -> Option<u64> {
    if !G::available() {
        return None;
    }
    let server = Server::start();
    let mut edit = edit.to_vec();
    edit.push(CALM);
    let proxy = G::start(server.port(), &edit);
    // The engine found and a connection pooled before the burst.
    let warm = proxy.get("/api/x", &[("X-API-Key", "warm")]);
    assert_eq!(warm.status, 200, "{warm:?}");
    let mut client = server.client();
    let before = connections(&mut client);
    // Redis stopped for the first 300 ms of the burst: its requests pile up in the proxy, all
    // waiting at once (within the 2 s timeout).
    server.pause();
    let port = proxy.port;
    let clients = thread::spawn(move || burst(port, "/api/x", &[("X-API-Key", "burst")]));
    thread::sleep(Duration::from_millis(300));
    server.resume();
    let responses = clients.join().expect("the burst");
    let opened = connections(&mut client) - before;
    let mut admitted = 0;
    let mut refused = 0;
    for r in &responses {
        match r.status {
            200 => {
                assert!(r.header("RateLimit").is_some(), "admitted undecided: {r:?}");
                admitted += 1;
            }
            429 => refused += 1,
            _ => panic!("{r:?}"),
        }
    }
    assert_eq!(admitted, 100, "admitted of {}", responses.len());
    assert_eq!(refused, CLIENTS * EACH - 100);
    Some(opened)
}

/// Redis stopped (SIGSTOP) under a burst: every request ends within timeout_ms (and slack),
/// failing open; then the limits come back.
fn burst_through_a_stall<G: Gateway>(edit: &[(&str, &str)]) {
    if !G::available() {
        return;
    }
    let server = Server::start();
    let proxy = G::start(server.port(), edit);
    let key = [("X-API-Key", "stalled")];
    // Decided before (a 50 ms timeout can pass on a loaded machine: then asked again).
    let decided = |what: &str| {
        for _ in 0..300 {
            if proxy.get("/api/x", &key).header("RateLimit").is_some() {
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
        panic!("{what}: no decision 15 s on");
    };
    decided("at the start");
    server.pause();
    let responses = burst(proxy.port, "/api/x", &[("X-API-Key", "stalled")]);
    server.resume();
    let bound = Duration::from_millis(TIMEOUT_MS) + SLACK;
    for r in &responses {
        assert_eq!(r.status, 200, "fails open: {r:?}");
        assert_eq!(r.header("RateLimit"), None, "nothing known: {r:?}");
        assert!(r.elapsed < bound, "a request took {:?}", r.elapsed);
    }
    decided("after the stall");
}

const ONE_WORKER: (&str, &str) = ("worker_processes auto;", "worker_processes 1;");
const ONE_THREAD: (&str, &str) = ("\nglobal\n", "\nglobal\n    nbthread 1\n");

#[test]
fn nginx_coalesces_a_burst_on_one_connection_and_admits_exactly_the_limit() {
    if let Some(opened) = burst_admits_exactly_the_limit::<Nginx>(&[ONE_WORKER]) {
        // One worker's calls share its one pooled connection, whatever their number at once.
        assert_eq!(opened, 0, "connections opened during the burst");
    }
}

#[test]
fn haproxy_admits_exactly_the_limit_under_a_burst() {
    burst_admits_exactly_the_limit::<Haproxy>(&[ONE_THREAD]);
}

#[test]
fn nginx_bounds_a_burst_through_a_stall() {
    burst_through_a_stall::<Nginx>(&[ONE_WORKER]);
}

#[test]
fn haproxy_bounds_a_burst_through_a_stall() {
    burst_through_a_stall::<Haproxy>(&[ONE_THREAD]);
}
