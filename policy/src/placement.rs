//! Where a tenant pod may run and what it may schedule against (pure).
//!
//! A tenant is cluster-admin of its own apiserver, so everything in a pod spec that steers the
//! host scheduler is untrusted. [`confine`] rewrites the host pod's spec so that:
//! - [`confine`] takes `nodeName` off: a node the tenant named itself becomes a required
//!   affinity to that node (`matchFields metadata.name`), so the pod runs on the node its
//!   tenant pod shows, when that node is in the pool; a node outside the pool leaves the pod
//!   Pending, as a real cluster leaves a pod bound to a node that never runs it. The syncer
//!   sets `nodeName` again at creation only for a node [`in_pool`] accepts, so the host
//!   kubelet admits the pod as a real one would (capacity, host ports, the pool's selector and
//!   that affinity), without the host scheduler; a node's NoSchedule taints are what the
//!   kubelet does not check, which is why [`in_pool`] must hold;
//! - it lands only in the plan's workload pool: the pool's node selector wins over the tenant's
//!   keys of the same name, and every required node-affinity term of the tenant (terms are
//!   alternatives) additionally excludes the nodes that run control planes; the tenant's own
//!   selector and affinity can only narrow placement further, since the host ANDs them;
//! - it tolerates only what the plan gives every tenant pod, plus the tenant's own tolerations
//!   of the few taint keys the plan lets it choose (eviction timing);
//! - pod affinity and anti-affinity terms (and topology spread constraints) see only the
//!   tenant's own pods: label keys are rewritten as on the host, and a term's namespaces
//!   become the tenant's host namespaces (a namespace selector is ANDed with the tenant label),
//!   so a tenant pod can neither follow nor repel another tenant's or the host's pods;
//! - priority and runtime classes are the host classes the plan maps them to, or none.

use super::{Placement, Refusal, Scheduling};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PodAffinityTerm, PodSpec, Taint, Toleration, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use std::collections::BTreeMap;
use vcp_core::naming::{self, LABEL_TENANT, TenantKey};

/// Whether host node `node` belongs to the plan's workload pool: it carries every label of the
/// pool's selector and none of the control-plane labels to avoid, and every taint that keeps
/// pods off it (`NoSchedule`, `NoExecute`) is tolerated by what the plan gives every tenant
/// pod. The node controllers' state taints (`node.kubernetes.io/*`: not ready, unreachable,
/// cordoned, under pressure) do not count: a pool node that is not Ready or cordoned is still
/// the tenant's node, shown with its condition, as a real cluster shows it.
pub fn in_pool(node: &Node, placement: &Placement) -> bool {
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    let selected = placement
        .node_selector
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v));
    let avoided = placement
        .avoid_node_labels
        .iter()
        .any(|(k, v)| labels.get(k) == Some(v));
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref());
    let tolerated = taints.into_iter().flatten().all(|t| {
        t.effect == "PreferNoSchedule"
            || t.key.starts_with("node.kubernetes.io/")
            || placement.tolerations.iter().any(|tol| tolerates(tol, t))
    });
    selected && !avoided && tolerated
}

