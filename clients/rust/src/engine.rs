//! The sans-IO engine: the options, which engine serves (module or library), the words of each
//! call for each engine, policies' definitions and fallbacks, the breaker and what `OnError`
//! answers. The limiter (`limiter.rs`) does the I/O and asks this what to send and what it means.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::clientside::lock;
use crate::types::{Algorithm, Error, Limit, Policy, SpecRef};

/// What a call answers when Redis cannot (down, stalled past the timeout, refusing, or the
/// breaker open).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OnError {
    /// Admit: a [`Decision`](crate::Decision) with `source` [`Error`](crate::Source::Error)
    /// and every number 0.
    #[default]
    Open,
    /// Refuse the call: [`Error::Unavailable`].
    Closed,
    /// Decide in process with the core crate's algorithms, the limit scaled by `local_share`
    /// (as `Open` where there is no limit to decide with: a policy without a cached definition
    /// nor a fallback).
    Local,
}

/// Which engine to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EngineChoice {
    /// The module where the server has it, else the Functions library (loaded by the limiter).
    #[default]
    Auto,
    Module,
    Library,
}

/// A limiter's options. `Options::default()`: fail open, 100 ms per call, a breaker that opens
/// after 3 consecutive failures for 1 s.
#[derive(Clone, Debug)]
pub struct Options {
    pub on_error: OnError,
    /// Bounds every call to Redis: past it the call counts as a failure and `on_error` answers.
    pub timeout: Duration,
    pub engine: EngineChoice,
    /// The prefix of the library's keys (default `"fn:"`): the engines never share a key.
    pub prefix: String,
    /// That many consecutive failures open the breaker (0: never): calls then apply `on_error`
    /// at once, and one call probes Redis per `breaker_cooldown`.
    pub breaker_failures: u32,
    pub breaker_cooldown: Duration,
    /// How long a policy's definition (`POLICY GET`) is kept.
    pub policy_refresh: Duration,
    /// Refusals kept by the denial cache (0: off).
    pub denial_cache: usize,
    /// The share of each limit the local fallback admits (above 0, at most 1): with N processes,
    /// 1/N keeps an outage's admissions near the limit.
    pub local_share: f64,
    /// Load the Functions library where the module is absent (`FUNCTION LOAD`).
    pub load_library: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            on_error: OnError::Open,
            timeout: Duration::from_millis(100),
            engine: EngineChoice::Auto,
            prefix: "fn:".into(),
            breaker_failures: 3,
            breaker_cooldown: Duration::from_secs(1),
            policy_refresh: Duration::from_secs(10),
            denial_cache: 0,
            local_share: 1.0,
            load_library: true,
        }
    }
}

impl Options {
    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.timeout.is_zero() {
            return Err(Error::invalid("timeout", "must be above 0"));
        }
        if !(self.local_share > 0.0 && self.local_share <= 1.0) {
            return Err(Error::invalid(
                "local_share",
                format!("must be above 0 and at most 1, not {}", self.local_share),
            ));
        }
        Ok(())
    }
}

/// Consecutive failures open it for the cool-down: calls then apply `on_error` at once,
/// without touching Redis; after the cool-down one call (the probe) goes through, the others
/// still fail at once; the probe's success closes it, its failure opens it again.
///
/// The consecutive failures are an atomic, changed only under the lock: a call while there are
/// none (the breaker closed, the path of every call when Redis answers) takes no lock.
#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    cooldown: Duration,
    failures: AtomicU32,
    state: Mutex<BreakerState>,
}

#[derive(Debug)]
struct BreakerState {
    open_until: Option<Instant>,
    /// A probe is out (only while open: `failures` 0 implies no probe).
    probing: bool,
}

impl Breaker {
    pub fn new(threshold: u32, cooldown: Duration) -> Breaker {
        Breaker {
            threshold,
            cooldown,
            failures: AtomicU32::new(0),
            state: Mutex::new(BreakerState {
                open_until: None,
                probing: false,
            }),
        }
    }

    fn open(&self, failures: u32) -> bool {
        self.threshold > 0 && failures >= self.threshold
    }

