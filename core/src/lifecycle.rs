//! The tenant lifecycle as types: what was asked of a tenant ([`Desired`]), where it is
//! ([`Phase`]), and the conditions a reconcile pass reports ([`Condition`], with its
//! [`ConditionType`], [`ConditionStatus`] and [`ConditionReason`]).
//!
//! One definition for every layer. The inventory reads and writes these through checked sqlx
//! mappings (`tenants.desired` and `tenants.phase` are TEXT columns whose CHECK constraints in
//! `migrations/` (the latest of each: 0001, 0012) list exactly these names, as `tenants.sleep`'s
//! ([`Sleep`]) does; conditions are JSONB, through
//! serde); the provisioning steps and the workers match on them; the API serializes them, and
//! its OpenAPI document is derived from them. A name the code does not know is an error
//! wherever it is read, never a default: a row whose phase reads `Redy` fails to load, loudly,
//! instead of showing as `Pending`.
//!
//! Pure: no client, no pool, no I/O. The sqlx mapping (feature `sqlx`) and the OpenAPI
//! schemas (feature `openapi`) are trait impls only, so the syncer, which needs neither, does
//! not build them.

use crate::Error;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use time::OffsetDateTime;
#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// Declares an enum stored and sent by name: `as_str`, `ALL`, `Display`, a `FromStr` that
/// refuses unknown names, serde under the same names, comparisons with a name (for readable
/// assertions: `assert_eq!(t.phase, "Ready")`; code matches on variants), and the sqlx
/// mapping to a Postgres TEXT column (decoding goes through the same `FromStr`).
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        pub enum $T:ident ($what:literal) {
            $( $(#[$vmeta:meta])* $V:ident = $name:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum $T {
            $( $(#[$vmeta])* #[serde(rename = $name)] $V, )+
        }

        impl $T {
            /// Every value, in declaration order.
            pub const ALL: &'static [$T] = &[$($T::$V),+];

            /// The name stored in the inventory and sent by the API.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $T::$V => $name, )+
                }
            }
        }

        impl fmt::Display for $T {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $T {
            type Err = Error;

            fn from_str(s: &str) -> Result<$T, Error> {
                match s {
                    $( $name => Ok($T::$V), )+
                    _ => Err(Error::Unknown { what: $what, value: s.to_owned() }),
                }
            }
        }

        impl PartialEq<str> for $T {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }

        impl PartialEq<&str> for $T {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        #[cfg(feature = "sqlx")]
        impl sqlx::Type<sqlx::Postgres> for $T {
            fn type_info() -> sqlx::postgres::PgTypeInfo {
                <str as sqlx::Type<sqlx::Postgres>>::type_info()
            }

            fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
                <str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
            }
        }

        #[cfg(feature = "sqlx")]
        impl sqlx::Encode<'_, sqlx::Postgres> for $T {
            fn encode_by_ref(
                &self,
                buf: &mut sqlx::postgres::PgArgumentBuffer,
            ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                <&str as sqlx::Encode<'_, sqlx::Postgres>>::encode(self.as_str(), buf)
            }
        }

        #[cfg(feature = "sqlx")]
        impl<'r> sqlx::Decode<'r, sqlx::Postgres> for $T {
            fn decode(
                value: sqlx::postgres::PgValueRef<'r>,
            ) -> Result<$T, sqlx::error::BoxDynError> {
                Ok(<&str as sqlx::Decode<'r, sqlx::Postgres>>::decode(value)?.parse()?)
            }
        }
    };
}

named_enum! {
    /// What the owner asked for: the tenant should exist, or be removed.
    #[cfg_attr(feature = "openapi", derive(ToSchema), serde(rename_all = "lowercase"))]
    pub enum Desired ("desired state") {
        /// Provision the tenant and keep it provisioned.
        Present = "present",
        /// Tear the tenant down (`DELETE /v1/tenants/{name}`).
        Absent = "absent",
    }
}

named_enum! {
    /// Whether the owner (or the idle timer of its plan) wants the control plane to run.
    // The schema derive does not see the per-variant names the macro writes; the container
    // rule gives it the same (lowercase) names.
    #[cfg_attr(feature = "openapi", derive(ToSchema), serde(rename_all = "lowercase"))]
    pub enum Sleep ("sleep state") {
        /// Run it.
        Awake = "awake",
        /// Scale it to zero until a wake (`POST /v1/tenants/{name}/wake`, or a request through
        /// the gateway).
        Asleep = "asleep",
    }
}

named_enum! {
    /// Where a tenant is in its life.
    pub enum Phase ("phase") {
        /// Accepted; no reconcile pass has run yet.
        Pending = "Pending",
        /// Steps are being brought up; `conditions` tell which.
        Provisioning = "Provisioning",
        /// Every step is ready; kubeconfigs can be issued.
        Ready = "Ready",
        /// An upgrade is moving the tenant to another version.
        Upgrading = "Upgrading",
        /// The tenant's etcd is being restored from a snapshot; its API is down meanwhile.
        Restoring = "Restoring",
        /// Asleep: its control plane is scaled to zero (etcd keeps its volume); a wake, or the
        /// first request through the gateway, starts it again.
        Sleeping = "Sleeping",
        /// Deletion was requested and is in progress.
        Deleting = "Deleting",
        /// A plan, version or template that cannot work; see `conditions`.
        Failed = "Failed",
        /// Everything on the host is gone; the row is tombstoned (`deleted_at`) and stays for
        /// the record. What deletion ends in: a pass that reports it makes the worker
        /// tombstone the tenant. The API never shows it (deleted tenants are not served).
        Deleted = "Deleted",
    }
}

impl Phase {
    /// The phases of a live tenant: every one but [`Phase::Deleted`]. What the API can answer
    /// and what `vcp_tenants{phase}` counts.
    pub const LIVE: [Phase; 8] = [
        Phase::Pending,
        Phase::Provisioning,
        Phase::Ready,
        Phase::Upgrading,
        Phase::Restoring,
        Phase::Sleeping,
        Phase::Deleting,
        Phase::Failed,
    ];
}

#[cfg(feature = "openapi")]
// By hand rather than derived: the API's schema lists only the phases it can answer, so
// `Deleted` (which only the inventory holds) does not widen the published contract.
impl utoipa::PartialSchema for Phase {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("Where a tenant is in its life."))
            .enum_values(Some(Phase::LIVE.iter().map(|p| p.as_str())))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl ToSchema for Phase {}

named_enum! {
    /// What a condition is about: one per provisioning step (in step order), then `Ready`
    /// for the whole; `Deleted` during deletion.
    #[cfg_attr(feature = "openapi", derive(ToSchema))]
    pub enum ConditionType ("condition type") {
        NamespaceReady = "NamespaceReady",
        Exposed = "Exposed",
        CertificatesReady = "CertificatesReady",
        EtcdReady = "EtcdReady",
        ApiserverReady = "ApiserverReady",
        Bootstrapped = "Bootstrapped",
        ControllerManagerReady = "ControllerManagerReady",
        DnsReady = "DnsReady",
        SyncerReady = "SyncerReady",
        /// Every step is ready.
        Ready = "Ready",
        /// Everything the tenant had on the host is gone.
        Deleted = "Deleted",
        /// An upgrade's progress: the hop, the step, the gate it waits on, or why it was
        /// rolled back.
        Upgraded = "Upgraded",
        /// A restore from an etcd snapshot: stopping, restoring, starting, or why it failed.
        Restored = "Restored",
        /// The tenant's latest finished snapshot (a backup, with a backup store): `True` when
        /// it was taken (and uploaded), `False` with why when it failed.
        BackedUp = "BackedUp",
    }
}

named_enum! {
    /// Where one tenant's upgrade is: rolling forward hop by hop, rolling back to the version
    /// it ran before the failed hop, or finished either way.
    #[cfg_attr(feature = "openapi", derive(ToSchema))]
    pub enum UpgradeState ("upgrade state") {
        /// Taking the etcd snapshot before the hop `hop_from` -> `hop_to`; nothing changed yet.
        Snapshotting = "Snapshotting",
        /// Moving forward; `hop_to` is the version the control plane is rolled to.
        Running = "Running",
        /// A gate failed; the control plane is rolled back to `hop_from`.
        RollingBack = "RollingBack",
        /// Every hop passed its gates; the tenant runs the target.
        Succeeded = "Succeeded",
        /// Back on the version it ran before the failed hop, healthy; `reason` says why.
        RolledBack = "RolledBack",
    }
}

named_enum! {
    /// Where an etcd snapshot of a tenant is.
    #[cfg_attr(feature = "openapi", derive(ToSchema))]
    pub enum SnapshotState ("snapshot state") {
        /// Asked for; the tenant's next pass takes it once its etcd is up.
        Pending = "Pending",
        /// On its volume, with etcd's revision, its size and SHA-256 recorded.
        Succeeded = "Succeeded",
        /// Not taken; `reason` says why.
        Failed = "Failed",
    }
}

named_enum! {
    /// Where a restore of a tenant's etcd from a snapshot is.
    #[cfg_attr(feature = "openapi", derive(ToSchema))]
    pub enum RestoreState ("restore state") {
        /// Stopping the control plane, restoring each member, or starting it again.
        Running = "Running",
        /// The control plane is Ready on the snapshot's data.
        Succeeded = "Succeeded",
        /// Stopped; the control plane was started again on the data it had; `reason` says why.
        Failed = "Failed",
    }
}

impl UpgradeState {
    /// Still moving (forward or back).
    pub fn active(self) -> bool {
        matches!(
            self,
            UpgradeState::Snapshotting | UpgradeState::Running | UpgradeState::RollingBack
        )
    }

    /// The names of the active states, for SQL (`state = ANY($1)`): the one place the
    /// inventory learns which states hold a tenant, so a new active state needs no SQL edit.
    pub fn active_names() -> Vec<&'static str> {
        UpgradeState::ALL
            .iter()
            .filter(|s| s.active())
            .map(|s| s.as_str())
            .collect()
    }
}

