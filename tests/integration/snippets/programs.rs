//! Python, Node and shell blocks: each a program run against the run's server (REDIS_URL), which
//! must exit 0 in time, its stdout compared with the page's `output` block if it has one. The
//! tools they need (a virtualenv with redis-py, an npm project with node-redis) are made once under
//! target/snippets/ and reused.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use super::pages::{repo_root, Block, Directive, Expected, Kind};
use super::run::{cache_dir, find_on_path, indent, normalize, path_with, run, Env};

/// How long one program may run: it must exit by itself (a client left open hangs it).
const PROGRAM_TIMEOUT: Duration = Duration::from_secs(30);
/// How long installing a client may take.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(300);

/// The virtualenv's python with redis-py and this repository's package (clients/python,
/// `redis_ratelimit`), made once (target/snippets/venv); or why not. The package is installed
/// again once per test run (from the source tree, without the registry), so the pages run
/// against the package as it stands.
pub fn python() -> &'static Result<(PathBuf, String), String> {
    static PYTHON: OnceLock<Result<(PathBuf, String), String>> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let (python, version) = python_with_redis_py()?;
        step(
            Command::new(&python)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--no-build-isolation",
                    "--no-deps",
                    "--force-reinstall",
                ])
                .arg(super::pages::repo_root().join("clients/python")),
            "pip install clients/python (the redis_ratelimit package)",
        )?;
        Ok((python, version))
    })
}

/// The virtualenv with redis-py and hatchling (to build clients/python), made once.
fn python_with_redis_py() -> Result<(PathBuf, String), String> {
    let venv = cache_dir().join("venv");
    let python = venv.join("bin/python");
    let version = |python: &Path| {
        let output = run(
            Command::new(python).args(["-c", "import redis, hatchling; print(redis.__version__)"]),
            "",
            INSTALL_TIMEOUT,
        )
        .ok()?;
        (output.success == Some(true)).then(|| output.stdout.trim().to_string())
    };
    if let Some(v) = version(&python) {
        return Ok((python, v));
    }
    let system = find_on_path("python3").ok_or("no python3 on PATH")?;
    step(
        Command::new(&system)
            .args(["-m", "venv", "--clear"])
            .arg(&venv),
        "python3 -m venv (Debian: apt-get install python3-venv)",
    )?;
    step(
        Command::new(&python).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--upgrade",
            "redis",
            "hatchling",
        ]),
        "pip install redis hatchling (is the package registry reachable?)",
    )?;
    version(&python)
        .map(|v| (python, v))
        .ok_or_else(|| "redis-py does not import after pip install".to_string())
}

/// The npm project with node-redis, made once as a user makes one (target/snippets/node:
/// `npm init -y`, `npm install redis`); or why not.
pub fn node_project() -> &'static Result<(PathBuf, String), String> {
    static NODE: OnceLock<Result<(PathBuf, String), String>> = OnceLock::new();
    NODE.get_or_init(|| {
        let project = cache_dir().join("node");
        let installed = project.join("node_modules/redis/package.json");
        let version = || {
            let text = fs::read_to_string(&installed).ok()?;
            let json: serde_json::Value = serde_json::from_str(&text).ok()?;
            json["version"].as_str().map(String::from)
        };
        find_on_path("node").ok_or("no node on PATH")?;
        if let Some(v) = version() {
            return Ok((project, v));
        }
        find_on_path("npm").ok_or("no npm on PATH")?;
        fs::create_dir_all(&project).map_err(|e| format!("{}: {e}", project.display()))?;
        if !project.join("package.json").is_file() {
            step(
                Command::new("npm")
                    .args(["init", "-y"])
                    .current_dir(&project),
                "npm init -y",
            )?;
        }
        step(
            Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "redis"])
                .current_dir(&project),
            "npm install redis (is the package registry reachable?)",
        )?;
        version()
            .map(|v| (project, v))
            .ok_or_else(|| "node-redis is not in node_modules after npm install".to_string())
    })
}

