//! Delta-encoded publications: a subscription with `delta: "fossil"` gets every live
//! publication of a channel as the publication's JSON text, either whole (`"delta": false`) or
//! as a Fossil delta (`"delta": true`, the format of the Fossil SCM's `delta.c`) that turns the
//! previous push's text of the channel into this one's. In JSON the text or delta is a string,
//! in MessagePack a binary; a delta's counts are bytes of the UTF-8 text either way.
//!
//! [`Chains`] keeps each channel's last text on one connection and turns such pushes back into
//! plain [`Publication`]s, so that no caller ever sees a string or a delta. A delta that cannot
//! be applied — no text to apply it to, a declared size past the bound, a bad checksum, a
//! result that is not JSON — is a [`DeltaError`]: the channel's stream has a hole there, and
//! the subscriber subscribes it again with `recover` ([`crate::Subscriber`] does).
//!
//! The `fossil-delta` crate applies deltas and checks their checksum; [`apply`] first walks the
//! delta's commands with the crate's own integer reader, because the crate's `apply` indexes
//! without bounds checks (a truncated delta would panic) and reserves the declared output size
//! up front (a 20-byte delta may declare gigabytes).

use std::collections::{BTreeMap, HashMap};

use crate::event::Publication;

pub mod error;
pub use error::DeltaError;

/// The largest text a delta may declare unless the client says otherwise (1 MiB): well above a
/// node's largest publication (`limits.max_publication_bytes`, 64 KiB by default).
pub const DEFAULT_MAX_BYTES: usize = 1 << 20;

/// The output size `delta` declares, and the rest of it after the size's `\n`.
fn declared(delta: &[u8]) -> Result<(usize, &[u8]), DeltaError> {
    let (size, rest) = fossil_delta::b64int_read(delta);
    match rest.split_first() {
        Some((b'\n', rest)) => Ok((size, rest)),
        _ => Err(DeltaError::Malformed("the output size is not followed by a newline")),
    }
}

/// Checks that `delta` is whole and within bounds for a base of `base_len` bytes: every copy
/// inside the base, every insert inside the delta, the output no larger than declared nor than
/// `max`, and a checksum command at the end. What passes is safe to hand to the crate's apply.
fn check(base_len: usize, delta: &[u8], max: usize) -> Result<usize, DeltaError> {
    let (size, mut rest) = declared(delta)?;
    if size > max {
        return Err(DeltaError::TooLarge { size, max });
    }
    let mut total = 0usize;
    loop {
        let (n, after) = fossil_delta::b64int_read(rest);
        let Some((&op, after)) = after.split_first() else {
            return Err(DeltaError::Malformed("no checksum at its end"));
        };
        match op {
            b'@' => {
                let (offset, after) = fossil_delta::b64int_read(after);
                let Some((b',', after)) = after.split_first() else {
                    return Err(DeltaError::Malformed("a copy command without its ','"));
                };
                if offset.checked_add(n).is_none_or(|end| end > base_len) {
                    return Err(DeltaError::Malformed("a copy past the end of the previous publication"));
                }
                total = total.checked_add(n).ok_or(DeltaError::Malformed("an output larger than declared"))?;
                rest = after;
            }
            b':' => {
                if n > after.len() {
                    return Err(DeltaError::Malformed("an insert past the end of the delta"));
                }
                total = total.checked_add(n).ok_or(DeltaError::Malformed("an output larger than declared"))?;
                rest = &after[n..];
            }
            b';' => {
                if total != size {
                    return Err(DeltaError::Malformed("an output of another size than declared"));
                }
                return Ok(size);
            }
            _ => return Err(DeltaError::Malformed("an unknown command")),
        }
        if total > size {
            return Err(DeltaError::Malformed("an output larger than declared"));
        }
    }
}

/// The text `delta` turns `base` into. A delta declaring more than `max` bytes is refused
/// before anything is allocated for it.
pub fn apply(base: &[u8], delta: &[u8], max: usize) -> Result<Vec<u8>, DeltaError> {
    check(base.len(), delta, max)?;
    fossil_delta::apply(base, delta).map_err(|e| match e {
        fossil_delta::Error::BadChecksum => DeltaError::BadChecksum,
        _ => DeltaError::Malformed("refused by the delta decoder"),
    })
}

/// A push of a delta subscription as the wire has it: `text` is the publication's JSON text
/// (`delta: false`) or the delta from the previous push's text of the channel (`delta: true`).
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedPush {
    pub ch: String,
    pub off: u64,
    pub historical: bool,
    pub tags: Option<BTreeMap<String, String>>,
    pub delta: bool,
    pub text: Vec<u8>,
}

/// Each channel's last rebuilt text on one connection, and the bound on what a push may
/// declare. A subscription's first push (and the first after every resubscription) is whole,
/// so a text is only ever replaced, never needs clearing for a new subscription; a failed push
/// clears its channel's, so that nothing is built on a text that was never delivered.
#[derive(Debug)]
pub struct Chains {
    texts: HashMap<String, Vec<u8>>,
    max: usize,
}

impl Default for Chains {
    fn default() -> Chains {
        Chains::new(DEFAULT_MAX_BYTES)
    }
}

impl Chains {
    /// Chains refusing texts larger than `max` bytes.
    pub fn new(max: usize) -> Chains {
        Chains { texts: HashMap::new(), max }
    }

    /// Changes the bound for the pushes that follow.
    pub fn set_max(&mut self, max: usize) {
        self.max = max;
    }

    /// The publication `push` carries, its data parsed from the rebuilt text.
    pub fn decode(&mut self, push: EncodedPush) -> Result<Publication, DeltaError> {
        let text = match self.rebuild(&push) {
            Ok(text) => text,
            Err(e) => {
                self.texts.remove(&push.ch);
                return Err(e);
            }
        };
        let data = match serde_json::from_slice(&text) {
            Ok(data) => data,
            Err(e) => {
                self.texts.remove(&push.ch);
                return Err(DeltaError::NotJson(e.to_string()));
            }
        };
        self.texts.insert(push.ch.clone(), text);
        Ok(Publication { ch: push.ch, off: push.off, data, historical: push.historical, tags: push.tags })
    }

    fn rebuild(&self, push: &EncodedPush) -> Result<Vec<u8>, DeltaError> {
        if !push.delta {
            return match push.text.len() {
                size if size > self.max => Err(DeltaError::TooLarge { size, max: self.max }),
                _ => Ok(push.text.clone()),
            };
        }
        let base = self.texts.get(&push.ch).ok_or(DeltaError::NoBase)?;
        apply(base, &push.text, self.max)
    }
}

#[cfg(test)]
mod tests;
