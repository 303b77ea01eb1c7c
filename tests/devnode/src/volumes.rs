//! Volume contents (pure) and how they land on disk.
//!
//! Secret, ConfigMap, downwardAPI and projected volumes become a set of files computed from the
//! API objects ([`files_for`]); the devnode writes them with [`write_atomic`] into the pod's
//! volume directory, which is bind-mounted at each container's `mountPath`. Updates must be
//! atomic for readers, as with a kubelet: the files live in a fresh hidden directory, a
//! `..data` symlink is swapped to it in one rename, and every visible entry is a symlink through
//! `..data`. A bind mount of the volume directory therefore sees every update.

use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, ObjectFieldSelector, Pod, Secret, Volume,
};
use kube::ResourceExt;
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

/// One file of a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeFile {
    /// Relative path inside the volume.
    pub path: String,
    pub data: Vec<u8>,
    pub mode: u32,
}

/// Why a volume cannot be built (the pod waits with this reason, as with a kubelet).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeError {
    #[error("secret {0:?} not found")]
    SecretMissing(String),
    #[error("configmap {0:?} not found")]
    ConfigMapMissing(String),
    #[error("key {key:?} not found in {kind} {name:?}")]
    KeyMissing {
        kind: &'static str,
        name: String,
        key: String,
    },
    #[error("path {0:?} must be relative and stay inside the volume")]
    BadPath(String),
    #[error("unsupported field {0:?} in a downward API volume")]
    UnsupportedField(String),
    #[error("unsupported volume type in volume {0:?}")]
    Unsupported(String),
}

/// What a volume is on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// Files the devnode writes (and refreshes).
    Files(Vec<VolumeFile>),
    /// A plain directory: emptyDir (under the pod dir) or an existing path (PVC, hostPath).
    Dir(Option<PathBuf>),
}

/// Everything a volume may read from the API, fetched by the caller.
#[derive(Debug, Default, Clone)]
pub struct Inputs {
    pub secrets: BTreeMap<String, Secret>,
    pub config_maps: BTreeMap<String, ConfigMap>,
    /// Service-account tokens by (audience, expiration seconds).
    pub tokens: BTreeMap<(String, i64), String>,
    /// hostPath of the PV bound to each claim.
    pub claim_paths: BTreeMap<String, PathBuf>,
}

const DEFAULT_MODE: u32 = 0o644;

fn check_path(p: &str) -> Result<String, VolumeError> {
    let path = Path::new(p);
    let ok = !p.is_empty()
        && path
            .components()
            .all(|c| matches!(c, Component::Normal(n) if !n.to_string_lossy().starts_with("..")));
    ok.then(|| p.to_owned())
        .ok_or_else(|| VolumeError::BadPath(p.to_owned()))
}

fn keyed(
    kind: &'static str,
    name: &str,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
    optional: bool,
) -> Result<Vec<VolumeFile>, VolumeError> {
    let mode = default_mode.map_or(DEFAULT_MODE, |m| m as u32);
    match items {
        None => data
            .iter()
            .map(|(k, v)| {
                Ok(VolumeFile {
                    path: check_path(k)?,
                    data: v.clone(),
                    mode,
                })
            })
            .collect(),
        Some(items) => items
            .iter()
            .filter_map(|item| match data.get(&item.key) {
                Some(v) => Some(Ok(VolumeFile {
                    path: match check_path(&item.path) {
                        Ok(p) => p,
                        Err(e) => return Some(Err(e)),
                    },
                    data: v.clone(),
                    mode: item.mode.map_or(mode, |m| m as u32),
                })),
                None if optional => None,
                None => Some(Err(VolumeError::KeyMissing {
                    kind,
                    name: name.to_owned(),
                    key: item.key.clone(),
                })),
            })
            .collect(),
    }
}

fn secret_data(s: &Secret) -> BTreeMap<String, Vec<u8>> {
    let mut out: BTreeMap<String, Vec<u8>> = s
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    for (k, v) in s.string_data.iter().flatten() {
        out.insert(k.clone(), v.clone().into_bytes());
    }
    out
}

fn config_map_data(c: &ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut out: BTreeMap<String, Vec<u8>> = c
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
        .collect();
    for (k, v) in c.binary_data.iter().flatten() {
        out.insert(k.clone(), v.0.clone());
    }
    out
}

