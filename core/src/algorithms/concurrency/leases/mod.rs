//! The lease set of one concurrency key: requests in flight by id, each holding a cost until its
//! expiry, kept so that every operation is O(log n) in the leases held and a lease costs at most
//! 24 bytes more than its id.
//!
//! Three parts index the same leases, each a module with its invariants beside it:
//! - `records`, one *class* per id length: fixed-size records in pages of 32, dense; a lease's
//!   *handle* is its class and its place there. Expiries are stored as offsets from `base_ms`,
//!   40 bits (34 years) wide; the base sits in the middle of that span and moves (every record
//!   rewritten) only when a lease falls outside it.
//! - `table` (by id): an open-addressing table of handles, kept between 1/2 and 4/5 full.
//! - `tree` (by expiry): a B+ tree of handles ordered by `(expiry, id)`, each child of an
//!   inner node carrying its subtree's count, total cost and greatest handle. Leaves hold 64 to
//!   128 handles and inner nodes 16 to 32 children (a node below half is merged with or evened
//!   out with a neighbour), except the last node of each level.
//!
//! # Memory
//!
//! After every operation, with `n` leases, `d` classes (at most the most id lengths held at once
//! since the set was last empty, so at most 128) and [`Leases::heap_bytes`] what is allocated:
//!
//! `heap_bytes ≤ 244 + 52·d + Σ (len(id) + 24)`, so at most `6,900 + Σ (len(id) + 24)`.
//!
//! Every allocation is sized to a rule, and each part's share is:
//! - **records**: `len(id) + 10` bytes a lease (pages are never partly empty but the last,
//!   allocated to its records), and room for one record more in the last page of a class of `m`
//!   leases once `m ≥ 8·(len(id) + 10)`: at most `m/8` bytes, 0.125 a lease.
//! - **the lists of pages**: 16 bytes a page, a list at most a quarter beyond its pages: with
//!   `p` pages for a class of `m` leases, `16·(p + ⌊p/4⌋) ≤ 20 + 20·(p − 1) ≤ 20 + 0.625·m`
//!   (the `p − 1` full pages hold 32 leases each). The class itself, in a list allocated
//!   exactly: 32 bytes. Per class 52 bytes, per lease 0.625.
//! - **the table**: 4 bytes a slot, at most `max(8, 2n)` slots (rebuilt with `25n/16`, at least
//!   8, when more than 4/5 full; with `25n/16` when less than half full and that is smaller):
//!   `4·max(8, 2n) ≤ 24 + 8n` for `n ≥ 1`. Per lease 8, and 24 in the header.
//! - **the tree**: a leaf's array holds fewer than 8 handles beyond its `k`: at most `4k + 28`;
//!   every node but the root is a 48-byte child record in its parent's array, allocated exactly.
//!   A leaf that is not the last holds `k ≥ 64`, so with its record it takes at most
//!   `4k + 76 ≤ 5.1875·k`. An inner node that is not the last of its level has 16 children at
//!   least, all of them not the last either, so at least `16^h·64` handles below it at height
//!   `h`: its record adds at most `48/1024 + 48/16,384 + … < 0.05` a handle over all heights. The
//!   last nodes of the levels are what their handles do not pay for: the last leaf at most 76
//!   bytes (its spare handles and its record), the last inner node of a level its 48-byte record;
//!   below [`MAX_LEASES`] (`2^20 − 2`) leases there are at most 16,384 leaves, 1,024, 64 and 4
//!   inner nodes on the levels above them, so at most 3 levels below the root: `76 + 3·48 = 220`.
//!   Per lease `5.1875 + 0.05 = 5.2375`, and 220 in the header (the root's record is in the set,
//!   not on the heap).
//!
//! Summed: `Σ (len(id) + 10) + (0.125 + 0.625 + 8 + 5.2375)·n + 52·d + 24 + 220`, and
//! `13.9875 ≤ 14`. The sizes the arithmetic counts with (a child record 48 bytes, a class 32, a
//! page's pointer 16) are asserted when the crate compiles; `Leases::check_invariants` (test builds) checks
//! every rule above and the bound itself, and the tests check the bound after every step of random
//! and adversarial sequences.
//!
//! # Time
//!
//! Every operation is O(log n), and what it copies is bounded: the last page of a class is
//! reallocated (at most 32 records, 4,416 bytes at the longest ids) on each insertion and removal
//! of a class of fewer than `8·(len(id) + 10)` leases, and of a larger one only when its spare room
//! is used up or doubled (a lease acquired and released in turn reallocates nothing); a leaf's
//! array 4 handles at a time (at most 512 bytes; it shrinks once 8 are spare); an inner node's
//! array only when a node below it splits or merges; a list of pages by an eighth at a time. The
//! table is rebuilt, each time 16/25 full, once a quarter of `n` has been added or a fifth removed
//! at least: amortized O(1) rehashed slots per call.

