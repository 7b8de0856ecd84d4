//! `tether load storm`: N subscribers are dropped at once; how long until all are back and
//! resumed, how many attempts that took, and how bunched the reconnects were.
//!
//! Phases of each client: open and subscribe; primed (one message per channel is published over
//! HTTP so every client has a non-zero `from`); dropped (`--trigger cut`: this process resets
//! every socket at once; `--trigger drain`: the server closes with 1012/1001 while draining);
//! reconnecting with full-jitter backoff (docs/protocol.md: sleep uniform in
//! `[0, min(cap, base·2^attempt)]` before each attempt; a close code that forbids reconnecting,
//! §3, ends the client); back (`subscribed` answered the `sub` with `from` and `epoch`, or a
//! `reset` did: both mean the client resumed correctly).
//!
//! The clock starts at the trigger: the cut, the SIGTERM sent to `--server-pid`, or (drain
//! without `--server-pid`: a harness drains and restarts the server while the storm waits) the
//! first close received.
//!
//! Report: `scenario`, `conns`, `trigger`, `connected`, `primed`, `recovered` (clients back),
//! `resets` (of those, resumed through `reset` rather than a gapless replay), `recovery_s`,
//! `attempts`, `failed_attempts`, `peak_reconnects_per_100ms` (attempts started in the busiest
//! 100 ms), `errors` (clients that failed to connect at first, gave up, or got a terminal close
//! code), `error_kinds`, `attempt_error_kinds`, and `restart_pid` when `--restart-cmd` ran.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Semaphore};

use super::args::{StormArgs, Trigger, WsUrl};
use super::idle::STEP_TIMEOUT;
use super::publish::{stamp, HttpPublisher};
use super::report::{round3, Errors, Report};
use super::wire::{scan_str, scan_u64, ConnError, WsConn};
use super::{full_jitter, now_ns, run_id, run_split, share, thread_count, wait_until};

/// Close codes after which a client must not reconnect (docs/protocol.md, close codes).
const TERMINAL_CODES: [u16; 6] = [1002, 1003, 1007, 1008, 1009, 1010];
/// Width of a reconnect-rate bucket, ns.
const BUCKET_NS: u64 = 100_000_000;

/// State shared by the controller and the worker threads.
struct Shared {
    ready: AtomicUsize,
    failed: AtomicUsize,
    primed: AtomicUsize,
    back: AtomicUsize,
    /// Clients that ended without coming back (terminal close code, gave up).
    lost: AtomicUsize,
    first_close_ns: AtomicU64,
    last_back_ns: AtomicU64,
    cut: watch::Sender<bool>,
    stop: watch::Sender<bool>,
}

/// One worker thread's results.
#[derive(Default)]
struct Tally {
    resets: u64,
    attempts: u64,
    failed_attempts: u64,
    /// Attempts started per 100 ms bucket (absolute: ns since the UNIX epoch / 100 ms).
    buckets: HashMap<u64, u64>,
    errors: Errors,
    attempt_errors: Errors,
}

