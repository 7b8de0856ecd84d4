//! The box's floor for a broadcast (issue 31 item 6; docs/operations.md, "The broadcast
//! against the box's floor"): what one core needs to send one small frame to each of N
//! connections that all exist at once, the work of an N-subscriber broadcast without a server
//! around it.
//!
//! The per-process open-file limit holds one process to about 9,900 loopback pairs, so
//! [`Floor::measure`] starts `ceil(N / per_proc)` copies of the running bench (the environment
//! variable [`CHILD`] tells a copy it is one; [`child_if_asked`] at the top of `main` runs it).
//! Each child holds its pairs, connected from a source address of its own (127.1.x.y, so no two
//! share a port range), all alive together: 2N sockets in the kernel's tables, as in the `c1m`
//! bench. Then, for each round, the parent asks every child in turn for one pass: pinned to one
//! CPU, one non-blocking `send(2)` of the frame from each accepted (server-side) socket to its
//! peer, timed by the child's thread CPU clock (`CLOCK_THREAD_CPUTIME_ID`; on loopback it
//! includes the peer's TCP receive, done in the sender's context) and by the wall clock; then
//! the child reads its peers' bytes (not timed). Each send of a round reaches a socket the core
//! has not touched since the round before, with the other children's sockets in between: the
//! caches hold none of it, as in a broadcast to a million, against a few thousand sockets sent
//! to over and over that stay in the caches (`send_path`'s warm figure, about half as much).
//!
//! Needs `fs.file-max` above 2N and about 10 KiB of kernel memory per pair while it runs. A
//! child ends at the end of its input with every socket reset (`SO_LINGER` 0), so a run leaves
//! no `TIME_WAIT` behind for whatever the bench does next.

use std::io::{BufRead, BufReader, IoSlice, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tether::server::io as sock;

use super::{env_or, kernel, loadavg, median, pin_to, slab_bytes, table, thread_cpu_ns};

/// Loopback pairs one child holds by default: both ends of each under the per-process
/// open-file limit (20,000 here) with room for the rest.
pub const PER_PROC: usize = 9_900;
/// Set in a child's environment: its index; with [`CHILD_PAIRS`], [`CHILD_CPU`], [`CHILD_FRAME`].
pub const CHILD: &str = "FLOOR_CHILD";
/// Loopback pairs the child holds.
const CHILD_PAIRS: &str = "FLOOR_CHILD_PAIRS";
/// The CPU its passes run on.
const CHILD_CPU: &str = "FLOOR_CHILD_CPU";
/// Bytes per send.
const CHILD_FRAME: &str = "FLOOR_CHILD_FRAME";

/// Runs this process as a floor child and exits, when [`CHILD`] is set; returns otherwise.
pub fn child_if_asked() {
    let Ok(index) = std::env::var(CHILD) else { return };
    let index = index.parse().expect("FLOOR_CHILD: a child index");
    child(index, env_or(CHILD_PAIRS, 0), env_or(CHILD_CPU, 0), env_or(CHILD_FRAME, 100));
    std::process::exit(0);
}

/// The source address of child `index`: 127.1.x.y, one per child.
fn source(index: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 1 + (index / 62_500) as u8, (index / 250 % 250) as u8, (index % 250 + 1) as u8)
}

/// Sets an int socket option, panicking with its name on failure.
fn set_int(fd: i32, level: i32, name: i32, value: libc::c_int, what: &str) {
    // SAFETY: setsockopt reads the int it is pointed at, on a socket the caller owns.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "{what}: {}", std::io::Error::last_os_error());
}

/// Reads whatever each socket holds (non-blocking sockets), so the next pass starts from
/// empty buffers.
pub fn drain(rx: &mut [TcpStream]) {
    use std::io::Read;
    let mut buf = [0u8; 4096];
    for s in rx {
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
    }
}

