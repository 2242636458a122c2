//! A real Redis Cluster on loopback: 3 masters and 3 replicas, every node with the module loaded,
//! created with `redis-cli --cluster create`. A cluster-aware client (the `redis` crate) runs CHECK
//! over keys spread across all masters and CHECKALL over hash-tagged keys; keys in different
//! slots get `CROSSSLOT`; a slot holding limiter keys is moved with `redis-cli --cluster reshard`
//! and its keys arrive intact; then the master holding them is killed, its replica takes over,
//! and every limit continues exactly where it was (each reply equals the model of
//! docs/algorithms.md, tests/common/model.rs).
//!
//! Every server is a `common::Server`, killed on Drop (also on panic); every external command
//! and every wait is bounded.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::model::{checkall_reply, Model, Spec};
use common::{dbsize, future_base_ms, snapshot, wait_replica_sync, Server};
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::Value;
use redis_ratelimit::algorithms::{Algorithm, Request};

/// How long the cluster may take to form, fail over or agree again.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
/// `cluster-node-timeout`: a master is declared failed this long after it stops answering.
const NODE_TIMEOUT_MS: &str = "2000";

// ---------------------------------------------------------------------------------------------
// The cluster

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug)]
struct Node {
    id: String,
    port: u16,
    master: bool,
    failed: bool,
    /// The master's id, for a replica.
    master_id: Option<String>,
    slots: Vec<(u16, u16)>,
}

impl Node {
    fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot))
    }
}

fn parse_nodes(text: &str) -> Vec<Node> {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port = fields[1]
                .split(['@', ','])
                .next()
                .and_then(|addr| addr.rsplit(':').next())
                .and_then(|port| port.parse().ok())
                .unwrap_or(0);
            let flags: Vec<&str> = fields[2].split(',').collect();
            let slots = fields[8..]
                .iter()
                .filter(|slot| !slot.starts_with('['))
                .map(|slot| match slot.split_once('-') {
                    Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
                    None => (slot.parse().unwrap(), slot.parse().unwrap()),
                })
                .collect();
            Node {
                id: fields[0].to_string(),
                port,
                master: flags.contains(&"master"),
                failed: flags.contains(&"fail") || flags.contains(&"fail?"),
                master_id: (fields[3] != "-").then(|| fields[3].to_string()),
                slots,
            }
        })
        .collect()
}

/// Runs an external command with a deadline; its output, or a panic with it.
fn run_bounded(command: &mut Command, timeout: Duration) -> String {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e} (is redis-cli installed?)"));
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let out = thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for redis-cli") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    let text = out.join().unwrap_or_default();
    match status {
        Some(status) if status.success() => text,
        Some(status) => panic!("{command:?} failed ({status}):\n{text}"),
        None => panic!("{command:?} still ran after {timeout:?}; killed:\n{text}"),
    }
}

fn redis_cli() -> Command {
    Command::new(std::env::var_os("REDIS_CLI").unwrap_or_else(|| "redis-cli".into()))
}

