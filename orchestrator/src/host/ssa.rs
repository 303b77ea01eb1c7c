//! Writing rendered objects to a cluster: server-side apply with vcp's field manager.

use crate::render::Object;
use crate::{Error, Result};
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};

/// Field manager of everything the orchestrator writes.
pub const FIELD_MANAGER: &str = "vcp-orchestrator";

/// Kinds the templates may produce: (apiVersion, kind, plural, namespaced). A fixed table
/// instead of discovery: one request less per object, and a template cannot sneak in a kind
/// nobody reviewed.
const KINDS: [(&str, &str, &str, bool); 17] = [
    ("v1", "Namespace", "namespaces", false),
    (
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        true,
    ),
    ("batch/v1", "Job", "jobs", true),
    ("v1", "Service", "services", true),
    ("v1", "ConfigMap", "configmaps", true),
    ("v1", "Secret", "secrets", true),
    ("v1", "ServiceAccount", "serviceaccounts", true),
    ("apps/v1", "StatefulSet", "statefulsets", true),
    ("apps/v1", "Deployment", "deployments", true),
    (
        "policy/v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        true,
    ),
    (
        "networking.k8s.io/v1",
        "NetworkPolicy",
        "networkpolicies",
        true,
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRole",
        "clusterroles",
        false,
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        false,
    ),
    ("rbac.authorization.k8s.io/v1", "Role", "roles", true),
    (
        "rbac.authorization.k8s.io/v1",
        "RoleBinding",
        "rolebindings",
        true,
    ),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        false,
    ),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        false,
    ),
];

/// Whether templates may produce objects of this apiVersion and kind.
pub fn supported(api_version: &str, kind: &str) -> bool {
    KINDS
        .iter()
        .any(|(v, k, _, _)| *v == api_version && *k == kind)
}

/// The API for an object's kind (namespaced into its namespace).
pub fn api_for(client: &Client, o: &Object) -> Result<Api<DynamicObject>> {
    let (_, _, plural, namespaced) = KINDS
        .iter()
        .find(|(v, k, _, _)| *v == o.api_version() && *k == o.kind())
        .ok_or_else(|| Error::UnsupportedKind(format!("{}/{}", o.api_version(), o.kind())))?;
    let (group, version) = o
        .api_version()
        .rsplit_once('/')
        .unwrap_or(("", o.api_version()));
    let gvk = GroupVersionKind::gvk(group, version, o.kind());
    let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
    Ok(match (namespaced, o.namespace()) {
        (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
        _ => Api::all_with(client.clone(), &ar),
    })
}

/// Applies one object (server-side apply, forced: these objects are vcp's).
pub async fn apply(client: &Client, o: &Object, dry_run: bool) -> Result<DynamicObject> {
    let api = api_for(client, o)?;
    let mut pp = PatchParams::apply(FIELD_MANAGER).force();
    pp.dry_run = dry_run;
    api.patch(o.name(), &pp, &Patch::Apply(&o.0))
        .await
        .map_err(|e| Error::kube(format!("apply {} {}", o.kind(), o.name()), e))
}

/// Deletes one object vcp applied (in the background; gone already is fine).
pub async fn delete(client: &Client, o: &Object) -> Result<()> {
    let api = api_for(client, o)?;
    let dp = kube::api::DeleteParams::background();
    match api.delete(o.name(), &dp).await {
        Ok(_) => Ok(()),
        Err(e) if super::not_found(&e) => Ok(()),
        Err(e) => Err(Error::kube(format!("delete {} {}", o.kind(), o.name()), e)),
    }
}

/// Applies objects in order.
pub async fn apply_all(client: &Client, objects: &[Object]) -> Result<()> {
    for o in objects {
        apply(client, o, false).await?;
    }
    Ok(())
}

/// vcp's own user name on the host (a SelfSubjectReview), which its RoleBindings in tenants'
/// namespaces name ([`crate::render::host_rbac::own_binding`]).
pub async fn identity(client: &Client) -> Result<String> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let review: SelfSubjectReview = Api::<SelfSubjectReview>::all(client.clone())
        .create(&Default::default(), &SelfSubjectReview::default())
        .await
        .map_err(|e| Error::kube("ask the host who vcp is (SelfSubjectReview)", e))?;
    review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .filter(|u| !u.is_empty())
        .ok_or_else(|| Error::Config("the host's SelfSubjectReview names no user".into()))
}

/// Makes sure the shared host ClusterRoles of `templates/host-roles.yaml` are there, with the
/// rules this vcp expects. Applied when they differ and vcp may write them (a cluster admin's
/// credentials); with the chart's narrower ones the chart owns them, and vcp only checks.
pub async fn ensure_host_roles(client: &Client, prefix: &str) -> Result<()> {
    use k8s_openapi::api::rbac::v1::ClusterRole;
    let roles: Api<ClusterRole> = Api::all(client.clone());
    for want in crate::render::host_rbac::host_roles(prefix)? {
        let live = roles
            .get_opt(want.name())
            .await
            .map_err(|e| Error::kube(format!("read the host ClusterRole {}", want.name()), e))?;
        let same = live.as_ref().is_some_and(|l| {
            serde_json::to_value(&l.rules).ok().as_ref() == Some(&want.0["rules"])
        });
        if same {
            continue;
        }
        match apply(client, &want, false).await {
            Ok(_) => tracing::info!(role = want.name(), "applied a shared host ClusterRole"),
            Err(Error::Kube { source, .. }) if matches!(source.as_ref(), kube::Error::Api(s) if s.code == 403) =>
            {
                return Err(Error::Config(format!(
                    "the host ClusterRole {} is {} and vcp may not write it: install the chart of this vcp version, or apply templates/host-roles.yaml as a cluster admin",
                    want.name(),
                    if live.is_some() {
                        "not this version's"
                    } else {
                        "missing"
                    }
                )));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
