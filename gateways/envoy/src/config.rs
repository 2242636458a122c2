//! envoyproxy/ratelimit's YAML configuration, read unchanged and validated as it validates, plus
//! our optional extension under `rate_limit.redis_ratelimit`.
//!
//! A configuration is a set of files, each one domain (`domain`, `descriptors`). Loading checks, in
//! envoyproxy/ratelimit's order: the document parses; every mapping key is a string and one of the
//! keys the format knows (at any depth: the check is flat, as theirs is); every list holds mappings;
//! the domain is not empty nor a duplicate (unless merging); every descriptor has a key, no two
//! descriptors of one list share a key and value, the unit is valid (and absent when `unlimited`),
//! `replaces` entries are named and not the limit's own name, `share_threshold` is on a wildcard.
//! Every error names the file and the field (`descriptors[0].rate_limit.unit`), then says what
//! envoyproxy/ratelimit says.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use crate::yaml_tree::Tree;

/// A configuration error: the file, the field (a path into the document, empty for the whole
/// file) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}: {}: {}", self.file, self.field, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

fn err(file: &str, field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        file: file.to_owned(),
        field: field.to_owned(),
        message: message.into(),
    }
}

/// The time units of envoyproxy/ratelimit's `rate_limit.unit` (Envoy's
/// `RateLimitResponse.RateLimit.Unit`), matched case-insensitively. A month is 30 days and a year
/// 365, as envoyproxy/ratelimit counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    pub fn parse(text: &str) -> Option<Unit> {
        Some(match text.to_ascii_uppercase().as_str() {
            "SECOND" => Unit::Second,
            "MINUTE" => Unit::Minute,
            "HOUR" => Unit::Hour,
            "DAY" => Unit::Day,
            "WEEK" => Unit::Week,
            "MONTH" => Unit::Month,
            "YEAR" => Unit::Year,
            _ => return None,
        })
    }

    /// From the protobuf enum's number (a descriptor's limit override); `None` for UNKNOWN.
    pub fn from_proto(value: i32) -> Option<Unit> {
        Some(match value {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            7 => Unit::Week,
            _ => return None,
        })
    }

    pub fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    pub fn period_ms(self) -> u64 {
        self.seconds() * 1000
    }

    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }
}

/// The module's algorithms (docs/commands.md, "Arguments").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    TokenBucket,
    LeakyBucket,
    FixedWindow,
    SlidingWindow,
    SlidingLog,
    Gcra,
}

impl Algorithm {
    pub const ALL: [Algorithm; 6] = [
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::Gcra,
    ];

    pub fn parse(text: &str) -> Option<Algorithm> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(text))
    }

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token-bucket",
            Algorithm::LeakyBucket => "leaky-bucket",
            Algorithm::FixedWindow => "fixed-window",
            Algorithm::SlidingWindow => "sliding-window",
            Algorithm::SlidingLog => "sliding-log",
            Algorithm::Gcra => "gcra",
        }
    }

    /// Whether `BURST` applies (the buckets and GCRA).
    pub fn takes_burst(self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra
        )
    }
}

/// Largest `limit`, `BURST` and `COST` the module accepts.
pub const MAX_AMOUNT: u64 = 1_000_000_000_000;
/// Largest period or `BLOCK` the module accepts: 3650 days in ms.
pub const MAX_PERIOD_MS: u64 = 3650 * 86_400_000;
/// The module's default `ratelimit.max-log-limit`: the largest sliding-log limit.
pub const MAX_LOG_LIMIT: u64 = 100_000;

/// How the module decides one rate limit: the limit spec a `RATELIMIT.CHECK` takes after its key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Spec {
    /// `algorithm limit period [BURST capacity] [BLOCK duration]`.
    Inline {
        algorithm: Algorithm,
        limit: u64,
        period_ms: u64,
        burst: Option<u64>,
        block_ms: Option<u64>,
    },
    /// `POLICY name`: a limit defined on the server with `RATELIMIT.POLICY SET`.
    Policy(String),
}

impl Spec {
    /// The spec's words, as CHECK and CHECKALL take them.
    pub fn args(&self) -> Vec<String> {
        match self {
            Spec::Inline {
                algorithm,
                limit,
                period_ms,
                burst,
                block_ms,
            } => {
                let mut args = vec![
                    algorithm.name().to_owned(),
                    limit.to_string(),
                    period_ms.to_string(),
                ];
                if let Some(burst) = burst {
                    args.push("BURST".into());
                    args.push(burst.to_string());
                }
                if let Some(block) = block_ms {
                    args.push("BLOCK".into());
                    args.push(block.to_string());
                }
                args
            }
            Spec::Policy(name) => vec!["POLICY".into(), name.clone()],
        }
    }

