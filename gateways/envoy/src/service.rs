//! `ShouldRateLimit`: a request's descriptors matched against the configuration as
//! envoyproxy/ratelimit matches them, decided by the module in one pipeline, answered with
//! envoyproxy/ratelimit's statuses, stats and headers.
//!
//! What differs on purpose (gateways/envoy/README.md, "Differences"): by default the descriptors
//! a request enforces are decided together by one `RATELIMIT.CHECKALL`, so a refused request
//! consumes nothing from any of its limits; `RLS_DECISION=independent` counts each descriptor on
//! its own (one `RATELIMIT.CHECK` each), as envoyproxy/ratelimit's `INCRBY`s do. Shadow-mode
//! limits are always counted on their own: the request passes them whatever they say.

use std::sync::{Arc, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;

use crate::backend::{Backend, BackendError, Call, Decision};
use crate::config::{Algorithm, Config, Matched, RateLimit, Spec, Unit, MAX_AMOUNT};
use crate::stats::{LimitStats, Stats};

/// How the descriptors of one request are decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionMode {
    /// One `RATELIMIT.CHECKALL` for the request's enforced limits: all or nothing.
    Atomic,
    /// One `RATELIMIT.CHECK` per descriptor, each counted whatever the others decide
    /// (envoyproxy/ratelimit's behaviour).
    Independent,
}

/// Which rate-limit headers the response asks Envoy to add.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Headers {
    None,
    /// envoyproxy/ratelimit's three headers (`LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`,
    /// `LIMIT_RESET_HEADER`; default `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`).
    Legacy {
        limit: String,
        remaining: String,
        reset: String,
    },
    /// The IETF httpapi draft's structured fields `RateLimit-Policy` and `RateLimit`.
    Ietf,
}

/// What a Redis failure answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    /// gRPC `UNAVAILABLE`: Envoy's `failure_mode_deny` decides.
    Unavailable,
    /// `OK` for every descriptor: the request passes.
    Allow,
}

#[derive(Debug, Clone)]
pub struct Options {
    pub mode: DecisionMode,
    /// Cluster: prefix every key of a domain with the hash tag `{domain}`, so that one CHECKALL
    /// can hold all of a request's keys (and a domain lives on one node).
    pub domain_hash_tag: bool,
    pub key_prefix: String,
    pub near_limit_ratio: f64,
    pub global_shadow_mode: bool,
    pub global_quota_mode: bool,
    pub headers: Headers,
    pub failure_mode: FailureMode,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: DecisionMode::Atomic,
            domain_hash_tag: false,
            key_prefix: String::new(),
            near_limit_ratio: 0.8,
            global_shadow_mode: false,
            global_quota_mode: false,
            headers: Headers::None,
            failure_mode: FailureMode::Unavailable,
        }
    }
}

/// Why a call got no response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceError {
    /// The request itself is wrong (empty domain, no descriptors, a bad limit override).
    InvalidRequest(String),
    /// Redis did not decide (and the failure mode is `Unavailable`).
    Redis(BackendError),
}

/// The service: the running configuration (swapped whole on a reload), the backend, the stats.
pub struct RateLimiter {
    config: RwLock<Arc<Config>>,
    backend: Arc<dyn Backend>,
    pub stats: Arc<Stats>,
    pub options: Options,
}

/// What the descriptors of one CHECKALL share: the cost, and in a cluster the slot.
type GroupKey = (u64, Option<u16>);

/// One descriptor's resolved limit.
struct Resolved {
    limit: Arc<RateLimit>,
    stats: Arc<LimitStats>,
    share_patterns: Vec<Option<String>>,
}

