//! The lease set of one concurrency key: requests in flight by id, each holding a cost until its
//! expiry, kept so that every operation is O(log n) in the leases held and a lease costs at most
//! 24 bytes more than its id.
//!
//! Three parts index the same leases:
//! - **records**, one *class* per id length: fixed-size records `[expiry − base: 5 bytes]
//!   [cost: 5 bytes][id]` (little-endian) in pages of 32, every page full but the last, which is
//!   allocated to its records exactly; dense: a removed record's place is taken by the class's
//!   last one. A lease's *handle* is its class (7 bits) and its place there (20 bits: page << 5 |
//!   record). Expiries are stored as offsets from `base_ms`, 40 bits (34 years) wide; the base
//!   sits in the middle of that span and moves (every record rewritten) only when a lease falls
//!   outside it. A class no lease uses any more keeps its slot (handles name classes by index)
//!   until a new length takes it, or it is the last slot and goes.
//! - **by id**: an open-addressing table of handles (linear probing, backward-shift deletion, no
//!   tombstones), each slot a handle and 5 bits of the id's hash (so a probe seldom reads a record
//!   it does not want), kept between 1/2 and 4/5 full (rebuilt 16/25 full). The hash is SipHash
//!   with keys drawn at random once per process, so ids chosen to collide cannot be precomputed.
//! - **by expiry**: a B+ tree of handles ordered by `(expiry, id)`, each child of an inner node
//!   carrying its subtree's count, total cost and greatest handle: the earliest and the last
//!   lease, the cost that has expired by a time, and the time by which a given cost has expired,
//!   each in O(log n). Leaves hold 64 to 128 handles and inner nodes 16 to 32 children (a node
//!   below half is merged with or evened out with a neighbour), except the last node of each level,
//!   where leases of one duration are appended: a full node splits off the new one alone there.
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

use std::cmp::Ordering;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;

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

const FIELD_BITS: u32 = 40;
const FIELD_MAX: u64 = (1 << FIELD_BITS) - 1;
/// Bytes of a record before its id: the expiry's offset and the cost.
const HEAD: usize = 10;
const CLASS_BITS: u32 = 7;
const SLOT_BITS: u32 = 20;
const HANDLE_BITS: u32 = CLASS_BITS + SLOT_BITS;
const HANDLE_MASK: u32 = (1 << HANDLE_BITS) - 1;
/// A free table slot (fingerprint 31 and the handle of place 2^20 − 1, which is never used).
const EMPTY: u32 = u32::MAX;

/// The most handles of a leaf; every leaf but the last holds at least half as many.
const LEAF_MAX: usize = 128;
const LEAF_MIN: usize = LEAF_MAX / 2;
/// The most children of an inner node; every inner node but the root and the last of its level
/// has at least half as many.
const INNER_MAX: usize = 32;
const INNER_MIN: usize = INNER_MAX / 2;
/// Leaf arrays grow by this many handles, and shrink once twice as many are spare (so a leaf
/// that gains and loses a handle in turn does not reallocate each time).
const LEAF_STEP: usize = 4;
/// Records per page: a place is `page << PAGE_BITS | record`.
const PAGE_BITS: u32 = 5;
const PAGE_RECORDS: usize = 1 << PAGE_BITS;
const PAGE_MASK: usize = PAGE_RECORDS - 1;

// The sizes the memory bound's arithmetic counts with (the module documentation).
const _: () = assert!(std::mem::size_of::<Child>() <= CHILD_BYTES);
const _: () = assert!(std::mem::size_of::<Class>() <= 32);
const _: () = assert!(std::mem::size_of::<Box<[u8]>>() == 16);
const CHILD_BYTES: usize = 48;

fn read40(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word[..5].copy_from_slice(&bytes[..5]);
    u64::from_le_bytes(word)
}

fn write40(bytes: &mut [u8], value: u64) {
    bytes[..5].copy_from_slice(&value.to_le_bytes()[..5]);
}

/// The records of the ids of one length, in pages of [`PAGE_RECORDS`]: every page full but the
/// last, which holds 1 to [`PAGE_RECORDS`] records and is allocated to them exactly, or with room
/// for one more in a large class ([`Class::may_keep_spare`]). Place `p` is record `p & PAGE_MASK`
/// of page `p >> PAGE_BITS`: the places are dense, `0..len`.
#[derive(Clone, Default)]
struct Class {
    pages: Vec<Box<[u8]>>,
    /// Records held.
    len: u32,
    /// The ids' length (0: a class no lease uses any more, whose slot a new length may take).
    id_len: u8,
}

impl Class {
    fn size(&self) -> usize {
        HEAD + usize::from(self.id_len)
    }

    fn len(&self) -> usize {
        self.len as usize
    }

    fn record(&self, place: usize) -> &[u8] {
        let (size, at) = (self.size(), place & PAGE_MASK);
        &self.pages[place >> PAGE_BITS][at * size..(at + 1) * size]
    }

    fn record_mut(&mut self, place: usize) -> &mut [u8] {
        let (size, at) = (self.size(), place & PAGE_MASK);
        &mut self.pages[place >> PAGE_BITS][at * size..(at + 1) * size]
    }

    /// Records in the last page (the class holds some).
    fn in_last_page(&self) -> usize {
        (self.len() - 1) % PAGE_RECORDS + 1
    }

    /// Whether the last page may keep room for one record more, with `len` records held: when
    /// that room is at most an eighth of a byte per record.
    fn may_keep_spare(&self, len: usize) -> bool {
        len >= 8 * self.size()
    }

