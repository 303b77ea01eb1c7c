//! The devnode's Node object and its heartbeat.
//!
//! The Node carries the label `vcp.dev/runtime=process` and the taint
//! `vcp.dev/runtime=process:NoSchedule`, so only pods that ask for it (the control-plane
//! templates) land here; kwok never manages it (no kwok annotation). Its InternalIP is
//! 127.0.0.1: that is where its NodePorts listen for the host (pods reach them on the
//! gateway, see [`crate::forward`]). With a kubelet endpoint ([`crate::kubelet`])
//! it also names `localhost` (InternalDNS, which the host apiserver prefers and the serving
//! certificate names) and publishes the port in `daemonEndpoints`. Every 10 s the Lease in
//! `kube-node-lease` is renewed and the Ready condition refreshed.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use std::time::Duration;

/// Label and taint key of process-running nodes.
pub const RUNTIME_KEY: &str = "vcp.dev/runtime";
/// Its value.
pub const RUNTIME_VALUE: &str = "process";
const MANAGER: &str = "vcp-devnode";
const HEARTBEAT: Duration = Duration::from_secs(10);

/// Registers (or re-registers) the node.
pub async fn register(
    client: &Client,
    name: &str,
    pod_cidr: &str,
    version: &str,
    kubelet_port: Option<u16>,
) -> kube::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PatchParams::apply(MANAGER).force();
    let node = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                RUNTIME_KEY: RUNTIME_VALUE,
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "devnode",
            },
            "annotations": {"vcp.dev/pod-cidr": pod_cidr},
        },
        "spec": {"taints": [{"key": RUNTIME_KEY, "value": RUNTIME_VALUE, "effect": "NoSchedule"}]},
    });
    nodes.patch(name, &pp, &Patch::Apply(&node)).await?;
    heartbeat(client, name, version, kubelet_port).await
}

/// Refreshes status (Ready) and the Lease.
pub async fn heartbeat(
    client: &Client,
    name: &str,
    version: &str,
    kubelet_port: Option<u16>,
) -> kube::Result<()> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let capacity = serde_json::json!({"cpu": cpus.to_string(), "memory": "16Gi", "pods": "110"});
    let condition = |type_: &str, status: &str, reason: &str| {
        serde_json::json!({"type": type_, "status": status, "reason": reason, "message": "",
            "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let mut addresses = vec![
        serde_json::json!({"type": "InternalIP", "address": "127.0.0.1"}),
        serde_json::json!({"type": "Hostname", "address": name}),
    ];
    if kubelet_port.is_some() {
        addresses.insert(
            0,
            serde_json::json!({"type": "InternalDNS", "address": "localhost"}),
        );
    }
    let status = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "status": {
            "addresses": addresses,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port.unwrap_or(0)}},
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [
                condition("Ready", "True", "KubeletReady"),
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
            ],
            "nodeInfo": {"kubeletVersion": version, "architecture": "amd64", "operatingSystem": "linux",
                "containerRuntimeVersion": "vcp-devnode://process", "bootID": "", "kernelVersion": "",
                "kubeProxyVersion": "", "machineID": "", "osImage": "", "systemUUID": ""},
        },
    });
    let nodes: Api<Node> = Api::all(client.clone());
    // lastTransitionTime is rewritten each beat; nobody reads it in the dev cluster.
    nodes
        .patch_status(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&status),
        )
        .await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.to_owned()),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ..Default::default()
        }),
    };
    leases
        .patch(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&lease),
        )
        .await?;
    Ok(())
}

/// Keeps the node alive until the future is dropped.
pub async fn keep_alive(client: Client, name: String, version: String, kubelet_port: Option<u16>) {
    loop {
        tokio::time::sleep(HEARTBEAT).await;
        if let Err(e) = heartbeat(&client, &name, &version, kubelet_port).await {
            tracing::warn!(node = %name, error = %e, "heartbeat failed");
        }
    }
}
