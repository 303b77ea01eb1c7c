//! Starting one container as a process, and probing it.
//!
//! A container runs as `ip netns exec <pod netns> /bin/sh -c <mount script> ... -- <exe> <args>`.
//! `ip netns exec` gives the process the pod's network namespace and a private mount
//! namespace (slave to the host's) in which `/etc/netns/<netns>/hosts` is bind-mounted over
//! `/etc/hosts`; the script then bind-mounts each volume at its `mountPath` and execs the
//! binary. The mounts exist only in that namespace and vanish with the last process in it, so
//! nothing outlives the container. Missing mount points are created on the host filesystem as
//! empty directories (or empty files for a file subPath). A container with a `runAsUser`
//! (see [`crate::identity`]) then takes that identity through `setpriv`. Each container is its
//! own process group and dies with the devnode (parent-death signal).
//!
//! The program runs from its own path, unless a volume's `mountPath` covers that path (the
//! chart's Postgres mounts an emptyDir at `/tmp`, and a workspace cloned under `/tmp` holds
//! the program): then the program file is bound read-only at [`PROGRAM_DIR`]`/<name>` before
//! the volumes are mounted, and runs from there ([`place_program`]). That directory is outside
//! every volume (a volume mounted over it is refused), so nothing mounted later hides it, and
//! the pod's volumes get no files of ours. Binding the program back at its own path from a
//! descriptor opened before the mounts does not work with util-linux `mount`: it
//! canonicalizes `/proc/self/fd/N` to the link's text, the covered path, which by then names
//! the empty placeholder, so the empty file was bound on itself and `exec` failed with
//! "permission denied".

use crate::dns;
use crate::identity::RunAs;
use k8s_openapi::api::core::v1::{Container, Probe};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use vcp_dev::process::{self, ProcSpec, Spawned, Supervision};

/// Mounts each (source, target, ro|rw) triple, then execs the rest. Mount points it creates
/// are searchable by everyone (umask 022 in a subshell, leaving the container's own umask
/// alone), as a runtime makes them: a non-root container reaches a program bound below one.
const MOUNT_SCRIPT: &str = r#"set -e
while [ "$1" != "--" ]; do
  (umask 022; if [ -d "$1" ]; then mkdir -p "$2"; else mkdir -p "$(dirname "$2")"; [ -e "$2" ] || : > "$2"; fi)
  mount --bind "$1" "$2"
  if [ "$3" = ro ]; then mount -o remount,bind,ro "$2"; fi
  shift 3
done
shift
exec "$@"
"#;

/// util-linux's setpriv: how a container takes its `runAsUser` (by absolute path: the
/// container's `PATH` is the image's).
const SETPRIV: &str = "/usr/bin/setpriv";

/// A bind mount for a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub source: PathBuf,
    pub target: String,
    pub read_only: bool,
}

/// Where a program that a volume would hide is bound, in the container's mount namespace; its
/// mount point is created on the node's root filesystem, like any missing mount point.
pub const PROGRAM_DIR: &str = "/.vcp-devnode/bin";

/// A volume mounted where the devnode binds a program its volumes would hide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "volume mount at {target} covers {program}, and {PROGRAM_DIR} (where the devnode would run it from) is covered too"
)]
pub struct ProgramHidden {
    pub target: String,
    pub program: PathBuf,
}

