//! The wire format: the arguments of each command, and its replies (RESP2 arrays, RESP3 maps,
//! the Functions library's RESP2 shapes under both) read into typed results. No I/O; never a
//! panic on any reply: a shape it does not know is [`Error::Protocol`].

use std::collections::BTreeMap;

use redis::{Cmd, ErrorKind, RedisError, Value};

use crate::types::{Decision, Error, MultiDecision, Source};

/// The six fields of a decision, in the RESP2 order.
pub const FIELDS: [&str; 6] = [
    "allowed",
    "limit",
    "remaining",
    "retry_after_ms",
    "reset_after_ms",
    "delay_ms",
];

/// The Functions library's name (`#!lua name=ratelimit`).
pub const LIBRARY_NAME: &str = "ratelimit";

/// Error replies that mean the server cannot serve now (not the caller's mistake).
const UNAVAILABLE_CODES: [&str; 7] = [
    "BUSY",
    "LOADING",
    "MASTERDOWN",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "OOM",
    "READONLY",
];

/// A command from words.
pub fn command<S: AsRef<[u8]>>(words: &[S]) -> Cmd {
    let mut cmd = Cmd::new();
    for word in words {
        cmd.arg(word.as_ref());
    }
    cmd
}

/// Whether `error` means Redis is down, refuses or did not answer (rather than an error reply
/// to a bad call).
pub fn unavailable(error: &RedisError) -> bool {
    if error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
    {
        return true;
    }
    match error.kind() {
        ErrorKind::BusyLoadingError
        | ErrorKind::TryAgain
        | ErrorKind::ClusterDown
        | ErrorKind::MasterDown
        | ErrorKind::ReadOnly
        | ErrorKind::ClusterConnectionNotFound
        | ErrorKind::IoError => return true,
        _ => {}
    }
    error
        .code()
        .is_some_and(|code| UNAVAILABLE_CODES.contains(&code))
}

/// An error reply's text as Redis sent it (`ERR ...`, `WRONGTYPE ...`).
pub fn reply_text(error: &RedisError) -> String {
    match (error.code(), error.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => error.to_string(),
    }
}

/// The server has no such command (a cluster client may say so before sending it).
pub fn unknown_command(error: &RedisError) -> bool {
    let text = reply_text(error).to_ascii_lowercase();
    text.contains("unknown command") || text.contains("command doesn't exist")
}

/// FCALL of a function the server does not have (the library was flushed or never loaded).
pub fn function_not_found(error: &RedisError) -> bool {
    reply_text(error)
        .to_ascii_lowercase()
        .contains("function not found")
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Okay => Some("OK".into()),
        _ => None,
    }
}

/// Whether `value` is the text `name` (a map's key), without copying it.
fn is_text(value: &Value, name: &str) -> bool {
    match value {
        Value::BulkString(bytes) => bytes.as_slice() == name.as_bytes(),
        Value::SimpleString(s) => s == name,
        Value::VerbatimString { text, .. } => text == name,
        _ => false,
    }
}

