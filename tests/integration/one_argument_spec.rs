//! A limit spec given as one argument (`"sliding-window 100 1m"`) is exactly its words given
//! separately: the same replies, stored values and expiries, and the same writes propagated (the
//! AOF, which the replication stream feeds, byte for byte); a malformed one is refused with an
//! error that says what is wrong, and changes nothing.

use std::fs;

use redis::{Cmd, Connection, Value};

use crate::common::{dbsize, error_text, send, show_cmd, show_value, Server};

/// The specs: every algorithm, with BURST and BLOCK, names in any case, and a policy.
const SPECS: [&str; 12] = [
    "token-bucket 10 1s",
    "token-bucket 10 1s BURST 20 BLOCK 1m",
    "leaky-bucket 5 1s BURST 3",
    "fixed-window 3 1s",
    "fixed-window 3 1s BLOCK 2s",
    "sliding-window 100 1m",
    "sliding-window 4 1s block 500ms",
    "sliding-log 4 1s",
    "gcra 10 1s BURST 5",
    "GCRA 10 1S burst 5",
    "POLICY api",
    "policy api",
];

/// A command from its name and arguments, each given whole (spaces and all).
fn cmd(name: &str, args: &[&str]) -> Cmd {
    let mut cmd = redis::cmd(name);
    for arg in args {
        cmd.arg(*arg);
    }
    cmd
}

/// A spec as arguments: its words, or itself as one argument.
fn spec_args(spec: &str, one: bool) -> Vec<&str> {
    if one {
        vec![spec]
    } else {
        spec.split(' ').collect()
    }
}

/// Every command that takes a spec, on `spec` given as words or as one argument, at times from
/// `base` on; CHECKALL mixes it with a spec of the other form. PEXPIRETIME and INFO after each.
fn sequence(spec: &str, one: bool, base: u64) -> Vec<Cmd> {
    let spec_words = spec_args(spec, one);
    let other = spec_args("fixed-window 5 1s", !one);
    let mut cmds = vec![cmd(
        "RATELIMIT.POLICY",
        &["SET", "api", "token-bucket", "4", "1s"],
    )];
    for step in 0..10u64 {
        let at = (base + step * 97).to_string();
        let cost = (step % 3).to_string();
        let with = |name: &str, key: &str, before: &[&str], after: &[&str]| {
            let args: Vec<&str> = before
                .iter()
                .chain([key].iter())
                .chain(spec_words.iter())
                .chain(after.iter())
                .copied()
                .collect();
            cmd(name, &args)
        };
        cmds.push(with(
            "RATELIMIT.CHECK",
            "k",
            &[],
            &["COST", &cost, "AT", &at],
        ));
        cmds.push(with("RATELIMIT.PEEK", "k", &[], &["AT", &at]));
        cmds.push(with("RATELIMIT.TAKE", "k", &[], &["MAX", "2", "AT", &at]));
        cmds.push(with(
            "RATELIMIT.REFUND",
            "k",
            &[],
            &["COST", "1", "AT", &at],
        ));
        let mut checkall = vec!["2", "k", "other"];
        checkall.extend(&spec_words);
        checkall.extend(&other);
        checkall.extend(["COST", &cost, "AT", &at]);
        cmds.push(cmd("RATELIMIT.CHECKALL", &checkall));
        // The other spec first, then this one.
        let mut reversed = vec!["2", "other", "k"];
        reversed.extend(&other);
        reversed.extend(&spec_words);
        reversed.extend(["AT", &at]);
        cmds.push(cmd("RATELIMIT.CHECKALL", &reversed));
        for key in ["k", "other"] {
            cmds.push(cmd("PEXPIRETIME", &[key]));
            cmds.push(cmd("RATELIMIT.INFO", &[key]));
        }
    }
    cmds
}

/// The AOF's one incremental file (Redis 7's multi-part AOF): what the server propagated.
fn aof_incr(server: &Server) -> Vec<u8> {
    let dir = server.dir().join("appendonlydir");
    let path = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .find(|path| path.to_string_lossy().contains(".incr."))
        .expect("an incremental AOF file");
    fs::read(path).expect("read the AOF")
}

fn aof_server() -> Server {
    Server::builder()
        .config(&[("appendonly", "yes"), ("appendfsync", "always")])
        .start()
}

