//! A host pod as the syncer keeps it in memory: the fields it reads, and nothing else.
//!
//! The syncer caches every host pod of its tenant next to the tenant pod it came from. Held as
//! a full `Pod`, one small host pod took about 13 KB (k8s-openapi's types are wide: a
//! `Container` is 2.3 KB and a `Volume` 3.3 KB before any of their strings, and a host pod
//! carries the env, DNS settings and host aliases the translation added), more than the
//! tenant pod beside it. The watch decodes host pods straight into [`HostPod`]: metadata,
//! status, and of the spec only what a reconcile compares or reads (node, containers' names,
//! images and resources, ephemeral containers' names, the deadline, readiness gates, host
//! network). Fields the type does not name are skipped while decoding, never allocated.
//!
//! What needs a whole host pod (the body of a resize or of an ephemeral-container update, the
//! env and placement an apply must repeat) reads it from the host apiserver, on those rare
//! passes only.

use k8s_openapi::api::core::v1::{Pod, PodReadinessGate, PodStatus, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// A host pod, narrowed to what the syncer reads (see the module docs). Same API path as a
/// pod: it is listed, watched, read and deleted as one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostPod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<HostPodSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PodStatus>,
}

/// The part of a host pod's spec the syncer reads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostPodSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_network: Option<bool>,
    #[serde(default)]
    pub containers: Vec<HostContainer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_containers: Option<Vec<HostContainer>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_containers: Option<Vec<HostContainer>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_gates: Option<Vec<PodReadinessGate>>,
}

/// A container of a host pod: its name, image and resources.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostContainer {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

impl k8s_openapi::Resource for HostPod {
    const API_VERSION: &'static str = <Pod as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Pod as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Pod as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Pod as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Pod as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <Pod as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for HostPod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl HostPod {
    /// The node the host scheduled (or the create bound) the pod to.
    pub fn node_name(&self) -> Option<&str> {
        self.spec.as_ref()?.node_name.as_deref()
    }
}

impl From<&k8s_openapi::api::core::v1::Container> for HostContainer {
    fn from(c: &k8s_openapi::api::core::v1::Container) -> Self {
        HostContainer {
            name: c.name.clone(),
            image: c.image.clone(),
            resources: c.resources.clone(),
        }
    }
}

impl From<&Pod> for HostPod {
    /// The narrowed form of `pod`: what the watch would have decoded from it.
    fn from(pod: &Pod) -> Self {
        let spec = pod.spec.as_ref().map(|s| HostPodSpec {
            node_name: s.node_name.clone(),
            host_network: s.host_network,
            containers: s.containers.iter().map(HostContainer::from).collect(),
            init_containers: s
                .init_containers
                .as_ref()
                .map(|cs| cs.iter().map(HostContainer::from).collect()),
            ephemeral_containers: s.ephemeral_containers.as_ref().map(|cs| {
                cs.iter()
                    .map(|c| HostContainer {
                        name: c.name.clone(),
                        image: c.image.clone(),
                        resources: c.resources.clone(),
                    })
                    .collect()
            }),
            active_deadline_seconds: s.active_deadline_seconds,
            readiness_gates: s.readiness_gates.clone(),
        });
        HostPod {
            metadata: pod.metadata.clone(),
            spec,
            status: pod.status.clone(),
        }
    }
}

impl From<Pod> for HostPod {
    fn from(pod: Pod) -> Self {
        HostPod::from(&pod)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod_json() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "demo-apps", "uid": "u1", "resourceVersion": "7",
                         "labels": {"vcp.dev/tenant": "demo"}},
            "spec": {
                "nodeName": "n1", "hostNetwork": false, "activeDeadlineSeconds": 30,
                "readinessGates": [{"conditionType": "example.com/ready"}],
                "containers": [{"name": "c", "image": "busybox",
                                "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": "10.96.0.1"}],
                                "resources": {"requests": {"cpu": "100m"}},
                                "livenessProbe": {"exec": {"command": ["true"]}}}],
                "initContainers": [{"name": "i", "image": "busybox"}],
                "ephemeralContainers": [{"name": "debug", "image": "busybox"}],
                "volumes": [{"name": "v", "emptyDir": {}}],
                "dnsConfig": {"nameservers": ["10.96.0.10"]}
            },
            "status": {"phase": "Running", "podIP": "10.0.0.5"}
        })
    }

    #[test]
    fn decoding_a_pod_keeps_what_the_syncer_reads_and_equals_narrowing_it() {
        let decoded: HostPod = serde_json::from_value(pod_json()).unwrap();
        let full: Pod = serde_json::from_value(pod_json()).unwrap();
        assert_eq!(decoded, HostPod::from(&full));
        let spec = decoded.spec.as_ref().unwrap();
        assert_eq!(decoded.node_name(), Some("n1"));
        assert_eq!(spec.containers[0].image.as_deref(), Some("busybox"));
        assert_eq!(
            spec.containers[0]
                .resources
                .as_ref()
                .unwrap()
                .requests
                .as_ref()
                .unwrap()["cpu"]
                .0,
            "100m"
        );
        assert_eq!(spec.init_containers.as_ref().unwrap()[0].name, "i");
        assert_eq!(spec.ephemeral_containers.as_ref().unwrap()[0].name, "debug");
        assert_eq!(spec.active_deadline_seconds, Some(30));
        assert_eq!(
            spec.readiness_gates.as_ref().unwrap()[0].condition_type,
            "example.com/ready"
        );
        assert_eq!(
            decoded.status.as_ref().unwrap().pod_ip.as_deref(),
            Some("10.0.0.5")
        );
        // What the syncer never reads is not kept.
        let back = serde_json::to_value(&decoded).unwrap();
        assert!(back["spec"]["containers"][0].get("env").is_none());
        assert!(back["spec"].get("volumes").is_none());
        assert!(back["spec"].get("dnsConfig").is_none());
    }

    #[test]
    fn a_host_pod_is_addressed_as_a_pod() {
        use k8s_openapi::Resource;
        assert_eq!(HostPod::URL_PATH_SEGMENT, "pods");
        assert_eq!(HostPod::API_VERSION, "v1");
        assert_eq!(HostPod::KIND, "Pod");
    }
}
