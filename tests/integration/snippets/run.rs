//! What every runner shares: the run's servers (with the module or not, the library, a config
//! file), the `redis-cli` wrapper put first on PATH, running a process with a deadline, the
//! session clock (`at`, `wait`) and comparing output.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::pages::{repo_root, Block, Directive};
use crate::common::{now_ms, Server, DAY_MS};

/// A server of the run, and what it has.
pub struct Env {
    pub server: Server,
    pub module: bool,
    /// The Functions library was loaded into it (by a `library` block).
    pub library: bool,
    /// The folder holding the `redis-cli` wrapper, first on PATH.
    pub bin: PathBuf,
}

/// What a server is started with: the module or not, and its config file's lines.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Setup {
    module: bool,
    config: String,
}

impl Setup {
    fn of(block: &Block) -> Setup {
        Setup {
            module: !block.has(&Directive::NoModule),
            config: block
                .directives
                .iter()
                .filter_map(|d| match d {
                    Directive::Config(name, value) => Some(format!("{name} {value}\n")),
                    _ => None,
                })
                .collect(),
        }
    }
}

/// The servers of a run, one per setup the pages ask for, each shared by every block that asks
/// for it, in page order, as a reader runs them on the server they started: what one block
/// leaves on it, the next ones see.
#[derive(Default)]
pub struct Servers {
    servers: Vec<(Setup, Env)>,
    /// How many were started (a `fresh` block starts its setup's anew).
    pub started: usize,
}

impl Servers {
    /// The server a chain whose first block is `first` runs on: the shared one of its setup (the
    /// module unless `no-module`, its `config` lines), started at the first block that asks for
    /// it, and anew for a `fresh` block; with `library`, the Functions library (re)loaded into it.
    pub fn for_block(&mut self, first: &Block) -> &Env {
        let setup = Setup::of(first);
        let found = self.servers.iter().position(|(s, _)| *s == setup);
        let index = match found {
            Some(i) if !first.has(&Directive::Fresh) => i,
            found => {
                if let Some(i) = found {
                    self.servers.remove(i); // stops it
                }
                self.started += 1;
                let env = start_env(&setup);
                self.servers.push((setup, env));
                self.servers.len() - 1
            }
        };
        let env = &mut self.servers[index].1;
        if first.has(&Directive::Library) {
            load_library(&env.server);
            env.library = true;
        }
        env
    }
}

/// Starts a server of `setup`: the module unless not, and a config file `redis.conf` holding its
/// `config` lines (always a file, so `CONFIG REWRITE` works as on a server started from one).
fn start_env(setup: &Setup) -> Env {
    let mut builder = Server::builder().config_file(&setup.config);
    if !setup.module {
        builder = builder.no_module();
    }
    let server = builder.start();
    let bin = server.dir().join(".snippet-bin");
    fs::create_dir_all(&bin).expect("create the wrapper folder");
    write_wrapper(&bin.join("redis-cli"), server.port());
    Env {
        server,
        module: setup.module,
        library: false,
        bin,
    }
}

/// `FUNCTION LOAD REPLACE` of the Functions library (what `make functions` does).
fn load_library(server: &Server) {
    let path = repo_root().join("lua-reference/functions/ratelimit.lua");
    let code = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(code)
        .query(&mut server.client())
        .unwrap_or_else(|e| panic!("FUNCTION LOAD of {}: {e}", path.display()));
}

/// `redis-cli` as the pages run it: the test server's port (a `-p 6379` in a page means that
/// server too), and with `SNIPPET_TTY=1` the format redis-cli prints in a terminal.
fn write_wrapper(path: &Path, port: u16) {
    let script = format!(
        "#!/usr/bin/env bash\n\
         # redis-cli for the doc snippets: the test server, whatever port the page names as 6379.\n\
         args=()\n\
         while [ $# -gt 0 ]; do\n\
         \x20   if [ \"$1\" = -p ] && [ \"${{2:-}}\" = 6379 ]; then shift 2; continue; fi\n\
         \x20   args+=(\"$1\"); shift\n\
         done\n\
         tty=()\n\
         [ \"${{SNIPPET_TTY:-}}\" = 1 ] && tty=(--no-raw)\n\
         exec {cli} -p {port} \"${{tty[@]}}\" \"${{args[@]}}\"\n",
        cli = real_redis_cli().display()
    );
    fs::write(path, script).expect("write the redis-cli wrapper");
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).expect("chmod the wrapper");
}

