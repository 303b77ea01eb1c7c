//! Tearing a tenant down: everything vcp created for it on the host goes, in an order that
//! leaves nothing half-owned, and its etcd volumes are kept when the tenant asked to retain
//! its data.

use crate::host::{Provisioner, cp_selector, ignore_404};
use crate::inventory::Tenant;
use crate::lifecycle::steps::StepResult;
use crate::{Error, Result, render};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use vcp_core::naming::{LABEL_TENANT, control_plane_namespace};

impl Provisioner {
    /// Removes everything vcp created for the tenant on the host. `Ready` when nothing is left.
    pub(crate) async fn tear_down(&self, t: &Tenant) -> Result<StepResult> {
        let ns = control_plane_namespace(&t.key);
        // The syncer goes first, so nothing recreates host objects while they are deleted.
        let deployments: Api<Deployment> = Api::namespaced(self.host.clone(), &ns);
        ignore_404(
            deployments
                .delete("vcp-syncer", &DeleteParams::foreground())
                .await,
        )
        .map_err(|e| Error::kube("delete the syncer", e))?;
        let pods: Api<Pod> = Api::namespaced(self.host.clone(), &ns);
        let syncers = pods
            .list(&ListParams::default().labels(&format!(
                "{},{}=vcp-syncer",
                cp_selector(&t.key),
                render::LABEL_COMPONENT
            )))
            .await
            .map_err(|e| Error::kube("list syncer pods", e))?;
        if !syncers.items.is_empty() {
            return Ok(StepResult::Waiting("waiting for the syncer to stop".into()));
        }
        let cluster_name = format!("vcp-syncer-{}", t.key);
        ignore_404(
            Api::<ClusterRoleBinding>::all(self.host.clone())
                .delete(&cluster_name, &DeleteParams::default())
                .await,
        )
        .map_err(|e| Error::kube("delete the syncer's cluster role binding", e))?;
        // Its namespaced role too: the bindings in its host namespaces go with the namespaces.
        for role in [
            cluster_name.clone(),
            format!("vcp-syncer-namespaced-{}", t.key),
        ] {
            ignore_404(
                Api::<ClusterRole>::all(self.host.clone())
                    .delete(&role, &DeleteParams::default())
                    .await,
            )
            .map_err(|e| Error::kube("delete the syncer's cluster roles", e))?;
        }
        // Its admission policy goes with it (binding first: a policy without one is inert).
        for (plural, what) in [
            (
                "validatingadmissionpolicybindings",
                "ValidatingAdmissionPolicyBinding",
            ),
            ("validatingadmissionpolicies", "ValidatingAdmissionPolicy"),
        ] {
            let gvk = kube::core::GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", what);
            let ar = kube::core::ApiResource::from_gvk_with_plural(&gvk, plural);
            ignore_404(
                Api::<kube::api::DynamicObject>::all_with(self.host.clone(), &ar)
                    .delete(&cluster_name, &DeleteParams::default())
                    .await,
            )
            .map_err(|e| Error::kube("delete the syncer's admission policy", e))?;
        }
        if t.retain_data {
            self.retain_etcd_volumes(&ns).await?;
        }
        // On a shared datastore: its user goes, and its keys unless it retains its data (they
        // stay under its prefix, which no user reaches any more).
        match self
            .revoke_from_datastore(t.id, &t.key, t.retain_data)
            .await?
        {
            StepResult::Ready => {}
            other => return Ok(other),
        }
        let namespaces: Api<Namespace> = Api::all(self.host.clone());
        let mut left = Vec::new();
        for sel in [format!("{LABEL_TENANT}={}", t.key), cp_selector(&t.key)] {
            for n in namespaces
                .list(&ListParams::default().labels(&sel))
                .await
                .map_err(|e| Error::kube("list tenant namespaces", e))?
            {
                let name = n.metadata.name.clone().unwrap_or_default();
                if n.metadata.deletion_timestamp.is_none() {
                    ignore_404(namespaces.delete(&name, &DeleteParams::default()).await)
                        .map_err(|e| Error::kube(format!("delete namespace {name}"), e))?;
                }
                left.push(name);
            }
        }
        let pvs: Api<PersistentVolume> = Api::all(self.host.clone());
        for pv in pvs
            .list(&ListParams::default().labels(&format!("{LABEL_TENANT}={}", t.key)))
            .await
            .map_err(|e| Error::kube("list tenant volumes", e))?
        {
            let name = pv.metadata.name.clone().unwrap_or_default();
            ignore_404(pvs.delete(&name, &DeleteParams::default()).await)
                .map_err(|e| Error::kube(format!("delete volume {name}"), e))?;
            left.push(name);
        }
        if left.is_empty() {
            Ok(StepResult::Ready)
        } else {
            left.sort();
            Ok(StepResult::Waiting(format!(
                "{} left: {}",
                left.len(),
                left.join(", ")
            )))
        }
    }

    pub(crate) async fn retain_etcd_volumes(&self, ns: &str) -> Result<()> {
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.host.clone(), ns);
        let pvs: Api<PersistentVolume> = Api::all(self.host.clone());
        for pvc in pvcs
            .list(&ListParams::default())
            .await
            .map_err(|e| Error::kube("list etcd volume claims", e))?
        {
            if let Some(pv) = pvc.spec.and_then(|s| s.volume_name) {
                let patch = json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}});
                ignore_404(
                    pvs.patch(&pv, &PatchParams::default(), &Patch::Merge(&patch))
                        .await,
                )
                .map_err(|e| Error::kube(format!("retain volume {pv}"), e))?;
            }
        }
        Ok(())
    }
}
