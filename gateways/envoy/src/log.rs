//! Structured logs on stderr: one line per event, `LOG_FORMAT=json` for JSON lines (the fields
//! envoyproxy/ratelimit's logrus JSON has: `@timestamp`, `level`, `@message`), text otherwise.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug = 0,
    Info = 1,
    Warn = 2,
    Error = 3,
}

static MIN_LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);
static JSON: AtomicBool = AtomicBool::new(false);

pub fn init(min: Level, json: bool) {
    MIN_LEVEL.store(min as u8, Ordering::Relaxed);
    JSON.store(json, Ordering::Relaxed);
}

fn name(level: Level) -> &'static str {
    match level {
        Level::Debug => "debug",
        Level::Info => "info",
        Level::Warn => "warning",
        Level::Error => "error",
    }
}

pub fn log(level: Level, message: &str, fields: &[(&str, &str)]) {
    if (level as u8) < MIN_LEVEL.load(Ordering::Relaxed) {
        return;
    }
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let line = if JSON.load(Ordering::Relaxed) {
        let mut map = serde_json::Map::new();
        map.insert("@timestamp_ms".into(), serde_json::Value::from(ms as u64));
        map.insert("level".into(), name(level).into());
        map.insert("@message".into(), message.into());
        for (k, v) in fields {
            map.insert((*k).to_owned(), (*v).into());
        }
        serde_json::Value::Object(map).to_string()
    } else {
        let mut line = format!("time_ms={ms} level={} msg={:?}", name(level), message);
        for (k, v) in fields {
            line.push_str(&format!(" {k}={v:?}"));
        }
        line
    };
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}
