//! The service's numbers, in Prometheus's text format on `/metrics`: envoyproxy/ratelimit's stats
//! under the names its Prometheus mapping gives them (`ratelimit_service_rate_limit_total_hits`
//! and the rest, labelled by domain and by the descriptor's stats key), its service counters, and
//! latency histograms (the whole call and the Redis round trip).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One rate limit rule's counters (`ratelimit.service.rate_limit.DOMAIN.KEY_VALUE.STAT`).
#[derive(Debug, Default)]
pub struct LimitStats {
    pub total_hits: AtomicU64,
    pub over_limit: AtomicU64,
    pub near_limit: AtomicU64,
    pub within_limit: AtomicU64,
    pub shadow_mode: AtomicU64,
    pub over_limit_with_local_cache: AtomicU64,
}

impl LimitStats {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// A latency histogram in seconds with fixed buckets.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_ns: AtomicU64,
    count: AtomicU64,
}

const LATENCY_BOUNDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            bounds: LATENCY_BOUNDS,
            counts: LATENCY_BOUNDS.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            if secs <= *bound {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.sum_ns.fetch_add(
            d.as_nanos().min(u128::from(u64::MAX)) as u64,
            Ordering::Relaxed,
        );
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {}",
                count.load(Ordering::Relaxed)
            );
        }
        let total = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {total}");
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(
            out,
            "{name}_sum{braces} {}",
            self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9
        );
        let _ = writeln!(out, "{name}_count{braces} {total}");
    }
}

