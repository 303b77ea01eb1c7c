//! The tenant apiserver's egress proxy: every connection it opens into the cluster (pod,
//! Service and node proxying, kubelet calls, admission and authorization webhooks, aggregated
//! APIs) goes through here, and only to the tenant's own addresses.
//!
//! Data flow: the apiserver runs with `--egress-selector-config-file`, whose `cluster`
//! selection names the syncer's kubelet endpoint as an HTTP CONNECT proxy over mutual TLS (the
//! same certificates as its kubelet calls), and whose `controlplane` selection (the
//! authorization webhook, webhooks by URL) goes to the [`relay`] in its own pod, which keeps
//! the revocation authorizer local and opens every other target here the same way.
//! [`crate::answer::serve`] hands
//! each `CONNECT host:port` of the apiserver's kubelet client to [`Proxy::connect`], which
//! judges the target with [`allow::Allowed`] (kept current by the host pod and Service
//! watches through [`Proxy::observe_pod`] and [`Proxy::observe_service`]) and then either
//! answers `200` and pipes bytes both ways, or answers [`REFUSED`]. A refusal is decided before
//! anything is dialled, so its answer is the same whether the target is open, closed, speaks
//! HTTP or does not exist: nothing about what lies outside the tenant reaches it. Each refusal
//! is logged with its target and reason and counted in `vcp_syncer_egress_refused_total`.
//!
//! The tenant's pods and Services are the only destinations because they are the only ones a
//! tenant may legitimately make its apiserver reach; everything the review found dialled
//! (vcp's API, other tenants' syncers and etcd, Postgres, the host apiserver) is neither.

pub mod allow;
pub mod relay;

use crate::answer::Body;
use allow::{Allowed, Dial, Refusal, ServiceAddr};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use vcp_core::host_pod::HostPod;

/// The status of every refused CONNECT, whatever the reason.
pub const REFUSED: StatusCode = StatusCode::FORBIDDEN;

/// How long an allowed target may take to accept the connection.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// The tenant's addresses, shared by the watches that keep them and the proxy that reads them.
#[derive(Debug, Default)]
pub struct Addresses(RwLock<Allowed>);

impl Addresses {
    /// A host pod of the tenant was listed, changed or deleted (`present == false`).
    pub fn observe_pod(&self, pod: &HostPod, present: bool) {
        let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
        let ip = present.then(|| pod_ip(pod)).flatten();
        self.0.write().expect("not poisoned").set_pod(&key, ip);
    }

    /// A host Service of the tenant was listed, changed or deleted.
    pub fn observe_service(&self, svc: &Service, present: bool) {
        let key = format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any());
        let addr = present.then(|| service_addr(svc)).flatten();
        self.0
            .write()
            .expect("not poisoned")
            .set_service(&key, addr);
    }

    /// A copy of what is allowed now.
    pub fn snapshot(&self) -> Allowed {
        self.0.read().expect("not poisoned").clone()
    }
}

/// The IP a running, non-terminal host pod of the tenant answers on; none for a pod on the
/// host's network (its IP is a node's, shared with everything on that node) or one that has
/// finished (its IP may already be another pod's).
fn pod_ip(pod: &HostPod) -> Option<IpAddr> {
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
    {
        return None;
    }
    let status = pod.status.as_ref()?;
    if !matches!(status.phase.as_deref(), Some("Running" | "Pending")) {
        return None;
    }
    status.pod_ip.as_deref()?.parse().ok()
}

/// A host Service's ClusterIP and ports; none for a headless or ExternalName Service.
fn service_addr(svc: &Service) -> Option<ServiceAddr> {
    let spec = svc.spec.as_ref()?;
    let ip: IpAddr = spec.cluster_ip.as_deref()?.parse().ok()?;
    let ports = spec
        .ports
        .iter()
        .flatten()
        .filter_map(|p| u16::try_from(p.port).ok())
        .collect();
    Some(ServiceAddr { ip, ports })
}

/// The proxy of one tenant.
pub struct Proxy {
    /// The engine: the tenant's key and the metrics.
    pub engine: Arc<crate::engine::Engine>,
    /// The tenant's addresses, kept by the pod and Service kinds.
    pub addresses: Arc<Addresses>,
    /// The syncer's endpoint as virtual nodes give it (`address`, `port`).
    pub own: (String, u16),
    /// Where that endpoint really listens (loopback for an unspecified bind address).
    pub own_listen: SocketAddr,
    pub cluster_domain: String,
}

