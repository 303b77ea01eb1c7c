//! NetworkPolicies of a tenant on the host (pure): the policies vcp keeps in every host
//! namespace of a tenant, the host copy of each tenant NetworkPolicy, and the labels that tell
//! the two apart on host pods.
//!
//! Data flow: in every host namespace `K-<ns>` of tenant `K` the syncer keeps the policies of
//! [`host_policies`]; every tenant NetworkPolicy becomes the host policy [`to_host`] makes of
//! it, in the same host namespace (its [`Refusal`]s become Warning events on the tenant
//! policy); every host pod carries the [`isolation_labels`] computed from the tenant pod's
//! labels and the tenant policies of its namespace, recomputed when those policies change.
//! Nothing here does I/O.
//!
//! Semantics. In Kubernetes a pod that no policy selects for a direction is not isolated in it
//! (all traffic allowed); a pod some policy selects is isolated, and may do only what the union
//! of the policies selecting it allows. A tenant expects the first half inside its own cluster,
//! but on the shared host "all traffic" would include every other tenant, every control plane
//! and the host's own workloads. So on the host:
//! - `vcp-isolate` selects every pod for Ingress and Egress with no rules: no host pod of a
//!   tenant is ever unisolated, and what it may do is exactly the union of the allowances below;
//! - `vcp-control-plane` lets every pod reach its own tenant's CoreDNS (53 UDP and TCP) and
//!   apiserver (6443), and be reached by that apiserver and its egress proxy, the tenant's
//!   syncer (admission webhooks, aggregated APIs, `pods/proxy` and `services/proxy`, which the
//!   apiserver dials through the syncer's pod), even a pod a tenant policy isolates: they are
//!   the tenant's cluster infrastructure (name resolution, the `kubernetes` Service), not its
//!   workloads;
//! - `vcp-tenant-ingress` and `vcp-tenant-egress` give a pod that no tenant policy isolates in
//!   their direction what "not isolated" means in the tenant's cluster: every pod of the tenant
//!   (namespaces labelled `vcp.dev/tenant=K`) and the outside addresses the plan allows.
//!
//! The last two must not select a pod that a tenant policy isolates, since allowances add up: a
//! "the whole tenant" policy selecting every pod would undo every tenant policy. Whether a pod
//! is isolated depends on which other policies select it, which no label selector can say, so
//! the syncer works it out ([`isolation`], the tenant's own rules, on tenant-side labels) and
//! writes it on the host pod as the labels [`LABEL_INGRESS_ISOLATED`] and
//! [`LABEL_EGRESS_ISOLATED`], which the two policies exclude. A tenant can neither forge nor
//! clear them: its own `vcp.dev/` keys reach the host under `t.` (see `naming`).
//!
//! A tenant policy's host copy selects the same pods as the tenant policy: selector keys are
//! rewritten with `naming::key_to_host`, exactly as pod and namespace label keys are, and that
//! rewrite is injective. Its peers are confined to the tenant ([`to_host`]).
//!
//! The property: no policy made here allows traffic between a tenant pod and anything outside
//! the tenant's own world (its pods in its host namespaces, and the outside addresses of its
//! plan), except the tenant's own CoreDNS, apiserver and syncer pods. Peer by peer:
//! - a podSelector alone selects in the policy's own namespace, a host namespace of the tenant;
//! - every namespaceSelector carries `vcp.dev/tenant=K` in its matchLabels, and only the syncer
//!   labels namespaces so (a tenant's `vcp.dev/tenant` selector key becomes
//!   `t.vcp.dev/tenant`, so it can neither drop nor contradict the requirement; the control
//!   plane's namespace carries `vcp.dev/control-plane-of`, not `vcp.dev/tenant`);
//! - an ipBlock lies inside the plan's CIDRs for its direction, outside every cluster CIDR and
//!   the IPv4-mapped IPv6 range (which plugins read as IPv4), and excepts every cluster CIDR
//!   inside it: pods, Services, nodes and the cloud metadata
//!   address are reachable through selectors only (network plugins disagree on whether an
//!   ipBlock matches pod addresses; with the cluster ranges excepted they all agree);
//! - a rule without peers means "any peer" in Kubernetes: it becomes "all of the tenant" plus
//!   the plan's CIDRs, and a rule whose every peer was refused is dropped, never left without
//!   peers;
//! - the control-plane peers name the control-plane namespace by `kubernetes.io/metadata.name`,
//!   which the host apiserver sets on every namespace to its own name.
//!
//! Every policy allows only such traffic on its own, so any set of them does, as long as
//! `vcp-isolate` isolates every pod: the syncer creates it, with the others, before the first
//! pod of the namespace. So a copy applied late, a label update that lags a tenant policy
//! change (the pod keeps the tenant-wide defaults a moment longer) or a generated policy
//! missing can cost the tenant a connection, or leave one open inside its own world a moment
//! longer, never open one beyond it. The property tests below check the property for random
//! tenant policies.

use super::{Error, Refusal};
use ipnet::IpNet;
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use vcp_core::naming::{self, LABEL_TENANT, TenantKey};

/// Host pod label: some tenant policy of the pod's namespace isolates it for ingress.
pub const LABEL_INGRESS_ISOLATED: &str = "vcp.dev/ingress-isolated";
/// Host pod label: some tenant policy of the pod's namespace isolates it for egress.
pub const LABEL_EGRESS_ISOLATED: &str = "vcp.dev/egress-isolated";
/// Value of `naming::ANN_GENERATED` on the policies vcp generates.
pub const GENERATED_FOR: &str = "network-policy";
/// Deny by default: selects every pod for both directions, allows nothing.
pub const ISOLATE: &str = "vcp-isolate";
/// Egress to the tenant's own CoreDNS and apiserver.
pub const CONTROL_PLANE: &str = "vcp-control-plane";
/// Ingress from the whole tenant, for pods no tenant policy isolates for ingress.
pub const TENANT_INGRESS: &str = "vcp-tenant-ingress";
/// Egress to the whole tenant, for pods no tenant policy isolates for egress.
pub const TENANT_EGRESS: &str = "vcp-tenant-egress";
/// Prefix of every generated policy's name.
pub const GENERATED_PREFIX: &str = "vcp-";

