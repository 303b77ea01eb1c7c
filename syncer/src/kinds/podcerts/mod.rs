//! Pod certificates: the host kubelet's requests answered by the tenant's signers (translation:
//! [`translate`]).
//!
//! A tenant pod's `podCertificate` source reaches the host naming vcp's signer for the tenant
//! (`pods.vcp.dev/<key>.<hash>`), which no host signer answers: the host never issues a
//! certificate for a tenant workload. The host kubelet asks for one with a
//! PodCertificateRequest in the pod's host namespace. This loop watches those requests (one
//! watch per host namespace of the tenant, as Events up do), makes the same request in the
//! tenant for the tenant pod, naming the tenant's signer ([`translate::to_tenant`]), and, once
//! a signer of the tenant answered it, writes the answer into the host request's status
//! ([`translate::answer`]), which the kubelet turns into the pod's credential bundle. A watch
//! of the tenant's relayed requests (by their label) brings the answer as soon as it is there.
//!
//! The host lets the syncer `sign` for `pods.vcp.dev/*` and update requests' status only in
//! its own host namespaces, so it answers only its own tenant's pods; and the host checks that
//! a chain is for the request's key, so a tenant can only hand its own pods certificates its
//! own signer issued. Everything is stateless: both requests live in the apiservers, and a
//! request that fails is tried again a few seconds later.

pub mod translate;

use crate::engine::Engine;
use crate::{Result, kube_err};
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::PodCertificateRequest;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use vcp_core::naming;

/// How soon a request whose relay failed, or whose pod the caches do not show yet, is tried
/// again.
const RETRY: Duration = Duration::from_secs(3);

/// Relays pod certificate requests until the future is dropped.
pub async fn run(e: Arc<Engine>, concurrency: usize) {
    let (tx, rx) = mpsc::channel::<PodCertificateRequest>(concurrency.max(1) * 16);
    let requeue = tx.clone();
    let relays = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|r| (r, rx))
    })
    .for_each_concurrent(concurrency, |h| {
        let (e, requeue) = (e.clone(), requeue.clone());
        async move {
            match relay(&e, &h).await {
                Ok(true) => {}
                Ok(false) => again(requeue, h),
                Err(err) => {
                    e.metrics.error("PodCertificateRequest", &err);
                    tracing::warn!(ns = ?h.namespace(), request = %h.name_any(), error = %err, "failed to relay a pod certificate request; retrying");
                    again(requeue, h);
                }
            }
        }
    });
    let host =
        crate::engine::fanin::each_namespace(e.clone(), watcher::Config::default(), tx.clone());
    futures::join!(host, answers(e.clone(), tx), relays);
}

/// Sends `h` back to the relay after [`RETRY`].
fn again(tx: mpsc::Sender<PodCertificateRequest>, h: PodCertificateRequest) {
    tokio::spawn(async move {
        tokio::time::sleep(RETRY).await;
        let _ = tx.send(h).await;
    });
}

/// Watches the tenant's relayed requests and sends the host request of each one answered to
/// the relay (read afresh from the host: the answer goes to its current version).
async fn answers(e: Arc<Engine>, tx: mpsc::Sender<PodCertificateRequest>) {
    let api = Api::<PodCertificateRequest>::all(e.tenant.clone());
    let cfg = watcher::Config::default().labels(&format!("{}=true", translate::RELAYED));
    let mut answered = watcher(api, cfg)
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(r) = answered.next().await {
        let t = match r {
            Ok(t) => t,
            Err(err) => {
                tracing::warn!(error = %err, "tenant pod certificate request watch failed; retrying");
                continue;
            }
        };
        if !translate::settled(t.status.as_ref()) {
            continue;
        }
        let Some(ns) = t.namespace() else { continue };
        let host_ns = naming::host_namespace(e.key(), &ns);
        let found = Api::<PodCertificateRequest>::namespaced(e.host.clone(), &host_ns)
            .get_opt(&t.name_any())
            .await;
        match found {
            Ok(Some(h)) => {
                if tx.send(h).await.is_err() {
                    return;
                }
            }
            Ok(None) => {} // the host request is gone (its pod went, or it expired)
            Err(err) => {
                tracing::warn!(ns = %host_ns, request = %t.name_any(), error = %err, "failed to read a host pod certificate request")
            }
        }
    }
}

