//! Redis's clock as this node sees it: the offset between the two, measured with `TIME`,
//! so that a script's deadline can be written on Redis's clock (the broker's publish script
//! and the lease store's write scripts compare it with Redis `TIME`; docs/redis.md).

/// This node's clock, in milliseconds since the Unix epoch.
pub fn local_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Redis's clock minus this node's, in milliseconds: `time` is Redis's `TIME` reply
/// (seconds, microseconds), asked between this node's `before` and `after` ([`local_ms`]);
/// it is compared with the midpoint.
pub fn clock_offset_ms(before: i64, time: (i64, i64), after: i64) -> i64 {
    time.0 * 1000 + time.1 / 1000 - (before + after) / 2
}