    /// What the stored key's name ends with, so that a configuration that changes the algorithm
    /// (or the window) starts a fresh limiter instead of meeting the old one's state.
    pub fn key_suffix(&self) -> String {
        match self {
            Spec::Inline {
                algorithm,
                period_ms,
                ..
            } => format!("{}:{}", algorithm.name(), period_ms),
            Spec::Policy(name) => format!("policy:{name}"),
        }
    }

    pub fn algorithm(&self) -> Option<Algorithm> {
        match self {
            Spec::Inline { algorithm, .. } => Some(*algorithm),
            Spec::Policy(_) => None,
        }
    }
}

/// One `rate_limit` block, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimit {
    /// The stats key of the config entry: `domain.key_value.key2` (envoyproxy/ratelimit's FullKey).
    pub full_key: String,
    pub requests_per_unit: u32,
    /// `None` only when `unlimited`.
    pub unit: Option<Unit>,
    pub unlimited: bool,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    pub name: String,
    pub replaces: Vec<String>,
    pub detailed_metric: bool,
    /// How the module decides it (`None` when unlimited).
    pub spec: Option<Spec>,
}

#[derive(Debug, Clone)]
struct WildcardEntry {
    key: String,
    parts: Vec<String>,
}

/// One level of a domain's descriptor tree.
#[derive(Debug, Clone, Default)]
struct Level {
    children: HashMap<String, Level>,
    /// The children whose composite key has a `*`, in document order (the first match wins).
    wildcards: Vec<WildcardEntry>,
    limit: Option<Arc<RateLimit>>,
    value_to_metric: bool,
    share_threshold: bool,
    wildcard_pattern: Option<String>,
}

/// A loaded configuration: its domains.
#[derive(Debug, Clone, Default)]
pub struct Config {
    domains: HashMap<String, Level>,
    /// The files it was loaded from, in load order.
    pub files: Vec<String>,
}

/// The limit one request descriptor resolves to.
#[derive(Debug, Clone)]
pub struct Matched {
    pub limit: Arc<RateLimit>,
    /// The stats key this descriptor counts under (detailed_metric, value_to_metric and
    /// share_threshold applied).
    pub stats_key: String,
    /// Per entry: the wildcard value to use in the counter's key instead of the request's
    /// (share_threshold), else `None`.
    pub share_patterns: Vec<Option<String>>,
}

/// The keys envoyproxy/ratelimit knows, at any depth, plus ours.
const VALID_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    EXTENSION_KEY,
];

/// Our extension's key, inside a `rate_limit` block.
pub const EXTENSION_KEY: &str = "redis_ratelimit";

// The typed form, read leniently as envoyproxy/ratelimit reads it (a known key in the wrong place
// is ignored); the strict checks are on the tree and below.
#[derive(Deserialize, Default)]
struct YamlRoot {
    #[serde(default)]
    domain: Option<String>,
    #[serde(default)]
    descriptors: Option<Vec<YamlDescriptor>>,
}

#[derive(Deserialize, Default)]
struct YamlDescriptor {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    rate_limit: Option<YamlRateLimit>,
    #[serde(default)]
    descriptors: Option<Vec<YamlDescriptor>>,
    #[serde(default)]
    shadow_mode: Option<bool>,
    #[serde(default)]
    quota_mode: Option<bool>,
    #[serde(default)]
    detailed_metric: Option<bool>,
    #[serde(default)]
    value_to_metric: Option<bool>,
    #[serde(default)]
    share_threshold: Option<bool>,
}

#[derive(Deserialize, Default)]
struct YamlRateLimit {
    #[serde(default)]
    requests_per_unit: Option<u32>,
    #[serde(default)]
    unit: Option<String>,
    #[serde(default)]
    unlimited: Option<bool>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    replaces: Option<Vec<YamlReplaces>>,
    #[serde(default)]
    redis_ratelimit: Option<YamlExtension>,
}

#[derive(Deserialize, Default)]
struct YamlReplaces {
    #[serde(default)]
    name: Option<String>,
}

/// `rate_limit.redis_ratelimit`: strict (an unknown key is an error).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct YamlExtension {
    #[serde(default)]
    algorithm: Option<String>,
    #[serde(default)]
    burst: Option<u64>,
    #[serde(default)]
    block: Option<String>,
    #[serde(default)]
    policy: Option<String>,
}

