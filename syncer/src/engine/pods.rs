//! Pods: the down-reconcile plus what a kubelet would do for the tenant.
//!
//! - Graceful deletion both ways: a terminating tenant pod deletes its host pod with the same
//!   grace period; once the host pod is gone the tenant pod is removed (grace 0), as a
//!   kubelet does after its containers stopped.
//! - A bound tenant pod that had run, whose host pod vanished while the tenant pod was not
//!   terminating, was deleted or evicted on the host: the tenant pod is deleted so its
//!   controller replaces it, as after a node loss.
//! - Status flows up; a tenant pod is bound (Binding subresource) to the virtual node named
//!   after its host node once the host scheduled it. Virtual nodes exist while tenant pods are
//!   bound to them ([`virtual_nodes`]).

use super::decide::{Decision, HostSide, decide};
use super::quota::Verdict;
use super::{Engine, Placed, Side, apply, cached_host, create_or_adopt, delete_exact, delete_host};
use crate::metrics::Direction;
use crate::resources::pods::{
    EnvFromKeys, add_service_links, bound_status, host_node, keep_host_env, placement_notes,
    same_status, service_links, status_to_tenant, to_host, wants_service_links,
};
use crate::{Error, Result, kube_err};
use k8s_openapi::api::core::v1::{Node, Pod, PodStatus};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use vcp_policy::Refusal;

/// Label on virtual nodes the syncer created in the tenant.
pub const VIRTUAL_NODE_LABEL: &str = "vcp.dev/virtual-node";

/// Removes a tenant pod at once (grace 0), as a kubelet does once its containers stopped.
async fn remove_tenant_pod(e: &Engine, t: &Pod) -> Result<()> {
    let api = Api::<Pod>::namespaced(e.tenant.clone(), &t.namespace().unwrap_or_default());
    delete_exact(&api, t, Some(0), "tenant pod").await
}

