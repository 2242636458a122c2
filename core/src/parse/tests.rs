use super::check::{parse_check, CheckArgs};
use super::checkall::{parse_checkall, parse_numkeys, CheckAllArgs, CheckAllError};
use super::spec::{parse_period, LimitArg, LimitSpec};
use crate::algorithms::{Algorithm, Kind, Params, MAX_PERIOD_MS};
use crate::error::{ArgError, Options as Expected};
use crate::integer::parse_integer;

fn parse(line: &str) -> Result<CheckArgs, ArgError> {
    let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
    parse_check(&args, 100_000)
}

#[test]
fn algorithm_names_are_whole_and_case_insensitive() {
    for kind in Kind::EVERY {
        let name = kind.name();
        assert_eq!(Kind::parse(name.as_bytes()), Some(kind));
        let upper = name.to_ascii_uppercase();
        assert_eq!(Kind::parse(upper.as_bytes()), Some(kind));
        // A prefix or an extension of a name is no name.
        assert_eq!(Kind::parse(&name.as_bytes()[..name.len() - 1]), None);
        assert_eq!(Kind::parse(format!("{name}s").as_bytes()), None);
    }
    for bad in [
        &b""[..],
        b"s",
        b"sliding",
        b"sliding-bucket",
        b"gcr",
        b"\xff",
        // The length and first letter of a name, another name's tail or a typo.
        b"token-window",
        b"leaky-window",
        b"fixed-bucket",
        b"sliding-windov",
        b"sliding-lag",
        b"gcrb",
        b"Tokenxbucket",
    ] {
        assert_eq!(Kind::parse(bad), None, "{bad:?}");
    }
}

#[test]
fn algorithm_names_parse_as_a_linear_search_would() {
    let reference = |name: &[u8]| {
        Kind::EVERY
            .into_iter()
            .find(|a| a.name().as_bytes().eq_ignore_ascii_case(name))
    };
    for kind in Kind::EVERY {
        let name = kind.name().as_bytes();
        // What the fast comparison relies on: lowercase letters and '-', at most 16 bytes.
        assert!(name.len() <= 16);
        assert!(name.iter().all(|b| b.is_ascii_lowercase() || *b == b'-'));
        // Every byte value at every position, and every name at every other's length.
        for at in 0..name.len() {
            for byte in 0..=255u8 {
                let mut changed = name.to_vec();
                changed[at] = byte;
                assert_eq!(Kind::parse(&changed), reference(&changed), "{changed:?}");
            }
        }
        for other in Kind::EVERY {
            let mut mixed = other.name().as_bytes().to_vec();
            mixed.resize(name.len(), b'-');
            assert_eq!(Kind::parse(&mixed), reference(&mixed), "{mixed:?}");
        }
    }
}

#[test]
fn periods_take_units() {
    assert_eq!(parse_period(b"250"), Some(250));
    assert_eq!(parse_period(b"250ms"), Some(250));
    assert_eq!(parse_period(b"1s"), Some(1000));
    assert_eq!(parse_period(b"15M"), Some(900_000));
    assert_eq!(parse_period(b"1h"), Some(3_600_000));
    assert_eq!(parse_period(b"3650d"), Some(MAX_PERIOD_MS));
    for bad in [
        &b"0"[..],
        b"0s",
        b"3651d",
        b"s",
        b"1w",
        b"1 s",
        b"-1s",
        b"1.5s",
    ] {
        assert_eq!(parse_period(bad), None, "{bad:?}");
    }
}

proptest::proptest! {
    /// The per-call parsers agree with the standard library's reading of the same text.
    #[test]
    fn integers_and_periods_read_as_std_reads_them(
        digits in "[0-9]{0,25}",
        unit in proptest::sample::select(vec!["", "ms", "MS", "mS", "s", "S", "m", "h", "d", "D", "x", "sm", "msx", " s", "0s"]),
        noise in proptest::option::of("[-+ .a-z0-9]{1,3}"),
    ) {
        let text = format!("{digits}{}{unit}", noise.unwrap_or_default());
        let expected_integer = if text.bytes().all(|b| b.is_ascii_digit()) {
            text.parse::<u64>().ok()
        } else {
            None
        };
        proptest::prop_assert_eq!(parse_integer(text.as_bytes()), expected_integer);
        let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
        let scale = match text[split..].to_ascii_lowercase().as_str() {
            "" | "ms" => Some(1),
            "s" => Some(1_000),
            "m" => Some(60_000),
            "h" => Some(3_600_000),
            "d" => Some(86_400_000),
            _ => None,
        };
        let expected_period = scale
            .and_then(|scale| text[..split].parse::<u64>().ok()?.checked_mul(scale))
            .filter(|ms| (1..=MAX_PERIOD_MS).contains(ms));
        proptest::prop_assert_eq!(parse_period(text.as_bytes()), expected_period);
    }
}

