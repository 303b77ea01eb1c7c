//! The client vcp uses on a tenant's own apiserver: cluster-admin as the orchestrator's own
//! user, from the certificate the pass keeps in the control-plane namespace, reached through
//! the Service or the exposed endpoint as [`TenantAccess`] says. The pass's readiness, bootstrap
//! and upgrade gates use it, and so does kubeconfig signing (sudo grants).

use super::{Provisioner, TenantAccess, secret_str};
use crate::{Error, Result, render};
use k8s_openapi::api::core::v1::Secret;
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

impl Provisioner {
    /// A cluster-admin client of the tenant, as the orchestrator's own user.
    pub async fn tenant_client(&self, ns: &str, endpoint: Option<&str>) -> Result<Client> {
        let secrets: Api<Secret> = Api::namespaced(self.host.clone(), ns);
        let s = secrets
            .get("orchestrator")
            .await
            .map_err(|e| Error::kube("read the orchestrator's tenant certificate", e))?;
        let (server, server_name) = match (self.config.access, endpoint) {
            (TenantAccess::Endpoint, Some(e)) => self.config.settings.expose.dial(e),
            _ => (format!("https://kube-apiserver.{ns}.svc:6443"), None),
        };
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
