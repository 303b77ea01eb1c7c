//! Who a container's process runs as (pure).
//!
//! The devnode runs as root, and until a pod asks otherwise its containers do too. A pod or
//! container `securityContext` with `runAsUser` makes the container's process run as that uid
//! ([`RunAs`], applied with `setpriv` after the container's mounts are in place), with
//! `runAsGroup` (else the image user's group for that uid, else 0, as a runtime does), the
//! pod's `supplementalGroups` and `fsGroup` as supplementary groups, and no new privileges when
//! `allowPrivilegeEscalation` is false. `runAsNonRoot` is enforced as a kubelet does: a
//! container that would run as uid 0 does not start.
//!
//! Images here have no `USER` of their own (the devnode does not model it): without
//! `runAsUser` a container runs as root, so `runAsNonRoot` without `runAsUser` refuses to start,
//! where a real runtime would have used the image's user.
//!
//! Some images expect their users to exist (`initdb` looks its own uid up): such an image
//! declares them ([`ImageUser`]) and the container sees the machine's `/etc/passwd` and
//! `/etc/group` with those users in place of any of the same name or id ([`passwd_with`],
//! [`group_with`]), mounted in its own mount namespace only.

use k8s_openapi::api::core::v1::{PodSecurityContext, SecurityContext};

/// A user an image's `/etc/passwd` holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageUser {
    pub name: &'static str,
    pub uid: u32,
    pub gid: u32,
    pub home: &'static str,
}

/// The identity a container's process takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, sorted, without duplicates.
    pub groups: Vec<u32>,
    pub no_new_privs: bool,
}

/// Why a container may not start as asked (`CreateContainerConfigError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The kubelet's own wording for both cases.
    #[error("container's runAsUser breaks non-root policy (container: {0})")]
    RootUser(String),
    #[error(
        "container has runAsNonRoot and image will run as root (container: {0}; the devnode's images have no USER: set runAsUser)"
    )]
    RootImage(String),
    #[error("invalid {field} {value} (container: {container})")]
    OutOfRange {
        field: &'static str,
        value: i64,
        container: String,
    },
}

/// The identity of `container` in a pod with `pod` security context; `None` when it runs as
/// the devnode's own user (root) with nothing to change.
pub fn run_as(
    pod: Option<&PodSecurityContext>,
    container_name: &str,
    container: Option<&SecurityContext>,
    image_users: &[ImageUser],
) -> Result<Option<RunAs>, IdentityError> {
    let id = |field: &'static str, v: i64| {
        u32::try_from(v).map_err(|_| IdentityError::OutOfRange {
            field,
            value: v,
            container: container_name.to_owned(),
        })
    };
    let uid = container
        .and_then(|c| c.run_as_user)
        .or_else(|| pod?.run_as_user)
        .map(|v| id("runAsUser", v))
        .transpose()?;
    let non_root = container
        .and_then(|c| c.run_as_non_root)
        .or_else(|| pod?.run_as_non_root)
        .unwrap_or(false);
    match uid {
        Some(0) if non_root => return Err(IdentityError::RootUser(container_name.to_owned())),
        None if non_root => return Err(IdentityError::RootImage(container_name.to_owned())),
        _ => {}
    }
    let gid = container
        .and_then(|c| c.run_as_group)
        .or_else(|| pod?.run_as_group)
        .map(|v| id("runAsGroup", v))
        .transpose()?;
    let mut groups = pod
        .and_then(|p| p.supplemental_groups.clone())
        .unwrap_or_default()
        .into_iter()
        .chain(pod.and_then(|p| p.fs_group))
        .map(|g| id("supplementalGroups", g))
        .collect::<Result<Vec<u32>, _>>()?;
    groups.sort_unstable();
    groups.dedup();
    let no_new_privs = container.and_then(|c| c.allow_privilege_escalation) == Some(false);
    if uid.unwrap_or(0) == 0 && gid.unwrap_or(0) == 0 && groups.is_empty() && !no_new_privs {
        return Ok(None);
    }
    let uid = uid.unwrap_or(0);
    let gid = gid
        .or_else(|| image_users.iter().find(|u| u.uid == uid).map(|u| u.gid))
        .unwrap_or(0);
    Ok(Some(RunAs {
        uid,
        gid,
        groups,
        no_new_privs,
    }))
}

impl RunAs {
    /// `setpriv` arguments that take this identity and then run the command that follows
    /// them. The parent-death signal is set again: changing the uid clears it, and a container
    /// must die with its devnode.
    pub fn setpriv_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--reuid={}", self.uid),
            format!("--regid={}", self.gid),
        ];
        if self.groups.is_empty() {
            args.push("--clear-groups".into());
        } else {
            let list: Vec<String> = self.groups.iter().map(u32::to_string).collect();
            args.push(format!("--groups={}", list.join(",")));
        }
        if self.no_new_privs {
            args.push("--no-new-privs".into());
        }
        args.push("--pdeathsig=KILL".into());
        args.push("--".into());
        args
    }
}

/// `host` (an `/etc/passwd`) as the image sees it: the image's users replace any line with
/// the same name or uid (the machine's `postgres` is uid 101, the image's is 999), the rest
/// stays.
pub fn passwd_with(host: &str, users: &[ImageUser]) -> String {
    let mut out = kept_lines(host, |name, id| {
        users
            .iter()
            .any(|u| u.name == name || u.uid.to_string() == id)
    });
    for u in users {
        out.push_str(&format!(
            "{}:x:{}:{}::{}:/usr/sbin/nologin\n",
            u.name, u.uid, u.gid, u.home
        ));
    }
    out
}