#[test]
fn a_one_argument_spec_answers_stores_and_propagates_as_its_words() {
    let base = crate::common::future_base_ms();
    let (words_server, one_server) = (aof_server(), aof_server());
    let (mut words_con, mut one_con) = (words_server.client(), one_server.client());
    for spec in SPECS {
        for con in [&mut words_con, &mut one_con] {
            redis::cmd("FLUSHALL").query::<()>(con).expect("FLUSHALL");
        }
        let as_words = sequence(spec, false, base);
        let as_one = sequence(spec, true, base);
        let replies = send(&mut words_con, &as_words);
        assert!(
            replies.iter().all(|reply| error_text(reply).is_none()),
            "{spec}: {:?}",
            replies.iter().map(show_value).collect::<Vec<_>>()
        );
        for ((words_cmd, one_cmd), (words_reply, one_reply)) in as_words
            .iter()
            .zip(&as_one)
            .zip(replies.iter().zip(send(&mut one_con, &as_one)))
        {
            assert_eq!(
                show_value(words_reply),
                show_value(&one_reply),
                "`{}` and `{}`",
                show_cmd(words_cmd),
                show_cmd(one_cmd)
            );
        }
    }
    // What was written and replicated: the same commands, the same payloads.
    let (words_aof, one_aof) = (aof_incr(&words_server), aof_incr(&one_server));
    assert!(words_aof.windows(3).any(|w| w == b"rla"), "rla in the AOF");
    assert!(words_aof == one_aof, "the AOFs differ");
}

/// `(arguments after the command name, the error)`, each argument whole.
const MALFORMED: [(&str, &[&str], &str); 14] = [
    (
        "RATELIMIT.CHECK",
        &["k", " fixed-window 10 1s"],
        "ERR limit spec ' fixed-window 10 1s' has an empty word: separate its words by single \
         spaces",
    ),
    (
        "RATELIMIT.CHECK",
        &["k", "fixed-window 10 1s "],
        "ERR limit spec 'fixed-window 10 1s ' has an empty word: separate its words by single \
         spaces",
    ),
    (
        "RATELIMIT.PEEK",
        &["k", "fixed-window  10 1s"],
        "ERR limit spec 'fixed-window  10 1s' has an empty word: separate its words by single \
         spaces",
    ),
    (
        "RATELIMIT.CHECK",
        &["k", "fixed-window\t10 1s"],
        "ERR limit spec 'fixed-window?10 1s' has a tab or a newline: separate its words by \
         single spaces",
    ),
    (
        "RATELIMIT.CHECK",
        &["k", "fixed-window 10 1s\n"],
        "ERR limit spec 'fixed-window 10 1s?' has a tab or a newline: separate its words by \
         single spaces",
    ),
    (
        "RATELIMIT.CHECK",
        &["k", "fixed-window 10 1s cost 2"],
        "ERR COST goes after the limit spec 'fixed-window 10 1s cost 2' as arguments of its \
         own, not inside it",
    ),
    (
        "RATELIMIT.REFUND",
        &["k", "POLICY api COST 1"],
        "ERR COST goes after the limit spec 'POLICY api COST 1' as arguments of its own, not \
         inside it",
    ),
    (
        "RATELIMIT.TAKE",
        &["k", "gcra 10 1s MAX 3"],
        "ERR MAX goes after the limit spec 'gcra 10 1s MAX 3' as arguments of its own, not \
         inside it",
    ),
    (
        "RATELIMIT.CHECK",
        &["k", "fixed-window 10 1s AT 5"],
        "ERR AT goes after the limit spec 'fixed-window 10 1s AT 5' as arguments of its own, \
         not inside it",
    ),
    (
        "RATELIMIT.CHECK",
        &["k", "fixed-window 10", "1s"],
        "ERR limit spec 'fixed-window 10' is incomplete: one argument holds a whole spec, \
         algorithm limit period [BURST capacity] [BLOCK duration] or POLICY name",
    ),
    (
        "RATELIMIT.CHECK",
        &["k", "token-bucket 10 1s BURST 5 BLOCK", "1s"],
        "ERR limit spec 'token-bucket 10 1s BURST 5 BLOCK' is incomplete: one argument holds a \
         whole spec, algorithm limit period [BURST capacity] [BLOCK duration] or POLICY name",
    ),
    (
        "RATELIMIT.CHECKALL",
        &[
            "2",
            "a",
            "b",
            "fixed-window 2 1s",
            "token-bucket 10 1s BURST",
            "5",
        ],
        "ERR limit spec 2 (key 'b'): limit spec 'token-bucket 10 1s BURST' is incomplete: one \
         argument holds a whole spec, algorithm limit period [BURST capacity] [BLOCK duration] \
         or POLICY name",
    ),
    (
        "RATELIMIT.CHECKALL",
        &["1", "a", "fixed-window 2 1s", "fixed-window 2  1s"],
        "ERR limit spec 'fixed-window 2  1s' has an empty word: separate its words by single \
         spaces",
    ),
    // The words' own errors, as the words give them.
    (
        "RATELIMIT.CHECKALL",
        &[
            "2",
            "a",
            "b",
            "fixed-window 10 1s BURST 5",
            "token-bucket 100 1h",
        ],
        "ERR limit spec 1 (key 'a'): BURST applies only to token-bucket, leaky-bucket and gcra",
    ),
];

/// Calls the grammar refuses for what is missing after the spec: the same text both ways.
const MISSING: [(&str, &str, &str); 2] = [
    (
        "RATELIMIT.REFUND",
        "fixed-window 10 1s",
        "ERR RATELIMIT.REFUND needs COST: how much to give back",
    ),
    (
        "RATELIMIT.TAKE",
        "fixed-window 10 1s",
        "ERR RATELIMIT.TAKE needs MAX: the most units to take",
    ),
];

