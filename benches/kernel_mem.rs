//! The kernel's share of an idle connection (issue 31, item 4; docs/operations.md, "What a
//! connection costs"): the server side's slab bytes per connection by cache
//! (`/proc/slabinfo`: active_objs × objsize), `/proc/meminfo` Slab and SUnreclaim, and TCP
//! socket memory (`/proc/net/sockstat` `mem` pages), with the shipped sysctl profile and
//! without, for each readiness source.
//!
//! `sudo cargo bench --bench kernel_mem` (root: /proc/slabinfo and the sysctls). Env:
//! KMEM_CONNS (counts held, "2000,8000,16000"; the per-connection figure is the least-squares
//! slope of each cache's delta over them), KMEM_ROUNDS (3; figures are medians over rounds),
//! KMEM_PROFILE ("off,on": `on` applies sysctl/99-tether.conf as sysctl/install.sh would and
//! restores every changed value after, also on a panic; `target/bench/kernel_mem.restore.sh`
//! restores them after a SIGKILL), KMEM_READINESS ("epoll,io_uring": the servers'
//! `io.readiness`), KMEM_CORES (2), KMEM_SETTLE_MS (2000: after connecting and after the
//! clients vanish, for deferred frees), KMEM_TOP (14 caches printed; the rest is "other").
//!
//! Method. Both ends of a loopback connection live in this kernel, so the slab delta of N held
//! connections is a client socket plus a server socket. Each point therefore has two phases on
//! a fresh server: (1) the bench's own client opens N connections (upgrade, subscribe, read
//! `subscribed`; then nothing: pings are an hour apart) and the delta against the baseline
//! taken before connecting is the *pair*; (2) every client socket is put in TCP repair mode
//! (`TCP_REPAIR`, as CRIU uses) and closed, which frees it without sending a packet, so the
//! server's sockets stay ESTABLISHED and idle (the bench checks that the server still counts N
//! connections and how many bytes their queues hold), and the delta is the *server side*
//! alone. The client's share is the difference. A client that closed normally, or a listener
//! that accepted and closed, would change the server's TCP state; this changes nothing the
//! server sees. The box's other activity moves the slab too: hence slopes over several counts
//! and medians over rounds, and a point is measured again (up to 4 times) when the box's TCP
//! sockets in use (sockstat) moved by more than 1 % beyond the bench's own.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

use common::kernel::{self, Cache, SysctlProfile, TcpSockstat};
use common::*;
use serde_json::{json, Value};
use tether::ws::codec::{decode_server_frame, encode_client_frame};

/// Bound of each client step (connect, the 101, the `subscribed` answer).
const STEP: Duration = Duration::from_secs(10);
/// Connections opened before their answers are read (keeps 16,000 connects to seconds).
const BATCH: usize = 128;
const MASK: [u8; 4] = [0x5b, 0x1e, 0x93, 0x7c];
/// The clients' source address. Not 127.0.0.1, where the harness scrapes `/metrics` from: a
/// scrape given the port of a vanished client would reach that client's server socket (same
/// four-tuple) and reset it.
const SOURCE: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

/// What the kernel holds at one instant.
struct Snapshot {
    slabs: BTreeMap<String, Cache>,
    slab: u64,
    sunreclaim: u64,
    sock: TcpSockstat,
}

fn snapshot() -> Snapshot {
    Snapshot {
        slabs: kernel::slabinfo(),
        slab: kernel::meminfo_bytes("Slab:"),
        sunreclaim: kernel::meminfo_bytes("SUnreclaim:"),
        sock: kernel::sockstat_tcp(),
    }
}

/// One phase's deltas against the baseline: bytes per cache, then the whole-kernel figures.
#[derive(Default, Clone)]
struct Delta {
    caches: BTreeMap<String, f64>,
    /// Slab:, SUnreclaim:, sockstat TCP mem (bytes), sockstat TCP inuse.
    totals: [f64; 4],
}

const TOTALS: [&str; 4] = ["meminfo Slab", "meminfo SUnreclaim", "sockstat TCP mem", "sockstat TCP inuse"];

fn delta(base: &Snapshot, now: &Snapshot) -> Delta {
    let names = base.slabs.keys().chain(now.slabs.keys());
    let bytes = |s: &Snapshot, n: &str| s.slabs.get(n).map_or(0.0, |c| c.bytes() as f64);
    let caches = names.map(|n| (n.clone(), bytes(now, n) - bytes(base, n))).collect();
    let d = |a: u64, b: u64| b as f64 - a as f64;
    Delta {
        caches,
        totals: [
            d(base.slab, now.slab),
            d(base.sunreclaim, now.sunreclaim),
            d(base.sock.mem_pages, now.sock.mem_pages) * 4096.0,
            d(base.sock.inuse, now.sock.inuse),
        ],
    }
}

