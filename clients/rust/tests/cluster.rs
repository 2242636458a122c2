//! A Redis Cluster of three primaries (the test kit's): every method through the async cluster
//! connection equal to the raw commands on twin keys, the module and the Functions library
//! (loaded on every primary), RESP2 and RESP3; a shadow policy (defined on every primary, as
//! policies are per node) through check, take and check_all on each primary's slots.

mod common;

use common::twin::*;
use common::*;
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::ProtocolVersion;
use redis_ratelimit_client::{
    Algorithm, Call, EngineChoice, Limit, LimitSpec, OnError, Options, Policy, RateLimiter, Source,
};
use redis_ratelimit_testkit::cluster::{cluster_address, slot, Cluster};

async fn connect(cluster: &Cluster, resp3: bool) -> ClusterConnection {
    let nodes: Vec<String> = cluster
        .live()
        .map(|s| format!("redis://{}", cluster_address(s.port())))
        .collect();
    let protocol = if resp3 {
        ProtocolVersion::RESP3
    } else {
        ProtocolVersion::RESP2
    };
    ClusterClientBuilder::new(nodes)
        .use_protocol(protocol)
        .build()
        .unwrap()
        .get_async_connection()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_answers_as_the_raw_commands_with_both_engines() {
    if !module_available() {
        skip("no module library (build it with `make build` or set RATELIMIT_MODULE)");
        return;
    }
    let cluster = Cluster::start(3, 0);
    for (resp3, library, seed) in [
        (false, false, 11),
        (true, false, 12),
        (false, true, 13),
        (true, true, 14),
    ] {
        let engine = if library {
            EngineChoice::Library
        } else {
            EngineChoice::Module
        };
        let options = Options {
            engine,
            timeout: std::time::Duration::from_secs(1),
            ..Options::default()
        };
        let limiter = RateLimiter::new(connect(&cluster, resp3).await, options).unwrap();
        let mut raw_conn = connect(&cluster, resp3).await;
        let limit = Limit::new(Algorithm::Gcra, 3, "1s").unwrap();
        let d = limiter.check("first", &limit, 1).await.unwrap();
        assert_eq!(
            d.source,
            if library {
                Source::Library
            } else {
                Source::Module
            }
        );
        // Keys of several slots: each round its own hash tag.
        for part in 0..4 {
            let tag = format!("c{}{}{part}", u8::from(resp3), u8::from(library));
            run_twins(
                &limiter,
                &mut raw_conn,
                library,
                &tag,
                seed * 10 + part,
                100,
            )
            .await;
        }
        leases_and_errors(&limiter, &mut raw_conn, library).await;
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut raw_conn)
            .await
            .unwrap();
        // CHECKALL on a slot other than the first argument's ("2").
        let pairs = [("{u}:sec", limit.clone()), ("{u}:hour", limit.clone())];
        let d = limiter.check_all(&pairs, Call::cost(1)).await.unwrap();
        assert!(d.allowed && d.limits.len() == 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_policy_on_every_primary_reports_what_enforcement_would_refuse() {
    if !module_available() {
        skip("no module library (build it with `make build` or set RATELIMIT_MODULE)");
        return;
    }
    let cluster = Cluster::start(3, 0);
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3, "{masters:?}");
    // Policies are per node: each primary gets both.
    let two = Limit::new(Algorithm::FixedWindow, 2, "1m").unwrap();
    for node in &masters {
        let mut conn = cluster.server(node.port).client();
        for (name, shadow) in [("shadowed", true), ("enforced", false)] {
            let mut set = redis::cmd("RATELIMIT.POLICY");
            set.arg("SET").arg(name).arg(two.args());
            if shadow {
                set.arg("SHADOW");
            }
            let () = set.query(&mut conn).unwrap();
        }
    }
    // A hash tag of each primary's slots: the MULTI of a PEEK and the call goes to each.
    let tags: Vec<String> = masters
        .iter()
        .map(|node| {
            (0..)
                .map(|i| format!("s{i}"))
                .find(|tag| node.owns(slot(&format!("{{{tag}}}"))))
                .unwrap()
        })
        .collect();
    let shadowed = Policy::new("shadowed").unwrap();
    let enforced = Policy::new("enforced").unwrap();
    let shadow_spec: LimitSpec = shadowed.clone().into();
    let ten: LimitSpec = Limit::new(Algorithm::SlidingWindow, 10, "1m")
        .unwrap()
        .into();
    let at = base_ms();
    for resp3 in [false, true] {
        let options = Options {
            engine: EngineChoice::Module,
            on_error: OnError::Closed,
            // A loaded machine must not turn a slow reply into an error.
            timeout: std::time::Duration::from_secs(5),
            ..Options::default()
        };
        let limiter = RateLimiter::new(connect(&cluster, resp3).await, options).unwrap();
        for tag in &tags {
            let p = format!("{{{tag}}}:r{}", u8::from(resp3));
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
                assert_eq!(d.source, Source::Module, "{p} check {n}: {d:?}");
                assert!(d.allowed, "{p} shadow check {n}: {d:?}");
                assert_eq!(d.shadow_rejected, n > 2, "{p} shadow check {n}: {d:?}");
                assert_eq!(d.remaining, 2u64.saturating_sub(n), "{p} check {n}: {d:?}");
                assert_eq!(e.allowed, n <= 2, "{p} enforced check {n}: {e:?}");
                assert!(!e.shadow_rejected, "{p} enforced check {n}: {e:?}");
            }
            let t = format!("{p}:t");
            let d = limiter
                .take(&t, &shadowed, Call::cost(2).at(at))
                .await
                .unwrap();
            assert!(d.granted == 2 && !d.shadow_rejected, "{p} take: {d:?}");
            let d = limiter
                .take(&t, &shadowed, Call::cost(1).at(at + 1))
                .await
                .unwrap();
            assert!(
                d.allowed && d.shadow_rejected,
                "{p} take past the limit: {d:?}"
            );
            let (a, b) = (format!("{p}:all:a"), format!("{p}:all:b"));
            for n in 1..=3u64 {
                let m = limiter
                    .check_all(
                        &[(a.as_str(), &shadow_spec), (b.as_str(), &ten)],
                        Call::cost(1).at(at + n),
                    )
                    .await
                    .unwrap();
                assert!(m.allowed, "{p} check_all {n}: {m:?}");
                assert_eq!(m.shadow_rejected, n > 2, "{p} check_all {n}: {m:?}");
                assert_eq!(
                    m.limits[0].shadow_rejected,
                    n > 2,
                    "{p} check_all {n}: {m:?}"
                );
                assert!(!m.limits[1].shadow_rejected, "{p} check_all {n}: {m:?}");
            }
        }
        limiter.close().await;
    }
}