/// Whether toleration `tol` tolerates `taint`, as the scheduler matches them.
fn tolerates(tol: &Toleration, taint: &Taint) -> bool {
    let effect = tol
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key = tol.key.as_deref().unwrap_or_default();
    match tol.operator.as_deref() {
        Some("Exists") => effect && (key.is_empty() || key == taint.key),
        _ => {
            effect
                && key == taint.key
                && tol.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
    }
}

/// Rewrites `spec` (a copy of the tenant pod's) so it stays in the pool and in the tenant's world. What the tenant asked for and did
/// not get is told to it as notes (dropped tolerations, priority classes), since the pod
/// still runs.
pub fn confine(
    spec: &mut PodSpec,
    key: &TenantKey,
    placement: &Placement,
    scheduling: &Scheduling,
) -> Vec<String> {
    let mut notes = Vec::new();
    let pinned = spec.node_name.take().filter(|n| !n.is_empty());
    let mut selector = spec.node_selector.take().unwrap_or_default();
    for (k, v) in &placement.node_selector {
        if selector.get(k).is_some_and(|own| own != v) {
            notes.push(format!(
                "nodeSelector {k}={} replaced by the pool's {k}={v}",
                selector[k]
            ));
        }
        selector.insert(k.clone(), v.clone());
    }
    spec.node_selector = (!selector.is_empty()).then_some(selector);

    let own = spec.tolerations.take().unwrap_or_default();
    let (kept, dropped): (Vec<Toleration>, Vec<Toleration>) = own.into_iter().partition(|t| {
        t.key
            .as_ref()
            .is_some_and(|k| !k.is_empty() && placement.tenant_toleration_keys.contains(k))
    });
    if !dropped.is_empty() {
        let keys: Vec<String> = dropped
            .iter()
            .map(|t| {
                t.key
                    .clone()
                    .filter(|k| !k.is_empty())
                    .unwrap_or_else(|| "*".into())
            })
            .collect();
        notes.push(format!(
            "tolerations of {} dropped: the plan decides which taints tenant pods tolerate",
            keys.join(", ")
        ));
    }
    let mut tolerations = kept;
    tolerations.extend(placement.tolerations.iter().cloned());
    spec.tolerations = (!tolerations.is_empty()).then_some(tolerations);

    avoid_nodes(spec, &placement.avoid_node_labels);
    if let Some(node) = &pinned {
        pin(spec, node);
    }
    confine_pod_terms(spec, key);

    if let Some(class) = spec.priority_class_name.take() {
        match scheduling.priority_classes.get(&class) {
            Some(host) => spec.priority_class_name = Some(host.clone()),
            None => notes.push(format!(
                "priorityClassName {class} dropped: the plan maps no host class to it"
            )),
        }
    }
    // Set by the tenant's admission from its own classes; the host's admission sets them
    // again from the host classes (and rejects a pod whose values disagree with them).
    spec.priority = None;
    spec.preemption_policy = None;
    spec.overhead = None;
    notes
}

/// The host RuntimeClass a pod runs under (`None`: it names no class), or why its class keeps
/// it off the host. `handler` is the handler of the pod's class as the tenant defines it
/// (`None`: not known, or the class does not exist in the tenant). A class the plan lists by
/// name keeps its name; otherwise its handler picks the host class.
pub fn runtime_class(
    spec: &PodSpec,
    handler: Option<&str>,
    scheduling: &Scheduling,
) -> Result<Option<String>, Refusal> {
    let Some(c) = spec.runtime_class_name.as_deref() else {
        return Ok(None);
    };
    if scheduling.runtime_classes.iter().any(|a| a == c) {
        return Ok(Some(c.to_owned()));
    }
    if let Some(host) = handler.and_then(|h| scheduling.runtime_handlers.get(h)) {
        return Ok(Some(host.clone()));
    }
    let mut allowed: Vec<String> = scheduling.runtime_classes.clone();
    allowed.extend(
        scheduling
            .runtime_handlers
            .keys()
            .map(|h| format!("any class of handler {h}")),
    );
    let of_handler = handler
        .map(|h| format!(" (handler {h})"))
        .unwrap_or_default();
    Err(Refusal::new(
        "spec.runtimeClassName",
        "plan: runtime classes",
        format!(
            "RuntimeClass {c}{of_handler} is not one the tenant's plan allows{}",
            if allowed.is_empty() {
                String::new()
            } else {
                format!(" ({})", allowed.join(", "))
            }
        ),
    ))
}

/// Keeps the pod to host node `node` by name: `metadata.name In [node]` in every required
/// node-affinity term ([`required_terms`]), as the DaemonSet controller pins its pods.
fn pin(spec: &mut PodSpec, node: &str) {
    let field = NodeSelectorRequirement {
        key: "metadata.name".into(),
        operator: "In".into(),
        values: Some(vec![node.to_owned()]),
    };
    for term in required_terms(spec) {
        term.match_fields
            .get_or_insert_with(Vec::new)
            .push(field.clone());
    }
}

/// The pod's required node-affinity terms, with one made if there is none. Terms are ORed,
/// so a requirement that must always hold goes into each of them.
fn required_terms(spec: &mut PodSpec) -> &mut Vec<NodeSelectorTerm> {
    let required = spec
        .affinity
        .get_or_insert_with(Affinity::default)
        .node_affinity
        .get_or_insert_with(NodeAffinity::default)
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    &mut required.node_selector_terms
}

/// Adds `key NotIn [value]` for every avoided label to every required node-affinity term (or
/// to a new one): node selector terms are ORed, so each must exclude the nodes by itself.
fn avoid_nodes(spec: &mut PodSpec, avoid: &BTreeMap<String, String>) {
    if avoid.is_empty() {
        return;
    }
    let requirements: Vec<NodeSelectorRequirement> = avoid
        .iter()
        .map(|(k, v)| NodeSelectorRequirement {
            key: k.clone(),
            operator: "NotIn".into(),
            values: Some(vec![v.clone()]),
        })
        .collect();
    for term in required_terms(spec) {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .extend(requirements.iter().cloned());
    }
}

/// Label selector keys as the host stores them (see [`naming::key_to_host`]).
pub fn selector_to_host(s: &LabelSelector) -> LabelSelector {
    LabelSelector {
        match_labels: s.match_labels.as_ref().map(naming::map_to_host),
        match_expressions: s.match_expressions.as_ref().map(|es| {
            es.iter()
                .map(|e| LabelSelectorRequirement {
                    key: naming::key_to_host(&e.key),
                    ..e.clone()
                })
                .collect()
        }),
    }
}

/// A namespace selector that can match only this tenant's host namespaces: the tenant's
/// requirements (keys rewritten) AND the tenant label. A tenant requirement on the tenant
/// label's own key was rewritten to its `t.` form, so it cannot widen this.
pub fn namespace_selector_to_host(s: &LabelSelector, key: &TenantKey) -> LabelSelector {
    let mut host = selector_to_host(s);
    host.match_labels
        .get_or_insert_with(BTreeMap::new)
        .insert(LABEL_TENANT.into(), key.to_string());
    host
}

fn term_to_host(t: &mut PodAffinityTerm, key: &TenantKey) {
    t.label_selector = t.label_selector.as_ref().map(selector_to_host);
    for keys in [&mut t.match_label_keys, &mut t.mismatch_label_keys]
        .into_iter()
        .flatten()
    {
        for k in keys.iter_mut() {
            *k = naming::key_to_host(k);
        }
    }
    // Listed namespaces and a selector are ORed: both are confined to the tenant. Neither (or
    // an empty list) means the pod's own namespace, which is the tenant's anyway.
    t.namespaces = t.namespaces.as_ref().map(|list| {
        list.iter()
            .map(|n| naming::host_namespace(key, n))
            .collect()
    });
    t.namespace_selector = t
        .namespace_selector
        .as_ref()
        .map(|s| namespace_selector_to_host(s, key));
}

/// The required and preferred terms of a pod affinity or anti-affinity (both kinds hold the
/// same two lists of [`PodAffinityTerm`]s).
fn terms<'a>(
    required: &'a mut Option<Vec<PodAffinityTerm>>,
    preferred: &'a mut Option<Vec<WeightedPodAffinityTerm>>,
) -> impl Iterator<Item = &'a mut PodAffinityTerm> {
    let preferred = preferred
        .iter_mut()
        .flatten()
        .map(|w| &mut w.pod_affinity_term);
    required.iter_mut().flatten().chain(preferred)
}