named_enum! {
    /// Where a fleet upgrade is: starting tenants wave by wave, held by an admin, or finished
    /// (every wave done, stopped by its failure budget, or cancelled).
    #[cfg_attr(feature = "openapi", derive(ToSchema))]
    pub enum FleetState ("fleet upgrade state") {
        /// Starting the current wave's tenants (or soaking before the next wave).
        Running = "Running",
        /// Held by an admin: no tenant starts; upgrades already started finish.
        Paused = "Paused",
        /// Every wave is done (some tenants may have failed within the budget).
        Succeeded = "Succeeded",
        /// Stopped: more tenants of a wave failed than the failure budget allows.
        Failed = "Failed",
        /// Stopped by an admin; tenants not started yet are skipped.
        Cancelled = "Cancelled",
    }
}

impl FleetState {
    /// Finished: no tenant of it starts any more.
    pub fn finished(self) -> bool {
        matches!(
            self,
            FleetState::Succeeded | FleetState::Failed | FleetState::Cancelled
        )
    }
}

named_enum! {
    /// Where one tenant of a fleet upgrade is.
    #[cfg_attr(feature = "openapi", derive(ToSchema))]
    pub enum FleetEntryState ("fleet entry state") {
        /// Its wave has not reached it yet (or it waits for its maintenance window).
        Pending = "Pending",
        /// Its own upgrade (`tenant_upgrades`) is moving it.
        Running = "Running",
        /// Its upgrade succeeded.
        Succeeded = "Succeeded",
        /// Its upgrade was rolled back; `reason` says why.
        Failed = "Failed",
        /// Never started: not Ready when its turn came, deleted, or the fleet upgrade
        /// stopped; `reason` says which.
        Skipped = "Skipped",
    }
}

