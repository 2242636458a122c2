//! Concurrency limits (`RATELIMIT.ACQUIRE`/`RELEASE`, docs/algorithms.md "Concurrency"): the
//! module equals a model of leases written from the definitions on random sequences (acquires,
//! renewals, releases, expiry, clocks running backwards, costs and limits changing); racing
//! clients never hold more than the limit; the leases survive RDB, AOF (with and without the RDB
//! preamble) and replication exactly; `ratelimit.max-leases` bounds a key; rejected calls and
//! empty releases are invisible; the errors say what to do.
//!
//! `LEASES_SEED=<n>` (decimal or 0x hex) replays a randomized run; the seed is printed.

use crate::common;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use common::rng::{seed_from_env, Rng};
use common::{
    assert_replica_matches, config_set, digest, exists, future_base_ms, info_int, limiter_info,
    master_and_replica, now_ms, pexpiretime, reply6, send, send_one, Server,
};
use redis::{Cmd, Connection, Value};

/// `RATELIMIT.ACQUIRE key limit duration ID id [COST n] [AT t]`.
fn acquire(key: &str, limit: u64, duration_ms: u64, id: &[u8], cost: u64, at: Option<u64>) -> Cmd {
    let mut cmd = redis::cmd("RATELIMIT.ACQUIRE");
    cmd.arg(key)
        .arg(limit)
        .arg(duration_ms)
        .arg("ID")
        .arg(id)
        .arg("COST")
        .arg(cost);
    if let Some(at) = at {
        cmd.arg("AT").arg(at);
    }
    cmd
}

/// `RATELIMIT.RELEASE key ID id [AT t]`.
fn release(key: &str, id: &[u8], at: Option<u64>) -> Cmd {
    let mut cmd = redis::cmd("RATELIMIT.RELEASE");
    cmd.arg(key).arg("ID").arg(id);
    if let Some(at) = at {
        cmd.arg("AT").arg(at);
    }
    cmd
}

fn int_reply(value: &Value) -> i64 {
    match value {
        Value::Int(n) => *n,
        other => panic!("not an integer: {other:?}"),
    }
}

/// One key's leases, written out as a list, and the definitions of docs/algorithms.md
/// ("Concurrency") applied to it literally: no index, no running sums.
#[derive(Clone, Debug, Default)]
struct Model {
    /// `(id, cost, expiry)`.
    leases: Vec<(Vec<u8>, u64, u64)>,
    /// `last`: the time of the last write; `None` when the key does not exist.
    last: Option<u64>,
}

impl Model {
    fn live(&self, t: u64) -> impl Iterator<Item = &(Vec<u8>, u64, u64)> {
        self.leases.iter().filter(move |lease| lease.2 > t)
    }

    /// ms from `t` until the last lease live at `t` expires.
    fn reset_after(&self, t: u64) -> i64 {
        self.live(t).map(|lease| lease.2).max().unwrap_or(t) as i64 - t as i64
    }

    /// The ACQUIRE's reply, or `None` for the max-leases error.
    fn acquire(
        &mut self,
        id: &[u8],
        limit: u64,
        d: u64,
        n: u64,
        now: u64,
        max: usize,
    ) -> Option<[i64; 6]> {
        let t = self.last.map_or(now, |last| now.max(last));
        let held: u64 = self.live(t).map(|lease| lease.1).sum();
        let own = self
            .live(t)
            .find(|lease| lease.0 == id)
            .map(|lease| lease.1);
        let other = held - own.unwrap_or(0);
        if other + n <= limit {
            if own.is_none() && self.live(t).count() >= max {
                return None;
            }
            self.leases.retain(|lease| lease.2 > t && lease.0 != id);
            self.leases.push((id.to_vec(), n, t + d));
            self.last = Some(t);
            let reset = self.reset_after(t);
            return Some([1, limit as i64, (limit - other - n) as i64, 0, reset, 0]);
        }
        // The first expiry after which the request fits, tried in order.
        let retry = if n > limit {
            -1
        } else {
            let mut times: Vec<u64> = self.live(t).map(|lease| lease.2).collect();
            times.sort_unstable();
            let fits = |x: u64| {
                let other: u64 = self.live(x).filter(|l| l.0 != id).map(|l| l.1).sum();
                other + n <= limit
            };
            let x = times
                .into_iter()
                .find(|&x| fits(x))
                .expect("fits once all expired");
            (x - t) as i64
        };
        let remaining = limit.saturating_sub(held) as i64;
        Some([0, limit as i64, remaining, retry, self.reset_after(t), 0])
    }

