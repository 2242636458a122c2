//! Settings: envoyproxy/ratelimit's environment variables where the meaning is the same, ours
//! (`RLS_*`) for what it does not have, and `--config DIR`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::backend::RedisSettings;
use crate::service::{DecisionMode, FailureMode, Headers, Options};

#[derive(Debug, Clone)]
pub struct Settings {
    pub config_dir: PathBuf,
    pub ignore_dot_files: bool,
    pub merge_domains: bool,
    pub host: String,
    pub port: u16,
    pub grpc_host: String,
    pub grpc_port: u16,
    pub redis: RedisSettings,
    pub options: Options,
    pub reload_interval: Duration,
    pub health_interval: Duration,
    pub healthy_with_config: bool,
    pub log_level: LogLevel,
    pub log_json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

/// A setting that cannot be used: the variable, its value, what it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsError(pub String);

impl std::fmt::Display for SettingsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SettingsError {}

/// Go's `time.ParseDuration` for what these settings use: a sequence of decimal numbers with a
/// unit each (`ns`, `us`, `ms`, `s`, `m`, `h`), e.g. `50ms`, `1m30s`, `1.5s`; `0` alone.
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = text;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_end == 0 {
            return None;
        }
        let number: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let factor = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total += number * factor;
    }
    Duration::try_from_secs_f64(total).ok()
}

struct Env<'a> {
    vars: &'a HashMap<String, String>,
}

impl Env<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        self.vars
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
    fn string(&self, name: &str, default: &str) -> String {
        self.get(name).unwrap_or(default).to_owned()
    }
    fn bool(&self, name: &str, default: bool) -> Result<bool, SettingsError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => match v.to_ascii_lowercase().as_str() {
                "1" | "t" | "true" | "yes" | "on" => Ok(true),
                "0" | "f" | "false" | "no" | "off" => Ok(false),
                _ => Err(SettingsError(format!("{name}={v}: expected true or false"))),
            },
        }
    }
    fn port(&self, name: &str, default: u16) -> Result<u16, SettingsError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| {
                SettingsError(format!(
                    "{name}={v}: expected a port number from 0 to 65535"
                ))
            }),
        }
    }
    fn number<T: std::str::FromStr>(
        &self,
        name: &str,
        default: T,
        what: &str,
    ) -> Result<T, SettingsError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| SettingsError(format!("{name}={v}: expected {what}"))),
        }
    }
    fn duration(&self, name: &str, default: Duration) -> Result<Duration, SettingsError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => parse_go_duration(v).ok_or_else(|| {
                SettingsError(format!(
                    "{name}={v}: expected a duration such as 50ms, 2s or 1m30s"
                ))
            }),
        }
    }
}

/// A Redis address in envoyproxy/ratelimit's form as a URL: `host:port` (tcp), a socket path
/// (unix), or already a `redis://`, `rediss://` or `unix://` URL. `REDIS_AUTH` is `password` or
/// `user:password`.
fn redis_url(
    address: &str,
    socket_type: &str,
    auth: Option<&str>,
    tls: bool,
) -> Result<String, SettingsError> {
    let address = address.trim();
    if address.contains("://") {
        return Ok(address.to_owned());
    }
    let userinfo = match auth {
        None => String::new(),
        Some(auth) => {
            let enc = |s: &str| -> String {
                s.bytes()
                    .map(|b| {
                        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                            (b as char).to_string()
                        } else {
                            format!("%{b:02X}")
                        }
                    })
                    .collect()
            };
            match auth.split_once(':') {
                Some((user, password)) => format!("{}:{}@", enc(user), enc(password)),
                None => format!(":{}@", enc(auth)),
            }
        }
    };
    match socket_type {
        "tcp" => Ok(format!(
            "{}://{userinfo}{address}",
            if tls { "rediss" } else { "redis" }
        )),
        "unix" => {
            let mut url = format!("unix://{address}");
            if let Some(auth) = auth {
                match auth.split_once(':') {
                    Some((user, password)) => {
                        url.push_str(&format!("?user={user}&pass={password}"))
                    }
                    None => url.push_str(&format!("?pass={auth}")),
                }
            }
            Ok(url)
        }
        other => Err(SettingsError(format!(
            "REDIS_SOCKET_TYPE={other}: expected tcp or unix"
        ))),
    }
}

