//! One chunk of trend buckets, encoded Gorilla-style (Pelkonen et al., "Gorilla: A Fast,
//! Scalable, In-Memory Time Series Database", VLDB 2015), bucket after bucket:
//!
//! - **start** `t`: delta-of-delta against the previous bucket (the first bucket's `t` is the
//!   chunk's `first_t`, kept outside the stream). `0` when the gap is the previous gap — one
//!   bit per bucket for a point that saw a value every step; gaps of missing buckets cost a
//!   few bits more (`10` + 7 bits, `110` + 14, `1110` + 32, `1111` + 64, zigzag-coded). This is
//!   the run-length record of present buckets: a run of consecutive buckets is a run of `0`s.
//! - **count** `n`: `0` when it equals the previous bucket's (the first is compared with 1),
//!   else `1`, 7 bits of bit length `L` and the `L` bits of `n`.
//! - **last**: coded against the previous bucket's `last` (0.0 before the first): `0` when
//!   equal; else, when the value is a decimal of at most 7 places (`m / 10^d` gives it bit for
//!   bit, as a JSON parser gives `47.23`), the difference of `m` from the previous value in the
//!   same units, zigzag-coded in 7 to 67 bits; else Gorilla's XOR of the bits: the meaningful
//!   bits inside the previous window of leading and trailing zeros, or a new window (6 bits of
//!   leading zeros, 6 of length) and its bits. Instruments report decimals, whose binary
//!   mantissas differ in almost every bit from one value to the next: there the decimal
//!   difference costs about 10 bits where the XOR costs 50 to 64.
//! - **min** and **max**: only when `n` > 1 (a bucket of one value has min = max = last), each
//!   coded the same way against this bucket's `last`, each with a state of its own.
//! - **time of last** (`last_at`), as its offset from `t`: `0` when it is the previous
//!   bucket's offset (0 before the first) — a device's period held, or values at whole steps
//!   — else `1` and the zigzag difference from it ([`put_varint`]).
//!
//! Both codings are exact: decoding returns the buckets bit for bit (±0, subnormals and
//! extreme magnitudes included).

use super::bits::{BitReader, BitWriter};
use crate::trend::TrendBucket;

/// Most decimal places a value is tried with (a 3-bit field).
const MAX_DECIMALS: u8 = 7;

/// `10^d` for `d` in `0..=MAX_DECIMALS`, exact in f64.
const POW10: [f64; 8] = [1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6, 1e7];

/// The integer `m` with `m / 10^d == v` bit for bit, when there is one (|m| < 2^53).
fn decimal(v: f64, d: u8) -> Option<i64> {
    let p = POW10[usize::from(d)];
    let m = (v * p).round();
    (m.abs() < 9_007_199_254_740_992.0 && ((m as i64) as f64 / p).to_bits() == v.to_bits()).then_some(m as i64)
}

/// What `against` is worth in units of `10^-d`, as a predictor (saturating; any integer will
/// do, encoder and decoder compute the same one).
fn predict(against: f64, d: u8) -> i64 {
    (against * POW10[usize::from(d)]).round() as i64
}

/// Coding state of one float series: the decimal places last used and the XOR window.
#[derive(Debug, Default, Clone, Copy)]
struct FloatState {
    decimals: u8,
    /// Leading and trailing zeros of the XOR window; `lead` > 63 means none yet.
    lead: u8,
    trail: u8,
}

impl FloatState {
    fn new() -> Self {
        FloatState { decimals: 0, lead: u8::MAX, trail: 0 }
    }

    /// Codes `value` against `against` (the previous value of the series, or the bucket's
    /// `last`): `0` equal; `10` a decimal — `0` the previous value's places or `1` + 3 bits of
    /// places — then the zigzag difference from `against` in those units ([`put_varint`]);
    /// `11` the XOR of the bits — `0` + the bits inside the previous window, or `1` + 6 bits of
    /// leading zeros + 6 bits of (length − 1) + the bits.
    fn put(&mut self, w: &mut BitWriter, value: f64, against: f64) {
        let (v, a) = (value.to_bits(), against.to_bits());
        if v == a {
            w.bit(false);
            return;
        }
        let same = decimal(value, self.decimals).map(|m| (self.decimals, m));
        if let Some((d, m)) = same.or_else(|| (0..=MAX_DECIMALS).find_map(|d| decimal(value, d).map(|m| (d, m)))) {
            w.put(0b10, 2);
            if d == self.decimals {
                w.bit(false);
            } else {
                w.bit(true);
                w.put(u64::from(d), 3);
                self.decimals = d;
            }
            put_varint(w, zigzag(m.wrapping_sub(predict(against, d))));
            return;
        }
        let x = v ^ a;
        let lead = x.leading_zeros() as u8;
        let trail = x.trailing_zeros() as u8;
        w.put(0b11, 2);
        if self.lead <= 63 && lead >= self.lead && trail >= self.trail {
            let len = 64 - u32::from(self.lead) - u32::from(self.trail);
            w.bit(false);
            w.put(x >> self.trail, len);
        } else {
            let len = 64 - u32::from(lead) - u32::from(trail);
            w.bit(true);
            w.put(u64::from(lead), 6);
            w.put(u64::from(len - 1), 6);
            w.put(x >> trail, len);
            self.lead = lead;
            self.trail = trail;
        }
    }

