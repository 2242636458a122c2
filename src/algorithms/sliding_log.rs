//! Sliding log: the exact multiset of admitted timestamps in `(t − P, t]`; at most `L` of them.
//!
//! Stored compactly, oldest first, as one `u64` word per run of entries at the same millisecond:
//! `timestamp << 11 | (run − 1)`. Entries at the same ms are counted, never collapsed; a run longer
//! than 2048 continues in the next word. Distinct timestamps cost 8 bytes each.

use std::collections::VecDeque;

use super::{Decision, Limiter, Outcome, Params, Request, State, Write};

const RUN_BITS: u32 = 11;
const MAX_RUN: u64 = 1 << RUN_BITS;

/// The log of one key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlidingLog {
    /// Runs of entries, oldest first: `timestamp << 11 | (run − 1)`.
    words: VecDeque<u64>,
    /// The number of entries (the sum of the runs).
    total: u64,
}

/// A log whose runs are out of order, empty or out of range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidLog;

fn unpack(word: u64) -> (u64, u64) {
    (word >> RUN_BITS, (word & (MAX_RUN - 1)) + 1)
}

fn pack(timestamp_ms: u64, run: u64) -> u64 {
    debug_assert!((1..=MAX_RUN).contains(&run));
    timestamp_ms << RUN_BITS | (run - 1)
}

/// Entries at or before `cutoff` have left the window (`None`: nothing has).
type Cutoff = Option<u64>;

impl SlidingLog {
    /// The number of entries stored.
    pub fn len(&self) -> u64 {
        self.total
    }

    /// The log holds no entry.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The runs `(timestamp_ms, count)`, oldest first.
    pub fn runs(&self) -> impl ExactSizeIterator<Item = (u64, u64)> + '_ {
        self.words.iter().map(|word| unpack(*word))
    }

    /// Rebuilds a log from runs as [`SlidingLog::runs`] yields them, refusing unordered, empty,
    /// oversized (above 2048, so memory stays bounded by the input) or out-of-range runs.
    pub fn from_runs(runs: impl IntoIterator<Item = (u64, u64)>) -> Result<SlidingLog, InvalidLog> {
        let mut log = SlidingLog::default();
        for (timestamp_ms, count) in runs {
            let newest = log.newest_ms();
            if count == 0
                || count > MAX_RUN
                || timestamp_ms >= super::TIME_LIMIT_MS
                || newest > Some(timestamp_ms)
            {
                return Err(InvalidLog);
            }
            log.push(timestamp_ms, count);
        }
        Ok(log)
    }

    /// Heap bytes held, for `MEMORY USAGE`.
    pub fn heap_bytes(&self) -> usize {
        self.words.capacity() * std::mem::size_of::<u64>()
    }

    /// The newest entry's timestamp.
    pub fn newest_ms(&self) -> Option<u64> {
        self.words.back().map(|word| unpack(*word).0)
    }

    /// ms from `t` until every entry has left a window of `params.period_ms`.
    pub fn reset_after(&self, params: &Params, t_ms: u64) -> u64 {
        self.newest_ms()
            .map_or(0, |newest| (newest + params.period_ms).saturating_sub(t_ms))
    }

    /// Appends `count` entries at `timestamp_ms` (not older than the newest entry).
    fn push(&mut self, timestamp_ms: u64, mut count: u64) {
        self.total += count;
        if let Some(last) = self.words.back_mut() {
            let (newest, run) = unpack(*last);
            if newest == timestamp_ms && run < MAX_RUN {
                let added = count.min(MAX_RUN - run);
                *last = pack(timestamp_ms, run + added);
                count -= added;
            }
        }
        while count > 0 {
            let run = count.min(MAX_RUN);
            if self.words.len() == self.words.capacity() {
                // Grow by a quarter rather than double: a log holds about its limit for long.
                self.words.reserve_exact((self.words.len() / 4).max(4));
            }
            self.words.push_back(pack(timestamp_ms, run));
            count -= run;
        }
    }

    /// The number of words and of entries at or before `cutoff`.
    fn expired(&self, cutoff: Cutoff) -> (usize, u64) {
        let Some(cutoff) = cutoff else {
            return (0, 0);
        };
        let words = self.words.partition_point(|word| unpack(*word).0 <= cutoff);
        let entries = self.words.range(..words).map(|word| unpack(*word).1).sum();
        (words, entries)
    }

    /// The timestamp of the `k`-th (1-based) entry counted from word `first`.
    fn kth_from(&self, first: usize, k: u64) -> Option<u64> {
        let mut seen = 0;
        for word in self.words.range(first..) {
            let (timestamp_ms, run) = unpack(*word);
            seen += run;
            if seen >= k {
                return Some(timestamp_ms);
            }
        }
        None
    }

    /// Drops the first `words` words holding `entries` entries.
    fn drop_front(&mut self, words: usize, entries: u64) {
        self.words.drain(..words);
        self.total -= entries;
        // Keep at most twice the room needed, so a shrinking log gives its memory back.
        let len = self.words.len();
        if self.words.capacity() > 16 && self.words.capacity() > 4 * len {
            self.words.shrink_to(2 * len);
        }
    }
}