/// Polls `ready` until it answers `Ok`, or panics with its last complaint after `timeout`.
fn wait_for<T>(what: &str, timeout: Duration, mut ready: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match ready() {
            Ok(value) => return value,
            Err(why) if Instant::now() >= deadline => {
                panic!("{what}: not within {timeout:?}: {why}")
            }
            Err(_) => thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Six servers with the module; dropping it kills them all.
struct Cluster {
    servers: Vec<Server>,
}

impl Cluster {
    fn start() -> Cluster {
        let servers: Vec<Server> = (0..6)
            .map(|_| {
                Server::builder()
                    .config(&[
                        ("cluster-enabled", "yes"),
                        ("cluster-config-file", "nodes.conf"),
                        ("cluster-node-timeout", NODE_TIMEOUT_MS),
                    ])
                    .start()
            })
            .collect();
        let cluster = Cluster { servers };
        let mut create = redis_cli();
        create.args(["--cluster", "create"]);
        create.args(
            cluster
                .servers
                .iter()
                .map(|s| format!("127.0.0.1:{}", s.port())),
        );
        create.args(["--cluster-replicas", "1", "--cluster-yes"]);
        let output = run_bounded(&mut create, CLUSTER_TIMEOUT);
        assert!(output.contains("All 16384 slots covered"), "{output}");
        cluster.wait_healthy();
        cluster
    }

    fn live(&self) -> impl Iterator<Item = &Server> {
        self.servers.iter().filter(|s| s.is_running())
    }

    fn server(&self, port: u16) -> &Server {
        self.servers
            .iter()
            .find(|s| s.port() == port)
            .expect("a node of this cluster")
    }

    fn server_mut(&mut self, port: u16) -> &mut Server {
        self.servers
            .iter_mut()
            .find(|s| s.port() == port)
            .expect("a node of this cluster")
    }

    /// `CLUSTER NODES` as seen by a live node.
    fn nodes(&self) -> Vec<Node> {
        let server = self.live().next().expect("a live node");
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut server.client())
            .expect("CLUSTER NODES");
        parse_nodes(&text)
    }

    /// The live master serving `slot`.
    fn owner(&self, slot: u16) -> Node {
        self.nodes()
            .into_iter()
            .find(|n| n.master && !n.failed && n.owns(slot))
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// Every live node reports `cluster_state:ok`, all see the same masters serving the same
    /// slots (all 16384), and every live replica is linked to its master.
    fn wait_healthy(&self) {
        wait_for("a healthy cluster", CLUSTER_TIMEOUT, || {
            let mut views = Vec::new();
            for server in self.live() {
                let mut con = server.client();
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut con)
                    .map_err(|e| e.to_string())?;
                let info = common::parse_info(&info);
                if info.get("cluster_state").map(String::as_str) != Some("ok")
                    || info.get("cluster_slots_ok").map(String::as_str) != Some("16384")
                {
                    return Err(format!("port {}: {info:?}", server.port()));
                }
                let text: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query(&mut con)
                    .map_err(|e| e.to_string())?;
                let nodes = parse_nodes(&text);
                // Every live node is a master serving slots or a replica (no role change
                // still spreading by gossip).
                if let Some(node) = nodes
                    .iter()
                    .find(|n| !n.failed && n.master == n.slots.is_empty())
                {
                    return Err(format!("port {} sees {node:?}", server.port()));
                }
                let mut view: Vec<(u16, Vec<(u16, u16)>)> = nodes
                    .into_iter()
                    .filter(|n| n.master && !n.failed)
                    .map(|n| (n.port, n.slots))
                    .collect();
                view.sort();
                views.push(view);
                let replication = server.info("replication");
                if replication.get("role").map(String::as_str) == Some("slave")
                    && replication.get("master_link_status").map(String::as_str) != Some("up")
                {
                    return Err(format!("replica {} not linked", server.port()));
                }
            }
            if views.windows(2).any(|pair| pair[0] != pair[1]) {
                return Err(format!("nodes disagree: {views:?}"));
            }
            Ok(())
        });
    }

    /// A cluster-aware client seeded with every live node.
    fn client(&self) -> ClusterConnection {
        let seeds: Vec<String> = self.live().map(Server::url).collect();
        ClusterClient::builder(seeds)
            .retries(10)
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(10))
            .build()
            .and_then(|client| client.get_connection())
            .expect("a cluster connection")
    }
}

// ---------------------------------------------------------------------------------------------
// Slots (CRC16/XMODEM of the key or its hash tag, mod 16384)

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &bytes[open + 1..open + 1 + close])
    });
    crc16(tagged.unwrap_or(bytes)) % 16384
}

fn route(key: &str) -> RoutingInfo {
    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
        slot(key),
        SlotAddr::Master,
    )))
}

// ---------------------------------------------------------------------------------------------
// The workload: CHECK over many keys, CHECKALL over hash-tagged groups

const SINGLE_SPECS: [Spec; 5] = [
    Spec::new(Algorithm::TokenBucket, 4, 3_600_000),
    Spec::new(Algorithm::LeakyBucket, 4, 3_600_000),
    Spec::new(Algorithm::FixedWindow, 4, 3_600_000),
    Spec::new(Algorithm::SlidingWindow, 4, 3_600_000),
    Spec::new(Algorithm::SlidingLog, 4, 3_600_000),
];

/// Per user: a per-second, a per-hour and a per-day limit, checked together.
const GROUP_SPECS: [Spec; 3] = [
    Spec::new(Algorithm::FixedWindow, 3, 1000),
    Spec::new(Algorithm::TokenBucket, 5, 3_600_000),
    Spec::new(Algorithm::SlidingLog, 4, 86_400_000),
];

const SINGLE_KEYS: usize = 300;

fn single_key(i: usize) -> String {
    format!("limit:{i}")
}

fn group_keys(tag: &str) -> Vec<String> {
    ["sec", "hour", "day"]
        .iter()
        .map(|suffix| format!("{{{tag}}}:{suffix}"))
        .collect()
}

fn checkall_cmd(keys: &[String], specs: &[Spec], at_ms: u64) -> redis::Cmd {
    let mut cmd = redis::cmd("RATELIMIT.CHECKALL");
    cmd.arg(keys.len()).arg(keys);
    for spec in specs {
        cmd.arg(spec.args());
    }
    cmd.arg("AT").arg(at_ms);
    cmd
}

