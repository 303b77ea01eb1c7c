//! Events up: what the host reports about a host object is reported on its tenant object.
//!
//! A host Event about a host object of this tenant (the object carries the tenant's markers)
//! becomes a tenant Event about the tenant object: involved object re-pointed (namespace, name
//! and UID from the markers), reason, message, type, count, timestamps and source kept. The
//! tenant Event's name is derived from the host Event's UID ([`crate::naming::event_name`]), so it is
//! created once and then only updated (count, last timestamp, message) however often the host
//! Event is seen. Host namespace names in the message are rewritten to the tenant's.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::ObjectMeta;
use vcp_core::naming::TenantRef;

/// Kinds whose host Events flow up, with their resource (plural) names: the kinds the syncer
/// creates on the host.
pub const KINDS: [(&str, &str); 5] = [
    ("Pod", "pods"),
    ("Service", "services"),
    ("PersistentVolumeClaim", "persistentvolumeclaims"),
    ("ConfigMap", "configmaps"),
    ("Secret", "secrets"),
];

/// Whether a host Event is worth a tenant write. The host scheduler's `Scheduled` (a pod
/// bound to a node) is not: the syncer binds the tenant pod itself, so the tenant already sees
/// the node in `spec.nodeName` and the `PodScheduled` condition, and copying the record would
/// cost every pod a third write to the tenant apiserver beside its binding and status. Every
/// other Event flows up, `FailedScheduling` (why a pod waits for a host node) included.
/// The host watch's field selector: what [`worth_copying`] drops, as far as the apiserver
/// can select it (the host scheduler records only `Normal` `Scheduled` Events).
pub const NOT_WORTH_WATCHING: &str = "reason!=Scheduled";

///
/// Nor is the kubelet's progress (pulled, created, started) of the syncer's own init container
/// ([`crate::etc_hosts`]), which the tenant pod does not have; its Warnings still flow up, since
/// a pod held in its init phase must say why.
pub fn worth_copying(host: &Event) -> bool {
    let pod = host.involved_object.kind.as_deref() == Some("Pod");
    let normal = host.type_.as_deref() != Some("Warning");
    let ours = host
        .involved_object
        .field_path
        .as_deref()
        .and_then(|f| f.strip_prefix("spec.initContainers{"))
        .and_then(|f| f.strip_suffix('}'))
        .is_some_and(crate::etc_hosts::hidden);
    !(pod && normal && (host.reason.as_deref() == Some("Scheduled") || ours))
}

/// Whether a host Event only tells that the kubelet waits for the token of tenant pod `r`:
/// the syncer asks the tenant for a pod's token once the pod is bound, so the kubelet may look
/// for the token Secret a moment before it is written (`FailedMount ... secret "vcp-sa-..."
/// not found`) and finds it at its next try. That wait is the syncer's doing, not the
/// tenant's, and a kubelet of a real cluster has no such wait to report. Any other mount
/// failure flows up.
pub fn about_the_token_wait(host: &Event, r: &TenantRef) -> bool {
    let Some(uid) = r.uid.as_deref() else {
        return false;
    };
    let missing = format!(
        "secret \"{}\" not found",
        crate::naming::token_secret_name(uid)
    );
    host.involved_object.kind.as_deref() == Some("Pod")
        && host.reason.as_deref() == Some("FailedMount")
        && host
            .message
            .as_deref()
            .is_some_and(|m| m.contains(&missing))
}

/// The plural of a kind whose Events flow up (core group only), or `None`.
pub fn plural(involved: &ObjectReference) -> Option<&'static str> {
    let core = matches!(involved.api_version.as_deref(), None | Some("v1"));
    let kind = involved.kind.as_deref()?;
    KINDS
        .iter()
        .find(|(k, _)| core && *k == kind)
        .map(|(_, p)| *p)
}

/// The tenant copy of `host` (an Event about the host object made from `r`, which lives in
/// host namespace `host_ns`).
pub fn to_tenant(host: &Event, r: &TenantRef, host_ns: &str) -> Option<Event> {
    let ns = r.namespace.clone()?;
    let involved = ObjectReference {
        api_version: host.involved_object.api_version.clone(),
        kind: host.involved_object.kind.clone(),
        namespace: Some(ns.clone()),
        name: Some(r.name.clone()),
        uid: r.uid.clone(),
        field_path: host.involved_object.field_path.clone(),
        resource_version: None,
    };
    // New-style events (events.k8s.io, e.g. the scheduler's) carry eventTime and a series
    // instead of the legacy timestamps and count the tenant's `kubectl describe` reads.
    let event_time = host.event_time.as_ref().map(|t| Time(t.0));
    let first = host.first_timestamp.clone().or_else(|| event_time.clone());
    let last = host
        .series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref().map(|t| Time(t.0)))
        .or_else(|| host.last_timestamp.clone())
        .or_else(|| first.clone());
    let count = host
        .series
        .as_ref()
        .and_then(|s| s.count)
        .or(host.count)
        .unwrap_or(1);
    let source = match &host.source {
        Some(s) if s.component.is_some() => s.clone(),
        _ => EventSource {
            component: host.reporting_component.clone(),
            host: host.source.as_ref().and_then(|s| s.host.clone()),
        },
    };
    let message = host
        .message
        .as_ref()
        .map(|m| m.replace(&format!("{host_ns}/"), &format!("{ns}/")));
    Some(Event {
        metadata: ObjectMeta {
            name: Some(crate::naming::event_name(&r.name, &host.uid()?)),
            namespace: Some(ns),
            ..Default::default()
        },
        involved_object: involved,
        reason: host.reason.clone(),
        message,
        type_: host.type_.clone(),
        count: Some(count),
        first_timestamp: first,
        last_timestamp: last,
        source: Some(source),
        ..Default::default()
    })
}