    /// Adds `record` at place `len`: in the last page's spare room, else the last page grows by
    /// this record alone (a copy of at most a page), else a new page, the list of pages growing by
    /// an eighth.
    fn push(&mut self, record: &[u8]) {
        let size = self.size();
        if self.len() % PAGE_RECORDS == 0 {
            if self.pages.len() == self.pages.capacity() {
                self.pages.reserve_exact((self.pages.len() / 8).max(1));
            }
            self.pages.push(Box::from(record));
        } else {
            let at = self.in_last_page() * size;
            let last = self.pages.last_mut().expect("a partial page");
            if last.len() < at + size {
                let mut page = std::mem::take(last).into_vec();
                page.reserve_exact(size);
                page.resize(at + size, 0);
                *last = page.into_boxed_slice();
            }
            last[at..at + size].copy_from_slice(record);
        }
        self.len += 1;
    }

    /// Removes the record at place `len − 1`. The last page keeps room for one record at most (and
    /// only as [`Class::may_keep_spare`] says); a page emptied goes, and the list of pages gives
    /// memory back once a quarter of it is unused.
    fn pop(&mut self) {
        let size = self.size();
        let held = self.in_last_page();
        if held == 1 {
            self.pages.pop();
            let (len, capacity) = (self.pages.len(), self.pages.capacity());
            if capacity - len > len / 4 {
                self.pages.shrink_to(len + len / 8);
            }
        } else {
            let keep = held - 1 + usize::from(self.may_keep_spare(self.len() - 1));
            let last = self.pages.last_mut().expect("a record to pop");
            if last.len() > keep * size {
                let mut page = std::mem::take(last).into_vec();
                page.truncate(keep * size);
                *last = page.into_boxed_slice();
            }
        }
        self.len -= 1;
    }

    /// Bytes on the heap: the pages and the list of them.
    fn heap_bytes(&self) -> usize {
        self.pages.capacity() * std::mem::size_of::<Box<[u8]>>()
            + self.pages.iter().map(|page| page.len()).sum::<usize>()
    }
}

fn handle(class: usize, place: usize) -> u32 {
    (place as u32) << CLASS_BITS | class as u32
}

fn class_of(handle: u32) -> usize {
    (handle & ((1 << CLASS_BITS) - 1)) as usize
}

fn place_of(handle: u32) -> usize {
    (handle >> CLASS_BITS) as usize
}

/// The records, read through handles.
#[derive(Clone, Copy)]
struct Records<'a> {
    classes: &'a [Class],
}

impl<'a> Records<'a> {
    fn record(&self, handle: u32) -> &'a [u8] {
        self.classes[class_of(handle)].record(place_of(handle))
    }

    fn offset(&self, handle: u32) -> u64 {
        read40(self.record(handle))
    }

    fn cost(&self, handle: u32) -> u64 {
        read40(&self.record(handle)[5..])
    }

    fn id(&self, handle: u32) -> &'a [u8] {
        &self.record(handle)[HEAD..]
    }

    /// The order of the tree: by expiry, then by id.
    fn cmp(&self, a: u32, b: u32) -> Ordering {
        let (ra, rb) = (self.record(a), self.record(b));
        read40(ra)
            .cmp(&read40(rb))
            .then_with(|| ra[HEAD..].cmp(&rb[HEAD..]))
    }

    fn less(&self, a: u32, b: u32) -> bool {
        self.cmp(a, b) == Ordering::Less
    }
}

// ---------------------------------------------------------------------------------------------
// By id: the table.

/// The process's hash keys, drawn once.
fn hash(id: &[u8]) -> u64 {
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    KEYS.get_or_init(RandomState::new).hash_one(id)
}

/// Where `hash` starts probing in a table of `capacity` slots (any size, not only powers of 2).
fn home(hash: u64, capacity: usize) -> usize {
    ((u128::from(hash) * capacity as u128) >> 64) as usize
}

/// The 5 bits of `hash` a slot keeps beside its handle (the low ones: `home` uses the high ones).
fn fingerprint(hash: u64) -> u32 {
    (hash & 31) as u32
}

/// The table's size for `len` handles: 25/16 of them (16/25 full).
fn table_size(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        (len * 25 / 16).max(8)
    }
}

// ---------------------------------------------------------------------------------------------
// By expiry: the tree.

#[derive(Clone)]
enum Node {
    /// Handles in order.
    Leaf(Vec<u32>),
    /// Children in order.
    Inner(Vec<Child>),
}

/// A subtree and its totals.
#[derive(Clone)]
struct Child {
    node: Node,
    count: u32,
    cost: u64,
    /// The subtree's greatest handle (meaningless when empty).
    last: u32,
}

impl Child {
    fn empty() -> Child {
        Child {
            node: Node::Leaf(Vec::new()),
            count: 0,
            cost: 0,
            last: EMPTY,
        }
    }

    fn items(&self) -> usize {
        match &self.node {
            Node::Leaf(handles) => handles.len(),
            Node::Inner(children) => children.len(),
        }
    }

    fn underfull(&self) -> bool {
        match &self.node {
            Node::Leaf(handles) => handles.len() < LEAF_MIN,
            Node::Inner(children) => children.len() < INNER_MIN,
        }
    }
}

/// A leaf's array holds its handles and fewer than `2 · LEAF_STEP` more.
fn fit(handles: &mut Vec<u32>) {
    if handles.capacity() >= handles.len() + 2 * LEAF_STEP {
        handles.shrink_to(handles.len().next_multiple_of(LEAF_STEP));
    }
}