    fn release(&mut self, id: &[u8], now: u64) -> i64 {
        let Some(last) = self.last else { return 0 };
        let t = now.max(last);
        if self.live(t).all(|lease| lease.0 != id) {
            return 0;
        }
        self.leases.retain(|lease| lease.2 > t && lease.0 != id);
        self.last = (!self.leases.is_empty()).then_some(t);
        1
    }
}

/// Random ACQUIREs and RELEASEs on a few keys, each reply compared with the model's; the
/// keys' INFO too. Returns the keys.
fn random_sequences(
    con: &mut Connection,
    rng: &mut Rng,
    prefix: &str,
    steps: usize,
) -> Vec<String> {
    let keys: Vec<String> = (0..4).map(|i| format!("{prefix}:{i}")).collect();
    let mut models = vec![Model::default(); keys.len()];
    let mut now = future_base_ms();
    let ids: Vec<Vec<u8>> = (0..10u8)
        .map(|i| match i {
            // Binary ids, and the longest.
            0 => vec![0, 0xff, b'\r', b'\n'],
            1 => vec![b'x'; 128],
            _ => format!("req-{i}").into_bytes(),
        })
        .collect();
    for _ in 0..steps {
        let k = rng.index(keys.len());
        // Mostly forwards, sometimes backwards (evaluated at the key's last time then).
        now = now.saturating_add_signed(rng.range(0, 900) as i64 - 300);
        let id = rng.pick_ref(&ids).clone();
        if rng.chance(70) {
            let limit = rng.pick(&[1, 2, 3, 5, 8]);
            let d = rng.pick(&[1, 50, 300, 1000, 2500]);
            let n = rng.range(1, 4);
            let expected = models[k]
                .acquire(&id, limit, d, n, now, 100_000)
                .expect("below max-leases");
            let reply = reply6(&send_one(
                con,
                &acquire(&keys[k], limit, d, &id, n, Some(now)),
            ));
            assert_eq!(
                reply, expected,
                "ACQUIRE {} {limit} {d} ID {id:?} COST {n} AT {now}; model {:?}",
                keys[k], models[k]
            );
        } else {
            let expected = models[k].release(&id, now);
            let reply = int_reply(&send_one(con, &release(&keys[k], &id, Some(now))));
            assert_eq!(
                reply, expected,
                "RELEASE {} ID {id:?} AT {now}; model {:?}",
                keys[k], models[k]
            );
        }
        // The key exists exactly while the model holds leases, and expires with the last one.
        let model = &models[k];
        assert_eq!(
            exists(con, &keys[k]),
            model.last.is_some(),
            "{}: {model:?}",
            keys[k]
        );
        if model.last.is_some() {
            let last_expiry = model.leases.iter().map(|lease| lease.2).max().unwrap();
            assert_eq!(
                pexpiretime(con, &keys[k]),
                last_expiry as i64,
                "{}",
                keys[k]
            );
        }
    }
    keys
}

#[test]
fn acquire_and_release_match_the_model_and_replicate_exactly() {
    let seed = seed_from_env("LEASES_SEED", now_ms);
    eprintln!("LEASES_SEED={seed}");
    let mut rng = Rng::new(seed);
    let (master, replica) = master_and_replica();
    let mut con = master.client();
    let keys = random_sequences(&mut con, &mut rng, "lease", 1500);
    // The replica holds what the master holds: digests, expiries, INFO.
    assert_replica_matches(&master, &replica, &keys);
    // And so does the master after an RDB round trip.
    let before = key_states(&mut con, &keys);
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).unwrap();
    assert_eq!(key_states(&mut con, &keys), before, "DEBUG RELOAD");
}

/// Each key's digest and expiry, `None` for a missing one.
fn key_states(con: &mut Connection, keys: &[String]) -> Vec<Option<(String, i64)>> {
    let mut states = Vec::new();
    for key in keys {
        let state = exists(con, key).then(|| (digest(con, key), pexpiretime(con, key)));
        states.push(state);
    }
    states
}

