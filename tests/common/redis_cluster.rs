//! A throwaway Redis Cluster for integration tests: six `redis-server` processes on free
//! 127.0.0.1 ports in a temporary directory, joined by `redis-cli --cluster create` into three
//! masters with one replica each. Dropping it SIGKILLs every process it started (by PID) and
//! removes the directory; if the test is panicking, the tail of each node's log is printed.
//!
//! Queries go through the `redis` crate's blocking client with short timeouts, so every wait
//! here is bounded and a node that was killed answers with an error, never a hang.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `--cluster-node-timeout`, in milliseconds: how long a silent master has before its replica
/// is promoted (about this plus an election).
pub const NODE_TIMEOUT_MS: u64 = 2_000;

/// Ports below this leave `port + 10000` (the cluster bus) a valid port.
const PORT_CEILING: u16 = 55_535;

/// One `redis-server` process of the cluster.
pub struct RedisNode {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub id: String,
    pub port: u16,
    /// `myself,master`, `slave`, `master,fail`, …
    pub flags: String,
    /// The master's id, for a replica.
    pub master_id: Option<String>,
    /// `connected` or `disconnected`.
    pub link: String,
    /// Slot ranges served (inclusive), for a master.
    pub slots: Vec<(u16, u16)>,
}

impl NodeInfo {
    pub fn is_master(&self) -> bool {
        self.flags.split(',').any(|f| f == "master")
    }

    pub fn failed(&self) -> bool {
        self.flags.split(',').any(|f| f == "fail" || f == "fail?")
    }

    pub fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot))
    }
}

/// A six-node Redis Cluster (three masters, three replicas).
pub struct RedisCluster {
    pub nodes: Vec<RedisNode>,
    dir: PathBuf,
}

