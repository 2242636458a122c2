//! By expiry: the lease set's counted B+ tree of handles, ordered by `(expiry, id)`.
//!
//! Each child of an inner node carries its subtree's count, total cost and greatest handle: the
//! earliest and the last lease, the cost that has expired by a time, and the time by which a
//! given cost has expired, each in O(log n). Leases of one duration are appended at the end, so
//! the last node of each level is where a full node splits off the new one alone.
//!
//! Invariants (checked by `Leases::check_tree` in test builds):
//! - handles in strictly increasing `(expiry, id)` order, each lease once;
//! - every child's count, cost and last handle are its subtree's;
//! - leaves hold at most [`LEAF_MAX`] handles and inner nodes at most [`INNER_MAX`] children;
//!   every node but the root and the last of its level at least half as many; the root, when
//!   inner, at least 2 children, and no node but the root empty;
//! - a leaf's array holds fewer than `2 · LEAF_STEP` spare handles, an inner node's none.

use super::records::Records;
use super::table::EMPTY;
use super::Leases;

/// The most handles of a leaf; every leaf but the last holds at least half as many.
pub(super) const LEAF_MAX: usize = 128;
pub(super) const LEAF_MIN: usize = LEAF_MAX / 2;
/// The most children of an inner node; every inner node but the root and the last of its level
/// has at least half as many.
pub(super) const INNER_MAX: usize = 32;
pub(super) const INNER_MIN: usize = INNER_MAX / 2;
/// Leaf arrays grow by this many handles, and shrink once twice as many are spare (so a leaf
/// that gains and loses a handle in turn does not reallocate each time).
pub(super) const LEAF_STEP: usize = 4;

/// The size the memory bound counts a child record at (the module documentation).
pub(super) const CHILD_BYTES: usize = 48;
const _: () = assert!(std::mem::size_of::<Child>() <= CHILD_BYTES);

#[derive(Clone)]
pub(super) enum Node {
    /// Handles in order.
    Leaf(Vec<u32>),
    /// Children in order.
    Inner(Vec<Child>),
}

/// A subtree and its totals.
#[derive(Clone)]
pub(super) struct Child {
    pub(super) node: Node,
    pub(super) count: u32,
    pub(super) cost: u64,
    /// The subtree's greatest handle (meaningless when empty).
    pub(super) last: u32,
}

impl Child {
    pub(super) fn empty() -> Child {
        Child {
            node: Node::Leaf(Vec::new()),
            count: 0,
            cost: 0,
            last: EMPTY,
        }
    }

    pub(super) fn items(&self) -> usize {
        match &self.node {
            Node::Leaf(handles) => handles.len(),
            Node::Inner(children) => children.len(),
        }
    }

    pub(super) fn underfull(&self) -> bool {
        match &self.node {
            Node::Leaf(handles) => handles.len() < LEAF_MIN,
            Node::Inner(children) => children.len() < INNER_MIN,
        }
    }
}

/// A leaf's array holds its handles and fewer than `2 · LEAF_STEP` more.
pub(super) fn fit(handles: &mut Vec<u32>) {
    if handles.capacity() >= handles.len() + 2 * LEAF_STEP {
        handles.shrink_to(handles.len().next_multiple_of(LEAF_STEP));
    }
}

/// An inner node's array holds its children exactly (it changes only when a leaf splits or
/// merges).
pub(super) fn fit_exactly(children: &mut Vec<Child>) {
    if children.capacity() > children.len() {
        children.shrink_to_fit();
    }
}

pub(super) fn leaf_totals(handles: &[u32], records: Records) -> (u32, u64) {
    let cost = handles.iter().map(|&h| records.cost(h)).sum();
    (handles.len() as u32, cost)
}

pub(super) fn inner_totals(children: &[Child]) -> (u32, u64) {
    children.iter().fold((0, 0), |(count, cost), child| {
        (count + child.count, cost + child.cost)
    })
}

/// Inserts `h` (holding `cost`) under `child`; a child that overflows splits, and the new
/// right sibling is returned. `rightmost`: `child` is the last subtree of the tree, where an
/// insertion at the end (the usual one: a lease of the usual duration expires after the others)
/// splits off the new handle alone, so appended leaves stay full.
pub(super) fn insert(
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
pub(super) fn remove(child: &mut Child, h: u32, cost: u64, records: Records) -> bool {
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
pub(super) fn rebalance(children: &mut Vec<Child>, i: usize, records: Records) {
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
pub(super) fn relocate(child: &mut Child, old: u32, new: u32, records: Records) {
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
pub(super) fn prefix(child: &Child, offset: u64, records: Records) -> (u32, u64) {
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
pub(super) fn reach(child: &Child, mut target: u64, records: Records) -> Option<u32> {
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
pub(super) fn nth(child: &Child, mut k: u32) -> Option<u32> {
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

pub(super) fn first(child: &Child) -> Option<u32> {
    match &child.node {
        Node::Leaf(handles) => handles.first().copied(),
        Node::Inner(children) => children.first().and_then(first),
    }
}

pub(super) fn node_bytes(child: &Child) -> usize {
    match &child.node {
        Node::Leaf(handles) => handles.capacity() * std::mem::size_of::<u32>(),
        Node::Inner(children) => {
            children.capacity() * std::mem::size_of::<Child>()
                + children.iter().map(node_bytes).sum::<usize>()
        }
    }
}

impl Leases {
    pub(super) fn tree_insert(&mut self, h: u32, cost: u64) {
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

    pub(super) fn collapse_root(&mut self) {
        while let Node::Inner(children) = &mut self.tree.node {
            if children.len() != 1 {
                break;
            }
            let only = children.pop().expect("one child");
            self.tree = only;
        }
    }

    /// Checks the tree's invariants (the module documentation) and returns its handles in order
    /// (tests).
    #[cfg(test)]
    pub(super) fn check_tree(&self) -> Vec<u32> {
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
        order
    }
}
