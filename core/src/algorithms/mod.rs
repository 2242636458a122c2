//! Pure rate-limiting cores: no Redis types in here.
//!
//! Every algorithm is a small state machine over integer milliseconds. A call hands the core the
//! stored limiter (if any), the request and the time; the core answers a [`Decision`] (the six reply
//! fields of docs/algorithms.md) and, when the request consumed something, the new state to store.
//!
//! Quantities are kept exact with *scaled units*: one request of cost is worth `P` scaled units and
//! `L` scaled units flow per millisecond, so a rate of `L` per `P` ms never needs a fraction.
//! Products such as `C·P` reach 10^12 · 3.15·10^11 and are computed in `u128`.

pub mod block;
pub mod concurrency;
pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

pub use concurrency::Leases;
pub use sliding_log::SlidingLog;

#[cfg(test)]
pub(crate) mod proptests;

/// Largest accepted `limit`, `BURST` and `COST`.
pub const MAX_AMOUNT: u64 = 1_000_000_000_000;
/// Largest accepted period: 3650 days in ms.
pub const MAX_PERIOD_MS: u64 = 3650 * 86_400_000;
/// `AT` (and every time) must stay below 2^53 ms.
pub const TIME_LIMIT_MS: u64 = 1 << 53;

/// The rate-limiting algorithms, in the order used for statistics and encodings. Leases
/// (`RATELIMIT.ACQUIRE`/`RELEASE`) are no rate and no algorithm of these: a key holding them is
/// of [`Kind::Leases`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    TokenBucket = 0,
    LeakyBucket = 1,
    FixedWindow = 2,
    SlidingWindow = 3,
    SlidingLog = 4,
    Gcra = 5,
}

impl Algorithm {
    /// The six rate limits, the algorithms CHECK, PEEK, CHECKALL, TAKE and REFUND name, indexed
    /// by their discriminant.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::Gcra,
    ];

    /// The name used on the command line and in replies.
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

    /// Parses a name case-insensitively. Every CHECK parses one, so this is no linear search: the
    /// length and first letter single out the one name to compare, and `same_name` compares it
    /// 8 bytes at a time (`eq_ignore_ascii_case` against each of the six in turn showed in the
    /// profile of every CHECK).
    #[inline(always)]
    pub fn parse(name: &[u8]) -> Option<Algorithm> {
        let candidate = match (name.len(), name.first()? | 0x20) {
            (12, b't') => Algorithm::TokenBucket,
            (12, b'l') => Algorithm::LeakyBucket,
            (12, b'f') => Algorithm::FixedWindow,
            (14, b's') => Algorithm::SlidingWindow,
            (11, b's') => Algorithm::SlidingLog,
            (4, b'g') => Algorithm::Gcra,
            _ => return None,
        };
        same_name(name, candidate.name().as_bytes()).then_some(candidate)
    }

    /// Decodes the discriminant written by [`Algorithm::index`].
    pub fn from_index(index: u8) -> Option<Algorithm> {
        Algorithm::ALL.get(usize::from(index)).copied()
    }

    /// The discriminant, for statistics tables and encodings.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Buckets and GCRA take a `BURST` capacity; windows and the log do not.
    pub fn is_bucket(self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra
        )
    }
}

/// What a key holds, and what a policy limits: a rate of one of the [`Algorithm`]s, or leases in
/// flight (docs/algorithms.md, "Concurrency"). Only the places that take both (statistics, the
/// stored encodings, policies, key introspection) name a `Kind`; the rate commands name an
/// [`Algorithm`] and the lease commands [`concurrency`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Rate(Algorithm),
    /// Leases in flight (`RATELIMIT.ACQUIRE`/`RELEASE`), not a rate: CHECK refuses it.
    Leases,
}

impl Kind {
    /// Every kind a key can hold, indexed by [`Kind::index`]: the six rate algorithms in
    /// [`Algorithm::ALL`] order, then leases (statistics and encodings).
    pub const EVERY: [Kind; 7] = [
        Kind::Rate(Algorithm::TokenBucket),
        Kind::Rate(Algorithm::LeakyBucket),
        Kind::Rate(Algorithm::FixedWindow),
        Kind::Rate(Algorithm::SlidingWindow),
        Kind::Rate(Algorithm::SlidingLog),
        Kind::Rate(Algorithm::Gcra),
        Kind::Leases,
    ];

