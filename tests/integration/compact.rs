//! The compact form (core/src/compact.rs): a bucket, window or gcra key of common parameters is
//! one word beside a shared entry. What it costs (a gcra key: at most 140 bytes, less than
//! redis-cell's), and that everything still holds where the word does not fit: a limiter whose
//! change outgrows its word, a full table of entries, entries freed from a background thread,
//! random calls that move keys between the two forms.

use crate::common;

use std::time::{Duration, Instant};

use common::model::{Model, Spec};
use common::rng::{seed_from_env, Rng};
use common::{
    assert_replica_matches, dbsize, decision, digests, future_base_ms, info_int, int, limiter_info,
    now_ms, redis_cell, reply6, send, Limit, Server,
};
use redis::{Cmd, Connection};
use redis_ratelimit_core::algorithms::Algorithm;

/// `MEMORY USAGE` of one key.
fn memory_usage(con: &mut Connection, key: &str) -> i64 {
    int(con, redis::cmd("MEMORY").arg("USAGE").arg(key))
}

/// `used_memory` read once the server is at rest: every other client gone and no hash table
/// rehashing. A client that pipelined thousands of commands holds ~100 KB of query and reply
/// buffers until its connection closes; the keyspace's table, doubled at 16,384 keys, keeps its
/// old 128 KB array until a cron or later commands finish moving it. Either moves a per-key
/// figure by ~8 B, as much as the margin to redis-cell (CI saw it on a loaded machine).
fn used_memory(probe: &mut Connection) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let clients: String = redis::cmd("INFO").arg("clients").query(probe).unwrap();
        let stats: String = redis::cmd("DEBUG")
            .arg("HTSTATS")
            .arg(0)
            .query(probe)
            .unwrap();
        if common::parse_info(&clients)["connected_clients"] == "1"
            && !stats.contains("rehashing target")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the server does not come to rest: {clients} {stats}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let memory: String = redis::cmd("INFO").arg("memory").query(probe).unwrap();
    common::parse_info(&memory)["used_memory"]
        .parse()
        .expect("used_memory")
}

/// What one more key costs: the `used_memory` delta per key between 17k and 32k keys made by
/// `command(key)`, where the keyspace's and the expiries' hash tables keep their size. Each
/// range is written by a connection of its own, closed before the count.
fn bytes_per_added_key(server: &Server, command: impl Fn(&str) -> Cmd) -> f64 {
    let mut probe = server.client();
    let _: () = redis::cmd("FLUSHALL").query(&mut probe).unwrap();
    let fill = |range: std::ops::Range<u32>| {
        let mut con = server.client();
        let cmds: Vec<Cmd> = range.map(|i| command(&format!("rl:{i:012}"))).collect();
        for chunk in cmds.chunks(2_000) {
            for reply in send(&mut con, chunk) {
                assert!(!common::is_error(&reply), "{reply:?}");
            }
        }
    };
    fill(0..17_000);
    let middle = used_memory(&mut probe);
    fill(17_000..32_000);
    let after = used_memory(&mut probe);
    assert_eq!(dbsize(&mut probe), 32_000, "a key expired while measuring");
    (after - middle) / 15_000.0
}

/// `CL.THROTTLE key 15 30 3600 1`: 30 an hour, bursts of 15; a key written once lives 120 s.
fn throttle(key: &str) -> Cmd {
    let mut cmd = redis::cmd("CL.THROTTLE");
    cmd.arg(key).arg(&["15", "30", "3600", "1"]);
    cmd
}

