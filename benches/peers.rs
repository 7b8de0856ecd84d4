//! tether against peer servers on one box, in one run (docs/benchmarks.md, "Peers"): the
//! bench-peers suites pinned (server on one core, load tool on the other) and the handshake
//! comparison, with ratios tether / best peer.
//!
//! `cargo bench --bench peers`. It needs `../shared/bench-peers` (or `BENCH_PEERS_DIR`), builds
//! it into `target/bench-peers` when its binaries are missing, and runs its `run_bench.py`
//! through `benches/peers/run_peers.py` (which adds the uWebSockets peer) with `--pin`:
//! - fanout: 10,000 subscribers, 64 B, 10 and 100 msg/s, p50/p99 of publish-to-receive;
//! - max: the ladder of publish rates, highest with nothing lost and p99 < 1 s, confirmed;
//! - handshakes: each server alone on the server core, `tether load connect --conns N
//!   --concurrency 128 --threads 1` on the other; the server's CPU (utime + stime of
//!   /proc/PID/stat) over the run divided by the handshakes, in µs.
//!
//! Medians of `PEERS_RUNS` runs each. The fan-out runs and the handshake rounds are interleaved
//! (round 1 of every peer, then round 2, …), so the box's drift during the bench falls on every
//! peer alike; the max ladders run peer after peer. Env: PEERS_LIST ("tether,tokio-tungstenite,uwebsockets";
//! fastwebsockets is the other bench-peers server), PEERS_SUITES ("fanout,max,handshake"; also any
//! run_bench.py suite such as `rate-N` or `maxat-N`), PEERS_RUNS (3), PEERS_DURATION (seconds of
//! publishing per fan-out run, 10), PEERS_PIN ("0:1", server CPU : load CPU), PEERS_LADDER
//! (run_bench.py's default), PEERS_HANDSHAKES (20000 per round), UWS_SRC (a uWebSockets tree with
//! uSockets/ inside, as `git clone --recursive` gives; without it the uWS peer is skipped, and the
//! bench says so), PEERS_BASE_BIN (another `tether` binary, e.g. a build of `main`: measured as
//! `tether-base` right after `tether`, with a column tether / tether-base). The box may be
//! shared: before each run both parts wait up to PEERS_QUIET_WAIT seconds (120) for the host to
//! use less than 15 % of a core, and repeat a run during which other processes used more than
//! PEERS_MAX_OTHER % of a core (15) up to PEERS_RETRIES times (2); the JSON keeps every attempt
//! with its `other_cpu_pct`, and the table uses the valid ones (all, when none is). Writes `target/bench/peers.json` and the raw run_bench lines to
//! `target/bench/peers.jsonl`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// What a run measures, from the environment (see the module docs).
struct Knobs {
    peers: Vec<String>,
    suites: Vec<String>,
    runs: usize,
    duration: f64,
    server_cpu: String,
    load_cpu: String,
    ladder: Option<String>,
    handshakes: usize,
    quiet_wait: f64,
    max_other: f64,
    retries: usize,
}

impl Knobs {
    fn read() -> Knobs {
        let list = |name: &str, default: &str| -> Vec<String> {
            let v = std::env::var(name).unwrap_or_else(|_| default.to_string());
            v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
        };
        let pin = std::env::var("PEERS_PIN").unwrap_or_else(|_| "0:1".into());
        let Some((server_cpu, load_cpu)) = pin.split_once(':') else {
            panic!("PEERS_PIN: expected SERVER_CPU:LOAD_CPU, got {pin:?}")
        };
        Knobs {
            peers: list("PEERS_LIST", "tether,tokio-tungstenite,uwebsockets"),
            suites: list("PEERS_SUITES", "fanout,max,handshake"),
            runs: env_or("PEERS_RUNS", 3),
            duration: env_or("PEERS_DURATION", 10.0),
            server_cpu: server_cpu.trim().to_string(),
            load_cpu: load_cpu.trim().to_string(),
            ladder: std::env::var("PEERS_LADDER").ok(),
            handshakes: env_or("PEERS_HANDSHAKES", 20000),
            quiet_wait: env_or("PEERS_QUIET_WAIT", 120.0),
            max_other: env_or("PEERS_MAX_OTHER", 15.0),
            retries: env_or("PEERS_RETRIES", 2),
        }
    }
}