/// One host request: `Ok(true)` when done with it for now (relayed, answered, or not ours),
/// `Ok(false)` when it must be looked at again (its pod not in the caches yet, not bound yet).
#[tracing::instrument(skip_all, fields(kind = "PodCertificateRequest", namespace = h.namespace().as_deref(), name = %h.name_any()))]
async fn relay(e: &Engine, h: &PodCertificateRequest) -> Result<bool> {
    let key = e.key().as_str();
    let prefix = format!("{}/{key}.", crate::naming::POD_SIGNER_DOMAIN);
    if !h.spec.signer_name.starts_with(&prefix) || translate::settled(h.status.as_ref()) {
        return Ok(true);
    }
    let Some(host_ns) = h.namespace() else {
        return Ok(true);
    };
    let (Some(host_pods), Some(tenant_pods)) = (e.host_pods.get(), e.tenant_pods.get()) else {
        return Ok(false);
    };
    // The pod that asked, on the host and in the tenant (the same pod only by its markers).
    let Some(hp) = host_pods.get(&ObjectRef::<Pod>::new(&h.spec.pod_name).within(&host_ns)) else {
        return Ok(false);
    };
    if hp.metadata.uid.as_deref() != Some(h.spec.pod_uid.as_str()) {
        return Ok(true); // a request of a pod that is gone
    }
    let Some(tr) = naming::tenant_ref(e.key(), hp.labels(), hp.annotations()) else {
        return Ok(true);
    };
    let Some(ns) = tr.namespace.clone() else {
        return Ok(true);
    };
    let Some(tp) = tenant_pods.get(&ObjectRef::<Pod>::new(&tr.name).within(&ns)) else {
        return Ok(false);
    };
    if tp.metadata.uid != tr.uid {
        return Ok(true);
    }
    let Some(signer) = translate::tenant_signer(&tp, key, &h.spec.signer_name) else {
        return Ok(true); // no source of the pod names it: not a request vcp made
    };
    let api = Api::<PodCertificateRequest>::namespaced(e.tenant.clone(), &ns);
    let name = h.name_any();
    let t = match api.get_opt(&name).await.map_err(kube_err(format!(
        "get tenant pod certificate request {ns}/{name}"
    )))? {
        Some(t) => t,
        None => {
            let Some(node) = tp.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                return Ok(false); // bound once the host placed it
            };
            let sa = tp
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "default".to_owned());
            let sa_uid = uid_of(
                Api::<ServiceAccount>::namespaced(e.tenant.clone(), &ns),
                &sa,
                "service account",
            )
            .await?;
            let node_uid = uid_of(Api::<Node>::all(e.tenant.clone()), &node, "node").await?;
            let want = translate::to_tenant(h, &tp, &signer, &sa_uid, &node_uid);
            match api.create(&PostParams::default(), &want).await {
                Ok(_) => {
                    tracing::info!(ns = %ns, request = %name, signer = %signer, "pod certificate request relayed to the tenant");
                }
                Err(kube::Error::Api(ae)) if ae.code == 409 => {}
                Err(err) => {
                    return Err(kube_err(format!(
                        "create tenant pod certificate request {ns}/{name}"
                    ))(err));
                }
            }
            // The answer comes through the tenant watch.
            return Ok(true);
        }
    };
    let Some(status) = translate::answer(&t, h) else {
        if !translate::relayed(&t) {
            // The tenant took the name itself: its request answers nothing on the host.
            tracing::warn!(ns = %ns, request = %name, "a tenant pod certificate request of that name is not the syncer's; the host request stays unanswered");
        }
        return Ok(true);
    };
    let mut body = h.clone();
    body.status = Some(status);
    let host = Api::<PodCertificateRequest>::namespaced(e.host.clone(), &host_ns);
    match host
        .replace_status(&name, &PostParams::default(), &body)
        .await
    {
        Ok(_) => {
            tracing::info!(ns = %host_ns, request = %name, "the tenant's answer passed to the host pod certificate request");
            Ok(true)
        }
        // A newer version of the host request: its event brings it back.
        Err(kube::Error::Api(ae)) if ae.code == 409 => Ok(true),
        Err(err) => Err(kube_err(format!(
            "answer host pod certificate request {host_ns}/{name}"
        ))(err)),
    }
}

/// The UID of tenant object `name` (a `what`), read once per relayed request.
async fn uid_of<K>(api: Api<K>, name: &str, what: &str) -> Result<String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let o = api
        .get(name)
        .await
        .map_err(kube_err(format!("get tenant {what} {name}")))?;
    Ok(o.meta().uid.clone().unwrap_or_default())
}

/// Starts relaying pod certificate requests (see [`super::KINDS`]).
pub fn start(s: &super::Start) -> futures::future::BoxFuture<'static, ()> {
    let (e, w) = (s.engine.clone(), s.workers);
    Box::pin(async move {
        crate::engine::wait_for_cache(&e.host_pods).await;
        crate::engine::wait_for_cache(&e.tenant_pods).await;
        run(e, usize::from(w)).await
    })
}
