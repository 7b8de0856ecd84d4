//! Payload masking (RFC 6455 §5.3), a word at a time.

/// XORs `buf` with the 4-byte masking key, where `buf[0]` is byte `offset` of the frame payload
/// (so a payload can be unmasked in pieces).
///
/// Works on `u64` words: the key repeats every 4 bytes, so a word-sized key is the key twice.
/// The loop is plain safe code that the compiler turns into SIMD for large payloads.
pub(crate) fn apply_mask(buf: &mut [u8], mask: [u8; 4], offset: usize) {
    let mut key = mask;
    key.rotate_left(offset % 4);
    let word = u64::from_ne_bytes([key[0], key[1], key[2], key[3], key[0], key[1], key[2], key[3]]);
    let mut words = buf.chunks_exact_mut(8);
    for chunk in &mut words {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(chunk);
        chunk.copy_from_slice(&(u64::from_ne_bytes(bytes) ^ word).to_ne_bytes());
    }
    // The tail starts at a multiple of 8, hence of 4: the rotated key lines up again at index 0.
    for (i, byte) in words.into_remainder().iter_mut().enumerate() {
        *byte ^= key[i & 3];
    }
}

#[cfg(test)]
mod tests {
    use super::apply_mask;

    fn naive(buf: &mut [u8], mask: [u8; 4], offset: usize) {
        for (i, b) in buf.iter_mut().enumerate() {
            *b ^= mask[(i + offset) % 4];
        }
    }

    #[test]
    fn matches_bytewise_masking_for_every_length_and_offset() {
        let mask = [0x6d, 0xb6, 0xb2, 0x80];
        let data: Vec<u8> = (0..100u8).map(|i| i.wrapping_mul(37)).collect();
        for len in 0..data.len() {
            for offset in 0..8 {
                let mut fast = data[..len].to_vec();
                let mut slow = fast.clone();
                apply_mask(&mut fast, mask, offset);
                naive(&mut slow, mask, offset);
                assert_eq!(fast, slow, "len {len} offset {offset}");
            }
        }
    }

    #[test]
    fn unmasking_in_pieces_equals_unmasking_at_once() {
        let mask = [1, 2, 3, 4];
        let data: Vec<u8> = (0..50u8).collect();
        let mut whole = data.clone();
        apply_mask(&mut whole, mask, 0);
        let mut pieces = data.clone();
        let (a, b) = pieces.split_at_mut(13);
        apply_mask(a, mask, 0);
        apply_mask(b, mask, 13);
        assert_eq!(whole, pieces);
    }
}
