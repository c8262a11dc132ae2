//! Channel patterns: the `channels` and `publish` claims of a token, per-user grants in the
//! configuration (SPEC §6).
//!
//! A pattern is a channel name in which `*` stands for one segment and `**` for any rest.
//! Segments are separated by `.`, `:` and `/` (`pt:plant1.boiler.temp` has the segments `pt`,
//! `plant1`, `boiler`, `temp`):
//!
//! - `room:*` matches `room:42` but not `room:42.x` nor `room:`;
//! - `pt:plant1.**` matches every channel starting with `pt:plant1.`;
//! - `pt:*.temp` matches `pt:boiler.temp`; `user-*` matches `user-7` (a `*` may share its
//!   segment with literal text);
//! - `**` matches every channel.
//!
//! Matching is linear in the product of the two lengths (no backtracking), so a hostile
//! pattern like `*a*a*a*a*b` cannot stall a node. This file has no dependencies on the rest of
//! the crate: the fuzz crate compiles it on its own.

use std::fmt;

/// Longest accepted pattern in bytes.
pub const MAX_PATTERN_LEN: usize = 512;

/// Why a pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatternError {
    Empty,
    TooLong,
    /// A byte outside the channel alphabet and `*`.
    BadByte(u8),
    /// Three or more `*` in a row.
    TooManyStars,
}

impl fmt::Display for PatternError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PatternError::Empty => f.write_str("pattern is empty"),
            PatternError::TooLong => write!(f, "pattern longer than {MAX_PATTERN_LEN} bytes"),
            PatternError::BadByte(b) => {
                write!(f, "pattern contains byte 0x{b:02x}; allowed are A-Z a-z 0-9 _ . : / @ = - and *")
            }
            PatternError::TooManyStars => f.write_str("pattern has `***`; use `*` (one segment) or `**` (any rest)"),
        }
    }
}

impl std::error::Error for PatternError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    Byte(u8),
    /// One or more bytes, none of them a separator.
    Star,
    /// Any bytes, possibly none.
    Rest,
}

/// A parsed channel pattern.
#[derive(Clone, PartialEq, Eq)]
pub struct Pattern {
    tokens: Box<[Token]>,
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pattern({:?})", self.to_string())
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for t in self.tokens.iter() {
            match t {
                Token::Byte(b) => write!(f, "{}", char::from(*b))?,
                Token::Star => f.write_str("*")?,
                Token::Rest => f.write_str("**")?,
            }
        }
        Ok(())
    }
}

/// Whether `b` separates two segments of a channel name.
pub fn is_separator(b: u8) -> bool {
    matches!(b, b'.' | b':' | b'/')
}

fn is_channel_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'/' | b'@' | b'=' | b'-')
}

impl Pattern {
    /// Parses a pattern: 1–512 bytes of the channel alphabet, `*` and `**`.
    pub fn parse(s: &str) -> Result<Pattern, PatternError> {
        let bytes = s.as_bytes();
        if bytes.is_empty() {
            return Err(PatternError::Empty);
        }
        if bytes.len() > MAX_PATTERN_LEN {
            return Err(PatternError::TooLong);
        }
        let mut tokens = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            if b == b'*' {
                let run = bytes[i..].iter().take_while(|&&c| c == b'*').count();
                match run {
                    1 => tokens.push(Token::Star),
                    2 => tokens.push(Token::Rest),
                    _ => return Err(PatternError::TooManyStars),
                }
                i += run;
            } else if is_channel_byte(b) {
                tokens.push(Token::Byte(b));
                i += 1;
            } else {
                return Err(PatternError::BadByte(b));
            }
        }
        Ok(Pattern { tokens: tokens.into_boxed_slice() })
    }

    /// Whether the pattern matches the whole of `channel`.
    pub fn matches(&self, channel: &str) -> bool {
        let name = channel.as_bytes();
        // Fast path: a pattern without wildcards is a plain comparison.
        if self.tokens.iter().all(|t| matches!(t, Token::Byte(_))) {
            return self.tokens.len() == name.len()
                && self.tokens.iter().zip(name).all(|(t, b)| matches!(t, Token::Byte(c) if c == b));
        }
        // `reach[j]`: the tokens seen so far can consume exactly `name[..j]`.
        let n = name.len();
        let mut reach = vec![false; n + 1];
        let mut next = vec![false; n + 1];
        reach[0] = true;
        for t in self.tokens.iter() {
            match *t {
                Token::Byte(c) => {
                    next[0] = false;
                    for j in 0..n {
                        next[j + 1] = reach[j] && name[j] == c;
                    }
                }
                Token::Rest => {
                    let mut any = false;
                    for j in 0..=n {
                        any |= reach[j];
                        next[j] = any;
                    }
                }
                Token::Star => {
                    // `run`: some start position k < j has reach[k] and name[k..j] holds no
                    // separator.
                    next[0] = false;
                    let mut run = false;
                    for j in 1..=n {
                        if is_separator(name[j - 1]) {
                            run = false;
                        } else {
                            run |= reach[j - 1];
                        }
                        next[j] = run;
                    }
                }
            }
            std::mem::swap(&mut reach, &mut next);
            if !reach.iter().any(|&r| r) {
                return false;
            }
        }
        reach[n]
    }
}

