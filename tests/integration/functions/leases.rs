//! `ratelimit_acquire` and `ratelimit_release` answer as `RATELIMIT.ACQUIRE` and
//! `RATELIMIT.RELEASE`: on seeded random sequences (renewals with other costs, releases, expiry,
//! times going backwards and near 2^53, costs above the limit, limits changing, many ids, long
//! and binary ids), on docs/algorithms.md's worked table, in their errors; calls that change
//! nothing write nothing; racing clients never hold more than the limit; a key holds at most
//! 100000 live leases; what a lease costs in memory.

use std::fmt::Write as _;

use redis::{Cmd, Connection, Value};

use super::engines::{
    as_library_error, assert_same_error, both_engines, calls_per_algorithm, fcall, library_only,
    native, same_reply, seed, words,
};
use crate::common::rng::Rng;
use crate::common::{
    config_set, digest, error_text, exists, future_base_ms, info_fields, info_int, int,
    lease_worked_examples, pexpiretime, send, send_one, show_value, try_reply6, wait_replica_sync,
    Server, MAX_AMOUNT, TIME_LIMIT_MS,
};
use crate::leases::race;

/// The two engines.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Engine {
    Module,
    Library,
}

/// `RATELIMIT.<COMMAND> key args` or `FCALL ratelimit_<command> 1 key args` (binary arguments).
fn lease_cmd(engine: Engine, command: &str, key: &str, args: &[Vec<u8>]) -> Cmd {
    let mut cmd = match engine {
        Engine::Module => redis::cmd(&format!("RATELIMIT.{}", command.to_uppercase())),
        Engine::Library => {
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(format!("ratelimit_{command}")).arg(1);
            cmd
        }
    };
    cmd.arg(key);
    for arg in args {
        cmd.arg(arg.as_slice());
    }
    cmd
}

/// `limit duration ID id [COST n] [AT t]` as the module's tests spell it.
fn acquire_args(
    limit: u64,
    duration_ms: u64,
    id: &[u8],
    cost: u64,
    at: Option<u64>,
) -> Vec<Vec<u8>> {
    let mut args = vec![
        limit.to_string().into_bytes(),
        duration_ms.to_string().into_bytes(),
        b"ID".to_vec(),
        id.to_vec(),
        b"COST".to_vec(),
        cost.to_string().into_bytes(),
    ];
    if let Some(at) = at {
        args.extend([b"AT".to_vec(), at.to_string().into_bytes()]);
    }
    args
}

fn release_args(id: &[u8], at: Option<u64>) -> Vec<Vec<u8>> {
    let mut args = vec![b"ID".to_vec(), id.to_vec()];
    if let Some(at) = at {
        args.extend([b"AT".to_vec(), at.to_string().into_bytes()]);
    }
    args
}

/// The library's ACQUIRE and RELEASE with the module's test signatures (tests/integration/leases.rs).
fn library_acquire(key: &str, limit: u64, d: u64, id: &[u8], cost: u64, at: Option<u64>) -> Cmd {
    lease_cmd(
        Engine::Library,
        "acquire",
        key,
        &acquire_args(limit, d, id, cost, at),
    )
}

fn library_release(key: &str, id: &[u8], at: Option<u64>) -> Cmd {
    lease_cmd(Engine::Library, "release", key, &release_args(id, at))
}

