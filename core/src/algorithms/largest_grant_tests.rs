use super::largest_grant;

/// Every threshold from 0 to 70 under every `max` up to 70, and the largest values.
#[test]
fn finds_the_threshold_and_asks_max_first() {
    for threshold in 0..=70u64 {
        for max in 0..=70u64 {
            let mut asked = Vec::new();
            let granted = largest_grant(max, |cost| -> Result<bool, ()> {
                asked.push(cost);
                Ok(cost <= threshold)
            });
            assert_eq!(
                granted,
                Ok(threshold.min(max)),
                "threshold {threshold}, max {max}"
            );
            assert!(asked.first().is_none_or(|first| *first == max));
            assert!(asked.iter().all(|cost| (1..=max).contains(cost)));
        }
    }
    let max = 1_000_000_000_000;
    for threshold in [0, 1, max / 3, max - 1, max] {
        let mut questions = 0;
        let granted = largest_grant(max, |cost| -> Result<bool, ()> {
            questions += 1;
            Ok(cost <= threshold)
        });
        assert_eq!(granted, Ok(threshold));
        assert!(questions <= 41, "{questions} questions");
    }
}

#[test]
fn passes_the_predicates_error_on() {
    assert_eq!(
        largest_grant(10, |_| Err::<bool, _>("wrong type")),
        Err("wrong type")
    );
    assert_eq!(
        largest_grant(10, |cost| if cost < 5 { Err("late") } else { Ok(false) }),
        Err("late")
    );
}
