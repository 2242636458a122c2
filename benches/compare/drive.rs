//! `compare --drive`: the bench's own load generator on the command line, for `make profile`
//! (benches/profile.sh), which needs RESP3 clients and redis-benchmark has none.
//!
//! ```text
//! compare --drive --port PORT [--resp 2|3] [--clients 50] [--pipeline 16] -n CALLS [-r KEYS]
//!         [--expect 0|1] [--ready SHELL-COMMAND] -- COMMAND ARGS...
//! ```
//!
//! `__rand_int__` in the arguments becomes a random 12-digit key number below KEYS (as with
//! redis-benchmark's `-r`). `--ready` runs (with `sh -c`) once every client is connected and
//! has sent `HELLO 3`, just before the first command: `make profile` turns callgrind's
//! instrumentation on there, so neither the connections nor `HELLO` are counted. `--expect`
//! fails the run unless every reply's first field (CHECK's `allowed`) is that value. Prints one
//! line: `replies=N allowed=A rejected=R seconds=S`.

use std::process::Command;

use crate::model::Subject;
use crate::resp::{self, Load};
use crate::Case;

pub fn run(args: &[String]) -> Result<(), String> {
    let mut load = Load {
        port: 0,
        clients: 50,
        pipeline: 16,
        protocol: 2,
        calls: 0,
        keyspace: None,
        cpu: None,
    };
    let mut expect: Option<i64> = None;
    let mut ready: Option<String> = None;
    let mut command: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{arg} needs a value"))
        };
        let number = |v: String| -> Result<u64, String> {
            v.parse().map_err(|_| format!("{arg}: not a number: {v}"))
        };
        match arg.as_str() {
            "--drive" => {}
            "--port" => load.port = number(value()?)? as u16,
            "--resp" => load.protocol = number(value()?)? as u8,
            "--clients" => load.clients = number(value()?)? as usize,
            "--pipeline" | "-P" => load.pipeline = number(value()?)? as usize,
            "-n" => load.calls = number(value()?)?,
            "-r" => load.keyspace = Some(number(value()?)?),
            "--cpu" => load.cpu = Some(number(value()?)? as usize),
            "--expect" => expect = Some(number(value()?)? as i64),
            "--ready" => ready = Some(value()?),
            "--" => {
                command = it.by_ref().cloned().collect();
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if load.port == 0 || load.calls == 0 || command.is_empty() {
        return Err("usage: --drive --port PORT -n CALLS [options] -- COMMAND ARGS...".into());
    }
    if !matches!(load.protocol, 2 | 3) {
        return Err(format!("--resp {}: 2 or 3", load.protocol));
    }
    let case = Case {
        subject: Subject::Ping,
        command,
        resp: Some(load.protocol),
    };
    let outcome = resp::drive(&load, case.encoder(), move || {
        if let Some(shell) = ready {
            let status = Command::new("sh").arg("-c").arg(&shell).status()?;
            if !status.success() {
                return Err(std::io::Error::other(format!("{shell:?}: {status}")));
            }
        }
        Ok(())
    })
    .map_err(|e| format!("driving port {}: {e}", load.port))?;
    let b = &outcome.batch;
    println!(
        "replies={} allowed={} rejected={} seconds={:.3}",
        b.replies, b.allowed, b.rejected, outcome.seconds
    );
    if let Some(error) = &b.first_error {
        return Err(format!("an error reply: {error}"));
    }
    let wrong = match expect {
        Some(1) => b.rejected,
        Some(0) => b.allowed,
        _ => 0,
    };
    if wrong > 0 || (expect.is_some() && b.allowed + b.rejected != b.replies) {
        return Err(format!(
            "expected every reply to begin with {}: {} allowed, {} rejected of {}",
            expect.unwrap_or(-1),
            b.allowed,
            b.rejected,
            b.replies
        ));
    }
    Ok(())
}