    /// The name used on the command line and in replies (`concurrency` for leases).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Rate(algorithm) => algorithm.name(),
            Kind::Leases => "concurrency",
        }
    }

    /// Parses a name case-insensitively: an algorithm's, or `concurrency`.
    #[inline(always)]
    pub fn parse(name: &[u8]) -> Option<Kind> {
        match Algorithm::parse(name) {
            Some(algorithm) => Some(Kind::Rate(algorithm)),
            None => same_name(name, b"concurrency").then_some(Kind::Leases),
        }
    }

    /// The index in [`Kind::EVERY`]: an algorithm's discriminant, 6 for leases (statistics
    /// tables and encodings).
    pub fn index(self) -> usize {
        match self {
            Kind::Rate(algorithm) => algorithm.index(),
            Kind::Leases => Algorithm::ALL.len(),
        }
    }

    /// Decodes the index written by [`Kind::index`].
    pub fn from_index(index: u8) -> Option<Kind> {
        Kind::EVERY.get(usize::from(index)).copied()
    }

    /// Buckets and GCRA take a `BURST` capacity; windows, the log and leases do not.
    pub fn is_bucket(self) -> bool {
        matches!(self, Kind::Rate(algorithm) if algorithm.is_bucket())
    }
}

impl From<Algorithm> for Kind {
    fn from(algorithm: Algorithm) -> Kind {
        Kind::Rate(algorithm)
    }
}

/// `name` equals `lower`, an algorithm's name (1 to 16 bytes of lowercase ASCII letters and
/// `-`), ignoring ASCII case. Eight bytes at a time: where `lower` has a letter (bit 0x40 set) the
/// case bit 0x20 of `name` is ignored, and only there, so `-` matches `-` alone.
#[inline(always)]
fn same_name(name: &[u8], lower: &[u8]) -> bool {
    fn word(bytes: &[u8]) -> u64 {
        let mut padded = [0u8; 8];
        padded[..bytes.len()].copy_from_slice(bytes);
        u64::from_le_bytes(padded)
    }
    fn same(name: u64, lower: u64) -> bool {
        name | ((lower & 0x4040_4040_4040_4040) >> 1) == lower
    }
    let n = lower.len();
    if name.len() != n || !(1..=16).contains(&n) {
        return false;
    }
    if n <= 8 {
        return same(word(name), word(lower));
    }
    // The first and the last 8 bytes: together they cover every byte.
    same(word(&name[..8]), word(&lower[..8])) && same(word(&name[n - 8..]), word(&lower[n - 8..]))
}

/// The parameters of a limiter, validated against the bounds of docs/algorithms.md when built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    /// `L`: requests allowed per period; also the flow of scaled units per ms.
    pub limit: u64,
    /// `P`: the period in ms; one request is worth `P` scaled units.
    pub period_ms: u64,
    /// `C`: a bucket's capacity in requests (equal to `limit` for windows and the log).
    pub capacity: u64,
}

/// Why a set of parameters was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamsError {
    Limit,
    Period,
    Burst,
}

impl Params {
    /// Builds parameters, refusing values outside the bounds of docs/algorithms.md.
    /// `burst` is `None` for windows and the log (their capacity is the limit).
    pub fn new(limit: u64, period_ms: u64, burst: Option<u64>) -> Result<Params, ParamsError> {
        if limit == 0 || limit > MAX_AMOUNT {
            return Err(ParamsError::Limit);
        }
        if period_ms == 0 || period_ms > MAX_PERIOD_MS {
            return Err(ParamsError::Period);
        }
        let capacity = burst.unwrap_or(limit);
        if capacity == 0 || capacity > MAX_AMOUNT {
            return Err(ParamsError::Burst);
        }
        Ok(Params {
            limit,
            period_ms,
            capacity,
        })
    }

    /// `C·P`: a full bucket in scaled units.
    pub fn capacity_scaled(&self) -> u128 {
        u128::from(self.capacity) * u128::from(self.period_ms)
    }

    /// `c·P`: a cost in scaled units.
    pub fn cost_scaled(&self, cost: u64) -> u128 {
        u128::from(cost) * u128::from(self.period_ms)
    }

    /// Start of the epoch-aligned window holding `t`.
    pub fn window_start(&self, t_ms: u64) -> u64 {
        t_ms - t_ms % self.period_ms
    }
}

