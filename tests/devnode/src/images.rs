//! Which local executable stands for which container image (pure).
//!
//! There is no container runtime: an image is a name for a binary that `tests/kube-bin`
//! built, or that the workspace built. The table:
//!
//! | image | executable |
//! | --- | --- |
//! | `registry.k8s.io/kube-apiserver:vX.Y.Z` (also controller-manager, scheduler, kubectl) | `<bin-dir>/kube-apiserver-vX.Y.Z` |
//! | `registry.k8s.io/etcd:X.Y.Z-N` | `<bin-dir>/etcd-vX.Y.Z`; also `etcdctl-vX.Y.Z`, `etcdutl-vX.Y.Z` |
//! | `registry.k8s.io/coredns/coredns:vX.Y.Z` | `<bin-dir>/coredns-vX.Y.Z` |
//! | `<any registry>/vcp-syncer:<any tag>` | `<workspace-bin-dir>/vcp-syncer` |
//! | `<any registry>/vcp:<any tag>` | `<workspace-bin-dir>/vcp` (its `tool` commands: snapshots) |
//! | `vcp.dev/host:<any tag>` | `command[0]`, looked up on the node's `PATH` (test pods) |
//!
//! The image's own binary is its entrypoint. A container `command` whose first word names that
//! binary (`etcd`, `/usr/local/bin/kube-apiserver`, ...) runs it with the rest as arguments;
//! any other first word is not in the image and fails like a missing executable would. The etcd
//! image, like the real one, also holds `etcdctl` and `etcdutl` (snapshots, health checks).

use std::path::{Path, PathBuf};

/// Where executables come from.
#[derive(Debug, Clone)]
pub struct ImageDirs {
    /// `tests/kube-bin`'s cache (`~/.cache/vcp/bin`).
    pub bin_dir: PathBuf,
    /// The workspace's cargo target directory with `vcp-syncer`.
    pub workspace_bin_dir: PathBuf,
    /// `PATH` for `vcp.dev/host` images.
    pub host_path: Vec<PathBuf>,
}

/// Why an image cannot run; shown in the container's waiting reason as `ErrImagePull`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("image {0:?} is not known to the devnode (see docs/dev-cluster.md for the table)")]
    Unknown(String),
    #[error("image {image:?} maps to {path}, which is not built")]
    NotBuilt { image: String, path: PathBuf },
    #[error("executable {command:?} is not in image {image:?}")]
    NoSuchCommand { image: String, command: String },
    #[error("image {0:?} needs a command")]
    NoCommand(String),
}

/// What to execute for a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exec {
    pub program: PathBuf,
    pub args: Vec<String>,
}

fn split_image(image: &str) -> (&str, &str) {
    // The tag follows the last ':' after the last '/' (a registry may carry a port).
    let slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[slash..].rfind(':') {
        Some(i) => (&image[..slash + i], &image[slash + i + 1..]),
        None => (image, "latest"),
    }
}

/// The binaries an image holds as (name, path), its entrypoint first; `None` for `vcp.dev/host`.
fn binaries(
    image: &str,
    dirs: &ImageDirs,
) -> Result<Option<Vec<(&'static str, PathBuf)>>, ImageError> {
    let (repo, tag) = split_image(image);
    let unknown = || ImageError::Unknown(image.to_owned());
    let kube = |component: &'static str| -> Result<_, ImageError> {
        tag.starts_with('v')
            .then(|| {
                Some(vec![(
                    component,
                    dirs.bin_dir.join(format!("{component}-{tag}")),
                )])
            })
            .ok_or_else(unknown)
    };
    let found = match repo {
        "vcp.dev/host" => return Ok(None),
        "registry.k8s.io/kube-apiserver" => kube("kube-apiserver")?,
        "registry.k8s.io/kube-controller-manager" => kube("kube-controller-manager")?,
        "registry.k8s.io/kube-scheduler" => kube("kube-scheduler")?,
        "registry.k8s.io/kubectl" => kube("kubectl")?,
        "registry.k8s.io/coredns/coredns" => kube("coredns")?,
        "registry.k8s.io/etcd" => {
            // etcd images are tagged 3.6.16-0: the release plus an image revision.
            let release = tag.split('-').next().unwrap_or(tag);
            Some(
                ["etcd", "etcdctl", "etcdutl"]
                    .map(|b| (b, dirs.bin_dir.join(format!("{b}-v{release}"))))
                    .into(),
            )
        }
        r if r.rsplit('/').next() == Some("vcp-syncer") => Some(vec![(
            "vcp-syncer",
            dirs.workspace_bin_dir.join("vcp-syncer"),
        )]),
        r if r.rsplit('/').next() == Some("vcp") => {
            Some(vec![("vcp", dirs.workspace_bin_dir.join("vcp"))])
        }
        _ => None,
    };
    found.map(Some).ok_or_else(unknown)
}