/// One count held on one fresh server.
struct Point {
    n: usize,
    pair: Delta,
    server: Delta,
    /// The server's established sockets after the clients vanished: (sockets, unread bytes,
    /// unacknowledged bytes).
    queues: (u64, u64, u64),
}

/// Reads an upgrade answer head from `s`; returns the bytes after it. Panics with what came
/// when it is not a 101 within [`STEP`].
fn read_head(s: &mut TcpStream) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            assert!(buf.starts_with(b"HTTP/1.1 101"), "upgrade refused: {:?}", String::from_utf8_lossy(&buf));
            return buf.split_off(end + 4);
        }
        match s.read(&mut chunk) {
            Ok(0) => panic!("EOF before the upgrade answer; got {:?}", String::from_utf8_lossy(&buf)),
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
            Err(e) => panic!("no upgrade answer within {STEP:?} ({e}); got {:?}", String::from_utf8_lossy(&buf)),
        }
    }
}

/// Reads frames from `s` (after `buf`, what came with the head) until the `subscribed` answer.
fn await_subscribed(s: &mut TcpStream, mut buf: Vec<u8>) {
    let mut chunk = [0u8; 1024];
    let mut seen = Vec::new();
    loop {
        while let Some((used, _, opcode, payload)) = decode_server_frame(&buf).expect("a valid server frame") {
            if opcode == 0x1 && payload.windows(12).any(|w| w == b"\"subscribed\"") {
                return;
            }
            seen.push(String::from_utf8_lossy(&payload).into_owned());
            buf.drain(..used);
        }
        match s.read(&mut chunk) {
            Ok(0) => panic!("EOF before `subscribed`; frames seen: {seen:?}"),
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
            Err(e) => panic!("no `subscribed` within {STEP:?} ({e}); frames seen: {seen:?}"),
        }
    }
}