/// An inner node's array holds its children exactly (it changes only when a leaf splits or
/// merges).
fn fit_exactly(children: &mut Vec<Child>) {
    if children.capacity() > children.len() {
        children.shrink_to_fit();
    }
}

fn leaf_totals(handles: &[u32], records: Records) -> (u32, u64) {
    let cost = handles.iter().map(|&h| records.cost(h)).sum();
    (handles.len() as u32, cost)
}

fn inner_totals(children: &[Child]) -> (u32, u64) {
    children.iter().fold((0, 0), |(count, cost), child| {
        (count + child.count, cost + child.cost)
    })
}

/// Inserts `h` (holding `cost`) under `child`; a child that overflows splits, and the new
/// right sibling is returned. `rightmost`: `child` is the last subtree of the tree, where an
/// insertion at the end (the usual one: a lease of the usual duration expires after the others)
/// splits off the new handle alone, so appended leaves stay full.
fn insert(
    child: &mut Child,
    h: u32,
    cost: u64,
    records: Records,
    rightmost: bool,
) -> Option<Child> {
    child.count += 1;
    child.cost += cost;
    match &mut child.node {
        Node::Leaf(handles) => {
            let at = handles.partition_point(|&x| records.less(x, h));
            if handles.len() == handles.capacity() {
                handles.reserve_exact(LEAF_STEP);
            }
            handles.insert(at, h);
            if at + 1 == handles.len() {
                child.last = h;
            }
            if handles.len() <= LEAF_MAX {
                return None;
            }
            let split = if rightmost && at + 1 == handles.len() {
                handles.len() - 1
            } else {
                handles.len() / 2
            };
            let mut right = handles.split_off(split);
            fit(handles);
            fit(&mut right);
            let (count, cost) = leaf_totals(&right, records);
            child.count -= count;
            child.cost -= cost;
            child.last = *handles.last().expect("a split leaf keeps handles");
            let last = *right.last().expect("a split leaf gives handles");
            Some(Child {
                node: Node::Leaf(right),
                count,
                cost,
                last,
            })
        }
        Node::Inner(children) => {
            let n = children.len();
            let i = children
                .partition_point(|c| records.less(c.last, h))
                .min(n - 1);
            let split = insert(&mut children[i], h, cost, records, rightmost && i + 1 == n);
            if let Some(sibling) = split {
                children.reserve_exact(1);
                children.insert(i + 1, sibling);
            }
            child.last = children.last().expect("children").last;
            if children.len() <= INNER_MAX {
                return None;
            }
            let at = if rightmost && i + 2 == children.len() {
                children.len() - 1
            } else {
                children.len() / 2
            };
            let right = children.split_off(at);
            fit_exactly(children);
            let (count, cost) = inner_totals(&right);
            child.count -= count;
            child.cost -= cost;
            child.last = children.last().expect("children").last;
            let last = right.last().expect("children").last;
            Some(Child {
                node: Node::Inner(right),
                count,
                cost,
                last,
            })
        }
    }
}

/// Removes `h` (holding `cost`) from under `child`; whether it was there.
fn remove(child: &mut Child, h: u32, cost: u64, records: Records) -> bool {
    match &mut child.node {
        Node::Leaf(handles) => {
            let at = handles.partition_point(|&x| records.less(x, h));
            if handles.get(at) != Some(&h) {
                return false;
            }
            handles.remove(at);
            fit(handles);
            child.last = handles.last().copied().unwrap_or(EMPTY);
        }
        Node::Inner(children) => {
            let i = children.partition_point(|c| records.less(c.last, h));
            if i == children.len() || !remove(&mut children[i], h, cost, records) {
                return false;
            }
            if children[i].underfull() {
                rebalance(children, i, records);
            }
            child.last = children.last().expect("children").last;
        }
    }
    child.count -= 1;
    child.cost -= cost;
    true
}

/// Child `i` has too few items: merged with a neighbour when both fit in one, else evened out
/// with it.
fn rebalance(children: &mut Vec<Child>, i: usize, records: Records) {
    if children.len() < 2 {
        return;
    }
    let l = if i + 1 < children.len() { i } else { i - 1 };
    let (head, tail) = children.split_at_mut(l + 1);
    let (left, right) = (&mut head[l], &mut tail[0]);
    let max = match left.node {
        Node::Leaf(_) => LEAF_MAX,
        Node::Inner(_) => INNER_MAX,
    };
    let total = left.items() + right.items();
    if total <= max {
        match (&mut left.node, &mut right.node) {
            (Node::Leaf(a), Node::Leaf(b)) => {
                a.reserve_exact(b.len());
                a.append(b);
                fit(a);
            }
            (Node::Inner(a), Node::Inner(b)) => {
                a.reserve_exact(b.len());
                a.append(b);
            }
            _ => unreachable!("siblings are of one kind"),
        }
        left.count += right.count;
        left.cost += right.cost;
        left.last = right.last;
        children.remove(l + 1);
        fit_exactly(children);
        return;
    }
    let want = total / 2;
    let into_left = left.items() < want;
    let (count, cost) = match (&mut left.node, &mut right.node) {
        (Node::Leaf(a), Node::Leaf(b)) => {
            let moved: Vec<u32> = if into_left {
                b.drain(..want - a.len()).collect()
            } else {
                a.split_off(want)
            };
            let totals = leaf_totals(&moved, records);
            if into_left {
                a.extend_from_slice(&moved);
            } else {
                b.splice(0..0, moved);
            }
            fit(a);
            fit(b);
            totals
        }
        (Node::Inner(a), Node::Inner(b)) => {
            let moved: Vec<Child> = if into_left {
                b.drain(..want - a.len()).collect()
            } else {
                a.split_off(want)
            };
            let totals = inner_totals(&moved);
            if into_left {
                a.reserve_exact(moved.len());
                a.extend(moved);
            } else {
                b.reserve_exact(moved.len());
                b.splice(0..0, moved);
            }
            fit_exactly(a);
            fit_exactly(b);
            totals
        }
        _ => unreachable!("siblings are of one kind"),
    };
    let (from, to) = if into_left {
        (right, &mut *left)
    } else {
        (&mut *left, right)
    };
    from.count -= count;
    from.cost -= cost;
    to.count += count;
    to.cost += cost;
    left.last = match &left.node {
        Node::Leaf(a) => *a.last().expect("handles"),
        Node::Inner(a) => a.last().expect("children").last,
    };
}