/// Everything `/metrics` shows.
#[derive(Debug)]
pub struct Stats {
    limits: Mutex<BTreeMap<(String, String), Arc<LimitStats>>>,
    pub total_requests: AtomicU64,
    pub redis_errors: AtomicU64,
    pub service_errors: AtomicU64,
    pub failed_open: AtomicU64,
    pub global_shadow_mode: AtomicU64,
    pub config_load_success: AtomicU64,
    pub config_load_error: AtomicU64,
    pub redis_calls: AtomicU64,
    pub response_time: Histogram,
    pub redis_time: Histogram,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            limits: Mutex::new(BTreeMap::new()),
            total_requests: AtomicU64::new(0),
            redis_errors: AtomicU64::new(0),
            service_errors: AtomicU64::new(0),
            failed_open: AtomicU64::new(0),
            global_shadow_mode: AtomicU64::new(0),
            config_load_success: AtomicU64::new(0),
            config_load_error: AtomicU64::new(0),
            redis_calls: AtomicU64::new(0),
            response_time: Histogram::new(),
            redis_time: Histogram::new(),
        }
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Stats {
    /// The counters of one stats key (`domain.key_value...`), made on first use.
    pub fn limit(&self, domain: &str, stats_key: &str) -> Arc<LimitStats> {
        let key = stats_key
            .strip_prefix(domain)
            .and_then(|k| k.strip_prefix('.'))
            .unwrap_or(stats_key);
        let mut map = self.limits.lock().unwrap_or_else(|p| p.into_inner());
        map.entry((domain.to_owned(), key.to_owned()))
            .or_default()
            .clone()
    }

    /// One counter's value, for tests: `stat` is `total_hits`, `over_limit`, ...
    pub fn value(&self, stats_key: &str, stat: &str) -> u64 {
        let map = self.limits.lock().unwrap_or_else(|p| p.into_inner());
        for ((domain, key), s) in map.iter() {
            if format!("{domain}.{key}") == stats_key {
                let c = match stat {
                    "total_hits" => &s.total_hits,
                    "over_limit" => &s.over_limit,
                    "near_limit" => &s.near_limit,
                    "within_limit" => &s.within_limit,
                    "shadow_mode" => &s.shadow_mode,
                    "over_limit_with_local_cache" => &s.over_limit_with_local_cache,
                    _ => return 0,
                };
                return c.load(Ordering::Relaxed);
            }
        }
        0
    }

    /// The Prometheus text exposition.
    pub fn render(&self, redis_up: bool, breaker_open: bool, client: &[(String, u64)]) -> String {
        let mut out = String::new();
        let map = self.limits.lock().unwrap_or_else(|p| p.into_inner());
        type Pick = fn(&LimitStats) -> &AtomicU64;
        let families: [(&str, &str, Pick); 6] = [
            ("total_hits", "Rule hits in total.", |s| &s.total_hits),
            ("over_limit", "Rule hits over the limit.", |s| &s.over_limit),
            (
                "near_limit",
                "Rule hits over the near-limit ratio but within the limit.",
                |s| &s.near_limit,
            ),
            ("within_limit", "Rule hits within the limit.", |s| {
                &s.within_limit
            }),
            (
                "shadow_mode",
                "Rule hits over the limit that shadow mode let through.",
                |s| &s.shadow_mode,
            ),
            (
                "over_limit_with_local_cache",
                "Rule hits refused by the local denial cache.",
                |s| &s.over_limit_with_local_cache,
            ),
        ];
        for (stat, help, pick) in families {
            let name = format!("ratelimit_service_rate_limit_{stat}");
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            for ((domain, key), s) in map.iter() {
                let _ = writeln!(
                    out,
                    "{name}{{domain=\"{}\",key=\"{}\"}} {}",
                    escape(domain),
                    escape(key),
                    pick(s).load(Ordering::Relaxed)
                );
            }
        }
        drop(map);
        let counters: [(&str, &str, &AtomicU64); 6] = [
            (
                "ratelimit_service_config_load_success",
                "Configuration loads that succeeded.",
                &self.config_load_success,
            ),
            (
                "ratelimit_service_config_load_error",
                "Configuration loads that failed (the running configuration stayed).",
                &self.config_load_error,
            ),
            (
                "ratelimit_service_global_shadow_mode",
                "Requests over the limit that the global shadow mode let through.",
                &self.global_shadow_mode,
            ),
            (
                "redis_ratelimit_rls_failed_open_total",
                "Requests answered OK because Redis failed (the configured failure mode).",
                &self.failed_open,
            ),
            (
                "redis_ratelimit_rls_redis_calls_total",
                "Pipelines sent to Redis.",
                &self.redis_calls,
            ),
            (
                "ratelimit_service_total_requests",
                "ShouldRateLimit calls.",
                &self.total_requests,
            ),
        ];
        for (name, help, counter) in counters {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            if name == "ratelimit_service_total_requests" {
                let _ = writeln!(
                    out,
                    "{name}{{grpc_method=\"ShouldRateLimit\"}} {}",
                    counter.load(Ordering::Relaxed)
                );
            } else {
                let _ = writeln!(out, "{name} {}", counter.load(Ordering::Relaxed));
            }
        }
        let name = "ratelimit_service_should_rate_limit_error";
        let _ = writeln!(
            out,
            "# HELP {name} ShouldRateLimit calls that failed, by cause."
        );
        let _ = writeln!(out, "# TYPE {name} counter");
        let _ = writeln!(
            out,
            "{name}{{err_type=\"redis_error\"}} {}",
            self.redis_errors.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "{name}{{err_type=\"service_error\"}} {}",
            self.service_errors.load(Ordering::Relaxed)
        );
        let name = "ratelimit_service_response_time_seconds";
        let _ = writeln!(out, "# HELP {name} ShouldRateLimit latency.");
        let _ = writeln!(out, "# TYPE {name} histogram");
        self.response_time
            .render(&mut out, name, "grpc_method=\"ShouldRateLimit\"");
        let name = "redis_ratelimit_rls_redis_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Redis round-trip latency (one pipeline per request)."
        );
        let _ = writeln!(out, "# TYPE {name} histogram");
        self.redis_time.render(&mut out, name, "");
        let name = "redis_ratelimit_rls_client_total";
        let _ = writeln!(
            out,
            "# HELP {name} The Redis client's counters: commands sent, decisions by source (module, library, cache, fallback...)."
        );
        let _ = writeln!(out, "# TYPE {name} counter");
        for (what, n) in client {
            let _ = writeln!(out, "{name}{{what=\"{}\"}} {n}", escape(what));
        }
        for (name, help, value) in [
            (
                "redis_ratelimit_rls_redis_up",
                "1 while Redis answers PING.",
                redis_up,
            ),
            (
                "redis_ratelimit_rls_breaker_open",
                "1 while the Redis breaker is open.",
                breaker_open,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            let _ = writeln!(out, "{name} {}", u8::from(value));
        }
        out
    }
}
