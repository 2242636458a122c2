//! Hostile input: thousands of random argument vectors (huge and negative numbers, NUL bytes,
//! non-UTF-8, duplicated options, wrong arity) get an error or a valid reply, never a crash, and
//! no error creates a key; RATELIMIT.APPLY cannot grow a sliding log past `max-log-limit` (a
//! client's, not the master's stream or an AOF replay); a RESTORE of a corrupt limiter with a
//! valid checksum is refused, and so are APPLY and RESTORE of states no command could have
//! stored (a count above the limit, a level above the capacity, a TAT beyond the tolerance).
//!
//! The argument parser and the codec are also fuzzed with libFuzzer (fuzz/).
//! `HARDENING_SEED=<n>` (decimal or 0x hex) replays a randomized run; the seed is printed.

use crate::common;

use common::dump::{restore, Dump};
use common::model::Model;
use common::rng::{seed_from_env, Rng};
use common::{
    assert_replica_matches, config_set, dbsize, decision, digest, error_text, exists,
    future_base_ms, info_int, limiter_info, now_ms, pexpiretime, reply6, run_ok, send, send_one,
    Limit, Server, MAX_AMOUNT, MAX_PERIOD_MS, TIME_LIMIT_MS,
};
use redis::{Connection, Value};
use redis_ratelimit_core::algorithms::{Algorithm, Limiter, Params, Request, SlidingLog, State};
use redis_ratelimit_core::codec::{encode_write, to_bytes, Change};

fn hostile_number(rng: &mut Rng) -> Vec<u8> {
    const NUMBERS: &[&[u8]] = &[
        b"0",
        b"1",
        b"2",
        b"7",
        b"1000",
        b"-1",
        b"-0",
        b"+1",
        b"1e3",
        b"1.5",
        b" 1",
        b"1 ",
        b"0x10",
        b"007",
        b"1000000000000",
        b"1000000000001",
        b"315360000000",
        b"9007199254740991",
        b"9007199254740992",
        b"9223372036854775807",
        b"9223372036854775808",
        b"18446744073709551615",
        b"18446744073709551616",
        b"99999999999999999999999999999",
        b"",
        b"\0",
        b"1\x001",
        b"\xff\xfe",
        b"\xc3\xa9",
        b"NaN",
        b"inf",
    ];
    match rng.below(10) {
        0 => (0..rng.below(25) + 1)
            .map(|_| b'0' + rng.below(10) as u8)
            .collect(),
        1 => rng.bytes(12),
        2 if rng.chance(3) => vec![b'9'; 100_000],
        3 => format!("{}", future_base_ms() + rng.below(10_000)).into_bytes(),
        _ => rng.pick(NUMBERS).to_vec(),
    }
}

fn hostile_period(rng: &mut Rng) -> Vec<u8> {
    const UNITS: &[&[u8]] = &[
        b"", b"ms", b"s", b"m", b"h", b"d", b"MS", b"S", b"D", b"w", b"sec", b" s", b"s\0",
    ];
    let mut period = if rng.chance(60) {
        rng.pick(&[&b"1"[..], b"250", b"15", b"1000", b"3650", b"3651", b"0"])
            .to_vec()
    } else {
        hostile_number(rng)
    };
    let unit: &[u8] = rng.pick(UNITS);
    period.extend_from_slice(unit);
    period
}

fn hostile_word(rng: &mut Rng, words: &[&str]) -> Vec<u8> {
    let word = rng.pick(words).as_bytes().to_vec();
    match rng.below(8) {
        0 => word.to_ascii_uppercase(),
        1 => {
            let mut w = word;
            w.push(0);
            w
        }
        2 => rng.bytes(16),
        3 => Vec::new(),
        _ => word,
    }
}

