//! Endpoints and EndpointSlices of selector-less Services.
//!
//! A Service without a selector has whatever endpoints its owner writes by hand; the host
//! cannot compute them, so the tenant's copies go down under the same names (the host Service
//! keeps the tenant Service's name, so `Endpoints` name and the EndpointSlice
//! `kubernetes.io/service-name` label already point at it). Endpoints of Services with a
//! selector never go down: the host computes those from the host pods.
//!
//! EndpointSlices that Kubernetes controllers manage (the endpointslice controller for selector
//! Services, the mirroring controller for hand-written Endpoints) are not copied either: the
//! host mirrors the copied Endpoints itself. Only slices someone wrote by hand are.
//!
//! Only the addresses the tenant may name go down: its own pods' and, outside the cluster, the
//! plan's `endpoints.external_cidrs` (`policy::endpoints`, which also drops node names and
//! `targetRef`s that do not name the pod holding the address). What is dropped comes back as
//! [`Refusal`]s for the tenant.
//!
//! `targetRef`s name tenant objects (their UIDs mean nothing on the host): the namespace is
//! translated and the UID and resource version dropped.

use crate::tenant::Ctx;
use k8s_openapi::api::core::v1::{Endpoints, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use vcp_core::naming;
use vcp_core::naming::host_meta;
use vcp_policy::Refusal;
use vcp_policy::endpoints::{TenantPods, filter_endpoints, filter_slice};

/// The label naming the controller that manages an EndpointSlice.
pub const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// The label naming the Service an EndpointSlice belongs to.
pub const SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Managers of EndpointSlices that Kubernetes computes on each side itself.
pub const CONTROLLER_MANAGERS: [&str; 2] = [
    "endpointslice-controller.k8s.io",
    "endpointslicemirroring-controller.k8s.io",
];

/// The tenant's own `default/kubernetes` Endpoints: the address its pods reach the apiserver
/// at (the apiserver's host Service, `ip:port`), instead of the apiserver pods' own addresses,
/// which would show the tenant the control plane's pod network. Tenant apiservers run with
/// `--endpoint-reconciler-type=none`, so the syncer is the only writer.
pub fn kubernetes_endpoints(ip: &str, port: i32) -> Endpoints {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": "kubernetes", "namespace": "default"},
        "subsets": [{
            "addresses": [{"ip": ip}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        }],
    }))
    .expect("a fixed shape")
}

/// Whether a tenant Service's endpoints are written by hand (no selector), so they go down.
pub fn hand_managed(svc: &Service) -> bool {
    !vcp_policy::services::is_local_service(svc)
        && svc
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .is_none_or(|s| s.is_empty())
}

/// Whether a Kubernetes controller manages this EndpointSlice (never copied, never collected).
pub fn controller_managed(slice: &EndpointSlice) -> bool {
    slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY))
        .is_some_and(|m| CONTROLLER_MANAGERS.contains(&m.as_str()))
}

fn target_ref(r: &mut Option<ObjectReference>, ctx: &Ctx) {
    if let Some(r) = r {
        r.namespace = r
            .namespace
            .as_ref()
            .map(|ns| naming::host_namespace(&ctx.key, ns));
        r.uid = None;
        r.resource_version = None;
    }
}

/// The host copy of the tenant Endpoints of a selector-less Service, with only the addresses
/// the tenant may name (`pods`: its pods by address), and what was dropped.
pub fn endpoints_to_host(
    ep: &Endpoints,
    ctx: &Ctx,
    pods: &TenantPods,
) -> (Endpoints, Vec<Refusal>) {
    let (filtered, refusals) = filter_endpoints(ep, pods, &ctx.policy);
    let mut subsets = filtered.subsets;
    for s in subsets.iter_mut().flatten() {
        for a in s
            .addresses
            .iter_mut()
            .flatten()
            .chain(s.not_ready_addresses.iter_mut().flatten())
        {
            target_ref(&mut a.target_ref, ctx);
        }
    }
    let host = Endpoints {
        metadata: host_meta(&ep.metadata, &ctx.key),
        subsets,
    };
    (host, refusals)
}

/// The host copy of a hand-written tenant EndpointSlice, with only the addresses the tenant
/// may name, and what was dropped.
pub fn slice_to_host(
    slice: &EndpointSlice,
    ctx: &Ctx,
    pods: &TenantPods,
) -> (EndpointSlice, Vec<Refusal>) {
    let (filtered, refusals) = filter_slice(slice, pods, &ctx.policy);
    let mut endpoints = filtered.endpoints;
    for e in endpoints.iter_mut().flatten() {
        target_ref(&mut e.target_ref, ctx);
    }
    let host = EndpointSlice {
        metadata: host_meta(&slice.metadata, &ctx.key),
        address_type: slice.address_type.clone(),
        endpoints,
        ports: slice.ports.clone(),
    };
    (host, refusals)
}

/// Whether host copy `host` already is `desired` (a pass that changes nothing writes nothing):
/// same content, and every label and annotation of `desired` in place.
pub fn endpoints_unchanged(desired: &Endpoints, host: &Endpoints) -> bool {
    desired.subsets == host.subsets && meta_in_place(&desired.metadata, &host.metadata)
}

/// [`endpoints_unchanged`] for slices.
pub fn slice_unchanged(desired: &EndpointSlice, host: &EndpointSlice) -> bool {
    desired.address_type == host.address_type
        && desired.endpoints == host.endpoints
        && desired.ports == host.ports
        && meta_in_place(&desired.metadata, &host.metadata)
}