/// `host` (an `/etc/group`) with a group per image user, replacing any with its name or gid.
pub fn group_with(host: &str, users: &[ImageUser]) -> String {
    let mut out = kept_lines(host, |name, id| {
        users
            .iter()
            .any(|u| u.name == name || u.gid.to_string() == id)
    });
    for u in users {
        out.push_str(&format!("{}:x:{}:\n", u.name, u.gid));
    }
    out
}

/// The lines of a passwd or group file that `replaced(name, id)` does not claim.
fn kept_lines(host: &str, replaced: impl Fn(&str, &str) -> bool) -> String {
    let mut out = String::new();
    for line in host.lines() {
        let mut fields = line.split(':');
        let name = fields.next().unwrap_or_default();
        let id = fields.nth(1).unwrap_or_default();
        if !replaced(name, id) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const POSTGRES: ImageUser = ImageUser {
        name: "postgres",
        uid: 999,
        gid: 999,
        home: "/var/lib/postgresql",
    };

    fn pod(v: serde_json::Value) -> PodSecurityContext {
        serde_json::from_value(v).unwrap()
    }

    fn ctr(v: serde_json::Value) -> SecurityContext {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn without_a_security_context_containers_run_as_the_devnode_user() {
        assert_eq!(run_as(None, "c", None, &[]), Ok(None));
        let p = pod(serde_json::json!({"seccompProfile": {"type": "RuntimeDefault"}}));
        assert_eq!(run_as(Some(&p), "c", None, &[POSTGRES]), Ok(None));
    }

    #[test]
    fn the_charts_postgres_pod_runs_as_999_with_its_fs_group() {
        let p = pod(serde_json::json!({
            "runAsNonRoot": true, "runAsUser": 999, "runAsGroup": 999, "fsGroup": 999,
        }));
        let c = ctr(serde_json::json!({
            "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]},
        }));
        let r = run_as(Some(&p), "postgresql", Some(&c), &[POSTGRES])
            .unwrap()
            .unwrap();
        assert_eq!(
            r,
            RunAs {
                uid: 999,
                gid: 999,
                groups: vec![999],
                no_new_privs: true
            }
        );
        assert_eq!(
            r.setpriv_args(),
            [
                "--reuid=999",
                "--regid=999",
                "--groups=999",
                "--no-new-privs",
                "--pdeathsig=KILL",
                "--"
            ]
        );
    }

    #[test]
    fn the_container_context_overrides_the_pods_and_the_group_falls_back_to_the_images_user() {
        let p = pod(serde_json::json!({"runAsUser": 1000, "supplementalGroups": [7, 5, 7]}));
        let c = ctr(serde_json::json!({"runAsUser": 999}));
        let r = run_as(Some(&p), "c", Some(&c), &[POSTGRES])
            .unwrap()
            .unwrap();
        assert_eq!((r.uid, r.gid, r.groups.clone()), (999, 999, vec![5, 7]));
        assert!(!r.no_new_privs);
        assert!(r.setpriv_args().contains(&"--groups=5,7".to_owned()));
        // A uid the image does not know gets group 0, as from a runtime.
        let r = run_as(Some(&p), "c", None, &[POSTGRES]).unwrap().unwrap();
        assert_eq!((r.uid, r.gid), (1000, 0));
        let r = run_as(
            Some(&pod(serde_json::json!({"runAsUser": 65532}))),
            "c",
            None,
            &[],
        )
        .unwrap()
        .unwrap();
        assert!(r.setpriv_args().contains(&"--clear-groups".to_owned()));
    }

    #[test]
    fn run_as_non_root_refuses_root_as_a_kubelet_does() {
        let p = pod(serde_json::json!({"runAsNonRoot": true}));
        assert_eq!(
            run_as(Some(&p), "vcp", None, &[]),
            Err(IdentityError::RootImage("vcp".into()))
        );
        let c = ctr(serde_json::json!({"runAsUser": 0}));
        assert_eq!(
            run_as(Some(&p), "vcp", Some(&c), &[]),
            Err(IdentityError::RootUser("vcp".into()))
        );
        // The container may lift the pod's requirement.
        let c = ctr(serde_json::json!({"runAsNonRoot": false}));
        assert_eq!(run_as(Some(&p), "vcp", Some(&c), &[]), Ok(None));
        let c = ctr(serde_json::json!({"runAsUser": -1}));
        assert!(matches!(
            run_as(None, "vcp", Some(&c), &[]),
            Err(IdentityError::OutOfRange { .. })
        ));
    }

    #[test]
    fn image_users_replace_the_machines_entries_of_the_same_name_or_id() {
        let host = "root:x:0:0:root:/root:/bin/bash\npostgres:x:101:104::/var/lib/postgresql:/bin/bash\nnobody:x:65534:65534::/:/x";
        assert_eq!(
            passwd_with(host, &[POSTGRES]),
            "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/:/x\npostgres:x:999:999::/var/lib/postgresql:/usr/sbin/nologin\n"
        );
        assert_eq!(passwd_with(host, &[]), format!("{host}\n"));
        assert_eq!(
            group_with(
                "root:x:0:\nsystemd-journal:x:999:\npostgres:x:104:\n",
                &[POSTGRES]
            ),
            "root:x:0:\npostgres:x:999:\n"
        );
    }
}