/// Runs the scenario; see the module docs for the report.
pub fn run(args: StormArgs) -> Result<Report, String> {
    if args.conns == 0 {
        return Err("--conns must be at least 1".into());
    }
    let url = args.common.url(&args.url)?;
    let threads = thread_count(args.common.threads);
    let run = run_id();
    let channel_list: Vec<String> = (0..args.channels.max(1)).map(|i| format!("load.storm.{run}.{i}")).collect();
    let permits = (args.common.concurrency / threads).max(1);
    let shared = Arc::new(Shared {
        ready: AtomicUsize::new(0),
        failed: AtomicUsize::new(0),
        primed: AtomicUsize::new(0),
        back: AtomicUsize::new(0),
        lost: AtomicUsize::new(0),
        first_close_ns: AtomicU64::new(0),
        last_back_ns: AtomicU64::new(0),
        cut: watch::channel(false).0,
        stop: watch::channel(false).0,
    });

    let worker = |t: usize| {
        let (shared, url, channels) = (shared.clone(), url.clone(), channel_list.clone());
        let sources = args.common.sources.clone();
        let backoff = (args.backoff_base, args.backoff_cap);
        async move {
            let tally = Rc::new(RefCell::new(Tally::default()));
            let gate = Arc::new(Semaphore::new(permits));
            let mut tasks = Vec::new();
            for index in share(args.conns, 0, 1, t, threads) {
                let client = Client {
                    url: url.clone(),
                    source: sources.as_ref().map(|s| s.pick(index)),
                    channel: channels[index % channels.len()].clone(),
                    last: 0,
                    epoch: String::new(),
                    backoff,
                };
                let (gate, tally, shared) = (gate.clone(), tally.clone(), shared.clone());
                tasks.push(tokio::task::spawn_local(client.run(gate, tally, shared)));
            }
            for task in tasks {
                let _ = task.await;
            }
            Rc::try_unwrap(tally).map(RefCell::into_inner).unwrap_or_default()
        }
    };

    let controller = || {
        let (shared, url, args, channel_list) = (shared.clone(), url.clone(), args.clone(), channel_list.clone());
        async move {
            let result = control(&args, &url, &channel_list, &shared).await;
            let _ = shared.stop.send(true);
            result
        }
    };
    let (tallies, controlled) = run_split(threads, worker, controller)?;
    let c = controlled?;
    let mut total = Tally::default();
    for t in tallies {
        total.resets += t.resets;
        total.attempts += t.attempts;
        total.failed_attempts += t.failed_attempts;
        for (b, n) in t.buckets {
            *total.buckets.entry(b).or_insert(0) += n;
        }
        total.errors.merge(&t.errors);
        total.attempt_errors.merge(&t.attempt_errors);
    }
    let ready = shared.ready.load(Ordering::Relaxed);
    let back = shared.back.load(Ordering::Relaxed);
    let last_back = shared.last_back_ns.load(Ordering::Relaxed);
    let recovery_s = match c.t0_ns {
        Some(t0) if back > 0 => round3(last_back.saturating_sub(t0) as f64 / 1e9),
        _ => 0.0,
    };
    let failed = shared.failed.load(Ordering::Relaxed);
    let errors = (failed + ready - back) as u64;
    let mut r = Report::new("storm");
    r.set("conns", args.conns)
        .set("trigger", if args.trigger == Trigger::Cut { "cut" } else { "drain" })
        .set("connected", ready)
        .set("primed", shared.primed.load(Ordering::Relaxed))
        .set("recovered", back)
        .set("resets", total.resets)
        .set("recovery_s", recovery_s)
        .set("attempts", total.attempts)
        .set("failed_attempts", total.failed_attempts)
        .set("peak_reconnects_per_100ms", total.buckets.values().copied().max().unwrap_or(0))
        .set("errors", errors)
        .set("error_kinds", total.errors.to_json())
        .set("attempt_error_kinds", total.attempt_errors.to_json());
    if let Some(pid) = c.restart_pid {
        r.set("restart_pid", pid);
    }
    if let Some(why) = c.problem {
        r.set("problem", why);
    }
    r.ok = errors == 0 && c.t0_ns.is_some();
    Ok(r)
}

/// What the controller did.
struct Controlled {
    /// When the drop happened (ns since the UNIX epoch); None if it never did.
    t0_ns: Option<u64>,
    restart_pid: Option<u32>,
    problem: Option<String>,
}

