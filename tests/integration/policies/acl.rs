//! ACL: defining and removing policies is for operators. Where the server lets modules set
//! command categories (RedisModule_SetCommandACLCategories, Redis 7.2+ and Valkey), POLICY SET
//! and DEL are `@admin @dangerous @slow`, GET `@read @fast`, LIST `@read @slow`; all four are
//! `@ratelimit` where modules can add categories (Redis 7.4+, Valkey 8), so that
//! `+@ratelimit -@admin` checks through policies but cannot define them. Everywhere, the
//! subcommands are granted and refused by name (`+ratelimit.policy|get`).

use super::{define, list};
use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use common::model::Spec;
use common::Server;
use redis::{Connection, Value};
use redis_ratelimit_core::algorithms::Algorithm;

/// `INFO ratelimit`'s server and optional APIs.
fn server_and_apis(server: &Server) -> (String, Vec<String>) {
    let info = server.info("ratelimit");
    let apis = info["ratelimit_apis"]
        .split(',')
        .map(str::to_string)
        .collect();
    (info["ratelimit_server"].clone(), apis)
}

fn login(server: &Server, user: &str, rules: &[&str]) -> Connection {
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(user)
        .arg(&["reset", "on", ">secret"])
        .arg(rules)
        .query(&mut server.client())
        .unwrap_or_else(|e| panic!("ACL SETUSER {user}: {e}"));
    let mut con = server.client();
    let _: () = redis::cmd("AUTH")
        .arg(user)
        .arg("secret")
        .query(&mut con)
        .unwrap();
    con
}

/// Whether ACL lets `line` through (any reply but NOPERM).
fn permitted(con: &mut Connection, line: &str) -> bool {
    match common::run(con, line) {
        Value::ServerError(error) => {
            let text = format!("{} {}", error.code(), error.details().unwrap_or_default());
            assert!(!text.contains("unknown"), "{line}: {text}");
            error.code() != "NOPERM"
        }
        _ => true,
    }
}

const SET: &str = "RATELIMIT.POLICY SET made token-bucket 5 1m";
const DEL: &str = "RATELIMIT.POLICY DEL p";
const GET: &str = "RATELIMIT.POLICY GET p";
const LIST: &str = "RATELIMIT.POLICY LIST";
const CHECK: &str = "RATELIMIT.CHECK k POLICY p";
const PEEK: &str = "RATELIMIT.PEEK k POLICY p";
const CHECKALL: &str = "RATELIMIT.CHECKALL 1 k POLICY p";

/// Asserts which of [SET, DEL, GET, LIST, CHECK, PEEK, CHECKALL] `rules` permit.
fn assert_permits(server: &Server, release: &str, rules: &[&str], expected: [bool; 7]) {
    let user = format!(
        "u{}",
        rules
            .join("")
            .replace(['@', '|', '+', '-', '.', '~', '*'], "")
    );
    let mut con = login(server, &user, rules);
    let lines = [SET, DEL, GET, LIST, CHECK, PEEK, CHECKALL];
    let got = lines.map(|line| permitted(&mut con, line));
    assert_eq!(got, expected, "{release}: {rules:?} over {lines:?}");
    // Put back what a permitted SET or DEL changed.
    let mut admin = server.client();
    define(
        &mut admin,
        "p",
        &Spec::new(Algorithm::FixedWindow, 100, 60_000),
        false,
    );
    let _ = common::run(&mut admin, "RATELIMIT.POLICY DEL made");
}

/// Each `RATELIMIT.POLICY` subcommand's ACL categories, as `COMMAND INFO` shows them (`ACL CAT`
/// does not list module subcommands on every server).
fn categories(server: &Server) -> BTreeMap<String, BTreeSet<String>> {
    let info: Vec<Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("ratelimit.policy")
        .query(&mut server.client())
        .expect("COMMAND INFO");
    let Some(Value::Array(container)) = info.first() else {
        panic!("COMMAND INFO ratelimit.policy: {info:?}");
    };
    let Some(Value::Array(subcommands)) = container.get(9) else {
        panic!("no subcommands in {container:?}");
    };
    subcommands
        .iter()
        .map(|sub| {
            let Value::Array(fields) = sub else {
                panic!("subcommand {sub:?}");
            };
            let name = common::show_value(&fields[0]);
            let Value::Array(cats) = &fields[6] else {
                panic!("{name}: categories {:?}", fields[6]);
            };
            (name, cats.iter().map(common::show_value).collect())
        })
        .collect()
}

