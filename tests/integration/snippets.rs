//! The pages' code, run: every fenced block of README.md, docs/*.md and fuzz/README.md that a
//! reader is meant to run is executed against a real server, and what it prints compared.
//!
//! Which blocks run, by their tag:
//! - no tag, lines starting with `127.0.0.1:6379> `: a **redis-cli session**. Each command is
//!   sent with the real `redis-cli --no-raw` (a first line `$ redis-cli -3` adds its options),
//!   and its reply compared with the lines under it, as redis-cli prints them.
//! - `console`: a **transcript**: each `$ ` line runs in bash, its stdout compared with the lines
//!   under it; `redis-cli` there prints as in a terminal.
//! - `python` (redis-py, in a virtualenv under target/snippets/), `js`/`javascript`/`mjs`
//!   (node-redis, saved as a `.js` file, `.mjs` for `mjs`, in an `npm init -y` project under
//!   target/snippets/), `sh`/`bash`/`shell` (bash -e): programs that must exit 0 within 30 s.
//! - Anything else (`text`, `conf`, `http`, `json`, `lua`, `rust`...) never runs. An untagged
//!   block that is not a session is an error: tag it.
//!
//! The blocks run one after another, in page order (README.md, docs/*.md in name order,
//! fuzz/README.md), as a reader runs them on the one server they started (`make run`): every
//! block, sessions, transcripts and programs alike, on one shared server with the module, nothing
//! flushed between blocks, so a key that two blocks use makes one of them print other than its
//! page shows: each snippet has keys of its own. Blocks whose directives ask for another server
//! (`no-module`, `config ...`) share one of that setup likewise (all of functions.md's on one
//! server without the module). `REDIS_URL` names the block's server, and the `redis-cli` first on
//! PATH talks to it (a `-p 6379` in a page means it too). Shell blocks and transcripts run in its
//! temporary directory, which holds its config file `redis.conf`. The run takes 10 to 30 s here
//! (most of it redis-cli and interpreter start-ups); it prints how long each kind took.
//!
//! Directives, in an HTML comment on the line right before the opening fence, comma-separated:
//! `<!-- snippet: at 1796006883715 +10 +6, continue -->`.
//! - `skip (reason)`: never run, for the reason given.
//! - `at T +d ...`: session times, in ms. The commands that take `AT` (the module's CHECK, PEEK,
//!   CHECKALL, REFUND, ACQUIRE, RELEASE; the library's `FCALL(_RO)
//!   ratelimit_check|peek|checkall|refund|acquire|release`) are sent with `AT <time>` appended:
//!   the first at `T`, each next one `d` ms after the one before (after the list, at the last
//!   time). `at +d ...` continues the times of the block before. The times
//!   are moved by whole days to just after the server's clock and the reply's absolute times
//!   (12+ digit numbers near them) moved back, so every field compares exactly. Commands that
//!   take no `AT` (INFO, `CL.THROTTLE`, `GCRA`...) run on the server's clock, which is then
//!   behind the session: a key written `AT` is seen at its last consuming call.
//! - `wait D` (`1500ms`, `2s`): before the block, wait until the server's clock is `D` past the
//!   session's last time. A chain with a `wait` is moved by whole seconds, not days.
//! - `continue`: run with the clock of the running block before it (a session or transcript of
//!   the same page), on its server; a block without it starts a clock of its own.
//! - `no-module`: the server without the module; `library`: the Functions library loaded into
//!   the block's server first (`FUNCTION LOAD REPLACE`); `config NAME VALUE`: a line of the
//!   server's config file (repeatable), the blocks with the same lines sharing one server.
//! - `fresh`: the block's server is started anew first (the keys, policies, ACL users and
//!   `INFO` counters of the blocks before it gone), only where the page tells the reader to
//!   start from a server just started.
//! - `repo` (sh): run in the repository root instead of the server's directory.
//! - `output`, on a block that never runs (a `text` block) right after a python, js or sh
//!   block: what that block prints to stdout, compared exactly; with `vary PREFIX`, a number
//!   right after PREFIX (`vary t=`: a clock-dependent `t=117`) matches any number.
//!
//! Comparisons ignore trailing spaces and trailing empty lines. A failure names the page, the
//! line, the block, what was sent, and the expected and actual output. The pages show what the
//! redis-server and redis-cli on PATH (7.0) print: under another server (`RATELIMIT_SERVER`,
//! `make test-matrix`) the run skips; where python3 (with venv), node or npm, or the package
//! registry for the first install, is out of reach, the python or js blocks are left out (logged
//! as a skip) and the others run: their keys are their own, so they print the same without them.

