//! The crate's values: limits, policies, decisions and errors. No I/O.

use std::fmt;
use std::time::Duration;

pub use redis_ratelimit_core::algorithms::Algorithm;
use redis_ratelimit_core::algorithms::{MAX_AMOUNT, MAX_PERIOD_MS, TIME_LIMIT_MS};
use redis_ratelimit_core::parse::parse_period;

/// What went wrong with a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The caller's mistake, found before anything was sent: `argument` names what was passed
    /// (`limit`, `period`, `cost`, `key`...), `message` says what is wrong with it.
    InvalidArgument {
        argument: &'static str,
        message: String,
    },
    /// Redis answered this call with an error reply that is the caller's (`WRONGTYPE`, a key
    /// holding another algorithm, `no such policy`): the text as Redis (or the in-process
    /// fallback, in the module's words) gave it.
    Server(String),
    /// Redis is down, refuses (`LOADING`, `BUSY`, `READONLY`...), did not answer within the
    /// timeout, or the breaker is open, and the call has no decision to give instead
    /// (`OnError::Closed`, or a call that decides nothing: `reset`, `release`, policies).
    Unavailable(String),
    /// A reply of a shape this crate does not know (another module of the same name?).
    Protocol(String),
    /// A lease (`RateLimiter::lease`) was refused: the decision says when to retry.
    RateLimited(Box<crate::Decision>),
}

impl Error {
    pub(crate) fn invalid(argument: &'static str, message: impl Into<String>) -> Error {
        Error::InvalidArgument {
            argument,
            message: message.into(),
        }
    }

    /// Whether Redis could not decide (down, stalled, refusing, or the breaker open).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Unavailable(_))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument { argument, message } => write!(f, "{argument}: {message}"),
            Error::Server(text) => write!(f, "{text}"),
            Error::Unavailable(why) => write!(f, "Redis unavailable ({why})"),
            Error::Protocol(what) => write!(f, "unexpected reply: {what}"),
            Error::RateLimited(decision) => write!(
                f,
                "rate limited: retry after {} ms",
                decision.retry_after_ms
            ),
        }
    }
}

impl std::error::Error for Error {}

/// A duration as the module takes it: `"1m"`, `"250ms"` (units `ms`, `s`, `m`, `h`, `d`,
/// case-insensitive), a [`Duration`] of whole ms, or a number of ms; 1 ms to 3650 days.
#[derive(Clone, Copy, Debug)]
pub enum Period<'a> {
    Text(&'a str),
    Ms(u64),
    Duration(Duration),
}

impl<'a> From<&'a str> for Period<'a> {
    fn from(text: &'a str) -> Self {
        Period::Text(text)
    }
}

impl<'a> From<&'a String> for Period<'a> {
    fn from(text: &'a String) -> Self {
        Period::Text(text)
    }
}

impl From<u64> for Period<'_> {
    fn from(ms: u64) -> Self {
        Period::Ms(ms)
    }
}

impl From<Duration> for Period<'_> {
    fn from(duration: Duration) -> Self {
        Period::Duration(duration)
    }
}

impl Period<'_> {
    /// The period in ms, or the error naming `what` (the argument).
    pub(crate) fn ms(self, what: &'static str) -> Result<u64, Error> {
        let ms = match self {
            Period::Text(text) => parse_period(text.trim().as_bytes()).ok_or_else(|| {
                Error::invalid(
                    what,
                    format!(
                        "must be an integer of ms or with a unit ms, s, m, h or d (250ms, 1s, \
                         15m, 1h, 1d), from 1 ms to 3650 days, not {text:?}"
                    ),
                )
            })?,
            Period::Ms(ms) => ms,
            Period::Duration(duration) => {
                if duration.subsec_nanos() % 1_000_000 != 0 {
                    return Err(Error::invalid(
                        what,
                        format!("must be whole milliseconds, not {duration:?}"),
                    ));
                }
                u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
            }
        };
        if !(1..=MAX_PERIOD_MS).contains(&ms) {
            return Err(Error::invalid(
                what,
                format!("must be from 1 ms to 3650 days, not {ms} ms"),
            ));
        }
        Ok(ms)
    }
}

