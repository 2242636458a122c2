//! By id: the lease set's open-addressing table of handles.
//!
//! Linear probing with backward-shift deletion (no tombstones). Each slot holds a handle and 5
//! bits of the id's hash (so a probe seldom reads a record it does not want). The hash is SipHash
//! with keys drawn at random once per process, so ids chosen to collide cannot be precomputed.
//!
//! Invariants (checked by `Leases::check_table` in test builds):
//! - one slot per lease, holding its handle, and every id is found from its home slot by probing
//!   without crossing a free slot;
//! - the table is kept between 1/2 and 4/5 full (rebuilt 16/25 full, at least 8 slots) and is
//!   allocated exactly: at most `max(8, 2n)` slots of 4 bytes.

use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;

use super::records::{HANDLE_BITS, HANDLE_MASK};
use super::Leases;

/// A free table slot (fingerprint 31 and the handle of place 2^20 − 1, which is never used).
pub(super) const EMPTY: u32 = u32::MAX;

/// The process's hash keys, drawn once.
pub(super) fn hash(id: &[u8]) -> u64 {
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    KEYS.get_or_init(RandomState::new).hash_one(id)
}

/// Where `hash` starts probing in a table of `capacity` slots (any size, not only powers of 2).
pub(super) fn home(hash: u64, capacity: usize) -> usize {
    ((u128::from(hash) * capacity as u128) >> 64) as usize
}

/// The 5 bits of `hash` a slot keeps beside its handle (the low ones: `home` uses the high ones).
pub(super) fn fingerprint(hash: u64) -> u32 {
    (hash & 31) as u32
}

/// The table's size for `len` handles: 25/16 of them (16/25 full).
pub(super) fn table_size(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        (len * 25 / 16).max(8)
    }
}

impl Leases {
    /// The table slot holding `id`'s handle.
    pub(super) fn find(&self, id: &[u8], hash: u64) -> Option<usize> {
        let capacity = self.table.len();
        if capacity == 0 {
            return None;
        }
        let records = self.records();
        let finger = fingerprint(hash);
        let mut i = home(hash, capacity);
        loop {
            let slot = self.table[i];
            if slot == EMPTY {
                return None;
            }
            if slot >> HANDLE_BITS == finger && records.id(slot & HANDLE_MASK) == id {
                return Some(i);
            }
            i = if i + 1 == capacity { 0 } else { i + 1 };
        }
    }

    pub(super) fn table_insert(&mut self, h: u32, hash: u64) {
        let len = self.len() + 1;
        if len * 5 > self.table.len() * 4 {
            self.rehash(table_size(len));
        }
        let capacity = self.table.len();
        let mut i = home(hash, capacity);
        while self.table[i] != EMPTY {
            i = if i + 1 == capacity { 0 } else { i + 1 };
        }
        self.table[i] = fingerprint(hash) << HANDLE_BITS | h;
    }

    /// Builds the table again with `size` slots.
    pub(super) fn rehash(&mut self, size: usize) {
        let old = std::mem::take(&mut self.table);
        let mut table = Vec::new();
        table.reserve_exact(size);
        table.resize(size, EMPTY);
        let records = self.records();
        for slot in old.into_iter().filter(|&slot| slot != EMPTY) {
            let mut i = home(hash(records.id(slot & HANDLE_MASK)), size);
            while table[i] != EMPTY {
                i = if i + 1 == size { 0 } else { i + 1 };
            }
            table[i] = slot;
        }
        self.table = table;
    }

    /// Empties table slot `i`, moving back the slots after it that probing would no longer find.
    pub(super) fn table_delete(&mut self, mut hole: usize) {
        let capacity = self.table.len();
        let mut j = hole;
        loop {
            j = if j + 1 == capacity { 0 } else { j + 1 };
            let slot = self.table[j];
            if slot == EMPTY {
                break;
            }
            let k = home(hash(self.records().id(slot & HANDLE_MASK)), capacity);
            // The slot may move to the hole unless its home lies cyclically in (hole, j].
            let stays = if hole <= j {
                hole < k && k <= j
            } else {
                hole < k || k <= j
            };
            if !stays {
                self.table[hole] = slot;
                hole = j;
            }
        }
        self.table[hole] = EMPTY;
    }

    /// The table slot of `handle`, whose id is `id`.
    pub(super) fn find_handle(&self, id: &[u8], handle: u32) -> Option<usize> {
        let capacity = self.table.len();
        let hash = hash(id);
        let mut i = home(hash, capacity);
        loop {
            let slot = self.table[i];
            if slot == EMPTY {
                return None;
            }
            if slot & HANDLE_MASK == handle {
                return Some(i);
            }
            i = if i + 1 == capacity { 0 } else { i + 1 };
        }
    }

    /// Checks the table's invariants (the module documentation) against the handles of the
    /// tree, `order` (tests).
    #[cfg(test)]
    pub(super) fn check_table(&self, order: &[u32]) {
        let records = self.records();
        let used = self.table.iter().filter(|&&s| s != EMPTY).count();
        assert_eq!(used, order.len());
        assert_eq!(self.table.capacity(), self.table.len());
        if !order.is_empty() {
            assert!(used * 5 <= self.table.len() * 4);
            assert!(self.table.len() <= (2 * used).max(table_size(used)));
        }
        for &h in order {
            let id = records.id(h);
            let slot = self.find(id, hash(id)).expect("every id is found");
            assert_eq!(self.table[slot] & HANDLE_MASK, h);
        }
    }
}
