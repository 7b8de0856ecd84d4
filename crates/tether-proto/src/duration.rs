//! Durations as an operator types them on a command line (`tether token --ttl`, `tether load
//! --duration`).

use std::time::Duration;

/// Parses a duration: a number with an optional unit `ms`, `s`, `m` or `h` (no unit =
/// seconds), e.g. `500ms`, `30s`, `1.5m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num.parse().map_err(|_| format!("bad duration {s:?} (e.g. 30s, 500ms)"))?;
    let secs = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => return Err(format!("bad duration unit {other:?} in {s:?} (ms, s, m, h)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("duration {s:?} out of range"))
}
