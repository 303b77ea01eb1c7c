//! Which local executable stands for which container image (pure).
//!
//! There is no container runtime: an image is a name for a binary that `tests/kube-bin`
//! built, that the workspace built, or that a Debian package installed. The table:
//!
//! | image | executable |
//! | --- | --- |
//! | `registry.k8s.io/kube-apiserver:vX.Y.Z` (also controller-manager, scheduler, kubectl) | `<bin-dir>/kube-apiserver-vX.Y.Z` |
//! | `registry.k8s.io/etcd:X.Y.Z-N` | `<bin-dir>/etcd-vX.Y.Z`; also `etcdctl-vX.Y.Z`, `etcdutl-vX.Y.Z` |
//! | `registry.k8s.io/coredns/coredns:vX.Y.Z` | `<bin-dir>/coredns-vX.Y.Z` |
//! | `<any registry>/vcp-syncer:<any tag>` | `<workspace-bin-dir>/vcp-syncer` |
//! | `<any registry>/vcp:<any tag>` | `<workspace-bin-dir>/vcp` (`vcp serve`, and its `tool` commands: snapshots) |
//! | `<any registry>/postgres:<major>[.minor][-variant]` | entrypoint `<workspace-bin-dir>/vcp-devnode-postgres` (as the official image's `docker-entrypoint.sh`), then the tools of `<postgres-dir>/<major>/bin` (Debian's `postgresql-<major>`) |
//! | `vcp.dev/host:<any tag>` | `command[0]`, looked up on the node's `PATH` (test pods) |
//!
//! The image's own binary is its entrypoint. A container `command` whose first word names that
//! binary (`etcd`, `/usr/local/bin/kube-apiserver`, ...) runs it with the rest as arguments;
//! any other first word is not in the image and fails like a missing executable would. The etcd
//! image, like the real one, also holds `etcdctl` and `etcdutl` (snapshots, health checks).
//!
//! An image may also have a default command (`CMD`: the Postgres image's is `postgres`, used
//! when the container gives neither command nor args), environment (below the pod's: the
//! Postgres image puts its tools on `PATH` and sets `PGDATA`) and users (see
//! [`crate::identity`]). Only the Postgres image has any of these.

use crate::identity::ImageUser;
use std::path::{Path, PathBuf};

/// Where executables come from.
#[derive(Debug, Clone)]
pub struct ImageDirs {
    /// `tests/kube-bin`'s cache (`~/.cache/vcp/bin`).
    pub bin_dir: PathBuf,
    /// The workspace's cargo target directory with `vcp-syncer`.
    pub workspace_bin_dir: PathBuf,
    /// Debian's PostgreSQL installations, one directory per major version
    /// (`/usr/lib/postgresql`).
    pub postgres_dir: PathBuf,
    /// `PATH` for `vcp.dev/host` images.
    pub host_path: Vec<PathBuf>,
}

/// Debian's directory of PostgreSQL installations.
pub const DEBIAN_POSTGRES_DIR: &str = "/usr/lib/postgresql";

/// The runtime's default `PATH`, as containerd sets it.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The official Postgres image's `postgres` user.
const POSTGRES_USER: ImageUser = ImageUser {
    name: "postgres",
    uid: 999,
    gid: 999,
    home: "/var/lib/postgresql",
};

/// Why an image cannot run; shown in the container's waiting reason as `ErrImagePull`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("image {0:?} is not known to the devnode (see docs/dev-cluster.md for the table)")]
    Unknown(String),
    #[error("image {image:?} maps to {path}, which is not built")]
    NotBuilt { image: String, path: PathBuf },
    #[error("image {image:?} maps to {path}, which is not installed (Debian package {package})")]
    NotInstalled {
        image: String,
        path: PathBuf,
        package: String,
    },
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

/// What an image holds, beyond `vcp.dev/host` (which holds the node's `PATH`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Named executables as (name, path), the entrypoint first.
    binaries: Vec<(&'static str, PathBuf)>,
    /// More executables: any file of this directory, by name (the Postgres tools), and the
    /// package that installs it.
    tools: Option<(PathBuf, String)>,
    /// The default command (`CMD`): the entrypoint's arguments when the container gives
    /// neither command nor args.
    cmd: Vec<String>,
    /// The image's environment; the pod's env overrides it.
    pub env: Vec<(String, String)>,
    /// The users the image's `/etc/passwd` holds.
    pub users: Vec<ImageUser>,
}

