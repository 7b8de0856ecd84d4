//! Redis's clock as this node sees it: the offset between the two, measured with `TIME`,
//! so that a script's deadline can be written on Redis's clock (the publish script and the
//! lease write scripts compare it with Redis `TIME`; docs/redis.md).

use super::thread::Ctx;

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

/// A `TIME` answered slower than this (round trip, ms) does not replace a measured offset:
/// its error is up to half the round trip.
const CLOCK_SAMPLE_RTT_MS: i64 = 100;

/// Asks Redis `TIME` on the command link (as [`Ctx::query`]) and records
/// [`clock_offset_ms`] in [`Ctx::clock_offset_ms`] (the first answer always; later ones
/// when their round trip was under [`CLOCK_SAMPLE_RTT_MS`]).
pub(super) async fn measure_clock(ctx: &Ctx) -> redis::RedisResult<()> {
    let before = local_ms();
    let time = ctx.query(&redis::cmd("TIME")).await?;
    let after = local_ms();
    if after - before < CLOCK_SAMPLE_RTT_MS || !ctx.clock_measured.get() {
        ctx.clock_offset_ms.set(clock_offset_ms(before, time, after));
        ctx.clock_measured.set(true);
    }
    Ok(())
}
