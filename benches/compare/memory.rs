//! The memory phase: the `used_memory` delta per key over many keys in one state, and `MEMORY
//! USAGE` of one.

use std::sync::Arc;

use crate::common::now_ms;
use crate::model::*;
use crate::{resp, Bench, LOG_GAP_MS};

/// One kind of key whose memory is measured.
struct Kind {
    id: String,
    label: String,
    /// The server the keys are written to.
    side: Side,
    keys: u64,
    /// Calls made per key (entries of a log).
    calls_per_key: u64,
    /// See [`Bench::memory_of`].
    marginal_from: Option<u64>,
    /// What the first field of every reply must be (see [`Bench::pipeline_on`]).
    expect_first: Option<i64>,
}

impl Kind {
    fn keys(id: &str, label: &str, side: Side, config: &crate::Config, first: i64) -> Kind {
        Kind {
            id: id.into(),
            label: label.into(),
            side,
            keys: config.memory_keys,
            calls_per_key: 1,
            marginal_from: Some(config.memory_marginal_from),
            expect_first: Some(first),
        }
    }

    /// Logs of 100 entries, on our server.
    fn log(id: &str, label: &str, config: &crate::Config) -> Kind {
        Kind {
            id: id.into(),
            label: label.into(),
            side: Side::Ours,
            keys: config.log_memory_keys,
            calls_per_key: LOG_ENTRIES,
            marginal_from: None,
            expect_first: Some(1),
        }
    }
}

/// Entries per key of the logs whose memory is measured.
const LOG_ENTRIES: u64 = 100;
/// Leases in the concurrency key whose memory is measured (`ratelimit.max-leases`' default).
const LEASES: u64 = 100_000;