    pub fn is_open(&self) -> bool {
        self.open(self.failures.load(Ordering::Acquire))
    }

    /// Whether a call may go to Redis now (true for the probe of a half-open breaker).
    pub fn allow(&self) -> bool {
        if !self.is_open() {
            return true;
        }
        let mut state = lock(&self.state);
        if !self.open(self.failures.load(Ordering::Acquire)) {
            return true; // closed meanwhile
        }
        if state.probing || state.open_until.is_some_and(|until| Instant::now() < until) {
            return false;
        }
        state.probing = true;
        true
    }

    pub fn success(&self) {
        if self.failures.load(Ordering::Acquire) == 0 {
            return; // nothing to reset: no failure, hence no probe out
        }
        let mut state = lock(&self.state);
        if self.open(self.failures.load(Ordering::Acquire)) {
            log::warn!("redis_ratelimit: Redis answers again: breaker closed");
        }
        self.failures.store(0, Ordering::Release);
        state.probing = false;
    }

    pub fn failure(&self) {
        let mut state = lock(&self.state);
        let failures = self.failures.load(Ordering::Acquire).saturating_add(1);
        state.probing = false;
        if self.open(failures) {
            state.open_until = Some(Instant::now() + self.cooldown);
        }
        self.failures.store(failures, Ordering::Release);
        if self.open(failures) && failures == self.threshold {
            log::warn!(
                "redis_ratelimit: {failures} consecutive failures: breaker open, on_error \
                 applies at once, one probe every {:?}",
                self.cooldown
            );
        }
    }

    /// A call ended without an outcome (its future was dropped): a probe may go again.
    pub fn abandon(&self) {
        if self.failures.load(Ordering::Acquire) == 0 {
            return;
        }
        lock(&self.state).probing = false;
    }
}

/// A policy as the server defines it (`RATELIMIT.POLICY GET`), as far as calls need it.
#[derive(Clone, Debug)]
pub struct Definition {
    pub fields: BTreeMap<String, String>,
    pub shadow: bool,
    pub period_ms: u64,
}

impl Definition {
    pub fn new(fields: BTreeMap<String, String>) -> Definition {
        let number = |name: &str| fields.get(name).and_then(|v| v.parse::<u64>().ok());
        Definition {
            shadow: fields.get("mode").is_some_and(|m| m == "shadow"),
            period_ms: number("period_ms")
                .or_else(|| number("lease_ms"))
                .unwrap_or(0),
            fields,
        }
    }

    fn number(&self, name: &str) -> Option<u64> {
        self.fields.get(name).and_then(|v| v.parse::<u64>().ok())
    }

    pub fn block_ms(&self) -> u64 {
        self.number("block_ms").unwrap_or(0)
    }

    /// A shadow policy's limit as inline words (to PEEK what enforcement would answer);
    /// `None` for an enforced policy or one without a limit (concurrency).
    pub fn inline(&self) -> Option<Vec<String>> {
        self.shadow
            .then(|| self.limit())
            .flatten()
            .map(|limit| limit.args().to_vec())
    }

    /// The same limit as a [`Limit`] (`None` for a concurrency policy).
    pub fn limit(&self) -> Option<Limit> {
        let algorithm = Algorithm::parse(self.fields.get("algorithm")?.as_bytes())?;
        let mut limit = Limit::new(algorithm, self.number("limit")?, self.period_ms).ok()?;
        if algorithm.is_bucket() {
            if let Some(burst) = self.number("burst") {
                limit = limit.burst(burst).ok()?;
            }
        }
        match self.block_ms() {
            0 => Some(limit),
            block => limit.block(block).ok(),
        }
    }
}

/// The engine's state: which engine serves, the library's readiness, the policies read.
#[derive(Debug)]
pub struct Engine {
    pub choice: EngineChoice,
    pub prefix: String,
    /// The module serves, and that was said (the path of every call: no lock).
    module_said: AtomicBool,
    /// The module takes a limit spec as one argument (`COMMAND INFO RATELIMIT.CHECK` answered
    /// arity -3): its calls send each spec so, one argument instead of three to seven.
    one_argument: AtomicBool,
    /// Whether that was asked (once, when the module first answers).
    one_argument_asked: AtomicBool,
    state: Mutex<EngineState>,
}

