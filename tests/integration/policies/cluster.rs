//! Redis Cluster: each primary holds its own policies. An operator applies one to every primary
//! with `redis-cli --cluster call <node> RATELIMIT.POLICY SET ...`; then CHECK, CHECKALL and PEEK
//! through it work on keys of every primary, each answering as the same call inline. A policy
//! defined on one primary alone is unknown to the others.

use super::{check_cmd, checkall_cmd, definition, inline_cmd, SpecArg};
use crate::common;

use common::cluster::{cluster_address, redis_cli, run_bounded, slot, Cluster, CLUSTER_TIMEOUT};
use common::model::Spec;
use common::{future_base_ms, show_value};
use redis::cluster::ClusterConnection;
use redis::{Cmd, Value};
use redis_ratelimit_core::algorithms::Algorithm;

/// The reply as redis-cli shows it, an error reply as `ERR ...`; panics if the call itself fails.
fn query(con: &mut ClusterConnection, cmd: &Cmd) -> Result<Value, String> {
    cmd.query::<Value>(con).map_err(|e| match e.code() {
        Some(code) => format!("{code} {}", e.detail().unwrap_or_default()),
        None => panic!("{}: {e}", common::show_cmd(cmd)),
    })
}

fn shown(reply: &Result<Value, String>) -> String {
    match reply {
        Ok(value) => show_value(value),
        Err(error) => error.clone(),
    }
}

/// `redis-cli --cluster call <node> args...` (every node; here every node is a primary).
fn cluster_call(cluster: &Cluster, args: &[&str]) -> String {
    let node = cluster.masters()[0].port;
    run_bounded(
        redis_cli()
            .args(["--cluster", "call", &cluster_address(node)])
            .args(args),
        CLUSTER_TIMEOUT,
    )
}

#[test]
fn a_policy_applied_to_every_primary_works_on_keys_of_every_primary() {
    let cluster = Cluster::start(3, 0);
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    let spec = Spec {
        burst: Some(4),
        ..Spec::new(Algorithm::TokenBucket, 2, 60_000)
    };
    let output = cluster_call(
        &cluster,
        &[
            "RATELIMIT.POLICY",
            "SET",
            "api",
            "token-bucket",
            "2",
            "1m",
            "BURST",
            "4",
        ],
    );
    for master in &masters {
        let mut con = cluster.server(master.port).client();
        assert_eq!(
            super::get(&mut con, "api"),
            Some(definition(&spec, false)),
            "primary {}: {output}",
            master.port
        );
    }
    // One key (and its hash-tagged twins) on each primary.
    let tags: Vec<String> = masters
        .iter()
        .map(|master| {
            (0u64..)
                .map(|i| format!("user{i}"))
                .find(|tag| master.owns(slot(tag)))
                .expect("a tag in every primary's slots")
        })
        .collect();
    let mut con = cluster.client();
    let at = future_base_ms();
    for (tag, master) in tags.iter().zip(&masters) {
        let (policy_key, inline_key) = (format!("{{{tag}}}:p"), format!("{{{tag}}}:i"));
        for (step, cost) in [1, 1, 2, 1, 0, 3].into_iter().enumerate() {
            let at = at + step as u64 * 10_000;
            let through = query(&mut con, &check_cmd(&policy_key, "api", cost, at));
            let inline = query(
                &mut con,
                &inline_cmd("RATELIMIT.CHECK", &inline_key, &spec, cost, at),
            );
            assert_eq!(
                shown(&through),
                shown(&inline),
                "{policy_key} on primary {} step {step}",
                master.port
            );
            let reply = through.unwrap_or_else(|e| panic!("{policy_key}: {e}"));
            assert!(
                common::try_reply6(&reply).is_some(),
                "{}",
                show_value(&reply)
            );
        }
        // CHECKALL over the twins, through the policy and inline alike.
        let keys = [policy_key.as_str(), inline_key.as_str()];
        let reply = query(
            &mut con,
            &checkall_cmd(
                &keys,
                &[SpecArg::Policy("api".into()), SpecArg::Inline(spec)],
                1,
                at + 60_000,
            ),
        );
        let rows: Vec<Vec<i64>> = reply
            .ok()
            .and_then(|reply| redis::from_redis_value(&reply).ok())
            .unwrap_or_else(|| panic!("{tag}: CHECKALL"));
        assert_eq!(rows[1], rows[2], "{tag}: {rows:?}");
    }

    // A policy set on one primary only is unknown to the others.
    let mut first = cluster.server(masters[0].port).client();
    super::define(&mut first, "here.only", &spec, false);
    for (tag, master) in tags.iter().zip(&masters) {
        let reply = query(
            &mut con,
            &check_cmd(&format!("{{{tag}}}:h"), "here.only", 1, at),
        );
        if master.port == masters[0].port {
            let reply = reply.unwrap_or_else(|e| panic!("{tag}: {e}"));
            assert!(
                common::try_reply6(&reply).is_some(),
                "{}",
                show_value(&reply)
            );
        } else {
            assert_eq!(
                reply.err().as_deref(),
                Some("ERR no such policy 'here.only'"),
                "primary {}",
                master.port
            );
        }
    }
    // And removed from every primary the same way.
    cluster_call(&cluster, &["RATELIMIT.POLICY", "DEL", "api"]);
    for master in &masters {
        let mut con = cluster.server(master.port).client();
        assert_eq!(super::get(&mut con, "api"), None, "primary {}", master.port);
    }
}