/// Where bench-peers is and where its binaries go.
struct Peers {
    /// The bench-peers source tree (run_bench.py, the peers, wsbench).
    dir: PathBuf,
    /// `target/bench-peers/release`.
    bin: PathBuf,
    /// The uWebSockets peer, when built.
    uws: Option<PathBuf>,
    /// The `tether-base` binary (`PEERS_BASE_BIN`, copied to `target/bench/peers-base.tether`).
    base: Option<PathBuf>,
}

impl Peers {
    /// The command that starts `peer` on `port` pinned to `cpu`, as run_bench.py starts it
    /// with `--pin` (tether with one core).
    fn command(&self, peer: &str, port: u16, cpu: &str) -> Command {
        let mut c = Command::new("taskset");
        c.args(["-c", cpu]);
        match peer {
            "tether" => {
                c.arg(bin()).args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--cores", "1"]);
            }
            "tether-base" => {
                c.arg(self.base.as_ref().expect("PEERS_BASE_BIN set"));
                c.args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--cores", "1"]);
            }
            "uwebsockets" => {
                c.arg(self.uws.as_ref().expect("uWS peer built")).arg(port.to_string());
            }
            other => {
                c.arg(self.bin.join(format!("peer-{other}"))).arg(port.to_string());
            }
        }
        c
    }
}

fn main() {
    if !should_run() {
        return;
    }
    pin_binary("peers");
    let k = Knobs::read();
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir =
        std::env::var("BENCH_PEERS_DIR").map(PathBuf::from).unwrap_or_else(|_| manifest.join("../shared/bench-peers"));
    if !dir.join("run_bench.py").is_file() {
        println!("peers: skipped: no bench-peers at {} (set BENCH_PEERS_DIR)", dir.display());
        return;
    }
    let bin = build_bench_peers(&dir);
    let uws = build_uws(&manifest);
    let base = std::env::var("PEERS_BASE_BIN").ok().map(|b| {
        let copy = bench_file("peers-base.tether");
        std::fs::copy(&b, &copy).unwrap_or_else(|e| panic!("PEERS_BASE_BIN: cannot copy {b}: {e}"));
        copy
    });
    let peers = Peers { dir, bin, uws, base };
    let mut names: Vec<String> = Vec::new();
    for p in &k.peers {
        if p == "uwebsockets" && peers.uws.is_none() {
            println!("peers: uwebsockets skipped: set UWS_SRC to a uWebSockets source tree (see docs/benchmarks.md)");
            continue;
        }
        names.push(p.clone());
        if p == "tether" && peers.base.is_some() {
            names.push("tether-base".into());
        }
    }
    let started = unix_ns();
    let load_before = loadavg();
    let jsonl = bench_file("peers.jsonl");
    let _ = std::fs::remove_file(&jsonl);
    let suites: Vec<&String> = k.suites.iter().filter(|s| s.as_str() != "handshake").collect();
    if !suites.is_empty() {
        run_suites(&peers, &k, &names, &suites, &jsonl);
    }
    let records: Vec<Value> = std::fs::read_to_string(&jsonl)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let handshakes: Vec<(String, Vec<Value>)> =
        if k.suites.iter().any(|s| s == "handshake") { handshake_rounds(&peers, &k, &names) } else { Vec::new() };
    let summary = summarize(&names, &records, &handshakes);
    print_table(&k, &names, &summary);
    println!(
        "\n  box: load average {load_before:.2} before, {:.2} after; {} cores; {} allocator",
        loadavg(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        allocator()
    );
    write_json(
        "peers",
        &json!({
            "started_ns": started, "ended_ns": unix_ns(), "loadavg_before": load_before, "loadavg_after": loadavg(),
            "pin": format!("{}:{}", k.server_cpu, k.load_cpu), "runs": k.runs, "duration_s": k.duration,
            "handshakes_per_round": k.handshakes, "peers": names, "summary": summary,
            "run_bench": records,
            "handshake": handshakes.iter().map(|(p, r)| json!({"peer": p, "rounds": r})).collect::<Vec<_>>(),
        }),
    );
}

/// `target/bench-peers/release` with wsbench and the peers, built from `dir` when one is missing.
fn build_bench_peers(dir: &Path) -> PathBuf {
    let out = target_dir().join("bench-peers");
    let bin = out.join("release");
    let wanted = ["wsbench", "peer-tokio-tungstenite", "peer-fastwebsockets"];
    if wanted.iter().all(|b| bin.join(b).is_file()) {
        return bin;
    }
    println!("peers: building bench-peers into {}", out.display());
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&out)
        .status()
        .expect("run cargo build for bench-peers");
    assert!(status.success(), "building bench-peers failed: {status}");
    bin
}

