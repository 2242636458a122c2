//! The lease set against a plain map, through random and adversarial sequences, with every
//! invariant and the memory bound checked after each step.

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
