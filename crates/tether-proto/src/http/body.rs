//! HTTP/1.1 message bodies, sans-IO: the `chunked` transfer coding (RFC 9112 §7.1) decoded
//! from the bytes after a request head.

use super::request::HttpError;
use crate::http::StatusCode;

/// Longest chunk-size line (size plus extensions, RFC 9112 §7.1.1) accepted in a chunked body.
const MAX_CHUNK_LINE: usize = 4096;

/// Largest trailer section (RFC 9112 §7.1.2) accepted after the last chunk; trailers are
/// discarded.
const MAX_TRAILER_BYTES: usize = 8192;

/// Decodes a `Transfer-Encoding: chunked` body (RFC 9112 §7.1) that starts at `buf[0]` (the
/// byte after the request head).
///
/// - `Ok(None)`: incomplete; call again with more bytes (nothing is consumed, no allocation).
/// - `Ok(Some((body, consumed)))`: the decoded body and the encoded bytes it took, trailers and
///   the final CRLF included; the next pipelined request starts at `buf[consumed]`.
/// - `Err(413)`: the decoded body would exceed `max_body_bytes`.
/// - `Err(400)`: bad chunk size, missing CRLF after a chunk, or a chunk line longer than 4 KiB
///   or trailers larger than 8 KiB.
pub fn decode_chunked(buf: &[u8], max_body_bytes: usize) -> Result<Option<(Vec<u8>, usize)>, HttpError> {
    // Walk once without copying so a body arriving in many reads costs no allocation per read.
    let Some((body_len, consumed)) = walk_chunks(buf, max_body_bytes, |_| ())? else {
        return Ok(None);
    };
    let mut body = Vec::with_capacity(body_len);
    walk_chunks(buf, max_body_bytes, |chunk| body.extend_from_slice(chunk))?;
    Ok(Some((body, consumed)))
}

/// Visits each chunk's data; returns (decoded length, encoded length) once the body is
/// complete.
fn walk_chunks(
    buf: &[u8],
    max_body_bytes: usize,
    mut on_chunk: impl FnMut(&[u8]),
) -> Result<Option<(usize, usize)>, HttpError> {
    let mut pos = 0;
    let mut body_len = 0usize;
    loop {
        let Some(line_len) = line_at(buf, pos, MAX_CHUNK_LINE)? else {
            return Ok(None);
        };
        let size = chunk_size(&buf[pos..pos + line_len + 2])?;
        pos += line_len + 2;
        if size == 0 {
            let trailer_start = pos;
            loop {
                let Some(line_len) = line_at(buf, pos, MAX_TRAILER_BYTES)? else {
                    return Ok(None);
                };
                pos += line_len + 2;
                if line_len == 0 {
                    return Ok(Some((body_len, pos)));
                }
                if pos - trailer_start > MAX_TRAILER_BYTES {
                    return Err(HttpError::new(StatusCode::BAD_REQUEST, "chunked trailers too large"));
                }
            }
        }
        body_len = body_len
            .checked_add(size)
            .filter(|&n| n <= max_body_bytes)
            .ok_or(HttpError::new(StatusCode::PAYLOAD_TOO_LARGE, "request body too large"))?;
        let Some(end) = pos.checked_add(size).filter(|&end| end + 2 <= buf.len()) else {
            return Ok(None);
        };
        if &buf[end..end + 2] != b"\r\n" {
            return Err(HttpError::new(StatusCode::BAD_REQUEST, "missing CRLF after chunk"));
        }
        on_chunk(&buf[pos..end]);
        pos = end + 2;
    }
}

/// Length of the line starting at `buf[pos]` (up to, excluding, CRLF); `None` if its end has
/// not arrived yet; 400 if it is already longer than `limit`.
fn line_at(buf: &[u8], pos: usize, limit: usize) -> Result<Option<usize>, HttpError> {
    let rest = &buf[pos.min(buf.len())..];
    match rest.windows(2).position(|w| w == b"\r\n") {
        Some(n) if n <= limit => Ok(Some(n)),
        Some(_) => Err(HttpError::new(StatusCode::BAD_REQUEST, "chunk line too long")),
        None if rest.len() > limit + 1 => Err(HttpError::new(StatusCode::BAD_REQUEST, "chunk line too long")),
        None => Ok(None),
    }
}

/// `chunk-size [BWS ";" chunk-ext] CRLF` → size; extensions are ignored (RFC 9112 §7.1.1).
/// Parsed by `httparse::parse_chunk_size`; a size past `u64` (which httparse refuses as
/// invalid) or `usize` is 413, like any body too large.
fn chunk_size(line: &[u8]) -> Result<usize, HttpError> {
    let too_large = || HttpError::new(StatusCode::PAYLOAD_TOO_LARGE, "request body too large");
    // httparse takes an empty size as 0; RFC 9112 §7.1 needs at least one HEXDIG.
    if !line.first().is_some_and(u8::is_ascii_hexdigit) {
        return Err(HttpError::new(StatusCode::BAD_REQUEST, "bad chunk size"));
    }
    match httparse::parse_chunk_size(line) {
        Ok(httparse::Status::Complete((_, size))) => usize::try_from(size).map_err(|_| too_large()),
        _ if overflows_u64(line) => Err(too_large()),
        _ => Err(HttpError::new(StatusCode::BAD_REQUEST, "bad chunk size")),
    }
}

/// Whether `line` starts with more significant hex digits than a `u64` holds (16).
fn overflows_u64(line: &[u8]) -> bool {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit());
    digits.skip_while(|&&b| b == b'0').count() > 16
}
