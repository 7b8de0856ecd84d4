//! Helpers for the delivery-guarantee tests (issue 4): a TCP relay whose connections the test
//! can cut with a RST, `tether sub --append-to` child processes, a paced HTTP publisher, and
//! readers of the subscriber's output file.
//!
//! Every wait here is bounded; a helper that runs out of time panics with what it saw.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::common::{check, eventually, eventually_sync, find, HttpConn};

/// Timestamps of one relayed connection.
#[derive(Debug, Clone, Copy)]
pub struct Relayed {
    /// When the relay accepted the client's TCP connection.
    pub accepted: Instant,
    /// When the first server→client chunk holding a `msg` frame passed through.
    pub first_msg: Option<Instant>,
}

/// A TCP relay between a client and the server: `cut` resets every open connection with a
/// TCP RST (SO_LINGER 0) on both sides, as a NAT or load balancer dropping its state would.
pub struct Relay {
    pub addr: SocketAddr,
    cuts: watch::Sender<u64>,
    conns: Arc<Mutex<Vec<Relayed>>>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Listens on 127.0.0.1:0 and relays every accepted connection to `target`.
    pub async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("relay bind");
        let addr = listener.local_addr().unwrap();
        let (cuts, _) = watch::channel(0u64);
        let conns: Arc<Mutex<Vec<Relayed>>> = Arc::default();
        let (cuts2, conns2) = (cuts.clone(), conns.clone());
        let accept_task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { return };
                let accepted = Instant::now();
                let Ok(server) = TcpStream::connect(target).await else {
                    // Let the client see a reset, as it would with the server down.
                    let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let index = {
                    let mut all = conns2.lock().unwrap();
                    all.push(Relayed { accepted, first_msg: None });
                    all.len() - 1
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let mut cut_up = cuts2.subscribe();
                cut_up.borrow_and_update();
                let mut cut_down = cut_up.clone();
                tokio::spawn(async move { pump(cr, sw, &mut cut_up, None).await });
                let watch = Some((conns2.clone(), index));
                tokio::spawn(async move { pump(sr, cw, &mut cut_down, watch).await });
            }
        });
        Relay { addr, cuts, conns, accept_task }
    }

    /// `ws://RELAY/ws`.
    pub fn ws_url(&self) -> String {
        format!("ws://{}/ws", self.addr)
    }

    /// Resets every connection open now with a TCP RST on both sides. Returns the instant.
    pub fn cut(&self) -> Instant {
        let now = Instant::now();
        self.cuts.send_modify(|n| *n += 1);
        now
    }

    /// Connections accepted so far.
    pub fn accepts(&self) -> usize {
        self.conns.lock().unwrap().len()
    }

    /// Timestamps of every connection so far, in accept order.
    pub fn conns(&self) -> Vec<Relayed> {
        self.conns.lock().unwrap().clone()
    }

    /// Waits until at least `n` connections were accepted.
    pub async fn wait_accepts(&self, n: usize, limit: Duration) {
        eventually(limit, &format!("the relay accepting {n} connections"), || async {
            check(self.accepts() >= n, || self.accepts())
        })
        .await
    }

    /// Time from `cut` until the first `msg` crossed the relay on a connection accepted after
    /// it: how long the subscriber took to resume (backoff, reconnect, resubscribe, replay).
    pub fn resume_after(&self, cut: Instant) -> Option<Duration> {
        self.conns().iter().filter(|c| c.accepted >= cut).find_map(|c| c.first_msg).map(|t| t - cut)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept_task.abort();
        self.cuts.send_modify(|n| *n += 1);
    }
}

/// Copies one direction until EOF, an error, or a cut. On a cut, SO_LINGER 0 makes the close
/// of each socket a RST; the socket closes when both of its halves are dropped.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    cut: &mut watch::Receiver<u64>,
    watch: Option<(Arc<Mutex<Vec<Relayed>>>, usize)>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut watch = watch;
    loop {
        tokio::select! {
            _ = cut.changed() => {
                let _ = socket2::SockRef::from(from.as_ref()).set_linger(Some(Duration::ZERO));
                let _ = socket2::SockRef::from(to.as_ref()).set_linger(Some(Duration::ZERO));
                return;
            }
            r = from.read(&mut buf) => {
                let n = match r { Ok(0) | Err(_) => return, Ok(n) => n };
                if let Some((conns, i)) = &watch {
                    if find(&buf[..n], b"\"op\":\"msg\"").is_some() {
                        conns.lock().unwrap()[*i].first_msg = Some(Instant::now());
                        watch = None;
                    }
                }
                tokio::select! {
                    _ = cut.changed() => {
                        let _ = socket2::SockRef::from(from.as_ref()).set_linger(Some(Duration::ZERO));
                        let _ = socket2::SockRef::from(to.as_ref()).set_linger(Some(Duration::ZERO));
                        return;
                    }
                    w = to.write_all(&buf[..n]) => if w.is_err() { return },
                }
            }
        }
    }
}

/// A fresh path in the temp dir for an output file (removed first if it exists).
pub fn temp_path(name: &str) -> PathBuf {
    let p =
        std::env::temp_dir().join(format!("tether-it-{}-{name}-{}.jsonl", std::process::id(), rand::random::<u32>()));
    let _ = std::fs::remove_file(&p);
    p
}

