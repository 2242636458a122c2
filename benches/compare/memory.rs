//! The memory phase: the `used_memory` delta per key over many keys in one state, and `MEMORY
//! USAGE` of one.

use std::sync::Arc;

use crate::common::now_ms;
use crate::model::*;
use crate::{resp, Bench, LOG_GAP_MS};

impl Bench<'_> {
    /// `used_memory` delta per key over many keys in the same state, and `MEMORY USAGE` of one.
    pub(crate) fn memory_phase(&mut self) -> Result<Vec<MemoryResult>, String> {
        let keys = self.config.memory_keys;
        let marginal_from = Some(self.config.memory_marginal_from);
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
        results.push(self.memory_of(
            "set-pxat",
            "SET k v PXAT t",
            keys,
            1,
            marginal_from,
            None,
            set_case,
        )?);
        for (a, &(name, stem, _)) in ALGORITHMS.iter().enumerate() {
            if a == 4 {
                continue; // the log is measured with 100 entries below
            }
            let native = move |i: u64| {
                vec![
                    "RATELIMIT.CHECK".to_string(),
                    key(i),
                    name.to_string(),
                    CONSUME_LIMIT.into(),
                    CONSUME_PERIOD_MS.into(),
                ]
            };
            results.push(self.memory_of(
                &format!("{name}/native"),
                &format!("{name} native"),
                keys,
                1,
                marginal_from,
                Some(true),
                native,
            )?);
            let sha = self.sha(stem);
            let lua = move |i: u64| {
                vec![
                    "EVALSHA".to_string(),
                    sha.clone(),
                    "1".into(),
                    key(i),
                    CONSUME_LIMIT.into(),
                    CONSUME_PERIOD_MS.into(),
                    CONSUME_LIMIT.into(),
                    "1".into(),
                    String::new(),
                ]
            };
            results.push(self.memory_of(
                &format!("{name}/lua"),
                &format!("{name} Lua (HASH)"),
                keys,
                1,
                marginal_from,
                Some(true),
                lua,
            )?);
        }
        // Logs of 100 entries a second apart (a record of 2 bytes in the native log), an hour
        // ahead of the server's clock, 1-day window.
        let log_keys = self.config.log_memory_keys;
        let entries = 100;
        let base = now_ms() + 3_600_000;
        let at = move |c: u64| base + c / log_keys * LOG_GAP_MS;
        let produce = |shape: fn(u64, u64) -> Vec<String>| move |c: u64| shape(c % log_keys, at(c));
        results.push(self.memory_of(
            "sliding-log/native-100",
            "sliding-log native, 100 entries",
            log_keys,
            entries,
            None,
            Some(true),
            produce(|i, at| {
                vec![
                    "RATELIMIT.CHECK".to_string(),
                    format!("rl:{i:012}"),
                    "sliding-log".into(),
                    "1000".into(),
                    "86400000".into(),
                    "AT".into(),
                    at.to_string(),
                ]
            }),
        )?);
        let seed = self.sha("seed_sliding_log");
        results.push(self.memory_of(
            "sliding-log/seed-zset-100",
            "seed ZSET log (seed_sliding_log.lua), 100 entries",
            log_keys,
            entries,
            None,
            Some(true),
            move |c: u64| {
                vec![
                    "EVALSHA".to_string(),
                    seed.clone(),
                    "1".into(),
                    format!("rl:{:012}", c % log_keys),
                    "1000".into(),
                    at(c).to_string(),
                    "86400000".into(),
                ]
            },
        )?);
        let lua_log = self.sha("sliding_log");
        results.push(self.memory_of(
            "sliding-log/lua-zset-100",
            "sliding_log.lua ZSET, 100 entries",
            log_keys,
            entries,
            None,
            Some(true),
            move |c: u64| {
                vec![
                    "EVALSHA".to_string(),
                    lua_log.clone(),
                    "1".into(),
                    format!("rl:{:012}", c % log_keys),
                    "1000".into(),
                    "86400000".into(),
                    "1000".into(),
                    "1".into(),
                    at(c).to_string(),
                ]
            },
        )?);
        Ok(results)
    }

    /// Fills `keys` keys with `calls_per_key` calls each (`produce(c)` the c-th call) on an empty
    /// server and measures the `used_memory` delta per key. With `marginal_from`, the keys are
    /// filled in two steps, `used_memory` read between them, and the second step's delta per key
    /// is the marginal cost of a key: both counts lie between the same powers of two, so the hash
    /// tables of the keyspace and of the expiries keep their size and only the keys count.
    #[allow(clippy::too_many_arguments)]
    fn memory_of<F>(
        &mut self,
        id: &str,
        label: &str,
        keys: u64,
        calls_per_key: u64,
        marginal_from: Option<u64>,
        expect_allowed: Option<bool>,
        produce: F,
    ) -> Result<MemoryResult, String>
    where
        F: Fn(u64) -> Vec<String> + Send + Sync + 'static,
    {
        self.flushall()?;
        let before = self.settled_used_memory()?;
        let first = produce(0);
        let produce = Arc::new(produce);
        let split = marginal_from.filter(|&k| k < keys && calls_per_key == 1);
        let mut middle = None;
        let mut done = 0;
        for stop in split.into_iter().chain([keys]) {
            let produce = Arc::clone(&produce);
            let from = done * calls_per_key;
            self.pipeline(
                (stop - done) * calls_per_key,
                expect_allowed,
                move |c, buf| resp::encode(buf, &produce(from + c)),
            )
            .map_err(|e| format!("memory of {label}: {e}"))?;
            if stop < keys {
                middle = Some(self.settled_used_memory()?);
            }
            done = stop;
        }
        let after = self.settled_used_memory()?;
        let live = self.dbsize()?;
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
            .query(
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
            id: id.to_string(),
            label: label.to_string(),
            keys,
            calls_per_key,
            bytes_per_key,
            marginal,
            memory_usage,
        })
    }
}