fn integer(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        Value::Boolean(b) => Some(i64::from(*b)),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn shape(what: &str, value: &Value) -> Error {
    let mut shown = format!("{value:?}");
    if shown.len() > 200 {
        let mut cut = 200;
        while !shown.is_char_boundary(cut) {
            cut -= 1;
        }
        shown.truncate(cut);
        shown.push_str("...");
    }
    Error::Protocol(format!("{what}: {shown}"))
}

/// A field/value reply (a flat array under RESP2, a map under RESP3) as pairs of a name and a
/// value.
pub fn pairs(value: &Value) -> Option<Vec<(String, &Value)>> {
    match value {
        Value::Map(items) => items
            .iter()
            .map(|(k, v)| Some((text(k)?, v)))
            .collect::<Option<Vec<_>>>(),
        Value::Array(items) if items.len() % 2 == 0 => items
            .chunks(2)
            .map(|pair| Some((text(&pair[0])?, &pair[1])))
            .collect::<Option<Vec<_>>>(),
        _ => None,
    }
}

/// The six integers of a decision reply: an array (RESP2, the library) or a map by name
/// (RESP3, `granted` in place of `allowed` for TAKE).
fn six(reply: &Value, take: bool) -> Option<[i64; 6]> {
    let mut out = [0i64; 6];
    match reply {
        Value::Map(items) => {
            // Names compared in place: no string made per field on every call.
            for (i, field) in FIELDS.iter().enumerate() {
                let name = if take && i == 0 { "granted" } else { field };
                // The module sends the fields in this order: look there first.
                let value = match items.get(i) {
                    Some((k, v)) if is_text(k, name) => v,
                    _ => &items.iter().find(|(k, _)| is_text(k, name))?.1,
                };
                out[i] = integer(value)?;
            }
        }
        Value::Array(items) if items.len() >= 6 => {
            for (slot, item) in out.iter_mut().zip(items) {
                *slot = integer(item)?;
            }
        }
        _ => return None,
    }
    Some(out)
}

fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// One decision: `cost` is the call's (its `granted` when admitted); for TAKE the first field
/// is the grant.
pub fn decision(
    reply: &Value,
    source: Source,
    period_ms: u64,
    cost: u64,
    take: bool,
) -> Result<Decision, Error> {
    let [first, limit, remaining, retry, reset, delay] =
        six(reply, take).ok_or_else(|| shape("a decision", reply))?;
    let granted = if take {
        unsigned(first)
    } else if first != 0 {
        cost
    } else {
        0
    };
    Ok(Decision {
        allowed: if take { granted > 0 } else { first != 0 },
        limit: unsigned(limit),
        remaining: unsigned(remaining),
        retry_after_ms: retry,
        reset_after_ms: unsigned(reset),
        delay_ms: unsigned(delay),
        source,
        shadow_rejected: false,
        period_ms,
        granted,
    })
}

/// A CHECKALL reply: RESP2 the overall decision then one per key; RESP3 the overall map with
/// its `limits`.
pub fn multi(
    reply: &Value,
    source: Source,
    periods: &[u64],
    cost: u64,
) -> Result<MultiDecision, Error> {
    let (overall, each): (&Value, Vec<&Value>) = match reply {
        Value::Map(_) => {
            let named = pairs(reply).ok_or_else(|| shape("a CHECKALL reply", reply))?;
            match named.iter().find(|(k, _)| k == "limits").map(|(_, v)| *v) {
                Some(Value::Array(limits)) => (reply, limits.iter().collect()),
                _ => return Err(shape("a CHECKALL reply without limits", reply)),
            }
        }
        Value::Array(items) if !items.is_empty() => (&items[0], items[1..].iter().collect()),
        _ => return Err(shape("a CHECKALL reply", reply)),
    };
    if each.len() != periods.len() {
        return Err(shape("a CHECKALL reply of another number of keys", reply));
    }
    let limits = each
        .iter()
        .zip(periods)
        .map(|(one, period)| decision(one, source, *period, cost, false))
        .collect::<Result<Vec<_>, _>>()?;
    let overall = decision(overall, source, 0, cost, false)?;
    Ok(MultiDecision { overall, limits })
}

/// An integer reply (RESET, RELEASE, POLICY DEL).
/// The arity in a `COMMAND INFO name` reply (`[[name, arity, ...]]`), `None` for any other
/// shape (no such command: `[nil]`).
pub fn command_arity(reply: &Value) -> Option<i64> {
    let Value::Array(entries) = reply else {
        return None;
    };
    let [Value::Array(entry)] = entries.as_slice() else {
        return None;
    };
    match entry.get(1) {
        Some(Value::Int(arity)) => Some(*arity),
        _ => None,
    }
}

pub fn count(reply: &Value) -> Result<i64, Error> {
    integer(reply).ok_or_else(|| shape("an integer", reply))
}

/// POLICY GET: the definition's fields as text (`None`: no such policy).
pub fn definition(reply: &Value) -> Result<Option<BTreeMap<String, String>>, Error> {
    if matches!(reply, Value::Nil) {
        return Ok(None);
    }
    let named = pairs(reply).ok_or_else(|| shape("a policy definition", reply))?;
    Ok(Some(
        named
            .into_iter()
            .map(|(k, v)| {
                let value = text(v)
                    .or_else(|| integer(v).map(|n| n.to_string()))
                    .unwrap_or_default();
                (k, value)
            })
            .collect(),
    ))
}

/// POLICY LIST: the names.
pub fn names(reply: &Value) -> Result<Vec<String>, Error> {
    match reply {
        Value::Array(items) | Value::Set(items) => items
            .iter()
            .map(|item| text(item).ok_or_else(|| shape("a policy name", item)))
            .collect(),
        _ => Err(shape("a list of policy names", reply)),
    }
}

/// FUNCTION LIST LIBRARYNAME ratelimit: whether every function of `wanted` is in the library
/// (`None`: no library of that name).
pub fn library_has(reply: &Value, wanted: &[&str]) -> Option<bool> {
    let Value::Array(libraries) = reply else {
        return None;
    };
    for library in libraries {
        let Some(fields) = pairs(library) else {
            continue;
        };
        let named = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
        if named("library_name").and_then(text).as_deref() != Some(LIBRARY_NAME) {
            continue;
        }
        let functions: Vec<String> = match named("functions") {
            Some(Value::Array(functions)) => functions
                .iter()
                .filter_map(|f| {
                    pairs(f)?
                        .into_iter()
                        .find(|(k, _)| k == "name")
                        .and_then(|(_, v)| text(v))
                })
                .collect(),
            _ => Vec::new(),
        };
        return Some(wanted.iter().all(|w| functions.iter().any(|f| f == w)));
    }
    None
}

/// The functions the library registers (`function_name = '...'`).
pub fn library_functions(code: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("function_name = '") {
        rest = &rest[at + "function_name = '".len()..];
        if let Some(end) = rest.find('\'') {
            out.push(&rest[..end]);
            rest = &rest[end..];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(values: &[i64]) -> Value {
        Value::Array(values.iter().map(|v| Value::Int(*v)).collect())
    }

    #[test]
    fn reads_resp2_and_resp3_decisions_alike() {
        let resp2 = ints(&[1, 10, 9, 0, 100, 0]);
        let resp3 = Value::Map(
            FIELDS
                .iter()
                .zip([
                    Value::Boolean(true),
                    Value::Int(10),
                    Value::Int(9),
                    Value::Int(0),
                    Value::Int(100),
                    Value::Int(0),
                ])
                .map(|(k, v)| (Value::SimpleString(k.to_string()), v))
                .collect(),
        );
        let a = decision(&resp2, Source::Module, 1000, 1, false).unwrap();
        let b = decision(&resp3, Source::Module, 1000, 1, false).unwrap();
        assert_eq!(a, b);
        assert!(a.allowed && a.granted == 1 && a.remaining == 9);
    }

    #[test]
    fn never_panics_on_odd_replies() {
        for reply in [
            Value::Nil,
            Value::Okay,
            ints(&[1, 2]),
            Value::Array(vec![Value::Nil; 6]),
            Value::Map(vec![]),
            Value::Array(vec![]),
        ] {
            assert!(matches!(
                decision(&reply, Source::Module, 0, 1, false),
                Err(Error::Protocol(_))
            ));
            assert!(multi(&reply, Source::Module, &[1], 1).is_err());
            assert!(names(&reply).is_err() || matches!(reply, Value::Array(_)));
        }
    }

    #[test]
    fn lists_the_library_functions() {
        let names = library_functions(include_str!("../ratelimit.lua"));
        assert!(names.contains(&"ratelimit_check") && names.contains(&"ratelimit_take"));
        assert_eq!(names.len(), 9);
    }
}