#[test]
fn options_come_in_any_order_once_each() {
    let args = parse("TOKEN-BUCKET 10 1s at 5 cost 2 burst 20").unwrap();
    assert_eq!(args.spec.algorithm, Algorithm::TokenBucket);
    assert_eq!(args.spec.params, Params::new(10, 1000, Some(20)).unwrap());
    assert_eq!((args.cost, args.at_ms), (2, Some(5)));
    assert_eq!(parse("fixed-window 10 1s").unwrap().cost, 1);
    assert_eq!(
        parse("fixed-window 10 1s COST 1 COST 2"),
        Err(ArgError::Duplicate("COST"))
    );
    assert_eq!(
        parse("fixed-window 10 1s COST"),
        Err(ArgError::MissingValue("COST"))
    );
    assert_eq!(
        parse("fixed-window 10 1s LIMIT 3"),
        Err(ArgError::UnknownOption {
            at: 3,
            after_period: true,
            expected: Expected::Call,
        })
    );
}

#[test]
fn every_bad_argument_is_named() {
    assert_eq!(
        parse("gcra-bucket 10 1s"),
        Err(ArgError::UnknownAlgorithm {
            at: 0,
            after_period: false
        })
    );
    assert_eq!(parse("fixed-window 0 1s"), Err(ArgError::Limit));
    assert_eq!(parse("fixed-window 1000000000001 1s"), Err(ArgError::Limit));
    assert_eq!(parse("fixed-window 10 0"), Err(ArgError::Period));
    assert_eq!(
        parse("fixed-window 10 1s BURST 5"),
        Err(ArgError::BurstOnWindow)
    );
    assert_eq!(parse("token-bucket 10 1s BURST 0"), Err(ArgError::Burst));
    assert_eq!(parse("token-bucket 10 1s COST -1"), Err(ArgError::Cost));
    assert_eq!(
        parse("token-bucket 10 1s AT 9007199254740992"),
        Err(ArgError::At)
    );
    assert_eq!(parse("token-bucket 10"), Err(ArgError::WrongArity));
    assert_eq!(
        parse("sliding-log 100001 1s"),
        Err(ArgError::LogLimit {
            limit: 100_001,
            max: 100_000
        })
    );
    assert!(parse("token-bucket 1000000000000 3650d BURST 1000000000000 COST 1000000000000 AT 9007199254740991").is_ok());
}

fn parse_all(line: &str) -> Result<CheckAllArgs<'_>, ArgError> {
    parse_all_in_spec(line).map_err(|error| error.error)
}

fn parse_all_in_spec(line: &str) -> Result<CheckAllArgs<'_>, CheckAllError> {
    let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
    parse_checkall(&args, 100_000)
}

#[test]
fn checkall_takes_one_spec_per_key_then_shared_options() {
    let args = parse_all(
        "3 a b c token-bucket 10 1s BURST 20 fixed-window 100 1h sliding-log 5 1m AT 7 COST 2",
    )
    .unwrap();
    assert_eq!(args.numkeys, 3);
    assert_eq!(
        args.specs,
        [
            LimitArg::Inline(LimitSpec {
                algorithm: Algorithm::TokenBucket,
                params: Params::new(10, 1000, Some(20)).unwrap(),
                block_ms: None,
            }),
            LimitArg::Inline(LimitSpec {
                algorithm: Algorithm::FixedWindow,
                params: Params::new(100, 3_600_000, None).unwrap(),
                block_ms: None,
            }),
            LimitArg::Inline(LimitSpec {
                algorithm: Algorithm::SlidingLog,
                params: Params::new(5, 60_000, None).unwrap(),
                block_ms: None,
            }),
        ]
    );
    assert_eq!((args.cost, args.at_ms), (2, Some(7)));
    // The last spec takes its BURST among the options, as CHECK does.
    let args = parse_all("2 a b fixed-window 1 1s leaky-bucket 3 1s COST 0 burst 9").unwrap();
    assert_eq!(
        args.specs[1],
        LimitArg::Inline(LimitSpec {
            algorithm: Algorithm::LeakyBucket,
            params: Params::new(3, 1000, Some(9)).unwrap(),
            block_ms: None,
        })
    );
    assert_eq!(args.cost, 0);
}