mod pages;
mod programs;
mod run;
mod transcripts;

use std::time::{Duration, Instant};

use crate::common::skip;
use pages::{all_blocks, chains, Kind};
use run::Servers;

/// None when the pages' server runs the tests (the `redis-server` on PATH, also when
/// `RATELIMIT_SERVER` names it); else why these tests skip. The example tests skip likewise.
pub(crate) fn other_server() -> Option<String> {
    let server = std::env::var("RATELIMIT_SERVER")
        .or_else(|_| std::env::var("REDIS_SERVER"))
        .ok()
        .filter(|s| !s.is_empty())?;
    let resolve = |name: &str| {
        let path = if name.contains('/') {
            Some(name.into())
        } else {
            run::find_on_path(name)
        };
        path.and_then(|p| std::fs::canonicalize(p).ok())
    };
    if resolve(&server).is_some() && resolve(&server) == resolve("redis-server") {
        return None;
    }
    Some(format!(
        "the pages show what the redis-server on PATH answers; RATELIMIT_SERVER={server} is another"
    ))
}

fn report(what: &str, failures: Vec<String>) {
    assert!(
        failures.is_empty(),
        "{} {what} failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn every_block_is_tagged_and_every_directive_is_known() {
    let (blocks, mut problems) = all_blocks();
    problems.extend(chains(&blocks).1);
    report("problems", problems);
}

/// The client a kind of block needs, for python and js blocks: its version, or why it is not
/// there (installed once per run).
fn client(kind: Kind) -> Option<Result<String, String>> {
    let found = match kind {
        Kind::Python => programs::python()
            .as_ref()
            .map(|(_, v)| format!("redis-py {v}")),
        Kind::Node => programs::node_project()
            .as_ref()
            .map(|(_, v)| format!("node-redis {v}")),
        _ => return None,
    };
    Some(found.map_err(Clone::clone))
}

#[test]
fn the_pages_run_top_to_bottom_on_one_server() {
    if let Some(why) = other_server() {
        return skip(&why);
    }
    let (blocks, _) = all_blocks();
    let (chains, _) = chains(&blocks);
    let start = Instant::now();
    let mut servers = Servers::default();
    let mut failures = Vec::new();
    // Blocks run and their time, per kind (a chain's time under its first block's kind).
    let mut tally: Vec<(Kind, usize, Duration)> = Vec::new();
    let mut asked: Vec<Kind> = Vec::new();
    for chain in &chains {
        let first = &chain[0];
        if let Some(client) = client(first.kind) {
            if !asked.contains(&first.kind) {
                asked.push(first.kind);
                match &client {
                    Ok(version) => eprintln!("snippets: {version}"),
                    // Those blocks' keys are their own: the others print the same without them.
                    Err(why) => skip(&format!("the {}s: no client: {why}", first.kind.name())),
                }
            }
            if client.is_err() {
                continue;
            }
        }
        let began = Instant::now();
        let env = servers.for_block(first);
        match first.kind {
            Kind::Session | Kind::Console => failures.extend(transcripts::run_chain(chain, env)),
            _ => failures.extend(programs::run_block(first, env)),
        }
        for (i, block) in chain.iter().enumerate() {
            let time = if i == 0 {
                began.elapsed()
            } else {
                Duration::ZERO
            };
            match tally.iter_mut().find(|(kind, ..)| *kind == block.kind) {
                Some(entry) => (entry.1, entry.2) = (entry.1 + 1, entry.2 + time),
                None => tally.push((block.kind, 1, time)),
            }
        }
    }
    let summary: Vec<String> = tally
        .iter()
        .map(|(kind, count, time)| format!("{count} {}s {:.1} s", kind.name(), time.as_secs_f64()))
        .collect();
    eprintln!(
        "snippets: the pages' blocks in order on {} servers in {:.1} s: {}",
        servers.started,
        start.elapsed().as_secs_f64(),
        summary.join(", ")
    );
    report("blocks", failures);
}
