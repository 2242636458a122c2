//! Racing clients never hold more than the limit; a key holds at most 100000 live leases; what a
//! lease costs in memory.

use super::{acquire_args, lease_cmd, library_acquire, library_release, Engine};
use crate::common::{
    config_set, digest, error_text, future_base_ms, info_fields, info_int, int, pexpiretime, send,
    send_one, show_value, try_reply6, Server, MAX_AMOUNT,
};
use crate::functions::engines::{as_library_error, both_engines, fcall, library_only};
use crate::leases::race;
use redis::{Cmd, Connection, Value};

#[test]
fn racing_clients_never_hold_more_than_the_limit() {
    let (server, _con) = library_only(Server::builder());
    race(&server, library_acquire, library_release);
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
