//! vcp-policy: what a tenant may put on the host. The tenant policy of its plan, and pure
//! checks against it.
//!
//! Data flow: the orchestrator reads plans with a `policy` section ([`TenantPolicy::from_yaml`],
//! checked when vcp starts), renders it (plus facts only it knows, such as the host's reserved
//! ClusterIPs and the nodes that run control planes) into the syncer's `--policy` file; the
//! syncer parses it once into a [`TenantPolicy`] and hands it to every translator through its
//! translation context. Translators call the functions here before a tenant object becomes a
//! host object: each either rewrites a field into something the policy allows (placement,
//! priority) or refuses the object with [`Refusal`]s, which the syncer turns into Warning
//! events on the tenant object (and, for pods, a condition). The tenant-wide quota is decided
//! here too ([`quota::admitted`]), and the orchestrator counts a tenant's host objects by the
//! same rules for billing ([`quota::host_usage`]).
//!
//! Nothing here does I/O, and the crate cannot: it depends on kube's object traits
//! (`kube-core`), not on its client. Every rule is a function of the tenant object and the
//! policy, tested with plain values and property tests. Names, markers and label rewriting come
//! from `vcp_core::naming`, as for the syncer.
//!
//! Defaults are the restrictive settings a tenant gets when its plan says nothing: Pod Security
//! `baseline`, no NodePorts or LoadBalancers, no tenant-created volumes with host-scoped
//! sources, no host priority classes or runtime classes, hand-written endpoints naming only
//! the tenant's own pods, and a finite tenant-wide quota ([`quota::Quota::plan_default`]).

pub mod endpoints;
pub mod network;
pub mod placement;
pub mod pod_security;
pub mod pods;
pub mod quota;
pub mod services;
pub mod volumes;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Toleration;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use pod_security::Level;

/// A tenant's policy: the `policy` section of its plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantPolicy {
    /// Pod Security Standards level every tenant pod must meet (`restricted`, `baseline`,
    /// `privileged`), checked by the syncer and enforced again by the host's Pod Security
    /// admission on every host namespace of the tenant.
    pub pod_security: Level,
    pub placement: Placement,
    pub scheduling: Scheduling,
    pub volumes: Volumes,
    pub services: Services,
    /// Outside addresses tenant pods may reach and be reached from, and the cluster's own
    /// ranges, which no ipBlock ever reaches (see [`network`]).
    pub network: network::Network,
    /// Outside addresses hand-written Endpoints and EndpointSlices may name; the tenant's own
    /// pods they always may (see [`endpoints`]).
    pub endpoints: endpoints::Endpoints,
    /// What the tenant may hold on the host across all its namespaces, and the container
    /// defaults that make it count (see [`quota`]). Absent: [`quota::Quota::plan_default`];
    /// a `quota` section replaces that whole, and resources it does not list are unlimited.
    pub quota: quota::Quota,
}

impl Default for TenantPolicy {
    fn default() -> Self {
        TenantPolicy {
            pod_security: Level::default(),
            placement: Placement::default(),
            scheduling: Scheduling::default(),
            volumes: Volumes::default(),
            services: Services::default(),
            network: network::Network::default(),
            endpoints: endpoints::Endpoints::default(),
            // Finite by default: a plan that forgets its quota must not hand out the host.
            quota: quota::Quota::plan_default(),
        }
    }
}

/// Where tenant pods run: the plan's workload node pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Placement {
    /// Labels of the pool's nodes: every tenant pod gets them as its node selector, over
    /// anything the tenant wrote for the same keys.
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations every tenant pod gets (to enter a tainted pool).
    pub tolerations: Vec<Toleration>,
    /// Taint keys a tenant pod may tolerate on its own; its other tolerations are dropped.
    /// By default the two the host's own admission adds for eviction timing.
    pub tenant_toleration_keys: Vec<String>,
    /// Node labels of nodes no tenant pod may ever use (those that run control planes): each
    /// becomes a `NotIn` requirement in every node selector term of every tenant pod. vcp
    /// fills this from the plan's control-plane node selector.
    pub avoid_node_labels: BTreeMap<String, String>,
    /// Which host nodes a tenant sees as its Nodes ([`VirtualNodes`]). Left out of a
    /// rendered policy when it is the default, so that policies (and the digest that rolls
    /// every tenant's syncer when it changes) read as they did before the field existed.
    #[serde(skip_serializing_if = "VirtualNodes::is_default")]
    pub virtual_nodes: VirtualNodes,
}

/// Which host nodes show in a tenant as virtual nodes. Either way a tenant sees only host nodes
/// its own pods may use, never what runs on them: name, `kubernetes.io` labels, conditions,
/// capacity (see the syncer's `virtual_node`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VirtualNodes {
    /// Every node of the plan's pool ([`placement::in_pool`]), from the tenant's first moment,
    /// as a real cluster lists its nodes before any pod runs (clients that count schedulable
    /// nodes, the conformance suite among them, need them). Costs one tenant Node per pool
    /// node.
    #[default]
    Pool,
    /// Only the nodes tenant pods run on, for pools too large to mirror into every tenant.
    Used,
}

