//! Why a delta-encoded push could not be turned back into its publication: kept apart from
//! the decoder so that the events that carry it do not depend on it.

/// Why a delta-encoded push could not be turned back into its publication.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeltaError {
    #[error("a delta with no previous publication of the channel to apply it to")]
    NoBase,
    #[error("the publication declares {size} bytes, more than the {max} allowed")]
    TooLarge { size: usize, max: usize },
    #[error("malformed delta: {0}")]
    Malformed(&'static str),
    #[error("the delta's checksum does not match its result")]
    BadChecksum,
    #[error("the publication's text is not JSON: {0}")]
    NotJson(String),
}