/// A pod field as the downward API renders it (`metadata.labels` as `key="value"` lines).
pub fn pod_field(pod: &Pod, field: &ObjectFieldSelector) -> Result<String, VolumeError> {
    let path = field.field_path.as_str();
    let map_lines = |m: &BTreeMap<String, String>| {
        m.iter()
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let subscript = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_suffix("']"))
            .map(str::to_owned)
    };
    let status = pod.status.as_ref();
    let spec = pod.spec.as_ref();
    Ok(match path {
        "metadata.name" => pod.name_any(),
        "metadata.namespace" => pod.namespace().unwrap_or_default(),
        "metadata.uid" => pod.uid().unwrap_or_default(),
        "metadata.labels" => map_lines(pod.labels()),
        "metadata.annotations" => map_lines(pod.annotations()),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" => status.and_then(|s| s.pod_ip.clone()).unwrap_or_default(),
        "status.hostIP" => status.and_then(|s| s.host_ip.clone()).unwrap_or_default(),
        "status.podIPs" => status
            .and_then(|s| s.pod_ips.as_ref())
            .map(|ips| {
                ips.iter()
                    .map(|i| i.ip.clone())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default(),
        _ => {
            if let Some(k) = subscript("metadata.labels['") {
                pod.labels().get(&k).cloned().unwrap_or_default()
            } else if let Some(k) = subscript("metadata.annotations['") {
                pod.annotations().get(&k).cloned().unwrap_or_default()
            } else {
                return Err(VolumeError::UnsupportedField(path.to_owned()));
            }
        }
    })
}

fn downward(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: Option<i32>,
) -> Result<Vec<VolumeFile>, VolumeError> {
    items
        .iter()
        .map(|item| {
            let value = match (&item.field_ref, &item.resource_field_ref) {
                (Some(f), _) => pod_field(pod, f)?,
                // Processes here are not resource-limited; report "no limit" as 0.
                (None, Some(_)) => "0".to_owned(),
                (None, None) => return Err(VolumeError::UnsupportedField(item.path.clone())),
            };
            Ok(VolumeFile {
                path: check_path(&item.path)?,
                data: value.into_bytes(),
                mode: item
                    .mode
                    .or(default_mode)
                    .map_or(DEFAULT_MODE, |m| m as u32),
            })
        })
        .collect()
}

/// The service-account token requests a pod's volumes need: (audience, expiration seconds).
pub fn token_requests(pod: &Pod) -> Vec<(String, i64)> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.projected.as_ref())
        .flat_map(|p| p.sources.iter().flatten())
        .filter_map(|s| s.service_account_token.as_ref())
        .map(|t| {
            (
                t.audience.clone().unwrap_or_default(),
                t.expiration_seconds.unwrap_or(3600),
            )
        })
        .collect()
}