impl Settings {
    /// From the environment and the command line (`--config DIR`).
    pub fn from_env_and_args(
        vars: &HashMap<String, String>,
        args: &[String],
    ) -> Result<Settings, SettingsError> {
        let env = Env { vars };
        let mut config_dir: Option<PathBuf> = None;
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            match arg.as_str() {
                "--config" => {
                    let dir = it.next().ok_or_else(|| {
                        SettingsError("--config needs a directory".into())
                    })?;
                    config_dir = Some(PathBuf::from(dir));
                }
                s if s.starts_with("--config=") => {
                    config_dir = Some(PathBuf::from(&s["--config=".len()..]));
                }
                "-h" | "--help" => {
                    return Err(SettingsError(
                        "usage: redis-ratelimit-rls [--config DIR]\n(see gateways/envoy/README.md for the environment variables)".into(),
                    ))
                }
                other => {
                    return Err(SettingsError(format!(
                        "unknown argument '{other}': usage: redis-ratelimit-rls [--config DIR]"
                    )))
                }
            }
        }
        let config_dir = match config_dir {
            Some(dir) => dir,
            None => {
                let root = env.string("RUNTIME_ROOT", "/srv/runtime_data/current");
                let sub = env.string("RUNTIME_SUBDIRECTORY", "");
                let app = env.string("RUNTIME_APPDIRECTORY", "config");
                PathBuf::from(root).join(sub).join(app)
            }
        };

