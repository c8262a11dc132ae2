//! [`Query`]: the query string of an HTTP API request, read by axum's `Query` extractor, whose
//! rejection is answered in the API's JSON error form (`{"error": {"code": 400, "message"}}`),
//! like every other bad request, instead of axum's plain text. Every route of the API reads
//! its query through this type (clippy's `disallowed-types` refuses axum's own).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use switchboard_protocol::code;

use crate::node::ApiError;

/// A query string deserialized as `T`; a malformed one (`?window_s=abc`, `?limit=-1`) is 400
/// with the JSON error body, naming the field.
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Query<T>, ApiError> {
        // The one place axum's extractor is used: its rejection becomes the API's error.
        #[allow(clippy::disallowed_types)]
        let read = axum::extract::Query::<T>::from_request_parts(parts, state).await;
        read.map(|q| Query(q.0)).map_err(|e| ApiError::new(code::BAD_REQUEST, e.body_text()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    struct Q {
        #[allow(dead_code)]
        window_s: Option<u64>,
    }

    async fn read(uri: &str) -> Result<Query<Q>, ApiError> {
        let (mut parts, ()) = axum::http::Request::get(uri).body(()).unwrap().into_parts();
        Query::<Q>::from_request_parts(&mut parts, &()).await
    }

    #[tokio::test]
    async fn api_malformed_query_is_a_400_naming_the_field() {
        let e = read("/x?window_s=abc").await.err().unwrap();
        assert_eq!(e.code, code::BAD_REQUEST);
        assert!(e.message.contains("window_s"), "{}", e.message);
        assert!(read("/x?window_s=60").await.is_ok());
        assert!(read("/x").await.is_ok());
    }
}
