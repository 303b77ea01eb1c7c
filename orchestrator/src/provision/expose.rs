//! Exposing a tenant's apiserver on the host: its NetworkPolicy and Service, and the endpoint
//! clients use, read back from the Service once the host has assigned it.

use crate::host::{Provisioner, ssa as host};
use crate::inventory::Tenant;
use crate::render::{Component, Expose, Plan};
use crate::{Error, Result, render};
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use std::collections::BTreeMap;
use std::net::IpAddr;
use vcp_core::naming::control_plane_namespace;

/// `https://host:port`, bracketing IPv6 literals.
pub fn url(host: &str, port: i32) -> String {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => format!("https://[{host}]:{port}"),
        _ => format!("https://{host}:{port}"),
    }
}

/// Where clients reach a tenant's apiserver, from its Service as the host reports it: the URL
/// for kubeconfigs and the host name or address the serving certificate must name. `None`
/// until the host has assigned it (a NodePort, a load balancer's address).
pub fn endpoint(expose: &Expose, key: &str, live: &Service) -> Option<(String, String)> {
    match expose {
        Expose::NodePort { address } => live
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .and_then(|p| p.iter().find_map(|p| p.node_port))
            .map(|port| (url(address, port), address.clone())),
        Expose::LoadBalancer => live
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .and_then(|i| i.first())
            .and_then(|i| i.ip.clone().or(i.hostname.clone()))
            .map(|a| (url(&a, 6443), a)),
        Expose::Hostname { domain } => {
            let h = format!("{key}.{domain}");
            Some((format!("https://{h}"), h))
        }
        // By key, not by name: names are unique per owner only, and a key is never reused (a
        // tenant created again under a deleted one's name gets a new host name, so a stale
        // kubeconfig cannot reach it); its random part also keeps one owner from probing
        // another's tenant names at the gateway.
        Expose::Gateway { domain, port, .. } => {
            let h = format!("{key}.{domain}");
            let url = match port {
                443 => format!("https://{h}"),
                p => url(&h, i32::from(*p)),
            };
            Some((url, h))
        }
    }
}

impl Provisioner {
    /// Applies the network policy and the apiserver Service; returns the endpoint URL and the
    /// host name or address to put in the serving certificate, once known.
    pub(crate) async fn expose(
        &self,
        t: &Tenant,
        version: &render::Version,
        plan: &Plan,
    ) -> Result<Option<(String, String)>> {
        let input = self.input(t, version, plan, BTreeMap::new());
        let r = &self.config.renderer;
        host::apply_all(&self.host, &r.render(Component::Network, &input)?).await?;
        let svc = r
            .render(Component::Apiserver, &input)?
            .into_iter()
            .find(|o| o.kind() == "Service")
            .ok_or(Error::Config(
                "the kube-apiserver template renders no Service".into(),
            ))?;
        host::apply(&self.host, &svc, false).await?;
        let ns = control_plane_namespace(&t.key);
        let live = Api::<Service>::namespaced(self.host.clone(), &ns)
            .get(svc.name())
            .await
            .map_err(|e| Error::kube("read the apiserver Service", e))?;
        Ok(endpoint(&self.config.settings.expose, &t.key, &live))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn endpoints_follow_the_exposure_and_wait_for_the_host() {
        let node_port = Expose::NodePort {
            address: "127.0.0.1".into(),
        };
        let pending = svc(json!({"spec": {"ports": [{"port": 6443}]}}));
        assert_eq!(endpoint(&node_port, "k", &pending), None);
        let assigned = svc(json!({"spec": {"ports": [{"port": 6443, "nodePort": 30123}]}}));
        assert_eq!(
            endpoint(&node_port, "k", &assigned),
            Some(("https://127.0.0.1:30123".into(), "127.0.0.1".into()))
        );
        let v6 = Expose::NodePort {
            address: "fd00::1".into(),
        };
        assert_eq!(
            endpoint(&v6, "k", &assigned).unwrap().0,
            "https://[fd00::1]:30123"
        );

        let lb = Expose::LoadBalancer;
        assert_eq!(endpoint(&lb, "k", &assigned), None, "no address yet");
        let with_ip =
            svc(json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}}));
        assert_eq!(
            endpoint(&lb, "k", &with_ip),
            Some(("https://203.0.113.7:6443".into(), "203.0.113.7".into()))
        );
        let with_name =
            svc(json!({"status": {"loadBalancer": {"ingress": [{"hostname": "lb.example.net"}]}}}));
        assert_eq!(endpoint(&lb, "k", &with_name).unwrap().1, "lb.example.net");

        let host = Expose::Hostname {
            domain: "tenants.example.net".into(),
        };
        assert_eq!(
            endpoint(&host, "demoab12cd", &pending),
            Some((
                "https://demoab12cd.tenants.example.net".into(),
                "demoab12cd.tenants.example.net".into()
            ))
        );
    }

    #[test]
    fn behind_the_gateway_a_tenant_is_its_key_under_the_domain() {
        let pending = svc(json!({"spec": {"ports": [{"port": 6443}]}}));
        let on_443 = Expose::Gateway {
            domain: "tenants.example.net".into(),
            port: 443,
            address: None,
        };
        let (url, host) = endpoint(&on_443, "demoab12cd", &pending).expect("known at once");
        assert_eq!(url, "https://demoab12cd.tenants.example.net");
        assert_eq!(host, "demoab12cd.tenants.example.net");
        assert_eq!(
            on_443.dial(&url),
            (url.clone(), None),
            "DNS names the gateway"
        );

        let dev = Expose::Gateway {
            domain: "tenants.vcp.test".into(),
            port: 31443,
            address: Some("10.243.3.2".into()),
        };
        let (url, host) = endpoint(&dev, "demoab12cd", &pending).unwrap();
        assert_eq!(url, "https://demoab12cd.tenants.vcp.test:31443");
        assert_eq!(
            dev.dial(&url),
            ("https://10.243.3.2:31443".to_owned(), Some(host.clone()),),
            "the address is dialled and the name goes as SNI"
        );
        let v6 = Expose::Gateway {
            domain: "tenants.vcp.test".into(),
            port: 31443,
            address: Some("fd00::2".into()),
        };
        assert_eq!(v6.dial(&url).0, "https://[fd00::2]:31443");
        // An endpoint recorded under another exposure is dialled as it is.
        assert_eq!(
            dev.dial("https://127.0.0.1:30123"),
            ("https://127.0.0.1:30123".to_owned(), None)
        );
    }
}
