//! Named policies: limits defined once on the server (`RATELIMIT.POLICY SET`) and named by calls
//! (`RATELIMIT.CHECK key POLICY name`), with a mode (enforce or shadow) and counters per policy.
//!
//! This is the pure part: what a policy is, what a valid name is, what shadow mode does to a
//! decision, and the table of policies with their counters. No Redis in here; the store saves the
//! table in the RDB (`store/policies.rs`), the commands define, list and use it
//! (`commands/policy.rs`).
//!
//! A limiter key never stores a policy's name: a call through a policy is the same call with the
//! policy's parameters, so deleting or replacing a policy leaves its keys as they are.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::algorithms::{Decision, Kind, Params};

/// The longest policy name.
pub const MAX_NAME_LEN: usize = 64;

/// Whether `name` is a policy name: 1 to 64 bytes of `A-Z a-z 0-9 _ - .` (no `:`, so that an INFO
/// line `ratelimit_policy_<name>:...` splits where every scraper splits it).
pub fn valid_name(name: &[u8]) -> bool {
    (1..=MAX_NAME_LEN).contains(&name.len())
        && name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// What a policy does with a request its limit rejects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Rejects it.
    Enforce,
    /// Admits it in the answer (the state stays what enforcement leaves: the request is not
    /// counted), and counts it as `shadow_rejected`.
    Shadow,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
        }
    }
}

/// A policy's definition: the limit a call through it applies, and its mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// What it limits: a rate of one algorithm, or leases (`concurrency`).
    pub kind: Kind,
    pub params: Params,
    pub mode: Mode,
    /// `BLOCK duration`, in ms: how long a rejection through the policy blocks its key.
    pub block_ms: Option<u64>,
}

/// The answer a call through a policy in `mode` gives for the limit's `decision`: in shadow mode
/// a rejection is answered as admitted (`allowed` 1, `retry_after_ms` 0, every other field as
/// enforcement answers it). Returns the answer and whether shadow mode turned a rejection into it.
pub fn answer(decision: Decision, mode: Mode) -> (Decision, bool) {
    if mode == Mode::Shadow && !decision.allowed {
        let admitted = Decision {
            allowed: true,
            retry_after_ms: 0,
            ..decision
        };
        (admitted, true)
    } else {
        (decision, false)
    }
}

/// One policy's counters, for `INFO ratelimit` (`CHECK` and `CHECKALL` calls, not `PEEK`).
#[derive(Debug, Default)]
pub struct Counters {
    /// Answered admitted.
    allowed: AtomicU64,
    /// Answered rejected.
    rejected: AtomicU64,
    /// Answered admitted only because the policy is in shadow mode (counted in `allowed` too).
    shadow_rejected: AtomicU64,
    /// Rejected because the key was blocked (`BLOCK`; counted in `rejected` too).
    blocked: AtomicU64,
}

/// A snapshot of [`Counters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    pub calls: u64,
    pub allowed: u64,
    pub rejected: u64,
    pub shadow_rejected: u64,
    pub blocked: u64,
}

impl Counters {
    /// Counts one answer (`blocked`: a block decided it).
    pub fn count(&self, allowed: bool, shadowed: bool, blocked: bool) {
        if allowed {
            self.allowed.fetch_add(1, Relaxed);
        } else {
            self.rejected.fetch_add(1, Relaxed);
        }
        if shadowed {
            self.shadow_rejected.fetch_add(1, Relaxed);
        }
        if blocked {
            self.blocked.fetch_add(1, Relaxed);
        }
    }

    pub fn figures(&self) -> Figures {
        let allowed = self.allowed.load(Relaxed);
        let rejected = self.rejected.load(Relaxed);
        Figures {
            calls: allowed + rejected,
            allowed,
            rejected,
            shadow_rejected: self.shadow_rejected.load(Relaxed),
            blocked: self.blocked.load(Relaxed),
        }
    }

    /// Takes `earlier` (a snapshot of these counters) off them: what was counted since.
    pub fn subtract(&self, earlier: &Figures) {
        let sub = |counter: &AtomicU64, value: u64| {
            let _ = counter.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(value)));
        };
        sub(&self.allowed, earlier.allowed);
        sub(&self.rejected, earlier.rejected);
        sub(&self.shadow_rejected, earlier.shadow_rejected);
        sub(&self.blocked, earlier.blocked);
    }
}

/// Policies by name, as saved and restored (sorted by name).
pub type Definitions = Vec<(Box<[u8]>, Policy)>;

/// A defined policy and its counters. Shared (`Arc`) so that a call holds its policy while it
/// runs without holding the table's lock.
#[derive(Debug)]
pub struct Entry {
    pub policy: Policy,
    pub counters: Arc<Counters>,
}