impl RedisCluster {
    /// Starts six nodes, creates the cluster and waits (bounded) until every node reports
    /// `cluster_state:ok`, three masters cover the slots, and every replica's link to its
    /// master is up (initial sync done). Panics with what it saw.
    pub fn start() -> RedisCluster {
        let dir = std::env::temp_dir().join(format!("tether-redis-cluster-{}-{}", std::process::id(), rand_u32()));
        std::fs::create_dir_all(&dir).expect("create the cluster's temp dir");
        let mut cluster = RedisCluster { nodes: Vec::new(), dir };
        for port in free_ports(6) {
            let node_dir = cluster.dir.join(port.to_string());
            std::fs::create_dir_all(&node_dir).expect("create a node dir");
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"])
                .args(["--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()])
                .args(["--save", "", "--appendonly", "no", "--logfile", "redis.log"])
                // A replica's first full sync starts at once, not after the 5 s default.
                .args(["--repl-diskless-sync-delay", "0"])
                .current_dir(&node_dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server (is it installed? .ci/run installs it)");
            cluster.nodes.push(RedisNode { port, child: Some(child), dir: node_dir });
        }
        for i in 0..cluster.nodes.len() {
            let port = cluster.nodes[i].port;
            cluster.wait("PING answered", Duration::from_secs(10), || {
                match query::<String>(port, &redis::cmd("PING")) {
                    Ok(_) => Ok(()),
                    Err(e) => Err(format!("{port}: {e}")),
                }
            });
        }

        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let log = std::fs::File::create(cluster.dir.join("create.log")).expect("create log");
        let mut child = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("log fd")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn redis-cli --cluster create");
        let end = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(st) = child.try_wait().expect("wait redis-cli") {
                break st;
            }
            if Instant::now() >= end {
                let _ = child.kill();
                let _ = child.wait();
                panic!("redis-cli --cluster create ran over 30 s:\n{}", cluster.create_log());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "redis-cli --cluster create failed ({status}):\n{}", cluster.create_log());

        let ports: Vec<u16> = cluster.nodes.iter().map(|n| n.port).collect();
        cluster.wait("the cluster is ok with 3 synced replicas", Duration::from_secs(30), || {
            for &p in &ports {
                let info = query::<String>(p, redis::cmd("CLUSTER").arg("INFO")).map_err(|e| format!("{p}: {e}"))?;
                if !info.contains("cluster_state:ok") {
                    return Err(format!("{p}: not cluster_state:ok"));
                }
            }
            let nodes = cluster_nodes(ports[0]).map_err(|e| e.to_string())?;
            let masters: Vec<&NodeInfo> = nodes.iter().filter(|n| n.is_master() && !n.slots.is_empty()).collect();
            if masters.len() != 3 {
                return Err(format!("{} masters with slots", masters.len()));
            }
            for m in masters {
                let Some(r) = nodes.iter().find(|n| n.master_id.as_deref() == Some(m.id.as_str())) else {
                    return Err(format!("master {} has no replica yet", m.port));
                };
                let repl = query::<String>(r.port, redis::cmd("INFO").arg("replication")).map_err(|e| e.to_string())?;
                if !repl.contains("master_link_status:up") || repl.contains("master_sync_in_progress:1") {
                    return Err(format!("replica {} of {} is not in sync", r.port, m.port));
                }
            }
            Ok(())
        });
        cluster
    }

    /// `redis://127.0.0.1:PORT` of node `i`.
    pub fn url(&self, i: usize) -> String {
        format!("redis://127.0.0.1:{}", self.nodes[i].port)
    }

    /// `CLUSTER NODES` as seen by the first node still running.
    pub fn topology(&self) -> Vec<NodeInfo> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .find_map(|n| cluster_nodes(n.port).ok())
            .expect("no running node answers CLUSTER NODES")
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`, asked of a running node).
    pub fn keyslot(&self, key: &str) -> u16 {
        let port = self.nodes.iter().find(|n| n.child.is_some()).expect("a running node").port;
        query::<u16>(port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)).expect("CLUSTER KEYSLOT")
    }

    /// SIGKILLs the node on `port` (kill -9: no shutdown, no last replication) and reaps it.
    pub fn kill(&mut self, port: u16) {
        let node = self.nodes.iter_mut().find(|n| n.port == port).expect("a node on that port");
        let mut child = node.child.take().expect("node already killed");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// The PID of the node on `port` (for `SIGSTOP`/`SIGCONT`); panics if it was killed.
    pub fn pid(&self, port: u16) -> i32 {
        let node = self.nodes.iter().find(|n| n.port == port).expect("a node on that port");
        node.child.as_ref().expect("node killed").id() as i32
    }

    /// Calls `check` every 50 ms until it returns `Ok`; panics after `limit` with its last
    /// error and the node logs.
    pub fn wait<T>(&self, what: &str, limit: Duration, mut check: impl FnMut() -> Result<T, String>) -> T {
        let end = Instant::now() + limit;
        loop {
            match check() {
                Ok(v) => return v,
                Err(e) if Instant::now() >= end => {
                    panic!("redis cluster: {what}: not within {limit:?}; last: {e}\n{}", self.logs(15))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn create_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("create.log")).unwrap_or_default()
    }

    /// The last `n` lines of every node's log.
    pub fn logs(&self, n: usize) -> String {
        let mut out = String::new();
        for node in &self.nodes {
            let text = std::fs::read_to_string(node.dir.join("redis.log")).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!("---- redis {} log tail ----\n", node.port));
            out.push_str(&lines[lines.len().saturating_sub(n)..].join("\n"));
            out.push('\n');
        }
        out
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if std::thread::panicking() {
            eprintln!("{}", self.logs(20));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One command to the node on `port` over a fresh connection (1 s to connect, 2 s to answer).
pub fn query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut con = client.get_connection_with_timeout(Duration::from_secs(1))?;
    con.set_read_timeout(Some(Duration::from_secs(2)))?;
    con.set_write_timeout(Some(Duration::from_secs(2)))?;
    cmd.query(&mut con)
}

/// `CLUSTER NODES` of the node on `port`, parsed.
pub fn cluster_nodes(port: u16) -> redis::RedisResult<Vec<NodeInfo>> {
    let text: String = query(port, redis::cmd("CLUSTER").arg("NODES"))?;
    Ok(text.lines().filter_map(parse_node_line).collect())
}

/// `<id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link> <slot> …`
fn parse_node_line(line: &str) -> Option<NodeInfo> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 8 {
        return None;
    }
    let addr = f[1].split('@').next()?;
    let port = addr.rsplit(':').next()?.parse().ok()?;
    let slots = f[8..]
        .iter()
        .filter(|s| !s.starts_with('['))
        .filter_map(|s| match s.split_once('-') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => s.parse().ok().map(|x| (x, x)),
        })
        .collect();
    Some(NodeInfo {
        id: f[0].to_owned(),
        port,
        flags: f[2].to_owned(),
        master_id: (f[3] != "-").then(|| f[3].to_owned()),
        link: f[7].to_owned(),
        slots,
    })
}

/// `n` distinct free ports on 127.0.0.1, each below [`PORT_CEILING`] with `port + 10000` (its
/// cluster bus port) free too and clear of the others.
fn free_ports(n: usize) -> Vec<u16> {
    let mut out: Vec<u16> = Vec::new();
    for _ in 0..10_000 {
        if out.len() == n {
            return out;
        }
        let port = TcpListener::bind("127.0.0.1:0").expect("bind port 0").local_addr().expect("addr").port();
        if port >= PORT_CEILING || out.iter().any(|&p| p == port || p + 10_000 == port || port + 10_000 == p) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port + 10_000)).is_err() || TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        out.push(port);
    }
    panic!("found only {} of {n} free port pairs (P, P + 10000)", out.len());
}

fn rand_u32() -> u32 {
    rand::random()
}
