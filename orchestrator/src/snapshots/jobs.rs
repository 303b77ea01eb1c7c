//! The host side of snapshots and restores ([`crate::snapshots`]): the pass applies the Jobs
//! through these, reads how they ended from their pods, and records it (the restore pass that
//! drives them is [`crate::provision`]'s).

use crate::host::Provisioner;
use crate::inventory::Tenant;
use crate::render::Object;
use crate::render::{Component, Input, JobKind, LABEL_COMPONENT, LABEL_CONTROL_PLANE_OF};
use crate::snapshots::backup_keys::BackupKey;
use crate::snapshots::offsite::{self, BackupStore};
use crate::snapshots::store::{NewRestore, RestoreRow, SnapshotRow};
use crate::snapshots::{JobState, Report, RestoreStep, RestoreView};
use crate::{Error, Result, snapshots};
use base64::Engine as _;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::{Api, ListParams};
use serde_json::json;
use vcp_core::lifecycle::SnapshotState;
use vcp_core::naming::control_plane_namespace;

/// The last termination message of a pod's containers (init containers first, as they ran).
fn message(p: &Pod) -> Option<String> {
    let s = p.status.as_ref()?;
    let all: Vec<&ContainerStatus> = s
        .init_container_statuses
        .iter()
        .flatten()
        .chain(s.container_statuses.iter().flatten())
        .collect();
    // A failure's message first: it says why; else the last container's (the report).
    let failed = all.iter().find_map(|c| {
        let t = c.state.as_ref()?.terminated.as_ref()?;
        (t.exit_code != 0).then(|| {
            format!(
                "container {} exited {}: {}",
                c.name,
                t.exit_code,
                t.message.as_deref().unwrap_or("no message")
            )
        })
    });
    failed.or_else(|| {
        all.iter()
            .rev()
            .find_map(|c| c.state.as_ref()?.terminated.as_ref()?.message.clone())
    })
}

impl Provisioner {
    /// Applies the claim that keeps the tenant's snapshots, exactly as the snapshot Job's
    /// template makes it (one definition of it, there).
    async fn ensure_snapshot_claim(&self, input: &Input<'_>) -> Result<()> {
        let objects = self.config.renderer.render_job(
            JobKind::Snapshot,
            input,
            json!({"job": "claim-only", "file": "none", "logical": false, "backup": null}),
        )?;
        let claim: Vec<_> = objects
            .into_iter()
            .filter(|o| o.kind() == "PersistentVolumeClaim")
            .collect();
        crate::host::ssa::apply_all(&self.host, &claim).await
    }