/// What `volume` of `pod` consists of, given the fetched inputs.
pub fn files_for(pod: &Pod, volume: &Volume, inputs: &Inputs) -> Result<Backing, VolumeError> {
    if volume.empty_dir.is_some() {
        return Ok(Backing::Dir(None));
    }
    if let Some(h) = &volume.host_path {
        return Ok(Backing::Dir(Some(PathBuf::from(&h.path))));
    }
    if let Some(c) = &volume.persistent_volume_claim {
        // An unbound claim waits; the caller retries.
        let path = inputs.claim_paths.get(&c.claim_name).cloned();
        return path.map(|p| Backing::Dir(Some(p))).ok_or_else(|| {
            VolumeError::Unsupported(format!(
                "{} (claim {} not bound)",
                volume.name, c.claim_name
            ))
        });
    }
    let secret = |name: &str, items: Option<&[KeyToPath]>, mode, optional: bool| match inputs
        .secrets
        .get(name)
    {
        Some(s) => keyed("secret", name, &secret_data(s), items, mode, optional),
        None if optional => Ok(Vec::new()),
        None => Err(VolumeError::SecretMissing(name.to_owned())),
    };
    let config_map = |name: &str, items: Option<&[KeyToPath]>, mode, optional: bool| match inputs
        .config_maps
        .get(name)
    {
        Some(c) => keyed(
            "configmap",
            name,
            &config_map_data(c),
            items,
            mode,
            optional,
        ),
        None if optional => Ok(Vec::new()),
        None => Err(VolumeError::ConfigMapMissing(name.to_owned())),
    };
    if let Some(s) = &volume.secret {
        let name = s.secret_name.clone().unwrap_or_default();
        return Ok(Backing::Files(secret(
            &name,
            s.items.as_deref(),
            s.default_mode,
            s.optional == Some(true),
        )?));
    }
    if let Some(c) = &volume.config_map {
        return Ok(Backing::Files(config_map(
            &c.name,
            c.items.as_deref(),
            c.default_mode,
            c.optional == Some(true),
        )?));
    }
    if let Some(d) = &volume.downward_api {
        return Ok(Backing::Files(downward(
            pod,
            d.items.as_deref().unwrap_or_default(),
            d.default_mode,
        )?));
    }
    if let Some(p) = &volume.projected {
        let mut files = Vec::new();
        for src in p.sources.iter().flatten() {
            if let Some(s) = &src.secret {
                files.extend(secret(
                    &s.name,
                    s.items.as_deref(),
                    p.default_mode,
                    s.optional == Some(true),
                )?);
            }
            if let Some(c) = &src.config_map {
                files.extend(config_map(
                    &c.name,
                    c.items.as_deref(),
                    p.default_mode,
                    c.optional == Some(true),
                )?);
            }
            if let Some(d) = &src.downward_api {
                files.extend(downward(
                    pod,
                    d.items.as_deref().unwrap_or_default(),
                    p.default_mode,
                )?);
            }
            if let Some(t) = &src.service_account_token {
                let key = (
                    t.audience.clone().unwrap_or_default(),
                    t.expiration_seconds.unwrap_or(3600),
                );
                let token = inputs.tokens.get(&key).ok_or_else(|| {
                    VolumeError::Unsupported(format!("{} (token not issued yet)", volume.name))
                })?;
                files.push(VolumeFile {
                    path: check_path(&t.path)?,
                    data: token.clone().into_bytes(),
                    mode: p.default_mode.map_or(DEFAULT_MODE, |m| m as u32),
                });
            }
        }
        return Ok(Backing::Files(files));
    }
    Err(VolumeError::Unsupported(volume.name.clone()))
}

/// Writes `files` into `dir` atomically for readers (see the module docs). Returns whether
/// anything changed.
pub fn write_atomic(dir: &Path, files: &[VolumeFile]) -> std::io::Result<bool> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    let data_link = dir.join("..data");
    let current = std::fs::read_link(&data_link).ok().map(|t| dir.join(t));
    if let Some(cur) = &current
        && same_content(cur, files)
    {
        return Ok(false);
    }
    let stamp = format!(
        "..{}",
        time::OffsetDateTime::now_utc().unix_timestamp_nanos()
    );
    let fresh = dir.join(&stamp);
    std::fs::create_dir(&fresh)?;
    for f in files {
        let path = fresh.join(&f.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, &f.data)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(f.mode))?;
    }
    let tmp_link = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp_link);
    std::os::unix::fs::symlink(&stamp, &tmp_link)?;
    std::fs::rename(&tmp_link, &data_link)?;
    let top: std::collections::BTreeSet<String> = files
        .iter()
        .filter_map(|f| f.path.split('/').next().map(str::to_owned))
        .collect();
    for name in &top {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), &link)?;
        }
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("..") {
            if name != "..data" && name != stamp {
                std::fs::remove_dir_all(entry.path())?;
            }
        } else if !top.contains(&name) {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(true)
}

/// Creates an emptyDir's directory as a kubelet does: world-writable (0777, kubernetes
/// `pkg/volume/emptydir`), so a container running as a user of its own can write there (make a
/// socket, say). Only a directory created now is given that mode: an `fsGroup` may have
/// changed it since.
pub fn make_empty_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    // Set after creation: the process umask would take bits off a mode given to mkdir.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
}

/// Gives `dir` and everything below it to group `gid` as a kubelet applies `fsGroup`: group
/// ownership, group read and write (and search on directories), setgid directories so what
/// the pod creates stays in the group. Symbolic links are re-owned, never followed.
pub fn give_to_group(dir: &Path, gid: u32) -> std::io::Result<()> {
    give_tree(dir, gid, 0o2770, 0o660)
}