#[test]
fn worked_example_and_info() {
    let server = Server::start();
    let mut con = server.client();
    let t = future_base_ms();
    // limit 3, leases of 10 s.
    assert_eq!(
        reply6(&send_one(
            &mut con,
            &acquire("k", 3, 10_000, b"a", 1, Some(t))
        )),
        [1, 3, 2, 0, 10_000, 0]
    );
    assert_eq!(
        reply6(&send_one(
            &mut con,
            &acquire("k", 3, 10_000, b"b", 2, Some(t + 1000))
        )),
        [1, 3, 0, 0, 10_000, 0]
    );
    // Full: `a` expires first, at t + 10000, and frees enough.
    assert_eq!(
        reply6(&send_one(
            &mut con,
            &acquire("k", 3, 10_000, b"c", 1, Some(t + 2000))
        )),
        [0, 3, 0, 8000, 9000, 0]
    );
    // A cost above the limit never fits.
    assert_eq!(
        reply6(&send_one(
            &mut con,
            &acquire("k", 3, 10_000, b"c", 4, Some(t + 2000))
        )),
        [0, 3, 0, -1, 9000, 0]
    );
    // `b` renewed with cost 1: its own cost is given back first.
    assert_eq!(
        reply6(&send_one(
            &mut con,
            &acquire("k", 3, 10_000, b"b", 1, Some(t + 3000))
        )),
        [1, 3, 1, 0, 10_000, 0]
    );
    let info = limiter_info(&mut con, "k").unwrap();
    assert_eq!(info["algorithm"], Value::SimpleString("concurrency".into()));
    for (field, value) in [
        ("limit", 3),
        ("lease_ms", 10_000),
        ("leases", 2),
        ("held", 2),
        ("updated_at_ms", (t + 3000) as i64),
    ] {
        assert_eq!(info_int(&info, field), value, "{field}");
    }
    assert_eq!(
        int_reply(&send_one(&mut con, &release("k", b"a", Some(t + 4000)))),
        1
    );
    assert_eq!(
        int_reply(&send_one(&mut con, &release("k", b"a", Some(t + 4000)))),
        0
    );
    // Expired at exactly its expiry: `b` holds nothing at t + 13000, and its release is 0.
    assert_eq!(
        int_reply(&send_one(&mut con, &release("k", b"b", Some(t + 13_000)))),
        0
    );
    assert!(exists(&mut con, "k"), "an empty release writes nothing");
    assert_eq!(
        reply6(&send_one(
            &mut con,
            &acquire("k", 1, 500, b"z", 1, Some(t + 13_000))
        )),
        [1, 1, 0, 0, 500, 0]
    );
    assert_eq!(
        int_reply(&send_one(&mut con, &release("k", b"z", Some(t + 13_100)))),
        1
    );
    assert!(!exists(&mut con, "k"), "the last release deletes the key");
    assert_eq!(int_reply(&send_one(&mut con, &release("k", b"z", None))), 0);
}

#[test]
fn a_lease_frees_its_cost_at_exactly_its_expiry() {
    let server = Server::start();
    let mut con = server.client();
    let t = future_base_ms();
    decision_ok(&mut con, acquire("e", 2, 1000, b"a", 2, Some(t)));
    let reply = reply6(&send_one(
        &mut con,
        &acquire("e", 2, 1000, b"b", 1, Some(t + 999)),
    ));
    assert_eq!(reply, [0, 2, 0, 1, 1, 0]);
    let reply = reply6(&send_one(
        &mut con,
        &acquire("e", 2, 1000, b"b", 1, Some(t + 1000)),
    ));
    assert_eq!(reply, [1, 2, 1, 0, 1000, 0]);
    let info = limiter_info(&mut con, "e").unwrap();
    assert_eq!(
        info_int(&info, "leases"),
        1,
        "the expired lease was dropped by the write"
    );
    // On the server's clock: a lease of 150 ms lets the next in once it has passed.
    decision_ok(&mut con, acquire("live", 1, 150, b"a", 1, None));
    let rejected = reply6(&send_one(&mut con, &acquire("live", 1, 150, b"b", 1, None)));
    assert!(
        rejected[0] == 0 && (1..=150).contains(&rejected[3]),
        "{rejected:?}"
    );
    thread::sleep(std::time::Duration::from_millis(rejected[3] as u64 + 5));
    decision_ok(&mut con, acquire("live", 1, 150, b"b", 1, None));
}

fn decision_ok(con: &mut Connection, cmd: Cmd) {
    let reply = reply6(&send_one(con, &cmd));
    assert_eq!(reply[0], 1, "{reply:?}");
}

