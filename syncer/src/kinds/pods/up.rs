//! Pod status and binding up (host -> tenant): once the host scheduled a pod, the tenant pod is
//! bound (Binding subresource) to the virtual node named after the host node ([`super::nodes`]),
//! and the host pod's status is copied to the tenant pod as one merge patch, only when the
//! tenant does not show it yet ([`super::translate::status_to_tenant`]). [`UpWrites`] remembers
//! writes the tenant cache may not show yet, so a pass that runs before the tenant watch
//! delivered them does not repeat them.

use super::nodes::ensure_virtual_node;
use super::translate::{
    bound_status, host_node, observed_generation, same_status, status_to_tenant,
};
use crate::engine::{Engine, echo};
use crate::{Result, kube_err};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use std::time::Duration;
use vcp_core::host_pod::HostPod;

/// Entries [`UpWrites`] holds before it starts over (it only holds writes in flight).
const UP_WRITES: usize = 10_000;

/// How long a remembered write counts at most: far longer than a tenant watch lags, short
/// enough that a status someone else set back to an older value is repaired soon.
const UP_WRITE_TTL: Duration = Duration::from_secs(30);

/// Writes to tenant pods (binding, status) that the tenant cache may not show yet.
///
/// A host change can trigger a pass on a pod before the tenant watch delivered this syncer's
/// own last writes to it; that pass would bind again (answered 409) and copy the same status
/// again, a tenant request each. The memory is only a hint, used while the cached tenant pod
/// is provably older than those writes: it is the very version they were based on, or (a
/// binding and a status written in one pass) its status is still one the writes replaced.
/// The tenant has no kubelet, so nothing but this syncer moves a pod's status. Anything else
/// drops the entry; forgetting costs one repeated, idempotent write.
#[derive(Default)]
pub struct UpWrites(std::sync::Mutex<std::collections::HashMap<String, UpWrite>>);

/// What the syncer last wrote to one tenant pod.
#[derive(Debug, Clone, PartialEq)]
pub struct UpWrite {
    /// Resource version of the tenant pod the writes were based on.
    pub based_on: String,
    pub bound: bool,
    /// The status copied up, if one was.
    pub status: Option<PodStatus>,
    /// Statuses the pod showed before the status was copied (before and after the binding).
    pub replaced: Vec<PodStatus>,
    pub at: std::time::Instant,
}

impl UpWrite {
    /// Whether a cache holding version `rv` of the pod, with `status`, is still older than
    /// these writes (and they are recent enough to count).
    fn lags(&self, rv: &str, status: Option<&PodStatus>) -> bool {
        let older = self.based_on == rv
            || (self.status.is_some()
                && self
                    .replaced
                    .iter()
                    .any(|r| status.is_some_and(|s| same_status(r, s))));
        older && self.at.elapsed() < UP_WRITE_TTL
    }

    fn new(based_on: String) -> UpWrite {
        UpWrite {
            based_on,
            bound: false,
            status: None,
            replaced: Vec::new(),
            at: std::time::Instant::now(),
        }
    }
}

impl UpWrites {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, UpWrite>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The writes to pod `uid` that a cache holding version `rv` of it, with `status`, does
    /// not show yet.
    pub fn unseen(&self, uid: &str, rv: &str, status: Option<&PodStatus>) -> Option<UpWrite> {
        let mut m = self.lock();
        let w = m.get(uid)?;
        if w.lags(rv, status) {
            return Some(w.clone());
        }
        m.remove(uid);
        None
    }

    /// Drops what is remembered of pod `uid` once the tenant cache shows it: called by the
    /// tenant pod watch for every version it caches (`present`), and for a deleted pod.
    /// A pass used to do that, but the echo of the syncer's own status write triggers none any
    /// more (`engine::echo`), and the memory, a status or two per pod, stayed until the
    /// resync (3.5 KiB per pod at 1,000 pods).
    pub fn settle(&self, uid: &str, rv: &str, status: Option<&PodStatus>, present: bool) {
        let mut m = self.lock();
        if m.get(uid).is_some_and(|w| !present || !w.lags(rv, status)) {
            m.remove(uid);
        }
    }

    /// How many pods have writes remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn record(&self, uid: &str, w: UpWrite) {
        let mut m = self.lock();
        if m.len() >= UP_WRITES {
            m.clear();
        }
        m.insert(uid.to_owned(), w);
    }
}

