//! Pods: the down-reconcile plus what a kubelet would do for the tenant.
//!
//! - Graceful deletion both ways: a terminating tenant pod deletes its host pod with the same
//!   grace period; once the host pod is gone the tenant pod is removed (grace 0), as a
//!   kubelet does after its containers stopped.
//! - A bound tenant pod that had run, whose host pod vanished while the tenant pod was not
//!   terminating, was deleted or evicted on the host: the tenant pod is deleted so its
//!   controller replaces it, as after a node loss.
//! - Status flows up; a tenant pod is bound (Binding subresource) to the virtual node named
//!   after its host node once the host scheduled it ([`up`]). Virtual nodes exist while tenant
//!   pods are bound to them ([`nodes`]).
//!
//! Where a tenant pod becomes a host pod: [`down`] (this file) decides, in order, whether the
//! pod may go down at all (policy, quota, its ConfigMaps and Secrets, its token:
//! [`tokens`], its trust bundles: [`bundles`]), and creates or updates the host pod that
//! [`translate::to_host`] describes.

pub mod bundles;
pub mod decide;
pub mod generated;
pub mod nodes;
pub mod refs;
pub mod tokens;
pub mod translate;
pub mod up;

use crate::engine::decide::{Decision, HostSide, decide};
use crate::engine::quota::{self, Verdict};
use crate::engine::{
    Engine, Placed, Side, Synced, apply, cached_host, create_or_adopt, delete_exact, delete_host,
};
use crate::kinds::pods::translate::{
    EnvFromKeys, add_service_links, keep_host_env, keep_host_placement, service_links, to_host,
    wants_service_links,
};
use crate::metrics::Direction;
use crate::{Error, Result, kube_err};
use decide::{Admission, DesiredPod};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vcp_core::host_pod::HostPod;
use vcp_policy::Refusal;

/// What the pods kind keeps beside the engine: the state a kubelet would hold for the
/// tenant. One per syncer, shared by the pod controllers, the virtual-node upkeep, and the
/// ConfigMap and Secret kinds (which go down only when a pod references them).
#[derive(Default)]
pub struct PodCtx {
    /// Which ConfigMaps and Secrets tenant pods reference (fed by the tenant pod watch).
    pub refs: Mutex<refs::PodRefs>,
    /// Virtual nodes known to exist in the tenant (saves a GET per binding).
    pub known_nodes: Mutex<BTreeSet<String>>,
    /// Tenant pod writes the tenant cache may not show yet (see [`up::UpWrites`]).
    pub up_writes: up::UpWrites,
    /// Where the tenant apiserver reaches the syncer's kubelet endpoint, if it serves one
    /// (virtual nodes carry it).
    pub kubelet_endpoint: Option<nodes::KubeletEndpoint>,
    /// Under what tenant pods' tokens are issued, and their CA (`--token-generation`,
    /// `--token-ca`).
    pub tokens: tokens::TokenSource,
    /// The tenant's pod and Service addresses on the host, which the egress proxy allows
    /// (kept by the host pod and Service watches; the Service kind holds the same).
    pub addresses: Arc<crate::egress::Addresses>,
}
/// Removes a tenant pod at once (grace 0), as a kubelet does once its containers stopped.
async fn remove_tenant_pod(e: &Engine, t: &Pod) -> Result<()> {
    let api = Api::<Pod>::namespaced(e.tenant.clone(), &t.namespace().unwrap_or_default());
    delete_exact(&api, t, Some(0), "tenant pod").await
}

/// Whether the host apiserver itself (not the cache) has no pod of `desired`'s name. Asked
/// before anything is done because a host pod is missing from the cache: a cache can be
/// complete and still lack it (after a restart, a host namespace whose first list failed
/// counts as listed empty, see [`crate::engine::fanin`]), and acting on that would delete a
/// running tenant pod. An error (the list failed for a reason, say) is returned, not taken
/// for absence. Only on this path, so it costs nothing in steady state.
async fn host_pod_gone(e: &Engine, desired: &Pod) -> Result<bool> {
    let ns = desired.namespace().unwrap_or_default();
    let name = desired.name_any();
    let found = Api::<Pod>::namespaced(e.host.clone(), &ns)
        .get_opt(&name)
        .await
        .map_err(kube_err(format!("get host pod {ns}/{name}")))?;
    Ok(found.is_none())
}

