//! A cluster mid-upgrade, or a failover to a replica with an older module: `COMMAND INFO` was
//! answered by an upgraded server (arity -3), then the calls land on a server with the module as
//! it was before a spec could be one argument (arity -4: `$RATELIMIT_OLD_MODULE`, built from
//! main before 9170e78; the test skips without it). The call it refuses is sent again as words,
//! words from then on, and each answers what a limiter sending words to that server answers.
//!
//! One test in this file: it starts its older server with `RATELIMIT_MODULE` set to the older
//! module, which no other test may see.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use redis::aio::MultiplexedConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use redis_ratelimit_client::{
    Algorithm, Call, Connection, Decision, Limit, Options, Policy, RateLimiter,
};

/// Two servers behind one connection: the upgraded one until `moved`, then the older one
/// (every call, `COMMAND INFO` included). Counts what reached the older one with a spec as one
/// argument (an argument holding a space).
#[derive(Clone)]
struct Upgrading {
    upgraded: MultiplexedConnection,
    older: MultiplexedConnection,
    moved: Arc<AtomicBool>,
    one_argument_to_older: Arc<AtomicUsize>,
}

fn spaced(cmd: &Cmd) -> bool {
    cmd.args_iter().any(|arg| match arg {
        redis::Arg::Simple(bytes) => bytes.contains(&b' '),
        redis::Arg::Cursor => false,
    })
}

impl Upgrading {
    /// The server a command goes to now.
    fn node(&mut self, spaced: bool) -> &mut MultiplexedConnection {
        if !self.moved.load(Ordering::SeqCst) {
            return &mut self.upgraded;
        }
        if spaced {
            self.one_argument_to_older.fetch_add(1, Ordering::SeqCst);
        }
        &mut self.older
    }
}

impl Connection for Upgrading {
    fn send<'a>(&'a mut self, cmd: &'a Cmd, key: Option<&'a str>) -> RedisFuture<'a, Value> {
        self.node(spaced(cmd)).send(cmd, key)
    }

    fn send_transaction<'a>(
        &'a mut self,
        pipe: &'a Pipeline,
        key: Option<&'a str>,
    ) -> RedisFuture<'a, Value> {
        let one = pipe.cmd_iter().any(spaced);
        self.node(one).send_transaction(pipe, key)
    }
}

fn fields(d: &Decision) -> (bool, u64, u64, i64, u64, u64, u64, bool) {
    (
        d.allowed,
        d.limit,
        d.remaining,
        d.retry_after_ms,
        d.reset_after_ms,
        d.delay_ms,
        d.granted,
        d.shadow_rejected,
    )
}

/// What a phase calls first once the calls land on the older server.
#[derive(Clone, Copy, Debug)]
enum First {
    /// A Limit's CHECK of cost 1: the key and the spec alone (the older arity refuses it).
    Check,
    /// A TAKE: the older module reads the spec as an algorithm.
    Take,
    /// A shadow policy's CHECK: its MULTI aborted (EXECABORT).
    Shadow,
    /// A CHECKALL of one key, then of two.
    CheckAll,
}

/// `first`, then every other call on `prefix`'s keys at `at` + steps: the fields answered.
async fn calls<C: Connection>(
    limiter: &RateLimiter<C>,
    prefix: &str,
    at: u64,
    first: First,
) -> Vec<String> {
    let limit = Limit::new(Algorithm::Gcra, 10, "1s")
        .unwrap()
        .burst(4)
        .unwrap();
    let window = Limit::new(Algorithm::SlidingWindow, 5, "1m").unwrap();
    let dark = Policy::new("dark").unwrap();
    let api = Policy::new("api").unwrap();
    let key = |name: &str| format!("{prefix}:{name}");
    let mut out = Vec::new();
    let mut push = |what: &str, d: &Decision| out.push(format!("{what} {:?}", fields(d)));
    for step in 0..4u64 {
        let call = |cost: u64| Call::cost(cost).at(at + step * 100);
        let order: Vec<First> = match (step, first) {
            (0, first) => vec![
                first,
                First::Check,
                First::Take,
                First::Shadow,
                First::CheckAll,
            ],
            _ => vec![First::Check, First::Take, First::Shadow, First::CheckAll],
        };
        for what in order {
            match what {
                First::Check => {
                    push(
                        "check",
                        &limiter.check(&key("l"), &limit, call(1)).await.unwrap(),
                    );
                    push(
                        "peek",
                        &limiter.peek(&key("l"), &limit, call(1)).await.unwrap(),
                    );
                    push(
                        "policy",
                        &limiter.check(&key("p"), &api, call(1)).await.unwrap(),
                    );
                }
                First::Take => {
                    push(
                        "take",
                        &limiter.take(&key("w"), &window, call(2)).await.unwrap(),
                    );
                    push(
                        "refund",
                        &limiter.refund(&key("w"), &window, call(1)).await.unwrap(),
                    );
                }
                First::Shadow => {
                    push(
                        "shadow",
                        &limiter.check(&key("d"), &dark, call(1)).await.unwrap(),
                    );
                }
                First::CheckAll => {
                    let one = [(key("a1"), limit.clone())];
                    let multi = limiter.check_all(&one, call(1)).await.unwrap();
                    push("all1", &multi.overall);
                    let two = [(key("b1"), dark.clone()), (key("b2"), api.clone())];
                    let multi = limiter.check_all(&two, call(1)).await.unwrap();
                    push("all2", &multi.overall);
                    for d in &multi.limits {
                        push("all2 each", d);
                    }
                }
            }
        }
    }
    out
}

