//! Under memcheck: the data type's callbacks. DUMP/RESTORE round trips and corrupt payloads with a
//! valid CRC (most reach the module's rdb_load), APPLY payloads (its other decoder), COPY, RENAME,
//! MOVE, SWAPDB, MEMORY USAGE, digests, DEBUG RELOAD and expiry.

use std::thread;
use std::time::Duration;

use redis::{Connection, Value};
use redis_ratelimit_core::algorithms::Algorithm;

use super::{assert_alive, assert_info, populate, HOUR_MS};
use crate::common::dump::{restore, with_crc, Dump};
use crate::common::rng::Rng;
use crate::common::{
    cmd_line, config_set, digests, exists, future_base_ms, int, is_error, run, send_one, six,
    Server,
};

/// Six copies of `bytes` with one random bit flipped each.
fn bit_flips(bytes: &[u8], rng: &mut Rng) -> Vec<Vec<u8>> {
    (0..6)
        .map(|_| {
            let mut m = bytes.to_vec();
            let at = rng.index(m.len());
            m[at] ^= 1 << rng.below(8);
            m
        })
        .collect()
}

/// Corrupt variants of a limiter encoding: bit flips, random bytes, truncations, extensions,
/// and fields set to extremes (every 8-byte field after the algorithm byte).
fn corrupt_limiters(limiter: &[u8], rng: &mut Rng) -> Vec<Vec<u8>> {
    let mut out = bit_flips(limiter, rng);
    for _ in 0..3 {
        let mut m = limiter.to_vec();
        let at = rng.index(m.len());
        m[at] = rng.next() as u8;
        out.push(m);
    }
    // The algorithm byte: every other algorithm and an unknown one.
    for algorithm in [0u8, 1, 2, 3, 4, 5, 0xff] {
        if algorithm != limiter[0] {
            let mut m = limiter.to_vec();
            m[0] = algorithm;
            out.push(m);
        }
    }
    // Fields at extremes: 0, all ones, 2^53, one above the accepted bounds.
    let mut field = 1;
    while field + 8 <= limiter.len() && field <= 1 + 8 * 9 {
        for value in [0u64, u64::MAX, 1 << 53, 1_000_000_000_001] {
            let mut m = limiter.to_vec();
            m[field..field + 8].copy_from_slice(&value.to_le_bytes());
            out.push(m);
        }
        field += 8;
    }
    // Truncated (to nothing, one byte, mid-field, one byte short) and extended.
    for len in [0, 1, 9, limiter.len() / 2, limiter.len() - 1] {
        out.push(limiter[..len].to_vec());
    }
    for extra in [1, 8, 16, 200] {
        let mut m = limiter.to_vec();
        m.extend((0..extra).map(|_| rng.next() as u8));
        out.push(m);
    }
    out
}

/// Corrupt variants of a whole DUMP payload body (framing included), CRC fixed afterwards.
fn corrupt_bodies(body: &[u8], rng: &mut Rng) -> Vec<Vec<u8>> {
    let mut out = bit_flips(body, rng);
    for len in [
        1,
        2,
        10,
        11,
        12,
        body.len() / 2,
        body.len() - 3,
        body.len() - 2,
    ] {
        out.push(body[..len.min(body.len())].to_vec());
    }
    // Bytes inserted before the EOF opcode, and the EOF opcode replaced.
    let eof = body.len() - 3;
    for insert in [vec![0u8], vec![5, 1, 0], vec![2, 7], vec![0xff; 9]] {
        let mut m = body[..eof].to_vec();
        m.extend(insert);
        m.extend_from_slice(&body[eof..]);
        out.push(m);
    }
    let mut m = body.to_vec();
    m[eof] = 5;
    out.push(m);
    out
}

fn apply(con: &mut Connection, key: &str, payload: &[u8]) -> Value {
    let mut cmd = redis::cmd("RATELIMIT.APPLY");
    cmd.arg(key).arg(payload);
    send_one(con, &cmd)
}

