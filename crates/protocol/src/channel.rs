//! Channel names: `namespace:name` or a bare name in the default namespace (SPEC §1).

/// Why a channel name was rejected; the gateway answers these with error 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    #[error("channel name is empty")]
    Empty,
    #[error("channel name longer than 255 bytes")]
    TooLong,
    #[error("channel name contains {0:?}; allowed are A-Z a-z 0-9 _ . : / @ = -")]
    BadByte(char),
}

/// Longest accepted channel name in bytes.
pub const MAX_CHANNEL_LEN: usize = 255;

/// Checks a channel name: 1–255 bytes of `[A-Za-z0-9_.:/@=-]`.
pub fn validate_channel(name: &str) -> Result<(), ChannelError> {
    if name.is_empty() {
        return Err(ChannelError::Empty);
    }
    if name.len() > MAX_CHANNEL_LEN {
        return Err(ChannelError::TooLong);
    }
    for b in name.bytes() {
        let ok = b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'/' | b'@' | b'=' | b'-');
        if !ok {
            let c = name[name.bytes().position(|x| x == b).unwrap_or(0)..].chars().next().unwrap_or('?');
            return Err(ChannelError::BadByte(c));
        }
    }
    Ok(())
}

/// The namespace of a channel: the part before the first `:`, or `""` (the default namespace).
pub fn namespace_of(channel: &str) -> &str {
    match channel.find(':') {
        Some(i) => &channel[..i],
        None => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_accepts_the_documented_alphabet() {
        assert!(validate_channel("pt:plant1.boiler.temp").is_ok());
        assert!(validate_channel("room:42").is_ok());
        assert!(validate_channel("a/b@c=d-e_f").is_ok());
        assert!(validate_channel(&"x".repeat(255)).is_ok());
    }

    #[test]
    fn channel_rejects_empty_long_and_foreign_bytes() {
        assert_eq!(validate_channel(""), Err(ChannelError::Empty));
        assert_eq!(validate_channel(&"x".repeat(256)), Err(ChannelError::TooLong));
        assert_eq!(validate_channel("a b"), Err(ChannelError::BadByte(' ')));
        assert_eq!(validate_channel("é"), Err(ChannelError::BadByte('é')));
        assert_eq!(validate_channel("a\"b"), Err(ChannelError::BadByte('"')));
    }

    #[test]
    fn channel_namespace_is_the_prefix_before_the_first_colon() {
        assert_eq!(namespace_of("pt:a:b"), "pt");
        assert_eq!(namespace_of("plain"), "");
        assert_eq!(namespace_of(":x"), "");
    }
}