/// The part of a tenant Event that changes as the host Event repeats, as a merge patch.
pub fn repeat_patch(ev: &Event) -> serde_json::Value {
    serde_json::json!({
        "count": ev.count,
        "lastTimestamp": ev.last_timestamp,
        "message": ev.message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scheduled() -> Event {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1.abc", "namespace": "demo-apps", "uid": "h-ev-1"},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": "demo-apps",
                "name": "web-1", "uid": "host-pod-uid"},
            "reason": "Scheduled", "type": "Normal",
            "message": "Successfully assigned demo-apps/web-1 to kwok-node-1",
            "eventTime": "2026-11-21T08:00:00.000000Z",
            "reportingComponent": "default-scheduler", "reportingInstance": "default-scheduler-x",
            "action": "Binding",
        }))
        .unwrap()
    }

    fn tenant_ref() -> TenantRef {
        TenantRef {
            namespace: Some("apps".into()),
            name: "web-1".into(),
            uid: Some("tenant-pod-uid".into()),
        }
    }

    #[test]
    fn the_host_schedulers_binding_record_stays_on_the_host() {
        assert!(!worth_copying(&scheduled()));
        let mut failed = scheduled();
        failed.reason = Some("FailedScheduling".into());
        failed.type_ = Some("Warning".into());
        assert!(
            worth_copying(&failed),
            "why a pod waits must reach the tenant"
        );
        let mut pulled = scheduled();
        pulled.reason = Some("Pulled".into());
        assert!(worth_copying(&pulled));
        let mut service = scheduled();
        service.involved_object.kind = Some("Service".into());
        assert!(worth_copying(&service));
        // The syncer's own init container: its progress stays, its trouble flows up.
        pulled.involved_object.field_path =
            Some(format!("spec.initContainers{{{}}}", crate::etc_hosts::NAME));
        assert!(!worth_copying(&pulled));
        pulled.type_ = Some("Warning".into());
        pulled.reason = Some("Failed".into());
        assert!(worth_copying(&pulled));
        pulled.involved_object.field_path = Some("spec.initContainers{setup}".into());
        pulled.type_ = Some("Normal".into());
        assert!(worth_copying(&pulled), "the tenant's own init containers");
    }

    #[test]
    fn the_kubelets_wait_for_a_pods_token_stays_on_the_host() {
        let mut ev = scheduled();
        ev.reason = Some("FailedMount".into());
        ev.type_ = Some("Warning".into());
        let token = crate::naming::token_secret_name("tenant-pod-uid");
        ev.message = Some(format!(
            "MountVolume.SetUp failed for volume \"kube-api-access-x\" : secret \"{token}\" not found"
        ));
        assert!(about_the_token_wait(&ev, &tenant_ref()));
        let other = TenantRef {
            uid: Some("another-pod".into()),
            ..tenant_ref()
        };
        assert!(
            !about_the_token_wait(&ev, &other),
            "another pod's token is not this pod's wait"
        );
        ev.message = Some(
            "MountVolume.SetUp failed for volume \"cfg\" : secret \"app-config\" not found".into(),
        );
        assert!(
            !about_the_token_wait(&ev, &tenant_ref()),
            "a Secret of the tenant's that is missing must reach the tenant"
        );
    }

    #[test]
    fn a_host_event_is_repointed_at_the_tenant_object() {
        let ev = to_tenant(&scheduled(), &tenant_ref(), "demo-apps").unwrap();
        assert_eq!(ev.metadata.namespace.as_deref(), Some("apps"));
        assert_eq!(
            ev.metadata.name,
            Some(crate::naming::event_name("web-1", "h-ev-1"))
        );
        let o = &ev.involved_object;
        assert_eq!(
            (o.namespace.as_deref(), o.name.as_deref(), o.uid.as_deref()),
            (Some("apps"), Some("web-1"), Some("tenant-pod-uid"))
        );
        assert_eq!(ev.reason.as_deref(), Some("Scheduled"));
        assert_eq!(ev.type_.as_deref(), Some("Normal"));
        assert_eq!(
            ev.message.as_deref(),
            Some("Successfully assigned apps/web-1 to kwok-node-1"),
            "no host namespace in the tenant's view"
        );
        assert_eq!(ev.count, Some(1));
        assert!(ev.first_timestamp.is_some() && ev.last_timestamp.is_some());
        assert_eq!(
            ev.source.unwrap().component.as_deref(),
            Some("default-scheduler")
        );
    }

    #[test]
    fn legacy_counts_and_sources_are_kept() {
        let mut host = scheduled();
        host.event_time = None;
        host.count = Some(4);
        host.source = Some(EventSource {
            component: Some("kubelet".into()),
            host: Some("kwok-node-1".into()),
        });
        let ev = to_tenant(&host, &tenant_ref(), "demo-apps").unwrap();
        assert_eq!(ev.count, Some(4));
        assert_eq!(
            ev.source.as_ref().unwrap().host.as_deref(),
            Some("kwok-node-1")
        );
        assert_eq!(repeat_patch(&ev)["count"], 4);
    }

    #[test]
    fn only_core_kinds_the_syncer_creates_flow_up() {
        let mut o = scheduled().involved_object;
        assert_eq!(plural(&o), Some("pods"));
        o.kind = Some("Node".into());
        assert_eq!(plural(&o), None);
        o.kind = Some("Pod".into());
        o.api_version = Some("example.com/v1".into());
        assert_eq!(plural(&o), None);
    }
}