/// A hash for the table's names: a multiply-rotate over 8 bytes at a time (names are short and
/// looked up on every call through a policy).
#[derive(Default)]
pub struct NameHash(u64);

impl Hasher for NameHash {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        let mut word = [0u8; 8];
        word[..rest.len()].copy_from_slice(rest);
        self.mix(u64::from_le_bytes(word) ^ (rest.len() as u64) << 59);
    }

    fn write_usize(&mut self, value: usize) {
        self.mix(value as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl NameHash {
    fn mix(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// What [`Table::set`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetOutcome {
    /// A new name.
    Added,
    /// An existing name now has another definition.
    Replaced,
    /// The name already had this very definition: nothing changed.
    Unchanged,
    /// A new name, refused: the table holds its bound already.
    Full,
}

/// The policies by name.
#[derive(Debug, Default)]
pub struct Table {
    by_name: HashMap<Box<[u8]>, Entry, BuildHasherDefault<NameHash>>,
}

impl Table {
    /// The policy named `name`, with its counters.
    #[inline]
    pub fn get(&self, name: &[u8]) -> Option<(Policy, Arc<Counters>)> {
        self.by_name
            .get(name)
            .map(|entry| (entry.policy, Arc::clone(&entry.counters)))
    }

    /// Defines `name` (a valid name) as `policy`, unless it is new and the table already holds
    /// `max` policies. A replaced policy keeps its counters.
    pub fn set(&mut self, name: &[u8], policy: Policy, max: usize) -> SetOutcome {
        if let Some(entry) = self.by_name.get_mut(name) {
            if entry.policy == policy {
                return SetOutcome::Unchanged;
            }
            entry.policy = policy;
            return SetOutcome::Replaced;
        }
        if self.by_name.len() >= max {
            return SetOutcome::Full;
        }
        self.by_name.insert(
            name.into(),
            Entry {
                policy,
                counters: Arc::default(),
            },
        );
        SetOutcome::Added
    }

    /// Removes `name`; whether it existed.
    pub fn delete(&mut self, name: &[u8]) -> bool {
        self.by_name.remove(name).is_some()
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Every policy, sorted by name (bytewise).
    pub fn sorted(&self) -> BTreeMap<&[u8], &Entry> {
        self.by_name
            .iter()
            .map(|(name, entry)| (&name[..], entry))
            .collect()
    }

    /// Every policy's counters now, by name.
    pub fn figures(&self) -> HashMap<Box<[u8]>, Figures> {
        self.by_name
            .iter()
            .map(|(name, entry)| (name.clone(), entry.counters.figures()))
            .collect()
    }

    /// Takes a snapshot from [`Table::figures`] off the counters of the policies still there.
    pub fn subtract(&self, earlier: &HashMap<Box<[u8]>, Figures>) {
        for (name, figures) in earlier {
            if let Some(entry) = self.by_name.get(name) {
                entry.counters.subtract(figures);
            }
        }
    }

    /// Takes the counters of the names `other` holds too (a reloaded table keeps its figures).
    pub fn adopt_counters(&mut self, other: &Table) {
        for (name, entry) in self.by_name.iter_mut() {
            if let Some(old) = other.by_name.get(name) {
                entry.counters = Arc::clone(&old.counters);
            }
        }
    }

    /// The definitions without their counters (a copy, to save or to restore).
    pub fn definitions(&self) -> Definitions {
        let mut list: Vec<_> = self
            .by_name
            .iter()
            .map(|(name, entry)| (name.clone(), entry.policy))
            .collect();
        list.sort_by(|a, b| a.0.cmp(&b.0));
        list
    }

    /// A table of these definitions, counters at zero.
    pub fn from_definitions(definitions: Definitions) -> Table {
        let mut table = Table::default();
        for (name, policy) in definitions {
            table.by_name.insert(
                name,
                Entry {
                    policy,
                    counters: Arc::default(),
                },
            );
        }
        table
    }
}

/// The server's policies. Redis runs commands, type callbacks and events on its main thread (a
/// forked child saving the RDB has only that thread), so the lock is never contended; it keeps
/// the table sound whatever calls it.
static TABLE: Mutex<Option<Table>> = Mutex::new(None);

/// The server's table of policies, locked. Do not call back into Redis while holding it.
pub fn table() -> TableGuard {
    TableGuard(
        TABLE
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
    )
}

/// The locked table (created empty on first use).
pub struct TableGuard(MutexGuard<'static, Option<Table>>);

impl std::ops::Deref for TableGuard {
    type Target = Table;

    fn deref(&self) -> &Table {
        static EMPTY: std::sync::OnceLock<Table> = std::sync::OnceLock::new();
        self.0
            .as_ref()
            .unwrap_or_else(|| EMPTY.get_or_init(Table::default))
    }
}

impl std::ops::DerefMut for TableGuard {
    fn deref_mut(&mut self) -> &mut Table {
        self.0.get_or_insert_with(Table::default)
    }
}

impl TableGuard {
    /// Puts `table` in place of the server's and returns the one it replaces.
    pub fn replace(&mut self, table: Table) -> Table {
        std::mem::replace(&mut **self, table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(limit: u64, mode: Mode) -> Policy {
        Policy {
            kind: Kind::Rate(crate::algorithms::Algorithm::SlidingWindow),
            params: Params::new(limit, 60_000, None).unwrap(),
            mode,
            block_ms: None,
        }
    }

    #[test]
    fn names_are_64_bytes_of_letters_digits_and_three_marks() {
        for good in [&b"a"[..], b"api.v2_read-heavy", &[b'x'; 64], b"0", b"..."] {
            assert!(valid_name(good), "{good:?}");
        }
        for bad in [
            &b""[..],
            &[b'x'; 65],
            b"a:b",
            b"a b",
            b"caf\xc3\xa9",
            b"a/b",
            b"a\0",
        ] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn shadow_mode_admits_what_enforcement_rejects_and_says_so() {
        let rejected = Decision {
            allowed: false,
            limit: 5,
            remaining: 0,
            retry_after_ms: 700,
            reset_after_ms: 9_000,
            delay_ms: 0,
        };
        let admitted = Decision {
            allowed: true,
            retry_after_ms: 0,
            ..rejected
        };
        assert_eq!(answer(rejected, Mode::Enforce), (rejected, false));
        assert_eq!(answer(rejected, Mode::Shadow), (admitted, true));
        assert_eq!(answer(admitted, Mode::Shadow), (admitted, false));
        let never = Decision {
            retry_after_ms: -1,
            ..rejected
        };
        assert_eq!(answer(never, Mode::Shadow), (admitted, true));
    }

    #[test]
    fn a_table_sets_replaces_and_bounds_its_policies() {
        let mut table = Table::default();
        assert_eq!(
            table.set(b"a", policy(5, Mode::Enforce), 2),
            SetOutcome::Added
        );
        assert_eq!(
            table.set(b"a", policy(5, Mode::Enforce), 2),
            SetOutcome::Unchanged
        );
        let (_, counters) = table.get(b"a").unwrap();
        counters.count(false, false, false);
        // A new definition (here: the mode) keeps the counters.
        assert_eq!(
            table.set(b"a", policy(5, Mode::Shadow), 2),
            SetOutcome::Replaced
        );
        assert_eq!(table.get(b"a").unwrap().0.mode, Mode::Shadow);
        assert_eq!(table.get(b"a").unwrap().1.figures().rejected, 1);
        assert_eq!(
            table.set(b"b", policy(6, Mode::Enforce), 2),
            SetOutcome::Added
        );
        assert_eq!(
            table.set(b"c", policy(7, Mode::Enforce), 2),
            SetOutcome::Full
        );
        // Replacing needs no room.
        assert_eq!(
            table.set(b"b", policy(8, Mode::Enforce), 2),
            SetOutcome::Replaced
        );
        let names: Vec<&[u8]> = table.sorted().keys().copied().collect();
        assert_eq!(names, [&b"a"[..], b"b"]);
        assert!(table.delete(b"a"));
        assert!(!table.delete(b"a"));
        assert!(table.get(b"a").is_none());
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn counters_count_answers_and_a_snapshot_comes_off_them() {
        let mut table = Table::default();
        table.set(b"p", policy(5, Mode::Shadow), 10);
        let (_, counters) = table.get(b"p").unwrap();
        counters.count(true, false, false);
        counters.count(true, true, false);
        counters.count(false, false, false);
        let figures = counters.figures();
        assert_eq!(
            figures,
            Figures {
                calls: 3,
                allowed: 2,
                rejected: 1,
                shadow_rejected: 1,
                blocked: 0,
            }
        );
        let snapshot = table.figures();
        counters.count(true, true, false);
        table.subtract(&snapshot);
        assert_eq!(
            counters.figures(),
            Figures {
                calls: 1,
                allowed: 1,
                rejected: 0,
                shadow_rejected: 1,
                blocked: 0,
            }
        );
    }

    #[test]
    fn the_name_hash_tells_every_length_apart() {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let build = BuildHasherDefault::<NameHash>::default();
        let hashes: std::collections::HashSet<u64> = (0..=64)
            .map(|n| build.hash_one(&vec![0u8; n][..]))
            .collect();
        assert_eq!(hashes.len(), 65);
    }
}