/// Options of a load (envoyproxy/ratelimit's settings that change what a load accepts).
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// `MERGE_DOMAIN_CONFIG`: several files may define one domain.
    pub merge_domains: bool,
}

/// One file to load: its name (as errors show it) and its text.
pub struct Source {
    pub name: String,
    pub text: String,
}

impl Config {
    /// Loads a configuration from file contents, in the order given.
    pub fn load(sources: &[Source], options: LoadOptions) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        for source in sources {
            config.load_one(source, options)?;
            config.files.push(source.name.clone());
        }
        Ok(config)
    }

    /// Reads every `*.yaml` and `*.yml` file under `dir` (recursively, sorted by path) and loads
    /// them. Errors name the file by its path relative to `dir`.
    pub fn load_dir(
        dir: &Path,
        options: LoadOptions,
        ignore_dot_files: bool,
    ) -> Result<Config, ConfigError> {
        let sources = read_dir_sources(dir, ignore_dot_files)?;
        Config::load(&sources, options)
    }

    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    fn load_one(&mut self, source: &Source, options: LoadOptions) -> Result<(), ConfigError> {
        let file = source.name.as_str();
        let parse_error = |e: serde_saphyr::Error| {
            err(
                file,
                "",
                format!("error loading config file: {}", yaml_message(&e)),
            )
        };
        let tree: Tree = if source.text.trim().is_empty() {
            Tree::Null
        } else {
            serde_saphyr::from_str(&source.text).map_err(parse_error)?
        };
        match &tree {
            Tree::Map(entries) => validate_keys(file, "", entries)?,
            Tree::Null => {}
            other => {
                return Err(err(
                    file,
                    "",
                    format!("error loading config file: the document is not a mapping: {other}"),
                ))
            }
        }
        let root: YamlRoot = if matches!(tree, Tree::Null) {
            YamlRoot::default()
        } else {
            serde_saphyr::from_str(&source.text).map_err(parse_error)?
        };
        let domain = root.domain.unwrap_or_default();
        if domain.is_empty() {
            return Err(err(file, "domain", "config file cannot have empty domain"));
        }
        let descriptors = root.descriptors.unwrap_or_default();
        if let Some(level) = self.domains.get_mut(&domain) {
            if !options.merge_domains {
                return Err(err(
                    file,
                    "domain",
                    format!("duplicate domain '{domain}' in config file"),
                ));
            }
            return load_descriptors(
                file,
                "descriptors",
                level,
                &format!("{domain}."),
                descriptors,
            );
        }
        let mut level = Level::default();
        load_descriptors(
            file,
            "descriptors",
            &mut level,
            &format!("{domain}."),
            descriptors,
        )?;
        self.domains.insert(domain, level);
        Ok(())
    }

    /// The limit a request descriptor resolves to, as envoyproxy/ratelimit resolves it: level by
    /// level, `key_value` first, then a wildcard of that level, then `key` alone; a limit applies
    /// only at the level of the descriptor's last entry. `None`: no limit (also for an unknown
    /// domain).
    pub fn get_limit(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Matched> {
        let root = self.domains.get(domain)?;
        let mut level = root;
        let mut detailed_key = domain.to_owned();
        let mut value_key = domain.to_owned();
        let mut patterns: Vec<Option<String>> = vec![None; entries.len()];
        let mut any_pattern = false;
        let mut found: Option<Arc<RateLimit>> = None;
        let mut found_patterns = false;

        for (i, (key, value)) in entries.iter().enumerate() {
            let key_value = format!("{key}_{value}");
            detailed_key.push('.');
            detailed_key.push_str(&key_value);

            let mut next = level.children.get(&key_value);
            let mut matched_wildcard: Option<&str> = None;
            if next.is_none() {
                for entry in &level.wildcards {
                    if wildcard_match(&entry.parts, &key_value) {
                        next = level.children.get(&entry.key);
                        matched_wildcard = Some(&entry.key);
                        break;
                    }
                }
            }
            let matched_using_value = next.is_some();
            if next.is_none() {
                next = level.children.get(*key);
            }

            let key_prefix = format!("{key}_");
            if let (Some(wild), Some(n)) = (matched_wildcard, next) {
                if n.share_threshold {
                    if let Some(pattern) = &n.wildcard_pattern {
                        let _ = wild;
                        patterns[i] = Some(
                            pattern
                                .strip_prefix(&key_prefix)
                                .unwrap_or(pattern)
                                .to_owned(),
                        );
                        any_pattern = true;
                    }
                }
            }

            value_key.push('.');
            match next {
                Some(n) => {
                    let value_to_use: &str = if let Some(wild) = matched_wildcard {
                        if let Some(pattern) = &patterns[i] {
                            pattern
                        } else if n.value_to_metric {
                            value
                        } else {
                            wild.strip_prefix(&key_prefix).unwrap_or(wild)
                        }
                    } else if matched_using_value || n.value_to_metric {
                        value
                    } else {
                        ""
                    };
                    value_key.push_str(key);
                    if !value_to_use.is_empty() {
                        value_key.push('_');
                        value_key.push_str(value_to_use);
                    }
                }
                None => value_key.push_str(key),
            }

            let Some(n) = next else { break };
            if let Some(limit) = &n.limit {
                if i == entries.len() - 1 {
                    found = Some(limit.clone());
                    found_patterns = any_pattern;
                }
            }
            if n.children.is_empty() {
                break;
            }
            level = n;
        }

        let limit = found?;
        let share_patterns = if found_patterns {
            patterns
        } else {
            vec![None; entries.len()]
        };
        let stats_key = if limit.detailed_metric {
            if found_patterns {
                let mut key = domain.to_owned();
                for (i, (k, v)) in entries.iter().enumerate() {
                    key.push('.');
                    key.push_str(k);
                    if let Some(pattern) = &share_patterns[i] {
                        key.push('_');
                        key.push_str(pattern);
                    } else if !v.is_empty() {
                        key.push('_');
                        key.push_str(v);
                    }
                }
                key
            } else {
                detailed_key
            }
        } else {
            value_key
        };
        Some(Matched {
            limit,
            stats_key,
            share_patterns,
        })
    }
}