fn as_rows(value: Value) -> Vec<Vec<i64>> {
    redis::from_redis_value(&value).expect("a CHECKALL reply")
}

/// One round: CHECK every single key once, CHECKALL every group once; every reply must equal
/// the model's. `default_routing` groups go through the client's own routing (it routes by the
/// second argument, `numkeys`, and follows `MOVED`); the others are sent to their slot's master.
/// Answers how many CHECKs and how many CHECKALLs were admitted.
fn round(
    con: &mut ClusterConnection,
    model: &mut Model,
    groups: &[String],
    at_ms: u64,
    phase: &str,
) -> (usize, usize) {
    let (mut checks, mut checkalls) = (0, 0);
    for i in 0..SINGLE_KEYS {
        let key = single_key(i);
        let spec = SINGLE_SPECS[i % SINGLE_SPECS.len()];
        let reply: Vec<i64> = redis::cmd("RATELIMIT.CHECK")
            .arg(&key)
            .arg(spec.args())
            .arg("AT")
            .arg(at_ms)
            .query(con)
            .unwrap_or_else(|e| panic!("{phase}: CHECK {key}: {e}"));
        let expected = model.check(&key, &spec.request(1, at_ms)).to_array();
        assert_eq!(reply, expected, "{phase}: CHECK {key}");
        checks += usize::from(reply[0] == 1);
    }
    for (n, tag) in groups.iter().enumerate() {
        let keys = group_keys(tag);
        let cmd = checkall_cmd(&keys, &GROUP_SPECS, at_ms);
        let reply = if n % 4 == 0 {
            cmd.query::<Value>(con)
        } else {
            con.route_command(&cmd, route(&keys[0]))
        }
        .map(as_rows)
        .unwrap_or_else(|e| panic!("{phase}: CHECKALL {keys:?}: {e}"));
        let requests: Vec<Request> = GROUP_SPECS.iter().map(|s| s.request(1, at_ms)).collect();
        let expected = checkall_reply(&model.checkall(&keys, &requests));
        assert_eq!(reply, expected, "{phase}: CHECKALL {keys:?}");
        checkalls += usize::from(reply[0][0] == 1);
    }
    (checks, checkalls)
}

/// A hash tag whose slot is `target`.
fn tag_for_slot(target: u16) -> String {
    (0u64..)
        .map(|i| format!("moved{i}"))
        .find(|tag| slot(tag) == target)
        .expect("some tag hashes to every slot")
}

// ---------------------------------------------------------------------------------------------

