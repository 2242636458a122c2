//! `cargo test --bench compare` (or `cargo bench --bench compare -- --self-test`): checks, without
//! any server, that the bench understands the tools' output and writes well-formed reports. Not a
//! timed test: it takes milliseconds. Panics (exit status 101) on the first failure.

use std::io::BufReader;

use crate::model::*;
use crate::parse::{parse_benchmark_csv, parse_cmdstat, parse_info, Summary};
use crate::report;
use crate::resp::{self, Reply};

/// `redis-benchmark --csv` of redis 7.0.15, one custom command.
const CSV_70: &str = r#""test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"RATELIMIT.CHECK rl:__rand_int__ token-bucket 1000000 1000","83472.46","8.786","0.544","7.751","20.303","27.935","28.895"
"#;

/// The same, with an argument holding a comma and a quote, and columns reordered.
const CSV_ODD: &str =
    "\"rps\",\"test\",\"p99_latency_ms\"\n\"1234.5\",\"EVALSHA x \"\"a,b\"\" \",\"9.5\"\n";

const COMMANDSTATS: &str = "# Commandstats\r\n\
cmdstat_ratelimit.check:calls=100002,usec=399548,usec_per_call=4.00,rejected_calls=0,failed_calls=1\r\n\
cmdstat_evalsha:calls=50000,usec=2828590,usec_per_call=56.57,rejected_calls=0,failed_calls=0\r\n\
cmdstat_config|resetstat:calls=1,usec=7,usec_per_call=7.00,rejected_calls=0,failed_calls=0\r\n";

const INFO_MEMORY: &str = "# Memory\r\nused_memory:1104536\r\nused_memory_human:1.05M\r\n";

