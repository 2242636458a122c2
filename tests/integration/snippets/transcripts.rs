//! redis-cli sessions and console transcripts: each command replayed on the chain's server, its
//! output compared with the page's.

use std::process::Command;
use std::time::Duration;

use super::pages::{Block, Directive, Kind, PROMPT};
use super::run::{indent, normalize, path_with, real_redis_cli, run, takes_at, Clock, Env};

/// One command of a transcript and what the page shows it printing.
struct Step {
    /// Page line of the command.
    line: usize,
    command: String,
    expected: String,
}

/// A session: the `redis-cli` options of a first `$ redis-cli ...` line (e.g. `-3`), then the
/// prompts and their replies.
fn session_steps(block: &Block) -> Result<(Vec<String>, Vec<Step>), String> {
    let mut options = Vec::new();
    let mut steps: Vec<Step> = Vec::new();
    for (i, line) in block.body.iter().enumerate() {
        if let Some(command) = line.strip_prefix(PROMPT) {
            steps.push(Step {
                line: block.body_line(i),
                command: command.to_string(),
                expected: String::new(),
            });
        } else if let Some(step) = steps.last_mut() {
            step.expected.push_str(line);
            step.expected.push('\n');
        } else if let Some(args) = line.strip_prefix("$ redis-cli") {
            options = args.split_whitespace().map(String::from).collect();
        } else {
            return Err(format!(
                "line {}: a session starts with `{PROMPT}...` (or `$ redis-cli <options>`)",
                block.body_line(i)
            ));
        }
    }
    Ok((options, steps))
}

/// A console transcript: `$ ` lines and what each prints.
fn console_steps(block: &Block) -> Result<Vec<Step>, String> {
    let mut steps: Vec<Step> = Vec::new();
    for (i, line) in block.body.iter().enumerate() {
        if let Some(command) = line.strip_prefix("$ ") {
            steps.push(Step {
                line: block.body_line(i),
                command: command.to_string(),
                expected: String::new(),
            });
        } else if let Some(step) = steps.last_mut() {
            step.expected.push_str(line);
            step.expected.push('\n');
        } else {
            return Err(format!(
                "line {}: a console transcript starts with a `$ ` command",
                block.body_line(i)
            ));
        }
    }
    Ok(steps)
}

/// The redis-cli command in a console line (`redis-cli [options] COMMAND args`): its words
/// from COMMAND on (quotes removed), if the line is one plain redis-cli call (no redirection,
/// pipe or second command outside quotes).
fn redis_cli_command(line: &str) -> Option<Vec<String>> {
    let mut words: Vec<String> = Vec::new();
    let (mut word, mut quote, mut in_word) = (String::new(), None, false);
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => (quote, in_word) = (Some(c), true),
            (None, '|' | '<' | '>' | ';' | '&' | '$' | '`') => return None,
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                }
                in_word = false;
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    if words.first().map(String::as_str) != Some("redis-cli") {
        return None;
    }
    let mut i = 1;
    while let Some(word) = words.get(i) {
        match word.as_str() {
            "-p" | "-h" | "-a" | "-n" | "-u" | "-s" | "--user" | "--pass" => i += 2,
            w if w.starts_with('-') => i += 1,
            _ => return Some(words.split_off(i)),
        }
    }
    None
}

