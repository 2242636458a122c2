//! A server-side policy in shadow mode: the module admits what it would refuse; the crate
//! reports `shadow_rejected` (what enforcement would have answered) from a PEEK of the policy's
//! definition sent with the CHECK, TAKE or CHECKALL in one MULTI, as the packages do. The
//! Functions library has no policies: there a Policy decides with its fallback Limit, never
//! a shadow.

mod common;

use std::time::Duration;

use common::*;
use redis_ratelimit_client::{
    Algorithm, Call, EngineChoice, Limit, LimitSpec, OnError, Options, Policy, RateLimiter, Source,
};

fn options(engine: EngineChoice) -> Options {
    Options {
        engine,
        // A loaded machine must not turn a slow reply into the fail-open answer.
        timeout: Duration::from_secs(5),
        on_error: OnError::Closed,
        ..Options::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_policy_reports_what_enforcement_would_refuse() {
    let Some(server) = module_server() else {
        return;
    };
    for resp3 in [false, true] {
        let limiter =
            RateLimiter::new(manager(&server, resp3).await, options(EngineChoice::Module)).unwrap();
        let two = Limit::new(Algorithm::FixedWindow, 2, "1m").unwrap();
        limiter
            .policies()
            .set("shadowed", &two, true)
            .await
            .unwrap();
        limiter
            .policies()
            .set("enforced", &two, false)
            .await
            .unwrap();
        let shadowed = Policy::new("shadowed").unwrap();
        let enforced = Policy::new("enforced").unwrap();
        let at = base_ms();
        let p = if resp3 { "r3" } else { "r2" };

        // check: the third request is admitted, and said to be one enforcement refuses.
        for n in 1..=4u64 {
            let call = Call::cost(1).at(at + n);
            let d = limiter
                .check(&format!("{p}:s"), &shadowed, call)
                .await
                .unwrap();
            let e = limiter
                .check(&format!("{p}:e"), &enforced, call)
                .await
                .unwrap();
            assert_eq!(d.source, Source::Module);
            assert!(d.allowed, "shadow check {n}: {d:?}");
            assert_eq!(d.shadow_rejected, n > 2, "shadow check {n}: {d:?}");
            assert_eq!(e.allowed, n <= 2, "enforced check {n}: {e:?}");
            assert!(!e.shadow_rejected, "enforced check {n}: {e:?}");
        }
        // A cost-0 check of a refused key asks without consuming: enforcement refuses none.
        let zero = limiter
            .check(&format!("{p}:s"), &shadowed, Call::cost(0).at(at + 5))
            .await
            .unwrap();
        assert!(!zero.shadow_rejected, "{zero:?}");

        // take: MAX 2 of 2, then MAX 1 is past the limit.
        let d = limiter
            .take(&format!("{p}:t"), &shadowed, Call::cost(2).at(at))
            .await
            .unwrap();
        assert!(d.allowed && d.granted == 2 && !d.shadow_rejected, "{d:?}");
        let d = limiter
            .take(&format!("{p}:t"), &shadowed, Call::cost(1).at(at + 1))
            .await
            .unwrap();
        assert!(d.allowed && d.shadow_rejected, "{d:?}");

        // check_all: only the shadow policy's limit is flagged, and the overall decision.
        let ten: LimitSpec = Limit::new(Algorithm::SlidingWindow, 10, "1m")
            .unwrap()
            .into();
        let shadow_spec: LimitSpec = shadowed.clone().into();
        let a = format!("{p}:all:{{t}}:a");
        let b = format!("{p}:all:{{t}}:b");
        for n in 1..=3u64 {
            let m = limiter
                .check_all(
                    &[(a.as_str(), &shadow_spec), (b.as_str(), &ten)],
                    Call::cost(1).at(at + n),
                )
                .await
                .unwrap();
            assert!(m.allowed, "check_all {n}: {m:?}");
            assert_eq!(m.shadow_rejected, n > 2, "check_all {n}: {m:?}");
            assert_eq!(m.limits[0].shadow_rejected, n > 2, "check_all {n}: {m:?}");
            assert!(!m.limits[1].shadow_rejected, "check_all {n}: {m:?}");
        }
        // An enforced limit that refuses: nothing was admitted, so nothing shadow-rejected.
        let one: LimitSpec = Limit::new(Algorithm::FixedWindow, 1, "1m").unwrap().into();
        let c = format!("{p}:all:{{u}}:c");
        let d = format!("{p}:all:{{u}}:d");
        for n in 1..=4u64 {
            let m = limiter
                .check_all(
                    &[(c.as_str(), &shadow_spec), (d.as_str(), &one)],
                    Call::cost(1).at(at + n),
                )
                .await
                .unwrap();
            assert_eq!(m.allowed, n == 1, "check_all {n}: {m:?}");
            assert!(!m.shadow_rejected, "check_all {n}: {m:?}");
        }
        limiter.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_decides_a_policy_with_its_fallback_never_a_shadow() {
    let Some(server) = module_server() else {
        return;
    };
    let module =
        RateLimiter::new(manager(&server, false).await, options(EngineChoice::Module)).unwrap();
    let two = Limit::new(Algorithm::FixedWindow, 2, "1m").unwrap();
    module.policies().set("shadowed", &two, true).await.unwrap();
    let library = RateLimiter::new(
        manager(&server, false).await,
        options(EngineChoice::Library),
    )
    .unwrap();
    let policy = Policy::new("shadowed").unwrap().fallback(two.clone());
    let at = base_ms();
    for n in 1..=3u64 {
        let d = library
            .check("lib:s", &policy, Call::cost(1).at(at + n))
            .await
            .unwrap();
        assert_eq!(d.source, Source::Library);
        assert_eq!(d.allowed, n <= 2, "library check {n}: {d:?}");
        assert!(!d.shadow_rejected, "library check {n}: {d:?}");
    }
    library.close().await;
    module.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_fallback_admits_a_shadow_policys_refusal_and_says_so() {
    let Some(server) = module_server() else {
        return;
    };
    let options = Options {
        on_error: OnError::Local,
        timeout: Duration::from_secs(1),
        ..options(EngineChoice::Module)
    };
    let limiter = RateLimiter::new(manager(&server, false).await, options).unwrap();
    let two = Limit::new(Algorithm::FixedWindow, 2, "1m").unwrap();
    limiter
        .policies()
        .set("shadowed", &two, true)
        .await
        .unwrap();
    let shadowed = Policy::new("shadowed").unwrap();
    // The definition is read (and kept) by a call the server answers.
    let primed = limiter.check("prime", &shadowed, 1).await.unwrap();
    assert_eq!(primed.source, Source::Module);
    server.pause();
    let at = base_ms();
    for n in 1..=3u64 {
        let call = Call::cost(1).at(at + n);
        let d = limiter.check("loc:c", &shadowed, call).await.unwrap();
        assert_eq!(d.source, Source::Fallback, "{d:?}");
        assert!(d.allowed, "local check {n}: {d:?}");
        assert_eq!(d.shadow_rejected, n > 2, "local check {n}: {d:?}");
        let t = limiter.take("loc:t", &shadowed, call).await.unwrap();
        assert!(t.allowed && t.granted == 1, "local take {n}: {t:?}");
        assert_eq!(t.shadow_rejected, n > 2, "local take {n}: {t:?}");
    }
    server.resume();
}
