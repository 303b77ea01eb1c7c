//! The tenant apiserver's authorizer for revoked kubeconfigs: what it reads and what it answers.
//!
//! Data flow: the orchestrator writes the tenant's revoked serials to the host ConfigMap
//! `vcp-revocations` in its control-plane namespace. The authorizer (`vcp-syncer authorize`,
//! [`authorizer`]) runs as a sidecar in the tenant apiserver's own pod and reads that list two
//! ways: from the ConfigMap mounted as a volume ([`follow_file`], polled every second) and from
//! a watch on the host apiserver ([`follow`]). [`merge`] publishes the union of whatever each
//! has read so far, and [`review`] answers each SubjectAccessReview the apiserver posts to
//! `POST /vcp/authorize` on the pod's loopback: denied for a revoked serial, no opinion
//! otherwise (RBAC decides), 503 until either source has been read once.
//!
//! Why two sources: a kubelet refreshes a ConfigMap volume only on its pod sync, up to a
//! minute and more after the change, which with the apiserver's 10 s answer cache breaks the
//! promise that a revoked kubeconfig is refused within 60 s; the watch sees a revocation in
//! about a second. The mounted file is there the moment the container starts and while the
//! host apiserver is unreachable, so a restarted authorizer answers at once without the host.
//! The union is the right merge because a serial leaves the list only when its certificate
//! has expired (and can no longer authenticate): a source that lags only denies more.
//!
//! The apiserver calls the authorizer with failure policy `Deny` for requests that carry a
//! kubeconfig's serial group, so revocations hold whenever the apiserver serves; nothing the
//! authorizer depends on (not the syncer, not vcp, not the host apiserver once the volume is
//! mounted) can switch them off.

pub mod authorizer;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::watcher;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use vcp_core::revocation::{self, Decision};

/// A list of revoked serials as last read; `None` before the first read.
pub type List = Option<Arc<BTreeSet<String>>>;

/// The revoked serials as last read; `None` before the first read.
pub type Revoked = watch::Receiver<List>;

/// The largest review the webhook reads: a SubjectAccessReview is a few hundred bytes, and a
/// bounded read keeps a misbehaving caller from growing the authorizer's memory.
pub const MAX_REVIEW: usize = 64 * 1024;

/// How often the mounted list is read again. A kubelet swaps the whole volume at once (a
/// `..data` symlink), so a read sees either the old list or the new one.
pub const FILE_PERIOD: Duration = Duration::from_secs(1);

/// A channel to follow a source into and read from.
pub fn channel() -> (watch::Sender<List>, Revoked) {
    watch::channel(None)
}

fn serials(cm: &ConfigMap) -> BTreeSet<String> {
    cm.data
        .as_ref()
        .and_then(|d| d.get(revocation::KEY))
        .map(|t| revocation::parse_list(t))
        .unwrap_or_default()
}

/// Publishes `set` on `tx` if it differs from what is there; `source` names it in the log.
fn publish(tx: &watch::Sender<List>, set: BTreeSet<String>, source: &'static str) {
    let changed = tx.borrow().as_deref() != Some(&set);
    if changed {
        tracing::info!(revoked = set.len(), source, "revoked kubeconfigs");
        tx.send_replace(Some(Arc::new(set)));
    }
}

/// Follows the ConfigMap in `namespace` until the future is dropped. A missing ConfigMap is
/// an empty list (the orchestrator writes it before the apiserver exists and on every pass).
/// The last list read stays in force while the host apiserver is unreachable.
pub async fn follow(host: kube::Client, namespace: String, tx: watch::Sender<List>) {
    let api: Api<ConfigMap> = Api::namespaced(host, &namespace);
    let cfg =
        watcher::Config::default().fields(&format!("metadata.name={}", revocation::CONFIGMAP));
    let mut events = watcher(api, cfg).boxed();
    let mut seen = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => seen = false,
            Ok(watcher::Event::InitApply(cm) | watcher::Event::Apply(cm)) => {
                seen = true;
                publish(&tx, serials(&cm), "watch");
            }
            Ok(watcher::Event::InitDone) if !seen => publish(&tx, BTreeSet::new(), "watch"),
            Ok(watcher::Event::InitDone) => {}
            Ok(watcher::Event::Delete(_)) => publish(&tx, BTreeSet::new(), "watch"),
            Err(e) => {
                // The last list stays in force; the watcher retries after a pause.
                tracing::warn!(error = %e, "watching the revoked kubeconfigs failed");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}

/// Reads the list at `path` (the `serials` key of the mounted ConfigMap) every
/// [`FILE_PERIOD`] until the future is dropped. A file that cannot be read publishes nothing:
/// the ConfigMap always has the key, so a missing file is a mount gone wrong, and the last
/// list read (or none, 503) stays.
pub async fn follow_file(path: PathBuf, tx: watch::Sender<List>) {
    let mut failing = false;
    loop {
        match tokio::fs::read_to_string(&path).await {
            Ok(text) => {
                failing = false;
                publish(&tx, revocation::parse_list(&text), "file");
            }
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(path = %path.display(), error = %e, "reading the revoked kubeconfigs failed");
            }
            Err(_) => {}
        }
        tokio::time::sleep(FILE_PERIOD).await;
    }
}

