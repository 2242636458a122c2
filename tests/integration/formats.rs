//! The formats users' data lives in, pinned by golden fixtures (tests/integration/fixtures/,
//! README.md there): an RDB file this module wrote loads into a server with the module, every key
//! with the state, expiry and DUMP bytes the fixture records, in its in-memory form (a word, the
//! 32-byte form, a sliding log); and the RATELIMIT.APPLY payloads of each kind (whole limiter, log
//! append, packed limiter), as replication and the AOF carry them, rebuild the same keys.

use crate::common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use common::dump::Dump;
use common::{config_set, dbsize, int, limiter_info, pexpiretime, send_one, Server};
use redis::{Connection, Value};

/// One key of formats.txt.
struct Fixture {
    key: String,
    info: BTreeMap<String, String>,
    expires_at: i64,
    /// The DUMP payload but its RDB version and CRC.
    dump: Vec<u8>,
    /// The APPLY payloads, in order, their kind first.
    payloads: Vec<Vec<u8>>,
}

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/integration/fixtures")
}

fn hex(text: &str) -> Vec<u8> {
    assert!(text.len() % 2 == 0, "odd hex: {text}");
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

fn fixtures() -> Vec<Fixture> {
    let mut fixtures: Vec<Fixture> = Vec::new();
    for line in include_str!("fixtures/formats.txt").lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (field, value) = line.split_once(' ').expect("`field value`");
        if field == "key" {
            fixtures.push(Fixture {
                key: value.to_string(),
                info: BTreeMap::new(),
                expires_at: 0,
                dump: Vec::new(),
                payloads: Vec::new(),
            });
            continue;
        }
        let fixture = fixtures.last_mut().expect("a key first");
        match field {
            "info" => {
                fixture.info = value
                    .split(' ')
                    .map(|pair| {
                        let (name, value) = pair.split_once('=').expect("name=value");
                        (name.to_string(), value.to_string())
                    })
                    .collect()
            }
            "expires_at" => fixture.expires_at = value.parse().expect("ms"),
            "dump" => fixture.dump = hex(value),
            "payload" => fixture.payloads.push(hex(value)),
            other => panic!("formats.txt: unknown field {other}"),
        }
    }
    assert_eq!(fixtures.len(), 9, "the keys of formats.txt");
    fixtures
}

/// RATELIMIT.INFO as text, as formats.txt writes it.
fn info(con: &mut Connection, key: &str) -> BTreeMap<String, String> {
    let info = limiter_info(con, key).unwrap_or_else(|| panic!("{key}: no such limiter"));
    info.into_iter()
        .map(|(name, value)| {
            let value = match value {
                Value::Int(n) => n.to_string(),
                Value::SimpleString(text) => text,
                Value::BulkString(bytes) => String::from_utf8(bytes).expect("utf-8"),
                other => panic!("{key} {name}: {other:?}"),
            };
            (name, value)
        })
        .collect()
}

/// DUMP without its RDB version and CRC (they depend on the server).
fn dump_body(con: &mut Connection, key: &str) -> Vec<u8> {
    let payload: Vec<u8> = redis::cmd("DUMP").arg(key).query(con).expect("DUMP");
    payload[..payload.len() - 10].to_vec()
}

/// `key` holds what `fixture` says: its state, its expiry and its DUMP bytes.
fn assert_holds(con: &mut Connection, key: &str, fixture: &Fixture) {
    assert_eq!(info(con, key), fixture.info, "{key}: RATELIMIT.INFO");
    assert_eq!(
        pexpiretime(con, key),
        fixture.expires_at,
        "{key}: PEXPIRETIME"
    );
    assert_eq!(dump_body(con, key), fixture.dump, "{key}: DUMP");
}

#[test]
fn an_rdb_written_by_this_version_loads_every_key_as_it_was() {
    let server = Server::builder()
        .rdb(&fixtures_dir().join("formats.rdb"))
        .start();
    let mut con = server.client();
    // DUMP's string buffers verbatim, as formats.txt records them.
    config_set(&mut con, "rdbcompression", "no").unwrap();
    let fixtures = fixtures();
    assert_eq!(dbsize(&mut con), fixtures.len() as i64);
    for fixture in &fixtures {
        assert_holds(&mut con, &fixture.key, fixture);
        // The RDB holds the whole-limiter encoding an AOF rewrite writes (payload kind 1).
        let whole = fixture.payloads.last().expect("a rewrite's payload");
        assert_eq!(whole[0], 1, "{}", fixture.key);
        let payload: Vec<u8> = redis::cmd("DUMP")
            .arg(&fixture.key)
            .query(&mut con)
            .unwrap();
        assert_eq!(Dump::parse(&payload).limiter, whole[1..], "{}", fixture.key);
    }
    // Each in its form (names of one length): a word, 32 bytes more, a log's entries besides.
    let usage =
        |con: &mut Connection, key: &str| int(con, redis::cmd("MEMORY").arg("USAGE").arg(key));
    let word = usage(&mut con, "word:tb");
    for fixture in &fixtures {
        let (key, bytes) = (&fixture.key, usage(&mut con, &fixture.key));
        match &key[..5] {
            "word:" => assert_eq!(bytes, word, "{key} in a word"),
            "wide:" => assert_eq!(bytes, word + 32, "{key} in the 32-byte form"),
            _ => assert!(bytes > word + 32, "{key}: a log ({bytes} bytes)"),
        }
    }
}

#[test]
fn the_payloads_of_every_kind_rebuild_the_same_keys() {
    let server = Server::start();
    let mut con = server.client();
    config_set(&mut con, "rdbcompression", "no").unwrap();
    let mut kinds = std::collections::BTreeSet::new();
    for fixture in fixtures() {
        for kind in [1u8, 2, 3] {
            let payloads: Vec<&Vec<u8>> =
                fixture.payloads.iter().filter(|p| p[0] == kind).collect();
            if payloads.is_empty() {
                continue;
            }
            kinds.insert(kind);
            // Under the name each was written with: commands replicate `rla`, rewrites the long
            // name.
            let command = if kind == 1 { "RATELIMIT.APPLY" } else { "rla" };
            let key = format!("{kind}:{}", fixture.key);
            for payload in payloads {
                let reply = send_one(&mut con, redis::cmd(command).arg(&key).arg(payload));
                assert_eq!(reply, Value::Okay, "{command} {key}");
            }
            assert_holds(&mut con, &key, &fixture);
        }
    }
    assert_eq!(kinds.into_iter().collect::<Vec<_>>(), [1, 2, 3]);
}