/// The six reply fields, in the order of docs/algorithms.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Decision {
    /// The request is admitted (and its cost consumed).
    pub allowed: bool,
    /// The most `remaining` can ever be: `C` for buckets, `L` for windows and the log.
    pub limit: u64,
    /// How much cost could still be admitted right now, after this decision.
    pub remaining: u64,
    /// 0 when allowed; else the least ms until the same request is admitted; -1 if it never can.
    pub retry_after_ms: i64,
    /// ms until the key's state is equivalent to a fresh key's (0: it already is).
    pub reset_after_ms: u64,
    /// Leaky bucket: ms to wait before processing an admitted request; 0 otherwise.
    pub delay_ms: u64,
}

impl Decision {
    /// The reply as the six integers of the RESP2 array.
    pub fn to_array(&self) -> [i64; 6] {
        [
            i64::from(self.allowed),
            saturating_i64(self.limit),
            saturating_i64(self.remaining),
            self.retry_after_ms,
            saturating_i64(self.reset_after_ms),
            saturating_i64(self.delay_ms),
        ]
    }
}

/// One call: the parameters named on it, its cost and the time of the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub algorithm: Algorithm,
    pub params: Params,
    /// `c`: the request's weight; 0 asks without consuming.
    pub cost: u64,
    /// The call time (the server's clock or `AT`), before `max(call, last)`.
    pub now_ms: u64,
}

/// The per-algorithm part of a stored limiter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// `tokens` in scaled units, `0 ..= C·P`.
    TokenBucket { tokens_scaled: u128 },
    /// `level` (queued work) in scaled units, `0 ..= C·P`.
    LeakyBucket { level_scaled: u128 },
    /// The count of the window starting at `window_start_ms`.
    FixedWindow { window_start_ms: u64, count: u64 },
    /// The counts of the window starting at `window_start_ms` and of the one before it.
    SlidingWindow {
        window_start_ms: u64,
        current: u64,
        previous: u64,
    },
    /// The exact multiset of admitted timestamps.
    SlidingLog(SlidingLog),
    /// How far the theoretical arrival time is ahead of `last`, in scaled units, `0 ..= C·P`.
    Gcra { ahead_scaled: u128 },
    /// The leases, none expired at `last` (boxed: the set is larger than the other states).
    Concurrency(Box<Leases>),
}

impl State {
    /// The state holds memory of its own (a log's entries, a lease set): dropping it frees that.
    /// Exhaustive, so a new kind of state says whether it does.
    #[inline(always)]
    pub fn owns_heap(&self) -> bool {
        match self {
            State::TokenBucket { .. }
            | State::LeakyBucket { .. }
            | State::FixedWindow { .. }
            | State::SlidingWindow { .. }
            | State::Gcra { .. } => false,
            State::SlidingLog(_) | State::Concurrency(_) => true,
        }
    }
}

/// A stored limiter: its parameters, the time of its last consuming call and its state at that time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limiter {
    pub params: Params,
    /// `last`: the time of the last consuming call; calls are evaluated at `max(call, last)`.
    pub last_ms: u64,
    pub state: State,
    /// The end of a penalty block (`BLOCK`, see [`block`]): every call before it is rejected.
    /// 0 when the key was never blocked, or a consuming call since cleared it.
    pub blocked_until_ms: u64,
}

impl State {
    /// What this state limits: its algorithm's rate, or leases.
    pub fn kind(&self) -> Kind {
        Kind::Rate(match self {
            State::TokenBucket { .. } => Algorithm::TokenBucket,
            State::LeakyBucket { .. } => Algorithm::LeakyBucket,
            State::FixedWindow { .. } => Algorithm::FixedWindow,
            State::SlidingWindow { .. } => Algorithm::SlidingWindow,
            State::SlidingLog(_) => Algorithm::SlidingLog,
            State::Gcra { .. } => Algorithm::Gcra,
            State::Concurrency(_) => return Kind::Leases,
        })
    }
}

impl Limiter {
    /// What this limiter holds: a rate of one algorithm, or leases.
    pub fn kind(&self) -> Kind {
        self.state.kind()
    }

