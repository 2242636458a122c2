//! Defining policies: what GET and LIST answer, the name rule, unknown policies (refused, nothing
//! created), the bound `ratelimit.max-policies`, and the arguments SET and calls refuse.

use super::{
    check_cmd, checkall_cmd, define, definition, get, list, policy_figures, words, SpecArg,
};
use crate::common;

use common::model::Spec;
use common::{
    cmd_error, config_get, config_set, dbsize, decision, exists, future_base_ms, limiter_info, run,
    run_error, run_ok, send_one, show_value, Server,
};
use redis::Value;
use redis_ratelimit_core::algorithms::Algorithm;

const NAME_RULE: &str = "ERR policy name must be 1 to 64 bytes of A-Z, a-z, 0-9, '_', '-' and '.'";

#[test]
fn get_and_list_answer_the_definitions() {
    let server = Server::start();
    let mut con = server.client();
    // Every algorithm, BURST given or not, periods with units; names of every allowed byte.
    let long = "x".repeat(64);
    let defined: Vec<(&str, Spec, bool)> = vec![
        (
            "api.v2_read-heavy",
            Spec {
                burst: Some(20),
                ..Spec::new(Algorithm::TokenBucket, 10, 1000)
            },
            false,
        ),
        ("B", Spec::new(Algorithm::LeakyBucket, 5, 60_000), true),
        (
            "0",
            Spec::new(Algorithm::FixedWindow, 100, 3_600_000),
            false,
        ),
        ("-", Spec::new(Algorithm::SlidingWindow, 7, 250), true),
        (".", Spec::new(Algorithm::SlidingLog, 3, 86_400_000), false),
        (
            "_",
            Spec {
                burst: Some(1),
                ..Spec::new(Algorithm::Gcra, 50, 1000)
            },
            false,
        ),
        (&long, Spec::new(Algorithm::Gcra, 2, 2), false),
    ];
    for (name, spec, shadow) in &defined {
        define(&mut con, name, spec, *shadow);
        assert_eq!(
            get(&mut con, name),
            Some(definition(spec, *shadow)),
            "{name}"
        );
    }
    // The RESP2 reply is a flat array in this order; RESP3 a map of the same.
    assert_eq!(
        show_value(&run(&mut con, "RATELIMIT.POLICY GET api.v2_read-heavy")),
        "[algorithm, token-bucket, limit, 10, period_ms, 1000, burst, 20, mode, enforce, block_ms, 0]"
    );
    let mut resp3 = server.client_resp3();
    let Value::Map(pairs) = run(&mut resp3, "RATELIMIT.POLICY GET B") else {
        panic!("RESP3 GET is not a map");
    };
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(field, value)| (show_value(field), show_value(value)))
        .collect();
    assert_eq!(
        pairs,
        [
            ("algorithm", "leaky-bucket"),
            ("limit", "5"),
            ("period_ms", "60000"),
            ("burst", "5"),
            ("mode", "shadow"),
            ("block_ms", "0")
        ]
        .map(|(f, v)| (f.to_string(), v.to_string()))
    );
    assert_eq!(run(&mut resp3, "RATELIMIT.POLICY GET missing"), Value::Nil);
    // Units are read as CHECK reads them.
    run_ok(&mut con, "RATELIMIT.POLICY SET units sliding-window 3 15m");
    assert_eq!(get(&mut con, "units").unwrap()["period_ms"], "900000");
    run_ok(
        &mut con,
        "RATELIMIT.POLICY set Units gcra 3 2d burst 4 shadow",
    );
    let units = get(&mut con, "Units").unwrap();
    assert_eq!(
        (
            units["period_ms"].as_str(),
            units["burst"].as_str(),
            units["mode"].as_str()
        ),
        ("172800000", "4", "shadow")
    );

    // LIST: sorted bytewise (names are case-sensitive).
    let mut names: Vec<String> = defined
        .iter()
        .map(|(name, _, _)| name.to_string())
        .collect();
    names.extend(["units".to_string(), "Units".to_string()]);
    names.sort();
    assert_eq!(list(&mut con), names);
    assert_eq!(get(&mut con, "missing"), None);

    // SET of an existing name replaces it (the mode too).
    let replaced = Spec::new(Algorithm::FixedWindow, 9, 1000);
    define(&mut con, "B", &replaced, false);
    assert_eq!(get(&mut con, "B"), Some(definition(&replaced, false)));
    // DEL: 1, then 0; the others stay.
    assert_eq!(run(&mut con, "RATELIMIT.POLICY DEL B"), Value::Int(1));
    assert_eq!(run(&mut con, "RATELIMIT.POLICY DEL B"), Value::Int(0));
    assert_eq!(get(&mut con, "B"), None);
    names.retain(|name| name != "B");
    assert_eq!(list(&mut con), names);
    assert_eq!(policy_figures(&server).len(), names.len());
    // Policies are not keys.
    assert_eq!(dbsize(&mut con), 0);
}

