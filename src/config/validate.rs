//! Range and shape checks for [`Config`]; each failure names the key and the value.

use super::{BrokerKind, Config, ConfigError};

const GIB: usize = 1 << 30;
const MIB: usize = 1 << 20;

/// Largest `cores`: beyond this the value is a typo, not a machine.
const MAX_CORES: usize = 1024;
/// Largest `channels[].history` (DESIGN: history ring per channel).
const MAX_HISTORY: usize = 10_000_000;
/// Largest `drain.window_ms` (one hour).
const MAX_DRAIN_WINDOW_MS: u64 = 3_600_000;
/// Longest pattern and channel name in bytes (DESIGN §7 channel names).
const MAX_PATTERN_BYTES: usize = 128;
/// Close codes a drain may send (DESIGN §3 Close codes): normal, going away, service restart,
/// try again later.
pub(super) const DRAIN_CLOSE_CODES: [u16; 4] = [1000, 1001, 1012, 1013];

/// `key = value` must lie in `lo..=hi`.
fn range<T>(key: &str, value: T, lo: T, hi: T) -> Result<(), ConfigError>
where
    T: PartialOrd + std::fmt::Display + Copy,
{
    if value < lo {
        return Err(ConfigError::new(
            key,
            value,
            format!("must be at least {lo}"),
        ));
    }
    if value > hi {
        return Err(ConfigError::new(
            key,
            value,
            format!("must be at most {hi}"),
        ));
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
    range(
        "limits.handshake_timeout_ms",
        l.handshake_timeout_ms,
        100,
        u64::MAX,
    )?;
    range("limits.max_header_bytes", l.max_header_bytes, 1024, MIB)?;
    range("limits.max_message_bytes", l.max_message_bytes, 125, GIB)?;
    range("limits.max_publish_bytes", l.max_publish_bytes, 1, GIB)?;
    range(
        "limits.queue_max_bytes",
        l.queue_max_bytes,
        1024,
        usize::MAX,
    )?;
    range(
        "limits.queue_max_messages",
        l.queue_max_messages,
        1,
        usize::MAX,
    )?;
    range("limits.close_timeout_ms", l.close_timeout_ms, 100, u64::MAX)?;

    range(
        "heartbeat.ping_interval_ms",
        c.heartbeat.ping_interval_ms,
        100,
        u64::MAX,
    )?;
    range(
        "heartbeat.pong_timeout_ms",
        c.heartbeat.pong_timeout_ms,
        1,
        u64::MAX,
    )?;

    range("drain.window_ms", c.drain.window_ms, 0, MAX_DRAIN_WINDOW_MS)?;
    if !DRAIN_CLOSE_CODES.contains(&c.drain.close_code) {
        return Err(ConfigError::new(
            "drain.close_code",
            c.drain.close_code,
            "must be one of 1000, 1001, 1012, 1013",
        ));
    }

    validate_channels(c)?;

    range("dedup.window_ms", c.dedup.window_ms, 1000, u64::MAX)?;
    range("dedup.max_entries", c.dedup.max_entries, 1, usize::MAX)?;

    if c.broker.kind == BrokerKind::Redis
        && !(c.broker.url.starts_with("redis://") || c.broker.url.starts_with("rediss://"))
    {
        return Err(ConfigError::new(
            "broker.url",
            quoted(&c.broker.url),
            "must start with redis:// or rediss:// when broker.kind = \"redis\"",
        ));
    }

    validate_origins(c)
}

fn validate_channels(c: &Config) -> Result<(), ConfigError> {
    for (i, rule) in c.channels.iter().enumerate() {
        let key = format!("channels[{i}].pattern");
        let p = rule.pattern.as_bytes();
        if p.is_empty() || p.len() > MAX_PATTERN_BYTES {
            return Err(ConfigError::new(
                key,
                quoted(&rule.pattern),
                "must be 1 to 128 bytes",
            ));
        }
        if let Some(&bad) = p.iter().find(|&&b| !pattern_char(b)) {
            return Err(ConfigError::new(
                key,
                quoted(&rule.pattern),
                format!(
                    "character {:?} not allowed; use [A-Za-z0-9._:-] and the wildcards * and ?",
                    bad as char
                ),
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
        range(
            &format!("channels[{i}].history"),
            rule.history,
            0,
            MAX_HISTORY,
        )?;
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
                    && scheme
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
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
