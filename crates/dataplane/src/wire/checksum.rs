//! The Internet checksum (RFC 1071) and its incremental update (RFC 1624).

/// One's-complement sum of `data` as big-endian 16-bit words, not yet folded.
pub fn sum(data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    let mut acc: u32 = chunks
        .by_ref()
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

/// Fold carries into 16 bits.
pub fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The checksum to store for `data` (its checksum field zeroed).
pub fn compute(data: &[u8]) -> u16 {
    !fold(sum(data))
}

/// RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m'), so a router can patch one word without re-summing.
pub fn update(old_checksum: u16, old_word: u16, new_word: u16) -> u16 {
    let acc = u32::from(!old_checksum) + u32::from(!old_word) + u32::from(new_word);
    !fold(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1071_example() {
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(&data)), 0xddf2);
    }

    #[test]
    fn odd_length_pads_with_zero() {
        assert_eq!(sum(&[0x12, 0x34, 0x56]), 0x1234 + 0x5600);
    }
}