/// An ACQUIRE of one engine: `(key, limit, duration_ms, id, cost, at)`.
pub type AcquireCmd = fn(&str, u64, u64, &[u8], u64, Option<u64>) -> Cmd;
/// A RELEASE of one engine: `(key, id, at)`.
pub type ReleaseCmd = fn(&str, &[u8], Option<u64>) -> Cmd;

#[test]
fn racing_clients_never_hold_more_than_the_limit() {
    race(&Server::start(), acquire, release);
}

/// 8 clients taking and releasing leases of one key on the server's clock never hold more than
/// the limit together; at one instant (`AT`) exactly the limit is admitted, with distinct
/// `remaining`s. Also run on the Functions library (functions/leases.rs).
pub fn race(server: &Server, acquire: AcquireCmd, release: ReleaseCmd) {
    const CLIENTS: usize = 8;
    const LIMIT: i64 = 3;
    const ROUNDS: usize = 300;
    // What the clients hold, counted by them: up after an admitted ACQUIRE, down before RELEASE.
    let held = Arc::new(AtomicI64::new(0));
    let peak = Arc::new(AtomicI64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(CLIENTS));
    let threads: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (held, peak, admitted, barrier) = (
                held.clone(),
                peak.clone(),
                admitted.clone(),
                barrier.clone(),
            );
            let mut con = server.client();
            thread::spawn(move || {
                barrier.wait();
                for round in 0..ROUNDS {
                    let id = format!("client-{c}-{round}");
                    let reply = reply6(&send_one(
                        &mut con,
                        &acquire("race", LIMIT as u64, 60_000, id.as_bytes(), 1, None),
                    ));
                    if reply[0] == 1 {
                        let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(now, Ordering::SeqCst);
                        admitted.fetch_add(1, Ordering::SeqCst);
                        // The work: another client's ACQUIRE gets in between.
                        thread::yield_now();
                        held.fetch_sub(1, Ordering::SeqCst);
                        assert_eq!(
                            int_reply(&send_one(&mut con, &release("race", id.as_bytes(), None))),
                            1
                        );
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("a client panicked");
    }
    let peak = peak.load(Ordering::SeqCst);
    let admitted = admitted.load(Ordering::SeqCst);
    eprintln!(
        "peak held {peak} of {LIMIT}; {admitted} of {} admitted",
        CLIENTS * ROUNDS
    );
    assert!(peak <= LIMIT, "peak held {peak} > limit {LIMIT}");
    // The race took place: leases were admitted and some ACQUIREs met a full key. (How many are
    // admitted depends on the machine's load: 89 of 2,400 on a 2-core machine compiling.)
    assert!(admitted >= 10, "{admitted} admitted");
    assert!(
        admitted < (CLIENTS * ROUNDS) as u64,
        "no ACQUIRE was ever rejected"
    );
    assert!(
        !exists(&mut server.client(), "race"),
        "every lease released"
    );
    // Many clients at one instant (AT): exactly the limit admitted, distinct `remaining`s.
    let t = future_base_ms();
    let barrier = Arc::new(Barrier::new(CLIENTS));
    let threads: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let barrier = barrier.clone();
            let mut con = server.client();
            thread::spawn(move || {
                barrier.wait();
                let cmds: Vec<Cmd> = (0..50)
                    .map(|i| {
                        acquire(
                            "instant",
                            100,
                            60_000,
                            format!("{c}:{i}").as_bytes(),
                            1,
                            Some(t),
                        )
                    })
                    .collect();
                send(&mut con, &cmds).iter().map(reply6).collect::<Vec<_>>()
            })
        })
        .collect();
    let replies: Vec<[i64; 6]> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let mut remaining: Vec<i64> = replies.iter().filter(|r| r[0] == 1).map(|r| r[2]).collect();
    remaining.sort_unstable();
    assert_eq!(remaining, (0..100).collect::<Vec<i64>>());
    assert!(replies.iter().filter(|r| r[0] == 0).all(|r| r[3] == 60_000));
}

#[test]
fn max_leases_bounds_a_key_with_a_clear_error() {
    let server = Server::start();
    let mut con = server.client();
    assert_eq!(
        common::config_get(&mut con, "ratelimit.max-leases"),
        "100000"
    );
    config_set(&mut con, "ratelimit.max-leases", "2").unwrap();
    let t = future_base_ms();
    decision_ok(&mut con, acquire("m", 10, 1000, b"a", 1, Some(t)));
    decision_ok(&mut con, acquire("m", 10, 1000, b"b", 1, Some(t)));
    let message = common::error_text(&send_one(
        &mut con,
        &acquire("m", 10, 1000, b"c", 1, Some(t)),
    ))
    .expect("a third lease is an error");
    assert!(message.contains("ratelimit.max-leases (2)"), "{message}");
    // A renewal is no new lease; one expired makes room.
    decision_ok(&mut con, acquire("m", 10, 1000, b"b", 5, Some(t + 500)));
    decision_ok(&mut con, acquire("m", 10, 1000, b"c", 1, Some(t + 1000)));
    for bad in ["0", "1000001", "x"] {
        assert!(
            config_set(&mut con, "ratelimit.max-leases", bad).is_err(),
            "{bad}"
        );
    }
    // A replica with a lower bound still takes the master's leases.
    let (master, replica) = master_and_replica();
    config_set(&mut replica.client(), "ratelimit.max-leases", "1").unwrap();
    let mut m = master.client();
    for id in [&b"a"[..], b"b", b"c"] {
        decision_ok(&mut m, acquire("r", 10, 60_000, id, 1, Some(t)));
    }
    assert_replica_matches(&master, &replica, &["r".to_string()]);
    assert_eq!(
        info_int(&limiter_info(&mut replica.client(), "r").unwrap(), "leases"),
        3
    );
}

#[test]
fn rejected_acquires_and_empty_releases_are_invisible() {
    let (master, replica) = master_and_replica();
    let mut con = master.client();
    let t = future_base_ms();
    decision_ok(&mut con, acquire("q", 1, 60_000, b"a", 1, Some(t)));
    common::wait_replica_sync(&master, &replica);
    let offset = || master.info("replication")["master_repl_offset"].clone();
    let dirty = || master.info("persistence")["rdb_changes_since_last_save"].clone();
    let (offset0, dirty0) = (offset(), dirty());
    let before = send_one(&mut con, redis::cmd("DUMP").arg("q"));
    assert_eq!(
        reply6(&send_one(
            &mut con,
            &acquire("q", 1, 60_000, b"b", 1, Some(t + 10))
        ))[0],
        0
    );
    assert_eq!(
        int_reply(&send_one(&mut con, &release("q", b"b", Some(t + 20)))),
        0
    );
    assert_eq!(
        int_reply(&send_one(&mut con, &release("missing", b"b", Some(t + 20)))),
        0
    );
    assert_eq!(send_one(&mut con, redis::cmd("DUMP").arg("q")), before);
    assert_eq!(
        (offset(), dirty()),
        (offset0, dirty0),
        "nothing written, nothing replicated"
    );
    // Counted in INFO: calls, allowed, rejected and keys; RELEASE decides nothing.
    let info = master.info("ratelimit");
    for (field, value) in [
        ("calls", "2"),
        ("allowed", "1"),
        ("rejected", "1"),
        ("blocked", "0"),
        ("keys", "1"),
    ] {
        assert_eq!(
            info[&format!("ratelimit_concurrency_{field}")],
            value,
            "{field}"
        );
    }
    assert_eq!(replica.info("ratelimit")["ratelimit_concurrency_keys"], "1");
}

#[test]
fn leases_survive_aof_with_and_without_preamble_and_restarts() {
    for preamble in ["yes", "no"] {
        let mut server = Server::builder()
            .config(&[
                ("appendonly", "yes"),
                ("appendfsync", "always"),
                ("aof-use-rdb-preamble", preamble),
            ])
            .start();
        let mut con = server.client();
        let mut rng = Rng::new(seed_from_env("LEASES_SEED", now_ms));
        let keys = random_sequences(&mut con, &mut rng, "aof", 300);
        let state = |con: &mut Connection| key_states(con, &keys);
        let before = state(&mut con);
        assert!(before.iter().any(Option::is_some), "some leases held");
        // The APPLY changes replayed from the AOF...
        server.restart();
        let mut con = server.client();
        assert_eq!(state(&mut con), before, "AOF replay (preamble {preamble})");
        // ...and the rewritten AOF.
        let _: () = redis::cmd("BGREWRITEAOF").query(&mut con).unwrap();
        server.wait_persistence_idle(&["aof_rewrite_in_progress", "aof_rewrite_scheduled"]);
        server.restart();
        let mut con = server.client();
        assert_eq!(state(&mut con), before, "AOF rewrite (preamble {preamble})");
    }
}

#[test]
fn leases_through_a_policy_and_copy_and_errors() {
    let server = Server::start();
    let mut con = server.client();
    let t = future_base_ms();
    let run = |con: &mut Connection, line: &str| common::run(con, line);
    assert_eq!(
        run(&mut con, "RATELIMIT.POLICY SET jobs concurrency 2 30s"),
        Value::Okay
    );
    let got = run(&mut con, "RATELIMIT.POLICY GET jobs");
    let fields = common::info_fields(&got).unwrap();
    assert_eq!(info_int(&fields, "limit"), 2);
    assert_eq!(info_int(&fields, "lease_ms"), 30_000);
    let reply = reply6(&run(
        &mut con,
        &format!("RATELIMIT.ACQUIRE pk POLICY jobs ID a COST 2 AT {t}"),
    ));
    assert_eq!(reply, [1, 2, 0, 0, 30_000, 0]);
    // COPY and RESTORE of a lease set.
    assert_eq!(run(&mut con, "COPY pk pk2"), Value::Int(1));
    assert_eq!(digest(&mut con, "pk"), digest(&mut con, "pk2"));
    let errors = [
        ("RATELIMIT.ACQUIRE pk POLICY nope ID a", "no such policy"),
        ("RATELIMIT.POLICY SET rate token-bucket 2 1s", ""),
        ("RATELIMIT.ACQUIRE pk POLICY rate ID a", "not concurrency"),
        ("RATELIMIT.CHECK pk POLICY jobs", "is a concurrency limit"),
        (
            "RATELIMIT.POLICY SET jobs2 concurrency 2 30s BLOCK 1s",
            "BLOCK applies only to rate limits",
        ),
        (
            "RATELIMIT.POLICY SET jobs2 concurrency 2 30s BURST 3",
            "BURST applies only",
        ),
        (
            "RATELIMIT.CHECK pk token-bucket 3 1s",
            "holds a concurrency limiter",
        ),
        (
            "RATELIMIT.PEEK pk token-bucket 3 1s",
            "holds a concurrency limiter",
        ),
        (
            "RATELIMIT.REFUND pk token-bucket 3 1s COST 1",
            "holds a concurrency limiter",
        ),
        (
            "RATELIMIT.CHECKALL 1 pk token-bucket 3 1s",
            "holds a concurrency limiter",
        ),
        (
            "RATELIMIT.CHECK x concurrency 3 1s",
            "use RATELIMIT.ACQUIRE",
        ),
        (
            "RATELIMIT.ACQUIRE pk 3 1s ID a COST 0",
            "COST must be an integer from 1",
        ),
        ("RATELIMIT.ACQUIRE pk 0 1s ID a", "limit must be"),
        ("RATELIMIT.ACQUIRE pk 3 0 ID a", "lease-duration must be"),
        (
            "RATELIMIT.ACQUIRE pk 3 3651d ID a",
            "lease-duration must be",
        ),
        (
            "RATELIMIT.ACQUIRE pk 3 1s COST 1",
            "ID lease-id is required",
        ),
        (
            "RATELIMIT.ACQUIRE pk 3 1s ID a ID b",
            "ID given more than once",
        ),
        (
            "RATELIMIT.ACQUIRE pk 3 1s ID a BURST 1",
            "expected ID, COST or AT",
        ),
        ("RATELIMIT.ACQUIRE pk 3 1s ID", "wrong number of arguments"),
        ("RATELIMIT.RELEASE pk ID a COST 1", "expected ID or AT"),
        ("RATELIMIT.RELEASE pk AT 5", "ID lease-id is required"),
        (
            "RATELIMIT.RELEASE pk ID a AT 5 ID b",
            "ID given more than once",
        ),
        (
            "RATELIMIT.RELEASE pk ID a AT 5 AT 6",
            "AT given more than once",
        ),
        ("RATELIMIT.RELEASE pk", "wrong number of arguments"),
    ];
    for (line, expected) in errors {
        let reply = run(&mut con, line);
        if expected.is_empty() {
            continue;
        }
        let text = common::error_text(&reply).unwrap_or_else(|| panic!("{line}: {reply:?}"));
        assert!(text.contains(expected), "{line}: {text}");
    }
    let long_id = "x".repeat(129);
    let text = common::run_error(&mut con, &format!("RATELIMIT.ACQUIRE pk 3 1s ID {long_id}"));
    assert!(text.contains("lease id must be 1 to 128 bytes"), "{text}");
    // Per hour: tb must outlive the two calls below (per second it is gone 334 ms later).
    run(&mut con, "RATELIMIT.CHECK tb token-bucket 3 1h");
    let text = common::run_error(&mut con, "RATELIMIT.ACQUIRE tb 3 1s ID a");
    assert!(
        text.contains("holds a token-bucket limiter, not concurrency"),
        "{text}"
    );
    let text = common::run_error(&mut con, "RATELIMIT.RELEASE tb ID a");
    assert!(
        text.contains("holds a token-bucket limiter, not concurrency"),
        "{text}"
    );
    run(&mut con, "SET s x");
    assert!(common::run_error(&mut con, "RATELIMIT.ACQUIRE s 3 1s ID a").starts_with("WRONGTYPE"));
    assert!(common::run_error(&mut con, "RATELIMIT.RELEASE s ID a").starts_with("WRONGTYPE"));
    assert!(!server.log().contains("panicked"));
}

/// The memory bound of a lease set (core/src/algorithms/concurrency/leases/, docs/guarantees.md):
/// the module allocates at most `LEASE_HEADER_BYTES` plus `len(id) + 24` per lease for a key whose
/// ids are of one length (244 bytes, and 52 per id length).
const LEASE_HEADER_BYTES: i64 = 244 + 52;

#[test]
fn a_lease_costs_at_most_its_id_and_24_bytes() {
    let server = Server::start();
    let mut con = server.client();
    let t = future_base_ms();
    let mut rng = Rng::new(seed_from_env("LEASES_SEED", now_ms));
    let usage = |con: &mut Connection, key: &str| -> i64 {
        int_reply(&send_one(con, redis::cmd("MEMORY").arg("USAGE").arg(key)))
    };
    for (len, leases) in [(16usize, 50_000u64), (128, 20_000)] {
        let id = |i: u64| format!("{i:0len$}");
        let (one, many) = (format!("one-{len:03}"), format!("all-{len:03}"));
        let send_all = |con: &mut Connection, cmds: Vec<Cmd>| {
            for chunk in cmds.chunks(5_000) {
                assert!(send(con, chunk).iter().all(|reply| match reply {
                    Value::Int(n) => *n == 1,
                    reply => reply6(reply)[0] == 1,
                }));
            }
        };
        let lease = |key: &str, i: u64| {
            acquire(
                key,
                1_000_000_000_000,
                86_400_000,
                id(i).as_bytes(),
                1,
                Some(t),
            )
        };
        send_all(&mut con, vec![lease(&one, 0)]);
        send_all(&mut con, (0..leases).map(|i| lease(&many, i)).collect());
        // The keys' names are of one length, so the difference of their MEMORY USAGE is the
        // difference of the module's allocations; one lease alone takes more than len + 24 (its
        // record, its table, its leaf), so `heap(many) ≤ H + n·(len + 24)` gives this:
        let within = |con: &mut Connection, n: u64, what: &str| {
            let added = usage(con, &many) - usage(con, &one);
            let bound = LEASE_HEADER_BYTES + (n as i64 - 1) * (len as i64 + 24);
            eprintln!(
                "MEMORY USAGE: {:.1} bytes per lease of a {len}-byte id ({n} leases, {what})",
                added as f64 / (n - 1) as f64
            );
            assert!(
                added <= bound,
                "{added} bytes for {n} more leases: over {bound}"
            );
        };
        within(&mut con, leases, "acquired");
        // Half of them released at random: the bound holds as the set thins out.
        let mut order: Vec<u64> = (0..leases).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.index(i + 1));
        }
        let (gone, kept) = order.split_at(leases as usize / 2);
        let releases = |ids: &[u64]| -> Vec<Cmd> {
            ids.iter()
                .map(|&i| release(&many, id(i).as_bytes(), Some(t)))
                .collect()
        };
        send_all(&mut con, releases(gone));
        within(&mut con, kept.len() as u64, "after releasing a random half");
        // Releasing them all gives the key back.
        send_all(&mut con, releases(kept));
        assert!(!exists(&mut con, &many));
    }
}