fn step(command: &mut Command, what: &str) -> Result<(), String> {
    let output = run(command, "", INSTALL_TIMEOUT).map_err(|e| format!("{what}: {e}"))?;
    match output.success {
        Some(true) => Ok(()),
        Some(false) => Err(format!(
            "{what} failed:\n{}",
            indent(&normalize(&(output.stdout + &output.stderr)))
        )),
        None => Err(format!("{what}: not done within {INSTALL_TIMEOUT:?}")),
    }
}

/// Runs one block as a program on `env` (its tool, [`python`] or [`node_project`], checked
/// before); its failure, if any, naming its page, line and block.
pub fn run_block(block: &Block, env: &Env) -> Option<String> {
    let dir = if block.has(&Directive::Repo) {
        repo_root()
    } else {
        env.server.dir().to_path_buf()
    };
    let source = block.body.join("\n") + "\n";
    let name = format!(
        "snippet-{}-{}",
        block.page.replace(['/', '.'], "_"),
        block.line
    );
    let (mut command, file) = match block.kind {
        Kind::Python => {
            let (python, _) = python().as_ref().expect("checked by the test");
            let file = env.server.dir().join(format!("{name}.py"));
            (Command::new(python), file)
        }
        Kind::Node => {
            let (project, _) = node_project().as_ref().expect("checked by the test");
            let extension = if block.tag == "mjs" { "mjs" } else { "js" };
            let file = project.join(format!("{name}.{extension}"));
            let mut node = Command::new("node");
            node.current_dir(project);
            (node, file)
        }
        Kind::Shell => {
            let file = env.server.dir().join(format!("{name}.sh"));
            let mut bash = Command::new("bash");
            bash.args(["-e", "-o", "pipefail"]);
            (bash, file)
        }
        _ => unreachable!("not a program: {}", block.name()),
    };
    fs::write(&file, &source).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    if block.kind != Kind::Node {
        command.current_dir(&dir);
    }
    command
        .arg(&file)
        .env("REDIS_URL", env.server.url())
        .env("PATH", path_with(&env.bin));
    let output = run(&mut command, "", PROGRAM_TIMEOUT);
    if block.kind == Kind::Node {
        let _ = fs::remove_file(&file);
    }
    let failure = |what: String| {
        Some(format!(
            "{}: {what}\n  run: {command:?} (REDIS_URL={})\n  the block:\n{}",
            block.name(),
            env.server.url(),
            indent(&source)
        ))
    };
    let output = match output {
        Ok(output) => output,
        Err(why) => return failure(why),
    };
    let printed = || {
        format!(
            "  stdout:\n{}\n  stderr:\n{}",
            indent(&normalize(&output.stdout)),
            indent(&normalize(&output.stderr))
        )
    };
    match output.success {
        None => {
            return failure(format!(
                "did not exit within {PROGRAM_TIMEOUT:?} (is a client left open?)\n{}",
                printed()
            ))
        }
        Some(false) => return failure(format!("failed\n{}", printed())),
        Some(true) => {}
    }
    if let Some(Expected { line, text, vary }) = &block.output {
        let (expected, actual) = (normalize(text), normalize(&output.stdout));
        if masked(&expected, vary) != masked(&actual, vary) {
            return failure(format!(
                "prints other than the output block at line {line}\n  expected (the page):\n{}\n  actual:\n{}",
                indent(&expected),
                indent(&actual)
            ));
        }
    }
    None
}

/// `text` with every number right after one of the `vary` prefixes replaced by `#`.
fn masked(text: &str, vary: &[String]) -> String {
    let mut text = text.to_string();
    for prefix in vary {
        let mut result = String::new();
        let mut rest = text.as_str();
        while let Some(at) = rest.find(prefix.as_str()) {
            let after = at + prefix.len();
            result.push_str(&rest[..after]);
            rest = &rest[after..];
            let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            if digits > 0 {
                result.push('#');
                rest = &rest[digits..];
            }
        }
        result.push_str(rest);
        text = result;
    }
    text
}

#[test]
fn vary_masks_only_the_numbers_after_its_prefix() {
    let vary = ["t=".to_string()];
    assert_eq!(masked("r=99;t=117 t=x", &vary), "r=99;t=# t=x");
    assert_ne!(masked("r=99;t=117", &vary), masked("r=98;t=117", &vary));
}
