//! A pod's own name in its `/etc/hosts`, as the tenant names it.
//!
//! A kubelet writes each pod's `/etc/hosts`, and for a pod with a `subdomain` it adds the pod's
//! fully qualified name, `<hostname>.<subdomain>.<namespace>.svc.<domain>`, with the
//! namespace the kubelet sees: on the host, the tenant namespace's host name (`<key>-<ns>`).
//! `hostname -f`, a StatefulSet member announcing itself to its peers, and the conformance
//! suite's `/etc/hosts` test would all read a name the tenant's DNS does not know.
//! `hostAliases` cannot carry the right line (the pod's address is not known when the pod is
//! created), so the syncer puts one init container first in such host pods
//! ([`init_container`]): this binary's `etc-hosts` command ([`run`]), which rewrites that one
//! name in place ([`rewrite`]) before the tenant's own containers start. The kubelet mounts the
//! same file into every container of the pod, so they all see the tenant's name.
//!
//! The container runs as root (the kubelet's file is root's, mode 0644) with no capabilities
//! and a read-only root file system; so it is added only where the plan's Pod Security level
//! admits a root container (not `restricted`), and the tenant never sees it: its status is
//! left out of the tenant pod's ([`hidden`]), and its Events are not copied.

use crate::{Error, Result};
use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements, SecurityContext};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::path::PathBuf;

/// The init container's name in host pods. A tenant pod that uses the name itself does not
/// get the container (its own wins).
pub const CONTAINER: &str = "vcp-etc-hosts";

/// `vcp-syncer etc-hosts`: rewrites the pod's own name in a hosts file.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "vcp-syncer etc-hosts",
    about = "Rewrites a pod's fully qualified name in its hosts file (the init container vcp adds)"
)]
pub struct Args {
    /// The domain the kubelet wrote (`<subdomain>.<host namespace>.svc.<domain>`).
    #[arg(long, env = "VCP_ETC_HOSTS_FROM")]
    pub from_domain: String,
    /// The domain the tenant knows (`<subdomain>.<namespace>.svc.<domain>`).
    #[arg(long, env = "VCP_ETC_HOSTS_TO")]
    pub to_domain: String,
    /// The hosts file.
    #[arg(long, env = "VCP_ETC_HOSTS_PATH", default_value = "/etc/hosts")]
    pub path: PathBuf,
}

/// `text` with every name `<label>.<from>` (a single label, as a host name is) spelled
/// `<label>.<to>`, or `None` when no line has one (nothing to write; a second run finds the
/// file already done). Comment lines are kept as they are; a line that changes is written
/// back with tabs between its fields, as the kubelet writes them.
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

/// Whether host pod spec `spec` (translated, in tenant namespace `ns`) gets the init
/// container: the kubelet writes a fully qualified name (a `subdomain`, pod networking), the
/// plan admits a root container, and the tenant did not take the name.
pub fn wanted(spec: &PodSpec, restricted: bool) -> bool {
    let named = spec.subdomain.as_deref().is_some_and(|s| !s.is_empty());
    let host_network = spec.host_network == Some(true);
    // In a user namespace root is not the file's owner.
    let own_users = spec.host_users == Some(false);
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
        .any(|n| n == CONTAINER);
    named && !host_network && !own_users && !windows && !restricted && !taken
}

/// The init container that rewrites `<subdomain>.<host_ns>.svc.<domain>` to
/// `<subdomain>.<ns>.svc.<domain>`, run from `image` (the syncer's own). Its requests are
/// token ones, so it barely moves what the host's quota counts for the pod beside what the
/// tenant's quota counted (an init container counts only where it asks for more than the
/// pod's containers together).
pub fn init_container(
    image: &str,
    subdomain: &str,
    host_ns: &str,
    ns: &str,
    domain: &str,
) -> Container {
    let q = |v: &str| Quantity(v.to_owned());
    Container {
        name: CONTAINER.to_owned(),
        image: Some(image.to_owned()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        command: Some(vec!["vcp-syncer".to_owned(), "etc-hosts".to_owned()]),
        args: Some(vec![
            format!("--from-domain={subdomain}.{host_ns}.svc.{domain}"),
            format!("--to-domain={subdomain}.{ns}.svc.{domain}"),
        ]),
        resources: Some(ResourceRequirements {
            requests: Some([("cpu".into(), q("1m")), ("memory".into(), q("8Mi"))].into()),
            limits: Some([("cpu".into(), q("100m")), ("memory".into(), q("16Mi"))].into()),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            run_as_user: Some(0),
            run_as_group: Some(0),
            run_as_non_root: Some(false),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(k8s_openapi::api::core::v1::Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                add: None,
            }),
            ..Default::default()
        }),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Default::default()
    }
}

