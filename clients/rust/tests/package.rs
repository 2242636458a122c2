//! What a user installs is what is tested: `cargo package` packs the crate (the Functions
//! library inside it), and a fresh project depending on the unpacked crate builds and decides
//! against a server. The core crate is not published, so the packing skips cargo's
//! verification build and lock file (`--no-verify --exclude-lockfile`: both would look the
//! core up on crates.io), and the fresh project finds the core by a `[patch.crates-io]` to its
//! path; the verification is this test's build of the packed crate instead.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn run(command: &mut Command) -> String {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{command:?}\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

#[test]
fn the_packed_crate_builds_in_a_fresh_project_and_decides() {
    let root = redis_ratelimit_testkit::repo_root();
    let target = target_dir(&root);
    run(cargo().current_dir(&root).args([
        "package",
        "--quiet",
        "-p",
        "redis-ratelimit-client",
        "--allow-dirty",
        "--no-verify",
        "--exclude-lockfile",
    ]));
    let version = env!("CARGO_PKG_VERSION");
    let packed = target.join(format!("package/redis-ratelimit-client-{version}.crate"));
    let listing = run(Command::new("tar").arg("tzf").arg(&packed));
    for file in [
        "src/lib.rs",
        "ratelimit.lua",
        "README.md",
        "examples/axum_app.rs",
    ] {
        assert!(
            listing.contains(&format!("redis-ratelimit-client-{version}/{file}")),
            "{file} is packed:\n{listing}"
        );
    }
    let dir = redis_ratelimit_testkit::make_temp_dir();
    run(Command::new("tar")
        .arg("xzf")
        .arg(&packed)
        .arg("-C")
        .arg(&dir));
    // The packed library is the repository's, byte for byte (a symlink when not packed).
    let lua =
        std::fs::read(dir.join(format!("redis-ratelimit-client-{version}/ratelimit.lua"))).unwrap();
    assert_eq!(
        lua,
        std::fs::read(root.join("lua-reference/functions/ratelimit.lua")).unwrap()
    );

    let app = dir.join("app");
    std::fs::create_dir_all(app.join("src")).unwrap();
    std::fs::write(
        app.join("Cargo.toml"),
        format!(
            r#"[package]
name = "app"
version = "0.0.0"
edition = "2021"

[dependencies]
redis-ratelimit-client = {{ path = "../redis-ratelimit-client-{version}", features = ["tower"] }}
redis = {{ version = "0.32", features = ["tokio-comp", "connection-manager"] }}
tokio = {{ version = "1", features = ["rt-multi-thread", "macros"] }}

[patch.crates-io]
redis-ratelimit-core = {{ path = "{core}" }}

[workspace]
"#,
            core = root.join("core").display()
        ),
    )
    .unwrap();
    std::fs::write(
        app.join("src/main.rs"),
        r#"use redis_ratelimit_client::{Algorithm, Limit, Options, RateLimiter};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis = redis::Client::open(std::env::var("REDIS_URL")?)?;
    let limiter = RateLimiter::new(redis.get_connection_manager().await?, Options::default())?;
    let d = limiter.check("user:42", &Limit::new(Algorithm::TokenBucket, 10, "1s")?.burst(20)?, 1).await?;
    println!("{} {} {}", d.allowed, d.remaining, d.source.name());
    Ok(())
}
"#,
    )
    .unwrap();
    // The workspace's lock: the same versions, so the shared target folder has them built.
    std::fs::copy(root.join("Cargo.lock"), app.join("Cargo.lock")).unwrap();
    run(cargo()
        .current_dir(&app)
        .env("CARGO_TARGET_DIR", &target)
        .args(["build", "--quiet"]));
    let server = Server::start_without_module();
    let out = run(Command::new(target.join("debug/app")).env("REDIS_URL", server.url()));
    assert_eq!(out, "true 19 library\n");
    redis_ratelimit_testkit::remove_dir(&dir);
}
