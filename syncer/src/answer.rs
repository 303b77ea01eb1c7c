//! The syncer's HTTP answers: the body type its servers (the kubelet endpoint, the egress
//! proxy, the metrics API) share, the plain-text and JSON responses they all send, and the
//! Kubernetes `Status` body of a failure. Kept apart so each server depends on these and none
//! on another.

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

/// A Kubernetes `Status` body of a failure, as an apiserver or a kubelet writes it.
pub(crate) fn status(code: u16, reason: &str, message: &str) -> serde_json::Value {
    serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;

    /// kubectl and client-go decode the kubelet's error stream and the metrics API's errors as
    /// a `Status`; both come from here.
    #[test]
    fn a_failure_decodes_as_a_kubernetes_status() {
        let v = super::status(503, "ServiceUnavailable", "container c is not running");
        assert_eq!(v["kind"], "Status");
        assert_eq!(v["apiVersion"], "v1");
        let s: Status = serde_json::from_value(v).unwrap();
        assert_eq!(s.status.as_deref(), Some("Failure"));
        assert_eq!(s.code, Some(503));
        assert_eq!(s.reason.as_deref(), Some("ServiceUnavailable"));
        assert_eq!(s.message.as_deref(), Some("container c is not running"));
    }
}
