//! The pod's way down, decided: from what one pass read, whether a tenant pod may go down and
//! the host pod it becomes. Pure: [`super::down`] gathers the facts (the caches, the quota's
//! ledger, the tenant's ConfigMaps and Secrets), asks, and applies the answer with its writes.
//!
//! Two questions, in the order a pass can answer them:
//! - [`admit`]: may the pod go down at all? The plan (`vcp_policy::pods::admit`), whether it
//!   finished, and the tenant-wide quota, each asked once and in that order: a pod the plan
//!   refuses, or one that finished, never looks at the quota. Nothing of the pod is written
//!   before this says [`Admission::Go`].
//! - [`host_pod`]: the host pod, computed once per pass: the translation with its placement
//!   (and what placement changed, told to the tenant after the create) and the isolation
//!   labels the tenant's NetworkPolicies call for. Its service links are added
//!   (`translate::add_service_links`) once the references are copied, since which names
//!   envFrom defines depends on their keys.

use super::translate;
use crate::engine::quota::Verdict;
use crate::tenant::{Ctx, PodEnv};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use vcp_policy::{Refusal, network};

/// Whether a tenant pod may go down.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// Yes: copy its references, issue its token, take its quota share, create it.
    Go,
    /// The plan refuses it (`PolicyRefused`, told as any refusal).
    Refused(Vec<Refusal>),
    /// It finished (`Succeeded`, `Failed`): it never runs again and takes nothing.
    Finished,
    /// The quota holds it back, or cannot judge it yet.
    Quota(Verdict),
}

/// Whether `pod` may go down: the plan first, then whether it finished, then `quota` (the
/// ledger's verdict, asked only for a pod that got that far). `runtime_handler`: the handler
/// of the pod's RuntimeClass in the tenant, where the plan maps handlers.
pub fn admit(
    pod: &Pod,
    ctx: &Ctx,
    runtime_handler: Option<&str>,
    quota: impl FnOnce() -> Verdict,
) -> Admission {
    let refusals = vcp_policy::pods::admit(pod, &ctx.policy, runtime_handler);
    if !refusals.is_empty() {
        return Admission::Refused(refusals);
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return Admission::Finished;
    }
    match quota() {
        Verdict::Admitted => Admission::Go,
        other => Admission::Quota(other),
    }
}

/// Names on `host` the host RuntimeClass that the plan gives the class `tenant` names (its
/// own name, or the host class of its handler: `vcp_policy::placement::runtime_class`), for a
/// pod [`admit`] let through with the same `runtime_handler`.
pub fn set_runtime_class(host: &mut Pod, tenant: &Pod, ctx: &Ctx, runtime_handler: Option<&str>) {
    let (Some(hs), Some(ts)) = (host.spec.as_mut(), tenant.spec.as_ref()) else {
        return;
    };
    hs.runtime_class_name =
        vcp_policy::placement::runtime_class(ts, runtime_handler, &ctx.policy.scheduling)
            .ok()
            .flatten();
}

/// A tenant pod's host pod, and what placement changed of what the tenant asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredPod {
    pub pod: Pod,
    /// One sentence per adjustment (`PlacementAdjusted`, told once the host pod is created).
    pub notes: Vec<String>,
}

