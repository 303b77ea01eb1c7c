//! Moving a tenant's data between stores (a plan change from a dedicated etcd to a shared
//! datastore, back, or between datastores), as a restore with three more steps
//! ([`crate::snapshots::jobs`] drives them from the restore pass):
//!
//! 1. **Export** ([`Provisioner::move_export`]): the control plane's clients stopped on the
//!    plan it leaves (the store keeps running), a logical snapshot of the tenant's keys taken
//!    from that store; then the tenant switched to the plan it goes to.
//! 2. **Prepare** ([`Provisioner::prepare_store`]): the new store made ready for the import:
//!    the certificates for the new plan, then its own etcd up, or its user on the datastore.
//!    The import itself is a logical restore's.
//! 3. **Clean up** ([`Provisioner::clean_up_store`]): once imported, the store it left
//!    emptied: its own etcd's objects and volumes deleted, or its user and keys revoked from
//!    the datastore.
//!
//! An export that fails leaves the tenant on its plan; an import that fails sends it back to
//! the plan it left (whose store still holds its data, since clean-up comes last).

use crate::host::Provisioner;
use crate::inventory::Tenant;
use crate::lifecycle::steps::StepResult;
use crate::render::{Component, Input, Run};
use crate::snapshots::store::{NewRestore, RestoreRow};
use crate::{Error, Result};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DeleteParams};
use std::collections::BTreeMap;
use vcp_core::lifecycle::SnapshotState;
use vcp_core::naming::control_plane_namespace;

const ACTOR: &str = "vcp-orchestrator";

impl Provisioner {
    /// The export step of a move, on the plan it leaves (`input`): clients stopped, then the
    /// logical snapshot taken, then the plan switched. What it means for the restore.
    pub(crate) async fn move_export(
        &self,
        t: &Tenant,
        input: &Input<'_>,
        r: &RestoreRow,
    ) -> Result<(Option<NewRestore>, String)> {
        let to = r.to_plan.as_deref().unwrap_or_default();
        let ns = control_plane_namespace(&t.key);
        let stopped = Input {
            run: Run::Stopped,
            ..input.clone()
        };
        for c in [
            Component::Syncer,
            Component::ControllerManager,
            Component::Apiserver,
        ] {
            let objects = self.config.renderer.render(c, &stopped)?;
            crate::host::ssa::apply_all(&self.host, &objects).await?;
        }
        let left = self.control_plane_pods(t, &ns, false).await?;
        if left > 0 {
            return Ok((
                None,
                format!("moving to plan {to}: stopping the control plane ({left} pods left)"),
            ));
        }
        let Some(s) = self.inventory.snapshot(t.id, r.snapshot_id).await? else {
            return Ok((
                Some(NewRestore::Failed(format!(
                    "moving to plan {to}: its snapshot is gone"
                ))),
                String::new(),
            ));
        };
        let state = match s.state {
            SnapshotState::Pending => self.take_snapshot(t, input, &s, true).await?,
            other => other,
        };
        match state {
            SnapshotState::Pending => Ok((
                None,
                format!("moving to plan {to}: exporting the tenant's keys"),
            )),
            SnapshotState::Failed => {
                let why = self
                    .inventory
                    .snapshot(t.id, r.snapshot_id)
                    .await?
                    .and_then(|s| s.reason)
                    .unwrap_or_default();
                Ok((
                    Some(NewRestore::Failed(format!(
                        "moving to plan {to}: exporting the tenant's keys failed: {why}"
                    ))),
                    String::new(),
                ))
            }
            SnapshotState::Succeeded => {
                self.inventory.switch_plan(t, r, false, ACTOR).await?;
                Ok((
                    None,
                    format!("moving to plan {to}: keys exported; switching stores"),
                ))
            }
        }
    }

    /// The new store ready for the import, on the plan the move goes to (`input`); `None`
    /// when it is, else what it waits for.
    pub(crate) async fn prepare_store(
        &self,
        t: &Tenant,
        input: &Input<'_>,
    ) -> Result<Option<String>> {
        let ns = control_plane_namespace(&t.key);
        let plan = input.plan;
        // The apiserver's etcd client certificate (and on a datastore the Jobs' one) for the
        // new store, issued as bring-up issues them.
        let Some((_, host)) = self.expose(t, input.version, plan).await? else {
            return Ok(Some("waiting for the apiserver Service's address".into()));
        };
        self.ensure_pki(t, &ns, plan, &host, None).await?;
        let step = match self.config.settings.placement(plan, &t.key) {
            Some(p) => self.tenant_on_datastore(t, &p).await?,
            None => {
                let objects = self.config.renderer.render(Component::Etcd, input)?;
                crate::host::ssa::apply_all(&self.host, &objects).await?;
                crate::host::workload_ready(&self.host, &objects)
                    .await?
                    .unwrap_or(StepResult::Waiting("etcd is starting".into()))
            }
        };
        Ok(match step {
            StepResult::Ready => None,
            StepResult::Waiting(m) | StepResult::Error(m) | StepResult::Fatal(m) => Some(m),
        })
    }

    /// Once imported: the store the tenant left emptied. `None` when done, else what it waits
    /// for.
    pub(crate) async fn clean_up_store(
        &self,
        t: &Tenant,
        r: &RestoreRow,
        version: &crate::render::Version,
    ) -> Result<Option<String>> {
        let Some(from) = r.from_plan.as_deref() else {
            return Ok(None);
        };
        let plan = self
            .config
            .plans
            .get(from)
            .ok_or_else(|| Error::Config(format!("plan {from:?} is not configured")))?;
        if self.config.settings.placement(plan, &t.key).is_some() {
            // Its user and keys on the datastore it left (unless it is on that one still:
            // a move between two plans on one datastore never runs).
            return Ok(
                match self.revoke_from_datastore(t.id, &t.key, false).await? {
                    StepResult::Ready => None,
                    StepResult::Waiting(m) | StepResult::Error(m) | StepResult::Fatal(m) => {
                        Some(format!("removing the tenant from its old datastore: {m}"))
                    }
                },
            );
        }
        // Its own etcd: the objects its old plan rendered, and the members' volumes, which a
        // StatefulSet leaves behind.
        let old = self.input(t, version, plan, BTreeMap::new());
        let ns = control_plane_namespace(&t.key);
        for o in self.config.renderer.render(Component::Etcd, &old)? {
            crate::host::ssa::delete(&self.host, &o).await?;
        }
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.host.clone(), &ns);
        for m in 0..plan.etcd_replicas {
            let name = format!("data-etcd-{m}");
            match claims.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if crate::host::not_found(&e) => {}
                Err(e) => return Err(Error::kube(format!("delete claim {name}"), e)),
            }
        }
        Ok(None)
    }
}
