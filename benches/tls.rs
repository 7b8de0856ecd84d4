//! TLS (issue 30, docs/benchmarks.md): what `wss://` costs, per path: `plain` (ws:// straight
//! to tether, the baseline), `nginx` (nginx terminating TLS in front of tether on the same box,
//! from docs/recipes/nginx.conf: the anchor a TLS-terminating tether is compared with) and
//! `tether` (tether's own `[tls]`, on `listen_tls`). For each, per round:
//! - handshakes: `tether load connect` (full handshakes: the load tool never resumes a TLS
//!   session) → handshakes/s, and server CPU per handshake: the time on a CPU of every thread
//!   of tether, plus nginx's master and workers on the nginx path (/proc/PID/task/*/schedstat),
//!   over the run, divided by the handshakes;
//! - fan-out: `tether load fanout` of TLS_RATE msg/s to TLS_SUBS subscribers on one channel →
//!   server CPU (user + system of the same processes, /proc/PID/stat sampled every 20 ms,
//!   interpolated to the load's measured window) per delivery,
//!   deliveries/s, p99;
//! - idle memory: RSS of the same processes at TLS_IDLE_POINTS counts of idle subscribed
//!   connections up to TLS_IDLE (`tether load idle`), least-squares slope in bytes per
//!   connection (user memory only: the kernel's socket buffers are not in it).
//!
//! The `tether` path runs only when the server accepts a `[tls]` section (`cert_file`,
//! `key_file`, `listen_tls`); otherwise the bench prints "server TLS not available" with the
//! server's answer and leaves that path's rows out. Certificates: a test CA and an ECDSA P-256
//! server certificate made with the openssl CLI at start (tests/common/proxy.rs).
//!
//! `cargo bench --bench tls`. Env: TLS_PATHS ("plain,nginx,tether"), TLS_ROUNDS (3), TLS_CORES
//! (tether's cores, 2), TLS_NGINX_WORKERS (2), TLS_CONNS (handshakes per connect run, 5000),
//! TLS_CONCURRENCY (handshakes in flight, 64), TLS_SUBS (10000), TLS_RATE (10), TLS_SIZE
//! (bytes of `data`, 64), TLS_DURATION (seconds of publishing, 10), TLS_IDLE (8000),
//! TLS_IDLE_POINTS (4). Every path shares the box's cores with the load generator.
//! Writes target/bench/tls.json.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::proxy::{free_port, Proxy, ProxyOpts, TestCa};
use common::*;
use serde_json::{json, Value};

const PATHS: [&str; 3] = ["plain", "nginx", "tether"];
/// The figures of one run, in this order: handshakes/s, CPU µs per handshake, deliveries/s,
/// CPU µs per delivery, p99 ms, idle bytes per connection.
const FIGURES: [&str; 6] = [
    "handshakes_per_s",
    "cpu_us_per_handshake",
    "deliveries_per_s",
    "cpu_us_per_delivery",
    "p99_ms",
    "idle_bytes_per_conn",
];

struct Knobs {
    cores: usize,
    workers: usize,
    conns: usize,
    concurrency: usize,
    fanout: FanoutKnobs,
    idle: usize,
    idle_points: usize,
}

/// One path's server side: tether (and nginx), where clients connect, and what they trust.
struct Setup {
    server: Server,
    proxy: Option<Proxy>,
    url: String,
    tls: bool,
}

impl Setup {
    /// The processes whose CPU and memory count: tether, then nginx's master and workers.
    fn pids(&self) -> Vec<i32> {
        let mut pids = vec![self.server.pid];
        if let Some(p) = &self.proxy {
            pids.extend(p.pids());
        }
        pids
    }

    /// CPU seconds of those processes, to the nanosecond (/proc/PID/task/*/schedstat: a
    /// plain connect run takes well under a second, too short for 10 ms clock ticks).
    fn cpu(&self) -> f64 {
        self.pids().iter().filter_map(|&p| cpu_seconds_fine(p)).sum()
    }

    fn rss(&self) -> u64 {
        self.pids().iter().map(|&p| rss_bytes(p)).sum()
    }

    /// `args` plus `--ca` on a TLS path.
    fn with_ca(&self, mut args: Vec<String>, ca: &TestCa) -> Vec<String> {
        if self.tls {
            args.extend(["--ca".into(), ca.ca_cert.display().to_string()]);
        }
        args
    }
}

