//! What differs between the servers the module runs on (Redis 7.0 to 8.0, Valkey 8): the optional
//! module APIs it finds, and what they give users (ACL categories). A test that needs an API the
//! server lacks says so (`skipped: <server>: ...`) and passes: `make test-matrix` counts those.

use crate::common;

use common::Server;
use redis::{Connection, Value};

/// `INFO ratelimit`'s `server` and `apis` fields.
fn server_and_apis(server: &Server) -> (String, Vec<String>) {
    let info = server.info("ratelimit");
    let apis = info["ratelimit_apis"]
        .split(',')
        .filter(|api| !api.is_empty())
        .map(str::to_string)
        .collect();
    (info["ratelimit_server"].clone(), apis)
}

fn skipped(release: &str, what: &str) {
    common::skip(&format!("{release}: {what}"));
}

/// Runs `args` as `user` and answers whether ACL let it through (any reply but NOPERM).
fn permitted(con: &mut Connection, args: &[&str]) -> bool {
    match redis::cmd(args[0]).arg(&args[1..]).query::<Value>(con) {
        Ok(_) => true,
        Err(error) => {
            let text = error.to_string();
            assert!(
                !text.contains("unknown command"),
                "{args:?}: {text}: not registered"
            );
            !text.contains("NOPERM")
        }
    }
}

fn login(server: &Server, user: &str, rules: &[&str]) -> Connection {
    let mut admin = server.client();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(user)
        .arg(&["reset", "on", ">secret"])
        .arg(rules)
        .query(&mut admin)
        .unwrap_or_else(|e| panic!("ACL SETUSER {user}: {e}"));
    let mut con = server.client();
    let _: () = redis::cmd("AUTH")
        .arg(user)
        .arg("secret")
        .query(&mut con)
        .unwrap();
    con
}

/// One call of every command of the module.
const EVERY_COMMAND: [&[&str]; 6] = [
    &["RATELIMIT.CHECK", "k", "token-bucket", "5", "1m"],
    &["RATELIMIT.PEEK", "k", "token-bucket", "5", "1m"],
    &["RATELIMIT.CHECKALL", "1", "k", "token-bucket", "5", "1m"],
    &["RATELIMIT.INFO", "k"],
    &["RATELIMIT.RESET", "missing"],
    // A payload it refuses: what matters is that ACL let the call reach the module.
    &["RATELIMIT.APPLY", "k", "not-a-payload"],
];

/// RATELIMIT.APPLY under the short name replication and the AOF use.
const APPLY_SHORT: &[&str] = &["rla", "k", "not-a-payload"];

#[test]
fn info_names_the_server_and_its_optional_apis() {
    let server = Server::start();
    let (release, apis) = server_and_apis(&server);
    let info = server.info("server");
    let expected = match info.get("server_name").map(String::as_str) {
        Some("valkey") => format!("valkey {}", info["valkey_version"]),
        _ => format!("redis {}", info["redis_version"]),
    };
    assert_eq!(release, expected);
    // Every supported server (7.0+) has these.
    for api in ["SetCommandInfo", "KeyAtPosWithFlags"] {
        assert!(
            apis.iter().any(|a| a == api),
            "{release}: no {api} in {apis:?}"
        );
    }
    let log = server.log();
    assert!(
        log.contains(&format!("ratelimit: loaded on {release}")),
        "no load line naming the server\n{log}"
    );
}

#[test]
fn commands_are_in_the_builtin_acl_categories() {
    let server = Server::start();
    let (release, apis) = server_and_apis(&server);
    if !apis.iter().any(|api| api == "SetCommandACLCategories") {
        skipped(
            &release,
            "no RedisModule_SetCommandACLCategories (Redis 7.2+): commands are granted by name",
        );
        return;
    }
    let mut writer = login(&server, "writer", &["~*", "+@write"]);
    let mut reader = login(&server, "reader", &["~*", "+@read"]);
    for (i, args) in EVERY_COMMAND.iter().enumerate() {
        let read_only = matches!(i, 1 | 3);
        assert_eq!(
            permitted(&mut writer, args),
            !read_only,
            "{release}: +@write and {args:?}"
        );
        assert_eq!(
            permitted(&mut reader, args),
            read_only,
            "{release}: +@read and {args:?}"
        );
    }
    // APPLY writes any state it is given: it is @dangerous.
    let mut safe = login(&server, "safe", &["~*", "+@all", "-@dangerous"]);
    assert!(!permitted(&mut safe, EVERY_COMMAND[5]), "{release}");
    assert!(!permitted(&mut safe, APPLY_SHORT), "{release}");
    assert!(permitted(&mut safe, EVERY_COMMAND[0]), "{release}");
    assert!(permitted(&mut writer, APPLY_SHORT), "{release}");
    assert!(!permitted(&mut reader, APPLY_SHORT), "{release}");
}

#[test]
fn the_ratelimit_category_holds_every_command_and_nothing_else() {
    let server = Server::start();
    let (release, apis) = server_and_apis(&server);
    if !apis.iter().any(|api| api == "AddACLCategory") {
        skipped(
            &release,
            "no RedisModule_AddACLCategory (Redis 7.4+, Valkey 8): no @ratelimit category",
        );
        return;
    }
    let mut user = login(&server, "limiter", &["~*", "+@ratelimit"]);
    for args in EVERY_COMMAND {
        assert!(
            permitted(&mut user, args),
            "{release}: +@ratelimit and {args:?}"
        );
    }
    for args in [&["GET", "k"][..], &["SET", "k", "v"], &["DEL", "k"]] {
        assert!(
            !permitted(&mut user, args),
            "{release}: +@ratelimit and {args:?}"
        );
    }
    // Applications get the category without the replication command.
    let mut app = login(&server, "app", &["~*", "+@ratelimit", "-ratelimit.apply"]);
    assert!(permitted(&mut app, EVERY_COMMAND[0]), "{release}");
    assert!(!permitted(&mut app, EVERY_COMMAND[5]), "{release}");
    // The short name is not in the category: such an ACL keeps both names of APPLY away.
    assert!(!permitted(&mut user, APPLY_SHORT), "{release}");
    assert!(!permitted(&mut app, APPLY_SHORT), "{release}");
}
