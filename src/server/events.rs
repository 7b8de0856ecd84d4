//! Log lines about connections (docs/operations.md, "Logs"): handshake failures and reaps at
//! `debug`, overflow closes and drain progress at `info`, accept errors at `warn`. Lines a flood can produce go through a
//! per-core [`LogLimiter`] (at most [`LINES_PER_SECOND`] per kind per core, then one
//! "suppressed K similar lines" summary), so a storm of bad handshakes or a mass reap after a
//! network cut does not become a storm of log lines.
//!
//! Callers are one-line hooks in the engine; the session does not log, it hands up what is
//! worth a line (`session::Event`) and the core calls these. Nothing here touches connection
//! state. The peer address is asked of the kernel (`getpeername`) only when a line is actually
//! written.
//!
//! Bytes a client chose (request targets, header values, channel names, close reasons, the op
//! of a refused request) are written through [`Escaped`] only: a client cannot forge a log
//! line or send terminal escapes to whoever reads the log (docs/security.md, "Logs").

use std::cell::RefCell;
use std::os::fd::RawFd;
use std::time::Instant;

use tracing::Level;

use crate::http::{Request, StatusCode};
use crate::log_limit::{Admit, LogLimiter};
use crate::logging::Escaped;
use crate::protocol::close::CloseCode;
use crate::protocol::RequestError;
use crate::session::{HandshakeFailure, ReapReason};

/// Lines per second per kind per core before suppression.
pub const LINES_PER_SECOND: u32 = 10;
/// Drain progress is logged at most this often per core (ms).
const DRAIN_PROGRESS_EVERY_MS: u64 = 1000;

/// The kinds of rate-limited lines.
#[derive(Clone, Copy)]
enum Kind {
    Handshake = 0,
    Reap = 1,
    Overflow = 2,
    Accept = 3,
    Refused = 4,
    PeerClose = 5,
}

const KINDS: usize = 6;
const KIND_NAMES: [&str; KINDS] =
    ["handshake failure", "reap", "overflow close", "accept error", "refused request", "peer close"];

struct State {
    epoch: Instant,
    limiters: [LogLimiter; KINDS],
    last_drain_line_ms: Option<u64>,
}

thread_local! {
    // One per core thread: cores never share it.
    static STATE: RefCell<State> = RefCell::new(State {
        epoch: Instant::now(),
        limiters: [const { LogLimiter::new(LINES_PER_SECOND, 1000) }; KINDS],
        last_drain_line_ms: None,
    });
}

fn now_ms(st: &State) -> u64 {
    st.epoch.elapsed().as_millis() as u64
}

/// Whether a line of `kind` may be written now; writes the pending summary first.
fn admit(kind: Kind, level: Level, core: usize) -> bool {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        let now = now_ms(&s);
        let limiter = &mut s.limiters[kind as usize];
        let pending = limiter.pending();
        match limiter.admit(now) {
            Admit::Suppress => {
                if pending == 0 {
                    // A summary is now due at the end of the window: the clock must wake then.
                    super::tick::nudge();
                }
                false
            }
            Admit::Log { suppressed_before } => {
                if suppressed_before > 0 {
                    summary(level, core, kind, suppressed_before);
                }
                true
            }
        }
    })
}

fn summary(level: Level, core: usize, kind: Kind, n: u64) {
    let what = KIND_NAMES[kind as usize];
    match level {
        Level::WARN => tracing::warn!(core, suppressed = n, "suppressed {n} similar lines ({what})"),
        Level::INFO => tracing::info!(core, suppressed = n, "suppressed {n} similar lines ({what})"),
        _ => tracing::debug!(core, suppressed = n, "suppressed {n} similar lines ({what})"),
    }
}

fn peer(fd: Option<RawFd>) -> String {
    // Callers pass the fd of a connection whose socket is still open.
    fd.and_then(super::io::peer_addr).map_or_else(|| "unknown".to_owned(), |a| a.to_string())
}

/// A request refused before (or instead of) an upgrade: `debug`, rate-limited. `status` is
/// the answer sent, `None` when none was (a head that never completed; logged as 0).
pub fn handshake_failed(
    core: usize,
    fd: Option<RawFd>,
    why: HandshakeFailure,
    status: Option<StatusCode>,
    reason: &str,
) {
    if tracing::enabled!(Level::DEBUG) && admit(Kind::Handshake, Level::DEBUG, core) {
        let status = status.map_or(0, |s| s.as_u16());
        tracing::debug!(core, peer = %peer(fd), why = why.label(), status, reason, "handshake failed");
    }
}

/// A TLS connection failed by rustls (`why`: the `tether_tls_handshake_failures_total`
/// reason, `reason`: rustls' error): `debug`, rate-limited with the handshake failures.
pub fn tls_failed(core: usize, fd: Option<RawFd>, why: &str, reason: &str) {
    if tracing::enabled!(Level::DEBUG) && admit(Kind::Handshake, Level::DEBUG, core) {
        tracing::debug!(core, peer = %peer(fd), why, reason, "TLS failed");
    }
}

/// An HTTP API request refused for its credentials (`endpoint`: `publish` or `admin`):
/// `debug`, rate-limited with the handshake failures. The credentials are never logged.
pub fn http_auth_failed(core: usize, fd: Option<RawFd>, endpoint: &str, reason: &str) {
    if tracing::enabled!(Level::DEBUG) && admit(Kind::Handshake, Level::DEBUG, core) {
        tracing::debug!(core, peer = %peer(fd), endpoint, reason, "HTTP request refused: 401");
    }
}