/// The uWebSockets peer (benches/peers/uws) built by make into `target/bench/uws`, or `None`
/// when `UWS_SRC` is unset or does not hold uWS with uSockets.
fn build_uws(manifest: &Path) -> Option<PathBuf> {
    let src = PathBuf::from(std::env::var("UWS_SRC").ok()?);
    if !src.join("src/App.h").is_file() || !src.join("uSockets/src/libusockets.h").is_file() {
        println!("peers: UWS_SRC={} does not hold src/App.h and uSockets/src/libusockets.h", src.display());
        return None;
    }
    let out = bench_file("uws");
    println!("peers: building the uWebSockets peer from {} into {}", src.display(), out.display());
    let status = Command::new("make")
        .arg("-C")
        .arg(manifest.join("benches/peers/uws"))
        .arg(format!("UWS_SRC={}", src.display()))
        .arg(format!("OUT={}", out.display()))
        .status()
        .expect("run make for the uWebSockets peer");
    assert!(status.success(), "building the uWebSockets peer failed: {status}");
    Some(out.join("uws-broadcast"))
}

/// Runs run_bench.py (through run_peers.py) for `names` and `suites`, pinned, appending to
/// `jsonl`; its per-run lines go to the terminal. Suites of repeated runs at a fixed rate
/// (`fanout`, `rate-N`) are interleaved: round by round, each peer once per round (run_bench.py
/// with `--runs 1`), so a box whose speed drifts during the bench moves every peer's runs alike
/// instead of one peer's block. Searches (`max`, `maxat-N`, `idle`) run peer after peer.
fn run_suites(peers: &Peers, k: &Knobs, names: &[String], suites: &[&String], jsonl: &Path) {
    let (fixed, searches): (Vec<&String>, Vec<&String>) =
        suites.iter().partition(|s| s.as_str() == "fanout" || s.starts_with("rate-"));
    // run_bench.py takes listener ports upward from --port, one per run; each call its own range.
    let mut port = 9200;
    if !fixed.is_empty() {
        for round in 0..k.runs {
            for p in names {
                println!("\npeers: round {} of {}, {p}", round + 1, k.runs);
                run_bench(peers, k, std::slice::from_ref(p), &fixed, 1, port, jsonl);
                port += 100;
            }
        }
    }
    if !searches.is_empty() {
        run_bench(peers, k, names, &searches, k.runs, port, jsonl);
    }
}

/// One run_peers.py call: `runs` runs of each of `suites` for each of `names`, listener ports
/// from `port` + 1 upward.
fn run_bench(peers: &Peers, k: &Knobs, names: &[String], suites: &[&String], runs: usize, port: u16, jsonl: &Path) {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut c = Command::new("python3");
    c.arg(manifest.join("benches/peers/run_peers.py"))
        .args(["--peers", &names.join(",")])
        .args(["--suites", &suites.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(",")])
        .args(["--runs", &runs.to_string(), "--duration", &k.duration.to_string()])
        .args(["--pin", &format!("{}:{}", k.server_cpu, k.load_cpu)])
        .args(["--quiet-wait", &k.quiet_wait.to_string(), "--max-other", &k.max_other.to_string()])
        .args(["--retries", &k.retries.to_string(), "--port", &port.to_string()])
        .arg("--out")
        .arg(jsonl)
        .env("BENCH_PEERS_DIR", &peers.dir)
        .env("BENCH_PEERS_BIN", &peers.bin)
        .env("TETHER_BIN", bin());
    if let Some(ladder) = &k.ladder {
        c.args(["--ladder", ladder]);
    }
    if let Some(uws) = &peers.uws {
        c.env("UWS_BIN", uws);
    }
    if let Some(base) = &peers.base {
        c.env("TETHER_BASE_BIN", base);
    }
    println!("\n$ {c:?}");
    let status = c.status().expect("run python3 run_peers.py");
    if !status.success() {
        println!("peers: run_bench.py ended with {status}; summarizing what it wrote");
    }
}

