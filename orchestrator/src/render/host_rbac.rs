//! vcp's own access to the host, as objects (pure: no client).
//!
//! The shared ClusterRoles of `templates/host-roles.yaml` (installed by the chart, or applied
//! by `vcp serve` when it may) -> [`host_roles`]; vcp's host user name (from a
//! SelfSubjectReview at start) -> [`own_binding`], the RoleBinding that gives vcp the
//! `vcp:tenant-namespace` role in one namespace of a tenant. Binding per namespace is what keeps
//! Secrets out of vcp's reach everywhere else (docs/install.md, "vcp's host permissions").

use super::{Object, RenderError};
use serde_json::json;

/// The shared host ClusterRoles, as the chart installs them.
pub const HOST_ROLES_YAML: &str = include_str!("../../../templates/host-roles.yaml");

/// The role vcp binds to itself in a tenant's namespaces.
pub const TENANT_NAMESPACE_ROLE: &str = "vcp:tenant-namespace";

/// The role each syncer binds to itself in its host namespaces (its `--host-role`).
pub const SYNCER_NAMESPACED_ROLE: &str = "vcp:syncer-namespaced";

/// Name of vcp's own RoleBinding in a tenant's namespace.
pub const OWN_BINDING: &str = "vcp";

/// The ClusterRoles of `templates/host-roles.yaml`.
pub fn host_roles() -> Result<Vec<Object>, RenderError> {
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(HOST_ROLES_YAML) {
        let v: serde_json::Value =
            serde::Deserialize::deserialize(doc).map_err(|e| RenderError::Yaml {
                template: "host-roles.yaml".into(),
                message: e.to_string(),
            })?;
        if !v.is_null() {
            out.push(Object(v));
        }
    }
    Ok(out)
}

/// The RBAC subject a host user name stands for: a ServiceAccount for
/// `system:serviceaccount:<ns>:<name>` (vcp in its chart), a User otherwise (a certificate's
/// user, as on the dev cluster).
pub fn subject(user: &str) -> serde_json::Value {
    match user
        .strip_prefix("system:serviceaccount:")
        .and_then(|r| r.split_once(':'))
    {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() => {
            json!({"kind": "ServiceAccount", "name": name, "namespace": ns})
        }
        _ => json!({"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user}),
    }
}

/// vcp's RoleBinding of [`TENANT_NAMESPACE_ROLE`] to `user` in namespace `ns`.
pub fn own_binding(ns: &str, user: &str) -> Object {
    Object(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {
            "name": OWN_BINDING,
            "namespace": ns,
            "labels": {super::LABEL_MANAGED_BY: "vcp"},
        },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": TENANT_NAMESPACE_ROLE,
        },
        "subjects": [subject(user)],
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_roles_are_the_two_shared_cluster_roles_and_grant_no_rbac() {
        let roles = host_roles().unwrap();
        let names: Vec<_> = roles.iter().map(|r| (r.kind(), r.name())).collect();
        assert_eq!(
            names,
            [
                ("ClusterRole", TENANT_NAMESPACE_ROLE),
                ("ClusterRole", SYNCER_NAMESPACED_ROLE)
            ]
        );
        for r in &roles {
            for rule in r.0["rules"].as_array().unwrap() {
                let groups = rule["apiGroups"].to_string();
                let verbs = rule["verbs"].to_string();
                // Bound per namespace, still neither may widen its own access.
                assert!(!groups.contains("rbac"), "{} grants {rule}", r.name());
                assert!(!verbs.contains('*'), "{} grants {rule}", r.name());
                assert!(!verbs.contains("escalate") && !verbs.contains("bind"));
            }
        }
    }

    #[test]
    fn the_syncer_template_binds_the_shared_role_by_name() {
        let t = include_str!("../../../templates/vcp-syncer.yaml");
        assert!(t.contains(&format!("--host-role={SYNCER_NAMESPACED_ROLE}")));
        assert!(t.contains(&format!("resourceNames: [\"{SYNCER_NAMESPACED_ROLE}\"]")));
    }

    #[test]
    fn a_service_account_is_bound_as_one_and_anyone_else_as_a_user() {
        assert_eq!(
            subject("system:serviceaccount:vcp-system:vcp"),
            json!({"kind": "ServiceAccount", "name": "vcp", "namespace": "vcp-system"})
        );
        for user in [
            "kubernetes-admin",
            "system:serviceaccount:",
            "system:serviceaccount:x",
        ] {
            assert_eq!(subject(user)["kind"], "User", "{user}");
            assert_eq!(subject(user)["name"], user);
        }
        let b = own_binding("vcp-abc", "system:serviceaccount:vcp-system:vcp");
        assert_eq!(b.namespace(), Some("vcp-abc"));
        assert_eq!(b.0["roleRef"]["name"], TENANT_NAMESPACE_ROLE);
        assert_eq!(b.0["subjects"][0]["namespace"], "vcp-system");
    }
}