impl FleetEntryState {
    /// Done either way: it will not start or change again.
    pub fn finished(self) -> bool {
        matches!(
            self,
            FleetEntryState::Succeeded | FleetEntryState::Failed | FleetEntryState::Skipped
        )
    }
}

named_enum! {
    /// Whether fleet upgrades may move a tenant. A tenant that opted out is still moved off a
    /// version once it is `expired` in the catalog (one minor per fleet run).
    // The schema derive does not see the per-variant names the macro writes; the container
    // rule gives it the same (lowercase) names.
    #[cfg_attr(feature = "openapi", derive(ToSchema), serde(rename_all = "lowercase"))]
    pub enum FleetUpgrades ("fleet upgrades setting") {
        /// Fleet upgrades whose selector matches the tenant move it (the default).
        Include = "include",
        /// Only an expired version moves it.
        Exclude = "exclude",
    }
}

named_enum! {
    /// Whether vcp moves a tenant to newer releases by itself (a tenant's own setting, or its
    /// plan's): `patch` moves it, in its maintenance window, to the newest release of its minor
    /// the catalog offers; `off` leaves it where it is.
    #[cfg_attr(feature = "openapi", derive(ToSchema), serde(rename_all = "lowercase"))]
    pub enum AutoUpdate ("auto update setting") {
        /// No automatic updates (the default).
        Off = "off",
        /// Patch releases of the tenant's minor, in its maintenance window.
        Patch = "patch",
    }
}

named_enum! {
    /// Whether a condition holds, as in Kubernetes.
    #[cfg_attr(feature = "openapi", derive(ToSchema))]
    pub enum ConditionStatus ("condition status") {
        True = "True",
        False = "False",
        /// The pass did not get that far.
        Unknown = "Unknown",
    }
}

impl ConditionStatus {
    /// `True` or `False`.
    pub fn of(holds: bool) -> ConditionStatus {
        if holds {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        }
    }
}

