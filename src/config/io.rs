//! The socket I/O section of the configuration (`[io]`): how a core learns that its sockets
//! are ready (docs/architecture.md, "Readiness") and how it writes what its connections queued
//! ("The send path").

use serde::Deserialize;

/// Socket I/O (`[io]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Io {
    /// How a fan-out pass writes the connections it queued to: `"sendmsg"` (default: one
    /// `sendmsg(2)` per connection) or `"io_uring"` (the sends of up to 128 connections
    /// submitted together on a small io_uring ring of each core's own, one `io_uring_enter`
    /// per chunk). Both give the same bytes, order and queue rules. Measured on a 2-core box
    /// with 10,000 subscribers (docs/architecture.md, "The send path"): at 100 msg/s both
    /// deliver the same and `sendmsg` has the shorter p99 (`io_uring` 8–28 % longer);
    /// saturated, `io_uring` delivered 2–27 % more per second in three runs and 6 % less in a
    /// fourth. A real-time service runs below saturation, hence the default. Trade-off: `io_uring` saves a system call per connection
    /// per pass and costs about 130 KiB and one ring per core. A core whose ring cannot be
    /// created (`ENOMEM`, `EPERM` under seccomp or `kernel.io_uring_disabled`, an old kernel)
    /// logs a warning and uses `sendmsg` (a core with a ring logs `send ring ready`).
    /// Independent of the runtime's driver (`MONOIO_FORCE_LEGACY_DRIVER=1` keeps it).
    pub send_batch: SendBatch,
    /// Where a core learns that its sockets are ready: `"epoll"` (default: one edge-triggered
    /// epoll set per core) or `"io_uring"` (one multishot poll per socket on a readiness ring of
    /// each core's own, with deferred task work on Linux ≥ 6.1; 512 KiB of completion queue per
    /// core). Either way an idle connection holds no task and no buffer, the reports are the
    /// same, and both run on either monoio driver. Measured on a 2-core box
    /// (docs/architecture.md, "Readiness"): with the ring an idle server with 15,000
    /// connections used 1.02–1.29× the CPU of epoll, and the fan-out p99 at 100 msg/s was
    /// 1.13–1.15× as long, for 1.02–1.08× the deliveries/s when saturated; hence the default. A core whose ring cannot be created (`ENOMEM`, `EPERM`
    /// under seccomp or `kernel.io_uring_disabled`) logs a warning and uses an epoll set; the
    /// `readiness source ready` log line names each core's source.
    pub readiness: Readiness,
}

/// The readiness source (`io.readiness`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Deserialize)]
pub enum Readiness {
    /// An edge-triggered epoll set per core. TOML `"epoll"`.
    #[serde(rename = "epoll")]
    Epoll,
    /// Multishot polls on a ring per core. TOML `"io_uring"`.
    #[serde(rename = "io_uring")]
    IoUring,
}

/// The send path (`io.send_batch`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Deserialize)]
pub enum SendBatch {
    /// One `sendmsg(2)` per connection per pass. TOML `"sendmsg"`.
    #[serde(rename = "sendmsg")]
    Sendmsg,
    /// A chunk of connections' sends per `io_uring_enter`. TOML `"io_uring"`.
    #[serde(rename = "io_uring")]
    IoUring,
}

impl SendBatch {
    /// The TOML spelling: `sendmsg`, `io_uring`.
    pub fn as_str(self) -> &'static str {
        match self {
            SendBatch::Sendmsg => "sendmsg",
            SendBatch::IoUring => "io_uring",
        }
    }
}

impl Readiness {
    /// The TOML spelling: `epoll`, `io_uring`.
    pub fn as_str(self) -> &'static str {
        match self {
            Readiness::Epoll => "epoll",
            Readiness::IoUring => "io_uring",
        }
    }
}

impl Default for Io {
    fn default() -> Self {
        Io { send_batch: SendBatch::Sendmsg, readiness: Readiness::Epoll }
    }
}
