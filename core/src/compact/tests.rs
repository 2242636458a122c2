use super::*;
use crate::algorithms::testing::states;
use crate::algorithms::{check, Request, Write, MAX_AMOUNT, MAX_PERIOD_MS};

use super::test_turn as turn;

/// A limiter as a first call at `now_ms` leaves it.
fn limiter(
    algorithm: Algorithm,
    (limit, period_ms, burst): (u64, u64, Option<u64>),
    now_ms: u64,
) -> Limiter {
    let request = Request {
        algorithm,
        params: Params::new(limit, period_ms, burst).unwrap(),
        cost: 1,
        now_ms,
    };
    let mut created = None;
    match check(None, &request, true, &mut created).unwrap().1 {
        Write::Created => created.expect("a created limiter"),
        other => panic!("{other:?}"),
    }
}

fn refs(word: u64) -> u64 {
    TABLE[index(word)].refs.load(Ordering::Relaxed)
}

const COMPACT: [Algorithm; 5] = [
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::Gcra,
];

#[test]
fn every_algorithm_but_the_log_round_trips() {
    let _turn = turn();
    for (i, algorithm) in COMPACT.into_iter().enumerate() {
        let burst = algorithm.is_bucket().then_some(40);
        let mut original = limiter(algorithm, (30 + i as u64, 60_000, burst), 1_796_000_000_123);
        if let State::SlidingWindow { previous, .. } = &mut original.state {
            *previous = 29;
        }
        let word = compact(&original).unwrap_or_else(|| panic!("{}", algorithm.name()));
        assert!(is_compact(word));
        assert_eq!(expand(word), original, "{}", algorithm.name());
        assert_eq!(super::algorithm(word), algorithm);
        release(word);
    }
    let log = limiter(Algorithm::SlidingLog, (3, 1_000, None), 5_000);
    assert_eq!(compact(&log), None);
}

#[test]
fn keys_of_one_parameter_set_share_an_entry_and_hold_references_on_it() {
    let _turn = turn();
    let a = limiter(Algorithm::Gcra, (7, 3_000, Some(11)), 1_000_000);
    let b = limiter(Algorithm::Gcra, (7, 3_000, Some(11)), 1_000_250);
    let (first, second) = (compact(&a).unwrap(), compact(&b).unwrap());
    assert_eq!(index(first), index(second));
    assert_eq!(refs(first), 2);
    assert_eq!((expand(first), expand(second)), (a.clone(), b));
    release(second);
    assert_eq!(refs(first), 1);
    // Another parameter set, another entry.
    let other = compact(&limiter(Algorithm::Gcra, (7, 3_000, Some(12)), 1_000_000)).unwrap();
    assert_ne!(index(other), index(first));
    release(other);
    // A released entry that nobody reassigned yet is found again by its parameters.
    release(first);
    assert_eq!(refs(first), 0);
    let again = compact(&a).unwrap();
    assert_eq!((index(again), refs(again)), (index(first), 1));
    release(again);
}

#[test]
fn a_change_stays_in_its_entry_until_it_leaves_the_epoch_or_the_parameters() {
    let _turn = turn();
    let params = (100, 1_000, Some(100));
    let shape = Shape::of(
        Algorithm::TokenBucket,
        &Params::new(100, 1_000, Some(100)).unwrap(),
    )
    .unwrap();
    // The last millisecond of an epoch.
    let end = (5 << shape.time_bits) - 1;
    let mut limiter = limiter(Algorithm::TokenBucket, params, end - 10);
    let word = compact(&limiter).unwrap();
    let change = rewrite;
    limiter.last_ms = end;
    let same = change(word, &limiter).unwrap();
    assert_eq!((index(same), refs(same)), (index(word), 1));
    assert_eq!(expand(same), limiter);
    // One millisecond later: the next epoch's entry; the old one loses its reference.
    limiter.last_ms = end + 1;
    let moved = change(same, &limiter).unwrap();
    assert_ne!(index(moved), index(same));
    assert_eq!((refs(same), refs(moved)), (0, 1));
    assert_eq!(expand(moved), limiter);
    // New parameters: another entry again.
    limiter.params.capacity = 50;
    if let State::TokenBucket { tokens_scaled } = &mut limiter.state {
        *tokens_scaled = 50 * 1_000;
    }
    let changed = change(moved, &limiter).unwrap();
    assert_eq!((refs(moved), refs(changed)), (0, 1));
    assert_eq!(expand(changed), limiter);
    // A state beyond what the word holds: no word, nothing taken.
    if let State::TokenBucket { tokens_scaled } = &mut limiter.state {
        *tokens_scaled = 1 << 50;
    }
    assert_eq!(change(changed, &limiter), None);
    assert_eq!(refs(changed), 1);
    release(changed);
}