/// A key a corrupt payload was accepted into: use it every way there is, then remove it.
fn exercise_and_remove(con: &mut Connection, key: &str) {
    for algorithm in Algorithm::ALL.map(Algorithm::name) {
        let _ = run(con, &format!("RATELIMIT.PEEK {key} {algorithm} 3 1h"));
        let _ = run(con, &format!("RATELIMIT.CHECK {key} {algorithm} 3 1h"));
    }
    for text in [
        format!("RATELIMIT.INFO {key}"),
        format!("DEBUG DIGEST-VALUE {key}"),
        format!("MEMORY USAGE {key}"),
        format!("DUMP {key}"),
        format!("COPY {key} {key}:copy"),
        format!("DEL {key} {key}:copy"),
    ] {
        let _ = run(con, &text);
    }
}

#[test]
fn dump_restore_and_corrupt_payloads_never_crash() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    // Uncompressed, so the limiter's bytes appear verbatim in DUMP.
    config_set(&mut con, "rdbcompression", "no").unwrap();
    let mut keys = populate(&mut con, "d", base);
    // A sliding log of many runs: a longer buffer (two-byte length).
    for i in 0..12 {
        six(
            &mut con,
            &format!(
                "RATELIMIT.CHECK d:log sliding-log 100 1h AT {}",
                base + 100 * i
            ),
        );
    }
    keys.push("d:log".into());
    let mut rng = Rng::new(0x6d65_6d63_6865_636b);
    let mut accepted = 0;
    let mut refused = 0;
    for key in &keys {
        let payload: Vec<u8> = redis::cmd("DUMP").arg(key).query(&mut con).unwrap();
        let dump = Dump::parse(&payload);
        assert_eq!(
            dump.with_limiter(&dump.limiter),
            payload,
            "the DUMP is understood"
        );
        // Round trip: same digest.
        let copy = format!("{key}:restored");
        let expires_at_ms = int(&mut con, &cmd_line(&format!("PEXPIRETIME {key}")));
        assert!(matches!(
            restore(&mut con, &copy, expires_at_ms, &payload),
            Value::Okay
        ));
        assert_eq!(
            digests(&mut con, std::slice::from_ref(key)),
            digests(&mut con, std::slice::from_ref(&copy))
        );
        // The limiter's bytes corrupted, the DUMP framing and CRC valid: the module's rdb_load
        // decodes them. The same bytes as an APPLY payload reach the replication decoder.
        let mut apply_payload = vec![1u8];
        apply_payload.extend_from_slice(&dump.limiter);
        assert!(!is_error(&apply(&mut con, "applied", &apply_payload)));
        exercise_and_remove(&mut con, "applied");
        for limiter in corrupt_limiters(&dump.limiter, &mut rng) {
            match restore(&mut con, "bad", 0, &dump.with_limiter(&limiter)) {
                Value::Okay => {
                    accepted += 1;
                    exercise_and_remove(&mut con, "bad");
                }
                Value::ServerError(_) => refused += 1,
                other => panic!("RESTORE of a corrupt payload: {other:?}"),
            }
            let mut apply_payload = vec![1u8];
            apply_payload.extend_from_slice(&limiter);
            if !is_error(&apply(&mut con, "bad", &apply_payload)) {
                exercise_and_remove(&mut con, "bad");
            }
        }
        // The framing corrupted (module id, opcodes, lengths, EOF, version), CRC valid.
        for body in corrupt_bodies(&dump.body(), &mut rng) {
            match restore(&mut con, "bad", 0, &with_crc(body)) {
                Value::Okay => {
                    accepted += 1;
                    exercise_and_remove(&mut con, "bad");
                }
                Value::ServerError(_) => refused += 1,
                other => panic!("RESTORE of a corrupt payload: {other:?}"),
            }
        }
        // A wrong CRC: refused by Redis before the module sees it.
        let mut wrong = payload.clone();
        let last = wrong.len() - 1;
        wrong[last] ^= 1;
        assert!(is_error(&restore(&mut con, "bad", 0, &wrong)));
        assert!(!exists(&mut con, "bad"));
    }
    eprintln!("corrupt RESTORE payloads: {refused} refused, {accepted} accepted");
    assert!(refused > 100, "{refused} refused");
    // The corrupt limiters reached the module's rdb_load, which logs what it refuses (a RESTORE
    // refused by Redis alone, for a bad CRC or framing, would prove nothing about the decoder).
    assert!(
        server.log().contains("refusing corrupt limiter"),
        "no corrupt limiter reached the module's rdb_load (its warning is missing from the log)"
    );
    // Sliding-log appends as APPLY payloads: valid, and with every field at an extreme.
    let mut append = vec![2u8];
    for value in [10u64, HOUR_MS, base + 50_000, 2] {
        append.extend_from_slice(&value.to_le_bytes());
    }
    for key in ["d:log", "fresh", "d:token-bucket"] {
        let _ = apply(&mut con, key, &append);
    }
    for field in 0..4 {
        for value in [0u64, u64::MAX, 1 << 53, 10_000_001] {
            let mut m = append.clone();
            m[1 + 8 * field..9 + 8 * field].copy_from_slice(&value.to_le_bytes());
            let _ = apply(&mut con, "d:log", &m);
        }
    }
    for len in [1, 9, append.len() - 1] {
        assert!(is_error(&apply(&mut con, "fresh2", &append[..len])));
    }
    let mut longer = append.clone();
    longer.push(0);
    assert!(is_error(&apply(&mut con, "fresh2", &longer)));
    assert_info(&mut con, "d:log");
    assert_alive(&server);
}