impl Image {
    fn of(binaries: Vec<(&'static str, PathBuf)>) -> Image {
        Image {
            binaries,
            tools: None,
            cmd: Vec::new(),
            env: Vec::new(),
            users: Vec::new(),
        }
    }
}

fn split_image(image: &str) -> (&str, &str) {
    // The tag follows the last ':' after the last '/' (a registry may carry a port).
    let slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[slash..].rfind(':') {
        Some(i) => (&image[..slash + i], &image[slash + i + 1..]),
        None => (image, "latest"),
    }
}

/// What `image` holds; `None` for `vcp.dev/host`.
pub fn lookup(image: &str, dirs: &ImageDirs) -> Result<Option<Image>, ImageError> {
    let (repo, tag) = split_image(image);
    let unknown = || ImageError::Unknown(image.to_owned());
    let kube = |component: &'static str| -> Result<_, ImageError> {
        tag.starts_with('v')
            .then(|| {
                Some(Image::of(vec![(
                    component,
                    dirs.bin_dir.join(format!("{component}-{tag}")),
                )]))
            })
            .ok_or_else(unknown)
    };
    let name = repo.rsplit('/').next();
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
            Some(Image::of(
                ["etcd", "etcdctl", "etcdutl"]
                    .map(|b| (b, dirs.bin_dir.join(format!("{b}-v{release}"))))
                    .into(),
            ))
        }
        _ if name == Some("vcp-syncer") => Some(Image::of(vec![(
            "vcp-syncer",
            dirs.workspace_bin_dir.join("vcp-syncer"),
        )])),
        _ if name == Some("vcp") => {
            Some(Image::of(vec![("vcp", dirs.workspace_bin_dir.join("vcp"))]))
        }
        _ if name == Some("postgres") => Some(postgres(tag, dirs).ok_or_else(unknown)?),
        _ => None,
    };
    found.map(Some).ok_or_else(unknown)
}