#[test]
fn cluster_routing_crossslot_resharding_and_failover() {
    let started = Instant::now();
    let mut cluster = Cluster::start();
    eprintln!("cluster up in {:.1?}", started.elapsed());
    let base = future_base_ms();
    let mut model = Model::default();
    let mut con = cluster.client();

    // The slot that will be resharded: the lowest slot of the first master (what
    // `redis-cli --cluster reshard --cluster-slots 1` moves), holding a group's keys.
    let first_master = cluster.owner(0);
    let moved_slot = first_master.slots.iter().map(|(a, _)| *a).min().unwrap();
    let moved_tag = tag_for_slot(moved_slot);
    let mut groups: Vec<String> = (0..40).map(|u| format!("user:{u}")).collect();
    groups.push(moved_tag.clone());

    // CHECK over many keys, CHECKALL over hash-tagged groups, two rounds.
    let all = (SINGLE_KEYS, groups.len());
    assert_eq!(round(&mut con, &mut model, &groups, base, "start"), all);
    assert_eq!(
        round(&mut con, &mut model, &groups, base + 10, "start"),
        all
    );
    let masters: Vec<Node> = cluster
        .nodes()
        .into_iter()
        .filter(|n| n.master && !n.slots.is_empty())
        .collect();
    assert_eq!(masters.len(), 3);
    for master in &masters {
        let keys = dbsize(&mut cluster.server(master.port).client());
        assert!(keys > 50, "master {} holds only {keys} keys", master.port);
    }

    // Keys in different slots: CROSSSLOT, from Redis itself, and nothing is written.
    let (a, b) = ("limit:a", "limit:b");
    assert_ne!(slot(a), slot(b));
    let spread = [a.to_string(), b.to_string()];
    let tags = ["{user:1}:sec".to_string(), "{user:2}:sec".to_string()];
    assert_ne!(slot(&tags[0]), slot(&tags[1]));
    let specs = [GROUP_SPECS[0], GROUP_SPECS[1]];
    for keys in [&spread, &tags] {
        let cmd = checkall_cmd(keys, &specs, base);
        let error = cmd.query::<Value>(&mut con).expect_err("CROSSSLOT");
        assert_eq!(error.code(), Some("CROSSSLOT"), "{keys:?}: {error}");
        let owner = cluster.owner(slot(&keys[0]));
        let direct = cmd
            .query::<Value>(&mut cluster.server(owner.port).client())
            .expect_err("CROSSSLOT");
        assert_eq!(direct.code(), Some("CROSSSLOT"), "{keys:?}: {direct}");
    }
    let exists: i64 = redis::cmd("EXISTS").arg(a).query(&mut con).unwrap();
    assert_eq!(exists, 0);

    // Resharding: move the slot with `redis-cli --cluster reshard`; its keys arrive intact.
    let target = masters
        .iter()
        .find(|m| m.id != first_master.id)
        .expect("another master")
        .clone();
    let moved_keys = group_keys(&moved_tag);
    let source = cluster.server(first_master.port);
    let before = snapshot(&mut source.client(), &moved_keys);
    assert!(before.iter().all(|(dump, _)| dump.is_some()));
    let resharding = Instant::now();
    let output = run_bounded(
        redis_cli().args([
            "--cluster",
            "reshard",
            &format!("127.0.0.1:{}", first_master.port),
            "--cluster-from",
            &first_master.id,
            "--cluster-to",
            &target.id,
            "--cluster-slots",
            "1",
            "--cluster-yes",
        ]),
        CLUSTER_TIMEOUT,
    );
    cluster.wait_healthy();
    eprintln!(
        "slot {moved_slot} resharded in {:.1?}",
        resharding.elapsed()
    );
    assert_eq!(
        cluster.owner(moved_slot).id,
        target.id,
        "reshard moved another slot:\n{output}"
    );
    let arrived = snapshot(&mut cluster.server(target.port).client(), &moved_keys);
    for ((key, (dump, expiry)), (dump_after, expiry_after)) in
        moved_keys.iter().zip(&before).zip(arrived)
    {
        assert_eq!(&dump_after, dump, "{key}: state changed in transit");
        // MIGRATE carries the TTL relative: the expiry may only move later by the transit time.
        assert!(
            (*expiry..*expiry + 5_000).contains(&expiry_after),
            "{key}: expiry {expiry} became {expiry_after}"
        );
    }
    let left: i64 = redis::cmd("CLUSTER")
        .arg("COUNTKEYSINSLOT")
        .arg(moved_slot)
        .query(&mut cluster.server(first_master.port).client())
        .unwrap();
    assert_eq!(left, 0, "keys left behind on the source");
    let mut con = cluster.client();
    assert_eq!(
        round(&mut con, &mut model, &groups, base + 20, "after resharding"),
        all
    );

    // Failover: kill the master now holding the moved slot; its replica takes over and every
    // limit continues exactly.
    let replica = cluster
        .nodes()
        .into_iter()
        .find(|n| n.master_id.as_deref() == Some(target.id.as_str()))
        .expect("the target master's replica");
    // Every write has reached the replica (equal replication offsets) before its master dies.
    // (`WAIT` would not do here: on a new connection it waits for that connection's writes only,
    // which are none.)
    wait_replica_sync(cluster.server(target.port), cluster.server(replica.port));
    let failover = Instant::now();
    drop(con);
    cluster.server_mut(target.port).kill9();
    wait_for("the replica to take over", CLUSTER_TIMEOUT, || {
        let role = cluster
            .server(replica.port)
            .info_field("replication", "role");
        (role == "master")
            .then_some(())
            .ok_or_else(|| format!("port {} is still {role}", replica.port))
    });
    cluster.wait_healthy();
    eprintln!("failover done in {:.1?}", failover.elapsed());
    assert_eq!(cluster.owner(moved_slot).port, replica.port);
    let mut con = cluster.client();
    // The fourth call in the first second: every group's per-second limit refuses (and its hour
    // and day limits keep their state); the single keys still have one left.
    assert_eq!(
        round(&mut con, &mut model, &groups, base + 30, "after failover"),
        (SINGLE_KEYS, 0)
    );
    // A second later: the groups pass again; the single keys are spent (limit 4 per hour).
    assert_eq!(
        round(&mut con, &mut model, &groups, base + 1030, "after failover"),
        (0, groups.len())
    );
    // The survivors still refuse keys in different slots.
    let error = checkall_cmd(&spread, &specs, base)
        .query::<Value>(&mut con)
        .expect_err("CROSSSLOT");
    assert_eq!(error.code(), Some("CROSSSLOT"));
    eprintln!("whole test in {:.1?}", started.elapsed());
}