/// Where `program` is executed from once `mounts` are made, and the bind mount that puts it
/// there when that is not its own path: its own path, unless a mount's target is that path
/// or a directory above it; then [`PROGRAM_DIR`]`/<file name>`, bound read-only from the
/// program before the covering mount hides it (see [`mount_order`]). A program that needs
/// no binding stays where it is, so programs that find their files next to themselves
/// (Debian's `postgres` finds its `share` directory from its own path) keep doing so.
pub fn place_program(
    program: &Path,
    mounts: &[Mount],
) -> Result<(PathBuf, Option<Mount>), ProgramHidden> {
    let Some(cover) = mounts
        .iter()
        .find(|m| program.starts_with(Path::new(&m.target)))
    else {
        return Ok((program.to_owned(), None));
    };
    let dir = Path::new(PROGRAM_DIR);
    if let Some(m) = mounts.iter().find(|m| {
        let t = Path::new(&m.target);
        dir.starts_with(t) || t.starts_with(dir)
    }) {
        return Err(ProgramHidden {
            target: m.target.clone(),
            program: program.to_owned(),
        });
    }
    let name = program.file_name().unwrap_or(program.as_os_str());
    let placed = dir.join(name);
    tracing::debug!(program = %program.display(), covered_by = %cover.target, at = %placed.display(),
        "program covered by a volume: bound at the devnode's program directory");
    let bind = Mount {
        source: program.to_owned(),
        target: placed.display().to_string(),
        read_only: true,
    };
    Ok((placed, Some(bind)))
}

/// The order to make `mounts` in: each source must still be reachable when it is mounted,
/// so a mount whose target covers another's source (an emptyDir at `/tmp` while the
/// devnode's state, where volumes live, is under `/tmp`) comes after the others; those, and
/// the covering ones among themselves, keep parents before children (shallower targets
/// first, otherwise as given). A covering mount below another covering one is not
/// supported: its source is hidden by then.
pub fn mount_order(mounts: &[Mount]) -> Vec<&Mount> {
    let covers = |m: &Mount| {
        mounts
            .iter()
            .any(|o| o.source.starts_with(Path::new(&m.target)))
    };
    let depth = |m: &Mount| Path::new(&m.target).components().count();
    let mut ordered: Vec<&Mount> = mounts.iter().collect();
    ordered.sort_by_key(|m| (covers(m), depth(m)));
    ordered
}

/// Everything needed to start a container process.
#[derive(Debug, Clone)]
pub struct Launch {
    pub name: String,
    pub netns: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
    pub working_dir: Option<String>,
    pub log: PathBuf,
    /// Another identity than the devnode's, taken after the mounts (which need root).
    pub run_as: Option<RunAs>,
}

/// Starts the container process.
pub fn start(l: &Launch) -> vcp_dev::Result<Spawned> {
    let mut spec = ProcSpec::new(&l.name, "ip").args([
        "netns",
        "exec",
        &l.netns,
        "/bin/sh",
        "-c",
        MOUNT_SCRIPT,
        "sh",
    ]);
    for m in mount_order(&l.mounts) {
        spec = spec.args([
            m.source.to_string_lossy().into_owned(),
            m.target.clone(),
            if m.read_only { "ro" } else { "rw" }.to_owned(),
        ]);
    }
    spec = spec.arg("--");
    if let Some(r) = &l.run_as {
        spec = spec.arg(SETPRIV).args(r.setpriv_args());
    }
    spec = spec
        .arg(l.program.to_string_lossy())
        .args(l.args.iter().cloned());
    spec.env = l.env.clone();
    spec.clear_env = true;
    spec.cwd = l
        .working_dir
        .as_ref()
        .map(PathBuf::from)
        .filter(|p| p.is_dir());
    if let Some(parent) = l.log.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&l.log)
    {
        let _ = writeln!(
            f,
            "--- vcp-devnode: starting {} {}",
            l.program.display(),
            l.args.join(" ")
        );
    }
    process::spawn(&spec, Supervision::Attached, &l.log)
}