#[derive(Debug, Default)]
struct EngineState {
    /// Known to be the library (`None`: not known yet; `Some(false)`: the module).
    library: Option<bool>,
    library_ready: bool,
    policies: HashMap<String, (Instant, Option<Definition>)>,
    warned: HashSet<String>,
}

/// The library's function of each verb.
pub fn function(verb: &str) -> &'static str {
    match verb {
        "CHECK" => "ratelimit_check",
        "PEEK" => "ratelimit_peek",
        "REFUND" => "ratelimit_refund",
        "TAKE" => "ratelimit_take",
        "CHECKALL" => "ratelimit_checkall",
        "ACQUIRE" => "ratelimit_acquire",
        "RELEASE" => "ratelimit_release",
        _ => "ratelimit_reset",
    }
}

impl Engine {
    pub fn new(choice: EngineChoice, prefix: String) -> Engine {
        let library = match choice {
            EngineChoice::Auto => None,
            EngineChoice::Module => Some(false),
            EngineChoice::Library => Some(true),
        };
        Engine {
            choice,
            prefix,
            module_said: AtomicBool::new(false),
            one_argument: AtomicBool::new(false),
            one_argument_asked: AtomicBool::new(false),
            state: Mutex::new(EngineState {
                library,
                ..EngineState::default()
            }),
        }
    }

    /// Whether the library serves (as far as known).
    pub fn library(&self) -> bool {
        if self.module_said.load(Ordering::Relaxed) {
            return false; // the module serves: no lock
        }
        lock(&self.state).library == Some(true)
    }

    pub fn library_ready(&self) -> bool {
        lock(&self.state).library_ready
    }

    pub fn set_library_ready(&self, ready: bool) {
        lock(&self.state).library_ready = ready;
    }

    /// The module is known to serve (it answered, and that was said): no lock.
    pub fn module_serves(&self) -> bool {
        self.module_said.load(Ordering::Relaxed)
    }

    /// Whether the module takes a spec as one argument (see [`Engine::set_one_argument`]).
    pub fn one_argument(&self) -> bool {
        self.one_argument.load(Ordering::Relaxed)
    }

    /// Whether to ask if the module takes a spec as one argument: true once (the first asker's).
    pub fn ask_one_argument(&self) -> bool {
        !self.one_argument_asked.load(Ordering::Relaxed)
            && !self.one_argument_asked.swap(true, Ordering::Relaxed)
    }

    /// What `COMMAND INFO RATELIMIT.CHECK` answered: `Some(arity)`, or `None` (an error, no
    /// such command, an answer of another shape). Arity -3: specs go as one argument from now on.
    pub fn set_one_argument(&self, arity: Option<i64>) {
        let takes = arity == Some(-3);
        self.one_argument.store(takes, Ordering::Relaxed);
        if takes {
            log::info!("redis_ratelimit: the module takes a limit spec as one argument");
        }
    }

    /// A module call failed with the error reply `text`: true when it refused a spec sent as one
    /// argument as an older module does (a cluster's node not upgraded yet, a failover to one),
    /// and the call is to be sent again, as words. Words from now on (said once); so too for the
    /// calls in flight when the form changed (no spec sent as words is refused so). A refused call
    /// changed nothing on the server: the retry consumes once. False for any other error.
    pub fn one_argument_refused(&self, text: &str) -> bool {
        if !refuses_one_argument(text) {
            return false;
        }
        self.words_from_now_on(text);
        true
    }

    /// Specs go as words from now on: a server refused them as one argument (`why`, said once).
    pub fn words_from_now_on(&self, why: &str) {
        if self.one_argument.swap(false, Ordering::Relaxed) {
            log::warn!(
                "redis_ratelimit: a server does not take a limit spec as one argument (an older \
                 module: {why}): sending the words from now on"
            );
        }
    }

