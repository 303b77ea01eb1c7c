//! TCP forwarding, where kube-proxy would route.
//!
//! - The gateway forwarder: pods reach the host apiserver at `<gateway>:443` (named
//!   `kubernetes.default.svc` in their hosts file), forwarded to the apiserver on 127.0.0.1.
//! - NodePorts: for every NodePort Service with ready endpoints on this devnode's network, the
//!   devnode listens on `127.0.0.1:<nodePort>` and on `<gateway>:<nodePort>`, and forwards each
//!   connection to one ready endpoint (round robin). Endpoints elsewhere (kwok IPs) are never
//!   dialled.
//!
//! Why two addresses: kube-proxy serves a NodePort on every address of the node. The host
//! (tests, kubectl) reaches the devnode as 127.0.0.1, its Node's InternalIP; a pod cannot,
//! since 127.0.0.1 in its network namespace is its own loopback. The node address a pod sees
//! is the gateway, the host side of the pod bridge and every pod's default route, so a pod on
//! the devnode reaches `<default gateway>:<nodePort>` as it would reach its node's IP under
//! kube-proxy. Each address binds on its own: one that is taken (another dev cluster's
//! NodePort on 127.0.0.1) does not keep the other from serving.

use crate::network::Network;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Accepts on `listen` and pipes each connection to whatever `target` picks. A connection
/// that finds no target, or whose target does not answer, is closed, as kube-proxy would
/// refuse it; each is logged with its cause (`what` names the listener), since a client sees
/// only a reset and tests that count failed calls need to know which of the two it was.
pub async fn serve<F>(listener: TcpListener, what: String, target: F)
where
    F: Fn() -> Option<SocketAddr> + Send + Sync + 'static,
{
    let (target, what) = (Arc::new(target), Arc::new(what));
    loop {
        let Ok((mut inbound, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (target, what) = (target.clone(), what.clone());
        tokio::spawn(async move {
            let Some(addr) = target() else {
                tracing::warn!(listener = %what, %peer, "connection closed: no ready endpoint");
                return;
            };
            match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr)).await {
                Ok(Ok(mut outbound)) => {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
                Ok(Err(e)) => {
                    tracing::warn!(listener = %what, %peer, endpoint = %addr, error = %e, "connection closed: the endpoint refused")
                }
                Err(_) => {
                    tracing::warn!(listener = %what, %peer, endpoint = %addr, "connection closed: the endpoint did not answer in 5 s")
                }
            }
        });
    }
}

/// One NodePort's target: the service's ready endpoints on our network, for one port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodePortRule {
    pub node_port: u16,
    pub namespace: String,
    pub service: String,
    /// Name of the service port (endpoint ports carry the same name).
    pub port_name: String,
    pub target_port_number: Option<u16>,
}

/// NodePort rules of all services (pure).
pub fn rules(services: &[Arc<Service>]) -> Vec<NodePortRule> {
    let mut out = Vec::new();
    for svc in services {
        let Some(spec) = &svc.spec else { continue };
        if !matches!(spec.type_.as_deref(), Some("NodePort" | "LoadBalancer")) {
            continue;
        }
        for p in spec.ports.iter().flatten() {
            let Some(np) = p.node_port.and_then(|n| u16::try_from(n).ok()) else {
                continue;
            };
            use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
            let target_port_number = match &p.target_port {
                Some(IntOrString::Int(n)) => u16::try_from(*n).ok(),
                None => u16::try_from(p.port).ok(),
                Some(IntOrString::String(_)) => None,
            };
            out.push(NodePortRule {
                node_port: np,
                namespace: svc.namespace().unwrap_or_default(),
                service: svc.name_any(),
                port_name: p.name.clone().unwrap_or_default(),
                target_port_number,
            });
        }
    }
    out.sort();
    out
}