pub(crate) fn amount(value: u64, what: &'static str, low: u64) -> Result<u64, Error> {
    if !(low..=MAX_AMOUNT).contains(&value) {
        return Err(Error::invalid(
            what,
            format!("must be an integer from {low} to {MAX_AMOUNT}, not {value}"),
        ));
    }
    Ok(value)
}

pub(crate) fn check_at(at: Option<u64>) -> Result<(), Error> {
    match at {
        Some(at) if at >= TIME_LIMIT_MS => Err(Error::invalid(
            "at",
            format!("must be ms since the Unix epoch below 2^53, not {at}"),
        )),
        _ => Ok(()),
    }
}

pub(crate) fn check_key(key: &str) -> Result<(), Error> {
    if key.is_empty() {
        return Err(Error::invalid("key", "must not be empty"));
    }
    Ok(())
}

/// A limit given inline: `Limit::new(Algorithm::SlidingWindow, 100, "1m")?`, with
/// [`burst`](Limit::burst), [`block`](Limit::block) and [`batch`](Limit::batch). Checked when
/// it is made: a bad limit is an [`Error::InvalidArgument`] before any call.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    algorithm: Algorithm,
    limit: u64,
    period_ms: u64,
    burst: Option<u64>,
    block_ms: Option<u64>,
    batch_ms: Option<u64>,
    batch_max: Option<u64>,
    /// The module's words for it (`algorithm limit period [BURST c] [BLOCK d]`), built once.
    args: Vec<String>,
    /// The same words as one argument, separated by single spaces (a module that takes a spec
    /// as one argument: `COMMAND INFO RATELIMIT.CHECK` arity -3).
    spec: [String; 1],
}

impl Limit {
    /// `limit` requests (1 to 10^12) per `period` (1 ms to 3650 days) with `algorithm`.
    pub fn new<'a>(
        algorithm: Algorithm,
        limit: u64,
        period: impl Into<Period<'a>>,
    ) -> Result<Limit, Error> {
        let mut made = Limit {
            algorithm,
            limit: amount(limit, "limit", 1)?,
            period_ms: period.into().ms("period")?,
            burst: None,
            block_ms: None,
            batch_ms: None,
            batch_max: None,
            args: Vec::new(),
            spec: [String::new()],
        };
        made.words();
        Ok(made)
    }

    /// A bucket's or GCRA's capacity (default: the limit), 1 to 10^12; an error for the windows
    /// and the log.
    pub fn burst(mut self, burst: u64) -> Result<Limit, Error> {
        if !self.algorithm.is_bucket() {
            return Err(Error::invalid(
                "burst",
                format!(
                    "applies only to token-bucket, leaky-bucket and gcra, not {}",
                    self.algorithm.name()
                ),
            ));
        }
        self.burst = Some(amount(burst, "burst", 1)?);
        self.words();
        Ok(self)
    }

    /// A penalty block: whoever exceeds the limit is refused for this long.
    pub fn block<'a>(mut self, block: impl Into<Period<'a>>) -> Result<Limit, Error> {
        self.block_ms = Some(block.into().ms("block")?);
        self.words();
        Ok(self)
    }

    /// Decide `check`s from units taken ahead with `RATELIMIT.TAKE` and held for `hold` (e.g.
    /// `"50ms"`), at most [`batch_max`](Limit::batch_max) units at once (default: the limit).
    /// See the README's "Client-side decisions" for the bound this keeps.
    pub fn batch<'a>(mut self, hold: impl Into<Period<'a>>) -> Result<Limit, Error> {
        self.batch_ms = Some(hold.into().ms("batch")?);
        Ok(self)
    }

    /// The most units one batch holds (needs [`batch`](Limit::batch)).
    pub fn batch_max(mut self, most: u64) -> Result<Limit, Error> {
        if self.batch_ms.is_none() {
            return Err(Error::invalid(
                "batch_max",
                "needs batch (a hold time such as \"50ms\") first",
            ));
        }
        self.batch_max = Some(amount(most, "batch_max", 1)?);
        Ok(self)
    }

    fn words(&mut self) {
        let mut words = vec![
            self.algorithm.name().to_string(),
            self.limit.to_string(),
            format!("{}ms", self.period_ms),
        ];
        if let Some(burst) = self.burst {
            words.push("BURST".into());
            words.push(burst.to_string());
        }
        if let Some(block) = self.block_ms {
            words.push("BLOCK".into());
            words.push(format!("{block}ms"));
        }
        self.spec = [words.join(" ")];
        self.args = words;
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
    /// Requests per period.
    pub fn limit(&self) -> u64 {
        self.limit
    }
    pub fn period_ms(&self) -> u64 {
        self.period_ms
    }
    pub fn burst_value(&self) -> Option<u64> {
        self.burst
    }
    pub fn block_ms(&self) -> Option<u64> {
        self.block_ms
    }
    /// How long batch units are held, `None` without batches.
    pub fn batch_ms(&self) -> Option<u64> {
        self.batch_ms
    }
    /// The most units one batch holds: `batch_max`, by default the limit.
    pub fn batch_limit(&self) -> u64 {
        self.batch_max.unwrap_or(self.limit)
    }
    /// The most `remaining` can be: the burst for the buckets and GCRA, else the limit.
    pub fn capacity(&self) -> u64 {
        self.burst.unwrap_or(self.limit)
    }
    /// The module's words: `algorithm limit period [BURST c] [BLOCK d]`.
    pub fn args(&self) -> &[String] {
        &self.args
    }
    /// The module's words as one argument: `["algorithm limit period [BURST c] [BLOCK d]"]`.
    pub fn spec_arg(&self) -> &[String] {
        &self.spec
    }
}

