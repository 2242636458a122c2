//! Named policies (issue 23): `RATELIMIT.POLICY SET|GET|DEL|LIST`, calls that name a policy
//! (`CHECK|PEEK key POLICY name`, CHECKALL's `POLICY name` specs), shadow mode and the per-policy
//! lines of `INFO ratelimit`, against real servers.
//!
//! - equivalence.rs: a call through an enforce policy is the inline call with its parameters, on
//!   twin keys over seeded random sequences of every algorithm (replies, RATELIMIT.INFO, DUMP,
//!   PEXPIRETIME, per-algorithm counters, a replica), policies replaced mid-sequence; the same for
//!   CHECKALL mixing POLICY and inline specs.
//! - shadow.rs: a shadow policy answers what its enforce twin answers, rejections rewritten, and
//!   leaves the same state; its events; CHECKALL's consumption rule, a case per branch, and random
//!   CHECKALLs of shadow and enforce policies against the model.
//! - errors.rs: definitions as GET and LIST answer them, bad names, unknown policies (nothing
//!   created), `ratelimit.max-policies`, the options SET and calls refuse.
//! - paused.rs: a rewrite without the RDB preamble that starts while writes are paused (CLIENT
//!   PAUSE, a rewrite scheduled behind a BGSAVE, FAILOVER): the server lives, the AOF keeps them.
//! - persistence.rs: DEBUG RELOAD, RDB and AOF restarts (with and without the RDB preamble, AOF
//!   switched on at run time), a damaged policy record in an RDB.
//! - replication.rs: full sync, failover, a read-only replica, FLUSHALL, and what is not
//!   replicated (a SET of the same definition, a DEL of a missing name).
//! - cluster.rs, acl.rs, info.rs: three primaries; ACL categories and subcommand rules; exact INFO
//!   lines and CONFIG RESETSTAT.
//!
//! Seeds: `RATELIMIT_POLICIES_SEED` replays the random sequences of another seed.

use crate::common;

mod acl;
mod cluster;
mod equivalence;
mod errors;
mod info;
mod paused;
mod persistence;
mod replication;
mod shadow;
mod shadow_checkall;

use std::collections::BTreeMap;

use common::model::Spec;
use common::rng::seed_from_env;
use common::{send_one, show_cmd, show_value, Server};
use redis::{Cmd, Connection, Value};

/// The seed of the random sequences: `$RATELIMIT_POLICIES_SEED`, else a fixed one.
pub fn seed() -> u64 {
    seed_from_env("RATELIMIT_POLICIES_SEED", || 0x9011_C1E5_0023)
}

/// `RATELIMIT.POLICY SET name <spec> [SHADOW]`.
pub fn set_cmd(name: &str, spec: &Spec, shadow: bool) -> Cmd {
    let mut cmd = redis::cmd("RATELIMIT.POLICY");
    cmd.arg("SET").arg(name).arg(spec.args());
    if shadow {
        cmd.arg("SHADOW");
    }
    cmd
}

/// Defines `name` as `spec` (in shadow mode with `shadow`); panics unless the reply is OK.
pub fn define(con: &mut Connection, name: &str, spec: &Spec, shadow: bool) {
    let cmd = set_cmd(name, spec, shadow);
    let reply = send_one(con, &cmd);
    assert!(
        matches!(reply, Value::Okay),
        "{}: {}",
        show_cmd(&cmd),
        show_value(&reply)
    );
}

/// A text command from words that may be empty or hold spaces (names under test).
pub fn words(words: &[&[u8]]) -> Cmd {
    let mut cmd = redis::cmd(std::str::from_utf8(words[0]).expect("an ASCII command name"));
    for word in &words[1..] {
        cmd.arg(*word);
    }
    cmd
}

/// `RATELIMIT.POLICY GET name` as field -> value (as redis-cli shows them); `None` for nil.
pub fn get(con: &mut Connection, name: &str) -> Option<BTreeMap<String, String>> {
    match send_one(con, redis::cmd("RATELIMIT.POLICY").arg("GET").arg(name)) {
        Value::Nil => None,
        Value::Array(items) => {
            assert_eq!(items.len(), 12, "GET {name}: {items:?}");
            Some(
                items
                    .chunks(2)
                    .map(|pair| (show_value(&pair[0]), show_value(&pair[1])))
                    .collect(),
            )
        }
        other => panic!("POLICY GET {name}: {}", show_value(&other)),
    }
}

/// What `RATELIMIT.POLICY GET` answers for a policy defined as `spec`.
pub fn definition(spec: &Spec, shadow: bool) -> BTreeMap<String, String> {
    let burst = spec.burst.filter(|_| spec.algorithm.is_bucket());
    [
        ("algorithm", spec.algorithm.name().to_string()),
        ("limit", spec.limit.to_string()),
        ("period_ms", spec.period_ms.to_string()),
        ("burst", burst.unwrap_or(spec.limit).to_string()),
        (
            "mode",
            if shadow { "shadow" } else { "enforce" }.to_string(),
        ),
        ("block_ms", "0".to_string()),
    ]
    .into_iter()
    .map(|(field, value)| (field.to_string(), value))
    .collect()
}

/// `RATELIMIT.POLICY LIST`.
pub fn list(con: &mut Connection) -> Vec<String> {
    redis::cmd("RATELIMIT.POLICY")
        .arg("LIST")
        .query(con)
        .expect("POLICY LIST")
}

/// Every policy's definition, by name (`LIST`, then `GET` of each).
pub fn all_definitions(con: &mut Connection) -> BTreeMap<String, BTreeMap<String, String>> {
    list(con)
        .into_iter()
        .map(|name| {
            let definition = get(con, &name).unwrap_or_else(|| panic!("{name} is listed"));
            (name, definition)
        })
        .collect()
}

