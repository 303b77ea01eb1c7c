//! The tenant apiserver's authorization webhook for revoked kubeconfigs.
//!
//! Data flow: [`follow`] watches the host ConfigMap `vcp-revocations` in the tenant's
//! control-plane namespace (the orchestrator writes it; the syncer's host role may only read
//! that one ConfigMap there) and publishes the revoked serials. The kubelet endpoint hands
//! `POST /vcp/authorize` from the tenant apiserver's kubelet client to [`answer`], which reads
//! the SubjectAccessReview, decides with `vcp_core::revocation::decide` and writes the review
//! back: denied for a revoked serial, no opinion otherwise (RBAC decides). Until the first
//! list has been read the answer is 503, an error the apiserver's failure policy
//! (`NoOpinion`) turns into no opinion: the tenant never depends on this webhook to serve,
//! and a revocation holds whenever the syncer answers. The last list read stays in force
//! while the host apiserver is unreachable.

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyExt;
use hyper::StatusCode;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::watcher;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;
use tokio::sync::watch;
use vcp_core::revocation::{self, Decision};

/// The revoked serials as last read; `None` before the first read.
pub type Revoked = watch::Receiver<Option<Arc<BTreeSet<String>>>>;

/// The largest review the webhook reads: a SubjectAccessReview is a few hundred bytes, and a
/// bounded read keeps a misbehaving caller from growing the syncer's memory.
const MAX_REVIEW: usize = 64 * 1024;

/// A channel to [`follow`] into and read from.
pub fn channel() -> (watch::Sender<Option<Arc<BTreeSet<String>>>>, Revoked) {
    watch::channel(None)
}

fn serials(cm: &ConfigMap) -> BTreeSet<String> {
    cm.data
        .as_ref()
        .and_then(|d| d.get(revocation::KEY))
        .map(|t| revocation::parse_list(t))
        .unwrap_or_default()
}

/// Follows the ConfigMap in `namespace` until the future is dropped. A missing ConfigMap is
/// an empty list (the orchestrator writes it at the first revocation and on every pass).
pub async fn follow(
    host: kube::Client,
    namespace: String,
    tx: watch::Sender<Option<Arc<BTreeSet<String>>>>,
) {
    let api: Api<ConfigMap> = Api::namespaced(host, &namespace);
    let cfg =
        watcher::Config::default().fields(&format!("metadata.name={}", revocation::CONFIGMAP));
    let mut events = watcher(api, cfg).boxed();
    let publish = |set: BTreeSet<String>| {
        let changed = tx.borrow().as_deref() != Some(&set);
        if changed {
            tracing::info!(revoked = set.len(), "revoked kubeconfigs");
            tx.send_replace(Some(Arc::new(set)));
        }
    };
    let mut seen = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => seen = false,
            Ok(watcher::Event::InitApply(cm) | watcher::Event::Apply(cm)) => {
                seen = true;
                publish(serials(&cm));
            }
            Ok(watcher::Event::InitDone) if !seen => publish(BTreeSet::new()),
            Ok(watcher::Event::InitDone) => {}
            Ok(watcher::Event::Delete(_)) => publish(BTreeSet::new()),
            Err(e) => {
                // The last list stays in force; the watcher retries after a pause.
                tracing::warn!(error = %e, "reading the revoked kubeconfigs failed");
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
        }
    }
}

/// The webhook's answer to a SubjectAccessReview body: status and JSON. Pure but for reading
/// the current list.
pub fn review(body: &[u8], revoked: Option<&BTreeSet<String>>) -> (StatusCode, Value) {
    let Ok(mut sar) = serde_json::from_slice::<Value>(body) else {
        return (
            StatusCode::BAD_REQUEST,
            json!({"error": "the body is not a SubjectAccessReview"}),
        );
    };
    let Some(revoked) = revoked else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"error": "the revoked kubeconfigs are not read yet"}),
        );
    };
    let groups: Vec<&str> = sar
        .pointer("/spec/groups")
        .and_then(Value::as_array)
        .map(|g| g.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let status = match revocation::decide(groups, revoked) {
        Decision::Denied { serial } => json!({
            "allowed": false,
            "denied": true,
            "reason": revocation::denied_reason(&serial),
        }),
        Decision::NoOpinion => json!({"allowed": false}),
    };
    // The review goes back as it came, with its status: the apiserver reads apiVersion and kind.
    if let Some(obj) = sar.as_object_mut() {
        obj.remove("spec");
        obj.insert("status".into(), status);
    }
    (StatusCode::OK, sar)
}

/// Serves one webhook call.
pub async fn answer(
    req: hyper::Request<hyper::body::Incoming>,
    revoked: &Revoked,
) -> hyper::Response<crate::kubelet::Body> {
    let body = match http_body_util::Limited::new(req.into_body(), MAX_REVIEW)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let current = revoked.borrow().clone();
    let (status, value) = review(&body, current.as_deref());
    crate::kubelet::json(status, &value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sar(groups: &[&str]) -> Vec<u8> {
        json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": "alice", "groups": groups, "resourceAttributes": {"verb": "get", "resource": "pods"}},
        })
        .to_string()
        .into_bytes()
    }

    #[test]
    fn reviews_deny_revoked_serials_and_leave_the_rest_to_rbac() {
        let revoked = revocation::parse_list("aa01\n");
        let (status, v) = review(&sar(&["edit", "vcp:kubeconfig:aa01"]), Some(&revoked));
        assert_eq!(status, StatusCode::OK);
        assert_eq!(v["apiVersion"], "authorization.k8s.io/v1");
        assert_eq!(v["kind"], "SubjectAccessReview");
        assert_eq!(v["status"]["denied"], true);
        assert_eq!(v["status"]["allowed"], false);
        assert!(v["status"]["reason"].as_str().unwrap().contains("aa01"));
        assert!(v.get("spec").is_none());

        let (status, v) = review(&sar(&["edit", "vcp:kubeconfig:aa02"]), Some(&revoked));
        assert_eq!(status, StatusCode::OK);
        assert_eq!(v["status"], json!({"allowed": false}));
    }

    #[test]
    fn before_the_list_is_read_or_for_garbage_there_is_no_answer() {
        assert_eq!(
            review(&sar(&["edit"]), None).0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            review(b"{not json", Some(&BTreeSet::new())).0,
            StatusCode::BAD_REQUEST
        );
        // A review without groups is nobody's revoked credential.
        let (status, v) = review(
            br#"{"kind":"SubjectAccessReview","spec":{}}"#,
            Some(&BTreeSet::new()),
        );
        assert_eq!(
            (status, v["status"].clone()),
            (StatusCode::OK, json!({"allowed": false}))
        );
    }
}