/// Replaces handle `old` by `new`, which holds the same record (moved within its array).
fn relocate(child: &mut Child, old: u32, new: u32, records: Records) {
    if child.last == old {
        child.last = new;
    }
    match &mut child.node {
        Node::Leaf(handles) => {
            let at = handles.partition_point(|&x| records.less(x, new));
            if let Some(slot) = handles.get_mut(at).filter(|slot| **slot == old) {
                *slot = new;
            }
        }
        Node::Inner(children) => {
            let i = children.partition_point(|c| records.less(c.last, new));
            if let Some(child) = children.get_mut(i) {
                relocate(child, old, new, records);
            }
        }
    }
}

/// The count and cost of the handles whose expiry offset is at most `offset`.
fn prefix(child: &Child, offset: u64, records: Records) -> (u32, u64) {
    match &child.node {
        Node::Leaf(handles) => {
            let k = handles.partition_point(|&h| records.offset(h) <= offset);
            leaf_totals(&handles[..k], records)
        }
        Node::Inner(children) => {
            let (mut count, mut cost) = (0, 0);
            for c in children {
                if records.offset(c.last) <= offset {
                    count += c.count;
                    cost += c.cost;
                } else {
                    let (more, more_cost) = prefix(c, offset, records);
                    return (count + more, cost + more_cost);
                }
            }
            (count, cost)
        }
    }
}

/// The first handle, in order, at which the handles up to it hold `target` cost (`target ≥ 1`).
fn reach(child: &Child, mut target: u64, records: Records) -> Option<u32> {
    match &child.node {
        Node::Leaf(handles) => {
            for &h in handles {
                let cost = records.cost(h);
                if cost >= target {
                    return Some(h);
                }
                target -= cost;
            }
            None
        }
        Node::Inner(children) => {
            for c in children {
                if c.cost >= target {
                    return reach(c, target, records);
                }
                target -= c.cost;
            }
            None
        }
    }
}

/// The handle of rank `k` (0-based) in order.
fn nth(child: &Child, mut k: u32) -> Option<u32> {
    match &child.node {
        Node::Leaf(handles) => handles.get(k as usize).copied(),
        Node::Inner(children) => {
            for c in children {
                if k < c.count {
                    return nth(c, k);
                }
                k -= c.count;
            }
            None
        }
    }
}

fn first(child: &Child) -> Option<u32> {
    match &child.node {
        Node::Leaf(handles) => handles.first().copied(),
        Node::Inner(children) => children.first().and_then(first),
    }
}