impl VirtualNodes {
    fn is_default(&self) -> bool {
        *self == VirtualNodes::default()
    }
}

impl Default for Placement {
    fn default() -> Self {
        Placement {
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            tenant_toleration_keys: vec![
                "node.kubernetes.io/not-ready".into(),
                "node.kubernetes.io/unreachable".into(),
            ],
            avoid_node_labels: BTreeMap::new(),
            virtual_nodes: VirtualNodes::default(),
        }
    }
}

/// Host scheduling classes a tenant may use.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Scheduling {
    /// Tenant PriorityClass name -> host PriorityClass name. A tenant pod of a listed class
    /// gets the host class; any other class is dropped (the host's default priority).
    pub priority_classes: BTreeMap<String, String>,
    /// RuntimeClasses tenant pods may name (the host's class of the same name).
    pub runtime_classes: Vec<String>,
    /// Runtime handler -> host RuntimeClass name. A tenant pod whose class, as the tenant
    /// defines it, names a listed handler runs under the host class given here, whatever the
    /// tenant called its class (tenants create classes of their own names, as the conformance
    /// suite does). A pod whose class is in neither list is refused. Left out of a rendered
    /// policy when empty, so the digest that rolls every tenant's syncer on a policy change
    /// stays as it was before the field existed.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub runtime_handlers: BTreeMap<String, String>,
}

/// Volumes a tenant may bring.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Volumes {
    /// Sources a tenant-created PersistentVolume may use, by API field name (`csi`, `nfs`,
    /// ...). Any other source keeps the volume off the host. `hostPath` and `local` may be
    /// listed only with `pod_security: privileged`.
    pub persistent_volume_sources: Vec<String>,
    /// StorageClasses tenant claims and volumes may name; absent: any host class.
    pub storage_classes: Option<Vec<String>>,
}

/// Services that take host resources.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Services {
    /// NodePort and LoadBalancer Services the tenant may hold at once (0: none).
    pub node_port_services: u32,
    /// Of those, LoadBalancer Services (0: none).
    pub load_balancers: u32,
    /// Host NodePorts all of them may take together (each port of a NodePort or
    /// LoadBalancer Service takes one).
    pub node_ports: u32,
    /// `loadBalancerClass` values a LoadBalancer Service may name; unset is always allowed.
    pub load_balancer_classes: Vec<String>,
    /// Ranges that `loadBalancerSourceRanges` must lie within; empty: any.
    pub load_balancer_source_ranges: Vec<IpNet>,
    /// ClusterIPs a tenant may not ask for (the host's cluster DNS and other fixed addresses);
    /// a Service asking for one gets a host-allocated address instead. vcp adds the static
    /// band of the host's service CIDR.
    pub reserved_cluster_ips: Vec<IpNet>,
}

/// A field of a tenant object that the policy does not allow, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The field, as a path in the tenant object (`spec.containers[0].securityContext`).
    pub field: String,
    /// The rule it breaks (`baseline: host namespaces`, `plan: persistent volume sources`).
    pub rule: String,
    /// What is wrong, in a sentence.
    pub message: String,
}

impl Refusal {
    pub fn new(
        field: impl Into<String>,
        rule: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Refusal {
            field: field.into(),
            rule: rule.into(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} ({})", self.field, self.message, self.rule)
    }
}

/// Refusals as one line for an event or condition message (the first few, then a count).
pub fn summary(refusals: &[Refusal]) -> String {
    const SHOWN: usize = 3;
    let mut s = refusals
        .iter()
        .take(SHOWN)
        .map(Refusal::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    if refusals.len() > SHOWN {
        s.push_str(&format!("; and {} more", refusals.len() - SHOWN));
    }
    s
}

/// Errors of vcp-policy: a policy or a quantity that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A policy that cannot work.
    #[error("invalid tenant policy: {0}")]
    InvalidPolicy(String),
    /// A string that is not a Kubernetes quantity.
    #[error(
        "{0:?} is not a Kubernetes quantity (a non-negative number with an optional suffix: m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei, or an exponent like 1e3)"
    )]
    InvalidQuantity(String),
}