fn main() {
    if !should_run() {
        return;
    }
    let paths: Vec<String> = env_or("TLS_PATHS", PATHS.join(","))
        .split(',')
        .map(|p| p.trim().to_string())
        .filter(|p| PATHS.contains(&p.as_str()))
        .collect();
    let rounds: usize = env_or("TLS_ROUNDS", 3);
    let mut fanout = FanoutKnobs::read("TLS", 64);
    fanout.rounds = rounds;
    let k = Knobs {
        cores: env_or("TLS_CORES", 2),
        workers: env_or("TLS_NGINX_WORKERS", 2),
        conns: env_or("TLS_CONNS", 5000),
        concurrency: env_or("TLS_CONCURRENCY", 64),
        fanout,
        idle: env_or("TLS_IDLE", 8000),
        idle_points: env_or("TLS_IDLE_POINTS", 4).max(2),
    };
    pin_binary("tls");
    let ca = TestCa::new();
    let tls_config = format!(
        "[tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\nlisten_tls = \"127.0.0.1:{{PORT}}\"\n",
        ca.cert.display(),
        ca.key.display()
    );
    let mut paths_run = paths.clone();
    if paths.iter().any(|p| p == "tether") {
        if let Err(why) = server_tls_support(&tls_config.replace("{PORT}", &free_port().to_string())) {
            println!("server TLS not available: {why}\n(the `tether` path is left out; no figure is reported for it)");
            paths_run.retain(|p| p != "tether");
        }
    }
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    // figures[path][figure]: one value per round.
    let mut figures: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); FIGURES.len()]; paths_run.len()];
    for round in 1..=rounds {
        for (i, path) in paths_run.iter().enumerate() {
            let (f, run) = measure(path, &k, &ca, &tls_config);
            rows.push(
                [round.to_string(), path.clone()]
                    .into_iter()
                    .chain(f.iter().map(|v| format!("{v:.3}")))
                    .chain([format!("{:.2}", loadavg())])
                    .collect(),
            );
            for (j, v) in f.iter().enumerate() {
                figures[i][j].push(*v);
            }
            runs.push(json!({"round": round, "path": path, "figures": f, "run": run}));
        }
    }
    table(
        &format!(
            "tls ({} cores for tether, {} nginx workers, {} allocator; connect {} at {} in flight; fanout {} msg/s to {} subs; idle up to {})",
            k.cores, k.workers, allocator(), k.conns, k.concurrency, k.fanout.rate, k.fanout.subs, k.idle
        ),
        &["round", "path", "handshakes/s", "cpu µs/hs", "deliveries/s", "cpu µs/deliv", "p99 ms", "idle B/conn", "load 1m"],
        &rows,
    );
    let summary = summarize(&paths_run, &figures);
    write_json(
        "tls",
        &json!({"paths": paths_run, "rounds": rounds, "cores": k.cores, "nginx_workers": k.workers,
            "conns": k.conns, "concurrency": k.concurrency, "subs": k.fanout.subs, "rate": k.fanout.rate,
            "size": k.fanout.size, "duration_s": k.fanout.duration, "idle_max": k.idle,
            "allocator": allocator(), "runs": runs, "summary": summary}),
    );
}