        let socket_type = env.string("REDIS_SOCKET_TYPE", "unix").to_ascii_lowercase();
        let redis_type = env.string("REDIS_TYPE", "SINGLE").to_ascii_uppercase();
        let cluster = match redis_type.as_str() {
            "SINGLE" => false,
            "CLUSTER" => true,
            other => {
                return Err(SettingsError(format!(
                    "REDIS_TYPE={other}: expected SINGLE or CLUSTER (SENTINEL is not supported)"
                )))
            }
        };
        let auth = env.get("REDIS_AUTH");
        let tls = env.bool("REDIS_TLS", false)?;
        let address = env.string("REDIS_URL", "/var/run/nutcracker/ratelimit.sock");
        let urls = address
            .split(',')
            .filter(|a| !a.trim().is_empty())
            .map(|a| redis_url(a, &socket_type, auth, tls))
            .collect::<Result<Vec<_>, _>>()?;
        if urls.is_empty() {
            return Err(SettingsError("REDIS_URL is empty".into()));
        }
        let read = |name: &str| -> Result<Option<Vec<u8>>, SettingsError> {
            match env.get(name) {
                None => Ok(None),
                Some(path) => std::fs::read(path)
                    .map(Some)
                    .map_err(|e| SettingsError(format!("{name}={path}: {e}"))),
            }
        };
        let ca_cert = read("REDIS_TLS_CACERT")?;
        let client_cert = read("REDIS_TLS_CLIENT_CERT")?;
        let client_key = read("REDIS_TLS_CLIENT_KEY")?;
        let client_cert_and_key = match (client_cert, client_key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => {
                return Err(SettingsError(
                    "REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together".into(),
                ))
            }
        };
        let skip_hostname = env.bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false)?;
        let urls: Vec<String> = if tls && skip_hostname {
            urls.into_iter()
                .map(|u| {
                    if u.contains('#') {
                        u
                    } else {
                        format!("{u}#insecure")
                    }
                })
                .collect()
        } else {
            urls
        };
        let uses_tls = urls.iter().any(|u| u.starts_with("rediss://"));
        let tls_files = if uses_tls && (ca_cert.is_some() || client_cert_and_key.is_some()) {
            Some(crate::backend::TlsFiles {
                ca_cert,
                client_cert_and_key,
            })
        } else {
            None
        };
        let on_error = env.string("RLS_ON_REDIS_ERROR", "unavailable");
        let local_share: f64 =
            env.number("RLS_LOCAL_SHARE", 1.0, "a share above 0 and at most 1")?;
        if !(local_share > 0.0 && local_share <= 1.0) {
            return Err(SettingsError(format!(
                "RLS_LOCAL_SHARE={local_share}: expected a share above 0 and at most 1"
            )));
        }
        let redis = RedisSettings {
            urls,
            cluster,
            timeout: env.duration("REDIS_TIMEOUT", Duration::from_secs(10))?,
            breaker_failures: env.number("RLS_BREAKER_FAILURES", 3u32, "a number of failures")?,
            breaker_cool_down: env.duration("RLS_BREAKER_COOL_DOWN", Duration::from_secs(1))?,
            denial_cache: env.number(
                "RLS_DENIAL_CACHE",
                0usize,
                "a number of refusals to keep (0: off)",
            )?,
            local_fallback: on_error == "local",
            local_share,
            tls: tls_files,
        };
        if redis.timeout.is_zero() {
            return Err(SettingsError("REDIS_TIMEOUT must be above 0".into()));
        }

        let headers = if env.bool("LIMIT_RESPONSE_HEADERS_ENABLED", false)? {
            match env.string("RLS_HEADERS_FORMAT", "envoyproxy").as_str() {
                "envoyproxy" => Headers::Legacy {
                    limit: env.string("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
                    remaining: env.string("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
                    reset: env.string("LIMIT_RESET_HEADER", "RateLimit-Reset"),
                },
                "ietf" => Headers::Ietf,
                other => {
                    return Err(SettingsError(format!(
                        "RLS_HEADERS_FORMAT={other}: expected envoyproxy or ietf"
                    )))
                }
            }
        } else {
            Headers::None
        };
        let near_limit_ratio: f64 = env.number("NEAR_LIMIT_RATIO", 0.8, "a ratio from 0 to 1")?;
        if !(0.0..=1.0).contains(&near_limit_ratio) {
            return Err(SettingsError(format!(
                "NEAR_LIMIT_RATIO={near_limit_ratio}: expected a ratio from 0 to 1"
            )));
        }
        let options = Options {
            mode: match env.string("RLS_DECISION", "atomic").as_str() {
                "atomic" => DecisionMode::Atomic,
                "independent" => DecisionMode::Independent,
                other => {
                    return Err(SettingsError(format!(
                        "RLS_DECISION={other}: expected atomic or independent"
                    )))
                }
            },
            domain_hash_tag: match env.string("RLS_CLUSTER_KEYS", "slot-groups").as_str() {
                "slot-groups" => false,
                "domain-tag" => true,
                other => {
                    return Err(SettingsError(format!(
                        "RLS_CLUSTER_KEYS={other}: expected slot-groups or domain-tag"
                    )))
                }
            },
            key_prefix: env.string("CACHE_KEY_PREFIX", ""),
            near_limit_ratio,
            global_shadow_mode: env.bool("SHADOW_MODE", false)?,
            global_quota_mode: env.bool("QUOTA_MODE", false)?,
            headers,
            failure_mode: match on_error.as_str() {
                // With the local fallback the client decides; what it cannot decide fails.
                "unavailable" | "local" => FailureMode::Unavailable,
                "ok" => FailureMode::Allow,
                other => {
                    return Err(SettingsError(format!(
                        "RLS_ON_REDIS_ERROR={other}: expected unavailable, ok or local"
                    )))
                }
            },
        };
        let log_level = match env
            .string("LOG_LEVEL", "WARN")
            .to_ascii_uppercase()
            .as_str()
        {
            "DEBUG" | "TRACE" => LogLevel::Debug,
            "INFO" => LogLevel::Info,
            "WARN" | "WARNING" => LogLevel::Warn,
            "ERROR" | "FATAL" | "PANIC" => LogLevel::Error,
            other => {
                return Err(SettingsError(format!(
                    "LOG_LEVEL={other}: expected debug, info, warn or error"
                )))
            }
        };
        Ok(Settings {
            config_dir,
            ignore_dot_files: env.bool("RUNTIME_IGNOREDOTFILES", false)?,
            merge_domains: env.bool("MERGE_DOMAIN_CONFIG", false)?,
            host: env.string("HOST", "0.0.0.0"),
            port: env.port("PORT", 8080)?,
            grpc_host: env.string("GRPC_HOST", "0.0.0.0"),
            grpc_port: env.port("GRPC_PORT", 8081)?,
            redis,
            options,
            reload_interval: env.duration("RLS_CONFIG_POLL_INTERVAL", Duration::from_secs(1))?,
            health_interval: env.duration("RLS_HEALTH_INTERVAL", Duration::from_secs(1))?,
            healthy_with_config: env.bool("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false)?,
            log_level,
            log_json: env
                .string("LOG_FORMAT", "text")
                .eq_ignore_ascii_case("json"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults_are_envoyproxy_ratelimits() {
        let s = Settings::from_env_and_args(&vars(&[]), &[]).unwrap();
        assert_eq!(s.port, 8080);
        assert_eq!(s.grpc_port, 8081);
        assert_eq!(
            s.config_dir,
            PathBuf::from("/srv/runtime_data/current/config")
        );
        assert_eq!(
            s.redis.urls,
            vec!["unix:///var/run/nutcracker/ratelimit.sock".to_owned()]
        );
        assert_eq!(s.redis.timeout, Duration::from_secs(10));
        assert_eq!(s.options.headers, Headers::None);
    }

    #[test]
    fn redis_addresses() {
        let s = Settings::from_env_and_args(
            &vars(&[
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "127.0.0.1:7000,127.0.0.1:7001"),
                ("REDIS_TYPE", "cluster"),
                ("REDIS_AUTH", "user:p@ss"),
                ("RUNTIME_ROOT", "/data"),
                ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ]),
            &[],
        )
        .unwrap();
        assert!(s.redis.cluster);
        assert_eq!(
            s.redis.urls,
            vec![
                "redis://user:p%40ss@127.0.0.1:7000".to_owned(),
                "redis://user:p%40ss@127.0.0.1:7001".to_owned()
            ]
        );
        assert_eq!(s.config_dir, PathBuf::from("/data/ratelimit/config"));
        let s = Settings::from_env_and_args(&vars(&[]), &["--config".into(), "/etc/rls".into()])
            .unwrap();
        assert_eq!(s.config_dir, PathBuf::from("/etc/rls"));
    }

    #[test]
    fn bad_settings_name_the_variable() {
        for (name, value, expected) in [
            (
                "REDIS_SOCKET_TYPE",
                "udp",
                "REDIS_SOCKET_TYPE=udp: expected tcp or unix",
            ),
            (
                "REDIS_TYPE",
                "SENTINEL",
                "REDIS_TYPE=SENTINEL: expected SINGLE or CLUSTER",
            ),
            (
                "REDIS_TIMEOUT",
                "10",
                "REDIS_TIMEOUT=10: expected a duration",
            ),
            ("GRPC_PORT", "80801", "GRPC_PORT=80801: expected a port"),
            (
                "RLS_DECISION",
                "both",
                "RLS_DECISION=both: expected atomic or independent",
            ),
            (
                "NEAR_LIMIT_RATIO",
                "2",
                "NEAR_LIMIT_RATIO=2: expected a ratio",
            ),
            (
                "SHADOW_MODE",
                "maybe",
                "SHADOW_MODE=maybe: expected true or false",
            ),
        ] {
            let e = Settings::from_env_and_args(
                &vars(&[("REDIS_SOCKET_TYPE", "tcp"), (name, value)]),
                &[],
            )
            .unwrap_err();
            assert!(e.0.starts_with(expected), "{name}: {e}");
        }
        let e = Settings::from_env_and_args(&vars(&[]), &["--bogus".into()]).unwrap_err();
        assert!(e.0.contains("unknown argument '--bogus'"));
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("50ms"), Some(Duration::from_millis(50)));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_go_duration("10"), None);
        assert_eq!(parse_go_duration("1d"), None);
        assert_eq!(parse_go_duration(""), None);
    }
}