    /// The module's words of a spec: as they are, or as one argument where the module takes it.
    pub fn module_words<'a>(&self, words: Cow<'a, [String]>) -> Cow<'a, [String]> {
        if self.one_argument() && words.len() > 1 {
            Cow::Owned(vec![words.join(" ")])
        } else {
            words
        }
    }

    /// The module answered: it serves (said once).
    pub fn use_module(&self) {
        if self.module_said.load(Ordering::Relaxed) {
            return;
        }
        let mut state = lock(&self.state);
        self.module_said
            .store(state.library != Some(true), Ordering::Relaxed);
        if state.library.is_none() {
            state.library = Some(false);
        }
        if state.warned.insert("engine module".into()) {
            log::info!("redis_ratelimit: engine: the module (RATELIMIT.* commands)");
        }
    }

    /// The server has no module: the library serves (said once).
    pub fn use_library(&self) {
        let mut state = lock(&self.state);
        // Under the lock, as use_module's store: the flag never outlives the switch.
        self.module_said.store(false, Ordering::Relaxed);
        state.library = Some(true);
        if state.warned.insert("engine library".into()) {
            let why = if self.choice == EngineChoice::Library {
                "engine = Library"
            } else {
                "the server has no module"
            };
            log::info!(
                "redis_ratelimit: engine: the Functions library 'ratelimit' (FCALL ratelimit_*, \
                 keys under '{}'): {why}",
                self.prefix
            );
        }
    }

    /// Whether `choice` lets an unknown-command reply switch to the library.
    pub fn may_switch(&self) -> bool {
        self.choice == EngineChoice::Auto
    }

    /// A policy's cached definition: `Some(d)` when read within `refresh` (d `None`: the server
    /// has none), `None` when it is to be read.
    pub fn cached(&self, name: &str, refresh: Duration) -> Option<Option<Definition>> {
        let state = lock(&self.state);
        let (at, definition) = state.policies.get(name)?;
        (at.elapsed() < refresh).then(|| definition.clone())
    }

    /// Any definition read of `name`, however old (for the local fallback).
    pub fn known(&self, name: &str) -> Option<Definition> {
        lock(&self.state).policies.get(name)?.1.clone()
    }

    pub fn remember(&self, name: &str, definition: Option<Definition>) {
        let mut state = lock(&self.state);
        if state.policies.len() > 1024 {
            state.policies.clear();
        }
        state
            .policies
            .insert(name.to_string(), (Instant::now(), definition));
    }

    pub fn forget(&self, name: &str) {
        lock(&self.state).policies.remove(name);
    }

    pub fn warn_fallback(&self, policy: &Policy) {
        let mut state = lock(&self.state);
        if state.warned.insert(format!("fallback {}", policy.name())) {
            let words = policy
                .fallback_limit()
                .map(|f| f.args().join(" "))
                .unwrap_or_default();
            log::warn!(
                "redis_ratelimit: the server has no policy '{}': using its fallback {words}",
                policy.name()
            );
        }
    }

    /// `warning` logged once per `what`.
    pub fn warn_once(&self, what: &str, warning: &str) {
        if lock(&self.state).warned.insert(what.to_string()) {
            log::warn!("redis_ratelimit: {warning}");
        }
    }
}

/// Whether the error reply `text` is an older module's refusal of a spec sent as one argument
/// (none of these answers a call of words):
/// - it read the whole as an algorithm: `ERR unknown algorithm 'gcra 10 1s': ...` (as the Python
///   and Node clients match it: a quoted word holding a space);
/// - a CHECK or PEEK of `COST 1` (left out: the key and the spec alone) or a CHECKALL of one key
///   is short of its arity: `ERR wrong number of arguments for 'ratelimit.check' command`;
/// - a CHECKALL of several keys counts fewer specs: `ERR 2 keys need 2 limit specs (one per
///   key, in order); found 1`.
///
/// In a MULTI a short command aborts the EXEC: redis-rs's multiplexed connection answers that
/// command's error (above); one answering `EXECABORT` alone names none, and the MULTI's caller
/// knows whether its specs went as one argument (the limiter's `aborted_as_one`).
pub fn refuses_one_argument(text: &str) -> bool {
    let algorithm = text
        .split("unknown algorithm '")
        .skip(1)
        .any(|rest| rest.find('\'').is_some_and(|end| rest[..end].contains(' ')));
    algorithm
        || text.contains("wrong number of arguments for 'ratelimit.")
        || (text.contains(" limit specs (one per key, in order); found "))
}