fn later(a: Cutoff, b: Cutoff) -> Cutoff {
    a.max(b)
}

/// The sliding-log call; see [`super::check`].
pub(crate) fn check(
    stored: Option<&mut Limiter>,
    request: &Request,
    commit: bool,
) -> (Outcome, Write) {
    let params = &request.params;
    let t_ms = stored.as_ref().map_or(request.now_ms, |limiter| {
        request.now_ms.max(limiter.last_ms)
    });
    let expired = stored
        .as_deref()
        .and_then(|limiter| slid_out(limiter, params, t_ms));
    // A stored log that has entirely slid out of its own window is equivalent to a fresh key.
    let live = stored.filter(|_| expired.is_some());
    let empty = SlidingLog::default();
    let log = match &live {
        Some(Limiter {
            state: State::SlidingLog(log),
            ..
        }) => log,
        _ => &empty,
    };
    let (expired_words, expired_entries) = expired.unwrap_or((0, 0));
    let count = log.total - expired_entries;
    let cost = request.cost;
    let allowed = count
        .checked_add(cost)
        .is_some_and(|total| total <= params.limit);
    let count_after = if allowed { count + cost } else { count };
    let newest_ms = if allowed && cost > 0 {
        Some(t_ms)
    } else if count > 0 {
        log.newest_ms()
    } else {
        None
    };
    let retry_after_ms = if allowed {
        0
    } else if cost > params.limit {
        -1
    } else {
        // The request fits once the (n + c − L)-th oldest live entry has left the window.
        let k = count + cost - params.limit;
        log.kth_from(expired_words, k)
            .map_or(0, |oldest| (oldest + params.period_ms - t_ms) as i64)
    };
    let decision = Decision {
        allowed,
        limit: params.limit,
        remaining: params.limit.saturating_sub(count_after),
        retry_after_ms,
        reset_after_ms: newest_ms.map_or(0, |newest| newest + params.period_ms - t_ms),
        delay_ms: 0,
    };
    let consumed = allowed && cost > 0;
    let outcome = Outcome {
        decision,
        t_ms,
        consumed,
    };
    if !(commit && consumed) {
        return (outcome, Write::None);
    }
    (outcome, record(live, expired, params, t_ms, cost))
}

/// What of `limiter`'s log has slid out at `t_ms`, as (words, entries): entries gone under the
/// stored period, and those older than the call's period, which do not count. `None` when the
/// whole stored log has slid out of its own window: the key is then equivalent to a fresh one.
fn slid_out(limiter: &Limiter, params: &Params, t_ms: u64) -> Option<(usize, u64)> {
    let State::SlidingLog(log) = &limiter.state else {
        return None;
    };
    if limiter.last_ms + limiter.params.period_ms <= t_ms {
        return None;
    }
    let cutoff = later(
        t_ms.checked_sub(limiter.params.period_ms),
        t_ms.checked_sub(params.period_ms),
    );
    Some(log.expired(cutoff))
}

/// Whether [`append`] of `cost` entries at `t_ms` keeps the log within `params.limit` (what an
/// admitted call guarantees; a replayed write is checked against it before it is applied).
pub fn append_fits(stored: Option<&Limiter>, params: &Params, t_ms: u64, cost: u64) -> bool {
    let live = match stored {
        Some(limiter) if limiter.last_ms > t_ms => return false,
        Some(limiter) => match (&limiter.state, slid_out(limiter, params, t_ms)) {
            (State::SlidingLog(log), Some((_, expired))) => log.total - expired,
            _ => 0,
        },
        None => 0,
    };
    live.checked_add(cost)
        .is_some_and(|total| total <= params.limit)
}

