//! The machine a run was measured on, and the tools it runs.

use std::fs;
use std::process::Command;
use std::thread;

use crate::common::now_ms;
use crate::model;

pub fn machine_before() -> model::Machine {
    let cpu_model = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let server = crate::common::server_binary();
    let redis_version = command_output(&server.to_string_lossy(), &["--version"])
        .map(|v| {
            let field = |name: &str| {
                v.split_whitespace()
                    .find_map(|w| w.strip_prefix(name))
                    .unwrap_or("?")
                    .to_string()
            };
            format!("{} ({})", field("v="), field("malloc="))
        })
        .unwrap_or_else(|| "unknown".into());
    let module_revision = command_output("git", &["describe", "--always", "--dirty"])
        .unwrap_or_else(|| "unknown".into());
    model::Machine {
        date_utc: utc_now(),
        cpu_model,
        nproc: thread::available_parallelism().map_or(0, |n| n.get()),
        kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        redis_version,
        module_revision,
        load_before: load_average(),
        load_after: String::new(),
    }
}

pub fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let output = Command::new(program)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// `YYYY-MM-DD HH:MM UTC`.
fn utc_now() -> String {
    let secs = now_ms() / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60
    )
}