#[test]
fn what_does_not_fit_a_word() {
    let _turn = turn();
    let shape = |algorithm, limit, period_ms, burst| {
        Shape::of(algorithm, &Params::new(limit, period_ms, burst).unwrap())
    };
    // A bucket's C·P beyond 2^50 leaves no bits for the time.
    assert_eq!(
        shape(Algorithm::Gcra, 1, MAX_PERIOD_MS, Some(MAX_AMOUNT)),
        None
    );
    // A bucket refilling for longer than 2^(T+5) ms would spread over too many epochs.
    assert_eq!(
        shape(Algorithm::TokenBucket, 1, 86_400_000, Some(1_000)),
        None
    );
    // Common limits fit, with room to spare.
    for (algorithm, limit, period_ms, burst) in [
        (Algorithm::Gcra, 30, 60_000, Some(16)),
        (Algorithm::TokenBucket, 1_000, 1_000, Some(2_000)),
        (Algorithm::LeakyBucket, 100, 3_600_000, Some(100)),
        (Algorithm::FixedWindow, 10_000, 86_400_000, None),
        (Algorithm::SlidingWindow, 1_000, 60_000, None),
    ] {
        let found = shape(algorithm, limit, period_ms, burst);
        assert!(
            found.is_some_and(|s| s.time_bits >= 20),
            "{algorithm:?} {found:?}"
        );
    }
    // A window whose start is not the window of `last_ms` keeps the 32-byte form too.
    let mut window = limiter(Algorithm::FixedWindow, (5, 1_000, None), 10_500);
    if let State::FixedWindow {
        window_start_ms, ..
    } = &mut window.state
    {
        *window_start_ms = 9_000;
    }
    assert_eq!(compact(&window), None);
}

/// The largest limits that fit a word (burst = limit), as docs/operations.md lists them.
#[test]
fn the_largest_limits_that_fit_a_word() {
    let fits = |algorithm: Algorithm, limit: u64, period_ms: u64| {
        let burst = algorithm.is_bucket().then_some(limit);
        Shape::of(algorithm, &Params::new(limit, period_ms, burst).unwrap()).is_some()
    };
    let (second, minute, hour, day) = (1_000, 60_000, 3_600_000, 86_400_000);
    for (algorithm, period_ms, largest) in [
        (Algorithm::TokenBucket, second, 35_184_372_088),
        (Algorithm::LeakyBucket, minute, 9_162_596),
        (Algorithm::Gcra, hour, 2_386),
        (Algorithm::TokenBucket, day, 3),
        (Algorithm::FixedWindow, minute, 549_755_813_887),
        (Algorithm::FixedWindow, hour, 8_589_934_591),
        (Algorithm::FixedWindow, day, 268_435_455),
        (Algorithm::SlidingWindow, second, 4_194_303),
        (Algorithm::SlidingWindow, minute, 524_287),
        (Algorithm::SlidingWindow, hour, 65_535),
        (Algorithm::SlidingWindow, day, 8_191),
    ] {
        assert!(
            fits(algorithm, largest, period_ms),
            "{algorithm:?} {largest}"
        );
        assert!(
            !fits(algorithm, largest + 1, period_ms),
            "{algorithm:?} {largest}"
        );
    }
}

/// Words of distinct parameter sets (fixed windows of limit `first`, `first + 1`, ...) until
/// the table refuses one.
fn fill_table(first: u64) -> Vec<u64> {
    (first..)
        .map(|limit| {
            compact(&limiter(
                Algorithm::FixedWindow,
                (limit, 1_000, None),
                7_000,
            ))
        })
        .take_while(Option::is_some)
        .map(Option::unwrap)
        .take(ENTRIES + 1)
        .collect()
}

#[test]
fn a_full_table_refuses_and_frees_up_as_keys_go() {
    let _turn = turn();
    let free_before = ENTRIES - entries_in_use();
    let words = fill_table(1_000);
    // Every free slot is taken, and then none is left.
    assert_eq!(words.len(), free_before);
    assert_eq!(entries_in_use(), ENTRIES);
    // Those stored are intact, and one more parameter set does not fit.
    for (i, &word) in words.iter().enumerate() {
        assert_eq!(expand(word).params.limit, 1_000 + i as u64);
    }
    let late = limiter(Algorithm::FixedWindow, (999, 1_000, None), 7_000);
    assert_eq!(compact(&late), None);
    for word in words {
        release(word);
    }
    let word = compact(&late).expect("room again");
    assert_eq!(expand(word), late);
    release(word);
}

