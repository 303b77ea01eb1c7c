//! Every kind the syncer syncs, each in one place: its translation and its sync.
//!
//! Layout: one folder per kind, `kinds/<kind>/`, with
//! - `translate.rs`: pure functions from a tenant object to its host object
//!   (`to_host(&tenant, &Ctx, ..)`), from a host object's status back to a patch of the tenant
//!   object, and which fields each side owns; no client, tested with plain values;
//! - `mod.rs`: the sync, the kind's I/O: its [`Synced`](crate::engine::Synced) impl (which
//!   tenant objects go down, as what) and its down-reconcile when the engine's generic one
//!   (`engine::down`) is not enough; more files beside it for the kind's own loops
//!   (pods: `tokens.rs`, service-account tokens issued by the tenant; namespaces: `access.rs`,
//!   the syncer's RoleBinding in each host namespace).
//!
//! NetworkPolicies are one file, `netpols.rs`: their translation is policy
//! (`vcp_policy::network::to_host`), since what a tenant policy may say on the host is all
//! there is to translate.
//!
//! Data flow for one kind: the engine ([`crate::engine`]) watches both sides and calls the
//! kind's down-reconcile per tenant object; that asks `translate` for the desired host object,
//! checks it against the tenant's policy (`vcp_policy`), and the engine's decision table
//! ([`crate::engine::decide`]) says whether to create, update, replace or leave alone. So a
//! tenant pod becomes a host pod in [`pods::translate::to_host`], driven by [`pods`]'s `down`;
//! its status comes back through [`pods::translate::status_to_tenant`].
//!
//! Ownership of fields: the tenant owns spec, labels and annotations (copied down); the host
//! owns status (copied up). Server-side apply with the field manager
//! [`FIELD_MANAGER`](crate::engine::FIELD_MANAGER) writes exactly the fields a translator sets,
//! so host-side defaults and other managers' fields are left alone. Every host object starts
//! from `vcp_core::naming::host_meta`: same name, host namespace, markers.
//!
//! The registry is this file: the `pub mod` lines and [`KINDS`]. Each kind's folder has a
//! `start`, which builds its controllers and loops from a [`Start`] (the engine, the settings,
//! and the state kinds share: the pods' [`pods::PodCtx`]); [`run`] starts every kind listed.
//! What a kind keeps for itself is its [`Synced::Own`](crate::engine::Synced::Own), handed to
//! its reconciles beside the engine, which never looks inside. So a new kind is its folder,
//! its `pub mod` line and its line in [`KINDS`]; neither the engine nor `lib.rs` changes, and
//! no file in `engine/` imports from here.

pub mod configmaps;
pub mod endpoints;
pub mod events;
pub mod namespaces;
pub mod netpols;
pub mod podcerts;
pub mod pods;
pub mod pvcs;
pub mod secrets;
pub mod services;
pub mod volumes;

use crate::engine::{Engine, spawned};
use futures::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;

/// What every kind's `start` is handed.
pub struct Start {
    pub engine: Arc<Engine>,
    /// Reconciles in flight per controller (`--workers`).
    pub workers: u16,
    /// Period of the loops that poll instead of watching (`--node-sync-seconds`).
    pub period: Duration,
    /// The pods' state, which the kinds that follow pods read too, and the kubelet endpoint.
    pub pods: Arc<pods::PodCtx>,
    /// How the syncer grants itself access to its host namespaces (`--host-role`).
    pub host_access: Option<namespaces::access::HostAccess>,
}

/// Starts one kind: its controllers and loops, running until dropped.
pub type Starter = fn(&Start) -> BoxFuture<'static, ()>;

/// Every kind the syncer runs, by name (the name is only for the record; a test checks that
/// every folder here is listed).
pub const KINDS: &[(&str, Starter)] = &[
    ("namespaces", namespaces::start),
    ("volumes", volumes::start),
    ("configmaps", configmaps::start),
    ("secrets", secrets::start),
    ("services", services::start),
    ("endpoints", endpoints::start),
    ("pods", pods::start),
    ("netpols", netpols::start),
    ("pvcs", pvcs::start),
    ("events", events::start),
    ("podcerts", podcerts::start),
];

/// Runs every kind of [`KINDS`], each in its own task, until the future is dropped.
pub async fn run(start: Start) {
    futures::future::join_all(KINDS.iter().map(|(_, kind)| spawned(kind(&start)))).await;
}

#[cfg(test)]
mod tests {
    use crate::engine::testing::{fields, obj, offline_engine, side, span, spans_of};
    use serde_json::json;

    /// What a namespaced reconcile's span carries: its kind, namespace and name.
    fn tagged(kind: &str) -> std::collections::BTreeMap<String, String> {
        fields(&[("kind", kind), ("namespace", "apps"), ("name", "web")])
    }

    #[tokio::test]
    async fn every_kinds_down_reconcile_runs_in_a_span_naming_its_object() {
        let e = offline_engine();
        let meta = json!({"metadata": {"name": "web", "namespace": "apps", "uid": "u1"}});
        macro_rules! check {
            ($down:path, $kind:literal) => {
                let spans = spans_of($down(obj(meta.clone()), side(&e))).await;
                assert_eq!(
                    span(
                        &spans,
                        stringify!($down).rsplit("::").next().unwrap().trim()
                    ),
                    Some(&tagged($kind)),
                    "{}: {spans:?}",
                    stringify!($down)
                );
            };
        }
        check!(super::configmaps::down, "ConfigMap");
        check!(super::endpoints::down_endpoints, "Endpoints");
        check!(super::endpoints::down_slice, "EndpointSlice");
        check!(super::pods::down, "Pod");
        check!(super::pvcs::down, "PersistentVolumeClaim");
        check!(super::services::down, "Service");
        check!(super::netpols::down, "NetworkPolicy");
    }

    #[test]
    fn every_kind_folder_is_registered_once() {
        let names: Vec<&str> = super::KINDS.iter().map(|(n, _)| *n).collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(
            unique.len(),
            names.len(),
            "a kind registered twice: {names:?}"
        );
        // Every folder (or file) under kinds/ is a kind, and each is listed.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/kinds");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| {
                e.file_name()
                    .to_string_lossy()
                    .trim_end_matches(".rs")
                    .to_owned()
            })
            .filter(|n| !matches!(n.as_str(), "mod"))
            .collect();
        on_disk.sort_unstable();
        assert_eq!(on_disk, unique, "kinds/ and the registry disagree");
    }
}