/// A limit defined on the server by name (`RATELIMIT.POLICY SET`): `Policy::new("api")?`.
///
/// `fallback`: the inline [`Limit`] used where policies do not exist (the Functions library has
/// none) and, with a warning logged once, when the server has no policy of that name. Without
/// one, those calls are [`Error::Server`] (`no such policy`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    name: String,
    fallback: Option<Limit>,
}

impl Policy {
    /// A policy name: 1 to 64 characters of `A-Z a-z 0-9 _ - .`.
    pub fn new(name: impl Into<String>) -> Result<Policy, Error> {
        let name = name.into();
        check_policy_name(&name)?;
        Ok(Policy {
            name,
            fallback: None,
        })
    }

    /// The limit used where the server has no such policy.
    pub fn fallback(mut self, limit: Limit) -> Policy {
        self.fallback = Some(limit);
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn fallback_limit(&self) -> Option<&Limit> {
        self.fallback.as_ref()
    }
}

pub(crate) fn check_policy_name(name: &str) -> Result<(), Error> {
    let good = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if !good {
        return Err(Error::invalid(
            "name",
            format!(
                "a policy name is 1 to 64 characters of A-Z, a-z, 0-9, '_', '-' and '.', not {name:?}"
            ),
        ));
    }
    Ok(())
}

/// A [`Limit`] or a [`Policy`]: what every call limits with.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LimitSpec {
    Limit(Limit),
    Policy(Policy),
}

impl From<Limit> for LimitSpec {
    fn from(limit: Limit) -> Self {
        LimitSpec::Limit(limit)
    }
}

impl From<Policy> for LimitSpec {
    fn from(policy: Policy) -> Self {
        LimitSpec::Policy(policy)
    }
}

/// What the calls take as a limit: a [`Limit`], a [`Policy`] or a [`LimitSpec`], by reference.
pub trait Spec {
    fn spec(&self) -> SpecRef<'_>;
}

/// A borrowed [`LimitSpec`].
#[derive(Clone, Copy, Debug)]
pub enum SpecRef<'a> {
    Limit(&'a Limit),
    Policy(&'a Policy),
}

impl Spec for Limit {
    fn spec(&self) -> SpecRef<'_> {
        SpecRef::Limit(self)
    }
}

impl Spec for Policy {
    fn spec(&self) -> SpecRef<'_> {
        SpecRef::Policy(self)
    }
}

impl Spec for LimitSpec {
    fn spec(&self) -> SpecRef<'_> {
        match self {
            LimitSpec::Limit(limit) => SpecRef::Limit(limit),
            LimitSpec::Policy(policy) => SpecRef::Policy(policy),
        }
    }
}

impl<S: Spec + ?Sized> Spec for &S {
    fn spec(&self) -> SpecRef<'_> {
        (**self).spec()
    }
}