#[test]
fn bad_names_are_refused_everywhere_and_create_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let at = future_base_ms().to_string();
    let long = vec![b'x'; 65];
    let bad: [&[u8]; 7] = [
        b"",
        &long,
        b"a:b",
        b"a b",
        "café".as_bytes(),
        b"a/b",
        b"tab\t",
    ];
    for name in bad {
        let shown = String::from_utf8_lossy(name);
        let set = words(&[
            b"RATELIMIT.POLICY",
            b"SET",
            name,
            b"token-bucket",
            b"5",
            b"1s",
        ]);
        assert_eq!(cmd_error(&mut con, &set), NAME_RULE, "SET {shown:?}");
        for sub in [&b"GET"[..], b"DEL"] {
            let cmd = words(&[b"RATELIMIT.POLICY", sub, name]);
            assert_eq!(cmd_error(&mut con, &cmd), NAME_RULE, "{sub:?} {shown:?}");
        }
        // A call naming it is refused before any key is opened.
        for command in [&b"RATELIMIT.CHECK"[..], b"RATELIMIT.PEEK"] {
            let cmd = words(&[command, b"k", b"POLICY", name, b"AT", at.as_bytes()]);
            assert_eq!(cmd_error(&mut con, &cmd), NAME_RULE, "{shown:?}");
        }
        let cmd = words(&[b"RATELIMIT.CHECKALL", b"1", b"k", b"POLICY", name]);
        assert!(
            cmd_error(&mut con, &cmd).contains(&NAME_RULE[4..]),
            "CHECKALL {shown:?}"
        );
    }
    assert_eq!(list(&mut con), Vec::<String>::new());
    assert_eq!(dbsize(&mut con), 0);
}

#[test]
fn an_unknown_policy_is_refused_and_nothing_is_created() {
    let server = Server::start();
    let mut con = server.client();
    let at = future_base_ms();
    let known = Spec::new(Algorithm::TokenBucket, 5, 60_000);
    define(&mut con, "known", &known, false);
    let refused = "ERR no such policy 'nope'";
    for command in ["RATELIMIT.CHECK", "RATELIMIT.PEEK"] {
        let cmd = super::call_cmd(command, "k", "nope", 1, at);
        assert_eq!(cmd_error(&mut con, &cmd), refused, "{command}");
    }
    // Names are case-sensitive.
    assert_eq!(
        cmd_error(&mut con, &check_cmd("k", "KNOWN", 1, at)),
        "ERR no such policy 'KNOWN'"
    );
    // CHECKALL: the unknown one refuses the whole call, wherever it stands.
    let nope = || SpecArg::Policy("nope".into());
    let calls = [
        vec![SpecArg::Policy("known".into()), nope()],
        vec![nope(), SpecArg::Inline(known)],
        vec![SpecArg::Inline(known), nope()],
    ];
    for specs in &calls {
        let cmd = checkall_cmd(&["k1", "k2"], specs, 1, at);
        assert_eq!(cmd_error(&mut con, &cmd), refused, "{specs:?}");
    }
    assert_eq!(dbsize(&mut con), 0);
    // Counted nowhere.
    assert_eq!(policy_figures(&server)["known"], super::Figures::default());
    assert_eq!(
        super::algorithm_figures(&server, "token-bucket"),
        [0, 0, 0, 0]
    );

    // A deleted policy is unknown from then on; its keys keep their state and work inline.
    assert_eq!(decision(&mut con, &check_cmd("kept", "known", 2, at))[2], 3);
    let before = limiter_info(&mut con, "kept");
    assert_eq!(run(&mut con, "RATELIMIT.POLICY DEL known"), Value::Int(1));
    assert_eq!(
        cmd_error(&mut con, &check_cmd("kept", "known", 1, at)),
        "ERR no such policy 'known'"
    );
    assert_eq!(limiter_info(&mut con, "kept"), before);
    let inline = super::inline_cmd("RATELIMIT.CHECK", "kept", &known, 1, at);
    assert_eq!(decision(&mut con, &inline)[2], 2);
}

