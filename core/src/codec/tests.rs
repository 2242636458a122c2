use super::buf::StackBuf;
use super::change::{encode_write, Change, PACKED};
use super::limiter::{decode, to_bytes, DecodeError, HEAD_LEN};
use crate::algorithms::{check as run, Request, Write};
use crate::algorithms::{Algorithm, Limiter, Params, SlidingLog, State, MAX_AMOUNT};

fn built(algorithm: Algorithm, burst: Option<u64>, calls: &[(u64, u64)]) -> Limiter {
    let params = Params::new(5, 1000, burst).unwrap();
    let mut stored: Option<Limiter> = None;
    for &(now_ms, cost) in calls {
        let request = Request {
            algorithm,
            params,
            cost,
            now_ms,
        };
        let mut created = None;
        run(stored.as_mut(), &request, true, &mut created).unwrap();
        if let Some(limiter) = created {
            stored = Some(limiter);
        }
    }
    stored.expect("a consuming call")
}

#[test]
fn every_algorithm_round_trips() {
    for algorithm in Algorithm::ALL {
        let burst = algorithm.is_bucket().then_some(7);
        let limiter = built(algorithm, burst, &[(10, 1), (10, 2), (1500, 1)]);
        let bytes = to_bytes(&limiter);
        assert_eq!(decode(&bytes), Ok(limiter.clone()), "{}", algorithm.name());
        let change = Change::Replace(limiter);
        let mut stack = StackBuf::default();
        change.encode(&mut stack);
        if algorithm != Algorithm::SlidingLog {
            assert_eq!(stack.as_slice(), Some(&change.to_bytes()[..]));
        }
        assert_eq!(Change::decode(&change.to_bytes()), Ok(change));
    }
    let append = Change::LogAppend {
        params: Params::new(5, 1000, None).unwrap(),
        t_ms: 77,
        cost: 5,
    };
    assert_eq!(Change::decode(&append.to_bytes()), Ok(append));
}

#[test]
fn commands_replicate_buckets_and_windows_in_33_bytes() {
    for algorithm in Algorithm::ALL {
        let burst = algorithm.is_bucket().then_some(7);
        let limiter = built(algorithm, burst, &[(10, 1), (10, 2), (1500, 1)]);
        let mut stack = StackBuf::default();
        encode_write(&limiter, &mut stack);
        let bytes = stack.as_slice().expect("fits");
        if algorithm == Algorithm::SlidingLog {
            assert_eq!(bytes, &Change::Replace(limiter).to_bytes()[..]);
            continue;
        }
        assert_eq!(
            (bytes.len(), bytes[0]),
            (33, PACKED),
            "{}",
            algorithm.name()
        );
        assert_eq!(
            Change::decode(bytes),
            Ok(Change::Replace(limiter)),
            "{}",
            algorithm.name()
        );
        for len in 0..bytes.len() {
            assert!(
                Change::decode(&bytes[..len]).is_err(),
                "prefix of {len} bytes"
            );
        }
        let mut padded = bytes.to_vec();
        padded.push(0);
        assert_eq!(Change::decode(&padded), Err(DecodeError::Length));
    }
}

#[test]
fn packed_payloads_are_validated_like_full_ones() {
    let limiter = built(Algorithm::FixedWindow, None, &[(10, 1)]);
    let mut stack = StackBuf::default();
    encode_write(&limiter, &mut stack);
    let good = stack.as_slice().unwrap().to_vec();
    let with_word = |i: usize, f: &dyn Fn(u64) -> u64| {
        let mut bytes = good.clone();
        let at = 1 + 8 * i;
        let word = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        bytes[at..at + 8].copy_from_slice(&f(word).to_le_bytes());
        Change::decode(&bytes)
    };
    // The sliding log's tag, and the boxed tag: never packed.
    assert!(with_word(0, &|w| w & !7 | 4).is_err());
    assert!(with_word(0, &|w| w | 7).is_err());
    // A limit of 0 (bits 56..96) and a period of 0 (bits 96..135).
    assert!(with_word(0, &|w| w & 0x00ff_ffff_ffff_ffff).is_err());
    assert!(with_word(1, &|w| w & !(u64::MAX << 32)).is_err());
    // A bit outside the fixed window's fields, and a count beyond the bounds.
    assert!(with_word(3, &|w| w | 1 << 60).is_err());
    assert!(with_word(2, &|w| w | 0xff_ffff_ffff << 7).is_err());
    // A bucket beyond its capacity.
    let bucket = built(Algorithm::TokenBucket, Some(3), &[(10, 1)]);
    let mut words = crate::value::pack(&bucket).unwrap();
    words[3] |= 1 << 61;
    let mut bytes = vec![PACKED];
    for word in words {
        bytes.extend_from_slice(&word.to_le_bytes());
    }
    assert_eq!(Change::decode(&bytes), Err(DecodeError::State));
    assert_eq!(with_word(0, &|w| w), Ok(Change::Replace(limiter)));
}