fn confine_pod_terms(spec: &mut PodSpec, key: &TenantKey) {
    if let Some(a) = &mut spec.affinity {
        for p in a.pod_affinity.iter_mut() {
            let (req, pref) = (
                &mut p.required_during_scheduling_ignored_during_execution,
                &mut p.preferred_during_scheduling_ignored_during_execution,
            );
            terms(req, pref).for_each(|t| term_to_host(t, key));
        }
        for p in a.pod_anti_affinity.iter_mut() {
            let (req, pref) = (
                &mut p.required_during_scheduling_ignored_during_execution,
                &mut p.preferred_during_scheduling_ignored_during_execution,
            );
            terms(req, pref).for_each(|t| term_to_host(t, key));
        }
    }
    for c in spec.topology_spread_constraints.iter_mut().flatten() {
        c.label_selector = c.label_selector.as_ref().map(selector_to_host);
        for k in c.match_label_keys.iter_mut().flatten() {
            *k = naming::key_to_host(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key() -> TenantKey {
        TenantKey::new("demo").unwrap()
    }

    fn pool() -> Placement {
        serde_yaml::from_str(
            r#"
node_selector: {type: kwok}
tolerations: [{key: pool, operator: Equal, value: tenants, effect: NoSchedule}]
avoid_node_labels: {vcp.dev/runtime: process}
"#,
        )
        .unwrap()
    }

    fn spec(v: serde_json::Value) -> PodSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_chosen_node_selector_and_tolerations_cannot_leave_the_pool() {
        let mut s = spec(serde_json::json!({
            "containers": [],
            "nodeName": "devnode-0",
            "nodeSelector": {"type": "control-plane", "zone": "a"},
            "tolerations": [
                {"operator": "Exists"},
                {"key": "vcp.dev/runtime", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
            ],
        }));
        let notes = confine(&mut s, &key(), &pool(), &Scheduling::default());
        assert_eq!(s.node_name, None, "the host scheduler binds");
        let sel = s.node_selector.clone().unwrap();
        assert_eq!(sel["type"], "kwok", "the pool wins");
        assert_eq!(sel["zone"], "a", "the tenant may narrow");
        let keys: Vec<_> = s
            .tolerations
            .clone()
            .unwrap()
            .into_iter()
            .map(|t| t.key.unwrap_or_default())
            .collect();
        assert_eq!(keys, ["node.kubernetes.io/not-ready", "pool"]);
        assert!(
            notes.iter().any(|n| n.contains("*, vcp.dev/runtime")),
            "{notes:?}"
        );
        assert!(notes.iter().any(|n| n.contains("type=control-plane")));
        assert!(
            !notes.iter().any(|n| n.contains("nodeName")),
            "a chosen node is honoured, not dropped: {notes:?}"
        );
        let terms = s
            .affinity
            .unwrap()
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 1);
        let e = &terms[0].match_expressions.as_ref().unwrap()[0];
        assert_eq!(
            (
                e.key.as_str(),
                e.operator.as_str(),
                e.values.clone().unwrap()
            ),
            ("vcp.dev/runtime", "NotIn", vec!["process".to_owned()])
        );
        // The chosen node, by name, beside the pool: the host scheduler checks both.
        let f = &terms[0].match_fields.as_ref().unwrap()[0];
        assert_eq!(
            (
                f.key.as_str(),
                f.operator.as_str(),
                f.values.clone().unwrap()
            ),
            ("metadata.name", "In", vec!["devnode-0".to_owned()])
        );
    }

    #[test]
    fn a_pool_node_is_selected_not_avoided_and_tolerated_whatever_its_state() {
        let placement: Placement = serde_yaml::from_str(
            "node_selector: {pool: workloads}\n\
             tolerations: [{key: pool, operator: Equal, value: workloads, effect: NoSchedule}]\n\
             avoid_node_labels: {vcp.dev/control-plane: 'true'}\n",
        )
        .unwrap();
        let node = |labels: serde_json::Value, taints: serde_json::Value| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "n", "labels": labels},
                "spec": {"taints": taints},
            }))
            .unwrap()
        };
        let pool = serde_json::json!({"pool": "workloads"});
        let own_taint =
            serde_json::json!([{"key": "pool", "value": "workloads", "effect": "NoSchedule"}]);
        assert!(in_pool(&node(pool.clone(), own_taint), &placement));
        assert!(
            !in_pool(
                &node(serde_json::json!({"pool": "batch"}), serde_json::json!([])),
                &placement
            ),
            "another pool"
        );
        assert!(
            !in_pool(
                &node(
                    serde_json::json!({"pool": "workloads", "vcp.dev/control-plane": "true"}),
                    serde_json::json!([])
                ),
                &placement
            ),
            "runs control planes"
        );
        assert!(
            !in_pool(
                &node(
                    pool.clone(),
                    serde_json::json!([{"key": "gpu", "effect": "NoSchedule"}])
                ),
                &placement
            ),
            "tainted for others"
        );
        assert!(
            !in_pool(
                &node(
                    pool.clone(),
                    serde_json::json!([{"key": "pool", "value": "batch", "effect": "NoExecute"}])
                ),
                &placement
            ),
            "the plan tolerates another value"
        );
        assert!(
            in_pool(
                &node(
                    pool.clone(),
                    serde_json::json!([
                        {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
                        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                        {"key": "spot", "effect": "PreferNoSchedule"},
                    ])
                ),
                &placement
            ),
            "not Ready, cordoned or disliked: still a node of the pool"
        );
        let anything: Placement =
            serde_yaml::from_str("tolerations: [{operator: Exists}]").unwrap();
        assert!(in_pool(
            &node(
                serde_json::json!({}),
                serde_json::json!([{"key": "x", "effect": "NoExecute"}])
            ),
            &anything
        ));
    }

    #[test]
    fn every_alternative_node_term_excludes_control_plane_nodes() {
        let mut s = spec(serde_json::json!({
            "containers": [],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["devnode-0"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["devnode-0"]}]},
            ]}}},
        }));
        confine(&mut s, &key(), &pool(), &Scheduling::default());
        let terms = s
            .affinity
            .unwrap()
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 2);
        for t in terms {
            assert!(
                t.match_expressions
                    .unwrap()
                    .iter()
                    .any(|e| e.key == "vcp.dev/runtime" && e.operator == "NotIn")
            );
        }
    }

    #[test]
    fn pod_affinity_terms_see_only_the_tenants_pods() {
        let mut s = spec(serde_json::json!({
            "containers": [],
            "affinity": {
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                    "labelSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
                    "namespaceSelector": {},
                    "topologyKey": "kubernetes.io/hostname",
                }]},
                "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                    "weight": 1,
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": {"vcp.dev/tenant": "other"}},
                        "namespaces": ["db"],
                        "matchLabelKeys": ["vcp.dev/x"],
                        "topologyKey": "zone",
                    },
                }]},
            },
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"vcp.dev/tenant": "x"}}}],
        }));
        confine(
            &mut s,
            &key(),
            &Placement::default(),
            &Scheduling::default(),
        );
        let a = s.affinity.unwrap();
        assert_eq!(
            vcp_fixtures::anti_affinity_tenant(&a, LABEL_TENANT).as_deref(),
            Some("demo"),
            "an empty namespace selector means every namespace of this tenant only"
        );
        let pref = &a
            .pod_affinity
            .unwrap()
            .preferred_during_scheduling_ignored_during_execution
            .unwrap()[0]
            .pod_affinity_term;
        assert_eq!(pref.namespaces.clone().unwrap(), ["demo-db"]);
        let labels = pref
            .label_selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap();
        assert!(labels.contains_key("t.vcp.dev/tenant") && !labels.contains_key(LABEL_TENANT));
        assert_eq!(pref.match_label_keys.clone().unwrap(), ["t.vcp.dev/x"]);
        let spread = &s.topology_spread_constraints.unwrap()[0];
        assert!(
            spread
                .label_selector
                .as_ref()
                .unwrap()
                .match_labels
                .as_ref()
                .unwrap()
                .contains_key("t.vcp.dev/tenant")
        );
    }

    #[test]
    fn priority_classes_map_to_plan_classes_or_are_dropped_and_runtime_classes_are_checked() {
        let scheduling: Scheduling = serde_yaml::from_str(
            "priority_classes: {high: tenant-high}\nruntime_classes: [gvisor]",
        )
        .unwrap();
        let mut s = spec(
            serde_json::json!({"containers": [], "priorityClassName": "high", "priority": 1000000, "preemptionPolicy": "Never"}),
        );
        assert!(confine(&mut s, &key(), &Placement::default(), &scheduling).is_empty());
        assert_eq!(s.priority_class_name.as_deref(), Some("tenant-high"));
        assert_eq!((s.priority, s.preemption_policy.clone()), (None, None));
        let mut s = spec(
            serde_json::json!({"containers": [], "priorityClassName": "system-node-critical"}),
        );
        let notes = confine(&mut s, &key(), &Placement::default(), &scheduling);
        assert_eq!(s.priority_class_name, None);
        assert!(notes[0].contains("system-node-critical"));

        let runc =
            spec(serde_json::json!({"containers": [], "runtimeClassName": "runc-privileged"}));
        let refused = runtime_class(&runc, Some("runc"), &scheduling).unwrap_err();
        assert_eq!(refused.field, "spec.runtimeClassName");
        assert!(
            refused.message.contains("handler runc"),
            "{}",
            refused.message
        );
        let gvisor = spec(serde_json::json!({"containers": [], "runtimeClassName": "gvisor"}));
        assert_eq!(
            runtime_class(&gvisor, None, &scheduling)
                .unwrap()
                .as_deref(),
            Some("gvisor")
        );
        let none = spec(serde_json::json!({"containers": []}));
        assert_eq!(runtime_class(&none, Some("runc"), &scheduling), Ok(None));
    }

    #[test]
    fn a_tenant_class_maps_to_a_host_class_by_its_handler() {
        let scheduling: Scheduling = serde_yaml::from_str(
            "runtime_classes: [gvisor]\nruntime_handlers: {test-handler: e2e-handler}",
        )
        .unwrap();
        let own =
            spec(serde_json::json!({"containers": [], "runtimeClassName": "runtimeclass-x7k2"}));
        // The tenant named its class freely: its handler decides.
        assert_eq!(
            runtime_class(&own, Some("test-handler"), &scheduling)
                .unwrap()
                .as_deref(),
            Some("e2e-handler")
        );
        // Another handler, or a class the tenant does not define, is refused and says which
        // handlers would do.
        let other = runtime_class(&own, Some("kata"), &scheduling).unwrap_err();
        assert!(other.message.contains("any class of handler test-handler"));
        assert!(runtime_class(&own, None, &scheduling).is_err());
        // A class listed by name keeps its name whatever its handler.
        let gvisor = spec(serde_json::json!({"containers": [], "runtimeClassName": "gvisor"}));
        assert_eq!(
            runtime_class(&gvisor, Some("test-handler"), &scheduling)
                .unwrap()
                .as_deref(),
            Some("gvisor")
        );
    }

    fn arb_toleration() -> impl Strategy<Value = Toleration> {
        (
            prop_oneof![
                Just(None),
                Just(Some(String::new())),
                Just(Some("vcp.dev/runtime".to_owned())),
                Just(Some("node.kubernetes.io/not-ready".to_owned())),
                Just(Some("pool".to_owned()))
            ],
            prop_oneof![Just("Exists"), Just("Equal")],
        )
            .prop_map(|(key, op)| Toleration {
                key,
                operator: Some(op.into()),
                ..Default::default()
            })
    }

    proptest! {
        /// Whatever the tenant writes, the host pod carries the pool's selector, excludes the
        /// control-plane nodes in every term, names no node (a chosen one is a requirement in
        /// every term instead), and tolerates nothing beyond the plan's tolerations and the keys
        /// the plan leaves to the tenant.
        #[test]
        fn placement_always_stays_in_the_pool(
            node_name in proptest::option::of("[a-z0-9-]{1,12}"),
            own_selector in proptest::collection::btree_map(
                prop_oneof![Just("type".to_owned()), Just("vcp.dev/runtime".to_owned()), "[a-z]{1,4}"],
                "[a-z]{1,6}", 0..4),
            tolerations in proptest::collection::vec(arb_toleration(), 0..5),
            terms in proptest::collection::vec(
                proptest::collection::vec(("[a-z/.]{1,10}", prop_oneof![Just("In"), Just("NotIn"), Just("Exists")]), 0..3),
                0..3),
        ) {
            let mut s = PodSpec {
                node_name,
                node_selector: Some(own_selector),
                tolerations: Some(tolerations),
                ..Default::default()
            };
            if !terms.is_empty() {
                s.affinity = Some(Affinity { node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: terms.into_iter().map(|es| NodeSelectorTerm {
                            match_expressions: Some(es.into_iter().map(|(k, op)| NodeSelectorRequirement {
                                key: k, operator: op.into(), values: None }).collect()),
                            match_fields: None,
                        }).collect(),
                    }),
                    ..Default::default()
                }), ..Default::default() });
            }
            let p = pool();
            let named = s.node_name.clone();
            confine(&mut s, &key(), &p, &Scheduling::default());
            prop_assert!(s.node_name.is_none());
            let sel = s.node_selector.clone().unwrap_or_default();
            for (k, v) in &p.node_selector {
                prop_assert_eq!(sel.get(k), Some(v));
            }
            for t in s.tolerations.clone().unwrap_or_default() {
                let plan = p.tolerations.contains(&t);
                let own = t.key.as_ref().is_some_and(|k| p.tenant_toleration_keys.contains(k));
                prop_assert!(plan || own, "{:?}", t);
            }
            let terms = s.affinity.unwrap().node_affinity.unwrap()
                .required_during_scheduling_ignored_during_execution.unwrap().node_selector_terms;
            prop_assert!(!terms.is_empty());
            for t in terms {
                prop_assert!(t.match_expressions.unwrap_or_default().iter().any(|e|
                    e.key == "vcp.dev/runtime" && e.operator == "NotIn"
                        && e.values.as_deref() == Some(&["process".to_owned()][..])));
                // A chosen node holds in every alternative; no other node is ever named.
                let fields = t.match_fields.unwrap_or_default();
                match &named {
                    Some(n) => prop_assert!(fields.iter().any(|f| f.key == "metadata.name"
                        && f.operator == "In" && f.values.as_deref() == Some(std::slice::from_ref(n)))),
                    None => prop_assert!(fields.is_empty()),
                }
            }
        }
    }
}