#[test]
fn a_gcra_key_costs_at_most_140_bytes() {
    let server = Server::start();
    let ours = bytes_per_added_key(&server, throttle);
    let set = bytes_per_added_key(&server, |key| {
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg("v").arg("PXAT").arg("4102444800000");
        cmd
    });
    eprintln!("per added key: CL.THROTTLE (ours) {ours:.1} B, SET k v PXAT t {set:.1} B");
    assert!(ours <= 140.0, "{ours:.1} B per gcra key");
    // Buckets and windows of common parameters cost the same. Written at a time ahead: on the
    // server's clock the fixed windows' keys all expire at the end of the hour, which can fall
    // while they are counted.
    let t = future_base_ms();
    for algorithm in [
        "token-bucket",
        "leaky-bucket",
        "fixed-window",
        "sliding-window",
    ] {
        let limit = Limit::new(algorithm, 100, "1h", None);
        let bytes = bytes_per_added_key(&server, |key| limit.check(key, 1, Some(t)));
        assert!(bytes <= 140.0, "{algorithm}: {bytes:.1} B per key");
    }
}

#[test]
fn a_gcra_key_costs_less_than_a_redis_cell_key() {
    let Some(cell) = redis_cell() else { return };
    let server = Server::start();
    let ours = bytes_per_added_key(&server, throttle);
    let peer = Server::builder()
        .no_module()
        .config(&[("loadmodule", cell.to_str().unwrap())])
        .start();
    let theirs = bytes_per_added_key(&peer, throttle);
    eprintln!("per added key: CL.THROTTLE ours {ours:.1} B, redis-cell {theirs:.1} B");
    assert!(ours < theirs, "ours {ours:.1} B, redis-cell {theirs:.1} B");
}

#[test]
fn a_limiter_whose_change_outgrows_its_word_keeps_its_state_everywhere() {
    let master = Server::start();
    let replica = Server::start();
    replica.replica_of(&master);
    let mut con = master.client();
    let t = future_base_ms();
    // 10 a second, bursts of 10: ten at once put the TAT 1 s ahead. A word holds this key.
    let small = Limit::new("gcra", 10, "1s", Some(10));
    assert_eq!(
        decision(&mut con, &small.check("g", 10, Some(t)))[..3],
        [1, 10, 0]
    );
    let compact_usage = memory_usage(&mut con, "g");
    // One a decade, bursts of 10^12: a TAT no word can hold. The TAT carries over (1 s ahead,
    // now in whole ms) and moves one period later.
    let wide = Limit::new("gcra", 1, "3650d", Some(1_000_000_000_000));
    let period_ms: i64 = 3650 * 86_400_000;
    let reply = decision(&mut con, &wide.check("g", 1, Some(t)));
    assert_eq!(reply[0], 1, "{reply:?}");
    let info = limiter_info(&mut con, "g").unwrap();
    assert_eq!(info_int(&info, "tat"), t as i64 + 1_000 + period_ms);
    assert_eq!(memory_usage(&mut con, "g"), compact_usage + 32);
    // Back to the small parameters: the TAT is far beyond their tolerance, so the key rejects
    // and keeps its state; a COST 0 reads it.
    let reply = decision(&mut con, &small.check("g", 1, Some(t + 5)));
    assert_eq!(reply[0], 0, "{reply:?}");
    assert_eq!(limiter_info(&mut con, "g").unwrap(), info);
    // The replica, DEBUG RELOAD and DUMP/RESTORE keep it exactly.
    assert_replica_matches(&master, &replica, &["g".to_string()]);
    let before = digests(&mut con, &["g".to_string()]);
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).unwrap();
    assert_eq!(digests(&mut con, &["g".to_string()]), before);
    assert_eq!(limiter_info(&mut con, "g").unwrap(), info);
}