/// The table that looked full: every slot used, then all released but the 64 after
/// the cursor (the only ones a search of the next 64 looked at), some of them on another
/// thread as Redis's lazyfree thread does. Each new parameter set still gets a word.
#[test]
fn a_new_parameter_set_gets_a_word_while_any_slot_is_free() {
    let _turn = turn();
    let words = fill_table(1_000);
    assert_eq!(entries_in_use(), ENTRIES);
    let cursor = SLOTS.lock().unwrap().as_ref().unwrap().cursor;
    let kept = |word: &u64| (index(*word) + ENTRIES - cursor) % ENTRIES < 64;
    let (keep, drop): (Vec<u64>, Vec<u64>) = words.into_iter().partition(kept);
    assert_eq!(keep.len(), 64);
    let (here, there) = drop.split_at(drop.len() / 2);
    here.iter().copied().for_each(release);
    let there = there.to_vec();
    std::thread::spawn(move || there.into_iter().for_each(release))
        .join()
        .unwrap();
    assert_eq!(entries_in_use(), 64);
    // Each of the free slots, then none.
    let new = fill_table(1_000_000);
    assert_eq!(new.len(), ENTRIES - 64);
    for (i, &word) in new.iter().enumerate() {
        assert_eq!(expand(word).params.limit, 1_000_000 + i as u64);
    }
    // A slot freed on another thread while the table is full is found by the next search.
    let last = new[new.len() / 2];
    std::thread::spawn(move || release(last)).join().unwrap();
    let again = limiter(Algorithm::FixedWindow, (5, 1_000, None), 7_000);
    let word = compact(&again).expect("the slot freed on another thread");
    assert_eq!(index(word), index(last));
    assert_eq!(expand(word), again);
    for word in keep.into_iter().chain(new).filter(|&w| w != last) {
        release(word);
    }
    release(word);
    assert_eq!(entries_in_use(), 0);
}

/// A stale mark (left by a release on another thread that set a slot's bit after the
/// retain that cleared it) is checked against the count: the slot in use is not handed out,
/// and its bit is cleared until its count is zero again.
#[test]
fn a_stale_free_mark_is_checked_against_the_count() {
    let _turn = turn();
    let word = compact(&limiter(Algorithm::FixedWindow, (77, 1_000, None), 7_000)).unwrap();
    let at = index(word);
    let marked = || FREE[at / 64].load(Ordering::Acquire) & 1 << (at % 64) != 0;
    assert!(!marked());
    FREE[at / 64].fetch_or(1 << (at % 64), Ordering::Release);
    assert_ne!(find_free(at), Some(at));
    assert!(!marked());
    release(word);
    assert!(marked());
    assert_eq!(find_free(at), Some(at));
}

/// A second release of one reference is a bug the debug build stops at.
#[cfg(debug_assertions)]
#[test]
fn a_double_release_is_caught_in_debug_builds() {
    let _turn = turn();
    let word = compact(&limiter(Algorithm::FixedWindow, (78, 1_000, None), 7_000)).unwrap();
    release(word);
    let second = std::panic::catch_unwind(|| release(word));
    assert!(second.is_err(), "a double release went unnoticed");
    // Undo the wrap, so the table stays as the other tests expect it.
    TABLE[index(word)].refs.fetch_add(1, Ordering::AcqRel);
    assert_eq!(refs(word), 0);
}

proptest::proptest! {
    /// Any state the cores produce for parameters that fit a word comes back whole.
    #[test]
    fn states_from_random_calls_round_trip(
        algorithm in 0usize..5,
        limit in 1u64..=1_000_000,
        period in 1u64..=86_400_000,
        burst in 1u64..=10_000,
        calls in proptest::collection::vec((0u64..=100_000, 0u64..=1_000), 1..20),
    ) {
        let algorithm = COMPACT[algorithm];
        let params = Params::new(limit, period, algorithm.is_bucket().then_some(burst)).unwrap();
        proptest::prop_assume!(Shape::of(algorithm, &params).is_some());
        let _turn = turn();
        for limiter in states(algorithm, params, 1_796_000_000_000, &calls) {
            let word = compact(&limiter);
            proptest::prop_assert!(word.is_some());
            proptest::prop_assert_eq!(expand(word.unwrap()), limiter);
            release(word.unwrap());
        }
    }
}
