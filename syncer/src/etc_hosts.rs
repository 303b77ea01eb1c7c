//! A pod's own name in its `/etc/hosts`, as the tenant names it.
//!
//! A kubelet writes each pod's `/etc/hosts`, and for a pod with a `subdomain` it adds the pod's
//! fully qualified name, `<hostname>.<subdomain>.<namespace>.svc.<domain>`, with the
//! namespace the kubelet sees: on the host, the tenant namespace's host name (`<key>-<ns>`).
//! `hostname -f`, a StatefulSet member announcing itself to its peers, and the conformance
//! suite's `/etc/hosts` test would all read a name the tenant's DNS does not know.
//! `hostAliases` cannot carry the right line (the pod's address is not known when the pod is
//! created), and an edit of the kubelet's file does not last: the kubelet writes it again each
//! time a container starts. What the kubelet leaves alone is a container that mounts its own
//! `/etc/hosts`. So the syncer gives such host pods ([`add`]):
//! - an `emptyDir` volume, [`NAME`];
//! - one init container first, [`NAME`]: this binary's `etc-hosts` command ([`run`]), which reads
//!   the kubelet's file (it mounts no `/etc/hosts` of its own, so it gets the kubelet's, with
//!   the pod's address) and writes it, with that one name spelled with the tenant's namespace
//!   ([`rewrite`]), into the volume;
//! - in every other container and init container that does not mount `/etc/hosts` itself, that
//!   file mounted at `/etc/hosts`.
//!
//! The init container runs as a non-root user with no capabilities, a read-only root file
//! system and the runtime's seccomp profile, so every Pod Security level admits it. The tenant
//! never sees any of it: the init container's status and the mount's status are left out of the
//! tenant pod's ([`hidden`]), and the kubelet's progress Events about the container are not
//! copied.

use crate::{Error, Result};
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, PodSpec, ResourceRequirements, SeccompProfile,
    SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::path::PathBuf;

/// The name of the init container and of its volume in host pods. A tenant pod that uses the
/// name itself (a container or a volume) does not get them: its own wins.
pub const NAME: &str = "vcp-etc-hosts";

/// Where the init container mounts the volume.
const DIR: &str = "/vcp-etc-hosts";

/// The file in the volume the other containers mount as `/etc/hosts`.
const FILE: &str = "hosts";

/// The kubelet's hosts file.
const ETC_HOSTS: &str = "/etc/hosts";

/// The user the init container runs as (the syncer image's own).
const USER: i64 = 65532;

/// `vcp-syncer etc-hosts`: writes a copy of a hosts file with the pod's own name respelled.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "vcp-syncer etc-hosts",
    about = "Writes the pod's hosts file with its fully qualified name in the tenant's namespace (the init container vcp adds)"
)]
pub struct Args {
    /// The domain the kubelet wrote (`<subdomain>.<host namespace>.svc.<domain>`).
    #[arg(long, env = "VCP_ETC_HOSTS_FROM")]
    pub from_domain: String,
    /// The domain the tenant knows (`<subdomain>.<namespace>.svc.<domain>`).
    #[arg(long, env = "VCP_ETC_HOSTS_TO")]
    pub to_domain: String,
    /// The kubelet's hosts file.
    #[arg(long, env = "VCP_ETC_HOSTS_SOURCE", default_value = ETC_HOSTS)]
    pub source: PathBuf,
    /// Where the copy goes (the file the pod's containers mount as `/etc/hosts`).
    #[arg(
        long,
        env = "VCP_ETC_HOSTS_TARGET",
        default_value = "/vcp-etc-hosts/hosts"
    )]
    pub target: PathBuf,
}

/// `text` with every name `<label>.<from>` (a single label, as a host name is) spelled
/// `<label>.<to>`, or `None` when no line has one. Comment lines are kept as they are; a line
/// that changes is written back with tabs between its fields, as the kubelet writes them.
pub fn rewrite(text: &str, from: &str, to: &str) -> Option<String> {
    let suffix = format!(".{from}");
    let rename = |name: &str| -> Option<String> {
        let label = name.strip_suffix(&suffix)?;
        (!label.is_empty() && !label.contains('.')).then(|| format!("{label}.{to}"))
    };
    let mut changed = false;
    let mut out = String::with_capacity(text.len() + 16);
    for line in text.split_inclusive('\n') {
        let body = line.trim_end_matches(['\n', '\r']);
        let fields: Vec<&str> = body.split_whitespace().collect();
        let hit = !body.trim_start().starts_with('#') && fields.iter().any(|f| rename(f).is_some());
        if !hit {
            out.push_str(line);
            continue;
        }
        changed = true;
        let fields: Vec<String> = fields
            .iter()
            .map(|f| rename(f).unwrap_or_else(|| (*f).to_owned()))
            .collect();
        out.push_str(&fields.join("\t"));
        out.push_str(&line[body.len()..]);
    }
    changed.then_some(out)
}

