//! Contention: many connections, MULTI/EXEC and Lua scripts hammering one key at one instant admit
//! exactly the limit (the capacity for buckets), hand no unit out twice, and leave the replicas
//! bit-identical.

use crate::common;

use std::sync::{Arc, Barrier};
use std::thread;

use common::{
    assert_replica_matches, future_base_ms, is_bucket, master_and_replica, reply6, send, Limit,
};
use redis::{Connection, Value};
use redis_ratelimit_core::algorithms::Algorithm;

/// The keys `<prefix>:<algorithm>`, one per algorithm.
fn keys(prefix: &str) -> Vec<String> {
    Algorithm::ALL
        .iter()
        .map(|a| format!("{prefix}:{}", a.name()))
        .collect()
}

/// Connections hammering the same keys at once.
const CONNECTIONS: usize = 8;
/// What one key admits at one instant: the limit of a window or a log, the capacity of a bucket.
const CAPACITY: u64 = 150;

/// One limit per algorithm; the buckets refill slowly (3 per second) but hold `CAPACITY`, so
/// admitting more than the capacity at one instant would show.
fn contention_limits() -> Vec<Limit> {
    Algorithm::ALL
        .iter()
        .map(|algorithm| {
            let algorithm = algorithm.name();
            if is_bucket(algorithm) {
                Limit::new(algorithm, 3, "1s", Some(CAPACITY))
            } else {
                Limit::new(algorithm, CAPACITY, "1s", None)
            }
        })
        .collect()
}

/// Exactly the capacity was admitted, each admitted reply left a distinct `remaining` (so no two
/// callers were handed the same unit), and every rejection says when to retry.
fn assert_exactly_capacity(limit: &Limit, replies: &[[i64; 6]]) {
    let capacity = limit.capacity() as i64;
    let admitted: Vec<&[i64; 6]> = replies.iter().filter(|r| r[0] == 1).collect();
    assert_eq!(
        admitted.len() as i64,
        capacity,
        "{}: admitted {} of {} at one instant (capacity {capacity})",
        limit.algorithm,
        admitted.len(),
        replies.len()
    );
    let mut remaining: Vec<i64> = admitted.iter().map(|r| r[2]).collect();
    remaining.sort_unstable();
    assert_eq!(
        remaining,
        (0..capacity).collect::<Vec<_>>(),
        "{}: remaining",
        limit.algorithm
    );
    for reply in replies {
        assert_eq!(
            reply[1], capacity,
            "{}: limit field {reply:?}",
            limit.algorithm
        );
        if reply[0] == 0 {
            assert_eq!(reply[2], 0, "{}: {reply:?}", limit.algorithm);
            assert!(reply[3] >= 1, "{}: retry_after {reply:?}", limit.algorithm);
        }
    }
}

/// Runs `per_connection` on `CONNECTIONS` connections to a master, released at once: CHECKs of
/// `limits[i]` on `keys[i]`, each reply answered with its `i`. One key per algorithm,
/// `<prefix>:<algorithm>`, with the limits of [`contention_limits`]. Asserts that each key admitted
/// exactly its capacity and that the replica ends up identical; returns the replies per limit.
fn contend(
    prefix: &str,
    per_connection: impl Fn(&mut Connection, &[Limit], &[String]) -> Vec<(usize, [i64; 6])>
        + Send
        + Sync
        + 'static,
) -> Vec<Vec<[i64; 6]>> {
    let (master, replica) = master_and_replica();
    let limits = Arc::new(contention_limits());
    let keys = Arc::new(keys(prefix));
    let barrier = Arc::new(Barrier::new(CONNECTIONS));
    let work = Arc::new(per_connection);
    let threads: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let mut con = master.client();
            let (barrier, work) = (Arc::clone(&barrier), Arc::clone(&work));
            let (limits, keys) = (Arc::clone(&limits), Arc::clone(&keys));
            thread::spawn(move || {
                barrier.wait();
                work(&mut con, &limits, &keys)
            })
        })
        .collect();
    let mut per_limit = vec![Vec::new(); limits.len()];
    for thread in threads {
        for (index, reply) in thread.join().expect("a contending connection panicked") {
            per_limit[index].push(reply);
        }
    }
    for (limit, replies) in limits.iter().zip(&per_limit) {
        assert_exactly_capacity(limit, replies);
    }
    assert_replica_matches(&master, &replica, &keys);
    per_limit
}