fn hostile_check_args(rng: &mut Rng) -> Vec<Vec<u8>> {
    let mut args = vec![
        hostile_word(
            rng,
            &[
                "token-bucket",
                "leaky-bucket",
                "fixed-window",
                "sliding-window",
                "sliding-log",
                "Token-Bucket",
                "gcra",
                "leaky-window",
                "token_bucket",
            ],
        ),
        if rng.chance(50) {
            rng.pick(&[&b"1"[..], b"5", b"100", b"100000", b"100001"])
                .to_vec()
        } else {
            hostile_number(rng)
        },
        hostile_period(rng),
    ];
    for _ in 0..rng.below(5) {
        args.push(hostile_word(
            rng,
            &["BURST", "COST", "AT", "cost", "at", "LIMIT"],
        ));
        args.push(hostile_number(rng));
    }
    match rng.below(10) {
        0 => args.truncate(rng.index(args.len())),
        1 => {
            args.pop();
        }
        2 => args.push(hostile_number(rng)),
        _ => {}
    }
    args
}

/// ACQUIRE's `limit lease-duration ID id [COST n] [AT t]` (RELEASE's `ID id [AT t]`), often
/// damaged: hostile numbers, ids of 0 to 200 bytes, options repeated, missing or unknown.
fn hostile_lease_args(rng: &mut Rng, acquire: bool) -> Vec<Vec<u8>> {
    let mut args = Vec::new();
    if acquire {
        if rng.chance(10) {
            args.push(b"POLICY".to_vec());
            args.push(hostile_word(rng, &["jobs", "none", "rate"]));
        } else {
            args.push(if rng.chance(60) {
                rng.pick(&[&b"1"[..], b"3", b"100"]).to_vec()
            } else {
                hostile_number(rng)
            });
            args.push(hostile_period(rng));
        }
    }
    let id = |rng: &mut Rng| match rng.below(6) {
        0 => Vec::new(),
        1 => vec![b'i'; 128 + rng.below(3) as usize],
        2 => rng.bytes(200),
        _ => format!("r{}", rng.below(8)).into_bytes(),
    };
    for _ in 0..1 + rng.below(3) {
        let option = hostile_word(rng, &["ID", "ID", "COST", "AT", "id", "BURST"]);
        let value = if option.eq_ignore_ascii_case(b"ID") {
            id(rng)
        } else if rng.chance(50) {
            format!("{}", future_base_ms() + rng.below(10_000)).into_bytes()
        } else {
            hostile_number(rng)
        };
        args.push(option);
        args.push(value);
    }
    if rng.chance(10) {
        args.truncate(rng.index(args.len() + 1));
    }
    args
}

/// A payload for RATELIMIT.APPLY: a real change (as a CHECK would replicate it), often damaged.
fn hostile_payload(rng: &mut Rng) -> Vec<u8> {
    let base = future_base_ms();
    let algorithm = rng.pick(&Algorithm::ALL);
    let mut payload = if rng.chance(20) {
        rng.bytes(90)
    } else if rng.chance(15) {
        let t_ms = base + rng.below(3_000);
        let id = format!("r{}", rng.below(8)).into_bytes();
        if rng.chance(60) {
            Change::LeaseAcquire {
                params: Params::new(1 + rng.below(10), 1 + rng.below(5_000), None).expect("valid"),
                t_ms,
                cost: 1 + rng.below(3),
                id,
            }
        } else {
            Change::LeaseRelease { t_ms, id }
        }
        .to_bytes()
    } else if algorithm == Algorithm::SlidingLog && rng.chance(50) {
        Change::LogAppend {
            params: Params::new(1 + rng.below(10), 1 + rng.below(5_000), None).expect("valid"),
            t_ms: base + rng.below(1_000),
            cost: 1 + rng.below(3),
        }
        .to_bytes()
    } else {
        let burst = algorithm.is_bucket().then(|| 1 + rng.below(10));
        let params = Params::new(1 + rng.below(10), 1 + rng.below(5_000), burst).expect("valid");
        let mut model = Model::default();
        for _ in 0..1 + rng.below(4) {
            let request = Request {
                algorithm,
                params,
                cost: rng.below(3),
                now_ms: base + rng.below(3_000),
            };
            model.outcome("payload", &request);
        }
        match model.limiter("payload") {
            // Half in the 33-byte packed form commands replicate.
            Some(limiter) if rng.chance(50) => {
                let mut bytes = Vec::new();
                encode_write(limiter, &mut bytes);
                bytes
            }
            Some(limiter) => Change::Replace(limiter.clone()).to_bytes(),
            None => rng.bytes(60),
        }
    };
    // Damage: flip bytes, truncate or extend.
    match rng.below(4) {
        0 if !payload.is_empty() => {
            for _ in 0..1 + rng.below(3) {
                let i = rng.index(payload.len());
                payload[i] ^= 1 << rng.below(8);
            }
        }
        1 if !payload.is_empty() => payload.truncate(rng.index(payload.len())),
        2 => payload.extend(rng.bytes(9)),
        _ => {}
    }
    payload
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Check,
    Peek,
    Reset,
    Info,
    Apply,
    Acquire,
    Release,
}