/// Starts `tether serve` with `config` (a `[tls]` section) and reports whether it came up:
/// `Err` with the first lines of its stderr when it refused the config or exited.
fn server_tls_support(config: &str) -> Result<(), String> {
    let file = bench_file("tls-probe.toml");
    std::fs::write(&file, config).expect("write tls-probe.toml");
    let mut child = Command::new(bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--cores", "1", "--config"])
        .arg(&file)
        .env("TETHER_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(15)).unwrap_or_default();
    let up = line.starts_with("tether listening on ");
    let _ = child.kill();
    let out = child.wait_with_output().map_err(|e| format!("wait: {e}"))?;
    if up {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    Err(err.lines().take(3).collect::<Vec<_>>().join(" / "))
}

/// A fresh server side for `path`.
fn setup(path: &str, k: &Knobs, ca: &TestCa, tls_config: &str) -> Setup {
    match path {
        "plain" => {
            let server = serve("tls-plain", k.cores, "");
            Setup { url: server.ws_url(), server, proxy: None, tls: false }
        }
        "nginx" => {
            let server = serve("tls-nginx", k.cores, "");
            let proxy = Proxy::nginx(ca, server.addr, ProxyOpts { idle_timeout: None, workers: k.workers });
            Setup { url: proxy.wss_url(), server, proxy: Some(proxy), tls: true }
        }
        _ => {
            let port = free_port();
            let server = serve("tls-tether", k.cores, &tls_config.replace("{PORT}", &port.to_string()));
            Setup { url: format!("wss://127.0.0.1:{port}/ws"), server, proxy: None, tls: true }
        }
    }
}

/// Every figure of [`FIGURES`] for `path`, each on a fresh server side, and the run's JSON.
fn measure(path: &str, k: &Knobs, ca: &TestCa, tls_config: &str) -> ([f64; 6], Value) {
    // Handshakes.
    let s = setup(path, k, ca, tls_config);
    let args: Vec<String> = ["connect", &s.url, "--conns", &k.conns.to_string()]
        .into_iter()
        .chain(["--concurrency", &k.concurrency.to_string(), "--sources", "127.0.0.2-127.0.0.254"])
        .map(String::from)
        .collect();
    let before = s.cpu();
    let connect = load(&s.with_ca(args, ca));
    let hs_cpu = s.cpu() - before;
    let handshakes = num(&connect, "ok");
    let cpu_us_per_handshake = if handshakes > 0.0 { hs_cpu / handshakes * 1e6 } else { f64::NAN };
    drop(s);

    // Fan-out.
    let s = setup(path, k, ca, tls_config);
    let stats: Vec<PathBuf> = s.pids().iter().map(|p| PathBuf::from(format!("/proc/{p}/stat"))).collect();
    let sampler = ProcSampler::start(vec![stats], Duration::from_millis(20));
    let fan = load(&s.with_ca(k.fanout.args(s.url.clone()), ca));
    let trace = sampler.finish();
    let (from, to) = (num(&fan, "start_ns") as u64, num(&fan, "end_ns") as u64);
    let delivered = num(&fan, "deliveries_per_s") * to.saturating_sub(from) as f64 / 1e9;
    let fan_cpu = trace.at(0, to) - trace.at(0, from);
    let cpu_us_per_delivery = if delivered > 0.0 { fan_cpu / delivered * 1e6 } else { f64::NAN };
    drop(s);

    // Idle memory.
    let s = setup(path, k, ca, tls_config);
    let (idle_slope, samples) = idle_memory(&s, k, ca);
    drop(s);

    let f = [
        num(&connect, "handshakes_per_s"),
        cpu_us_per_handshake,
        num(&fan, "deliveries_per_s"),
        cpu_us_per_delivery,
        num(&fan, "p99_ms"),
        idle_slope,
    ];
    let run = json!({"connect": connect, "connect_cpu_s": hs_cpu, "fanout": fan, "fanout_cpu_s": fan_cpu,
        "idle_samples": samples});
    (f, run)
}

/// RSS of `s`'s processes per idle subscribed connection: least-squares slope over
/// `k.idle_points` counts up to `k.idle`; returns it and the `(connections, rss bytes)` samples.
fn idle_memory(s: &Setup, k: &Knobs, ca: &TestCa) -> (f64, Vec<(f64, f64)>) {
    let mut loads = Vec::new();
    let mut samples = Vec::new();
    let mut held = 0usize;
    for i in 1..=k.idle_points {
        let target = k.idle * i / k.idle_points;
        let args: Vec<String> = ["idle", &s.url, "--conns", &(target - held).to_string()]
            .into_iter()
            .chain(["--channels", "100", "--hold", "600s", "--threads", "1", "--sources", "127.0.0.2-127.0.0.254"])
            .map(String::from)
            .collect();
        let args = s.with_ca(args, ca);
        eprintln!("$ tether load {}", args.join(" "));
        loads.push(spawn_load(&args));
        held = target;
        let got = wait_connections(&s.server, held as u64, Duration::from_secs(90));
        // Let the allocators and the kernel settle (deferred frees, timers).
        std::thread::sleep(Duration::from_millis(1500));
        let rss = s.rss();
        eprintln!("tls idle: {got} connections, RSS {} KiB", rss / 1024);
        samples.push((got as f64, rss as f64));
    }
    for child in loads {
        let report = stop_load(child);
        if num(&report, "errors") > 0.0 {
            eprintln!("tls idle: the load reported errors: {report}");
        }
    }
    (slope(&samples), samples)
}

/// Medians per path over the rounds and their ratios to `plain` and to `nginx` (printed and
/// returned for the JSON).
fn summarize(paths: &[String], figures: &[Vec<Vec<f64>>]) -> Value {
    let med = |i: usize, j: usize| median(&figures[i][j]);
    let index = |name: &str| paths.iter().position(|p| p == name);
    let mut rows = Vec::new();
    let mut out = serde_json::Map::new();
    for (i, path) in paths.iter().enumerate() {
        let mut entry = serde_json::Map::new();
        for (j, name) in FIGURES.iter().enumerate() {
            let v = med(i, j);
            let ratio = |base: Option<usize>| base.map(|b| v / med(b, j));
            entry.insert(
                name.to_string(),
                json!({"median": v, "vs_plain": ratio(index("plain")), "vs_nginx": ratio(index("nginx"))}),
            );
            rows.push(vec![
                path.clone(),
                name.to_string(),
                figures[i][j].len().to_string(),
                format!("{v:.3}"),
                ratio(index("plain")).map_or("-".into(), |r| format!("{r:.3}")),
                ratio(index("nginx")).map_or("-".into(), |r| format!("{r:.3}")),
            ]);
        }
        out.insert(path.clone(), Value::Object(entry));
    }
    table("medians per path", &["path", "figure", "runs", "median", "× plain", "× nginx"], &rows);
    Value::Object(out)
}
