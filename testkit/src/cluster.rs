//! A real Redis Cluster on loopback for the tests: [`Cluster::start`] starts `masters` servers
//! with the module (and `replicas` replicas per master), each a [`Server`] with
//! `cluster-enabled yes`, joins them with `redis-cli --cluster create` and waits until every node
//! agrees; dropping it kills them all (also on panic). [`slot`] and [`route`] give a key's hash
//! slot and a route to its master, [`redis_cli`] and [`run_bounded`] run `redis-cli --cluster`
//! subcommands with a deadline.
//!
//! Environment: `REDIS_CLI`, the cli to run (default `redis-cli` from PATH), besides the
//! [`Server`]'s own.

use std::io::Read;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redis::cluster::{ClusterClient, ClusterConnection};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};

use super::parse_info;
use super::server::Server;

/// How long the cluster may take to form, fail over or agree again.
pub const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
/// `cluster-node-timeout`: a master is declared failed this long after it stops answering.
pub const NODE_TIMEOUT_MS: &str = "2000";

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug)]
pub struct Node {
    pub id: String,
    pub port: u16,
    pub master: bool,
    pub failed: bool,
    /// The master's id, for a replica.
    pub master_id: Option<String>,
    pub slots: Vec<(u16, u16)>,
}

impl Node {
    pub fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot))
    }
}

pub fn parse_nodes(text: &str) -> Vec<Node> {
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
pub fn run_bounded(command: &mut Command, timeout: Duration) -> String {
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

/// `$REDIS_CLI`, else `redis-cli` from PATH.
pub fn redis_cli() -> Command {
    Command::new(std::env::var_os("REDIS_CLI").unwrap_or_else(|| "redis-cli".into()))
}

/// Polls `ready` until it answers `Ok`, or panics with its last complaint after `timeout`.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut ready: impl FnMut() -> Result<T, String>,
) -> T {
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

/// The servers of one cluster, every one with the module; dropping it kills them all.
pub struct Cluster {
    servers: Vec<Server>,
}

impl Cluster {
    /// `masters` masters (at least 3, as `redis-cli --cluster create` wants) with `replicas`
    /// replicas each, the 16384 slots spread evenly over the masters; returns once every node
    /// agrees ([`wait_healthy`](Self::wait_healthy)).
    pub fn start(masters: usize, replicas: usize) -> Cluster {
        let servers: Vec<Server> = (0..masters * (1 + replicas))
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
        create.args(cluster.servers.iter().map(|s| cluster_address(s.port())));
        create.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]);
        let output = run_bounded(&mut create, CLUSTER_TIMEOUT);
        assert!(output.contains("All 16384 slots covered"), "{output}");
        cluster.wait_healthy();
        cluster
    }

    /// The servers still running.
    pub fn live(&self) -> impl Iterator<Item = &Server> {
        self.servers.iter().filter(|s| s.is_running())
    }

    pub fn server(&self, port: u16) -> &Server {
        self.servers
            .iter()
            .find(|s| s.port() == port)
            .expect("a node of this cluster")
    }

    pub fn server_mut(&mut self, port: u16) -> &mut Server {
        self.servers
            .iter_mut()
            .find(|s| s.port() == port)
            .expect("a node of this cluster")
    }

    /// `CLUSTER NODES` as seen by a live node.
    pub fn nodes(&self) -> Vec<Node> {
        let server = self.live().next().expect("a live node");
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut server.client())
            .expect("CLUSTER NODES");
        parse_nodes(&text)
    }

    /// The live masters serving slots, as `CLUSTER NODES` lists them.
    pub fn masters(&self) -> Vec<Node> {
        self.nodes()
            .into_iter()
            .filter(|n| n.master && !n.failed && !n.slots.is_empty())
            .collect()
    }

    /// The live master serving `slot`.
    pub fn owner(&self, slot: u16) -> Node {
        self.nodes()
            .into_iter()
            .find(|n| n.master && !n.failed && n.owns(slot))
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// Every live node reports `cluster_state:ok`, all see the same masters serving the same
    /// slots (all 16384), and every live replica is linked to its master.
    pub fn wait_healthy(&self) {
        wait_for("a healthy cluster", CLUSTER_TIMEOUT, || {
            let mut views = Vec::new();
            for server in self.live() {
                let mut con = server.client();
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut con)
                    .map_err(|e| e.to_string())?;
                let info = parse_info(&info);
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
    pub fn client(&self) -> ClusterConnection {
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

/// `127.0.0.1:<port>`, as `redis-cli --cluster` names a node.
pub fn cluster_address(port: u16) -> String {
    format!("127.0.0.1:{port}")
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

/// The hash slot of `key`: of its hash tag (the first non-empty `{...}`) if it has one.
pub fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &bytes[open + 1..open + 1 + close])
    });
    crc16(tagged.unwrap_or(bytes)) % 16384
}

/// A route to the master serving `key`'s slot, for
/// [`ClusterConnection::route_command`](redis::cluster::ClusterConnection::route_command).
pub fn route(key: &str) -> RoutingInfo {
    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
        slot(key),
        SlotAddr::Master,
    )))
}