    /// ms after `last` at which the state becomes equivalent to a fresh key's: the key's expiry is
    /// `last + reset_after`.
    pub fn reset_after_ms(&self) -> u64 {
        let p = &self.params;
        let t = self.last_ms;
        match &self.state {
            State::TokenBucket { tokens_scaled } => token_bucket::reset_after(p, *tokens_scaled),
            State::LeakyBucket { level_scaled } => leaky_bucket::reset_after(p, *level_scaled),
            State::FixedWindow {
                window_start_ms,
                count,
            } => fixed_window::reset_after(p, *window_start_ms, *count, t),
            State::SlidingWindow {
                window_start_ms,
                current,
                previous,
            } => sliding_window::reset_after(p, *window_start_ms, *current, *previous, t),
            State::SlidingLog(log) => log.reset_after(p, t),
            State::Gcra { ahead_scaled } => to_u64(ceil_div(*ahead_scaled, u128::from(p.limit))),
            State::Concurrency(leases) => concurrency::reset_after(leases, t),
        }
    }

    /// The absolute time (ms) at which this stored key expires.
    pub fn expires_at_ms(&self) -> u64 {
        self.last_ms
            .saturating_add(self.reset_after_ms())
            .max(self.blocked_until_ms)
    }

    /// Blocked at `t_ms`: a block that has not ended.
    pub fn blocked_at(&self, t_ms: u64) -> bool {
        t_ms < self.blocked_until_ms
    }
}

/// The answer to one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub decision: Decision,
    /// The evaluation time `t = max(call, last)`.
    pub t_ms: u64,
    /// The call consumed cost: the key must be written (and replicated).
    pub consumed: bool,
}

impl Outcome {
    /// The outcome of a call of `cost` decided at `t_ms`: it consumed if admitted with a cost.
    pub(crate) fn new(decision: Decision, t_ms: u64, cost: u64) -> Outcome {
        Outcome {
            consumed: decision.allowed && cost > 0,
            decision,
            t_ms,
        }
    }
}

/// The key holds another algorithm than the call names, or leases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlgorithmMismatch {
    pub stored: Kind,
}

/// What a call did to the stored value. A limiter it created is written into the caller's
/// `created` slot rather than returned with this: on every CHECK's path a limiter moved through
/// the results would be copied at each step (`make profile`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    /// Nothing changed.
    Nothing,
    /// `stored` was updated in place.
    Updated,
    /// The key was absent (or equivalent to fresh): the limiter to store is in `created`.
    Created,
}

/// Evaluates `request` against the stored limiter (`None` when the key is absent).
///
/// With `commit` and an admitted request of positive cost the state is written: in place when a
/// limiter was stored, else into `created` ([`Write::Created`]; `created` is left as it is
/// otherwise). Without `commit` nothing is written and the decision is exactly the one a
/// committing call would answer (PEEK equals the CHECK that follows).
pub fn check(
    stored: Option<&mut Limiter>,
    request: &Request,
    commit: bool,
    created: &mut Option<Limiter>,
) -> Result<(Outcome, Write), AlgorithmMismatch> {
    if let Some(limiter) = &stored {
        let kind = limiter.kind();
        if kind != Kind::Rate(request.algorithm) {
            return Err(AlgorithmMismatch { stored: kind });
        }
    }
    let result = match request.algorithm {
        Algorithm::TokenBucket => {
            drive::<token_bucket::TokenBucket>(stored, request, commit, created)
        }
        Algorithm::LeakyBucket => {
            drive::<leaky_bucket::LeakyBucket>(stored, request, commit, created)
        }
        Algorithm::FixedWindow => {
            drive::<fixed_window::FixedWindow>(stored, request, commit, created)
        }
        Algorithm::SlidingWindow => {
            drive::<sliding_window::SlidingWindow>(stored, request, commit, created)
        }
        Algorithm::SlidingLog => sliding_log::check(stored, request, commit, created),
        Algorithm::Gcra => drive::<gcra::Gcra>(stored, request, commit, created),
    };
    Ok(result)
}

/// The largest grant `g <= max` that `admits` accepts (`RATELIMIT.TAKE`), 0 when it accepts none.
/// `admits(g)` answers whether a call of cost `g` is admitted now (a PEEK): admission is monotone
/// in the cost for every algorithm (a cost that passes leaves room for any smaller one), so a
/// binary search finds it in at most 41 questions for `max` up to 10^12; the first asks for
/// `max` itself, the common case of a grant in full. The error is `admits`'s, passed on.
pub fn largest_grant<E>(
    max: u64,
    mut admits: impl FnMut(u64) -> Result<bool, E>,
) -> Result<u64, E> {
    if max == 0 || admits(max)? {
        return Ok(max);
    }
    // Invariant: `granted` is admitted (0 always is), `refused` is not.
    let (mut granted, mut refused) = (0, max);
    while refused - granted > 1 {
        let middle = granted + (refused - granted) / 2;
        if admits(middle)? {
            granted = middle;
        } else {
            refused = middle;
        }
    }
    Ok(granted)
}

