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

pub mod configmaps;
pub mod endpoints;
pub mod events;
pub mod namespaces;
pub mod netpols;
pub mod pods;
pub mod pvcs;
pub mod secrets;
pub mod services;
pub mod volumes;

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
}