/// Specs the grammar refuses: one argument gets the error its words get.
const REFUSED_WORDS: [&str; 10] = [
    "leaky-window 10 1s",
    "fixed-window 0 1s",
    "fixed-window 10 1w",
    "fixed-window 10 1s BURST 5",
    "token-bucket 10 1s BURST 2 BURST 3",
    "token-bucket 10 1s BLOCK x",
    "sliding-window 100 1 minute",
    "concurrency 10 1s",
    "POLICY nope",
    "POLICY api BURST 5",
];

/// The errors of `cmds`, which must all be refused, with DBSIZE and DEBUG DIGEST unchanged.
fn refused(con: &mut Connection, cmds: &[Cmd]) -> Vec<String> {
    let digest = |con: &mut Connection| {
        let replies = send(con, &[cmd("DBSIZE", &[]), cmd("DEBUG", &["DIGEST"])]);
        (show_value(&replies[0]), show_value(&replies[1]))
    };
    let before = digest(con);
    let errors = send(con, cmds)
        .iter()
        .zip(cmds)
        .map(|(reply, cmd)| {
            error_text(reply).unwrap_or_else(|| panic!("`{}`: {reply:?}", show_cmd(cmd)))
        })
        .collect();
    assert_eq!(digest(con), before, "nothing changes");
    errors
}

#[test]
fn a_malformed_one_argument_spec_is_refused_and_changes_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let _: Value = cmd("RATELIMIT.POLICY", &["SET", "api", "gcra", "10", "1s"])
        .query(&mut con)
        .expect("POLICY SET");
    let _: Value = cmd("RATELIMIT.CHECK", &["kept", "fixed-window", "5", "1m"])
        .query(&mut con)
        .expect("CHECK");
    assert_eq!(dbsize(&mut con), 1);
    let cmds: Vec<Cmd> = MALFORMED
        .iter()
        .map(|(name, args, _)| cmd(name, args))
        .collect();
    for ((name, args, expected), error) in MALFORMED.iter().zip(refused(&mut con, &cmds)) {
        assert_eq!(error, *expected, "{name} {args:?}");
    }
    for (name, spec, expected) in MISSING {
        let [words, one] = [false, true].map(|one| {
            let mut args = vec!["k"];
            args.extend(spec_args(spec, one));
            cmd(name, &args)
        });
        assert_eq!(
            refused(&mut con, &[words, one]),
            [expected, expected],
            "{name}"
        );
    }
    for spec in REFUSED_WORDS {
        for name in [
            "RATELIMIT.CHECK",
            "RATELIMIT.PEEK",
            "RATELIMIT.TAKE",
            "RATELIMIT.REFUND",
        ] {
            let after: &[&str] = match name {
                "RATELIMIT.TAKE" => &["MAX", "2"],
                "RATELIMIT.REFUND" => &["COST", "1"],
                _ => &[],
            };
            let [words, one] = [false, true].map(|one| {
                let mut args = vec!["k"];
                args.extend(spec_args(spec, one));
                args.extend(after);
                cmd(name, &args)
            });
            let errors = refused(&mut con, &[words, one]);
            assert_eq!(errors[0], errors[1], "{name} k {spec}");
        }
        let [words, one] = [false, true].map(|one| {
            let mut args = vec!["2", "a", "b"];
            args.extend(spec_args(spec, one));
            args.extend(spec_args("fixed-window 1 1s", false));
            cmd("RATELIMIT.CHECKALL", &args)
        });
        let errors = refused(&mut con, &[words, one]);
        assert_eq!(errors[0], errors[1], "CHECKALL 2 a b {spec} ...");
    }
}

/// Clients tell a module that takes one-argument specs by CHECK's arity: -3.
#[test]
fn check_and_peek_take_a_key_and_a_spec_of_one_argument() {
    let server = Server::start();
    let mut con = server.client();
    for (command, arity) in [
        ("ratelimit.check", -3),
        ("ratelimit.peek", -3),
        ("ratelimit.take", -3),
        ("ratelimit.refund", -3),
        ("ratelimit.checkall", -2),
    ] {
        let info: Value = cmd("COMMAND", &["INFO", command])
            .query(&mut con)
            .expect("COMMAND INFO");
        let text = show_value(&info);
        let Value::Array(entries) = info else {
            panic!("{command}: {text}")
        };
        let Some(Value::Array(entry)) = entries.first() else {
            panic!("{command}: {text}")
        };
        assert_eq!(entry.get(1), Some(&Value::Int(arity)), "{command}: {text}");
    }
    // COMMAND DOCS names the one-argument form among a call's limits.
    let docs = show_value(
        &cmd("COMMAND", &["DOCS", "ratelimit.check"])
            .query::<Value>(&mut con)
            .expect("COMMAND DOCS"),
    );
    assert!(docs.contains("one-argument-spec"), "{docs}");
}