/// `$REDIS_CLI`, else `redis-cli`, as a path: a bare name is looked up on this process's PATH,
/// so the wrapper never finds itself (its folder comes first on the snippets' PATH).
pub fn real_redis_cli() -> PathBuf {
    let cli =
        std::env::var_os("REDIS_CLI").map_or_else(|| PathBuf::from("redis-cli"), PathBuf::from);
    if cli.components().count() > 1 {
        return cli;
    }
    find_on_path(&cli.to_string_lossy())
        .unwrap_or_else(|| panic!("{} is not on PATH (make deps)", cli.display()))
}

pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// PATH with `dir` first.
pub fn path_with(dir: &Path) -> std::ffi::OsString {
    let mut dirs = vec![dir.to_path_buf()];
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    std::env::join_paths(dirs).expect("join PATH")
}

/// What a finished process gave.
pub struct Output {
    pub stdout: String,
    pub stderr: String,
    /// None: killed at the deadline.
    pub success: Option<bool>,
}

/// Runs `command` with `stdin`, killing it after `timeout`.
pub fn run(command: &mut Command, stdin: &str, timeout: Duration) -> Result<Output, String> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    let mut input = child.stdin.take().expect("piped stdin");
    let stdin = stdin.to_string();
    let writer = thread::spawn(move || {
        let _ = input.write_all(stdin.as_bytes());
    });
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let reader = thread::spawn(move || {
        let mut text = Vec::new();
        let _ = out.read_to_end(&mut text);
        String::from_utf8_lossy(&text).into_owned()
    });
    let err_reader = thread::spawn(move || {
        let mut text = Vec::new();
        let _ = err.read_to_end(&mut text);
        String::from_utf8_lossy(&text).into_owned()
    });
    let deadline = Instant::now() + timeout;
    let success = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status.success()),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(2)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let _ = writer.join();
    Ok(Output {
        stdout: reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
        success,
    })
}

/// Lines with trailing spaces removed, and no trailing empty lines: what output is compared as.
pub fn normalize(text: &str) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    let end = lines
        .iter()
        .rposition(|l| !l.is_empty())
        .map_or(0, |i| i + 1);
    lines[..end].join("\n")
}

