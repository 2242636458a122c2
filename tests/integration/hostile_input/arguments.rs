//! Thousands of random argument vectors (huge and negative numbers, NUL bytes, non-UTF-8,
//! duplicated options, wrong arity) get an error or a valid reply, never a crash, and no error
//! creates a key. `HARDENING_SEED=<n>` (decimal or 0x hex) replays a run; the seed is printed.

use crate::common;
use common::model::Model;
use common::rng::{seed_from_env, Rng};
use common::{future_base_ms, now_ms, reply6, send, Server};
use redis::Value;
use redis_ratelimit_core::algorithms::{Algorithm, Params, Request};
use redis_ratelimit_core::codec::{encode_write, Change};

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

/// A whole-limiter payload for RATELIMIT.APPLY, as a CHECK at `at_ms` would leave the key.
fn replace_payload(algorithm: Algorithm, at_ms: u64) -> Vec<u8> {
    let params = Params::new(5, 60_000, None).expect("valid");
    let mut model = Model::default();
    let request = Request {
        algorithm,
        params,
        cost: 1,
        now_ms: at_ms,
    };
    model.outcome("payload", &request);
    Change::Replace(model.limiter("payload").expect("a limiter").clone()).to_bytes()
}

#[test]
fn a_malformed_multi_pair_apply_is_refused_whole_and_changes_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let base = future_base_ms();
    let good = |i: u64| replace_payload(Algorithm::ALL[i as usize % 6], base + i);
    let _: () = redis::cmd("SET")
        .arg("str")
        .arg("x")
        .query(&mut con)
        .unwrap();
    // One key holding a limiter already, which a refused command must not change either.
    let one: String = redis::cmd("rla")
        .arg("held")
        .arg(good(0))
        .query(&mut con)
        .expect("single-pair rla");
    assert_eq!(one, "OK");
    let state = |con: &mut redis::Connection| -> (i64, String) {
        let size: i64 = redis::cmd("DBSIZE").query(con).unwrap();
        let digest: String = redis::cmd("DEBUG").arg("DIGEST").query(con).unwrap();
        (size, digest)
    };
    let before = state(&mut con);
    let refund = Change::LogRefund {
        t_ms: base,
        cost: 1,
    }
    .to_bytes();
    let pairs = |keys: &[&str], payloads: &[Vec<u8>]| {
        let mut cmd = redis::cmd("rla");
        for (key, payload) in keys.iter().zip(payloads) {
            cmd.arg(*key).arg(payload.as_slice());
        }
        cmd
    };
    // Every key is declared (cluster routing and ACL key permissions see them all).
    for name in ["rla", "RATELIMIT.APPLY"] {
        let keys: Vec<String> = redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg(name)
            .arg(&["k1", "p1", "k2", "p2", "k3", "p3"])
            .query(&mut con)
            .expect("COMMAND GETKEYS");
        assert_eq!(keys, ["k1", "k2", "k3"], "{name}");
    }
    let nine: Vec<String> = (0..9).map(|i| format!("n{i}")).collect();
    let nine_keys: Vec<&str> = nine.iter().map(String::as_str).collect();
    let cases: Vec<(&str, redis::Cmd, &str)> = vec![
        (
            "even argc",
            pairs(&["a", "b"], &[good(1), good(2)]).arg("c").clone(),
            "ERR wrong number of arguments",
        ),
        (
            "9 pairs",
            pairs(&nine_keys, &(0..9).map(good).collect::<Vec<_>>()),
            "ERR ratelimit.apply takes at most 8",
        ),
        (
            "a bad payload in pair 2 of 3",
            pairs(&["a", "b", "c"], &[good(1), b"garbage".to_vec(), good(3)]),
            "ERR",
        ),
        (
            "a refund onto nothing in pair 2 of 3",
            pairs(&["a", "b", "held"], &[good(1), refund.clone(), good(3)]),
            "ERR",
        ),
        (
            "a wrong-type key in pair 3",
            pairs(&["a", "held", "str"], &[good(1), good(2), good(3)]),
            "WRONGTYPE",
        ),
        (
            "a key named twice",
            pairs(&["a", "b", "a"], &[good(1), good(2), good(3)]),
            "ERR ratelimit.apply names a key twice",
        ),
    ];
    for (what, cmd, error) in &cases {
        let reply = common::send_one(&mut con, cmd);
        let text = common::error_text(&reply).unwrap_or_else(|| panic!("{what}: {reply:?}"));
        assert!(text.starts_with(error), "{what}: {text}");
        assert_eq!(state(&mut con), before, "{what}: changed the data set");
    }
    // The same pairs, well formed: all applied, each as the single-pair form applies it.
    let payloads = [good(1), good(2), good(3)];
    let ok: String = pairs(&["a", "b", "held"], &payloads)
        .query(&mut con)
        .expect("multi-pair rla");
    assert_eq!(ok, "OK");
    for (i, payload) in payloads.iter().enumerate() {
        let single = format!("single{i}");
        let _: String = redis::cmd("rla")
            .arg(&single)
            .arg(payload.as_slice())
            .query(&mut con)
            .unwrap();
        let key = ["a", "b", "held"][i];
        let digests: Vec<String> = redis::cmd("DEBUG")
            .arg("DIGEST-VALUE")
            .arg(key)
            .arg(&single)
            .query(&mut con)
            .unwrap();
        assert_eq!(digests[0], digests[1], "{key}: digest");
        let expiry = |con: &mut redis::Connection, k: &str| -> i64 {
            redis::cmd("PEXPIRETIME").arg(k).query(con).unwrap()
        };
        assert_eq!(expiry(&mut con, key), expiry(&mut con, &single), "{key}");
    }
}