mod records;
mod table;
#[cfg(test)]
mod tests;
mod tree;

use std::fmt;

use records::{
    class_of, handle, place_of, read40, write40, Class, Records, FIELD_MAX, HANDLE_MASK, HEAD,
    SLOT_BITS,
};
use table::{hash, table_size};
use tree::{first, node_bytes, nth, prefix, reach, relocate, remove, Child, Node};

/// The longest lease id, in bytes.
pub const MAX_ID_LEN: usize = 128;
/// The most leases one set can hold (a handle's 20 bits of place, less the one an empty table slot
/// uses), whatever the id lengths.
pub const MAX_LEASES: usize = (1 << SLOT_BITS) - 2;
/// The largest cost one lease holds (40 bits; the commands allow up to 10^12).
pub const MAX_COST: u64 = FIELD_MAX;

/// What one lease takes beyond its id, at most, in the memory bound: the set's heap
/// ([`Leases::heap_bytes`]) is at most [`HEADER_BYTES`] + [`CLASS_BYTES`] per class + the sum of
/// `len(id) + LEASE_BYTES` over the leases, after every operation (the module documentation
/// proves it). A class is an id length the set holds, or one it held that no new length has
/// taken over yet: at most the most id lengths held at once since the set was last empty.
pub const LEASE_BYTES: usize = 24;
/// The fixed part of the memory bound (see [`LEASE_BYTES`]).
pub const HEADER_BYTES: usize = 244;
/// The part of the memory bound that each class adds (see [`LEASE_BYTES`]).
pub const CLASS_BYTES: usize = 52;
/// The memory bound's header whatever the id lengths: a set holds at most [`MAX_ID_LEN`] classes.
pub const MAX_HEADER_BYTES: usize = HEADER_BYTES + CLASS_BYTES * MAX_ID_LEN;

/// A lease: the cost it holds, until `expiry_ms` (it holds nothing from then on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub cost: u64,
    pub expiry_ms: u64,
}

/// An insertion the set refuses: an id of no accepted length, a cost of 0 or above
/// [`MAX_COST`], a set at [`MAX_LEASES`], or an expiry more than 34 years from the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused;

// The sizes the memory bound's arithmetic counts with (the module documentation): a class 32
// bytes, a page's pointer 16 (a child record's 48 in `tree`).
const _: () = assert!(std::mem::size_of::<Class>() <= 32);
const _: () = assert!(std::mem::size_of::<Box<[u8]>>() == 16);

/// The leases of one key. See the module documentation for the layout.
#[derive(Clone)]
pub struct Leases {
    /// Expiries are stored as offsets from this time.
    base_ms: u64,
    /// The records, one class per id length in use (in the order the lengths first came).
    classes: Vec<Class>,
    /// By id: `fingerprint << 27 | handle`, or [`table::EMPTY`].
    table: Vec<u32>,
    /// By expiry; its totals are the set's.
    tree: Child,
}

impl Default for Leases {
    fn default() -> Leases {
        Leases {
            base_ms: 0,
            classes: Vec::new(),
            table: Vec::new(),
            tree: Child::empty(),
        }
    }
}

impl Leases {
    /// An empty set.
    pub fn new() -> Leases {
        Leases::default()
    }

    /// The leases stored (live or not: see [`Leases::drop_expired`]).
    pub fn len(&self) -> usize {
        self.tree.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.tree.count == 0
    }

    /// The cost the stored leases hold together.
    pub fn total_cost(&self) -> u64 {
        self.tree.cost
    }