/// The `delay_ms` a TAKE of `granted` units replies where it is not its CHECK's (`None`: the
/// CHECK's own, its first unit's wait): the wait of the last granted unit. For a leaky bucket
/// granting more than one unit that is the queue ahead of the last once the first `granted - 1`
/// are queued, the `reset_after_ms` of a PEEK of cost `granted - 1` at the same moment
/// (`peek(cost)` answers one, nothing stored). So a client handing the units out one by one never
/// promises a unit a shorter wait than a CHECK of it would have given. The error is `peek`'s.
pub fn last_unit_delay_ms<E>(
    algorithm: Algorithm,
    granted: u64,
    peek: impl FnOnce(u64) -> Result<Decision, E>,
) -> Result<Option<u64>, E> {
    if algorithm != Algorithm::LeakyBucket || granted <= 1 {
        return Ok(None);
    }
    Ok(Some(peek(granted - 1)?.reset_after_ms))
}

#[cfg(test)]
mod largest_grant_tests;

/// A fixed-size algorithm: its state is `Copy` and the whole call is computed on copies.
pub(crate) trait FixedSize {
    type State: Copy + PartialEq;
    /// The state of a key that does not exist.
    fn fresh(params: &Params, t_ms: u64) -> Self::State;
    /// The state brought from `last` to `t` under the parameters it was stored with.
    fn advance(state: Self::State, params: &Params, last_ms: u64, t_ms: u64) -> Self::State;
    /// The state is equivalent to a fresh key's (such a state is never stored).
    fn is_fresh(state: &Self::State, params: &Params) -> bool;
    /// The state carried over from the stored parameters to the call's.
    fn carry_over(state: Self::State, from: &Params, to: &Params, t_ms: u64) -> Self::State;
    /// The decision at `t` and the state after it (meaningful only when admitted).
    fn decide(state: Self::State, params: &Params, cost: u64, t_ms: u64)
        -> (Decision, Self::State);
    /// The state with up to `cost` units of what it consumed given back (see [`refund`]).
    fn refund(state: Self::State, params: &Params, cost: u64) -> Self::State;
    fn load(state: &State) -> Option<Self::State>;
    fn store(state: Self::State) -> State;
}

/// What [`refund`] did to the stored limiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refunded {
    /// Nothing was given back (a missing or fresh key, or nothing left to give): nothing changed.
    Nothing,
    /// The stored limiter was changed in place.
    Updated,
    /// The key is now equivalent to a fresh one: it is to be deleted.
    Emptied,
}

/// Gives back up to `request.cost` units of what earlier calls consumed on `stored`, under the
/// parameters it holds (a refund never changes them), at `t = max(call, last)`:
/// - token bucket, gcra: `cost` tokens back, never above capacity (gcra: the TAT moves back by
///   `cost` emission intervals, never below `t`);
/// - leaky bucket: the level drops by `cost`, never below 0;
/// - fixed and sliding window: the current window's count drops by `cost`, never below 0;
/// - sliding log: the `cost` newest entries still in the window are removed.
///
/// The decision is what a non-committing call of `request`'s parameters with `COST 0` answers
/// right after (`t` is its time). A refund that gives back nothing changes nothing. A refund
/// does not lift a block (see [`block`]): a blocked key whose state it leaves fresh keeps that
/// state until the block ends, and answers blocked.
pub fn refund(
    stored: Option<&mut Limiter>,
    request: &Request,
) -> Result<(Outcome, Refunded), AlgorithmMismatch> {
    let Some(limiter) = stored else {
        let peek = Request {
            cost: 0,
            ..*request
        };
        // A PEEK (`commit` false) creates nothing.
        return Ok((check(None, &peek, false, &mut None)?.0, Refunded::Nothing));
    };
    let kind = limiter.kind();
    if kind != Kind::Rate(request.algorithm) {
        return Err(AlgorithmMismatch { stored: kind });
    }
    let t_ms = request.now_ms.max(limiter.last_ms);
    let refunded = match request.algorithm {
        Algorithm::TokenBucket => {
            give_back::<token_bucket::TokenBucket>(limiter, request.cost, t_ms)
        }
        Algorithm::LeakyBucket => {
            give_back::<leaky_bucket::LeakyBucket>(limiter, request.cost, t_ms)
        }
        Algorithm::FixedWindow => {
            give_back::<fixed_window::FixedWindow>(limiter, request.cost, t_ms)
        }
        Algorithm::SlidingWindow => {
            give_back::<sliding_window::SlidingWindow>(limiter, request.cost, t_ms)
        }
        Algorithm::SlidingLog => sliding_log::refund(limiter, request.cost, t_ms),
        Algorithm::Gcra => give_back::<gcra::Gcra>(limiter, request.cost, t_ms),
    };
    let peek = Request {
        cost: 0,
        now_ms: t_ms,
        ..*request
    };
    let after = match refunded {
        Refunded::Emptied => None,
        _ => Some(limiter),
    };
    let (outcome, _, _) = block::check_blocking(after, &peek, false, None, &mut None)?;
    Ok((outcome, refunded))
}

