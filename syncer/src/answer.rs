//! The syncer's HTTP answers: the body type its servers (the kubelet endpoint, the egress
//! proxy, the metrics API) share, and the plain-text and JSON responses they all send. Kept
//! apart so each server depends on these and none on another.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use hyper::{Response, StatusCode};

/// A response body: a buffered answer or a stream passed through.
pub(crate) type Body = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// A plain-text answer, newline-terminated.
pub(crate) fn text(status: StatusCode, msg: impl Into<String>) -> Response<Body> {
    let mut res = Response::new(
        Full::new(Bytes::from(msg.into() + "\n"))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *res.status_mut() = status;
    res
}

/// A JSON answer (the metrics API's objects).
pub(crate) fn json(status: StatusCode, v: &serde_json::Value) -> Response<Body> {
    let mut res = Response::new(
        Full::new(Bytes::from(v.to_string()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *res.status_mut() = status;
    res.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    res
}
