//! Services: the host allocates ClusterIPs and NodePorts; the tenant sees the host's values.
//!
//! Tenant apiservers run with the host's service CIDR, so the address a tenant apiserver gave
//! a Service is usually free on the host too. The host Service first asks for exactly that
//! address ([`to_host`] with `keep_ip`); if another tenant holds it, the syncer asks again
//! without it, the host allocates one, and the tenant Service is recreated with the host's
//! address ([`ip_mismatch`]). NodePorts likewise: the host Service first asks for the ports
//! the tenant apiserver gave (a client that read them from its create call, as the
//! conformance suite does, then finds the Service there); if another tenant holds one, the
//! syncer asks again with the tenant's address only, then with neither ([`Ask`]), and the
//! host's ports are copied up. Selector keys get the same rewrite as labels, so a tenant
//! selector matches the host pods. The tenant's plan decides what takes host resources
//! ([`vcp_policy::services`]): `externalIPs` never go down, a ClusterIP in a host-reserved
//! range is not requested, and NodePort/LoadBalancer Services beyond the plan go down as
//! ClusterIP Services.

use crate::tenant::Ctx;
use k8s_openapi::api::core::v1::{Service, ServiceSpec, ServiceStatus};
use vcp_core::naming;
use vcp_core::naming::host_meta;

/// What a host Service asks the host for of what the tenant apiserver allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// The tenant's ClusterIP and NodePorts: the first create, so the tenant's values hold.
    Tenant,
    /// The tenant's ClusterIP only (a NodePort of the tenant's is taken on the host).
    TenantIp,
    /// Neither: the host allocates (the tenant's address is taken too; and every update,
    /// which never moves what the host allocated).
    Host,
}

/// The host Service for a tenant Service, asking for what `ask` says of the tenant's
/// allocations (never a ClusterIP the tenant's plan reserves for the host). With `host_ports` false
/// (the plan does not admit it as a NodePort or LoadBalancer Service, see
/// [`vcp_policy::services::admitted`]) it goes down as a plain ClusterIP Service: served
/// inside the cluster, no host port opened. `externalIPs` never go down.
pub fn to_host(svc: &Service, ctx: &Ctx, ask: Ask, host_ports: bool) -> Service {
    let mut spec: ServiceSpec = svc.spec.clone().unwrap_or_default();
    let headless = spec.cluster_ip.as_deref() == Some("None");
    let reserved = vcp_policy::services::reserved_ip(svc, &ctx.policy).is_some();
    if !headless && (ask == Ask::Host || reserved) {
        spec.cluster_ip = None;
        spec.cluster_ips = None;
    }
    if ask != Ask::Tenant || !host_ports {
        for p in spec.ports.iter_mut().flatten() {
            p.node_port = None;
        }
    }
    spec.health_check_node_port = None;
    spec.external_ips = None;
    if !host_ports && vcp_policy::services::takes_node_ports(svc) {
        spec.type_ = Some("ClusterIP".into());
        spec.load_balancer_class = None;
        spec.load_balancer_source_ranges = None;
        spec.allocate_load_balancer_node_ports = None;
        #[allow(deprecated)] // refused along with the rest of the LoadBalancer
        {
            spec.load_balancer_ip = None;
        }
    }
    // Only externally reachable Services may have one, and without externalIPs a ClusterIP
    // Service no longer is (the tenant apiserver defaulted it for those).
    if !matches!(spec.type_.as_deref(), Some("NodePort" | "LoadBalancer")) {
        spec.external_traffic_policy = None;
    }
    if let Some(sel) = &spec.selector {
        spec.selector = Some(naming::map_to_host(sel));
    }
    Service {
        metadata: host_meta(&svc.metadata, &ctx.key),
        spec: Some(spec),
        status: None,
    }
}

/// Whether the tenant Service must be recreated to carry the host's ClusterIP.
pub fn ip_mismatch(host: &Service, tenant: &Service) -> bool {
    let ip = |s: &Service| s.spec.as_ref().and_then(|s| s.cluster_ip.clone());
    match (ip(host), ip(tenant)) {
        (Some(h), Some(t)) => h != t && h != "None",
        _ => false,
    }
}