/// The official Postgres image of `tag` (`15`, `15.8`, `15-bookworm`): its major version's
/// Debian installation behind our stand-in for its entrypoint.
fn postgres(tag: &str, dirs: &ImageDirs) -> Option<Image> {
    let major: String = tag.chars().take_while(char::is_ascii_digit).collect();
    let rest = &tag[major.len()..];
    // `latest` and `alpine` name no major version: which server they hold is not known.
    if major.is_empty() || !(rest.is_empty() || rest.starts_with(['.', '-'])) {
        return None;
    }
    let bin = dirs.postgres_dir.join(&major).join("bin");
    Some(Image {
        binaries: vec![(
            "docker-entrypoint.sh",
            dirs.workspace_bin_dir.join("vcp-devnode-postgres"),
        )],
        tools: Some((bin.clone(), format!("postgresql-{major}"))),
        cmd: vec!["postgres".into()],
        env: vec![
            ("PATH".into(), format!("{}:{DEFAULT_PATH}", bin.display())),
            ("PG_MAJOR".into(), major),
            ("PGDATA".into(), "/var/lib/postgresql/data".into()),
            // The official image's en_US.utf8 is not generated here; C.UTF-8 always is, and
            // gives the same UTF8 encoding.
            ("LANG".into(), "C.UTF-8".into()),
        ],
        users: vec![POSTGRES_USER],
    })
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
    match lookup(image, dirs)? {
        None => {
            let tail = |skip: usize| command.iter().skip(skip).chain(args).cloned().collect();
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
        Some(img) => img.resolve(image, command, args, exists),
    }
}

impl Image {
    /// [`resolve`] within this image (named `image` in errors).
    pub fn resolve(
        &self,
        image: &str,
        command: &[String],
        args: &[String],
        exists: impl Fn(&Path) -> bool,
    ) -> Result<Exec, ImageError> {
        let no_such = |command: &str| ImageError::NoSuchCommand {
            image: image.to_owned(),
            command: command.to_owned(),
        };
        // Kubernetes: no command runs the entrypoint with the args, or with the image's CMD
        // when there are no args either; a command replaces both.
        let (path, rest): (PathBuf, Vec<String>) = match command.first() {
            None => {
                let args = if args.is_empty() {
                    self.cmd.clone()
                } else {
                    args.to_vec()
                };
                (self.binaries[0].1.clone(), args)
            }
            Some(first) => {
                let name = first.rsplit('/').next().unwrap_or(first);
                let named = self
                    .binaries
                    .iter()
                    .find(|(b, _)| *b == name)
                    .map(|(_, p)| p.clone());
                let tool = || {
                    let (dir, _) = self.tools.as_ref()?;
                    // A bare name, or a path into the tools' directory.
                    let plain =
                        !first.contains('/') || Path::new(first).parent() == Some(dir.as_path());
                    let valid = plain && !name.is_empty() && name != "." && name != "..";
                    valid.then(|| dir.join(name)).filter(|p| exists(p))
                };
                let path = named.or_else(tool).ok_or_else(|| no_such(first))?;
                (path, command[1..].iter().chain(args).cloned().collect())
            }
        };
        // Only the binary that runs has to be there: an etcd server needs no etcdctl.
        if !exists(&path) {
            return Err(ImageError::NotBuilt {
                image: image.to_owned(),
                path,
            });
        }
        // The Postgres entrypoint runs the package's server: it must be installed too.
        if let Some((dir, package)) = &self.tools {
            let server = dir.join("postgres");
            if !exists(&server) {
                return Err(ImageError::NotInstalled {
                    image: image.to_owned(),
                    path: server,
                    package: package.clone(),
                });
            }
        }
        Ok(Exec {
            program: path,
            args: rest,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs() -> ImageDirs {
        ImageDirs {
            bin_dir: "/cache".into(),
            workspace_bin_dir: "/ws".into(),
            postgres_dir: "/pg".into(),
            host_path: vec!["/usr/bin".into(), "/bin".into()],
        }
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    fn run(image: &str, command: &[&str], args: &[&str]) -> Result<Exec, ImageError> {
        resolve(image, &s(command), &s(args), &dirs(), |p| {
            p.starts_with("/cache")
                || p.starts_with("/ws")
                || ["postgres", "pg_isready", "psql"]
                    .iter()
                    .any(|t| p == Path::new("/pg/15/bin").join(t))
                || p == Path::new("/bin/sleep")
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
    fn postgres_images_run_our_entrypoint_then_debians_server_of_their_major_version() {
        for image in [
            "postgres:15",
            "docker.io/library/postgres:15.8",
            "mirror.example.com:5000/postgres:15-bookworm",
        ] {
            // The chart gives neither command nor args: the entrypoint with CMD `postgres`.
            let e = run(image, &[], &[]).unwrap();
            assert_eq!(e.program, Path::new("/ws/vcp-devnode-postgres"), "{image}");
            assert_eq!(e.args, ["postgres"]);
        }
        let e = run("postgres:15", &[], &["-c", "max_connections=50"]).unwrap();
        assert_eq!(e.program, Path::new("/ws/vcp-devnode-postgres"));
        assert_eq!(e.args, ["-c", "max_connections=50"], "args replace CMD");
        let e = run(
            "postgres:15",
            &["/usr/local/bin/docker-entrypoint.sh", "postgres"],
            &[],
        )
        .unwrap();
        assert_eq!(e.program, Path::new("/ws/vcp-devnode-postgres"));
        assert_eq!(e.args, ["postgres"]);
        // The probes' pg_isready, and any other tool of the package, by name or by its path.
        let e = run(
            "postgres:15",
            &["pg_isready", "-U", "vcp", "-h", "127.0.0.1"],
            &[],
        )
        .unwrap();
        assert_eq!(e.program, Path::new("/pg/15/bin/pg_isready"));
        assert_eq!(e.args, ["-U", "vcp", "-h", "127.0.0.1"]);
        let e = run("postgres:15", &["/pg/15/bin/psql"], &["-c", "select 1"]).unwrap();
        assert_eq!(e.program, Path::new("/pg/15/bin/psql"));
        let e = run("postgres:15", &["postgres", "--version"], &[]).unwrap();
        assert_eq!(e.program, Path::new("/pg/15/bin/postgres"));
        for outside in ["sh", "/bin/sleep", "../bin/psql", "/pg/15/psql"] {
            assert!(
                matches!(
                    run("postgres:15", &[outside], &[]),
                    Err(ImageError::NoSuchCommand { .. })
                ),
                "{outside}"
            );
        }
    }

    #[test]
    fn postgres_images_carry_their_environment_and_user() {
        let img = lookup("postgres:15", &dirs()).unwrap().unwrap();
        let env: std::collections::BTreeMap<_, _> = img.env.iter().cloned().collect();
        assert!(env["PATH"].starts_with("/pg/15/bin:"), "{}", env["PATH"]);
        assert_eq!(env["PGDATA"], "/var/lib/postgresql/data");
        assert_eq!(env["PG_MAJOR"], "15");
        assert_eq!(img.users, [POSTGRES_USER]);
        assert_eq!(POSTGRES_USER.uid, 999, "the official image's postgres user");
        let vcp = lookup("ghcr.io/vcp-dev/vcp:0.1.0", &dirs())
            .unwrap()
            .unwrap();
        assert!(vcp.env.is_empty() && vcp.users.is_empty());
    }

    #[test]
    fn postgres_images_without_an_installed_major_version_fail_naming_the_package() {
        let err = run("postgres:16", &[], &[]).unwrap_err();
        assert_eq!(
            err,
            ImageError::NotInstalled {
                image: "postgres:16".into(),
                path: "/pg/16/bin/postgres".into(),
                package: "postgresql-16".into(),
            }
        );
        assert!(err.to_string().contains("postgresql-16"), "{err}");
        for unknown in [
            "postgres",
            "postgres:latest",
            "postgres:alpine",
            "postgres:15alpha",
        ] {
            assert!(
                matches!(run(unknown, &[], &[]), Err(ImageError::Unknown(_))),
                "{unknown}"
            );
        }
        let missing_entrypoint =
            resolve("postgres:15", &[], &[], &dirs(), |p| p.starts_with("/pg"));
        assert!(matches!(
            missing_entrypoint,
            Err(ImageError::NotBuilt { path, .. }) if path == Path::new("/ws/vcp-devnode-postgres")
        ));
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
