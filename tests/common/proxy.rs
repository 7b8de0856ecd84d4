//! TLS-terminating proxies in front of a test `tether serve`: a throwaway CA and a server
//! certificate for `127.0.0.1` / `localhost` made with the `openssl` CLI ([`TestCa`]), and the
//! real nginx or HAProxy ([`Proxy`]) started from the shipped recipes (docs/recipes/) with
//! only their addresses, paths and chosen knobs replaced, on 127.0.0.1, stopped by PID.
//!
//! benches/common includes this file with `#[path]`: it names nothing of tests/common but
//! `wait.rs`.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::wait::within_sync;

/// How long a started proxy may take to accept connections.
const START_LIMIT: Duration = Duration::from_secs(15);
/// How long a proxy may take to exit on SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A fresh directory under the system temp dir for one CA or proxy, removed by its owner.
fn scratch_dir(what: &str) -> PathBuf {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("tether-{what}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

/// Runs `openssl ARGS` in `dir`; panics with its stderr when it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("run openssl (scripts/setup installs it): {e}"));
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A test CA and one server certificate it signed (ECDSA P-256, valid two days, names
/// `IP:127.0.0.1` and `DNS:localhost`), as PEM files in a temporary directory removed on drop.
pub struct TestCa {
    dir: PathBuf,
    /// The CA certificate: what clients trust (`--ca`, `ssl.create_default_context(cafile=)`).
    pub ca_cert: PathBuf,
    /// The server's certificate (leaf only).
    pub cert: PathBuf,
    /// The server's private key (PKCS#8).
    pub key: PathBuf,
    /// Certificate then key in one file (HAProxy's `crt`).
    pub combined: PathBuf,
}

impl TestCa {
    /// Makes the CA and the server certificate with the `openssl` CLI.
    pub fn new() -> TestCa {
        let dir = scratch_dir("ca");
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        let mut ca = vec!["req", "-x509"];
        ca.extend(ec);
        ca.extend(["-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=tether test CA"]);
        ca.extend(["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign"]);
        openssl(&dir, &ca);
        let mut csr = vec!["req"];
        csr.extend(ec);
        csr.extend(["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"]);
        openssl(&dir, &csr);
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .expect("write server.ext");
        openssl(
            &dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.crt",
                "-days",
                "2",
                "-extfile",
                "server.ext",
            ],
        );
        let pem = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_else(|e| panic!("read {f}: {e}"));
        std::fs::write(dir.join("combined.pem"), pem("server.crt") + &pem("server.key")).expect("write combined.pem");
        TestCa {
            ca_cert: dir.join("ca.crt"),
            cert: dir.join("server.crt"),
            key: dir.join("server.key"),
            combined: dir.join("combined.pem"),
            dir,
        }
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A free TCP port on 127.0.0.1 (bound to port 0, read back, released): the proxy binds it
/// right after; the kernel does not hand a just-released port out again at once.
pub fn free_port() -> u16 {
    let probe = TcpListener::bind("127.0.0.1:0").expect("bind a probe on 127.0.0.1:0");
    probe.local_addr().expect("probe address").port()
}

/// The shipped recipe `docs/recipes/NAME` with each `(from, to)` replaced; panics naming a
/// `from` the recipe does not contain (the recipe changed: the test must change with it).
pub fn render_recipe(name: &str, replace: &[(&str, String)]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/recipes").join(name);
    let mut text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    for (from, to) in replace {
        assert!(text.contains(from), "docs/recipes/{name} no longer contains {from:?}");
        text = text.replace(from, to);
    }
    text
}

/// Which proxy, and the knobs a test may change in its recipe.
#[derive(Debug, Clone, Copy)]
pub struct ProxyOpts {
    /// Replaces the recipe's 75 s inactivity timeouts (`proxy_read_timeout`, `timeout
    /// tunnel`, …), so a test can hold a connection past them in seconds.
    pub idle_timeout: Option<Duration>,
    /// nginx `worker_processes` (the main context is the harness's, not the recipe's).
    pub workers: usize,
}

impl Default for ProxyOpts {
    fn default() -> Self {
        ProxyOpts { idle_timeout: None, workers: 1 }
    }
}

/// A running nginx or HAProxy: its child process (the nginx master; HAProxy in the
/// foreground), the address it serves TLS on, and its scratch directory. Dropping it sends
/// SIGTERM to the process and, after up to 5 s, SIGKILL to it and its children (nginx's
/// workers), then removes the directory.
pub struct Proxy {
    child: Child,
    /// Its process id (the nginx master).
    pub pid: i32,
    /// Where it accepts TLS.
    pub addr: SocketAddr,
    dir: PathBuf,
    log: PathBuf,
}

impl Proxy {
    /// nginx with docs/recipes/nginx.conf in its http {} context, TLS on a free 127.0.0.1 port
    /// with `ca`'s server certificate, proxying to `upstream`.
    pub fn nginx(ca: &TestCa, upstream: SocketAddr, opts: ProxyOpts) -> Proxy {
        let dir = scratch_dir("nginx");
        let port = free_port();
        let mut replace = vec![
            ("listen 443 ssl;", format!("listen 127.0.0.1:{port} ssl;")),
            ("/etc/nginx/tls/tether.crt", ca.cert.display().to_string()),
            ("/etc/nginx/tls/tether.key", ca.key.display().to_string()),
            ("server 127.0.0.1:8080;", format!("server {upstream};")),
        ];
        if let Some(t) = opts.idle_timeout {
            let ms = format!("{}ms", t.as_millis());
            replace.push(("proxy_read_timeout 75s;", format!("proxy_read_timeout {ms};")));
            replace.push(("proxy_send_timeout 75s;", format!("proxy_send_timeout {ms};")));
        }
        std::fs::write(dir.join("tether.conf"), render_recipe("nginx.conf", &replace)).expect("write tether.conf");
        // The main context a distribution's nginx.conf would give, in the scratch directory.
        let d = dir.display();
        let main = format!(
            "worker_processes {workers};\nworker_rlimit_nofile 20000;\nerror_log {d}/error.log warn;\n\
             pid {d}/nginx.pid;\ndaemon off;\nevents {{ worker_connections 19000; }}\n\
             http {{\n    access_log off;\n    client_body_temp_path {d}/body;\n    proxy_temp_path {d}/proxy;\n\
             include {d}/tether.conf;\n}}\n",
            workers = opts.workers.max(1)
        );
        std::fs::write(dir.join("nginx.conf"), main).expect("write nginx.conf");
        let log = dir.join("error.log");
        let child = Command::new("nginx")
            .arg("-e")
            .arg(&log)
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(dir.join("stderr.log")).expect("create stderr.log")))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn nginx (scripts/setup installs it): {e}"));
        Proxy::wait_up(child, port, dir, log)
    }

    /// HAProxy with docs/recipes/haproxy.cfg, TLS on a free 127.0.0.1 port with `ca`'s
    /// server certificate, proxying to `upstream`.
    pub fn haproxy(ca: &TestCa, upstream: SocketAddr, opts: ProxyOpts) -> Proxy {
        let dir = scratch_dir("haproxy");
        let port = free_port();
        let mut replace = vec![
            (
                "bind :443 ssl crt /etc/haproxy/certs/tether.pem",
                format!("bind 127.0.0.1:{port} ssl crt {}", ca.combined.display()),
            ),
            ("server tether1 127.0.0.1:8080", format!("server tether1 {upstream}")),
            // Within the box's open-file limit (2 descriptors per proxied connection).
            ("maxconn 100000", "maxconn 9000".to_string()),
        ];
        if let Some(t) = opts.idle_timeout {
            let ms = format!("{}ms", t.as_millis());
            for knob in ["timeout client 75s", "timeout server 75s", "timeout tunnel 75s"] {
                replace.push((knob, knob.replace("75s", &ms)));
            }
        }
        let cfg = dir.join("haproxy.cfg");
        std::fs::write(&cfg, render_recipe("haproxy.cfg", &replace)).expect("write haproxy.cfg");
        let log = dir.join("stderr.log");
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::from(std::fs::File::create(dir.join("stdout.log")).expect("create stdout.log")))
            .stderr(Stdio::from(std::fs::File::create(&log).expect("create stderr.log")))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn haproxy (scripts/setup installs it): {e}"));
        Proxy::wait_up(child, port, dir, log)
    }

    /// Waits (bounded) until `port` accepts; panics with the proxy's log when it does not.
    fn wait_up(mut child: Child, port: u16, dir: PathBuf, log: PathBuf) -> Proxy {
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let up = within_sync(START_LIMIT, || {
            if let Ok(Some(st)) = child.try_wait() {
                return Ok(Err(format!("exited: {st}")));
            }
            TcpStream::connect_timeout(&addr, Duration::from_millis(200)).map(|_| Ok(())).map_err(|e| e.to_string())
        });
        let pid = child.id() as i32;
        let proxy = Proxy { child, pid, addr, dir, log };
        match up {
            Ok(Ok(())) => proxy,
            Ok(Err(why)) | Err(why) => {
                panic!("proxy on {addr} not accepting within {START_LIMIT:?}: {why}\n{}", proxy.log_text())
            }
        }
    }

    /// `wss://127.0.0.1:PORT/ws`.
    pub fn wss_url(&self) -> String {
        format!("wss://{}/ws", self.addr)
    }

    /// The proxy's error log (and nginx's stderr), for failure messages.
    pub fn log_text(&self) -> String {
        let mut text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text += &std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default();
        text
    }

    /// The process ids of the proxy: the nginx master (or HAProxy) first, then its children
    /// (nginx's workers), from /proc/PID/task/*/children.
    pub fn pids(&self) -> Vec<i32> {
        let mut pids = vec![self.pid];
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.pid)).into_iter().flatten().flatten();
        for task in tasks {
            let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            pids.extend(children.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
        }
        pids
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let pids = self.pids();
        // SAFETY: kill(2) on the child this harness started; no memory is involved.
        unsafe {
            libc::kill(self.pid, libc::SIGTERM);
        }
        let exited = within_sync(STOP_GRACE, || match self.child.try_wait() {
            Ok(Some(_)) => Ok(()),
            _ => Err(()),
        });
        if exited.is_err() {
            for pid in pids {
                // SAFETY: kill(2) on the proxy this harness started and its own workers.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- proxy log ({}) ---\n{}", self.addr, self.log_text());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