#[test]
fn checkall_of_one_key_parses_like_check() {
    for tail in [
        "token-bucket 10 1s",
        "TOKEN-BUCKET 10 1s at 5 cost 2 burst 20",
        "fixed-window 10 1s COST 1 COST 2",
        "fixed-window 10 1s COST",
        "fixed-window 10 1s LIMIT 3",
        "fixed-window 10 1s BURST 5",
        "gcra 10 1s",
        "sliding-log 100001 1s",
        "token-bucket 10 1s AT 9007199254740992",
    ] {
        let check_args: Vec<&[u8]> = tail.split(' ').map(str::as_bytes).collect();
        let line = format!("1 k {tail}");
        let all_args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        let both = (parse(tail), parse_checkall(&all_args, 100_000));
        match both {
            (Ok(check), Ok(all)) => {
                assert_eq!(all.specs, [LimitArg::Inline(check.spec)], "{tail}");
                assert_eq!((all.cost, all.at_ms), (check.cost, check.at_ms), "{tail}");
            }
            (Err(check), Err(all)) => assert_eq!(
                check.message("c", &check_args),
                all.error.message("c", &all_args),
                "{tail}"
            ),
            (check, all) => panic!("{tail}: {check:?} {all:?}"),
        }
    }
}

#[test]
fn checkall_names_its_bad_arguments() {
    assert_eq!(parse_all("1 k fixed-window 1"), Err(ArgError::WrongArity));
    assert_eq!(parse_all("0 k fixed-window 1 1s"), Err(ArgError::NumKeys));
    assert_eq!(parse_all("-1 k fixed-window 1 1s"), Err(ArgError::NumKeys));
    assert_eq!(parse_all("x k fixed-window 1 1s"), Err(ArgError::NumKeys));
    assert_eq!(
        parse_all("3 a b fixed-window 1 1s fixed-window 1 1s"),
        Err(ArgError::SpecCount { keys: 3, specs: 2 })
    );
    assert_eq!(parse_all("9 a b c d"), Err(ArgError::NumKeys));
    // A missing spec: the options come where a spec should.
    assert_eq!(
        parse_all("2 a b fixed-window 1 1s COST 1 AT 5 x"),
        Err(ArgError::WrongArity)
    );
    assert_eq!(
        parse_all("2 a b fixed-window 1 1s fixed-window 1"),
        Err(ArgError::WrongArity)
    );
    assert_eq!(
        parse_all("2 a b token-bucket 1 1s BURST 2 BURST 3 fixed-window 1 1s"),
        Err(ArgError::Duplicate("BURST"))
    );
    assert_eq!(
        parse_all("2 a b fixed-window 1 1s BURST 2 fixed-window 1 1s"),
        Err(ArgError::BurstOnWindow)
    );
    assert_eq!(
        parse_all("2 a b token-bucket 1 1s BURST"),
        Err(ArgError::MissingValue("BURST"))
    );
    assert_eq!(
        parse_all("2 a b token-bucket 1 1s BURST x fixed-window 1 1s"),
        Err(ArgError::Burst)
    );
    assert_eq!(
        parse_all("2 a b gcr 1 1s fixed-window 1 1s"),
        Err(ArgError::UnknownAlgorithm {
            at: 3,
            after_period: false
        })
    );
    assert_eq!(
        parse_all("2 a b fixed-window 1 0 fixed-window 1 1s"),
        Err(ArgError::Period)
    );
    assert_eq!(
        parse_all("2 a b fixed-window 1 1s fixed-window 1 1s COST 1 COST 2"),
        Err(ArgError::Duplicate("COST"))
    );
    assert_eq!(
        parse_all("2 a b fixed-window 1 1s fixed-window 1 1s fixed-window 1 1s"),
        Err(ArgError::SpecCount { keys: 2, specs: 3 })
    );
    assert_eq!(
        parse_all("2 a b sliding-log 100001 1s fixed-window 1 1s"),
        Err(ArgError::LogLimit {
            limit: 100_001,
            max: 100_000
        })
    );
}