/// The categories `names` (without `@`), plus `@ratelimit` where the server has it.
fn expected_categories(names: &[&str], ratelimit: bool) -> BTreeSet<String> {
    let mut set: BTreeSet<String> = names.iter().map(|name| format!("@{name}")).collect();
    if ratelimit {
        set.insert("@ratelimit".to_string());
    }
    set
}

#[test]
fn set_and_del_are_admin_get_and_list_read_where_modules_set_categories() {
    let server = Server::start();
    let (release, apis) = server_and_apis(&server);
    if !apis.iter().any(|api| api == "SetCommandACLCategories") {
        common::skip(&format!(
            "{release}: no RedisModule_SetCommandACLCategories (Redis 7.2+): module commands \
             are in no category; POLICY SET/DEL are refused by name only"
        ));
        return;
    }
    define(
        &mut server.client(),
        "p",
        &Spec::new(Algorithm::FixedWindow, 100, 60_000),
        false,
    );
    let ratelimit = apis.iter().any(|api| api == "AddACLCategory");
    let expected: BTreeMap<String, BTreeSet<String>> = [
        (
            "set",
            expected_categories(&["admin", "dangerous", "slow"], ratelimit),
        ),
        (
            "del",
            expected_categories(&["admin", "dangerous", "slow"], ratelimit),
        ),
        ("get", expected_categories(&["read", "fast"], ratelimit)),
        ("list", expected_categories(&["read", "slow"], ratelimit)),
    ]
    .into_iter()
    .map(|(sub, set)| (format!("ratelimit.policy|{sub}"), set))
    .collect();
    assert_eq!(categories(&server), expected, "{release}");
    // What users with these categories can do.
    let all = [true; 7];
    assert_permits(
        &server,
        &release,
        &["~*", "+@all", "-@admin"],
        [false, false, true, true, true, true, true],
    );
    assert_permits(
        &server,
        &release,
        &["~*", "+@all", "-@dangerous"],
        [false, false, true, true, true, true, true],
    );
    assert_permits(
        &server,
        &release,
        &["~*", "+@read"],
        [false, false, true, true, false, true, false],
    );
    assert_permits(&server, &release, &["~*", "+@all"], all);
}

#[test]
fn ratelimit_without_admin_checks_through_policies_but_cannot_define_them() {
    let server = Server::start();
    let (release, apis) = server_and_apis(&server);
    if !apis.iter().any(|api| api == "AddACLCategory") {
        common::skip(&format!(
            "{release}: no RedisModule_AddACLCategory (Redis 7.4+, Valkey 8): no @ratelimit"
        ));
        return;
    }
    define(
        &mut server.client(),
        "p",
        &Spec::new(Algorithm::FixedWindow, 100, 60_000),
        false,
    );
    for (name, set) in categories(&server) {
        assert!(
            set.contains("@ratelimit"),
            "{release}: {name} is in {set:?}"
        );
    }
    assert_permits(
        &server,
        &release,
        &["~*", "+@ratelimit", "-@admin"],
        [false, false, true, true, true, true, true],
    );
    assert_permits(&server, &release, &["~*", "+@ratelimit"], [true; 7]);
    // Nothing a refused user tried was defined or removed.
    assert_eq!(list(&mut server.client()), ["p"]);
}

#[test]
fn policy_subcommands_are_granted_and_refused_by_name() {
    let server = Server::start();
    let (release, _) = server_and_apis(&server);
    define(
        &mut server.client(),
        "p",
        &Spec::new(Algorithm::FixedWindow, 100, 60_000),
        false,
    );
    // Only GET (and CHECK by name).
    assert_permits(
        &server,
        &release,
        &["~*", "+ratelimit.policy|get", "+ratelimit.check"],
        [false, false, true, false, true, false, false],
    );
    // Everything but defining and removing.
    assert_permits(
        &server,
        &release,
        &[
            "~*",
            "+@all",
            "-ratelimit.policy|set",
            "-ratelimit.policy|del",
        ],
        [false, false, true, true, true, true, true],
    );
    // The whole container by its name.
    assert_permits(
        &server,
        &release,
        &["~*", "+ratelimit.policy"],
        [true, true, true, true, false, false, false],
    );
    assert_eq!(list(&mut server.client()), ["p"]);
}