/// NodePorts and load-balancer status the tenant should show, as a merge patch, or `None`.
pub fn to_tenant_patch(host: &Service, tenant: &Service) -> Option<serde_json::Value> {
    let host_ports = host
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default();
    let mut ports = tenant
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default();
    let mut changed = false;
    for p in &mut ports {
        let np = host_ports
            .iter()
            .find(|h| h.name == p.name && h.port == p.port)
            .and_then(|h| h.node_port);
        if np.is_some() && p.node_port != np {
            p.node_port = np;
            changed = true;
        }
    }
    let status: Option<ServiceStatus> = host.status.clone();
    let status_changed = status.as_ref().and_then(|s| s.load_balancer.clone())
        != tenant.status.as_ref().and_then(|s| s.load_balancer.clone());
    if !changed && !status_changed {
        return None;
    }
    let mut patch = serde_json::json!({});
    if changed {
        patch["spec"] = serde_json::json!({"ports": ports});
    }
    if status_changed {
        patch["status"] = serde_json::json!({"loadBalancer": status.and_then(|s| s.load_balancer)});
    }
    Some(patch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::fixtures::ctx;

    fn svc(ip: &str, node_port: Option<i32>) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "apps"},
            "spec": {
                "type": "NodePort", "clusterIP": ip, "clusterIPs": [ip],
                "selector": {"app": "web", "vcp.dev/tenant": "forged"},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": node_port}],
            },
        }))
        .unwrap()
    }

    #[test]
    fn the_host_service_asks_for_the_tenant_ip_and_node_ports_first() {
        let tenant = svc("10.96.7.7", Some(30080));
        let host = to_host(&tenant, &ctx(), Ask::Tenant, true).spec.unwrap();
        assert_eq!(host.cluster_ip.as_deref(), Some("10.96.7.7"));
        assert_eq!(host.ports.as_ref().unwrap()[0].node_port, Some(30080));
        // A port of the tenant's is taken on the host: the address alone, then neither.
        let ip_only = to_host(&tenant, &ctx(), Ask::TenantIp, true).spec.unwrap();
        assert_eq!(ip_only.cluster_ip.as_deref(), Some("10.96.7.7"));
        assert_eq!(ip_only.ports.unwrap()[0].node_port, None);
        // Not admitted as a NodePort Service: a ClusterIP one never asks for a port.
        let refused = to_host(&tenant, &ctx(), Ask::Tenant, false).spec.unwrap();
        assert_eq!(refused.ports.unwrap()[0].node_port, None);
        let sel = host.selector.unwrap();
        assert_eq!(sel["app"], "web");
        assert!(
            !sel.contains_key("vcp.dev/tenant"),
            "a tenant selector must not select by marker"
        );
        assert!(
            to_host(&tenant, &ctx(), Ask::Host, true)
                .spec
                .unwrap()
                .cluster_ip
                .is_none()
        );
    }

    #[test]
    fn external_ips_reserved_addresses_and_refused_node_ports_never_reach_the_host() {
        let mut tenant = svc("10.96.0.10", Some(30080));
        let spec = tenant.spec.as_mut().unwrap();
        spec.external_ips = Some(vec!["192.0.2.1".into()]);
        spec.external_traffic_policy = Some("Local".into());
        let mut c = ctx();
        c.policy = std::sync::Arc::new(
            vcp_policy::TenantPolicy::from_yaml("services: {reserved_cluster_ips: [10.96.0.0/28]}")
                .unwrap(),
        );
        let host = to_host(&tenant, &c, Ask::Tenant, false).spec.unwrap();
        assert_eq!(host.external_ips, None);
        assert_eq!(
            host.cluster_ip, None,
            "the host allocates instead of the reserved address"
        );
        assert_eq!(
            host.type_.as_deref(),
            Some("ClusterIP"),
            "refused NodePort: cluster-internal only"
        );
        assert_eq!(host.external_traffic_policy, None);
        let admitted = to_host(&svc("10.96.7.7", None), &c, Ask::Tenant, true)
            .spec
            .unwrap();
        assert_eq!(admitted.type_.as_deref(), Some("NodePort"));
        assert_eq!(admitted.cluster_ip.as_deref(), Some("10.96.7.7"));
    }

    #[test]
    fn host_ip_and_node_ports_flow_up() {
        let tenant = svc("10.96.7.7", Some(30080));
        let same = svc("10.96.7.7", Some(31999));
        assert!(!ip_mismatch(&same, &tenant));
        assert!(ip_mismatch(&svc("10.96.9.9", None), &tenant));
        let patch = to_tenant_patch(&same, &tenant).unwrap();
        assert_eq!(patch["spec"]["ports"][0]["nodePort"], 31999);
        assert!(to_tenant_patch(&tenant.clone(), &tenant).is_none());
    }

    #[test]
    fn the_control_planes_own_services_are_recognised() {
        use vcp_policy::services::is_local_service;
        let mut s = svc("10.96.0.1", None);
        s.metadata.name = Some("kubernetes".into());
        assert!(!is_local_service(&s), "only in the default namespace");
        s.metadata.namespace = Some("default".into());
        assert!(is_local_service(&s));
        s.metadata.name = Some(crate::top::SERVICE_NAME.into());
        assert!(
            !is_local_service(&s),
            "the metrics Service only in kube-system"
        );
        s.metadata.namespace = Some(crate::top::SERVICE_NAMESPACE.into());
        assert!(is_local_service(&s));
    }

    #[test]
    fn headless_services_stay_headless() {
        let host = to_host(&svc("None", None), &ctx(), Ask::Host, true)
            .spec
            .unwrap();
        assert_eq!(host.cluster_ip.as_deref(), Some("None"));
    }
}
