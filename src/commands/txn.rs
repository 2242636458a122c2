//! The one write path: every command that reads or writes a limiter key goes through a [`Txn`].
//!
//! A command's work on a key is always the same sequence, and a `Txn` owns it:
//!
//! 1. **open** the key ([`Txn::open`]), for reading or for writing;
//! 2. **decide**: the command asks a core, on the limiter the key holds ([`Txn::slot`]);
//! 3. **store**: a changed limiter is written by [`LimiterRef::store`](redis_ratelimit_core::value::LimiterRef::store),
//!    a new one by [`Txn::create`]; nothing is ever written when a handle or a `Txn` drops, so a
//!    call that decided not to write simply does not store (PEEK, a rejection, `COST 0`);
//! 4. then [`Txn::commit`], in this order:
//!    - **expire**: the key's absolute expiry ([`Txn::expire_at`]), or its deletion
//!      ([`Txn::delete`]), once its value is stored (Redis drops the expiry of a key whose
//!      value is replaced by a new one);
//!    - **replicate**: the writes staged with [`Txn::replicate`] (`rla key payload`, the state
//!      with its explicit time, never the command itself: a replica must not read its own
//!      clock), in the order they were staged, then [`Txn::replicate_del`] or, for the
//!      deterministic commands (`RATELIMIT.APPLY`, `RATELIMIT.RESET`), [`Txn::replicate_verbatim`];
//!      nothing when nothing was written;
//!    - **close** the key: before anything below, because a subscriber to keyspace events may
//!      touch it, and Redis caches the value in the open handle;
//!    - **count** the decision ([`Txn::count`]): the algorithm's counters and a policy's;
//!    - **notify**: the module keyspace events staged with [`Txn::notify`]
//!      (`ratelimit.rejected`, `ratelimit.shadow-rejected`, `ratelimit.blocked`).
//!
//! A command that returns early (an error reply) drops its `Txn` uncommitted: nothing was
//! stored, so there is nothing to expire, replicate, count or notify, and the key closes.
//!
//! Counting the *calls* of the counted commands (`stats::count_call`, for `CONFIG RESETSTAT`) is
//! not per key: the handler of every [`counted`](super::registry::Command::counted) command does it, first thing,
//! from its declaration (see [`handler!`](super::call::handler) and `registry::register`).

use std::ffi::{c_int, CStr};

use redis_module::raw;
use redis_ratelimit_core::algorithms::Kind;
use redis_ratelimit_core::codec::StackBuf;
use redis_ratelimit_core::error;
use redis_ratelimit_core::policy::Counters;
use redis_ratelimit_core::value::Refused;

use super::apply::MAX_PAIRS;
use super::call::Call;
use crate::api::rm;
use crate::log::log_warning;
use crate::stats;
use crate::store::{Key, Slot, APPLY_SHORT_NAME};

/// What happens to the key's lifetime at commit.
#[derive(Clone, Copy, PartialEq, Eq)]
enum After {
    /// Nothing: the key was not written.
    Nothing,
    /// `SetAbsExpire` at this time (ms since the epoch).
    Expire(u64),
    /// The key is deleted (a refund or a release left it fresh).
    Delete,
}

/// The events a commit raises, in this order.
const EVENTS: [&CStr; 3] = [
    c"ratelimit.rejected",
    c"ratelimit.shadow-rejected",
    c"ratelimit.blocked",
];

/// A module keyspace event on the key, raised at commit once the key is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// A request was rejected.
    Rejected = 0,
    /// A policy in shadow mode admitted a request its limit rejects.
    ShadowRejected = 1,
    /// A rejection started a block.
    Blocked = 2,
}

/// One decision to count at commit.
struct Count<'c> {
    kind: Kind,
    allowed: bool,
    /// A block decided it.
    blocked: bool,
    /// The counters of the policy the call went through, and whether shadow mode admitted a
    /// rejection.
    policy: Option<(&'c Counters, bool)>,
}

/// What a [`Txn`] stages beyond one payload and one count.
#[derive(Default)]
struct More<'c> {
    payloads: Vec<StackBuf>,
    counts: Vec<Count<'c>>,
}