/// The answer to every refused CONNECT: one status, one text, nothing about the target.
pub fn refused() -> Response<Body> {
    let mut res = Response::new(
        Full::new(Bytes::from_static(b"egress refused\n"))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *res.status_mut() = REFUSED;
    res
}

impl Proxy {
    /// Judges `authority` against the tenant's addresses now.
    pub fn decide(&self, authority: &str) -> Result<Dial, Refusal> {
        let key = self.engine.key();
        self.addresses.0.read().expect("not poisoned").decide(
            authority,
            (&self.own.0, self.own.1),
            |ns| Some(vcp_core::naming::host_namespace(key, ns)),
            &self.cluster_domain,
        )
    }

    /// Serves one CONNECT of the tenant apiserver.
    pub async fn connect(&self, req: Request<Incoming>) -> Response<Body> {
        let authority = req
            .uri()
            .authority()
            .map(|a| a.as_str().to_owned())
            .unwrap_or_default();
        let dial = match self.decide(&authority) {
            Ok(d) => d,
            Err(reason) => {
                tracing::warn!(target_addr = %authority, reason = reason.as_str(), "egress refused");
                self.engine.metrics.egress_refused(reason.as_str());
                return refused();
            }
        };
        let to = match dial {
            Dial::Own => self.own_listen,
            Dial::To(addr) => addr,
        };
        let upstream = match tokio::time::timeout(DIAL_TIMEOUT, tokio::net::TcpStream::connect(to))
            .await
        {
            Ok(Ok(s)) => s,
            // Only the tenant's own addresses get this far: telling it one of its own pods
            // does not answer reveals nothing it could not learn by itself.
            Ok(Err(e)) => {
                tracing::info!(target_addr = %authority, %to, error = %e, "egress dial failed");
                return crate::answer::text(StatusCode::BAD_GATEWAY, "egress dial failed");
            }
            Err(_) => {
                tracing::info!(target_addr = %authority, %to, "egress dial timed out");
                return crate::answer::text(StatusCode::GATEWAY_TIMEOUT, "egress dial timed out");
            }
        };
        tracing::debug!(target_addr = %authority, %to, "egress allowed");
        tokio::spawn(async move {
            let Ok(upgraded) = hyper::upgrade::on(req).await else {
                return;
            };
            let mut tenant = TokioIo::new(upgraded);
            let mut upstream = upstream;
            let _ = tokio::io::copy_bidirectional(&mut tenant, &mut upstream).await;
        });
        Response::new(
            Full::new(Bytes::new())
                .map_err(|never| match never {})
                .boxed_unsync(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> HostPod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn only_running_pods_off_the_host_network_lend_their_ip() {
        let running = pod(serde_json::json!({
            "metadata": {"name": "web", "namespace": "t1-a"},
            "status": {"phase": "Running", "podIP": "10.244.1.7"},
        }));
        assert_eq!(pod_ip(&running), Some("10.244.1.7".parse().unwrap()));
        let host_net = pod(serde_json::json!({
            "metadata": {"name": "web", "namespace": "t1-a"},
            "spec": {"hostNetwork": true, "containers": []},
            "status": {"phase": "Running", "podIP": "192.0.2.2"},
        }));
        assert_eq!(pod_ip(&host_net), None);
        let done = pod(serde_json::json!({
            "metadata": {"name": "web", "namespace": "t1-a"},
            "status": {"phase": "Succeeded", "podIP": "10.244.1.7"},
        }));
        assert_eq!(pod_ip(&done), None);
    }

    #[test]
    fn watched_objects_come_and_go_from_the_allowed_addresses() {
        let a = Addresses::default();
        let p = pod(serde_json::json!({
            "metadata": {"name": "web", "namespace": "t1-a"},
            "status": {"phase": "Running", "podIP": "10.244.1.7"},
        }));
        a.observe_pod(&p, true);
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "t1-a"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]},
        }))
        .unwrap();
        a.observe_service(&svc, true);
        assert_eq!(a.snapshot().len(), 2);
        a.observe_pod(&p, false);
        a.observe_service(&svc, false);
        assert!(a.snapshot().is_empty());
    }
}
