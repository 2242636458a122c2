//! Bytes per key and per sliding-log entry, the library against the module and the seed's ZSET.

use redis::Connection;

use super::engines::{algorithms, both_engines, both_infos, fcall, native, words};
use crate::common::{future_base_ms, int, reply6, send, send_one, show_value};

/// `MEMORY USAGE key SAMPLES 0`: every element counted.
fn memory_usage(con: &mut Connection, key: &str) -> i64 {
    int(
        con,
        redis::cmd("MEMORY").arg(&["USAGE", key, "SAMPLES", "0"]),
    )
}

/// Bytes per key for every algorithm, and per entry of a full sliding log, against the module
/// and the seed's ZSET (a member per request): printed with `--nocapture`.
#[test]
fn memory_per_key_and_per_log_entry() {
    let (_server, mut con) = both_engines();
    let at = future_base_ms();
    println!(
        "MEMORY USAGE of one key (`rl:` and 12 digits, 15-byte names; state after one CHECK):"
    );
    for algorithm in algorithms().into_iter().map(|a| a.name()) {
        let args = words(&format!("{algorithm} 100 1m AT {at}"));
        send(
            &mut con,
            &[
                native("check", &["rl:000000000001"], &args),
                fcall("check", &["rl:000000000002"], &args),
            ],
        );
        let (module, library) = (
            memory_usage(&mut con, "rl:000000000001"),
            memory_usage(&mut con, "rl:000000000002"),
        );
        println!("  {algorithm:15} module {module:4} B   library {library:4} B");
        int(
            &mut con,
            redis::cmd("DEL").arg(&["rl:000000000001", "rl:000000000002"]),
        );
        assert!(library <= 160, "{algorithm}: {library} B");
    }

    // A full log of 100000 entries 700 ms apart, then 20000 more calls sliding it (one entry
    // leaves as one comes), as the module's own memory test measures it.
    const ENTRIES: u64 = 100_000;
    const GAP: u64 = 700;
    let period = ENTRIES * GAP;
    let args = |t: u64| words(&format!("sliding-log {ENTRIES} {period} AT {t}"));
    let fill = |con: &mut Connection, from: u64, to: u64| {
        for chunk in (from..to).collect::<Vec<_>>().chunks(2000) {
            let mut cmds = Vec::new();
            for &i in chunk {
                cmds.push(native("check", &["log:module"], &args(at + i * GAP)));
                cmds.push(fcall("check", &["log:library"], &args(at + i * GAP)));
            }
            let replies = send(con, &cmds);
            for pair in replies.chunks_exact(2) {
                assert_eq!(pair[0], pair[1]);
                assert_eq!(reply6(&pair[0])[0], 1, "{}", show_value(&pair[0]));
            }
        }
    };
    fill(&mut con, 0, ENTRIES);
    for chunk in (0..ENTRIES).collect::<Vec<_>>().chunks(5000) {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg("log:seed");
        for &i in chunk {
            zadd.arg(at + i * GAP).arg(at + i * GAP); // the seed's ZADD key t t
        }
        send_one(&mut con, &zadd);
    }
    let per_entry =
        |con: &mut Connection, key: &str| memory_usage(con, key) as f64 / ENTRIES as f64;
    let full = (
        per_entry(&mut con, "log:module"),
        per_entry(&mut con, "log:library"),
        per_entry(&mut con, "log:seed"),
    );
    fill(&mut con, ENTRIES, ENTRIES + 20_000);
    let slid = (
        per_entry(&mut con, "log:module"),
        per_entry(&mut con, "log:library"),
    );
    println!(
        "sliding log, {ENTRIES} entries {GAP} ms apart, bytes per entry: module {:.2}, library \
         {:.2}, seed ZSET {:.2}; after sliding 20000 more: module {:.2}, library {:.2}",
        full.0, full.1, full.2, slid.0, slid.1
    );
    let (module, library) = both_infos(&mut con, "log:module", "log:library");
    assert_eq!(module, library);
    assert!(full.1 < 4.5 && slid.1 < 6.0, "library: {full:?} {slid:?}");
    assert!(slid.1 * 4.0 < full.2, "library {slid:?} vs seed {full:?}");
}