/// An error reply, or a reply of the command's shape whose fields are consistent.
fn assert_valid_reply(kind: Kind, args: &[Vec<u8>], value: &Value) {
    let shown = || {
        args.iter()
            .map(|a| String::from_utf8_lossy(&a[..a.len().min(40)]).into_owned())
            .collect::<Vec<_>>()
    };
    if let Value::ServerError(error) = value {
        assert!(
            matches!(error.code(), "ERR" | "WRONGTYPE"),
            "{kind:?} {:?}: unexpected error {error:?}",
            shown()
        );
        assert!(
            !error
                .details()
                .unwrap_or_default()
                .contains("internal error"),
            "{kind:?} {:?}: a panic was caught: {error:?}",
            shown()
        );
        return;
    }
    match kind {
        Kind::Check | Kind::Peek | Kind::Acquire => {
            let [allowed, limit, remaining, retry, reset, delay] = reply6(value);
            let ok = (allowed == 0 || allowed == 1)
                && limit >= 1
                && (0..=limit).contains(&remaining)
                && retry >= -1
                && (allowed == 1) == (retry == 0)
                && reset >= 0
                && delay >= 0;
            assert!(ok, "{kind:?} {:?}: inconsistent reply {value:?}", shown());
        }
        Kind::Reset => assert!(matches!(value, Value::Int(n) if *n >= 0), "{value:?}"),
        Kind::Info => assert!(
            matches!(value, Value::Nil)
                || matches!(value, Value::Array(a) if a.len() % 2 == 0 && !a.is_empty()),
            "{:?}: {value:?}",
            shown()
        ),
        Kind::Apply => assert!(matches!(value, Value::Okay), "{:?}: {value:?}", shown()),
        Kind::Release => assert!(matches!(value, Value::Int(0 | 1)), "{value:?}"),
    }
}

