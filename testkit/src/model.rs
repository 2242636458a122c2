//! The model the server is held to: stored keys driven through the crate's pure cores
//! (`redis_ratelimit_core::algorithms`, whose arithmetic other tests hold to docs/algorithms.md's
//! worked examples and to the Lua references), and CHECKALL's all-or-nothing rules from
//! docs/algorithms.md ("CHECKALL"), re-implemented here independently of the module's own.

use std::collections::HashMap;

use redis_ratelimit_core::algorithms::{
    self, Algorithm, Decision, Limiter, Outcome, Params, Request,
};

/// One limit as given on the command line, the period in ms.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub algorithm: Algorithm,
    pub limit: u64,
    pub period_ms: u64,
    /// `BURST`, for the buckets; `None` leaves it out.
    pub burst: Option<u64>,
}

impl Spec {
    /// A limit without `BURST`.
    pub const fn new(algorithm: Algorithm, limit: u64, period_ms: u64) -> Spec {
        Spec {
            algorithm,
            limit,
            period_ms,
            burst: None,
        }
    }

    pub fn params(&self) -> Params {
        Params::new(self.limit, self.period_ms, self.burst).expect("valid spec")
    }

    /// `algorithm limit period [BURST n]`, as CHECK and CHECKALL take them.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            self.algorithm.name().to_string(),
            self.limit.to_string(),
            self.period_ms.to_string(),
        ];
        if let Some(burst) = self.burst {
            args.extend(["BURST".to_string(), burst.to_string()]);
        }
        args
    }

    pub fn request(&self, cost: u64, at_ms: u64) -> Request {
        Request {
            algorithm: self.algorithm,
            params: self.params(),
            cost,
            now_ms: at_ms,
        }
    }
}

/// The stored keys, as the server should hold them.
#[derive(Clone, Default)]
pub struct Model {
    keys: HashMap<String, Option<Limiter>>,
}

impl Model {
    /// A CHECK of `key`: the core's outcome; what it creates is stored.
    pub fn outcome(&mut self, key: &str, request: &Request) -> Outcome {
        let stored = self.keys.entry(key.to_string()).or_default();
        let mut created = None;
        let (outcome, _) = algorithms::check(stored.as_mut(), request, true, &mut created)
            .expect("same algorithm");
        if let Some(limiter) = created {
            *stored = Some(limiter);
        }
        outcome
    }

    /// A CHECK of `key`: its decision.
    pub fn check(&mut self, key: &str, request: &Request) -> Decision {
        self.outcome(key, request).decision
    }

    /// CHECKALL: the limits decided in order on a copy of the keys, each seeing what the
    /// admitted ones before it consumed (a key named twice counts twice, as two CHECKs in a row
    /// would); the copy is kept only if every limit admits. Returns the per-limit decisions.
    pub fn checkall<K: AsRef<str>>(&mut self, keys: &[K], requests: &[Request]) -> Vec<Decision> {
        let mut trial = self.clone();
        let decisions: Vec<Decision> = keys
            .iter()
            .zip(requests)
            .map(|(key, request)| trial.check(key.as_ref(), request))
            .collect();
        if decisions.iter().all(|decision| decision.allowed) {
            *self = trial;
        }
        decisions
    }

    /// What `key` holds now.
    pub fn limiter(&self, key: &str) -> Option<&Limiter> {
        self.keys.get(key).and_then(Option::as_ref)
    }

    /// Drop `key`, as its expiry does.
    pub fn forget(&mut self, key: &str) {
        self.keys.remove(key);
    }
}

/// CHECKALL's overall decision from the per-limit ones (docs/algorithms.md, "CHECKALL"), as the
/// six integers of the reply.
pub fn overall(decisions: &[[i64; 6]]) -> [i64; 6] {
    let allowed = decisions.iter().all(|d| d[0] == 1);
    let least = decisions.iter().map(|d| d[2]).min().expect("a key");
    let first_least = decisions.iter().find(|d| d[2] == least).expect("a key");
    let retry = if decisions.iter().any(|d| d[3] == -1) {
        -1
    } else {
        decisions.iter().map(|d| d[3]).max().expect("a key")
    };
    [
        i64::from(allowed),
        first_least[1],
        least,
        retry,
        decisions.iter().map(|d| d[4]).max().expect("a key"),
        decisions.iter().map(|d| d[5]).max().expect("a key"),
    ]
}

/// CHECKALL's whole RESP2 reply: the overall decision, then each limit's.
pub fn checkall_reply(decisions: &[Decision]) -> Vec<Vec<i64>> {
    let per_limit: Vec<[i64; 6]> = decisions.iter().map(Decision::to_array).collect();
    std::iter::once(overall(&per_limit).to_vec())
        .chain(per_limit.iter().map(|d| d.to_vec()))
        .collect()
}