// The control plane's pod labels, as orchestrator/src/render puts them on its pods.
use vcp_core::naming::{LABEL_COMPONENT, LABEL_CONTROL_PLANE_OF};
const COMPONENT_DNS: &str = "coredns";
const COMPONENT_APISERVER: &str = "kube-apiserver";
/// The syncer, which is also the apiserver's egress proxy: what the apiserver dials in the
/// tenant's cluster (webhooks, aggregated APIs, `pods/proxy`, `services/proxy`) the syncer's
/// pod dials for it, after checking it is the tenant's own.
const COMPONENT_SYNCER: &str = "vcp-syncer";
const DNS_PORT: i32 = 53;
const APISERVER_PORT: i32 = 6443;
/// Set by the host apiserver on every namespace to the namespace's own name.
const LABEL_NAMESPACE_NAME: &str = "kubernetes.io/metadata.name";
/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`): Go's `net.IPNet`, which network plugins use,
/// reads such a range as IPv4, so `::ffff:10.0.0.0/104` contains `10.1.2.3`.
const IPV4_MAPPED: &str = "::ffff:0:0/96";
const RULE: &str = "plan: network";
const RULE_PEER: &str = "vcp: network policy peer";

/// Which addresses outside the cluster tenant pods may reach and be reached from: the
/// `network` section of a plan's policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Network {
    /// Outside addresses tenant pods may reach (ipBlocks of egress rules must lie within one).
    /// Default: everywhere (`0.0.0.0/0`, `::/0`), cluster CIDRs excepted.
    pub egress_cidrs: Vec<IpNet>,
    /// Outside addresses that may reach tenant pods (ipBlocks of ingress rules must lie within
    /// one). Default: none.
    pub ingress_cidrs: Vec<IpNet>,
    /// Ranges no ipBlock ever reaches, whatever the tenant or the plan says: pods, Services,
    /// nodes and the cloud metadata address live there. Default: the private, shared
    /// (carrier-grade NAT) and link-local ranges of IPv4 and IPv6.
    pub cluster_cidrs: Vec<IpNet>,
}

impl Default for Network {
    fn default() -> Self {
        let nets = |v: &[&str]| v.iter().map(|s| s.parse().expect("a valid CIDR")).collect();
        Network {
            egress_cidrs: nets(&["0.0.0.0/0", "::/0"]),
            ingress_cidrs: Vec::new(),
            cluster_cidrs: nets(&[
                "10.0.0.0/8",
                "172.16.0.0/12",
                "192.168.0.0/16",
                "100.64.0.0/10",
                "169.254.0.0/16",
                "fc00::/7",
                "fe80::/10",
            ]),
        }
    }
}

impl Network {
    /// Checks what types alone cannot (called by `TenantPolicy::validate`).
    pub fn validate(&self) -> Result<(), Error> {
        if self.cluster_cidrs.is_empty() {
            return Err(Error::InvalidPolicy(
                "network.cluster_cidrs: empty would let ipBlocks reach pods, Services and nodes; list the cluster's ranges".into(),
            ));
        }
        for (field, cidrs) in [
            ("egress_cidrs", &self.egress_cidrs),
            ("ingress_cidrs", &self.ingress_cidrs),
        ] {
            for c in cidrs {
                if let Some(why) = unreachable(c, &self.cluster_cidrs) {
                    return Err(Error::InvalidPolicy(format!(
                        "network.{field}: {c} {why}, so it would allow nothing"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Whether `name` is one vcp's own policies use: a tenant policy so named must not be copied
/// to the host, where it would take the generated policy's place. (It still counts for
/// [`isolation`], as it does in the tenant: its pods lose the tenant-wide defaults and get
/// nothing in return, which is the safe side.)
pub fn reserved_name(name: &str) -> bool {
    name.starts_with(GENERATED_PREFIX)
}

/// Whether `selector` selects an object with `labels`: every matchLabels pair and every
/// matchExpressions requirement must hold; an empty selector selects everything.
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v))
        && selector
            .match_expressions
            .iter()
            .flatten()
            .all(|r| requirement_holds(r, labels))
}

fn requirement_holds(r: &LabelSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let value = labels.get(&r.key);
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        // As in apimachinery: a missing key is "not in" any set.
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        // apimachinery refuses such a selector, and policy code reads that as "selects
        // nothing"; guessing a meaning could widen what a policy covers.
        _ => false,
    }
}

/// The directions a policy isolates its pods in (Ingress, Egress). `policyTypes` unset or
/// empty is read as the apiserver defaults it: Ingress always, Egress iff there are egress
/// rules.
fn directions(spec: &NetworkPolicySpec) -> (bool, bool) {
    match spec.policy_types.as_deref() {
        Some(types) if !types.is_empty() => (
            types.iter().any(|t| t == "Ingress"),
            types.iter().any(|t| t == "Egress"),
        ),
        _ => (true, spec.egress.as_ref().is_some_and(|e| !e.is_empty())),
    }
}

/// Whether some tenant policy of the pod's namespace selects a pod with (tenant-side)
/// `pod_labels`, for Ingress and for Egress. `tenant_policies` are those of the pod's namespace.
pub fn isolation(
    pod_labels: &BTreeMap<String, String>,
    tenant_policies: &[NetworkPolicy],
) -> (bool, bool) {
    let none = NetworkPolicySpec::default();
    let all = LabelSelector::default();
    tenant_policies
        .iter()
        .map(|p| p.spec.as_ref().unwrap_or(&none))
        .filter(|s| selects(s.pod_selector.as_ref().unwrap_or(&all), pod_labels))
        .map(directions)
        .fold((false, false), |(i, e), (pi, pe)| (i || pi, e || pe))
}

/// The host labels saying in which directions tenant policies isolate a pod: the generated
/// "whole tenant" policies leave such pods to the tenant's policies.
pub fn isolation_labels(
    pod_labels: &BTreeMap<String, String>,
    tenant_policies: &[NetworkPolicy],
) -> BTreeMap<String, String> {
    let (ingress, egress) = isolation(pod_labels, tenant_policies);
    [
        (ingress, LABEL_INGRESS_ISOLATED),
        (egress, LABEL_EGRESS_ISOLATED),
    ]
    .into_iter()
    .filter(|(on, _)| *on)
    .map(|(_, k)| (k.to_owned(), "true".to_owned()))
    .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    fn plan_cidrs(self, network: &Network) -> &[IpNet] {
        match self {
            Direction::Ingress => &network.ingress_cidrs,
            Direction::Egress => &network.egress_cidrs,
        }
    }

    /// The rule list's field name, also the word for the direction in messages.
    fn rules(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }

    fn peers(self) -> &'static str {
        match self {
            Direction::Ingress => "from",
            Direction::Egress => "to",
        }
    }
}

/// Why no ipBlock may name addresses inside `cidr`, if so.
fn unreachable(cidr: &IpNet, cluster: &[IpNet]) -> Option<String> {
    if let Some(c) = cluster.iter().find(|c| c.contains(cidr)) {
        return Some(format!(
            "lies inside the cluster range {c}, reachable through selectors only"
        ));
    }
    let mapped: IpNet = IPV4_MAPPED.parse().expect("a valid CIDR");
    mapped
        .contains(cidr)
        .then(|| "is IPv4-mapped IPv6, which network plugins may read as an IPv4 range".to_owned())
}

/// The cluster CIDRs inside `cidr`, none inside another, for its `except`.
fn cluster_excepts(cidr: &IpNet, cluster: &[IpNet]) -> Vec<IpNet> {
    let inside: Vec<IpNet> = cluster
        .iter()
        .filter(|c| cidr.contains(*c))
        .map(IpNet::trunc)
        .collect();
    let mut out: Vec<IpNet> = Vec::new();
    for (i, c) in inside.iter().enumerate() {
        // Keep the first of equal ranges, drop those inside a larger one.
        let covered = inside
            .iter()
            .enumerate()
            .any(|(j, o)| o.contains(c) && (o != c || j < i));
        if !covered {
            out.push(*c);
        }
    }
    out
}

fn labels_selector(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        match_expressions: None,
    }
}

/// Every namespace of tenant `key` on the host, and no other.
fn tenant_namespaces(key: &TenantKey) -> LabelSelector {
    labels_selector(&[(LABEL_TENANT, key.as_str())])
}

fn port(port: i32, protocol: &str) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(port)),
        protocol: Some(protocol.to_owned()),
        end_port: None,
    }
}

/// An ipBlock of a plan CIDR, every cluster CIDR inside it excepted; `None` if the CIDR itself
/// cannot be reached (a plan `validate` refuses, built anyway).
fn plan_block(cidr: &IpNet, cluster: &[IpNet]) -> Option<NetworkPolicyPeer> {
    if unreachable(cidr, cluster).is_some() {
        return None;
    }
    let except: Vec<String> = cluster_excepts(cidr, cluster)
        .iter()
        .map(IpNet::to_string)
        .collect();
    Some(NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: cidr.trunc().to_string(),
            except: (!except.is_empty()).then_some(except),
        }),
        ..Default::default()
    })
}

/// What "any peer" means inside the tenant's world: every pod of the tenant, and the plan's
/// outside addresses for the direction.
fn whole_tenant(key: &TenantKey, dir: Direction, network: &Network) -> Vec<NetworkPolicyPeer> {
    std::iter::once(NetworkPolicyPeer {
        namespace_selector: Some(tenant_namespaces(key)),
        ..Default::default()
    })
    .chain(
        dir.plan_cidrs(network)
            .iter()
            .filter_map(|c| plan_block(c, &network.cluster_cidrs)),
    )
    .collect()
}

/// The policies vcp keeps in host namespace `host_ns` of tenant `key`, whose control plane runs
/// in `control_plane_ns` (see the module doc for why these four).
pub fn host_policies(
    key: &TenantKey,
    host_ns: &str,
    control_plane_ns: &str,
    network: &Network,
) -> Vec<NetworkPolicy> {
    let policy = |name: &str, spec: NetworkPolicySpec| NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(host_ns.to_owned()),
            labels: Some(BTreeMap::from([(LABEL_TENANT.to_owned(), key.to_string())])),
            annotations: Some(BTreeMap::from([(
                naming::ANN_GENERATED.to_owned(),
                GENERATED_FOR.to_owned(),
            )])),
            ..Default::default()
        },
        spec: Some(spec),
    };
    let types = |t: &[&str]| Some(t.iter().map(|t| (*t).to_owned()).collect());
    let control_plane = |component: &str| NetworkPolicyPeer {
        namespace_selector: Some(labels_selector(&[(LABEL_NAMESPACE_NAME, control_plane_ns)])),
        pod_selector: Some(labels_selector(&[
            (LABEL_CONTROL_PLANE_OF, key.as_str()),
            (LABEL_COMPONENT, component),
        ])),
        ip_block: None,
    };
    let not_isolated = |label: &str| LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: label.to_owned(),
            operator: "DoesNotExist".to_owned(),
            values: None,
        }]),
    };
    vec![
        policy(
            ISOLATE,
            NetworkPolicySpec {
                pod_selector: Some(LabelSelector::default()),
                policy_types: types(&["Ingress", "Egress"]),
                ingress: None,
                egress: None,
            },
        ),
        policy(
            CONTROL_PLANE,
            NetworkPolicySpec {
                pod_selector: Some(LabelSelector::default()),
                policy_types: types(&["Ingress", "Egress"]),
                // The tenant's apiserver calls its admission webhooks and aggregated APIs,
                // which run as tenant pods, through its egress proxy, the syncer.
                ingress: Some(vec![NetworkPolicyIngressRule {
                    from: Some(vec![
                        control_plane(COMPONENT_APISERVER),
                        control_plane(COMPONENT_SYNCER),
                    ]),
                    ports: None,
                }]),
                egress: Some(vec![
                    NetworkPolicyEgressRule {
                        to: Some(vec![control_plane(COMPONENT_DNS)]),
                        ports: Some(vec![port(DNS_PORT, "UDP"), port(DNS_PORT, "TCP")]),
                    },
                    NetworkPolicyEgressRule {
                        to: Some(vec![control_plane(COMPONENT_APISERVER)]),
                        ports: Some(vec![port(APISERVER_PORT, "TCP")]),
                    },
                ]),
            },
        ),
        policy(
            TENANT_INGRESS,
            NetworkPolicySpec {
                pod_selector: Some(not_isolated(LABEL_INGRESS_ISOLATED)),
                policy_types: types(&["Ingress"]),
                ingress: Some(vec![NetworkPolicyIngressRule {
                    from: Some(whole_tenant(key, Direction::Ingress, network)),
                    ports: None,
                }]),
                egress: None,
            },
        ),
        policy(
            TENANT_EGRESS,
            NetworkPolicySpec {
                pod_selector: Some(not_isolated(LABEL_EGRESS_ISOLATED)),
                policy_types: types(&["Egress"]),
                ingress: None,
                egress: Some(vec![NetworkPolicyEgressRule {
                    to: Some(whole_tenant(key, Direction::Egress, network)),
                    ports: None,
                }]),
            },
        ),
    ]
}

/// A tenant selector as it must read on the host: keys rewritten as label keys are, so it
/// selects the host form of what it selected in the tenant.
fn selector_to_host(s: &LabelSelector) -> LabelSelector {
    LabelSelector {
        match_labels: s.match_labels.as_ref().map(naming::map_to_host),
        match_expressions: s.match_expressions.as_ref().map(|rs| {
            rs.iter()
                .map(|r| LabelSelectorRequirement {
                    key: naming::key_to_host(&r.key),
                    ..r.clone()
                })
                .collect()
        }),
    }
}

/// A tenant namespaceSelector on the host: rewritten, and confined to the tenant's namespaces.
fn namespaces_to_host(s: &LabelSelector, key: &TenantKey) -> LabelSelector {
    let mut out = selector_to_host(s);
    // No rewritten key is `vcp.dev/tenant`, so this adds a requirement and replaces none.
    out.match_labels
        .get_or_insert_default()
        .insert(LABEL_TENANT.to_owned(), key.to_string());
    out
}

fn ip_block_to_host(
    b: &IPBlock,
    dir: Direction,
    network: &Network,
    field: &str,
) -> Result<IPBlock, Refusal> {
    let refuse = |m: String| Refusal::new(field, RULE, m);
    let cidr: IpNet = b
        .cidr
        .parse()
        .map_err(|_| refuse(format!("{} is not a CIDR", b.cidr)))?;
    if let Some(why) = unreachable(&cidr, &network.cluster_cidrs) {
        return Err(refuse(format!("{} {why}", b.cidr)));
    }
    let plan = dir.plan_cidrs(network);
    if !plan.iter().any(|p| p.contains(&cidr)) {
        return Err(refuse(if plan.is_empty() {
            format!(
                "the tenant's plan allows no outside addresses for {}",
                dir.rules()
            )
        } else {
            let allowed: Vec<String> = plan.iter().map(IpNet::to_string).collect();
            format!(
                "{} is not inside the outside addresses the tenant's plan allows for {} ({})",
                b.cidr,
                dir.rules(),
                allowed.join(", ")
            )
        }));
    }
    let mut except = b.except.clone().unwrap_or_default();
    for c in cluster_excepts(&cidr, &network.cluster_cidrs) {
        let covered = except
            .iter()
            .any(|e| e.parse::<IpNet>().is_ok_and(|e| e.contains(&c)));
        if !covered {
            except.push(c.to_string());
        }
    }
    Ok(IPBlock {
        cidr: b.cidr.clone(),
        except: (!except.is_empty()).then_some(except),
    })
}

fn peer_to_host(
    p: &NetworkPolicyPeer,
    dir: Direction,
    key: &TenantKey,
    network: &Network,
    field: &str,
) -> Result<NetworkPolicyPeer, Refusal> {
    match p {
        NetworkPolicyPeer {
            ip_block: Some(b),
            namespace_selector: None,
            pod_selector: None,
        } => Ok(NetworkPolicyPeer {
            ip_block: Some(ip_block_to_host(
                b,
                dir,
                network,
                &format!("{field}.ipBlock"),
            )?),
            ..Default::default()
        }),
        // Both invalid, so the tenant apiserver refused them already; a host copy of either
        // would only be refused in turn.
        NetworkPolicyPeer {
            ip_block: Some(_), ..
        } => Err(Refusal::new(
            field,
            RULE_PEER,
            "a peer has an ipBlock or selectors, not both",
        )),
        NetworkPolicyPeer {
            ip_block: None,
            namespace_selector: None,
            pod_selector: None,
        } => Err(Refusal::new(
            field,
            RULE_PEER,
            "a peer must have a podSelector, a namespaceSelector or an ipBlock",
        )),
        NetworkPolicyPeer {
            ip_block: None,
            namespace_selector,
            pod_selector,
        } => Ok(NetworkPolicyPeer {
            namespace_selector: namespace_selector
                .as_ref()
                .map(|s| namespaces_to_host(s, key)),
            // Without a namespaceSelector it stays in the policy's own host namespace.
            pod_selector: pod_selector.as_ref().map(selector_to_host),
            ip_block: None,
        }),
    }
}

/// The host peers of rule `rule` of direction `dir`; `None` drops the rule (with a refusal).
fn peers_to_host(
    peers: Option<&[NetworkPolicyPeer]>,
    dir: Direction,
    rule: usize,
    key: &TenantKey,
    network: &Network,
    refusals: &mut Vec<Refusal>,
) -> Option<Vec<NetworkPolicyPeer>> {
    let rule_field = format!("spec.{}[{rule}]", dir.rules());
    let Some(peers) = peers.filter(|p| !p.is_empty()) else {
        // No peers is "any peer" to Kubernetes: on the host every pod of every tenant, the
        // control planes and the host. In the tenant's cluster it is the whole tenant and
        // the outside world, which the plan bounds.
        return Some(whole_tenant(key, dir, network));
    };
    let mut out = Vec::new();
    for (i, p) in peers.iter().enumerate() {
        let field = format!("{rule_field}.{}[{i}]", dir.peers());
        match peer_to_host(p, dir, key, network, &field) {
            Ok(p) => out.push(p),
            Err(r) => refusals.push(r),
        }
    }
    if out.is_empty() {
        // Left without peers it would mean "any peer": the opposite of what was refused.
        refusals.push(Refusal::new(
            rule_field,
            RULE,
            format!(
                "every peer of this {} rule was refused, so the whole rule is left out (without peers it would allow everything)",
                dir.rules()
            ),
        ));
        return None;
    }
    Some(out)
}

/// The host copy of tenant NetworkPolicy `tenant` (same name, host namespace, markers), and
/// what of it could not be copied. The copy is always safe to apply (module doc); refusals
/// name the peers and rules left out.
pub fn to_host(
    tenant: &NetworkPolicy,
    key: &TenantKey,
    network: &Network,
) -> (NetworkPolicy, Vec<Refusal>) {
    let mut refusals = Vec::new();
    let none = NetworkPolicySpec::default();
    let spec = tenant.spec.as_ref().unwrap_or(&none);
    let (ingress_on, egress_on) = directions(spec);
    // Spelled out even when the tenant left it to defaulting: the host would default it from
    // the copy's rules, and a copy that lost every egress rule would stop isolating for egress.
    let policy_types = match spec.policy_types.as_ref() {
        Some(t) if !t.is_empty() => t.clone(),
        _ => [(ingress_on, "Ingress"), (egress_on, "Egress")]
            .into_iter()
            .filter(|(on, _)| *on)
            .map(|(_, t)| t.to_owned())
            .collect(),
    };
    let ingress = spec.ingress.as_ref().map(|rules| {
        rules
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let from = peers_to_host(
                    r.from.as_deref(),
                    Direction::Ingress,
                    i,
                    key,
                    network,
                    &mut refusals,
                )?;
                Some(NetworkPolicyIngressRule {
                    from: Some(from),
                    ports: r.ports.clone(),
                })
            })
            .collect()
    });
    let egress = spec.egress.as_ref().map(|rules| {
        rules
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let to = peers_to_host(
                    r.to.as_deref(),
                    Direction::Egress,
                    i,
                    key,
                    network,
                    &mut refusals,
                )?;
                Some(NetworkPolicyEgressRule {
                    to: Some(to),
                    ports: r.ports.clone(),
                })
            })
            .collect()
    });
    let host = NetworkPolicy {
        // The metadata every translator gives its host object; the key is all it needs.
        metadata: naming::host_meta(&tenant.metadata, key),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selector_to_host(
                spec.pod_selector
                    .as_ref()
                    .unwrap_or(&LabelSelector::default()),
            )),
            policy_types: Some(policy_types),
            ingress,
            egress,
        }),
    };
    (host, refusals)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TenantPolicy;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn key() -> TenantKey {
        TenantKey::new("demo").unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn selector(v: Value) -> LabelSelector {
        serde_json::from_value(v).unwrap()
    }

    /// A tenant policy `p` in tenant namespace `apps` with `spec`.
    fn tenant_policy(spec: Value) -> NetworkPolicy {
        serde_json::from_value(json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "p", "namespace": "apps", "uid": "u1", "labels": {"vcp.dev/x": "1"}},
            "spec": spec,
        }))
        .unwrap()
    }

    fn host_spec(tenant: Value, network: &Network) -> (Value, Vec<Refusal>) {
        let (host, refusals) = to_host(&tenant_policy(tenant), &key(), network);
        (serde_json::to_value(host.spec).unwrap(), refusals)
    }

    fn network(y: &str) -> Network {
        TenantPolicy::from_yaml(y).unwrap().network
    }

    fn fields(refusals: &[Refusal]) -> Vec<&str> {
        refusals.iter().map(|r| r.field.as_str()).collect()
    }

    const V4_CLUSTER: [&str; 5] = [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "169.254.0.0/16",
    ];
    const V6_CLUSTER: [&str; 2] = ["fc00::/7", "fe80::/10"];

    #[test]
    fn host_policies_are_the_four_expected_objects() {
        let n = network("network: {ingress_cidrs: [203.0.113.0/24]}");
        let got = serde_json::to_value(host_policies(&key(), "demo-apps", "vcp-demo", &n)).unwrap();
        let meta = |name: &str| {
            json!({
                "name": name,
                "namespace": "demo-apps",
                "labels": {"vcp.dev/tenant": "demo"},
                "annotations": {"vcp.dev/generated-for": "network-policy"},
            })
        };
        let control_plane = |component: &str| {
            json!([{
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "vcp-demo"}},
                "podSelector": {"matchLabels": {
                    "vcp.dev/control-plane-of": "demo",
                    "app.kubernetes.io/component": component,
                }},
            }])
        };
        let tenant = json!({"namespaceSelector": {"matchLabels": {"vcp.dev/tenant": "demo"}}});
        let expected = json!([
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": meta("vcp-isolate"),
                "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
            },
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": meta("vcp-control-plane"),
                "spec": {
                    "podSelector": {},
                    "policyTypes": ["Ingress", "Egress"],
                    // The apiserver, and its egress proxy (the syncer): webhooks, aggregated
                    // APIs and the proxy subresources reach tenant pods through it.
                    "ingress": [{"from": [control_plane("kube-apiserver")[0].clone(), control_plane("vcp-syncer")[0].clone()]}],
                    "egress": [
                        {
                            "to": control_plane("coredns"),
                            "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
                        },
                        {"to": control_plane("kube-apiserver"), "ports": [{"port": 6443, "protocol": "TCP"}]},
                    ],
                },
            },
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": meta("vcp-tenant-ingress"),
                "spec": {
                    "podSelector": {"matchExpressions": [
                        {"key": "vcp.dev/ingress-isolated", "operator": "DoesNotExist"},
                    ]},
                    "policyTypes": ["Ingress"],
                    "ingress": [{"from": [tenant, {"ipBlock": {"cidr": "203.0.113.0/24"}}]}],
                },
            },
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": meta("vcp-tenant-egress"),
                "spec": {
                    "podSelector": {"matchExpressions": [
                        {"key": "vcp.dev/egress-isolated", "operator": "DoesNotExist"},
                    ]},
                    "policyTypes": ["Egress"],
                    "egress": [{"to": [
                        tenant,
                        {"ipBlock": {"cidr": "0.0.0.0/0", "except": V4_CLUSTER}},
                        {"ipBlock": {"cidr": "::/0", "except": V6_CLUSTER}},
                    ]}],
                },
            },
        ]);
        assert_eq!(got, expected);
        for p in host_policies(&key(), "demo-apps", "vcp-demo", &n) {
            assert!(reserved_name(p.metadata.name.as_deref().unwrap()));
        }
    }

    #[test]
    fn by_default_nothing_outside_may_reach_tenant_pods() {
        let policies = host_policies(&key(), "demo-apps", "vcp-demo", &Network::default());
        let ingress = serde_json::to_value(&policies[2].spec).unwrap();
        assert_eq!(
            ingress["ingress"][0]["from"],
            json!([{"namespaceSelector": {"matchLabels": {"vcp.dev/tenant": "demo"}}}])
        );
    }

    #[test]
    fn an_empty_selector_selects_everything() {
        assert!(selects(&LabelSelector::default(), &labels(&[])));
        assert!(selects(&selector(json!({})), &labels(&[("app", "web")])));
        assert!(selects(
            &selector(json!({"matchLabels": {}, "matchExpressions": []})),
            &labels(&[("app", "web")])
        ));
    }

    #[test]
    fn selectors_require_every_label_and_every_expression() {
        let s = selector(json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}],
        }));
        assert!(selects(&s, &labels(&[("app", "web"), ("tier", "a")])));
        assert!(!selects(&s, &labels(&[("app", "web"), ("tier", "c")])));
        assert!(!selects(&s, &labels(&[("app", "db"), ("tier", "a")])));
        assert!(!selects(&s, &labels(&[("tier", "a")])));
    }

    #[test]
    fn selector_operators_mean_what_apimachinery_says() {
        let op = |op: &str, values: &[&str]| {
            selector(json!({"matchExpressions": [{"key": "k", "operator": op, "values": values}]}))
        };
        let (set, other, unset) = (
            labels(&[("k", "a")]),
            labels(&[("k", "z")]),
            labels(&[("x", "a")]),
        );
        let table = [
            (op("In", &["a", "b"]), [true, false, false]),
            (op("NotIn", &["a", "b"]), [false, true, true]),
            (op("Exists", &[]), [true, true, false]),
            (op("DoesNotExist", &[]), [false, false, true]),
            (op("In", &[]), [false, false, false]),
            (op("Gt", &["1"]), [false, false, false]),
            (op("in", &["a"]), [false, false, false]),
        ];
        for (s, expected) in table {
            let got = [selects(&s, &set), selects(&s, &other), selects(&s, &unset)];
            assert_eq!(got, expected, "{s:?}");
        }
    }

    #[test]
    fn isolation_follows_policy_types_and_their_defaults() {
        let web = labels(&[("app", "web")]);
        let rule = json!([{"from": [{"podSelector": {}}]}]);
        let table = [
            (json!({"podSelector": {}}), (true, false)),
            (json!({"podSelector": {}, "policyTypes": []}), (true, false)),
            (json!({"podSelector": {}, "egress": []}), (true, false)),
            (
                json!({"podSelector": {}, "egress": [{"to": [{"podSelector": {}}]}]}),
                (true, true),
            ),
            (
                json!({"podSelector": {}, "policyTypes": ["Egress"], "ingress": rule}),
                (false, true),
            ),
            (
                json!({"podSelector": {}, "policyTypes": ["Ingress"], "egress": rule}),
                (true, false),
            ),
            (
                json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
                (true, true),
            ),
            (
                json!({"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress", "Egress"]}),
                (false, false),
            ),
            (json!(null), (true, false)),
        ];
        for (spec, expected) in table {
            assert_eq!(
                isolation(&web, &[tenant_policy(spec.clone())]),
                expected,
                "{spec}"
            );
        }
        assert_eq!(isolation(&web, &[]), (false, false));
    }

    #[test]
    fn isolation_is_the_union_of_the_policies_selecting_the_pod() {
        let policies = [
            tenant_policy(json!({"podSelector": {"matchLabels": {"app": "web"}}})),
            tenant_policy(
                json!({"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Egress"]}),
            ),
            tenant_policy(json!({"podSelector": {"matchExpressions": [
                {"key": "tier", "operator": "Exists"},
            ]}, "policyTypes": ["Egress"]})),
        ];
        let l = isolation_labels;
        assert_eq!(l(&labels(&[("app", "other")]), &policies), labels(&[]));
        assert_eq!(
            l(&labels(&[("app", "web")]), &policies),
            labels(&[("vcp.dev/ingress-isolated", "true")])
        );
        assert_eq!(
            l(&labels(&[("app", "db")]), &policies),
            labels(&[("vcp.dev/egress-isolated", "true")])
        );
        assert_eq!(
            l(&labels(&[("app", "web"), ("tier", "x")]), &policies),
            labels(&[
                ("vcp.dev/ingress-isolated", "true"),
                ("vcp.dev/egress-isolated", "true")
            ])
        );
        // The tenant's own labels under these keys are not ours: they go to the host as `t.`.
        assert_eq!(
            naming::key_to_host(LABEL_INGRESS_ISOLATED),
            "t.vcp.dev/ingress-isolated"
        );
    }

    #[test]
    fn the_host_copy_has_the_host_namespace_markers_and_the_same_name() {
        let (host, refusals) = to_host(
            &tenant_policy(json!({"podSelector": {}})),
            &key(),
            &Network::default(),
        );
        assert!(refusals.is_empty());
        let m = &host.metadata;
        assert_eq!(m.name.as_deref(), Some("p"));
        assert_eq!(m.namespace.as_deref(), Some("demo-apps"));
        assert_eq!(
            m.labels.as_ref().unwrap(),
            &labels(&[("vcp.dev/tenant", "demo"), ("t.vcp.dev/x", "1")])
        );
        assert_eq!(m.annotations.as_ref().unwrap()["vcp.dev/tenant-uid"], "u1");
    }

    #[test]
    fn selectors_are_rewritten_to_host_label_keys() {
        let (spec, refusals) = host_spec(
            json!({
                "podSelector": {
                    "matchLabels": {"app": "web", "vcp.dev/role": "x"},
                    "matchExpressions": [{"key": "pod-security.kubernetes.io/enforce", "operator": "Exists"}],
                },
                "ingress": [{"from": [
                    {"podSelector": {"matchLabels": {"vcp.dev/ingress-isolated": "true"}}},
                    {
                        "namespaceSelector": {"matchLabels": {"team": "a"}},
                        "podSelector": {"matchExpressions": [
                            {"key": "vcp.dev/tier", "operator": "In", "values": ["a"]},
                        ]},
                    },
                ]}],
            }),
            &Network::default(),
        );
        assert!(refusals.is_empty());
        assert_eq!(
            spec["podSelector"],
            json!({
                "matchLabels": {"app": "web", "t.vcp.dev/role": "x"},
                "matchExpressions": [{"key": "t.pod-security.kubernetes.io/enforce", "operator": "Exists"}],
            })
        );
        assert_eq!(
            spec["ingress"][0]["from"],
            json!([
                {"podSelector": {"matchLabels": {"t.vcp.dev/ingress-isolated": "true"}}},
                {
                    "namespaceSelector": {"matchLabels": {"team": "a", "vcp.dev/tenant": "demo"}},
                    "podSelector": {"matchExpressions": [
                        {"key": "t.vcp.dev/tier", "operator": "In", "values": ["a"]},
                    ]},
                },
            ])
        );
        assert_eq!(spec["policyTypes"], json!(["Ingress"]));
    }

    #[test]
    fn an_empty_namespace_selector_means_every_namespace_of_this_tenant_only() {
        let (spec, _) = host_spec(
            json!({"podSelector": {}, "egress": [{"to": [{"namespaceSelector": {}}]}]}),
            &Network::default(),
        );
        assert_eq!(
            spec["egress"][0]["to"],
            json!([{"namespaceSelector": {"matchLabels": {"vcp.dev/tenant": "demo"}}}])
        );
    }

    #[test]
    fn a_namespace_name_selector_names_the_tenant_namespace() {
        let (spec, _) = host_spec(
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": "db"},
            }}]}]}),
            &Network::default(),
        );
        let ns = selector(spec["ingress"][0]["from"][0]["namespaceSelector"].clone());
        assert_eq!(
            ns.match_labels.as_ref().unwrap(),
            &labels(&[
                ("t.kubernetes.io/metadata.name", "db"),
                ("vcp.dev/tenant", "demo")
            ])
        );
        // The tenant's namespace `db` on the host, and neither the host's `db` nor another
        // tenant's.
        let tenant_db = labels(&[
            ("kubernetes.io/metadata.name", "demo-db"),
            ("t.kubernetes.io/metadata.name", "db"),
            ("vcp.dev/tenant", "demo"),
        ]);
        let host_db = labels(&[("kubernetes.io/metadata.name", "db")]);
        let other_db = labels(&[
            ("kubernetes.io/metadata.name", "other-db"),
            ("t.kubernetes.io/metadata.name", "db"),
            ("vcp.dev/tenant", "other"),
        ]);
        assert!(selects(&ns, &tenant_db));
        assert!(!selects(&ns, &host_db));
        assert!(!selects(&ns, &other_db));
    }

    #[test]
    fn a_forged_tenant_label_cannot_widen_a_namespace_selector() {
        let (spec, _) = host_spec(
            json!({"podSelector": {}, "ingress": [{"from": [
                {"namespaceSelector": {"matchLabels": {"vcp.dev/tenant": "other"}}},
                {"namespaceSelector": {"matchExpressions": [
                    {"key": "vcp.dev/tenant", "operator": "In", "values": ["other", "demo"]},
                ]}},
                {"namespaceSelector": {"matchExpressions": [
                    {"key": "vcp.dev/tenant", "operator": "DoesNotExist"},
                ]}},
            ]}]}),
            &Network::default(),
        );
        assert_eq!(
            spec["ingress"][0]["from"],
            json!([
                {"namespaceSelector": {"matchLabels": {"t.vcp.dev/tenant": "other", "vcp.dev/tenant": "demo"}}},
                {"namespaceSelector": {
                    "matchLabels": {"vcp.dev/tenant": "demo"},
                    "matchExpressions": [
                        {"key": "t.vcp.dev/tenant", "operator": "In", "values": ["other", "demo"]},
                    ],
                }},
                {"namespaceSelector": {
                    "matchLabels": {"vcp.dev/tenant": "demo"},
                    "matchExpressions": [{"key": "t.vcp.dev/tenant", "operator": "DoesNotExist"}],
                }},
            ])
        );
        let other = labels(&[("vcp.dev/tenant", "other")]);
        for p in spec["ingress"][0]["from"].as_array().unwrap() {
            assert!(!selects(&selector(p["namespaceSelector"].clone()), &other));
        }
    }

    #[test]
    fn ip_blocks_get_every_cluster_range_inside_them_excepted() {
        let n = network("network: {egress_cidrs: [0.0.0.0/0, '::/0', 100.0.0.0/8]}");
        let (spec, refusals) = host_spec(
            json!({"podSelector": {}, "egress": [{"to": [
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "8.8.8.0/24"]}},
                {"ipBlock": {"cidr": "100.0.0.0/8"}},
                {"ipBlock": {"cidr": "203.0.113.0/24"}},
                {"ipBlock": {"cidr": "::/0"}},
            ]}]}),
            &n,
        );
        assert!(refusals.is_empty(), "{refusals:?}");
        assert_eq!(
            spec["egress"][0]["to"],
            json!([
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": [
                    "10.0.0.0/8", "8.8.8.0/24", "172.16.0.0/12", "192.168.0.0/16",
                    "100.64.0.0/10", "169.254.0.0/16",
                ]}},
                {"ipBlock": {"cidr": "100.0.0.0/8", "except": ["100.64.0.0/10"]}},
                {"ipBlock": {"cidr": "203.0.113.0/24"}},
                {"ipBlock": {"cidr": "::/0", "except": V6_CLUSTER}},
            ])
        );
    }

    #[test]
    fn ip_blocks_outside_the_plan_or_inside_cluster_ranges_are_refused() {
        let n = network("network: {egress_cidrs: [203.0.113.0/24, '2001:db8::/32']}");
        let (spec, refusals) = host_spec(
            json!({"podSelector": {}, "egress": [{"to": [
                {"ipBlock": {"cidr": "203.0.113.128/25"}},
                {"ipBlock": {"cidr": "0.0.0.0/0"}},
                {"ipBlock": {"cidr": "10.1.0.0/16"}},
                {"ipBlock": {"cidr": "169.254.169.254/32"}},
                {"ipBlock": {"cidr": "::ffff:203.0.113.0/120"}},
                {"ipBlock": {"cidr": "not-a-cidr"}},
                {"podSelector": {}},
            ]}]}),
            &n,
        );
        assert_eq!(
            spec["egress"][0]["to"],
            json!([{"ipBlock": {"cidr": "203.0.113.128/25"}}, {"podSelector": {}}])
        );
        assert_eq!(
            fields(&refusals),
            [1, 2, 3, 4, 5].map(|i| format!("spec.egress[0].to[{i}].ipBlock"))
        );
        assert!(refusals.iter().all(|r| r.rule == "plan: network"));
        assert!(
            refusals[0].message.contains("203.0.113.0/24"),
            "{}",
            refusals[0]
        );
        assert!(
            refusals[1].message.contains("10.0.0.0/8"),
            "{}",
            refusals[1]
        );
        assert!(
            refusals[3].message.contains("IPv4-mapped"),
            "{}",
            refusals[3]
        );
        // By default no outside address may reach tenant pods.
        let (_, refusals) = host_spec(
            json!({"podSelector": {}, "ingress": [{"from": [
                {"ipBlock": {"cidr": "203.0.113.0/24"}}, {"podSelector": {}},
            ]}]}),
            &Network::default(),
        );
        assert_eq!(fields(&refusals), ["spec.ingress[0].from[0].ipBlock"]);
        assert!(
            refusals[0]
                .message
                .contains("no outside addresses for ingress")
        );
    }

    #[test]
    fn a_rule_losing_every_peer_is_dropped_not_opened() {
        let (spec, refusals) = host_spec(
            json!({
                "podSelector": {},
                "egress": [
                    {"to": [{"ipBlock": {"cidr": "10.0.0.0/16"}}, {"ipBlock": {"cidr": "192.168.1.1/32"}}], "ports": [{"port": 5432}]},
                    {"to": [{"podSelector": {}}]},
                ],
            }),
            &Network::default(),
        );
        assert_eq!(spec["egress"], json!([{"to": [{"podSelector": {}}]}]));
        assert_eq!(
            fields(&refusals),
            [
                "spec.egress[0].to[0].ipBlock",
                "spec.egress[0].to[1].ipBlock",
                "spec.egress[0]"
            ]
        );
        assert!(
            refusals[2].message.contains("whole rule"),
            "{}",
            refusals[2]
        );
        // The policy still isolates for egress, with no rule left at all.
        let (spec, _) = host_spec(
            json!({"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/16"}}]}]}),
            &Network::default(),
        );
        assert_eq!(spec["egress"], json!([]));
        assert_eq!(spec["policyTypes"], json!(["Ingress", "Egress"]));
    }

    #[test]
    fn rules_without_peers_mean_the_whole_tenant_and_the_plans_outside() {
        let n =
            network("network: {egress_cidrs: [203.0.113.0/24], ingress_cidrs: [198.51.100.0/24]}");
        let (spec, refusals) = host_spec(
            json!({
                "podSelector": {},
                "ingress": [{}, {"from": [], "ports": [{"port": 80}]}],
                "egress": [{"ports": [{"port": 443, "protocol": "TCP"}]}],
            }),
            &n,
        );
        assert!(refusals.is_empty());
        let tenant = json!({"namespaceSelector": {"matchLabels": {"vcp.dev/tenant": "demo"}}});
        assert_eq!(
            spec["ingress"],
            json!([
                {"from": [tenant, {"ipBlock": {"cidr": "198.51.100.0/24"}}]},
                {"from": [tenant, {"ipBlock": {"cidr": "198.51.100.0/24"}}], "ports": [{"port": 80}]},
            ])
        );
        assert_eq!(
            spec["egress"],
            json!([{
                "to": [tenant, {"ipBlock": {"cidr": "203.0.113.0/24"}}],
                "ports": [{"port": 443, "protocol": "TCP"}],
            }])
        );
        assert_eq!(spec["policyTypes"], json!(["Ingress", "Egress"]));
    }

    #[test]
    fn ports_and_policy_types_are_copied() {
        let (spec, _) = host_spec(
            json!({
                "podSelector": {},
                "policyTypes": ["Egress"],
                "ingress": [{"from": [{"podSelector": {}}]}],
                "egress": [{"to": [{"podSelector": {}}], "ports": [
                    {"port": "http", "protocol": "TCP"},
                    {"port": 8000, "endPort": 8100, "protocol": "UDP"},
                ]}],
            }),
            &Network::default(),
        );
        assert_eq!(spec["policyTypes"], json!(["Egress"]));
        assert_eq!(
            spec["egress"][0]["ports"],
            json!([
                {"port": "http", "protocol": "TCP"},
                {"port": 8000, "endPort": 8100, "protocol": "UDP"},
            ])
        );
        let (spec, _) = host_spec(json!({"podSelector": {}}), &Network::default());
        assert_eq!(spec["policyTypes"], json!(["Ingress"]));
    }

    #[test]
    fn invalid_peers_are_left_out() {
        let (spec, refusals) = host_spec(
            json!({"podSelector": {}, "ingress": [{"from": [
                {},
                {"ipBlock": {"cidr": "203.0.113.0/24"}, "podSelector": {}},
                {"podSelector": {}},
            ]}]}),
            &network("network: {ingress_cidrs: [0.0.0.0/0]}"),
        );
        assert_eq!(spec["ingress"][0]["from"], json!([{"podSelector": {}}]));
        assert_eq!(
            fields(&refusals),
            ["spec.ingress[0].from[0]", "spec.ingress[0].from[1]"]
        );
    }

    #[test]
    fn the_network_section_defaults_and_refuses_what_cannot_work() {
        let p = TenantPolicy::from_yaml("{}").unwrap();
        assert_eq!(p.network, Network::default());
        assert_eq!(
            p.network.egress_cidrs,
            ["0.0.0.0/0", "::/0"].map(|s| s.parse::<IpNet>().unwrap())
        );
        assert!(p.network.ingress_cidrs.is_empty());
        network("network: {egress_cidrs: [203.0.113.0/24], ingress_cidrs: [0.0.0.0/0]}");
        let err = |y: &str| TenantPolicy::from_yaml(y).unwrap_err().to_string();
        assert!(err("network: {egress_cidrs: [10.1.0.0/16]}").contains("network.egress_cidrs"));
        assert!(err("network: {ingress_cidrs: [169.254.169.254/32]}").contains("169.254.0.0/16"));
        assert!(err("network: {egress_cidrs: ['::ffff:0:0/96']}").contains("IPv4-mapped"));
        assert!(err("network: {cluster_cidrs: []}").contains("network.cluster_cidrs"));
        assert!(err("network: {egres_cidrs: []}").contains("unknown field"));
        assert!(err("network: {egress_cidrs: [example.com]}").contains("invalid"));
    }

    #[test]
    fn generated_names_are_reserved() {
        assert!(reserved_name("vcp-isolate"));
        assert!(reserved_name("vcp-anything"));
        assert!(!reserved_name("allow-dns"));
        assert!(!reserved_name("vcp"));
    }

    // Property tests: random tenant policies over small sets of keys, values and CIDRs, so
    // forged keys, cluster ranges and empty selectors come up often.

    const KEYS: [&str; 6] = [
        "app",
        "vcp.dev/tenant",
        "t.vcp.dev/tenant",
        "kubernetes.io/metadata.name",
        "vcp.dev/ingress-isolated",
        "vcp.dev/control-plane-of",
    ];
    const VALUES: [&str; 4] = ["demo", "other", "apps", "vcp-demo"];
    const CIDRS: [&str; 14] = [
        "0.0.0.0/0",
        "0.0.0.0/1",
        "10.0.0.0/8",
        "10.1.0.0/16",
        "100.0.0.0/8",
        "169.254.169.254/32",
        "192.168.0.0/16",
        "203.0.113.0/24",
        "8.8.8.8/32",
        "::/0",
        "fd00::/8",
        "2001:db8::/32",
        "::ffff:0:0/96",
        "::ffff:10.0.0.0/104",
    ];
    const OPERATORS: [&str; 5] = ["In", "NotIn", "Exists", "DoesNotExist", "Gt"];

    fn arb_labels() -> impl Strategy<Value = BTreeMap<String, String>> {
        proptest::collection::btree_map(
            proptest::sample::select(&KEYS[..]).prop_map(str::to_owned),
            proptest::sample::select(&VALUES[..]).prop_map(str::to_owned),
            0..4,
        )
    }

    fn arb_selector() -> impl Strategy<Value = LabelSelector> {
        let requirement = (
            proptest::sample::select(&KEYS[..]),
            proptest::sample::select(&OPERATORS[..]),
            proptest::collection::vec(proptest::sample::select(&VALUES[..]), 0..3),
        )
            .prop_map(|(k, op, values)| LabelSelectorRequirement {
                key: k.to_owned(),
                operator: op.to_owned(),
                values: Some(values.into_iter().map(str::to_owned).collect()),
            });
        (
            proptest::option::of(arb_labels()),
            proptest::option::of(proptest::collection::vec(requirement, 0..3)),
        )
            .prop_map(|(match_labels, match_expressions)| LabelSelector {
                match_labels,
                match_expressions,
            })
    }

    fn arb_peer() -> impl Strategy<Value = NetworkPolicyPeer> {
        let block = (
            proptest::sample::select(&CIDRS[..]),
            proptest::option::of(proptest::collection::vec(
                proptest::sample::select(&CIDRS[..]),
                0..3,
            )),
        )
            .prop_map(|(cidr, except)| IPBlock {
                cidr: cidr.to_owned(),
                except: except.map(|e| e.into_iter().map(str::to_owned).collect()),
            });
        prop_oneof![
            4 => (proptest::option::of(arb_selector()), proptest::option::of(arb_selector()))
                .prop_map(|(namespace_selector, pod_selector)| NetworkPolicyPeer {
                    namespace_selector,
                    pod_selector,
                    ip_block: None,
                }),
            1 => Just(NetworkPolicyPeer {
                namespace_selector: Some(LabelSelector::default()),
                ..Default::default()
            }),
            4 => block.prop_map(|b| NetworkPolicyPeer { ip_block: Some(b), ..Default::default() }),
        ]
    }

    fn arb_peers() -> impl Strategy<Value = Option<Vec<NetworkPolicyPeer>>> {
        proptest::option::of(proptest::collection::vec(arb_peer(), 0..4))
    }

    fn arb_ports() -> impl Strategy<Value = Option<Vec<NetworkPolicyPort>>> {
        proptest::option::of(Just(vec![port(80, "TCP")]))
    }

    fn arb_policy() -> impl Strategy<Value = NetworkPolicy> {
        let types = prop_oneof![
            Just(None),
            Just(Some(vec![])),
            Just(Some(vec!["Ingress"])),
            Just(Some(vec!["Egress"])),
            Just(Some(vec!["Ingress", "Egress"])),
        ];
        let ingress = proptest::collection::vec(
            (arb_peers(), arb_ports())
                .prop_map(|(from, ports)| NetworkPolicyIngressRule { from, ports }),
            0..3,
        );
        let egress = proptest::collection::vec(
            (arb_peers(), arb_ports())
                .prop_map(|(to, ports)| NetworkPolicyEgressRule { to, ports }),
            0..3,
        );
        (
            proptest::option::of(arb_selector()),
            types,
            proptest::option::of(ingress),
            proptest::option::of(egress),
        )
            .prop_map(|(pod_selector, types, ingress, egress)| {
                let mut p = tenant_policy(json!({}));
                p.spec = Some(NetworkPolicySpec {
                    pod_selector,
                    policy_types: types.map(|t| t.into_iter().map(str::to_owned).collect()),
                    ingress,
                    egress,
                });
                p
            })
    }

    /// The default plan, a narrow one, and one `validate` would refuse (a plan CIDR inside a
    /// cluster range): the translation must stay safe even with that.
    fn arb_network() -> impl Strategy<Value = Network> {
        let nets = |v: &[&str]| v.iter().map(|s| s.parse().unwrap()).collect::<Vec<IpNet>>();
        prop_oneof![
            Just(Network::default()),
            Just(Network {
                egress_cidrs: nets(&["203.0.113.0/24", "2001:db8::/32"]),
                ingress_cidrs: nets(&["0.0.0.0/0"]),
                ..Network::default()
            }),
            Just(Network {
                egress_cidrs: nets(&["10.0.0.0/8", "100.0.0.0/8", "::ffff:0:0/96"]),
                ingress_cidrs: nets(&["0.0.0.0/1"]),
                ..Network::default()
            }),
        ]
    }

    /// Addresses of pods, Services, nodes and the metadata server: no ipBlock may admit them.
    const CLUSTER_ADDRESSES: [&str; 6] = [
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "169.254.169.254",
        "fd00::1",
    ];

    fn admits_address(b: &IPBlock, addr: &str) -> bool {
        let addr: std::net::IpAddr = addr.parse().unwrap();
        let inside = |c: &str| c.parse::<IpNet>().is_ok_and(|n| n.contains(&addr));
        inside(&b.cidr) && !b.except.iter().flatten().any(|e| inside(e))
    }

    /// Checks one host rule's peers; `tenant_peers` are the tenant rule's.
    fn check_peers(
        host: &Option<Vec<NetworkPolicyPeer>>,
        tenant: &Option<Vec<NetworkPolicyPeer>>,
        dir: Direction,
        network: &Network,
        foreign_namespaces: &[BTreeMap<String, String>],
    ) -> Result<(), TestCaseError> {
        let peers = host.as_deref().unwrap_or_default();
        prop_assert!(
            !peers.is_empty(),
            "a host rule without peers allows everything"
        );
        if tenant.as_deref().is_none_or(<[_]>::is_empty) {
            prop_assert_eq!(
                &peers[0],
                &NetworkPolicyPeer {
                    namespace_selector: Some(tenant_namespaces(&key())),
                    ..Default::default()
                }
            );
        }
        for p in peers {
            if let Some(ns) = &p.namespace_selector {
                prop_assert_eq!(
                    ns.match_labels.as_ref().and_then(|l| l.get(LABEL_TENANT)),
                    Some(&"demo".to_owned())
                );
                prop_assert!(
                    ns.match_expressions
                        .iter()
                        .flatten()
                        .all(|r| r.key != LABEL_TENANT)
                );
                for f in foreign_namespaces {
                    prop_assert!(
                        !selects(ns, f),
                        "{:?} selects foreign namespace {:?}",
                        ns,
                        f
                    );
                }
            }
            for s in [&p.namespace_selector, &p.pod_selector]
                .into_iter()
                .flatten()
            {
                let keys = s
                    .match_expressions
                    .iter()
                    .flatten()
                    .map(|r| r.key.as_str())
                    .chain(s.match_labels.iter().flatten().map(|(k, _)| k.as_str()));
                for k in keys {
                    prop_assert!(
                        naming::key_to_tenant(k).is_some() || k == LABEL_TENANT,
                        "{} is a key vcp or the host sets",
                        k
                    );
                }
            }
            if let Some(b) = &p.ip_block {
                prop_assert!(p.namespace_selector.is_none() && p.pod_selector.is_none());
                let cidr: IpNet = b.cidr.parse().unwrap();
                prop_assert!(dir.plan_cidrs(network).iter().any(|c| c.contains(&cidr)));
                prop_assert!(unreachable(&cidr, &network.cluster_cidrs).is_none());
                for c in network.cluster_cidrs.iter().filter(|c| cidr.contains(*c)) {
                    let covered = b
                        .except
                        .iter()
                        .flatten()
                        .any(|e| e.parse::<IpNet>().is_ok_and(|e| e.contains(c)));
                    prop_assert!(covered, "{} is not excepted from {}", c, b.cidr);
                }
                for a in CLUSTER_ADDRESSES {
                    prop_assert!(!admits_address(b, a), "{:?} admits {}", b, a);
                }
            } else {
                prop_assert!(p.namespace_selector.is_some() || p.pod_selector.is_some());
            }
        }
        Ok(())
    }

    /// The host rules of each tenant rule, following the refusals that dropped some.
    fn kept<'a, T>(
        n: usize,
        host: &'a [T],
        refusals: &[Refusal],
        dir: Direction,
    ) -> Vec<Option<&'a T>> {
        let mut host = host.iter();
        (0..n)
            .map(|i| {
                let dropped = refusals
                    .iter()
                    .any(|r| r.field == format!("spec.{}[{i}]", dir.rules()));
                if dropped { None } else { host.next() }
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn host_copies_never_reach_beyond_the_tenant(
            tenant in arb_policy(),
            network in arb_network(),
            ns_labels in arb_labels(),
        ) {
            let (host, refusals) = to_host(&tenant, &key(), &network);
            let (t, h) = (tenant.spec.as_ref().unwrap(), host.spec.as_ref().unwrap());
            // Other tenants' namespaces, the control plane's and the host's, carrying whatever
            // labels a tenant could have given its own.
            let mut other = naming::map_to_host(&ns_labels);
            other.insert(LABEL_TENANT.into(), "other".into());
            let mut host = ns_labels.clone();
            host.remove(LABEL_TENANT);
            let mut control_plane = host.clone();
            control_plane.extend(labels(&[
                ("kubernetes.io/metadata.name", "vcp-demo"),
                ("vcp.dev/control-plane-of", "demo"),
            ]));
            let foreign = [other, control_plane, host, BTreeMap::new()];

            let (ti, te) = (t.ingress.as_deref().unwrap_or_default(), t.egress.as_deref().unwrap_or_default());
            let (hi, he) = (h.ingress.as_deref().unwrap_or_default(), h.egress.as_deref().unwrap_or_default());
            let ki = kept(ti.len(), hi, &refusals, Direction::Ingress);
            prop_assert_eq!(ki.iter().flatten().count(), hi.len());
            for (tr, hr) in ti.iter().zip(ki) {
                if let Some(hr) = hr {
                    check_peers(&hr.from, &tr.from, Direction::Ingress, &network, &foreign)?;
                    prop_assert_eq!(&hr.ports, &tr.ports);
                }
            }
            let ke = kept(te.len(), he, &refusals, Direction::Egress);
            prop_assert_eq!(ke.iter().flatten().count(), he.len());
            for (tr, hr) in te.iter().zip(ke) {
                if let Some(hr) = hr {
                    check_peers(&hr.to, &tr.to, Direction::Egress, &network, &foreign)?;
                    prop_assert_eq!(&hr.ports, &tr.ports);
                }
            }
            // The copy isolates in the directions the tenant policy does, whatever was dropped.
            prop_assert_eq!(directions(h), directions(t));
            prop_assert!(refusals.iter().all(|r| !r.message.is_empty()));
        }

        #[test]
        fn host_copies_select_the_host_form_of_the_same_pods(
            tenant in arb_policy(),
            pod in arb_labels(),
        ) {
            let (host, _) = to_host(&tenant, &key(), &Network::default());
            let all = LabelSelector::default();
            let spec = tenant.spec.as_ref().unwrap();
            let tenant_selects = selects(spec.pod_selector.as_ref().unwrap_or(&all), &pod);
            // The host pod: its labels' host form, the marker and the isolation labels.
            let mut host_pod = naming::map_to_host(&pod);
            host_pod.extend(labels(&[
                (LABEL_TENANT, "demo"),
                (LABEL_INGRESS_ISOLATED, "true"),
                (LABEL_EGRESS_ISOLATED, "true"),
            ]));
            let host_selects = selects(host.spec.as_ref().unwrap().pod_selector.as_ref().unwrap(), &host_pod);
            prop_assert_eq!(tenant_selects, host_selects);
        }

        #[test]
        fn namespace_selectors_pick_the_host_form_of_the_same_namespaces(
            selector in arb_selector(),
            ns in arb_labels(),
        ) {
            let tenant = tenant_policy(json!({
                "podSelector": {},
                "ingress": [{"from": [{"namespaceSelector": selector}]}],
            }));
            let (host, refusals) = to_host(&tenant, &key(), &Network::default());
            prop_assert!(refusals.is_empty());
            let host_selector = host.spec.unwrap().ingress.unwrap()[0].from.as_ref().unwrap()[0]
                .namespace_selector
                .clone()
                .unwrap();
            let mut host_ns = naming::map_to_host(&ns);
            host_ns.extend(labels(&[
                (LABEL_TENANT, "demo"),
                ("kubernetes.io/metadata.name", "demo-x"),
            ]));
            prop_assert_eq!(selects(&selector, &ns), selects(&host_selector, &host_ns));
        }
    }
}
