//! The server → client texts of the protocol (docs/protocol.md): `msg` (as JSON and as the
//! shared, already framed WebSocket frame), `subscribed`, `reset`, `ack`, `error`,
//! `unsubscribed`, `refreshed`, `seq`, and the JSON writers they share. Each is one compact
//! JSON object with no trailing newline, built in one allocation sized up front.

use bytes::Bytes;

use super::valid_channel;

/// `{"op":"msg","ch":CH,"seq":SEQ,"data":DATA}`. One allocation, sized up front: it runs once
/// per publish.
pub fn msg_json(ch: &str, seq: u64, data: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(msg_json_capacity(ch, data));
    push_msg(&mut out, ch, seq, data);
    out
}

/// [`msg_json`] already framed as one unmasked, unfragmented WebSocket text frame (RFC 6455
/// §5.2, §5.6: FIN, opcode 0x1, no mask, 7/16/64-bit payload length), ready to be shared by
/// every subscriber on every core. One allocation for header and payload.
pub fn msg_frame(ch: &str, seq: u64, data: &str) -> Bytes {
    crate::ws::codec::text_frame_with(msg_json_capacity(ch, data), |out| push_msg(out, ch, seq, data))
}

/// `{"op":"subscribed","ch":CH,"seq":SEQ,"epoch":EPOCH[,"recovered":BOOL]}`; `recovered` only
/// when the `sub` carried `from` (docs/protocol.md, resume).
pub fn subscribed_json(ch: &str, seq: u64, epoch: &str, recovered: Option<bool>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + ch.len() + epoch.len());
    out.extend_from_slice(b"{\"op\":\"subscribed\",\"ch\":");
    push_channel(&mut out, ch);
    out.extend_from_slice(b",\"seq\":");
    push_u64(&mut out, seq);
    out.extend_from_slice(b",\"epoch\":");
    push_json_str(&mut out, epoch);
    if let Some(r) = recovered {
        out.extend_from_slice(if r { b",\"recovered\":true" } else { b",\"recovered\":false" });
    }
    out.push(b'}');
    out
}

/// Why a resume point is gone (docs/protocol.md, `reset.reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetReason {
    /// `from` is older than the oldest seq still in the history ring.
    Evicted,
    /// The client's `epoch` is not the channel's current one (its numbering restarted).
    Epoch,
}

impl ResetReason {
    /// The wire token: `"evicted"` or `"epoch"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ResetReason::Evicted => "evicted",
            ResetReason::Epoch => "epoch",
        }
    }
}

/// `{"op":"reset","ch":CH,"seq":SEQ,"epoch":EPOCH,"reason":REASON,"oldest":OLDEST}`: the client
/// must start over; live messages continue at `seq + 1`; `oldest` is the oldest seq still in
/// history.
pub fn reset_json(ch: &str, seq: u64, epoch: &str, reason: ResetReason, oldest: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(96 + ch.len() + epoch.len());
    out.extend_from_slice(b"{\"op\":\"reset\",\"ch\":");
    push_channel(&mut out, ch);
    out.extend_from_slice(b",\"seq\":");
    push_u64(&mut out, seq);
    out.extend_from_slice(b",\"epoch\":");
    push_json_str(&mut out, epoch);
    out.extend_from_slice(b",\"reason\":\"");
    out.extend_from_slice(reason.as_str().as_bytes());
    out.extend_from_slice(b"\",\"oldest\":");
    push_u64(&mut out, oldest);
    out.push(b'}');
    out
}

/// `{"op":"ack","id":ID,"ch":CH,"seq":SEQ}`: the publish `id` is stored as `seq`.
pub fn ack_json(id: &str, ch: &str, seq: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + id.len() + ch.len());
    out.extend_from_slice(b"{\"op\":\"ack\",\"id\":");
    push_json_str(&mut out, id);
    out.extend_from_slice(b",\"ch\":");
    push_channel(&mut out, ch);
    out.extend_from_slice(b",\"seq\":");
    push_u64(&mut out, seq);
    out.push(b'}');
    out
}

