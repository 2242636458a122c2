//! `RateLimiter`: the engine's plans run over a redis-rs connection, every command bounded by
//! the timeout, under the breaker, with the denial cache, batches and the local fallback.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionManager;
use redis::{Cmd, RedisError, Value};
use tokio::sync::{oneshot, Notify};

use crate::clientside::{lock, target, Batch, Batches, DenialCache, Flight};
use crate::connection::Connection;
use crate::engine::{
    function, local_limit, resolve, Breaker, Definition, Engine, EngineChoice, OnError, Options,
    Resolved,
};
use crate::local::LocalLimiter;
use crate::types::{
    amount, check_at, check_key, check_policy_name, Call, Decision, Error, Limit, MultiDecision,
    Period, Policy, Source, Spec, SpecRef,
};
use crate::wire;

/// The Functions library (lua-reference/functions/ratelimit.lua), loaded where the server has
/// no module.
pub const LIBRARY_CODE: &str = include_str!("../ratelimit.lua");

/// How long a batch's TAKE whose caller stopped waiting (its timeout passed) is still awaited,
/// so that a late grant is held (and refunded) rather than lost.
const LATE_REPLY_WAIT: Duration = Duration::from_secs(30);

/// Why a plan did not give its result.
#[derive(Debug)]
enum Fail {
    /// Redis did not answer (down, stalled, refusing, breaker open).
    Unavailable(String),
    /// The call's own error (an error reply, a bad argument, a reply of an unknown shape).
    Error(Error),
}

impl From<Error> for Fail {
    fn from(error: Error) -> Self {
        Fail::Error(error)
    }
}

fn from_redis(error: RedisError) -> Fail {
    if wire::unavailable(&error) {
        Fail::Unavailable(error.to_string())
    } else {
        Fail::Error(Error::Server(wire::reply_text(&error)))
    }
}

/// A rate limiter over one redis-rs connection ([`ConnectionManager`] by default: it
/// reconnects by itself; also [`MultiplexedConnection`](redis::aio::MultiplexedConnection) and
/// the async [`ClusterConnection`](redis::cluster_async::ClusterConnection)). Cheap to clone:
/// clones share the connection, the breaker, the cache and the batches.
///
/// Every call is bounded by [`Options::timeout`] per command; what a call answers when Redis
/// cannot is [`Options::on_error`]'s.
pub struct RateLimiter<C: Connection = ConnectionManager> {
    inner: Arc<Inner<C>>,
}

impl<C: Connection> Clone for RateLimiter<C> {
    fn clone(&self) -> Self {
        RateLimiter {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<C> {
    conn: C,
    options: Options,
    engine: Engine,
    breaker: Breaker,
    cache: Option<Mutex<DenialCache>>,
    batches: Batches,
    local: Option<Mutex<LocalLimiter>>,
    origin: Instant,
    stats: [AtomicU64; STATS.len()],
    /// Batch TAKEs still running (their replies may grant units to hold), and their end.
    in_flight: AtomicUsize,
    landed: Notify,
    lease_seq: AtomicU64,
}

/// Ends a breaker's call without an outcome when its future is dropped.
struct Abandon<'a> {
    breaker: &'a Breaker,
    armed: bool,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.breaker.abandon();
        }
    }
}

/// Counts a batch TAKE while it runs.
struct InFlight<C>(Arc<Inner<C>>);

impl<C> Drop for InFlight<C> {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.landed.notify_waiters();
        }
    }
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The counters of `stats()`, by the index of [`Stat`].
const STATS: [&str; 9] = [
    "commands", "module", "library", "error", "cache", "local", "fallback", "taken", "refunded",
];

/// A counter of `stats()`: its index in [`STATS`] (counted without looking its name up).
#[derive(Clone, Copy)]
enum Stat {
    Commands = 0,
    Cache = 4,
    Taken = 7,
    Refunded = 8,
}

/// The counter of decisions from `source`.
fn stat_of(source: Source) -> usize {
    match source {
        Source::Module => 1,
        Source::Library => 2,
        Source::Error => 3,
        Source::Cache => Stat::Cache as usize,
        Source::Local => 5,
        Source::Fallback => 6,
    }
}

/// A library call's arguments after its keys: a limit's words, then the cost's (`COST n` or
/// `MAX n`, and `AT t`) if it has one.
#[derive(Clone, Copy)]
struct Args<'a> {
    head: &'a [String],
    cost: Option<Cost>,
}

/// The cost words of a CHECK, PEEK, TAKE or REFUND.
#[derive(Clone, Copy)]
struct Cost {
    take: bool,
    cost: u64,
    at: Option<u64>,
}

impl Cost {
    fn words(self) -> Vec<String> {
        cost_words(self.take, self.cost, self.at)
    }

    /// Appends them to `cmd`; `COST 1`, the module's default, is left out of a CHECK or PEEK
    /// (`omit_unit`: fewer arguments for Redis to read).
    fn write(self, cmd: &mut Cmd, omit_unit: bool) {
        if !(omit_unit && !self.take && self.cost == 1) {
            cmd.arg(if self.take { "MAX" } else { "COST" })
                .arg(self.cost);
        }
        if let Some(at) = self.at {
            cmd.arg("AT").arg(at);
        }
    }
}

/// `RATELIMIT.<verb> key <limit words> COST n [AT t]` (`MAX n` for TAKE), its buffers sized
/// once.
fn decide_command(verb: &str, key: &str, args: &[String], cost: Cost) -> Cmd {
    let name = command_name(verb);
    let data = name.len() + key.len() + args.iter().map(String::len).sum::<usize>() + 48;
    let mut cmd = Cmd::with_capacity(args.len() + 6, data);
    cmd.arg(name).arg(key).arg(args);
    cost.write(&mut cmd, verb == "CHECK" || verb == "PEEK");
    cmd
}

fn command_name(verb: &str) -> &'static str {
    match verb {
        "CHECK" => "RATELIMIT.CHECK",
        "PEEK" => "RATELIMIT.PEEK",
        "TAKE" => "RATELIMIT.TAKE",
        _ => "RATELIMIT.REFUND",
    }
}

fn cost_words(take: bool, cost: u64, at: Option<u64>) -> Vec<String> {
    let mut words = vec![
        if take { "MAX" } else { "COST" }.to_string(),
        cost.to_string(),
    ];
    if let Some(at) = at {
        words.push("AT".into());
        words.push(at.to_string());
    }
    words
}

impl<C: Connection> RateLimiter<C> {
    /// A limiter on `conn` (see [`Options`]; `Options::default()` fails open with a 100 ms
    /// timeout). Sends nothing: the engine is found by the first call.
    pub fn new(conn: C, options: Options) -> Result<RateLimiter<C>, Error> {
        options.validate()?;
        let inner = Inner {
            engine: Engine::new(options.engine, options.prefix.clone()),
            breaker: Breaker::new(options.breaker_failures, options.breaker_cooldown),
            cache: (options.denial_cache > 0)
                .then(|| Mutex::new(DenialCache::new(options.denial_cache))),
            batches: Batches::default(),
            local: (options.on_error == OnError::Local)
                .then(|| Mutex::new(LocalLimiter::default())),
            origin: Instant::now(),
            stats: Default::default(),
            in_flight: AtomicUsize::new(0),
            landed: Notify::new(),
            lease_seq: AtomicU64::new(0),
            conn,
            options,
        };
        Ok(RateLimiter {
            inner: Arc::new(inner),
        })
    }

    /// The options it was made with.
    pub fn options(&self) -> &Options {
        &self.inner.options
    }

    /// `RATELIMIT.CHECK`: admits `call.cost` (default 1) against the limit, consuming it.
    pub async fn check<S: Spec + ?Sized>(
        &self,
        key: &str,
        spec: &S,
        call: impl Into<Call>,
    ) -> Result<Decision, Error> {
        self.inner
            .request("CHECK", key, spec.spec(), call.into())
            .await
    }

    /// `RATELIMIT.PEEK`: what `check` would answer, consuming nothing.
    pub async fn peek<S: Spec + ?Sized>(
        &self,
        key: &str,
        spec: &S,
        call: impl Into<Call>,
    ) -> Result<Decision, Error> {
        self.inner
            .request("PEEK", key, spec.spec(), call.into())
            .await
    }

    /// `RATELIMIT.TAKE ... MAX call.cost`: grants the largest cost up to it that a check would
    /// admit (`granted`; `allowed` when at least one unit).
    pub async fn take<S: Spec + ?Sized>(
        &self,
        key: &str,
        spec: &S,
        call: impl Into<Call>,
    ) -> Result<Decision, Error> {
        self.inner
            .request("TAKE", key, spec.spec(), call.into())
            .await
    }

    /// `RATELIMIT.REFUND`: gives back up to `call.cost` of what earlier calls consumed.
    pub async fn refund<S: Spec + ?Sized>(
        &self,
        key: &str,
        spec: &S,
        call: impl Into<Call>,
    ) -> Result<Decision, Error> {
        self.inner
            .request("REFUND", key, spec.spec(), call.into())
            .await
    }

    /// `RATELIMIT.CHECKALL`: every `(key, limit)` at once, all or nothing (in a cluster the
    /// keys share a slot: give them one hash tag, `{user}:sec`, `{user}:hour`).
    pub async fn check_all<K: AsRef<str>, S: Spec>(
        &self,
        pairs: &[(K, S)],
        call: impl Into<Call>,
    ) -> Result<MultiDecision, Error> {
        let pairs: Vec<(&str, SpecRef<'_>)> =
            pairs.iter().map(|(k, s)| (k.as_ref(), s.spec())).collect();
        self.inner.check_all(&pairs, call.into()).await
    }

    /// `RATELIMIT.RESET`: removes the keys' limiters; how many there were.
    pub async fn reset<K: AsRef<str>>(&self, keys: &[K]) -> Result<u64, Error> {
        let keys: Vec<&str> = keys.iter().map(AsRef::as_ref).collect();
        self.inner.reset(&keys).await
    }

    /// `RATELIMIT.ACQUIRE key limit lease ID lease_id COST cost`: takes (or renews) a lease.
    pub async fn acquire<'p>(
        &self,
        key: &str,
        limit: u64,
        lease: impl Into<Period<'p>>,
        lease_id: &str,
        cost: u64,
    ) -> Result<Decision, Error> {
        let lease_ms = lease.into().ms("lease")?;
        self.inner
            .acquire(key, limit, lease_ms, lease_id, cost)
            .await
    }