/// Down-reconcile of a tenant pod.
pub async fn down(t: Arc<Pod>, side: Arc<Side<Pod>>) -> Result<Action> {
    let e = &side.engine;
    let mut desired = to_host(&t, &e.ctx, &e.pod_env);
    // Which tenant NetworkPolicies isolate it (see `netpols`).
    desired
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .extend(super::netpols::isolation_labels(e, &t));
    let host_side = HostSide::of(e.key(), cached_host(&side, &desired));

    if t.metadata.deletion_timestamp.is_some() {
        match &host_side {
            HostSide::Ours { host: h, .. } if h.metadata.deletion_timestamp.is_none() => {
                delete_host(e, h.as_ref(), t.metadata.deletion_grace_period_seconds).await?;
            }
            HostSide::Ours { .. } => {} // the host pod is terminating; wait for it
            HostSide::Absent | HostSide::Foreign(_) => remove_tenant_pod(e, &t).await?,
        }
        return Ok(Action::requeue(Duration::from_secs(1)));
    }

    match decide(t.uid().as_deref(), true, host_side) {
        Decision::Create => {
            let bound = t.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
            let ran = t.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some();
            if bound && ran {
                tracing::info!(ns = ?t.namespace(), pod = %t.name_any(), "host pod vanished; removing the tenant pod so its owner replaces it");
                remove_tenant_pod(e, &t).await?;
                return Ok(Action::await_change());
            }
            // The plan decides before anything of the pod reaches the host.
            let refusals = vcp_policy::pods::admit(&t, &e.ctx.policy);
            if !refusals.is_empty() {
                refuse(e, &t, "PolicyRefused", &refusals).await?;
                return Ok(Action::requeue(e.resync));
            }
            // A finished pod never runs again (a kubelet would not restart it either); it
            // takes no quota, so it must not take the host either.
            let phase = t.status.as_ref().and_then(|s| s.phase.as_deref());
            if matches!(phase, Some("Succeeded" | "Failed")) {
                return Ok(Action::requeue(e.resync));
            }
            // Then the tenant-wide quota, in creation order over every tenant pod.
            match super::quota::pod(e, &t) {
                Verdict::Admitted => {}
                Verdict::NotReady => return Ok(Action::requeue(super::quota::not_ready())),
                Verdict::Refused(refusals) => {
                    refuse(e, &t, super::quota::REASON, &refusals).await?;
                    return Ok(Action::requeue(super::quota::retry(e)));
                }
            }
            // What the host pod mounts first: its ConfigMaps, Secrets and token. One held on
            // the host by someone else keeps the pod off the host: it would mount theirs.
            let (env_from, held) = sync_references(e, &t).await?;
            if !held.is_empty() {
                let refusals: Vec<Refusal> = held
                    .iter()
                    .map(|what| {
                        Refusal::new(
                            what.clone(),
                            "vcp: host conflict",
                            "the host object of that name is not this tenant's; the pod waits until it is renamed or gone",
                        )
                    })
                    .collect();
                refuse(e, &t, "HostConflict", &refusals).await?;
                return Ok(Action::requeue(CONFLICT_RETRY));
            }
            super::tokens::ensure(e, &t, None).await?;
            if wants_service_links(&t) {
                let links = tenant_service_links(e, &t.namespace().unwrap_or_default())?;
                add_service_links(&mut desired, &links, &env_from);
            }
            // Again under the admission lock, with the create it allows (the first look above
            // spares a waiting pod the work in between).
            let admission = e.admission.lock().await;
            match super::quota::pod(e, &t) {
                Verdict::Admitted => {}
                Verdict::NotReady => return Ok(Action::requeue(super::quota::not_ready())),
                Verdict::Refused(refusals) => {
                    drop(admission);
                    refuse(e, &t, super::quota::REASON, &refusals).await?;
                    return Ok(Action::requeue(super::quota::retry(e)));
                }
            }
            let created = create_or_adopt(e, t.as_ref(), &desired).await;
            if matches!(created, Ok(Placed::Ours)) {
                e.admission
                    .created::<Pod>(&t.namespace().unwrap_or_default(), &t.name_any());
            }
            drop(admission);
            let placed = match created {
                // The host's backstop caught a race the caches could not see (two passes
                // admitting at once): wait like any pod over the quota.
                Err(err) if super::quota::host_quota_pending(&err) => {
                    return Ok(Action::requeue(super::quota::not_ready()));
                }
                Err(err) if super::quota::host_refused(&err) => {
                    refuse(e, &t, super::quota::REASON, &[super::quota::host_refusal()]).await?;
                    return Ok(Action::requeue(super::quota::retry(e)));
                }
                other => other?,
            };
            if placed == Placed::Ours {
                let notes = placement_notes(&t, &e.ctx);
                if !notes.is_empty() {
                    e.report(t.as_ref(), "PlacementAdjusted", notes.join("; "))
                        .await;
                }
            }
        }
        Decision::Replace(h) => {
            delete_host(e, h.as_ref(), Some(0)).await?;
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        Decision::Update(h) => {
            if drifted(&desired, &h) {
                // Env is immutable and was settled at creation (service links of that moment).
                keep_host_env(&mut desired, &h);
                apply(e, &desired).await?;
            }
            let policies = super::netpols::tenant_policies(e, &t.namespace().unwrap_or_default());
            super::netpols::relabel_pod(e, &t, &h, &policies).await?;
            super::tokens::ensure(e, &t, Some(&h)).await?;
            e.metrics
                .timed("Pod", Direction::Up, false, sync_up(e, &t, &h))
                .await?;
        }
        Decision::Delete(_) | Decision::Conflict(_) | Decision::Nothing => {}
    }
    Ok(Action::requeue(e.resync))
}

/// How soon a pod kept off the host by a name someone else holds there is looked at again.
const CONFLICT_RETRY: Duration = Duration::from_secs(30);

/// Keeps a pod off the host: a Warning event, and the pod's `PodScheduled` condition `False`
/// with the same reason and message (what `kubectl describe` and `get -o wide` show; the tenant
/// has no scheduler of its own that would set it). Written once per message.
async fn refuse(e: &Engine, t: &Pod, reason: &str, refusals: &[Refusal]) -> Result<()> {
    let message = vcp_policy::summary(refusals);
    let shown = t
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some(reason)
                    && c.message.as_deref() == Some(message.as_str())
            })
        });
    if shown {
        return Ok(());
    }
    let ns = t.namespace().unwrap_or_default();
    let name = t.name_any();
    tracing::info!(ns = %ns, pod = %name, reason, %message, "pod kept off the host");
    e.report(t, reason, message.clone()).await;
    let patch = serde_json::json!({"status": {"conditions": [{
        "type": "PodScheduled", "status": "False", "reason": reason, "message": message,
        "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
    }]}});
    Api::<Pod>::namespaced(e.tenant.clone(), &ns)
        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .map_err(kube_err(format!("mark tenant pod {ns}/{name} refused")))?;
    Ok(())
}

