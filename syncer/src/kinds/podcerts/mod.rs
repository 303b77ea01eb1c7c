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
//! own signer issued. Both requests live in the apiservers; only the pacing of retries is kept
//! in memory: a request that could not be relayed yet is tried again with a doubling delay
//! ([`Retries`]), and a restart simply relists.

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
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use vcp_core::host_pod::HostPod;
use vcp_core::naming;

/// Relays pod certificate requests until the future is dropped.
pub async fn run(e: Arc<Engine>, concurrency: usize) {
    let (tx, rx) = mpsc::channel::<PodCertificateRequest>(concurrency.max(1) * 16);
    let requeue = tx.clone();
    let retries = Arc::new(Mutex::new(Retries::default()));
    let relays = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|r| (r, rx))
    })
    .for_each_concurrent(concurrency, |h| {
        let (e, requeue, retries) = (e.clone(), requeue.clone(), retries.clone());
        async move {
            let key = (h.namespace().unwrap_or_default(), h.name_any());
            match relay(&e, &h).await {
                Ok(true) => retries.lock().expect("retries").done(&key),
                Ok(false) => again(&retries, key, requeue, h),
                Err(err) => {
                    e.metrics.error("PodCertificateRequest", &err);
                    tracing::warn!(ns = ?h.namespace(), request = %h.name_any(), error = %err, "failed to relay a pod certificate request; retrying");
                    again(&retries, key, requeue, h);
                }
            }
        }
    });
    let host =
        crate::engine::fanin::each_namespace(e.clone(), watcher::Config::default(), tx.clone());
    futures::join!(host, answers(e.clone(), tx), relays);
}

/// Sends `h` back to the relay after the delay [`Retries`] gives it, unless a retry of it is
/// on its way already or it has been tried too often.
fn again(
    retries: &Arc<Mutex<Retries>>,
    key: RequestKey,
    tx: mpsc::Sender<PodCertificateRequest>,
    h: PodCertificateRequest,
) {
    let Some(delay) = retries.lock().expect("retries").next(&key) else {
        return;
    };
    let retries = retries.clone();
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        retries.lock().expect("retries").fired(&key);
        let _ = tx.send(h).await;
    });
}

/// A host request by namespace and name.
type RequestKey = (String, String);

/// When a request that could not be relayed yet is tried again: first after [`RETRY`], then
/// twice as long each time up to [`MAX_RETRY`], and not after [`MAX_TRIES`] tries (about 20
/// minutes). The retry holds a copy of the request, so without an end a request whose pod went
/// away for good would be retried for the life of the syncer; without the doubling, a request
/// failing on a down tenant apiserver would cost a call every few seconds. A request has at
/// most one retry on its way: a watch event for it meanwhile is relayed at once but schedules
/// no second one. Whatever ends early, a relist of the host watch brings back.
#[derive(Debug, Default)]
struct Retries {
    /// Tries so far, and whether a retry is on its way.
    pending: HashMap<RequestKey, (u32, bool)>,
}

/// The first retry's delay.
const RETRY: Duration = Duration::from_secs(3);
/// The longest delay between two tries.
const MAX_RETRY: Duration = Duration::from_secs(300);
/// Tries after which a request is left to the next relist.
const MAX_TRIES: u32 = 10;

impl Retries {
    /// The delay before the next try of `key`, or `None` if one is on its way or the tries
    /// are spent (then it is forgotten).
    fn next(&mut self, key: &RequestKey) -> Option<Duration> {
        let (tries, scheduled) = self.pending.entry(key.clone()).or_insert((0, false));
        if *scheduled {
            return None;
        }
        if *tries >= MAX_TRIES {
            self.pending.remove(key);
            return None;
        }
        let delay = RETRY
            .saturating_mul(2u32.saturating_pow(*tries))
            .min(MAX_RETRY);
        *tries += 1;
        *scheduled = true;
        Some(delay)
    }

    /// The retry of `key` is being sent.
    fn fired(&mut self, key: &RequestKey) {
        if let Some((_, scheduled)) = self.pending.get_mut(key) {
            *scheduled = false;
        }
    }

    /// `key` needs no more tries.
    fn done(&mut self, key: &RequestKey) {
        self.pending.remove(key);
    }
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
    let Some(hp) = host_pods.get(&ObjectRef::<HostPod>::new(&h.spec.pod_name).within(&host_ns))
    else {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> RequestKey {
        ("ns".into(), name.into())
    }

    #[test]
    fn retries_double_up_to_a_cap_one_at_a_time_and_end() {
        let mut r = Retries::default();
        let a = key("a");
        assert_eq!(r.next(&a), Some(Duration::from_secs(3)));
        assert_eq!(r.next(&a), None, "one retry on its way at a time");
        r.fired(&a);
        assert_eq!(r.next(&a), Some(Duration::from_secs(6)));
        r.fired(&a);
        assert_eq!(r.next(&a), Some(Duration::from_secs(12)));
        let mut delays = vec![];
        for _ in 3..MAX_TRIES {
            r.fired(&a);
            delays.push(r.next(&a).expect("tries left"));
        }
        assert_eq!(delays.last(), Some(&MAX_RETRY), "capped");
        r.fired(&a);
        assert_eq!(r.next(&a), None, "tries spent");
        assert!(r.pending.is_empty(), "and forgotten");
        // Others are counted on their own; a relayed request starts afresh.
        let b = key("b");
        assert_eq!(r.next(&b), Some(RETRY));
        r.fired(&b);
        r.done(&b);
        assert_eq!(r.next(&b), Some(RETRY));
    }
}