    /// `RATELIMIT.RELEASE key ID lease_id`: whether the lease was live.
    pub async fn release(&self, key: &str, lease_id: &str) -> Result<bool, Error> {
        self.inner.release(key, lease_id).await
    }

    /// A lease of `cost` under `limit` for at most `lease`, released by
    /// [`Lease::release`] or, when the guard is dropped, by a task spawned on the current tokio
    /// runtime (the release then happens shortly after the drop, not before it returns).
    /// Refused: [`Error::RateLimited`] with the decision.
    pub async fn lease<'p>(
        &self,
        key: &str,
        limit: u64,
        lease: impl Into<Period<'p>>,
        cost: u64,
    ) -> Result<Lease<C>, Error> {
        let seq = self.inner.lease_seq.fetch_add(1, Ordering::Relaxed);
        let id = format!(
            "{:x}-{:x}-{seq:x}",
            std::process::id(),
            self.inner.origin.elapsed().as_nanos() ^ u128::from(wall_ms())
        );
        let decision = self.acquire(key, limit, lease, &id, cost).await?;
        if !decision.allowed {
            return Err(Error::RateLimited(Box::new(decision)));
        }
        Ok(Lease {
            limiter: Some(self.clone()),
            key: key.to_string(),
            id,
            decision,
        })
    }

    /// The module's named policies (`RATELIMIT.POLICY SET/GET/DEL/LIST`).
    pub fn policies(&self) -> Policies<'_, C> {
        Policies { limiter: self }
    }

    /// Loads the Functions library (`FUNCTION LOAD REPLACE`, on every primary of a cluster).
    pub async fn load_library(&self) -> Result<(), Error> {
        self.inner.load_library().await.map_err(|f| match f {
            Fail::Unavailable(why) => Error::Unavailable(why),
            Fail::Error(e) => e,
        })
    }

    /// Gives back every unit the batches hold (after waiting for the batch TAKEs still running,
    /// whose grants it then refunds too).
    pub async fn close(&self) {
        self.inner.close().await
    }

    /// Units the batches hold now.
    pub fn held(&self) -> u64 {
        self.inner.batches.held()
    }

    /// Counters: `commands` sent, decisions per source (`module`, `library`, `cache`, `local`,
    /// `error`, `fallback`), units `taken` by batches and `refunded`.
    pub fn stats(&self) -> HashMap<String, u64> {
        STATS
            .iter()
            .zip(&self.inner.stats)
            .map(|(name, n)| (name.to_string(), n.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// Whether the breaker is open now.
    pub fn breaker_open(&self) -> bool {
        self.inner.breaker.is_open()
    }
}

impl<C: Connection> Inner<C> {
    fn count(&self, what: Stat, n: u64) {
        self.stats[what as usize].fetch_add(n, Ordering::Relaxed);
    }

    fn count_decision(&self, source: Source) {
        self.stats[stat_of(source)].fetch_add(1, Ordering::Relaxed);
    }

    fn now_ms(&self, at: Option<u64>) -> u64 {
        at.unwrap_or_else(|| u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX))
    }

    /// One command, bounded by the timeout (`patience`: another bound).
    async fn send(
        &self,
        cmd: &Cmd,
        key: Option<&str>,
        patience: Option<Duration>,
    ) -> Result<Value, Fail> {
        self.count(Stat::Commands, 1);
        let mut conn = self.conn.clone();
        let bound = patience.unwrap_or(self.options.timeout);
        match tokio::time::timeout(bound, conn.send(cmd, key)).await {
            // An error reply comes as a value from req_packed_command.
            Ok(Ok(error @ Value::ServerError(_))) => match error.extract_error() {
                Err(error) => Err(from_redis(error)),
                Ok(value) => Ok(value),
            },
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(from_redis(error)),
            Err(_) => Err(Fail::Unavailable(format!("no reply within {bound:?}"))),
        }
    }

    /// `cmds` in one `MULTI` ... `EXEC` (one round trip, applied together) to the node of
    /// `key`, bounded by the timeout: each command's reply, in order.
    async fn transaction(
        &self,
        cmds: Vec<Cmd>,
        key: &str,
        patience: Option<Duration>,
    ) -> Result<Vec<Value>, Fail> {
        self.count(Stat::Commands, 1);
        let n = cmds.len();
        let mut pipe = redis::pipe();
        pipe.atomic();
        for cmd in cmds {
            pipe.add_command(cmd);
        }
        let mut conn = self.conn.clone();
        let bound = patience.unwrap_or(self.options.timeout);
        let reply = match tokio::time::timeout(bound, conn.send_transaction(&pipe, Some(key))).await
        {
            Ok(Ok(reply)) => reply,
            Ok(Err(error)) => return Err(from_redis(error)),
            Err(_) => return Err(Fail::Unavailable(format!("no reply within {bound:?}"))),
        };
        match reply {
            Value::Array(items) if items.len() == n => {
                for item in &items {
                    if let Value::ServerError(error) = item {
                        return Err(from_redis(RedisError::from(error.clone())));
                    }
                }
                Ok(items)
            }
            other => Err(Fail::Error(Error::Protocol(format!(
                "EXEC replied {other:?}, not {n} replies"
            )))),
        }
    }

    /// Runs `plan` under the breaker.
    async fn guarded<T>(&self, plan: impl Future<Output = Result<T, Fail>>) -> Result<T, Fail> {
        if !self.breaker.allow() {
            return Err(Fail::Unavailable("breaker open".into()));
        }
        let mut abandon = Abandon {
            breaker: &self.breaker,
            armed: true,
        };
        let result = plan.await;
        abandon.armed = false;
        self.outcome(&result);
        result
    }

    /// Tells the breaker how a call under it ended.
    fn outcome<T>(&self, result: &Result<T, Fail>) {
        match result {
            Err(Fail::Unavailable(_)) => self.breaker.failure(),
            _ => self.breaker.success(),
        }
    }

    /// What a deciding call answers when Redis could not: the local decision, the open answer,
    /// or the error.
    fn fail(
        &self,
        why: String,
        period_ms: u64,
        local: Option<Result<Decision, Error>>,
        granted: u64,
    ) -> Result<Decision, Error> {
        let breaker = why == "breaker open";
        let how = match (&local, self.options.on_error) {
            (Some(_), _) => "deciding in process",
            (None, OnError::Closed) => "failing closed",
            (None, _) => "failing open",
        };
        if !breaker {
            log::warn!("redis_ratelimit: Redis unavailable ({why}): {how}");
        }
        match (local, self.options.on_error) {
            (Some(answer), _) => answer,
            (None, OnError::Closed) => Err(Error::Unavailable(why)),
            (None, _) => Ok(Decision::error(period_ms, granted)),
        }
    }

    // -- engines ------------------------------------------------------------------------

    /// The module answered: it serves; and, asked once (`COMMAND INFO RATELIMIT.CHECK`, not
    /// counted as a call's command), whether it takes a limit spec as one argument (arity -3).
    /// Any other answer, an error or no answer in time: the words, as before.
    async fn module_answered(&self) {
        self.engine.use_module();
        if !self.engine.ask_one_argument() {
            return;
        }
        let info = wire::command(&["COMMAND", "INFO", "RATELIMIT.CHECK"]);
        let mut conn = self.conn.clone();
        let arity = match tokio::time::timeout(self.options.timeout, conn.send(&info, None)).await {
            Ok(Ok(reply)) => wire::command_arity(&reply),
            _ => None,
        };
        self.engine.set_one_argument(arity);
    }

    /// A Limit's words for the module: one argument where the module takes it so.
    fn module_args<'l>(&self, limit: &'l Limit) -> &'l [String] {
        if self.engine.one_argument() {
            limit.spec_arg()
        } else {
            limit.args()
        }
    }

    async fn ensure_library(&self) -> Result<(), Fail> {
        if self.engine.library_ready() {
            return Ok(());
        }
        if !self.options.load_library {
            self.engine.set_library_ready(true);
            return Ok(());
        }
        let list = wire::command(&["FUNCTION", "LIST", "LIBRARYNAME", wire::LIBRARY_NAME]);
        let reply = self.send(&list, None, None).await?;
        let wanted = wire::library_functions(LIBRARY_CODE);
        match wire::library_has(&reply, &wanted) {
            Some(true) => self.engine.set_library_ready(true),
            found => {
                self.load_library().await?;
                if found == Some(false) {
                    log::info!("redis_ratelimit: replaced an older Functions library 'ratelimit'");
                }
            }
        }
        Ok(())
    }

    async fn load_library(&self) -> Result<(), Fail> {
        let load = wire::command(&["FUNCTION", "LOAD", "REPLACE", LIBRARY_CODE]);
        // An 800 kB library takes the server a while to compile: its own, longer bound.
        let patience = (self.options.timeout * 20).max(Duration::from_secs(2));
        self.send(&load, None, Some(patience)).await?;
        self.engine.set_library_ready(true);
        log::info!("redis_ratelimit: loaded the Functions library 'ratelimit' (FUNCTION LOAD)");
        Ok(())
    }

    /// The module's command, or the library's function on the prefixed keys (`library`: its
    /// arguments after the keys; `None`: this call has no library form).
    async fn call_either(
        &self,
        module: Option<&Cmd>,
        name: &str,
        keys: &[&str],
        library: Option<Args<'_>>,
        readonly: bool,
        patience: Option<Duration>,
    ) -> Result<(Value, Source), Fail> {
        let route = keys.first().copied();
        if !self.engine.library() {
            if let Some(cmd) = module {
                match self.send(cmd, route, patience).await {
                    Ok(reply) => {
                        self.module_answered().await;
                        return Ok((reply, Source::Module));
                    }
                    Err(Fail::Error(Error::Server(text)))
                        if self.engine.may_switch()
                            && (text.to_ascii_lowercase().contains("unknown command")
                                || text.contains("command doesn't exist")) =>
                    {
                        self.engine.use_library()
                    }
                    Err(other) => return Err(other),
                }
            }
        }
        // On a future of its own: the module's path (every call's where it serves) stays small.
        Box::pin(self.call_library(name, keys, library, readonly, patience)).await
    }

    /// The library's function on the prefixed keys (loading the library where it is missing).
    async fn call_library(
        &self,
        name: &str,
        keys: &[&str],
        library: Option<Args<'_>>,
        readonly: bool,
        patience: Option<Duration>,
    ) -> Result<(Value, Source), Fail> {
        let Some(args) = library else {
            return Err(Fail::Error(Error::Server(
                "no such policy: the Functions library has no policies (give the Policy a \
                 fallback Limit)"
                    .into(),
            )));
        };
        self.ensure_library().await?;
        self.engine.use_library();
        let prefixed: Vec<String> = keys
            .iter()
            .map(|k| format!("{}{k}", self.options.prefix))
            .collect();
        let mut words = vec![
            if readonly { "FCALL_RO" } else { "FCALL" }.to_string(),
            name.to_string(),
            keys.len().to_string(),
        ];
        words.extend(prefixed.iter().cloned());
        words.extend(args.head.iter().cloned());
        words.extend(args.cost.map(Cost::words).unwrap_or_default());
        let cmd = wire::command(&words);
        let route = prefixed.first().map(String::as_str);
        match self.send(&cmd, route, patience).await {
            Err(Fail::Error(Error::Server(text)))
                if text.to_ascii_lowercase().contains("function not found") =>
            {
                // Flushed meanwhile: load it again, once.
                self.engine.set_library_ready(false);
                self.ensure_library().await?;
                Ok((self.send(&cmd, route, patience).await?, Source::Library))
            }
            other => Ok((other?, Source::Library)),
        }
    }

    // -- policies -----------------------------------------------------------------------

    async fn definition(&self, policy: &Policy) -> Result<Option<Option<Definition>>, Fail> {
        if self.engine.library() {
            return Ok(None);
        }
        if let Some(cached) = self
            .engine
            .cached(policy.name(), self.options.policy_refresh)
        {
            return Ok(Some(cached));
        }
        let get = wire::command(&["RATELIMIT.POLICY", "GET", policy.name()]);
        match self.send(&get, None, None).await {
            Ok(reply) => {
                self.module_answered().await;
                let definition = wire::definition(&reply)?.map(Definition::new);
                self.engine.remember(policy.name(), definition.clone());
                Ok(Some(definition))
            }
            Err(Fail::Error(Error::Server(text)))
                if self.engine.may_switch()
                    && text.to_ascii_lowercase().contains("unknown command") =>
            {
                self.engine.use_library();
                Ok(None)
            }
            Err(other) => Err(other),
        }
    }

    async fn resolve<'a>(&self, spec: SpecRef<'a>) -> Result<Resolved<'a>, Fail> {
        let definition = match spec {
            SpecRef::Limit(_) => Some(None),
            SpecRef::Policy(policy) => self.definition(policy).await?,
        };
        Ok(resolve(&self.engine, spec, definition))
    }

    /// After `no such policy` (deleted since it was read): forget it; whether to retry.
    fn forget_policy(&self, error: &Fail, specs: &[SpecRef<'_>]) -> bool {
        let Fail::Error(Error::Server(text)) = error else {
            return false;
        };
        let Some(name) = text
            .split("no such policy '")
            .nth(1)
            .and_then(|rest| rest.split('\'').next())
        else {
            return false;
        };
        for spec in specs {
            if let SpecRef::Policy(policy) = spec {
                if policy.name() == name && policy.fallback_limit().is_some() {
                    if let Some(Some(_)) = self.engine.cached(name, Duration::MAX) {
                        self.engine.remember(name, None);
                        return true;
                    }
                }
            }
        }
        false
    }

    // -- the calls ----------------------------------------------------------------------

    /// CHECK, PEEK, REFUND or TAKE (`cost`: its MAX) against the server.
    async fn decide(
        &self,
        verb: &'static str,
        key: &str,
        spec: SpecRef<'_>,
        cost: u64,
        at: Option<u64>,
        patience: Option<Duration>,
    ) -> Result<Decision, Fail> {
        let cost = Cost {
            take: verb == "TAKE",
            cost,
            at,
        };
        match self.decide_spec(verb, key, spec, cost, patience).await {
            // Refused as one argument (an older module): again, as words now (once).
            Err(Fail::Error(Error::Server(text))) if self.engine.one_argument_refused(&text) => {
                Box::pin(self.decide_spec(verb, key, spec, cost, patience)).await
            }
            other => other,
        }
    }

    /// One attempt of `decide`, in the form the engine holds for specs now.
    async fn decide_spec(
        &self,
        verb: &'static str,
        key: &str,
        spec: SpecRef<'_>,
        cost: Cost,
        patience: Option<Duration>,
    ) -> Result<Decision, Fail> {
        match spec {
            SpecRef::Limit(limit) => self.decide_limit(verb, key, limit, cost, patience).await,
            // A policy's definition, its shadow and its retry: on a future of their own, so
            // that a Limit's (the common one) stays small.
            SpecRef::Policy(_) => {
                Box::pin(self.decide_policy(verb, key, spec, cost, patience)).await
            }
        }
    }

    /// A Limit's call: its words are the module's and the library's, nothing to resolve.
    async fn decide_limit(
        &self,
        verb: &'static str,
        key: &str,
        limit: &Limit,
        cost: Cost,
        patience: Option<Duration>,
    ) -> Result<Decision, Fail> {
        let args = limit.args();
        let module = decide_command(verb, key, self.module_args(limit), cost);
        let library = Args {
            head: args,
            cost: Some(cost),
        };
        let (reply, source) = self
            .call_either(
                Some(&module),
                function(verb),
                &[key],
                Some(library),
                verb == "PEEK",
                patience,
            )
            .await?;
        Ok(wire::decision(
            &reply,
            source,
            limit.period_ms(),
            cost.cost,
            cost.take,
        )?)
    }

    /// A Policy's call: its definition read (or cached), a shadow policy's enforcement asked in
    /// the same round trip, and one retry with the fallback when the policy was deleted since.
    async fn decide_policy(
        &self,
        verb: &'static str,
        key: &str,
        spec: SpecRef<'_>,
        cost: Cost,
        patience: Option<Duration>,
    ) -> Result<Decision, Fail> {
        // One retry after the policy was deleted since it was read, one after an abort.
        let (mut forgot, mut aborted) = (false, false);
        for _ in 0..3 {
            let resolved = self.resolve(spec).await?;
            let module = resolved
                .module
                .as_ref()
                .map(|args| decide_command(verb, key, args, cost));
            let library = resolved.library.as_ref().map(|args| Args {
                head: args,
                cost: Some(cost),
            });
            let result = match (&resolved.shadow, &module, verb == "CHECK" || cost.take) {
                (Some(shadow), Some(cmd), true) => {
                    self.decide_shadow(key, spec, shadow, cmd, resolved.period_ms, cost, patience)
                        .await
                }
                _ => match self
                    .call_either(
                        module.as_ref(),
                        function(verb),
                        &[key],
                        library,
                        verb == "PEEK",
                        patience,
                    )
                    .await
                {
                    Ok((reply, source)) => {
                        wire::decision(&reply, source, resolved.period_ms, cost.cost, cost.take)
                            .map_err(Fail::from)
                    }
                    Err(error) => Err(error),
                },
            };
            // Its shadow's MULTI, its specs sent as one argument, aborted: again, as words.
            let one = resolved
                .shadow
                .as_ref()
                .is_some_and(|words| words.len() == 1);
            match result {
                Err(error) if !forgot && self.forget_policy(&error, &[spec]) => forgot = true,
                Err(error) if !aborted && self.aborted_as_one(&error, one) => aborted = true,
                other => return other,
            }
        }
        Err(Fail::Error(Error::Protocol("no attempt left".into())))
    }

    /// A MULTI whose specs went as one argument (`one`) was aborted (`EXECABORT`): an older
    /// module refused a command short of its arity at queueing (none sent as words is). Words
    /// from now on; true: send it again.
    fn aborted_as_one(&self, error: &Fail, one: bool) -> bool {
        match error {
            Fail::Error(Error::Server(text)) if one && text.starts_with("EXECABORT") => {
                self.engine.words_from_now_on(text);
                true
            }
            _ => false,
        }
    }

    /// A shadow policy's CHECK or TAKE (`cmd`) with a PEEK of its definition (`shadow`, what
    /// enforcement answers) in one MULTI: the decision, `shadow_rejected` when enforcement would
    /// have refused what the shadow admitted.
    #[allow(clippy::too_many_arguments)]
    async fn decide_shadow(
        &self,
        key: &str,
        spec: SpecRef<'_>,
        shadow: &[String],
        cmd: &Cmd,
        period_ms: u64,
        cost: Cost,
        patience: Option<Duration>,
    ) -> Result<Decision, Fail> {
        let peek = decide_command(
            "PEEK",
            key,
            shadow,
            Cost {
                take: false,
                ..cost
            },
        );
        let replies = self
            .transaction(vec![peek, cmd.clone()], key, patience)
            .await?;
        let enforced = wire::decision(&replies[0], Source::Module, 0, cost.cost, false)?;
        let mut decision =
            wire::decision(&replies[1], Source::Module, period_ms, cost.cost, cost.take)?;
        decision.shadow_rejected = decision.allowed && !enforced.allowed;
        if decision.shadow_rejected {
            log::info!(
                "redis_ratelimit: shadow policy '{}' would have rejected {key} (retry in {} ms); \
                 admitted",
                match spec {
                    SpecRef::Policy(policy) => policy.name(),
                    SpecRef::Limit(_) => "",
                },
                enforced.retry_after_ms
            );
        }
        self.module_answered().await;
        Ok(decision)
    }

    /// The in-process decision of `OnError::Local` (`None` where there is none).
    fn local(
        &self,
        verb: &str,
        key: &str,
        spec: SpecRef<'_>,
        cost: u64,
        at: Option<u64>,
    ) -> Option<Result<Decision, Error>> {
        let local = self.local.as_ref()?;
        let limit = local_limit(&self.engine, spec, self.options.local_share)?;
        let now = at.unwrap_or_else(wall_ms);
        let mut local = lock(local);
        let answer = match verb {
            "TAKE" => local.take(key, &limit, cost, now),
            "PEEK" => local
                .peek(key, &limit, cost, now)
                .map(|f| (if f.allowed { cost } else { 0 }, f)),
            "REFUND" => local
                .refund(key, &limit, cost, now)
                .map(|f| (if f.allowed { cost } else { 0 }, f)),
            _ => local
                .check(key, &limit, cost, now)
                .map(|f| (if f.allowed { cost } else { 0 }, f)),
        };
        // A shadow policy's refusal is admitted, and said (as the server's shadow mode does).
        let shadow = (verb == "CHECK" || verb == "TAKE")
            && matches!(spec, SpecRef::Policy(policy)
                if self.engine.known(policy.name()).is_some_and(|d| d.shadow));
        Some(answer.map(|(granted, f)| {
            let allowed = if verb == "TAKE" {
                granted > 0
            } else {
                f.allowed
            };
            let rejected = shadow && !allowed;
            Decision {
                allowed: allowed || rejected,
                limit: f.limit,
                remaining: f.remaining,
                retry_after_ms: if rejected { 0 } else { f.retry_after_ms },
                reset_after_ms: f.reset_after_ms,
                delay_ms: f.delay_ms,
                source: Source::Fallback,
                shadow_rejected: rejected,
                period_ms: limit.period_ms(),
                granted: if rejected { cost } else { granted },
            }
        }))
    }

    /// A deciding call under the breaker, with `on_error`'s answer.
    async fn guarded_decide(
        &self,
        verb: &'static str,
        key: &str,
        spec: SpecRef<'_>,
        cost: u64,
        at: Option<u64>,
    ) -> Result<Decision, Error> {
        // `guarded` written out: the plan's future is not moved into another.
        let result = if self.breaker.allow() {
            let mut abandon = Abandon {
                breaker: &self.breaker,
                armed: true,
            };
            let result = self.decide(verb, key, spec, cost, at, None).await;
            abandon.armed = false;
            self.outcome(&result);
            result
        } else {
            Err(Fail::Unavailable("breaker open".into()))
        };
        match result {
            Ok(decision) => Ok(decision),
            Err(Fail::Error(error)) => Err(error),
            Err(Fail::Unavailable(why)) => {
                let local = self.local(verb, key, spec, cost, at);
                self.fail(why, spec.known_period_ms(), local, cost)
            }
        }
    }

    /// `guarded_decide` of a Limit where the module serves, in one future: the breaker, the
    /// command, its reply (the path of most calls, with the fewest steps).
    async fn module_limit(
        &self,
        verb: &'static str,
        key: &str,
        limit: &Limit,
        call: Call,
    ) -> Result<Decision, Error> {
        let spec = SpecRef::Limit(limit);
        if !self.breaker.allow() {
            let local = self.local(verb, key, spec, call.cost, call.at);
            return self.fail("breaker open".into(), limit.period_ms(), local, call.cost);
        }
        let cost = Cost {
            take: verb == "TAKE",
            cost: call.cost,
            at: call.at,
        };
        let cmd = decide_command(verb, key, self.module_args(limit), cost);
        let mut abandon = Abandon {
            breaker: &self.breaker,
            armed: true,
        };
        let sent = self.send(&cmd, Some(key), None).await;
        abandon.armed = false;
        self.outcome(&sent);
        match sent {
            Ok(reply) => Ok(wire::decision(
                &reply,
                Source::Module,
                limit.period_ms(),
                cost.cost,
                cost.take,
            )?),
            Err(Fail::Unavailable(why)) => {
                let local = self.local(verb, key, spec, call.cost, call.at);
                self.fail(why, limit.period_ms(), local, call.cost)
            }
            Err(Fail::Error(Error::Server(text)))
                if self.engine.may_switch()
                    && (text.to_ascii_lowercase().contains("unknown command")
                        || text.contains("command doesn't exist")) =>
            {
                // The module went away (as call_either would): the library from now on.
                self.engine.use_library();
                Box::pin(self.guarded_decide(verb, key, spec, call.cost, call.at)).await
            }
            Err(Fail::Error(Error::Server(text))) if self.engine.one_argument_refused(&text) => {
                // An older module refused the spec as one argument: again, as words.
                Box::pin(self.guarded_decide(verb, key, spec, call.cost, call.at)).await
            }
            Err(Fail::Error(error)) => Err(error),
        }
    }

    async fn request(
        self: &Arc<Self>,
        verb: &'static str,
        key: &str,
        spec: SpecRef<'_>,
        call: Call,
    ) -> Result<Decision, Error> {
        check_key(key)?;
        if verb == "TAKE" {
            amount(call.cost, "max", 1)?;
        } else {
            amount(call.cost, "cost", 0)?;
        }
        check_at(call.at)?;
        let batched = match spec {
            SpecRef::Limit(limit) => {
                verb == "CHECK"
                    && limit.batch_ms().is_some()
                    && call.cost > 0
                    && call.cost <= limit.batch_limit()
            }
            SpecRef::Policy(_) => false,
        };
        if !batched && self.cache.is_none() && self.batches.next_end().is_none() {
            // Nothing to answer in process nor to refund: straight to Redis.
            let decision = match spec {
                SpecRef::Limit(limit) if self.engine.module_serves() => {
                    self.module_limit(verb, key, limit, call).await?
                }
                _ => {
                    self.guarded_decide(verb, key, spec, call.cost, call.at)
                        .await?
                }
            };
            self.count_decision(decision.source);
            return Ok(decision);
        }
        let now = self.now_ms(call.at);
        if self.batches.next_end().is_some_and(|end| end <= now) {
            Box::pin(self.refund_due(Some(now), call.at)).await;
        }
        let where_ = self.cache.as_ref().map(|_| target(key, spec));
        let asked = if verb == "TAKE" { 1 } else { call.cost };
        if let (Some(cache), Some(where_)) = (&self.cache, &where_) {
            if verb == "CHECK" || verb == "TAKE" {
                if let Some(hit) = lock(cache).get(where_, asked, now) {
                    self.count(Stat::Cache, 1);
                    return Ok(hit);
                }
            } else if verb == "REFUND" {
                lock(cache).drop_key(key);
            }
        }
        let decision = match spec {
            SpecRef::Limit(limit) if batched => {
                let batch = self.batches.get(key, limit);
                // Units held cover it: answered here (the path of most batched calls).
                let held = lock(&batch.state).held_answer(batch.hold_ms, call.cost, now);
                match held {
                    Some(decision) => decision,
                    None => {
                        Box::pin(self.batched(batch, key, limit, call.cost, call.at, now)).await?
                    }
                }
            }
            _ => {
                self.guarded_decide(verb, key, spec, call.cost, call.at)
                    .await?
            }
        };
        if let (Some(cache), Some(where_)) = (&self.cache, &where_) {
            if (verb == "CHECK" || verb == "TAKE")
                && decision.source.is_server()
                && self.cacheable(spec)
            {
                lock(cache).put(where_, asked, &decision, now);
            }
        }
        self.count_decision(decision.source);
        Ok(decision)
    }

    /// Whether refusals of `spec` may be answered again here: not with a BLOCK (a refusal after
    /// a block has ended starts another, which an answer from the cache would skip).
    fn cacheable(&self, spec: SpecRef<'_>) -> bool {
        match spec {
            SpecRef::Limit(limit) => limit.block_ms().is_none(),
            SpecRef::Policy(policy) => match self.engine.known(policy.name()) {
                Some(definition) => definition.block_ms() == 0,
                None => policy
                    .fallback_limit()
                    .is_none_or(|f| f.block_ms().is_none()),
            },
        }
    }

    // -- batches ------------------------------------------------------------------------

    /// A CHECK answered from the units the batch holds, taking more with one TAKE (shared by
    /// concurrent callers, run on a task of its own) when they do not cover `cost`.
    async fn batched(
        self: &Arc<Self>,
        batch: Arc<Batch>,
        key: &str,
        limit: &Limit,
        cost: u64,
        at: Option<u64>,
        now: u64,
    ) -> Result<Decision, Error> {
        let spec = SpecRef::Limit(limit);
        let mut retries = 0;
        loop {
            let (flight, start) = {
                let mut state = lock(&batch.state);
                if let Some(decision) = state.held_answer(batch.hold_ms, cost, now) {
                    return Ok(decision);
                }
                match &state.flight {
                    Some(flight) => (Some(flight.clone()), None),
                    None => {
                        let leftover = if state.held > 0 && now >= state.until {
                            std::mem::take(&mut state.held)
                        } else {
                            0
                        };
                        let most = (cost.saturating_sub(state.held)).max(state.size(
                            batch.hold_ms,
                            batch.most,
                            now,
                        ));
                        let (flight, done) = Flight::new();
                        state.flight = Some(flight);
                        (None, Some((leftover, most, done)))
                    }
                }
            };
            if let Some(flight) = flight {
                if tokio::time::timeout(self.options.timeout, flight.wait())
                    .await
                    .is_err()
                {
                    // The TAKE in flight did not end in time: Redis is as slow for this
                    // request (a CHECK of its own could only add a unit consumed late).
                    let local = self.local("CHECK", key, spec, cost, at);
                    let why = format!("the batch's TAKE took over {:?}", self.options.timeout);
                    return self.fail(why, limit.period_ms(), local, cost);
                }
                continue;
            }
            let Some((leftover, most, done)) = start else {
                continue;
            };
            let (answer, answered) = oneshot::channel();
            self.in_flight.fetch_add(1, Ordering::SeqCst);
            let task = InFlight(self.clone());
            let batch_for_task = batch.clone();
            tokio::spawn(async move {
                let inner = task.0.clone();
                inner
                    .batch_take(batch_for_task, leftover, most, at, now, answer, done)
                    .await;
                drop(task);
            });
            let taken = match answered.await {
                Ok(taken) => taken,
                Err(_) => Err(Fail::Unavailable("the batch's TAKE task ended".into())),
            };
            let decision = match taken {
                Ok(decision) => decision,
                Err(Fail::Error(error)) => return Err(error),
                Err(Fail::Unavailable(why)) => {
                    let local = self.local("CHECK", key, spec, cost, at);
                    return self.fail(why, limit.period_ms(), local, cost);
                }
            };
            let short = {
                let mut state = lock(&batch.state);
                if cost <= state.held {
                    return Ok(state.admit(batch.hold_ms, cost, now, decision.source));
                }
                cost - state.held
            };
            if decision.granted >= cost && retries < 3 {
                // Enough was granted, but concurrent callers used it first: ask again.
                retries += 1;
                continue;
            }
            if decision.granted == 0 && short == 1 {
                return Ok(decision); // the TAKE's refusal is the CHECK of one unit's
            }
            // Refused: the wait until the server can grant the units the batch lacks.
            let peek = self.guarded_decide("PEEK", key, spec, short, at).await?;
            return Ok(Decision {
                allowed: false,
                granted: 0,
                delay_ms: 0,
                source: decision.source,
                ..peek
            });
        }
    }

    /// The batch's TAKE, on a task of its own: its grant goes into the batch whether or not
    /// the caller still waits; a reply that comes after the timeout is still awaited (up to
    /// `LATE_REPLY_WAIT`) and its grant held, then refunded when the hold ends.
    #[allow(clippy::too_many_arguments)]
    async fn batch_take(
        self: Arc<Self>,
        batch: Arc<Batch>,
        leftover: u64,
        most: u64,
        at: Option<u64>,
        now: u64,
        answer: oneshot::Sender<Result<Decision, Fail>>,
        done: tokio::sync::watch::Sender<bool>,
    ) {
        let mut answer = Some(answer);
        let finish = |batch: &Batch| {
            lock(&batch.state).flight = None;
            let _ = done.send(true);
        };
        if leftover > 0 {
            self.refund_units(&batch, leftover, at).await;
        }
        if !self.breaker.allow() {
            finish(&batch);
            if let Some(answer) = answer.take() {
                let _ = answer.send(Err(Fail::Unavailable("breaker open".into())));
            }
            return;
        }
        let spec = SpecRef::Limit(&batch.limit);
        let take = self.decide("TAKE", &batch.key, spec, most, at, Some(LATE_REPLY_WAIT));
        tokio::pin!(take);
        let timely = tokio::time::timeout(self.options.timeout, &mut take).await;
        let (result, late) = match timely {
            Ok(result) => (result, false),
            Err(_) => {
                // The callers stop waiting; the TAKE may still be granted: await it.
                self.breaker.failure();
                finish(&batch);
                if let Some(answer) = answer.take() {
                    let _ = answer.send(Err(Fail::Unavailable(format!(
                        "no reply within {:?}",
                        self.options.timeout
                    ))));
                }
                (take.await, true)
            }
        };
        match &result {
            Err(Fail::Unavailable(_)) if !late => self.breaker.failure(),
            Err(Fail::Unavailable(_)) => {}
            _ => self.breaker.success(),
        }
        if let Ok(decision) = &result {
            if decision.granted > 0 {
                self.count(Stat::Taken, decision.granted);
                // A late grant is held from its arrival.
                let from = if late && at.is_none() {
                    self.now_ms(None)
                } else {
                    now
                };
                let until = from.saturating_add(batch.hold_ms);
                {
                    let mut state = lock(&batch.state);
                    state.held += decision.granted;
                    state.until = until;
                    state.taken_at = from;
                    state.reply = Some(*decision);
                    state.virtual_time = at.is_some();
                }
                self.batches.holding(&batch, until);
                if at.is_none() {
                    self.schedule_sweep(until);
                }
            }
        }
        if !late {
            finish(&batch);
            if let Some(answer) = answer.take() {
                let _ = answer.send(result);
            }
        }
    }

    /// Refunds what the batches hold when their hold ends at `until` (real time).
    fn schedule_sweep(self: &Arc<Self>, until: u64) {
        let weak: Weak<Self> = Arc::downgrade(self);
        let wait = Duration::from_millis(until.saturating_sub(self.now_ms(None)));
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            if let Some(inner) = weak.upgrade() {
                let now = inner.now_ms(None);
                inner.refund_due(Some(now), None).await;
            }
        });
    }

    /// Gives back the units a batch did not use (a failure is logged: they count until the
    /// key's state refills or slides past them).
    async fn refund_units(&self, batch: &Batch, units: u64, at: Option<u64>) {
        let spec = SpecRef::Limit(&batch.limit);
        // Not under the breaker, and patient: a refund skipped or answered late would leave
        // the units consumed (or give them back unseen).
        match self
            .decide("REFUND", &batch.key, spec, units, at, Some(LATE_REPLY_WAIT))
            .await
        {
            Ok(_) => {
                self.count(Stat::Refunded, units);
                if let Some(cache) = &self.cache {
                    lock(cache).drop_key(&batch.key);
                }
            }
            Err(error) => log::warn!(
                "redis_ratelimit: refund of {units} unused batch units of {} not done ({error:?})",
                batch.key
            ),
        }
    }

    /// Refunds the batches whose hold has ended at `now` (every batch's with `None`): on the
    /// calls' `at` times in the call, else on a task of its own (the call does not wait).
    async fn refund_due(self: &Arc<Self>, now: Option<u64>, at: Option<u64>) {
        if self
            .batches
            .next_end()
            .is_none_or(|end| now.is_some_and(|now| end > now))
        {
            return;
        }
        let due = self.batches.due(now);
        if due.is_empty() {
            return;
        }
        if at.is_some() {
            for (batch, units) in due {
                self.refund_units(&batch, units, at).await;
            }
            return;
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let task = InFlight(self.clone());
        tokio::spawn(async move {
            for (batch, units) in due {
                task.0.refund_units(&batch, units, None).await;
            }
            drop(task);
        });
    }

    async fn close(self: &Arc<Self>) {
        // The TAKEs and refunds still running first: their grants are refunded below.
        loop {
            let landed = self.landed.notified();
            if self.in_flight.load(Ordering::SeqCst) == 0 {
                break;
            }
            landed.await;
        }
        for (batch, units) in self.batches.due(None) {
            self.refund_units(&batch, units, None).await;
        }
    }

    // -- the other calls ----------------------------------------------------------------

    async fn check_all(
        &self,
        pairs: &[(&str, SpecRef<'_>)],
        call: Call,
    ) -> Result<MultiDecision, Error> {
        if pairs.is_empty() {
            return Err(Error::invalid(
                "pairs",
                "check_all needs at least one (key, limit) pair",
            ));
        }
        for (key, _) in pairs {
            check_key(key)?;
        }
        amount(call.cost, "cost", 0)?;
        check_at(call.at)?;
        let keys: Vec<&str> = pairs.iter().map(|(k, _)| *k).collect();
        let specs: Vec<SpecRef<'_>> = pairs.iter().map(|(_, s)| *s).collect();
        let plan = async {
            // One retry after a policy deleted since it was read, one after a refusal of the
            // specs as one argument (an older module: words then).
            let (mut forgot, mut refused) = (false, false);
            let mut retry = |error: &Fail, one: bool| {
                if let Fail::Error(Error::Server(text)) = error {
                    if !refused
                        && (self.engine.one_argument_refused(text)
                            || self.aborted_as_one(error, one))
                    {
                        refused = true;
                        return true;
                    }
                }
                if !forgot && self.forget_policy(error, &specs) {
                    forgot = true;
                    return true;
                }
                false
            };
            for _ in 0..3 {
                let mut resolved = Vec::with_capacity(specs.len());
                for spec in &specs {
                    resolved.push(self.resolve(*spec).await?);
                }
                let tail = cost_words(false, call.cost, call.at);
                let periods: Vec<u64> = resolved.iter().map(|r| r.period_ms).collect();
                let module = resolved.iter().all(|r| r.module.is_some()).then(|| {
                    let mut words = vec!["RATELIMIT.CHECKALL".to_string(), keys.len().to_string()];
                    words.extend(keys.iter().map(|k| k.to_string()));
                    for r in &resolved {
                        words.extend(r.module.iter().flat_map(|w| w.iter()).cloned());
                    }
                    // `COST 1` is the module's default: not sent.
                    let unit = call.cost == 1;
                    words.extend(tail.iter().skip(if unit { 2 } else { 0 }).cloned());
                    words
                });
                let library = resolved.iter().all(|r| r.library.is_some()).then(|| {
                    let mut words: Vec<String> = Vec::new();
                    for r in &resolved {
                        words.extend(r.library.iter().flat_map(|w| w.iter()).cloned());
                    }
                    words.extend(tail.iter().cloned());
                    words
                });
                let module = module.map(|words| wire::command(&words));
                if let (Some(cmd), true) = (&module, resolved.iter().any(|r| r.shadow.is_some())) {
                    // What enforcement answers for each shadow policy, in the same round trip.
                    let mut cmds = Vec::new();
                    for (key, r) in keys.iter().zip(&resolved) {
                        if let Some(shadow) = &r.shadow {
                            let mut peek = redis::cmd("RATELIMIT.PEEK");
                            peek.arg(*key).arg(&shadow[..]).arg(&tail[..]);
                            cmds.push(peek);
                        }
                    }
                    cmds.push(cmd.clone());
                    // Whether its specs went as one argument (an abort is then an older module's).
                    let one = resolved.iter().any(|r| {
                        r.module
                            .as_ref()
                            .is_some_and(|w| w.len() == 1 && w[0].contains(' '))
                    });
                    match self.transaction(cmds, keys[0], None).await {
                        Ok(replies) => {
                            let mut peeks = replies[..replies.len() - 1].iter();
                            let mut multi = wire::multi(
                                &replies[replies.len() - 1],
                                Source::Module,
                                &periods,
                                call.cost,
                            )?;
                            for (limit, r) in multi.limits.iter_mut().zip(&resolved) {
                                if r.shadow.is_some() {
                                    if let Some(peek) = peeks.next() {
                                        let enforced = wire::decision(
                                            peek,
                                            Source::Module,
                                            0,
                                            call.cost,
                                            false,
                                        )?;
                                        limit.shadow_rejected = limit.allowed && !enforced.allowed;
                                    }
                                }
                            }
                            multi.overall.shadow_rejected = multi.overall.allowed
                                && multi.limits.iter().any(|d| d.shadow_rejected);
                            self.module_answered().await;
                            return Ok(multi);
                        }
                        Err(error) if retry(&error, one) => continue,
                        Err(error) => return Err(error),
                    }
                }
                let result = self
                    .call_either(
                        module.as_ref(),
                        "ratelimit_checkall",
                        &keys,
                        library.as_ref().map(|head| Args { head, cost: None }),
                        false,
                        None,
                    )
                    .await;
                match result {
                    Ok((reply, source)) => {
                        return Ok(wire::multi(&reply, source, &periods, call.cost)?)
                    }
                    Err(error) if retry(&error, false) => continue,
                    Err(error) => return Err(error),
                }
            }
            Err(Fail::Error(Error::Protocol("no attempt left".into())))
        };
        match self.guarded(plan).await {
            Ok(multi) => {
                self.count_decision(multi.overall.source);
                Ok(multi)
            }
            Err(Fail::Error(error)) => Err(error),
            Err(Fail::Unavailable(why)) => {
                if let Some(local) = self.local_check_all(pairs, call) {
                    log::warn!("redis_ratelimit: Redis unavailable ({why}): deciding in process");
                    return local;
                }
                let periods: Vec<u64> = specs.iter().map(|s| s.known_period_ms()).collect();
                let each = periods
                    .iter()
                    .map(|p| self.fail(why.clone(), *p, None, call.cost))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(MultiDecision {
                    overall: Decision::error(0, call.cost),
                    limits: each,
                })
            }
        }
    }

    /// check_all in process, all or nothing (`None`: some limit has nothing to decide with).
    fn local_check_all(
        &self,
        pairs: &[(&str, SpecRef<'_>)],
        call: Call,
    ) -> Option<Result<MultiDecision, Error>> {
        let local = self.local.as_ref()?;
        let limits: Vec<Limit> = pairs
            .iter()
            .map(|(_, spec)| local_limit(&self.engine, *spec, self.options.local_share))
            .collect::<Option<_>>()?;
        let now = call.at.unwrap_or_else(wall_ms);
        let mut local = lock(local);
        let run = |local: &mut LocalLimiter, commit: bool| {
            pairs
                .iter()
                .zip(&limits)
                .map(|((key, _), limit)| {
                    if commit {
                        local.check(key, limit, call.cost, now)
                    } else {
                        local.peek(key, limit, call.cost, now)
                    }
                })
                .collect::<Result<Vec<_>, Error>>()
        };
        let mut fields = match run(&mut local, false) {
            Ok(fields) => fields,
            Err(error) => return Some(Err(error)),
        };
        if fields.iter().all(|f| f.allowed) {
            fields = match run(&mut local, true) {
                Ok(fields) => fields,
                Err(error) => return Some(Err(error)),
            };
        }
        let each: Vec<Decision> = fields
            .iter()
            .zip(&limits)
            .map(|(f, limit)| Decision {
                allowed: f.allowed,
                limit: f.limit,
                remaining: f.remaining,
                retry_after_ms: f.retry_after_ms,
                reset_after_ms: f.reset_after_ms,
                delay_ms: f.delay_ms,
                source: Source::Fallback,
                shadow_rejected: false,
                period_ms: limit.period_ms(),
                granted: if f.allowed { call.cost } else { 0 },
            })
            .collect();
        let least = each.iter().min_by_key(|d| d.remaining)?;
        let allowed = each.iter().all(|d| d.allowed);
        let overall = Decision {
            allowed,
            limit: least.limit,
            remaining: least.remaining,
            retry_after_ms: if each.iter().any(|d| d.retry_after_ms < 0) {
                -1
            } else {
                each.iter().map(|d| d.retry_after_ms).max().unwrap_or(0)
            },
            reset_after_ms: each.iter().map(|d| d.reset_after_ms).max().unwrap_or(0),
            delay_ms: each.iter().map(|d| d.delay_ms).max().unwrap_or(0),
            source: Source::Fallback,
            shadow_rejected: false,
            period_ms: 0,
            granted: if allowed { call.cost } else { 0 },
        };
        Some(Ok(MultiDecision {
            overall,
            limits: each,
        }))
    }

    async fn reset(&self, keys: &[&str]) -> Result<u64, Error> {
        if keys.is_empty() {
            return Err(Error::invalid("keys", "reset needs at least one key"));
        }
        for key in keys {
            check_key(key)?;
        }
        let mut words = vec!["RATELIMIT.RESET".to_string()];
        words.extend(keys.iter().map(|k| k.to_string()));
        let cmd = wire::command(&words);
        let plan = self.call_either(
            Some(&cmd),
            "ratelimit_reset",
            keys,
            Some(Args {
                head: &[],
                cost: None,
            }),
            false,
            None,
        );
        let result = self.guarded(plan).await;
        for key in keys {
            if let Some(cache) = &self.cache {
                lock(cache).drop_key(key);
            }
            self.batches.drop_key(key);
            if let Some(local) = &self.local {
                lock(local).reset(&[key]);
            }
        }
        match result {
            Ok((reply, _)) => Ok(u64::try_from(wire::count(&reply)?).unwrap_or(0)),
            Err(Fail::Error(error)) => Err(error),
            Err(Fail::Unavailable(why)) => Err(Error::Unavailable(why)),
        }
    }

    async fn acquire(
        &self,
        key: &str,
        limit: u64,
        lease_ms: u64,
        lease_id: &str,
        cost: u64,
    ) -> Result<Decision, Error> {
        check_key(key)?;
        amount(limit, "limit", 1)?;
        check_lease_id(lease_id)?;
        amount(cost, "cost", 1)?;
        let args = vec![
            limit.to_string(),
            format!("{lease_ms}ms"),
            "ID".to_string(),
            lease_id.to_string(),
            "COST".to_string(),
            cost.to_string(),
        ];
        let mut module = vec!["RATELIMIT.ACQUIRE".to_string(), key.to_string()];
        module.extend(args.iter().cloned());
        let keys = [key];
        let cmd = wire::command(&module);
        let plan = self.call_either(
            Some(&cmd),
            "ratelimit_acquire",
            &keys,
            Some(Args {
                head: &args,
                cost: None,
            }),
            false,
            None,
        );
        match self.guarded(plan).await {
            Ok((reply, source)) => Ok(wire::decision(&reply, source, lease_ms, cost, false)?),
            Err(Fail::Error(error)) => Err(error),
            Err(Fail::Unavailable(why)) => self.fail(why, lease_ms, None, cost),
        }
    }

    async fn release(&self, key: &str, lease_id: &str) -> Result<bool, Error> {
        check_key(key)?;
        check_lease_id(lease_id)?;
        let args = vec!["ID".to_string(), lease_id.to_string()];
        let mut module = vec!["RATELIMIT.RELEASE".to_string(), key.to_string()];
        module.extend(args.iter().cloned());
        let keys = [key];
        let cmd = wire::command(&module);
        let plan = self.call_either(
            Some(&cmd),
            "ratelimit_release",
            &keys,
            Some(Args {
                head: &args,
                cost: None,
            }),
            false,
            None,
        );
        match self.guarded(plan).await {
            Ok((reply, _)) => Ok(wire::count(&reply)? != 0),
            Err(Fail::Error(error)) => Err(error),
            Err(Fail::Unavailable(why)) => Err(Error::Unavailable(why)),
        }
    }

    async fn policy_command(&self, words: &[&str]) -> Result<Value, Error> {
        let cmd = wire::command(words);
        match self.guarded(self.send(&cmd, None, None)).await {
            Ok(reply) => Ok(reply),
            Err(Fail::Error(error)) => Err(error),
            Err(Fail::Unavailable(why)) => Err(Error::Unavailable(why)),
        }
    }
}

fn check_lease_id(lease_id: &str) -> Result<(), Error> {
    if !(1..=128).contains(&lease_id.len()) {
        return Err(Error::invalid(
            "lease_id",
            format!("a lease id is 1 to 128 bytes, not {} bytes", lease_id.len()),
        ));
    }
    Ok(())
}

/// A lease taken by [`RateLimiter::lease`]: released by [`release`](Lease::release), or on
/// drop by a task spawned on the current tokio runtime (logged where there is none; the lease
/// then ends when its duration does).
pub struct Lease<C: Connection = ConnectionManager> {
    limiter: Option<RateLimiter<C>>,
    key: String,
    id: String,
    decision: Decision,
}

impl<C: Connection> Lease<C> {
    /// The acquiring decision.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Gives the lease back now: whether it was still live.
    pub async fn release(mut self) -> Result<bool, Error> {
        match self.limiter.take() {
            Some(limiter) => limiter.release(&self.key, &self.id).await,
            None => Ok(false),
        }
    }
}

impl<C: Connection> Drop for Lease<C> {
    fn drop(&mut self) {
        let Some(limiter) = self.limiter.take() else {
            return;
        };
        let (key, id) = (std::mem::take(&mut self.key), std::mem::take(&mut self.id));
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    if let Err(error) = limiter.release(&key, &id).await {
                        log::warn!("redis_ratelimit: release of lease {id} on {key}: {error}");
                    }
                });
            }
            Err(_) => log::warn!(
                "redis_ratelimit: lease {id} on {key} dropped outside a tokio runtime: it ends \
                 when its duration does"
            ),
        }
    }
}

