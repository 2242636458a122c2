//! Reading the pages: their fenced blocks, what kind each is, and the `<!-- snippet: ... -->`
//! directive before it (see the module docs of `snippets`).

use std::fs;
use std::path::PathBuf;

/// The redis-cli prompt that starts a command in a session.
pub const PROMPT: &str = "127.0.0.1:6379> ";

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md, docs/*.md and fuzz/README.md, relative to the repository root.
pub fn page_paths() -> Vec<String> {
    let root = repo_root();
    let mut docs: Vec<String> = fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    let mut pages = vec!["README.md".to_string()];
    pages.extend(docs);
    pages.push("fuzz/README.md".to_string());
    pages
}

/// How a block is run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Lines starting with [`PROMPT`]: each command replayed, its reply compared.
    Session,
    /// ```` ```console ````: `$ ` lines run with bash, their output compared.
    Console,
    Python,
    Node,
    Shell,
    /// Any other tag: never run.
    Inert,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Session => "redis-cli session",
            Kind::Console => "console transcript",
            Kind::Python => "python block",
            Kind::Node => "js block",
            Kind::Shell => "sh block",
            Kind::Inert => "block",
        }
    }
}

/// One directive of a `<!-- snippet: ... -->` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Directive {
    Skip(String),
    Continue,
    /// `at T +d ...`: the absolute first time (None: after the session's last time) and the
    /// gaps to the next ones.
    At(Option<u64>, Vec<u64>),
    Wait(u64),
    NoModule,
    Library,
    Config(String, String),
    /// `fresh`: the block's server is started anew first, where the page tells the reader to
    /// start from a server just started.
    Fresh,
    Repo,
    Output,
    /// `vary PREFIX` (with `output`): a number right after PREFIX may be any number.
    Vary(String),
}

/// What a program must print: the `output` block's line, its text, and the prefixes of the
/// numbers that may vary.
#[derive(Clone, Debug)]
pub struct Expected {
    pub line: usize,
    pub text: String,
    pub vary: Vec<String>,
}

/// A fenced block of a page.
#[derive(Clone, Debug)]
pub struct Block {
    pub page: String,
    /// 1-based line of the opening fence.
    pub line: usize,
    /// The info string's first word, lowercase (`python`, `mjs`, `text`, or empty).
    pub tag: String,
    pub kind: Kind,
    pub body: Vec<String>,
    pub directives: Vec<Directive>,
    /// The ```` ```text ```` block marked `output` right after this one.
    pub output: Option<Expected>,
}

impl Block {
    pub fn name(&self) -> String {
        format!("{}:{} ({})", self.page, self.line, self.kind.name())
    }

    pub fn has(&self, directive: &Directive) -> bool {
        self.directives.contains(directive)
    }

    pub fn skipped(&self) -> bool {
        self.directives
            .iter()
            .any(|d| matches!(d, Directive::Skip(_)))
    }

    /// The page line of the body's line `index` (0-based).
    pub fn body_line(&self, index: usize) -> usize {
        self.line + 1 + index
    }
}

/// Every fenced block of a page, with its directives, the `output` blocks attached to the block
/// before them; or the problems found (unknown directives, misplaced `output`, untagged blocks
/// that are not sessions).
pub fn read_page(page: &str) -> (Vec<Block>, Vec<String>) {
    let path = repo_root().join(page);
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse_page(page, &text)
}

fn parse_page(page: &str, text: &str) -> (Vec<Block>, Vec<String>) {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks: Vec<Block> = Vec::new();
    let mut problems = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(info) = lines[i].trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let line = i + 1;
        let tag = info.split_whitespace().next().unwrap_or("").to_lowercase();
        let end = (i + 1..lines.len())
            .find(|&j| lines[j].trim() == "```")
            .unwrap_or_else(|| panic!("{page}:{line}: a fence that is never closed"));
        let body: Vec<String> = lines[i + 1..end].iter().map(|l| l.to_string()).collect();
        let directives = match i.checked_sub(1).map(|p| lines[p].trim()) {
            Some(previous) if previous.starts_with("<!-- snippet:") => {
                match parse_directives(previous) {
                    Ok(directives) => directives,
                    Err(why) => {
                        problems.push(format!("{page}:{}: {why}", line - 1));
                        Vec::new()
                    }
                }
            }
            _ => Vec::new(),
        };
        let kind = kind_of(&tag, &body);
        if tag.is_empty() && kind == Kind::Inert {
            problems.push(format!(
                "{page}:{line}: an untagged block that is not a redis-cli session: tag it \
                 (`text`, `conf`, `console`...)"
            ));
        }
        let varies = directives.iter().any(|d| matches!(d, Directive::Vary(_)));
        if varies && !directives.contains(&Directive::Output) {
            problems.push(format!("{page}:{line}: `vary` goes with `output`"));
        }
        if directives.contains(&Directive::Output) {
            match blocks.last_mut() {
                Some(previous)
                    if matches!(previous.kind, Kind::Python | Kind::Node | Kind::Shell)
                        && previous.output.is_none()
                        && kind == Kind::Inert =>
                {
                    previous.output = Some(Expected {
                        line,
                        text: body.join("\n"),
                        vary: directives
                            .iter()
                            .filter_map(|d| match d {
                                Directive::Vary(prefix) => Some(prefix.clone()),
                                _ => None,
                            })
                            .collect(),
                    });
                }
                _ => problems.push(format!(
                    "{page}:{line}: `output` marks a non-running block right after a python, \
                     js or sh block"
                )),
            }
            i = end + 1;
            continue;
        }
        blocks.push(Block {
            page: page.to_string(),
            line,
            tag,
            kind,
            body,
            directives,
            output: None,
        });
        i = end + 1;
    }
    (blocks, problems)
}

fn kind_of(tag: &str, body: &[String]) -> Kind {
    match tag {
        "python" => Kind::Python,
        "js" | "javascript" | "mjs" => Kind::Node,
        "sh" | "bash" | "shell" => Kind::Shell,
        "console" => Kind::Console,
        "" if body.iter().any(|l| l.starts_with(PROMPT)) => Kind::Session,
        _ => Kind::Inert,
    }
}

/// `<!-- snippet: a, b, c -->` → directives. `skip (reason)` takes the rest of the line.
pub fn parse_directives(line: &str) -> Result<Vec<Directive>, String> {
    let inner = line
        .strip_prefix("<!-- snippet:")
        .and_then(|rest| rest.strip_suffix("-->"))
        .ok_or_else(|| format!("not a `<!-- snippet: ... -->` line: {line}"))?
        .trim();
    if let Some(reason) = inner.strip_prefix("skip") {
        let reason = reason.trim();
        let reason = reason
            .strip_prefix('(')
            .and_then(|r| r.strip_suffix(')'))
            .filter(|r| !r.trim().is_empty())
            .ok_or_else(|| format!("`skip` needs a reason in parentheses: {line}"))?;
        return Ok(vec![Directive::Skip(reason.to_string())]);
    }
    inner
        .split(',')
        .map(|item| parse_one(item.trim()))
        .collect()
}

fn parse_one(item: &str) -> Result<Directive, String> {
    let words: Vec<&str> = item.split_whitespace().collect();
    match words.as_slice() {
        ["continue"] => Ok(Directive::Continue),
        ["no-module"] => Ok(Directive::NoModule),
        ["library"] => Ok(Directive::Library),
        ["repo"] => Ok(Directive::Repo),
        ["fresh"] => Ok(Directive::Fresh),
        ["output"] => Ok(Directive::Output),
        ["vary", prefix] => Ok(Directive::Vary(prefix.to_string())),
        ["wait", duration] => parse_duration(duration).map(Directive::Wait),
        ["config", name, value @ ..] if !value.is_empty() => {
            Ok(Directive::Config(name.to_string(), value.join(" ")))
        }
        ["at", times @ ..] if !times.is_empty() => {
            let absolute = !times[0].starts_with('+');
            let (first, gaps) = match times[0].parse::<u64>() {
                Ok(t) if absolute => (Some(t), &times[1..]),
                _ if absolute => return Err(format!("`at`: `{}` is not a time in ms", times[0])),
                _ => (None, times),
            };
            let gaps = gaps
                .iter()
                .map(|g| {
                    g.strip_prefix('+')
                        .and_then(|g| g.parse().ok())
                        .ok_or_else(|| format!("`at`: `{g}` is not `+<ms>`"))
                })
                .collect::<Result<Vec<u64>, String>>()?;
            if first.is_none() && gaps.is_empty() {
                return Err(format!("`at` needs a time or `+<ms>`: {item}"));
            }
            Ok(Directive::At(first, gaps))
        }
        _ => Err(format!("unknown snippet directive `{item}`")),
    }
}

/// `250ms`, `2s` or a number of ms.
fn parse_duration(text: &str) -> Result<u64, String> {
    let parsed = if let Some(ms) = text.strip_suffix("ms") {
        ms.parse().ok()
    } else if let Some(s) = text.strip_suffix('s') {
        s.parse::<u64>().ok().map(|s| s * 1000)
    } else {
        text.parse().ok()
    };
    parsed.ok_or_else(|| format!("`wait`: `{text}` is not a duration (`1500ms`, `2s`)"))
}

/// The blocks of every page, and every problem found in them.
pub fn all_blocks() -> (Vec<Block>, Vec<String>) {
    let mut blocks = Vec::new();
    let mut problems = Vec::new();
    for page in page_paths() {
        let (mut b, mut p) = read_page(&page);
        blocks.append(&mut b);
        problems.append(&mut p);
    }
    (blocks, problems)
}

impl Directive {
    /// Does this directive choose the block's server (so a `continue` block cannot carry it)?
    pub fn picks_server(&self) -> bool {
        matches!(
            self,
            Directive::NoModule | Directive::Library | Directive::Config(..) | Directive::Fresh
        )
    }
}

/// Sessions and console transcripts: the blocks a `continue` may join.
fn is_transcript(kind: Kind) -> bool {
    matches!(kind, Kind::Session | Kind::Console)
}

/// The running blocks (skipped ones left out) in page order, as chains: a block and the
/// `continue` blocks after it, which share its clock. A misplaced `continue` is a problem (and
/// its block a chain of its own), and so is a `continue` block that names a server.
pub fn chains(blocks: &[Block]) -> (Vec<Vec<Block>>, Vec<String>) {
    let mut chains: Vec<Vec<Block>> = Vec::new();
    let mut problems = Vec::new();
    for block in blocks {
        if block.kind == Kind::Inert || block.skipped() {
            continue;
        }
        if !block.has(&Directive::Continue) {
            chains.push(vec![block.clone()]);
            continue;
        }
        let previous = chains.last().and_then(|chain| chain.last());
        let joins = previous.is_some_and(|p| p.page == block.page && is_transcript(p.kind));
        if !is_transcript(block.kind) {
            problems.push(format!(
                "{}: `continue` is for sessions and console transcripts only",
                block.name()
            ));
        } else if !joins {
            problems.push(format!(
                "{}: `continue` needs a session or console transcript before it on its page",
                block.name()
            ));
        } else {
            if let Some(d) = block.directives.iter().find(|d| d.picks_server()) {
                problems.push(format!(
                    "{}: `{d:?}` with `continue`: a `continue` block runs on the server of the \
                     block before it",
                    block.name()
                ));
            }
            chains.last_mut().expect("a chain").push(block.clone());
            continue;
        }
        chains.push(vec![block.clone()]);
    }
    (chains, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_parse_and_unknown_ones_are_refused() {
        assert_eq!(
            parse_directives("<!-- snippet: at 1000 +5 +0, continue -->").unwrap(),
            vec![Directive::At(Some(1000), vec![5, 0]), Directive::Continue]
        );
        assert_eq!(
            parse_directives("<!-- snippet: continue, at +114 -->").unwrap(),
            vec![Directive::Continue, Directive::At(None, vec![114])]
        );
        assert_eq!(
            parse_directives("<!-- snippet: skip (needs a cluster, of 3) -->").unwrap(),
            vec![Directive::Skip("needs a cluster, of 3".into())]
        );
        assert!(parse_directives("<!-- snippet: skip -->").is_err());
        assert!(parse_directives("<!-- snippet: shift 5 -->").is_err());
        assert_eq!(
            parse_directives("<!-- snippet: wait 1s, config a b c -->").unwrap(),
            vec![
                Directive::Wait(1000),
                Directive::Config("a".into(), "b c".into())
            ]
        );
        assert_eq!(
            parse_directives("<!-- snippet: fresh -->").unwrap(),
            vec![Directive::Fresh]
        );
    }

    #[test]
    fn continue_joins_the_session_before_it_on_its_page_and_nothing_else() {
        let page = "\
```
127.0.0.1:6379> PING
PONG
```
<!-- snippet: continue -->
```console
$ redis-cli PING
PONG
```
```python
print(1)
```
<!-- snippet: continue -->
```
127.0.0.1:6379> PING
PONG
```
<!-- snippet: skip (not run) -->
```sh
true
```
```
127.0.0.1:6379> PING
PONG
```
<!-- snippet: continue, fresh -->
```
127.0.0.1:6379> PING
PONG
```
";
        let (blocks, problems) = parse_page("p.md", page);
        assert!(problems.is_empty(), "{problems:?}");
        let (chains, problems) = chains(&blocks);
        let lines: Vec<Vec<usize>> = chains
            .iter()
            .map(|chain| chain.iter().map(|b| b.line).collect())
            .collect();
        // The session and the transcript that continues it; the python block alone; the
        // session after it alone (a `continue` after a program is a problem); the skipped sh
        // block left out; the last two joined, `fresh` on the second a problem.
        assert_eq!(lines, vec![vec![1, 6], vec![10], vec![14], vec![22, 27]]);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("p.md:14") && problems[0].contains("needs a session"));
        assert!(problems[1].contains("p.md:27") && problems[1].contains("Fresh"));
    }
}
