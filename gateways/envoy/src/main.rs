//! `redis-ratelimit-rls [--config DIR]`: envoyproxy/ratelimit's environment variables, our
//! `RLS_*` ones (gateways/envoy/README.md).

use std::collections::HashMap;
use std::process::ExitCode;

use redis_ratelimit_rls::log::{self, Level};
use redis_ratelimit_rls::settings::{LogLevel, Settings};

fn main() -> ExitCode {
    let vars: HashMap<String, String> = std::env::vars().collect();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let settings = match Settings::from_env_and_args(&vars, &args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("redis-ratelimit-rls: {e}");
            return ExitCode::from(2);
        }
    };
    log::init(
        match settings.log_level {
            LogLevel::Debug => Level::Debug,
            LogLevel::Info => Level::Info,
            LogLevel::Warn => Level::Warn,
            LogLevel::Error => Level::Error,
        },
        settings.log_json,
    );
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("redis-ratelimit-rls: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let running = match redis_ratelimit_rls::server::start(settings).await {
            Ok(r) => r,
            Err(e) => {
                log::log(Level::Error, "cannot start", &[("error", &e)]);
                eprintln!("redis-ratelimit-rls: {e}");
                return ExitCode::FAILURE;
            }
        };
        // SIGTERM or SIGINT: stop serving (in-flight calls finish).
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = term => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        log::log(Level::Info, "stopping", &[]);
        running.stop().await;
        ExitCode::SUCCESS
    })
}
