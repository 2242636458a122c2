//! A Redis Cluster of three primaries (the test kit's): every method through the async cluster
//! connection equal to the raw commands on twin keys, the module and the Functions library
//! (loaded on every primary), RESP2 and RESP3.

mod common;

use common::twin::*;
use common::*;
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::ProtocolVersion;
use redis_ratelimit_client::{Algorithm, Call, EngineChoice, Limit, Options, RateLimiter, Source};
use redis_ratelimit_testkit::cluster::{cluster_address, Cluster};

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