#[test]
fn checkall_errors_name_the_spec_they_are_in() {
    let message = |line: &str| {
        let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        parse_checkall(&args, 100_000)
            .unwrap_err()
            .message("ratelimit.checkall", &args)
    };
    assert_eq!(
        message("2 a b token-bucket 1 1s fixed-window 1 1s BURST 2"),
        "ERR limit spec 2 (key 'b'): BURST applies only to token-bucket, leaky-bucket and gcra"
    );
    assert_eq!(
        message("2 a b fixed-window 1 1s BURST 2 token-bucket 1 1s"),
        "ERR limit spec 1 (key 'a'): BURST applies only to token-bucket, leaky-bucket and gcra"
    );
    assert!(
        message("3 a b c fixed-window 1 1s fixed-window 0 1s fixed-window 1 1s")
            .starts_with("ERR limit spec 2 (key 'b'): limit must be")
    );
    assert!(message("2 a b fixed-window 1 1s sliding-logs 1 1s")
        .starts_with("ERR limit spec 2 (key 'b'): unknown algorithm"));
    assert_eq!(
        message("2 a b token-bucket 1 1s BURST 2 BURST 3 fixed-window 1 1s"),
        "ERR limit spec 1 (key 'a'): BURST given more than once"
    );
    // Shared options and arity belong to no spec.
    assert!(message("2 a b fixed-window 1 1s fixed-window 1 1s COST x").starts_with("ERR COST"));
    assert_eq!(
        message("2 a b fixed-window 1 1s fixed-window 1"),
        "ERR wrong number of arguments for 'ratelimit.checkall' command"
    );
    // numkeys is named before the arity is counted.
    assert!(message("0").starts_with("ERR numkeys"));
    assert!(message("0 k").starts_with("ERR numkeys"));
    assert!(message("x k fixed-window").starts_with("ERR numkeys"));
    assert_eq!(parse_all("1 k"), Err(ArgError::WrongArity));
}

#[test]
fn unknown_words_are_named_and_a_unit_after_a_bare_period_is_explained() {
    let check = |line: &str| {
        let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        parse_check(&args, 100_000)
            .unwrap_err()
            .message("ratelimit.check", &args)
    };
    assert_eq!(
        check("sliding-window 100 1 minute"),
        "ERR unknown option 'minute': expected BURST, BLOCK, COST or AT; a period takes its unit in \
         the same argument: 1m, not '1 minute'"
    );
    assert_eq!(
        check("fixed-window 5 15 Secs"),
        "ERR unknown option 'Secs': expected BURST, BLOCK, COST or AT; a period takes its unit in \
         the same argument: 15s, not '15 Secs'"
    );
    assert_eq!(
        check("fixed-window 5 15 fortnights"),
        "ERR unknown option 'fortnights': expected BURST, BLOCK, COST or AT; a period takes its unit \
         in the same argument: 15ms, 15s, 15m, 15h or 15d"
    );
    // No hint after a period with its unit, or after another option's value.
    assert_eq!(
        check("fixed-window 5 15s minute"),
        "ERR unknown option 'minute': expected BURST, BLOCK, COST or AT"
    );
    assert_eq!(
        check("fixed-window 5 15s COST 1 minute"),
        "ERR unknown option 'minute': expected BURST, BLOCK, COST or AT"
    );
    assert_eq!(
        check("sliding-windows 100 1m"),
        "ERR unknown algorithm 'sliding-windows': expected token-bucket, leaky-bucket, \
         fixed-window, sliding-window, sliding-log or gcra"
    );
    // Long or binary words are shown in part.
    let long = format!("fixed-window 5 1s {}\u{7}x", "y".repeat(40));
    assert_eq!(
        check(&long),
        format!(
            "ERR unknown option '{}...': expected BURST, BLOCK, COST or AT",
            "y".repeat(32)
        )
    );
    assert_eq!(
        check("fixed-window 5 1s a\u{1}b"),
        "ERR unknown option 'a?b': expected BURST, BLOCK, COST or AT"
    );
}

