//! Request and response bodies of the platform API, gathered from the features that define
//! them (each feature's `types.rs`), for the `vcp` client commands, the integration tests and
//! the OpenAPI document: the server serializes them, the client deserializes them, the
//! document is derived from them. This file adds the catalog's bodies (`GET /v1/versions`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use crate::audit::types::*;
pub use crate::http::schema::*;
pub use crate::kubeconfigs::types::*;
pub use crate::rotations::api::{RotateTenant, RotationList, RotationTarget, RotationView};
pub use crate::sleep::api::{ActivityRecorded, ActivityReport, GatewayWake, GatewayWoken, Seen};
pub use crate::snapshots::types::*;
pub use crate::tenant_audit::types::*;
pub use crate::tenants::types::*;
pub use crate::tokens::types::*;
pub use crate::upgrades::types::*;
pub use crate::usage::types::*;
pub use crate::window::{Day, MaintenanceWindow, RawWindow};
pub use vcp_core::lifecycle::{
    AutoUpdate, Condition, FleetEntryState, FleetState, FleetUpgrades, Phase, RestoreState, Sleep,
    SnapshotState, UpgradeState,
};
pub use vcp_policy::quota::{Hard, Usage};

/// One Kubernetes minor the server can provision.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VersionView {
    #[schema(example = "1.37")]
    pub minor: String,
    #[schema(example = "v1.37.1")]
    pub kubernetes: String,
    /// Where the minor is in its life: `preview` (new tenants need `allow_preview`),
    /// `supported`, `deprecated` (owners should upgrade), `expired` (no new tenants; the next
    /// fleet upgrade moves tenants off it).
    pub class: crate::render::catalog::Class,
    pub default: bool,
}

/// `GET /v1/versions` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VersionList {
    pub default: String,
    pub versions: Vec<VersionView>,
}