/// [`give_to_group`] for a read-only volume (Secret, ConfigMap, projected, downward API): the
/// group may read and search, not write, as a kubelet leaves such volumes. The files' own
/// modes must already carry group read ([`group_readable`]), so that rewriting them on the
/// next sync is not mistaken for a change.
pub fn give_to_group_read_only(dir: &Path, gid: u32) -> std::io::Result<()> {
    give_tree(dir, gid, 0o2550, 0o440)
}

/// `files` with group read added to each mode, as an `fsGroup` makes read-only volume files.
pub fn group_readable(files: Vec<VolumeFile>) -> Vec<VolumeFile> {
    files
        .into_iter()
        .map(|f| VolumeFile {
            mode: f.mode | 0o440,
            ..f
        })
        .collect()
}

fn give_tree(path: &Path, gid: u32, dir_bits: u32, file_bits: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(path)?;
    std::os::unix::fs::lchown(path, None, Some(gid))?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let mode = meta.permissions().mode() & 0o7777;
    let extra = if meta.is_dir() { dir_bits } else { file_bits };
    if mode | extra != mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode | extra))?;
    }
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            give_tree(&entry?.path(), gid, dir_bits, file_bits)?;
        }
    }
    Ok(())
}

fn same_content(dir: &Path, files: &[VolumeFile]) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let count = walk_count(dir);
    count == files.len()
        && files.iter().all(|f| {
            let p = dir.join(&f.path);
            std::fs::read(&p).is_ok_and(|d| d == f.data)
                && std::fs::metadata(&p).is_ok_and(|m| m.permissions().mode() & 0o7777 == f.mode)
        })
}

