//! Who may do what inside a tenant: the access levels a kubeconfig's groups carry, as the RBAC
//! objects vcp writes in the tenant apiserver (pure: the provisioner applies them).
//!
//! Bootstrap binds the groups `view`, `edit` and `admin` to the ClusterRoles `view`, `edit` and
//! `cluster-admin`, and the group [`SUDO_AS_GROUP`] to `cluster-admin` too. Nobody is in that
//! group: it is reserved (`vcp:` names are refused in kubeconfigs), so the only way into it is
//! impersonation. A kubeconfig with the group [`SUDO_GROUP`] makes its holder a sudoer: vcp
//! writes a ClusterRole that lets its user impersonate exactly itself and [`SUDO_AS_GROUP`],
//! and binds it to that kubeconfig's own revocation group (`vcp:kubeconfig:<serial>`, which
//! only that certificate carries), never to the user name. So a sudoer who works as `view` or
//! `edit` acts as admin for one command with `kubectl --as=<self> --as-group=vcp:sudo ...`,
//! the tenant apiserver's own audit log records the impersonation, and no one can impersonate
//! anyone else or join any other group that way.
//!
//! Binding to the serial is what makes sudo die with what granted it: a revoked kubeconfig is
//! refused before RBAC is asked, an expired one cannot authenticate, and another kubeconfig of
//! the same user name (issued later, after the user was revoked, say) carries another serial
//! and so only the groups it was issued with. The roles of kubeconfigs that are no longer live
//! are then only litter, which [`sudo_plan`] finds from the inventory and the tenant's roles.

use serde_json::{Value, json};

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

/// The annotation naming the user a sudo role is for.
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

/// The prefix of every sudo role's and binding's name (the level binding `vcp:sudo` has no
/// colon after it, so it never matches).
pub const SUDO_PREFIX: &str = "vcp:sudo:";

/// The name of the sudo role and binding of the kubeconfig with certificate serial `serial`
/// (lowercase hex, so the name is a valid object name).
pub fn sudo_name(serial: &str) -> String {
    format!("{SUDO_PREFIX}{serial}")
}

/// The ClusterRole and ClusterRoleBinding that make the kubeconfig of `serial`, issued to
/// `user`, a sudoer: its holder may impersonate `user` and [`SUDO_AS_GROUP`], nothing else.
pub fn sudo_objects(user: &str, serial: &str) -> (Value, Value) {
    let name = sudo_name(serial);
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
        "subjects": [{
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Group",
            "name": vcp_core::revocation::group_of(serial),
        }],
    });
    (role, binding)
}

/// A live sudo kubeconfig: its user and certificate serial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sudoer {
    pub user: String,
    pub serial: String,
}

/// What to change in a tenant so that exactly the `live` sudo kubeconfigs have their role and
/// binding.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SudoPlan<'a> {
    /// Live kubeconfigs whose role or binding is missing: write both.
    pub write: Vec<&'a Sudoer>,
    /// Sudo roles to delete: of kubeconfigs revoked or expired, of none vcp knows, and those
    /// bound to a user name (written before sudo was bound to serials).
    pub delete_roles: Vec<String>,
    /// Sudo bindings to delete, likewise.
    pub delete_bindings: Vec<String>,
}