/// A list of patterns; a channel is allowed when any of them matches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PatternSet(pub Vec<Pattern>);

impl PatternSet {
    /// Parses every pattern; the first bad one is the error (with its position).
    pub fn parse<S: AsRef<str>>(list: &[S]) -> Result<PatternSet, (usize, PatternError)> {
        list.iter()
            .enumerate()
            .map(|(i, s)| Pattern::parse(s.as_ref()).map_err(|e| (i, e)))
            .collect::<Result<_, _>>()
            .map(PatternSet)
    }

    pub fn matches(&self, channel: &str) -> bool {
        self.0.iter().any(|p| p.matches(channel))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, c: &str) -> bool {
        Pattern::parse(p).unwrap().matches(c)
    }

    #[test]
    fn pattern_literal_matches_only_itself() {
        assert!(m("room:42", "room:42"));
        assert!(!m("room:42", "room:4"));
        assert!(!m("room:42", "room:421"));
    }

    #[test]
    fn pattern_star_is_one_non_empty_segment() {
        assert!(m("room:*", "room:42"));
        assert!(!m("room:*", "room:"));
        assert!(!m("room:*", "room:42.x"));
        assert!(!m("room:*", "room:42/x"));
        assert!(m("pt:*.temp", "pt:boiler.temp"));
        assert!(!m("pt:*.temp", "pt:a.b.temp"));
        assert!(m("user-*", "user-7"));
        assert!(!m("*", "pt:x"));
        assert!(m("*", "plain"));
        assert!(m("a*b*c", "aXbYc"));
        assert!(!m("a*b*c", "a.b.c"));
    }

    #[test]
    fn pattern_double_star_is_any_rest() {
        assert!(m("**", "pt:a.b/c"));
        assert!(m("pt:**", "pt:plant1.boiler.temp"));
        assert!(m("pt:**", "pt:"));
        assert!(!m("pt:**", "pts:x"));
        assert!(m("pt:**.temp", "pt:a.b.temp"));
        assert!(!m("pt:**.temp", "pt:a.b.temps"));
    }

    #[test]
    fn pattern_rejects_bad_input() {
        assert_eq!(Pattern::parse(""), Err(PatternError::Empty));
        assert_eq!(Pattern::parse("a b"), Err(PatternError::BadByte(b' ')));
        assert_eq!(Pattern::parse("a***"), Err(PatternError::TooManyStars));
        assert_eq!(Pattern::parse(&"a".repeat(513)), Err(PatternError::TooLong));
        assert_eq!(Pattern::parse("room:*").unwrap().to_string(), "room:*");
    }

    #[test]
    fn pattern_hostile_patterns_stay_linear() {
        let p = Pattern::parse(&format!("{}b", "*a".repeat(100))).unwrap();
        assert!(!p.matches(&"a".repeat(255)));
        assert!(p.matches(&format!("{}b", "a".repeat(254))));
        let p = Pattern::parse(&"**a".repeat(100)).unwrap();
        assert!(!p.matches(&"a".repeat(99)));
        assert!(p.matches(&"a".repeat(100)));
    }
}
