//! The provisioner's handle on the host cluster: what every part that touches the host shares.
//!
//! [`Provisioner`] carries the host client, the inventory and the [`Config`] (catalog, plans,
//! settings, renderer); the reconcile pass ([`crate::provision`]) and the features that act on
//! the host (signing kubeconfigs, snapshot Jobs, rotations) add their methods to it in their
//! own folders. [`ssa`] is server-side apply under vcp's field manager, with the kinds
//! templates may create. This module knows no feature.

pub mod ssa;
pub mod tenant;

pub use tenant::client_from_kubeconfig;

use crate::inventory::{Inventory, Tenant};
use crate::lifecycle::steps::{self, StepResult};
use crate::render;
use crate::render::catalog::Catalog;
use crate::render::{Input, Object, Plan, Renderer, Settings};
use crate::{Error, Result};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use kube::Client;
use kube::api::Api;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// How the orchestrator reaches tenant apiservers (readiness, bootstrap, kubeconfigs it checks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TenantAccess {
    /// Through the Service (its cluster IP, verified by its DNS name; vcp runs inside the host
    /// cluster).
    Service,
    /// Through the Service's DNS name, resolved on every connection: for a host cluster whose
    /// pods cannot reach cluster IPs (the dev cluster's devnode routes none).
    ServiceName,
    /// Through the exposed endpoint that kubeconfigs carry (vcp runs outside).
    Endpoint,
}

/// Everything a pass needs besides the tenant.
#[derive(Debug)]
pub struct Config {
    pub catalog: Catalog,
    pub plans: BTreeMap<String, Plan>,
    pub settings: Settings,
    pub renderer: Renderer,
    pub access: TenantAccess,
    /// Control-plane pods run on simulated nodes: Ready pods stand for a serving control
    /// plane and nothing talks to the tenant apiserver (benchmarks of vcp's own overhead).
    pub simulate: bool,
    /// How long one upgrade hop may take before it is rolled back.
    pub hop_timeout: Duration,
    /// vcp's own user on the host, bound to `vcp:tenant-namespace` in each namespace of a
    /// tenant vcp works in (render::host_rbac).
    pub host_user: String,
    /// Seals and opens the tenants' etcd encryption keys in the inventory
    /// (`--inventory-key`; [`crate::pki::seal`]).
    pub inventory_key: crate::pki::seal::InventoryKey,
    /// Where snapshots go off the host (`--backup-store`); none: they stay on their claims.
    pub backups: Option<crate::backup_store::BackupStore>,
}

/// The handle every part that works on the host shares; cheap to clone.
#[derive(Clone)]
pub struct Provisioner {
    pub inventory: Inventory,
    pub host: Client,
    pub config: Arc<Config>,
}

impl std::fmt::Debug for Provisioner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provisioner").finish_non_exhaustive()
    }
}

/// Label selecting a tenant's control-plane objects.
pub fn cp_selector(key: &str) -> String {
    format!("{}={key}", render::LABEL_CONTROL_PLANE_OF)
}

pub fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

pub fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// The first address of a CIDR (the tenant's own `kubernetes` Service IP).
pub fn first_service_ip(cidr: &str) -> Option<IpAddr> {
    let (base, _) = cidr.split_once('/')?;
    match base.parse::<IpAddr>().ok()? {
        IpAddr::V4(v4) => Some(IpAddr::V4((u32::from(v4) + 1).into())),
        IpAddr::V6(v6) => Some(IpAddr::V6((u128::from(v6) + 1).into())),
    }
}

pub use crate::pki::secret_str;

impl Provisioner {
    pub fn input<'a>(
        &'a self,
        t: &'a Tenant,
        version: &'a render::Version,
        plan: &'a Plan,
        rollout: BTreeMap<String, String>,
    ) -> Input<'a> {
        Input {
            name: &t.name,
            key: &t.key,
            version,
            plan,
            settings: &self.config.settings,
            rollout,
            run: crate::render::Run::Up,
        }
    }

    /// The input of a Job's template: the tenant's version and plan (Jobs mount no
    /// certificates that roll); `None` if either is not configured (the bring-up says so).
    pub fn job_input<'a>(
        &'a self,
        t: &'a Tenant,
        version: Option<&'a render::Version>,
    ) -> Option<Input<'a>> {
        let version = version?;
        let plan = self.config.plans.get(&t.plan)?;
        Some(self.input(t, version, plan, BTreeMap::new()))
    }

    /// The catalog's entry for the tenant's minor as its release runs it; `None` if this
    /// replica's catalog does not have the minor.
    pub fn version_of(&self, t: &Tenant) -> Option<render::Version> {
        self.config
            .catalog
            .at_release(&t.version, t.release.as_deref())
    }
}

