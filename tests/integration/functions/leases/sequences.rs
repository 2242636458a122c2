//! The library's leases against the module's on seeded random sequences (renewals with other
//! costs, releases, expiry, times going backwards and near 2^53, costs above the limit, limits
//! changing, many ids, long and binary ids) and on docs/algorithms.md's worked table.

use super::{acquire_args, duration_arg, lease_cmd, options, release_args, Engine};
use crate::common::rng::Rng;
use crate::common::{
    error_text, exists, future_base_ms, info_fields, info_int, lease_worked_examples, pexpiretime,
    send, send_one, show_value, try_reply6, MAX_AMOUNT, TIME_LIMIT_MS,
};
use crate::functions::engines::{
    both_engines, calls_per_algorithm, fcall, native, same_reply, seed,
};
use redis::{Connection, Value};
use std::fmt::Write as _;

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