/// A policy's definition as `RATELIMIT.POLICY GET` answers it (`algorithm`, `limit`,
/// `period_ms`, `burst`, `block_ms`, `mode`...).
pub type PolicyDefinition = BTreeMap<String, String>;

/// The module's named policies. In a cluster each primary has its own: define them on every
/// primary (`redis-cli --cluster call`).
pub struct Policies<'a, C: Connection> {
    limiter: &'a RateLimiter<C>,
}

impl<C: Connection> Policies<'_, C> {
    /// `RATELIMIT.POLICY SET name <limit> [SHADOW]`.
    pub async fn set(&self, name: &str, limit: &Limit, shadow: bool) -> Result<(), Error> {
        check_policy_name(name)?;
        let mut words = vec!["RATELIMIT.POLICY", "SET", name];
        words.extend(limit.args().iter().map(String::as_str));
        if shadow {
            words.push("SHADOW");
        }
        self.limiter.inner.policy_command(&words).await?;
        self.limiter.inner.engine.forget(name);
        Ok(())
    }

    /// `RATELIMIT.POLICY GET name`: the definition, `None` if there is none.
    pub async fn get(&self, name: &str) -> Result<Option<PolicyDefinition>, Error> {
        check_policy_name(name)?;
        let reply = self
            .limiter
            .inner
            .policy_command(&["RATELIMIT.POLICY", "GET", name])
            .await?;
        wire::definition(&reply)
    }

    /// `RATELIMIT.POLICY DEL name`: whether it existed.
    pub async fn delete(&self, name: &str) -> Result<bool, Error> {
        check_policy_name(name)?;
        let reply = self
            .limiter
            .inner
            .policy_command(&["RATELIMIT.POLICY", "DEL", name])
            .await?;
        self.limiter.inner.engine.forget(name);
        Ok(wire::count(&reply)? != 0)
    }

    /// `RATELIMIT.POLICY LIST`: the names, sorted.
    pub async fn list(&self) -> Result<Vec<String>, Error> {
        let reply = self
            .limiter
            .inner
            .policy_command(&["RATELIMIT.POLICY", "LIST"])
            .await?;
        wire::names(&reply)
    }
}

