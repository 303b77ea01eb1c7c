//! The syncer's access to its own host namespaces.
//!
//! Its host credentials hold no namespaced permission cluster-wide (see docs/syncer.md,
//! "Syncer credentials"): it may create namespaces and RoleBindings, and bind one ClusterRole,
//! the namespaced permissions of a syncer (`--host-role`). Right after it creates a host
//! namespace it binds that role to its own service account there ([`role_binding`]), and from
//! then on reads and writes objects in that namespace through it; the host's admission policy
//! for this syncer refuses a binding anywhere but in its own namespaces, to any other role or
//! to any other subject. So another tenant's namespaces, Secrets included, stay out of reach
//! of the host apiserver's authorizer itself, reads as well as writes.

use crate::Result;
use crate::engine::Engine;
use crate::engine::FIELD_MANAGER;
use crate::kube_err;
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use vcp_core::naming;

/// Name of the RoleBinding in every host namespace of a tenant.
pub const BINDING: &str = "vcp-syncer";

/// Who the syncer is on the host and which ClusterRole it binds to itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostAccess {
    /// The ClusterRole with a syncer's namespaced permissions.
    pub role: String,
    /// The syncer's service account: namespace and name.
    pub service_account: (String, String),
}

/// The RoleBinding that gives the syncer its role in host namespace `host_ns`.
pub fn role_binding(key: &naming::TenantKey, host_ns: &str, access: &HostAccess) -> RoleBinding {
    let (sa_ns, sa) = &access.service_account;
    RoleBinding {
        metadata: ObjectMeta {
            name: Some(BINDING.into()),
            namespace: Some(host_ns.into()),
            labels: Some(
                [(naming::LABEL_TENANT.to_owned(), key.to_string())]
                    .into_iter()
                    .collect(),
            ),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: access.role.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: sa.clone(),
            namespace: Some(sa_ns.clone()),
            ..Default::default()
        }]),
    }
}

/// Makes sure the syncer's RoleBinding exists in `host_ns` (a namespace it owns). Created, never
/// patched: its role reference cannot change, and an existing binding is either ours or the
/// host admin's to fix. Without `--host-role`, nothing to do.
pub async fn ensure(e: &Engine, access: Option<&HostAccess>, host_ns: &str) -> Result<()> {
    let Some(access) = access else {
        return Ok(());
    };
    let api: Api<RoleBinding> = Api::namespaced(e.host.clone(), host_ns);
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match api
        .create(&pp, &role_binding(e.key(), host_ns, access))
        .await
    {
        Ok(_) => {
            tracing::debug!(ns = %host_ns, role = %access.role, "bound the syncer's role in its host namespace");
            Ok(())
        }
        Err(kube::Error::Api(ae)) if ae.code == 409 => Ok(()),
        Err(err) => Err(kube_err(format!("bind the syncer's role in {host_ns}"))(
            err,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binding_names_only_the_syncers_role_and_account() {
        let key = naming::TenantKey::new("demo").unwrap();
        let access = HostAccess {
            role: "vcp-syncer-namespaced-demo".into(),
            service_account: ("vcp-demo".into(), "vcp-syncer".into()),
        };
        let rb = role_binding(&key, "demo-apps", &access);
        assert_eq!(
            serde_json::to_value(&rb).unwrap(),
            serde_json::json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "vcp-syncer", "namespace": "demo-apps",
                    "labels": {"vcp.dev/tenant": "demo"}},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "vcp-syncer-namespaced-demo"},
                "subjects": [{"kind": "ServiceAccount", "name": "vcp-syncer", "namespace": "vcp-demo"}],
            })
        );
    }
}
