//! The `Date` header (RFC 9110 §6.6.1): an origin server with a clock MUST send it in its 2xx,
//! 3xx and 4xx responses (tether sends it in every final response). The formatting is pure
//! ([`imf_fixdate`]); the current second is read once per second per thread and cached, so a
//! response costs a clock read and a copy, not a formatting.

use std::cell::Cell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Length of an IMF-fixdate, `Sun, 06 Nov 1994 08:49:37 GMT`.
const LEN: usize = 29;

thread_local! {
    /// The second last formatted and its text.
    static CACHE: Cell<(u64, [u8; LEN])> = const { Cell::new((u64::MAX, [0; LEN])) };
}

/// `unix_secs` (seconds since 1970-01-01T00:00:00Z) as an IMF-fixdate (RFC 9110 §5.6.7),
/// e.g. 784111777 → `Sun, 06 Nov 1994 08:49:37 GMT`, formatted by `httpdate`. Years past 9999
/// are not representable in the format and are clamped to 9999-12-31T23:59:59Z.
pub fn imf_fixdate(unix_secs: u64) -> [u8; LEN] {
    let at = UNIX_EPOCH + Duration::from_secs(unix_secs.min(253_402_300_799));
    let mut out = [0u8; LEN];
    out.copy_from_slice(httpdate::fmt_http_date(at).as_bytes());
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