async fn control(args: &StormArgs, url: &WsUrl, channels: &[String], shared: &Shared) -> Result<Controlled, String> {
    let n = args.conns;
    wait_until(Duration::MAX, || shared.ready.load(Ordering::Relaxed) + shared.failed.load(Ordering::Relaxed) >= n)
        .await;
    let ready = shared.ready.load(Ordering::Relaxed);
    let mut http = HttpPublisher::connect(url).await.map_err(|e| format!("priming publish: {e}"))?;
    for (k, ch) in channels.iter().enumerate() {
        match http.post(ch, stamp(k as u64 + 1, 0).as_bytes()).await {
            Ok((200..=299, _)) => {}
            Ok((code, body)) => {
                return Err(format!("priming publish answered {code}: {}", String::from_utf8_lossy(&body)))
            }
            Err(e) => return Err(format!("priming publish: {e}")),
        }
    }
    drop(http);
    wait_until(STEP_TIMEOUT, || shared.primed.load(Ordering::Relaxed) >= ready).await;
    eprintln!("storm: {ready} subscribers connected and primed; triggering {:?}", args.trigger);
    let mut out = Controlled { t0_ns: None, restart_pid: None, problem: None };
    match (args.trigger, args.server_pid) {
        (Trigger::Cut, _) => {
            out.t0_ns = Some(now_ns());
            let _ = shared.cut.send(true);
        }
        (Trigger::Drain, Some(pid)) => {
            out.t0_ns = Some(now_ns());
            // SAFETY: kill(2) with a pid the operator named; a bad pid only fails.
            if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
                return Err(format!("cannot SIGTERM --server-pid {pid}: {}", std::io::Error::last_os_error()));
            }
            if let Some(cmd) = &args.restart_cmd {
                // One port, one process: the replacement would refuse to start while the old
                // server still listens, and a draining server closes its listeners at once.
                wait_until(STEP_TIMEOUT, || !listening(url.addr)).await;
                out.restart_pid = Some(spawn_restart(cmd)?);
            }
        }
        (Trigger::Drain, None) => {
            if wait_until(args.timeout, || shared.first_close_ns.load(Ordering::Relaxed) != 0).await {
                out.t0_ns = Some(shared.first_close_ns.load(Ordering::Relaxed));
            } else {
                out.problem = Some("no connection was closed: nothing drained the server".into());
                return Ok(out);
            }
        }
    }
    let everyone = || shared.back.load(Ordering::Relaxed) + shared.lost.load(Ordering::Relaxed) >= ready;
    if !wait_until(args.timeout, everyone).await {
        out.problem = Some(format!("not all clients were back within {:?}", args.timeout));
    }
    Ok(out)
}

/// Whether something accepts TCP connections on `addr` (a connect that is not refused).
fn listening(addr: std::net::SocketAddr) -> bool {
    std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(100)).is_ok()
}

/// Starts `sh -c cmd` with its stdout on this process's stderr (stdout carries the report);
/// returns its pid. It is not waited for: the replacement server outlives this run.
fn spawn_restart(cmd: &str) -> Result<u32, String> {
    let stderr = std::io::stderr().as_fd().try_clone_to_owned().map_err(|e| format!("--restart-cmd: {e}"))?;
    let child = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(stderr))
        .spawn()
        .map_err(|e| format!("--restart-cmd: {e}"))?;
    Ok(child.id())
}

/// One storm subscriber.
struct Client {
    url: WsUrl,
    source: Option<IpAddr>,
    channel: String,
    /// Last seq processed on `channel` (the `from` of the next subscribe).
    last: u64,
    /// The channel's epoch from the last `subscribed` / `reset`.
    epoch: String,
    backoff: (Duration, Duration),
}

/// How a subscribe attempt was answered.
enum Answer {
    Subscribed,
    Reset,
}