/// The host pod of `pod`: its translation (placement confined to the plan's pool) with the
/// isolation labels that `policies`, the tenant's NetworkPolicies in its namespace, call for.
pub fn host_pod(pod: &Pod, ctx: &Ctx, env: &PodEnv, policies: &[NetworkPolicy]) -> DesiredPod {
    let (mut host, notes) = translate::to_host_noting(pod, ctx, env);
    host.labels_mut()
        .extend(network::isolation_labels(pod.labels(), policies));
    DesiredPod { pod: host, notes }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::fixtures::ctx;
    use proptest::prelude::*;
    use std::cell::Cell;

    /// Tenant pods with what the decision reads: host namespaces and paths the plan refuses,
    /// a phase, labels NetworkPolicies select, and placement the plan confines.
    fn arb_tenant_pod() -> impl Strategy<Value = Pod> {
        (
            proptest::bool::weighted(0.2),
            proptest::bool::weighted(0.2),
            prop_oneof![Just(None), Just(Some("Running")), Just(Some("Succeeded")), Just(Some("Failed"))],
            0usize..3,
            proptest::bool::weighted(0.3),
            proptest::bool::weighted(0.3),
            proptest::bool::weighted(0.3),
        )
            .prop_map(|(host_net, host_path, phase, app, node_name, selector, forged)| {
                let mut spec = serde_json::json!({"containers": [{"name": "c", "image": "busybox"}]});
                if host_net {
                    spec["hostNetwork"] = serde_json::json!(true);
                }
                if host_path {
                    spec["volumes"] = serde_json::json!([{"name": "h", "hostPath": {"path": "/etc"}}]);
                }
                if node_name {
                    spec["nodeName"] = serde_json::json!("some-node");
                }
                if selector {
                    spec["nodeSelector"] = serde_json::json!({"disk": "ssd"});
                }
                let app = ["web", "db", "job"][app];
                let mut labels = serde_json::json!({ "app": app });
                if forged {
                    // A tenant's try at the isolation labels themselves.
                    labels[network::LABEL_INGRESS_ISOLATED] = serde_json::json!("false");
                    labels[network::LABEL_EGRESS_ISOLATED] = serde_json::json!("true");
                }
                let mut pod = serde_json::json!({
                    "metadata": {"name": "p", "namespace": "apps", "uid": "u1", "labels": labels},
                    "spec": spec,
                });
                if let Some(p) = phase {
                    pod["status"] = serde_json::json!({"phase": p});
                }
                serde_json::from_value(pod).unwrap()
            })
    }

    /// NetworkPolicies of namespace `apps` selecting some `app` label, for ingress or egress.
    fn arb_policies() -> impl Strategy<Value = Vec<NetworkPolicy>> {
        proptest::collection::vec((0usize..4, 0usize..3), 0..4).prop_map(|ps| {
            ps.into_iter()
                .enumerate()
                .map(|(i, (app, types))| {
                    let selector = match app {
                        3 => serde_json::json!({}),
                        a => {
                            let app = ["web", "db", "job"][a];
                            serde_json::json!({"matchLabels": {"app": app}})
                        }
                    };
                    let types =
                        [vec!["Ingress"], vec!["Egress"], vec!["Ingress", "Egress"]][types].clone();
                    serde_json::from_value(serde_json::json!({
                        "metadata": {"name": format!("np{i}"), "namespace": "apps"},
                        "spec": {"podSelector": selector, "policyTypes": types},
                    }))
                    .unwrap()
                })
                .collect()
        })
    }

    fn arb_verdict() -> impl Strategy<Value = Verdict> {
        prop_oneof![
            Just(Verdict::Admitted),
            Just(Verdict::NotReady),
            Just(Verdict::Refused(vec![Refusal::new(
                "pods",
                "plan: quota",
                "over"
            )])),
        ]
    }

    proptest! {
        /// A pod goes down exactly when the plan admits it, it has not finished and the quota
        /// admits it; the quota is asked only for a pod the plan admits and that still runs.
        #[test]
        fn a_pod_goes_down_only_past_the_plan_its_phase_and_the_quota(
            pod in arb_tenant_pod(),
            verdict in arb_verdict(),
        ) {
            let ctx = ctx();
            let asked = Cell::new(false);
            let got = admit(&pod, &ctx, None, || { asked.set(true); verdict.clone() });
            let refusals = vcp_policy::pods::admit(&pod, &ctx.policy, None);
            let finished = matches!(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            );
            let expected = if !refusals.is_empty() {
                Admission::Refused(refusals)
            } else if finished {
                Admission::Finished
            } else if verdict == Verdict::Admitted {
                Admission::Go
            } else {
                Admission::Quota(verdict.clone())
            };
            prop_assert_eq!(&got, &expected);
            prop_assert_eq!(asked.get(), !matches!(got, Admission::Refused(_) | Admission::Finished));
        }

        /// The host pod is the translation, with the isolation labels the namespace's policies
        /// call for and nothing else added, and placement's notes are what confining the
        /// tenant's spec reports: both worked out once, here.
        #[test]
        fn the_host_pod_is_the_translation_with_its_isolation_labels(
            pod in arb_tenant_pod(),
            policies in arb_policies(),
        ) {
            let (ctx, env) = (ctx(), PodEnv::default());
            let got = host_pod(&pod, &ctx, &env, &policies);
            let plain = translate::to_host(&pod, &ctx, &env);
            let isolation = network::isolation_labels(pod.labels(), &policies);
            let mut want_labels = plain.labels().clone();
            want_labels.extend(isolation.clone());
            prop_assert_eq!(got.pod.labels(), &want_labels);
            // The isolation labels are the policies' alone, whatever the tenant wrote.
            for k in [network::LABEL_INGRESS_ISOLATED, network::LABEL_EGRESS_ISOLATED] {
                prop_assert_eq!(got.pod.labels().get(k), isolation.get(k), "{}", k);
            }
            prop_assert_eq!(&got.pod.spec, &plain.spec);
            prop_assert_eq!(got.pod.annotations(), plain.annotations());
            let mut spec = pod.spec.clone().unwrap_or_default();
            let notes = vcp_policy::placement::confine(
                &mut spec,
                &ctx.key,
                &ctx.policy.placement,
                &ctx.policy.scheduling,
            );
            prop_assert_eq!(got.notes, notes);
            // Never the tenant's node: the host scheduler places it within the plan's pool.
            prop_assert!(got.pod.spec.as_ref().unwrap().node_name.is_none());
        }
    }
}
