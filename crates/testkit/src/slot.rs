//! [`key_slot`]: which of the 16384 Redis Cluster slots a key belongs to.
//!
//! Redis Cluster hashes a key with CRC16 in its XMODEM form (polynomial 0x1021, initial value
//! 0, bits not reflected, no final xor) and keeps the low 14 bits. When the key holds a hash
//! tag, a `{` followed later by a `}` with at least one byte between them, only the bytes
//! between the first `{` and the first `}` after it are hashed, so that `sb:{pt:a.b}:m` and
//! `sb:{pt:a.b}:h` share a slot.

/// Number of slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The slot of `key`, as `CLUSTER KEYSLOT key` computes it.
pub fn key_slot(key: impl AsRef<[u8]>) -> u16 {
    crc16_xmodem(hashed_part(key.as_ref())) % SLOTS
}

/// The hash tag of `key` if it has a non-empty one, else the whole key.
fn hashed_part(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else { return key };
    let rest = &key[open + 1..];
    match rest.iter().position(|&b| b == b'}') {
        Some(len) if len > 0 => &rest[..len],
        _ => key,
    }
}

/// CRC16/XMODEM, bit by bit: each byte enters at the top of the register, and each bit shifted
/// out at the top folds the polynomial back in.
fn crc16_xmodem(data: &[u8]) -> u16 {
    const POLY: u16 = 0x1021;
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ POLY } else { crc << 1 };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn testkit_crc16_xmodem_check_value() {
        // The catalogued check value of CRC-16/XMODEM over the ASCII digits 1 to 9.
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
        assert_eq!(crc16_xmodem(b""), 0);
    }

    #[test]
    fn testkit_hash_tag_rules() {
        assert_eq!(hashed_part(b"sb:{pt:a.b}:m"), b"pt:a.b");
        assert_eq!(hashed_part(b"{user1000}.following"), b"user1000");
        // The first `{` and the first `}` after it; an empty tag hashes the whole key.
        assert_eq!(hashed_part(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hashed_part(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hashed_part(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(hashed_part(b"foo{bar"), b"foo{bar");
        assert_eq!(hashed_part(b"}foo{"), b"}foo{");
        assert_eq!(key_slot("a{tag}b"), key_slot("tag"));
        assert!(key_slot("anything") < SLOTS);
    }
}