impl SpecRef<'_> {
    /// The period known without asking the server (a Limit's, a Policy's fallback's), else 0.
    pub(crate) fn known_period_ms(&self) -> u64 {
        match self {
            SpecRef::Limit(limit) => limit.period_ms(),
            SpecRef::Policy(policy) => policy.fallback.as_ref().map_or(0, |f| f.period_ms()),
        }
    }
}

/// A call's weight and time: `1` (a cost), `Call::cost(5)`, `Call::cost(1).at(unix_ms)`.
/// For [`take`](crate::RateLimiter::take) the cost is the `MAX` to grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    /// The request's weight: 0 to 10^12 (0 asks without consuming), default 1.
    pub cost: u64,
    /// Evaluate at this time (ms since the Unix epoch, the module's `AT`), `None`: the server's
    /// clock.
    pub at: Option<u64>,
}

impl Call {
    pub fn cost(cost: u64) -> Call {
        Call { cost, at: None }
    }

    /// The same call at `unix_ms` (the module's `AT`).
    pub fn at(self, unix_ms: u64) -> Call {
        Call {
            at: Some(unix_ms),
            ..self
        }
    }
}

impl Default for Call {
    fn default() -> Self {
        Call::cost(1)
    }
}

impl From<u64> for Call {
    fn from(cost: u64) -> Self {
        Call::cost(cost)
    }
}

/// Who made a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// The module (`RATELIMIT.*`).
    Module,
    /// The Functions library (`FCALL ratelimit_*`).
    Library,
    /// Redis unavailable and `OnError::Open`: admitted, every number 0.
    Error,
    /// A refusal answered again by the denial cache.
    Cache,
    /// Admitted from a batch's units, without a round trip.
    Local,
    /// Decided in process by the core crate's algorithms (`OnError::Local`).
    Fallback,
}

impl Source {
    /// `"module"`, `"library"`, `"error"`, `"cache"`, `"local"` or `"fallback"`.
    pub fn name(self) -> &'static str {
        match self {
            Source::Module => "module",
            Source::Library => "library",
            Source::Error => "error",
            Source::Cache => "cache",
            Source::Local => "local",
            Source::Fallback => "fallback",
        }
    }

    /// Redis decided (the module or the library).
    pub fn is_server(self) -> bool {
        matches!(self, Source::Module | Source::Library)
    }
}

/// What was decided for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Admitted (and its cost consumed). For `take`: at least one unit granted.
    pub allowed: bool,
    /// The most `remaining` can be: the capacity for the buckets and GCRA, else the limit.
    pub limit: u64,
    /// How much cost could still pass now.
    pub remaining: u64,
    /// 0 when allowed; else the ms until the same request would pass (-1: never, its cost is
    /// above the limit).
    pub retry_after_ms: i64,
    /// ms until the key is as good as new.
    pub reset_after_ms: u64,
    /// The leaky bucket's wait before processing (a `take`'s: the last granted unit's).
    pub delay_ms: u64,
    pub source: Source,
    /// A shadow policy admitted what enforcement would have refused.
    pub shadow_rejected: bool,
    /// The limit's period (a lease's duration) in ms, 0 where unknown (for `RateLimit-Policy`'s
    /// `w`).
    pub period_ms: u64,
    /// Units granted: a `take`'s grant; for other calls the cost when allowed, else 0.
    pub granted: u64,
}

impl Decision {
    /// What `OnError::Open` answers: admitted, every number 0, `Source::Error`.
    pub(crate) fn error(period_ms: u64, granted: u64) -> Decision {
        Decision {
            allowed: true,
            limit: 0,
            remaining: 0,
            retry_after_ms: 0,
            reset_after_ms: 0,
            delay_ms: 0,
            source: Source::Error,
            shadow_rejected: false,
            period_ms,
            granted,
        }
    }
}

/// What [`check_all`](crate::RateLimiter::check_all) decided: the overall decision (admitted only
/// if every limit admits; the least remaining; the longest waits) and each limit's own, in order.
/// Derefs to the overall [`Decision`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultiDecision {
    pub overall: Decision,
    pub limits: Vec<Decision>,
}

impl std::ops::Deref for MultiDecision {
    type Target = Decision;
    fn deref(&self) -> &Decision {
        &self.overall
    }
}