/// The handler of the tenant RuntimeClass `t` names, where the plan maps handlers to host
/// classes and does not list that class by name (`None` otherwise, or if the tenant has no
/// such class). Asked of the tenant apiserver on the create path only, so it costs nothing for
/// pods without a class or once their host pod exists.
async fn runtime_handler(e: &Engine, t: &Pod) -> Result<Option<String>> {
    use k8s_openapi::api::node::v1::RuntimeClass;
    let Some(class) = t
        .spec
        .as_ref()
        .and_then(|s| s.runtime_class_name.as_deref())
    else {
        return Ok(None);
    };
    let s = &e.ctx.policy.scheduling;
    if s.runtime_handlers.is_empty() || s.runtime_classes.iter().any(|c| c == class) {
        return Ok(None);
    }
    let found = Api::<RuntimeClass>::all(e.tenant.clone())
        .get_opt(class)
        .await
        .map_err(kube_err(format!("get tenant runtimeclass {class}")))?;
    Ok(found.map(|rc| rc.handler))
}

/// A pod the tenant bound itself (`spec.nodeName`, as a real cluster's kubelet would run it
/// without a scheduler) goes to that node directly when the node is in the plan's pool: the
/// host kubelet then admits or rejects it as a real one would (a host port already taken, no
/// room left: the pod fails, and its controller replaces it). The pool's selector and the
/// affinity pin stay on the host pod, so the kubelet's own admission refuses it on any other
/// node too. A node outside the pool, or unknown, keeps only the pin, and the pod stays
/// Pending, as [`vcp_policy::placement::confine`] explains. One GET of the host node, on the
/// create path of such pods only.
async fn bind_in_pool(e: &Engine, t: &Pod, desired: &mut Pod) -> Result<()> {
    let Some(node) = t
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
    else {
        return Ok(());
    };
    let found = Api::<k8s_openapi::api::core::v1::Node>::all(e.host.clone())
        .get_opt(node)
        .await
        .map_err(kube_err(format!("get host node {node}")))?;
    if found.is_some_and(|n| vcp_policy::placement::in_pool(&n, &e.ctx.policy.placement))
        && let Some(s) = desired.spec.as_mut()
    {
        s.node_name = Some(node.to_owned());
    }
    Ok(())
}