pub fn ignore_404<T>(
    r: std::result::Result<T, kube::Error>,
) -> std::result::Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if not_found(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether the StatefulSets and Deployments among `objects` are fully rolled out and ready;
/// `None` if one of them does not exist or is scaled to zero (asleep, or stopped for a
/// restore): nothing of it runs, so there is no roll to keep in order, and waking it starts it
/// as early as a creation would (the apiserver beside etcd rather than after it).
pub(crate) async fn workload_ready(
    client: &Client,
    objects: &[Object],
) -> Result<Option<StepResult>> {
    for o in objects {
        let Some(ns) = o.namespace() else { continue };
        let r = match o.kind() {
            "StatefulSet" => {
                let Some(s) = Api::<StatefulSet>::namespaced(client.clone(), ns)
                    .get_opt(o.name())
                    .await
                    .map_err(|e| Error::kube(format!("read statefulset {}", o.name()), e))?
                else {
                    return Ok(None);
                };
                if s.spec.replicas == Some(0) {
                    return Ok(None);
                }
                let st = s.status.unwrap_or_default();
                steps::Rollout {
                    want: s.spec.replicas.unwrap_or(1),
                    ready: st.ready_replicas.unwrap_or(0),
                    updated: st.updated_replicas.unwrap_or(0),
                    total: st.replicas,
                    observed: st.observed_generation.unwrap_or(0),
                    generation: s.metadata.generation.unwrap_or(0),
                }
            }
            "Deployment" => {
                let Some(d) = Api::<Deployment>::namespaced(client.clone(), ns)
                    .get_opt(o.name())
                    .await
                    .map_err(|e| Error::kube(format!("read deployment {}", o.name()), e))?
                else {
                    return Ok(None);
                };
                if d.spec.replicas == Some(0) {
                    return Ok(None);
                }
                let st = d.status.unwrap_or_default();
                steps::Rollout {
                    want: d.spec.replicas.unwrap_or(1),
                    ready: st.available_replicas.unwrap_or(0),
                    updated: st.updated_replicas.unwrap_or(0),
                    total: st.replicas.unwrap_or(0),
                    observed: st.observed_generation.unwrap_or(0),
                    generation: d.metadata.generation.unwrap_or(0),
                }
            }
            _ => continue,
        };
        if let Some(waiting) = r.waiting() {
            return Ok(Some(StepResult::Waiting(format!(
                "{} {}: {waiting}",
                o.kind(),
                o.name()
            ))));
        }
    }
    Ok(Some(StepResult::Ready))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{self, ApiNames};

    #[test]
    fn the_serving_certificate_names_an_external_host_or_address() {
        let names = |external: &str| ApiNames {
            namespace: "vcp-k".into(),
            cluster_domain: "cluster.local".into(),
            kubernetes_service_ip: [10, 96, 0, 1].into(),
            external: Some(external.into()),
            etcd_replicas: 1,
            datastore_user: None,
        };
        let api = |n: &ApiNames| {
            pki::plan(n)
                .into_iter()
                .find(|l| l.name == "apiserver")
                .unwrap()
                .spec
        };
        let by_name = api(&names("k.tenants.example.net"));
        assert!(
            by_name
                .dns_names
                .contains(&"k.tenants.example.net".to_owned())
        );
        let by_ip = api(&names("203.0.113.7"));
        assert!(by_ip.ips.contains(&"203.0.113.7".parse().unwrap()));
        assert!(!by_ip.dns_names.contains(&"203.0.113.7".to_owned()));
        assert_eq!(
            first_service_ip("10.96.0.0/16"),
            Some("10.96.0.1".parse().unwrap())
        );
        assert_eq!(
            first_service_ip("fd00:10:96::/112"),
            Some("fd00:10:96::1".parse().unwrap())
        );
        assert_eq!(first_service_ip("nonsense"), None);
    }
}
