//! The conformance vectors `tests/vectors/v1.json` (tests/vectors/README.md) and the core:
//! the committed file is exactly what `cargo run -p redis-ratelimit-core --example vectors`
//! prints, and the core replays it: each call read back from the file and decided again gives
//! the file's reply and stored key.

#[path = "../examples/vectors.rs"]
mod generator;

use std::collections::BTreeMap;

use generator::{call_json, Call, Keyspace, Op, Spec};
use redis_ratelimit_core::algorithms::Algorithm;

const REGENERATE: &str =
    "cargo run -p redis-ratelimit-core --example vectors > tests/vectors/v1.json";

fn committed() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/vectors/v1.json");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e} ({REGENERATE})"))
}

#[test]
fn committed_vectors_are_what_the_core_generates() {
    let (file, generated) = (committed(), generator::generate());
    if file != generated {
        let line = file
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(file.lines().count().min(generated.lines().count()));
        panic!(
            "tests/vectors/v1.json is not what the core generates: first difference at line {}:\n  \
             file:      {}\n  generated: {}\nIf the core's change is meant, regenerate it \
             (`{REGENERATE}`) and every engine's replay will show where it must follow.",
            line + 1,
            file.lines().nth(line).unwrap_or("(end)"),
            generated.lines().nth(line).unwrap_or("(end)"),
        );
    }
}

/// A JSON value, as far as the vectors need one.
#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Number(String),
    Text(String),
    List(Vec<Json>),
    Object(BTreeMap<String, Json>),
}

struct Parser<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn skip_space(&mut self) {
        while self.pos < self.bytes.len() && self.bytes[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }

    fn expect(&mut self, byte: u8) {
        self.skip_space();
        assert_eq!(
            self.bytes.get(self.pos),
            Some(&byte),
            "at byte {}",
            self.pos
        );
        self.pos += 1;
    }

    fn text(&mut self) -> String {
        self.expect(b'"');
        let start = self.pos;
        while self.bytes[self.pos] != b'"' {
            assert_ne!(self.bytes[self.pos], b'\\', "no escapes in the vectors");
            self.pos += 1;
        }
        self.pos += 1;
        String::from_utf8(self.bytes[start..self.pos - 1].to_vec()).expect("UTF-8")
    }

    fn value(&mut self) -> Json {
        self.skip_space();
        match self.bytes[self.pos] {
            b'{' => {
                self.pos += 1;
                let mut fields = BTreeMap::new();
                self.skip_space();
                if self.bytes[self.pos] == b'}' {
                    self.pos += 1;
                    return Json::Object(fields);
                }
                loop {
                    let name = self.text();
                    self.expect(b':');
                    fields.insert(name, self.value());
                    self.skip_space();
                    self.pos += 1;
                    if self.bytes[self.pos - 1] == b'}' {
                        return Json::Object(fields);
                    }
                }
            }
            b'[' => {
                self.pos += 1;
                let mut items = Vec::new();
                self.skip_space();
                if self.bytes[self.pos] == b']' {
                    self.pos += 1;
                    return Json::List(items);
                }
                loop {
                    items.push(self.value());
                    self.skip_space();
                    self.pos += 1;
                    if self.bytes[self.pos - 1] == b']' {
                        return Json::List(items);
                    }
                }
            }
            b'"' => Json::Text(self.text()),
            b'n' => {
                self.pos += 4;
                Json::Null
            }
            _ => {
                let start = self.pos;
                while self.bytes[self.pos] == b'-' || self.bytes[self.pos].is_ascii_digit() {
                    self.pos += 1;
                }
                Json::Number(String::from_utf8(self.bytes[start..self.pos].to_vec()).unwrap())
            }
        }
    }
}

fn parse(text: &str) -> Json {
    let mut parser = Parser {
        bytes: text.as_bytes(),
        pos: 0,
    };
    let value = parser.value();
    parser.skip_space();
    assert_eq!(parser.pos, text.len(), "one JSON value");
    value
}

fn field<'a>(value: &'a Json, name: &str) -> Option<&'a Json> {
    match value {
        Json::Object(fields) => fields.get(name),
        _ => None,
    }
}

fn number(value: &Json, name: &str) -> Option<u64> {
    match field(value, name)? {
        Json::Number(text) => Some(text.parse().expect("an integer")),
        _ => None,
    }
}

