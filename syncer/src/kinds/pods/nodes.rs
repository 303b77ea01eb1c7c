//! Virtual nodes: the tenant's view of the host nodes its pods may run on. By default a tenant
//! sees every node of its plan's pool from the start ([`in_pool`]), as a real cluster lists its
//! nodes before any pod runs; with `placement.virtual_nodes: used`, only the nodes its pods run
//! on. A tenant pod is bound to the virtual node named after its host pod's node
//! ([`super::up`]), created then if need be (`ensure_virtual_node`). The upkeep
//! ([`virtual_nodes`]) creates the pool's nodes, mirrors each one's status from its host node
//! when it changed, and removes a virtual node once it is neither in the pool nor used. The
//! syncer also keeps the taints a node lifecycle controller would ([`lifecycle_taints`]):
//! tenants run none.
//!
//! With a kubelet endpoint ([`crate::kubelet`]), every virtual node carries that endpoint's
//! address and port instead of the host node's, so the tenant apiserver's `logs`, `exec`,
//! `attach` and `port-forward` go to the syncer, never to a host node.

use super::PodCtx;
use crate::engine::{Engine, FIELD_MANAGER, shared::Cache};
use crate::{Result, kube_err};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use vcp_policy::VirtualNodes;
use vcp_policy::placement::in_pool;

/// Label on virtual nodes the syncer created in the tenant.
pub const VIRTUAL_NODE_LABEL: &str = "vcp.dev/virtual-node";

/// Where the tenant apiserver reaches the syncer's kubelet endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletEndpoint {
    /// A host name (`vcp-syncer.<ns>.svc`) or an IP address.
    pub address: String,
    pub port: u16,
}

impl KubeletEndpoint {
    /// The node address naming the endpoint: `InternalIP` for an IP, `Hostname` otherwise.
    fn node_address(&self) -> k8s_openapi::api::core::v1::NodeAddress {
        let type_ = if self.address.parse::<std::net::IpAddr>().is_ok() {
            "InternalIP"
        } else {
            "Hostname"
        };
        k8s_openapi::api::core::v1::NodeAddress {
            type_: type_.into(),
            address: self.address.clone(),
        }
    }
}