/// A port free on 127.0.0.1 right now.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local address").port()
}

/// Busy jiffies and all jiffies of the host (first line of /proc/stat).
fn host_jiffies() -> (u64, u64) {
    let line = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> =
        line.lines().next().unwrap_or("").split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let busy = [0, 1, 2, 5, 6].iter().filter_map(|&i| f.get(i)).sum();
    (busy, f.iter().take(8).sum())
}

/// CPU seconds of the reaped children of this process (the finished load runs).
fn children_cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Waits (up to `limit` seconds) until the host has used less than 15 % of one core over 2 s,
/// as run_bench.py does before each run; returns the seconds waited and the last reading (% of
/// one core).
fn wait_quiet(limit: f64) -> (f64, f64) {
    let started = Instant::now();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    loop {
        let (b0, t0) = host_jiffies();
        std::thread::sleep(Duration::from_secs(2));
        let (b1, t1) = host_jiffies();
        let busy = 100.0 * (b1 - b0) as f64 / (t1 - t0).max(1) as f64 * cores;
        if busy <= 15.0 || started.elapsed().as_secs_f64() >= limit {
            return (started.elapsed().as_secs_f64(), busy);
        }
    }
}

/// Starts `peer` pinned to the server core and waits (up to 10 s) until it accepts.
fn start_peer(peers: &Peers, k: &Knobs, peer: &str) -> (Child, u16) {
    let port = free_port();
    let mut child = peers
        .command(peer, port, &k.server_cpu)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {peer}: {e}"));
    let up = within_sync(Duration::from_secs(10), || {
        if let Ok(Some(status)) = child.try_wait() {
            return Ok(Err(format!("{peer} exited: {status}")));
        }
        std::net::TcpStream::connect(("127.0.0.1", port)).map(|_| Ok(())).map_err(|e| e.to_string())
    });
    match up {
        Ok(Ok(())) => (child, port),
        Ok(Err(why)) => panic!("{why}"),
        Err(why) => {
            terminate(&mut child, Duration::from_secs(5));
            panic!("{peer} did not accept on 127.0.0.1:{port} within 10 s: {why}")
        }
    }
}

/// `PEERS_RUNS` rounds of handshakes, each peer once per round (interleaved, as the fan-out
/// runs are) on a fresh server; a round is repeated (up to `PEERS_RETRIES` times) when other
/// processes used more than `PEERS_MAX_OTHER` % of a core during it. Per peer, one JSON object
/// per round (its last attempt).
fn handshake_rounds(peers: &Peers, k: &Knobs, names: &[String]) -> Vec<(String, Vec<Value>)> {
    let mut rounds: Vec<(String, Vec<Value>)> = names.iter().map(|p| (p.clone(), Vec::new())).collect();
    for round in 0..k.runs {
        for (peer, done) in rounds.iter_mut() {
            let mut last = Value::Null;
            for attempt in 0..=k.retries {
                last = handshake_round(peers, k, peer);
                last["round"] = json!(round);
                last["attempt"] = json!(attempt);
                let other = num(&last, "other_cpu_pct");
                println!(
                    "{peer}:handshake round {round}: {:.1} µs/handshake (server {:.0}% cli {:.0}% other {other:.0}%), {} of {} ok, {} /s",
                    num(&last, "server_us_per_handshake"),
                    num(&last, "server_cpu_pct"),
                    num(&last, "client_cpu_pct"),
                    num(&last, "ok"),
                    k.handshakes,
                    num(&last, "handshakes_per_s"),
                );
                if last["valid"].as_bool() == Some(true) {
                    break;
                }
                println!("   (contended: other processes used {other:.0}% CPU; retrying)");
            }
            done.push(last);
        }
    }
    rounds
}