    fn records(&self) -> Records<'_> {
        Records {
            classes: &self.classes,
        }
    }

    fn lease_of(&self, handle: u32) -> Lease {
        let records = self.records();
        Lease {
            cost: records.cost(handle),
            expiry_ms: self.base_ms + records.offset(handle),
        }
    }

    /// The lease `id` holds, if any.
    pub fn get(&self, id: &[u8]) -> Option<Lease> {
        let slot = self.find(id, hash(id))?;
        Some(self.lease_of(self.table[slot] & HANDLE_MASK))
    }

    /// The earliest expiry.
    pub fn first_expiry_ms(&self) -> Option<u64> {
        first(&self.tree).map(|h| self.lease_of(h).expiry_ms)
    }

    /// The latest expiry: when the last lease expires.
    pub fn last_expiry_ms(&self) -> Option<u64> {
        (!self.is_empty()).then(|| self.lease_of(self.tree.last).expiry_ms)
    }

    /// The latest expiry of the leases other than `id`'s.
    pub fn last_expiry_except_ms(&self, id: &[u8]) -> Option<u64> {
        let last = (!self.is_empty()).then_some(self.tree.last)?;
        if self.records().id(last) != id {
            return Some(self.lease_of(last).expiry_ms);
        }
        let before = self.tree.count.checked_sub(2)?;
        nth(&self.tree, before).map(|h| self.lease_of(h).expiry_ms)
    }

    /// How many leases, holding how much cost, expire at or before `t_ms`.
    pub fn expiring_by(&self, t_ms: u64) -> (usize, u64) {
        let Some(offset) = t_ms.checked_sub(self.base_ms) else {
            return (0, 0);
        };
        let (count, cost) = prefix(&self.tree, offset, self.records());
        (count as usize, cost)
    }

    /// The earliest time by which leases holding `cost` (at least 1) have expired, counted
    /// from the earliest expiry on; `None` if all of them hold less.
    pub fn expired_cost_by(&self, cost: u64) -> Option<u64> {
        if cost == 0 || cost > self.total_cost() {
            return None;
        }
        reach(&self.tree, cost, self.records()).map(|h| self.lease_of(h).expiry_ms)
    }

    /// Stores `lease` for `id`, replacing the lease `id` held (which is returned).
    pub fn insert(&mut self, id: &[u8], lease: Lease) -> Result<Option<Lease>, Refused> {
        if !(1..=MAX_ID_LEN).contains(&id.len()) || !(1..=MAX_COST).contains(&lease.cost) {
            return Err(Refused);
        }
        let hash = hash(id);
        let found = self.find(id, hash);
        if found.is_none() && self.len() >= MAX_LEASES {
            return Err(Refused);
        }
        self.make_room_for(lease.expiry_ms)?;
        let offset = lease.expiry_ms - self.base_ms;
        if let Some(slot) = found {
            // A renewal: the record changes in place and moves in the tree.
            let h = self.table[slot] & HANDLE_MASK;
            let old = self.lease_of(h);
            let records = Records {
                classes: &self.classes,
            };
            remove(&mut self.tree, h, old.cost, records);
            self.collapse_root();
            let record = self.classes[class_of(h)].record_mut(place_of(h));
            write40(record, offset);
            write40(&mut record[5..], lease.cost);
            self.tree_insert(h, lease.cost);
            return Ok(Some(old));
        }
        let class = self.class_for(id.len());
        let mut record = [0u8; HEAD + MAX_ID_LEN];
        write40(&mut record, offset);
        write40(&mut record[5..], lease.cost);
        record[HEAD..HEAD + id.len()].copy_from_slice(id);
        let records = &mut self.classes[class];
        let h = handle(class, records.len());
        records.push(&record[..HEAD + id.len()]);
        self.table_insert(h, hash);
        self.tree_insert(h, lease.cost);
        Ok(None)
    }

    /// Moves the base so that `expiry_ms` fits beside the stored expiries (rewriting every
    /// record: only when a lease lands 17 years from the base).
    fn make_room_for(&mut self, expiry_ms: u64) -> Result<(), Refused> {
        if self.is_empty() {
            self.base_ms = expiry_ms.saturating_sub(FIELD_MAX / 2);
            return Ok(());
        }
        if expiry_ms >= self.base_ms && expiry_ms - self.base_ms <= FIELD_MAX {
            return Ok(());
        }
        let first = self.first_expiry_ms().unwrap_or(expiry_ms);
        let last = self.last_expiry_ms().unwrap_or(expiry_ms);
        let (low, high) = (first.min(expiry_ms), last.max(expiry_ms));
        let spread = high - low;
        if spread > FIELD_MAX {
            return Err(Refused);
        }
        let base = low.saturating_sub((FIELD_MAX - spread) / 2);
        let old = self.base_ms;
        for class in &mut self.classes {
            for place in 0..class.len() {
                let record = class.record_mut(place);
                let expiry = old + read40(record);
                write40(record, expiry - base);
            }
        }
        self.base_ms = base;
        Ok(())
    }

    /// Removes `id`'s lease and returns it.
    pub fn remove(&mut self, id: &[u8]) -> Option<Lease> {
        let slot = self.find(id, hash(id))?;
        Some(self.remove_at(slot))
    }

    /// Removes the lease of table slot `slot`.
    fn remove_at(&mut self, slot: usize) -> Lease {
        let h = self.table[slot] & HANDLE_MASK;
        let lease = self.lease_of(h);
        let records = Records {
            classes: &self.classes,
        };
        let removed = remove(&mut self.tree, h, lease.cost, records);
        debug_assert!(removed, "every handle is in the tree");
        self.collapse_root();
        self.table_delete(slot);
        // The class's last record takes the removed one's place.
        let (class, place) = (class_of(h), place_of(h));
        let last = self.classes[class].len() - 1;
        if place != last {
            let records = &mut self.classes[class];
            let size = records.size();
            let mut moving = [0u8; HEAD + MAX_ID_LEN];
            moving[..size].copy_from_slice(records.record(last));
            records.record_mut(place).copy_from_slice(&moving[..size]);
            let moved = handle(class, last);
            let records = Records {
                classes: &self.classes,
            };
            relocate(&mut self.tree, moved, h, records);
            let id = records.id(h);
            if let Some(at) = self.find_handle(id, moved) {
                self.table[at] = (self.table[at] & !HANDLE_MASK) | h;
            }
        }
        let records = &mut self.classes[class];
        records.pop();
        if records.len() == 0 {
            // No handle names the class now: its slot is free for another length.
            records.id_len = 0;
            while self.classes.last().is_some_and(|c| c.id_len == 0) {
                self.classes.pop();
            }
            self.classes.shrink_to_fit();
        }
        let len = self.len();
        if len == 0 {
            *self = Leases::default();
        } else if self.table.len() > 2 * len && table_size(len) < self.table.len() {
            // Never below half full (unless at the smallest size).
            self.rehash(table_size(len));
        }
        lease
    }

    /// Removes every lease that expires at or before `t_ms`; how many there were.
    pub fn drop_expired(&mut self, t_ms: u64) -> usize {
        let mut dropped = 0;
        while let Some(h) = first(&self.tree) {
            if self.lease_of(h).expiry_ms > t_ms {
                break;
            }
            let id = self.records().id(h);
            let slot = self
                .find_handle(id, h)
                .expect("every handle is in the table");
            self.remove_at(slot);
            dropped += 1;
        }
        dropped
    }

    /// The leases in order of expiry, then id: `(id, lease)`.
    pub fn iter(&self) -> Iter<'_> {
        let mut iter = Iter {
            leases: self,
            stack: Vec::new(),
            leaf: &[],
        };
        iter.descend(&self.tree);
        iter
    }

    /// Bytes held on the heap, for `MEMORY USAGE`.
    pub fn heap_bytes(&self) -> usize {
        self.classes.capacity() * std::mem::size_of::<Class>()
            + self.classes.iter().map(Class::heap_bytes).sum::<usize>()
            + self.table.capacity() * std::mem::size_of::<u32>()
            + node_bytes(&self.tree)
    }

    /// Checks every structural invariant of the three parts and the memory bound (tests).
    #[cfg(test)]
    pub fn check_invariants(&self) {
        let order = self.check_tree();
        self.check_records(order.len());
        self.check_table(&order);
        let records = self.records();
        let ids: usize = order.iter().map(|&h| records.id(h).len()).sum();
        assert!(
            self.heap_bytes() <= self.memory_bound(ids),
            "{} bytes for {} leases of {ids} bytes of ids in {} classes",
            self.heap_bytes(),
            order.len(),
            self.classes.len()
        );
    }

    /// The bound [`Leases::heap_bytes`] holds to, with `ids` the bytes of the ids held (tests).
    #[cfg(test)]
    fn memory_bound(&self, ids: usize) -> usize {
        HEADER_BYTES + CLASS_BYTES * self.classes.len() + ids + LEASE_BYTES * self.len()
    }
}

