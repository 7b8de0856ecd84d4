//! Range, shape and coherence checks for [`Config`]; each failure names the key and the
//! value. [`validate`] refuses what cannot work (a message the server accepts but can never
//! deliver, a timeout the timer cannot represent, a broker this build does not have);
//! [`warnings`] lists what works but is probably not meant (history larger than the box's
//! memory, a drain longer than the service manager waits).

use super::{BrokerKind, Config, ConfigError, DEDUP_BYTES_PER_ID};
use crate::protocol::MSG_FRAME_OVERHEAD;

const GIB: usize = 1 << 30;
const MIB: usize = 1 << 20;

/// Largest `cores`: beyond this the value is a typo, not a machine.
const MAX_CORES: usize = 1024;
/// Largest `channels[].history` (a history ring per channel).
const MAX_HISTORY: usize = 10_000_000;
/// Largest `drain.window_ms` (one hour).
const MAX_DRAIN_WINDOW_MS: u64 = 3_600_000;
/// Longest pattern and channel name in bytes (docs/protocol.md, channel names).
const MAX_PATTERN_BYTES: usize = 128;
/// Close codes a drain may send (docs/protocol.md, close codes): normal, going away, service
/// restart, try again later.
pub(super) const DRAIN_CLOSE_CODES: [u16; 4] = [1000, 1001, 1012, 1013];
/// Longest timeout or interval in milliseconds (one day): deadlines live on a timer of 10 ms
/// ticks counted in 32 bits, whose comparisons hold for about 248 days.
const MAX_TIMEOUT_MS: u64 = 86_400_000;

/// Bytes of an outbound queue kept for control frames and replies around the largest message
/// (a ping, pongs, an `ack` or `error`, the close frame): a queue must hold one message of the
/// largest accepted size plus this, or a subscriber that reads could still be closed with 1013.
pub const QUEUE_CONTROL_RESERVE: usize = 4096;

/// `TimeoutStopSec` of the shipped `systemd/tether.service`, in milliseconds: a drain must end
/// before it, or systemd kills the process mid-drain. `tests/config_coherent_limits.rs` checks
/// this against the unit file.
pub const SHIPPED_UNIT_STOP_TIMEOUT_MS: u64 = 30_000;

/// Longest wait of a client's reconnect backoff (`client::BackoffConfig`, cap 30 s): a publish
/// retried after that long must still be remembered by dedup.
const CLIENT_BACKOFF_CAP_MS: u64 = 30_000;

/// Idle cut of common load balancers and proxies (AWS ALB, nginx `proxy_read_timeout`): 60 s.
const COMMON_IDLE_CUT_MS: u64 = 60_000;

/// A single channel's or the dedup table's worst case is flagged above this share of memory.
const MEMORY_SHARE: u64 = 4;

/// `key = value` must lie in `lo..=hi`.
pub(super) fn range<T>(key: &str, value: T, lo: T, hi: T) -> Result<(), ConfigError>
where
    T: PartialOrd + std::fmt::Display + Copy,
{
    if value < lo {
        return Err(ConfigError::new(key, value, format!("must be at least {lo}")));
    }
    if value > hi {
        return Err(ConfigError::new(key, value, format!("must be at most {hi}")));
    }
    Ok(())
}

/// TOML rendering of a string value for error messages.
fn quoted(s: &str) -> String {
    format!("{s:?}")
}

/// Whether `c` may appear in a channel-rule pattern: the channel charset plus `*` and `?`.
fn pattern_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b':' | b'-' | b'*' | b'?')
}

pub(super) fn validate(c: &Config) -> Result<(), ConfigError> {
    range("cores", c.cores, 0, MAX_CORES)?;
    range("max_connections", c.max_connections, 1, usize::MAX)?;

    let l = &c.limits;
    range("limits.handshake_timeout_ms", l.handshake_timeout_ms, 100, MAX_TIMEOUT_MS)?;
    range("limits.max_header_bytes", l.max_header_bytes, 1024, MIB)?;
    range("limits.max_message_bytes", l.max_message_bytes, 125, GIB)?;
    range("limits.max_publish_bytes", l.max_publish_bytes, 1, GIB)?;
    range("limits.queue_max_bytes", l.queue_max_bytes, 1024, usize::MAX)?;
    range("limits.queue_max_messages", l.queue_max_messages, 1, usize::MAX)?;
    range("limits.close_timeout_ms", l.close_timeout_ms, 100, MAX_TIMEOUT_MS)?;
    queue_holds_the_largest_message(c)?;

    range("heartbeat.ping_interval_ms", c.heartbeat.ping_interval_ms, 100, MAX_TIMEOUT_MS)?;
    range("heartbeat.pong_timeout_ms", c.heartbeat.pong_timeout_ms, 1, MAX_TIMEOUT_MS)?;

    range("drain.window_ms", c.drain.window_ms, 0, MAX_DRAIN_WINDOW_MS)?;
    if !DRAIN_CLOSE_CODES.contains(&c.drain.close_code) {
        return Err(ConfigError::new("drain.close_code", c.drain.close_code, "must be one of 1000, 1001, 1012, 1013"));
    }

    validate_channels(c)?;

    range("dedup.window_ms", c.dedup.window_ms, 1000, MAX_TIMEOUT_MS)?;
    range("dedup.max_entries", c.dedup.max_entries, 1, usize::MAX)?;

    if c.broker.kind == BrokerKind::Redis {
        validate_redis(&c.broker)?;
    }

    super::security::validate(c)?;
    super::presence::validate(c)?;
    super::compression::validate(c)?;
    super::tls::validate(c)?;
    super::feeds::validate(c)?;
    validate_origins(c)
}