/// [`handshake_failed`] for a request whose head was read: also its target (`path`) and
/// `Origin`, escaped (client bytes). `debug`, rate-limited.
pub fn handshake_failed_for(
    core: usize,
    fd: Option<RawFd>,
    why: HandshakeFailure,
    status: StatusCode,
    reason: &str,
    req: &Request,
) {
    if tracing::enabled!(Level::DEBUG) && admit(Kind::Handshake, Level::DEBUG, core) {
        let path = Escaped::str(&req.path);
        let origin = Escaped::str(req.origin.as_deref().unwrap_or(""));
        tracing::debug!(core, peer = %peer(fd), why = why.label(), status = status.as_u16(), reason, ?path, ?origin, "handshake failed");
    }
}

/// A WebSocket text message refused as a request (answered with an `error` of code
/// `e.code`): its reason (which may quote the client's op) and the channel it named, if it
/// could be read, both escaped. `debug`, rate-limited.
pub fn message_refused(core: usize, fd: Option<RawFd>, e: &RequestError) {
    if tracing::enabled!(Level::DEBUG) && admit(Kind::Refused, Level::DEBUG, core) {
        let (reason, ch) = (Escaped::str(&e.reason), Escaped::str(e.ch.as_deref().unwrap_or("")));
        tracing::debug!(core, peer = %peer(fd), code = e.code, ?reason, ?ch, "request refused");
    }
}

/// An HTTP publish answered 400 (`reason`): `channel` is the `{channel}` segment of its target
/// as sent (percent-decoded when it decodes), escaped. `debug`, rate-limited.
pub fn publish_refused(core: usize, fd: Option<RawFd>, reason: &str, channel: &[u8]) {
    if tracing::enabled!(Level::DEBUG) && admit(Kind::Refused, Level::DEBUG, core) {
        let ch = Escaped(channel);
        tracing::debug!(core, peer = %peer(fd), status = 400, reason, ?ch, "publish refused");
    }
}

/// The peer sent a close frame: its code (`None`: no status) and reason, escaped (client
/// bytes). `debug`, rate-limited.
pub fn peer_closed(core: usize, fd: Option<RawFd>, code: Option<CloseCode>, reason: &[u8]) {
    if tracing::enabled!(Level::DEBUG) && admit(Kind::PeerClose, Level::DEBUG, core) {
        let code = code.map(u16::from);
        let reason = Escaped(reason);
        tracing::debug!(core, peer = %peer(fd), code, ?reason, "peer sent a close frame");
    }
}

/// An upgraded connection removed, with why: `debug`, rate-limited.
pub fn reaped(core: usize, fd: RawFd, why: ReapReason) {
    if tracing::enabled!(Level::DEBUG) && admit(Kind::Reap, Level::DEBUG, core) {
        tracing::debug!(core, peer = %peer(Some(fd)), why = why.as_str(), "connection reaped");
    }
}

/// A subscriber closed with 1013 because its outbound queue overflowed: `info`,
/// rate-limited.
pub fn overflow_closed(core: usize, fd: RawFd, queue_max_bytes: usize, queue_max_messages: usize) {
    if tracing::enabled!(Level::INFO) && admit(Kind::Overflow, Level::INFO, core) {
        tracing::info!(core, peer = %peer(Some(fd)), queue_max_bytes, queue_max_messages, "slow subscriber closed with 1013 (outbound queue full)");
    }
}

/// `accept` failed (e.g. `EMFILE` with a full fd table; the loop retries every 10 ms):
/// `warn`, rate-limited.
pub fn accept_failed(core: usize, error: &std::io::Error) {
    if tracing::enabled!(Level::WARN) && admit(Kind::Accept, Level::WARN, core) {
        tracing::warn!(core, %error, "accept failed");
    }
}

/// Called when the clock advances: reports floods that ended (their summary line).
pub fn flush_suppressed(core: usize) {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        let now = now_ms(&s);
        for (kind, level) in [
            (Kind::Handshake, Level::DEBUG),
            (Kind::Reap, Level::DEBUG),
            (Kind::Overflow, Level::INFO),
            (Kind::Accept, Level::WARN),
            (Kind::Refused, Level::DEBUG),
            (Kind::PeerClose, Level::DEBUG),
        ] {
            if let Some(n) = s.limiters[kind as usize].flush(now) {
                summary(level, core, kind, n);
            }
        }
    })
}

/// Milliseconds until the earliest pending "suppressed K similar lines" summary of this
/// core is due ([`flush_suppressed`] writes it), `None` when none is pending.
pub fn next_summary_in_ms() -> Option<u64> {
    STATE.with(|s| {
        let s = s.borrow();
        let now = now_ms(&s);
        s.limiters.iter().filter_map(|l| l.summary_due()).min().map(|due| due.saturating_sub(now))
    })
}

/// This core begins its drain: `info`.
pub fn drain_started(core: usize, connections: u64, window_ms: u64) {
    tracing::info!(core, connections, window_ms, "drain started: closes spread over the window");
}

/// The drain goes on: `info`, at most once a second per core.
pub fn drain_progress(core: usize, to_close: i64, open: i64) {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        let now = now_ms(&s);
        if s.last_drain_line_ms.is_some_and(|t| now.saturating_sub(t) < DRAIN_PROGRESS_EVERY_MS) {
            return;
        }
        s.last_drain_line_ms = Some(now);
        tracing::info!(core, to_close = to_close.max(0), open = open.max(0), "draining");
    })
}

/// This core's drain is over (every peer answered, or the deadline passed): `info`.
pub fn drain_done(core: usize, still_open: i64) {
    if still_open > 0 {
        tracing::info!(core, still_open, "drain deadline reached; the remaining connections are dropped");
    } else {
        tracing::info!(core, "drain done: every connection closed");
    }
}