/// Ready endpoint addresses of a rule on our network (pure).
pub fn endpoints(
    rule: &NodePortRule,
    slices: &[Arc<EndpointSlice>],
    net: &Network,
) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    for s in slices {
        if s.namespace().as_deref() != Some(rule.namespace.as_str())
            || s.labels().get("kubernetes.io/service-name") != Some(&rule.service)
        {
            continue;
        }
        let port = s
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.clone().unwrap_or_default() == rule.port_name)
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
            .or(rule.target_port_number);
        let Some(port) = port else { continue };
        for ep in s.endpoints.iter().flatten() {
            if !ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true) {
                continue;
            }
            for a in &ep.addresses {
                if let Ok(ip) = a.parse::<IpAddr>()
                    && net.contains(ip)
                {
                    out.push(SocketAddr::new(ip, port));
                }
            }
        }
    }
    out.sort();
    out
}

/// Keeps one listener per NodePort and node address (127.0.0.1 and the gateway) in step with
/// the Services, until dropped.
pub async fn node_ports(services: Store<Service>, slices: Store<EndpointSlice>, net: Network) {
    let addresses = [IpAddr::from(Ipv4Addr::LOCALHOST), net.gateway().into()];
    let mut open: BTreeMap<(u16, IpAddr), (NodePortRule, JoinHandle<()>)> = BTreeMap::new();
    loop {
        let wanted: BTreeMap<u16, NodePortRule> = rules(&services.state())
            .into_iter()
            .map(|r| (r.node_port, r))
            .collect();
        open.retain(|(port, _), (rule, task)| {
            let keep = wanted.get(port) == Some(rule);
            if !keep {
                task.abort();
            }
            keep
        });
        let missing: Vec<(u16, IpAddr, NodePortRule)> = wanted
            .values()
            .flat_map(|r| addresses.map(|a| (r.node_port, a, r.clone())))
            .filter(|(port, address, _)| !open.contains_key(&(*port, *address)))
            .collect();
        for (port, address, rule) in missing {
            match TcpListener::bind((address, port)).await {
                Ok(listener) => {
                    let (slices, net, r, next) = (
                        slices.clone(),
                        net.clone(),
                        rule.clone(),
                        Arc::new(AtomicUsize::new(0)),
                    );
                    let what = format!("{address}:{port} ({}/{})", rule.namespace, rule.service);
                    let task = tokio::spawn(serve(listener, what, move || {
                        let eps = endpoints(&r, &slices.state(), &net);
                        (!eps.is_empty())
                            .then(|| eps[next.fetch_add(1, Ordering::Relaxed) % eps.len()])
                    }));
                    tracing::info!(node_port = port, %address, service = %format!("{}/{}", rule.namespace, rule.service), "forwarding");
                    open.insert((port, address), (rule, task));
                }
                Err(e) => {
                    tracing::debug!(node_port = port, %address, error = %e, "cannot listen yet")
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ports_forward_only_to_ready_endpoints_on_our_network() {
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "api", "namespace": "cp"},
            "spec": {"type": "NodePort", "ports": [{"name": "https", "port": 443, "targetPort": 6443, "nodePort": 31443}]},
        }))
        .unwrap();
        let rules = rules(&[Arc::new(svc)]);
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].node_port, 31443);
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "api-1", "namespace": "cp", "labels": {"kubernetes.io/service-name": "api"}},
            "addressType": "IPv4",
            "ports": [{"name": "https", "port": 6443}],
            "endpoints": [
                {"addresses": ["10.245.3.5"], "conditions": {"ready": true}},
                {"addresses": ["10.245.3.6"], "conditions": {"ready": false}},
                {"addresses": ["10.244.0.9"], "conditions": {"ready": true}},
            ],
        }))
        .unwrap();
        let net = Network {
            index: 3,
            bridge: "vcpdev3".into(),
        };
        let eps = endpoints(&rules[0], &[Arc::new(slice)], &net);
        assert_eq!(eps, ["10.245.3.5:6443".parse::<SocketAddr>().unwrap()]);
    }
}