/// One command's work on one key: see the module documentation for the sequence it owns.
pub(crate) struct Txn<'c> {
    call: &'c Call,
    name: *mut raw::RedisModuleString,
    key: Key,
    after: After,
    /// The first staged replication payload (most commands stage one at most)...
    payload: StackBuf,
    staged: bool,
    /// ... and the ones after it (CHECKALL naming a key twice, a block after a write), with
    /// the decisions counted after the first: boxed, so a plain CHECK carries one word of it.
    more: Option<Box<More<'c>>>,
    replicate_del: bool,
    /// `ReplicateVerbatim`: the command itself replicates (APPLY, RESET: deterministic).
    verbatim: bool,
    /// The decision to count (most commands count one at most).
    count: Option<Count<'c>>,
    /// Bit `e` set: event `e` of [`EVENTS`] is raised.
    events: u8,
}

impl<'c> Txn<'c> {
    /// Opens the key `name` (one of the call's arguments), for writing or for reading only.
    #[inline(always)]
    pub fn open(call: &'c Call, name: *mut raw::RedisModuleString, write: bool) -> Txn<'c> {
        Txn {
            call,
            name,
            key: Key::open(call.ctx, name, write),
            after: After::Nothing,
            payload: StackBuf::default(),
            staged: false,
            more: None,
            replicate_del: false,
            verbatim: false,
            count: None,
            events: 0,
        }
    }

    /// What the key holds, to decide on (and store a change through). Inlined: the caller's
    /// slot is built in place, not copied out (`make profile`).
    #[inline(always)]
    pub fn slot(&mut self) -> Slot<'_> {
        self.key.slot()
    }

    /// Stores a new limiter in the key (it held none, or one to replace whole).
    pub fn create(
        &mut self,
        limiter: redis_ratelimit_core::algorithms::Limiter,
    ) -> Result<(), Refused> {
        if self.key.set(limiter) {
            Ok(())
        } else {
            Err(Refused)
        }
    }

    /// The key's value was stored: it expires at `at_ms` (ms since the epoch).
    #[inline(always)]
    pub fn expire_at(&mut self, at_ms: u64) {
        self.after = After::Expire(at_ms);
    }

    /// The key is to be deleted.
    pub fn delete(&mut self) {
        self.after = After::Delete;
    }

    /// A buffer to write one replication payload into (`ratelimit.apply`'s, a
    /// [`Change`](redis_ratelimit_core::codec::Change)); it is replicated at commit, after the ones
    /// staged before it.
    #[inline(always)]
    pub fn replicate(&mut self) -> &mut StackBuf {
        if !self.staged {
            self.staged = true;
            return &mut self.payload;
        }
        let payloads = &mut self.more.get_or_insert_with(Box::default).payloads;
        payloads.push(StackBuf::default());
        let last = payloads.len() - 1;
        &mut payloads[last]
    }

    /// The key's deletion is replicated as `DEL key`.
    pub fn replicate_del(&mut self) {
        self.replicate_del = true;
    }

    /// The command replicates as it was called (`ReplicateVerbatim`: a deterministic command).
    pub fn replicate_verbatim(&mut self) {
        self.verbatim = true;
    }