/// `id`, `Id`, `ID`...: option names are case-insensitive.
fn spelled(rng: &mut Rng, word: &str) -> Vec<u8> {
    match rng.below(3) {
        0 => word.to_lowercase().into_bytes(),
        1 => word.to_uppercase().into_bytes(),
        _ => word
            .chars()
            .enumerate()
            .map(|(i, c)| {
                if i == 0 {
                    c.to_ascii_uppercase()
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect::<String>()
            .into_bytes(),
    }
}

/// A lease duration as clients write it: ms, or with a unit when it is a whole one.
fn duration_arg(rng: &mut Rng, ms: u64) -> Vec<u8> {
    let text = if ms % 1000 == 0 && rng.chance(40) {
        format!("{}{}", ms / 1000, if rng.chance(50) { "s" } else { "S" })
    } else if rng.chance(20) {
        format!("{ms}ms")
    } else {
        ms.to_string()
    };
    text.into_bytes()
}

/// Options in a random order, names in any case.
fn options(rng: &mut Rng, pairs: Vec<(&str, Vec<u8>)>) -> Vec<Vec<u8>> {
    let mut pairs = pairs;
    rng.shuffle(&mut pairs);
    pairs
        .into_iter()
        .flat_map(|(name, value)| [spelled(rng, name), value])
        .collect()
}

/// One call of a random sequence: the command and its arguments after the key.
struct Call {
    command: &'static str,
    args: Vec<Vec<u8>>,
}

/// A family of keys the sequences run on: their limits, durations, costs and ids.
struct Family {
    name: &'static str,
    keys: usize,
    limits: &'static [u64],
    durations: &'static [u64],
    ids: Vec<Vec<u8>>,
    /// The first time, and the steps forward (and sometimes back) from it.
    base: u64,
    /// At most this many calls per key.
    steps: usize,
    /// RESETs per 1000 calls.
    resets_per_mille: u64,
    /// ACQUIREs per 100 calls (the others RELEASEs).
    acquires: u64,
}

/// Ids that probe the layout: bytes 0x00 and 0xff, the longest, and ids spelled like the
/// key's own members and their prefixes.
fn tricky_ids() -> Vec<Vec<u8>> {
    vec![
        vec![0],
        vec![0xff],
        vec![0, 0xff, b'\r', b'\n'],
        vec![b'x'; 128],
        vec![0xff; 128],
        [vec![0u8; 127], vec![b'!']].concat(),
        b"!limit".to_vec(),
        b"!cost".to_vec(),
        b"!last".to_vec(),
        b"=a".to_vec(),
        b"+a".to_vec(),
        b"#a".to_vec(),
        b"a".to_vec(),
        b" ".to_vec(),
    ]
}

/// Random calls for one key of `family`, each at its own time: acquires (renewals with other
/// costs, costs above the limit, limits and durations changing), releases, now and then a RESET,
/// times mostly going forward, sometimes back, sometimes jumping past every lease.
fn random_calls(rng: &mut Rng, family: &Family) -> Vec<Call> {
    let mut now = family.base;
    let mut calls = Vec::with_capacity(family.steps);
    for _ in 0..family.steps {
        now = match rng.below(100) {
            0..=2 => now + rng.range(3_000, 30_000),
            3..=5 => now.saturating_sub(rng.range(1_000, 5_000)).max(family.base),
            _ => (now + rng.range(0, 900))
                .saturating_sub(300)
                .max(family.base),
        };
        let id = rng.pick_ref(&family.ids).clone();
        let at = now.to_string().into_bytes();
        if rng.below(1000) < family.resets_per_mille {
            calls.push(Call {
                command: "reset",
                args: vec![],
            });
            continue;
        }
        let call = match rng.below(100) {
            n if n < family.acquires => {
                let limit = rng.pick(family.limits);
                let cost = match rng.below(100) {
                    0..=79 => rng.range(1, 4),
                    80..=89 => (limit + rng.range(1, 3)).min(MAX_AMOUNT),
                    90..=94 => MAX_AMOUNT,
                    _ => rng.range(1, limit.clamp(1, 1000) + 1),
                };
                let ms = rng.pick(family.durations);
                let mut pairs = vec![("ID", id), ("AT", at)];
                if cost != 1 || rng.chance(50) {
                    pairs.push(("COST", cost.to_string().into_bytes()));
                }
                let mut args = vec![limit.to_string().into_bytes(), duration_arg(rng, ms)];
                args.extend(options(rng, pairs));
                Call {
                    command: "acquire",
                    args,
                }
            }
            _ => Call {
                command: "release",
                args: options(rng, vec![("ID", id), ("AT", at)]),
            },
        };
        calls.push(call);
    }
    calls
}

/// The calls on both engines (the module on `n:<key>`, the library on `f:<key>`), each followed
/// by both keys' PEXPIRETIME, EXISTS and INFO: eight replies a call.
fn run_calls(con: &mut Connection, key: &str, calls: &[Call]) -> Vec<Value> {
    let (nkey, fkey) = (format!("n:{key}"), format!("f:{key}"));
    let mut cmds = Vec::with_capacity(calls.len() * 8);
    for call in calls {
        cmds.push(lease_cmd(Engine::Module, call.command, &nkey, &call.args));
        cmds.push(lease_cmd(Engine::Library, call.command, &fkey, &call.args));
        for command in ["PEXPIRETIME", "EXISTS"] {
            cmds.push(redis::cmd(command).arg(&nkey).clone());
            cmds.push(redis::cmd(command).arg(&fkey).clone());
        }
        cmds.push(native("info", &[&nkey], &[]));
        cmds.push(fcall("info", &[&fkey], &[]));
    }
    let mut replies = Vec::with_capacity(cmds.len());
    for chunk in cmds.chunks(4000) {
        replies.extend(send(con, chunk));
    }
    replies
}

/// What the sequences covered, each required at least once.
#[derive(Debug, Default)]
struct Seen {
    admitted: usize,
    rejected_with_retry: usize,
    rejected_never: usize,
    released: usize,
    released_nothing: usize,
    emptied_by_release: usize,
    /// The most live leases one key held (INFO's `leases`).
    most_leases: i64,
}

impl Seen {
    fn count(&mut self, call: &Call, reply: &Value, emptied: bool) {
        if let Some(r) = try_reply6(reply) {
            match (r[0], r[3]) {
                (1, _) => self.admitted += 1,
                (_, -1) => self.rejected_never += 1,
                _ => self.rejected_with_retry += 1,
            }
        } else if call.command == "release" {
            match reply {
                Value::Int(1) if emptied => self.emptied_by_release += 1,
                Value::Int(1) => self.released += 1,
                _ => self.released_nothing += 1,
            }
        }
    }
}

/// The calls and both engines' replies up to `upto`, as redis-cli lines.
fn describe(key: &str, calls: &[Call], replies: &[Value], upto: usize) -> String {
    let mut out = String::new();
    for (call, r) in calls.iter().zip(replies.chunks_exact(8)).take(upto + 1) {
        let args: Vec<String> = call
            .args
            .iter()
            .map(|a| a.escape_ascii().to_string())
            .collect();
        let args = args.join(" ");
        let _ = writeln!(
            out,
            "  RATELIMIT.{} n:{key} {args}\n    -> {} expires {} exists {}",
            call.command.to_uppercase(),
            show_value(&r[0]),
            show_value(&r[2]),
            show_value(&r[4]),
        );
        let _ = writeln!(
            out,
            "  FCALL ratelimit_{} 1 f:{key} {args}\n    -> {} expires {} exists {}",
            call.command,
            show_value(&r[1]),
            show_value(&r[3]),
            show_value(&r[5]),
        );
    }
    out
}

#[test]
fn leases_answer_as_the_module_on_random_sequences() {
    let (_server, mut con) = both_engines();
    let mut rng = Rng::with_stream(seed(), 2500);
    let base = future_base_ms();
    let steps = calls_per_algorithm() / 2;
    let mut crowd: Vec<Vec<u8>> = (0..300).map(|i| format!("job-{i}").into_bytes()).collect();
    crowd.extend(tricky_ids());
    let families = [
        // A few ids contending for small limits: rejections, renewals, retry walks.
        Family {
            name: "small",
            keys: 4,
            limits: &[1, 2, 3, 5, 8],
            durations: &[1, 50, 300, 1000, 2500],
            ids: [
                tricky_ids(),
                (0..6).map(|i| format!("req-{i}").into_bytes()).collect(),
            ]
            .concat(),
            base,
            steps,
            resets_per_mille: 20,
            acquires: 64,
        },
        // Hundreds of ids on one key (a sorted set past its small encoding), long retry walks.
        Family {
            name: "crowd",
            keys: 2,
            limits: &[200, MAX_AMOUNT, MAX_AMOUNT, MAX_AMOUNT],
            durations: &[1000, 60_000, 600_000, 3_600_000],
            ids: crowd,
            base,
            steps,
            resets_per_mille: 1,
            acquires: 85,
        },
        // Just below 2^53 (the library's bound: every expiry below it).
        Family {
            name: "top",
            keys: 1,
            limits: &[1, 3, 8],
            durations: &[1, 300, 2500],
            ids: tricky_ids(),
            base: TIME_LIMIT_MS - 40_000_000,
            steps: steps / 4,
            resets_per_mille: 20,
            acquires: 64,
        },
    ];
    let mut seen = Seen::default();
    for family in &families {
        for k in 0..family.keys {
            let key = format!("{}:{k}", family.name);
            let calls = random_calls(&mut rng, family);
            let replies = run_calls(&mut con, &key, &calls);
            let mut existed = false;
            for (i, (call, r)) in calls.iter().zip(replies.chunks_exact(8)).enumerate() {
                let what = if !same_reply(&r[0], &r[1]) {
                    "the replies differ"
                } else if r[2] != r[3] {
                    "PEXPIRETIME differs"
                } else if r[4] != r[5] {
                    "EXISTS differs"
                } else if r[6] != r[7] {
                    "INFO differs"
                } else {
                    ""
                };
                if !what.is_empty() {
                    panic!(
                        "{key}, call {i}: {what} (INFO module {} library {}; seed {:#x})\n{}",
                        show_value(&r[6]),
                        show_value(&r[7]),
                        seed(),
                        describe(&key, &calls, &replies, i)
                    );
                }
                // Every error the library gives is the module's: none expected here.
                assert!(
                    error_text(&r[1]).is_none(),
                    "{key}, call {i}: {}",
                    show_value(&r[1])
                );
                let exists_now = r[5] == Value::Int(1);
                seen.count(call, &r[1], existed && !exists_now);
                existed = exists_now;
                if let Some(info) = info_fields(&r[7]) {
                    seen.most_leases = seen.most_leases.max(info_int(&info, "leases"));
                }
            }
        }
    }
    eprintln!("leases sequences: {seen:?}");
    assert!(
        seen.admitted > 100
            && seen.rejected_with_retry > 50
            && seen.rejected_never > 20
            && seen.released > 50
            && seen.released_nothing > 50
            && seen.emptied_by_release > 5,
        "{seen:?}"
    );
    assert!(seen.most_leases > 150, "{seen:?}");
}

/// docs/algorithms.md's Concurrency table, row by row, on both engines.
#[test]
fn the_worked_table_of_the_concurrency_section() {
    let (_server, mut con) = both_engines();
    let (limit, duration, rows) = lease_worked_examples();
    assert!(rows.len() >= 10, "{} rows", rows.len());
    let t = future_base_ms();
    for row in &rows {
        let at = Some(t + row.at);
        let args = match row.command.as_str() {
            "ACQUIRE" => acquire_args(limit, duration, row.id.as_bytes(), row.cost.unwrap(), at),
            _ => release_args(row.id.as_bytes(), at),
        };
        let command = row.command.to_lowercase();
        for (engine, key) in [(Engine::Module, "n"), (Engine::Library, "f")] {
            let reply = send_one(&mut con, &lease_cmd(engine, &command, key, &args));
            let got: Vec<i64> = match &reply {
                Value::Int(n) => vec![*n],
                other => try_reply6(other)
                    .unwrap_or_else(|| panic!("{}: {}", row.command, show_value(other)))
                    .to_vec(),
            };
            assert_eq!(
                got, row.reply,
                "{key}: {} {} at {}",
                row.command, row.id, row.at
            );
        }
        assert_eq!(
            pexpiretime(&mut con, "n"),
            pexpiretime(&mut con, "f"),
            "at {}",
            row.at
        );
    }
    // The table ends with the last lease released.
    assert!(!exists(&mut con, "f") && !exists(&mut con, "n"));
}

/// A rejected ACQUIRE (full, a renewal that does not fit, a cost above the limit), a RELEASE of
/// nothing (an unknown id, an expired lease, a missing key), INFO and every error change
/// nothing: the dirty counter, the value and the expiry stay as they were, on the master and on
/// its replica. The admitted calls do write.
#[test]
fn calls_that_change_nothing_write_nothing() {
    let (server, mut con) = library_only(Server::builder());
    let replica = Server::builder().no_module().start();
    replica.replica_of(&server);
    let t = future_base_ms();
    let dirty = |server: &Server| server.info_field("persistence", "rdb_changes_since_last_save");
    let before = dirty(&server);
    for (id, cost, at) in [("a", 1, t), ("b", 2, t + 10), ("c", 3, t + 20)] {
        let reply = send_one(
            &mut con,
            &library_acquire("q", 6, 60_000, id.as_bytes(), cost, Some(at)),
        );
        assert_eq!(
            try_reply6(&reply).map(|r| r[0]),
            Some(1),
            "{}",
            show_value(&reply)
        );
    }
    // One that expires: at t + 100 it holds nothing, and stays stored until a write.
    send_one(
        &mut con,
        &library_acquire("q", 7, 50, b"e", 1, Some(t + 30)),
    );
    assert_ne!(dirty(&server), before, "admitted acquires write");
    send_one(&mut con, &redis::cmd("SET").arg(&["tb", "x"]).clone());
    let state = |con: &mut Connection| {
        send(
            con,
            &[
                redis::cmd("DUMP").arg("q").clone(),
                redis::cmd("PEXPIRETIME").arg("q").clone(),
                redis::cmd("ZCARD").arg("q").clone(),
            ],
        )
    };
    let (dirty0, state0) = (dirty(&server), state(&mut con));
    let at = Some(t + 100);
    let mut calls = vec![
        library_acquire("q", 6, 60_000, b"d", 1, at),
        library_acquire("q", 6, 60_000, b"a", 2, at),
        library_acquire("q", 6, 60_000, b"d", 7, at),
        library_acquire("q", 2, 60_000, b"d", 1, at),
        library_acquire("q", 6, 60_000, b"b", 5, at),
        library_release("q", b"nobody", at),
        library_release("q", b"e", at),
        library_release("missing", b"a", at),
        library_release("q", b"a", Some(t + 70_000)),
        fcall("info", &["q"], &[]),
        fcall("info", &["missing"], &[]),
        lease_cmd(
            Engine::Library,
            "acquire",
            "q",
            &[b"6".to_vec(), b"1s".to_vec()],
        ),
        lease_cmd(
            Engine::Library,
            "acquire",
            "q",
            &acquire_args(6, 1000, b"", 1, at),
        ),
        lease_cmd(
            Engine::Library,
            "acquire",
            "q",
            &acquire_args(6, 1000, b"z", 0, at),
        ),
        lease_cmd(Engine::Library, "release", "q", &[b"ID".to_vec()]),
        lease_cmd(
            Engine::Library,
            "acquire",
            "tb",
            &acquire_args(6, 1000, b"z", 1, at),
        ),
        lease_cmd(Engine::Library, "release", "tb", &release_args(b"z", at)),
        fcall("check", &["q"], &words("token-bucket 5 1s")),
        fcall("peek", &["q"], &words("token-bucket 5 1s")),
        fcall("refund", &["q"], &words("token-bucket 5 1s COST 1")),
        fcall("check", &["q"], &words("concurrency 5 1s")),
    ];
    calls.push(library_acquire(
        "q",
        6,
        60_000,
        b"late",
        1,
        Some(TIME_LIMIT_MS - 1),
    ));
    let replies = send(&mut con, &calls);
    let rejected = replies
        .iter()
        .filter(|r| try_reply6(r).is_some_and(|r| r[0] == 0))
        .count();
    let zeros = replies.iter().filter(|r| **r == Value::Int(0)).count();
    let errors = replies.iter().filter(|r| error_text(r).is_some()).count();
    assert_eq!((rejected, zeros, errors), (5, 4, 11), "{replies:?}");
    assert_eq!((dirty(&server), state(&mut con)), (dirty0, state0.clone()));
    wait_replica_sync(&server, &replica);
    assert_eq!(
        state(&mut replica.client()),
        state0,
        "the replica holds the same"
    );
    // A release that does release drops the expired lease with it.
    assert_eq!(
        send_one(&mut con, &library_release("q", b"a", at)),
        Value::Int(1)
    );
    assert_eq!(
        int(&mut con, redis::cmd("ZCOUNT").arg(&["q", "0", "+inf"])),
        2
    );
    wait_replica_sync(&server, &replica);
    assert_eq!(digest(&mut con, "q"), digest(&mut replica.client(), "q"));
}

/// Rate-limit functions on a lease key, lease functions on a rate key and `concurrency` named as
/// an algorithm answer the module's errors; other types and forged sorted sets are WRONGTYPE;
/// RESET removes a lease key.
#[test]
fn lease_keys_and_rate_keys_refuse_each_others_calls() {
    let (_server, mut con) = both_engines();
    let t = future_base_ms();
    let setup = [
        lease_cmd(
            Engine::Module,
            "acquire",
            "lease",
            &acquire_args(3, 60_000, b"a", 1, Some(t)),
        ),
        lease_cmd(
            Engine::Library,
            "acquire",
            "f:lease",
            &acquire_args(3, 60_000, b"a", 1, Some(t)),
        ),
        native("check", &["rate"], &words("sliding-log 5 1h")),
        fcall("check", &["f:rate"], &words("sliding-log 5 1h")),
        redis::cmd("HSET").arg(&["hash", "f", "v"]).clone(),
        redis::cmd("SET").arg(&["plain", "hello"]).clone(),
        redis::cmd("ZADD").arg(&["zset", "1", "=a"]).clone(),
        // A sorted set with some of a lease key's fields, or one out of range.
        redis::cmd("ZADD")
            .arg(&["forged", "-3", "!limit", "-1000", "!lease_ms", "5", "=a"])
            .clone(),
        redis::cmd("ZADD")
            .arg(&[
                "forged2",
                "-3",
                "!limit",
                "-1000",
                "!lease_ms",
                "-1",
                "!last",
                "5",
                "!cost",
            ])
            .clone(),
    ];
    assert!(send(&mut con, &setup)
        .iter()
        .all(|r| error_text(r).is_none()));
    let lease_args = acquire_args(3, 60_000, b"b", 1, Some(t));
    let mut pairs: Vec<(Cmd, Cmd, String)> = Vec::new();
    for (command, args) in [
        ("check", "token-bucket 3 1s"),
        ("peek", "sliding-log 3 1s COST 0"),
        ("refund", "fixed-window 3 1s COST 1"),
        ("check", "concurrency 3 1s"),
        ("peek", "CONCURRENCY 3 1s BURST 5"),
        ("check", "concurrency 0 1s"),
        ("check", "concurrency 3 0"),
        ("refund", "concurrency 3 1s COST 1"),
    ] {
        pairs.push((
            native(command, &["lease"], &words(args)),
            fcall(command, &["f:lease"], &words(args)),
            format!("{command} {args}"),
        ));
    }
    for (keys, args) in [
        (["rate", "lease"], "sliding-log 5 1h token-bucket 3 1s"),
        (["lease", "rate"], "token-bucket 3 1s sliding-log 5 1h"),
    ] {
        let fkeys: Vec<String> = keys.iter().map(|k| format!("f:{k}")).collect();
        let fkeys: Vec<&str> = fkeys.iter().map(String::as_str).collect();
        pairs.push((
            native("checkall", &keys, &words(args)),
            fcall("checkall", &fkeys, &words(args)),
            format!("checkall {keys:?} {args}"),
        ));
    }
    // The error names the key: the same (missing) keys on both.
    let args = words("sliding-log 5 1h concurrency 3 1s");
    pairs.push((
        native("checkall", &["a", "b"], &args),
        fcall("checkall", &["a", "b"], &args),
        "checkall naming concurrency".to_string(),
    ));
    for (command, args) in [
        ("acquire", lease_args.clone()),
        ("release", release_args(b"a", None)),
    ] {
        pairs.push((
            lease_cmd(Engine::Module, command, "rate", &args),
            lease_cmd(Engine::Library, command, "f:rate", &args),
            format!("{command} on a sliding log"),
        ));
    }
    for (module, library, what) in pairs {
        assert_same_error(&mut con, module, library, &what);
    }
    const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
    for key in ["hash", "plain", "zset", "forged", "forged2", "lease"] {
        for cmd in [
            lease_cmd(Engine::Library, "acquire", key, &lease_args),
            lease_cmd(Engine::Library, "release", key, &release_args(b"a", None)),
            fcall("info", &[key], &[]),
            fcall("check", &[key], &words("token-bucket 3 1s")),
            fcall("reset", &["f:lease", key], &[]),
        ] {
            assert_eq!(
                error_text(&send_one(&mut con, &cmd)).as_deref(),
                Some(WRONGTYPE),
                "{key}: {}",
                crate::common::show_cmd(&cmd)
            );
        }
    }
    // The module does not read the library's lease key.
    for cmd in [
        lease_cmd(Engine::Module, "acquire", "f:lease", &lease_args),
        lease_cmd(
            Engine::Module,
            "release",
            "f:lease",
            &release_args(b"a", None),
        ),
        native("info", &["f:lease"], &[]),
    ] {
        assert_eq!(
            error_text(&send_one(&mut con, &cmd)).as_deref(),
            Some(WRONGTYPE)
        );
    }
    // RESET removes lease keys on both engines, a key named twice once.
    assert_eq!(
        send_one(&mut con, &native("reset", &["lease", "lease", "rate"], &[])),
        Value::Int(2)
    );
    assert_eq!(
        send_one(
            &mut con,
            &fcall("reset", &["f:lease", "f:lease", "f:rate"], &[])
        ),
        Value::Int(2)
    );
    assert!(!exists(&mut con, "f:lease"));
}

#[test]
fn every_bad_lease_argument_gets_the_modules_message() {
    let (_server, mut con) = both_engines();
    let acquire_vectors = [
        "",
        "3",
        "3 1s",
        "3 1s ID",
        "0 1s ID a",
        "1000000000001 1s ID a",
        "-1 1s ID a",
        "x 1s ID a",
        "3 0 ID a",
        "3 0s ID a",
        "3 3651d ID a",
        "3 1w ID a",
        "3 1.5s ID a",
        "3 -1s ID a",
        "3 1 minute ID a",
        "3 1s COST 1",
        "3 1s AT 5 COST 2",
        "3 1s ID a ID b",
        "3 1s id a Id b",
        "3 1s ID a COST 0",
        "3 1s ID a COST -1",
        "3 1s ID a COST 1000000000001",
        "3 1s ID a COST x",
        "3 1s ID a COST",
        "3 1s ID a COST 1 COST 2",
        "3 1s ID a AT",
        "3 1s ID a AT 9007199254740992",
        "3 1s ID a AT 1e3",
        "3 1s ID a AT 1 AT 2",
        "3 1s ID a BURST 1",
        "3 1s ID a BLOCK 1s",
        "3 1s ID a SHADOW",
        "3 1s ID a COST 1 AT 5 ID b COST 3 AT 6",
        "3 1s ID a COST 1 AT 5 ID b COST 3 AT 6 EXTRA",
        "3 1s yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy a",
        "3 1s a\u{1}\u{ff}b 1",
        "token-bucket 3 1s ID a",
    ];
    let long_id = vec![b'x'; 129];
    for args in [
        acquire_args(3, 1000, &long_id, 1, None),
        vec![b"3".to_vec(), b"1s".to_vec(), b"ID".to_vec(), vec![]],
    ] {
        assert_same_error(
            &mut con,
            lease_cmd(Engine::Module, "acquire", "k", &args),
            lease_cmd(Engine::Library, "acquire", "k", &args),
            "acquire: an id of no accepted length",
        );
    }
    let release_vectors = [
        "",
        "ID",
        "AT 5",
        "ID a COST 1",
        "ID a AT",
        "ID a AT x",
        "ID a AT 9007199254740992",
        "ID a ID b",
        "ID a FOO",
        "ID a AT 5 FOO",
        "ID a AT 5 FOO bar",
        "ID a AT 5 ID b",
        "ID a AT 5 AT 6",
        "AT 5 ID a AT 6 ID b",
    ];
    for (verb, vectors) in [
        ("acquire", &acquire_vectors[..]),
        ("release", &release_vectors),
    ] {
        for line in vectors {
            let args: Vec<Vec<u8>> = words(line).into_iter().map(String::into_bytes).collect();
            assert_same_error(
                &mut con,
                lease_cmd(Engine::Module, verb, "k", &args),
                lease_cmd(Engine::Library, verb, "k", &args),
                &format!("{verb} k {line}"),
            );
        }
    }
    assert_eq!(crate::common::dbsize(&mut con), 0, "an error created a key");

    // The library's own: no policies, its exact range, FCALL's key count.
    let policy = "ERR the ratelimit functions library has no policies: give the limit as limit \
                  lease-duration (see docs/functions.md)";
    let lua_only = [
        (
            lease_cmd(
                Engine::Library,
                "acquire",
                "k",
                &bytes_of("POLICY jobs ID a"),
            ),
            policy,
        ),
        (
            lease_cmd(Engine::Library, "acquire", "k", &bytes_of("policy jobs")),
            policy,
        ),
        (
            library_acquire("k", 3, 1000, b"a", 1, Some(TIME_LIMIT_MS - 1000)),
            "ERR AT (or the key's last write, if later) plus lease-duration must be below 2^53",
        ),
        (
            fcall("acquire", &[], &words("3 1s ID a")),
            "ERR ratelimit_acquire takes exactly one key",
        ),
        (
            fcall("release", &["a", "b"], &words("ID a")),
            "ERR ratelimit_release takes exactly one key",
        ),
    ];
    for (cmd, prefix) in lua_only {
        let error = error_text(&send_one(&mut con, &cmd)).unwrap_or_default();
        assert!(
            error.starts_with(prefix),
            "{}: {error}",
            crate::common::show_cmd(&cmd)
        );
    }
    // Just below the bound is fine, and a later call on that key is held to the key's time.
    let reply = send_one(
        &mut con,
        &library_acquire("k", 3, 1000, b"a", 1, Some(TIME_LIMIT_MS - 1001)),
    );
    assert_eq!(try_reply6(&reply), Some([1, 3, 2, 0, 1000, 0]));
    let error = error_text(&send_one(
        &mut con,
        &library_acquire("k", 3, 1001, b"b", 1, Some(5)),
    ));
    assert!(error.is_some_and(|e| e.contains("below 2^53")));
}

fn bytes_of(line: &str) -> Vec<Vec<u8>> {
    words(line).into_iter().map(String::into_bytes).collect()
}

#[test]
fn racing_clients_never_hold_more_than_the_limit() {
    let (server, _con) = library_only(Server::builder());
    race(&server, library_acquire, library_release);
}

/// MULTI/EXEC admits exactly the limit; over `maxmemory` acquire is refused with OOM and
/// changes nothing while release (declared `allow-oom`, as the module's RELEASE runs over
/// maxmemory) gives leases back; the function flags say so.
#[test]
fn multi_maxmemory_and_flags() {
    let (_server, mut con) =
        library_only(Server::builder().config(&[("maxmemory-policy", "noeviction")]));
    let t = future_base_ms();
    let mut pipe = redis::pipe();
    pipe.atomic();
    for i in 0..4 {
        pipe.add_command(library_acquire(
            "m",
            3,
            60_000,
            format!("r{i}").as_bytes(),
            1,
            Some(t),
        ));
    }
    let replies: Vec<Vec<i64>> = pipe.query(&mut con).expect("EXEC");
    assert_eq!(
        replies.iter().map(|r| r[0]).collect::<Vec<_>>(),
        [1, 1, 1, 0]
    );
    let before = (digest(&mut con, "m"), pexpiretime(&mut con, "m"));
    config_set(&mut con, "maxmemory", "1").unwrap();
    for cmd in [
        library_acquire("m", 3, 60_000, b"r0", 1, Some(t + 1)),
        library_acquire("fresh", 3, 60_000, b"r0", 1, Some(t)),
    ] {
        let error = error_text(&send_one(&mut con, &cmd)).expect("OOM");
        assert!(error.starts_with("OOM"), "{error}");
    }
    assert_eq!((digest(&mut con, "m"), pexpiretime(&mut con, "m")), before);
    assert!(matches!(
        send_one(&mut con, &fcall("info", &["m"], &[])),
        Value::Array(_)
    ));
    assert_eq!(
        send_one(&mut con, &library_release("m", b"r1", Some(t + 2))),
        Value::Int(1)
    );
    config_set(&mut con, "maxmemory", "0").unwrap();
    let listed = send_one(
        &mut con,
        redis::cmd("FUNCTION").arg(&["LIST", "LIBRARYNAME", "ratelimit"]),
    );
    assert_eq!(
        function_flags(&listed, "ratelimit_acquire"),
        Vec::<String>::new()
    );
    assert_eq!(function_flags(&listed, "ratelimit_release"), ["allow-oom"]);
}

/// `field` of a RESP2 field/value list.
fn field<'a>(pairs: &'a Value, name: &str) -> Option<&'a Value> {
    let Value::Array(items) = pairs else {
        return None;
    };
    items
        .chunks_exact(2)
        .find(|pair| show_value(&pair[0]) == name)
        .map(|pair| &pair[1])
}

/// A function's flags in a `FUNCTION LIST` reply.
fn function_flags(listed: &Value, function: &str) -> Vec<String> {
    let Value::Array(libraries) = listed else {
        panic!("FUNCTION LIST: {}", show_value(listed))
    };
    let Some(Value::Array(functions)) = field(&libraries[0], "functions") else {
        panic!("no functions: {}", show_value(listed))
    };
    let found = functions
        .iter()
        .find(|f| field(f, "name").is_some_and(|n| show_value(n) == function))
        .unwrap_or_else(|| panic!("no {function}"));
    match field(found, "flags") {
        Some(Value::Array(flags)) => flags.iter().map(show_value).collect(),
        other => panic!("flags: {other:?}"),
    }
}

/// `MEMORY USAGE` per lease of a 16-byte id (printed with `--nocapture`, the module's beside it),
/// and the bound: a key holds at most 100000 live leases; a new one past it is an error, a
/// renewal is not, and one expired makes room.
#[test]
fn a_key_holds_at_most_100000_leases_and_what_a_lease_costs() {
    const LEASES: u64 = 100_000;
    let (_server, mut con) = both_engines();
    let t = future_base_ms();
    let id = |i: u64| format!("{i:016}");
    let fill = |con: &mut Connection, engine: Engine, key: &str, from: u64, to: u64| {
        for chunk in (from..to).collect::<Vec<u64>>().chunks(5_000) {
            let cmds: Vec<Cmd> = chunk
                .iter()
                .map(|&i| {
                    // The first lease expires first, after a day; the others a day later.
                    let d = if i == 0 { 86_400_000 } else { 2 * 86_400_000 };
                    let args = acquire_args(MAX_AMOUNT, d, id(i).as_bytes(), 1, Some(t));
                    lease_cmd(engine, "acquire", key, &args)
                })
                .collect();
            for reply in send(con, &cmds) {
                assert_eq!(
                    try_reply6(&reply).map(|r| r[0]),
                    Some(1),
                    "{}",
                    show_value(&reply)
                );
            }
        }
    };
    let usage = |con: &mut Connection, key: &str| -> i64 {
        int(
            con,
            redis::cmd("MEMORY").arg(&["USAGE", key, "SAMPLES", "0"]),
        )
    };
    let started = std::time::Instant::now();
    fill(&mut con, Engine::Library, "one", 0, 1);
    fill(&mut con, Engine::Library, "many", 0, LEASES);
    let filled = started.elapsed();
    fill(&mut con, Engine::Module, "n:one", 0, 1);
    fill(&mut con, Engine::Module, "n:many", 0, 20_000);
    let per_lease = |con: &mut Connection, many: &str, one: &str, n: u64| {
        (usage(con, many) - usage(con, one)) as f64 / (n - 1) as f64
    };
    let library = per_lease(&mut con, "many", "one", LEASES);
    let module = per_lease(&mut con, "n:many", "n:one", 20_000);
    println!(
        "MEMORY USAGE per lease of a 16-byte id: library {library:.1} B, module {module:.1} B; \
         one lease: library {} B, module {} B; {LEASES} acquires in {filled:.2?}",
        usage(&mut con, "one"),
        usage(&mut con, "n:one"),
    );
    // A sorted set member: the id and its prefix byte, a skiplist node, a hash table entry.
    assert!(library < 16.0 + 110.0, "{library} B per lease");
    // Full: a new lease is an error, and writes nothing.
    let before = (digest(&mut con, "many"), pexpiretime(&mut con, "many"));
    let error = error_text(&send_one(
        &mut con,
        &library_acquire("many", MAX_AMOUNT, 1000, b"new", 1, Some(t)),
    ));
    assert_eq!(
        error.as_deref(),
        Some("ERR key holds ratelimit.max-leases (100000) live leases: release some (ratelimit_release)")
    );
    assert_eq!(
        (digest(&mut con, "many"), pexpiretime(&mut con, "many")),
        before
    );
    // The module's text up to the advice to raise its config, which the library has not.
    let module_error = config_set(&mut con, "ratelimit.max-leases", "1")
        .ok()
        .and_then(|()| {
            error_text(&send_one(
                &mut con,
                &lease_cmd(
                    Engine::Module,
                    "acquire",
                    "n:one",
                    &acquire_args(3, 1000, b"x", 1, Some(t)),
                ),
            ))
        })
        .expect("the module's error");
    let library_error = error.unwrap();
    assert_eq!(
        as_library_error(&module_error).replace("(1)", "(100000)"),
        format!("{library_error}, or raise it")
    );
    // A renewal is no new lease; the release of one makes room, and so does an expired one.
    let renewed = send_one(
        &mut con,
        &library_acquire(
            "many",
            MAX_AMOUNT,
            2 * 86_400_000,
            id(7).as_bytes(),
            3,
            Some(t + 5),
        ),
    );
    assert_eq!(try_reply6(&renewed).map(|r| r[0]), Some(1));
    assert_eq!(
        send_one(
            &mut con,
            &library_release("many", id(8).as_bytes(), Some(t + 5))
        ),
        Value::Int(1)
    );
    let admitted = send_one(
        &mut con,
        &library_acquire("many", MAX_AMOUNT, 1000, b"new", 1, Some(t + 5)),
    );
    assert_eq!(try_reply6(&admitted).map(|r| r[0]), Some(1));
    let refused = send_one(
        &mut con,
        &library_acquire("many", MAX_AMOUNT, 1000, b"new2", 1, Some(t + 5)),
    );
    assert!(error_text(&refused).is_some(), "{}", show_value(&refused));
    // Lease 0 expires a day after t: then there is room for one more.
    let later = t + 86_400_000;
    let admitted = send_one(
        &mut con,
        &library_acquire("many", MAX_AMOUNT, 1000, b"new2", 1, Some(later)),
    );
    assert_eq!(
        try_reply6(&admitted).map(|r| r[0]),
        Some(1),
        "{}",
        show_value(&admitted)
    );
    // Lease 0 and `new` expired, `new2` taken: ids 1 to 99999 but 8 (7 holding 3), and `new2`.
    let info = info_fields(&send_one(&mut con, &fcall("info", &["many"], &[]))).unwrap();
    assert_eq!(info_int(&info, "leases"), LEASES as i64 - 1);
    assert_eq!(info_int(&info, "held"), LEASES as i64 + 1);
}
