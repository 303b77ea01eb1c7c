//! A small dynamic provisioner behind the dev cluster's default StorageClass.
//!
//! The controller-manager's PV controller marks a claim of the default class with
//! `volume.kubernetes.io/storage-provisioner: vcp.dev/hostpath` and waits for a volume. This
//! controller answers with a hostPath PV backed by `<state>/volumes/<pv>` and pre-bound to the
//! claim; the PV controller completes the binding. When a claim goes away its Released volume
//! (reclaim policy Delete) is deleted together with its directory. Both reconcilers are
//! idempotent: the PV name is derived from the claim's UID.

use crate::{Error, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The `provisioner` of the default StorageClass.
pub const PROVISIONER_NAME: &str = "vcp.dev/hostpath";
const ANN_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

struct Ctx {
    client: Client,
    volumes: PathBuf,
}

/// Why a reconcile failed (kept inside the provisioner; logged and retried).
#[derive(Debug, thiserror::Error)]
enum ReconcileError {
    #[error("kubernetes api call failed")]
    Kube(#[from] kube::Error),
    #[error("failed to manage volume directory {0}")]
    Dir(PathBuf, #[source] std::io::Error),
}

/// Name of the volume provisioned for a claim.
pub fn volume_name(claim_uid: &str) -> String {
    format!("pvc-{claim_uid}")
}

/// The PV that satisfies `pvc`, or `None` if this provisioner should not act on it (pure).
pub fn volume_for(
    pvc: &PersistentVolumeClaim,
    volumes: &std::path::Path,
) -> Option<PersistentVolume> {
    let ours = pvc.annotations().get(ANN_PROVISIONER).map(String::as_str) == Some(PROVISIONER_NAME);
    let spec = pvc.spec.as_ref()?;
    if !ours || spec.volume_name.is_some() || pvc.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let uid = pvc.uid()?;
    let name = volume_name(&uid);
    let storage = spec
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")?
        .clone();
    let pv = serde_json::json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": {ANN_PROVISIONED_BY: PROVISIONER_NAME}},
        "spec": {
            "capacity": {"storage": storage},
            "accessModes": spec.access_modes.clone().unwrap_or_else(|| vec!["ReadWriteOnce".into()]),
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": spec.storage_class_name,
            "volumeMode": spec.volume_mode.clone().unwrap_or_else(|| "Filesystem".into()),
            "hostPath": {"path": volumes.join(&name), "type": "DirectoryOrCreate"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": pvc.namespace(),
                "name": pvc.name_any(),
                "uid": uid,
            },
        },
    });
    serde_json::from_value(pv).ok()
}

async fn reconcile_claim(
    pvc: Arc<PersistentVolumeClaim>,
    ctx: Arc<Ctx>,
) -> Result<Action, ReconcileError> {
    let Some(pv) = volume_for(&pvc, &ctx.volumes) else {
        return Ok(Action::await_change());
    };
    let name = pv.name_any();
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    if pvs.get_opt(&name).await?.is_some() {
        return Ok(Action::await_change());
    }
    let dir = ctx.volumes.join(&name);
    std::fs::create_dir_all(&dir).map_err(|e| ReconcileError::Dir(dir.clone(), e))?;
    // Workloads may run as any user; the directory is theirs.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .map_err(|e| ReconcileError::Dir(dir.clone(), e))?;
    match pvs.create(&PostParams::default(), &pv).await {
        Ok(_) => {
            tracing::info!(pv = %name, claim = %pvc.name_any(), ns = ?pvc.namespace(), "provisioned")
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

async fn reconcile_volume(
    pv: Arc<PersistentVolume>,
    ctx: Arc<Ctx>,
) -> Result<Action, ReconcileError> {
    let ours =
        pv.annotations().get(ANN_PROVISIONED_BY).map(String::as_str) == Some(PROVISIONER_NAME);
    let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    let delete = pv
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        == Some("Delete");
    if !ours || !delete || !matches!(phase, Some("Released" | "Failed")) {
        return Ok(Action::await_change());
    }
    let name = pv.name_any();
    let dir = ctx.volumes.join(&name);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(ReconcileError::Dir(dir, e)),
    }
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    match pvs.delete(&name, &DeleteParams::default()).await {
        Ok(_) => tracing::info!(pv = %name, "deleted released volume"),
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

fn retry<K>(_: Arc<K>, err: &ReconcileError, _: Arc<Ctx>) -> Action {
    tracing::warn!(error = %err, "provisioner reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

/// Runs both controllers until the future is dropped.
pub async fn run(client: Client, volumes: PathBuf) {
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        volumes,
    });
    let claims = Controller::new(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
    )
    .run(reconcile_claim, retry, ctx.clone())
    .for_each(|_| async {});
    let volumes = Controller::new(
        Api::<PersistentVolume>::all(client),
        watcher::Config::default(),
    )
    .run(reconcile_volume, retry, ctx)
    .for_each(|_| async {});
    futures::join!(claims, volumes);
}

/// The provisioner running on a thread of its own (attached mode), independent of the
/// caller's async runtime: test runtimes come and go, the cluster outlives each of them.
pub struct Provisioner {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Provisioner {
    /// Starts the provisioner against the cluster behind `kubeconfig`.
    pub fn start(kubeconfig: PathBuf, volumes: PathBuf) -> Result<Provisioner> {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::io("tokio runtime"))?;
        let thread = std::thread::Builder::new()
            .name("vcp-dev-provisioner".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let client = match crate::cluster::client_from(&kubeconfig).await {
                        Ok(c) => c,
                        Err(e) => {
                            tracing::error!(error = %e, "provisioner cannot reach the cluster");
                            return;
                        }
                    };
                    tokio::select! {
                        () = run(client, volumes) => {}
                        _ = stopped => {}
                    }
                });
            })
            .map_err(Error::io("provisioner thread"))?;
        Ok(Provisioner {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Stops the provisioner and waits for its thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Provisioner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(provisioner: Option<&str>, volume: Option<&str>) -> PersistentVolumeClaim {
        let mut ann = serde_json::Map::new();
        if let Some(p) = provisioner {
            ann.insert(ANN_PROVISIONER.into(), p.into());
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "data", "namespace": "apps", "uid": "1234", "annotations": ann},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "standard",
                "resources": {"requests": {"storage": "1Gi"}},
                "volumeName": volume,
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_pending_claim_of_ours_gets_a_prebound_hostpath_volume() {
        let pv = volume_for(
            &claim(Some(PROVISIONER_NAME), None),
            std::path::Path::new("/v"),
        )
        .unwrap();
        assert_eq!(pv.name_any(), "pvc-1234");
        let spec = pv.spec.unwrap();
        let claim_ref = spec.claim_ref.unwrap();
        assert_eq!(claim_ref.namespace.as_deref(), Some("apps"));
        assert_eq!(claim_ref.uid.as_deref(), Some("1234"));
        assert_eq!(spec.host_path.unwrap().path, "/v/pvc-1234");
        assert_eq!(spec.capacity.unwrap()["storage"].0, "1Gi");
        assert_eq!(spec.storage_class_name.as_deref(), Some("standard"));
    }

    #[test]
    fn claims_of_other_provisioners_or_already_bound_are_left_alone() {
        let v = std::path::Path::new("/v");
        assert!(volume_for(&claim(Some("ebs.csi.aws.com"), None), v).is_none());
        assert!(volume_for(&claim(None, None), v).is_none());
        assert!(volume_for(&claim(Some(PROVISIONER_NAME), Some("pv-1")), v).is_none());
    }
}
