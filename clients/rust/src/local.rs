//! The in-process limiter of `OnError::Local`: a state per key, decided by the core crate's own
//! algorithms (`redis_ratelimit_core::algorithms`, the code the module runs), so the same calls
//! at the same times (`now_ms`, the module's `AT`) give the same six fields as the module,
//! `BLOCK`, `REFUND` and `TAKE` included (TAKE through the core's `largest_grant` and
//! `last_unit_delay_ms`, as the module's command). This file is glue: it keeps the states and
//! treats a state past its expiry (on the wall clock, as Redis expires keys) as absent; it
//! computes no rate itself.

use std::collections::HashMap;

use redis_ratelimit_core::algorithms::{
    self, block, largest_grant, last_unit_delay_ms, Limiter, Params, Refunded, Request, Write,
};
use redis_ratelimit_core::error::algorithm_mismatch;

use crate::types::{Error, Limit};

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The six fields of a reply, as the core answers them.
pub type Fields = algorithms::Decision;

/// Keys' states in process, at most `max_keys` of them (past that, the expired ones go first,
/// then the least recently used).
#[derive(Debug)]
pub struct LocalLimiter {
    max_keys: usize,
    keys: HashMap<String, (Limiter, u64)>,
    touched: u64,
}

impl Default for LocalLimiter {
    fn default() -> Self {
        LocalLimiter::new(10_000)
    }
}

fn params(limit: &Limit) -> Params {
    // A Limit was checked when it was made: its parameters are within the core's bounds.
    Params::new(limit.limit(), limit.period_ms(), limit.burst_value()).unwrap_or(Params {
        limit: limit.limit(),
        period_ms: limit.period_ms(),
        capacity: limit.capacity(),
    })
}

fn request(limit: &Limit, cost: u64, now_ms: u64) -> Request {
    Request {
        algorithm: limit.algorithm(),
        params: params(limit),
        cost,
        now_ms,
    }
}

fn mismatch(stored: algorithms::Kind, limit: &Limit) -> Error {
    Error::Server(format!(
        "{} (in process)",
        algorithm_mismatch(stored.name(), limit.algorithm().name())
    ))
}

impl LocalLimiter {
    pub fn new(max_keys: usize) -> LocalLimiter {
        LocalLimiter {
            max_keys: max_keys.max(1),
            keys: HashMap::new(),
            touched: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key's limiter, `None` where the module's key would not exist (never written, or
    /// expired: Redis expires keys on its own clock, whatever a call's `AT`, so this compares
    /// the expiry with the wall clock, not with `now_ms`).
    fn stored(&mut self, key: &str, _now_ms: u64) -> Option<Limiter> {
        let (limiter, _) = self.keys.get(key)?;
        if limiter.expires_at_ms() <= wall_ms() {
            self.keys.remove(key);
            return None;
        }
        Some(limiter.clone())
    }

    fn store(&mut self, key: &str, limiter: Option<Limiter>) {
        match limiter {
            None => {
                self.keys.remove(key);
            }
            Some(limiter) => {
                self.touched += 1;
                self.keys.insert(key.to_string(), (limiter, self.touched));
                if self.keys.len() > self.max_keys {
                    self.evict();
                }
            }
        }
    }

    fn evict(&mut self) {
        // The tenth least recently used go (one scan per tenth of the keys added).
        let mut ages: Vec<u64> = self.keys.values().map(|(_, t)| *t).collect();
        let cut = self.keys.len() / 10 + 1;
        let (_, oldest, _) = ages.select_nth_unstable(cut - 1);
        let oldest = *oldest;
        self.keys.retain(|_, (_, t)| *t > oldest);
    }

    fn call(
        &mut self,
        key: &str,
        limit: &Limit,
        cost: u64,
        now_ms: u64,
        commit: bool,
    ) -> Result<Fields, Error> {
        let mut stored = self.stored(key, now_ms);
        let mut created = None;
        let (outcome, write, _) = block::check_blocking(
            stored.as_mut(),
            &request(limit, cost, now_ms),
            commit,
            limit.block_ms(),
            &mut created,
        )
        .map_err(|m| mismatch(m.stored, limit))?;
        if commit {
            match write {
                Write::Nothing => {}
                Write::Updated => self.store(key, stored),
                Write::Created => self.store(key, created),
            }
        }
        Ok(outcome.decision)
    }

    /// `RATELIMIT.CHECK key <limit> COST cost AT now_ms`.
    pub fn check(
        &mut self,
        key: &str,
        limit: &Limit,
        cost: u64,
        now_ms: u64,
    ) -> Result<Fields, Error> {
        self.call(key, limit, cost, now_ms, true)
    }

    /// `RATELIMIT.PEEK`: what `check` would answer, changing nothing.
    pub fn peek(
        &mut self,
        key: &str,
        limit: &Limit,
        cost: u64,
        now_ms: u64,
    ) -> Result<Fields, Error> {
        self.call(key, limit, cost, now_ms, false)
    }

    /// `RATELIMIT.REFUND`: gives back up to `cost` of what earlier calls consumed.
    pub fn refund(
        &mut self,
        key: &str,
        limit: &Limit,
        cost: u64,
        now_ms: u64,
    ) -> Result<Fields, Error> {
        let mut stored = self.stored(key, now_ms);
        let (outcome, refunded) =
            algorithms::refund(stored.as_mut(), &request(limit, cost, now_ms))
                .map_err(|m| mismatch(m.stored, limit))?;
        match refunded {
            Refunded::Nothing => {}
            Refunded::Updated => self.store(key, stored),
            Refunded::Emptied => self.store(key, None),
        }
        Ok(outcome.decision)
    }

    /// `RATELIMIT.TAKE ... MAX most`: (the grant, CHECK COST max(grant, 1)'s fields, with a
    /// leaky bucket's `delay_ms` the last granted unit's wait).
    pub fn take(
        &mut self,
        key: &str,
        limit: &Limit,
        most: u64,
        now_ms: u64,
    ) -> Result<(u64, Fields), Error> {
        let stored = self.stored(key, now_ms);
        // A PEEK of `cost` on the stored state (a copy: nothing is written).
        let peek = |cost| {
            let mut copy = stored.clone();
            block::check_blocking(
                copy.as_mut(),
                &request(limit, cost, now_ms),
                false,
                limit.block_ms(),
                &mut None,
            )
            .map(|(outcome, _, _)| outcome.decision)
        };
        let granted = largest_grant(most, |cost| peek(cost).map(|decision| decision.allowed))
            .map_err(|m| mismatch(m.stored, limit))?;
        // The wait of the last granted unit (a leaky bucket's), asked before the grant is
        // consumed, as the module asks it.
        let last = last_unit_delay_ms(limit.algorithm(), granted, peek)
            .map_err(|m| mismatch(m.stored, limit))?;
        let mut fields = self.check(key, limit, granted.max(1), now_ms)?;
        if let Some(delay_ms) = last {
            fields.delay_ms = delay_ms;
        }
        Ok((granted, fields))
    }

    /// `RATELIMIT.RESET`: how many of `keys` had a state.
    pub fn reset<S: AsRef<str>>(&mut self, keys: &[S]) -> u64 {
        keys.iter()
            .filter(|key| self.keys.remove(key.as_ref()).is_some())
            .count() as u64
    }

    /// The absolute expiry (ms) of `key`'s state as the module would set it, `None` without one.
    pub fn expires_at_ms(&self, key: &str) -> Option<u64> {
        self.keys
            .get(key)
            .map(|(limiter, _)| limiter.expires_at_ms())
    }
}