#[test]
fn max_policies_bounds_new_names_but_not_replacements() {
    let server = Server::start();
    let mut con = server.client();
    assert_eq!(config_get(&mut con, "ratelimit.max-policies"), "10000");
    config_set(&mut con, "ratelimit.max-policies", "3").unwrap();
    let spec = |limit| Spec::new(Algorithm::SlidingWindow, limit, 1000);
    for name in ["p1", "p2", "p3"] {
        define(&mut con, name, &spec(1), false);
    }
    let full = "ERR too many policies: ratelimit.max-policies is 3 (RATELIMIT.POLICY DEL one, or raise it)";
    let fourth = super::set_cmd("p4", &spec(1), false);
    assert_eq!(cmd_error(&mut con, &fourth), full);
    assert_eq!(get(&mut con, "p4"), None);
    // Replacing a name, or setting it to what it is, needs no room.
    define(&mut con, "p2", &spec(8), true);
    define(&mut con, "p2", &spec(8), true);
    assert_eq!(get(&mut con, "p2"), Some(definition(&spec(8), true)));
    // A DEL makes room.
    assert_eq!(run(&mut con, "RATELIMIT.POLICY DEL p1"), Value::Int(1));
    define(&mut con, "p4", &spec(1), false);
    assert_eq!(
        cmd_error(&mut con, &super::set_cmd("p5", &spec(1), false)),
        full
    );
    // Lowered below the count: the defined ones stay, new ones wait.
    config_set(&mut con, "ratelimit.max-policies", "1").unwrap();
    assert_eq!(list(&mut con), ["p2", "p3", "p4"]);
    assert_eq!(
        cmd_error(&mut con, &super::set_cmd("p5", &spec(1), false)),
        full.replace("is 3", "is 1")
    );
    define(&mut con, "p3", &spec(2), false);
    config_set(&mut con, "ratelimit.max-policies", "0").unwrap();
    assert_eq!(
        cmd_error(&mut con, &super::set_cmd("p5", &spec(1), false)),
        full.replace("is 3", "is 0")
    );
    // Its bounds: 0 to 1000000.
    for value in ["-1", "1000001", "x"] {
        assert!(
            config_set(&mut con, "ratelimit.max-policies", value).is_err(),
            "max-policies {value}"
        );
    }
    config_set(&mut con, "ratelimit.max-policies", "1000000").unwrap();
    define(&mut con, "p5", &spec(1), false);
    assert_eq!(list(&mut con), ["p2", "p3", "p4", "p5"]);
}