    /// Counts one decision at commit (each call counts one more): `kind`'s counters and, for a
    /// call through a policy, the policy's (`shadowed`: shadow mode admitted a rejection).
    #[inline(always)]
    pub fn count(
        &mut self,
        kind: Kind,
        allowed: bool,
        blocked: bool,
        policy: Option<(&'c Counters, bool)>,
    ) {
        let count = Count {
            kind,
            allowed,
            blocked,
            policy,
        };
        match self.count {
            None => self.count = Some(count),
            Some(_) => self
                .more
                .get_or_insert_with(Box::default)
                .counts
                .push(count),
        }
    }

    /// Raises `event` on the key at commit (once, however many times it is staged).
    #[inline(always)]
    pub fn notify(&mut self, event: Event) {
        self.events |= 1 << event as u8;
    }

    /// `event` is staged ([`notify`](Txn::notify)).
    #[inline(always)]
    pub fn notifies(&self, event: Event) -> bool {
        self.events & (1 << event as u8) != 0
    }

    /// Expires (or deletes), replicates, closes, counts and notifies, in that order (see the
    /// module documentation). Every store happened before: this writes no value. Once per
    /// transaction: it ends with the key closed (by reference, not by value: a `Txn` carries its
    /// payload buffer, which a move would copy on every CHECK).
    #[inline(always)]
    pub fn commit(&mut self) {
        self.close();
        self.finish();
    }

    /// [`commit`](Txn::commit) of a command's transactions on several keys (CHECKALL, RESET):
    /// each key expires, replicates and closes, in order, before anything is counted or
    /// notified (a subscriber to keyspace events may touch any of them).
    pub fn commit_all(txns: &mut [Txn<'c>]) {
        // A batch of plain payload writes, one per key, replicates as one multi-pair `rla`
        // per `MAX_PAIRS` keys (one RM_Replicate instead of one per key); anything with a
        // deletion, a verbatim replication or several payloads on a key, one `rla` per write.
        let batched = txns.len() > 1 && txns.iter().all(Txn::batchable);
        for txn in txns.iter_mut() {
            txn.close_into(batched);
        }
        if batched {
            replicate_batch(txns);
        }
        for txn in txns.iter_mut() {
            txn.finish();
        }
    }

    /// The transaction's writes replicate as one key-payload pair at most, nothing else.
    fn batchable(&self) -> bool {
        !self.replicate_del
            && !self.verbatim
            && self
                .more
                .as_deref()
                .is_none_or(|more| more.payloads.is_empty())
    }

    /// Expires (or deletes), replicates, then closes the key.
    #[inline(always)]
    fn close(&mut self) {
        self.close_into(false);
    }

    /// [`close`](Txn::close), but with `batched` the one payload of a
    /// [`batchable`](Txn::batchable) transaction is left for [`commit_all`](Txn::commit_all)
    /// to replicate with the others.
    #[inline(always)]
    fn close_into(&mut self, batched: bool) {
        match self.after {
            After::Nothing => {}
            After::Expire(at_ms) => self.key.expire_at(at_ms),
            After::Delete => self.key.delete(),
        }
        if self.staged && !batched {
            // The first payload, then the rare ones after it (no iterator over both: every
            // consuming CHECK runs this).
            if let Some(bytes) = self.payload.as_slice() {
                replicate_apply(self.call, self.name, bytes);
            }
            if let Some(more) = self.more.as_deref() {
                for payload in &more.payloads {
                    if let Some(bytes) = payload.as_slice() {
                        replicate_apply(self.call, self.name, bytes);
                    }
                }
            }
        }
        if self.replicate_del {
            replicate_del_key(self.call, self.name);
        }
        if self.verbatim {
            super::call::replicate_verbatim(self.call);
        }
        self.key.close();
    }

    /// Counts, then notifies (the key closed).
    #[inline(always)]
    fn finish(&mut self) {
        if let Some(count) = self.count.take() {
            count.apply();
            if let Some(more) = &mut self.more {
                for count in std::mem::take(&mut more.counts) {
                    count.apply();
                }
            }
        }
        if self.events != 0 {
            for (i, event) in EVENTS.iter().enumerate() {
                if self.events & (1 << i) != 0 {
                    notify(self.call, self.name, event);
                }
            }
        }
    }
}

impl Count<'_> {
    /// Counts the decision in `INFO ratelimit`'s counters and its policy's.
    #[inline(always)]
    fn apply(self) {
        stats::count_decision(self.kind, self.allowed);
        if self.blocked {
            stats::count_blocked(self.kind);
        }
        if let Some((counters, shadowed)) = self.policy {
            counters.count(self.allowed, shadowed, self.blocked);
        }
    }
}

/// Raises the module keyspace event `event` on the key (Redis drops it unless module events are
/// on). Only with the key closed: a subscriber may touch the key.
fn notify(call: &Call, key_name: *mut raw::RedisModuleString, event: &'static CStr) {
    // SAFETY: the command's context, a static NUL-terminated event name and the command's key.
    unsafe {
        rm!(RedisModule_NotifyKeyspaceEvent)(
            call.ctx,
            raw::REDISMODULE_NOTIFY_MODULE,
            event.as_ptr(),
            key_name,
        )
    };
}

/// Replicates (and appends to the AOF) `rla key payload` (`ratelimit.apply`'s short name).
fn replicate_apply(call: &Call, key: *mut raw::RedisModuleString, payload: &[u8]) {
    // SAFETY: a registered command; "sb" = a key string and a buffer, both valid for the call.
    let status = unsafe {
        rm!(RedisModule_Replicate)(
            call.ctx,
            APPLY_SHORT_NAME.as_ptr(),
            c"sb".as_ptr(),
            key,
            payload.as_ptr().cast::<std::ffi::c_char>(),
            payload.len(),
        )
    };
    if status != raw::REDISMODULE_OK as c_int {
        log_warning("ratelimit: could not replicate a limiter write");
    }
}

/// One write of a batch: the key's name and its payload.
type Pair<'a> = (*mut raw::RedisModuleString, &'a [u8]);