#[test]
fn random_argument_vectors_get_an_error_or_a_valid_reply_and_errors_create_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let mut rng = Rng::new(seed_from_env("HARDENING_SEED", now_ms));
    let _: () = redis::cmd("SET")
        .arg("h:string")
        .arg("not a limiter")
        .query(&mut con)
        .unwrap();
    let pool: Vec<Vec<u8>> = (0..6)
        .map(|i| format!("h:{i}").into_bytes())
        .chain([b"h:string".to_vec(), Vec::new(), b"h:\0\xff".to_vec()])
        .collect();
    let (mut errors, mut replies) = (0, 0);
    for _batch in 0..30 {
        let mut cmds = Vec::new();
        let mut sent = Vec::new();
        for _ in 0..200 {
            let kind = rng.pick(&[
                Kind::Check,
                Kind::Check,
                Kind::Check,
                Kind::Check,
                Kind::Peek,
                Kind::Peek,
                Kind::Reset,
                Kind::Info,
                Kind::Apply,
                Kind::Apply,
                Kind::Acquire,
                Kind::Acquire,
                Kind::Release,
            ]);
            let key = rng.pick_ref(&pool).clone();
            let (name, args): (&str, Vec<Vec<u8>>) = match kind {
                Kind::Check | Kind::Peek => {
                    let mut args = vec![key];
                    args.extend(hostile_check_args(&mut rng));
                    if rng.chance(3) {
                        args.clear();
                    }
                    let name = if kind == Kind::Check {
                        "RATELIMIT.CHECK"
                    } else {
                        "RATELIMIT.PEEK"
                    };
                    (name, args)
                }
                Kind::Acquire => {
                    let mut args = vec![key];
                    args.extend(hostile_lease_args(&mut rng, true));
                    ("RATELIMIT.ACQUIRE", args)
                }
                Kind::Release => {
                    let mut args = vec![key];
                    args.extend(hostile_lease_args(&mut rng, false));
                    ("RATELIMIT.RELEASE", args)
                }
                Kind::Reset => (
                    "RATELIMIT.RESET",
                    (0..rng.below(4))
                        .map(|_| rng.pick_ref(&pool).clone())
                        .collect(),
                ),
                Kind::Info => (
                    "RATELIMIT.INFO",
                    (0..rng.below(3))
                        .map(|_| rng.pick_ref(&pool).clone())
                        .collect(),
                ),
                Kind::Apply => {
                    let mut args = vec![key, hostile_payload(&mut rng)];
                    match rng.below(10) {
                        0 => args.truncate(rng.below(2) as usize),
                        1 => args.push(hostile_payload(&mut rng)),
                        _ => {}
                    }
                    (
                        if rng.chance(50) {
                            "rla"
                        } else {
                            "RATELIMIT.APPLY"
                        },
                        args,
                    )
                }
            };
            let mut cmd = redis::cmd(name);
            for arg in &args {
                cmd.arg(arg.as_slice());
            }
            cmds.push(redis::cmd("DBSIZE"));
            cmds.push(cmd);
            cmds.push(redis::cmd("DBSIZE"));
            sent.push((kind, args));
        }
        let values = send(&mut con, &cmds);
        for (triple, (kind, args)) in values.chunks(3).zip(&sent) {
            let (Value::Int(before), Value::Int(after)) = (&triple[0], &triple[2]) else {
                panic!("DBSIZE: {triple:?}");
            };
            assert_valid_reply(*kind, args, &triple[1]);
            if matches!(triple[1], Value::ServerError(_)) {
                errors += 1;
                // Keys may expire in between, never appear.
                assert!(
                    after <= before,
                    "{kind:?} {args:?} answered an error and created a key"
                );
            } else {
                replies += 1;
            }
        }
        let pong: String = redis::cmd("PING")
            .query(&mut con)
            .expect("the server is up");
        assert_eq!(pong, "PONG");
    }
    eprintln!("{errors} error replies, {replies} valid replies");
    assert!(
        errors > 1_000 && replies > 300,
        "{errors} errors, {replies} replies"
    );
    let string: String = redis::cmd("GET").arg("h:string").query(&mut con).unwrap();
    assert_eq!(string, "not a limiter");
    assert!(
        !server.log().contains("panicked"),
        "a callback panicked:\n{}",
        server.log_tail(30)
    );
}

#[test]
fn apply_cannot_grow_a_sliding_log_past_max_log_limit() {
    let server = Server::start();
    let mut con = server.client();
    let payload = Change::LogAppend {
        params: Params::new(MAX_AMOUNT, 1000, None).unwrap(),
        t_ms: future_base_ms(),
        cost: 10_000_000,
    }
    .to_bytes();
    let reply = send_one(
        &mut con,
        redis::cmd("RATELIMIT.APPLY").arg("bomb").arg(payload),
    );
    assert!(error_text(&reply).is_some(), "accepted: {reply:?}");
    assert_eq!(dbsize(&mut con), 0);
}

