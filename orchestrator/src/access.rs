//! Who may do what inside a tenant: the access levels a kubeconfig's groups carry, as the RBAC
//! objects vcp writes in the tenant apiserver (pure: the provisioner applies them).
//!
//! Bootstrap binds the groups `view`, `edit` and `admin` to the ClusterRoles `view`, `edit` and
//! `cluster-admin`, and the group [`SUDO_AS_GROUP`] to `cluster-admin` too. Nobody is in that
//! group: it is reserved (`vcp:` names are refused in kubeconfigs), so the only way into it is
//! impersonation. A kubeconfig with the group [`SUDO_GROUP`] makes its user a sudoer: vcp
//! writes a ClusterRole that lets exactly that user impersonate exactly itself and
//! [`SUDO_AS_GROUP`], and binds it to that user. So a sudoer who works as `view` or `edit`
//! acts as admin for one command with `kubectl --as=<self> --as-group=vcp:sudo ...`, the
//! tenant apiserver's own audit log records the impersonation, and no one can impersonate
//! anyone else or join any other group that way.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The kubeconfig group that makes its user a sudoer.
pub const SUDO_GROUP: &str = "sudo";

/// The group a sudoer impersonates to act as admin.
pub const SUDO_AS_GROUP: &str = "vcp:sudo";

/// The groups bound at bootstrap and the ClusterRole each gets.
pub const LEVELS: [(&str, &str); 4] = [
    ("view", "view"),
    ("edit", "edit"),
    ("admin", "cluster-admin"),
    (SUDO_AS_GROUP, "cluster-admin"),
];

/// Label on what vcp writes in a tenant (its bindings, its roles).
const MANAGED_BY: (&str, &str) = (crate::render::LABEL_MANAGED_BY, "vcp");

/// The annotation naming the user a sudo role is for (the object's name is a digest: a user
/// name may hold characters an object name may not).
pub const ANN_SUDO_USER: &str = "vcp.dev/sudo-user";

/// The name of the binding of access group `group`: `vcp:view`, ..., `vcp:sudo`.
pub fn level_binding_name(group: &str) -> String {
    format!("vcp:{}", group.strip_prefix("vcp:").unwrap_or(group))
}

/// The ClusterRoleBinding of access group `group` to `role`.
pub fn level_binding(group: &str, role: &str) -> Value {
    let name = level_binding_name(group);
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": {MANAGED_BY.0: MANAGED_BY.1}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}],
    })
}

/// The name of `user`'s sudo role and binding.
pub fn sudo_name(user: &str) -> String {
    let digest = Sha256::digest(user.as_bytes());
    let hex: String = digest[..10].iter().map(|b| format!("{b:02x}")).collect();
    format!("vcp:sudo:{hex}")
}

/// The ClusterRole and ClusterRoleBinding that make `user` a sudoer: it may impersonate itself
/// and [`SUDO_AS_GROUP`], nothing else.
pub fn sudo_objects(user: &str) -> (Value, Value) {
    let name = sudo_name(user);
    let meta = json!({
        "name": name,
        "labels": {MANAGED_BY.0: MANAGED_BY.1},
        "annotations": {ANN_SUDO_USER: user},
    });
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": meta,
        "rules": [
            {"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"], "resourceNames": [user]},
            {"apiGroups": [""], "resources": ["groups"], "verbs": ["impersonate"], "resourceNames": [SUDO_AS_GROUP]},
        ],
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    });
    (role, binding)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sudoer_may_impersonate_itself_into_the_sudo_group_and_nothing_else() {
        let (role, binding) = sudo_objects("dave@example.com");
        let rules = role["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 2);
        for r in rules {
            assert_eq!(r["verbs"], json!(["impersonate"]));
            assert_eq!(r["resourceNames"].as_array().unwrap().len(), 1, "{r}");
        }
        assert_eq!(rules[0]["resources"], json!(["users"]));
        assert_eq!(rules[0]["resourceNames"], json!(["dave@example.com"]));
        assert_eq!(rules[1]["resources"], json!(["groups"]));
        assert_eq!(rules[1]["resourceNames"], json!([SUDO_AS_GROUP]));
        assert_eq!(
            binding["subjects"],
            json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "dave@example.com"}])
        );
        assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
        assert_eq!(
            role["metadata"]["annotations"][ANN_SUDO_USER],
            "dave@example.com"
        );
    }

    #[test]
    fn sudo_names_are_object_names_and_differ_per_user() {
        let names: Vec<String> = ["a", "b", "a/b", "x%y", "..", "A"]
            .iter()
            .map(|u| sudo_name(u))
            .collect();
        for n in &names {
            assert!(n.starts_with("vcp:sudo:") && n.len() == 29, "{n}");
            assert!(!n.contains(['/', '%']), "{n}");
        }
        let unique: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len());
    }

    #[test]
    fn the_sudo_group_is_one_no_kubeconfig_can_carry() {
        assert!(!crate::names::is_subject(SUDO_AS_GROUP));
        assert!(crate::names::is_subject(SUDO_GROUP));
        assert_eq!(level_binding_name(SUDO_AS_GROUP), "vcp:sudo");
        assert_eq!(level_binding_name("view"), "vcp:view");
        let b = level_binding(SUDO_AS_GROUP, "cluster-admin");
        assert_eq!(b["subjects"][0]["name"], SUDO_AS_GROUP);
        assert_eq!(b["roleRef"]["name"], "cluster-admin");
    }
}
