//! The client vcp uses on a tenant's own apiserver: cluster-admin as the orchestrator's own
//! user, from the certificate the pass keeps in the control-plane namespace, reached through
//! the Service or the exposed endpoint as [`TenantAccess`] says. The pass's readiness, bootstrap
//! and upgrade gates use it, and so does kubeconfig signing (sudo grants).

use super::{Provisioner, TenantAccess, secret_str};
use crate::{Error, Result, render};
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::Client;
use kube::api::Api;
use std::time::Duration;

/// A client from kubeconfig text.
pub async fn client_from_kubeconfig(yaml: &str) -> Result<Client> {
    let kc = kube::config::Kubeconfig::from_yaml(yaml).map_err(|e| Error::Config(e.to_string()))?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| Error::Config(e.to_string()))?;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(30));
    Client::try_from(config).map_err(|e| Error::kube("build a tenant client", e))
}

/// The tenant apiserver's Service, in its control-plane namespace.
const SERVICE: &str = "kube-apiserver";

/// Where vcp inside the host cluster dials a tenant apiserver: its Service's cluster IP, with
/// the Service's DNS name for TLS. Not the name itself: every new client would resolve it, and
/// a resolver's lost UDP answer (A and AAAA sent at once through the DNS Service's NAT) costs
/// its five-second retry, which is the client's whole connect timeout (seen on the real node:
/// "client error (Connect): deadline has elapsed" right after the apiserver answered). The
/// name stays the address only for a Service without a cluster IP.
fn in_cluster(ns: &str, cluster_ip: Option<&str>) -> (String, Option<String>) {
    let name = format!("{SERVICE}.{ns}.svc");
    match cluster_ip.and_then(|ip| ip.parse::<std::net::IpAddr>().ok()) {
        Some(ip) => (
            format!("https://{}", std::net::SocketAddr::new(ip, 6443)),
            Some(name),
        ),
        None => (format!("https://{name}:6443"), None),
    }
}

impl Provisioner {
    /// A cluster-admin client of the tenant, as the orchestrator's own user.
    pub async fn tenant_client(&self, ns: &str, endpoint: Option<&str>) -> Result<Client> {
        let secrets: Api<Secret> = Api::namespaced(self.host.clone(), ns);
        let (server, server_name) = match (self.config.access, endpoint) {
            (TenantAccess::Endpoint, Some(e)) => self.config.settings.expose.dial(e),
            (TenantAccess::ServiceName, _) | (TenantAccess::Endpoint, None) => in_cluster(ns, None),
            (TenantAccess::Service, _) => {
                let services: Api<Service> = Api::namespaced(self.host.clone(), ns);
                let ip = services
                    .get_opt(SERVICE)
                    .await
                    .map_err(|e| Error::kube("read the tenant apiserver's Service", e))?
                    .and_then(|s| s.spec)
                    .and_then(|s| s.cluster_ip);
                in_cluster(ns, ip.as_deref())
            }
        };
        let s = secrets
            .get("orchestrator")
            .await
            .map_err(|e| Error::kube("read the orchestrator's tenant certificate", e))?;
        let kc = render::kubeconfig::embedded(
            "tenant",
            (&server, server_name.as_deref()),
            &secret_str(&s, "ca.crt").unwrap_or_default(),
            "vcp",
            &secret_str(&s, "tls.crt").unwrap_or_default(),
            &secret_str(&s, "tls.key").unwrap_or_default(),
        );
        client_from_kubeconfig(&kc).await
    }
}

#[cfg(test)]
mod tests {
    use super::in_cluster;

    #[test]
    fn the_service_is_dialled_by_its_cluster_ip_and_verified_by_its_name() {
        let name = Some("kube-apiserver.vcp-k.svc".to_owned());
        assert_eq!(
            in_cluster("vcp-k", Some("10.96.0.17")),
            ("https://10.96.0.17:6443".to_owned(), name.clone())
        );
        assert_eq!(
            in_cluster("vcp-k", Some("fd00::a")),
            ("https://[fd00::a]:6443".to_owned(), name)
        );
        // Headless, or not there yet: the name, resolved as before.
        for ip in [None, Some("None"), Some("")] {
            assert_eq!(
                in_cluster("vcp-k", ip),
                ("https://kube-apiserver.vcp-k.svc:6443".to_owned(), None)
            );
        }
    }
}