/// One round: a fresh pinned server, `tether load connect` pinned on the other core, the
/// server's CPU from /proc/PID/stat before and after.
fn handshake_round(peers: &Peers, k: &Knobs, peer: &str) -> Value {
    let (waited, pre_busy) = wait_quiet(k.quiet_wait);
    let (mut server, port) = start_peer(peers, k, peer);
    let pid = server.id() as i32;
    let url = format!("ws://127.0.0.1:{port}/ws");
    let args = [
        "load",
        "connect",
        &url,
        "--conns",
        &k.handshakes.to_string(),
        "--concurrency",
        "128",
        "--threads",
        "1",
        "--sources",
        "127.0.0.2-127.0.0.254",
    ];
    let (cpu0, cli0, host0, t0) = (cpu_seconds(pid), children_cpu_seconds(), host_jiffies(), Instant::now());
    let out = Command::new("taskset")
        .args(["-c", &k.load_cpu])
        .arg(bin())
        .args(args)
        .env("TETHER_LOG", "warn")
        .stderr(Stdio::null())
        .output()
        .expect("run tether load connect");
    let (cpu1, cli1, host1, wall) =
        (cpu_seconds(pid), children_cpu_seconds(), host_jiffies(), t0.elapsed().as_secs_f64());
    terminate(&mut server, Duration::from_secs(5));
    let report: Value = String::from_utf8_lossy(&out.stdout)
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or(Value::Null);
    let server_s = cpu1.unwrap_or(f64::NAN) - cpu0.unwrap_or(f64::NAN);
    let client_s = cli1 - cli0;
    let tick = 1.0 / 100.0; // USER_HZ on Linux: what /proc/stat counts in
    let host_s = (host1.0 - host0.0) as f64 * tick;
    let other_pct = ((host_s - server_s - client_s) / wall * 100.0).max(0.0);
    let ok = num(&report, "ok");
    json!({
        "peer": peer, "conns": k.handshakes, "ok": ok, "errors": report.get("errors"),
        "handshakes_per_s": num(&report, "handshakes_per_s"), "p99_ms": num(&report, "p99_ms"),
        "server_cpu_s": server_s, "client_cpu_s": client_s, "wall_s": wall,
        "server_us_per_handshake": if ok > 0.0 { server_s / ok * 1e6 } else { f64::NAN },
        "server_cpu_pct": server_s / wall * 100.0, "client_cpu_pct": client_s / wall * 100.0,
        "other_cpu_pct": other_pct, "valid": other_pct <= k.max_other && ok > 0.0,
        "quiet_wait_s": waited, "pre_busy_pct": pre_busy,
        "command": format!("taskset -c {} tether {}", k.load_cpu, args.join(" ")),
    })
}

/// One figure of the summary: its name, whether lower is better, and a value per peer.
type Row = (&'static str, bool, Vec<f64>);

/// Valid records of `peer` with `label` (all of them when none is valid: the table then shows
/// a contended figure rather than none, and the JSON says which).
fn runs_of<'a>(records: &'a [Value], peer: &str, label: &str) -> Vec<&'a Value> {
    let all: Vec<&Value> = records.iter().filter(|r| r["peer"] == peer && r["label"] == label).collect();
    let valid: Vec<&Value> = all.iter().copied().filter(|r| r["valid"].as_bool() == Some(true)).collect();
    if valid.is_empty() {
        all
    } else {
        valid
    }
}

fn lat_ms(runs: &[&Value], q: &str) -> f64 {
    median(&runs.iter().map(|r| num(&r["lat_us"], q) / 1000.0).collect::<Vec<_>>())
}