/// The plan for `live` sudo kubeconfigs, given the names of the vcp-managed ClusterRoles and
/// ClusterRoleBindings in the tenant (any names: those not starting with [`SUDO_PREFIX`] are
/// not sudo's and are left alone). Running it twice changes nothing the second time.
pub fn sudo_plan<'a>(live: &'a [Sudoer], roles: &[String], bindings: &[String]) -> SudoPlan<'a> {
    use std::collections::BTreeSet;
    let wanted: BTreeSet<String> = live.iter().map(|s| sudo_name(&s.serial)).collect();
    let extra = |names: &[String]| -> Vec<String> {
        let mut out: Vec<String> = names
            .iter()
            .filter(|n| n.starts_with(SUDO_PREFIX) && !wanted.contains(*n))
            .cloned()
            .collect();
        out.sort();
        out.dedup();
        out
    };
    let write = live
        .iter()
        .filter(|s| {
            let n = sudo_name(&s.serial);
            !roles.contains(&n) || !bindings.contains(&n)
        })
        .collect();
    SudoPlan {
        write,
        delete_roles: extra(roles),
        delete_bindings: extra(bindings),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sudoer_may_impersonate_itself_into_the_sudo_group_and_nothing_else() {
        let serial = "4f1e";
        let (role, binding) = sudo_objects("dave@example.com", serial);
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
        assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
        assert_eq!(role["metadata"]["name"], "vcp:sudo:4f1e");
        assert_eq!(
            role["metadata"]["annotations"][ANN_SUDO_USER],
            "dave@example.com"
        );
    }

    #[test]
    fn sudo_is_bound_to_the_kubeconfigs_own_serial_never_to_its_user() {
        let (_, binding) = sudo_objects("dave", "4f1e");
        assert_eq!(
            binding["subjects"],
            json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                    "name": vcp_core::revocation::group_of("4f1e")}])
        );
        // Two kubeconfigs of one user: two roles, each bound to its own certificate only.
        let (a, b) = (sudo_objects("dave", "aa").1, sudo_objects("dave", "bb").1);
        assert_ne!(a["metadata"]["name"], b["metadata"]["name"]);
        assert_ne!(a["subjects"], b["subjects"]);
    }

    fn sudoer(user: &str, serial: &str) -> Sudoer {
        Sudoer {
            user: user.into(),
            serial: serial.into(),
        }
    }

    fn names(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|x| (*x).to_owned()).collect()
    }

    #[test]
    fn the_sudo_plan_writes_live_kubeconfigs_and_deletes_every_other_sudo_object() {
        let live = [sudoer("dave", "aa"), sudoer("erin", "bb")];
        // aa complete, bb without its binding; cc revoked or expired; a user-bound role of
        // old (a digest name); the level binding and other vcp objects are not sudo's.
        let roles = names(&["vcp:sudo:aa", "vcp:sudo:bb", "vcp:sudo:cc", "vcp:coredns"]);
        let bindings = names(&[
            "vcp:sudo",
            "vcp:view",
            "vcp:sudo:aa",
            "vcp:sudo:cc",
            "vcp:sudo:0123456789abcdef0123",
        ]);
        let plan = sudo_plan(&live, &roles, &bindings);
        assert_eq!(plan.write, vec![&live[1]]);
        assert_eq!(plan.delete_roles, names(&["vcp:sudo:cc"]));
        assert_eq!(
            plan.delete_bindings,
            names(&["vcp:sudo:0123456789abcdef0123", "vcp:sudo:cc"])
        );
        // Applied, the plan has nothing left to do.
        let roles = names(&["vcp:sudo:aa", "vcp:sudo:bb", "vcp:coredns"]);
        let bindings = names(&["vcp:sudo", "vcp:view", "vcp:sudo:aa", "vcp:sudo:bb"]);
        assert_eq!(sudo_plan(&live, &roles, &bindings), SudoPlan::default());
        // No live sudoer: every sudo object goes, nothing else does.
        let plan = sudo_plan(&[], &roles, &bindings);
        assert!(plan.write.is_empty());
        assert_eq!(plan.delete_roles, names(&["vcp:sudo:aa", "vcp:sudo:bb"]));
        assert_eq!(plan.delete_bindings, names(&["vcp:sudo:aa", "vcp:sudo:bb"]));
    }

    #[test]
    fn sudo_names_are_object_names_and_differ_per_serial() {
        let serial = "7f".repeat(16);
        let n = sudo_name(&serial);
        assert_eq!(n.len(), SUDO_PREFIX.len() + 32);
        assert!(!n.contains(['/', '%']), "{n}");
        assert_ne!(sudo_name("aa"), sudo_name("ab"));
        assert!(!level_binding_name(SUDO_AS_GROUP).starts_with(SUDO_PREFIX));
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
