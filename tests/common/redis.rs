//! A real `redis-server` for the Redis broker tests and benches: no TCP port, a Unix socket in
//! a private temp dir, no RDB snapshots, optionally an append-only file fsynced on every write.
//! The test can SIGKILL it and start it again on the same socket and dir (so an AOF survives),
//! and run `redis-cli` against it. `REDIS_SERVER` names another binary than the
//! `redis-server` on the PATH.
//!
//! benches/common includes this file with `#[path]`: it names nothing else of tests/common.
//!
//! Every wait here is bounded; a helper that runs out of time panics with what it saw.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long `redis-server` may take to answer `PING` after it was started.
const START_LIMIT: Duration = Duration::from_secs(10);

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A `redis-server` child process listening only on `<dir>/redis.sock`. Dropping it SIGKILLs
/// the process (by the PID this helper started) and removes the dir; if the test is panicking,
/// the tail of the Redis log is printed.
pub struct RedisProc {
    child: Option<Child>,
    dir: PathBuf,
    sock: PathBuf,
    appendonly: bool,
}

impl RedisProc {
    /// Starts a Redis with no persistence at all: a restart comes back empty.
    pub fn start() -> RedisProc {
        RedisProc::start_with(false)
    }

    /// Starts a Redis; with `appendonly`, every write is in the AOF and fsynced before Redis
    /// answers (`appendfsync always`), so a SIGKILL loses nothing that was acknowledged.
    pub fn start_with(appendonly: bool) -> RedisProc {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tether-redis-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the redis dir");
        let sock = dir.join("redis.sock");
        let mut r = RedisProc { child: None, dir, sock, appendonly };
        r.spawn();
        r
    }

    /// `unix:///…/redis.sock`, for `[broker] url`.
    pub fn url(&self) -> String {
        format!("unix://{}", self.sock.display())
    }

    /// Its Unix socket.
    pub fn sock(&self) -> &Path {
        &self.sock
    }

    /// Its process id (for /proc sampling); panics when it is not running (after
    /// [`RedisProc::kill9`]).
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("redis-server is not running").id() as i32
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "redis-server is already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("redis.log"))
            .expect("create the redis log");
        let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let mut cmd = Command::new(&bin);
        cmd.args(["--port", "0", "--unixsocket"])
            .arg(&self.sock)
            .args(["--unixsocketperm", "700", "--save", "", "--dir"])
            .arg(&self.dir)
            .args(["--appendonly", if self.appendonly { "yes" } else { "no" }])
            // `DEBUG SLEEP` (tests/redis_unknown_outcome.rs) from this socket.
            .args(["--enable-debug-command", "local"]);
        if self.appendonly {
            cmd.args(["--appendfsync", "always"]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("clone the log handle")))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {bin}: {e} (is it installed? apt-get install redis-server)"));
        self.child = Some(child);
        self.wait_ready();
    }

    /// Polls `PING` on the socket until Redis answers `+PONG` (not `-LOADING`).
    fn wait_ready(&mut self) {
        let end = Instant::now() + START_LIMIT;
        loop {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                panic!("redis-server exited at start with {st:?}\n{}", self.log_tail(20));
            }
            let last = match ping(&self.sock) {
                Ok(reply) if reply.starts_with("+PONG") => return,
                Ok(reply) => reply,
                Err(e) => e.to_string(),
            };
            assert!(
                Instant::now() < end,
                "redis-server did not answer PING within {START_LIMIT:?} (last: {last})\n{}",
                self.log_tail(20)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILLs the server and reaps it (no shutdown, no final fsync: a crash).
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("redis-server is not running");
        // SAFETY: kill(2) on the PID of a child this helper spawned and has not reaped yet.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGKILL);
        }
        let _ = child.wait();
    }

    /// Starts the server again on the same socket and dir (an AOF, when enabled, is loaded).
    pub fn restart(&mut self) {
        self.spawn();
    }

    /// Runs `redis-cli -s SOCK ARGS…` and returns its stdout; panics if it fails.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .arg("-s")
            .arg(&self.sock)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli");
        assert!(out.status.success(), "redis-cli {args:?}: {:?} {}", out.status, String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Sends `DEBUG SLEEP secs` on a connection of its own (the returned thread ends when
    /// Redis answers, or dies) and returns once Redis is asleep: a `PING` on another
    /// connection got no answer within 100 ms (so up to ~0.1 s of the sleep has passed).
    pub fn debug_sleep(&self, secs: f64) -> std::thread::JoinHandle<()> {
        let s = self.sock.clone();
        let sleeper = std::thread::spawn(move || {
            let mut c = UnixStream::connect(&s).expect("connect to redis");
            c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            c.write_all(format!("DEBUG SLEEP {secs}\r\n").as_bytes()).unwrap();
            let mut buf = [0u8; 128];
            let n = c.read(&mut buf).unwrap_or(0);
            // A Redis killed while asleep answers nothing.
            assert!(n == 0 || buf.starts_with(b"+OK"), "DEBUG SLEEP: {}", String::from_utf8_lossy(&buf[..n]));
        });
        let end = Instant::now() + START_LIMIT;
        loop {
            let mut c = UnixStream::connect(&self.sock).expect("connect to redis");
            c.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
            c.write_all(b"PING\r\n").unwrap();
            let mut buf = [0u8; 16];
            if let Err(e) = c.read(&mut buf) {
                assert!(matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut), "{e}");
                return sleeper;
            }
            assert!(Instant::now() < end, "redis did not go to sleep within {START_LIMIT:?}");
        }
    }

    /// The last `n` lines of the Redis log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for RedisProc {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.kill9();
        }
        if std::thread::panicking() {
            eprintln!("---- redis log tail ----\n{}", self.log_tail(30));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One `PING` over a fresh connection to `sock`; the first reply line.
fn ping(sock: &Path) -> std::io::Result<String> {
    let mut s = UnixStream::connect(sock)?;
    s.set_read_timeout(Some(Duration::from_millis(500)))?;
    s.write_all(b"PING\r\n")?;
    let mut buf = [0u8; 256];
    let n = s.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).trim_end().to_owned())
}

/// A tether config with `[broker] kind = "redis"` at `url`, then `extra` (more `[broker]`
/// keys, or further tables), then a `[[channels]]` rule keeping 100,000 messages of history.
pub fn redis_config(url: &str, extra: &str) -> String {
    format!("[broker]\nkind = \"redis\"\nurl = \"{url}\"\n{extra}\n\n[[channels]]\npattern = \"*\"\nhistory = 100000\n")
}