    fn take(&mut self, r: &mut BitReader<'_>, against: f64) -> f64 {
        if !r.bit() {
            return against;
        }
        if !r.bit() {
            if r.bit() {
                self.decimals = r.take(3) as u8;
            }
            let d = self.decimals;
            let m = predict(against, d).wrapping_add(unzigzag(take_varint(r)));
            return m as f64 / POW10[usize::from(d)];
        }
        if r.bit() {
            self.lead = r.take(6) as u8;
            let len = r.take(6) as u8 + 1;
            self.trail = 64u8.saturating_sub(self.lead + len);
        }
        // Saturating: bits that are not a chunk (corrupted in storage) decode to wrong values,
        // never to a panic.
        let len = 64u32.saturating_sub(u32::from(self.lead) + u32::from(self.trail));
        f64::from_bits(against.to_bits() ^ r.take(len).checked_shl(u32::from(self.trail)).unwrap_or(0))
    }
}

/// A small unsigned number in few bits: `0` + 6 bits, `10` + 13, `110` + 24, `111` + 64.
fn put_varint(w: &mut BitWriter, u: u64) {
    match u {
        0..0x40 => {
            w.bit(false);
            w.put(u, 6);
        }
        0x40..0x2000 => {
            w.put(0b10, 2);
            w.put(u, 13);
        }
        0x2000..0x100_0000 => {
            w.put(0b110, 3);
            w.put(u, 24);
        }
        _ => {
            w.put(0b111, 3);
            w.put(u, 64);
        }
    }
}

fn take_varint(r: &mut BitReader<'_>) -> u64 {
    if !r.bit() {
        r.take(6)
    } else if !r.bit() {
        r.take(13)
    } else if !r.bit() {
        r.take(24)
    } else {
        r.take(64)
    }
}

/// Zigzag: small magnitudes of either sign become small unsigned numbers.
fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(u: u64) -> i64 {
    ((u >> 1) as i64) ^ -((u & 1) as i64)
}

/// The state shared by the encoder and the decoder: what the next bucket is coded against.
#[derive(Debug, Clone, Copy)]
struct Context {
    prev_t: u64,
    prev_gap: u64,
    prev_n: u64,
    prev_last: f64,
    /// The previous bucket's offset of `last_at` from its `t`.
    prev_offset: u64,
    last: FloatState,
    min: FloatState,
    max: FloatState,
}

impl Context {
    fn new(first_t: u64) -> Self {
        Context {
            prev_t: first_t,
            prev_gap: 0,
            prev_n: 1,
            prev_last: 0.0,
            prev_offset: 0,
            last: FloatState::new(),
            min: FloatState::new(),
            max: FloatState::new(),
        }
    }
}

/// Appends buckets (in increasing `t`) to a chunk's bit stream; the open chunk of a ring.
#[derive(Debug, Clone)]
pub struct Encoder {
    bits: BitWriter,
    first_t: u64,
    last_t: u64,
    count: u32,
    ctx: Context,
}

impl Encoder {
    pub fn new() -> Self {
        Encoder { bits: BitWriter::default(), first_t: 0, last_t: 0, count: 0, ctx: Context::new(0) }
    }