#[test]
fn checkall_says_how_many_specs_it_found() {
    let message = |line: &str| {
        let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        parse_checkall(&args, 100_000)
            .unwrap_err()
            .message("ratelimit.checkall", &args)
    };
    assert_eq!(
        message("2 a b sliding-window 100 1m"),
        "ERR 2 keys need 2 limit specs (one per key, in order); found 1"
    );
    assert_eq!(
        message("2 a b sliding-window 100 1m COST 2"),
        "ERR 2 keys need 2 limit specs (one per key, in order); found 1"
    );
    assert_eq!(
        message("1 a sliding-window 100 1m fixed-window 5 1s"),
        "ERR 1 key needs 1 limit spec (one per key, in order); found 2"
    );
    assert_eq!(
        message("3 a b c token-bucket 1 1s BURST 2 fixed-window 1 1h AT 5"),
        "ERR 3 keys need 3 limit specs (one per key, in order); found 2"
    );
    // A bare period in a spec that is not the last: its unit is taken for the next spec.
    assert_eq!(
        message("2 a b sliding-window 100 1 minute fixed-window 10 1h"),
        "ERR limit spec 2 (key 'b'): unknown algorithm 'minute': expected token-bucket, \
         leaky-bucket, fixed-window, sliding-window, sliding-log or gcra; a period takes its \
         unit in the same argument: 1m, not '1 minute'"
    );
    assert_eq!(
        message("2 a b fixed-window 100 1m fixed-window 10 1 hour"),
        "ERR unknown option 'hour': expected BURST, BLOCK, COST or AT; a period takes its unit in \
         the same argument: 1h, not '1 hour'"
    );
    // A spec whose own arguments are missing is still a wrong number of arguments.
    assert_eq!(
        message("2 a b fixed-window 1 1s fixed-window 1"),
        "ERR wrong number of arguments for 'ratelimit.checkall' command"
    );
}

#[test]
fn numkeys_leaves_room_for_the_specs() {
    assert_eq!(parse_numkeys(b"1", 4), Ok(1));
    assert_eq!(parse_numkeys(b"2", 8), Ok(2));
    assert_eq!(parse_numkeys(b"2", 7), Ok(2));
    assert_eq!(parse_numkeys(b"7", 7), Err(ArgError::NumKeys));
    assert_eq!(parse_numkeys(b"0", 8), Err(ArgError::NumKeys));
    assert_eq!(parse_numkeys(b"+1", 8), Err(ArgError::NumKeys));
    assert_eq!(
        parse_numkeys(b"99999999999999999999", 8),
        Err(ArgError::NumKeys)
    );
}

/// `line`'s arguments, separated by `|` (each kept whole, spaces and all).
fn whole(line: &str) -> Vec<&[u8]> {
    line.split('|').map(str::as_bytes).collect()
}

#[test]
fn a_spec_of_one_argument_reads_as_its_words() {
    use super::check::{parse_call, parse_refund, parse_take};
    use super::words::read_call;
    type Parser = for<'a> fn(&[&'a [u8]], u64) -> Result<super::CallArgs<'a>, ArgError>;
    let parsers: [(Parser, &str); 3] = [
        (parse_call, "|COST|2|AT|5"),
        (parse_refund, "|COST|1"),
        (parse_take, "|MAX|3|AT|5"),
    ];
    for spec in [
        "token-bucket 10 1s",
        "token-bucket 10 1s BURST 20 BLOCK 1m",
        "GCRA 10 1S block 1s burst 5",
        "sliding-log 3 250ms",
        "POLICY api",
        "policy api",
        // Refused by the grammar, alike.
        "fixed-window 10 1s BURST 5",
        "fixed-window 0 1s",
        "sliding-window 100 1 minute",
        "concurrency 10 1s",
        "POLICY api BURST 2",
    ] {
        for (parse, options) in parsers {
            let words_line = format!("{}{options}", spec.replace(' ', "|"));
            let words = whole(&words_line);
            let one_line = format!("{spec}{options}");
            let one = whole(&one_line);
            let by_words = parse(&words, 100_000);
            let by_one = read_call(&one, |read| parse(read, 100_000)).expect("well formed");
            assert_eq!(by_words, by_one, "{one_line}");
            // An error names the same words.
            if let (Err(a), Err(b)) = (by_words, by_one) {
                let split: Vec<&[u8]> = one_line.split(['|', ' ']).map(str::as_bytes).collect();
                assert_eq!(a.message("c", &words), b.message("c", &split), "{one_line}");
            }
        }
    }
    // Words only: read as they are.
    let words = whole("fixed-window|10|1s");
    assert_eq!(read_call(&words, <[&[u8]]>::len), Ok(3));
}