/// [`refund`] of a fixed-size algorithm, at `t_ms`.
fn give_back<A: FixedSize>(limiter: &mut Limiter, cost: u64, t_ms: u64) -> Refunded {
    let params = limiter.params;
    let Some(state) = A::load(&limiter.state) else {
        return Refunded::Nothing;
    };
    let state = A::advance(state, &params, limiter.last_ms, t_ms);
    if A::is_fresh(&state, &params) {
        return Refunded::Nothing;
    }
    let refunded = A::refund(state, &params, cost);
    if refunded == state {
        return Refunded::Nothing;
    }
    // A refund does not lift a block: a blocked key keeps its state, fresh or not.
    if A::is_fresh(&refunded, &params) && !limiter.blocked_at(t_ms) {
        return Refunded::Emptied;
    }
    limiter.last_ms = t_ms;
    limiter.state = A::store(refunded);
    Refunded::Updated
}

fn drive<A: FixedSize>(
    stored: Option<&mut Limiter>,
    request: &Request,
    commit: bool,
    created: &mut Option<Limiter>,
) -> (Outcome, Write) {
    let new_params = &request.params;
    let (t_ms, carried) = match stored.as_deref() {
        Some(limiter) => {
            let t_ms = request.now_ms.max(limiter.last_ms);
            // A stored limiter always holds its own algorithm's state (checked by the caller).
            let state = A::load(&limiter.state)
                .map(|state| A::advance(state, &limiter.params, limiter.last_ms, t_ms));
            let carried = match state {
                Some(state) if !A::is_fresh(&state, &limiter.params) => {
                    A::carry_over(state, &limiter.params, new_params, t_ms)
                }
                _ => A::fresh(new_params, t_ms),
            };
            (t_ms, carried)
        }
        None => (request.now_ms, A::fresh(new_params, request.now_ms)),
    };
    let (decision, after) = A::decide(carried, new_params, request.cost, t_ms);
    let outcome = Outcome::new(decision, t_ms, request.cost);
    if !(commit && outcome.consumed) {
        return (outcome, Write::Nothing);
    }
    let limiter = Limiter {
        params: *new_params,
        last_ms: t_ms,
        state: A::store(after),
        // Consuming: any block had ended.
        blocked_until_ms: 0,
    };
    match stored {
        Some(slot) => {
            *slot = limiter;
            (outcome, Write::Updated)
        }
        None => {
            *created = Some(limiter);
            (outcome, Write::Created)
        }
    }
}

/// `⌈a / b⌉` for `b > 0`. Inlined, with one hardware division when both fit a word (a `u128`
/// division is a call; the scaled quantities of most limits fit a word).
#[inline(always)]
pub fn ceil_div(a: u128, b: u128) -> u128 {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) => u128::from(a.div_ceil(b)),
        _ => a.div_ceil(b),
    }
}

/// `⌊a / b⌋` for `b > 0`, as [`ceil_div`] computes it.
#[inline(always)]
pub fn floor_div(a: u128, b: u128) -> u128 {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) => u128::from(a / b),
        _ => a / b,
    }
}

/// A `u128` quantity of ms or requests as `u64`, saturating (only reachable beyond the bounds
/// of docs/algorithms.md).
pub fn to_u64(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
pub(crate) mod testing;