/// Runs a chain of sessions and console transcripts on `env`, with one clock; the failures,
/// each naming its page, line and block.
pub fn run_chain(chain: &[Block], env: &Env) -> Vec<String> {
    let live = chain
        .iter()
        .any(|b| b.directives.iter().any(|d| matches!(d, Directive::Wait(_))));
    let mut clock = Clock::new(live);
    let mut failures = Vec::new();
    for block in chain {
        if let Err(why) = clock.start_block(block) {
            failures.push(format!("{}: {why}", block.name()));
            continue;
        }
        let result = match block.kind {
            Kind::Session => session_steps(block).map(|(options, steps)| {
                run_steps(block, &steps, env, &mut clock, |command, clock| {
                    let words: Vec<&str> = command.split_whitespace().collect();
                    let sent = match takes_at(&words, env).then(|| clock.next()).flatten() {
                        Some(at) => format!("{command} AT {at}"),
                        None => command.to_string(),
                    };
                    let mut cli = Command::new(real_redis_cli());
                    cli.arg("-p")
                        .arg(env.server.port().to_string())
                        .arg("--no-raw")
                        .args(&options);
                    (sent.clone(), run(&mut cli, &format!("{sent}\n"), TIMEOUT))
                })
            }),
            Kind::Console => console_steps(block).map(|steps| {
                run_steps(block, &steps, env, &mut clock, |command, clock| {
                    let at = redis_cli_command(command)
                        .filter(|words| {
                            takes_at(&words.iter().map(String::as_str).collect::<Vec<_>>(), env)
                        })
                        .and_then(|_| clock.next());
                    let sent = match at {
                        Some(at) => format!("{command} AT {at}"),
                        None => command.to_string(),
                    };
                    let mut bash = Command::new("bash");
                    bash.arg("-c")
                        .arg(&sent)
                        .current_dir(env.server.dir())
                        .env("PATH", path_with(&env.bin))
                        .env("REDIS_URL", env.server.url())
                        .env("SNIPPET_TTY", "1");
                    (sent.clone(), run(&mut bash, "", TIMEOUT))
                })
            }),
            _ => unreachable!("not a transcript: {}", block.name()),
        };
        match result {
            Ok(mut f) => failures.append(&mut f),
            Err(why) => failures.push(format!("{}: {why}", block.name())),
        }
    }
    failures
}

const TIMEOUT: Duration = Duration::from_secs(20);

fn run_steps(
    block: &Block,
    steps: &[Step],
    env: &Env,
    clock: &mut Clock,
    mut send: impl FnMut(&str, &mut Clock) -> (String, Result<super::run::Output, String>),
) -> Vec<String> {
    let mut failures = Vec::new();
    for step in steps {
        let (sent, output) = send(&step.command, clock);
        let actual = match output {
            Ok(output) if output.success.is_none() => {
                failures.push(format!(
                    "{}, line {}: `{sent}` did not finish within {TIMEOUT:?}",
                    block.name(),
                    step.line
                ));
                continue;
            }
            Ok(output) => {
                let mut text = output.stdout;
                if text.trim().is_empty() && !output.stderr.trim().is_empty() {
                    text = output.stderr; // a failed command: show why
                }
                normalize(&clock.unshift(&text))
            }
            Err(why) => {
                failures.push(format!("{}, line {}: {why}", block.name(), step.line));
                continue;
            }
        };
        let expected = normalize(&step.expected);
        if actual != expected {
            failures.push(format!(
                "{}, line {}: `{}`\n  sent: {sent}\n  ({}; server on port {}{})\n  expected (the page):\n{}\n  actual:\n{}",
                block.name(),
                step.line,
                step.command,
                clock.describe(),
                env.server.port(),
                if env.module { "" } else { ", no module" },
                indent(&expected),
                indent(&actual)
            ));
        }
    }
    failures
}

#[test]
fn a_console_line_names_its_redis_cli_command_past_options_and_quotes() {
    let command = |line| redis_cli_command(line).map(|words| words.join(" "));
    assert_eq!(
        command("redis-cli --user u --pass secret -3 RATELIMIT.CHECK 'a b' x").as_deref(),
        Some("RATELIMIT.CHECK a b x")
    );
    assert_eq!(
        command("redis-cli ACL SETUSER u on '>secret' '~api:*'").as_deref(),
        Some("ACL SETUSER u on >secret ~api:*")
    );
    assert_eq!(command("redis-cli ACL SETUSER u on >secret"), None);
    assert_eq!(command("redis-cli INFO | head"), None);
    assert_eq!(command("grep x redis.conf"), None);
}
