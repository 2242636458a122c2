//! RESTORE and APPLY of crafted lease sets are refused.

use super::{dump, le};
use crate::common;
use common::dump::restore;
use common::{
    config_set, digest, error_text, exists, future_base_ms, pexpiretime, run_ok, send_one, Server,
    MAX_AMOUNT, MAX_PERIOD_MS, TIME_LIMIT_MS,
};
use redis::{Connection, Value};

/// A lease set's encoding (core/src/codec/limiter.rs): the head, then `u64 count` and per lease
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
