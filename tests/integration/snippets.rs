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
//! Every block gets a fresh server with the module on a free port: `REDIS_URL` names it, and the
//! `redis-cli` first on PATH talks to it (a `-p 6379` in a page means it too). Shell blocks and
//! transcripts run in its temporary directory, which holds its config file `redis.conf`.
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
//! - `continue`: run on the server, clock and directory of the running block before it.
//! - `no-module`: a server without the module; `library`: the Functions library loaded;
//!   `config NAME VALUE`: a line of the server's config file (repeatable).
//! - `repo` (sh): run in the repository root instead of the server's directory.
//! - `output`, on a block that never runs (a `text` block) right after a python, js or sh
//!   block: what that block prints to stdout, compared exactly; with `vary PREFIX`, a number
//!   right after PREFIX (`vary t=`: a clock-dependent `t=117`) matches any number.
//!
//! Comparisons ignore trailing spaces and trailing empty lines. A failure names the page, the
//! line, the block, what was sent, and the expected and actual output. The pages show what the
//! redis-server and redis-cli on PATH (7.0) print: under another server (`RATELIMIT_SERVER`,
//! `make test-matrix`) these tests skip, and so do the python and js tests where python3 (with
//! venv), node or npm, or the package registry for the first install, is out of reach.

mod pages;
mod programs;
mod run;
mod transcripts;

use crate::common::skip;
use pages::{all_blocks, chains, Kind};

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
    for kinds in [
        &[Kind::Session, Kind::Console][..],
        &[Kind::Python],
        &[Kind::Node],
        &[Kind::Shell],
    ] {
        problems.extend(chains(&blocks, kinds).1);
    }
    report("problems", problems);
}

#[test]
fn redis_cli_sessions_and_transcripts_answer_as_the_pages_show() {
    if let Some(why) = other_server() {
        return skip(&why);
    }
    let (blocks, _) = all_blocks();
    let (chains, _) = chains(&blocks, &[Kind::Session, Kind::Console]);
    let count: usize = chains.iter().map(Vec::len).sum();
    eprintln!(
        "snippets: {count} sessions and transcripts, on {} servers",
        chains.len()
    );
    let failures = run::parallel(&chains, |chain| transcripts::run_chain(chain));
    report("commands", failures.into_iter().flatten().collect());
}

fn run_programs(kind: Kind) {
    let (blocks, _) = all_blocks();
    let (chains, _) = chains(&blocks, &[kind]);
    let blocks: Vec<_> = chains.into_iter().flatten().collect();
    eprintln!("snippets: {} {}s", blocks.len(), kind.name());
    let failures = run::parallel(&blocks, programs::run_block);
    report("blocks", failures.into_iter().flatten().collect());
}

#[test]
fn shell_blocks_run() {
    if let Some(why) = other_server() {
        return skip(&why);
    }
    run_programs(Kind::Shell);
}

#[test]
fn python_blocks_run_with_redis_py() {
    if let Some(why) = other_server() {
        return skip(&why);
    }
    match programs::python() {
        Ok((_, version)) => eprintln!("snippets: redis-py {version}"),
        Err(why) => return skip(&format!("no python client for the snippets: {why}")),
    }
    run_programs(Kind::Python);
}

#[test]
fn node_blocks_run_with_node_redis() {
    if let Some(why) = other_server() {
        return skip(&why);
    }
    match programs::node_project() {
        Ok((_, version)) => eprintln!("snippets: node-redis {version}"),
        Err(why) => return skip(&format!("no node client for the snippets: {why}")),
    }
    run_programs(Kind::Node);
}