/// `<command> key POLICY name COST cost AT at_ms` (`command`: CHECK or PEEK).
pub fn call_cmd(command: &str, key: &str, policy: &str, cost: u64, at_ms: u64) -> Cmd {
    let mut cmd = redis::cmd(command);
    cmd.arg(key)
        .arg("POLICY")
        .arg(policy)
        .arg("COST")
        .arg(cost)
        .arg("AT")
        .arg(at_ms);
    cmd
}

/// `RATELIMIT.CHECK key POLICY name COST cost AT at_ms`.
pub fn check_cmd(key: &str, policy: &str, cost: u64, at_ms: u64) -> Cmd {
    call_cmd("RATELIMIT.CHECK", key, policy, cost, at_ms)
}

/// `<command> key <spec> COST cost AT at_ms`, the same call written inline.
pub fn inline_cmd(command: &str, key: &str, spec: &Spec, cost: u64, at_ms: u64) -> Cmd {
    let mut cmd = redis::cmd(command);
    cmd.arg(key)
        .arg(spec.args())
        .arg("COST")
        .arg(cost)
        .arg("AT")
        .arg(at_ms);
    cmd
}

/// One CHECKALL spec: a policy's name or a limit written out.
#[derive(Clone, Debug)]
pub enum SpecArg {
    Policy(String),
    Inline(Spec),
}

/// `RATELIMIT.CHECKALL n keys... specs... COST cost AT at_ms`.
pub fn checkall_cmd(keys: &[&str], specs: &[SpecArg], cost: u64, at_ms: u64) -> Cmd {
    let mut cmd = redis::cmd("RATELIMIT.CHECKALL");
    cmd.arg(keys.len()).arg(keys);
    for spec in specs {
        match spec {
            SpecArg::Policy(name) => cmd.arg("POLICY").arg(name),
            SpecArg::Inline(spec) => cmd.arg(spec.args()),
        };
    }
    cmd.arg("COST").arg(cost).arg("AT").arg(at_ms);
    cmd
}

/// One policy's line of `INFO ratelimit`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    pub calls: u64,
    pub allowed: u64,
    pub rejected: u64,
    pub shadow_rejected: u64,
    pub blocked: u64,
}

impl Figures {
    /// Parses `calls=..,allowed=..,rejected=..,shadow_rejected=..,blocked=..` (those fields, in
    /// that order).
    pub fn parse(text: &str) -> Figures {
        let values: Vec<(&str, u64)> = text
            .split(',')
            .map(|pair| {
                let (name, value) = pair.split_once('=').unwrap_or_else(|| panic!("{text}"));
                (name, value.parse().unwrap_or_else(|_| panic!("{text}")))
            })
            .collect();
        let names: Vec<&str> = values.iter().map(|(name, _)| *name).collect();
        assert_eq!(
            names,
            ["calls", "allowed", "rejected", "shadow_rejected", "blocked"],
            "{text}"
        );
        Figures {
            calls: values[0].1,
            allowed: values[1].1,
            rejected: values[2].1,
            shadow_rejected: values[3].1,
            blocked: values[4].1,
        }
    }
}

/// Every `ratelimit_policy_<name>` line of `INFO ratelimit`, by name, and `ratelimit_policies`
/// (checked to be their count).
pub fn policy_figures(server: &Server) -> BTreeMap<String, Figures> {
    let info = server.info("ratelimit");
    let figures: BTreeMap<String, Figures> = info
        .iter()
        .filter_map(|(field, value)| {
            let name = field.strip_prefix("ratelimit_policy_")?;
            Some((name.to_string(), Figures::parse(value)))
        })
        .collect();
    assert_eq!(
        info.get("ratelimit_policies"),
        Some(&figures.len().to_string()),
        "INFO ratelimit: {info:?}"
    );
    figures
}

/// One algorithm's counters of `INFO ratelimit`: calls, allowed, rejected, keys.
pub fn algorithm_figures(server: &Server, algorithm: &str) -> [u64; 4] {
    let info = server.info("ratelimit");
    let prefix = format!("ratelimit_{}", algorithm.replace('-', "_"));
    ["calls", "allowed", "rejected", "keys"].map(|name| {
        let field = format!("{prefix}_{name}");
        info.get(&field)
            .unwrap_or_else(|| panic!("INFO ratelimit has no {field}"))
            .parse()
            .expect("a number")
    })
}

/// The reply a shadow policy gives for its limit's `reply`: a rejection answered as admitted
/// (`allowed` 1, `retry_after_ms` 0), every other field as it is.
pub fn shadowed(reply: [i64; 6]) -> [i64; 6] {
    if reply[0] == 1 {
        reply
    } else {
        [1, reply[1], reply[2], 0, reply[4], reply[5]]
    }
}

/// Everything stored for `keys`: per key its DUMP payload, PEXPIRETIME and RATELIMIT.INFO.
pub fn stored(con: &mut Connection, keys: &[&str]) -> Vec<(Value, Value, Value)> {
    let mut pipe = redis::pipe();
    for key in keys {
        pipe.cmd("DUMP")
            .arg(*key)
            .cmd("PEXPIRETIME")
            .arg(*key)
            .cmd("RATELIMIT.INFO")
            .arg(*key);
    }
    let flat: Vec<Value> = pipe.query(con).expect("DUMP/PEXPIRETIME/RATELIMIT.INFO");
    flat.chunks(3)
        .map(|three| (three[0].clone(), three[1].clone(), three[2].clone()))
        .collect()
}
