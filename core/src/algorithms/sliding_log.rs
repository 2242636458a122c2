//! Sliding log: the exact multiset of admitted timestamps in `(t − P, t]`; at most `L` of them.
//!
//! Stored compactly, oldest first, as runs of entries at the same millisecond, each run one
//! variable-length record of its gap since the previous run: `varint(gap << 1 | several)`, then
//! `varint(count − 2)` when `several`. Entries at the same ms are counted, never collapsed. An entry
//! alone at its ms costs 1 byte for gaps under 64 ms, 2 under 8.2 s, 3 under 17 min and 4 under 37 h.

use std::collections::VecDeque;
use std::fmt;

use super::{Decision, Limiter, Outcome, Params, Refunded, Request, State, Write};

/// The largest run in the encodings of [`crate::codec`] and [`crate::value`] (a longer run is split there).
const MAX_RUN: u64 = 2048;
/// The longest record: two 64-bit varints.
const MAX_RECORD: usize = 20;

/// The log of one key.
#[derive(Clone, Default)]
pub struct SlidingLog {
    /// The runs' records, oldest first.
    bytes: VecDeque<u8>,
    /// The time the first run's gap counts from.
    base_ms: u64,
    /// The newest run's timestamp (meaningless when empty).
    newest_ms: u64,
    /// Where the newest run's record starts, so a call at the same ms extends it in place.
    newest_pos: usize,
    /// The number of entries (the sum of the runs).
    total: u64,
}

/// A log whose runs are out of order, empty or out of range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidLog;

/// A point between two runs: `pos` bytes in, after runs holding `entries` entries, the last of
/// them at `prev_ms` (the log's base when there are none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mark {
    pos: usize,
    prev_ms: u64,
    entries: u64,
}

/// Writes `value` as a varint into `out` at `at`; returns where it ends.
fn put_varint(out: &mut [u8; MAX_RECORD], mut at: usize, mut value: u64) -> usize {
    while value >= 0x80 {
        out[at] = value as u8 | 0x80;
        value >>= 7;
        at += 1;
    }
    out[at] = value as u8;
    at + 1
}

/// Decodes the runs from a [`Mark`] on, yielding `(timestamp_ms, count)`.
struct Runs<'a> {
    bytes: std::collections::vec_deque::Iter<'a, u8>,
    pos: usize,
    prev_ms: u64,
}

impl Runs<'_> {
    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        let mut shift = 0u32;
        for &byte in self.bytes.by_ref() {
            self.pos += 1;
            value |= u64::from(byte & 0x7f).wrapping_shl(shift);
            if byte < 0x80 {
                return Some(value);
            }
            shift += 7;
        }
        None
    }

    /// Where the next run starts.
    fn mark(&self, entries: u64) -> Mark {
        Mark {
            pos: self.pos,
            prev_ms: self.prev_ms,
            entries,
        }
    }
}