/// The tenant view of a host node: its name, non-reserved labels, Ready condition, capacity
/// and internal addresses; nothing that would let a tenant address the host (no taints,
/// no external addresses, no daemon endpoints). With a kubelet endpoint, its address and port
/// come first: the tenant apiserver prefers a `Hostname`, and an endpoint named by IP is the
/// first `InternalIP`. The node's own `InternalIP` stays after it, as a real node lists it:
/// it is where the tenant's NodePort Services answer (the tenant's pods see it as their
/// `hostIP` anyway).
pub fn virtual_node(host: &Node, kubelet: Option<&KubeletEndpoint>) -> Node {
    let name = host.name_any();
    let mut labels: std::collections::BTreeMap<String, String> = host
        .labels()
        .iter()
        .filter(|(k, _)| {
            k.starts_with("kubernetes.io/")
                || k.starts_with("topology.kubernetes.io/")
                || k.starts_with("node.kubernetes.io/instance-type")
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.insert(VIRTUAL_NODE_LABEL.into(), "true".into());
    let status = host
        .status
        .clone()
        .map(|s| k8s_openapi::api::core::v1::NodeStatus {
            addresses: s.addresses.map(|a| {
                a.into_iter()
                    .filter(|a| a.type_ == "InternalIP" || a.type_ == "Hostname")
                    .collect()
            }),
            allocatable: s.allocatable,
            capacity: s.capacity,
            conditions: s.conditions,
            node_info: s.node_info,
            phase: s.phase,
            ..Default::default()
        })
        .map(|mut s| {
            if let Some(k) = kubelet {
                let own = s.addresses.take().unwrap_or_default();
                let internal = own.into_iter().filter(|a| a.type_ == "InternalIP");
                s.addresses = Some(std::iter::once(k.node_address()).chain(internal).collect());
                s.daemon_endpoints = Some(k8s_openapi::api::core::v1::NodeDaemonEndpoints {
                    kubelet_endpoint: Some(k8s_openapi::api::core::v1::DaemonEndpoint {
                        port: i32::from(k.port),
                    }),
                });
            }
            s
        });
    Node {
        metadata: kube::api::ObjectMeta {
            name: Some(name),
            labels: Some(labels),
            ..Default::default()
        },
        spec: None,
        status,
    }
}

/// The taint the apiserver puts on every node it creates, and that a node lifecycle controller
/// keeps in step with the node's Ready condition from then on.
pub const NOT_READY: &str = "node.kubernetes.io/not-ready";
/// The lifecycle controller's taint for a node that stopped reporting.
pub const UNREACHABLE: &str = "node.kubernetes.io/unreachable";

/// Whether a node's Ready condition is True.
pub fn is_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The taints a virtual node should carry when its host node is `ready`, if they differ from
/// `current`'s. A tenant runs no node lifecycle controller (its controller-manager runs without
/// `nodelifecycle`: its nodes are the syncer's), so the syncer does that part of its work for
/// virtual nodes: a Ready node carries neither [`NOT_READY`] nor [`UNREACHABLE`], a node that
/// is not Ready carries [`NOT_READY`] (`NoSchedule`). Without this, the `not-ready` taint the
/// apiserver adds at creation would stay, and clients that schedule by taints (the conformance
/// suite counts schedulable nodes) would see no node they may use. Other taints, a tenant's
/// own, are kept.
pub fn lifecycle_taints(current: &Node, ready: bool) -> Option<Vec<Taint>> {
    let taints = current
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let ours = |t: &Taint| t.key == NOT_READY || t.key == UNREACHABLE;
    let want: Vec<Taint> = if ready {
        taints.iter().filter(|t| !ours(t)).cloned().collect()
    } else if taints.iter().any(|t| t.key == NOT_READY) {
        taints.clone()
    } else {
        let mut w = taints.clone();
        w.push(Taint {
            key: NOT_READY.to_owned(),
            effect: "NoSchedule".to_owned(),
            ..Default::default()
        });
        w
    };
    (want != taints).then_some(want)
}

/// Gives virtual node `current` the taints its readiness calls for ([`lifecycle_taints`]).
async fn keep_taints(e: &Engine, current: &Node, ready: bool) -> Result<()> {
    let Some(taints) = lifecycle_taints(current, ready) else {
        return Ok(());
    };
    let name = current.name_any();
    let patch = serde_json::json!({"spec": {"taints": taints}});
    Api::<Node>::all(e.tenant.clone())
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kube_err(format!("set the taints of virtual node {name}")))?;
    Ok(())
}

/// Creates the virtual node `name` in the tenant unless it is known to exist.
pub(super) async fn ensure_virtual_node(e: &Engine, p: &PodCtx, name: &str) -> Result<()> {
    if p.known_nodes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(name)
    {
        return Ok(());
    }
    let tenant_nodes: Api<Node> = Api::all(e.tenant.clone());
    if tenant_nodes
        .get_opt(name)
        .await
        .map_err(kube_err(format!("get tenant node {name}")))?
        .is_some()
    {
        p.known_nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_owned());
        return Ok(());
    }
    let host = Api::<Node>::all(e.host.clone())
        .get(name)
        .await
        .map_err(kube_err(format!("get host node {name}")))?;
    let node = virtual_node(&host, p.kubelet_endpoint.as_ref());
    match tenant_nodes
        .create(
            &PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            },
            &node,
        )
        .await
    {
        // The apiserver tainted it `not-ready` as it does every new node.
        Ok(created) => keep_taints(e, &created, is_ready(&node)).await?,
        // Someone else's create; the upkeep below sets its taints.
        Err(kube::Error::Api(ae)) if ae.code == 409 => {}
        Err(err) => return Err(kube_err(format!("create virtual node {name}"))(err)),
    }
    refresh_virtual_node(e, &node).await?;
    p.known_nodes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(name.to_owned());
    Ok(())
}