#[test]
fn pipelined_checks_from_many_connections_admit_exactly_the_capacity() {
    let at = future_base_ms() + 500;
    // Each connection pipelines 60 CHECKs per key, interleaving the keys: 8 x 60 = 480 > 150.
    let replies = contend("pipe", move |con, limits, keys| {
        let mut cmds = Vec::new();
        let mut index = Vec::new();
        for _ in 0..60 {
            for (i, limit) in limits.iter().enumerate() {
                cmds.push(limit.check(&keys[i], 1, Some(at)));
                index.push(i);
            }
        }
        let mut out = Vec::new();
        // Three pipelines per connection, so the connections' batches interleave in the server.
        for (chunk, chunk_index) in cmds.chunks(100).zip(index.chunks(100)) {
            for (value, i) in send(con, chunk).iter().zip(chunk_index) {
                out.push((*i, reply6(value)));
            }
        }
        out
    });
    for replies in &replies {
        assert_eq!(replies.len(), CONNECTIONS * 60);
    }
}

#[test]
fn checks_inside_multi_exec_admit_exactly_the_capacity() {
    let at = future_base_ms() + 700;
    // Each connection runs 4 transactions of 15 CHECKs per key: 8 x 60 = 480 per key.
    contend("multi", move |con, limits, keys| {
        let mut out = Vec::new();
        for _ in 0..4 {
            let mut pipe = redis::pipe();
            pipe.atomic();
            let mut index = Vec::new();
            for _ in 0..15 {
                for (i, limit) in limits.iter().enumerate() {
                    pipe.add_command(limit.check(&keys[i], 1, Some(at)));
                    index.push(i);
                }
            }
            let results: Vec<Value> = pipe.query(con).expect("MULTI/EXEC");
            assert_eq!(results.len(), index.len());
            out.extend(index.into_iter().zip(results.iter().map(reply6)));
        }
        out
    });
}

/// Calls `RATELIMIT.CHECK KEYS[1] ARGV[2..]` ARGV[1] times and returns every reply.
const LUA_CHECKS: &str = r#"
local replies = {}
for i = 1, tonumber(ARGV[1]) do
    replies[i] = redis.call('RATELIMIT.CHECK', KEYS[1], unpack(ARGV, 2))
end
return replies
"#;

#[test]
fn checks_from_lua_scripts_admit_exactly_the_capacity() {
    let at = future_base_ms() + 900;
    // Each connection pipelines 5 EVALs of 12 CHECKs per key: 8 x 60 = 480 per key.
    contend("lua", move |con, limits, keys| {
        let mut cmds = Vec::new();
        let mut index = Vec::new();
        for _ in 0..5 {
            for (i, limit) in limits.iter().enumerate() {
                let check = limit.check(&keys[i], 1, Some(at));
                let mut eval = redis::cmd("EVAL");
                eval.arg(LUA_CHECKS).arg(1).arg(&keys[i]).arg(12);
                for arg in check.args_iter().skip(2) {
                    if let redis::Arg::Simple(bytes) = arg {
                        eval.arg(bytes);
                    }
                }
                cmds.push(eval);
                index.push(i);
            }
        }
        let mut out = Vec::new();
        for (value, i) in send(con, &cmds).iter().zip(index) {
            let Value::Array(replies) = value else {
                panic!("EVAL: {value:?}");
            };
            assert_eq!(replies.len(), 12);
            out.extend(replies.iter().map(|reply| (i, reply6(reply))));
        }
        out
    });
}
