//! ClusterTrustBundles for host pods, from the tenant.
//!
//! A tenant pod's projected `clusterTrustBundle` sources name the *tenant's* bundles; a host
//! kubelet would read the host's. So the host pod reads them from one host ConfigMap per pod
//! ([`crate::naming::trust_bundles_name`], a key per source, see
//! [`super::translate::trust_bundle_sources`]) that this module writes from the tenant's
//! bundles before the host pod is created, and brings up to date on every pass of the pod (at
//! the latest each `--resync-seconds`; no watch of the bundles, which change rarely): a bundle
//! that changed then reaches the running pod as a changed ConfigMap does. An optional source that
//! matches nothing is an empty key (an empty file, as a kubelet writes it); a required one is
//! left out, so the kubelet holds the pod back, as a tenant kubelet would. The ConfigMap is
//! generated for the pod ([`super::generated`]: marked, owned by the host pod, never taken
//! from someone else).
//!
//! Only pods with such sources cost anything here: one list of the tenant's bundles per pass;
//! the host ConfigMap is read from the ConfigMap kind's host cache.

use crate::engine::{Engine, FIELD_MANAGER};
use crate::kinds::pods::generated::{self, Standing};
use crate::kinds::pods::translate::{trust_bundle_content, trust_bundle_sources};
use crate::{Result, kube_err};
use k8s_openapi::api::certificates::v1::ClusterTrustBundle;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use std::collections::BTreeMap;
use vcp_core::host_pod::HostPod;
use vcp_core::naming;

/// Writes the trust-bundle ConfigMap of tenant pod `t` (if it has such sources); `host_pod`,
/// once it exists, becomes its owner.
pub async fn ensure(e: &Engine, t: &Pod, host_pod: Option<&HostPod>) -> Result<()> {
    let sources = trust_bundle_sources(t);
    let (Some(uid), Some(ns)) = (t.uid(), t.namespace()) else {
        return Ok(());
    };
    if sources.is_empty() {
        return Ok(());
    }
    let bundles = match Api::<ClusterTrustBundle>::all(e.tenant.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(l) => l.items,
        // A tenant minor that does not serve certificates.k8s.io/v1 bundles has none.
        Err(kube::Error::Api(ae)) if ae.code == 404 => Vec::new(),
        Err(err) => {
            return Err(kube_err("list the tenant's ClusterTrustBundles".into())(
                err,
            ));
        }
    };
    let data: BTreeMap<String, String> = sources
        .iter()
        .filter_map(|(key, src)| {
            let content = trust_bundle_content(src, &bundles);
            match (content, src.optional.unwrap_or(false)) {
                (Some(c), _) => Some((key.clone(), c)),
                (None, true) => Some((key.clone(), String::new())),
                (None, false) => None,
            }
        })
        .collect();
    let host_ns = naming::host_namespace(e.key(), &ns);
    let name = crate::naming::trust_bundles_name(&uid);
    let api: Api<ConfigMap> = Api::namespaced(e.host.clone(), &host_ns);
    // From the ConfigMap kind's host cache, which holds the generated ConfigMaps too.
    let current = crate::engine::cached_or_get(e, &e.host_configmaps, &host_ns, &name).await?;
    match generated::standing(e.key(), current.as_ref().map(|c| &c.metadata), host_pod) {
        Standing::Foreign => {
            generated::refuse_foreign(e, t, "configmap", &host_ns, &name).await;
            return Ok(());
        }
        Standing::Ours { owned: true }
            if current
                .as_ref()
                .is_some_and(|c| c.data.as_ref().map_or(data.is_empty(), |d| *d == data)) =>
        {
            return Ok(());
        }
        _ => {}
    }
    let cm = ConfigMap {
        metadata: generated::meta(e.key(), &host_ns, &name, &uid, host_pod, []),
        data: Some(data),
        ..Default::default()
    };
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&cm),
    )
    .await
    .map_err(kube_err(format!("apply host configmap {host_ns}/{name}")))?;
    tracing::info!(ns = %ns, pod = %t.name_any(), "wrote the pod's trust bundles");
    Ok(())
}