/// Result with vcp-policy's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl TenantPolicy {
    /// Parses and checks a policy (the syncer's `--policy` file, a plan's `policy` section).
    pub fn from_yaml(text: &str) -> Result<TenantPolicy, Error> {
        let p: TenantPolicy =
            serde_yaml::from_str(text).map_err(|e| Error::InvalidPolicy(e.to_string()))?;
        p.validate()?;
        Ok(p)
    }

    /// Checks what types alone cannot.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::InvalidPolicy(m));
        for s in &self.volumes.persistent_volume_sources {
            if !volumes::PV_SOURCES.contains(&s.as_str()) {
                return bad(format!(
                    "volumes.persistent_volume_sources: unknown source {s:?} (one of {})",
                    volumes::PV_SOURCES.join(", ")
                ));
            }
            if volumes::HOST_SCOPED.contains(&s.as_str()) && self.pod_security != Level::Privileged
            {
                return bad(format!(
                    "volumes.persistent_volume_sources: {s} mounts a node's files and needs pod_security: privileged"
                ));
            }
        }
        for (tenant, host) in &self.scheduling.priority_classes {
            if host.starts_with("system-") {
                return bad(format!(
                    "scheduling.priority_classes: {tenant} -> {host}: system priority classes are the host's own"
                ));
            }
        }
        let sv = &self.services;
        if sv.load_balancers > sv.node_port_services {
            return bad(
                "services.load_balancers: cannot exceed node_port_services (a LoadBalancer is a NodePort Service too)".into(),
            );
        }
        if sv.node_port_services > 0 && sv.node_ports == 0 {
            return bad("services.node_ports: 0 allows no NodePort Service at all; raise it or set node_port_services: 0".into());
        }
        self.quota.validate().map_err(Error::InvalidPolicy)?;
        self.network.validate()?;
        self.endpoints.validate(&self.network.cluster_cidrs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_policy_is_the_restrictive_default() {
        let p = TenantPolicy::from_yaml("{}").unwrap();
        assert_eq!(p, TenantPolicy::default());
        assert_eq!(p.pod_security, Level::Baseline);
        assert_eq!(p.services.node_port_services, 0);
        assert!(p.volumes.persistent_volume_sources.is_empty());
        assert!(p.scheduling.priority_classes.is_empty());
        assert_eq!(
            p.placement.tenant_toleration_keys,
            [
                "node.kubernetes.io/not-ready",
                "node.kubernetes.io/unreachable"
            ]
        );
    }

    #[test]
    fn a_full_policy_parses() {
        let p = TenantPolicy::from_yaml(
            r#"
pod_security: restricted
placement:
  node_selector: {pool: workloads}
  tolerations: [{key: pool, operator: Equal, value: workloads, effect: NoSchedule}]
  avoid_node_labels: {vcp.dev/runtime: process}
  virtual_nodes: used
scheduling:
  priority_classes: {high: tenant-high}
  runtime_classes: [gvisor]
  runtime_handlers: {kata: kata-host}
volumes:
  persistent_volume_sources: [csi, nfs]
  storage_classes: [standard]
services:
  node_port_services: 2
  load_balancers: 1
  node_ports: 4
  load_balancer_classes: [example.com/internal]
  load_balancer_source_ranges: [203.0.113.0/24]
  reserved_cluster_ips: [10.96.0.0/28]
endpoints:
  external_cidrs: [198.51.100.0/24]
"#,
        )
        .unwrap();
        assert_eq!(p.pod_security, Level::Restricted);
        assert_eq!(p.placement.tolerations[0].key.as_deref(), Some("pool"));
        assert_eq!(p.placement.virtual_nodes, VirtualNodes::Used);
        // The default is left out of a rendered policy, which reads back the same.
        let default = serde_yaml::to_string(&TenantPolicy::default()).unwrap();
        assert!(!default.contains("virtual_nodes"), "{default}");
        assert!(
            serde_yaml::to_string(&p)
                .unwrap()
                .contains("virtual_nodes: used")
        );
        assert!(TenantPolicy::from_yaml("placement: {virtual_nodes: all}").is_err());
        assert_eq!(
            p.services.reserved_cluster_ips[0],
            "10.96.0.0/28".parse::<IpNet>().unwrap()
        );
    }

    #[test]
    fn policies_that_cannot_work_are_refused_with_the_field() {
        let err = |y: &str| TenantPolicy::from_yaml(y).unwrap_err().to_string();
        assert!(err("pod_securty: baseline").contains("unknown field"));
        assert!(err("pod_security: lax").contains("unknown variant"));
        assert!(err("volumes: {persistent_volume_sources: [hostpath]}").contains("unknown source"));
        assert!(
            err("volumes: {persistent_volume_sources: [hostPath]}").contains("privileged"),
            "a node's files only for an explicitly privileged plan"
        );
        TenantPolicy::from_yaml(
            "pod_security: privileged\nvolumes: {persistent_volume_sources: [hostPath]}",
        )
        .unwrap();
        assert!(
            err("scheduling: {priority_classes: {a: system-node-critical}}").contains("system")
        );
        assert!(
            err("services: {node_port_services: 1, load_balancers: 2, node_ports: 2}")
                .contains("load_balancers")
        );
        assert!(err("services: {node_port_services: 1}").contains("node_ports"));
        assert!(
            err("services: {reserved_cluster_ips: [10.96.0.0]}").contains("reserved_cluster_ips")
                || err("services: {reserved_cluster_ips: [10.96.0.0]}").contains("invalid")
        );
    }

    #[test]
    fn summaries_name_the_first_refusals_and_count_the_rest() {
        let r = |f: &str| Refusal::new(f, "baseline: x", "not allowed");
        assert_eq!(summary(&[r("a")]), "a: not allowed (baseline: x)");
        let s = summary(&[r("a"), r("b"), r("c"), r("d"), r("e")]);
        assert!(s.ends_with("; and 2 more"), "{s}");
    }
}