/// A child: `pairs` loopback connections from [`source`]`(index)`, `ready` on stdout, then one
/// pass per `pass` line on stdin, answered with `CPU_NS WALL_NS`; at the end of input, every
/// connection reset.
fn child(index: usize, pairs: usize, cpu: usize, size: usize) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let addr = socket2::SockAddr::from(l.local_addr().expect("listener address"));
    let src = socket2::SockAddr::from(SocketAddr::from((source(index), 0)));
    let (mut tx, mut rx) = (Vec::with_capacity(pairs), Vec::with_capacity(pairs));
    for _ in 0..pairs {
        let c = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
        // The port is chosen at connect, per destination, not at bind.
        set_int(c.as_raw_fd(), libc::IPPROTO_IP, libc::IP_BIND_ADDRESS_NO_PORT, 1, "IP_BIND_ADDRESS_NO_PORT");
        c.bind(&src).unwrap_or_else(|e| panic!("bind {}: {e}", source(index)));
        c.connect(&addr).expect("connect");
        c.set_nonblocking(true).expect("non-blocking");
        let (s, _) = l.accept().expect("accept");
        s.set_nonblocking(true).expect("non-blocking");
        s.set_nodelay(true).expect("TCP_NODELAY");
        rx.push(TcpStream::from(c));
        tx.push(s);
    }
    drop(l);
    let fds: Vec<i32> = tx.iter().map(|s| s.as_raw_fd()).collect();
    let frame = vec![b'x'; size];
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").and_then(|_| out.flush()).expect("stdout");
    let mut pinned = false;
    for line in std::io::stdin().lock().lines() {
        if line.expect("stdin") != "pass" {
            continue;
        }
        if !pinned {
            pin_to(cpu);
            pinned = true;
        }
        let (w0, c0) = (Instant::now(), thread_cpu_ns());
        for &fd in &fds {
            let n = sock::send(fd, &[IoSlice::new(&frame)]).expect("send");
            assert_eq!(n, frame.len(), "a short send to an empty socket");
        }
        let (cpu_ns, wall_ns) = (thread_cpu_ns() - c0, w0.elapsed().as_nanos());
        drain(&mut rx);
        writeln!(out, "{cpu_ns} {wall_ns}").and_then(|_| out.flush()).expect("stdout");
    }
    // A reset instead of a FIN: no TIME_WAIT left in the tables for the next bench.
    for s in &tx {
        let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
    }
}

/// A child as the parent holds it; killed and reaped on drop if it has not ended.
struct Kid {
    child: Child,
    to: Option<ChildStdin>,
    from: BufReader<ChildStdout>,
}