/// Whether host pod spec `spec` gets the hosts file: the kubelet writes a fully qualified name
/// (a `subdomain`, pod networking, not Windows) and the tenant did not take the name.
pub fn wanted(spec: &PodSpec) -> bool {
    let named = spec.subdomain.as_deref().is_some_and(|s| !s.is_empty());
    let host_network = spec.host_network == Some(true);
    let windows = spec.os.as_ref().is_some_and(|o| o.name == "windows");
    let taken = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .map(|c| c.name.as_str())
        .chain(
            spec.ephemeral_containers
                .iter()
                .flatten()
                .map(|c| c.name.as_str()),
        )
        .chain(spec.volumes.iter().flatten().map(|v| v.name.as_str()))
        .any(|n| n == NAME);
    named && !host_network && !windows && !taken
}

/// Gives `spec` (a host pod's, of a pod in tenant namespace `ns` and host namespace
/// `host_ns`) the volume, the init container (run from `image`, the syncer's own) and the
/// mounts, where [`wanted`].
pub fn add(spec: &mut PodSpec, image: &str, host_ns: &str, ns: &str, domain: &str) {
    // Asked first: every pod's translation comes here, and building the init container (its
    // strings and arguments) for the many pods without a subdomain was 6 % of the pod pass
    // (perf, docs/benchmarks.md).
    if !wanted(spec) {
        return;
    }
    let sub = spec.subdomain.clone().unwrap_or_default();
    attach(spec, init_container(image, &sub, host_ns, ns, domain));
}

/// [`add`] with the init container `fix` as given (a host pod's own, kept as it was created).
pub fn attach(spec: &mut PodSpec, fix: Container) {
    if !wanted(spec) {
        return;
    }
    let mount = VolumeMount {
        name: NAME.to_owned(),
        mount_path: ETC_HOSTS.to_owned(),
        sub_path: Some(FILE.to_owned()),
        ..Default::default()
    };
    let containers = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for c in containers {
        let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
        if !mounts
            .iter()
            .any(|m| m.mount_path.trim_end_matches('/') == ETC_HOSTS)
        {
            mounts.push(mount.clone());
        }
    }
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: NAME.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity("1Mi".to_owned())),
            ..Default::default()
        }),
        ..Default::default()
    });
    spec.init_containers
        .get_or_insert_with(Vec::new)
        .insert(0, fix);
}

/// Takes what [`add`] gave `spec` off again: for a host pod created without it, whose
/// containers, volumes and mounts can no longer change.
pub fn remove(spec: &mut PodSpec) {
    let ours = |n: &str| n == NAME;
    if let Some(init) = spec.init_containers.as_mut() {
        init.retain(|c| !ours(&c.name));
    }
    if spec.init_containers.as_ref().is_some_and(Vec::is_empty) {
        spec.init_containers = None;
    }
    if let Some(v) = spec.volumes.as_mut() {
        v.retain(|v| !ours(&v.name));
    }
    let containers = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for c in containers {
        if let Some(m) = c.volume_mounts.as_mut() {
            m.retain(|m| !ours(&m.name));
        }
        if c.volume_mounts.as_ref().is_some_and(Vec::is_empty) {
            c.volume_mounts = None;
        }
    }
}

/// Whether `spec` has what [`add`] gives.
pub fn present(spec: &PodSpec) -> bool {
    spec.init_containers
        .iter()
        .flatten()
        .any(|c| c.name == NAME)
}

/// The init container that copies the kubelet's file with `<subdomain>.<host_ns>.svc.<domain>`
/// spelled `<subdomain>.<ns>.svc.<domain>`. Its requests are token ones, so it barely moves
/// what the host's quota counts for the pod beside what the tenant's quota counted (an init
/// container counts only where it asks for more than the pod's containers together).
fn init_container(
    image: &str,
    subdomain: &str,
    host_ns: &str,
    ns: &str,
    domain: &str,
) -> Container {
    let q = |v: &str| Quantity(v.to_owned());
    Container {
        name: NAME.to_owned(),
        image: Some(image.to_owned()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        command: Some(vec!["vcp-syncer".to_owned(), "etc-hosts".to_owned()]),
        args: Some(vec![
            format!("--from-domain={subdomain}.{host_ns}.svc.{domain}"),
            format!("--to-domain={subdomain}.{ns}.svc.{domain}"),
            format!("--target={DIR}/{FILE}"),
        ]),
        resources: Some(ResourceRequirements {
            requests: Some([("cpu".into(), q("1m")), ("memory".into(), q("8Mi"))].into()),
            limits: Some([("cpu".into(), q("100m")), ("memory".into(), q("16Mi"))].into()),
            ..Default::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: NAME.to_owned(),
            mount_path: DIR.to_owned(),
            ..Default::default()
        }]),
        security_context: Some(SecurityContext {
            run_as_user: Some(USER),
            run_as_group: Some(USER),
            run_as_non_root: Some(true),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(k8s_openapi::api::core::v1::Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                add: None,
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                localhost_profile: None,
            }),
            ..Default::default()
        }),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Default::default()
    }
}

