//! vcp's own access to the host, as objects (pure: no client).
//!
//! The shared ClusterRoles of `templates/host-roles.yaml` (installed by the chart, or applied
//! by `vcp serve` when it may) -> [`host_roles`]; vcp's host user name (from a
//! SelfSubjectReview at start) -> [`own_binding`], the RoleBinding that gives vcp the
//! `vcp:tenant-namespace` role in one namespace of a tenant. Binding per namespace is what keeps
//! Secrets out of vcp's reach everywhere else (docs/install.md, "vcp's host permissions").

use crate::render::{Object, RenderError};
use serde_json::json;

/// The shared host ClusterRoles, as the chart installs them: their names start with `vcp:`,
/// which a deployment replaces with its prefix (`--host-roles-prefix`; the chart's release).
pub const HOST_ROLES_YAML: &str = include_str!("../../../templates/host-roles.yaml");

/// The prefix the names in [`HOST_ROLES_YAML`] are written with.
pub const DEFAULT_PREFIX: &str = "vcp";

/// Name of vcp's own RoleBinding in a tenant's namespace.
pub const OWN_BINDING: &str = "vcp";

/// The role vcp binds to itself in a tenant's namespaces.
pub fn tenant_namespace_role(prefix: &str) -> String {
    format!("{prefix}:tenant-namespace")
}

/// The role each syncer binds to itself in its host namespaces (its `--host-role`).
pub fn syncer_namespaced_role(prefix: &str) -> String {
    format!("{prefix}:syncer-namespaced")
}

/// Whether `prefix` can start a ClusterRole name the way the chart writes it (a release name:
/// lowercase letters, digits, `-` and `.`, at most 200 characters).
pub fn valid_prefix(prefix: &str) -> bool {
    !prefix.is_empty()
        && prefix.len() <= 200
        && prefix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// The ClusterRoles of `templates/host-roles.yaml`, named with `prefix`.
pub fn host_roles(prefix: &str) -> Result<Vec<Object>, RenderError> {
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(HOST_ROLES_YAML) {
        let mut v: serde_json::Value =
            serde::Deserialize::deserialize(doc).map_err(|e| RenderError::Yaml {
                template: "host-roles.yaml".into(),
                message: e.to_string(),
            })?;
        if v.is_null() {
            continue;
        }
        let name = v["metadata"]["name"].as_str().unwrap_or_default();
        if let Some(rest) = name.strip_prefix(DEFAULT_PREFIX) {
            v["metadata"]["name"] = json!(format!("{prefix}{rest}"));
        }
        out.push(Object(v));
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

/// vcp's RoleBinding of [`tenant_namespace_role`] to `user` in namespace `ns`.
pub fn own_binding(ns: &str, user: &str, prefix: &str) -> Object {
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
            "name": tenant_namespace_role(prefix),
        },
        "subjects": [subject(user)],
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_roles_are_the_two_shared_cluster_roles_and_grant_no_rbac() {
        for prefix in [DEFAULT_PREFIX, "prod-vcp"] {
            let roles = host_roles(prefix).unwrap();
            let names: Vec<_> = roles
                .iter()
                .map(|r| (r.kind(), r.name().to_owned()))
                .collect();
            assert_eq!(
                names,
                [
                    ("ClusterRole", tenant_namespace_role(prefix)),
                    ("ClusterRole", syncer_namespaced_role(prefix))
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
    }

    #[test]
    fn prefixes_are_release_names() {
        for ok in ["vcp", "prod-vcp", "a.b-1"] {
            assert!(valid_prefix(ok), "{ok}");
        }
        for bad in ["", "Vcp", "a:b", "a/b", "a b", &"x".repeat(201)] {
            assert!(!valid_prefix(bad), "{bad}");
        }
    }

    #[test]
    fn the_syncer_template_binds_the_shared_role_by_name() {
        let t = include_str!("../../../templates/vcp-syncer.yaml");
        assert!(t.contains("--host-role={{ syncer_host_role }}"));
        assert!(t.contains("resourceNames: [\"{{ syncer_host_role }}\"]"));
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
        let b = own_binding("vcp-abc", "system:serviceaccount:vcp-system:vcp", "vcp");
        assert_eq!(b.namespace(), Some("vcp-abc"));
        assert_eq!(b.0["roleRef"]["name"], "vcp:tenant-namespace");
        assert_eq!(b.0["subjects"][0]["namespace"], "vcp-system");
    }
}