impl Kid {
    /// The child's next line, or a panic naming it when it ended.
    fn line(&mut self, index: usize) -> String {
        let mut s = String::new();
        match self.from.read_line(&mut s) {
            Ok(n) if n > 0 => s.trim().to_string(),
            r => panic!("floor child {index} ended ({r:?}); see its stderr above"),
        }
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        // End of input: the child resets its connections and exits; then SIGKILL if still there.
        drop(self.to.take());
        let t = Instant::now() + Duration::from_secs(10);
        while Instant::now() < t && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One round: a pass over every connection.
#[derive(Clone, Copy)]
pub struct Round {
    /// Σ of the children's thread CPU time, nanoseconds.
    pub cpu_ns: u128,
    /// Σ of the children's wall time, nanoseconds.
    pub wall_ns: u128,
    /// The 1-minute load average before the round.
    pub loadavg: f64,
}

/// A measured floor.
pub struct Floor {
    /// Connections (one send each per round).
    pub conns: usize,
    /// Child processes that held them.
    pub procs: usize,
    /// Bytes per send.
    pub frame: usize,
    /// The CPU every pass ran on.
    pub cpu: usize,
    /// Seconds to open every connection.
    pub setup_s: f64,
    /// `/proc/net/sockstat` TCP `inuse` with every connection open.
    pub sockets: u64,
    /// `Slab:` growth per pair, bytes.
    pub slab_per_pair: f64,
    /// `net.ipv4.tcp_ehash_entries`, as read.
    pub ehash: Option<String>,
    /// The rounds, in order.
    pub rounds: Vec<Round>,
}

impl Floor {
    /// Opens `conns` connections over children of `per_proc` pairs each, then `rounds` passes,
    /// each pinned to `cpu` and sending `frame` bytes per connection. Panics when a child
    /// cannot start or ends early (its stderr is the bench's).
    pub fn measure(conns: usize, per_proc: usize, rounds: usize, cpu: usize, frame: usize) -> Floor {
        let per_proc = per_proc.max(1);
        let procs = conns.div_ceil(per_proc);
        let exe = std::env::current_exe().expect("this bench's path");
        let (slab0, t0) = (slab_bytes(), Instant::now());
        let mut kids = Vec::with_capacity(procs);
        for i in 0..procs {
            let pairs = per_proc.min(conns - i * per_proc);
            let mut child = Command::new(&exe)
                .arg("--bench")
                .env(CHILD, i.to_string())
                .env(CHILD_PAIRS, pairs.to_string())
                .env(CHILD_CPU, cpu.to_string())
                .env(CHILD_FRAME, frame.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a floor child");
            let to = child.stdin.take();
            let from = BufReader::new(child.stdout.take().expect("child stdout"));
            kids.push(Kid { child, to, from });
        }
        for (i, k) in kids.iter_mut().enumerate() {
            assert_eq!(k.line(i), "ready", "floor child {i}");
        }
        let setup_s = t0.elapsed().as_secs_f64();
        let slab_per_pair = slab_bytes().saturating_sub(slab0) as f64 / conns.max(1) as f64;
        let sockets = kernel::sockstat_tcp().inuse;
        let ehash = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_ehash_entries").ok().map(|s| s.trim().to_string());
        let mut out = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let loadavg = loadavg();
            let (mut cpu_ns, mut wall_ns) = (0u128, 0u128);
            for (i, k) in kids.iter_mut().enumerate() {
                let to = k.to.as_mut().expect("child stdin");
                writeln!(to, "pass").and_then(|_| to.flush()).expect("child stdin");
                let line = k.line(i);
                let mut f = line.split_whitespace().map(|x| x.parse::<u128>().expect("child figures"));
                cpu_ns += f.next().expect("CPU ns");
                wall_ns += f.next().expect("wall ns");
            }
            out.push(Round { cpu_ns, wall_ns, loadavg });
        }
        Floor { conns, procs, frame, cpu, setup_s, sockets, slab_per_pair, ehash, rounds: out }
    }

    /// CPU nanoseconds per send, by round.
    pub fn ns_per_send(&self) -> Vec<f64> {
        self.rounds.iter().map(|r| r.cpu_ns as f64 / self.conns.max(1) as f64).collect()
    }

    /// The median round's CPU time for all the sends, seconds: the floor.
    pub fn median_s(&self) -> f64 {
        median(&self.ns_per_send()) * self.conns as f64 / 1e9
    }

    /// Prints the set-up line, a table of the rounds and the median.
    pub fn print(&self) {
        println!(
            "floor: {} connections in {} processes, set up in {:.1} s ({} TCP sockets in use, slab +{:.0} B per pair, \
             tcp_ehash_entries {})",
            self.conns,
            self.procs,
            self.setup_s,
            self.sockets,
            self.slab_per_pair,
            self.ehash.as_deref().unwrap_or("-")
        );
        let rows: Vec<Vec<String>> = self
            .rounds
            .iter()
            .zip(self.ns_per_send())
            .enumerate()
            .map(|(i, (r, ns))| {
                vec![
                    (i + 1).to_string(),
                    format!("{ns:.0}"),
                    format!("{:.2}", r.cpu_ns as f64 / 1e9),
                    format!("{:.2}", r.wall_ns as f64 / 1e9),
                    format!("{:.2}", r.loadavg),
                ]
            })
            .collect();
        table(
            &format!(
                "floor: one {}-byte send to each of {} loopback connections, pinned to CPU {}",
                self.frame, self.conns, self.cpu
            ),
            &["round", "cpu ns/send", "cpu s", "wall s", "load 1m"],
            &rows,
        );
        println!(
            "\n  floor: {:.0} ns per send (median round): {:.2} s of one core for {} sends",
            median(&self.ns_per_send()),
            self.median_s(),
            self.conns
        );
    }

    /// The figures as JSON.
    pub fn json(&self) -> Value {
        let runs: Vec<Value> = self
            .rounds
            .iter()
            .zip(self.ns_per_send())
            .map(|(r, ns)| {
                json!({"cpu_ns_per_send": ns, "cpu_s": r.cpu_ns as f64 / 1e9, "wall_s": r.wall_ns as f64 / 1e9,
                "loadavg": r.loadavg})
            })
            .collect();
        json!({"conns": self.conns, "procs": self.procs, "frame": self.frame, "cpu": self.cpu,
        "setup_s": self.setup_s, "tcp_sockets_inuse": self.sockets, "slab_bytes_per_pair": self.slab_per_pair,
        "tcp_ehash_entries": self.ehash, "rounds": runs, "median_ns": median(&self.ns_per_send()),
        "median_s": self.median_s()})
    }
}