enum Outcome {
    /// No limit applies (no match, an unknown domain, replaced).
    NoLimit,
    Unlimited,
    /// Decided here without Redis (`requests_per_unit: 0` refuses any cost above 0).
    Local {
        allowed: bool,
    },
    /// Decided by Redis: the call and the decision's index in its reply.
    Remote {
        call: usize,
        at: usize,
    },
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn pb_duration_ms(ms: u64) -> PbDuration {
    PbDuration {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

impl RateLimiter {
    pub fn new(
        config: Config,
        backend: Arc<dyn Backend>,
        stats: Arc<Stats>,
        options: Options,
    ) -> RateLimiter {
        RateLimiter {
            config: RwLock::new(Arc::new(config)),
            backend,
            stats,
            options,
        }
    }

    pub fn config(&self) -> Arc<Config> {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn set_config(&self, config: Config) {
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The Redis key of a descriptor's counter: envoyproxy/ratelimit's cache key without its
    /// window (the module keeps the window), then the algorithm and period.
    fn counter_key(
        &self,
        domain: &str,
        d: &RateLimitDescriptor,
        r: &Resolved,
        spec: &Spec,
    ) -> String {
        let mut key = String::with_capacity(64);
        key.push_str(&self.options.key_prefix);
        if self.options.domain_hash_tag {
            key.push('{');
            key.push_str(domain);
            key.push('}');
        } else {
            key.push_str(domain);
        }
        key.push('_');
        for (i, entry) in d.entries.iter().enumerate() {
            key.push_str(&entry.key);
            key.push('_');
            match r.share_patterns.get(i).and_then(|p| p.as_deref()) {
                Some(pattern) => key.push_str(pattern),
                None => key.push_str(&entry.value),
            }
            key.push('_');
        }
        key.push_str(&spec.key_suffix());
        key
    }

    fn resolve(
        &self,
        config: &Config,
        domain: &str,
        d: &RateLimitDescriptor,
    ) -> Result<Option<Resolved>, ServiceError> {
        if !config.domains().any(|known| known == domain) {
            return Ok(None);
        }
        if let Some(o) = &d.limit {
            // A limit override from Envoy's configuration: a fixed window, never shadowed.
            let unit = Unit::from_proto(o.unit).ok_or_else(|| {
                ServiceError::InvalidRequest(format!(
                    "descriptor limit override has an unknown unit ({})",
                    o.unit
                ))
            })?;
            let mut stats_key = domain.to_owned();
            for e in &d.entries {
                stats_key.push('.');
                stats_key.push_str(&e.key);
                if !e.value.is_empty() {
                    stats_key.push('_');
                    stats_key.push_str(&e.value);
                }
            }
            let limit = RateLimit {
                full_key: stats_key.clone(),
                requests_per_unit: o.requests_per_unit,
                unit: Some(unit),
                unlimited: false,
                shadow_mode: false,
                quota_mode: false,
                name: String::new(),
                replaces: Vec::new(),
                detailed_metric: false,
                spec: Some(Spec::Inline {
                    algorithm: Algorithm::FixedWindow,
                    limit: u64::from(o.requests_per_unit),
                    period_ms: unit.period_ms(),
                    burst: None,
                    block_ms: None,
                }),
            };
            return Ok(Some(Resolved {
                stats: self.stats.limit(domain, &stats_key),
                limit: Arc::new(limit),
                share_patterns: vec![None; d.entries.len()],
            }));
        }
        let entries: Vec<(&str, &str)> = d
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        Ok(config
            .get_limit(domain, &entries)
            .map(|m: Matched| Resolved {
                stats: self.stats.limit(domain, &m.stats_key),
                limit: m.limit,
                share_patterns: m.share_patterns,
            }))
    }

    /// Decides one request.
    pub async fn should_rate_limit(
        &self,
        req: &RateLimitRequest,
    ) -> Result<RateLimitResponse, ServiceError> {
        let started = Instant::now();
        self.stats
            .total_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let result = self.decide(req).await;
        self.stats.response_time.observe(started.elapsed());
        match &result {
            Err(ServiceError::InvalidRequest(_)) => {
                self.stats
                    .service_errors
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Err(ServiceError::Redis(_)) => {
                self.stats
                    .redis_errors
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(_) => {}
        }
        result
    }

    async fn decide(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, ServiceError> {
        if req.domain.is_empty() {
            return Err(ServiceError::InvalidRequest(
                "rate limit domain must not be empty".into(),
            ));
        }
        if req.descriptors.is_empty() {
            return Err(ServiceError::InvalidRequest(
                "rate limit descriptor list must not be empty".into(),
            ));
        }
        let config = self.config();
        let n = req.descriptors.len();

        // Resolve, then drop what `replaces` names.
        let mut resolved: Vec<Option<Resolved>> = Vec::with_capacity(n);
        let mut replacing: Vec<&str> = Vec::new();
        for d in &req.descriptors {
            resolved.push(self.resolve(&config, &req.domain, d)?);
        }
        for r in resolved.iter().flatten() {
            replacing.extend(r.limit.replaces.iter().map(String::as_str));
        }
        let replacing: Vec<String> = replacing.into_iter().map(str::to_owned).collect();
        let mut outcomes: Vec<Outcome> = Vec::with_capacity(n);
        for r in resolved.iter_mut() {
            if let Some(x) = r {
                if x.limit.unlimited {
                    outcomes.push(Outcome::Unlimited);
                    *r = None;
                    continue;
                }
                if !x.limit.name.is_empty() && replacing.contains(&x.limit.name) {
                    outcomes.push(Outcome::NoLimit);
                    *r = None;
                    continue;
                }
            }
            outcomes.push(Outcome::NoLimit);
        }

        // Costs: the descriptor's hits_addend if set (0 allowed: a look that consumes nothing),
        // else the request's, at least 1.
        let costs: Vec<u64> = req
            .descriptors
            .iter()
            .map(|d| match &d.hits_addend {
                Some(v) => v.value,
                None => u64::from(req.hits_addend.max(1)),
            })
            .collect();
        for (i, r) in resolved.iter().enumerate() {
            if r.is_some() && costs[i] > MAX_AMOUNT {
                return Err(ServiceError::InvalidRequest(format!(
                    "descriptor {i}: hits_addend {} is above {MAX_AMOUNT}",
                    costs[i]
                )));
            }
        }

        // The plan: which descriptors go to Redis, in which calls.
        let mut calls: Vec<Call> = Vec::new();
        let mut keys: Vec<Option<String>> = vec![None; n];
        // Atomic groups by (cost, slot): descriptor indices.
        let mut groups: Vec<(GroupKey, Vec<usize>)> = Vec::new();
        for i in 0..n {
            let Some(r) = &resolved[i] else { continue };
            LimitStats::add(&r.stats.total_hits, costs[i]);
            let Some(spec) = &r.limit.spec else { continue };
            if let Spec::Inline { limit: 0, .. } = spec {
                outcomes[i] = Outcome::Local {
                    allowed: costs[i] == 0,
                };
                continue;
            }
            let key = self.counter_key(&req.domain, &req.descriptors[i], r, spec);
            let shadow = r.limit.shadow_mode || self.options.global_shadow_mode;
            if shadow || self.options.mode == DecisionMode::Independent {
                outcomes[i] = Outcome::Remote {
                    call: calls.len(),
                    at: 0,
                };
                calls.push(Call::Check {
                    key: key.clone(),
                    spec: spec.clone(),
                    cost: costs[i],
                });
            } else {
                let group = (costs[i], self.backend.slot_of(&key));
                match groups.iter_mut().find(|(g, _)| *g == group) {
                    Some((_, members)) => members.push(i),
                    None => groups.push((group, vec![i])),
                }
            }
            keys[i] = Some(key);
        }
        for ((cost, _), members) in &groups {
            let call = calls.len();
            if members.len() == 1 {
                let i = members[0];
                outcomes[i] = Outcome::Remote { call, at: 0 };
                calls.push(Call::Check {
                    key: keys[i].clone().unwrap_or_default(),
                    spec: spec_of(&resolved[i]),
                    cost: *cost,
                });
            } else {
                for (j, &i) in members.iter().enumerate() {
                    outcomes[i] = Outcome::Remote { call, at: j + 1 };
                }
                calls.push(Call::CheckAll {
                    keys: members
                        .iter()
                        .map(|&i| keys[i].clone().unwrap_or_default())
                        .collect(),
                    specs: members.iter().map(|&i| spec_of(&resolved[i])).collect(),
                    cost: *cost,
                });
            }
        }

        let replies = if calls.is_empty() {
            Vec::new()
        } else {
            let started = Instant::now();
            self.stats
                .redis_calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let result = self.backend.execute(&calls).await;
            self.stats.redis_time.observe(started.elapsed());
            match result {
                Ok(replies) => replies,
                Err(e) => {
                    if self.options.failure_mode == FailureMode::Allow
                        && !matches!(e, BackendError::Command(_))
                    {
                        self.stats
                            .failed_open
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        return Ok(self.fail_open(&resolved));
                    }
                    return Err(ServiceError::Redis(e));
                }
            }
        };

        Ok(self.respond(req, &resolved, &outcomes, &costs, &calls, &replies))
    }

    fn fail_open(&self, resolved: &[Option<Resolved>]) -> RateLimitResponse {
        RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: resolved
                .iter()
                .map(|r| DescriptorStatus {
                    code: Code::Ok as i32,
                    current_limit: r.as_ref().map(|r| current_limit(&r.limit)),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn respond(
        &self,
        req: &RateLimitRequest,
        resolved: &[Option<Resolved>],
        outcomes: &[Outcome],
        costs: &[u64],
        calls: &[Call],
        replies: &[Vec<Decision>],
    ) -> RateLimitResponse {
        let now = now_ms();
        let ratio = self.options.near_limit_ratio;
        let mut statuses = Vec::with_capacity(outcomes.len());
        let mut failed_limit = 0usize;
        let mut failed_quota = 0usize;
        let mut total_quota = 0usize;
        // The status the headers describe: the nearest to its limit, or the last one over it.
        let mut header_status: Option<(usize, u32)> = None;

        for (i, outcome) in outcomes.iter().enumerate() {
            let cost = costs[i];
            let status = match (outcome, &resolved[i]) {
                (Outcome::Unlimited, _) => DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                },
                (Outcome::NoLimit, _) | (_, None) => DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                },
                (Outcome::Local { allowed }, Some(r)) => {
                    let d = Decision {
                        allowed: *allowed,
                        ..Default::default()
                    };
                    self.status_of(r, &d, cost, now, ratio, false)
                }
                (Outcome::Remote { call, at }, Some(r)) => {
                    let d = replies[*call][*at];
                    // In a refused CHECKALL nothing was consumed: a limit that admits shows what
                    // it still has, not what it would have had.
                    let overall_refused =
                        matches!(calls[*call], Call::CheckAll { .. }) && !replies[*call][0].allowed;
                    self.status_of(r, &d, cost, now, ratio, overall_refused)
                }
            };
            if let Some(r) = &resolved[i] {
                let quota = self.options.global_quota_mode || r.limit.quota_mode;
                if status.current_limit.is_some()
                    && header_status.is_none_or(|(_, min)| status.limit_remaining < min)
                {
                    header_status = Some((i, status.limit_remaining));
                }
                if status.code == Code::OverLimit as i32 {
                    if quota {
                        failed_quota += 1;
                    } else {
                        failed_limit += 1;
                        header_status = Some((i, 0));
                    }
                }
                if quota {
                    total_quota += 1;
                }
            }
            statuses.push(status);
        }

        let mut overall = if failed_limit > 0 || (total_quota > 0 && total_quota == failed_quota) {
            Code::OverLimit
        } else {
            Code::Ok
        };
        let mut response_headers_to_add = Vec::new();
        if let Some((i, _)) = header_status {
            if let Some(r) = &resolved[i] {
                response_headers_to_add = self.headers(&statuses[i], r);
            }
        }
        if overall == Code::OverLimit && self.options.global_shadow_mode {
            overall = Code::Ok;
            self.stats
                .global_shadow_mode
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let _ = req;
        RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            response_headers_to_add,
            ..Default::default()
        }
    }

    /// A limited descriptor's status and its stats, envoyproxy/ratelimit's way: hits within the
    /// limit, near it (above `NEAR_LIMIT_RATIO` of it), over it, and over it in shadow mode.
    fn status_of(
        &self,
        r: &Resolved,
        d: &Decision,
        cost: u64,
        now: u64,
        ratio: f64,
        overall_refused: bool,
    ) -> DescriptorStatus {
        let cap = d.limit.max(0) as u64;
        let mut remaining = d.remaining.max(0) as u64;
        if overall_refused && d.allowed {
            remaining = (remaining + cost).min(cap);
        }
        let (before, after) = if d.allowed {
            let after = if overall_refused {
                cap.saturating_sub(remaining) + cost
            } else {
                cap.saturating_sub(remaining)
            };
            (after.saturating_sub(cost), after)
        } else {
            let before = cap.saturating_sub(remaining);
            (before, before + cost)
        };
        let threshold = cap;
        let near = (threshold as f64 * ratio).floor() as u64;
        let s = &r.stats;
        let over = !d.allowed;
        if over && d.from_cache {
            LimitStats::add(&s.over_limit_with_local_cache, cost);
        }
        if over {
            if before >= threshold {
                LimitStats::add(&s.over_limit, cost);
            } else {
                LimitStats::add(&s.over_limit, after - threshold);
                LimitStats::add(&s.near_limit, threshold - near.max(before));
            }
        } else {
            LimitStats::add(&s.within_limit, cost);
            if after > near {
                LimitStats::add(
                    &s.near_limit,
                    if before >= near { cost } else { after - near },
                );
            }
        }
        let mut code = if over { Code::OverLimit } else { Code::Ok };
        if over && r.limit.shadow_mode {
            code = Code::Ok;
            LimitStats::add(
                &s.shadow_mode,
                if before >= threshold {
                    cost
                } else {
                    after - threshold
                },
            );
        }
        let unit = r.limit.unit.unwrap_or(Unit::Second);
        let reset_ms = match r.limit.spec {
            Some(Spec::Inline {
                algorithm: Algorithm::FixedWindow,
                ..
            }) => {
                // As envoyproxy/ratelimit: whole seconds to the end of the epoch-aligned window.
                let unit_s = unit.seconds();
                (unit_s - (now / 1000) % unit_s) * 1000
            }
            _ => {
                if over && d.retry_after_ms > 0 {
                    d.retry_after_ms as u64
                } else {
                    d.reset_after_ms.max(0) as u64
                }
            }
        };
        DescriptorStatus {
            code: code as i32,
            current_limit: Some(current_limit(&r.limit)),
            limit_remaining: if over {
                0
            } else {
                remaining.min(u64::from(u32::MAX)) as u32
            },
            duration_until_reset: Some(pb_duration_ms(reset_ms)),
            ..Default::default()
        }
    }

    fn headers(&self, status: &DescriptorStatus, r: &Resolved) -> Vec<HeaderValue> {
        let limit = r.limit.requests_per_unit;
        let remaining = status.limit_remaining;
        let reset_s = status
            .duration_until_reset
            .as_ref()
            .map(|d| d.seconds + i64::from(d.nanos > 0))
            .unwrap_or(0);
        let header = |key: &str, value: String| HeaderValue {
            key: key.to_owned(),
            value,
            ..Default::default()
        };
        match &self.options.headers {
            Headers::None => Vec::new(),
            Headers::Legacy {
                limit: l,
                remaining: rem,
                reset: res,
            } => vec![
                header(l, limit.to_string()),
                header(rem, remaining.to_string()),
                header(res, reset_s.to_string()),
            ],
            Headers::Ietf => {
                let name = if r.limit.name.is_empty() {
                    &r.limit.full_key
                } else {
                    &r.limit.name
                };
                let name = sf_string(name);
                let window = r.limit.unit.map(Unit::seconds).unwrap_or(1);
                vec![
                    header("RateLimit-Policy", format!("{name};q={limit};w={window}")),
                    header("RateLimit", format!("{name};r={remaining};t={reset_s}")),
                ]
            }
        }
    }
}

fn spec_of(r: &Option<Resolved>) -> Spec {
    r.as_ref()
        .and_then(|r| r.limit.spec.clone())
        .unwrap_or(Spec::Policy(String::new()))
}

fn current_limit(limit: &RateLimit) -> PbRateLimit {
    PbRateLimit {
        name: limit.name.clone(),
        requests_per_unit: limit.requests_per_unit,
        unit: limit.unit.map(Unit::proto).unwrap_or(0),
    }
}

/// An RFC 8941 string: quoted, with `"` and `\` escaped (other characters outside printable
/// ASCII replaced, since a structured-field string cannot hold them).
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
    out
}