#[test]
fn copy_move_digest_memory_reload_and_expiry() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    let keys = populate(&mut con, "c", base);
    six(&mut con, "RATELIMIT.CHECK c:short fixed-window 3 1ms");
    six(&mut con, "RATELIMIT.CHECK c:short2 sliding-log 3 1ms");
    for key in &keys {
        let copy = format!("{key}:copy");
        assert_eq!(int(&mut con, &cmd_line(&format!("COPY {key} {copy}"))), 1);
        assert_eq!(
            digests(&mut con, std::slice::from_ref(key)),
            digests(&mut con, std::slice::from_ref(&copy)),
        );
        for text in [
            format!("COPY {key} {key}:copy REPLACE"),
            format!("COPY {key} {key} DB 1"),
            format!("MEMORY USAGE {key}"),
            format!("MEMORY USAGE {key} SAMPLES 0"),
            format!("DEBUG OBJECT {key}"),
            format!("TYPE {key}"),
            format!("OBJECT ENCODING {key}"),
            format!("PEXPIRETIME {key}"),
            format!("RENAME {key}:copy {key}:renamed"),
            format!("MOVE {key}:renamed 2"),
        ] {
            let reply = run(&mut con, &text);
            assert!(!is_error(&reply), "{text}: {reply:?}");
        }
    }
    let _ = run(&mut con, "DEBUG DIGEST");
    let before = digests(&mut con, &keys);
    for text in [
        "SWAPDB 0 1",
        "SWAPDB 0 1",
        "DEBUG RELOAD",
        "CONFIG SET rdbcompression no",
        "DEBUG RELOAD",
    ] {
        let reply = run(&mut con, text);
        assert!(!is_error(&reply), "{text}: {reply:?}");
    }
    assert_eq!(
        digests(&mut con, &keys),
        before,
        "DEBUG RELOAD kept every limiter"
    );
    // Expired keys are freed lazily and actively.
    thread::sleep(Duration::from_millis(20));
    assert!(!exists(&mut con, "c:short"));
    let _ = run(&mut con, "RATELIMIT.INFO c:short2");
    six(&mut con, "RATELIMIT.CHECK c:short3 token-bucket 3 1ms");
    let _ = run(&mut con, "DEBUG SET-ACTIVE-EXPIRE 1");
    thread::sleep(Duration::from_millis(200));
    // UNLINK, FLUSHDB ASYNC and FLUSHALL free values (in a background thread when large).
    let _ = run(&mut con, &format!("UNLINK {}", keys[0]));
    let _ = run(&mut con, "SELECT 1");
    let _ = run(&mut con, "FLUSHDB ASYNC");
    let _ = run(&mut con, "SELECT 0");
    let reply = run(&mut con, "FLUSHALL");
    assert!(!is_error(&reply), "{reply:?}");
    assert_alive(&server);
}
