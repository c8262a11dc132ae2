//! Bit streams for the trend chunks: a writer that appends the low `n` bits of a word, most
//! significant first, and a reader that takes them back in the same order.

/// An append-only bit stream. Bits fill each byte from its most significant end; the unused
/// tail of the last byte stays zero.
#[derive(Debug, Default, Clone)]
pub struct BitWriter {
    bytes: Vec<u8>,
    /// Bits written (the last byte holds `len % 8` of them, or 8 when that is 0).
    len: u32,
}

impl BitWriter {
    /// Appends the low `n` bits of `value` (`n` ≤ 64), most significant first.
    pub fn put(&mut self, value: u64, n: u32) {
        debug_assert!(n <= 64);
        let mut left = n;
        while left > 0 {
            let used = self.len % 8;
            if used == 0 {
                self.bytes.push(0);
            }
            let room = 8 - used;
            let take = room.min(left);
            let part = ((value >> (left - take)) & ((1u64 << take) - 1)) as u8;
            if let Some(last) = self.bytes.last_mut() {
                *last |= part << (room - take);
            }
            self.len += take;
            left -= take;
        }
    }

    pub fn bit(&mut self, set: bool) {
        self.put(u64::from(set), 1);
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The stream's bytes, without spare capacity (a sealed chunk keeps only what it uses).
    pub fn into_boxed(self) -> Box<[u8]> {
        self.bytes.into_boxed_slice()
    }
}

/// Reads a stream written by [`BitWriter`]. Reading past the end yields zero bits (a
/// well-formed chunk never does: its decoder reads exactly the buckets it holds).
#[derive(Debug, Clone)]
pub struct BitReader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> BitReader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        BitReader { bytes, pos: 0 }
    }

    /// The next `n` bits (`n` ≤ 64) as the low bits of a word.
    pub fn take(&mut self, n: u32) -> u64 {
        debug_assert!(n <= 64);
        let mut out = 0u64;
        let mut left = n;
        while left > 0 {
            let used = (self.pos % 8) as u32;
            let room = 8 - used;
            let take = room.min(left);
            let byte = self.bytes.get(self.pos / 8).copied().unwrap_or(0);
            let part = (byte >> (room - take)) & ((1u16 << take) - 1) as u8;
            // `take` ≤ 8 and `out` holds at most 64 - take bits here, so the shift keeps them.
            out = (out << take) | u64::from(part);
            self.pos += take as usize;
            left -= take;
        }
        out
    }

    pub fn bit(&mut self) -> bool {
        self.take(1) == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trend_bits_read_back_what_was_written() {
        let fields: Vec<(u64, u32)> =
            vec![(1, 1), (0, 1), (0x5a, 7), (u64::MAX, 64), (0, 64), (3, 2), (0x1234_5678_9abc, 48), (1, 64), (0, 0)];
        let mut w = BitWriter::default();
        for &(v, n) in &fields {
            w.put(v, n);
        }
        let total: u32 = fields.iter().map(|f| f.1).sum();
        assert_eq!(w.bytes().len() as u32, total.div_ceil(8));
        let mut r = BitReader::new(w.bytes());
        for &(v, n) in &fields {
            let mask = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
            assert_eq!(r.take(n), v & mask, "{n} bits");
        }
    }
}