impl Bench<'_> {
    /// `used_memory` delta per key over many keys in the same state, and `MEMORY USAGE` of one.
    pub(crate) fn memory_phase(&mut self) -> Result<Vec<MemoryResult>, String> {
        let config = self.config.clone();
        let mut results = Vec::new();
        // Every kind uses the same key names ("rl:" and 12 digits, 15 bytes), one kind at a time
        // on an empty server.
        let key = |i: u64| format!("rl:{i:012}");
        let set_case = move |i: u64| {
            vec![
                "SET".to_string(),
                key(i),
                "v".into(),
                "PXAT".into(),
                FAR_FUTURE_MS.into(),
            ]
        };
        let kind = |id: &str, label: &str| Kind::keys(id, label, Side::Ours, &config, 1);
        results.push(self.memory_of(kind("set-pxat", "SET k v PXAT t"), set_case)?);
        for (a, &(name, stem, _)) in ALGORITHMS.iter().enumerate() {
            if a == SLIDING_LOG {
                continue; // the log is measured with 100 entries below
            }
            let native = move |i: u64| {
                vec![
                    "RATELIMIT.CHECK".to_string(),
                    key(i),
                    name.to_string(),
                    MEMORY_LIMIT.into(),
                    MEMORY_PERIOD_MS.into(),
                ]
            };
            results.push(self.memory_of(
                kind(&format!("{name}/native"), &format!("{name} native")),
                native,
            )?);
            let library = move |i: u64| {
                vec![
                    "FCALL".to_string(),
                    "ratelimit_check".into(),
                    "1".into(),
                    key(i),
                    name.to_string(),
                    MEMORY_LIMIT.into(),
                    MEMORY_PERIOD_MS.into(),
                ]
            };
            results.push(self.memory_of(
                kind(
                    &format!("{name}/library"),
                    &format!("{name} library (string)"),
                ),
                library,
            )?);
            let sha = self.sha(stem);
            let lua = move |i: u64| {
                vec![
                    "EVALSHA".to_string(),
                    sha.clone(),
                    "1".into(),
                    key(i),
                    MEMORY_LIMIT.into(),
                    MEMORY_PERIOD_MS.into(),
                    MEMORY_LIMIT.into(),
                    "1".into(),
                    String::new(),
                ]
            };
            results.push(self.memory_of(
                kind(&format!("{name}/lua"), &format!("{name} Lua (HASH)")),
                lua,
            )?);
        }
        // CL.THROTTLE keys: ours (a gcra limiter) and redis-cell's (a string), on its server.
        let throttle = move |i: u64| {
            let mut command = vec!["CL.THROTTLE".to_string(), key(i)];
            command.extend(THROTTLE_MEMORY_ARGS.iter().map(|a| a.to_string()));
            command
        };
        // The 32-byte form, for parameters too wide for a word (the consuming cases' own).
        let wide = move |i: u64| {
            vec![
                "RATELIMIT.CHECK".to_string(),
                key(i),
                "token-bucket".into(),
                CONSUME_LIMIT.into(),
                CONSUME_PERIOD_MS.into(),
            ]
        };
        results.push(self.memory_of(
            kind(
                "token-bucket/native-wide",
                &format!("token-bucket native, {CONSUME_LIMIT} per {CONSUME_PERIOD_MS} ms"),
            ),
            wide,
        )?);
        let mut throttles = vec![(Subject::Throttle, Side::Ours)];
        if self.has_cell() {
            throttles.push((Subject::Cell, Side::Cell));
        }
        for (subject, side) in throttles {
            results.push(self.memory_of(
                Kind::keys(&subject.id(), &subject.label(), side, &config, 0),
                throttle,
            )?);
        }
        // Logs of 100 entries a second apart (a record of 2 bytes in the native log), an hour
        // ahead of the server's clock, 1-day window.
        let log_keys = config.log_memory_keys;
        let base = now_ms() + 3_600_000;
        let at = move |c: u64| base + c / log_keys * LOG_GAP_MS;
        let log_key = move |c: u64| format!("rl:{:012}", c % log_keys);
        results.push(self.memory_of(
            Kind::log(
                "sliding-log/native-100",
                "sliding-log native, 100 entries",
                &config,
            ),
            move |c: u64| {
                vec![
                    "RATELIMIT.CHECK".to_string(),
                    log_key(c),
                    "sliding-log".into(),
                    "1000".into(),
                    "86400000".into(),
                    "AT".into(),
                    at(c).to_string(),
                ]
            },
        )?);
        results.push(self.memory_of(
            Kind::log(
                "sliding-log/library-100",
                "sliding-log library (string), 100 entries",
                &config,
            ),
            move |c: u64| {
                vec![
                    "FCALL".to_string(),
                    "ratelimit_check".into(),
                    "1".into(),
                    log_key(c),
                    "sliding-log".into(),
                    "1000".into(),
                    "86400000".into(),
                    "AT".into(),
                    at(c).to_string(),
                ]
            },
        )?);
        let seed = self.sha("seed_sliding_log");
        results.push(self.memory_of(
            Kind::log(
                "sliding-log/seed-zset-100",
                "seed ZSET log (seed_sliding_log.lua), 100 entries",
                &config,
            ),
            move |c: u64| {
                vec![
                    "EVALSHA".to_string(),
                    seed.clone(),
                    "1".into(),
                    log_key(c),
                    "1000".into(),
                    at(c).to_string(),
                    "86400000".into(),
                ]
            },
        )?);
        let lua_log = self.sha("sliding_log");
        results.push(self.memory_of(
            Kind::log(
                "sliding-log/lua-zset-100",
                "sliding_log.lua ZSET, 100 entries",
                &config,
            ),
            move |c: u64| {
                vec![
                    "EVALSHA".to_string(),
                    lua_log.clone(),
                    "1".into(),
                    log_key(c),
                    "1000".into(),
                    "86400000".into(),
                    "1000".into(),
                    "1".into(),
                    at(c).to_string(),
                ]
            },
        )?);
        // A concurrency key of LEASES leases of 16-byte ids (a day long, so none expires), per
        // lease: the set's own bytes are the core's benchmark's (core/benches/leases.rs), this is
        // what the server's allocator adds up to.
        let mut leases = self.memory_of(
            Kind {
                id: "concurrency/leases".into(),
                label: format!("concurrency, {LEASES} leases of 16-byte ids in one key, a lease"),
                side: Side::Ours,
                keys: 1,
                calls_per_key: LEASES,
                marginal_from: None,
                expect_first: Some(1),
            },
            move |c: u64| {
                [
                    "RATELIMIT.ACQUIRE",
                    "rl:000000000000",
                    "1000000000000",
                    "86400000",
                    "ID",
                    &format!("id:{c:013}"),
                    "AT",
                    &base.to_string(),
                ]
                .map(String::from)
                .to_vec()
            },
        )?;
        leases.bytes_per_key /= LEASES as f64;
        leases.memory_usage = None;
        results.push(leases);
        Ok(results)
    }

    /// Fills `kind.keys` keys with `kind.calls_per_key` calls each (`produce(c)` the c-th call)
    /// on an empty server and measures the `used_memory` delta per key. With `marginal_from`, the
    /// keys are filled in two steps, `used_memory` read between them, and the second step's delta
    /// per key is the marginal cost of a key: both counts lie between the same powers of two, so
    /// the hash tables of the keyspace and of the expiries keep their size and only the keys
    /// count.
    fn memory_of<F>(&mut self, kind: Kind, produce: F) -> Result<MemoryResult, String>
    where
        F: Fn(u64) -> Vec<String> + Send + Sync + 'static,
    {
        let Kind {
            id,
            label,
            side,
            keys,
            calls_per_key,
            marginal_from,
            expect_first,
        } = kind;
        self.flushall()?;
        let before = self.settled_used_memory(side)?;
        let first = produce(0);
        let produce = Arc::new(produce);
        let split = marginal_from.filter(|&k| k < keys && calls_per_key == 1);
        let mut middle = None;
        let mut done = 0;
        for stop in split.into_iter().chain([keys]) {
            let produce = Arc::clone(&produce);
            let from = done * calls_per_key;
            self.pipeline_on(
                side,
                (stop - done) * calls_per_key,
                expect_first,
                move |c, buf| resp::encode(buf, &produce(from + c)),
            )
            .map_err(|e| format!("memory of {label}: {e}"))?;
            if stop < keys {
                middle = Some(self.settled_used_memory(side)?);
            }
            done = stop;
        }
        let after = self.settled_used_memory(side)?;
        let live = self.dbsize_on(side)?;
        if live != keys {
            return Err(format!(
                "memory of {label}: {live} keys live after filling {keys}"
            ));
        }
        let key_arg = first
            .iter()
            .find(|a| a.starts_with("rl:"))
            .cloned()
            .unwrap_or_default();
        let memory_usage: Option<i64> = self
            .query_on(
                side,
                redis::cmd("MEMORY")
                    .arg("USAGE")
                    .arg(&key_arg)
                    .arg("SAMPLES")
                    .arg(0),
            )
            .ok();
        let bytes_per_key = (after as f64 - before as f64) / keys as f64;
        let marginal = split
            .zip(middle)
            .map(|(from, middle)| (from, (after as f64 - middle as f64) / (keys - from) as f64));
        eprintln!(
            "bench:   memory {label}: {bytes_per_key:.1} B/key over {keys} keys{}",
            marginal.map_or(String::new(), |(_, m)| format!(", {m:.1} B marginal"))
        );
        Ok(MemoryResult {
            id,
            label,
            keys,
            calls_per_key,
            bytes_per_key,
            marginal,
            memory_usage,
        })
    }
}