/// Opens `n` WebSocket connections to `addr`, each subscribed to one of 100 channels (as
/// `tether load idle --channels 100` does), in batches of [`BATCH`].
fn open(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let upgrade = format!(
        "GET /ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    let mut held = Vec::with_capacity(n);
    for start in (0..n).step_by(BATCH) {
        let mut batch: Vec<TcpStream> = (start..(start + BATCH).min(n))
            .map(|i| {
                let mut s = connect_from(SOURCE, addr)
                    .unwrap_or_else(|e| panic!("connection {i} of {n} from {SOURCE} to {addr} failed: {e}"));
                s.set_read_timeout(Some(STEP)).expect("read timeout");
                s.write_all(upgrade.as_bytes()).expect("send the upgrade");
                s
            })
            .collect();
        let rests: Vec<Vec<u8>> = batch.iter_mut().map(read_head).collect();
        for (i, s) in batch.iter_mut().enumerate() {
            let sub = json!({"op": "sub", "ch": format!("kmem-{}", (start + i) % 100)}).to_string();
            s.write_all(&encode_client_frame(0x1, true, sub.as_bytes(), MASK)).expect("send sub");
        }
        for (s, rest) in batch.iter_mut().zip(rests) {
            await_subscribed(s, rest);
        }
        held.extend(batch);
    }
    held
}

/// Connects to `addr` from `source` (port chosen at connect: `IP_BIND_ADDRESS_NO_PORT`).
fn connect_from(source: std::net::IpAddr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    let on: libc::c_int = 1;
    // SAFETY: setsockopt on the socket just made, with a c_int option value.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&s),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    s.bind(&SocketAddr::new(source, 0).into())?;
    s.connect_timeout(&addr.into(), STEP)?;
    Ok(s.into())
}

/// Frees every client socket without a packet to the server: `TCP_REPAIR` on, then close
/// (Linux ≥ 3.5, CAP_NET_ADMIN). Panics when the kernel refuses repair mode.
fn vanish(streams: Vec<TcpStream>) {
    for s in streams {
        let on: libc::c_int = 1;
        // SAFETY: setsockopt on an open socket this process owns, with a c_int option value.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_REPAIR,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0, "TCP_REPAIR refused ({}): run as root", std::io::Error::last_os_error());
    }
}

/// Holds `n` connections on a fresh server with `io.readiness = readiness` and measures both
/// phases (module docs, "Method").
fn measure_point(readiness: &str, n: usize, cores: usize, settle: Duration) -> Point {
    let cfg = format!(
        "[heartbeat]\nping_interval_ms = 3600000\n\n[drain]\nwindow_ms = 1000\n\n[io]\nreadiness = \"{readiness}\"\n"
    );
    let mut server = serve(&format!("kernel_mem_{readiness}"), cores, &cfg);
    std::thread::sleep(settle);
    let base = snapshot();
    let clients = open(server.addr, n);
    let got = wait_connections(&server, n as u64, Duration::from_secs(60));
    assert_eq!(got, n as u64, "the server counts {got} connections, {n} opened");
    std::thread::sleep(settle);
    let pair = delta(&base, &snapshot());
    vanish(clients);
    std::thread::sleep(settle);
    let still = connections(&server).unwrap_or(0);
    assert_eq!(still, n as u64, "the server dropped connections after their clients vanished: {still} of {n}");
    let queues = kernel::tcp_queues(server.addr.port());
    let alone = delta(&base, &snapshot());
    server.stop(STOP_GRACE);
    eprintln!(
        "kernel_mem ({readiness}): {n} connections: pair {:.0} B/conn, server side {:.0} B/conn (all caches); \
         server queues {queues:?}",
        all_caches(&pair) / n as f64,
        all_caches(&alone) / n as f64
    );
    Point { n, pair, server: alone, queues }
}

/// Attempts at one point before its figures are taken as they are.
const ATTEMPTS: usize = 4;

/// [`measure_point`] again while another process's sockets disturbed it: the box's TCP sockets
/// in use (sockstat) must have grown by 2N with both ends held and by N with the server's
/// alone, within 1 % (a test on the shared box opening or closing thousands of sockets moves
/// every socket cache by as much). After [`ATTEMPTS`], the last figures stand, and it says so.
fn undisturbed_point(readiness: &str, n: usize, cores: usize, settle: Duration) -> Point {
    let off = |d: &Delta, want: usize| (d.totals[3] - want as f64).abs() > 0.01 * want as f64;
    let mut attempt = 1;
    loop {
        let p = measure_point(readiness, n, cores, settle);
        let disturbed = off(&p.pair, 2 * n) || off(&p.server, n);
        if disturbed {
            eprintln!(
                "kernel_mem: sockets in use moved by {:.0} (want {}) and {:.0} (want {n}): other sockets on the box; {}",
                p.pair.totals[3],
                2 * n,
                p.server.totals[3],
                if attempt < ATTEMPTS { "measuring again" } else { "keeping it" }
            );
        }
        if !disturbed || attempt == ATTEMPTS {
            return p;
        }
        attempt += 1;
    }
}

/// Sum of every cache's delta.
fn all_caches(d: &Delta) -> f64 {
    d.caches.values().sum()
}

/// What a process listing `/proc/PID/fd` of the server adds per connection (`server`: the
/// server side, else the pair): each listed descriptor gets a `proc_inode_cache` inode and a
/// dentry. On the development box something lists every process's descriptors every few
/// seconds; these are reclaimable and are not the socket's, so the tables show them apart.
fn proc_readers(v: &Variant, objsize: &BTreeMap<String, u64>, server: bool) -> f64 {
    let size = |n: &str| objsize.get(n).copied().unwrap_or(0) as f64;
    let inodes = v.cache("proc_inode_cache", server);
    inodes + inodes / size("proc_inode_cache").max(1.0) * size("dentry")
}

/// The caches of one phase that moved by more than 4 KiB, for the JSON.
fn moved(d: &Delta) -> BTreeMap<&str, f64> {
    d.caches.iter().filter(|(_, b)| b.abs() > 4096.0).map(|(n, b)| (n.as_str(), *b)).collect()
}

/// One (profile, readiness) variant: every round's points.
struct Variant {
    profile: String,
    readiness: String,
    changed: Vec<Value>,
    rounds: Vec<Vec<Point>>,
}

impl Variant {
    fn label(&self) -> String {
        format!("profile {}, {}", self.profile, self.readiness)
    }

    /// Median over rounds of the slope over counts of `f(point)` (bytes per connection).
    fn per_conn(&self, f: impl Fn(&Point) -> f64) -> f64 {
        let slopes: Vec<f64> =
            self.rounds.iter().map(|pts| slope(&pts.iter().map(|p| (p.n as f64, f(p))).collect::<Vec<_>>())).collect();
        median(&slopes)
    }

    fn cache(&self, name: &str, server: bool) -> f64 {
        self.per_conn(|p| *(if server { &p.server } else { &p.pair }).caches.get(name).unwrap_or(&0.0))
    }
}

fn main() {
    if !should_run() {
        return;
    }
    let conns = env_list("KMEM_CONNS", "2000,8000,16000");
    let rounds: usize = env_or("KMEM_ROUNDS", 3).max(1);
    let profiles: Vec<String> =
        env_or("KMEM_PROFILE", "off,on".to_string()).split(',').map(|s| s.trim().to_string()).collect();
    let readiness: Vec<String> =
        env_or("KMEM_READINESS", "epoll,io_uring".to_string()).split(',').map(|s| s.trim().to_string()).collect();
    let cores: usize = env_or("KMEM_CORES", 2);
    let settle = Duration::from_millis(env_or("KMEM_SETTLE_MS", 2000));
    let top: usize = env_or("KMEM_TOP", 14);
    assert!(conns.len() >= 2, "KMEM_CONNS needs two counts or more for a slope: {conns:?}");
    pin_binary("kernel_mem");

    let mut variants = Vec::new();
    for profile in &profiles {
        let guard = (profile == "on").then(|| {
            let conf = concat!(env!("CARGO_MANIFEST_DIR"), "/sysctl/99-tether.conf");
            SysctlProfile::apply(conf.as_ref(), bench_file("kernel_mem.restore.sh"))
        });
        let changed: Vec<Value> =
            guard.iter().flat_map(|g| g.changed().iter().map(|(p, old)| json!({"path": p, "previous": old}))).collect();
        for r in &readiness {
            let mut v = Variant {
                profile: profile.clone(),
                readiness: r.clone(),
                changed: changed.clone(),
                rounds: Vec::new(),
            };
            for round in 0..rounds {
                eprintln!("kernel_mem: {}, round {}/{rounds}", v.label(), round + 1);
                v.rounds.push(conns.iter().map(|&n| undisturbed_point(r, n, cores, settle)).collect());
            }
            variants.push(v);
        }
        drop(guard);
    }
    report(&variants, &conns, rounds, cores, top);
}

/// Prints the tables and writes `target/bench/kernel_mem.json`.
fn report(variants: &[Variant], conns: &[usize], rounds: usize, cores: usize, top: usize) {
    let aliases = kernel::slab_aliases();
    let objsize: BTreeMap<String, u64> = kernel::slabinfo().into_iter().map(|(n, c)| (n, c.objsize)).collect();
    let mut json_variants = Vec::new();
    let mut shown: Vec<String> = Vec::new();
    for v in variants {
        let names: Vec<&String> = v.rounds[0][0].pair.caches.keys().collect();
        let mut rows: Vec<(String, f64, f64)> =
            names.iter().map(|n| (n.to_string(), v.cache(n, true), v.cache(n, false))).collect();
        rows.sort_by(|a, b| b.1.total_cmp(&a.1));
        let (all_server, all_pair) = (v.per_conn(|p| all_caches(&p.server)), v.per_conn(|p| all_caches(&p.pair)));
        let mut lines = Vec::new();
        let mut caches = serde_json::Map::new();
        for (name, server, pair) in rows.iter().take(top) {
            let size = objsize.get(name).copied().unwrap_or(0);
            let merged = aliases.get(name).filter(|a| !a.is_empty()).map(|a| a.join(" ")).unwrap_or_default();
            lines.push(vec![
                name.clone(),
                format!("{size}"),
                format!("{server:.0}"),
                format!("{:.2}", server / size.max(1) as f64),
                format!("{:.0}", pair - server),
                format!("{pair:.0}"),
                merged.clone(),
            ]);
            caches.insert(
                name.clone(),
                json!({"objsize": size, "server_bytes_per_conn": server.round(), "pair_bytes_per_conn": pair.round(),
                       "merged_with": merged}),
            );
            if !shown.contains(name) {
                shown.push(name.clone());
            }
        }
        let (shown_server, shown_pair): (f64, f64) =
            rows.iter().take(top).fold((0.0, 0.0), |acc, r| (acc.0 + r.1, acc.1 + r.2));
        let (other_server, other_pair) = (all_server - shown_server, all_pair - shown_pair);
        lines.push(vec![
            "other".into(),
            "".into(),
            format!("{other_server:.0}"),
            "".into(),
            format!("{:.0}", other_pair - other_server),
            format!("{other_pair:.0}"),
            "".into(),
        ]);
        lines.push(vec![
            "all caches".into(),
            "".into(),
            format!("{all_server:.0}"),
            "".into(),
            format!("{:.0}", all_pair - all_server),
            format!("{all_pair:.0}"),
            "".into(),
        ]);
        let (proc_server, proc_pair) = (proc_readers(v, &objsize, true), proc_readers(v, &objsize, false));
        lines.push(vec![
            "less /proc readers".into(),
            "".into(),
            format!("{:.0}", all_server - proc_server),
            "".into(),
            format!("{:.0}", (all_pair - proc_pair) - (all_server - proc_server)),
            format!("{:.0}", all_pair - proc_pair),
            "".into(),
        ]);
        table(
            &format!(
                "kernel_mem: {}: bytes per idle connection by slab cache (slope over {conns:?}, median of {rounds})",
                v.label()
            ),
            &[
                "cache",
                "objsize",
                "server B/conn",
                "server objs/conn",
                "client B/conn",
                "pair B/conn",
                "also counts (merged)",
            ],
            &lines,
        );
        let mut totals = serde_json::Map::new();
        let mut total_rows = Vec::new();
        for (i, name) in TOTALS.iter().enumerate() {
            let (server, pair) = (v.per_conn(|p| p.server.totals[i]), v.per_conn(|p| p.pair.totals[i]));
            total_rows.push(vec![
                name.to_string(),
                format!("{server:.2}"),
                format!("{:.2}", pair - server),
                format!("{pair:.2}"),
            ]);
            totals.insert(name.to_string(), json!({"server_per_conn": server, "pair_per_conn": pair}));
        }
        let last: Vec<(u64, u64, u64)> = v.rounds.iter().map(|r| r[r.len() - 1].queues).collect();
        table(
            &format!("kernel_mem: {}: per connection (bytes; TCP inuse in sockets)", v.label()),
            &["figure", "server", "client", "pair"],
            &total_rows,
        );
        // Slab pages are not given back while other objects share them: after the clients'
        // sockets are freed, their slabs stay, half used, under the server's.
        println!(
            "  (meminfo's server column counts the pages the freed client sockets leave half used: read the caches)"
        );
        println!(
            "  server sockets' queues at {} connections (sockets, unread B, unacked B) per round: {last:?}",
            conns[conns.len() - 1]
        );
        json_variants.push(json!({
            "profile": v.profile, "readiness": v.readiness, "sysctl_changed": v.changed,
            "server_bytes_per_conn_all_caches": all_server.round(), "pair_bytes_per_conn_all_caches": all_pair.round(),
            "other_server_bytes_per_conn": other_server.round(), "caches": caches, "totals": totals,
            "proc_readers_server_bytes_per_conn": proc_server.round(),
            "server_bytes_per_conn_less_proc_readers": (all_server - proc_server).round(),
            "pair_bytes_per_conn_less_proc_readers": (all_pair - proc_pair).round(),
            "server_queues_at_max": last.iter().map(|q| json!({"sockets": q.0, "unread": q.1, "unacked": q.2})).collect::<Vec<_>>(),
            "rounds": v.rounds.iter().map(|pts| pts.iter().map(|p| json!({
                "connections": p.n, "pair_all_caches": all_caches(&p.pair), "server_all_caches": all_caches(&p.server),
                "pair_caches": moved(&p.pair), "server_caches": moved(&p.server),
                "pair_totals": p.pair.totals, "server_totals": p.server.totals,
            })).collect::<Vec<_>>()).collect::<Vec<_>>(),
        }));
    }
    // Side by side: the server's bytes per connection of every cache shown above, per variant.
    let mut rows: Vec<Vec<String>> = shown
        .iter()
        .map(|n| {
            std::iter::once(n.clone()).chain(variants.iter().map(|v| format!("{:.0}", v.cache(n, true)))).collect()
        })
        .collect();
    rows.push(
        std::iter::once("all caches".to_string())
            .chain(variants.iter().map(|v| format!("{:.0}", v.per_conn(|p| all_caches(&p.server)))))
            .collect(),
    );
    let labels: Vec<String> = variants.iter().map(Variant::label).collect();
    let headers: Vec<&str> = std::iter::once("server B/conn").chain(labels.iter().map(String::as_str)).collect();
    table("kernel_mem: server side by variant", &headers, &rows);
    write_json(
        "kernel_mem",
        &json!({
            "connections": conns, "rounds": rounds, "cores": cores, "allocator": allocator(),
            "method": "pair = delta with both ends held; server = delta after every client socket was freed by TCP_REPAIR + close (no packet sent); client = pair - server; per connection = least-squares slope over the counts, median over rounds",
            "variants": json_variants,
        }),
    );
}