/// `[broker]` with `kind = "redis"`: URL schemes, the key prefix, the timings.
pub(super) fn validate_redis(b: &super::Broker) -> Result<(), ConfigError> {
    let scheme_ok = |u: &str, unix: bool| {
        u.starts_with("redis://") || u.starts_with("rediss://") || (unix && u.starts_with("unix://"))
    };
    if b.urls.is_empty() && !scheme_ok(&b.url, !b.cluster) {
        let want = if b.cluster { "redis:// or rediss://" } else { "redis://, rediss:// or unix://" };
        return Err(ConfigError::new(
            "broker.url",
            quoted(&crate::logging::redact_url(&b.url)),
            format!("must start with {want} when broker.kind = \"redis\""),
        ));
    }
    for (i, u) in b.urls.iter().enumerate() {
        if !scheme_ok(u, false) {
            return Err(ConfigError::new(
                format!("broker.urls[{i}]"),
                quoted(&crate::logging::redact_url(u)),
                "a cluster seed node must start with redis:// or rediss://",
            ));
        }
    }
    if b.key_prefix.contains(['{', '}']) {
        return Err(ConfigError::new(
            "broker.key_prefix",
            quoted(&b.key_prefix),
            "must not contain { or } (the channel name is the cluster hash tag)",
        ));
    }
    range("broker.history_ttl_ms", b.history_ttl_ms, 60_000, 31_536_000_000)?;
    range("broker.request_timeout_ms", b.request_timeout_ms, 100, 60_000)?;
    Ok(())
}

/// The largest message the server accepts, as a `msg` frame, plus [`QUEUE_CONTROL_RESERVE`]
/// must fit `limits.queue_max_bytes`; otherwise every subscriber of such a message, reading or
/// not, is closed with 1013 the moment it is published.
fn queue_holds_the_largest_message(c: &Config) -> Result<(), ConfigError> {
    let l = &c.limits;
    for (key, accepted) in
        [("limits.max_publish_bytes", l.max_publish_bytes), ("limits.max_message_bytes", l.max_message_bytes)]
    {
        let needed = accepted + MSG_FRAME_OVERHEAD + QUEUE_CONTROL_RESERVE;
        if needed > l.queue_max_bytes {
            return Err(ConfigError::new(
                "limits.queue_max_bytes",
                l.queue_max_bytes,
                format!(
                    "cannot hold one message of {key} = {accepted} bytes \
                     ({accepted} + {MSG_FRAME_OVERHEAD} bytes of msg envelope and frame header + \
                     {QUEUE_CONTROL_RESERVE} for control frames = {needed}), so every subscriber \
                     of such a message would be closed with 1013: raise limits.queue_max_bytes to \
                     at least {needed} or lower {key} to at most {}",
                    l.queue_max_bytes.saturating_sub(MSG_FRAME_OVERHEAD + QUEUE_CONTROL_RESERVE)
                ),
            ));
        }
    }
    Ok(())
}