impl Iterator for Runs<'_> {
    type Item = (u64, u64);

    fn next(&mut self) -> Option<(u64, u64)> {
        let head = self.varint()?;
        let count = if head & 1 == 1 { self.varint()? + 2 } else { 1 };
        self.prev_ms += head >> 1;
        Some((self.prev_ms, count))
    }
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

    /// The start of the log.
    fn start(&self) -> Mark {
        Mark {
            pos: 0,
            prev_ms: self.base_ms,
            entries: 0,
        }
    }

    /// The whole runs from `mark` on.
    fn runs_from(&self, mark: Mark) -> Runs<'_> {
        Runs {
            bytes: self.bytes.range(mark.pos..),
            pos: mark.pos,
            prev_ms: mark.prev_ms,
        }
    }

    /// The runs `(timestamp_ms, count)`, oldest first, runs above 2048 entries split as the
    /// encodings want them.
    pub fn runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.runs_from(self.start())
            .flat_map(|(timestamp_ms, count)| {
                let rest = count % MAX_RUN;
                std::iter::repeat_n((timestamp_ms, MAX_RUN), (count / MAX_RUN) as usize)
                    .chain((rest > 0).then_some((timestamp_ms, rest)))
            })
    }

    /// Rebuilds a log from runs as [`SlidingLog::runs`] yields them, refusing unordered, empty,
    /// oversized (above 2048, so memory stays bounded by the input) or out-of-range runs. Runs at
    /// the same ms are merged.
    pub fn from_runs(runs: impl IntoIterator<Item = (u64, u64)>) -> Result<SlidingLog, InvalidLog> {
        let mut log = SlidingLog::default();
        for (timestamp_ms, count) in runs {
            if count == 0
                || count > MAX_RUN
                || timestamp_ms >= super::TIME_LIMIT_MS
                || log.newest_ms() > Some(timestamp_ms)
            {
                return Err(InvalidLog);
            }
            log.push(timestamp_ms, count);
        }
        Ok(log)
    }

    /// Heap bytes held, for `MEMORY USAGE`.
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity()
    }

    /// The newest entry's timestamp.
    pub fn newest_ms(&self) -> Option<u64> {
        (self.total > 0).then_some(self.newest_ms)
    }

    /// The oldest entry's timestamp.
    pub fn oldest_ms(&self) -> Option<u64> {
        self.runs_from(self.start())
            .next()
            .map(|(timestamp_ms, _)| timestamp_ms)
    }

    /// ms from `t` until every entry has left a window of `params.period_ms`.
    pub fn reset_after(&self, params: &Params, t_ms: u64) -> u64 {
        self.newest_ms()
            .map_or(0, |newest| (newest + params.period_ms).saturating_sub(t_ms))
    }

    /// Appends `count` (at least 1) entries at `timestamp_ms` (not older than the newest entry).
    fn push(&mut self, timestamp_ms: u64, count: u64) {
        debug_assert!(count > 0 && self.newest_ms() <= Some(timestamp_ms));
        let (gap, run) = match self.newest_ms() {
            None => {
                self.bytes.clear();
                self.base_ms = timestamp_ms;
                self.newest_pos = 0;
                (0, count)
            }
            Some(newest) if newest == timestamp_ms => {
                // Re-encode the newest run with its new count; its gap stays.
                let last = Mark {
                    pos: self.newest_pos,
                    prev_ms: 0,
                    entries: 0,
                };
                let (gap, run) = self.runs_from(last).next().unwrap_or((0, 0));
                self.bytes.truncate(self.newest_pos);
                (gap, run + count)
            }
            Some(newest) => {
                self.newest_pos = self.bytes.len();
                (timestamp_ms - newest, count)
            }
        };
        let mut record = [0u8; MAX_RECORD];
        let mut len = put_varint(&mut record, 0, gap << 1 | u64::from(run > 1));
        if run > 1 {
            len = put_varint(&mut record, len, run - 2);
        }
        if self.bytes.capacity() - self.bytes.len() < len {
            // Grow by a quarter rather than double: a log holds about its limit for long.
            self.bytes
                .reserve_exact((self.bytes.len() / 4).max(len).max(8));
        }
        self.bytes.extend(&record[..len]);
        self.newest_ms = timestamp_ms;
        self.total += count;
    }

    /// The point after the runs at or before `cutoff`.
    fn expired(&self, cutoff: Cutoff) -> Mark {
        let mut mark = self.start();
        let Some(cutoff) = cutoff else {
            return mark;
        };
        let mut runs = self.runs_from(mark);
        while let Some((timestamp_ms, count)) = runs.next() {
            if timestamp_ms > cutoff {
                break;
            }
            mark = runs.mark(mark.entries + count);
        }
        mark
    }

    /// The timestamp of the `k`-th (1-based) entry counted from `mark`.
    fn kth_from(&self, mark: Mark, k: u64) -> Option<u64> {
        let mut seen = 0;
        for (timestamp_ms, count) in self.runs_from(mark) {
            seen += count;
            if seen >= k {
                return Some(timestamp_ms);
            }
        }
        None
    }

    /// Removes the `n` newest entries (fewer than the log holds): the log is written again
    /// without them, O(runs).
    fn remove_newest(&mut self, n: u64) {
        debug_assert!(n < self.total);
        let mut runs: Vec<(u64, u64)> = self.runs_from(self.start()).collect();
        let mut left = n;
        while let Some(last) = runs.last_mut() {
            if last.1 > left {
                last.1 -= left;
                break;
            }
            left -= last.1;
            runs.pop();
        }
        *self = SlidingLog::default();
        for (timestamp_ms, count) in runs {
            self.push(timestamp_ms, count);
        }
    }

    /// Drops the runs before `mark`.
    fn drop_front(&mut self, mark: Mark) {
        self.bytes.drain(..mark.pos);
        self.total -= mark.entries;
        if self.total == 0 {
            // Everything is gone, the newest run included: the next push starts afresh.
            self.bytes.clear();
            self.newest_pos = 0;
            self.base_ms = 0;
        } else {
            self.newest_pos -= mark.pos;
            self.base_ms = mark.prev_ms;
        }
        // Keep at most twice the room needed, so a shrinking log gives its memory back.
        let len = self.bytes.len();
        if self.bytes.capacity() > 64 && self.bytes.capacity() > 4 * len {
            self.bytes.shrink_to(2 * len);
        }
    }
}

