//! Pod certificate requests between the host kubelet and the tenant's signer (pure).
//!
//! Down: the host pod's `podCertificate` source names vcp's signer for the tenant
//! ([`crate::naming::host_pod_signer`]); the host kubelet's request for it becomes a tenant
//! request ([`to_tenant`]) that names the tenant's signer, pod, service account and virtual
//! node, with the kubelet's key (a stub PKCS#10 request, self-signed, so it proves the key
//! whatever pod it names). Up: the tenant signer's answer (a certificate chain, or a denial or
//! failure) goes to the host request's status ([`answer`]), for the kubelet to write into the
//! pod's volume. The host apiserver checks that the chain is for the request's key.

use k8s_openapi::api::certificates::v1::{PodCertificateRequest, PodCertificateRequestStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// Label on the tenant requests the syncer relays (the only ones it watches).
pub const RELAYED: &str = "vcp.dev/relayed-pod-certificate";

/// Whether a request has its answer: a certificate chain, or a `Denied` or `Failed` condition.
pub fn settled(status: Option<&PodCertificateRequestStatus>) -> bool {
    let Some(s) = status else { return false };
    let issued = s
        .certificate_chain
        .as_deref()
        .is_some_and(|c| !c.is_empty());
    let ended = s
        .conditions
        .iter()
        .flatten()
        .any(|c| (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True");
    issued || ended
}

/// The tenant's own signer behind host signer `host_signer`: the one among tenant pod `pod`'s
/// `podCertificate` sources whose host name it is.
pub fn tenant_signer(pod: &Pod, key: &str, host_signer: &str) -> Option<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .flat_map(|v| v.projected.iter().flat_map(|p| p.sources.iter().flatten()))
        .filter_map(|s| s.pod_certificate.as_ref())
        .map(|c| c.signer_name.clone())
        .find(|s| crate::naming::host_pod_signer(key, s) == host_signer)
}

/// The tenant's request for host request `host`, made by the kubelet for tenant pod `pod`
/// (bound to its virtual node): named like the host request, owned by the pod (so it goes
/// with it), naming `signer`, the pod's service account (`sa_uid`) and node (`node_uid`).
pub fn to_tenant(
    host: &PodCertificateRequest,
    pod: &Pod,
    signer: &str,
    sa_uid: &str,
    node_uid: &str,
) -> PodCertificateRequest {
    let spec = pod.spec.clone().unwrap_or_default();
    let sa = spec
        .service_account_name
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".to_owned());
    let mut out = host.spec.clone();
    out.signer_name = signer.to_owned();
    out.pod_name = pod.metadata.name.clone().unwrap_or_default();
    out.pod_uid = pod.metadata.uid.clone().unwrap_or_default();
    out.service_account_name = sa;
    out.service_account_uid = sa_uid.to_owned();
    out.node_name = spec.node_name.unwrap_or_default();
    out.node_uid = node_uid.to_owned();
    PodCertificateRequest {
        metadata: ObjectMeta {
            name: host.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            labels: Some([(RELAYED.to_owned(), "true".to_owned())].into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: out.pod_name.clone(),
                uid: out.pod_uid.clone(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: out,
        status: None,
    }
}

/// The status host request `host` gets from tenant request `tenant`, once the tenant's signer
/// answered: only for the tenant request made for it (same name, the same key), and with the
/// conditions' `observedGeneration` the host request's own.
pub fn answer(
    tenant: &PodCertificateRequest,
    host: &PodCertificateRequest,
) -> Option<PodCertificateRequestStatus> {
    let ours = relayed(tenant)
        && tenant.metadata.name == host.metadata.name
        && tenant.spec.stub_pkc_s10_request == host.spec.stub_pkc_s10_request;
    if !ours || !settled(tenant.status.as_ref()) || settled(host.status.as_ref()) {
        return None;
    }
    let mut status = tenant.status.clone()?;
    for c in status.conditions.iter_mut().flatten() {
        c.observed_generation = host.metadata.generation;
    }
    Some(status)
}

/// Whether `r` carries the syncer's relay label.
pub fn relayed(r: &PodCertificateRequest) -> bool {
    r.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.get(RELAYED).map(String::as_str) == Some("true"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant_pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "apps", "uid": "tp-uid"},
            "spec": {
                "nodeName": "node-1", "serviceAccountName": "builder",
                "containers": [{"name": "c"}],
                "volumes": [{"name": "certs", "projected": {"sources": [
                    {"configMap": {"name": "x"}},
                    {"podCertificate": {"signerName": "e2e.example.com/s1", "keyType": "ED25519", "credentialBundlePath": "b"}},
                ]}}],
            },
        }))
        .unwrap()
    }

    fn host_request() -> PodCertificateRequest {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-x7k2p", "namespace": "demo-apps", "generation": 1},
            "spec": {
                "signerName": crate::naming::host_pod_signer("demo", "e2e.example.com/s1"),
                "podName": "web", "podUID": "hp-uid",
                "serviceAccountName": "default", "serviceAccountUID": "host-sa",
                "nodeName": "node-1", "nodeUID": "host-node",
                "maxExpirationSeconds": 86400,
                "stubPKCS10Request": "AAEC",
                "unverifiedUserAnnotations": {"x": "y"},
            },
        }))
        .unwrap()
    }

    #[test]
    fn the_tenant_request_names_the_tenants_signer_pod_account_and_node() {
        let h = host_request();
        let signer = tenant_signer(&tenant_pod(), "demo", &h.spec.signer_name).unwrap();
        assert_eq!(signer, "e2e.example.com/s1");
        assert_eq!(
            tenant_signer(&tenant_pod(), "other", &h.spec.signer_name),
            None
        );
        let t = to_tenant(&h, &tenant_pod(), &signer, "t-sa", "t-node");
        assert_eq!(t.metadata.name.as_deref(), Some("web-x7k2p"));
        assert_eq!(t.metadata.namespace.as_deref(), Some("apps"));
        assert_eq!(t.metadata.owner_references.unwrap()[0].uid, "tp-uid");
        let s = &t.spec;
        assert_eq!(
            (
                s.signer_name.as_str(),
                s.pod_name.as_str(),
                s.pod_uid.as_str()
            ),
            ("e2e.example.com/s1", "web", "tp-uid")
        );
        assert_eq!(
            (
                s.service_account_name.as_str(),
                s.service_account_uid.as_str()
            ),
            ("builder", "t-sa")
        );
        assert_eq!(
            (s.node_name.as_str(), s.node_uid.as_str()),
            ("node-1", "t-node")
        );
        // The kubelet's key and asks, as it made them.
        assert_eq!(s.stub_pkc_s10_request, h.spec.stub_pkc_s10_request);
        assert_eq!(s.max_expiration_seconds, Some(86400));
        assert_eq!(
            s.unverified_user_annotations,
            h.spec.unverified_user_annotations
        );
    }

    #[test]
    fn only_a_settled_answer_to_the_same_key_goes_to_the_host() {
        let h = host_request();
        let mut t = to_tenant(&h, &tenant_pod(), "e2e.example.com/s1", "t-sa", "t-node");
        t.metadata.generation = Some(4);
        assert_eq!(answer(&t, &h), None, "not answered yet");
        t.status = Some(
            serde_json::from_value(serde_json::json!({
                "certificateChain": "-----BEGIN CERTIFICATE-----\n...",
                "conditions": [{"type": "Issued", "status": "True", "reason": "Issued", "message": "",
                                "lastTransitionTime": "2026-11-29T00:00:00Z", "observedGeneration": 4}],
            }))
            .unwrap(),
        );
        let status = answer(&t, &h).unwrap();
        assert_eq!(status.conditions.unwrap()[0].observed_generation, Some(1));
        // Another key, or a request the syncer did not make: nothing goes down.
        let mut other = t.clone();
        other.spec.stub_pkc_s10_request = k8s_openapi::ByteString(vec![9]);
        assert_eq!(answer(&other, &h), None);
        let mut forged = t.clone();
        forged.metadata.labels = None;
        assert_eq!(answer(&forged, &h), None);
        // Already answered on the host: nothing to write.
        let mut done = h.clone();
        done.status = t.status.clone();
        assert_eq!(answer(&t, &done), None);
        // A denial is an answer too.
        let mut denied = t.clone();
        denied.status = Some(
            serde_json::from_value(serde_json::json!({
                "conditions": [{"type": "Denied", "status": "True", "reason": "No", "message": "no",
                                "lastTransitionTime": "2026-11-29T00:00:00Z"}],
            }))
            .unwrap(),
        );
        assert!(settled(denied.status.as_ref()));
        assert!(answer(&denied, &h).is_some());
    }
}