/// How a spec is sent: the module's words for the limit, the library's (`None`: no library
/// form), the period, and whether the limit is a shadow policy's.
#[derive(Clone, Debug)]
pub struct Resolved<'a> {
    pub module: Option<Cow<'a, [String]>>,
    pub library: Option<Cow<'a, [String]>>,
    pub period_ms: u64,
    pub block: bool,
    /// A shadow policy's definition as inline words: what a PEEK of enforcement sends.
    pub shadow: Option<Vec<String>>,
}

/// Resolves `spec` with the policy definition known (`definition`: `Some(None)` the server has
/// none, `None` not asked: the library serves).
pub fn resolve<'a>(
    engine: &Engine,
    spec: SpecRef<'a>,
    definition: Option<Option<Definition>>,
) -> Resolved<'a> {
    match spec {
        SpecRef::Limit(limit) => Resolved {
            module: Some(Cow::Borrowed(if engine.one_argument() {
                limit.spec_arg()
            } else {
                limit.args()
            })),
            library: Some(Cow::Borrowed(limit.args())),
            period_ms: limit.period_ms(),
            block: limit.block_ms().is_some(),
            shadow: None,
        },
        SpecRef::Policy(policy) => {
            let fallback = policy.fallback_limit();
            let fallback_words = fallback.map(|f| Cow::Borrowed(f.args()));
            let fallback_period = fallback.map_or(0, |f| f.period_ms());
            let fallback_block = fallback.is_some_and(|f| f.block_ms().is_some());
            match definition {
                None => Resolved {
                    module: None,
                    library: fallback_words,
                    period_ms: fallback_period,
                    block: fallback_block,
                    shadow: None,
                },
                Some(None) => {
                    match fallback {
                        None => Resolved {
                            // The server says "no such policy".
                            module: Some(engine.module_words(Cow::Owned(vec![
                                "POLICY".into(),
                                policy.name().into(),
                            ]))),
                            library: None,
                            period_ms: 0,
                            block: false,
                            shadow: None,
                        },
                        Some(_) => {
                            engine.warn_fallback(policy);
                            Resolved {
                                module: fallback_words.clone().map(|w| engine.module_words(w)),
                                library: fallback_words,
                                period_ms: fallback_period,
                                block: fallback_block,
                                shadow: None,
                            }
                        }
                    }
                }
                Some(Some(definition)) => Resolved {
                    module: Some(
                        engine
                            .module_words(Cow::Owned(vec!["POLICY".into(), policy.name().into()])),
                    ),
                    library: fallback_words,
                    period_ms: definition.period_ms,
                    block: definition.block_ms() > 0,
                    shadow: definition
                        .inline()
                        .map(|words| engine.module_words(Cow::Owned(words)).into_owned()),
                },
            }
        }
    }
}

/// The local fallback's limit for `spec`, scaled by `share`: a Limit, a policy's known
/// definition, else its fallback; `None` without any.
pub fn local_limit(engine: &Engine, spec: SpecRef<'_>, share: f64) -> Option<Limit> {
    let base = match spec {
        SpecRef::Limit(limit) => limit.clone(),
        SpecRef::Policy(policy) => engine
            .known(policy.name())
            .and_then(|d| d.limit())
            .or_else(|| policy.fallback_limit().cloned())?,
    };
    if share >= 1.0 {
        return Some(base);
    }
    let scale = |n: u64| ((n as f64 * share).floor() as u64).max(1);
    let mut scaled = Limit::new(base.algorithm(), scale(base.limit()), base.period_ms()).ok()?;
    if let Some(burst) = base.burst_value() {
        scaled = scaled.burst(scale(burst)).ok()?;
    }
    if let Some(block) = base.block_ms() {
        scaled = scaled.block(block).ok()?;
    }
    Some(scaled)
}