/// Copies the ConfigMaps and Secrets a tenant pod references to the host, so the host pod
/// never waits for them (later changes flow through their own controllers). Returns their
/// keys (names only, never values), which decide what envFrom defines, and the references
/// whose host name someone else holds (as `configmaps/<name>`, `secrets/<name>`).
async fn sync_references(e: &Engine, t: &Pod) -> Result<(EnvFromKeys, Vec<String>)> {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let ns = t.namespace().unwrap_or_default();
    let (cms, secrets) = crate::resources::pods::references(t);
    let mut keys = EnvFromKeys::new();
    let mut held = Vec::new();
    for name in cms {
        if let Some(cm) = Api::<ConfigMap>::namespaced(e.tenant.clone(), &ns)
            .get_opt(&name)
            .await
            .map_err(kube_err(format!("get tenant configmap {ns}/{name}")))?
        {
            let names = cm.data.iter().flat_map(|d| d.keys());
            let binary = cm.binary_data.iter().flat_map(|d| d.keys());
            keys.insert(
                (false, name.clone()),
                names.chain(binary).cloned().collect(),
            );
            let host = crate::resources::configmaps::to_host(&cm, &e.ctx);
            if create_or_adopt(e, &cm, &host).await? == Placed::Conflict {
                held.push(format!("configmaps/{name}"));
            }
        }
    }
    for name in secrets {
        let secret = Api::<Secret>::namespaced(e.tenant.clone(), &ns)
            .get_opt(&name)
            .await
            .map_err(kube_err(format!("get tenant secret {ns}/{name}")))?;
        let Some(s) = &secret else { continue };
        let names = s.data.iter().flat_map(|d| d.keys());
        keys.insert((true, name.clone()), names.cloned().collect());
        if let Some(host) = crate::resources::secrets::to_host(s, &e.ctx)
            && create_or_adopt(e, s, &host).await? == Placed::Conflict
        {
            held.push(format!("secrets/{name}"));
        }
    }
    Ok((keys, held))
}

/// Service-link variables of tenant namespace `ns`, from the tenant Service cache (complete
/// before any is computed, or a pod created at startup would miss links; until then the pod
/// is retried, see [`super::cache_ready`] for why it does not wait).
fn tenant_service_links(e: &Engine, ns: &str) -> Result<Vec<k8s_openapi::api::core::v1::EnvVar>> {
    let store = e
        .tenant_services
        .get()
        .filter(|s| super::cache_ready(s))
        .ok_or_else(|| Error::NotReady("tenant service cache".into()))?;
    let services = store.state();
    Ok(service_links(
        services
            .iter()
            .filter(|s| s.metadata.namespace.as_deref() == Some(ns))
            .map(|s| s.as_ref()),
    ))
}