/// `{"op":"error","code":CODE,"reason":REASON[,"id":ID]}`.
pub fn error_json(code: &str, reason: &str, id: Option<&str>) -> Vec<u8> {
    error_json_retry(code, reason, id, None)
}

/// [`error_json`] with `"retry_after_ms":N` when `retry_after_ms` is given (an `unavailable`
/// refusal: the client retries the same request after that many milliseconds).
pub fn error_json_retry(code: &str, reason: &str, id: Option<&str>, retry_after_ms: Option<u64>) -> Vec<u8> {
    let mut out = Vec::with_capacity(72 + code.len() + reason.len() + id.map_or(0, str::len));
    out.extend_from_slice(b"{\"op\":\"error\",\"code\":");
    push_json_str(&mut out, code);
    out.extend_from_slice(b",\"reason\":");
    push_json_str(&mut out, reason);
    if let Some(id) = id {
        out.extend_from_slice(b",\"id\":");
        push_json_str(&mut out, id);
    }
    if let Some(ms) = retry_after_ms {
        out.extend_from_slice(b",\"retry_after_ms\":");
        push_u64(&mut out, ms);
    }
    out.push(b'}');
    out
}

/// `json` (an `error` object) with `"ch":CH` added: the refusal of a `sub`, which has no
/// `id`, names its channel so the client knows which one to send again.
pub fn with_channel(mut json: Vec<u8>, ch: &str) -> Vec<u8> {
    if json.last() == Some(&b'}') {
        json.pop();
        json.extend_from_slice(b",\"ch\":");
        push_json_str(&mut json, ch);
        json.push(b'}');
    }
    json
}

/// `{"op":"unsubscribed","ch":CH}`: the answer to an `unsub` that ended a subscription.
pub fn unsubscribed_json(ch: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(40 + ch.len());
    out.extend_from_slice(b"{\"op\":\"unsubscribed\",\"ch\":");
    push_channel(&mut out, ch);
    out.push(b'}');
    out
}

/// `{"op":"refreshed","exp":EXP}`: the answer to a `refresh` whose token verified; `exp` is the
/// new token's expiry in seconds since the Unix epoch (docs/security.md).
pub fn refreshed_json(exp_s: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(48);
    out.extend_from_slice(b"{\"op\":\"refreshed\",\"exp\":");
    push_u64(&mut out, exp_s);
    out.push(b'}');
    out
}

/// `{"seq":SEQ}`: the body of a successful `POST /publish/{channel}` (docs/http.md).
pub fn seq_json(seq: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(28);
    out.extend_from_slice(b"{\"seq\":");
    push_u64(&mut out, seq);
    out.push(b'}');
    out
}

/// Appends `s` as a quoted, escaped JSON string (RFC 8259 §7, via `serde_json`).
pub fn push_json_str(out: &mut Vec<u8>, s: &str) {
    // Writing into a Vec cannot fail, and a &str always serializes.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Appends the decimal digits of `n`.
pub fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Valid names need no escaping, so they are copied raw; anything else is escaped so a caller
/// that skipped validation still emits valid JSON.
pub(crate) fn push_channel(out: &mut Vec<u8>, ch: &str) {
    if valid_channel(ch) {
        out.push(b'"');
        out.extend_from_slice(ch.as_bytes());
        out.push(b'"');
    } else {
        push_json_str(out, ch);
    }
}

fn push_msg(out: &mut Vec<u8>, ch: &str, seq: u64, data: &str) {
    out.extend_from_slice(b"{\"op\":\"msg\",\"ch\":");
    push_channel(out, ch);
    out.extend_from_slice(b",\"seq\":");
    push_u64(out, seq);
    out.extend_from_slice(b",\"data\":");
    out.extend_from_slice(data.as_bytes());
    out.push(b'}');
}

/// Upper bound of [`push_msg`]'s output: fixed text, 20 digits, and the channel (escaped at
/// worst 6 bytes per byte when invalid).
fn msg_json_capacity(ch: &str, data: &str) -> usize {
    let ch_len = if valid_channel(ch) { ch.len() + 2 } else { ch.len() * 6 + 2 };
    36 + ch_len + 20 + data.len()
}
