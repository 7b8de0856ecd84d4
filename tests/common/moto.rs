//! A real DynamoDB-compatible server for the DynamoDB lease store tests: moto's server mode
//! on a free port of 127.0.0.1, through `moto_serialized.py` (beside this file), which is
//! `moto_server` with one lock around each request: threaded `moto_server` can let two racing
//! conditional writes of one item both pass, where DynamoDB applies them one at a time.
//!
//! Every wait here is bounded; a helper that runs out of time panics with what it saw.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long moto may take to listen after it was started (it imports its whole package
/// first: about 1 s on an idle 2-core box, several while cargo builds beside it).
const START_LIMIT: Duration = Duration::from_secs(30);
/// Ports tried when the one picked is taken before moto binds it.
const PORT_TRIES: usize = 5;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A moto server child process listening on `127.0.0.1:port`, state in memory only. Dropping
/// it SIGKILLs the process by the PID this helper started (moto's SIGTERM handler waits for
/// open keep-alive connections) and removes its log; if the test is panicking, the tail of
/// the log is printed first.
pub struct MotoProc {
    child: Option<Child>,
    /// The TCP port moto listens on.
    pub port: u16,
    log: PathBuf,
}

impl MotoProc {
    /// Starts moto on a free port and waits (bounded) until it accepts connections. Panics,
    /// naming the install command, when `python3` cannot import moto.
    pub fn start() -> MotoProc {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let log = std::env::temp_dir().join(format!("tether-moto-{}-{n}.log", std::process::id()));
        let mut last = String::new();
        for _ in 0..PORT_TRIES {
            let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("pick a free port").port();
            let mut m = MotoProc { child: None, port, log: log.clone() };
            match m.spawn() {
                Ok(()) => return m,
                Err(e) => last = e,
            }
        }
        panic!("moto did not start on any of {PORT_TRIES} ports; last: {last}");
    }

    /// `http://127.0.0.1:PORT`, for [`tether::feeds::DynamoConfig::endpoint`].
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts the process and waits for its port; `Err` (after reaping it) if it exited,
    /// e.g. because another process took the port first.
    fn spawn(&mut self) -> Result<(), String> {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/common/moto_serialized.py");
        let out = std::fs::File::create(&self.log).expect("create the moto log");
        let child = Command::new("python3")
            .arg(&script)
            .args(["-H", "127.0.0.1", "-p", &self.port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone().expect("clone the log handle")))
            .stderr(Stdio::from(out))
            .spawn()
            .expect("spawn python3 (moto's server runs on it)");
        self.child = Some(child);
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let end = Instant::now() + START_LIMIT;
        loop {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                let tail = self.log_tail(15);
                assert!(
                    !tail.contains("No module named"),
                    "moto is not installed for python3 (python3 -m pip install 'moto[server]'):\n{tail}"
                );
                return Err(format!("moto exited at start with {st:?}:\n{tail}"));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            assert!(
                Instant::now() < end,
                "moto did not listen on {addr} within {START_LIMIT:?}\n{}",
                self.log_tail(20)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last `n` lines of moto's log (one line per request, and errors).
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for MotoProc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on the PID of a child this helper spawned and has not reaped yet.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGKILL);
            }
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("---- moto log tail ----\n{}", self.log_tail(30));
        }
        let _ = std::fs::remove_file(&self.log);
    }
}