/// Whether a container, volume or mount status named `name` is the syncer's own, kept from
/// the tenant.
pub fn hidden(name: &str) -> bool {
    name == NAME
}

/// Writes the copy. The target is written whole, even when no line changed, so the pod's
/// containers always find a file to mount.
pub fn run(args: Args) -> Result<()> {
    let io = |what: &'static str, path: &PathBuf| {
        let path = path.clone();
        move |source| Error::Io { what, path, source }
    };
    let text =
        std::fs::read_to_string(&args.source).map_err(io("read the hosts file", &args.source))?;
    let done = rewrite(&text, &args.from_domain, &args.to_domain);
    let changed = done.is_some();
    std::fs::write(&args.target, done.unwrap_or(text))
        .map_err(io("write the hosts file", &args.target))?;
    println!(
        "{} -> {}: {}",
        args.source.display(),
        args.target.display(),
        if changed {
            format!("{} is now {}", args.from_domain, args.to_domain)
        } else {
            format!("no name in {}; copied as it is", args.from_domain)
        }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBELET: &str = "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n10.244.0.7\tweb-0.nginx.demo-apps.svc.cluster.local\tweb-0\n\n# Entries added by HostAliases.\n10.96.0.10\tkubernetes\tkubernetes.default\n";

    #[test]
    fn the_pods_own_name_is_spelled_with_the_tenant_namespace() {
        let done = rewrite(
            KUBELET,
            "nginx.demo-apps.svc.cluster.local",
            "nginx.apps.svc.cluster.local",
        )
        .unwrap();
        assert_eq!(
            done,
            KUBELET.replace(
                "web-0.nginx.demo-apps.svc.cluster.local",
                "web-0.nginx.apps.svc.cluster.local"
            )
        );
        // Respelled once: a second pass finds nothing to change.
        assert_eq!(
            rewrite(
                &done,
                "nginx.demo-apps.svc.cluster.local",
                "nginx.apps.svc.cluster.local"
            ),
            None
        );
    }

    #[test]
    fn only_a_host_name_under_the_exact_domain_changes() {
        let text = "# web-0.nginx.demo-apps.svc.cluster.local\n1.2.3.4 a.b.nginx.demo-apps.svc.cluster.local xnginx.demo-apps.svc.cluster.local\n1.2.3.5  web-0.nginx.demo-apps.svc.cluster.local.evil web-0\n";
        assert_eq!(
            rewrite(
                text,
                "nginx.demo-apps.svc.cluster.local",
                "nginx.apps.svc.cluster.local"
            ),
            None,
            "comments, deeper names, other domains and longer names stay"
        );
        assert_eq!(
            rewrite(
                "1.2.3.4  p.s.k-ns.svc.d   p\r\n",
                "s.k-ns.svc.d",
                "s.ns.svc.d"
            )
            .as_deref(),
            Some("1.2.3.4\tp.s.ns.svc.d\tp\r\n"),
            "line ending kept"
        );
        assert_eq!(
            rewrite("1.2.3.4 .s.k-ns.svc.d\n", "s.k-ns.svc.d", "s.ns.svc.d"),
            None
        );
    }

    fn spec(v: serde_json::Value) -> PodSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn only_pods_the_kubelet_names_in_full_get_the_file() {
        let base = serde_json::json!({"subdomain": "nginx", "containers": [{"name": "c"}]});
        assert!(wanted(&spec(base.clone())));
        let mut v = base.clone();
        v["subdomain"] = serde_json::json!("");
        assert!(!wanted(&spec(v)));
        for (field, value) in [
            ("hostNetwork", serde_json::json!(true)),
            ("os", serde_json::json!({"name": "windows"})),
            ("initContainers", serde_json::json!([{"name": NAME}])),
            ("ephemeralContainers", serde_json::json!([{"name": NAME}])),
            (
                "volumes",
                serde_json::json!([{"name": NAME, "emptyDir": {}}]),
            ),
        ] {
            let mut v = base.clone();
            v[field] = value;
            assert!(!wanted(&spec(v)), "{field}");
        }
    }

    #[test]
    fn every_container_but_one_with_its_own_hosts_file_mounts_the_copy() {
        let mut s = spec(serde_json::json!({
            "subdomain": "nginx",
            "containers": [
                {"name": "app"},
                {"name": "own", "volumeMounts": [{"name": "h", "mountPath": "/etc/hosts/"}]},
            ],
            "initContainers": [{"name": "setup"}],
            "volumes": [{"name": "h", "configMap": {"name": "h"}}],
        }));
        let before = s.clone();
        add(&mut s, "img:1", "demo-apps", "apps", "cluster.local");
        assert!(present(&s));
        let mounts = |c: &Container| -> Vec<(String, String, Option<String>)> {
            c.volume_mounts
                .iter()
                .flatten()
                .map(|m| (m.name.clone(), m.mount_path.clone(), m.sub_path.clone()))
                .collect()
        };
        let copy = (
            NAME.to_owned(),
            "/etc/hosts".to_owned(),
            Some("hosts".to_owned()),
        );
        assert_eq!(mounts(&s.containers[0]), std::slice::from_ref(&copy));
        assert_eq!(
            mounts(&s.containers[1]),
            mounts(&before.containers[1]),
            "its own wins"
        );
        let init = s.init_containers.as_ref().unwrap();
        assert_eq!(init[0].name, NAME, "first");
        assert_eq!(
            mounts(&init[0]),
            [(NAME.to_owned(), DIR.to_owned(), None)],
            "the kubelet's file, and the volume beside it"
        );
        assert_eq!(mounts(&init[1]), [copy]);
        let vol = s
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == NAME)
            .unwrap();
        assert!(vol.empty_dir.is_some());
        // Taken off again, the spec is the tenant's as it was.
        remove(&mut s);
        assert_eq!(s, before);
        assert!(!present(&s));
        // Nothing for a pod the kubelet does not name in full.
        let mut plain = spec(serde_json::json!({"containers": [{"name": "app"}]}));
        add(&mut plain, "img:1", "demo-apps", "apps", "cluster.local");
        assert!(!present(&plain) && plain.volumes.is_none());
    }

    #[test]
    fn the_container_runs_the_syncers_command_unprivileged() {
        let c = init_container("img:1", "nginx", "demo-apps", "apps", "cluster.local");
        assert_eq!(c.name, NAME);
        assert_eq!(
            c.command.as_deref(),
            Some(&["vcp-syncer".to_owned(), "etc-hosts".to_owned()][..])
        );
        let args = c.args.unwrap();
        assert_eq!(
            args,
            [
                "--from-domain=nginx.demo-apps.svc.cluster.local",
                "--to-domain=nginx.apps.svc.cluster.local",
                "--target=/vcp-etc-hosts/hosts",
            ]
        );
        let sc = c.security_context.unwrap();
        assert_eq!(
            (sc.run_as_user, sc.run_as_non_root),
            (Some(USER), Some(true))
        );
        assert_eq!(sc.capabilities.unwrap().drop.unwrap(), ["ALL"]);
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        // The restricted level admits it.
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [serde_json::to_value(init_container("i", "s", "a-b", "b", "d")).unwrap()],
                     "volumes": [{"name": NAME, "emptyDir": {}}]},
        }))
        .unwrap();
        let refusals =
            vcp_policy::pod_security::check(&pod, vcp_policy::pod_security::Level::Restricted);
        assert!(refusals.is_empty(), "{refusals:?}");
        // The command line parses as the binary reads it.
        let mut argv = vec!["vcp-syncer etc-hosts".to_owned()];
        argv.extend(args);
        let parsed = <Args as clap::Parser>::try_parse_from(argv).unwrap();
        assert_eq!(parsed.source, PathBuf::from("/etc/hosts"));
        assert_eq!(parsed.target, PathBuf::from("/vcp-etc-hosts/hosts"));
    }

    #[test]
    fn the_command_writes_the_copy() {
        let dir = std::env::temp_dir().join(format!("vcp-etc-hosts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (source, target) = (dir.join("hosts"), dir.join("copy"));
        std::fs::write(&source, KUBELET).unwrap();
        let args = |from: &str, src: &std::path::Path| Args {
            from_domain: from.into(),
            to_domain: "nginx.apps.svc.cluster.local".into(),
            source: src.to_owned(),
            target: target.clone(),
        };
        run(args("nginx.demo-apps.svc.cluster.local", &source)).unwrap();
        let text = std::fs::read_to_string(&target).unwrap();
        assert!(
            text.contains("\tweb-0.nginx.apps.svc.cluster.local\tweb-0\n"),
            "{text}"
        );
        assert_eq!(
            std::fs::read_to_string(&source).unwrap(),
            KUBELET,
            "the kubelet's stays"
        );
        // Nothing to respell: the copy is the kubelet's file.
        run(args("other.demo-apps.svc.cluster.local", &source)).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), KUBELET);
        let err = run(args("x", &dir.join("missing")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("read the hosts file"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
