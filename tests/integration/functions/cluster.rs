//! The library in a real Redis Cluster (testkit/src/cluster.rs): 3 masters with the module, the
//! library loaded on each with `redis-cli --cluster call ... FUNCTION LOAD` as
//! docs/functions.md says (Redis does not propagate it across shards). Through a cluster client
//! every function answers as the module on the same cluster, the library on keys `f:...`, the
//! module on `n:...`; its keys are declared, so they route by their slot: a node that does not
//! serve a key's slot answers `MOVED`, CHECKALL and RESET take hash-tagged keys and answer
//! `CROSSSLOT` for keys in different slots.

use std::time::Instant;

use redis::cluster::ClusterConnection;
use redis::{Cmd, RedisError, Value};
use redis_ratelimit_core::algorithms::Algorithm;

use super::engines::{algorithms, as_library_error, fcall, native, seed, words, LIBRARY};
use super::limits::Limit;
use crate::common::cluster::{
    cluster_address, redis_cli, route, run_bounded, slot, Cluster, CLUSTER_TIMEOUT,
};
use crate::common::rng::Rng;
use crate::common::{error_text, future_base_ms, send_one, show_value, try_reply6};

/// Keys of each engine for CHECK: spread over the three masters.
const KEYS: usize = 150;
/// Hash-tagged groups of two keys for CHECKALL.
const GROUPS: usize = 30;

/// The reply to `cmd` through the cluster client (routed by its first key, following `MOVED`),
/// an error reply as its text.
fn call(con: &mut ClusterConnection, cmd: &Cmd) -> Result<Value, String> {
    cmd.query(con).map_err(|e| error_of(&e))
}

/// An error reply as `CODE detail`, as [`error_text`] words it.
fn error_of(error: &RedisError) -> String {
    format!(
        "{} {}",
        error.code().unwrap_or("(no code)"),
        error.detail().unwrap_or_default()
    )
}

/// The module's and the library's replies agree (error texts once the names are mapped).
fn assert_same(module: &Result<Value, String>, library: &Result<Value, String>, what: &str) {
    let show = |reply: &Result<Value, String>| match reply {
        Ok(value) => show_value(value),
        Err(error) => format!("(error) {error}"),
    };
    let same = match (module, library) {
        (Ok(m), Ok(l)) => m == l,
        (Err(m), Err(l)) => &as_library_error(m) == l,
        _ => false,
    };
    assert!(
        same,
        "{what}: module {} library {}",
        show(module),
        show(library)
    );
}

/// A user's keys for CHECKALL, hash-tagged into one slot: `<engine>:{user:<n>}:a` and `...:b`.
fn group(engine: &str, user: usize) -> [String; 2] {
    ["a", "b"].map(|suffix| format!("{engine}:{{user:{user}}}:{suffix}"))
}