/// Whether the host pod lost something the tenant set (labels, annotations, images): the
/// only mutable parts of a pod, so the only drift worth an apply.
fn drifted(desired: &Pod, host: &Pod) -> bool {
    let subset = |want: &std::collections::BTreeMap<String, String>,
                  have: &std::collections::BTreeMap<String, String>| {
        want.iter().all(|(k, v)| have.get(k) == Some(v))
    };
    let images = |p: &Pod| -> Vec<Option<String>> {
        p.spec
            .iter()
            .flat_map(|s| s.containers.iter().map(|c| c.image.clone()))
            .collect()
    };
    !subset(desired.labels(), host.labels())
        || !subset(desired.annotations(), host.annotations())
        || images(desired) != images(host)
}

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
        let lags = w.based_on == rv
            || (w.status.is_some()
                && w.replaced
                    .iter()
                    .any(|r| status.is_some_and(|s| same_status(r, s))));
        if lags && w.at.elapsed() < UP_WRITE_TTL {
            return Some(w.clone());
        }
        m.remove(uid);
        None
    }

    pub fn record(&self, uid: &str, w: UpWrite) {
        let mut m = self.lock();
        if m.len() >= UP_WRITES {
            m.clear();
        }
        m.insert(uid.to_owned(), w);
    }
}

async fn sync_up(e: &Engine, t: &Pod, h: &Pod) -> Result<()> {
    let ns = t.namespace().unwrap_or_default();
    let name = t.name_any();
    let api: Api<Pod> = Api::namespaced(e.tenant.clone(), &ns);
    let uid = t.uid().unwrap_or_default();
    let rv = t.resource_version().unwrap_or_default();
    let cached_bound = t.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
    let unseen = e.up_writes.unseen(&uid, &rv, t.status.as_ref());
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
        ensure_virtual_node(e, node).await?;
        let binding = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "uid": t.uid()},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        });
        match api
            .create_subresource::<_, serde_json::Value>(
                "binding",
                &name,
                &PostParams::default(),
                &binding,
            )
            .await
        {
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
    if let Some(status) = status_to_tenant(h, shown.as_ref()) {
        let patch = serde_json::json!({"status": status});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kube_err(format!("update status of tenant pod {ns}/{name}")))?;
        wrote.replaced.extend(shown);
        wrote.status = Some(status);
        changed = true;
    }
    if changed && !uid.is_empty() {
        wrote.at = std::time::Instant::now();
        e.up_writes.record(&uid, wrote);
    }
    Ok(())
}

/// The tenant view of a host node: its name, non-reserved labels, Ready condition, capacity
/// and internal addresses; nothing that would let a tenant address the host (no taints,
/// no external addresses, no daemon endpoints).
pub fn virtual_node(host: &Node) -> Node {
    let name = host.name_any();
    let mut labels: std::collections::BTreeMap<String, String> = host
        .labels()
        .iter()
        .filter(|(k, _)| {
            k.starts_with("kubernetes.io/")
                || k.starts_with("topology.kubernetes.io/")
                || k.starts_with("node.kubernetes.io/instance-type")
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.insert(VIRTUAL_NODE_LABEL.into(), "true".into());
    let status = host
        .status
        .clone()
        .map(|s| k8s_openapi::api::core::v1::NodeStatus {
            addresses: s.addresses.map(|a| {
                a.into_iter()
                    .filter(|a| a.type_ == "InternalIP" || a.type_ == "Hostname")
                    .collect()
            }),
            allocatable: s.allocatable,
            capacity: s.capacity,
            conditions: s.conditions,
            node_info: s.node_info,
            phase: s.phase,
            ..Default::default()
        });
    Node {
        metadata: kube::api::ObjectMeta {
            name: Some(name),
            labels: Some(labels),
            ..Default::default()
        },
        spec: None,
        status,
    }
}

async fn ensure_virtual_node(e: &Engine, name: &str) -> Result<()> {
    if e.known_nodes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(name)
    {
        return Ok(());
    }
    let tenant_nodes: Api<Node> = Api::all(e.tenant.clone());
    if tenant_nodes
        .get_opt(name)
        .await
        .map_err(kube_err(format!("get tenant node {name}")))?
        .is_some()
    {
        e.known_nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_owned());
        return Ok(());
    }
    let host = Api::<Node>::all(e.host.clone())
        .get(name)
        .await
        .map_err(kube_err(format!("get host node {name}")))?;
    let node = virtual_node(&host);
    match tenant_nodes
        .create(
            &PostParams {
                field_manager: Some(crate::resources::FIELD_MANAGER.into()),
                ..Default::default()
            },
            &node,
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(ae)) if ae.code == 409 => {}
        Err(err) => return Err(kube_err(format!("create virtual node {name}"))(err)),
    }
    refresh_virtual_node(e, &node).await?;
    e.known_nodes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(name.to_owned());
    Ok(())
}