pub fn run() {
    let line = parse_benchmark_csv(CSV_70).expect("7.0 CSV");
    assert_eq!(line.rps, 83472.46);
    assert_eq!(line.p50_ms, 7.751);
    assert_eq!(line.p99_ms, 27.935);
    assert_eq!(line.avg_ms, 8.786);
    let odd = parse_benchmark_csv(CSV_ODD).expect("reordered CSV");
    assert_eq!((odd.rps, odd.p99_ms), (1234.5, 9.5));
    assert!(odd.p50_ms.is_nan());
    assert!(parse_benchmark_csv("").is_err());
    assert!(parse_benchmark_csv("\"test\",\"rps\"\n\"PING\",\"0.00\"\n").is_err());

    let check = parse_cmdstat(COMMANDSTATS, "ratelimit.check").expect("cmdstat");
    assert_eq!(
        (check.calls, check.usec, check.failed_calls),
        (100002, 399548, 1)
    );
    assert!((check.usec_per_call - 399548.0 / 100002.0).abs() < 1e-9);
    let evalsha = parse_cmdstat(COMMANDSTATS, "evalsha").expect("evalsha");
    assert_eq!(evalsha.calls, 50000);
    assert!(parse_cmdstat(COMMANDSTATS, "set").is_none());
    assert_eq!(parse_info(INFO_MEMORY)["used_memory"], "1104536");

    let s = Summary::of(&[3.0, 1.0, 2.0, f64::NAN]).expect("summary");
    assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
    assert_eq!(Summary::of(&[1.0, 4.0]).expect("even").median, 2.5);
    assert!(Summary::of(&[]).is_none());

    let mut wire: &[u8] =
        b"*6\r\n:1\r\n:3\r\n:2\r\n:0\r\n:334\r\n:0\r\n-ERR bad\r\n$-1\r\n$3\r\nabc\r\n+OK\r\n";
    let mut reader = BufReader::new(&mut wire);
    let first = resp::read_reply(&mut reader).expect("array");
    assert_eq!(first.allowed(), Some(1));
    assert_eq!(
        resp::read_reply(&mut reader).expect("error"),
        Reply::Error("ERR bad".into())
    );
    assert_eq!(
        resp::read_reply(&mut reader).expect("nil"),
        Reply::Bulk(None)
    );
    assert_eq!(
        resp::read_reply(&mut reader).expect("bulk"),
        Reply::Bulk(Some(b"abc".to_vec()))
    );
    assert_eq!(
        resp::read_reply(&mut reader).expect("status"),
        Reply::Status("OK".into())
    );
    assert!(resp::read_reply(&mut reader).is_err());
    let mut wire: &[u8] = b"*2\r\n:0\r\n$2\r\nab\r\n-ERR x\r\n:-7\r\n+OK\r\n";
    let mut reader = BufReader::new(&mut wire);
    let mut line = Vec::new();
    let mut skim = || resp::skim_reply(&mut reader, &mut line).expect("skim");
    assert_eq!(skim(), Ok(Some(0)));
    assert_eq!(skim(), Err("ERR x".to_string()));
    assert_eq!(skim(), Ok(Some(-7)));
    assert_eq!(skim(), Ok(None));
    let mut encoded = Vec::new();
    resp::encode(&mut encoded, &["EVALSHA", ""]);
    assert_eq!(encoded, b"*2\r\n$7\r\nEVALSHA\r\n$0\r\n\r\n");

    resp3();

    let results = synthetic();
    let md = report::markdown(&results);
    for needle in [
        // Each algorithm's module, library and Lua script: 150, 60 and 30 kreq/s (gcra 170).
        "| token-bucket | consuming | 150.0 | 60.0 | 30.0 | 5.00x | 2.50x | 2.00x | 4.0 / 10.0 / 25.0 |",
        "| gcra | rejected | 170.0 | 60.0 | 30.0 | 5.67x | 2.83x | 2.00x | 3.5 / 10.0 / 25.0 |",
        // Against SET PXAT (140 kreq/s, 3.5 usec) and a hot INCR (200 kreq/s).
        "| token-bucket native | 150.0 [140.0..160.0] | 1.07x | 4.00 [4.00..4.00] | 1.14x | \
         150.0 [140.0..160.0] | 0.75x | 0.500 / 2.000 |",
        "| SET k v PXAT t | 140.0 [130.0..150.0] |  | 3.50 [3.50..3.50] |  |",
        "| CL.THROTTLE (ours) | 180.0 [170.0..190.0] | 1.50x | 3.00 [3.00..3.00] | \
         180.0 [170.0..190.0] | 1.50x | 96 B |",
        "| RATELIMIT.CHECK ... gcra | 170.0 [160.0..180.0] | 1.42x |",
        "| CL.THROTTLE (redis-cell) | 120.0 [110.0..130.0] |  |",
        // Without and with a replica: 150 -> 120 kreq/s for CHECK, 140 -> 100 for SET PXAT.
        "| token-bucket native | 150.0 [140.0..160.0] | 120.0 [110.0..130.0] | 0.80x | \
         1.07x / 1.20x | 1.14x / 1.00x |",
        "| SET k v PXAT t | 140.0 [130.0..150.0] | 100.0 [90.0..110.0] | 0.71x |  |  |",
        // RESP3 at 0.9x RESP2's throughput, 1.25x its usec_per_call.
        "| gcra | consuming | 200.0 [190.0..210.0] | 180.0 [170.0..190.0] | 0.90x | 1.25x |",
        "| sliding-log | rejected | 200.0 [190.0..210.0] | 180.0 [170.0..190.0] | 0.90x |",
        "| token-bucket/native | 1k | 140 B | 120 B (500..1k) | +30 B | 120 B |",
        "| token-bucket native | 3.00 [3.00..3.00] | 4.00 [4.00..4.00] | 1.33x |",
        "Note: synthetic results",
    ] {
        assert!(md.contains(needle), "Markdown lacks {needle:?}:\n{md}");
    }
    for absent in ["Target", "PASS", "FAIL", "threshold", "NaN", "inf"] {
        assert!(!md.contains(absent), "Markdown speaks of {absent:?}:\n{md}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&report::json(&results)).expect("the JSON report parses");
    assert_eq!(
        json["cases"].as_array().map(Vec::len),
        Some(results.cases.len())
    );
    assert_eq!(json["cases"][0]["rps"]["median"], 150000.0);
    assert_eq!(json["cases"][0]["samples"][2]["rps"], 160000.0);
    assert_eq!(json["memory"][1]["marginal_bytes_per_key"], 120.0);
    assert_eq!(json["scaling"][1]["points"][1]["keys"], 1_000_000);
    assert!(json.get("targets").is_none());
    // Without redis-cell (no ../shared/peers/): its rows are left out, the rest stays.
    let mut alone = synthetic();
    alone.redis_cell = None;
    alone.cases.retain(|c| c.subject != Subject::Cell);
    alone.memory.retain(|m| m.id != Subject::Cell.id());
    let md = report::markdown(&alone);
    assert!(md.contains("redis-cell was not measured"), "{md}");
    assert!(
        md.contains("| CL.THROTTLE (ours) | 180.0 [170.0..190.0] | n/a |"),
        "{md}"
    );
    assert!(!md.contains("| CL.THROTTLE (redis-cell) |"), "{md}");
    // Without the replica and RESP3 phases: no such tables.
    alone.replica = false;
    alone
        .cases
        .retain(|c| matches!(c.group, Group::Random { .. } | Group::Hot { .. }));
    let md = report::markdown(&alone);
    assert!(
        !md.contains("with a replica") && !md.contains("RESP3"),
        "{md}"
    );
    println!("bench self-test: parsers and report writers OK (run `make bench` to benchmark)");
}

/// RESP3 replies as the module and the server send them: a CHECK's map, `HELLO 3`'s map, a
/// blob error, attributes; read whole and skimmed (the load generator's way), and the load
/// generator's own command line.
fn resp3() {
    const CHECK: &[u8] = b"%6\r\n+allowed\r\n#t\r\n+limit\r\n:10\r\n+remaining\r\n:9\r\n\
        +retry_after_ms\r\n:-1\r\n+reset_after_ms\r\n:100\r\n+consumed\r\n:1\r\n";
    const REJECTED: &[u8] = b"%6\r\n+allowed\r\n#f\r\n+limit\r\n:1\r\n+remaining\r\n:0\r\n\
        +retry_after_ms\r\n:5\r\n+reset_after_ms\r\n:5\r\n+consumed\r\n:0\r\n";
    const HELLO: &[u8] = b"%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$6\r\n7.0.15\r\n\
        $5\r\nproto\r\n:3\r\n$2\r\nid\r\n:5\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n\
        $4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*1\r\n%2\r\n$4\r\nname\r\n$9\r\nratelimit\r\n\
        $3\r\nver\r\n:1\r\n";
    let mut wire = Vec::new();
    for part in [
        CHECK,
        REJECTED,
        HELLO,
        b"!9\r\nERR x\r\nyz\r\n",
        b"|1\r\n+ttl\r\n:3\r\n#t\r\n",
        b"_\r\n,1.5\r\n~2\r\n:0\r\n:1\r\n",
    ] {
        wire.extend_from_slice(part);
    }
    let mut reader = BufReader::new(wire.as_slice());
    let mut read = || resp::read_reply(&mut reader).expect("RESP3 reply");
    let check = read();
    assert_eq!(check.allowed(), Some(1));
    let Reply::Map(pairs) = &check else {
        panic!("not a map: {check:?}")
    };
    assert_eq!(pairs.len(), 6);
    assert_eq!(
        pairs[0],
        (Reply::Status("allowed".into()), Reply::Bool(true))
    );
    assert_eq!(pairs[4].1, Reply::Int(100));
    assert_eq!(read().allowed(), Some(0));
    let hello = read();
    assert!(matches!(&hello, Reply::Map(p) if p.len() == 7), "{hello:?}");
    assert_eq!(read(), Reply::Error("ERR x\r\nyz".into()));
    assert_eq!(read(), Reply::Bool(true));
    assert_eq!(read(), Reply::Null);
    assert_eq!(read(), Reply::Double("1.5".into()));
    assert_eq!(
        read(),
        Reply::Array(Some(vec![Reply::Int(0), Reply::Int(1)]))
    );
    let mut reader = BufReader::new(wire.as_slice());
    let mut line = Vec::new();
    let mut skim = || resp::skim_reply(&mut reader, &mut line).expect("skim RESP3");
    assert_eq!(skim(), Ok(Some(1)));
    assert_eq!(skim(), Ok(Some(0)));
    assert_eq!(
        skim(),
        Ok(None),
        "HELLO's first value is a string, not a decision"
    );
    assert_eq!(skim(), Err("ERR x\r\nyz".to_string()));
    assert_eq!(skim(), Ok(Some(1)));
    assert_eq!(skim(), Ok(None));
    assert_eq!(skim(), Ok(None));
    assert_eq!(skim(), Ok(Some(0)));
    let mut reader = BufReader::new(&b"*2\r\n-ERR in\r\n:1\r\n"[..]);
    assert_eq!(
        resp::skim_reply(&mut reader, &mut line).expect("skim"),
        Err("ERR in".to_string()),
        "an error inside an aggregate is reported"
    );
    let args = |list: &[&str]| list.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    assert!(crate::drive::run(&args(&["--drive", "--port", "1"])).is_err());
    assert!(crate::drive::run(&args(&[
        "--drive", "--resp", "4", "--port", "1", "-n", "1", "--", "PING"
    ]))
    .unwrap_err()
    .contains("2 or 3"));
    assert!(crate::drive::run(&args(&["--drive", "--bogus"])).is_err());
}

fn sample(rps: f64, usec: f64) -> Sample {
    Sample {
        requests: 1000,
        seconds: 1.0,
        rps,
        avg_ms: 1.0,
        p50_ms: 0.5,
        p99_ms: 2.0,
        usec_per_call: usec,
    }
}

/// Results with round numbers: natives at 150k (gcra's at 170k), the library at 60k, Lua at 30k,
/// floors 120k-200k.
fn synthetic() -> Results {
    let mut cases = Vec::new();
    let groups = [
        Group::Random { pipeline: 16 },
        Group::Hot { pipeline: 16 },
        Group::Random { pipeline: 1 },
        Group::Hot { pipeline: 1 },
    ];
    for group in groups {
        let mut subjects = Vec::new();
        for a in 0..ALGORITHMS.len() {
            let native = if a == GCRA {
                (170e3, 3.5)
            } else {
                (150e3, 4.0)
            };
            subjects.push((Subject::Native(a), native.0, native.1));
            subjects.push((Subject::Library(a), 60e3, 10.0));
            subjects.push((Subject::Lua(a), 30e3, 25.0));
        }
        subjects.push((Subject::Throttle, 180e3, 3.0));
        subjects.push((Subject::Cell, 120e3, 5.0));
        subjects.push((Subject::SetPxat, 140e3, 3.5));
        subjects.push((Subject::Incr, 200e3, 1.0));
        subjects.push((Subject::Ping, 250e3, 0.2));
        for (subject, rps, usec) in subjects {
            cases.push(CaseResult {
                group,
                subject,
                command: vec!["CMD".into(), "__rand_int__".into(), String::new()],
                samples: vec![
                    sample(rps - 10e3, usec),
                    sample(rps, usec),
                    sample(rps + 10e3, usec),
                ],
            });
        }
    }
    // Without and with a replica: CHECKs 150 -> 120 kreq/s, SET PXAT 140 -> 100, INCR 200 -> 160;
    // usec_per_call 4 -> 5 for CHECKs and SET PXAT alike (3.5 -> 5 for SET PXAT).
    for attached in [false, true] {
        let mut subjects: Vec<(Subject, f64, f64)> =
            vec![(Subject::SetPxat, 140e3, 3.5), (Subject::Incr, 200e3, 1.0)];
        subjects.extend((0..ALGORITHMS.len()).map(|a| (Subject::Native(a), 150e3, 4.0)));
        for (subject, rps, usec) in subjects {
            let (rps, usec) = match (attached, subject) {
                (false, _) => (rps, usec),
                (true, Subject::SetPxat) => (100e3, 5.0),
                (true, _) => (rps * 0.8, usec + 1.0),
            };
            cases.push(CaseResult {
                group: Group::Replica { attached },
                subject,
                command: vec!["CMD".into()],
                samples: vec![
                    sample(rps - 10e3, usec),
                    sample(rps, usec),
                    sample(rps + 10e3, usec),
                ],
            });
        }
    }
    // RESP2 at 200 kreq/s and 4 usec per call, RESP3 at 180 and 5.
    for a in 0..ALGORITHMS.len() {
        for hot in [false, true] {
            for (protocol, rps, usec) in [(2, 200e3, 4.0), (3, 180e3, 5.0)] {
                cases.push(CaseResult {
                    group: Group::Resp { protocol, hot },
                    subject: Subject::Native(a),
                    command: vec!["CMD".into()],
                    samples: vec![
                        sample(rps - 10e3, usec),
                        sample(rps, usec),
                        sample(rps + 10e3, usec),
                    ],
                });
            }
        }
    }
    let memory = |id: &str, bytes: f64| MemoryResult {
        id: id.into(),
        label: id.into(),
        keys: 1000,
        calls_per_key: 1,
        bytes_per_key: bytes + 20.0,
        marginal: Some((500, bytes)),
        memory_usage: Some(bytes as i64),
    };
    let flat = |v: f64| Summary {
        median: v,
        min: v,
        max: v,
    };
    Results {
        machine: Machine {
            date_utc: "2025-01-01 00:00 UTC".into(),
            cpu_model: "Test <CPU> & Co".into(),
            nproc: 2,
            ..Machine::default()
        },
        quick: true,
        repetitions: 3,
        clients: 50,
        keyspace: 100_000,
        run_seconds_target: 0.5,
        pinned: true,
        redis_cell: Some("redis-cell (test)".into()),
        replica: true,
        total_seconds: 60.0,
        cases,
        memory: vec![
            memory("set-pxat", 90.0),
            memory("token-bucket/native", 120.0),
            memory("token-bucket/library", 150.0),
            memory("token-bucket/lua", 200.0),
            memory("leaky-bucket/native", 140.0),
            memory("gcra/native", 96.0),
            memory("gcra/library", 128.0),
            memory("gcra/lua", 192.0),
            memory("cl-throttle/ours", 96.0),
            memory("cl-throttle/redis-cell", 120.0),
            memory("sliding-log/native-100", 900.0),
            memory("sliding-log/library-100", 1000.0),
            memory("sliding-log/seed-zset-100", 2000.0),
        ],
        scaling: vec![
            ScalingResult {
                subject: Subject::SetPxat,
                points: vec![
                    (1_000, Some(flat(2.0)), None),
                    (1_000_000, Some(flat(3.0)), None),
                ],
            },
            ScalingResult {
                subject: Subject::Native(0),
                points: vec![
                    (1_000, Some(flat(3.0)), None),
                    (1_000_000, Some(flat(4.0)), None),
                ],
            },
        ],
        notes: vec!["synthetic results".into()],
    }
}