/// The call a vector's input fields describe.
fn call_of(vector: &Json) -> Call {
    let Some(Json::Text(op)) = field(vector, "op") else {
        panic!("op in {vector:?}")
    };
    let amount = |name| number(vector, name).expect(name);
    if op == "reset" {
        // RESET names no limit: any spec, it is not read.
        let spec = Spec {
            algorithm: Algorithm::FixedWindow,
            limit: 1,
            period_ms: 1,
            burst: None,
            block_ms: None,
        };
        return Call {
            op: Op::Reset,
            spec,
            at_ms: 0,
        };
    }
    let Some(Json::Text(name)) = field(vector, "algorithm") else {
        panic!("algorithm in {vector:?}")
    };
    let spec = Spec {
        algorithm: Algorithm::parse(name.as_bytes()).expect("an algorithm"),
        limit: amount("limit"),
        period_ms: amount("period_ms"),
        burst: number(vector, "burst"),
        block_ms: number(vector, "block_ms"),
    };
    let op = match op.as_str() {
        "check" => Op::Check(amount("cost")),
        "peek" => Op::Peek(amount("cost")),
        "take" => Op::Take(amount("max")),
        "refund" => Op::Refund(amount("cost")),
        other => panic!("unknown op {other}"),
    };
    Call {
        op,
        spec,
        at_ms: amount("at"),
    }
}

#[test]
fn the_core_replays_the_vectors() {
    let file = parse(&committed());
    assert_eq!(number(&file, "version"), Some(generator::VERSION));
    let Some(Json::List(groups)) = field(&file, "groups") else {
        panic!("groups")
    };
    let mut replayed = 0;
    for group in groups {
        let Some(Json::Text(key)) = field(group, "key") else {
            panic!("key")
        };
        let Some(Json::List(calls)) = field(group, "calls") else {
            panic!("calls")
        };
        let mut keys = Keyspace::default();
        for (i, vector) in calls.iter().enumerate() {
            let call = call_of(vector);
            let reply = keys.apply(key, &call);
            let replayed_vector = parse(&call_json(&call, &reply, keys.keys.get(key.as_str())));
            for name in ["reply", "stored"] {
                assert_eq!(
                    field(&replayed_vector, name),
                    field(vector, name),
                    "{key} call {i}: {name}"
                );
            }
            replayed += 1;
        }
    }
    println!("the core replayed {replayed} vectors");
    assert!(replayed >= 500);
}

/// What the timelines exercise, per algorithm: counted so that a change of the generator cannot
/// silently leave a case out.
#[test]
fn the_vectors_cover_every_case_of_every_algorithm() {
    use generator::Reply;
    let mut seen: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for group in generator::groups() {
        let mut keys = Keyspace::default();
        let key = "k";
        for call in &group.calls {
            let before = keys.keys.get(key).cloned();
            let reply = keys.apply(key, call);
            let after = keys.keys.get(key);
            let name = call.spec.algorithm.name();
            let mut count = |case| *seen.entry((name, case)).or_default() += 1;
            let Reply::Fields(f) = reply else {
                count("reset");
                continue;
            };
            match call.op {
                Op::Check(0) | Op::Peek(0) => count("cost 0"),
                Op::Peek(_) => count("peek with a cost"),
                Op::Check(_) if f[0] == 0 => count("rejected"),
                Op::Take(max) if f[0] > 0 && (f[0] as u64) < max => count("partial grant"),
                Op::Take(_) if f[0] == 0 => count("nothing granted"),
                Op::Refund(_) if before.is_some() && after.is_none() => count("refund deletes"),
                _ => {}
            }
            if f[3] == -1 {
                count("never");
            }
            if f.contains(&i64::MAX) {
                count("saturated");
            }
            if let Some(before) = &before {
                if call.at_ms < before.last_ms {
                    count("late call");
                }
                if before.params != call.spec.params() {
                    count("parameter change");
                }
                if before.blocked_at(call.at_ms.max(before.last_ms)) {
                    count("blocked");
                } else if after.is_some_and(|a| a.blocked_until_ms > before.blocked_until_ms) {
                    count("block starts");
                }
            }
        }
    }
    let mut missing = Vec::new();
    for algorithm in Algorithm::ALL {
        for case in [
            "reset",
            "cost 0",
            "peek with a cost",
            "rejected",
            "partial grant",
            "nothing granted",
            "refund deletes",
            "never",
            "late call",
            "parameter change",
            "blocked",
            "block starts",
        ] {
            if !seen.contains_key(&(algorithm.name(), case)) {
                missing.push(format!("{}: {case}", algorithm.name()));
            }
        }
    }
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Gcra,
    ] {
        if !seen.contains_key(&(algorithm.name(), "saturated")) {
            missing.push(format!("{}: saturated", algorithm.name()));
        }
    }
    println!("{seen:?}");
    assert!(missing.is_empty(), "never exercised: {missing:?}");
}