#[test]
fn set_takes_checks_limit_arguments_with_their_errors_and_only_burst_and_shadow() {
    let server = Server::start();
    let mut con = server.client();
    // Whatever CHECK refuses in a spec, SET refuses with the same error.
    let bad_specs = [
        "token-bucket 0 1s",
        "token-bucket -1 1s",
        "token-bucket 1000000000001 1s",
        "token-bucket 5 0",
        "token-bucket 5 abc",
        "token-bucket 5 1x",
        "token-bucket 5 3651d",
        "no-such-algorithm 5 1s",
        "fixed-window 5 1s BURST 3",
        "sliding-log 5 1s BURST 3",
        "token-bucket 5 1s BURST 0",
        "gcra 5 1s BURST 1000000000001",
        "token-bucket 5 1s BURST",
        "leaky-bucket 5 1s BURST 2 BURST 3",
        "sliding-log 100001 1s",
    ];
    for spec in bad_specs {
        let check = run_error(&mut con, &format!("RATELIMIT.CHECK k {spec}"));
        let set = run_error(&mut con, &format!("RATELIMIT.POLICY SET p {spec}"));
        assert_eq!(set, check, "{spec}");
    }
    // COST and AT belong to calls, not definitions.
    for option in ["COST 1", "AT 1700000000000"] {
        let word = option.split(' ').next().unwrap();
        assert_eq!(
            run_error(
                &mut con,
                &format!("RATELIMIT.POLICY SET p token-bucket 5 1s {option}")
            ),
            format!("ERR unknown option '{word}': expected BURST, BLOCK or SHADOW")
        );
    }
    assert_eq!(
        run_error(
            &mut con,
            "RATELIMIT.POLICY SET p token-bucket 5 1s SHADOW SHADOW"
        ),
        "ERR SHADOW given more than once"
    );
    // Arity and subcommands.
    for (line, command) in [
        (
            "RATELIMIT.POLICY SET p token-bucket 5",
            "ratelimit.policy|set",
        ),
        ("RATELIMIT.POLICY GET", "ratelimit.policy|get"),
        ("RATELIMIT.POLICY GET a b", "ratelimit.policy|get"),
        ("RATELIMIT.POLICY DEL a b", "ratelimit.policy|del"),
        ("RATELIMIT.POLICY LIST x", "ratelimit.policy|list"),
        ("RATELIMIT.POLICY", "ratelimit.policy"),
    ] {
        assert_eq!(
            run_error(&mut con, line),
            format!("ERR wrong number of arguments for '{command}' command"),
            "{line}"
        );
    }
    assert!(run_error(&mut con, "RATELIMIT.POLICY NOPE").contains("unknown subcommand"));
    assert_eq!(
        list(&mut con),
        Vec::<String>::new(),
        "a refused SET defined something"
    );

    // BURST cannot be given with POLICY: the policy sets the limit.
    define(
        &mut con,
        "p",
        &Spec::new(Algorithm::TokenBucket, 5, 1000),
        false,
    );
    for command in ["RATELIMIT.CHECK", "RATELIMIT.PEEK"] {
        for tail in ["BURST 3", "COST 1 BURST 3", "burst 3 AT 1700000000000"] {
            assert_eq!(
                run_error(&mut con, &format!("{command} k POLICY p {tail}")),
                "ERR BURST cannot be given with POLICY: the policy sets the limit",
                "{command} {tail}"
            );
        }
    }
    let error = run_error(
        &mut con,
        "RATELIMIT.CHECKALL 2 k j POLICY p BURST 3 POLICY p",
    );
    assert!(
        error.contains("BURST cannot be given with POLICY: the policy sets the limit"),
        "{error}"
    );
    assert_eq!(
        run_error(&mut con, "RATELIMIT.CHECK k POLICY p FOO 1"),
        "ERR unknown option 'FOO': expected COST or AT"
    );
    assert_eq!(dbsize(&mut con), 0);
    assert!(!exists(&mut con, "k"));
    // The same call without BURST works; a spec's options are case-insensitive.
    let reply = send_one(
        &mut con,
        &common::cmd_line("RATELIMIT.CHECK k policy p cost 2"),
    );
    assert_eq!(common::reply6(&reply)[..3], [1, 5, 3]);
}