/// Replicates (and appends to the AOF) the writes of `txns` (one payload each at most) as
/// `rla k1 p1 [k2 p2 ...]`, at most [`MAX_PAIRS`] pairs a command (a lone pair as
/// [`replicate_apply`] does). On the stack: no allocation per call.
fn replicate_batch(txns: &[Txn]) {
    let Some(call) = txns.first().map(|txn| txn.call) else {
        return;
    };
    let mut chunk: [Pair; MAX_PAIRS] = [(std::ptr::null_mut(), &[]); MAX_PAIRS];
    let mut len = 0;
    let pairs = txns
        .iter()
        .filter(|txn| txn.staged)
        .filter_map(|txn| Some((txn.name, txn.payload.as_slice()?)));
    for pair in pairs {
        chunk[len] = pair;
        len += 1;
        if len == MAX_PAIRS {
            replicate_pairs(call, &chunk);
            len = 0;
        }
    }
    replicate_pairs(call, &chunk[..len]);
}

/// `RM_Replicate` of `rla` with these pairs (none: nothing), each an "sb" of the format: the
/// key string and its payload buffer, which Redis copies (no string to create and free here).
fn replicate_pairs(call: &Call, pairs: &[Pair]) {
    macro_rules! replicate {
        ($format:literal, $($i:literal)+) => {
            // SAFETY: a registered command; "sb" per pair = a key string and a buffer, both
            // valid for the call.
            unsafe {
                rm!(RedisModule_Replicate)(
                    call.ctx,
                    APPLY_SHORT_NAME.as_ptr(),
                    $format.as_ptr(),
                    $(
                        pairs[$i].0,
                        pairs[$i].1.as_ptr().cast::<std::ffi::c_char>(),
                        pairs[$i].1.len(),
                    )+
                )
            }
        };
    }
    const _: () = assert!(MAX_PAIRS == 8);
    let status = match pairs.len() {
        0 => return,
        1 => return replicate_apply(call, pairs[0].0, pairs[0].1),
        2 => replicate!(c"sbsb", 0 1),
        3 => replicate!(c"sbsbsb", 0 1 2),
        4 => replicate!(c"sbsbsbsb", 0 1 2 3),
        5 => replicate!(c"sbsbsbsbsb", 0 1 2 3 4),
        6 => replicate!(c"sbsbsbsbsbsb", 0 1 2 3 4 5),
        7 => replicate!(c"sbsbsbsbsbsbsb", 0 1 2 3 4 5 6),
        _ => replicate!(c"sbsbsbsbsbsbsbsb", 0 1 2 3 4 5 6 7),
    };
    if status != raw::REDISMODULE_OK as c_int {
        log_warning("ratelimit: could not replicate a batch of limiter writes");
    }
}

/// Replicates (and appends to the AOF) `DEL key`: a refund or a release left the key fresh.
fn replicate_del_key(call: &Call, key: *mut raw::RedisModuleString) {
    // SAFETY: the command's context; "s" = the command's key string, valid for the call.
    let status =
        unsafe { rm!(RedisModule_Replicate)(call.ctx, c"DEL".as_ptr(), c"s".as_ptr(), key) };
    if status != raw::REDISMODULE_OK as c_int {
        log_warning("ratelimit: could not replicate a limiter's removal");
    }
}

/// The reply for a value the key refused (never seen: Redis refuses only a key not opened for
/// writing, and the commands that store open theirs for writing).
pub(crate) fn refused(_: Refused) -> String {
    log_warning("ratelimit: a key refused its changed limiter; nothing was changed");
    error::INTERNAL.to_string()
}