    /// Appends `b`, whose `t` must exceed every `t` already in the chunk.
    pub fn push(&mut self, b: &TrendBucket) {
        if self.count == 0 {
            self.first_t = b.t;
            self.ctx = Context::new(b.t);
        }
        debug_assert!(self.count == 0 || b.t > self.last_t, "buckets in increasing t");
        let c = &mut self.ctx;
        let w = &mut self.bits;
        let gap = b.t.wrapping_sub(c.prev_t);
        let dod = zigzag(gap.wrapping_sub(c.prev_gap) as i64);
        match dod {
            0 => w.bit(false),
            1..=0x7f => {
                w.put(0b10, 2);
                w.put(dod, 7);
            }
            0x80..=0x3fff => {
                w.put(0b110, 3);
                w.put(dod, 14);
            }
            0x4000..=0xffff_ffff => {
                w.put(0b1110, 4);
                w.put(dod, 32);
            }
            _ => {
                w.put(0b1111, 4);
                w.put(dod, 64);
            }
        }
        c.prev_t = b.t;
        c.prev_gap = gap;
        if b.n == c.prev_n {
            w.bit(false);
        } else {
            let len = 64 - b.n.leading_zeros();
            w.bit(true);
            w.put(u64::from(len), 7);
            w.put(b.n, len);
            c.prev_n = b.n;
        }
        c.last.put(w, b.last, c.prev_last);
        c.prev_last = b.last;
        if b.n > 1 {
            c.min.put(w, b.min, b.last);
            c.max.put(w, b.max, b.last);
        } else {
            debug_assert!(
                b.min.to_bits() == b.last.to_bits() && b.max.to_bits() == b.last.to_bits(),
                "one value: min = max = last"
            );
        }
        let offset = b.last_at.saturating_sub(b.t);
        if offset == c.prev_offset {
            w.bit(false);
        } else {
            w.bit(true);
            put_varint(w, zigzag(offset.wrapping_sub(c.prev_offset) as i64));
            c.prev_offset = offset;
        }
        self.last_t = b.t;
        self.count += 1;
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// Bytes of encoded buckets so far.
    pub fn encoded_len(&self) -> usize {
        self.bits.bytes().len()
    }

    pub fn first_t(&self) -> u64 {
        self.first_t
    }

    pub fn last_t(&self) -> u64 {
        self.last_t
    }

    /// The buckets appended so far, oldest first.
    pub fn decode(&self) -> Decoder<'_> {
        Decoder::new(self.bits.bytes(), self.first_t, self.count)
    }

    /// Closes the chunk: the stream without spare capacity.
    pub fn seal(self) -> Chunk {
        Chunk {
            first_t: self.first_t,
            last_t: self.last_t,
            count: self.count,
            timed: true,
            bits: self.bits.into_boxed(),
        }
    }
}

impl Default for Encoder {
    fn default() -> Self {
        Encoder::new()
    }
}

/// A closed chunk: `count` buckets from `first_t` to `last_t`, encoded.
#[derive(Debug, Clone)]
pub struct Chunk {
    pub first_t: u64,
    pub last_t: u64,
    pub count: u32,
    /// Whether the buckets carry the times of `last` (every chunk encoded here does).
    timed: bool,
    bits: Box<[u8]>,
}

impl Chunk {
    /// Encodes `buckets` (increasing `t`, at least one).
    pub fn encode(buckets: &[TrendBucket]) -> Chunk {
        let mut e = Encoder::new();
        for b in buckets {
            e.push(b);
        }
        e.seal()
    }

    pub fn decode(&self) -> Decoder<'_> {
        Decoder { timed: self.timed, ..Decoder::new(&self.bits, self.first_t, self.count) }
    }

    /// Bytes of encoded buckets (without this header).
    pub fn encoded_len(&self) -> usize {
        self.bits.len()
    }

    /// The chunk as stored outside the process (the Redis trend hash): `first_t`, `last_t`
    /// (u64) and `count` (u32, its top bit [`TIMED`] set), big-endian, then the encoded
    /// buckets.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(STORED_HEADER + self.bits.len());
        out.extend_from_slice(&self.first_t.to_be_bytes());
        out.extend_from_slice(&self.last_t.to_be_bytes());
        out.extend_from_slice(&(self.count | TIMED).to_be_bytes());
        out.extend_from_slice(&self.bits);
        out
    }

    /// Reads [`Chunk::to_bytes`]; `None` for bytes too short to be one. A count without
    /// [`TIMED`] is a chunk coded without the times of `last`: its buckets decode with
    /// `last_at` at their start, so any value of the bucket recorded beside it is later. Bits
    /// that end early decode as zeros: a corrupted chunk yields wrong buckets, never a panic.
    pub fn from_bytes(bytes: &[u8]) -> Option<Chunk> {
        let (head, bits) = bytes.split_at_checked(STORED_HEADER)?;
        let first_t = u64::from_be_bytes(head[0..8].try_into().ok()?);
        let last_t = u64::from_be_bytes(head[8..16].try_into().ok()?);
        let stored = u32::from_be_bytes(head[16..20].try_into().ok()?);
        let (count, timed) = (stored & !TIMED, stored & TIMED != 0);
        // Every bucket takes at least three bits.
        (count as usize * 3 <= bits.len() * 8).then(|| Chunk { first_t, last_t, count, timed, bits: bits.into() })
    }
}

/// The bit of a stored chunk's count that says its buckets carry the times of `last`.
const TIMED: u32 = 1 << 31;

/// Header bytes of a stored chunk ([`Chunk::to_bytes`]).
const STORED_HEADER: usize = 20;