/// The rows of the table: latencies at 10 and 100 msg/s, the confirmed max rate (the last
/// rate run_bench.py's `max` suite confirmed) with its deliveries/s and p99, server CPU per
/// handshake.
fn summarize(names: &[String], records: &[Value], handshakes: &[(String, Vec<Value>)]) -> Vec<Row> {
    let per = |f: &dyn Fn(&str) -> f64| names.iter().map(|p| f(p)).collect::<Vec<f64>>();
    let max_runs = |p: &str| -> Vec<&Value> {
        let confirmed: Vec<&Value> = records.iter().filter(|r| r["peer"] == p && r["suite"] == "max").collect();
        let Some(last) = confirmed.last() else { return Vec::new() };
        let label = last["label"].clone();
        runs_of(records, p, label.as_str().unwrap_or(""))
    };
    let hs = |p: &str| -> f64 {
        let rounds = handshakes.iter().find(|(n, _)| n == p).map(|(_, r)| r.as_slice()).unwrap_or(&[]);
        let valid: Vec<&Value> = rounds.iter().filter(|r| r["valid"].as_bool() == Some(true)).collect();
        let used: Vec<&Value> = if valid.is_empty() { rounds.iter().collect() } else { valid };
        median(&used.iter().map(|r| num(r, "server_us_per_handshake")).collect::<Vec<_>>())
    };
    vec![
        ("p50 ms at 10 msg/s", true, per(&|p| lat_ms(&runs_of(records, p, "rate-10"), "p50"))),
        ("p99 ms at 10 msg/s", true, per(&|p| lat_ms(&runs_of(records, p, "rate-10"), "p99"))),
        ("p50 ms at 100 msg/s", true, per(&|p| lat_ms(&runs_of(records, p, "rate-100"), "p50"))),
        ("p99 ms at 100 msg/s", true, per(&|p| lat_ms(&runs_of(records, p, "rate-100"), "p99"))),
        (
            "max msg/s (p99 < 1 s, none lost)",
            false,
            per(&|p| median(&max_runs(p).iter().map(|r| num(r, "pub_rate")).collect::<Vec<_>>())),
        ),
        (
            "deliveries/s at max",
            false,
            per(&|p| median(&max_runs(p).iter().map(|r| num(r, "deliveries_per_s")).collect::<Vec<_>>())),
        ),
        ("p99 ms at max", true, per(&|p| lat_ms(&max_runs(p), "p99"))),
        ("server µs CPU per handshake", true, per(&|p| hs(p))),
    ]
}

/// tether's figure over the best peer's (lowest where lower is better, else highest; tether
/// builds are not peers); NaN when either is missing.
fn ratio(names: &[String], lower_better: bool, values: &[f64]) -> (f64, String) {
    let Some(t) = names.iter().position(|n| n == "tether") else { return (f64::NAN, "-".into()) };
    let best = names.iter().zip(values).filter(|(n, v)| !n.starts_with("tether") && !v.is_nan()).min_by(|a, b| {
        if lower_better {
            a.1.total_cmp(b.1)
        } else {
            b.1.total_cmp(a.1)
        }
    });
    match best {
        Some((n, v)) if !values[t].is_nan() => (values[t] / v, n.clone()),
        _ => (f64::NAN, "-".into()),
    }
}

fn print_table(k: &Knobs, names: &[String], rows: &[Row]) {
    let at = |name: &str| names.iter().position(|n| n == name);
    let fmt = |v: f64| {
        if v.is_nan() {
            "-".to_string()
        } else if v >= 1000.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.1}")
        }
    };
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|(name, lower, values)| {
            let (r, best) = ratio(names, *lower, values);
            let mut row = vec![name.to_string()];
            row.extend(values.iter().map(|v| fmt(*v)));
            row.push(if r.is_nan() { "-".into() } else { format!("{r:.2}× ({best})") });
            if let (Some(t), Some(b)) = (at("tether"), at("tether-base")) {
                let r = values[t] / values[b];
                row.push(if r.is_nan() { "-".into() } else { format!("{r:.2}×") });
            }
            row
        })
        .collect();
    let mut headers: Vec<&str> = vec!["figure"];
    headers.extend(names.iter().map(String::as_str));
    headers.push("tether / best peer");
    if at("tether-base").is_some() {
        headers.push("tether / tether-base");
    }
    table(
        &format!(
            "peers (server pinned to CPU {}, load to CPU {}; 10,000 subscribers, 64 B; medians of {} runs; {} handshakes per round)",
            k.server_cpu, k.load_cpu, k.runs, k.handshakes
        ),
        &headers,
        &cells,
    );
}