/// `text` indented, for a message.
pub fn indent(text: &str) -> String {
    if text.is_empty() {
        return "    (nothing)".to_string();
    }
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The session clock of a chain: the page's times (`at`), and how far they are moved to run.
///
/// The page's times are moved by a whole number of days (of seconds, in a chain with `wait`) to
/// just after the server's clock, so windows stay aligned as on the page, and nothing written
/// expires during the run. Numbers in a reply that are times of the run (13-digit ms near the
/// moved times) are moved back before comparing, so absolute times compare exactly too.
#[derive(Default)]
pub struct Clock {
    shift: Option<i128>,
    live: bool,
    /// The page time of the last command sent with `AT`.
    last: Option<u64>,
    /// Page times queued for the next commands that take `AT`.
    queue: Vec<u64>,
}

impl Clock {
    /// A chain's clock; `live` (the chain has a `wait`) places it within a second of the
    /// server's clock, so that a `wait` sees the server's clock pass the session's times.
    pub fn new(live: bool) -> Clock {
        Clock {
            live,
            ..Clock::default()
        }
    }

    /// At the start of a block: its `at` times, and its `wait` (sleeps until the server's
    /// clock is that far past the session's last time).
    pub fn start_block(&mut self, block: &Block) -> Result<(), String> {
        for directive in &block.directives {
            match directive {
                Directive::At(first, gaps) => {
                    let mut t = match (first, self.last) {
                        (Some(t), _) => *t,
                        (None, Some(last)) => last,
                        (None, None) => {
                            return Err("`at +<ms>` with no session time before it".into())
                        }
                    };
                    self.queue.clear();
                    if first.is_some() {
                        self.queue.push(t);
                    }
                    for gap in gaps {
                        t += gap;
                        self.queue.push(t);
                    }
                    self.queue.reverse();
                }
                Directive::Wait(ms) => {
                    let (Some(last), Some(shift)) = (self.last, self.shift) else {
                        return Err("`wait` with no session time before it".into());
                    };
                    let target = (last as i128 + shift) as u64 + ms;
                    while now_ms() <= target {
                        thread::sleep(Duration::from_millis(5));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The run time of the next command that takes `AT`, if the session has times.
    pub fn next(&mut self) -> Option<u64> {
        let page_time = match self.queue.pop() {
            Some(t) => t,
            None => self.last?,
        };
        self.last = Some(page_time);
        let shift = *self.shift.get_or_insert_with(|| {
            let (unit, margin) = if self.live {
                (1000, 300)
            } else {
                (DAY_MS as i128, 60_000)
            };
            let behind = (now_ms() as i128 + margin) - page_time as i128;
            behind.div_euclid(unit) * unit + if behind.rem_euclid(unit) > 0 { unit } else { 0 }
        });
        Some((page_time as i128 + shift) as u64)
    }

    /// `text` with the run's times moved back to the page's.
    pub fn unshift(&self, text: &str) -> String {
        let (Some(shift), Some(last)) = (self.shift, self.last) else {
            return text.to_string();
        };
        let run = last as i128 + shift;
        let (low, high) = (run - 400 * DAY_MS as i128, run + 3700 * DAY_MS as i128);
        let mut result = String::with_capacity(text.len());
        let mut digits = String::new();
        let flush = |digits: &mut String, result: &mut String| {
            match digits.parse::<i128>() {
                Ok(v) if digits.len() >= 12 && (low..=high).contains(&v) => {
                    result.push_str(&(v - shift).to_string())
                }
                _ => result.push_str(digits),
            }
            digits.clear();
        };
        for c in text.chars() {
            if c.is_ascii_digit() {
                digits.push(c);
            } else {
                flush(&mut digits, &mut result);
                result.push(c);
            }
        }
        flush(&mut digits, &mut result);
        result
    }

    /// How the run's times relate to the page's, for a message.
    pub fn describe(&self) -> String {
        match self.shift {
            Some(shift) => format!(
                "page times moved by {shift} ms ({} days) to run, and back in the reply",
                shift as f64 / DAY_MS as f64
            ),
            None => "the server's clock (no `at`)".to_string(),
        }
    }
}

/// Does this command (its words) take `AT` on this server: the module's CHECK, PEEK, CHECKALL, TAKE,
/// REFUND, ACQUIRE and RELEASE, and the library's check, peek, checkall, refund, acquire and
/// release (and take), unless it names `AT` already?
pub fn takes_at(words: &[&str], env: &Env) -> bool {
    let Some(name) = words.first() else {
        return false;
    };
    if words.iter().any(|w| w.eq_ignore_ascii_case("AT")) {
        return false;
    }
    let name = name.to_ascii_uppercase();
    let module = env.module
        && matches!(
            name.as_str(),
            "RATELIMIT.CHECK"
                | "RATELIMIT.PEEK"
                | "RATELIMIT.CHECKALL"
                | "RATELIMIT.REFUND"
                | "RATELIMIT.ACQUIRE"
                | "RATELIMIT.RELEASE"
                | "RATELIMIT.TAKE"
        );
    let library = env.library
        && matches!(name.as_str(), "FCALL" | "FCALL_RO")
        && words.get(1).is_some_and(|f| {
            matches!(
                f.to_ascii_lowercase().as_str(),
                "ratelimit_check"
                    | "ratelimit_peek"
                    | "ratelimit_checkall"
                    | "ratelimit_refund"
                    | "ratelimit_acquire"
                    | "ratelimit_release"
                    | "ratelimit_take"
            )
        });
    module || library
}

/// The folder the runners cache their tools in: `target/snippets`.
pub fn cache_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    target.join("snippets")
}

#[test]
fn the_clock_moves_page_times_by_whole_days_and_moves_them_back_in_replies() {
    let page = 1_796_006_883_715; // 2026-11-30, 3715 ms into a minute
    let mut clock = Clock {
        queue: vec![page + 10, page],
        ..Clock::default()
    };
    let run = clock.next().unwrap();
    assert_eq!((run - page) % DAY_MS, 0);
    assert!(run > now_ms() + 59_000 && run <= now_ms() + 60_000 + DAY_MS);
    assert_eq!(clock.next().unwrap(), run + 10);
    assert_eq!(
        clock.next().unwrap(),
        run + 10,
        "after the list, the last time"
    );
    let reply = format!(
        "14) (integer) {}\n\"rl:fw 3 900000 1 {}\" 1000000000000",
        run,
        run + 5
    );
    assert_eq!(
        clock.unshift(&reply),
        format!(
            "14) (integer) {page}\n\"rl:fw 3 900000 1 {}\" 1000000000000",
            page + 5
        )
    );
}