/// Two logs are equal when they hold the same entries, however their bytes are laid out.
impl PartialEq for SlidingLog {
    fn eq(&self, other: &SlidingLog) -> bool {
        self.total == other.total
            && self.newest_ms() == other.newest_ms()
            && self
                .runs_from(self.start())
                .eq(other.runs_from(other.start()))
    }
}

impl Eq for SlidingLog {}

impl fmt::Debug for SlidingLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.runs_from(self.start()))
            .finish()
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
    created: &mut Option<Limiter>,
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
    let mark = expired.unwrap_or_else(|| log.start());
    let count = log.total - mark.entries;
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
        log.kth_from(mark, k)
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
    let outcome = Outcome::new(decision, t_ms, cost);
    if !(commit && outcome.consumed) {
        return (outcome, Write::Nothing);
    }
    (outcome, record(live, expired, params, t_ms, cost, created))
}

/// [`super::refund`] of a sliding log at `t_ms`: the `cost` newest entries still in the window
/// (under the log's own period) are removed; the entries that have left it go too.
pub fn refund(limiter: &mut Limiter, cost: u64, t_ms: u64) -> Refunded {
    let Some(mark) = slid_out(limiter, &limiter.params, t_ms) else {
        return Refunded::Nothing;
    };
    let blocked = limiter.blocked_at(t_ms);
    let State::SlidingLog(log) = &mut limiter.state else {
        return Refunded::Nothing;
    };
    let live = log.total - mark.entries;
    let take = cost.min(live);
    if take == 0 {
        return Refunded::Nothing;
    }
    if take == live && !blocked {
        return Refunded::Emptied;
    }
    log.drop_front(mark);
    if take == live {
        // Blocked: the key stays, its log empty, until the block ends.
        *log = SlidingLog::default();
    } else {
        log.remove_newest(take);
    }
    limiter.last_ms = t_ms;
    Refunded::Updated
}

/// Where `limiter`'s log starts to count at `t_ms`: after the entries gone under the
/// stored period, and those older than the call's period, which do not count. `None` when the
/// whole stored log has slid out of its own window: the key is then equivalent to a fresh one.
fn slid_out(limiter: &Limiter, params: &Params, t_ms: u64) -> Option<Mark> {
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
            (State::SlidingLog(log), Some(mark)) => log.total - mark.entries,
            _ => 0,
        },
        None => 0,
    };
    live.checked_add(cost)
        .is_some_and(|total| total <= params.limit)
}

/// Records `cost` entries at `t_ms` under `params` and stores the new parameters: the write of an
/// admitted call, also what replicas and AOF replay apply. `stored` must hold a sliding log last
/// written at or before `t_ms`; one that has entirely slid out of its window is replaced (a new
/// log is written into `created`: [`Write::Created`]).
pub fn append(
    stored: Option<&mut Limiter>,
    params: &Params,
    t_ms: u64,
    cost: u64,
    created: &mut Option<Limiter>,
) -> Write {
    let expired = stored
        .as_deref()
        .and_then(|limiter| slid_out(limiter, params, t_ms));
    record(stored, expired, params, t_ms, cost, created)
}