/// What works but is probably not meant, each naming its key. `memory_bytes` is the box's
/// memory (`MemTotal`), when known, for the memory checks. The caller logs them at start.
pub(super) fn warnings(c: &Config, memory_bytes: Option<u64>) -> Vec<ConfigError> {
    let mut out = Vec::new();
    let l = &c.limits;
    let hb = &c.heartbeat;
    let gib = |b: u64| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64);

    let largest_frame = (l.max_publish_bytes.max(l.max_message_bytes) + MSG_FRAME_OVERHEAD) as u64;
    if let Some(mem) = memory_bytes {
        for (i, rule) in c.channels.iter().enumerate() {
            let worst = rule.history as u64 * largest_frame;
            if worst > mem / MEMORY_SHARE {
                out.push(ConfigError::new(
                    format!("channels[{i}].history"),
                    rule.history,
                    format!(
                        "one channel's history can hold {} (history x the largest message, \
                         {largest_frame} bytes), more than a quarter of this box's memory ({}): \
                         lower the history or limits.max_publish_bytes",
                        gib(worst),
                        gib(mem)
                    ),
                ));
            }
        }
        let dedup = c.dedup.max_entries as u64 * DEDUP_BYTES_PER_ID;
        if dedup > mem / MEMORY_SHARE {
            out.push(ConfigError::new(
                "dedup.max_entries",
                c.dedup.max_entries,
                format!(
                    "remembering that many publish ids takes about {} ({DEDUP_BYTES_PER_ID} B \
                     each), more than a quarter of this box's memory ({})",
                    gib(dedup),
                    gib(mem)
                ),
            ));
        }
    }
    if hb.pong_timeout_ms >= hb.ping_interval_ms {
        out.push(ConfigError::new(
            "heartbeat.pong_timeout_ms",
            hb.pong_timeout_ms,
            format!(
                "not below heartbeat.ping_interval_ms = {}: no ping is sent while a pong is \
                 awaited, so a dead peer is found only after ping_interval_ms + pong_timeout_ms",
                hb.ping_interval_ms
            ),
        ));
    }
    if hb.ping_interval_ms >= COMMON_IDLE_CUT_MS {
        out.push(ConfigError::new(
            "heartbeat.ping_interval_ms",
            hb.ping_interval_ms,
            "not below the 60 s idle timeout of common load balancers and proxies: quiet \
             connections behind one will be cut",
        ));
    }
    let drain_ms = c.drain.window_ms + l.close_timeout_ms.min(super::DRAIN_CLOSE_WAIT_MS);
    if drain_ms >= SHIPPED_UNIT_STOP_TIMEOUT_MS {
        out.push(ConfigError::new(
            "drain.window_ms",
            c.drain.window_ms,
            format!(
                "a drain takes up to {drain_ms} ms (window + the last close handshakes), not \
                 less than TimeoutStopSec = {} s of the shipped systemd unit: raise \
                 TimeoutStopSec in tether.service or systemd kills the process mid-drain",
                SHIPPED_UNIT_STOP_TIMEOUT_MS / 1000
            ),
        ));
    }
    if c.dedup.window_ms < CLIENT_BACKOFF_CAP_MS {
        out.push(ConfigError::new(
            "dedup.window_ms",
            c.dedup.window_ms,
            "shorter than the client's 30 s reconnect backoff cap: a publish retried after a \
             long reconnect can be stored twice",
        ));
    }
    if l.queue_max_messages < 4 {
        out.push(ConfigError::new(
            "limits.queue_max_messages",
            l.queue_max_messages,
            "a ping or reply waiting in the queue leaves no room for a message: subscribers \
             that read are closed with 1013",
        ));
    }
    if l.handshake_timeout_ms > COMMON_IDLE_CUT_MS {
        out.push(ConfigError::new(
            "limits.handshake_timeout_ms",
            l.handshake_timeout_ms,
            "half-sent request heads and idle HTTP keep-alive connections hold a file \
             descriptor this long each (slowloris): keep it to a few seconds",
        ));
    }
    out
}

fn validate_channels(c: &Config) -> Result<(), ConfigError> {
    for (i, rule) in c.channels.iter().enumerate() {
        let key = format!("channels[{i}].pattern");
        let p = rule.pattern.as_bytes();
        if p.is_empty() || p.len() > MAX_PATTERN_BYTES {
            return Err(ConfigError::new(key, quoted(&rule.pattern), "must be 1 to 128 bytes"));
        }
        if let Some(&bad) = p.iter().find(|&&b| !pattern_char(b)) {
            return Err(ConfigError::new(
                key,
                quoted(&rule.pattern),
                format!("character {:?} not allowed; use [A-Za-z0-9._:-] and the wildcards * and ?", bad as char),
            ));
        }
        // A rule after an identical or match-everything rule can never be chosen: almost
        // certainly a mistake in rule order.
        if let Some((j, earlier)) = c.channels[..i]
            .iter()
            .enumerate()
            .find(|(_, e)| e.pattern == rule.pattern || e.pattern.bytes().all(|b| b == b'*'))
        {
            return Err(ConfigError::new(
                key,
                quoted(&rule.pattern),
                format!(
                    "unreachable: channels[{j}] (pattern {:?}) matches first; put specific patterns before general ones",
                    earlier.pattern
                ),
            ));
        }
        range(&format!("channels[{i}].history"), rule.history, 0, MAX_HISTORY)?;
    }
    Ok(())
}

fn validate_origins(c: &Config) -> Result<(), ConfigError> {
    for (i, origin) in c.allowed_origins.iter().enumerate() {
        let key = format!("allowed_origins[{i}]");
        if origin == "null" {
            continue;
        }
        let ok = origin
            .split_once("://")
            .map(|(scheme, rest)| {
                !scheme.is_empty()
                    && scheme.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
                    && !rest.is_empty()
                    && !rest.contains('/')
            })
            .unwrap_or(false)
            && origin.bytes().all(|b| b.is_ascii_graphic());
        if !ok {
            return Err(ConfigError::new(
                key,
                quoted(origin),
                "must be a serialized origin like \"https://app.example.com\" (no path, no spaces) or \"null\"",
            ));
        }
    }
    Ok(())
}
