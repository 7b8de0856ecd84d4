//! The `Date` header (RFC 9110 §6.6.1): an origin server with a clock MUST send it in its 2xx,
//! 3xx and 4xx responses (tether sends it in every final response). The formatting is pure
//! ([`imf_fixdate`]); the current second is read once per second per thread and cached, so a
//! response costs a clock read and a copy, not a formatting.

use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

/// Length of an IMF-fixdate, `Sun, 06 Nov 1994 08:49:37 GMT`.
const LEN: usize = 29;

const DAYS: [&[u8; 3]; 7] = [b"Thu", b"Fri", b"Sat", b"Sun", b"Mon", b"Tue", b"Wed"];
const MONTHS: [&[u8; 3]; 12] =
    [b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec"];

thread_local! {
    /// The second last formatted and its text.
    static CACHE: Cell<(u64, [u8; LEN])> = const { Cell::new((u64::MAX, [0; LEN])) };
}

/// `unix_secs` (seconds since 1970-01-01T00:00:00Z) as an IMF-fixdate (RFC 9110 §5.6.7),
/// e.g. 784111777 → `Sun, 06 Nov 1994 08:49:37 GMT`. Years past 9999 are not representable
/// in the format and are clamped to 9999-12-31T23:59:59Z.
pub fn imf_fixdate(unix_secs: u64) -> [u8; LEN] {
    let unix_secs = unix_secs.min(253_402_300_799);
    let days = unix_secs / 86_400;
    let secs = unix_secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    let mut out = [0u8; LEN];
    out[..3].copy_from_slice(DAYS[(days % 7) as usize]);
    out[3..5].copy_from_slice(b", ");
    two(&mut out[5..7], d);
    out[7] = b' ';
    out[8..11].copy_from_slice(MONTHS[(m - 1) as usize]);
    out[11] = b' ';
    two(&mut out[12..14], y / 100);
    two(&mut out[14..16], y % 100);
    out[16] = b' ';
    two(&mut out[17..19], secs / 3600);
    out[19] = b':';
    two(&mut out[20..22], secs / 60 % 60);
    out[22] = b':';
    two(&mut out[23..25], secs % 60);
    out[25..].copy_from_slice(b" GMT");
    out
}

/// Appends `Date: <now>\r\n`.
pub(super) fn push_date_header(out: &mut Vec<u8>) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let text = CACHE.with(|c| {
        let (secs, text) = c.get();
        if secs == now {
            return text;
        }
        let text = imf_fixdate(now);
        c.set((now, text));
        text
    });
    out.extend_from_slice(b"Date: ");
    out.extend_from_slice(&text);
    out.extend_from_slice(b"\r\n");
}

fn two(out: &mut [u8], n: u64) {
    out[0] = b'0' + (n / 10 % 10) as u8;
    out[1] = b'0' + (n % 10) as u8;
}

/// (year, month 1–12, day 1–31) of `days` since 1970-01-01, proleptic Gregorian calendar
/// (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(secs: u64) -> String {
        String::from_utf8(imf_fixdate(secs).to_vec()).unwrap()
    }

    #[test]
    fn known_dates() {
        // The example of RFC 9110 §5.6.7.
        assert_eq!(text(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(text(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        // Leap day, and the last second of a leap year.
        assert_eq!(text(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(text(1_735_689_599), "Tue, 31 Dec 2024 23:59:59 GMT");
        assert_eq!(text(4_102_444_800), "Fri, 01 Jan 2100 00:00:00 GMT");
        assert_eq!(text(u64::MAX), "Fri, 31 Dec 9999 23:59:59 GMT");
    }

    #[test]
    fn header_is_cached_per_second_and_well_formed() {
        let mut a = Vec::new();
        push_date_header(&mut a);
        let t = std::str::from_utf8(&a).unwrap();
        assert!(t.starts_with("Date: ") && t.ends_with(" GMT\r\n") && t.len() == 6 + LEN + 2, "{t:?}");
    }
}