/// A timeout no loaded machine reaches: every answer is the server's.
fn options() -> Options {
    Options {
        timeout: std::time::Duration::from_secs(10),
        ..Options::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_refused_as_one_argument_by_an_older_module_go_again_as_words() {
    let Some(old_module) = std::env::var_os("RATELIMIT_OLD_MODULE") else {
        skip("no older module (RATELIMIT_OLD_MODULE: main's module before 9170e78)");
        return;
    };
    let Some(upgraded) = module_server() else {
        return;
    };
    let new_module = std::env::var_os("RATELIMIT_MODULE");
    std::env::set_var("RATELIMIT_MODULE", &old_module);
    let older = Server::start();
    match new_module {
        Some(path) => std::env::set_var("RATELIMIT_MODULE", path),
        None => std::env::remove_var("RATELIMIT_MODULE"),
    }
    let mut plain = multiplexed(&older, false).await;
    let arity = raw(&mut plain, &words("COMMAND INFO RATELIMIT.CHECK"))
        .await
        .unwrap();
    assert!(
        format!("{arity:?}").contains("int(-4)"),
        "the older module: {arity:?}"
    );
    for server in [&upgraded, &older] {
        let mut conn = multiplexed(server, false).await;
        for line in [
            "RATELIMIT.POLICY SET api token-bucket 5 1s BURST 7",
            "RATELIMIT.POLICY SET dark fixed-window 2 1s SHADOW",
        ] {
            raw(&mut conn, &words(line)).await.unwrap();
        }
    }
    // What a limiter sending words to the older server answers (it asks, and hears -4).
    let by_words = RateLimiter::new(plain.clone(), options()).unwrap();
    let at = base_ms();
    for (phase, first) in [First::Check, First::Take, First::Shadow, First::CheckAll]
        .into_iter()
        .enumerate()
    {
        let conn = Upgrading {
            upgraded: multiplexed(&upgraded, false).await,
            older: plain.clone(),
            moved: Arc::new(AtomicBool::new(false)),
            one_argument_to_older: Arc::new(AtomicUsize::new(0)),
        };
        let limiter = RateLimiter::new(conn.clone(), options()).unwrap();
        // On the upgraded server: the module found, arity -3, a spec as one argument.
        let warm = Limit::new(Algorithm::FixedWindow, 100, "1s").unwrap();
        for _ in 0..2 {
            let d = limiter.check("warm", &warm, Call::cost(1)).await.unwrap();
            assert!(d.allowed);
        }
        conn.moved.store(true, Ordering::SeqCst);
        let at = at + phase as u64 * 10_000;
        let moved = calls(&limiter, &format!("one{phase}"), at, first).await;
        let expected = calls(&by_words, &format!("words{phase}"), at, first).await;
        assert_eq!(moved, expected, "{first:?}");
        assert_eq!(
            conn.one_argument_to_older.load(Ordering::SeqCst),
            1,
            "{first:?}: one call refused, then words"
        );
        let stats = limiter.stats();
        let n = |name: &str| stats.get(name).copied().unwrap_or(0);
        assert_eq!(n("error") + n("local") + n("fallback"), 0, "{stats:?}");
        assert!(n("module") > 0, "{stats:?}");
    }
}