impl Client {
    async fn run(mut self, gate: Arc<Semaphore>, tally: Rc<RefCell<Tally>>, shared: Arc<Shared>) {
        let opened = {
            let Ok(_permit) = gate.acquire().await else { return };
            self.open(false).await
        };
        let mut conn = match opened {
            Ok((conn, _)) => conn,
            Err(e) => {
                shared.failed.fetch_add(1, Ordering::Relaxed);
                tally.borrow_mut().errors.add(e.kind());
                return;
            }
        };
        shared.ready.fetch_add(1, Ordering::Relaxed);
        let mut cut = shared.cut.subscribe();
        let mut stop = shared.stop.subscribe();
        // Live until the drop.
        let dropped = loop {
            let before = self.last;
            let mut seen = self.last;
            tokio::select! {
                r = conn.recv(|m| if scan_str(m, "op") == Some(b"msg") {
                    seen = seen.max(scan_u64(m, "seq").unwrap_or(0));
                }) => {
                    self.last = seen;
                    if let Err(e) = r {
                        break Some(e);
                    }
                }
                _ = cut.wait_for(|c| *c) => break None,
                _ = stop.wait_for(|s| *s) => return,
            }
            if before == 0 && self.last > 0 {
                shared.primed.fetch_add(1, Ordering::Relaxed);
            }
        };
        match dropped {
            None => conn.reset(),
            Some(e) => {
                // Free the descriptor before reconnecting: N clients must fit in N fds.
                drop(conn);
                let _ = shared.first_close_ns.compare_exchange(0, now_ns(), Ordering::Relaxed, Ordering::Relaxed);
                if TERMINAL_CODES.contains(&e.close_code()) {
                    shared.lost.fetch_add(1, Ordering::Relaxed);
                    tally.borrow_mut().errors.add(e.kind());
                    return;
                }
            }
        }
        // Reconnect with full jitter until back or told to stop.
        let mut attempt = 0u32;
        let mut conn = loop {
            let pause = full_jitter(self.backoff.0, self.backoff.1, attempt);
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.wait_for(|s| *s) => {
                    shared.lost.fetch_add(1, Ordering::Relaxed);
                    tally.borrow_mut().errors.add("gave_up".into());
                    return;
                }
            }
            let started = now_ns();
            {
                let mut t = tally.borrow_mut();
                t.attempts += 1;
                *t.buckets.entry(started / BUCKET_NS).or_insert(0) += 1;
            }
            match self.open(true).await {
                Ok((conn, answer)) => {
                    if matches!(answer, Answer::Reset) {
                        tally.borrow_mut().resets += 1;
                    }
                    shared.last_back_ns.fetch_max(now_ns(), Ordering::Relaxed);
                    shared.back.fetch_add(1, Ordering::Relaxed);
                    break conn;
                }
                Err(e) => {
                    let mut t = tally.borrow_mut();
                    t.failed_attempts += 1;
                    t.attempt_errors.add(e.kind());
                    attempt = attempt.saturating_add(1);
                }
            }
        };
        // Back: stay connected (answering pings) until the run ends.
        tokio::select! {
            _ = async { while conn.recv(|_| {}).await.is_ok() {} } => {}
            _ = stop.wait_for(|s| *s) => {}
        }
    }

    /// Connects and subscribes (with `from` and `epoch` when `resume`); returns once
    /// `subscribed` or `reset` arrived. Records the epoch and the head.
    async fn open(&mut self, resume: bool) -> Result<(WsConn, Answer), ConnError> {
        let mut conn = WsConn::connect_within(&self.url, self.source, STEP_TIMEOUT).await?;
        let sub = if resume {
            serde_json::json!({"op": "sub", "ch": self.channel, "from": self.last, "epoch": self.epoch})
        } else {
            serde_json::json!({"op": "sub", "ch": self.channel})
        };
        conn.send_text(sub.to_string().as_bytes()).await?;
        let wait = async {
            loop {
                let mut answer: Option<Result<Answer, ConnError>> = None;
                let mut epoch = None;
                let mut last = self.last;
                conn.recv(|m| match scan_str(m, "op") {
                    Some(b"subscribed") if answer.is_none() => {
                        epoch = scan_str(m, "epoch").map(<[u8]>::to_vec);
                        if !resume {
                            // A fresh subscription is live from the head on.
                            last = scan_u64(m, "seq").unwrap_or(0);
                        }
                        answer = Some(Ok(Answer::Subscribed));
                    }
                    Some(b"reset") if answer.is_none() => {
                        epoch = scan_str(m, "epoch").map(<[u8]>::to_vec);
                        // Live messages continue at reset.seq + 1 (docs/protocol.md, resume).
                        last = scan_u64(m, "seq").unwrap_or(0);
                        answer = Some(Ok(Answer::Reset));
                    }
                    Some(b"msg") => last = last.max(scan_u64(m, "seq").unwrap_or(0)),
                    Some(b"error") if answer.is_none() => {
                        answer = Some(Err(ConnError::Protocol("server refused the subscription")))
                    }
                    _ => {}
                })
                .await?;
                self.last = last;
                if let Some(e) = epoch {
                    self.epoch = String::from_utf8_lossy(&e).into_owned();
                }
                if let Some(a) = answer {
                    return a;
                }
            }
        };
        let answer = tokio::time::timeout(STEP_TIMEOUT, wait).await.unwrap_or(Err(ConnError::Timeout))?;
        Ok((conn, answer))
    }
}