#[test]
fn a_full_table_of_entries_leaves_keys_exact_and_a_background_flush_frees_it() {
    let server = Server::builder()
        .config(&[("lazyfree-lazy-user-flush", "yes")])
        .start();
    let mut con = server.client();
    let t = future_base_ms();
    // 2,100 parameter sets, one key each: more than the 2,048 entries.
    let sets = 2_100u64;
    let limit = |i: u64| Limit::new("fixed-window", 1_000 + i, "1h", None);
    let fill = |con: &mut Connection, prefix: &str| -> Vec<i64> {
        let cmds: Vec<Cmd> = (0..sets)
            .map(|i| limit(i).check(&format!("{prefix}:{i:05}"), 1, Some(t)))
            .collect();
        for (i, reply) in send(con, &cmds).iter().enumerate() {
            let limit = 1_000 + i as i64;
            assert_eq!(
                common::reply6(reply),
                [1, limit, limit - 1, 0, 3_600_000, 0],
                "{prefix}:{i}"
            );
        }
        (0..sets)
            .map(|i| memory_usage(con, &format!("{prefix}:{i:05}")))
            .collect()
    };
    let usage = fill(&mut con, "a");
    let small = *usage.iter().min().unwrap();
    // Exactly as many keys in words as there are entries: a new parameter set takes the wider
    // form only once every entry is in use.
    let compact = usage.iter().filter(|&&u| u == small).count();
    assert_eq!(compact, 2_048, "keys in words");
    assert!(
        usage.iter().all(|&u| u == small || u == small + 32),
        "{usage:?}"
    );
    // Every key answers from its state, in either form, and survives a reload.
    let keys: Vec<String> = (0..sets).map(|i| format!("a:{i:05}")).collect();
    let before = digests(&mut con, &keys);
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).unwrap();
    assert_eq!(digests(&mut con, &keys), before);
    let cmds: Vec<Cmd> = (0..sets)
        .map(|i| limit(i).check(&format!("a:{i:05}"), 1, Some(t + 1)))
        .collect();
    for (i, reply) in send(&mut con, &cmds).iter().enumerate() {
        assert_eq!(common::reply6(reply)[2], 1_000 + i as i64 - 2, "a:{i}");
    }
    // A background FLUSHALL drops every reference from its own thread; then 2,000 new
    // parameter sets all find an entry again (keys of the same length: the same MEMORY USAGE).
    let _: () = redis::cmd("FLUSHALL").arg("ASYNC").query(&mut con).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.info_field("memory", "lazyfree_pending_objects") != "0" {
        assert!(
            Instant::now() < deadline,
            "the background flush did not finish"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let cmds: Vec<Cmd> = (0..2_000)
        .map(|i| limit(5_000 + i).check(&format!("b:{i:05}"), 1, Some(t)))
        .collect();
    send(&mut con, &cmds);
    let usage: Vec<i64> = (0..2_000)
        .map(|i| memory_usage(&mut con, &format!("b:{i:05}")))
        .collect();
    assert!(usage.iter().all(|&u| u == usage[0]), "{usage:?}");
    assert_eq!(usage[0], small);
}

/// The table that looked full: 2,048 parameter sets fill every entry, then all but the
/// 64 keys right after where the search for a free entry starts are deleted, half by DEL (freed on
/// the main thread) and half by FLUSHDB ASYNC (freed on the lazyfree thread). Every new parameter
/// set gets a word again while an entry is free (it took the 32-byte form before, as if the table
/// were still full), and the wider form once none is.
#[test]
fn a_new_parameter_set_gets_a_word_while_any_entry_is_free() {
    let server = Server::start();
    let t = future_base_ms();
    let limit = |i: u64| Limit::new("fixed-window", 1_000 + i, "1h", None);
    let key = |i: u64| format!("k:{i:05}");
    let (mut kept, mut con) = (server.client(), server.client());
    let _: () = redis::cmd("SELECT").arg(1).query(&mut kept).unwrap();
    // On a fresh server the entries are assigned in order, and the search starts again at the
    // first one once all 2,048 are: the 64 keys kept, in db 1, hold the first 64 entries.
    let fill = |con: &mut Connection, sets: std::ops::Range<u64>| {
        let cmds: Vec<Cmd> = sets.map(|i| limit(i).check(&key(i), 1, Some(t))).collect();
        for reply in send(con, &cmds) {
            assert_eq!(reply6(&reply)[0], 1, "{reply:?}");
        }
    };
    fill(&mut kept, 0..64);
    fill(&mut con, 64..2_048);
    let word = memory_usage(&mut kept, &key(0));
    assert!(
        (64..2_048).all(|i| memory_usage(&mut con, &key(i)) == word),
        "every one of the 2,048 parameter sets in a word"
    );
    // Half deleted on the main thread, the other half freed by the lazyfree thread.
    let dels: Vec<Cmd> = (64..1_056)
        .map(|i| {
            let mut cmd = redis::cmd("DEL");
            cmd.arg(key(i));
            cmd
        })
        .collect();
    assert!(send(&mut con, &dels)
        .iter()
        .all(|r| *r == redis::Value::Int(1)));
    let _: () = redis::cmd("FLUSHDB").arg("ASYNC").query(&mut con).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.info_field("memory", "lazyfree_pending_objects") != "0" {
        assert!(
            Instant::now() < deadline,
            "the background flush did not finish"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(dbsize(&mut con), 0);
    // 1,984 entries are free: as many new parameter sets take a word, then the next one cannot.
    fill(&mut con, 10_000..11_984);
    let usage: Vec<i64> = (10_000..11_984)
        .map(|i| memory_usage(&mut con, &key(i)))
        .collect();
    let wide = usage.iter().filter(|&&u| u != word).count();
    assert_eq!(
        wide, 0,
        "{wide} new parameter sets not in a word: {usage:?}"
    );
    fill(&mut con, 20_000..20_001);
    assert_eq!(memory_usage(&mut con, &key(20_000)), word + 32);
}

/// Random calls on keys whose parameters change between sets that fit a word and sets that do
/// not, so keys move between the two forms (and between entries and epochs) mid-life: every
/// reply is the model's, and both forms are seen.
#[test]
fn random_calls_moving_keys_between_the_two_forms_answer_as_the_model_does() {
    let mut rng = Rng::new(seed_from_env("COMPACT_SEED", now_ms));
    let server = Server::start();
    let mut con = server.client();
    const DAY: u64 = 86_400_000;
    // Per algorithm: parameter sets that fit a word, then sets that do not.
    let specs = |algorithm: Algorithm| -> Vec<Spec> {
        let spec = |limit, period_ms, burst| Spec {
            algorithm,
            limit,
            period_ms,
            burst: algorithm.is_bucket().then_some(burst),
        };
        let mut specs = vec![
            spec(3, 1_000, 5),
            spec(10, 60_000, 4),
            spec(100, 3_600_000, 100),
        ];
        specs.extend(match algorithm {
            Algorithm::FixedWindow => vec![spec(1_000_000_000_000, 3650 * DAY, 0)],
            Algorithm::SlidingWindow => vec![spec(1_000_000, 3_600_000, 0)],
            _ => vec![
                spec(1, 3650 * DAY, 1_000_000_000_000),
                spec(100_000, 60_000_000_000, 100_000),
            ],
        });
        specs
    };
    let algorithms = [
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::Gcra,
    ];
    let mut model = Model::default();
    let mut t = future_base_ms();
    let mut forms = std::collections::HashSet::new();
    for step in 0..3_000 {
        let algorithm = rng.pick(&algorithms);
        // Names of one length, so MEMORY USAGE tells the forms apart.
        let key = format!("{:_<14}:{}", algorithm.name(), rng.below(3));
        let spec = *rng.pick_ref(&specs(algorithm));
        t = match rng.below(10) {
            0 => t.saturating_sub(rng.below(2_000)),
            1..=4 => t,
            5..=8 => t + rng.below(1_500),
            _ => t + rng.log_uniform(1, 2 * DAY),
        };
        let cost = rng.below(4);
        let mut cmd = redis::cmd("RATELIMIT.CHECK");
        cmd.arg(&key)
            .arg(spec.args())
            .arg("COST")
            .arg(cost)
            .arg("AT")
            .arg(t);
        let reply: redis::Value = cmd.query(&mut con).unwrap();
        let expected = model.check(&key, &spec.request(cost, t)).to_array();
        assert_eq!(
            reply6(&reply),
            expected,
            "step {step}: {key} {spec:?} cost {cost} at {t}"
        );
        if let Ok(usage) = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&key)
            .query::<i64>(&mut con)
        {
            forms.insert(usage);
        }
    }
    // A word and the 32-byte form, nothing else.
    assert_eq!(forms.len(), 2, "MEMORY USAGE seen: {forms:?}");
}