/// The environment of a container: the pod basics, then its `env` (already resolved by the
/// caller from envFrom, valueFrom and literals, in that order of precedence).
pub fn base_env(hostname: &str) -> Vec<(String, String)> {
    vec![
        (
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        ("HOSTNAME".into(), hostname.to_owned()),
        // The host apiserver, through the devnode's gateway forwarder; the name (not an IP)
        // matches the apiserver's certificate and resolves through the pod's hosts file.
        (
            "KUBERNETES_SERVICE_HOST".into(),
            format!("kubernetes.default.svc.{}", dns::CLUSTER_DOMAIN),
        ),
        ("KUBERNETES_SERVICE_PORT".into(), "443".into()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".into(), "443".into()),
    ]
}

/// Result of one probe attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeResult {
    Success,
    Failure,
}

/// Runs one probe against a container at `ip`. `exec` resolves an exec probe's command.
pub async fn probe(
    p: &Probe,
    ip: IpAddr,
    container: &Container,
    exec: impl FnOnce(&[String]) -> Option<(PathBuf, Vec<String>, String)>,
) -> ProbeResult {
    let timeout = Duration::from_secs(p.timeout_seconds.unwrap_or(1).max(1) as u64);
    let ok = tokio::time::timeout(timeout, async {
        if let Some(h) = &p.http_get {
            let port = port_of(&h.port, container)?;
            let host = h.host.clone().unwrap_or_else(|| ip.to_string());
            let scheme = h.scheme.as_deref().unwrap_or("HTTP").to_ascii_lowercase();
            let path = h.path.clone().unwrap_or_else(|| "/".into());
            let url = format!(
                "{scheme}://{}/{}",
                fmt_host_port(&host, port),
                path.trim_start_matches('/')
            );
            // Like a kubelet: HTTPS probes do not verify the serving certificate.
            let client = reqwest::Client::builder()
                .tls_danger_accept_invalid_certs(true)
                .timeout(timeout)
                .build()
                .ok()?;
            let mut req = client.get(&url);
            for hdr in h.http_headers.iter().flatten() {
                req = req.header(&hdr.name, &hdr.value);
            }
            let resp = req.send().await.ok()?;
            let code = resp.status().as_u16();
            return Some((200..400).contains(&code));
        }
        if let Some(t) = &p.tcp_socket {
            let port = port_of(&t.port, container)?;
            return Some(tokio::net::TcpStream::connect((ip, port)).await.is_ok());
        }
        if let Some(e) = &p.exec {
            let (program, args, netns) = exec(e.command.as_deref().unwrap_or_default())?;
            let status = tokio::process::Command::new("ip")
                .args(["netns", "exec", &netns])
                .arg(program)
                .args(args)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .status()
                .await
                .ok()?;
            return Some(status.success());
        }
        None
    })
    .await;
    match ok {
        Ok(Some(true)) => ProbeResult::Success,
        _ => ProbeResult::Failure,
    }
}

fn fmt_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A probe's port, by number or by the container's port name.
pub fn port_of(
    port: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString,
    container: &Container,
) -> Option<u16> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    match port {
        IntOrString::Int(n) => u16::try_from(*n).ok(),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

/// Log file of a container, named so a person finds it: `<ns>_<pod>_<container>.log`.
pub fn log_path(logs: &Path, ns: &str, pod: &str, container: &str) -> PathBuf {
    logs.join(format!("{ns}_{pod}_{container}.log"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    #[test]
    fn mounts_covering_another_mounts_source_come_last_and_parents_before_children() {
        let m = |source: &str, target: &str| Mount {
            source: source.into(),
            target: target.into(),
            read_only: false,
        };
        let mounts = [
            m("/tmp/state/pods/u/etc/passwd", "/etc/passwd"),
            m("/tmp/state/pods/u/volumes/data/sub", "/var/lib/data/sub"),
            m("/tmp/state/pods/u/volumes/tmp", "/tmp"),
            m("/tmp/state/volumes/pvc-1", "/var/lib/data"),
            m("/tmp/state/pods/u/termination/c", "/dev/termination-log"),
        ];
        let order: Vec<&str> = mount_order(&mounts)
            .iter()
            .map(|m| m.target.as_str())
            .collect();
        assert_eq!(
            order,
            [
                "/etc/passwd",
                "/dev/termination-log",
                "/var/lib/data",
                "/var/lib/data/sub",
                "/tmp"
            ]
        );
    }

    #[test]
    fn a_program_under_a_volume_is_bound_outside_every_volume_before_the_volume_is_mounted() {
        let m = |source: &str, target: &str| Mount {
            source: source.into(),
            target: target.into(),
            read_only: false,
        };
        // The chart's Postgres in a workspace cloned under /tmp, with the devnode's state
        // under /tmp too: the emptyDir at /tmp covers the entrypoint.
        let program = Path::new("/tmp/ci-clone1/target/debug/vcp-devnode-postgres");
        let mut mounts = vec![
            m("/tmp/state/pods/u/volumes/data", "/var/lib/postgresql/data"),
            m("/tmp/state/pods/u/volumes/tmp", "/tmp"),
            m("/tmp/state/pods/u/etc/passwd", "/etc/passwd"),
        ];
        let (placed, bind) = place_program(program, &mounts).unwrap();
        assert_eq!(placed, Path::new("/.vcp-devnode/bin/vcp-devnode-postgres"));
        let bind = bind.unwrap();
        assert_eq!(
            bind,
            Mount {
                source: program.to_owned(),
                target: "/.vcp-devnode/bin/vcp-devnode-postgres".into(),
                read_only: true
            }
        );
        mounts.push(bind);
        let order: Vec<&str> = mount_order(&mounts)
            .iter()
            .map(|m| m.target.as_str())
            .collect();
        let at = |t: &str| order.iter().position(|o| *o == t).unwrap();
        assert!(
            at("/.vcp-devnode/bin/vcp-devnode-postgres") < at("/tmp"),
            "bound while its source is still visible: {order:?}"
        );
        // A volume at the program's own path (a file subPath) covers it too.
        let (placed, _) = place_program(
            Path::new("/ws/vcp"),
            &[m("/tmp/state/pods/u/volumes/b/vcp", "/ws/vcp")],
        )
        .unwrap();
        assert_eq!(placed, Path::new("/.vcp-devnode/bin/vcp"));
    }

    #[test]
    fn a_program_no_volume_covers_runs_from_its_own_path() {
        let m = |target: &str| Mount {
            source: "/state/v".into(),
            target: target.into(),
            read_only: false,
        };
        // Debian's postgres finds its share directory from its own path: it stays there.
        let program = Path::new("/usr/lib/postgresql/15/bin/postgres");
        let mounts = [
            m("/tmp"),
            m("/usr/lib/postgresql/15/binaries"),
            m("/var/run"),
        ];
        assert_eq!(
            place_program(program, &mounts).unwrap(),
            (program.to_owned(), None)
        );
        assert_eq!(
            place_program(program, &[]).unwrap(),
            (program.to_owned(), None)
        );
    }

    #[test]
    fn a_covered_program_with_a_volume_over_the_program_directory_is_refused() {
        let m = |target: &str| Mount {
            source: "/state/v".into(),
            target: target.into(),
            read_only: false,
        };
        for over in ["/", "/.vcp-devnode", "/.vcp-devnode/bin/x"] {
            let err = place_program(Path::new("/tmp/ws/vcp"), &[m("/tmp"), m(over)]).unwrap_err();
            assert_eq!(err.target, over);
            assert!(err.to_string().contains("/tmp/ws/vcp"), "{err}");
        }
    }

    #[test]
    fn named_probe_ports_resolve_through_the_container() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "etcd", "ports": [{"name": "metrics", "containerPort": 2381}],
        }))
        .unwrap();
        assert_eq!(
            port_of(&IntOrString::String("metrics".into()), &c),
            Some(2381)
        );
        assert_eq!(port_of(&IntOrString::Int(2379), &c), Some(2379));
        assert_eq!(port_of(&IntOrString::String("nope".into()), &c), None);
        assert_eq!(port_of(&IntOrString::Int(70000), &c), None);
    }
}