/// Binds tenant pod `t` to the virtual node of its host pod `h` and copies `h`'s status up,
/// each only if the tenant does not show it yet. `in_sync`: `h` runs all of `t`'s spec (see
/// [`super::translate::observed_generation`]).
pub async fn sync_up(
    e: &Engine,
    p: &super::PodCtx,
    t: &Pod,
    h: &HostPod,
    in_sync: bool,
) -> Result<()> {
    let ns = t.namespace().unwrap_or_default();
    let name = t.name_any();
    let uid = t.uid().unwrap_or_default();
    let rv = t.resource_version().unwrap_or_default();
    let cached_bound = t.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
    let unseen = p.up_writes.unseen(&uid, &rv, t.status.as_ref());
    // The tenant status as it stands, counting this syncer's writes the cache lags behind.
    let mut shown = match &unseen {
        Some(w) if w.status.is_some() => w.status.clone(),
        Some(w) if w.bound && !cached_bound => Some(bound_status(t.status.as_ref())),
        _ => t.status.clone(),
    };
    let mut wrote = unseen.clone().unwrap_or_else(|| UpWrite::new(rv));
    let mut changed = false;
    let bound = cached_bound || unseen.is_some_and(|w| w.bound);
    if !bound && let Some(node) = host_node(h) {
        ensure_virtual_node(e, p, node).await?;
        let binding = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "uid": t.uid()},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        });
        let request = kube::core::Request::new(Pod::url_path(&(), Some(&ns)))
            .create_subresource(
                "binding",
                &name,
                &PostParams::default(),
                binding.to_string().into_bytes(),
            )
            .map_err(|err| {
                kube_err(format!("bind tenant pod {ns}/{name}"))(kube::Error::BuildRequest(err))
            })?;
        // The answer is a Status nobody reads: its body is not decoded.
        match e.tenant.request_text(request).await {
            // The binding marks the pod scheduled; the status below need not repeat it.
            Ok(_) => {
                wrote.replaced.extend(shown.clone());
                shown = Some(bound_status(shown.as_ref()));
                wrote.bound = true;
                changed = true;
            }
            // Bound already, by a pass whose writes this syncer no longer remembers: the
            // tenant's status is unknown here, so the host's is copied in full.
            Err(kube::Error::Api(ae)) if ae.code == 409 => shown = None,
            Err(err) => return Err(kube_err(format!("bind tenant pod {ns}/{name}"))(err)),
        }
    }
    let observed = observed_generation(h, t, in_sync);
    if let Some(status) = status_to_tenant(h, shown.as_ref(), observed) {
        set_status(e, t, &status).await?;
        wrote.replaced.extend(shown);
        wrote.status = Some(status);
        changed = true;
    }
    if changed && !uid.is_empty() {
        wrote.at = std::time::Instant::now();
        p.up_writes.record(&uid, wrote);
    }
    Ok(())
}

/// Writes `status` as tenant pod `t`'s (a merge patch of the status subresource).
pub async fn set_status(e: &Engine, t: &Pod, status: &PodStatus) -> Result<()> {
    let ns = t.namespace().unwrap_or_default();
    let name = t.name_any();
    let patch = serde_json::json!({"status": status});
    let request = kube::core::Request::new(Pod::url_path(&(), Some(&ns)))
        .patch_subresource(
            "status",
            &name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .map_err(|err| {
            kube_err(format!("update status of tenant pod {ns}/{name}"))(kube::Error::BuildRequest(
                err,
            ))
        })?;
    // The answer is the whole pod, which the tenant watch delivers anyway: not decoded, only
    // its version read, so that the watch's echo of this write triggers no pass (see
    // `engine::echo`). An answer at the version the write started from changed nothing, and
    // its event (if any) was someone else's: not expected.
    let write = e.echoes.begin(echo::Side::Tenant, &ns, &name);
    let answer = e
        .tenant
        .request_text(request)
        .await
        .map_err(kube_err(format!("update status of tenant pod {ns}/{name}")))?;
    if let Some(rv) = echo::answer_version(&answer)
        && t.resource_version().as_deref() != Some(rv.as_str())
    {
        write.made(&rv);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(phase: &str) -> PodStatus {
        PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        }
    }

    #[test]
    fn writes_are_remembered_only_while_the_cache_lags_them() {
        let w = UpWrites::default();
        let mut bound = UpWrite::new("10".into());
        bound.bound = true;
        w.record("u1", bound.clone());
        assert_eq!(
            w.unseen("u1", "10", None),
            Some(bound.clone()),
            "the cache still holds the version the binding was based on"
        );
        assert_eq!(w.unseen("u1", "11", None), None, "the cache moved on");
        assert_eq!(w.unseen("u1", "10", None), None, "and the entry is gone");
        assert_eq!(w.unseen("u2", "10", None), None);

        // Bound and status copied in one pass: the binding shows first (another version),
        // with the status from before the copy.
        let mut both = UpWrite::new("10".into());
        both.bound = true;
        both.replaced = vec![status("Pending")];
        both.status = Some(status("Running"));
        w.record("u3", both.clone());
        let lagging = w.unseen("u3", "11", Some(&status("Pending")));
        assert_eq!(lagging, Some(both.clone()));
        assert_eq!(
            w.unseen("u3", "12", Some(&status("Running"))),
            None,
            "the copied status shows"
        );
        w.record("u3", both.clone());
        assert_eq!(
            w.unseen("u3", "12", Some(&status("Failed"))),
            None,
            "someone else's status: the cache is newer"
        );

        // An old entry counts no more.
        let mut old = both;
        old.at = std::time::Instant::now() - UP_WRITE_TTL;
        w.record("u4", old);
        assert_eq!(w.unseen("u4", "10", None), None);
    }

    #[test]
    fn the_tenant_watch_settles_writes_its_cache_shows_and_those_of_deleted_pods() {
        let w = UpWrites::default();
        let mut both = UpWrite::new("10".into());
        both.bound = true;
        both.replaced = vec![status("Pending")];
        both.status = Some(status("Running"));
        w.record("u1", both.clone());
        // The binding's version, still with the status from before: kept.
        w.settle("u1", "11", Some(&status("Pending")), true);
        assert_eq!(w.len(), 1);
        // The status write's own version: the cache shows everything, nothing is kept.
        w.settle("u1", "12", Some(&status("Running")), true);
        assert_eq!(w.len(), 0);
        // A pod deleted while its writes were remembered leaves nothing behind.
        w.record("u2", both);
        w.settle("u2", "10", None, false);
        assert_eq!(w.len(), 0);
    }
}