/// Whether a container status or Event about container `name` is the syncer's own, kept
/// from the tenant.
pub fn hidden(name: &str) -> bool {
    name == CONTAINER
}

/// Rewrites the hosts file in place: the kubelet bind-mounts it, so it is written through,
/// never replaced by a rename.
pub fn run(args: Args) -> Result<()> {
    let io = |what: &'static str| {
        let path = args.path.clone();
        move |source| Error::Io { what, path, source }
    };
    let text = std::fs::read_to_string(&args.path).map_err(io("read the hosts file"))?;
    match rewrite(&text, &args.from_domain, &args.to_domain) {
        Some(done) => {
            std::fs::write(&args.path, done).map_err(io("write the hosts file"))?;
            println!(
                "{}: {} is now {}",
                args.path.display(),
                args.from_domain,
                args.to_domain
            );
        }
        None => println!(
            "{}: no name in {}; nothing to change",
            args.path.display(),
            args.from_domain
        ),
    }
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
        // Done once: a rerun (a restarted pod's init container) writes nothing.
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
    fn only_pods_the_kubelet_names_in_full_get_the_container() {
        let base = serde_json::json!({"subdomain": "nginx", "containers": [{"name": "c"}]});
        assert!(wanted(&spec(base.clone()), false));
        assert!(
            !wanted(&spec(base.clone()), true),
            "restricted: no root container"
        );
        let mut v = base.clone();
        v["subdomain"] = serde_json::json!("");
        assert!(!wanted(&spec(v), false));
        for (field, value) in [
            ("hostNetwork", serde_json::json!(true)),
            ("hostUsers", serde_json::json!(false)),
            ("os", serde_json::json!({"name": "windows"})),
            ("initContainers", serde_json::json!([{"name": CONTAINER}])),
            (
                "ephemeralContainers",
                serde_json::json!([{"name": CONTAINER}]),
            ),
        ] {
            let mut v = base.clone();
            v[field] = value;
            assert!(!wanted(&spec(v), false), "{field}");
        }
    }

    #[test]
    fn the_container_runs_the_syncers_command_as_root_without_capabilities() {
        let c = init_container("img:1", "nginx", "demo-apps", "apps", "cluster.local");
        assert_eq!(c.name, CONTAINER);
        assert_eq!(
            c.command.as_deref(),
            Some(&["vcp-syncer".to_owned(), "etc-hosts".to_owned()][..])
        );
        assert_eq!(
            c.args.unwrap(),
            [
                "--from-domain=nginx.demo-apps.svc.cluster.local",
                "--to-domain=nginx.apps.svc.cluster.local"
            ]
        );
        let sc = c.security_context.unwrap();
        assert_eq!((sc.run_as_user, sc.run_as_non_root), (Some(0), Some(false)));
        assert_eq!(sc.capabilities.unwrap().drop.unwrap(), ["ALL"]);
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        // The command line parses as the binary reads it.
        let parsed = <Args as clap::Parser>::try_parse_from([
            "vcp-syncer etc-hosts",
            "--from-domain=a.b-c.svc.d",
            "--to-domain=a.c.svc.d",
        ])
        .unwrap();
        assert_eq!(parsed.path, PathBuf::from("/etc/hosts"));
    }

    #[test]
    fn the_command_rewrites_the_file_in_place() {
        let dir = std::env::temp_dir().join(format!("vcp-etc-hosts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("hosts");
        std::fs::write(&path, KUBELET).unwrap();
        let args = |p: &std::path::Path| Args {
            from_domain: "nginx.demo-apps.svc.cluster.local".into(),
            to_domain: "nginx.apps.svc.cluster.local".into(),
            path: p.to_owned(),
        };
        run(args(&path)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("\tweb-0.nginx.apps.svc.cluster.local\tweb-0\n"),
            "{text}"
        );
        run(args(&path)).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        let err = run(args(&dir.join("missing"))).unwrap_err().to_string();
        assert!(err.contains("read the hosts file"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