#[allow(dead_code)]
fn _assert_send<C: Connection>(limiter: &RateLimiter<C>, limit: &Limit) {
    fn is_send<T: Send>(_: T) {}
    is_send(limiter.check("k", limit, 1));
    let _ = EngineChoice::Auto;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_source_counts_under_its_own_name() {
        let sources = [
            Source::Module,
            Source::Library,
            Source::Error,
            Source::Cache,
            Source::Local,
            Source::Fallback,
        ];
        for source in sources {
            assert_eq!(STATS[stat_of(source)], source.name());
        }
        assert_eq!(STATS[Stat::Commands as usize], "commands");
        assert_eq!(STATS[Stat::Cache as usize], "cache");
        assert_eq!(STATS[Stat::Taken as usize], "taken");
        assert_eq!(STATS[Stat::Refunded as usize], "refunded");
    }

    fn sent(cmd: &Cmd) -> String {
        args(cmd).join(" ")
    }

    fn args(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                redis::Arg::Cursor => "<cursor>".into(),
            })
            .collect()
    }

    #[test]
    fn specs_go_as_one_argument_only_where_the_module_said_arity_minus_3() {
        use crate::engine::{resolve, Definition, Engine};
        let limit = Limit::new(crate::Algorithm::TokenBucket, 10, "1s")
            .unwrap()
            .burst(20)
            .unwrap()
            .block("1m")
            .unwrap();
        let policy = Policy::new("api").unwrap().fallback(limit.clone());
        let cost = Cost {
            take: false,
            cost: 2,
            at: Some(5),
        };
        let shadow: std::collections::BTreeMap<String, String> = [
            ("algorithm", "fixed-window"),
            ("limit", "3"),
            ("period_ms", "1000"),
            ("mode", "shadow"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        for (arity, one) in [
            (None, false),
            (Some(-4), false),
            (Some(-2), false),
            (Some(-3), true),
        ] {
            let engine = Engine::new(EngineChoice::Module, "fn:".into());
            assert!(engine.ask_one_argument());
            assert!(!engine.ask_one_argument(), "asked once");
            engine.set_one_argument(arity);
            let words = |r: &crate::engine::Resolved<'_>| {
                let module = r.module.as_ref().map(|w| w.join("|"));
                let library = r.library.as_ref().map(|w| w.join("|"));
                (module, library)
            };
            let inline = resolve(&engine, SpecRef::Limit(&limit), Some(None));
            let by_name = resolve(
                &engine,
                SpecRef::Policy(&policy),
                Some(Some(Definition::new(shadow.clone()))),
            );
            let missing = resolve(&engine, SpecRef::Policy(&policy), Some(None));
            let library_words = Some("token-bucket|10|1000ms|BURST|20|BLOCK|60000ms".to_string());
            if one {
                let spec = "token-bucket 10 1000ms BURST 20 BLOCK 60000ms";
                assert_eq!(words(&inline), (Some(spec.into()), library_words.clone()));
                assert_eq!(words(&by_name).0, Some("POLICY api".into()));
                assert_eq!(
                    by_name.shadow,
                    Some(vec!["fixed-window 3 1000ms".to_string()])
                );
                assert_eq!(words(&missing), (Some(spec.into()), library_words));
                assert_eq!(
                    sent(&decide_command("CHECK", "k", limit.spec_arg(), cost)),
                    format!("RATELIMIT.CHECK k {spec} COST 2 AT 5")
                );
                assert_eq!(limit.spec_arg().len(), 1);
            } else {
                let spec = library_words.clone();
                assert_eq!(words(&inline), (spec.clone(), library_words.clone()));
                assert_eq!(words(&by_name).0, Some("POLICY|api".into()));
                assert_eq!(
                    by_name.shadow,
                    Some(vec!["fixed-window".into(), "3".into(), "1000ms".into()])
                );
                assert_eq!(words(&missing), (spec, library_words));
            }
        }
        // COMMAND INFO's shapes: the arity, or nothing.
        let info = |arity| {
            Value::Array(vec![Value::Array(vec![
                Value::BulkString(b"ratelimit.check".to_vec()),
                Value::Int(arity),
            ])])
        };
        assert_eq!(wire::command_arity(&info(-3)), Some(-3));
        assert_eq!(wire::command_arity(&info(-4)), Some(-4));
        assert_eq!(wire::command_arity(&Value::Array(vec![Value::Nil])), None);
        assert_eq!(wire::command_arity(&Value::Nil), None);
    }

    #[test]
    fn a_check_or_peek_of_cost_one_leaves_the_default_out() {
        let args = ["fixed-window".to_string(), "10".into(), "1m".into()];
        let cost = |cost, at| Cost {
            take: false,
            cost,
            at,
        };
        let cases = [
            (
                "CHECK",
                cost(1, None),
                "RATELIMIT.CHECK k fixed-window 10 1m",
            ),
            ("PEEK", cost(1, None), "RATELIMIT.PEEK k fixed-window 10 1m"),
            (
                "CHECK",
                cost(1, Some(5)),
                "RATELIMIT.CHECK k fixed-window 10 1m AT 5",
            ),
            (
                "CHECK",
                cost(2, None),
                "RATELIMIT.CHECK k fixed-window 10 1m COST 2",
            ),
            (
                "CHECK",
                cost(0, None),
                "RATELIMIT.CHECK k fixed-window 10 1m COST 0",
            ),
            (
                "REFUND",
                cost(1, None),
                "RATELIMIT.REFUND k fixed-window 10 1m COST 1",
            ),
        ];
        for (verb, cost, want) in cases {
            assert_eq!(sent(&decide_command(verb, "k", &args, cost)), want);
        }
        let take = Cost {
            take: true,
            cost: 1,
            at: None,
        };
        assert_eq!(
            sent(&decide_command("TAKE", "k", &args, take)),
            "RATELIMIT.TAKE k fixed-window 10 1m MAX 1"
        );
    }

    /// A server that said arity -3 (`COMMAND INFO`), then, once `old` is set, refuses any spec
    /// sent as one argument as an older module does; `refuse` answers every deciding call so (a
    /// real bad argument). Each command sent is kept.
    #[derive(Clone, Default)]
    struct Scripted {
        sent: Arc<Mutex<Vec<String>>>,
        old: Arc<std::sync::atomic::AtomicBool>,
        refuse: Arc<Mutex<Option<String>>>,
    }

    impl Scripted {
        fn answer(&self, cmd: &Cmd) -> redis::RedisResult<Value> {
            let line = sent(cmd);
            lock(&self.sent).push(line.clone());
            let args = args(cmd);
            let error = |detail: String| {
                Err(RedisError::from((
                    redis::ErrorKind::ResponseError,
                    "An error was signalled by the server",
                    detail,
                )))
            };
            let decision = || Value::Array([1, 10, 9, 0, 100, 0].map(Value::Int).to_vec());
            if args[0] == "COMMAND" {
                let info = vec![
                    Value::BulkString(b"ratelimit.check".to_vec()),
                    Value::Int(-3),
                ];
                return Ok(Value::Array(vec![Value::Array(info)]));
            }
            if let Some(detail) = lock(&self.refuse).clone() {
                return error(detail);
            }
            if args[0] == "RATELIMIT.POLICY" {
                let fields = [
                    "algorithm",
                    "fixed-window",
                    "limit",
                    "2",
                    "period_ms",
                    "1000",
                ];
                let mut fields: Vec<Value> = fields
                    .iter()
                    .map(|f| Value::BulkString(f.as_bytes().to_vec()))
                    .collect();
                fields.extend(["mode", "shadow"].map(|f| Value::BulkString(f.into())));
                return Ok(Value::Array(fields));
            }
            let joined = args.iter().find(|a| a.contains(' '));
            match (self.old.load(Ordering::Relaxed), joined) {
                (true, Some(_)) if args[0] == "RATELIMIT.CHECKALL" && args[1] == "2" => {
                    error("2 keys need 2 limit specs (one per key, in order); found 1".into())
                }
                (true, Some(joined)) => error(format!(
                    "unknown algorithm '{joined}': expected token-bucket, leaky-bucket, \
                     fixed-window, sliding-window, sliding-log or gcra"
                )),
                _ if args[0] == "RATELIMIT.CHECKALL" => {
                    Ok(Value::Array(vec![decision(), decision(), decision()]))
                }
                _ => Ok(decision()),
            }
        }

        fn take_sent(&self) -> Vec<String> {
            std::mem::take(&mut *lock(&self.sent))
        }
    }

    impl Connection for Scripted {
        fn send<'a>(
            &'a mut self,
            cmd: &'a Cmd,
            _key: Option<&'a str>,
        ) -> redis::RedisFuture<'a, Value> {
            let reply = self.answer(cmd);
            Box::pin(async move { reply })
        }

        /// A MULTI: aborted where the older module finds a command short of its arity.
        fn send_transaction<'a>(
            &'a mut self,
            pipe: &'a redis::Pipeline,
            _key: Option<&'a str>,
        ) -> redis::RedisFuture<'a, Value> {
            let lines: Vec<String> = pipe.cmd_iter().map(|cmd| args(cmd).join("|")).collect();
            lock(&self.sent).push(format!("MULTI {}", lines.join(" / ")));
            let short = |cmd: &Cmd| cmd.args_iter().count() < 4;
            let aborted = self.old.load(Ordering::Relaxed) && pipe.cmd_iter().any(short);
            let reply = if aborted {
                Err(RedisError::from((
                    redis::ErrorKind::ExecAbortError,
                    "Transaction discarded because of previous errors.",
                )))
            } else {
                let decision = Value::Array([1, 2, 1, 0, 100, 0].map(Value::Int).to_vec());
                Ok(Value::Array(vec![decision; lines.len()]))
            };
            Box::pin(async move { reply })
        }
    }

    #[test]
    fn an_older_module_s_refusals_of_one_argument_are_recognised_and_no_other_error() {
        use crate::engine::refuses_one_argument;
        for refused in [
            "ERR unknown algorithm 'gcra 10 1s': expected token-bucket, leaky-bucket, \
             fixed-window, sliding-window, sliding-log or gcra",
            "ERR limit spec 2 (key 'b'): unknown algorithm 'POLICY api': expected token-bucket",
            "ERR wrong number of arguments for 'ratelimit.check' command",
            "ERR wrong number of arguments for 'ratelimit.checkall' command",
            "ERR 2 keys need 2 limit specs (one per key, in order); found 1",
        ] {
            assert!(refuses_one_argument(refused), "{refused}");
        }
        for other in [
            "ERR unknown algorithm 'sliding-windows': expected token-bucket, leaky-bucket",
            "ERR limit must be at least 1, not 0",
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "ERR no such policy 'api'",
            "ERR wrong number of arguments for 'get' command",
            "EXECABORT Transaction discarded because of previous errors.",
        ] {
            assert!(!refuses_one_argument(other), "{other}");
        }
        // A refusal of a call in flight when another's refusal changed the form: sent again too.
        let engine = crate::engine::Engine::new(EngineChoice::Auto, "fn:".into());
        engine.set_one_argument(Some(-3));
        let refused = "ERR unknown algorithm 'gcra 10 1s': expected token-bucket";
        assert!(engine.one_argument_refused(refused));
        assert!(!engine.one_argument());
        assert!(
            engine.one_argument_refused(refused),
            "in flight: again as words"
        );
        assert!(!engine.one_argument());
        engine.set_one_argument(Some(-3));
        assert!(!engine.one_argument_refused("ERR limit must be at least 1, not 0"));
        assert!(engine.one_argument(), "another error changes nothing");
    }

    #[tokio::test]
    async fn a_call_refused_as_one_argument_goes_again_as_words_and_words_from_then_on() {
        let limit = Limit::new(crate::Algorithm::Gcra, 10, "1s").unwrap();
        let words = "gcra 10 1000ms";
        // The module's path (no cache), and `decide`'s (a denial cache): the same.
        for denial_cache in [0, 10] {
            let server = Scripted::default();
            let options = Options {
                denial_cache,
                ..Options::default()
            };
            let limiter = RateLimiter::new(server.clone(), options).unwrap();
            let check = |key: &'static str| limiter.check(key, &limit, Call::cost(1));
            assert!(check("k").await.unwrap().allowed);
            assert_eq!(
                server.take_sent(),
                [
                    format!("RATELIMIT.CHECK k {words}"),
                    "COMMAND INFO RATELIMIT.CHECK".into()
                ]
            );
            let d = check("k").await.unwrap();
            assert_eq!(d.source, Source::Module);
            let spec = format!("RATELIMIT.CHECK k {}", limit.spec_arg()[0]);
            assert_eq!(server.take_sent(), std::slice::from_ref(&spec));
            assert!(spec.ends_with(words), "one argument: its words, spaced");

            // A node of the older module: refused as one argument, sent again as words (once).
            server.old.store(true, Ordering::Relaxed);
            let d = check("k").await.unwrap();
            assert!(d.allowed && d.source == Source::Module, "{d:?}");
            let words_sent = format!("RATELIMIT.CHECK k {words}");
            assert_eq!(server.take_sent(), [spec.clone(), words_sent.clone()]);
            assert_eq!(
                limiter.stats()["commands"],
                4,
                "1, 1, then 2 (COMMAND INFO: none)"
            );
            // Words from then on, whatever the verb.
            check("k").await.unwrap();
            limiter.take("k", &limit, Call::cost(2)).await.unwrap();
            assert_eq!(
                server.take_sent(),
                [words_sent, format!("RATELIMIT.TAKE k {words} MAX 2")]
            );
        }
    }

    #[tokio::test]
    async fn check_all_refused_as_one_argument_goes_again_as_words() {
        let limit = Limit::new(crate::Algorithm::Gcra, 10, "1s").unwrap();
        let server = Scripted::default();
        let limiter = RateLimiter::new(server.clone(), Options::default()).unwrap();
        limiter.check("k", &limit, Call::cost(1)).await.unwrap();
        server.take_sent();
        server.old.store(true, Ordering::Relaxed);
        let pairs = [("a", limit.clone()), ("b", limit.clone())];
        let multi = limiter.check_all(&pairs, Call::cost(1)).await.unwrap();
        assert!(multi.overall.allowed);
        let one = &limit.spec_arg()[0];
        assert_eq!(
            server.take_sent(),
            [
                format!("RATELIMIT.CHECKALL 2 a b {one} {one}"),
                "RATELIMIT.CHECKALL 2 a b gcra 10 1000ms gcra 10 1000ms".to_string(),
            ]
        );
        assert!(!limiter.inner.engine.one_argument());
    }

    #[tokio::test]
    async fn a_shadow_policy_s_multi_aborted_as_one_argument_goes_again_as_words() {
        let limit = Limit::new(crate::Algorithm::Gcra, 10, "1s").unwrap();
        let dark = Policy::new("dark").unwrap();
        let server = Scripted::default();
        let limiter = RateLimiter::new(server.clone(), Options::default()).unwrap();
        limiter.check("k", &limit, Call::cost(1)).await.unwrap();
        limiter.check("d", &dark, Call::cost(1)).await.unwrap();
        let one = "MULTI RATELIMIT.PEEK|d|fixed-window 2 1000ms / RATELIMIT.CHECK|d|POLICY dark";
        assert_eq!(server.take_sent()[3..], [one]);
        // The older module: CHECK key "POLICY dark" is short of its arity -4.
        server.old.store(true, Ordering::Relaxed);
        assert!(
            limiter
                .check("d", &dark, Call::cost(1))
                .await
                .unwrap()
                .allowed
        );
        let words = "MULTI RATELIMIT.PEEK|d|fixed-window|2|1000ms / RATELIMIT.CHECK|d|POLICY|dark";
        assert_eq!(server.take_sent(), [one, words]);
        assert!(!limiter.inner.engine.one_argument());
    }

    #[tokio::test]
    async fn another_error_is_not_sent_again_and_reaches_the_caller() {
        let limit = Limit::new(crate::Algorithm::Gcra, 10, "1s").unwrap();
        for denial_cache in [0, 10] {
            let server = Scripted::default();
            let options = Options {
                denial_cache,
                ..Options::default()
            };
            let limiter = RateLimiter::new(server.clone(), options).unwrap();
            limiter.check("k", &limit, Call::cost(1)).await.unwrap();
            server.take_sent();
            for refusal in [
                "WRONGTYPE Operation against a key holding the wrong kind of value",
                "unknown algorithm 'gcra10': expected token-bucket",
            ] {
                *lock(&server.refuse) = Some(refusal.into());
                let error = limiter.check("k", &limit, Call::cost(1)).await.unwrap_err();
                assert!(
                    matches!(&error, Error::Server(text) if text.contains(refusal)),
                    "{error:?}"
                );
                assert_eq!(server.take_sent().len(), 1, "sent once");
                assert!(limiter.inner.engine.one_argument(), "still one argument");
            }
        }
    }
}
