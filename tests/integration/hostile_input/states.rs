//! A RESTORE of a corrupt limiter with a valid checksum is refused, and so are APPLY and RESTORE
//! of states no command could have stored (a count above the limit, a level above the capacity,
//! a TAT beyond the tolerance).

use super::{dump, le};
use crate::common;
use common::dump::{restore, Dump};
use common::{
    config_set, dbsize, decision, digest, error_text, exists, future_base_ms, info_int,
    limiter_info, pexpiretime, send_one, Limit, Server, MAX_AMOUNT, MAX_PERIOD_MS, TIME_LIMIT_MS,
};
use redis::{Connection, Value};
use redis_ratelimit_core::algorithms::{Limiter, Params, SlidingLog, State};
use redis_ratelimit_core::codec::{encode_write, to_bytes, Change};

#[test]
fn restore_of_a_corrupt_limiter_with_a_valid_checksum_is_refused() {
    let server = Server::start();
    let mut con = server.client();
    // Uncompressed, so the limiter's bytes appear verbatim in DUMP.
    config_set(&mut con, "rdbcompression", "no").unwrap();
    let base = future_base_ms();
    let far = (base + 86_400_000) as i64;
    let refused = |con: &mut Connection, what: &str, payload: &[u8]| {
        let reply = restore(con, "restored", far, payload);
        let error = error_text(&reply).unwrap_or_else(|| panic!("{what}: accepted {reply:?}"));
        assert!(
            error.contains("Bad data format") || error.contains("checksum"),
            "{what}: {error}"
        );
        assert!(!exists(con, "restored"), "{what}");
        let pong: String = redis::cmd("PING").query(con).expect("up");
        assert_eq!(pong, "PONG");
    };

    // A token bucket: 7 per 1000 ms, capacity 9, 2 taken: 7000 scaled tokens.
    let tb = Limit::new("token-bucket", 7, "1000", Some(9));
    decision(&mut con, &tb.check("tb", 2, Some(base)));
    let head = |algorithm: u8, limit: u64, period: u64, capacity: u64, last: u64| {
        let mut bytes = vec![algorithm];
        bytes.extend(le(&[limit, period, capacity, last]));
        bytes
    };
    let (payload, tb_dump) = dump(&mut con, "tb", &head(0, 7, 1000, 9, base), 49);
    let tokens = |scaled: u128| scaled.to_le_bytes().to_vec();
    let body = |head: Vec<u8>, state: Vec<u8>| [head, state].concat();
    // The payload as dumped restores, and a valid edit with a recomputed CRC restores too: the
    // CRC here is right, so the refusals below are about the contents.
    let tb_expiry = pexpiretime(&mut con, "tb");
    assert!(matches!(
        restore(&mut con, "restored", tb_expiry, &payload),
        Value::Okay
    ));
    assert_eq!(digest(&mut con, "restored"), digest(&mut con, "tb"));
    let edited = tb_dump.with_limiter(&body(head(0, 7, 1000, 9, base), tokens(8000)));
    assert!(matches!(
        restore(&mut con, "restored", far, &edited),
        Value::Okay
    ));
    assert_eq!(
        info_int(&limiter_info(&mut con, "restored").unwrap(), "tokens"),
        8
    );
    let _: i64 = redis::cmd("DEL").arg("restored").query(&mut con).unwrap();
    // The same edit without fixing the CRC is refused by Redis itself.
    let mut stale = payload.clone();
    stale[tb_dump.limiter_at() + 33] ^= 1;
    refused(&mut con, "stale CRC", &stale);

    let corrupt_buckets = [
        (
            "tokens above the capacity",
            body(head(0, 7, 1000, 9, base), tokens(9001)),
        ),
        (
            "tokens u128::MAX",
            body(head(0, 7, 1000, 9, base), tokens(u128::MAX)),
        ),
        (
            "level above the capacity",
            body(head(1, 7, 1000, 9, base), tokens(9001)),
        ),
        (
            "unknown algorithm 6",
            body(head(6, 7, 1000, 9, base), tokens(7000)),
        ),
        (
            "unknown algorithm 255",
            body(head(255, 7, 1000, 9, base), tokens(7000)),
        ),
        ("limit 0", body(head(0, 0, 1000, 9, base), tokens(0))),
        (
            "limit above 10^12",
            body(head(0, MAX_AMOUNT + 1, 1000, 9, base), tokens(0)),
        ),
        ("period 0", body(head(0, 7, 0, 9, base), tokens(0))),
        (
            "period above 3650 days",
            body(head(0, 7, MAX_PERIOD_MS + 1, 9, base), tokens(0)),
        ),
        ("capacity 0", body(head(0, 7, 1000, 0, base), tokens(0))),
        (
            "capacity above 10^12",
            body(head(0, 7, 1000, MAX_AMOUNT + 1, base), tokens(0)),
        ),
        (
            "time at 2^53",
            body(head(0, 7, 1000, 9, TIME_LIMIT_MS), tokens(0)),
        ),
        (
            "a window read as a bucket's bytes",
            body(head(2, 7, 1000, 7, base), tokens(7000)),
        ),
        (
            "truncated by one byte",
            body(head(0, 7, 1000, 9, base), tokens(7000)[..15].to_vec()),
        ),
        (
            "one byte too many",
            body(head(0, 7, 1000, 9, base), [tokens(7000), vec![0]].concat()),
        ),
    ];
    for (what, bytes) in &corrupt_buckets {
        refused(&mut con, what, &tb_dump.with_limiter(bytes));
    }

    // A fixed window: 5 per 1000 ms, one taken in the window starting at `base`.
    let fw = Limit::new("fixed-window", 5, "1000", None);
    decision(&mut con, &fw.check("fw", 1, Some(base + 250)));
    let fw_head = head(2, 5, 1000, 5, base + 250);
    let (_, fw_dump) = dump(&mut con, "fw", &fw_head, 49);
    for (what, state) in [
        ("an unaligned window", le(&[base + 1, 1])),
        ("another window than last's", le(&[base + 1000, 1])),
        ("a count above 10^12", le(&[base, MAX_AMOUNT + 1])),
    ] {
        refused(
            &mut con,
            what,
            &fw_dump.with_limiter(&body(fw_head.clone(), state)),
        );
    }

    // A sliding log: 10 per 1000 ms; two entries at base, one at base + 5.
    let sl = Limit::new("sliding-log", 10, "1000", None);
    decision(&mut con, &sl.check("sl", 2, Some(base)));
    decision(&mut con, &sl.check("sl", 1, Some(base + 5)));
    let sl_head = head(4, 10, 1000, 10, base + 5);
    let (_, sl_dump) = dump(&mut con, "sl", &sl_head, 73);
    let runs = |runs: &[(u64, u64)], claimed: u64| {
        let mut state = le(&[claimed]);
        for (ts, count) in runs {
            state.extend(le(&[*ts, *count]));
        }
        body(sl_head.clone(), state)
    };
    assert_eq!(
        sl_dump.limiter,
        runs(&[(base, 2), (base + 5, 1)], 2),
        "the log's layout"
    );
    let valid = sl_dump.with_limiter(&runs(&[(base, 1), (base + 5, 1)], 2));
    assert!(matches!(
        restore(&mut con, "restored", far, &valid),
        Value::Okay
    ));
    let _: i64 = redis::cmd("DEL").arg("restored").query(&mut con).unwrap();
    for (what, bytes) in [
        ("runs out of order", runs(&[(base + 5, 1), (base, 2)], 2)),
        ("an empty run", runs(&[(base, 0), (base + 5, 1)], 2)),
        ("a run above 2048", runs(&[(base, 2049), (base + 5, 1)], 2)),
        (
            "more entries than the limit",
            runs(&[(base, 9), (base + 5, 2)], 2),
        ),
        ("an entry after last", runs(&[(base, 2), (base + 6, 1)], 2)),
        (
            "an entry out of the window",
            runs(&[(base - 1000, 2), (base + 5, 1)], 2),
        ),
        (
            "more runs claimed than present",
            runs(&[(base, 2), (base + 5, 1)], 3),
        ),
        (
            "a huge run count",
            runs(&[(base, 2), (base + 5, 1)], u64::MAX),
        ),
        (
            "fewer runs claimed than present",
            runs(&[(base, 2), (base + 5, 1)], 1),
        ),
    ] {
        refused(&mut con, what, &sl_dump.with_limiter(&bytes));
    }

    // Nothing refused left a trace; the originals are intact.
    assert_eq!(dbsize(&mut con), 3);
    assert_eq!(
        info_int(&limiter_info(&mut con, "sl").unwrap(), "entries"),
        3
    );
}