#[test]
fn a_lower_max_log_limit_on_a_replica_or_at_aof_replay_keeps_the_masters_logs() {
    // The master admits logs of limit 1000; its replica, and later the master itself, run with
    // max-log-limit 10. What the master admitted must still arrive and load exactly.
    let master = Server::builder()
        .config(&[("appendonly", "yes"), ("appendfsync", "always")])
        .start();
    let replica = Server::builder()
        .module_args(&["max-log-limit", "10"])
        .start();
    replica.replica_of(&master);
    let limit = Limit::new("sliding-log", 1000, "1h", None);
    let base = future_base_ms();
    let mut con = master.client();
    for i in 0..60u64 {
        assert_eq!(
            decision(&mut con, &limit.check("log", 1 + i % 3, Some(base + i * 7)))[0],
            1
        );
    }
    let keys = ["log".to_string()];
    assert_replica_matches(&master, &replica, &keys);
    let before = limiter_info(&mut con, "log").expect("stored");
    assert_eq!(info_int(&before, "entries"), 120);

    // A client is still held to the local setting.
    config_set(&mut con, "ratelimit.max-log-limit", "10")
        .expect("CONFIG SET ratelimit.max-log-limit");
    let append = Change::LogAppend {
        params: Params::new(1000, 3_600_000, None).unwrap(),
        t_ms: base + 1000,
        cost: 1,
    }
    .to_bytes();
    let refused = send_one(
        &mut con,
        redis::cmd("RATELIMIT.APPLY").arg("log").arg(&append),
    );
    assert!(error_text(&refused).is_some(), "accepted: {refused:?}");

    // The AOF replayed under the lower setting rebuilds the same log.
    let digest_before = digest(&mut con, "log");
    let reload = send_one(&mut con, redis::cmd("DEBUG").arg("LOADAOF"));
    assert!(matches!(reload, Value::Okay), "DEBUG LOADAOF: {reload:?}");
    assert_eq!(limiter_info(&mut con, "log"), Some(before));
    assert_eq!(digest(&mut con, "log"), digest_before);
}

#[test]
fn every_state_apply_accepts_survives_a_reload() {
    let server = Server::start();
    let mut con = server.client();
    run_ok(&mut con, "SET a 1");
    let append = Change::LogAppend {
        params: Params::new(5, 1000, None).unwrap(),
        t_ms: future_base_ms(),
        cost: 5,
    }
    .to_bytes();
    for _ in 0..2 {
        send_one(
            &mut con,
            redis::cmd("RATELIMIT.APPLY").arg("over").arg(&append),
        );
    }
    run_ok(&mut con, "SET z 2");
    let keys = dbsize(&mut con);
    let reload = send_one(&mut con, redis::cmd("DEBUG").arg("RELOAD"));
    assert!(matches!(reload, Value::Okay), "DEBUG RELOAD: {reload:?}");
    assert_eq!(dbsize(&mut con), keys);
}