/// The leases in order; see [`Leases::iter`].
pub struct Iter<'a> {
    leases: &'a Leases,
    /// The inner nodes above the current leaf, each with the index of the next child to visit.
    stack: Vec<(&'a [Child], usize)>,
    leaf: &'a [u32],
}

impl<'a> Iter<'a> {
    fn descend(&mut self, mut child: &'a Child) {
        loop {
            match &child.node {
                Node::Leaf(handles) => {
                    self.leaf = handles;
                    return;
                }
                Node::Inner(children) => {
                    self.stack.push((children, 1));
                    child = &children[0];
                }
            }
        }
    }
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a [u8], Lease);

    fn next(&mut self) -> Option<(&'a [u8], Lease)> {
        loop {
            if let Some((&h, rest)) = self.leaf.split_first() {
                self.leaf = rest;
                let records = Records {
                    classes: &self.leases.classes,
                };
                return Some((records.id(h), self.leases.lease_of(h)));
            }
            let (children, next) = self.stack.pop()?;
            if let Some(child) = children.get(next) {
                self.stack.push((children, next + 1));
                self.descend(child);
            }
        }
    }
}

/// Two sets are equal when they hold the same leases, however they are laid out.
impl PartialEq for Leases {
    fn eq(&self, other: &Leases) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Leases {}

impl fmt::Debug for Leases {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.iter().map(|(id, lease)| {
                (
                    String::from_utf8_lossy(id).into_owned(),
                    lease.cost,
                    lease.expiry_ms,
                )
            }))
            .finish()
    }
}