/// Resolves a container's image, command and args to an executable and its arguments.
/// `exists` says whether a path is an executable file (injected to keep this pure).
pub fn resolve(
    image: &str,
    command: &[String],
    args: &[String],
    dirs: &ImageDirs,
    exists: impl Fn(&Path) -> bool,
) -> Result<Exec, ImageError> {
    let tail = |skip: usize| command.iter().skip(skip).chain(args).cloned().collect();
    match binaries(image, dirs)? {
        None => {
            let first = command
                .first()
                .ok_or_else(|| ImageError::NoCommand(image.to_owned()))?;
            let program = if first.contains('/') {
                Some(PathBuf::from(first)).filter(|p| exists(p))
            } else {
                dirs.host_path
                    .iter()
                    .map(|d| d.join(first))
                    .find(|p| exists(p))
            };
            let program = program.ok_or_else(|| ImageError::NoSuchCommand {
                image: image.to_owned(),
                command: first.clone(),
            })?;
            Ok(Exec {
                program,
                args: tail(1),
            })
        }
        Some(binaries) => {
            let (path, skip) = match command.first() {
                None => (binaries[0].1.clone(), 0),
                Some(first) => {
                    let name = first.rsplit('/').next();
                    let (_, path) =
                        binaries
                            .iter()
                            .find(|(b, _)| Some(*b) == name)
                            .ok_or_else(|| ImageError::NoSuchCommand {
                                image: image.to_owned(),
                                command: first.clone(),
                            })?;
                    (path.clone(), 1)
                }
            };
            // Only the binary that runs has to be built: an etcd server needs no etcdctl.
            if !exists(&path) {
                return Err(ImageError::NotBuilt {
                    image: image.to_owned(),
                    path,
                });
            }
            Ok(Exec {
                program: path,
                args: tail(skip),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs() -> ImageDirs {
        ImageDirs {
            bin_dir: "/cache".into(),
            workspace_bin_dir: "/ws".into(),
            host_path: vec!["/usr/bin".into(), "/bin".into()],
        }
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    fn run(image: &str, command: &[&str], args: &[&str]) -> Result<Exec, ImageError> {
        resolve(image, &s(command), &s(args), &dirs(), |p| {
            p.starts_with("/cache") || p.starts_with("/ws") || p == Path::new("/bin/sleep")
        })
    }

    #[test]
    fn vcp_images_map_to_the_workspace_build() {
        let e = run("ghcr.io/vcp-dev/vcp:0.1.0", &["vcp", "tool"], &["x"]).unwrap();
        assert_eq!(e.program, Path::new("/ws/vcp"));
        assert_eq!(e.args, ["tool", "x"]);
        let e = run("vcp.dev/vcp-syncer:dev", &[], &[]).unwrap();
        assert_eq!(e.program, Path::new("/ws/vcp-syncer"));
        assert!(matches!(
            run("ghcr.io/vcp-dev/vcp:0.1.0", &["sh"], &[]),
            Err(ImageError::NoSuchCommand { .. })
        ));
    }

    #[test]
    fn kubernetes_images_map_to_the_cached_build_of_their_version() {
        let e = run(
            "registry.k8s.io/kube-apiserver:v1.36.4",
            &["kube-apiserver", "--v=2"],
            &[],
        )
        .unwrap();
        assert_eq!(e.program, Path::new("/cache/kube-apiserver-v1.36.4"));
        assert_eq!(e.args, ["--v=2"]);
        let e = run(
            "registry.k8s.io/etcd:3.6.16-0",
            &["/usr/local/bin/etcd"],
            &["--name=a"],
        )
        .unwrap();
        assert_eq!(e.program, Path::new("/cache/etcd-v3.6.16"));
        assert_eq!(e.args, ["--name=a"]);
        let e = run(
            "registry.k8s.io/coredns/coredns:v1.15.0",
            &[],
            &["-conf", "/etc/coredns/Corefile"],
        )
        .unwrap();
        assert_eq!(e.program, Path::new("/cache/coredns-v1.15.0"));
        assert_eq!(e.args, ["-conf", "/etc/coredns/Corefile"]);
    }

    #[test]
    fn the_etcd_image_also_runs_etcdctl_and_etcdutl_of_its_release() {
        let image = "registry.k8s.io/etcd:3.6.16-0";
        let e = run(image, &[], &["--name=a"]).unwrap();
        assert_eq!(e.program, Path::new("/cache/etcd-v3.6.16"));
        assert_eq!(e.args, ["--name=a"]);
        let e = run(
            image,
            &["etcdctl", "--endpoints", "http://10.245.0.2:2379"],
            &["snapshot", "save", "/snap/db"],
        )
        .unwrap();
        assert_eq!(e.program, Path::new("/cache/etcdctl-v3.6.16"));
        assert_eq!(
            e.args,
            [
                "--endpoints",
                "http://10.245.0.2:2379",
                "snapshot",
                "save",
                "/snap/db"
            ]
        );
        let e = run(
            image,
            &["/usr/local/bin/etcdutl", "snapshot", "status", "/snap/db"],
            &[],
        )
        .unwrap();
        assert_eq!(e.program, Path::new("/cache/etcdutl-v3.6.16"));
        assert_eq!(e.args, ["snapshot", "status", "/snap/db"]);
        // The tools belong to the etcd image only.
        assert!(matches!(
            run("registry.k8s.io/kube-apiserver:v1.37.1", &["etcdctl"], &[]),
            Err(ImageError::NoSuchCommand { .. })
        ));
        assert!(matches!(
            run(image, &["kube-apiserver"], &[]),
            Err(ImageError::NoSuchCommand { .. })
        ));
    }

    #[test]
    fn a_missing_etcd_tool_fails_its_container_alone() {
        let image = "registry.k8s.io/etcd:3.6.16-0";
        let only_the_server = |p: &Path| p == Path::new("/cache/etcd-v3.6.16");
        let resolve = |command: &[&str]| resolve(image, &s(command), &[], &dirs(), only_the_server);
        assert_eq!(
            resolve(&["etcd"]).unwrap().program,
            Path::new("/cache/etcd-v3.6.16")
        );
        for tool in ["etcdctl", "etcdutl"] {
            let err = resolve(&[tool, "version"]).unwrap_err();
            let path = PathBuf::from(format!("/cache/{tool}-v3.6.16"));
            assert_eq!(
                err,
                ImageError::NotBuilt {
                    image: image.to_owned(),
                    path: path.clone()
                }
            );
            assert!(
                err.to_string().contains(&path.display().to_string()),
                "{err}"
            );
        }
    }

    #[test]
    fn the_syncer_image_maps_to_the_workspace_build_whatever_its_registry() {
        for image in [
            "vcp.dev/vcp-syncer:dev",
            "ghcr.io/acme/vcp-syncer:0.1.0",
            "localhost:5000/vcp-syncer",
        ] {
            assert_eq!(
                run(image, &[], &[]).unwrap().program,
                Path::new("/ws/vcp-syncer"),
                "{image}"
            );
        }
    }

    #[test]
    fn host_images_run_a_command_from_path() {
        let e = run("vcp.dev/host:any", &["sleep"], &["3600"]).unwrap();
        assert_eq!(e.program, Path::new("/bin/sleep"));
        assert_eq!(e.args, ["3600"]);
        assert!(matches!(
            run("vcp.dev/host:any", &[], &[]),
            Err(ImageError::NoCommand(_))
        ));
        assert!(matches!(
            run("vcp.dev/host:any", &["nope"], &[]),
            Err(ImageError::NoSuchCommand { .. })
        ));
    }

    #[test]
    fn unknown_images_and_foreign_commands_fail_clearly() {
        assert!(matches!(
            run("nginx:1.29", &[], &[]),
            Err(ImageError::Unknown(_))
        ));
        assert!(matches!(
            run("registry.k8s.io/kube-apiserver:latest", &[], &[]),
            Err(ImageError::Unknown(_))
        ));
        assert!(matches!(
            run(
                "registry.k8s.io/kube-apiserver:v1.37.1",
                &["sh", "-c", "x"],
                &[]
            ),
            Err(ImageError::NoSuchCommand { .. })
        ));
        let missing = resolve(
            "registry.k8s.io/kube-apiserver:v9.9.9",
            &[],
            &[],
            &dirs(),
            |_| false,
        );
        assert!(matches!(missing, Err(ImageError::NotBuilt { .. })));
    }
}