/// Down-reconcile of a tenant pod.
#[tracing::instrument(skip_all, fields(kind = "Pod", namespace = t.namespace().as_deref(), name = %t.name_any()))]
pub async fn down(t: Arc<Pod>, side: Arc<Side<Pod>>) -> Result<Action> {
    let e = &side.engine;
    // Until the host cache holds its first list every host pod looks absent; nothing is
    // decided on that (a requeue frees the worker, see `cache_ready`).
    if !crate::engine::cache_ready(&side.host) {
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    // The host pod, once per pass: translation, placement and the isolation labels the
    // namespace's NetworkPolicies call for (see `decide`).
    let ns = t.namespace().unwrap_or_default();
    let policies = crate::kinds::netpols::tenant_policies(e, &ns);
    let DesiredPod {
        pod: mut desired,
        notes,
    } = decide::host_pod(&t, &e.ctx, &e.pod_env, &policies);
    let host_side = HostSide::of(e.key(), cached_host(&side, &desired));

    if t.metadata.deletion_timestamp.is_some() {
        match &host_side {
            HostSide::Ours { host: h, .. } if h.metadata.deletion_timestamp.is_none() => {
                delete_host(e, h.as_ref(), t.metadata.deletion_grace_period_seconds).await?;
            }
            HostSide::Ours { .. } => {} // the host pod is terminating; wait for it
            HostSide::Foreign(_) => remove_tenant_pod(e, &t).await?,
            HostSide::Absent => {
                if host_pod_gone(e, &desired).await? {
                    // A kubelet gives a deleted pod its terminal phase before it goes; a
                    // finalizer (a Job's) waits for that phase, and with the host pod gone
                    // nothing else would ever set it.
                    if let Some(status) = translate::terminal_status(t.status.as_ref()) {
                        up::set_status(e, &t, &status).await?;
                    }
                    remove_tenant_pod(e, &t).await?;
                }
            }
        }
        return Ok(Action::requeue(Duration::from_secs(1)));
    }

    match decide(t.uid().as_deref(), true, host_side) {
        Decision::Create => {
            let bound = t.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
            let ran = t.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some();
            if bound && ran {
                if !host_pod_gone(e, &desired).await? {
                    return Ok(Action::requeue(Duration::from_secs(1)));
                }
                tracing::info!(ns = ?t.namespace(), pod = %t.name_any(), "host pod vanished; removing the tenant pod so its owner replaces it");
                remove_tenant_pod(e, &t).await?;
                return Ok(Action::await_change());
            }
            // The plan, then the phase (a finished pod never runs again, as a kubelet would
            // not restart it; it takes no quota, so no host either), then the tenant-wide
            // quota in creation order over every tenant pod; a refusal shows on the pod.
            let handler = runtime_handler(e, &t).await?;
            match decide::admit(&t, &e.ctx, handler.as_deref(), || quota::pod(e, &t)) {
                Admission::Go => {
                    decide::set_runtime_class(&mut desired, &t, &e.ctx, handler.as_deref());
                    bind_in_pool(e, &t, &mut desired).await?;
                }
                Admission::Refused(refusals) => {
                    refuse(e, &t, "PolicyRefused", &refusals).await?;
                    return Ok(Action::requeue(e.resync));
                }
                Admission::Finished => return Ok(Action::requeue(e.resync)),
                Admission::Quota(v) => {
                    let wait = wait_for_quota(e, &t, v).await?;
                    return Ok(wait.unwrap_or_else(|| Action::requeue(e.resync)));
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
            // A pod the tenant bound itself (`spec.nodeName`) gets its token now; any other
            // once the host has placed it and the syncer has bound it (below, on update).
            let node = t.spec.as_ref().and_then(|s| s.node_name.as_deref());
            tokens::ensure(e, &side.own.tokens, &t, node, None).await?;
            bundles::ensure(e, &t, None).await?;
            if wants_service_links(&t) {
                let links = tenant_service_links(e, &ns)?;
                add_service_links(&mut desired, &links, &env_from);
            }
            // The pod takes its share now, right before the create (the first look above
            // spares a waiting pod the work in between): a verdict that moved meanwhile is
            // told like any other.
            let verdict = quota::admit_pod(e, &t);
            if let Some(wait) = verdict.wait(e) {
                wait_for_quota(e, &t, verdict).await?;
                return Ok(wait);
            }
            // Ephemeral containers cannot be set on create: they follow through their
            // subresource on the next pass (a host pod recreated for a pod that had some).
            if let Some(s) = desired.spec.as_mut() {
                s.ephemeral_containers = None;
            }
            let created = create_or_adopt(e, t.as_ref(), &desired).await;
            // The host's backstop counts what the ledger cannot see (a terminating pod still
            // counts on the host for its grace period): wait like any pod over the quota.
            if let Some(wait) = wait_for_quota(e, &t, quota::host_verdict(&created)).await? {
                return Ok(wait);
            }
            if created? == Placed::Ours && !notes.is_empty() {
                e.report(t.as_ref(), "PlacementAdjusted", notes.join("; "))
                    .await;
            }
        }
        Decision::Replace(h) => {
            delete_host(e, h.as_ref(), Some(0)).await?;
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        Decision::Update(h) => {
            // Resources change only through the host's `resize` subresource (below).
            let resize = translate::resized(&t, &desired, &h).is_some();
            let drift = drifted(&desired, &h);
            if drift {
                // Env is immutable and was settled at creation (service links of that moment),
                // and so is placement: both as the host pod has them, read whole.
                if let Some(whole) = whole_host_pod(e, &h).await? {
                    keep_host_env(&mut desired, &whole);
                    keep_host_placement(&mut desired, &whole);
                    apply(e, &desired).await?;
                }
            }
            if resize {
                resize_host(e, &t, &desired, &h).await?;
            }
            let debug = translate::ephemeral_added(&desired, &h).is_some();
            if debug {
                add_ephemeral(e, &t, &desired, &h).await?;
            }
            // The isolation labels `desired` carries, worked out above.
            crate::kinds::netpols::relabel_pod(e, &h, desired.labels()).await?;
            mirror_gates(e, &t, &h).await?;
            if let Some(note) = translate::host_decided_gates(&t) {
                e.report_once(t.as_ref(), GATE_IGNORED, note).await;
            }
            e.metrics
                .timed(
                    "Pod",
                    Direction::Up,
                    false,
                    up::sync_up(e, &side.own, &t, &h, !drift && !resize && !debug),
                )
                .await?;
            // After the binding above: the tenant apiserver names the pod's node in the token.
            let node = t
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .or_else(|| translate::host_node(&h));
            tokens::ensure(e, &side.own.tokens, &t, node, Some(&h)).await?;
            bundles::ensure(e, &t, Some(&h)).await?;
        }
        Decision::Delete(_) | Decision::Conflict(_) | Decision::Nothing => {}
    }
    Ok(Action::requeue(e.resync))
}

/// Host pod `h` as the host apiserver has it now, whole (the cache keeps only what passes
/// read, see [`HostPod`]); `None` if it is gone. Read only on the rare passes that write
/// what the cache does not hold: an apply after drift, a resize, new ephemeral containers.
async fn whole_host_pod(e: &Engine, h: &HostPod) -> Result<Option<Pod>> {
    let (ns, name) = (h.namespace().unwrap_or_default(), h.name_any());
    Api::<Pod>::namespaced(e.host.clone(), &ns)
        .get_opt(&name)
        .await
        .map_err(kube_err(format!("get host pod {ns}/{name}")))
}

/// Passes tenant pod `t`'s in-place resize down (`desired`: its host pod as translated now):
/// the host pod, read whole, gets the resources the tenant asked for through the host's
/// `resize` subresource, as a kubelet's pod would through its apiserver. A resize that asks
/// for more must fit the tenant's quota (the ledger already counts the pod at its new size);
/// one that does not waits with `TenantQuotaExceeded`, told once, and the host pod keeps what
/// it runs. A change since the read (409) is left to the next pass, which the host watch
/// brings.
async fn resize_host(e: &Engine, t: &Pod, desired: &Pod, h: &HostPod) -> Result<()> {
    let Some(whole) = whole_host_pod(e, h).await? else {
        return Ok(());
    };
    // Worked out again on what the host has now: the cache may not show an earlier resize.
    let Some(resize) = translate::resized(t, desired, &HostPod::from(&whole)) else {
        return Ok(());
    };
    let body = resize.body(&whole);
    let grows = translate::resize_grows(&whole, &body, &e.ctx.policy.quota.limits);
    match quota::resize(e, grows) {
        Verdict::Admitted => {}
        Verdict::Refused(refusals) => {
            quota::tell(e, t, &refusals).await;
            return Ok(());
        }
        Verdict::NotReady => return Ok(()),
    }
    let ns = whole.namespace().unwrap_or_default();
    let name = whole.name_any();
    let result = Api::<Pod>::namespaced(e.host.clone(), &ns)
        .replace_subresource("resize", &name, &kube::api::PostParams::default(), &body)
        .await;
    match result {
        Ok(_) => {
            tracing::info!(ns = %ns, pod = %name, "resize passed to the host");
            Ok(())
        }
        Err(kube::Error::Api(ae)) if ae.code == 409 => Ok(()),
        Err(err) => Err(kube_err(format!("resize host pod {ns}/{name}"))(err)),
    }
}

/// Writes the readiness-gate conditions tenant pod `t` holds and host pod `h` does not show
/// ([`translate::gates_to_host`]) to the host pod's status, as a readiness gate's controller
/// would on a real cluster: the host kubelet keeps conditions it does not own, counts them
/// into `Ready`, and that `Ready` comes back up with the rest of the status, so the tenant pod
/// turns ready, and the host Service routes to it, only once its gates are met. A strategic
/// merge by condition type touches only those conditions.
async fn mirror_gates(e: &Engine, t: &Pod, h: &HostPod) -> Result<()> {
    let conditions = translate::gates_to_host(t, h);
    if conditions.is_empty() {
        return Ok(());
    }
    let ns = h.namespace().unwrap_or_default();
    let name = h.name_any();
    let patch = serde_json::json!({"status": {"conditions": conditions}});
    Api::<Pod>::namespaced(e.host.clone(), &ns)
        .patch_status(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(&patch),
        )
        .await
        .map_err(kube_err(format!(
            "write readiness gates of host pod {ns}/{name}"
        )))?;
    Ok(())
}

/// Passes the ephemeral containers tenant pod `t` gained down (`desired`: its host pod as
/// translated now, `h` the cached one): the host pod, read whole, with them appended goes
/// through the host's `ephemeralcontainers` subresource. They are checked against the plan's
/// Pod Security level first, like the pod was (the host's admission checks the same level
/// again); a refused one is told (`PolicyRefused`) and never reaches the host.
async fn add_ephemeral(e: &Engine, t: &Pod, desired: &Pod, h: &HostPod) -> Result<()> {
    let refusals = vcp_policy::pod_security::check(t, e.ctx.policy.pod_security);
    if !refusals.is_empty() {
        let message = vcp_policy::summary(&refusals);
        tracing::info!(ns = ?t.namespace(), pod = %t.name_any(), %message, "ephemeral container kept off the host");
        e.report(t, "PolicyRefused", message).await;
        return Ok(());
    }
    let Some(whole) = whole_host_pod(e, h).await? else {
        return Ok(());
    };
    // Again on what the host has now: the cache may not show containers added a moment ago.
    let Some(new) = translate::ephemeral_added(desired, &HostPod::from(&whole)) else {
        return Ok(());
    };
    let body = translate::with_ephemeral(&whole, new);
    let ns = body.namespace().unwrap_or_default();
    let name = body.name_any();
    let result = Api::<Pod>::namespaced(e.host.clone(), &ns)
        .replace_subresource(
            "ephemeralcontainers",
            &name,
            &kube::api::PostParams::default(),
            &body,
        )
        .await;
    match result {
        Ok(_) => Ok(()),
        // A stale cache: the host watch brings the next pass.
        Err(kube::Error::Api(ae)) if ae.code == 409 => Ok(()),
        Err(err) => Err(kube_err(format!(
            "add ephemeral containers to host pod {ns}/{name}"
        ))(err)),
    }
}

/// What a pod does about its quota verdict `v`: `None` when admitted; otherwise the requeue,
/// once a refusal shows on the pod as any refusal does ([`refuse`]).
async fn wait_for_quota(e: &Engine, t: &Pod, v: Verdict) -> Result<Option<Action>> {
    if let Verdict::Refused(refusals) = &v {
        refuse(e, t, quota::REASON, refusals).await?;
    }
    Ok(v.wait(e))
}

/// The reason of the Warning a pod gets for readiness gates on host-decided conditions
/// ([`translate::host_decided_gates`]).
const GATE_IGNORED: &str = "ReadinessGateNotMirrored";

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
    let (cms, secrets) = crate::kinds::pods::translate::references(t);
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
            let host = crate::kinds::configmaps::translate::to_host(&cm, &e.ctx);
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
        if let Some(host) = crate::kinds::secrets::translate::to_host(s, &e.ctx)
            && create_or_adopt(e, s, &host).await? == Placed::Conflict
        {
            held.push(format!("secrets/{name}"));
        }
    }
    Ok((keys, held))
}

/// Service-link variables of tenant namespace `ns`, from the tenant Service cache (complete
/// before any is computed, or a pod created at startup would miss links; until then the pod
/// is retried, see [`crate::engine::cache_ready`] for why it does not wait). Only the
/// namespace's Services are read, by name: a pod's cost does not grow with the tenant's other
/// namespaces.
fn tenant_service_links(e: &Engine, ns: &str) -> Result<Vec<k8s_openapi::api::core::v1::EnvVar>> {
    let store = e
        .tenant_services
        .get()
        .filter(|s| crate::engine::cache_ready(s))
        .ok_or_else(|| Error::NotReady("tenant service cache".into()))?;
    let services: Vec<Arc<k8s_openapi::api::core::v1::Service>> = e
        .tenant_services_by_ns
        .names(ns)
        .iter()
        .filter_map(|name| store.get(&kube::runtime::reflector::ObjectRef::new(name).within(ns)))
        .collect();
    Ok(service_links(services.iter().map(|s| s.as_ref())))
}

/// Whether the host pod lost something the tenant set (labels, annotations, images): the
/// only mutable parts of a pod, so the only drift worth an apply.
fn drifted(desired: &Pod, host: &HostPod) -> bool {
    let subset = |want: &std::collections::BTreeMap<String, String>,
                  have: &std::collections::BTreeMap<String, String>| {
        want.iter().all(|(k, v)| have.get(k) == Some(v))
    };
    let want_images = desired
        .spec
        .iter()
        .flat_map(|s| s.containers.iter().map(|c| c.image.as_deref()));
    let images = host
        .spec
        .iter()
        .flat_map(|s| s.containers.iter().map(|c| c.image.as_deref()));
    // The deadline is one of the few mutable spec fields, and the tenant's controllers and
    // `kubectl` set it on running pods (a Job's `activeDeadlineSeconds` works through it).
    let want_deadline = desired
        .spec
        .as_ref()
        .and_then(|s| s.active_deadline_seconds);
    let deadline = host.spec.as_ref().and_then(|s| s.active_deadline_seconds);
    !subset(desired.labels(), host.labels())
        || !subset(desired.annotations(), host.annotations())
        || !want_images.eq(images)
        || want_deadline != deadline
}
impl Synced for Pod {
    type Own = PodCtx;
    type Host = HostPod;

    /// A new host pod has nothing to tell the pass that created it: it is not scheduled yet
    /// (or bound where the create asked), and its scheduling, running and status each come
    /// as an event of their own.
    const SKIPS_OWN_ECHOES: bool = true;

    fn to_host(t: &Self, e: &Engine, _: &PodCtx) -> Option<Self> {
        Some(to_host(t, &e.ctx, &e.pod_env))
    }

    fn observe(
        e: &std::sync::Arc<Engine>,
        own: &Arc<PodCtx>,
        tenant: &mut crate::engine::shared::Shared<Self>,
        host: &mut crate::engine::shared::Shared<HostPod>,
    ) {
        crate::engine::quota::observe(e, tenant, host);
        let addresses = own.addresses.clone();
        let index = e.clone();
        host.observe(Box::new(move |p, present| {
            addresses.observe_pod(p, present);
            index
                .pod_index
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .observe(index.key(), p, present);
        }));
        let (e, own) = (e.clone(), own.clone());
        tenant.observe(Box::new(move |pod: &Pod, present| {
            let (Some(ns), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
                return;
            };
            e.tenant_pods_by_ns.observe(ns, name, present);
            if let (Some(uid), Some(rv)) = (&pod.metadata.uid, &pod.metadata.resource_version) {
                own.up_writes.settle(uid, rv, pod.status.as_ref(), present);
            }
            let refs = present.then(|| translate::references(pod));
            own.refs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .observe(ns, name, refs);
        }));
    }
}

/// Whether a tenant pod in `ns` references ConfigMap (`secret == false`) or Secret `name`.
pub fn referenced(e: &Engine, p: &PodCtx, ns: &str, name: &str, secret: bool) -> bool {
    if e.sync_all_configmaps_secrets {
        return true;
    }
    p.refs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .referenced(ns, name, secret)
}

/// Starts the pod controllers and the virtual-node upkeep (see [`super::KINDS`]).
pub fn start(s: &super::Start) -> futures::future::BoxFuture<'static, ()> {
    let (e, own, w, period) = (s.engine.clone(), s.pods.clone(), s.workers, s.period);
    Box::pin(async move {
        let (pods_tx, pods_rx) = tokio::sync::oneshot::channel();
        let nodes = {
            let (e, own) = (e.clone(), own.clone());
            async move {
                if let Ok(store) = pods_rx.await {
                    nodes::virtual_nodes(e, own, store, period).await;
                }
            }
        };
        let stores = {
            let e = e.clone();
            move |s: crate::engine::shared::Cache<Pod>, h| {
                // ConfigMaps and Secrets follow the pods that reference them.
                let _ = e.tenant_pods.set(s.clone());
                // Events up find their host pod here.
                let _ = e.host_pods.set(h);
                let _ = pods_tx.send(s);
            }
        };
        futures::join!(
            crate::engine::run_kind::<Pod>(e, own, w, |t, s| Box::pin(down(t, s)), stores),
            crate::engine::spawned(nodes),
        );
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(image: &str, label: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "labels": {"app": label}},
            "spec": {"containers": [{"name": "c", "image": image}]},
        }))
        .unwrap()
    }

    #[test]
    fn drift_is_about_tenant_owned_fields_only() {
        let host = |image, label| HostPod::from(&pod(image, label));
        assert!(!drifted(&pod("a", "x"), &host("a", "x")));
        assert!(drifted(&pod("b", "x"), &host("a", "x")));
        assert!(drifted(&pod("a", "y"), &host("a", "x")));
    }
}
