//! The bench's server side: the connection, the loaded scripts, INFO readings, pipelined calls,
//! and the cases (the commands measured) with the keys they need filled or exhausted first.

use std::collections::HashMap;
use std::fs;
use std::thread;
use std::time::Duration;

use crate::common::Server;
use crate::model::*;
use crate::parse::parse_info;
use crate::{lua_dir, resp, Bench, Case, Config};

impl<'a> Bench<'a> {
    /// Loads the Lua reference scripts and the Functions library into `server`; `cell` is the
    /// second server, with redis-cell, when there is one.
    pub(crate) fn new(
        server: &'a Server,
        cell: Option<&'a Server>,
        config: Config,
    ) -> Result<Bench<'a>, String> {
        let mut con = server.client();
        let mut shas = HashMap::new();
        let dir = lua_dir();
        let mut stems: Vec<&str> = ALGORITHMS.iter().map(|a| a.1).collect();
        stems.push("seed_sliding_log");
        for stem in stems {
            let path = dir.join(format!("{stem}.lua"));
            let body = fs::read_to_string(&path)
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
            let sha: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(body)
                .query(&mut con)
                .map_err(|e| format!("SCRIPT LOAD {}: {e}", path.display()))?;
            shas.insert(stem.to_string(), sha);
        }
        let library = dir.join("functions").join("ratelimit.lua");
        let body = fs::read_to_string(&library)
            .map_err(|e| format!("reading {}: {e}", library.display()))?;
        let _: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(body)
            .query(&mut con)
            .map_err(|e| format!("FUNCTION LOAD {}: {e}", library.display()))?;
        Ok(Bench {
            server,
            con,
            cell: cell.map(|s| (s, s.client())),
            config,
            shas,
            notes: Vec::new(),
        })
    }

    pub(crate) fn has_cell(&self) -> bool {
        self.cell.is_some()
    }

    /// The port of the server a side runs on (ours when there is no redis-cell server).
    pub(crate) fn port_of(&self, side: Side) -> u16 {
        match (side, &self.cell) {
            (Side::Cell, Some((server, _))) => server.port(),
            _ => self.server.port(),
        }
    }

    pub(crate) fn sha(&self, stem: &str) -> String {
        self.shas[stem].clone()
    }

    pub(crate) fn query<T: redis::FromRedisValue>(
        &mut self,
        cmd: &mut redis::Cmd,
    ) -> Result<T, String> {
        self.query_on(Side::Ours, cmd)
    }

    pub(crate) fn query_on<T: redis::FromRedisValue>(
        &mut self,
        side: Side,
        cmd: &mut redis::Cmd,
    ) -> Result<T, String> {
        let con = match (side, &mut self.cell) {
            (Side::Cell, Some((_, con))) => con,
            (Side::Cell, None) => return Err("no redis-cell server".into()),
            (Side::Ours, _) => &mut self.con,
        };
        cmd.query(con).map_err(|e| format!("{e}"))
    }

    pub(crate) fn info(&mut self, section: &str) -> Result<String, String> {
        self.info_on(Side::Ours, section)
    }

    pub(crate) fn info_on(&mut self, side: Side, section: &str) -> Result<String, String> {
        self.query_on(side, redis::cmd("INFO").arg(section))
    }

    pub(crate) fn resetstat_on(&mut self, side: Side) -> Result<(), String> {
        self.query_on::<()>(side, redis::cmd("CONFIG").arg("RESETSTAT"))?;
        // The module zeroes its own counters from an event-loop callback after the command
        // (commands/resetstat.rs): a command sent right after the reply can run first.
        thread::sleep(Duration::from_millis(20));
        Ok(())
    }

    /// Empties our server (and redis-cell's, when there is one).
    pub(crate) fn flushall(&mut self) -> Result<(), String> {
        self.query::<()>(redis::cmd("FLUSHALL").arg("SYNC"))?;
        if self.has_cell() {
            self.query_on::<()>(Side::Cell, redis::cmd("FLUSHALL").arg("SYNC"))?;
        }
        // Let serverCron settle (client buffers, incremental rehashing) before measuring.
        thread::sleep(Duration::from_millis(200));
        Ok(())
    }

    fn used_memory(&mut self, side: Side) -> Result<u64, String> {
        let info = parse_info(&self.info_on(side, "memory")?);
        info.get("used_memory")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| "INFO memory has no used_memory".to_string())
    }

    /// `used_memory` once serverCron has finished the incremental rehashing that a fill may
    /// have started (until then the old keyspace and expiry tables are still allocated):
    /// `DEBUG HTSTATS 0` lists a "rehashing target" table while one is in progress.
    pub(crate) fn settled_used_memory(&mut self, side: Side) -> Result<u64, String> {
        for _ in 0..50 {
            thread::sleep(Duration::from_millis(100));
            let stats: String = self.query_on(side, redis::cmd("DEBUG").arg("HTSTATS").arg(0))?;
            if !stats.contains("rehashing") {
                return self.used_memory(side);
            }
        }
        self.notes
            .push("the keyspace was still rehashing 5 s after a fill".into());
        self.used_memory(side)
    }

    pub(crate) fn dbsize(&mut self) -> Result<u64, String> {
        self.dbsize_on(Side::Ours)
    }

    pub(crate) fn dbsize_on(&mut self, side: Side) -> Result<u64, String> {
        self.query_on(side, &mut redis::cmd("DBSIZE"))
    }

    /// `ratelimit_<alg>_allowed` and `_rejected` of `INFO ratelimit`.
    pub(crate) fn module_decisions(&mut self, algorithm: usize) -> Result<(u64, u64), String> {
        let info = parse_info(&self.info("ratelimit")?);
        let name = ALGORITHMS[algorithm].0.replace('-', "_");
        let field = |f: &str| -> u64 {
            info.get(&format!("ratelimit_{name}_{f}"))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        Ok((field("allowed"), field("rejected")))
    }

    /// Sends `count` commands, `produce(i, buf)` appending the i-th in RESP, pipelined on a
    /// fresh connection to a side's server; fails on any error reply, and on any array reply
    /// whose first integer (CHECK's `allowed`, CL.THROTTLE's `limited`) is 0 or 1 but not
    /// `expect_first`.
    pub(crate) fn pipeline_on<F>(
        &self,
        side: Side,
        count: u64,
        expect_first: Option<i64>,
        produce: F,
    ) -> Result<(), String>
    where
        F: Fn(u64, &mut Vec<u8>) + Send + 'static,
    {
        let outcome = resp::pipeline(self.port_of(side), count, produce)
            .map_err(|e| format!("pipelined calls: {e}"))?;
        if let Some(error) = outcome.first_error {
            return Err(format!("pipelined calls answered an error: {error}"));
        }
        let (ones, zeros) = (outcome.allowed, outcome.rejected);
        match expect_first {
            Some(1) if zeros > 0 => Err(format!(
                "{zeros} of {count} replies began with 0, where 1 was expected"
            )),
            Some(0) if ones > 0 => Err(format!(
                "{ones} of {count} replies began with 1, where 0 was expected"
            )),
            _ => Ok(()),
        }
    }

    pub(crate) fn call_on(&self, side: Side, args: &[String]) -> Result<resp::Reply, String> {
        match resp::call(self.port_of(side), args) {
            Ok(resp::Reply::Error(e)) => Err(format!("{args:?}: {e}")),
            Ok(reply) => Ok(reply),
            Err(e) => Err(format!("{args:?}: {e}")),
        }
    }

    pub(crate) fn consuming(&self, subject: Subject, prefix: &str) -> Case {
        let key = |tag: &str, kind: &str| format!("{prefix}{tag}:{kind}:__rand_int__");
        let command: Vec<String> = match subject {
            Subject::Native(a) => vec![
                "RATELIMIT.CHECK".into(),
                key(ALGORITHMS[a].2, "n"),
                ALGORITHMS[a].0.into(),
                CONSUME_LIMIT.into(),
                CONSUME_PERIOD_MS.into(),
            ],
            Subject::Library(a) => vec![
                "FCALL".into(),
                "ratelimit_check".into(),
                "1".into(),
                key(ALGORITHMS[a].2, "f"),
                ALGORITHMS[a].0.into(),
                CONSUME_LIMIT.into(),
                CONSUME_PERIOD_MS.into(),
            ],
            Subject::Lua(a) => vec![
                "EVALSHA".into(),
                self.sha(ALGORITHMS[a].1),
                "1".into(),
                key(ALGORITHMS[a].2, "l"),
                CONSUME_LIMIT.into(),
                CONSUME_PERIOD_MS.into(),
                CONSUME_LIMIT.into(),
                "1".into(),
                String::new(),
            ],
            Subject::Throttle | Subject::Cell => {
                let mut command = vec!["CL.THROTTLE".into(), format!("{prefix}cl:__rand_int__")];
                command.extend(THROTTLE_ARGS.iter().map(|a| a.to_string()));
                command
            }
            Subject::SetPxat => vec![
                "SET".into(),
                format!("{prefix}set:__rand_int__"),
                "v".into(),
                "PXAT".into(),
                FAR_FUTURE_MS.into(),
            ],
            Subject::Incr => vec!["INCR".into(), format!("{prefix}incr:__rand_int__")],
            Subject::Ping => vec!["PING".into()],
        };
        Case {
            subject,
            command,
            resp: None,
        }
    }

    pub(crate) fn rejected(&self, subject: Subject) -> Case {
        let command: Vec<String> = match subject {
            Subject::Native(a) => vec![
                "RATELIMIT.CHECK".into(),
                format!("hot:{}:n", ALGORITHMS[a].2),
                ALGORITHMS[a].0.into(),
                REJECT_LIMIT.into(),
                CONSUME_PERIOD_MS.into(),
            ],
            Subject::Library(a) => vec![
                "FCALL".into(),
                "ratelimit_check".into(),
                "1".into(),
                format!("hot:{}:f", ALGORITHMS[a].2),
                ALGORITHMS[a].0.into(),
                REJECT_LIMIT.into(),
                CONSUME_PERIOD_MS.into(),
            ],
            Subject::Lua(a) => vec![
                "EVALSHA".into(),
                self.sha(ALGORITHMS[a].1),
                "1".into(),
                format!("hot:{}:l", ALGORITHMS[a].2),
                REJECT_LIMIT.into(),
                CONSUME_PERIOD_MS.into(),
                REJECT_LIMIT.into(),
                "1".into(),
                String::new(),
            ],
            Subject::Throttle | Subject::Cell => {
                let mut command = vec!["CL.THROTTLE".into(), "hot:cl".into()];
                command.extend(THROTTLE_REJECT_ARGS.iter().map(|a| a.to_string()));
                command
            }
            Subject::Incr => vec!["INCR".into(), "hot:incr".into()],
            Subject::Ping => vec!["PING".into()],
            Subject::SetPxat => vec![
                "SET".into(),
                "hot:set".into(),
                "v".into(),
                "PXAT".into(),
                FAR_FUTURE_MS.into(),
            ],
        };
        Case {
            subject,
            command,
            resp: None,
        }
    }

    /// Creates every key of a random-keyspace case (one call per key), so that measured calls
    /// update live keys.
    pub(crate) fn populate(&self, case: &Case, keys: u64) -> Result<(), String> {
        if !case.command.iter().any(|a| a.contains("__rand_int__")) {
            return Ok(());
        }
        let side = case.subject.side();
        self.pipeline_on(side, keys, case.subject.expect_first(true), case.encoder())
            .map_err(|e| format!("populating {}: {e}", case.subject.label()))
    }

    /// Exhausts a hot key (its first call is admitted), then checks that the next is rejected.
    pub(crate) fn exhaust(&self, case: &Case) -> Result<(), String> {
        let Some(rejected) = case.subject.expect_first(false) else {
            return Ok(());
        };
        let side = case.subject.side();
        self.call_on(side, &case.command)?;
        let reply = self.call_on(side, &case.command)?;
        if reply.allowed() != Some(rejected) {
            return Err(format!(
                "{}: the hot key still admits after being exhausted: {reply:?}",
                case.subject.label()
            ));
        }
        Ok(())
    }
}
