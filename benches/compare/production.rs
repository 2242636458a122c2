//! The phases that measure the module as it runs in production: with a replica attached to the
//! measured server, and with clients that speak RESP3.

use std::time::{Duration, Instant};

use crate::common::Server;
use crate::machine::command_output;
use crate::model::*;
use crate::parse::parse_info;
use crate::{Bench, Case};

/// How long a replica may take to load the measured server's keys and catch up.
const REPLICA_SYNC_TIMEOUT: Duration = Duration::from_secs(180);

impl Bench<'_> {
    /// Consuming calls over the random keyspace at pipeline 16 of `SET k v PXAT t`, `INCR` and
    /// every algorithm's CHECK: first on the server alone, then with a replica attached (a second,
    /// unmeasured redis-server with the module, on CPU 1 when the bench pins, so it does not
    /// take turns with the measured server), killed at the end of the phase.
    pub(crate) fn replica_phase(&mut self) -> Result<Vec<CaseResult>, String> {
        self.flushall()?;
        let keys = self.config.keys;
        let cases: Vec<Case> = [Subject::SetPxat, Subject::Incr]
            .into_iter()
            .chain((0..ALGORITHMS.len()).map(Subject::Native))
            .map(|s| self.consuming(s, "rl:"))
            .collect();
        let filling = Instant::now();
        for case in &cases {
            self.populate(case, keys)?;
        }
        eprintln!(
            "bench:   replica phase: filled {} keys in {:.1}s",
            self.dbsize()?,
            filling.elapsed().as_secs_f64()
        );
        let mut results = Vec::new();
        let group = Group::Replica { attached: false };
        let samples = self.measure_round_robin(&group.id(), &cases, 16, Some(keys), true)?;
        for (case, samples) in cases.iter().zip(samples) {
            results.push(case.result(group, samples));
        }

        let replica = Server::start();
        if self.config.pin {
            let pid = replica.pid().map(|p| p.to_string()).unwrap_or_default();
            if command_output("taskset", &["-a", "-p", "-c", "1", &pid]).is_none() {
                return Err(format!("taskset could not pin the replica {pid}"));
            }
        }
        let synced = Instant::now();
        self.attach_replica(&replica)?;
        eprintln!(
            "bench:   replica on port {} in sync after {:.1}s",
            replica.port(),
            synced.elapsed().as_secs_f64()
        );
        let group = Group::Replica { attached: true };
        let samples = self.measure_round_robin(&group.id(), &cases, 16, Some(keys), true)?;
        for (case, samples) in cases.iter().zip(samples) {
            results.push(case.result(group, samples));
        }
        // The replica kept up: still linked, and it reaches the master's offset.
        self.wait_replica(&replica)?;
        drop(replica);
        Ok(results)
    }

    /// `REPLICAOF` our server on `replica`, then waits until the link is up, the initial sync is
    /// done and the replica has reached our replication offset.
    fn attach_replica(&mut self, replica: &Server) -> Result<(), String> {
        let mut con = replica.client();
        let _: () = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(self.server.port())
            .query(&mut con)
            .map_err(|e| format!("REPLICAOF on the replica: {e}"))?;
        self.wait_replica(replica)
    }

    fn wait_replica(&mut self, replica: &Server) -> Result<(), String> {
        let mut con = replica.client();
        let deadline = Instant::now() + REPLICA_SYNC_TIMEOUT;
        loop {
            let master = parse_info(&self.info("replication")?);
            let text: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut con)
                .map_err(|e| format!("INFO on the replica: {e}"))?;
            let r = parse_info(&text);
            let field = |info: &std::collections::HashMap<String, String>, f: &str| {
                info.get(f).cloned().unwrap_or_default()
            };
            if field(&r, "master_link_status") == "up"
                && field(&r, "master_sync_in_progress") == "0"
                && field(&master, "connected_slaves") == "1"
                && field(&master, "slave0").contains("state=online")
                && field(&r, "slave_repl_offset") == field(&master, "master_repl_offset")
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the replica on port {} is not in sync after {REPLICA_SYNC_TIMEOUT:?}: \
                     {r:?}\n{}",
                    replica.port(),
                    replica.log_tail(15)
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every algorithm's CHECK, consuming (random keys) and rejected (hot key), from the bench's
    /// own clients speaking RESP2 and RESP3, interleaved in the same rounds.
    pub(crate) fn resp_phase(&mut self) -> Result<Vec<CaseResult>, String> {
        self.flushall()?;
        let keys = self.config.keys;
        let mut results = Vec::new();
        for hot in [false, true] {
            let mut cases = Vec::new();
            for a in 0..ALGORITHMS.len() {
                for protocol in [2, 3] {
                    let case = if hot {
                        self.rejected(Subject::Native(a))
                    } else {
                        self.consuming(Subject::Native(a), "rl:")
                    };
                    cases.push(case.over_resp(protocol));
                }
            }
            for case in cases.iter().step_by(2) {
                if hot {
                    self.exhaust(case)?;
                } else {
                    self.populate(case, keys)?;
                }
            }
            let name = if hot {
                "RESP2/3 rejected"
            } else {
                "RESP2/3 consuming"
            };
            let keyspace = (!hot).then_some(keys);
            let samples = self.measure_round_robin(name, &cases, 16, keyspace, !hot)?;
            for (case, samples) in cases.iter().zip(samples) {
                let group = Group::Resp {
                    protocol: case.resp.unwrap_or(2),
                    hot,
                };
                results.push(case.result(group, samples));
            }
        }
        Ok(results)
    }
}