#[test]
fn truncated_and_padded_payloads_are_refused() {
    let bytes = to_bytes(&built(Algorithm::SlidingLog, None, &[(10, 2), (20, 1)]));
    for len in 0..bytes.len() {
        assert!(decode(&bytes[..len]).is_err(), "prefix of {len} bytes");
    }
    let mut padded = bytes.clone();
    padded.push(0);
    assert_eq!(decode(&padded), Err(DecodeError::Length));
}

#[test]
fn impossible_states_are_refused() {
    let mut bytes = to_bytes(&built(Algorithm::TokenBucket, None, &[(10, 1)]));
    // Tokens beyond the capacity.
    bytes[HEAD_LEN..].copy_from_slice(&u128::MAX.to_le_bytes());
    assert_eq!(decode(&bytes), Err(DecodeError::State));
    // Unknown algorithm.
    bytes[0] = 9;
    assert_eq!(decode(&bytes), Err(DecodeError::Algorithm));
    // A huge run count with no runs behind it.
    let mut log = to_bytes(&built(Algorithm::SlidingLog, None, &[(10, 1)]));
    log[HEAD_LEN..HEAD_LEN + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(decode(&log), Err(DecodeError::State));
}

/// The limiter one key holds after committing `(now_ms, cost)` calls under `params`.
fn after(algorithm: Algorithm, params: Params, calls: &[(u64, u64)]) -> Limiter {
    let mut stored: Option<Limiter> = None;
    for &(now_ms, cost) in calls {
        let request = Request {
            algorithm,
            params,
            cost,
            now_ms,
        };
        let mut created = None;
        let (outcome, write) = run(stored.as_mut(), &request, true, &mut created).unwrap();
        assert!(outcome.decision.allowed, "{request:?}");
        if let (Write::Created, Some(limiter)) = (write, created.take()) {
            stored = Some(limiter);
        }
    }
    stored.expect("a consuming call")
}

/// `limiter` with another state, through the codec.
fn with_state(limiter: &Limiter, state: State) -> Result<Limiter, DecodeError> {
    let edited = Limiter {
        state,
        ..limiter.clone()
    };
    decode(&to_bytes(&edited))
}

/// Each bound of the module comment, at a value a real call sequence leaves (decoded back) and
/// one past it (refused). A refund leaves the states between (tested by `refunds_leave_...`).
#[test]
fn bucket_states_are_held_to_what_an_admitted_call_leaves() {
    // 7 per second, capacity 9: C·P = 9000 scaled units, one request P = 1000.
    let params = Params::new(7, 1_000, Some(9)).unwrap();
    let refused = Err(DecodeError::State);
    // A token bucket: one request from a full bucket leaves (C − 1)·P; C of them, none.
    let one = after(Algorithm::TokenBucket, params, &[(5_000, 1)]);
    assert_eq!(
        one.state,
        State::TokenBucket {
            tokens_scaled: 8_000
        }
    );
    assert_eq!(decode(&to_bytes(&one)), Ok(one.clone()));
    let all = after(Algorithm::TokenBucket, params, &[(5_000, 9)]);
    assert_eq!(decode(&to_bytes(&all)), Ok(all));
    let tokens = |tokens_scaled| State::TokenBucket { tokens_scaled };
    // A refund stops short of a full bucket (a full one is deleted).
    assert!(with_state(&one, tokens(8_999)).is_ok());
    assert_eq!(with_state(&one, tokens(9_000)), refused, "a full bucket");
    // A leaky bucket and gcra: one request queued (a TAT one interval ahead) at least, the
    // capacity (the tolerance) at most.
    for (algorithm, state) in [
        (
            Algorithm::LeakyBucket,
            (|level_scaled| State::LeakyBucket { level_scaled }) as fn(u128) -> State,
        ),
        (Algorithm::Gcra, |ahead_scaled| State::Gcra { ahead_scaled }),
    ] {
        let one = after(algorithm, params, &[(5_000, 1)]);
        assert_eq!(one.state, state(1_000), "{algorithm:?}");
        let full = after(algorithm, params, &[(5_000, 9)]);
        assert_eq!(full.state, state(9_000), "{algorithm:?}");
        for limiter in [&one, &full] {
            assert_eq!(
                decode(&to_bytes(limiter)),
                Ok(limiter.clone()),
                "{algorithm:?}"
            );
        }
        // A refund leaves less than one request queued, never an empty queue.
        assert!(with_state(&one, state(1)).is_ok(), "{algorithm:?}");
        for beyond in [0, 9_001, u128::MAX] {
            assert_eq!(
                with_state(&one, state(beyond)),
                refused,
                "{algorithm:?} {beyond}"
            );
        }
    }
}

#[test]
fn window_and_log_states_are_held_to_what_an_admitted_call_leaves() {
    let refused = Err(DecodeError::State);
    let params = Params::new(5, 1_000, None).unwrap();
    // A fixed window holds the call's cost, and at most the limit.
    let one = after(Algorithm::FixedWindow, params, &[(5_250, 1)]);
    let full = after(Algorithm::FixedWindow, params, &[(5_250, 5)]);
    for limiter in [&one, &full] {
        assert_eq!(decode(&to_bytes(limiter)), Ok(limiter.clone()));
    }
    let count = |count| State::FixedWindow {
        window_start_ms: 5_000,
        count,
    };
    // The limit 5 with a count of 10^12, and one past the limit; an empty window.
    for beyond in [0, 6, MAX_AMOUNT] {
        assert_eq!(with_state(&one, count(beyond)), refused, "count {beyond}");
    }

    // A sliding window, admitted exactly at its ceiling: 4 in the window before, then 4 at
    // e = 750, where the previous 4 weigh 1: 4·250 + 4·1000 = 5000 = L·P.
    let window = |current, previous| State::SlidingWindow {
        window_start_ms: 5_000,
        current,
        previous,
    };
    let ceiling = after(Algorithm::SlidingWindow, params, &[(4_000, 4), (5_750, 4)]);
    assert_eq!(ceiling.state, window(4, 4));
    assert_eq!(decode(&to_bytes(&ceiling)), Ok(ceiling.clone()));
    assert_eq!(with_state(&ceiling, window(5, 4)), refused);
    assert_eq!(with_state(&ceiling, window(4, 5)), refused);
    // A refund may empty the current window, not both.
    assert!(with_state(&ceiling, window(0, 4)).is_ok());
    assert_eq!(with_state(&ceiling, window(0, 0)), refused);
    // The current = previous = 10^12 under a limit of 5.
    assert_eq!(
        with_state(&ceiling, window(MAX_AMOUNT, MAX_AMOUNT)),
        refused
    );
    // A previous count above the limit is no corruption: a limit lowered since (1000 a
    // second, then 5), and late enough in the window for the previous count to fit.
    let wide = Params::new(1_000, 1_000, None).unwrap();
    let mut lowered = after(Algorithm::SlidingWindow, wide, &[(4_000, 1_000)]);
    let request = Request {
        algorithm: Algorithm::SlidingWindow,
        params,
        cost: 1,
        now_ms: 5_999,
    };
    assert!(
        run(Some(&mut lowered), &request, true, &mut None)
            .unwrap()
            .0
            .decision
            .allowed
    );
    assert_eq!(
        lowered.state,
        State::SlidingWindow {
            window_start_ms: 5_000,
            current: 1,
            previous: 1_000
        }
    );
    assert_eq!(decode(&to_bytes(&lowered)), Ok(lowered.clone()));
    // 4000·1 + 1·1000 = 5000 still fits; 4001 does not.
    let at_end = |previous| State::SlidingWindow {
        window_start_ms: 5_000,
        current: 1,
        previous,
    };
    assert!(with_state(&lowered, at_end(4_000)).is_ok());
    assert_eq!(with_state(&lowered, at_end(4_001)), refused);
    // A previous count is a limit's worth at most: 10^12, reached under the largest limit.
    let largest = Params::new(MAX_AMOUNT, 1_000, None).unwrap();
    let most = after(
        Algorithm::SlidingWindow,
        largest,
        &[(4_000, MAX_AMOUNT), (5_999, 1)],
    );
    assert_eq!(most.state, at_end(MAX_AMOUNT));
    assert_eq!(decode(&to_bytes(&most)), Ok(most.clone()));
    assert_eq!(with_state(&most, at_end(MAX_AMOUNT + 1)), refused);

    // A sliding log: one entry at least, the newest at last_ms, none older than the period.
    let params = Params::new(3, 1_000, None).unwrap();
    let log = after(Algorithm::SlidingLog, params, &[(4_001, 1), (5_000, 2)]);
    assert_eq!(decode(&to_bytes(&log)), Ok(log.clone()));
    let runs =
        |runs: &[(u64, u64)]| State::SlidingLog(SlidingLog::from_runs(runs.to_vec()).unwrap());
    // A refund removes the newest entries and keeps last_ms: the newest may be earlier.
    assert!(with_state(&log, runs(&[(4_001, 1), (4_999, 2)])).is_ok());
    for (what, state) in [
        ("empty", runs(&[])),
        ("newest after last", runs(&[(4_001, 1), (5_001, 2)])),
        ("more than the limit", runs(&[(4_001, 2), (5_000, 2)])),
        (
            "oldest a period before last",
            runs(&[(4_000, 1), (5_000, 2)]),
        ),
    ] {
        assert_eq!(with_state(&log, state), refused, "{what}");
    }
}

proptest::proptest! {
    // More cases than the default: a previous count above a lowered limit takes a few
    // hundred sequences to come up (proptest-regressions/codec.txt keeps one).
    #![proptest_config(proptest::test_runner::Config::with_cases(1024))]

    /// Every state the cores store on random call sequences (parameters changing between
    /// calls, tiny limiters and the largest inputs) decodes back whole, as a whole limiter and
    /// in the form commands replicate: the bounds refuse nothing a command can store.
    #[test]
    fn every_state_the_cores_store_decodes(
        states in crate::algorithms::proptests::stored_limiters(),
    ) {
        for limiter in states {
            proptest::prop_assert_eq!(decode(&to_bytes(&limiter)), Ok(limiter.clone()));
            let mut replicated = Vec::new();
            encode_write(&limiter, &mut replicated);
            proptest::prop_assert_eq!(Change::decode(&replicated), Ok(Change::Replace(limiter)));
        }
    }
}

proptest::proptest! {
    /// The same on the store's own generator (value.rs): random gaps and costs up to the
    /// largest amounts, for every algorithm.
    #[test]
    fn states_from_random_calls_decode(
        algorithm in 0u8..6,
        limit in 1u64..=MAX_AMOUNT,
        period in 1u64..=crate::algorithms::MAX_PERIOD_MS,
        burst in 1u64..=MAX_AMOUNT,
        calls in proptest::collection::vec(
            (0u64..=crate::algorithms::MAX_PERIOD_MS, 0u64..=MAX_AMOUNT),
            1..20,
        ),
    ) {
        let algorithm = Algorithm::from_index(algorithm).unwrap();
        // A sliding log of a large limit holds as many entries: keep it at the default cap.
        let limit = if algorithm == Algorithm::SlidingLog { limit % 100_000 + 1 } else { limit };
        let params = Params::new(limit, period, algorithm.is_bucket().then_some(burst)).unwrap();
        for limiter in crate::algorithms::testing::states(algorithm, params, 0, &calls) {
            proptest::prop_assert_eq!(decode(&to_bytes(&limiter)), Ok(limiter));
        }
    }
}

/// The payloads of tests/integration/fixtures/formats.txt, as redis-server wrote them (its
/// README.md says how), per key in order.
fn golden_payloads() -> Vec<(&'static str, Vec<u8>)> {
    let text = include_str!("../../../tests/integration/fixtures/formats.txt");
    let mut key = "";
    let mut payloads = Vec::new();
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("key", name)) => key = name,
            Some(("payload", hex)) => {
                let bytes = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                    .collect();
                payloads.push((key, bytes));
            }
            _ => {}
        }
    }
    payloads
}