async fn refresh_virtual_node(e: &Engine, node: &Node) -> Result<()> {
    let patch = serde_json::json!({"status": node.status});
    Api::<Node>::all(e.tenant.clone())
        .patch_status(
            &node.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(kube_err(format!("update virtual node {}", node.name_any())))?;
    Ok(())
}

/// Keeps virtual nodes in step: status mirrored from the host node every period; removed once
/// no tenant pod is bound to them.
pub async fn virtual_nodes(
    e: Arc<Engine>,
    tenant_pods: super::shared::Cache<Pod>,
    period: Duration,
) {
    tenant_pods.ready().await;
    loop {
        if let Err(err) = virtual_nodes_once(&e, &tenant_pods).await {
            tracing::warn!(error = %err, "virtual node upkeep failed");
        }
        tokio::time::sleep(period).await;
    }
}

async fn virtual_nodes_once(e: &Engine, tenant_pods: &Store<Pod>) -> Result<()> {
    let used: BTreeSet<String> = tenant_pods
        .state()
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    let tenant_nodes: Api<Node> = Api::all(e.tenant.clone());
    let list = tenant_nodes
        .list(&ListParams::default().labels(&format!("{VIRTUAL_NODE_LABEL}=true")))
        .await
        .map_err(kube_err("list virtual nodes".into()))?;
    for n in list.items {
        let name = n.name_any();
        if !used.contains(&name) {
            tracing::info!(node = %name, "no tenant pod left on virtual node; removing it");
            e.known_nodes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&name);
            let _ = tenant_nodes.delete(&name, &DeleteParams::default()).await;
            continue;
        }
        if let Some(host) = Api::<Node>::all(e.host.clone())
            .get_opt(&name)
            .await
            .map_err(kube_err(format!("get host node {name}")))?
        {
            refresh_virtual_node(e, &virtual_node(&host)).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_nodes_hide_host_addresses_taints_and_private_labels() {
        let host: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kwok-node-1", "labels": {"kubernetes.io/hostname": "kwok-node-1", "vcp.dev/tenant": "x", "team": "infra"}},
            "spec": {"taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}], "podCIDR": "10.244.1.0/24"},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "10.250.0.2"}, {"type": "ExternalIP", "address": "203.0.113.9"}],
                "conditions": [{"type": "Ready", "status": "True"}],
                "capacity": {"cpu": "32"},
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            },
        }))
        .unwrap();
        let v = virtual_node(&host);
        assert_eq!(v.name_any(), "kwok-node-1");
        assert!(v.spec.is_none(), "no taints or pod CIDR of the host");
        let labels = v.labels();
        assert_eq!(labels[VIRTUAL_NODE_LABEL], "true");
        assert!(
            labels.contains_key("kubernetes.io/hostname")
                && !labels.contains_key("team")
                && !labels.contains_key("vcp.dev/tenant")
        );
        let status = v.status.unwrap();
        assert_eq!(status.addresses.unwrap().len(), 1);
        assert!(status.daemon_endpoints.is_none());
        assert_eq!(status.conditions.unwrap()[0].status, "True");
    }

    fn pod(image: &str, label: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "labels": {"app": label}},
            "spec": {"containers": [{"name": "c", "image": image}]},
        }))
        .unwrap()
    }

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
    fn drift_is_about_tenant_owned_fields_only() {
        assert!(!drifted(&pod("a", "x"), &pod("a", "x")));
        assert!(drifted(&pod("b", "x"), &pod("a", "x")));
        assert!(drifted(&pod("a", "y"), &pod("a", "x")));
    }
}
