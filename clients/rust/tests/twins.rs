//! Twin keys: every method of the limiter on one key, the raw command on another, at the same
//! `AT` times: the same fields, through the module and the Functions library, RESP2 and RESP3.

mod common;

use common::twin::*;
use common::*;
use redis_ratelimit_client::{
    Algorithm, Call, EngineChoice, Limit, Options, Policy, RateLimiter, Source,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_module_answers_as_the_raw_commands_resp2_and_resp3() {
    let Some(server) = module_server() else {
        return;
    };
    for (resp3, seed) in [(false, 1), (true, 2)] {
        let limiter = RateLimiter::new(manager(&server, resp3).await, Options::default()).unwrap();
        let mut raw_conn = multiplexed(&server, resp3).await;
        run_twins(
            &limiter,
            &mut raw_conn,
            false,
            if resp3 { "m3" } else { "m2" },
            seed,
            600,
        )
        .await;
        leases_and_errors(&limiter, &mut raw_conn, false).await;
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut raw_conn)
            .await
            .unwrap();
    }
    // Policies: set, get, list, delete, and a call through one equal to the inline call.
    let limiter = RateLimiter::new(manager(&server, false).await, Options::default()).unwrap();
    let mut raw_conn = multiplexed(&server, false).await;
    let limit = Limit::new(Algorithm::TokenBucket, 5, "1s")
        .unwrap()
        .burst(7)
        .unwrap();
    limiter.policies().set("api", &limit, false).await.unwrap();
    let got = limiter.policies().get("api").await.unwrap().unwrap();
    assert_eq!(got["algorithm"], "token-bucket");
    assert_eq!(got["burst"], "7");
    assert_eq!(
        limiter.policies().list().await.unwrap(),
        vec!["api".to_string()]
    );
    let policy = Policy::new("api").unwrap();
    let at = base_ms();
    for step in 0..10 {
        let d = limiter
            .check("pa", &policy, Call::cost(1).at(at + step * 50))
            .await
            .unwrap();
        let mut args = words("POLICY api COST 1 AT");
        args.push((at + step * 50).to_string());
        let r = raw(&mut raw_conn, &raw_words(false, "CHECK", &["pb"], &args))
            .await
            .unwrap();
        assert_eq!(fields(&d, false), six(&r, false), "step {step}");
        assert_eq!(
            d.period_ms, 1000,
            "the definition's period, for the headers"
        );
    }
    assert!(limiter.policies().delete("api").await.unwrap());
    assert_eq!(limiter.policies().get("api").await.unwrap(), None);
    // A policy the server lacks: its fallback, else the server's error.
    let fallback = Policy::new("api").unwrap().fallback(limit.clone());
    assert!(limiter.check("pf", &fallback, 1).await.unwrap().allowed);
    let error = limiter
        .check("pf2", &Policy::new("nope").unwrap(), 1)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("no such policy"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_answers_as_its_functions_resp2_and_resp3() {
    let server = Server::start_without_module();
    for (resp3, seed) in [(false, 3), (true, 4)] {
        let limiter = RateLimiter::new(manager(&server, resp3).await, Options::default()).unwrap();
        let mut raw_conn = multiplexed(&server, resp3).await;
        // The first call finds no module and loads the library.
        let limit = Limit::new(Algorithm::FixedWindow, 3, "1s").unwrap();
        let d = limiter.check("first", &limit, 1).await.unwrap();
        assert_eq!(d.source, Source::Library);
        run_twins(
            &limiter,
            &mut raw_conn,
            true,
            if resp3 { "l3" } else { "l2" },
            seed,
            400,
        )
        .await;
        leases_and_errors(&limiter, &mut raw_conn, true).await;
        // Flushed meanwhile: loaded again, once.
        let _: () = redis::cmd("FUNCTION")
            .arg("FLUSH")
            .query_async(&mut raw_conn)
            .await
            .unwrap();
        assert_eq!(
            limiter.check("again", &limit, 1).await.unwrap().source,
            Source::Library
        );
        let error = limiter
            .check("p", &Policy::new("api").unwrap(), 1)
            .await
            .unwrap_err();
        assert!(error.to_string().contains("no such policy"), "{error}");
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut raw_conn)
            .await
            .unwrap();
    }
    // engine = Library on a server that has the module is the library too: not tested here
    // (one server per engine); engine = Module on this server is the server's error.
    let options = Options {
        engine: EngineChoice::Module,
        ..Options::default()
    };
    let limiter = RateLimiter::new(manager(&server, false).await, options).unwrap();
    let limit = Limit::new(Algorithm::FixedWindow, 3, "1s").unwrap();
    let error = limiter.check("m", &limit, 1).await.unwrap_err();
    assert!(
        error.to_string().to_lowercase().contains("unknown command"),
        "{error}"
    );
}