/// The union of the lists read so far; `None` while no source has been read. Pure.
pub fn union(lists: &[List]) -> List {
    let read: Vec<&Arc<BTreeSet<String>>> = lists.iter().flatten().collect();
    match read.as_slice() {
        [] => None,
        [one] => Some(Arc::clone(one)),
        many => Some(Arc::new(
            many.iter().flat_map(|s| s.iter().cloned()).collect(),
        )),
    }
}

/// Publishes on `tx` the [`union`] of `sources` whenever one of them changes. A source whose
/// sender is gone keeps its last list in the union; this returns once every source is gone.
pub async fn merge(mut sources: Vec<Revoked>, tx: watch::Sender<List>) {
    let mut open = vec![true; sources.len()];
    loop {
        let lists: Vec<List> = sources
            .iter_mut()
            .map(|s| s.borrow_and_update().clone())
            .collect();
        if let Some(set) = union(&lists) {
            let changed = tx.borrow().as_deref() != Some(&*set);
            if changed {
                tracing::info!(revoked = set.len(), "revoked kubeconfigs in force");
                tx.send_replace(Some(set));
            }
        }
        let waiting: Vec<_> = sources
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| open[*i])
            .map(|(i, s)| Box::pin(async move { (i, s.changed().await.is_ok()) }))
            .collect();
        if waiting.is_empty() {
            return;
        }
        let ((i, still_open), _, _) = futures::future::select_all(waiting).await;
        open[i] = still_open;
    }
}

/// The webhook's answer to a SubjectAccessReview body: status and JSON. Pure but for reading
/// the current list.
pub fn review(body: &[u8], revoked: Option<&BTreeSet<String>>) -> (http::StatusCode, Value) {
    use http::StatusCode;
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

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    fn sar(groups: &[&str]) -> Vec<u8> {
        json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": "alice", "groups": groups, "resourceAttributes": {"verb": "get", "resource": "pods"}},
        })
        .to_string()
        .into_bytes()
    }

    fn list(serials: &str) -> List {
        Some(Arc::new(revocation::parse_list(serials)))
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

    #[test]
    fn the_lists_in_force_are_the_union_of_what_each_source_read() {
        assert_eq!(union(&[None, None]), None, "nothing read yet: 503");
        assert_eq!(union(&[]), None);
        // One source read is enough to answer: the mounted file at start, before the watch.
        assert_eq!(union(&[list("aa01\n"), None]), list("aa01\n"));
        assert_eq!(union(&[None, list("")]), list(""));
        // The watch saw a revocation the volume does not show yet, and the volume still holds
        // a serial the watch saw pruned (expired): both are denied.
        assert_eq!(
            union(&[list("aa01\nbb02\n"), list("aa01\ncc03\n")]),
            list("aa01\nbb02\ncc03\n")
        );
    }

    #[tokio::test]
    async fn a_revocation_seen_by_either_source_is_in_force() {
        let (file_tx, file_rx) = channel();
        let (watch_tx, watch_rx) = channel();
        let (tx, mut rx) = channel();
        let merged = tokio::spawn(merge(vec![file_rx, watch_rx], tx));
        file_tx.send_replace(list("aa01\n"));
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow_and_update(), list("aa01\n"));
        watch_tx.send_replace(list("aa01\nbb02\n"));
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow_and_update(), list("aa01\nbb02\n"));
        // A source that ends keeps its last list in force.
        drop(watch_tx);
        file_tx.send_replace(list("cc03\n"));
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow_and_update(), list("aa01\nbb02\ncc03\n"));
        drop(file_tx);
        merged.await.unwrap();
    }

    #[tokio::test]
    async fn the_mounted_file_is_read_again_as_the_kubelet_swaps_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serials");
        let (tx, mut rx) = channel();
        let follower = tokio::spawn(follow_file(path.clone(), tx));
        // A missing file is not an empty list: nothing is published.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(*rx.borrow(), None);
        std::fs::write(&path, "aa01\n").unwrap();
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow_and_update(), list("aa01\n"));
        std::fs::write(&path, "aa01\nbb02\n").unwrap();
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow_and_update(), list("aa01\nbb02\n"));
        follower.abort();
    }
}