/// The buckets of a chunk, oldest first.
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    r: BitReader<'a>,
    left: u32,
    ctx: Context,
    /// Whether the times of `last` are coded ([`Chunk::from_bytes`]).
    timed: bool,
}

impl<'a> Decoder<'a> {
    fn new(bytes: &'a [u8], first_t: u64, count: u32) -> Self {
        Decoder { r: BitReader::new(bytes), left: count, ctx: Context::new(first_t), timed: true }
    }
}

impl Iterator for Decoder<'_> {
    type Item = TrendBucket;

    fn next(&mut self) -> Option<TrendBucket> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let c = &mut self.ctx;
        let r = &mut self.r;
        let dod = if !r.bit() {
            0
        } else if !r.bit() {
            r.take(7)
        } else if !r.bit() {
            r.take(14)
        } else if !r.bit() {
            r.take(32)
        } else {
            r.take(64)
        };
        let gap = c.prev_gap.wrapping_add(unzigzag(dod) as u64);
        let t = c.prev_t.wrapping_add(gap);
        c.prev_t = t;
        c.prev_gap = gap;
        if r.bit() {
            let len = r.take(7) as u32;
            c.prev_n = r.take(len.min(64));
        }
        let n = c.prev_n;
        let last = c.last.take(r, c.prev_last);
        c.prev_last = last;
        let (min, max) = if n > 1 { (c.min.take(r, last), c.max.take(r, last)) } else { (last, last) };
        if self.timed && r.bit() {
            c.prev_offset = c.prev_offset.wrapping_add(unzigzag(take_varint(r)) as u64);
        }
        let last_at = if self.timed { t.wrapping_add(c.prev_offset) } else { t };
        Some(TrendBucket { t, min, max, last, n, last_at })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trend_chunk_round_trips_bit_for_bit() {
        let odd = [0.0, -0.0, f64::MIN_POSITIVE / 3.0, -5e-324, f64::MAX, f64::MIN, 1e-300, 12.5, 12.5, 7.25];
        let mut buckets = Vec::new();
        let mut t = 1_700_000_000_000u64;
        for (i, &v) in odd.iter().enumerate() {
            let mut b = TrendBucket::new(t, t + [0, 7, 7, 990, 3][i % 5], v);
            for (k, &w) in odd.iter().skip(i).take(i % 4).enumerate() {
                b.add(t + [500, 2, 999][k % 3], w);
            }
            buckets.push(b);
            t += [1000, 1000, 3000, 1, 1 << 40][i % 5];
        }
        buckets.push(TrendBucket { t, min: 1.0, max: 2.0, last: 1.5, n: u64::MAX, last_at: t + (1 << 39) });
        let chunk = Chunk::encode(&buckets);
        let back: Vec<TrendBucket> = chunk.decode().collect();
        assert_eq!(back.len(), buckets.len());
        for (a, b) in back.iter().zip(&buckets) {
            assert_eq!(a.t, b.t);
            assert_eq!(a.n, b.n);
            assert_eq!(a.last_at, b.last_at);
            assert_eq!(
                (a.min.to_bits(), a.max.to_bits(), a.last.to_bits()),
                (b.min.to_bits(), b.max.to_bits(), b.last.to_bits())
            );
        }
        assert_eq!((chunk.first_t, chunk.last_t, chunk.count), (buckets[0].t, t, buckets.len() as u32));
    }

    #[test]
    fn trend_chunk_of_steady_seconds_costs_a_few_bits_a_bucket() {
        // A value held for two minutes, one bucket a second at the same point of each: t, n,
        // last and its time cost a bit each.
        let buckets: Vec<TrendBucket> = (0..120).map(|i| TrendBucket::new(i * 1000, i * 1000 + 250, 21.5)).collect();
        let chunk = Chunk::encode(&buckets);
        assert!(chunk.encoded_len() <= 64 + 16, "{} bytes", chunk.encoded_len());
    }

    #[test]
    fn trend_chunk_stored_without_times_of_last_reads_them_as_the_buckets_start() {
        let buckets = vec![TrendBucket::new(1000, 1500, 2.0), TrendBucket::new(2000, 2900, 3.0)];
        let bytes = Chunk::encode(&buckets).to_bytes();
        assert_eq!(Chunk::from_bytes(&bytes).unwrap().decode().collect::<Vec<_>>(), buckets);
        // A chunk of one bucket coded without times is the same stream without the last bit.
        let one = Chunk::encode(&[TrendBucket::new(1000, 1000, 2.5)]);
        let mut untimed = one.to_bytes();
        untimed[16..20].copy_from_slice(&one.count.to_be_bytes());
        let back: Vec<TrendBucket> = Chunk::from_bytes(&untimed).unwrap().decode().collect();
        assert_eq!(back, vec![TrendBucket::new(1000, 1000, 2.5)]);
    }
}