/// [`append`] with what has slid out already known (`None`: the stored log, if any, is stale).
fn record(
    stored: Option<&mut Limiter>,
    expired: Option<Mark>,
    params: &Params,
    t_ms: u64,
    cost: u64,
    created: &mut Option<Limiter>,
) -> Write {
    match (stored, expired) {
        (Some(limiter), Some(mark)) => {
            if let State::SlidingLog(log) = &mut limiter.state {
                log.drop_front(mark);
                log.push(t_ms, cost);
            }
            limiter.params = *params;
            limiter.last_ms = t_ms;
            // An admitted call: any block had ended.
            limiter.blocked_until_ms = 0;
            Write::Updated
        }
        _ => {
            let mut log = SlidingLog::default();
            log.push(t_ms, cost);
            *created = Some(Limiter {
                params: *params,
                last_ms: t_ms,
                state: State::SlidingLog(log),
                blocked_until_ms: 0,
            });
            Write::Created
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{run_table, step};
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
                step!(at 0, cost 1 => allowed, remaining 1, retry 0, reset 1000),
                step!(at 0, cost 1 => allowed, remaining 0, retry 0, reset 1000),
                step!(at 500, cost 1 => rejected, remaining 0, retry 500, reset 500),
                step!(at 1000, cost 1 => allowed, remaining 1, retry 0, reset 1000),
                step!(at 1000, cost 1 => allowed, remaining 0, retry 0, reset 1000),
                step!(at 1400, cost 1 => rejected, remaining 0, retry 600, reset 600),
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
                step!(at 0, cost 1 => allowed, remaining 2, retry 0, reset 1000),
                step!(at 100, cost 1 => allowed, remaining 1, retry 0, reset 1000),
                step!(at 200, cost 1 => allowed, remaining 0, retry 0, reset 1000),
                step!(at 300, cost 2 => rejected, remaining 0, retry 800, reset 900),
                step!(at 1000, cost 0 => allowed, remaining 1, retry 0, reset 200),
                step!(at 1100, cost 2 => allowed, remaining 0, retry 0, reset 1000),
                step!(at 1100, cost 4 => rejected, remaining 0, retry -1, reset 1000),
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
    fn an_entry_alone_costs_its_gap_in_varint_bytes() {
        let mut log = SlidingLog::default();
        log.push(1_000_000, 1); // the first run: gap 0
        assert_eq!(log.bytes.len(), 1);
        for (gap, bytes) in [(1, 1), (63, 1), (64, 2), (8191, 2), (8192, 3), (1 << 20, 4)] {
            let before = log.bytes.len();
            log.push(log.newest_ms + gap, 1);
            assert_eq!(log.bytes.len() - before, bytes, "gap {gap}");
        }
        // A second entry at the same ms turns the record into gap + count.
        let before = log.bytes.len();
        log.push(log.newest_ms, 1);
        assert_eq!(log.bytes.len() - before, 1);
        assert_eq!(log.len(), 8);
    }

    #[test]
    fn dropping_the_front_keeps_the_rest_and_its_times() {
        let mut log = SlidingLog::from_runs([(10, 1), (20, 3), (700, 1), (5000, 2)]).unwrap();
        let mark = log.expired(Some(20));
        assert_eq!(mark.entries, 4);
        assert_eq!(log.kth_from(mark, 2), Some(5000));
        log.drop_front(mark);
        log.push(5000, 4);
        log.push(90_000, 1);
        let runs: Vec<_> = log.runs().collect();
        assert_eq!(runs, vec![(700, 1), (5000, 6), (90_000, 1)]);
        assert_eq!(log.len(), 8);
        // Equal to the same entries laid out from scratch.
        assert_eq!(SlidingLog::from_runs(runs), Ok(log.clone()));
        // Everything gone, then a new entry starts a new base.
        log.drop_front(log.expired(Some(90_000)));
        assert!(log.is_empty() && log.newest_ms().is_none());
        assert_eq!((log.bytes.len(), log.newest_pos), (0, 0));
        log.push(3, 2);
        assert_eq!(log.runs().collect::<Vec<_>>(), vec![(3, 2)]);
    }

    proptest::proptest! {
        /// The encoded log against a plain list of its entries, through appends and slides.
        #[test]
        fn matches_a_plain_list(steps in proptest::collection::vec(
            (0u64..4, 0u64..100_000, 1u64..5000, proptest::bool::ANY), 1..200,
        )) {
            let mut log = SlidingLog::default();
            let mut model: Vec<u64> = Vec::new();
            let mut now = 0u64;
            for (kind, gap, count, slide) in steps {
                // Gaps of every varint length, same-ms runs included.
                // Up to 3650 days, the longest gap a log can hold (6-byte records).
                now += match kind { 0 => 0, 1 => gap % 100, 2 => gap * 1000, _ => gap * 3_153_600 };
                if slide {
                    let cutoff = now.checked_sub(gap * (1 + kind * kind * 1000));
                    let mark = log.expired(cutoff);
                    let gone = model.iter().take_while(|ts| Some(**ts) <= cutoff).count();
                    proptest::prop_assert_eq!(mark.entries, gone as u64);
                    let k = (count % (model.len() as u64 - gone as u64 + 1)).max(1);
                    proptest::prop_assert_eq!(
                        log.kth_from(mark, k),
                        model.get(gone + k as usize - 1).copied()
                    );
                    log.drop_front(mark);
                    model.drain(..gone);
                }
                log.push(now, count);
                model.extend(std::iter::repeat_n(now, count as usize));
                proptest::prop_assert_eq!(log.len(), model.len() as u64);
                proptest::prop_assert_eq!(log.newest_ms(), model.last().copied());
                proptest::prop_assert_eq!(log.oldest_ms(), model.first().copied());
                let flat: Vec<u64> = log
                    .runs()
                    .flat_map(|(ts, run)| std::iter::repeat_n(ts, run as usize))
                    .collect();
                proptest::prop_assert_eq!(&flat, &model);
                proptest::prop_assert!(log.runs().all(|(_, run)| (1..=MAX_RUN).contains(&run)));
                let rebuilt = SlidingLog::from_runs(log.runs());
                proptest::prop_assert_eq!(rebuilt.as_ref(), Ok(&log));
                proptest::prop_assert!(log.heap_bytes() >= log.bytes.len());
            }
        }
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