fn le(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `DUMP key`, taken apart; its limiter must begin with `head` and be `len` bytes long.
fn dump(con: &mut Connection, key: &str, head: &[u8], len: usize) -> (Vec<u8>, Dump) {
    let payload: Vec<u8> = redis::cmd("DUMP").arg(key).query(con).expect("DUMP");
    let dump = Dump::parse(&payload);
    assert!(
        dump.limiter.starts_with(head) && dump.limiter.len() == len,
        "{key}: the limiter's layout: {:?}",
        dump.limiter
    );
    (payload, dump)
}

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

/// A lease set's encoding (store/codec.rs): the head, then `u64 count` and per lease
/// `u64 expiry, u64 cost, u8 id length, id`.
fn lease_set(limit: u64, lease_ms: u64, last: u64, leases: &[(u64, u64, &[u8])]) -> Vec<u8> {
    let mut bytes = vec![6];
    bytes.extend(le(&[limit, lease_ms, limit, last, leases.len() as u64]));
    for (expiry, cost, id) in leases {
        bytes.extend(le(&[*expiry, *cost]));
        bytes.push(id.len() as u8);
        bytes.extend_from_slice(id);
    }
    bytes
}

#[test]
fn restore_and_apply_of_crafted_lease_sets_are_refused() {
    let server = Server::start();
    let mut con = server.client();
    config_set(&mut con, "rdbcompression", "no").unwrap();
    let base = future_base_ms();
    let far = (base + 86_400_000) as i64;
    let acquire = |con: &mut Connection, id: &str, cost: u64, at: u64| {
        run_ok(
            con,
            &format!("RATELIMIT.ACQUIRE jobs 5 1000 ID {id} COST {cost} AT {at}"),
        );
    };
    acquire(&mut con, "a", 2, base);
    acquire(&mut con, "bb", 1, base + 100);
    // The payload as dumped is the layout above, byte for byte.
    let real = lease_set(
        5,
        1000,
        base + 100,
        &[(base + 1000, 2, b"a"), (base + 1100, 1, b"bb")],
    );
    let (_, dump) = dump(&mut con, "jobs", &real[..33], real.len());
    assert_eq!(dump.limiter, real);
    let expiry = pexpiretime(&mut con, "jobs");
    assert!(matches!(
        restore(&mut con, "restored", expiry, &dump.with_limiter(&real)),
        Value::Okay
    ));
    assert_eq!(digest(&mut con, "restored"), digest(&mut con, "jobs"));
    run_ok(&mut con, "DEL restored");

    let (e1, e2) = (base + 1000, base + 1100);
    let last = base + 100;
    let mut impossible: Vec<(&str, Vec<u8>)> = vec![
        ("no lease", lease_set(5, 1000, last, &[])),
        (
            "a lease expired at last",
            lease_set(5, 1000, last, &[(last, 1, b"a")]),
        ),
        (
            "a lease beyond 3650 days",
            lease_set(5, 1000, last, &[(last + MAX_PERIOD_MS + 1, 1, b"a")]),
        ),
        ("a cost of 0", lease_set(5, 1000, last, &[(e1, 0, b"a")])),
        (
            "a cost above the limit",
            lease_set(5, 1000, last, &[(e1, 6, b"a")]),
        ),
        (
            "costs summing above the limit",
            lease_set(5, 1000, last, &[(e1, 3, b"a"), (e2, 3, b"b")]),
        ),
        ("an empty id", lease_set(5, 1000, last, &[(e1, 1, b"")])),
        (
            "a 129-byte id",
            lease_set(5, 1000, last, &[(e1, 1, &[b'x'; 129])]),
        ),
        (
            "the same id twice",
            lease_set(5, 1000, last, &[(e1, 1, b"a"), (e2, 1, b"a")]),
        ),
        (
            "out of order",
            lease_set(5, 1000, last, &[(e2, 1, b"a"), (e1, 1, b"b")]),
        ),
        (
            "ids out of order at one expiry",
            lease_set(5, 1000, last, &[(e1, 1, b"b"), (e1, 1, b"a")]),
        ),
        ("limit 0", lease_set(0, 1000, last, &[(e1, 1, b"a")])),
        (
            "limit above 10^12",
            lease_set(MAX_AMOUNT + 1, 1000, last, &[(e1, 1, b"a")]),
        ),
        (
            "a lease duration of 0",
            lease_set(5, 0, last, &[(e1, 1, b"a")]),
        ),
        (
            "last at 2^53",
            lease_set(5, 1000, TIME_LIMIT_MS, &[(TIME_LIMIT_MS + 1, 1, b"a")]),
        ),
    ];
    let mut edit = |what: &'static str, f: &dyn Fn(&mut Vec<u8>)| {
        let mut bytes = real.clone();
        f(&mut bytes);
        impossible.push((what, bytes));
    };
    edit("a capacity other than the limit", &|b| b[17] = 9);
    edit("a count above the leases given", &|b| b[33] = 3);
    edit("a count of 2^63", &|b| b[40] = 0x80);
    edit("an id length past the end", &|b| {
        let at = b.len() - 3;
        b[at] = 0xff
    });
    edit("a block trailer", &|b| b.extend(le(&[base + 5000])));
    edit("a byte left over", &|b| b.push(0));
    edit("cut in the middle of a lease", &|b| b.truncate(b.len() - 3));
    for (what, bytes) in impossible {
        let reply = restore(&mut con, "restored", far, &dump.with_limiter(&bytes));
        let error = error_text(&reply).unwrap_or_else(|| panic!("{what}: accepted {reply:?}"));
        assert!(error.contains("Bad data format"), "{what}: {error}");
        assert!(!exists(&mut con, "restored"), "{what}");
    }

    // APPLY of lease changes no ACQUIRE or RELEASE could have replicated.
    let apply = |con: &mut Connection, key: &str, payload: &[u8]| {
        send_one(con, redis::cmd("RATELIMIT.APPLY").arg(key).arg(payload))
    };
    let acquired = |limit: u64, t: u64, expiry: u64, cost: u64, id: &[u8]| {
        let mut bytes = vec![6];
        bytes.extend(le(&[limit, t, expiry, cost]));
        bytes.extend_from_slice(id);
        bytes
    };
    let released = |t: u64, id: &[u8]| [vec![7], le(&[t]), id.to_vec()].concat();
    run_ok(
        &mut con,
        &format!("RATELIMIT.CHECK tb token-bucket 5 1s AT {base}"),
    );
    let before = (digest(&mut con, "jobs"), pexpiretime(&mut con, "jobs"));
    let refused: [(&str, &str, Vec<u8>); 13] = [
        ("a cost of 0", "new", acquired(5, base, base + 10, 0, b"a")),
        (
            "a cost above the limit",
            "new",
            acquired(5, base, base + 10, 6, b"a"),
        ),
        ("an empty id", "new", acquired(5, base, base + 10, 1, b"")),
        (
            "a 129-byte id",
            "new",
            acquired(5, base, base + 10, 1, &[b'x'; 129]),
        ),
        (
            "an expiry at its time",
            "new",
            acquired(5, base, base, 1, b"a"),
        ),
        (
            "a duration beyond 3650 days",
            "new",
            acquired(5, base, base + MAX_PERIOD_MS + 1, 1, b"a"),
        ),
        (
            "a time at 2^53",
            "new",
            acquired(5, TIME_LIMIT_MS, TIME_LIMIT_MS + 1, 1, b"a"),
        ),
        (
            "more than the limit in flight",
            "jobs",
            acquired(5, base + 200, base + 900, 3, b"c"),
        ),
        (
            "before the key's last write",
            "jobs",
            acquired(5, base, base + 900, 1, b"c"),
        ),
        (
            "onto a token bucket",
            "tb",
            acquired(5, base + 200, base + 900, 1, b"c"),
        ),
        (
            "the release of no live lease",
            "jobs",
            released(base + 200, b"zz"),
        ),
        (
            "a release on a missing key",
            "new",
            released(base + 200, b"a"),
        ),
        (
            "a release on a token bucket",
            "tb",
            released(base + 200, b"a"),
        ),
    ];
    for (what, key, payload) in refused {
        let reply = apply(&mut con, key, &payload);
        let error = error_text(&reply).unwrap_or_else(|| panic!("{what}: accepted {reply:?}"));
        assert!(
            error.contains("invalid limiter state payload"),
            "{what}: {error}"
        );
    }
    assert!(!exists(&mut con, "new"));
    assert_eq!(
        (digest(&mut con, "jobs"), pexpiretime(&mut con, "jobs")),
        before
    );
    // What an ACQUIRE would replicate applies, and equals the ACQUIRE.
    let payload = acquired(5, base + 200, base + 1200, 2, b"c");
    assert!(matches!(
        restore(&mut con, "restored", far, &dump.with_limiter(&real)),
        Value::Okay
    ));
    assert_eq!(apply(&mut con, "restored", &payload), Value::Okay);
    acquire(&mut con, "c", 2, base + 200);
    assert_eq!(digest(&mut con, "restored"), digest(&mut con, "jobs"));
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");
    assert!(
        !server.log().contains("panicked"),
        "{}",
        server.log_tail(20)
    );
}
