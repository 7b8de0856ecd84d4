//! Why a connection ended: decided by its session, counted by the metrics
//! (`tether_reaped_total{reason}`), logged at teardown.

/// Why a connection ended: the `reason` label of `tether_reaped_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ReapReason {
    /// Close handshake completed (either side started it).
    Close = 0,
    /// The peer reset the connection or a socket error occurred.
    Reset,
    /// The peer closed TCP without a close frame.
    Eof,
    /// No frame within `heartbeat.pong_timeout_ms` of a ping.
    PongTimeout,
    /// Outbound queue overflow with the `disconnect` policy (close 1013).
    Overflow,
    /// The peer never finished the close handshake we started.
    CloseTimeout,
    /// The peer violated RFC 6455 (close 1002/1007/1009).
    Protocol,
    /// Server drain on shutdown.
    Drain,
    /// No complete request head within `limits.handshake_timeout_ms` (never upgraded).
    HandshakeTimeout,
    /// Closed with 1008 for going on far past a per-connection rate
    /// (`limits.per_connection`, docs/security.md).
    Limit,
    /// The token expired and no refresh came within the grace (close 4001).
    TokenExpired,
    /// A `refresh` was refused, or the token was revoked (close 4003).
    Forbidden,
    /// Closed by the server API (`POST /api/disconnect`), with the code it asked for.
    Disconnected,
}

impl ReapReason {
    /// Every reason, in label order.
    pub const ALL: [ReapReason; 13] = [
        ReapReason::Close,
        ReapReason::Reset,
        ReapReason::Eof,
        ReapReason::PongTimeout,
        ReapReason::Overflow,
        ReapReason::CloseTimeout,
        ReapReason::Protocol,
        ReapReason::Drain,
        ReapReason::HandshakeTimeout,
        ReapReason::Limit,
        ReapReason::TokenExpired,
        ReapReason::Forbidden,
        ReapReason::Disconnected,
    ];

    /// The metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            ReapReason::Close => "close",
            ReapReason::Reset => "reset",
            ReapReason::Eof => "eof",
            ReapReason::PongTimeout => "pong_timeout",
            ReapReason::Overflow => "overflow",
            ReapReason::CloseTimeout => "close_timeout",
            ReapReason::Protocol => "protocol",
            ReapReason::Drain => "drain",
            ReapReason::HandshakeTimeout => "handshake_timeout",
            ReapReason::Limit => "limit",
            ReapReason::TokenExpired => "token_expired",
            ReapReason::Forbidden => "forbidden",
            ReapReason::Disconnected => "disconnect",
        }
    }

    /// Whether the connection ended without a close frame from the peer (counted as close
    /// code 1006, abnormal closure, RFC 6455 §7.1.5).
    pub fn is_abnormal(self) -> bool {
        matches!(self, ReapReason::Reset | ReapReason::Eof | ReapReason::PongTimeout)
    }
}