async fn refresh_virtual_node(e: &Engine, node: &Node) -> Result<()> {
    let patch = serde_json::json!({"status": node.status});
    Api::<Node>::all(e.tenant.clone())
        .patch_status(
            &node.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(kube_err(format!("update virtual node {}", node.name_any())))?;
    Ok(())
}

/// Keeps virtual nodes in step, every `period`: one per node of the plan's pool (with
/// [`VirtualNodes::Pool`], the default) and one per node a tenant pod is bound to; each one's
/// status mirrored from its host node when it differs, and its lifecycle taints kept; any other
/// virtual node removed. The pool comes from a watch of the host nodes that carry the pool's
/// labels, slimmed to what a virtual node shows, so the upkeep asks the host nothing per node.
pub async fn virtual_nodes(
    e: Arc<Engine>,
    p: Arc<PodCtx>,
    tenant_pods: Cache<Pod>,
    period: Duration,
) {
    let placement = &e.ctx.policy.placement;
    let (hosts, writer) = reflector::store::<Node>();
    let watch = async {
        if placement.virtual_nodes != VirtualNodes::Pool {
            return futures::future::pending().await;
        }
        let labels: Vec<String> = placement
            .node_selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let cfg = watcher::Config::default().labels(&labels.join(","));
        reflector(
            writer,
            watcher(Api::<Node>::all(e.host.clone()), cfg)
                .default_backoff()
                .modify(slim),
        )
        .for_each(|ev| {
            if let Err(err) = ev {
                tracing::warn!(error = %err, "host node watch failed; retrying");
            }
            futures::future::ready(())
        })
        .await
    };
    let upkeep = async {
        tenant_pods.ready().await;
        if placement.virtual_nodes == VirtualNodes::Pool {
            let _ = hosts.wait_until_ready().await;
        }
        loop {
            if let Err(err) = virtual_nodes_once(&e, &p, &tenant_pods, &hosts).await {
                tracing::warn!(error = %err, "virtual node upkeep failed");
            }
            tokio::time::sleep(period).await;
        }
    };
    futures::join!(watch, upkeep);
}

/// A host node as the pool watch keeps it: what [`virtual_node`] and [`in_pool`] read.
fn slim(n: &mut Node) {
    n.metadata.managed_fields = None;
    n.metadata.annotations = None;
    if let Some(s) = n.status.as_mut() {
        s.images = None;
        s.volumes_attached = None;
        s.volumes_in_use = None;
        s.config = None;
    }
}

/// The part of a node's status a virtual node mirrors, heartbeats aside: a heartbeat alone
/// is no reason to write to the tenant (the host's kubelets beat every few seconds and
/// nothing in a tenant reads the beat; there is no node lifecycle controller there).
fn mirrored(n: &Node) -> Option<k8s_openapi::api::core::v1::NodeStatus> {
    n.status
        .as_ref()
        .map(|s| k8s_openapi::api::core::v1::NodeStatus {
            addresses: s.addresses.clone(),
            allocatable: s.allocatable.clone(),
            capacity: s.capacity.clone(),
            conditions: s.conditions.clone().map(|cs| {
                cs.into_iter()
                    .map(|mut c| {
                        c.last_heartbeat_time = None;
                        c
                    })
                    .collect()
            }),
            daemon_endpoints: s.daemon_endpoints.clone(),
            node_info: s.node_info.clone(),
            phase: s.phase.clone(),
            ..Default::default()
        })
}

/// Whether tenant node `current` shows other than `want` (a virtual node as it should be).
pub fn status_differs(current: &Node, want: &Node) -> bool {
    mirrored(current) != mirrored(want)
}

async fn virtual_nodes_once(
    e: &Engine,
    p: &PodCtx,
    tenant_pods: &Store<Pod>,
    hosts: &Store<Node>,
) -> Result<()> {
    let placement = &e.ctx.policy.placement;
    let pool: BTreeMap<String, Arc<Node>> = hosts
        .state()
        .into_iter()
        .filter(|n| in_pool(n, placement))
        .map(|n| (n.name_any(), n))
        .collect();
    let used: BTreeSet<String> = tenant_pods
        .state()
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    let tenant_nodes: Api<Node> = Api::all(e.tenant.clone());
    let list = tenant_nodes
        .list(&ListParams::default().labels(&format!("{VIRTUAL_NODE_LABEL}=true")))
        .await
        .map_err(kube_err("list virtual nodes".into()))?;
    let mut present = BTreeSet::new();
    for n in list.items {
        let name = n.name_any();
        present.insert(name.clone());
        if !used.contains(&name) && !pool.contains_key(&name) {
            tracing::info!(node = %name, "virtual node of no pool node and no tenant pod; removing it");
            p.known_nodes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&name);
            let _ = tenant_nodes.delete(&name, &DeleteParams::default()).await;
            continue;
        }
        let host = match pool.get(&name) {
            Some(h) => Some(h.as_ref().clone()),
            None => Api::<Node>::all(e.host.clone())
                .get_opt(&name)
                .await
                .map_err(kube_err(format!("get host node {name}")))?,
        };
        if let Some(host) = host {
            let v = virtual_node(&host, p.kubelet_endpoint.as_ref());
            keep_taints(e, &n, is_ready(&v)).await?;
            if status_differs(&n, &v) {
                refresh_virtual_node(e, &v).await?;
            }
        }
    }
    // Nodes the tenant should see and does not (new pool nodes, or one its admin deleted).
    for name in pool.keys().chain(used.iter()) {
        if present.contains(name) {
            continue;
        }
        p.known_nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
        if let Err(err) = ensure_virtual_node(e, p, name).await {
            tracing::warn!(node = %name, error = %err, "cannot create virtual node");
        }
        present.insert(name.clone());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_virtual_node_is_tainted_not_ready_exactly_while_its_host_node_is_not_ready() {
        let node = |taints: serde_json::Value| -> Node {
            serde_json::from_value(
                serde_json::json!({"metadata": {"name": "n"}, "spec": {"taints": taints}}),
            )
            .unwrap()
        };
        let keys = |ts: Vec<Taint>| -> Vec<String> { ts.into_iter().map(|t| t.key).collect() };
        // As the apiserver creates it, with a taint of the tenant's own.
        let created = node(serde_json::json!([
            {"key": NOT_READY, "effect": "NoSchedule"},
            {"key": "team", "value": "a", "effect": "NoSchedule"},
            {"key": UNREACHABLE, "effect": "NoExecute"},
        ]));
        assert_eq!(keys(lifecycle_taints(&created, true).unwrap()), ["team"]);
        assert_eq!(lifecycle_taints(&node(serde_json::json!([])), true), None);
        assert_eq!(
            keys(
                lifecycle_taints(
                    &node(serde_json::json!([{"key": "team", "effect": "NoSchedule"}])),
                    false
                )
                .unwrap()
            ),
            ["team", NOT_READY]
        );
        assert_eq!(lifecycle_taints(&created, false), None, "already not-ready");
        let untainted: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}})).unwrap();
        assert_eq!(
            keys(lifecycle_taints(&untainted, false).unwrap()),
            [NOT_READY]
        );
        assert!(!is_ready(&untainted));
    }

    #[test]
    fn a_heartbeat_alone_is_not_written_to_the_tenant() {
        let host = |beat: &str, ready: &str| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "n", "managedFields": [{"manager": "kubelet"}]},
                "status": {
                    "conditions": [{"type": "Ready", "status": ready, "lastHeartbeatTime": beat,
                                    "lastTransitionTime": "2026-11-28T00:00:00Z"}],
                    "capacity": {"cpu": "4"},
                    "images": [{"names": ["registry.example/other-tenant:1"], "sizeBytes": 1}],
                },
            }))
            .unwrap()
        };
        let shown = virtual_node(&host("2026-11-28T01:00:00Z", "True"), None);
        let beat = virtual_node(&host("2026-11-28T01:00:10Z", "True"), None);
        assert!(!status_differs(&shown, &beat));
        let down = virtual_node(&host("2026-11-28T01:00:10Z", "False"), None);
        assert!(status_differs(&shown, &down));
        // A tenant admin's edit of a virtual node's address is put back.
        let k = KubeletEndpoint {
            address: "vcp-syncer.vcp-demo.svc".into(),
            port: 10250,
        };
        let mut edited = virtual_node(&host("2026-11-28T01:00:00Z", "True"), Some(&k));
        edited.status.as_mut().unwrap().addresses = Some(vec![]);
        assert!(status_differs(
            &edited,
            &virtual_node(&host("2026-11-28T01:00:00Z", "True"), Some(&k))
        ));
        // The pool watch keeps no more of a host node than a virtual node shows.
        let mut n = host("2026-11-28T01:00:00Z", "True");
        slim(&mut n);
        assert!(n.metadata.managed_fields.is_none());
        assert!(n.status.unwrap().images.is_none());
    }

    #[test]
    fn virtual_nodes_hide_host_addresses_taints_and_private_labels() {
        let host: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kwok-node-1", "labels": {"kubernetes.io/hostname": "kwok-node-1", "vcp.dev/tenant": "x", "team": "infra"}},
            "spec": {"taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}], "podCIDR": "10.244.1.0/24"},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "10.250.0.2"}, {"type": "ExternalIP", "address": "203.0.113.9"}],
                "conditions": [{"type": "Ready", "status": "True"}],
                "capacity": {"cpu": "32"},
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            },
        }))
        .unwrap();
        let v = virtual_node(&host, None);
        assert_eq!(v.name_any(), "kwok-node-1");
        assert!(v.spec.is_none(), "no taints or pod CIDR of the host");
        let labels = v.labels();
        assert_eq!(labels[VIRTUAL_NODE_LABEL], "true");
        assert!(
            labels.contains_key("kubernetes.io/hostname")
                && !labels.contains_key("team")
                && !labels.contains_key("vcp.dev/tenant")
        );
        let status = v.status.unwrap();
        assert_eq!(status.addresses.unwrap().len(), 1);
        assert!(status.daemon_endpoints.is_none());
        assert_eq!(status.conditions.unwrap()[0].status, "True");

        // With a kubelet endpoint: its address and port first, then the node's internal
        // address (where NodePorts answer), never its external one.
        for (address, type_) in [
            ("vcp-syncer.vcp-demo.svc", "Hostname"),
            ("127.0.0.1", "InternalIP"),
        ] {
            let k = KubeletEndpoint {
                address: address.into(),
                port: 10250,
            };
            let s = virtual_node(&host, Some(&k)).status.unwrap();
            let a = s.addresses.unwrap();
            assert_eq!(
                (a.len(), a[0].type_.as_str(), a[0].address.as_str()),
                (2, type_, address)
            );
            assert_eq!(
                (a[1].type_.as_str(), a[1].address.as_str()),
                ("InternalIP", "10.250.0.2")
            );
            assert_eq!(
                s.daemon_endpoints.unwrap().kubelet_endpoint.unwrap().port,
                10250
            );
        }
    }
}
