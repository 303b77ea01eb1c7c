//! Snapshots and restores of a tenant's etcd.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;
use vcp_core::lifecycle::{RestoreState, SnapshotState};

/// What a snapshot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotKind {
    /// The whole etcd store of a tenant with an etcd of its own (a `.db` file).
    Etcd,
    /// The tenant's own keys, exported from a shared datastore (`vcp-logical-v1`, a `.vcpl`
    /// file; docs/orchestrator.md, "Shared datastores").
    Logical,
}

/// One etcd snapshot of a tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotView {
    /// Its number among the tenant's snapshots (1, 2, ...; those taken before snapshots were
    /// numbered per tenant kept their earlier id): what `POST .../restore` takes.
    pub id: i64,
    /// `Pending` until the tenant's next pass (once its etcd is up) has taken it.
    pub state: SnapshotState,
    /// Why it failed.
    pub reason: Option<String>,
    /// The upgrade that took it before one of its hops; none when asked for.
    pub upgrade: Option<i64>,
    /// The tenant's minor when it was asked for.
    pub version: String,
    /// The store's revision when the snapshot started.
    pub revision: Option<i64>,
    /// Bytes of the file (etcd's integrity trailer included).
    pub size_bytes: Option<i64>,
    /// SHA-256 of the file, hex; a restore checks the file against it first.
    pub sha256: Option<String>,
    /// What it holds; known once it is taken.
    pub kind: Option<SnapshotKind>,
    /// The plan's schedule that asked for it (`backups`); none when asked for through the API
    /// or by an upgrade (those never expire).
    pub schedule: Option<crate::snapshots::schedule::Schedule>,
    /// When retention pruned its uploaded copy; a pruned snapshot cannot be restored.
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub pruned_at: Option<OffsetDateTime>,
    /// `pvc://<control-plane namespace>/etcd-snapshots/<file>`; once uploaded to the
    /// platform's backup store, sealed, `s3://<bucket>/<prefix>/<tenant key>/<file>.enc`.
    pub location: String,
    pub requested_by: String,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub finished_at: Option<OffsetDateTime>,
}

impl From<super::store::SnapshotRow> for SnapshotView {
    fn from(s: super::store::SnapshotRow) -> SnapshotView {
        SnapshotView {
            id: s.number,
            state: s.state,
            reason: s.reason,
            upgrade: s.upgrade_id,
            version: s.version,
            revision: s.revision,
            size_bytes: s.size_bytes,
            kind: s.storage_version.as_deref().map(|v| {
                if super::is_logical(v) {
                    SnapshotKind::Logical
                } else {
                    SnapshotKind::Etcd
                }
            }),
            sha256: s.sha256,
            schedule: s.schedule,
            pruned_at: s.pruned_at,
            location: s.location,
            requested_by: s.requested_by,
            created_at: s.created_at,
            finished_at: s.finished_at,
        }
    }
}

/// One restore of a tenant from a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RestoreView {
    pub id: i64,
    /// The snapshot's `id` (its number among the tenant's snapshots).
    pub snapshot: i64,
    pub state: RestoreState,
    /// Every etcd member holds the snapshot's data (the control plane may still be starting).
    pub restored: bool,
    /// Why it failed.
    pub reason: Option<String>,
    /// A plan change that moves the tenant's data to another store: the plan it left and the
    /// one it goes to (the snapshot is the move's export). Absent for a plain restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_plan: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_plan: Option<String>,
    pub requested_by: String,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub started_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub finished_at: Option<OffsetDateTime>,
}

impl From<super::store::RestoreRow> for RestoreView {
    fn from(r: super::store::RestoreRow) -> RestoreView {
        RestoreView {
            id: r.id,
            snapshot: r.snapshot_number,
            state: r.state,
            restored: r.restored,
            reason: r.reason,
            from_plan: r.from_plan,
            to_plan: r.to_plan,
            requested_by: r.requested_by,
            started_at: r.created_at,
            finished_at: r.finished_at,
        }
    }
}

/// `GET /v1/tenants/{name}/snapshots`: a tenant's snapshots and restores, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotList {
    pub snapshots: Vec<SnapshotView>,
    pub restores: Vec<RestoreView>,
}

/// `POST /v1/tenants/{name}/restore` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreTenant {
    /// The `id` of a `Succeeded` snapshot of this tenant, as its snapshot list shows it.
    #[schema(minimum = 1)]
    pub snapshot: i64,
}