fn node_bytes(child: &Child) -> usize {
    match &child.node {
        Node::Leaf(handles) => handles.capacity() * std::mem::size_of::<u32>(),
        Node::Inner(children) => {
            children.capacity() * std::mem::size_of::<Child>()
                + children.iter().map(node_bytes).sum::<usize>()
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The set.

/// The leases of one key. See the module documentation for the layout.
#[derive(Clone)]
pub struct Leases {
    /// Expiries are stored as offsets from this time.
    base_ms: u64,
    /// The records, one class per id length in use (in the order the lengths first came).
    classes: Vec<Class>,
    /// By id: `fingerprint << 27 | handle`, or [`EMPTY`].
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

    /// The table slot holding `id`'s handle.
    fn find(&self, id: &[u8], hash: u64) -> Option<usize> {
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

    /// The class of the ids of `id_len` bytes: the one holding them, else a slot no lease uses
    /// any more, else a new one (the list of classes held to its length).
    fn class_for(&mut self, id_len: usize) -> usize {
        let id_len = id_len as u8;
        if let Some(class) = self.classes.iter().position(|c| c.id_len == id_len) {
            return class;
        }
        let class = match self.classes.iter().position(|c| c.id_len == 0) {
            Some(free) => free,
            None => {
                self.classes.reserve_exact(1);
                self.classes.push(Class::default());
                self.classes.len() - 1
            }
        };
        self.classes[class].id_len = id_len;
        class
    }

    fn tree_insert(&mut self, h: u32, cost: u64) {
        let records = Records {
            classes: &self.classes,
        };
        if let Some(sibling) = insert(&mut self.tree, h, cost, records, true) {
            let left = std::mem::replace(&mut self.tree, Child::empty());
            self.tree = Child {
                count: left.count + sibling.count,
                cost: left.cost + sibling.cost,
                last: sibling.last,
                node: Node::Inner(vec![left, sibling]),
            };
        }
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

    fn table_insert(&mut self, h: u32, hash: u64) {
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
    fn rehash(&mut self, size: usize) {
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
    fn table_delete(&mut self, mut hole: usize) {
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

    /// The table slot of `handle`, whose id is `id`.
    fn find_handle(&self, id: &[u8], handle: u32) -> Option<usize> {
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

    fn collapse_root(&mut self) {
        while let Node::Inner(children) = &mut self.tree.node {
            if children.len() != 1 {
                break;
            }
            let only = children.pop().expect("one child");
            self.tree = only;
        }
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

    /// Checks every structural invariant (tests).
    #[cfg(test)]
    pub fn check_invariants(&self) {
        /// `root`: the tree's root; `last`: the last node of its level (the root included).
        fn walk(
            child: &Child,
            records: Records,
            out: &mut Vec<u32>,
            root: bool,
            last: bool,
        ) -> (u32, u64) {
            let (count, cost) = match &child.node {
                Node::Leaf(handles) => {
                    assert!(handles.len() <= LEAF_MAX);
                    assert!(handles.capacity() < handles.len() + 2 * LEAF_STEP);
                    if !root {
                        assert!(!handles.is_empty());
                    }
                    if !last {
                        assert!(
                            handles.len() >= LEAF_MIN,
                            "a leaf at half its size at least"
                        );
                    }
                    out.extend_from_slice(handles);
                    leaf_totals(handles, records)
                }
                Node::Inner(children) => {
                    assert!(children.len() <= INNER_MAX);
                    assert!(children.len() >= if root { 2 } else { 1 });
                    if !last {
                        assert!(
                            children.len() >= INNER_MIN,
                            "a node at half its size at least"
                        );
                    }
                    assert_eq!(children.capacity(), children.len());
                    let mut totals = (0, 0);
                    for (i, c) in children.iter().enumerate() {
                        let (count, cost) =
                            walk(c, records, out, false, last && i + 1 == children.len());
                        assert_eq!((count, cost), (c.count, c.cost));
                        totals = (totals.0 + count, totals.1 + cost);
                    }
                    totals
                }
            };
            if count > 0 {
                assert_eq!(Some(&child.last), out.last(), "a subtree's last handle");
            }
            (count, cost)
        }
        let records = self.records();
        let mut order = Vec::new();
        let totals = walk(&self.tree, records, &mut order, true, true);
        assert_eq!(totals, (self.tree.count, self.tree.cost));
        assert!(order.windows(2).all(|w| records.less(w[0], w[1])));
        // The classes: the pages full but the last, allocated exactly; no class slot unused at
        // the end of the list, which is allocated exactly.
        assert_eq!(self.classes.capacity(), self.classes.len());
        assert!(self.classes.last().is_none_or(|c| c.id_len != 0));
        for (i, class) in self.classes.iter().enumerate() {
            let size = class.size();
            assert_eq!(class.pages.len(), class.len().div_ceil(PAGE_RECORDS));
            assert!(class.pages.capacity() - class.pages.len() <= class.pages.len() / 4);
            for (p, page) in class.pages.iter().enumerate() {
                let held = (class.len() - p * PAGE_RECORDS).min(PAGE_RECORDS);
                let spare = page.len() / size - held;
                assert_eq!(page.len() % size, 0);
                assert!(
                    spare == 0
                        || (spare == 1
                            && p + 1 == class.pages.len()
                            && held < PAGE_RECORDS
                            && class.may_keep_spare(class.len())),
                    "page {p} of class {i}: {held} records, room for {spare} more"
                );
            }
            if class.id_len == 0 {
                assert_eq!(class.len(), 0);
            } else {
                assert!(class.len() > 0, "a class in use holds a record");
                assert!(self.classes[..i].iter().all(|c| c.id_len != class.id_len));
            }
        }
        let stored: usize = self.classes.iter().map(Class::len).sum();
        assert_eq!(stored, order.len());
        let used = self.table.iter().filter(|&&s| s != EMPTY).count();
        assert_eq!(used, order.len());
        assert_eq!(self.table.capacity(), self.table.len());
        if !order.is_empty() {
            assert!(used * 5 <= self.table.len() * 4);
            assert!(self.table.len() <= (2 * used).max(table_size(used)));
        }
        for &h in &order {
            let id = records.id(h);
            let slot = self.find(id, hash(id)).expect("every id is found");
            assert_eq!(self.table[slot] & HANDLE_MASK, h);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn lease(cost: u64, expiry_ms: u64) -> Lease {
        Lease { cost, expiry_ms }
    }

    /// The set against a plain map, its every answer.
    fn same_as(leases: &Leases, model: &BTreeMap<Vec<u8>, Lease>) {
        leases.check_invariants();
        assert_eq!(leases.len(), model.len());
        assert_eq!(
            leases.total_cost(),
            model.values().map(|l| l.cost).sum::<u64>()
        );
        let mut ordered: Vec<(&[u8], Lease)> = model.iter().map(|(id, l)| (&id[..], *l)).collect();
        ordered.sort_by(|a, b| a.1.expiry_ms.cmp(&b.1.expiry_ms).then(a.0.cmp(b.0)));
        assert!(leases.iter().eq(ordered.iter().copied()));
        assert_eq!(
            leases.first_expiry_ms(),
            ordered.first().map(|l| l.1.expiry_ms)
        );
        assert_eq!(
            leases.last_expiry_ms(),
            ordered.last().map(|l| l.1.expiry_ms)
        );
        for (id, l) in model {
            assert_eq!(leases.get(id), Some(*l));
        }
    }

    #[test]
    fn leases_in_order_of_expiry_then_id() {
        let mut leases = Leases::new();
        for (id, cost, expiry) in [
            (&b"b"[..], 2, 100),
            (b"a", 1, 100),
            (b"longer-id", 5, 50),
            (b"c", 1, 200),
        ] {
            assert_eq!(leases.insert(id, lease(cost, expiry)), Ok(None));
        }
        let order: Vec<&[u8]> = leases.iter().map(|(id, _)| id).collect();
        assert_eq!(order, [&b"longer-id"[..], b"a", b"b", b"c"]);
        assert_eq!(leases.expiring_by(99), (1, 5));
        assert_eq!(leases.expiring_by(100), (3, 8));
        assert_eq!(leases.expired_cost_by(6), Some(100));
        assert_eq!(leases.expired_cost_by(9), Some(200));
        assert_eq!(leases.expired_cost_by(10), None);
        assert_eq!(leases.last_expiry_except_ms(b"c"), Some(100));
        // A renewal moves the lease and changes its cost.
        assert_eq!(
            leases.insert(b"longer-id", lease(1, 300)),
            Ok(Some(lease(5, 50)))
        );
        assert_eq!(leases.last_expiry_except_ms(b"longer-id"), Some(200));
        assert_eq!(leases.drop_expired(100), 2);
        assert_eq!(leases.len(), 2);
        assert_eq!(leases.remove(b"c"), Some(lease(1, 200)));
        assert_eq!(leases.remove(b"c"), None);
        assert_eq!(leases.remove(b"longer-id"), Some(lease(1, 300)));
        assert!(leases.is_empty());
        assert_eq!(leases.heap_bytes(), 0);
        leases.check_invariants();
    }

    #[test]
    fn refuses_what_it_cannot_hold() {
        let mut leases = Leases::new();
        assert_eq!(leases.insert(b"", lease(1, 5)), Err(Refused));
        assert_eq!(leases.insert(&[7; 129], lease(1, 5)), Err(Refused));
        assert_eq!(leases.insert(b"a", lease(0, 5)), Err(Refused));
        assert_eq!(leases.insert(b"a", lease(MAX_COST + 1, 5)), Err(Refused));
        assert_eq!(leases.insert(&[7; 128], lease(MAX_COST, 5)), Ok(None));
        // Expiries 34 years apart do not fit one set; 17 years either way of a base do, and
        // moving the base keeps every lease.
        assert_eq!(
            leases.insert(b"far", lease(1, 5 + FIELD_MAX + 1)),
            Err(Refused)
        );
        assert_eq!(leases.insert(b"far", lease(1, 5 + FIELD_MAX)), Ok(None));
        assert_eq!(leases.get(b"far"), Some(lease(1, 5 + FIELD_MAX)));
        assert_eq!(leases.get(&[7; 128]), Some(lease(MAX_COST, 5)));
        leases.check_invariants();
    }

    #[test]
    fn many_leases_grow_and_shrink_every_part() {
        let mut leases = Leases::new();
        let mut model = BTreeMap::new();
        let id = |i: u64| format!("req-{i}").into_bytes();
        for i in 0..5000 {
            // Mostly in order of expiry, as leases of one duration are; some out of order.
            let expiry = 1_000_000 + i * 3 - (i % 7) * 11;
            leases.insert(&id(i), lease(1 + i % 3, expiry)).unwrap();
            model.insert(id(i), lease(1 + i % 3, expiry));
        }
        same_as(&leases, &model);
        let full = leases.heap_bytes();
        for i in (0..5000).step_by(2) {
            assert_eq!(leases.remove(&id(i)), model.remove(&id(i)));
        }
        same_as(&leases, &model);
        let dropped = leases.drop_expired(1_000_000 + 6000);
        model.retain(|_, l| l.expiry_ms > 1_000_000 + 6000);
        assert!(dropped > 0);
        same_as(&leases, &model);
        assert!(
            leases.heap_bytes() < full / 2,
            "{} of {full}",
            leases.heap_bytes()
        );
    }

    /// Enough leases for inner nodes to split, merge and even out: random inserts, renewals,
    /// removals and drops of up to 20,000 leases against a plain map.
    #[test]
    fn thousands_of_leases_through_every_rebalance() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut leases = Leases::new();
        let mut model = BTreeMap::new();
        let mut now = 1u64 << 45;
        let (mut most, mut fewest_after) = (0, usize::MAX);
        for round in 0..120_000u64 {
            let r = next();
            let id = format!("{:x}", r % 20_000).into_bytes();
            // Growing for a while, then shrinking, then growing again.
            let phase = (round / 20_000) % 3;
            match (r >> 20) % 10 {
                0..=5 if phase != 1 => {
                    let expiry = now + 1 + (r >> 32) % 50_000;
                    let cost = 1 + (r >> 40) % 7;
                    let got = leases.insert(&id, lease(cost, expiry)).unwrap();
                    assert_eq!(got, model.insert(id, lease(cost, expiry)));
                }
                0..=8 => assert_eq!(leases.remove(&id), model.remove(&id)),
                _ => {
                    now += (r >> 32) % 4;
                    let gone = model.values().filter(|l| l.expiry_ms <= now).count();
                    assert_eq!(leases.drop_expired(now), gone);
                    model.retain(|_, l| l.expiry_ms > now);
                }
            }
            most = most.max(leases.len());
            if round >= 20_000 && phase == 1 {
                fewest_after = fewest_after.min(leases.len());
            }
            if round % 5_000 == 0 {
                same_as(&leases, &model);
            }
        }
        same_as(&leases, &model);
        assert!(
            most > 10_000 && fewest_after < most / 3,
            "{most} {fewest_after}"
        );
    }

    /// A set beside what the memory bound counts: the ids' bytes, how many leases hold each id
    /// length, and the most id lengths held at once since the set was last empty (a bound on its
    /// classes).
    #[derive(Default)]
    struct Bounded {
        leases: Leases,
        ids: usize,
        by_length: BTreeMap<usize, usize>,
        classes: usize,
    }

    impl Bounded {
        fn insert(&mut self, id: &[u8], lease: Lease) -> Option<Lease> {
            let old = self
                .leases
                .insert(id, lease)
                .expect("an id the set accepts");
            if old.is_none() {
                self.ids += id.len();
                *self.by_length.entry(id.len()).or_default() += 1;
                self.classes = self.classes.max(self.by_length.len());
            }
            self.holds_the_bound();
            old
        }

        fn remove(&mut self, id: &[u8]) -> Option<Lease> {
            let old = self.leases.remove(id);
            if old.is_some() {
                self.forget(id.len());
            }
            self.holds_the_bound();
            old
        }

        fn drop_expired(&mut self, t_ms: u64) -> usize {
            let gone: Vec<usize> = self
                .leases
                .iter()
                .take_while(|(_, l)| l.expiry_ms <= t_ms)
                .map(|(id, _)| id.len())
                .collect();
            assert_eq!(self.leases.drop_expired(t_ms), gone.len());
            for len in gone {
                self.forget(len);
            }
            self.holds_the_bound();
            self.leases.len()
        }

        fn forget(&mut self, len: usize) {
            self.ids -= len;
            let held = self.by_length.get_mut(&len).expect("a length held");
            *held -= 1;
            if *held == 0 {
                self.by_length.remove(&len);
            }
            if self.by_length.is_empty() {
                self.classes = 0;
            }
        }

        /// The bound, as the documentation states it: by the classes, and whatever they are.
        fn holds_the_bound(&self) {
            let (heap, leases) = (self.leases.heap_bytes(), self.leases.len());
            let held = self.ids + LEASE_BYTES * leases;
            assert!(
                heap <= HEADER_BYTES + CLASS_BYTES * self.classes + held,
                "{heap} bytes for {leases} leases of {} bytes of ids in {} classes",
                self.ids,
                self.classes
            );
            assert!(heap <= MAX_HEADER_BYTES + held);
        }
    }

    /// An id of `len` bytes numbered `n` (distinct for distinct `n` at one length).
    fn id_of(n: u64, len: usize) -> Vec<u8> {
        let mut id = vec![b'.'; len];
        let digits = n.to_le_bytes();
        let k = len.min(8);
        id[..k].copy_from_slice(&digits[..k]);
        id
    }

    fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        }
    }

    /// 100,000 leases of 128-byte ids, then 95% of them released at random: every step within
    /// the bound, as the set thins out leaves, pages and the table.
    #[test]
    fn memory_bound_holds_when_most_leases_go_at_random() {
        let mut set = Bounded::default();
        let mut next = xorshift(0x2545_F491_4F6C_DD1D);
        let n = 100_000u64;
        for i in 0..n {
            set.insert(&id_of(i, 128), lease(1, 1_000_000 + next() % 100_000));
        }
        set.leases.check_invariants();
        let mut order: Vec<u64> = (0..n).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        for (k, &i) in order.iter().take(95_000).enumerate() {
            assert!(set.remove(&id_of(i, 128)).is_some());
            if k % 10_000 == 0 {
                set.leases.check_invariants();
            }
        }
        set.leases.check_invariants();
        assert_eq!(set.leases.len(), 5_000);
    }

    /// Every other lease released (every leaf loses half its handles), at a length of 16 and of
    /// 128, leases in order of expiry as the usual ones are.
    #[test]
    fn memory_bound_holds_when_every_other_lease_goes() {
        for len in [16, 128] {
            let mut set = Bounded::default();
            let n = 50_000u64;
            for i in 0..n {
                set.insert(&id_of(i, len), lease(1 + i % 3, 1_000_000 + i));
            }
            for i in (0..n).step_by(2) {
                assert!(set.remove(&id_of(i, len)).is_some());
            }
            set.leases.check_invariants();
            // And back again, then dropped by expiry from the earliest on.
            for i in (0..n).step_by(2) {
                set.insert(&id_of(i, len), lease(1, 1_000_000 + i));
            }
            let mut t = 1_000_000;
            while set.drop_expired(t) > 0 {
                t += 997;
            }
            set.leases.check_invariants();
            assert_eq!(set.leases.heap_bytes(), 0);
        }
    }

    /// A class's last page with room for one record more, holding the bytes of the earliest
    /// lease, released; then a lease far enough to move the base past that expiry: every lease
    /// held keeps its expiry, and the spare bytes are not read.
    #[test]
    fn moving_the_base_rewrites_the_records_held_only() {
        let mut set = Bounded::default();
        let mut model = BTreeMap::new();
        let start = 2_000_000u64;
        for i in 0..300u64 {
            set.insert(&id_of(i, 2), lease(1, start - i));
            model.insert(id_of(i, 2), lease(1, start - i));
        }
        // 300 records: 9 full pages and 12; releasing the last (the earliest lease) leaves 11 and
        // room for a 12th.
        set.remove(&id_of(299, 2));
        model.remove(&id_of(299, 2));
        set.leases.check_invariants();
        let class = &set.leases.classes[0];
        assert_eq!(class.pages.last().map(|p| p.len()), Some(12 * class.size()));
        // The base moves to the earliest expiry held, after the released one.
        let far = (start - 298) + FIELD_MAX;
        set.insert(b"far", lease(1, far));
        model.insert(b"far".to_vec(), lease(1, far));
        assert_eq!(set.leases.base_ms, start - 298);
        same_as(&set.leases, &model);
    }

    /// Lengths alternating, and every length from 1 to 128 at once, a few leases each: the
    /// classes' share of the bound.
    #[test]
    fn memory_bound_holds_with_many_id_lengths() {
        let mut set = Bounded::default();
        for i in 0..20_000u64 {
            let len = if i % 2 == 0 { 16 } else { 128 };
            set.insert(&id_of(i, len), lease(1, 1_000_000 + i));
        }
        for i in 0..20_000u64 {
            if i % 3 != 0 {
                set.remove(&id_of(i, if i % 2 == 0 { 16 } else { 128 }));
            }
        }
        set.leases.check_invariants();
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
        for round in 0..3u64 {
            for len in 1..=MAX_ID_LEN {
                for k in 0..(1 + round * 17) {
                    set.insert(&id_of(k, len), lease(1, 2_000_000 + next() % 1000));
                }
            }
            set.leases.check_invariants();
            // Lengths emptied in the middle of the list, and taken again by others.
            for len in (1..=MAX_ID_LEN).step_by(3) {
                for k in 0..(1 + round * 17) {
                    set.remove(&id_of(k, len));
                }
            }
            set.leases.check_invariants();
        }
        assert!(set.classes <= MAX_ID_LEN);
    }

    /// The usual flow: leases of one duration acquired at the end, expiring from the front,
    /// some renewed, some released early; from one lease to thousands and back.
    #[test]
    fn memory_bound_holds_as_leases_come_and_go() {
        let mut set = Bounded::default();
        let mut next = xorshift(0xD1B5_4A32_D192_ED03);
        let mut now = 1_000_000u64;
        for round in 0..200_000u64 {
            let r = next();
            let live = 1 + (round / 1000) % 50 * 100;
            let len = 1 + (r % 40) as usize;
            let n = r >> 40;
            match (r >> 8) % 8 {
                0..=4 => {
                    set.insert(&id_of(n % live, len), lease(1, now + 5_000));
                }
                5 => {
                    set.remove(&id_of(n % live, len));
                }
                _ => {
                    now += 1 + (r >> 20) % 30;
                    set.drop_expired(now);
                }
            }
            if round % 20_000 == 0 {
                set.leases.check_invariants();
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(256))]

        /// The memory bound after every step of random inserts, renewals, removals and drops, ids
        /// of every length from 1 to 128, few or many of them.
        #[test]
        fn memory_stays_within_the_bound(
            lengths in proptest::collection::vec(1usize..=MAX_ID_LEN, 1..6),
            ops in proptest::collection::vec((0u8..10, 0u64..400, 0usize..6, 0u64..3000), 1..800),
        ) {
            let mut set = Bounded::default();
            let mut now = 1u64 << 40;
            for (kind, n, which, spread) in ops {
                let id = id_of(n, lengths[which % lengths.len()]);
                match kind {
                    0..=5 => {
                        set.insert(&id, lease(1 + spread % 5, now + spread));
                    }
                    6 | 7 => {
                        set.remove(&id);
                    }
                    _ => {
                        now += spread % 200;
                        set.drop_expired(now);
                    }
                }
                set.leases.check_invariants();
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(256))]

        /// The set equals a plain map through random inserts, renewals, removals and drops:
        /// ids of several lengths, expiries colliding often, far apart at times.
        #[test]
        fn matches_a_plain_map(ops in proptest::collection::vec(
            (0u8..10, 0u16..300, 1u64..5, 0u64..2000, 0u8..4), 1..600,
        )) {
            let mut leases = Leases::new();
            let mut model: BTreeMap<Vec<u8>, Lease> = BTreeMap::new();
            let mut now = 1u64 << 40;
            for (kind, n, cost, spread, len) in ops {
                let id: Vec<u8> = match len {
                    0 => vec![n as u8],
                    1 => n.to_le_bytes().to_vec(),
                    2 => format!("id-{n}").into_bytes(),
                    _ => std::iter::repeat_n(n as u8, 100 + n as usize % 29).collect(),
                };
                match kind {
                    0..=5 => {
                        let expiry = now + spread % 50 + if kind == 5 { spread * 400_000_000 } else { 0 };
                        let got = leases.insert(&id, lease(cost, expiry));
                        proptest::prop_assert_eq!(got, Ok(model.insert(id, lease(cost, expiry))));
                    }
                    6 | 7 => {
                        proptest::prop_assert_eq!(leases.remove(&id), model.remove(&id));
                    }
                    8 => {
                        now += spread;
                        let gone = model.values().filter(|l| l.expiry_ms <= now).count();
                        let expected = model.values().filter(|l| l.expiry_ms <= now)
                            .fold((0, 0), |(n, c), l| (n + 1, c + l.cost));
                        proptest::prop_assert_eq!(leases.expiring_by(now), expected);
                        proptest::prop_assert_eq!(leases.drop_expired(now), gone);
                        model.retain(|_, l| l.expiry_ms > now);
                    }
                    _ => {
                        let total: u64 = model.values().map(|l| l.cost).sum();
                        let target = 1 + spread % total.max(1);
                        let mut costs: Vec<Lease> = model.values().copied().collect();
                        costs.sort_by_key(|l| l.expiry_ms);
                        let mut acc = 0;
                        let expected = costs.iter().find(|l| { acc += l.cost; acc >= target })
                            .map(|l| l.expiry_ms);
                        proptest::prop_assert_eq!(leases.expired_cost_by(target), expected);
                        let except = model.iter().filter(|(k, _)| **k != id)
                            .map(|(_, l)| l.expiry_ms).max();
                        proptest::prop_assert_eq!(leases.last_expiry_except_ms(&id), except);
                    }
                }
                same_as(&leases, &model);
            }
        }
    }
}