/// States no admitted call leaves, each in a well-formed payload (parameters within bounds, the
/// window of `last`): APPLY, in the whole and in the packed form, and RESTORE with a valid CRC all
/// answer an error and store nothing, and a key they were sent to keeps its state.
#[test]
fn apply_and_restore_refuse_states_no_command_could_store() {
    let server = Server::start();
    let mut con = server.client();
    config_set(&mut con, "rdbcompression", "no").unwrap();
    let base = future_base_ms();
    let far = (base + 86_400_000) as i64;
    // A real key, to take a DUMP payload from and to aim APPLY at.
    let fw = Limit::new("fixed-window", 5, "1000", None);
    decision(&mut con, &fw.check("kept", 2, Some(base + 250)));
    let kept = limiter_info(&mut con, "kept").unwrap();
    let payload: Vec<u8> = redis::cmd("DUMP").arg("kept").query(&mut con).unwrap();
    let dump = Dump::parse(&payload);

    let limiter = |limit: u64, capacity: Option<u64>, state: State| Limiter {
        params: Params::new(limit, 1_000, capacity).unwrap(),
        last_ms: base + 250,
        state,
        blocked_until_ms: 0,
    };
    let window = |current: u64, previous: u64| State::SlidingWindow {
        window_start_ms: base,
        current,
        previous,
    };
    let impossible = [
        (
            "a fixed window of limit 5 holding 10^12",
            limiter(
                5,
                None,
                State::FixedWindow {
                    window_start_ms: base,
                    count: MAX_AMOUNT,
                },
            ),
        ),
        (
            "a fixed window holding nothing",
            limiter(
                5,
                None,
                State::FixedWindow {
                    window_start_ms: base,
                    count: 0,
                },
            ),
        ),
        (
            "a sliding window of limit 5 with current = previous = 10^12",
            limiter(5, None, window(MAX_AMOUNT, MAX_AMOUNT)),
        ),
        (
            "a sliding window over its estimate: 4·750 + 3·1000 > 5·1000",
            limiter(5, None, window(3, 4)),
        ),
        (
            "a sliding window holding nothing at all",
            limiter(5, None, window(0, 0)),
        ),
        (
            "a full token bucket",
            limiter(
                7,
                Some(9),
                State::TokenBucket {
                    tokens_scaled: 9_000,
                },
            ),
        ),
        (
            "a leaky bucket above its capacity",
            limiter(
                7,
                Some(9),
                State::LeakyBucket {
                    level_scaled: 9_001,
                },
            ),
        ),
        (
            "an empty leaky bucket",
            limiter(7, Some(9), State::LeakyBucket { level_scaled: 0 }),
        ),
        (
            "a TAT beyond the tolerance",
            limiter(
                7,
                Some(9),
                State::Gcra {
                    ahead_scaled: 9_001,
                },
            ),
        ),
        (
            "a TAT not ahead at all",
            limiter(7, Some(9), State::Gcra { ahead_scaled: 0 }),
        ),
        (
            "a log with an entry after its last call",
            limiter(
                5,
                None,
                State::SlidingLog(SlidingLog::from_runs([(base + 900, 2)]).unwrap()),
            ),
        ),
    ];
    for (what, limiter) in &impossible {
        let mut packed = Vec::new();
        encode_write(limiter, &mut packed);
        for (form, bytes) in [
            ("whole", Change::Replace(limiter.clone()).to_bytes()),
            ("packed", packed),
        ] {
            for key in ["new", "kept"] {
                let reply = send_one(&mut con, redis::cmd("RATELIMIT.APPLY").arg(key).arg(&bytes));
                assert!(
                    error_text(&reply).is_some(),
                    "APPLY {key} {what} ({form}): {reply:?}"
                );
            }
        }
        let reply = restore(&mut con, "new", far, &dump.with_limiter(&to_bytes(limiter)));
        let error = error_text(&reply).unwrap_or_else(|| panic!("RESTORE {what}: {reply:?}"));
        assert!(error.contains("Bad data format"), "RESTORE {what}: {error}");
        assert!(!exists(&mut con, "new"), "{what}");
    }
    assert_eq!(dbsize(&mut con), 1);
    assert_eq!(limiter_info(&mut con, "kept"), Some(kept));
    assert!(
        !server.log().contains("panicked"),
        "{}",
        server.log_tail(20)
    );
}