/// A `tether sub URL CH --from 0 --append-to FILE` child process; its stderr goes to
/// `FILE.stderr` (appended across restarts). Dropping it SIGKILLs the process.
pub struct SubProc {
    child: Child,
}

impl SubProc {
    pub fn start(url: &str, ch: &str, file: &Path) -> SubProc {
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(file.with_extension("stderr")).expect("sub log");
        let child = Command::new(env!("CARGO_BIN_EXE_tether"))
            .args(["sub", url, ch, "--from", "0", "--append-to"])
            .arg(file)
            .env("TETHER_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn tether sub");
        SubProc { child }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `sig` and waits (bounded) for the process to end.
    pub fn stop(&mut self, sig: i32) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.pid(), sig);
        }
        let what = format!("tether sub {} exiting after signal {sig}", self.pid());
        eventually_sync(Duration::from_secs(10), &what, || match self.child.try_wait() {
            Ok(Some(st)) => Ok(st),
            _ => Err("still running"),
        })
    }

    /// Panics if the process has already exited (it must run until stopped).
    pub fn assert_running(&mut self, file: &Path) {
        if let Ok(Some(st)) = self.child.try_wait() {
            let log = std::fs::read_to_string(file.with_extension("stderr")).unwrap_or_default();
            panic!("tether sub exited early with {st:?}; stderr:\n{log}");
        }
    }
}

impl Drop for SubProc {
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The `seq` of every complete line of a `tether sub` output file, in file order; checks that
/// each line is a `msg` on `ch` whose `data.n` equals its seq.
pub fn read_seqs(file: &Path, ch: &str) -> Vec<u64> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("line {l:?} is not JSON: {e}"));
            assert_eq!(v["op"], "msg", "line {l}");
            assert_eq!(v["ch"], ch, "line {l}");
            let seq = v["seq"].as_u64().unwrap_or_else(|| panic!("no seq in {l}"));
            assert_eq!(v["data"]["n"].as_u64(), Some(seq), "data does not match seq: {l}");
            seq
        })
        .collect()
}

/// The seq of the last complete line of the file (0 when empty), reading only its tail.
pub fn last_seq(file: &Path) -> u64 {
    let Ok(bytes) = std::fs::read(file) else { return 0 };
    let end = match bytes.iter().rposition(|&b| b == b'\n') {
        Some(e) => e,
        None => return 0,
    };
    let start = bytes[..end].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let line = &bytes[start..end];
    find(line, b"\"seq\":").map_or(0, |at| {
        line[at + 6..].iter().take_while(|b| b.is_ascii_digit()).fold(0, |n, d| n * 10 + u64::from(d - b'0'))
    })
}

/// Waits until the file's last line has seq `want`.
pub async fn wait_last_seq(file: &Path, want: u64, limit: Duration) {
    eventually(limit, &format!("the output file ending at seq {want}"), || async {
        let last = last_seq(file);
        check(last == want, || last)
    })
    .await
}

/// Asserts that `seqs` is exactly 1..=n in order (each once), naming the first fault.
pub fn assert_exactly_once(seqs: &[u64], n: u64) {
    let mut seen = vec![0u32; n as usize + 1];
    for &s in seqs {
        assert!((1..=n).contains(&s), "seq {s} out of 1..={n}");
        seen[s as usize] += 1;
    }
    let missing: Vec<u64> = (1..=n).filter(|&s| seen[s as usize] == 0).collect();
    let dups: Vec<u64> = (1..=n).filter(|&s| seen[s as usize] > 1).collect();
    assert!(
        missing.is_empty() && dups.is_empty(),
        "{} lines; missing {} (first {:?}), duplicated {} (first {:?})",
        seqs.len(),
        missing.len(),
        &missing[..missing.len().min(10)],
        dups.len(),
        &dups[..dups.len().min(10)]
    );
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "lines out of order");
    assert_eq!(seqs.len() as u64, n);
}

/// Publishes `{"n":i}` for i in 1..=n on `ch` over one HTTP keep-alive connection at `rate`
/// messages/s, asserting each reply is `{"seq":i}` (the channel must be fresh). `progress`
/// holds the last published seq.
pub async fn publish_paced(addr: SocketAddr, ch: &str, n: u64, rate: f64, progress: Arc<AtomicU64>) {
    let mut http = HttpConn::new(addr).await;
    let path = format!("/publish/{ch}");
    let t0 = tokio::time::Instant::now();
    for i in 1..=n {
        let due = t0 + Duration::from_secs_f64((i - 1) as f64 / rate);
        if due > tokio::time::Instant::now() {
            tokio::time::sleep_until(due).await;
        }
        let (status, body) = http.post(&path, &[], format!("{{\"n\":{i}}}").as_bytes()).await;
        assert_eq!(status, 200, "publish {i}: {}", String::from_utf8_lossy(&body));
        assert_eq!(crate::common::seq_of_reply(&body), i, "publish {i} got another seq");
        progress.store(i, Ordering::Relaxed);
    }
}

/// The median of some durations (0 when empty).
pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}