#[test]
fn a_malformed_spec_of_one_argument_is_refused_before_anything_else() {
    use super::words::read_call;
    use crate::error::SpecWordsError::*;
    for (line, problem) in [
        (" fixed-window 10 1s", EmptyWord),
        ("fixed-window 10 1s ", EmptyWord),
        ("fixed-window  10 1s", EmptyWord),
        ("fixed-window\t10 1s", Whitespace),
        ("fixed-window 10\n 1s", Whitespace),
        ("fixed-window 10 1s COST 2", CallOption("COST")),
        ("fixed-window 10 1s at 2", CallOption("AT")),
        ("POLICY api max 2|MAX|1", CallOption("MAX")),
        ("fixed-window 10|1s", Incomplete),
        ("token-bucket 10 1s burst|5", Incomplete),
        ("token-bucket 10 1s BURST 5 BLOCK|1s", Incomplete),
        // The first problem, in order; before the grammar's own.
        ("fixed-window 0 1s  COST", EmptyWord),
        ("leaky-window 10 1s COST 2", CallOption("COST")),
    ] {
        let args = whole(line);
        assert_eq!(
            read_call(&args, |_| ()),
            Err(ArgError::SpecWords { at: 0, problem }),
            "{line:?}"
        );
    }
    // In CHECKALL: the spec and its key named, none past the keys' count.
    for (line, spec) in [
        ("2|a|b|fixed-window 1 1s|token-bucket 1 1s BURST|2", Some(2)),
        ("2|a|b| fixed-window 1 1s|fixed-window|1|1s", Some(1)),
        ("1|a|fixed-window|1|1s|COST|1|gcra 1 1s BURST", None),
    ] {
        let args = whole(line);
        let error = super::read_checkall(&args, |_| ()).expect_err(line);
        assert_eq!(error.spec, spec, "{line}");
    }
    // Without a valid numkeys, nothing is split: the parser names it.
    let args = whole("x|a|fixed-window 1 1s");
    assert_eq!(
        super::read_checkall(&args, |read| parse_checkall(read, 100_000).map(|_| ())),
        Ok(Err(ArgError::NumKeys.into()))
    );
}

#[test]
fn checkall_reads_specs_of_one_argument_among_words() {
    use super::read_checkall;
    for (words_line, one_line) in [
        (
            "2|a|b|fixed-window|2|1s|token-bucket|1000|1h|COST|2",
            "2|a|b|fixed-window 2 1s|token-bucket|1000|1h|COST|2",
        ),
        (
            "3|a|b|c|gcra|1|1s|BURST|2|POLICY|api|sliding-log|5|1m|AT|7",
            "3|a|b|c|gcra 1 1s BURST 2|POLICY api|sliding-log 5 1m|AT|7",
        ),
        // BURST after a one-argument spec is still its words' BURST.
        (
            "2|a|b|token-bucket|1|1s|BURST|3|fixed-window|1|1s",
            "2|a|b|token-bucket 1 1s|BURST|3|fixed-window 1 1s",
        ),
        // Errors, alike: more specs than keys, a spec's own error.
        (
            "1|a|fixed-window|1|1s|fixed-window|1|1s",
            "1|a|fixed-window 1 1s|fixed-window 1 1s",
        ),
        (
            "2|a|b|fixed-window|1|1s|BURST|2|gcra|1|1s",
            "2|a|b|fixed-window 1 1s BURST 2|gcra 1 1s",
        ),
    ] {
        let (words, one) = (whole(words_line), whole(one_line));
        let by_words = parse_checkall(&words, 100_000);
        let by_one = read_checkall(&one, |read| parse_checkall(read, 100_000)).expect(one_line);
        assert_eq!(by_words, by_one, "{one_line}");
    }
}