fn meta_in_place(
    desired: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    host: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> bool {
    let within = |d: &Option<std::collections::BTreeMap<String, String>>,
                  h: &Option<std::collections::BTreeMap<String, String>>| {
        d.iter()
            .flatten()
            .all(|(k, v)| h.as_ref().and_then(|h| h.get(k)) == Some(v))
    };
    within(&desired.labels, &host.labels) && within(&desired.annotations, &host.annotations)
}

/// The tenant Service a tenant EndpointSlice belongs to.
pub fn service_of_slice(slice: &EndpointSlice) -> Option<&str> {
    slice
        .metadata
        .labels
        .as_ref()?
        .get(SERVICE_NAME)
        .map(String::as_str)
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_tenants_kubernetes_endpoints_are_the_apiserver_service_only() {
        let eps = kubernetes_endpoints("10.96.4.4", 6443);
        assert_eq!(eps.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(eps.metadata.name.as_deref(), Some("kubernetes"));
        let subsets = eps.subsets.unwrap();
        assert_eq!(subsets.len(), 1);
        let addresses = subsets[0].addresses.clone().unwrap();
        assert_eq!(addresses.len(), 1);
        assert_eq!(addresses[0].ip, "10.96.4.4");
        assert_eq!(
            addresses[0].target_ref, None,
            "no pod of the control plane named"
        );
        assert_eq!(subsets[0].ports.clone().unwrap()[0].port, 6443);
    }

    use super::*;
    use crate::tenant::fixtures::ctx;
    use vcp_core::naming::LABEL_TENANT;

    fn svc(selector: Option<serde_json::Value>) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db", "namespace": "apps"},
            "spec": {"selector": selector, "ports": [{"port": 5432}]},
        }))
        .unwrap()
    }

    #[test]
    fn only_selector_less_services_have_hand_managed_endpoints() {
        assert!(hand_managed(&svc(None)));
        assert!(hand_managed(&svc(Some(serde_json::json!({})))));
        assert!(!hand_managed(&svc(Some(serde_json::json!({"app": "db"})))));
        let mut api = svc(None);
        api.metadata.name = Some("kubernetes".into());
        api.metadata.namespace = Some("default".into());
        assert!(!hand_managed(&api), "the tenant apiserver's endpoints stay");
    }

    /// The tenant's pod `apps/db-0` at 10.244.0.10.
    fn pods() -> TenantPods {
        let mut p = TenantPods::default();
        p.insert("10.244.0.10".parse().unwrap(), "apps", "db-0");
        p
    }

    #[test]
    fn endpoints_keep_their_pod_addresses_and_lose_tenant_uids() {
        let ep: Endpoints = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db", "namespace": "apps", "uid": "e1"},
            "subsets": [{"addresses": [
                    {"ip": "10.244.0.10", "targetRef": {"kind": "Pod", "namespace": "apps", "name": "db-0", "uid": "p1"}},
                    {"ip": "10.244.0.11"}],
                "ports": [{"port": 5432}]}],
        }))
        .unwrap();
        let (host, refusals) = endpoints_to_host(&ep, &ctx(), &pods());
        assert_eq!(refusals.len(), 1, "another tenant's address");
        assert_eq!(refusals[0].field, "subsets[0].addresses[1].ip");
        assert_eq!(host.metadata.name.as_deref(), Some("db"));
        assert_eq!(host.metadata.namespace.as_deref(), Some("demo-apps"));
        assert_eq!(host.metadata.labels.as_ref().unwrap()[LABEL_TENANT], "demo");
        assert!(endpoints_unchanged(&host, &host));
        let addresses = host.subsets.unwrap()[0].addresses.clone().unwrap();
        assert_eq!(addresses.len(), 1);
        let addr = &addresses[0];
        assert_eq!(addr.ip, "10.244.0.10");
        let r = addr.target_ref.as_ref().unwrap();
        assert_eq!(r.namespace.as_deref(), Some("demo-apps"));
        assert!(r.uid.is_none());
    }

    #[test]
    fn slices_point_at_the_host_service_and_controller_slices_are_recognised() {
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db-1", "namespace": "apps",
                "labels": {"kubernetes.io/service-name": "db", MANAGED_BY: "me"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.0.10"]}, {"addresses": ["192.0.2.10"]}],
            "ports": [{"port": 5432}],
        }))
        .unwrap();
        assert!(!controller_managed(&slice));
        assert_eq!(service_of_slice(&slice), Some("db"));
        let (host, refusals) = slice_to_host(&slice, &ctx(), &pods());
        assert_eq!(refusals[0].field, "endpoints[1].addresses[0]");
        assert_eq!(
            host.metadata.labels.as_ref().unwrap()["kubernetes.io/service-name"],
            "db",
            "the host Service has the tenant Service's name"
        );
        assert!(slice_unchanged(&host, &host));
        let endpoints = host.endpoints.unwrap();
        assert_eq!(endpoints.len(), 1);
        assert_eq!(endpoints[0].addresses, ["10.244.0.10"]);
        let mut mirrored = slice.clone();
        mirrored.metadata.labels.as_mut().unwrap().insert(
            MANAGED_BY.into(),
            "endpointslicemirroring-controller.k8s.io".into(),
        );
        assert!(controller_managed(&mirrored));
    }
}