/// The parser's message on one line: where and what (its source snippet left out, and its advice
/// on its own options).
fn yaml_message(e: &serde_saphyr::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("").trim();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    match first.find(", set DuplicateKeyPolicy") {
        Some(at) => first[..at].to_owned(),
        None => first.to_owned(),
    }
}

/// Whether `value` matches a pattern split on `*` (each `*` matches any run of characters,
/// including none), as envoyproxy/ratelimit matches: the first part is a prefix, the last a suffix,
/// the middle ones found in order between them.
pub fn wildcard_match(parts: &[String], value: &str) -> bool {
    if parts.len() == 1 {
        return parts[0] == value;
    }
    let first = &parts[0];
    let last = &parts[parts.len() - 1];
    if !value.starts_with(first.as_str()) || !value.ends_with(last.as_str()) {
        return false;
    }
    let fixed: usize = parts.iter().map(String::len).sum();
    if value.len() < fixed {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

fn validate_keys(file: &str, path: &str, entries: &[(Tree, Tree)]) -> Result<(), ConfigError> {
    for (key, value) in entries {
        let Tree::Str(name) = key else {
            return Err(err(
                file,
                path,
                format!("config error, key is not of type string: {key}"),
            ));
        };
        let here = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        if !VALID_KEYS.contains(&name.as_str()) {
            return Err(err(
                file,
                &here,
                format!("config error, unknown key '{name}'"),
            ));
        }
        if name == "metadata" || name == EXTENSION_KEY {
            // metadata is free-form; ours is checked by its typed form (unknown fields refused).
            if name == EXTENSION_KEY && !path.ends_with("rate_limit") {
                return Err(err(
                    file,
                    &here,
                    format!("config error, '{EXTENSION_KEY}' belongs inside a rate_limit block"),
                ));
            }
            continue;
        }
        match value {
            Tree::Seq(items) => {
                for (i, item) in items.iter().enumerate() {
                    let Tree::Map(inner) = item else {
                        return Err(err(
                            file,
                            &format!("{here}[{i}]"),
                            format!(
                                "config error, yaml file contains list of type other than map: {item}"
                            ),
                        ));
                    };
                    validate_keys(file, &format!("{here}[{i}]"), inner)?;
                }
            }
            Tree::Map(inner) => validate_keys(file, &here, inner)?,
            Tree::Str(_) | Tree::Int(_) | Tree::Bool(_) | Tree::Null => {}
            Tree::Float(_) => {
                return Err(err(file, &here, "error checking config"));
            }
        }
    }
    Ok(())
}

fn load_descriptors(
    file: &str,
    path: &str,
    level: &mut Level,
    parent_key: &str,
    descriptors: Vec<YamlDescriptor>,
) -> Result<(), ConfigError> {
    for (i, d) in descriptors.into_iter().enumerate() {
        let here = format!("{path}[{i}]");
        let key = d.key.unwrap_or_default();
        if key.is_empty() {
            return Err(err(
                file,
                &format!("{here}.key"),
                "descriptor has empty key",
            ));
        }
        let value = d.value.unwrap_or_default();
        let final_key = if value.is_empty() {
            key.clone()
        } else {
            format!("{key}_{value}")
        };
        let full_key = format!("{parent_key}{final_key}");
        if level.children.contains_key(&final_key) {
            return Err(err(
                file,
                &here,
                format!("duplicate descriptor composite key '{full_key}'"),
            ));
        }
        let shadow_mode = d.shadow_mode.unwrap_or(false);
        let quota_mode = d.quota_mode.unwrap_or(false);
        let detailed_metric = d.detailed_metric.unwrap_or(false);
        let limit = match d.rate_limit {
            Some(rl) => Some(Arc::new(load_rate_limit(
                file,
                &format!("{here}.rate_limit"),
                rl,
                full_key.clone(),
                shadow_mode,
                quota_mode,
                detailed_metric,
            )?)),
            None => None,
        };
        let share_threshold = d.share_threshold.unwrap_or(false);
        let has_wildcard = final_key.contains('*');
        if share_threshold && !has_wildcard {
            return Err(err(
                file,
                &format!("{here}.share_threshold"),
                format!(
                    "share_threshold can only be used with wildcard values (containing '*'), but found key '{final_key}'"
                ),
            ));
        }
        if has_wildcard {
            level.wildcards.push(WildcardEntry {
                key: final_key.clone(),
                parts: final_key.split('*').map(str::to_owned).collect(),
            });
        }
        let mut child = Level {
            limit,
            value_to_metric: d.value_to_metric.unwrap_or(false),
            share_threshold,
            wildcard_pattern: (share_threshold && has_wildcard).then(|| final_key.clone()),
            ..Level::default()
        };
        load_descriptors(
            file,
            &format!("{here}.descriptors"),
            &mut child,
            &format!("{full_key}."),
            d.descriptors.unwrap_or_default(),
        )?;
        level.children.insert(final_key, child);
    }
    Ok(())
}

fn load_rate_limit(
    file: &str,
    path: &str,
    rl: YamlRateLimit,
    full_key: String,
    shadow_mode: bool,
    quota_mode: bool,
    detailed_metric: bool,
) -> Result<RateLimit, ConfigError> {
    let unlimited = rl.unlimited.unwrap_or(false);
    let unit_text = rl.unit.unwrap_or_default();
    let unit = Unit::parse(&unit_text);
    if unlimited {
        if unit.is_some() {
            return Err(err(
                file,
                &format!("{path}.unit"),
                "should not specify rate limit unit when unlimited",
            ));
        }
    } else if unit.is_none() {
        return Err(err(
            file,
            &format!("{path}.unit"),
            format!("invalid rate limit unit '{unit_text}'"),
        ));
    }
    let name = rl.name.unwrap_or_default();
    let mut replaces = Vec::new();
    for (i, r) in rl.replaces.unwrap_or_default().into_iter().enumerate() {
        let replaced = r.name.unwrap_or_default();
        let field = format!("{path}.replaces[{i}].name");
        if replaced.is_empty() {
            return Err(err(file, &field, "should not have an empty replaces entry"));
        }
        if replaced == name {
            return Err(err(
                file,
                &field,
                "replaces should not contain name of same descriptor",
            ));
        }
        replaces.push(replaced);
    }
    let requests_per_unit = rl.requests_per_unit.unwrap_or(0);
    let spec = match unit {
        None => {
            if rl.redis_ratelimit.is_some() {
                return Err(err(
                    file,
                    &format!("{path}.{EXTENSION_KEY}"),
                    "has no meaning on an unlimited rate limit",
                ));
            }
            None
        }
        Some(unit) => Some(load_extension(
            file,
            &format!("{path}.{EXTENSION_KEY}"),
            rl.redis_ratelimit.unwrap_or_default(),
            requests_per_unit,
            unit,
        )?),
    };
    Ok(RateLimit {
        full_key,
        requests_per_unit,
        unit,
        unlimited,
        shadow_mode,
        quota_mode,
        name,
        replaces,
        detailed_metric,
        spec,
    })
}

fn load_extension(
    file: &str,
    path: &str,
    ext: YamlExtension,
    requests_per_unit: u32,
    unit: Unit,
) -> Result<Spec, ConfigError> {
    if let Some(policy) = ext.policy {
        if ext.algorithm.is_some() || ext.burst.is_some() || ext.block.is_some() {
            return Err(err(
                file,
                &format!("{path}.policy"),
                "a policy defines the algorithm, burst and block: give either policy or those",
            ));
        }
        if policy.is_empty() || policy.chars().any(char::is_whitespace) {
            return Err(err(
                file,
                &format!("{path}.policy"),
                format!("policy must be a name without spaces, got '{policy}'"),
            ));
        }
        return Ok(Spec::Policy(policy));
    }
    let algorithm = match &ext.algorithm {
        None => Algorithm::FixedWindow,
        Some(text) => Algorithm::parse(text).ok_or_else(|| {
            err(
                file,
                &format!("{path}.algorithm"),
                format!(
                    "unknown algorithm '{text}': use token-bucket, leaky-bucket, fixed-window, sliding-window, sliding-log or gcra"
                ),
            )
        })?,
    };
    if let Some(burst) = ext.burst {
        if !algorithm.takes_burst() {
            return Err(err(
                file,
                &format!("{path}.burst"),
                format!(
                    "burst applies to token-bucket, leaky-bucket and gcra, not {}",
                    algorithm.name()
                ),
            ));
        }
        if !(1..=MAX_AMOUNT).contains(&burst) {
            return Err(err(
                file,
                &format!("{path}.burst"),
                format!("burst must be an integer from 1 to {MAX_AMOUNT}, got {burst}"),
            ));
        }
    }
    if algorithm == Algorithm::SlidingLog && u64::from(requests_per_unit) > MAX_LOG_LIMIT {
        return Err(err(
            file,
            &format!("{path}.algorithm"),
            format!(
                "a sliding-log keeps one entry per request: requests_per_unit must be at most {MAX_LOG_LIMIT} (the module's ratelimit.max-log-limit default), got {requests_per_unit}"
            ),
        ));
    }
    let block_ms = match &ext.block {
        None => None,
        Some(text) => Some(parse_duration_ms(text).ok_or_else(|| {
            err(
                file,
                &format!("{path}.block"),
                format!(
                    "block must be a duration from 1ms to 3650d: an integer of ms or with a unit ms, s, m, h or d (250ms, 15m), got '{text}'"
                ),
            )
        })?),
    };
    Ok(Spec::Inline {
        algorithm,
        limit: u64::from(requests_per_unit),
        period_ms: unit.period_ms(),
        burst: ext.burst,
        block_ms,
    })
}

/// A duration in the module's syntax: digits, then optionally `ms`, `s`, `m`, `h` or `d`
/// (case-insensitive); 1 ms to 3650 days.
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    if digits_end == 0 {
        return None;
    }
    let number: u64 = text[..digits_end].parse().ok()?;
    let factor = match text[digits_end..].to_ascii_lowercase().as_str() {
        "" | "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    let ms = number.checked_mul(factor)?;
    (1..=MAX_PERIOD_MS).contains(&ms).then_some(ms)
}

/// The files a directory holds, as [`Config::load`] takes them.
pub fn read_dir_sources(dir: &Path, ignore_dot_files: bool) -> Result<Vec<Source>, ConfigError> {
    let mut paths = Vec::new();
    collect_yaml(dir, ignore_dot_files, &mut paths).map_err(|e| {
        err(
            &dir.display().to_string(),
            "",
            format!("cannot read the configuration directory: {e}"),
        )
    })?;
    paths.sort();
    let mut sources = Vec::with_capacity(paths.len());
    for path in paths {
        let name = path
            .strip_prefix(dir)
            .unwrap_or(&path)
            .display()
            .to_string();
        let text = std::fs::read_to_string(&path)
            .map_err(|e| err(&name, "", format!("cannot read the file: {e}")))?;
        sources.push(Source { name, text });
    }
    Ok(sources)
}

fn collect_yaml(dir: &Path, ignore_dot: bool, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if ignore_dot && name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        // Follows symbolic links (a Kubernetes ConfigMap's files are links into `..data`).
        let meta = std::fs::metadata(&path)?;
        if meta.is_dir() {
            if !name.starts_with("..") {
                collect_yaml(&path, ignore_dot, out)?;
            }
        } else if name.ends_with(".yaml") || name.ends_with(".yml") {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
