//! Measuring Redis's clock on the broker's command link ([`crate::redis::clock`] holds the
//! arithmetic, shared with the lease store).

use super::thread::Ctx;
use crate::redis::clock::{clock_offset_ms, local_ms};

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
