//! A module that takes a limit spec as one argument (`COMMAND INFO RATELIMIT.CHECK`: arity -3) is
//! sent each spec so; a client that cannot ask (here a user without `COMMAND`) sends the words.
//! Both answer alike, on twin keys at the same `AT` times; the slow log shows what was sent.

mod common;

use common::*;
use redis::Value;
use redis_ratelimit_client::{Algorithm, Call, Decision, Limit, Options, Policy, RateLimiter};

/// The fields a decision answers (not where it came from).
fn fields(d: &Decision) -> (bool, u64, u64, i64, u64, u64, u64) {
    (
        d.allowed,
        d.limit,
        d.remaining,
        d.retry_after_ms,
        d.reset_after_ms,
        d.delay_ms,
        d.granted,
    )
}

/// Every call on `prefix`'s keys: CHECK, PEEK, TAKE, REFUND of each limit and of a policy, and
/// a CHECKALL of all the limits.
async fn calls(limiter: &RateLimiter, prefix: &str, at: u64) -> Vec<String> {
    let limits = [
        Limit::new(Algorithm::TokenBucket, 10, "1s")
            .unwrap()
            .burst(20)
            .unwrap()
            .block("1m")
            .unwrap(),
        Limit::new(Algorithm::FixedWindow, 3, "1s").unwrap(),
        Limit::new(Algorithm::SlidingWindow, 5, "1m").unwrap(),
        Limit::new(Algorithm::Gcra, 10, "1s")
            .unwrap()
            .burst(4)
            .unwrap(),
    ];
    let policy = Policy::new("api").unwrap();
    let mut out = Vec::new();
    for step in 0..6u64 {
        let call = || Call::cost(1 + step % 2).at(at + step * 100);
        for (i, limit) in limits.iter().enumerate() {
            let key = format!("{prefix}:{i}");
            for d in [
                limiter.check(&key, limit, call()).await.unwrap(),
                limiter.peek(&key, limit, call()).await.unwrap(),
                limiter.take(&key, limit, call()).await.unwrap(),
                limiter.refund(&key, limit, call()).await.unwrap(),
            ] {
                out.push(format!("{key} {:?}", fields(&d)));
            }
        }
        let key = format!("{prefix}:policy");
        let d = limiter.check(&key, &policy, call()).await.unwrap();
        out.push(format!("{key} {:?}", fields(&d)));
        let pairs: Vec<(String, Limit)> = limits
            .iter()
            .enumerate()
            .map(|(i, limit)| (format!("{prefix}:all{i}"), limit.clone()))
            .collect();
        let multi = limiter.check_all(&pairs, call()).await.unwrap();
        out.push(format!(
            "all {:?} {:?}",
            fields(&multi.overall),
            multi.limits.iter().map(fields).collect::<Vec<_>>()
        ));
    }
    out
}

/// The slow log's entries of `command` on keys starting with `prefix`: their arguments.
async fn logged(
    conn: &mut redis::aio::MultiplexedConnection,
    command: &str,
    prefix: &str,
) -> Vec<Vec<String>> {
    let entries = raw(conn, &words("SLOWLOG GET 100000")).await.unwrap();
    let Value::Array(entries) = entries else {
        panic!("SLOWLOG GET: {entries:?}")
    };
    let text = |v: &Value| match v {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => format!("{other:?}"),
    };
    entries
        .iter()
        .filter_map(|entry| match entry {
            Value::Array(fields) => match fields.get(3) {
                Some(Value::Array(args)) => Some(args.iter().map(text).collect::<Vec<_>>()),
                _ => None,
            },
            _ => None,
        })
        .filter(|args| {
            args[0].eq_ignore_ascii_case(command) && args.iter().any(|arg| arg.starts_with(prefix))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn specs_go_as_one_argument_where_the_module_takes_them_and_answer_as_words() {
    let Some(server) = module_server() else {
        return;
    };
    let mut conn = multiplexed(&server, false).await;
    for line in [
        "RATELIMIT.POLICY SET api gcra 5 1s",
        "CONFIG SET slowlog-log-slower-than 0",
        "CONFIG SET slowlog-max-len 100000",
        // A user that cannot ask COMMAND INFO: its limiter keeps to the words.
        "ACL SETUSER words on nopass ~* &* +@all -command",
    ] {
        raw(&mut conn, &words(line)).await.unwrap();
    }
    let one = RateLimiter::new(manager(&server, false).await, Options::default()).unwrap();
    let words_url = format!("redis://words:x@127.0.0.1:{}/", server.port());
    let words_manager = redis::Client::open(words_url)
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let by_words = RateLimiter::new(words_manager, Options::default()).unwrap();
    let at = base_ms();
    let one_answers = calls(&one, "one", at).await;
    let words_answers = calls(&by_words, "words", at).await;
    let strip = |lines: Vec<String>, prefix: &str| -> Vec<String> {
        lines
            .into_iter()
            .map(|l| l.replace(prefix, "key"))
            .collect()
    };
    assert_eq!(strip(one_answers, "one"), strip(words_answers, "words"));

    // What was sent: a spec as one argument, or its words (the first call, which finds the
    // engine, goes as words either way).
    for (prefix, one_argument) in [("one", true), ("words", false)] {
        for command in [
            "RATELIMIT.CHECK",
            "RATELIMIT.PEEK",
            "RATELIMIT.TAKE",
            "RATELIMIT.REFUND",
            "RATELIMIT.CHECKALL",
        ] {
            let sent = logged(&mut conn, command, prefix).await;
            assert!(sent.len() >= 5, "{command} {prefix}: {sent:?}");
            let spaced = sent
                .iter()
                .filter(|args| args.iter().skip(1).any(|arg| arg.contains(' ')))
                .count();
            if one_argument {
                assert!(spaced >= sent.len() - 1, "{command} {prefix}: {sent:?}");
            } else {
                assert_eq!(spaced, 0, "{command} {prefix}: {sent:?}");
            }
        }
    }
    let policy_calls = logged(&mut conn, "RATELIMIT.CHECK", "one:policy").await;
    assert!(
        policy_calls
            .iter()
            .any(|args| args.iter().any(|a| a == "POLICY api")),
        "{policy_calls:?}"
    );
}
