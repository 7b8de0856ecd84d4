//! The `http_body` target: a chunked request body, and the target and query decoders.

use super::{bucket, hash_of, hex_prefix, split_schedules, Signature, MAX_BODY_BYTES};
use tether_proto::http::HttpError;
use tether_proto::http::{decode_chunked, percent_decode, query_param};

type Decoded = Result<Option<(Vec<u8>, usize)>, HttpError>;

/// Decodes `data` as a `Transfer-Encoding: chunked` body ([`decode_chunked`], limit
/// `MAX_BODY_BYTES`) whole and at the prefixes a split schedule reads, and panics unless:
/// - a decoded body is within the limit, no longer than what it consumed, consumed no more
///   than `data`, and decodes again the same from a one-chunk encoding of it;
/// - every prefix is "incomplete" until the whole result is decided, and then the same
///   result (the same body and length, or the same refusal): a body arriving in reads is
///   decoded as if it had arrived at once.
///
/// Also runs [`percent_decode`] and [`query_param`] on the bytes as text (decoded output is
/// never longer than its input). Returns the signature: result kind, refusal reason, sizes.
pub fn http_body(data: &[u8]) -> Signature {
    let whole = decode_chunked(data, MAX_BODY_BYTES);
    check_whole(data, &whole);
    for cuts in split_schedules(data) {
        for cut in cuts {
            check_prefix(data, cut, &whole);
        }
    }
    check_text_decoders(data);
    signature(&whole)
}

/// [`http_body`] with the given prefixes only (positions in `data`; proptest chooses them).
pub fn http_body_split(data: &[u8], cuts: &[usize]) -> Signature {
    let whole = decode_chunked(data, MAX_BODY_BYTES);
    check_whole(data, &whole);
    for &cut in cuts {
        check_prefix(data, cut.min(data.len()), &whole);
    }
    signature(&whole)
}

fn check_whole(data: &[u8], whole: &Decoded) {
    let Ok(Some((body, consumed))) = whole else { return };
    assert!(body.len() <= MAX_BODY_BYTES, "http_body: {} bytes decoded over the limit", body.len());
    assert!(body.len() <= *consumed && *consumed <= data.len(), "http_body: consumed {consumed} of {}", data.len());
    let mut again = Vec::with_capacity(body.len() + 32);
    if !body.is_empty() {
        again.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
        again.extend_from_slice(body);
        again.extend_from_slice(b"\r\n");
    }
    again.extend_from_slice(b"0\r\n\r\n");
    let round = decode_chunked(&again, MAX_BODY_BYTES);
    assert_eq!(round, Ok(Some((body.clone(), again.len()))), "http_body: one-chunk re-encoding decodes differently");
}

fn check_prefix(data: &[u8], cut: usize, whole: &Decoded) {
    let prefix = decode_chunked(&data[..cut], MAX_BODY_BYTES);
    let ok = match (whole, &prefix) {
        (_, Ok(None)) => match whole {
            // Incomplete is right unless the prefix already holds the whole body.
            Ok(Some((_, consumed))) => cut < *consumed,
            _ => true,
        },
        (Ok(Some((_, consumed))), Ok(Some(_))) => cut >= *consumed && prefix == *whole,
        (Err(_), Err(_)) => prefix == *whole,
        _ => false,
    };
    if !ok {
        panic!(
            "http_body: the prefix of {cut} bytes decodes to {prefix:?}, the whole input to {whole:?}\ninput: {}",
            hex_prefix(data, 512)
        );
    }
}

fn check_text_decoders(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Some(decoded) = percent_decode(&text) {
        assert!(decoded.len() <= text.len(), "http_body: percent-decoding grew {text:?}");
    }
    for key in ["top", "token", ""] {
        if let Some(v) = query_param(&text, key) {
            assert!(v.len() <= text.len(), "http_body: query value longer than the query {text:?}");
        }
    }
}

fn signature(whole: &Decoded) -> Signature {
    match whole {
        Ok(None) => hash_of("more"),
        Ok(Some((body, consumed))) => hash_of(("body", bucket(body.len()), bucket(*consumed))),
        Err(e) => hash_of(("refused", e.status, e.reason)),
    }
}