/// Records `cost` entries at `t_ms` under `params` and stores the new parameters: the write of an
/// admitted call, also what replicas and AOF replay apply. `stored` must hold a sliding log last
/// written at or before `t_ms`; one that has entirely slid out of its window is replaced.
pub fn append(stored: Option<&mut Limiter>, params: &Params, t_ms: u64, cost: u64) -> Write {
    let expired = stored
        .as_deref()
        .and_then(|limiter| slid_out(limiter, params, t_ms));
    record(stored, expired, params, t_ms, cost)
}

/// [`append`] with what has slid out already known (`None`: the stored log, if any, is stale).
fn record(
    stored: Option<&mut Limiter>,
    expired: Option<(usize, u64)>,
    params: &Params,
    t_ms: u64,
    cost: u64,
) -> Write {
    match (stored, expired) {
        (Some(limiter), Some((words, entries))) => {
            if let State::SlidingLog(log) = &mut limiter.state {
                log.drop_front(words, entries);
                log.push(t_ms, cost);
            }
            limiter.params = *params;
            limiter.last_ms = t_ms;
            Write::Updated
        }
        _ => {
            let mut log = SlidingLog::default();
            log.push(t_ms, cost);
            Write::Created(Limiter {
                params: *params,
                last_ms: t_ms,
                state: State::SlidingLog(log),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::run_table;
    use super::super::Algorithm;
    use super::*;

    #[test]
    fn spec_worked_example() {
        // sliding-log 2 1000: two entries at the same ms both count.
        run_table(
            Algorithm::SlidingLog,
            2,
            1000,
            None,
            &[
                (0, 1, [1, 2, 1, 0, 1000, 0]),
                (0, 1, [1, 2, 0, 0, 1000, 0]),
                (500, 1, [0, 2, 0, 500, 500, 0]),
                (1000, 1, [1, 2, 1, 0, 1000, 0]),
                (1000, 1, [1, 2, 0, 0, 1000, 0]),
                (1400, 1, [0, 2, 0, 600, 600, 0]),
            ],
        );
    }

    #[test]
    fn retry_waits_for_enough_old_entries_to_leave() {
        // 3 per second: entries at 0, 100, 200; a cost-2 request needs the two oldest gone.
        run_table(
            Algorithm::SlidingLog,
            3,
            1000,
            None,
            &[
                (0, 1, [1, 3, 2, 0, 1000, 0]),
                (100, 1, [1, 3, 1, 0, 1000, 0]),
                (200, 1, [1, 3, 0, 0, 1000, 0]),
                (300, 2, [0, 3, 0, 800, 900, 0]),
                (1000, 0, [1, 3, 1, 0, 200, 0]),
                (1100, 2, [1, 3, 0, 0, 1000, 0]),
                (1100, 4, [0, 3, 0, -1, 1000, 0]),
            ],
        );
    }

    #[test]
    fn long_runs_at_one_millisecond_are_split_and_counted() {
        let mut log = SlidingLog::default();
        log.push(5, 5000);
        log.push(5, 1);
        log.push(7, 3);
        assert_eq!(log.len(), 5004);
        let runs: Vec<_> = log.runs().collect();
        assert_eq!(runs, vec![(5, 2048), (5, 2048), (5, 905), (7, 3)]);
        assert_eq!(SlidingLog::from_runs(runs), Ok(log));
    }

    #[test]
    fn from_runs_refuses_disorder_and_empty_runs() {
        assert_eq!(SlidingLog::from_runs([(5, 1), (4, 1)]), Err(InvalidLog));
        assert_eq!(SlidingLog::from_runs([(5, 0)]), Err(InvalidLog));
        assert_eq!(SlidingLog::from_runs([(5, 2049)]), Err(InvalidLog));
        assert_eq!(
            SlidingLog::from_runs([(super::super::TIME_LIMIT_MS, 1)]),
            Err(InvalidLog)
        );
    }
}