named_enum! {
    /// Why a condition has its status.
    #[cfg_attr(feature = "openapi", derive(ToSchema))]
    pub enum ConditionReason ("condition reason") {
        /// The step (or the whole tenant) is ready.
        Ready = "Ready",
        /// Applied; waiting for the host (the message says on what).
        Waiting = "Waiting",
        /// Failed; retried after a back-off (the message says why).
        Error = "Error",
        /// Cannot succeed without a change to the tenant or the configuration.
        Failed = "Failed",
        /// An earlier step is not ready yet.
        NotReached = "NotReached",
        /// `Ready` while some step is not.
        Provisioning = "Provisioning",
        /// Deletion finished.
        Deleted = "Deleted",
        /// `Ready` of a sleeping tenant: its control plane is scaled to zero until a wake.
        Asleep = "Asleep",
    }
}

/// One condition of a tenant (Kubernetes-style).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: ConditionType,
    /// `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    pub reason: ConditionReason,
    pub message: String,
    #[serde(with = "time::serde::rfc3339")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub last_transition_time: OffsetDateTime,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names in the last `CHECK (column IN ('a', 'b'))` of the migrations (a later
    /// migration redefines a constraint by dropping and adding it).
    fn check_list(column: &str) -> Vec<String> {
        let sql = concat!(
            include_str!("../../migrations/0001_inventory.sql"),
            include_str!("../../migrations/0003_upgrades.sql"),
            include_str!("../../migrations/0004_snapshots.sql"),
            include_str!("../../migrations/0012_sleep.sql")
        );
        let marker = format!("CHECK ({column} IN (");
        let start = sql.rfind(&marker).expect("the column has a CHECK") + marker.len();
        let list = &sql[start..start + sql[start..].find(')').unwrap()];
        list.split(',')
            .map(|s| s.trim().trim_matches('\'').to_owned())
            .collect()
    }

    fn names<T: Copy>(all: &[T], name: impl Fn(T) -> &'static str) -> Vec<String> {
        all.iter().map(|v| name(*v).to_owned()).collect()
    }

    /// The names in each `CHECK (state = ANY (ARRAY['a', 'b']))` of the snapshot migration, in
    /// the order of its tables (snapshots, restores).
    fn array_checks() -> Vec<Vec<String>> {
        let sql = include_str!("../../migrations/0004_snapshots.sql");
        sql.split("CHECK (state = ANY (ARRAY[")
            .skip(1)
            .map(|rest| {
                rest[..rest.find(']').unwrap()]
                    .split(',')
                    .map(|s| s.trim().trim_matches('\'').to_owned())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn the_database_allows_exactly_the_snapshot_and_restore_states_the_code_knows() {
        assert_eq!(
            array_checks(),
            [
                names(SnapshotState::ALL, SnapshotState::as_str),
                names(RestoreState::ALL, RestoreState::as_str)
            ]
        );
    }

    #[test]
    fn the_database_allows_exactly_the_phases_and_desired_states_the_code_knows() {
        assert_eq!(check_list("phase"), names(Phase::ALL, Phase::as_str));
        assert_eq!(check_list("desired"), names(Desired::ALL, Desired::as_str));
        assert_eq!(check_list("sleep"), names(Sleep::ALL, Sleep::as_str));
        assert_eq!(
            check_list("state"),
            names(UpgradeState::ALL, UpgradeState::as_str)
        );
        let fleet = include_str!("../../migrations/0005_fleet_upgrades.sql");
        // The CHECK of `marker` in the table created after `table`.
        let list = |table: &str, marker: &str| -> Vec<String> {
            let from = fleet.find(table).expect("the table is created");
            let start =
                from + fleet[from..].find(marker).expect("the column has a CHECK") + marker.len();
            fleet[start..start + fleet[start..].find(')').unwrap()]
                .split(',')
                .map(|s| s.trim().trim_matches('\'').to_owned())
                .collect()
        };
        assert_eq!(
            list("ALTER TABLE tenants", "CHECK (fleet_upgrades IN ("),
            names(FleetUpgrades::ALL, FleetUpgrades::as_str)
        );
        assert_eq!(
            list("CREATE TABLE fleet_upgrades", "CHECK (state IN ("),
            names(FleetState::ALL, FleetState::as_str)
        );
        assert_eq!(
            list("CREATE TABLE fleet_upgrade_tenants", "CHECK (state IN ("),
            names(FleetEntryState::ALL, FleetEntryState::as_str)
        );
        assert_eq!(
            UpgradeState::active_names(),
            ["Snapshotting", "Running", "RollingBack"]
        );
        let auto = include_str!("../../migrations/0007_auto_update.sql");
        let marker = "CHECK (auto_update IN (";
        let start = auto.find(marker).expect("auto_update has a CHECK") + marker.len();
        let listed: Vec<String> = auto[start..start + auto[start..].find(')').unwrap()]
            .split(',')
            .map(|s| s.trim().trim_matches('\'').to_owned())
            .collect();
        assert_eq!(listed, names(AutoUpdate::ALL, AutoUpdate::as_str));
    }

    #[test]
    fn every_name_round_trips_through_text_and_json() {
        fn round_trip<T>(all: &[T], name: impl Fn(T) -> &'static str)
        where
            T: Copy + fmt::Debug + PartialEq + FromStr<Err = Error> + Serialize,
            T: for<'de> Deserialize<'de>,
        {
            for v in all {
                let n = name(*v);
                assert_eq!(n.parse::<T>(), Ok(*v));
                assert_eq!(serde_json::to_value(v).unwrap(), n);
                assert_eq!(
                    serde_json::from_value::<T>(serde_json::json!(n)).unwrap(),
                    *v
                );
            }
        }
        round_trip(Phase::ALL, Phase::as_str);
        round_trip(Desired::ALL, Desired::as_str);
        round_trip(UpgradeState::ALL, UpgradeState::as_str);
        round_trip(SnapshotState::ALL, SnapshotState::as_str);
        round_trip(RestoreState::ALL, RestoreState::as_str);
        round_trip(FleetState::ALL, FleetState::as_str);
        round_trip(FleetEntryState::ALL, FleetEntryState::as_str);
        round_trip(FleetUpgrades::ALL, FleetUpgrades::as_str);
        round_trip(AutoUpdate::ALL, AutoUpdate::as_str);
        round_trip(ConditionType::ALL, ConditionType::as_str);
        round_trip(ConditionStatus::ALL, ConditionStatus::as_str);
        round_trip(ConditionReason::ALL, ConditionReason::as_str);
    }

    #[test]
    fn unknown_names_are_errors_not_pending() {
        for bad in ["Redy", "ready", "", "Pending ", "Unknown"] {
            assert_eq!(
                bad.parse::<Phase>(),
                Err(Error::Unknown {
                    what: "phase",
                    value: bad.to_owned()
                }),
                "{bad:?}"
            );
            assert!(serde_json::from_value::<Phase>(serde_json::json!(bad)).is_err());
        }
        assert_eq!(
            "Absent".parse::<Desired>().unwrap_err().to_string(),
            "unknown desired state \"Absent\""
        );
        assert!("Maybe".parse::<ConditionStatus>().is_err());
        let stored = |t: &str| {
            serde_json::json!({"type": t, "status": "True", "reason": "Ready", "message": "",
                "last_transition_time": "2026-01-01T00:00:00Z"})
        };
        assert!(serde_json::from_value::<Condition>(stored("EtcdReady")).is_ok());
        assert!(serde_json::from_value::<Condition>(stored("EtcdHappy")).is_err());
    }

    #[cfg(feature = "openapi")]
    #[test]
    fn the_api_schema_lists_the_live_phases_only() {
        let schema = serde_json::to_value(<Phase as utoipa::PartialSchema>::schema()).unwrap();
        assert_eq!(
            schema["enum"],
            serde_json::json!(names(&Phase::LIVE, Phase::as_str))
        );
        assert!(!Phase::LIVE.contains(&Phase::Deleted));
        assert_eq!(Phase::LIVE.len() + 1, Phase::ALL.len());
    }

    /// A derived schema lists variant names unless told otherwise; the API sends the names
    /// the macro writes. (The tenant's `sleep` was sent as `awake` and documented as `Awake`:
    /// the schemathesis contract test found it.)
    #[cfg(feature = "openapi")]
    #[test]
    fn derived_schemas_list_the_names_the_api_sends() {
        fn listed<T: utoipa::PartialSchema>() -> serde_json::Value {
            serde_json::to_value(T::schema()).unwrap()["enum"].clone()
        }
        assert_eq!(
            listed::<Sleep>(),
            serde_json::json!(names(Sleep::ALL, Sleep::as_str))
        );
        assert_eq!(
            listed::<FleetUpgrades>(),
            serde_json::json!(names(FleetUpgrades::ALL, FleetUpgrades::as_str))
        );
        assert_eq!(
            listed::<Desired>(),
            serde_json::json!(names(Desired::ALL, Desired::as_str))
        );
        assert_eq!(
            listed::<AutoUpdate>(),
            serde_json::json!(names(AutoUpdate::ALL, AutoUpdate::as_str))
        );
    }
}