#[test]
fn the_library_works_in_a_cluster_as_the_module_does() {
    let started = Instant::now();
    let cluster = Cluster::start(3, 0);
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    let up = started.elapsed();

    // Functions are per node: load the library on every master, as docs/functions.md does.
    run_bounded(
        redis_cli().args([
            "--cluster",
            "call",
            &cluster_address(masters[0].port),
            "FUNCTION",
            "LOAD",
            "REPLACE",
            LIBRARY,
            "--cluster-only-masters",
        ]),
        CLUSTER_TIMEOUT,
    );
    for master in &masters {
        let libraries: Vec<Value> = redis::cmd("FUNCTION")
            .arg(&["LIST", "LIBRARYNAME", "ratelimit"])
            .query(&mut cluster.server(master.port).client())
            .expect("FUNCTION LIST");
        assert_eq!(libraries.len(), 1, "master {}", master.port);
    }

    let mut con = cluster.client();
    let base = future_base_ms();
    let algorithms = algorithms();
    let mut rng = Rng::with_stream(seed(), 500);

    // CHECK, PEEK and INFO on keys of every master: the same replies from both engines.
    for i in 0..KEYS {
        let algorithm = algorithms[i % algorithms.len()];
        let limit = Limit::new(algorithm, 3, 3_600_000, Some(4));
        let (nkey, fkey) = (format!("n:{i}"), format!("f:{i}"));
        for step in 0..5 {
            let args = limit.args(1, Some(base + step * 10), &mut rng);
            for function in ["peek", "check"] {
                let module = call(&mut con, &native(function, &[&nkey], &args));
                let library = call(&mut con, &fcall(function, &[&fkey], &args));
                assert_same(&module, &library, &format!("{function} {fkey} {args:?}"));
                assert!(library.is_ok(), "{function} {fkey}: {library:?}");
            }
        }
        let module = call(&mut con, &native("info", &[&nkey], &[]));
        let library = call(&mut con, &fcall("info", &[&fkey], &[]));
        assert_same(&module, &library, &format!("info {fkey}"));
    }
    // The keys are on the masters serving their slots, on every master; any other master
    // redirects a call on them.
    for master in &masters {
        let mut direct = cluster.server(master.port).client();
        let keys: Vec<String> = redis::cmd("KEYS").arg("f:*").query(&mut direct).unwrap();
        assert!(
            keys.len() > KEYS / 6,
            "master {} holds {} library keys",
            master.port,
            keys.len()
        );
        assert!(keys.iter().all(|key| master.owns(slot(key))), "{keys:?}");
        let elsewhere = (0..KEYS)
            .map(|i| format!("f:{i}"))
            .find(|key| !master.owns(slot(key)))
            .expect("a key of another master");
        for cmd in [
            fcall("check", &[&elsewhere], &words("fixed-window 3 1h")),
            fcall("peek", &[&elsewhere], &words("fixed-window 3 1h")),
            fcall("info", &[&elsewhere], &[]),
            fcall("reset", &[&elsewhere], &[]),
        ] {
            let error = error_text(&send_one(&mut direct, &cmd)).unwrap_or_default();
            assert!(error.starts_with("MOVED"), "{}: {error}", master.port);
        }
    }

    // CHECKALL on hash-tagged keys: a per-second and a per-hour limit per user.
    let specs = [
        Limit::new(Algorithm::FixedWindow, 3, 1000, None),
        Limit::new(Algorithm::TokenBucket, 5, 3_600_000, Some(6)),
    ];
    let mut admitted = 0;
    for user in 0..GROUPS {
        let (nkeys, fkeys) = (group("n", user), group("f", user));
        assert_eq!(slot(&fkeys[0]), slot(&fkeys[1]));
        for step in 0..6 {
            let at = base + 100 * step;
            let mut args = specs[0].spec_args(&mut rng);
            args.extend(specs[1].args(rng.range(0, 2), Some(at), &mut rng));
            let n: Vec<&str> = nkeys.iter().map(String::as_str).collect();
            let f: Vec<&str> = fkeys.iter().map(String::as_str).collect();
            let module = con
                .route_command(&native("checkall", &n, &args), route(&nkeys[0]))
                .map_err(|e| error_of(&e));
            let library = call(&mut con, &fcall("checkall", &f, &args));
            assert_same(&module, &library, &format!("checkall {fkeys:?} {args:?}"));
            if let Ok(Value::Array(rows)) = &library {
                admitted += usize::from(try_reply6(&rows[0]).is_some_and(|r| r[0] == 1));
            }
        }
    }
    assert!(
        admitted > GROUPS && admitted < 6 * GROUPS,
        "{admitted} admitted"
    );
    // RESET of a group: both keys, in one slot.
    for user in 0..GROUPS {
        let (nkeys, fkeys) = (group("n", user), group("f", user));
        let n: Vec<&str> = nkeys.iter().map(String::as_str).collect();
        let f: Vec<&str> = fkeys.iter().map(String::as_str).collect();
        let module = call(&mut con, &native("reset", &n, &[]));
        let library = call(&mut con, &fcall("reset", &f, &[]));
        assert_same(&module, &library, &format!("reset {fkeys:?}"));
        assert_eq!(library, Ok(Value::Int(2)));
    }

    // Keys in different slots: CROSSSLOT from both engines, through the client and from the
    // node itself, and nothing is written.
    for keys in [["{cross:1}:a", "{cross:2}:a"], ["x", "y"]] {
        let fkeys = keys.map(|key| format!("f:{key}"));
        let nkeys = keys.map(|key| format!("n:{key}"));
        assert_ne!(slot(&fkeys[0]), slot(&fkeys[1]), "{fkeys:?}");
        assert_ne!(slot(&nkeys[0]), slot(&nkeys[1]), "{nkeys:?}");
        let f: Vec<&str> = fkeys.iter().map(String::as_str).collect();
        let n: Vec<&str> = nkeys.iter().map(String::as_str).collect();
        let args = words(&format!("fixed-window 3 1s fixed-window 3 1s AT {base}"));
        for (module, library) in [
            (native("checkall", &n, &args), fcall("checkall", &f, &args)),
            (native("reset", &n, &[]), fcall("reset", &f, &[])),
        ] {
            let module = call(&mut con, &module);
            let library_reply = call(&mut con, &library);
            assert_same(&module, &library_reply, &format!("{fkeys:?}"));
            let error = library_reply.expect_err("CROSSSLOT");
            assert!(error.starts_with("CROSSSLOT"), "{fkeys:?}: {error}");
            let owner = cluster.owner(slot(&fkeys[0]));
            let direct = send_one(&mut cluster.server(owner.port).client(), &library);
            let error = error_text(&direct).unwrap_or_default();
            assert!(error.starts_with("CROSSSLOT"), "{fkeys:?}: {error}");
        }
        for key in fkeys.iter().chain(&nkeys) {
            let exists: i64 = redis::cmd("EXISTS").arg(key).query(&mut con).unwrap();
            assert_eq!(exists, 0, "{key}");
        }
    }
    eprintln!(
        "cluster up in {up:.1?}, whole test in {:.1?}",
        started.elapsed()
    );
}