fn walk_count(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| {
                    if e.path().is_dir() {
                        walk_count(&e.path())
                    } else {
                        1
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_dir_is_world_writable_when_made_and_left_alone_after() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("volumes").join("scratch");
        make_empty_dir(&dir).unwrap();
        let mode = |d: &Path| std::fs::metadata(d).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&dir), 0o777);
        // An fsGroup applied since keeps its mode on the next sync.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o2770)).unwrap();
        make_empty_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o2770);
    }

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "etcd-0", "namespace": "cp", "uid": "u1", "labels": {"app": "etcd"}},
            "spec": {"containers": [], "nodeName": "devnode-0"},
            "status": {"podIP": "10.245.0.4"},
        }))
        .unwrap()
    }

    fn volume(v: serde_json::Value) -> Volume {
        serde_json::from_value(v).unwrap()
    }

    fn inputs() -> Inputs {
        let mut i = Inputs::default();
        i.secrets.insert(
            "certs".into(),
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "certs"},
                "data": {"tls.crt": "Q0VSVA==", "tls.key": "S0VZ"},
            }))
            .unwrap(),
        );
        i
    }

    #[test]
    fn an_fs_group_owns_a_volume_tree_and_may_write_it() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("vol");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/file"), b"x").unwrap();
        std::fs::set_permissions(
            root.join("sub/file"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.join("link")).unwrap();
        let before = std::fs::metadata("/etc/hostname").unwrap();
        // Our own group: no privilege needed to give files to it.
        let gid = nix::unistd::getegid().as_raw();
        give_to_group(&root, gid).unwrap();
        let mode = |p: &str| {
            std::fs::metadata(root.join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode("") & 0o2070, 0o2070, "setgid, group rwx");
        assert_eq!(mode("sub") & 0o2070, 0o2070);
        assert_eq!(mode("sub/file"), 0o660);
        assert_eq!(std::fs::metadata(root.join("sub/file")).unwrap().gid(), gid);
        let after = std::fs::metadata("/etc/hostname").unwrap();
        assert_eq!(
            (before.mode(), before.gid()),
            (after.mode(), after.gid()),
            "a link's target is left alone"
        );
    }

    #[test]
    fn an_fs_group_may_read_a_secret_volume_and_a_resync_changes_nothing() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("secret");
        let files = group_readable(vec![VolumeFile {
            path: "tls.key".into(),
            data: b"KEY".to_vec(),
            mode: 0o400,
        }]);
        assert_eq!(files[0].mode, 0o440, "defaultMode 0400 under an fsGroup");
        let gid = nix::unistd::getegid().as_raw();
        assert!(write_atomic(&root, &files).unwrap());
        give_to_group_read_only(&root, gid).unwrap();
        let key = std::fs::metadata(root.join("tls.key")).unwrap();
        assert_eq!((key.permissions().mode() & 0o7777, key.gid()), (0o440, gid));
        assert!(
            !write_atomic(&root, &files).unwrap(),
            "the next sync finds the same files"
        );
    }

    #[test]
    fn a_secret_volume_has_one_file_per_key_or_per_item() {
        let all = files_for(
            &pod(),
            &volume(serde_json::json!({"name": "c", "secret": {"secretName": "certs"}})),
            &inputs(),
        )
        .unwrap();
        let Backing::Files(files) = all else { panic!() };
        assert_eq!(files.len(), 2);
        assert_eq!(
            files[0],
            VolumeFile {
                path: "tls.crt".into(),
                data: b"CERT".to_vec(),
                mode: 0o644
            }
        );
        let some = files_for(
            &pod(),
            &volume(serde_json::json!({"name": "c", "secret": {"secretName": "certs", "defaultMode": 0o600,
                "items": [{"key": "tls.key", "path": "keys/server.key"}]}})),
            &inputs(),
        )
        .unwrap();
        assert_eq!(
            some,
            Backing::Files(vec![VolumeFile {
                path: "keys/server.key".into(),
                data: b"KEY".to_vec(),
                mode: 0o600
            }])
        );
    }

    #[test]
    fn missing_secrets_and_keys_are_errors_unless_optional() {
        let v = volume(serde_json::json!({"name": "c", "secret": {"secretName": "nope"}}));
        assert_eq!(
            files_for(&pod(), &v, &inputs()),
            Err(VolumeError::SecretMissing("nope".into()))
        );
        let v = volume(
            serde_json::json!({"name": "c", "secret": {"secretName": "nope", "optional": true}}),
        );
        assert_eq!(files_for(&pod(), &v, &inputs()), Ok(Backing::Files(vec![])));
        let v = volume(
            serde_json::json!({"name": "c", "secret": {"secretName": "certs", "items": [{"key": "ca.crt", "path": "ca"}]}}),
        );
        assert!(matches!(
            files_for(&pod(), &v, &inputs()),
            Err(VolumeError::KeyMissing { .. })
        ));
    }

    #[test]
    fn paths_cannot_escape_the_volume() {
        for bad in ["../etc/passwd", "/abs", "a/../../b", "..data"] {
            let v = volume(
                serde_json::json!({"name": "c", "secret": {"secretName": "certs", "items": [{"key": "tls.crt", "path": bad}]}}),
            );
            assert!(
                matches!(
                    files_for(&pod(), &v, &inputs()),
                    Err(VolumeError::BadPath(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn downward_api_renders_pod_fields() {
        let v = volume(serde_json::json!({"name": "d", "downwardAPI": {"items": [
            {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "app", "fieldRef": {"fieldPath": "metadata.labels['app']"}},
        ]}}));
        let Backing::Files(f) = files_for(&pod(), &v, &inputs()).unwrap() else {
            panic!()
        };
        let text: Vec<_> = f
            .iter()
            .map(|f| String::from_utf8(f.data.clone()).unwrap())
            .collect();
        assert_eq!(text, ["etcd-0", "app=\"etcd\"", "etcd"]);
    }

    #[test]
    fn atomic_writes_swap_the_data_link_and_prune_removed_keys() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        let f = |path: &str, data: &str| VolumeFile {
            path: path.into(),
            data: data.into(),
            mode: 0o644,
        };
        assert!(write_atomic(&dir, &[f("a", "1"), f("sub/b", "2")]).unwrap());
        assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "1");
        assert_eq!(std::fs::read_to_string(dir.join("sub/b")).unwrap(), "2");
        assert!(
            !write_atomic(&dir, &[f("a", "1"), f("sub/b", "2")]).unwrap(),
            "unchanged content rewrote"
        );
        assert!(write_atomic(&dir, &[f("a", "3")]).unwrap());
        assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "3");
        assert!(!dir.join("sub").exists());
        let hidden: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("..") && n != "..data")
            .collect();
        assert_eq!(hidden.len(), 1, "old generations left: {hidden:?}");
    }
}