/// The stored formats, pinned: each golden payload decodes to the limiter (or the append) the
/// commands that made it left, and this build encodes that value back to the same bytes, in
/// the same kind. A failure here means users' RDB files, AOF files or replication streams
/// would read differently: that takes a new encoding version, not new fixtures.
#[test]
fn golden_payloads_decode_to_what_made_them_and_encode_back_the_same() {
    const T: u64 = 4_102_444_800_000; // 2100-01-01
    let limiter = |limit, period_ms, capacity, last_ms, state| {
        Change::Replace(Limiter {
            params: Params {
                limit,
                period_ms,
                capacity,
            },
            last_ms,
            state,
            blocked_until_ms: 0,
        })
    };
    let fixed = |window_start_ms, count| State::FixedWindow {
        window_start_ms,
        count,
    };
    let sliding = |window_start_ms, current, previous| State::SlidingWindow {
        window_start_ms,
        current,
        previous,
    };
    let log = State::SlidingLog(SlidingLog::from_runs([(T, 2), (T + 5, 1)]).unwrap());
    let appended = |t_ms, cost| Change::LogAppend {
        params: Params::new(5, 10_000, None).unwrap(),
        t_ms,
        cost,
    };
    let states = |key: &str| -> Vec<Change> {
        let tb = |limit, period, capacity, tokens_scaled| {
            limiter(
                limit,
                period,
                capacity,
                T,
                State::TokenBucket { tokens_scaled },
            )
        };
        match key {
            "word:tb" => vec![tb(10, 1_000, 20, 17_000)],
            "word:lb" => vec![limiter(
                10,
                60_000,
                10,
                T,
                State::LeakyBucket {
                    level_scaled: 120_000,
                },
            )],
            "word:gc" => vec![limiter(
                30,
                60_000,
                5,
                T,
                State::Gcra {
                    ahead_scaled: 120_000,
                },
            )],
            "word:fw" => vec![limiter(100, 3_600_000, 100, T + 250, fixed(T, 5))],
            // After its first call (in the window before), then after its second.
            "word:sw" => vec![
                limiter(100, 60_000, 100, T - 30_000, sliding(T - 60_000, 7, 0)),
                limiter(100, 60_000, 100, T + 15_000, sliding(T, 3, 7)),
            ],
            "wide:tb" => vec![tb(1, 86_400_000, 1_000, 999 * 86_400_000)],
            "wide:fw" => vec![limiter(
                MAX_AMOUNT,
                315_360_000_000,
                MAX_AMOUNT,
                T,
                fixed(4_099_680_000_000, 1),
            )],
            "wide:sw" => vec![limiter(
                1_000_000,
                3_600_000,
                1_000_000,
                T,
                sliding(T, 5, 0),
            )],
            "log:sl" => vec![appended(T, 2), appended(T + 5, 1)],
            other => panic!("formats.txt: unknown key {other}"),
        }
    };
    let payloads = golden_payloads();
    assert_eq!(payloads.len(), 20);
    let mut kinds = [0; 4];
    let mut seen = std::collections::HashMap::<&str, usize>::new();
    for (key, bytes) in &payloads {
        let kind = bytes[0];
        kinds[usize::from(kind)] += 1;
        let decoded = Change::decode(bytes).unwrap_or_else(|e| panic!("{key}: {e:?}"));
        // Kind 1 is the rewrite's whole limiter: the key's final state (for the log, what
        // its appends built); kinds 2 and 3 are the commands' writes, one per call.
        let expected = match (kind, key) {
            (1, &"log:sl") => limiter(5, 10_000, 5, T + 5, log.clone()),
            (1, _) => states(key).pop().unwrap(),
            _ => {
                let call = seen.entry(key).or_default();
                *call += 1;
                states(key).swap_remove(*call - 1)
            }
        };
        assert_eq!(decoded, expected, "{key} kind {kind}");
        let again = match (&decoded, kind) {
            (Change::Replace(limiter), 3) => {
                let mut packed = Vec::new();
                encode_write(limiter, &mut packed);
                packed
            }
            _ => decoded.to_bytes(),
        };
        assert_eq!(&again, bytes, "{key} kind {kind}: encoded differently");
        // The RDB encoding is kind 1 without its kind byte.
        if let (Change::Replace(limiter), 1) = (&decoded, kind) {
            assert_eq!(to_bytes(limiter), bytes[1..], "{key}: the RDB encoding");
        }
    }
    assert_eq!(kinds, [0, 9, 2, 9], "payloads per kind");
}