    /// Applies the tenant's [`offsite::SECRET`]: the store's credentials and backup key `key`
    /// for the Jobs that upload and fetch its snapshots. The template context of those Jobs.
    async fn backup_secret(
        &self,
        t: &Tenant,
        store: &BackupStore,
        key: &BackupKey,
    ) -> Result<serde_json::Value> {
        let ns = control_plane_namespace(&t.key);
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let secret = Object(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": offsite::SECRET,
                "namespace": ns,
                "labels": {
                    crate::render::LABEL_CONTROL_PLANE_OF: t.key,
                    crate::render::LABEL_MANAGED_BY: "vcp",
                },
            },
            "type": "Opaque",
            // `data`, not `stringData`: applied again unchanged, it changes nothing.
            "data": {
                "access-key-id": b64(store.credentials.access_key_id.as_bytes()),
                "secret-access-key": b64(store.credentials.secret_access_key.as_bytes()),
                offsite::key_entry(key.id): b64(&key.secret),
            },
        }));
        crate::host::ssa::apply(&self.host, &secret, false).await?;
        Ok(json!({
            "secret": offsite::SECRET,
            "mount": offsite::SECRET_MOUNT,
            "endpoint": store.config.endpoint,
            "bucket": store.config.bucket,
            "region": store.config.region,
            "port": store.config.port(),
            "key_id": key.id,
            "key_file": format!("{}/{}", offsite::SECRET_MOUNT, offsite::key_entry(key.id)),
        }))
    }

    /// How a Job of this tenant's control-plane namespace is doing.
    pub async fn job_state(&self, ns: &str, name: &str) -> Result<JobState> {
        let jobs: Api<Job> = Api::namespaced(self.host.clone(), ns);
        let Some(job) = jobs
            .get_opt(name)
            .await
            .map_err(|e| Error::kube(format!("read job {name}"), e))?
        else {
            return Ok(JobState::Absent);
        };
        let status = job.status.unwrap_or_default();
        let failed = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Failed" && c.status == "True");
        if status.succeeded.unwrap_or(0) == 0 && failed.is_none() {
            return Ok(JobState::Running);
        }
        let pods: Api<Pod> = Api::namespaced(self.host.clone(), ns);
        let mut pods = pods
            .list(&ListParams::default().labels(&format!("job-name={name}")))
            .await
            .map_err(|e| Error::kube(format!("list the pods of job {name}"), e))?
            .items;
        pods.sort_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0));
        if status.succeeded.unwrap_or(0) > 0 {
            let done = pods
                .iter()
                .rev()
                .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"));
            return Ok(JobState::Succeeded(
                done.and_then(message).unwrap_or_default(),
            ));
        }
        let why = pods.iter().rev().find_map(message).unwrap_or_else(|| {
            failed
                .and_then(|c| c.message.clone())
                .unwrap_or_else(|| "the job failed".to_owned())
        });
        Ok(JobState::Failed(why))
    }

    /// Moves a pending snapshot along (the control plane is up): applies its Job, or records
    /// how it ended. Its state afterwards. `logical`: the tenant's keys rather than the whole
    /// store (always so on a shared datastore).
    pub async fn take_snapshot(
        &self,
        t: &Tenant,
        input: &Input<'_>,
        s: &SnapshotRow,
        logical: bool,
    ) -> Result<SnapshotState> {
        let ns = control_plane_namespace(&t.key);
        // Named by the tenant's own number, as the location it shows is.
        let job = snapshots::snapshot_job(s.number);
        let actor = "vcp-orchestrator";
        if self.config.simulate {
            // Simulated control planes have no etcd to stream from: the snapshot is recorded
            // as such (storage version `simulated`), so upgrades measure vcp's own work.
            let r = Report {
                revision: 1,
                size: 1,
                sha256: "0".repeat(64),
                storage_version: "simulated".into(),
                object: None,
                backup_key: None,
            };
            self.inventory
                .finish_snapshot(t.id, s.id, Ok(&r), actor)
                .await?;
            return Ok(SnapshotState::Succeeded);
        }
        match self.job_state(&ns, &job).await? {
            JobState::Absent => {
                // On a shared datastore the Job exports the tenant's keys (a logical snapshot).
                let logical =
                    logical || self.config.settings.placement(input.plan, &t.key).is_some();
                let file = if logical {
                    snapshots::logical_file_name(s.number)
                } else {
                    snapshots::file_name(s.number)
                };
                // With a backup store, the Job's last step seals the file and uploads it.
                let backup = match &self.config.backups {
                    None => serde_json::Value::Null,
                    Some(store) => {
                        let key = self
                            .inventory
                            .live_backup_key(t.id, &self.config.inventory_key, actor)
                            .await?;
                        let mut b = self.backup_secret(t, store, &key).await?;
                        b["object"] = json!(store.config.object_key(&t.key, &file));
                        b
                    }
                };
                let objects = self.config.renderer.render_job(
                    JobKind::Snapshot,
                    input,
                    json!({"job": job, "file": file, "logical": logical, "backup": backup}),
                )?;
                crate::host::ssa::apply_all(&self.host, &objects).await?;
                Ok(SnapshotState::Pending)
            }
            JobState::Running => Ok(SnapshotState::Pending),
            JobState::Succeeded(m) => match Report::parse(&m) {
                Some(r) => {
                    self.inventory
                        .finish_snapshot(t.id, s.id, Ok(&r), actor)
                        .await?;
                    Ok(SnapshotState::Succeeded)
                }
                None => {
                    let why = format!("the snapshot job reported nothing readable: {m:.200}");
                    self.inventory
                        .finish_snapshot(t.id, s.id, Err(&why), actor)
                        .await?;
                    Ok(SnapshotState::Failed)
                }
            },
            JobState::Failed(m) => {
                self.inventory
                    .finish_snapshot(t.id, s.id, Err(&m), actor)
                    .await?;
                Ok(SnapshotState::Failed)
            }
        }
    }

    /// Control-plane pods still there (etcd unless `etcd` is false, apiserver,
    /// controller-manager, syncer).
    pub async fn control_plane_pods(&self, t: &Tenant, ns: &str, etcd: bool) -> Result<usize> {
        let pods: Api<Pod> = Api::namespaced(self.host.clone(), ns);
        let sel = format!(
            "{LABEL_CONTROL_PLANE_OF}={},{LABEL_COMPONENT} in ({}kube-apiserver,kube-controller-manager,vcp-syncer)",
            t.key,
            if etcd { "etcd," } else { "" }
        );
        Ok(pods
            .list(&ListParams::default().labels(&sel))
            .await
            .map_err(|e| Error::kube("list the control plane's pods", e))?
            .items
            .len())
    }

    /// One pass over a restore that has not restored every member yet: keeps the control
    /// plane stopped, runs the members' Jobs once its pods are gone. What it means for the
    /// restore (`None`: still going) and a message for the tenant's condition.
    pub async fn restore_members(
        &self,
        t: &Tenant,
        input: &Input<'_>,
        r: &RestoreRow,
    ) -> Result<(Option<NewRestore>, String)> {
        // A move exports the tenant's keys from the store it leaves first (`input` is still
        // its old plan's until that switches it).
        if let Some(to) = r.moving_to()
            && t.plan != to
        {
            return self.move_export(t, input, r).await;
        }
        let ns = control_plane_namespace(&t.key);
        let s = self
            .inventory
            .snapshot(t.id, r.snapshot_id)
            .await?
            .filter(|s| s.state == SnapshotState::Succeeded);
        let Some(s) = s else {
            return Ok((
                Some(NewRestore::Failed(format!(
                    "snapshot {} is not a taken snapshot of this tenant",
                    r.snapshot_number
                ))),
                String::new(),
            ));
        };
        // A logical snapshot is put back by one Job while etcd runs (only its clients stop);
        // an etcd snapshot by one Job per member with etcd stopped.
        let logical = s
            .storage_version
            .as_deref()
            .is_some_and(snapshots::is_logical);
        let shared = self.config.settings.placement(input.plan, &t.key).is_some();
        if shared && !logical {
            return Ok((
                Some(NewRestore::Failed(format!(
                    "snapshot {} is an etcd snapshot of a dedicated etcd: a tenant on a shared datastore restores only from its logical snapshots",
                    r.snapshot_number
                ))),
                String::new(),
            ));
        }
        // An uploaded snapshot is fetched from the store first, whatever the claim still has.
        let fetch = match offsite::parse_location(&s.location) {
            None => serde_json::Value::Null,
            Some((_, object)) => {
                let (Some(store), Some(key_id)) = (&self.config.backups, s.backup_key_id) else {
                    return Ok((
                        Some(NewRestore::Failed(format!(
                            "snapshot {} is kept in {} and this vcp has no --backup-store to read it from",
                            r.snapshot_number, s.location
                        ))),
                        String::new(),
                    ));
                };
                let key = self
                    .inventory
                    .backup_key(t.id, key_id, &self.config.inventory_key)
                    .await?;
                let mut b = self.backup_secret(t, store, &key).await?;
                b["object"] = json!(object);
                b
            }
        };
        let members = if logical { 1 } else { input.plan.etcd_replicas };
        let mut jobs = Vec::new();
        for m in 0..members {
            jobs.push(
                self.job_state(&ns, &snapshots::restore_job(r.id, m))
                    .await?,
            );
        }
        let pods_left = self.control_plane_pods(t, &ns, !logical).await?;
        let view = RestoreView {
            restored: false,
            pods_left,
            jobs: jobs.clone(),
            ready: false,
        };
        let step = snapshots::restore_step(&view);
        if matches!(step, RestoreStep::Stop | RestoreStep::Restore) {
            // Stopped, and kept stopped until every member is restored.
            let stopped = Input {
                run: crate::render::Run::Stopped,
                ..input.clone()
            };
            let stop: &[Component] = if logical {
                &[
                    Component::Syncer,
                    Component::ControllerManager,
                    Component::Apiserver,
                ]
            } else {
                &[
                    Component::Syncer,
                    Component::ControllerManager,
                    Component::Apiserver,
                    Component::Etcd,
                ]
            };
            for &c in stop {
                let objects = self.config.renderer.render(c, &stopped)?;
                crate::host::ssa::apply_all(&self.host, &objects).await?;
            }
        }
        let id = s.number;
        Ok(match step {
            RestoreStep::Stop => (
                None,
                format!(
                    "restoring snapshot {id}: stopping the control plane ({pods_left} pods left)"
                ),
            ),
            RestoreStep::Restore => {
                // A move imports into a store made ready for it on its new plan.
                let absent = jobs.contains(&JobState::Absent);
                if pods_left == 0
                    && absent
                    && r.moving_to().is_some()
                    && let Some(wait) = self.prepare_store(t, input).await?
                {
                    return Ok((
                        None,
                        format!("restoring snapshot {id} into the new store: {wait}"),
                    ));
                }
                if pods_left == 0 && jobs.contains(&JobState::Absent) && !fetch.is_null() {
                    // Fetched from the store into a namespace that may never have taken a
                    // snapshot (a clone's): the claim first.
                    self.ensure_snapshot_claim(input).await?;
                }
                if pods_left == 0 {
                    for (m, j) in jobs.iter().enumerate() {
                        if *j != JobState::Absent {
                            continue;
                        }
                        let m = u8::try_from(m).expect("members fit a u8");
                        let objects = if logical {
                            self.config.renderer.render_job(
                                JobKind::Import,
                                input,
                                json!({
                                    "job": snapshots::restore_job(r.id, m),
                                    "file": snapshots::logical_file_name(id),
                                    "sha256": s.sha256,
                                    "fetch": fetch,
                                }),
                            )?
                        } else {
                            self.config.renderer.render_job(
                                JobKind::Restore,
                                input,
                                json!({
                                    "job": snapshots::restore_job(r.id, m),
                                    "file": snapshots::file_name(id),
                                    "sha256": s.sha256,
                                    "member": m,
                                    "staging": format!("/var/lib/etcd/restore-{}", r.id),
                                    "keep": "/var/lib/etcd/data.before-restore",
                                    "revision_bump": snapshots::REVISION_BUMP,
                                    "fetch": fetch,
                                }),
                            )?
                        };
                        crate::host::ssa::apply_all(&self.host, &objects).await?;
                    }
                }
                let done = jobs
                    .iter()
                    .filter(|j| matches!(j, JobState::Succeeded(_)))
                    .count();
                (
                    None,
                    format!("restoring snapshot {id}: {done}/{members} members restored"),
                )
            }
            RestoreStep::Start | RestoreStep::Done => {
                if r.moving_to().is_some()
                    && let Some(wait) = self.clean_up_store(t, r, input.version).await?
                {
                    return Ok((None, format!("snapshot {id} imported; {wait}")));
                }
                (
                    Some(NewRestore::Restored),
                    format!("snapshot {id} restored; starting the control plane"),
                )
            }
            RestoreStep::Failed(why) => {
                // A move's import failed: back to the plan it left, whose store has its data.
                if r.moving_to().is_some() {
                    self.inventory
                        .switch_plan(t, r, true, "vcp-orchestrator")
                        .await?;
                }
                (
                    Some(NewRestore::Failed(format!(
                        "restoring snapshot {id}: {why}"
                    ))),
                    String::new(),
                )
            }
        })
    }
}
