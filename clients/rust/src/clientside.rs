//! Decisions without a round trip where it is safe: the denial cache and the batches' state.
//! No I/O: the limiter asks them what it may answer locally and tells them what Redis answered.
//! Times are ms on the limiter's clock (monotonic, or the calls' `at`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use crate::types::{Decision, Limit, Source, SpecRef};

/// What a cached refusal or a batch belongs to: the key, and the limit's words or the policy's
/// name (and fallback).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target {
    pub key: String,
    pub spec: Vec<String>,
}

pub fn target(key: &str, spec: SpecRef<'_>) -> Target {
    let words = match spec {
        SpecRef::Limit(limit) => {
            let mut words = vec!["limit".to_string()];
            words.extend(limit.args().iter().cloned());
            words
        }
        SpecRef::Policy(policy) => {
            let mut words = vec!["policy".to_string(), policy.name().to_string()];
            if let Some(fallback) = policy.fallback_limit() {
                words.extend(fallback.args().iter().cloned());
            }
            words
        }
    };
    Target {
        key: key.to_string(),
        spec: words,
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code of ours panics while holding one of these locks; if some did, the data is still
    // whole (every update is a few assignments), so a poisoned lock is used as it is.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[derive(Debug)]
struct Entry {
    until_ms: u64,
    at_ms: u64,
    decision: Decision,
    used: u64,
}

/// At most `size` refusals, the least recently used dropped first, each answered again until
/// its `retry_after_ms` has passed, for a cost at least the refused one (admission is monotone
/// in the cost) up to the limit. A refusal that can never pass (`retry_after_ms` -1) or that
/// waits 0 is not kept.
#[derive(Debug)]
pub struct DenialCache {
    size: usize,
    entries: HashMap<(Target, u64), Entry>,
    by_key: HashMap<String, HashSet<(Target, u64)>>,
    clock: u64,
}

impl DenialCache {
    pub fn new(size: usize) -> DenialCache {
        DenialCache {
            size,
            entries: HashMap::new(),
            by_key: HashMap::new(),
            clock: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The refusal to answer for a request of `cost` at `now_ms`, its waits counted down.
    pub fn get(&mut self, where_: &Target, cost: u64, now_ms: u64) -> Option<Decision> {
        let candidates: Vec<(Target, u64)> = self
            .by_key
            .get(&where_.key)?
            .iter()
            .filter(|(t, c)| t == where_ && *c <= cost)
            .cloned()
            .collect();
        let mut best: Option<(u64, (Target, u64))> = None;
        for entry in candidates {
            let Some(found) = self.entries.get(&entry) else {
                continue;
            };
            if cost > found.decision.limit {
                return None; // never admitted (-1): Redis says so
            }
            if now_ms >= found.until_ms {
                self.drop_entry(&entry);
                continue;
            }
            if best
                .as_ref()
                .is_none_or(|(until, _)| found.until_ms > *until)
            {
                best = Some((found.until_ms, entry));
            }
        }
        let (_, entry) = best?;
        self.clock += 1;
        let clock = self.clock;
        let found = self.entries.get_mut(&entry)?;
        found.used = clock;
        let elapsed = now_ms.saturating_sub(found.at_ms);
        Some(Decision {
            retry_after_ms: i64::try_from(found.until_ms - now_ms.max(found.at_ms))
                .unwrap_or(i64::MAX),
            reset_after_ms: found.decision.reset_after_ms.saturating_sub(elapsed),
            delay_ms: 0,
            source: Source::Cache,
            granted: 0,
            ..found.decision
        })
    }

    /// Keeps a refusal of `cost` (a TAKE's refusal is one of cost 1).
    pub fn put(&mut self, where_: &Target, cost: u64, decision: &Decision, now_ms: u64) {
        if decision.allowed || decision.retry_after_ms <= 0 || self.size == 0 {
            return;
        }
        self.clock += 1;
        let entry = (where_.clone(), cost);
        self.entries.insert(
            entry.clone(),
            Entry {
                until_ms: now_ms.saturating_add(decision.retry_after_ms as u64),
                at_ms: now_ms,
                decision: *decision,
                used: self.clock,
            },
        );
        self.by_key
            .entry(where_.key.clone())
            .or_default()
            .insert(entry);
        if self.entries.len() > self.size {
            // The least recently used go (a tenth at once: one scan per tenth of the puts).
            let mut ages: Vec<u64> = self.entries.values().map(|e| e.used).collect();
            let cut = (self.entries.len() - self.size).max(self.size / 10).max(1);
            let cut = cut.min(ages.len());
            let (_, oldest, _) = ages.select_nth_unstable(cut - 1);
            let oldest = *oldest;
            let gone: Vec<(Target, u64)> = self
                .entries
                .iter()
                .filter(|(_, e)| e.used <= oldest)
                .map(|(k, _)| k.clone())
                .collect();
            for entry in gone {
                self.drop_entry(&entry);
            }
        }
    }

    /// Forgets every refusal of `key` (a reset or a refund through this limiter).
    pub fn drop_key(&mut self, key: &str) {
        if let Some(entries) = self.by_key.remove(key) {
            for entry in entries {
                self.entries.remove(&entry);
            }
        }
    }

    fn drop_entry(&mut self, entry: &(Target, u64)) {
        self.entries.remove(entry);
        if let Some(keyed) = self.by_key.get_mut(&entry.0.key) {
            keyed.remove(entry);
            if keyed.is_empty() {
                self.by_key.remove(&entry.0.key);
            }
        }
    }
}

/// A TAKE in flight for a batch: callers of the same limiter wait for it instead of sending
/// their own. It runs on a task of its own, so a caller that goes away loses nothing.
#[derive(Clone, Debug)]
pub struct Flight {
    done: watch::Receiver<bool>,
}

impl Flight {
    pub fn new() -> (Flight, watch::Sender<bool>) {
        let (sender, done) = watch::channel(false);
        (Flight { done }, sender)
    }

    /// Waits until the TAKE has ended (its units are in the batch, or it failed).
    pub async fn wait(mut self) {
        // An error: the sender is gone, which also means the flight ended.
        let _ = self.done.wait_for(|done| *done).await;
    }
}

/// The units one limiter holds for (key, limit): taken with TAKE, answered from locally,
/// refunded when the hold ends.
#[derive(Debug)]
pub struct BatchState {
    /// Units taken and not yet admitted nor refunded.
    pub held: u64,
    /// When the hold ends (ms).
    pub until: u64,
    /// The last TAKE's time and answer (for the numbers of local decisions).
    pub taken_at: u64,
    pub reply: Option<Decision>,
    pub flight: Option<Flight>,
    span_start: u64,
    used_now: u64,
    used_before: u64,
    /// Its times are the calls' `at` (no timer refunds it: the next call does).
    pub virtual_time: bool,
}

#[derive(Debug)]
pub struct Batch {
    pub key: String,
    pub limit: Limit,
    pub hold_ms: u64,
    pub most: u64,
    pub state: Mutex<BatchState>,
}

impl Batch {
    fn new(key: &str, limit: &Limit) -> Batch {
        Batch {
            key: key.to_string(),
            limit: limit.clone(),
            hold_ms: limit.batch_ms().unwrap_or(1).max(1),
            most: limit.batch_limit(),
            state: Mutex::new(BatchState {
                held: 0,
                until: 0,
                taken_at: 0,
                reply: None,
                flight: None,
                span_start: 0,
                used_now: 0,
                used_before: 0,
                virtual_time: false,
            }),
        }
    }
}

impl BatchState {
    fn roll(&mut self, hold_ms: u64, now_ms: u64) {
        if now_ms >= self.span_start.saturating_add(2 * hold_ms) {
            self.span_start = now_ms;
            self.used_now = 0;
            self.used_before = 0;
        } else if now_ms >= self.span_start + hold_ms {
            self.span_start += hold_ms;
            self.used_before = self.used_now;
            self.used_now = 0;
        }
    }

    pub fn used(&mut self, hold_ms: u64, units: u64, now_ms: u64) {
        self.roll(hold_ms, now_ms);
        self.used_now += units;
    }

    /// How many units to take: seven eighths of what was admitted over the last hold time,
    /// from 1 to `most`.
    pub fn size(&mut self, hold_ms: u64, most: u64, now_ms: u64) -> u64 {
        self.roll(hold_ms, now_ms);
        (self.used_now.max(self.used_before) * 7 / 8).clamp(1, most)
    }

    /// The units held cover `cost` within the hold: admitted from them.
    pub fn held_answer(&mut self, hold_ms: u64, cost: u64, now_ms: u64) -> Option<Decision> {
        (cost <= self.held && now_ms < self.until)
            .then(|| self.admit(hold_ms, cost, now_ms, Source::Local))
    }

    /// Admits `cost` from the held units (the caller checked `cost <= held`).
    pub fn admit(&mut self, hold_ms: u64, cost: u64, now_ms: u64, source: Source) -> Decision {
        self.held -= cost;
        self.used(hold_ms, cost, now_ms);
        self.decision(cost, now_ms, source)
    }

    fn decision(&self, cost: u64, now_ms: u64, source: Source) -> Decision {
        let reply = self.reply.unwrap_or(Decision::error(0, 0));
        let elapsed = now_ms.saturating_sub(self.taken_at);
        Decision {
            allowed: true,
            limit: reply.limit,
            remaining: self.held,
            retry_after_ms: 0,
            reset_after_ms: reply.reset_after_ms.saturating_sub(elapsed),
            delay_ms: reply.delay_ms.saturating_sub(elapsed),
            source,
            shadow_rejected: false,
            period_ms: reply.period_ms,
            granted: cost,
        }
    }
}

/// Every batch of a limiter, and the order their holds end in (to refund them on time).
#[derive(Debug)]
pub struct Batches {
    inner: Mutex<BatchesInner>,
    /// The first end of `inner.ends` (`u64::MAX`: none), written under the lock: a call reads
    /// it without the lock to see whether any hold is due.
    first_end: AtomicU64,
}

impl Default for Batches {
    fn default() -> Self {
        Batches {
            inner: Mutex::default(),
            first_end: AtomicU64::new(u64::MAX),
        }
    }
}

#[derive(Debug, Default)]
struct BatchesInner {
    batches: HashMap<Target, Arc<Batch>>,
    /// (end of hold, sequence) -> batch.
    ends: BTreeMap<(u64, u64), Arc<Batch>>,
    seq: u64,
}

impl Batches {
    pub fn get(&self, key: &str, limit: &Limit) -> Arc<Batch> {
        let where_ = target(key, SpecRef::Limit(limit));
        let mut inner = lock(&self.inner);
        inner
            .batches
            .entry(where_)
            .or_insert_with(|| Arc::new(Batch::new(key, limit)))
            .clone()
    }

    /// `batch` holds units until `until`.
    pub fn holding(&self, batch: &Arc<Batch>, until: u64) {
        let mut inner = lock(&self.inner);
        inner.seq += 1;
        let seq = inner.seq;
        inner.ends.insert((until, seq), batch.clone());
        self.publish(&inner);
    }

    fn publish(&self, inner: &BatchesInner) {
        // An end at u64::MAX (a saturated hold) is kept as MAX - 1: later than any call's time.
        let first = inner
            .ends
            .keys()
            .next()
            .map_or(u64::MAX, |(until, _)| (*until).min(u64::MAX - 1));
        self.first_end.store(first, Ordering::Release);
    }

    /// The batches whose hold has ended at `now_ms` (all of them with `None`) and the units each
    /// gives back, taken from them (the caller refunds them).
    pub fn due(&self, now_ms: Option<u64>) -> Vec<(Arc<Batch>, u64)> {
        let mut found = Vec::new();
        let mut inner = lock(&self.inner);
        while let Some((&(until, seq), _)) = inner.ends.iter().next() {
            if now_ms.is_some_and(|now| until > now) {
                break;
            }
            let Some(batch) = inner.ends.remove(&(until, seq)) else {
                break;
            };
            let mut state = lock(&batch.state);
            if state.held > 0 && now_ms.is_none_or(|now| state.until <= now) {
                found.push((batch.clone(), state.held));
                state.held = 0;
            }
        }
        if now_ms.is_none() {
            for batch in inner.batches.values() {
                let mut state = lock(&batch.state);
                if state.held > 0 {
                    found.push((batch.clone(), state.held));
                    state.held = 0;
                }
            }
        }
        self.publish(&inner);
        // Idle batches without units are forgotten (a new one starts from scratch).
        if inner.batches.len() > 1024 {
            inner.batches.retain(|_, b| {
                let state = lock(&b.state);
                state.held > 0 || state.flight.is_some()
            });
        }
        found
    }

    /// Whether any hold is still to end (on any clock).
    pub fn next_end(&self) -> Option<u64> {
        let first = self.first_end.load(Ordering::Acquire);
        (first != u64::MAX).then_some(first)
    }

    /// Units held by every batch now.
    pub fn held(&self) -> u64 {
        lock(&self.inner)
            .batches
            .values()
            .map(|b| lock(&b.state).held)
            .sum()
    }

    /// A reset of `key`: its batches' units are gone with it (nothing to refund).
    pub fn drop_key(&self, key: &str) {
        let inner = lock(&self.inner);
        for (where_, batch) in inner.batches.iter() {
            if where_.key == key {
                lock(&batch.state).held = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Algorithm;

    fn refusal(retry: i64, limit: u64) -> Decision {
        Decision {
            allowed: false,
            limit,
            remaining: 0,
            retry_after_ms: retry,
            reset_after_ms: 500,
            delay_ms: 0,
            source: Source::Module,
            shadow_rejected: false,
            period_ms: 1000,
            granted: 0,
        }
    }

    #[test]
    fn a_cached_refusal_counts_down_and_covers_larger_costs_only() {
        let limit = Limit::new(Algorithm::FixedWindow, 5, "1s").unwrap();
        let where_ = target("k", SpecRef::Limit(&limit));
        let mut cache = DenialCache::new(10);
        cache.put(&where_, 2, &refusal(300, 5), 1_000);
        assert!(
            cache.get(&where_, 1, 1_100).is_none(),
            "a smaller cost may pass"
        );
        let hit = cache.get(&where_, 3, 1_100).unwrap();
        assert_eq!(
            (hit.retry_after_ms, hit.reset_after_ms, hit.source),
            (200, 400, Source::Cache)
        );
        assert!(cache.get(&where_, 6, 1_100).is_none(), "above the limit");
        assert!(cache.get(&where_, 2, 1_300).is_none(), "its wait is over");
        cache.put(&where_, 1, &refusal(-1, 5), 1_000);
        assert!(cache.is_empty());
    }

    #[test]
    fn the_cache_keeps_at_most_its_size() {
        let limit = Limit::new(Algorithm::FixedWindow, 5, "1s").unwrap();
        let mut cache = DenialCache::new(100);
        for i in 0..1_000 {
            let where_ = target(&format!("k{i}"), SpecRef::Limit(&limit));
            cache.put(&where_, 1, &refusal(300, 5), 1_000);
            assert!(cache.len() <= 100);
        }
        let newest = target("k999", SpecRef::Limit(&limit));
        assert!(cache.get(&newest, 1, 1_001).is_some());
    }
}
