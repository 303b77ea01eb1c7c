//! The real node: a kubelet, containerd and runc running containers from images built here.
//!
//! Data flow: [`NodeNet::claim`] takes a free node index `k` (creating the network namespace
//! `vcpnode<k>` is the lock) and wires it to the host; [`Layout::write`] writes containerd's,
//! the kubelet's and the CNI's configuration (rendered by pure functions) and the node's
//! certificates; [`spawn`] starts `run.sh`, the node's supervisor, in that network namespace
//! and in mount and pid namespaces of its own; [`import_images`] loads [`crate::images`] into
//! containerd once it answers. [`sweep`] removes what a node leaves on the host.
//!
//! Why namespaces: the kubelet, the CNI plugins and kube-proxy write global state (routes,
//! netfilter rules, sysctls, `/var/lib/kubelet`, `/var/log/pods`). In their own namespaces,
//! several dev clusters (parallel test binaries) each have a node, and nothing is left on the
//! machine when a node dies: killing the supervisor (the pid namespace's init) kills every
//! process of the node, containers included, and its mounts go with its mount namespace.
//!
//! Addresses of node `k`: the link `10.243.<k>.0/30` (host side `.1`, node side `.2`, the
//! kubelet's address), the pod network `10.246.<k>.0/24` on the bridge `cni0` inside the
//! node, routed from the host through the link so the apiserver and tests reach pods. The node
//! has no default route: pod traffic goes to the host or to other pods, nowhere else.

use crate::pki::{self, Ca, CertKey, LeafSpec};
use crate::process::{ProcSpec, Spawned, Supervision};
use crate::{Error, Result, bins, images};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The real node's name in the host cluster.
pub const NODE_NAME: &str = "vcp-node-0";
/// Label and `NoSchedule` taint of the real node: pods that must run containers select and
/// tolerate it.
pub const NODE_LABEL: (&str, &str) = ("vcp.dev/node", "real");
/// The node's dir under the dev cluster's state dir.
pub const DIR: &str = "node";
/// File in the node's state dir recording the index it claimed.
const NETWORK_FILE: &str = "network.json";
/// Indexes tried; each is a /24 of `10.246.0.0/16`.
const MAX_NODES: u8 = 64;

/// Node `k`'s names and addresses (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeNet {
    pub index: u8,
}

impl NodeNet {
    pub fn netns(&self) -> String {
        format!("vcpnode{}", self.index)
    }

    pub fn veth_host(&self) -> String {
        format!("vnode{}h", self.index)
    }

    pub fn veth_node(&self) -> String {
        format!("vnode{}n", self.index)
    }

    /// The host's address on the link: what the node dials for the apiserver.
    pub fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 243, self.index, 1)
    }

    /// The node's address on the link: the kubelet's API and the Node's InternalIP.
    pub fn node_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 243, self.index, 2)
    }

    pub fn pod_cidr(&self) -> String {
        format!("10.246.{}.0/24", self.index)
    }

    /// The network namespace standing for the world outside the cluster
    /// ([`crate::outside`]), created only by the tests that need it.
    pub fn outside_netns(&self) -> String {
        format!("vcpout{}", self.index)
    }

    /// The node's end of its link to the outside (the far end is `vout<k>o`).
    pub fn veth_outside(&self) -> String {
        format!("vout{}n", self.index)
    }

    /// The node's address on its link to the outside, `10.243.<k>.4/30`.
    pub fn outside_link_node(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 243, self.index, 5)
    }

    /// The outside's address on that link.
    pub fn outside_link_far(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 243, self.index, 6)
    }

    /// The kubelet's `cgroupRoot`, in every v1 hierarchy.
    pub fn cgroup_root(&self) -> String {
        format!("vcp-node-{}", self.index)
    }

    /// Claims the first free index: creates its namespace (the lock), the veth pair, the
    /// addresses and the host's route to the pod network.
    pub fn claim() -> Result<NodeNet> {
        let mut last = None;
        for index in 0..MAX_NODES {
            let net = NodeNet { index };
            match ip(&["netns", "add", &net.netns()]) {
                Ok(()) => {
                    // A node killed outright may have left its cgroups behind.
                    remove_cgroups(&net.cgroup_root());
                    if let Err(e) = net.wire() {
                        net.sweep();
                        return Err(e);
                    }
                    return Ok(net);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Node("no node index to try".into())))
    }

    fn wire(&self) -> Result<()> {
        let (ns, host, node) = (self.netns(), self.veth_host(), self.veth_node());
        // A veth left by a node whose namespace was removed by hand.
        let _ = ip(&["link", "del", &host]);
        ip(&["link", "add", &host, "type", "veth", "peer", "name", &node])?;
        ip(&["link", "set", &node, "netns", &ns])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/30", self.host_ip()),
            "dev",
            &host,
        ])?;
        ip(&["link", "set", &host, "up"])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{}/30", self.node_ip()),
            "dev",
            &node,
        ])?;
        ip(&["-n", &ns, "link", "set", &node, "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        ip(&[
            "route",
            "add",
            &self.pod_cidr(),
            "via",
            &self.node_ip().to_string(),
        ])?;
        Ok(())
    }

    /// Removes the node's namespace, link (and with it the route), its outside's namespace and
    /// its cgroups. Never fails.
    pub fn sweep(&self) {
        let _ = ip(&["link", "del", &self.veth_host()]);
        let _ = ip(&["netns", "del", &self.outside_netns()]);
        let _ = ip(&["netns", "del", &self.netns()]);
        remove_cgroups(&self.cgroup_root());
    }
}

pub(crate) fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(Error::io("ip"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Node(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Removes `root` from every cgroup v1 hierarchy, deepest first; a cgroup that still has
/// processes stays (rmdir refuses it).
fn remove_cgroups(root: &str) {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for h in hierarchies.flatten() {
        let top = h.path().join(root);
        if top.is_dir() {
            remove_cgroup_tree(&top);
        }
    }
}

fn remove_cgroup_tree(dir: &Path) {
    if let Ok(children) = std::fs::read_dir(dir) {
        for c in children.flatten() {
            if c.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&c.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Where a node keeps everything, under `<state>/node`.
#[derive(Debug, Clone)]
pub struct Layout {
    pub dir: PathBuf,
}

impl Layout {
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    fn s(&self, rel: &str) -> String {
        self.path(rel).to_string_lossy().into_owned()
    }

    pub fn containerd_socket(&self) -> PathBuf {
        self.path("run/containerd.sock")
    }

    /// Empties `run/`, the node's `/run`: containerd's socket and its shims' task state. A
    /// node that was killed (its session ended, say) leaves them behind, and the next start
    /// then found the old socket at once, called `ctr` while containerd was still reloading
    /// dead shims, and failed with "no such file" (2026-11-29). Nothing in it outlives the
    /// node's processes, as `/run` does not outlive a boot.
    pub fn reset_runtime_state(&self) -> Result<()> {
        let run = self.path("run");
        match std::fs::remove_dir_all(&run) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&run)(e)),
        }
        std::fs::create_dir_all(&run).map_err(Error::io(&run))
    }

    /// Writes every file the node reads: certificates (issued by the cluster CA from
    /// `pki_dir`), kubeconfig, configurations, the CNI plugins' and node binaries' links and
    /// `run.sh`.
    pub fn write(&self, net: &NodeNet, pki_dir: &Path) -> Result<()> {
        std::fs::create_dir_all(&self.dir).map_err(Error::io(&self.dir))?;
        // First, so `vcp-dev down` sweeps the network even if what follows fails.
        let rec = serde_json::json!({ "index": net.index });
        let p = self.path(NETWORK_FILE);
        std::fs::write(&p, rec.to_string()).map_err(Error::io(&p))?;
        for d in [
            "bin",
            "cni/bin",
            "cni/conf",
            "cni/ipam",
            "pki",
            "containerd",
            "kubelet",
            "logs",
            "pods-logs",
            "hostdirs/var-lib-kubelet",
            "hostdirs/var-log-containers",
            "registry-hosts/_default",
        ] {
            let p = self.path(d);
            std::fs::create_dir_all(&p).map_err(Error::io(&p))?;
        }
        self.reset_runtime_state()?;
        let read = |n: &str| {
            let p = pki_dir.join(n);
            std::fs::read_to_string(&p).map_err(Error::io(p))
        };
        let ca = Ca::load(&CertKey {
            cert_pem: read("ca.crt")?,
            key_pem: read("ca.key")?,
        })?;
        let now = time::OffsetDateTime::now_utc();
        let user = format!("system:node:{NODE_NAME}");
        let client = ca.issue(
            &LeafSpec::client(&user, &["system:nodes"]),
            now,
            pki::LEAF_VALIDITY,
        )?;
        let serving = ca.issue(
            &LeafSpec::server(
                NODE_NAME,
                vec![NODE_NAME.to_owned()],
                vec![IpAddr::V4(net.node_ip())],
            ),
            now,
            pki::LEAF_VALIDITY,
        )?;
        let proxy = ca.issue(
            &LeafSpec::client(KUBE_PROXY_USER, &[]),
            now,
            pki::LEAF_VALIDITY,
        )?;
        let ca_path = pki_dir.join("ca.crt");
        crate::cluster::write_secret_file(&self.path("pki/client.crt"), &client.cert_pem)?;
        crate::cluster::write_secret_file(&self.path("pki/client.key"), &client.key_pem)?;
        crate::cluster::write_secret_file(&self.path("pki/serving.crt"), &serving.cert_pem)?;
        crate::cluster::write_secret_file(&self.path("pki/serving.key"), &serving.key_pem)?;
        crate::cluster::write_secret_file(&self.path("pki/kube-proxy.crt"), &proxy.cert_pem)?;
        crate::cluster::write_secret_file(&self.path("pki/kube-proxy.key"), &proxy.key_pem)?;

        let files = [
            ("containerd.toml", containerd_config(self)),
            ("cni/conf/10-vcp.conflist", cni_config(self, net)),
            (
                "kubelet.kubeconfig",
                node_kubeconfig(self, net, &ca_path, "client"),
            ),
            (
                "kube-proxy.kubeconfig",
                node_kubeconfig(self, net, &ca_path, "kube-proxy"),
            ),
            ("kube-proxy.yaml", kube_proxy_config(self, net)),
            ("kubelet.yaml", kubelet_config(self, net, &ca_path)),
            ("run.sh", run_script(self, net)),
            ("registry-hosts/_default/hosts.toml", registry_hosts()),
            ("no-registry.py", NO_REGISTRY.to_owned()),
            ("crictl.yaml", crictl_config(self)),
        ];
        for (name, text) in files {
            let p = self.path(name);
            std::fs::write(&p, text).map_err(Error::io(&p))?;
        }
        let link = |target: PathBuf, at: &str| -> Result<()> {
            let at = self.path(at);
            let _ = std::fs::remove_file(&at);
            std::os::unix::fs::symlink(&target, &at).map_err(Error::io(&at))
        };
        let k8s = bins::host_kubernetes_version();
        link(bins::binary("kubelet", k8s)?, "bin/kubelet")?;
        link(bins::binary("kube-proxy", k8s)?, "bin/kube-proxy")?;
        for c in ["containerd", "containerd-shim-runc-v2", "ctr", "crictl"] {
            link(bins::tool(c)?, &format!("bin/{c}"))?;
        }
        for p in ["bridge", "host-local", "loopback", "portmap"] {
            link(bins::tool(&format!("cni-{p}"))?, &format!("cni/bin/{p}"))?;
        }
        Ok(())
    }
}

/// containerd's configuration: its state under the node's dir, runc from Debian with the
/// cgroupfs driver, the CNI plugins of the bridge network, and `restrict_oom_score_adj`
/// (without CAP_SYS_RESOURCE, which even root lacks on these machines, runc fails to lower a
/// container's OOM score and the start dies with "can't get final child's PID from pipe").
pub fn containerd_config(l: &Layout) -> String {
    format!(
        r#"version = 3
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = '{registry_hosts}'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{pause}'
  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = '/usr/sbin/runc'
        SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{test_handler}]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{test_handler}.options]
        BinaryName = '/usr/sbin/runc'
        SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['{cni_bin}']
      conf_dir = '{cni_conf}'
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
"#,
        root = l.s("containerd/root"),
        state = l.s("run/containerd-state"),
        socket = l.containerd_socket().to_string_lossy(),
        pause = images::PAUSE_IMAGE,
        cni_bin = l.s("cni/bin"),
        cni_conf = l.s("cni/conf"),
        registry_hosts = l.s("registry-hosts"),
        test_handler = crate::cluster::TEST_RUNTIME_HANDLER,
    )
}

/// The node's port (on its own loopback) of [`NO_REGISTRY`].
pub const NO_REGISTRY_PORT: u16 = 5000;

/// Where containerd pulls from: every registry's default host is [`NO_REGISTRY`] on the node's
/// loopback (`_default` applies to any registry without a directory of its own).
pub fn registry_hosts() -> String {
    format!(
        "server = \"http://127.0.0.1:{NO_REGISTRY_PORT}\"\n\
         [host.\"http://127.0.0.1:{NO_REGISTRY_PORT}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
    )
}

/// What a pull of an image that is not on the node gets: the registry of the dev cluster,
/// which has no image. It refuses every request with a registry error naming the image and
/// saying how images come to the node; containerd puts that in the pull error, and so the
/// kubelet in the pod's `ErrImagePull`. Without it a pull fails at once too (the node has no
/// route out), but with a network error that says neither. `argv`: port, hint.
pub const NO_REGISTRY: &str = r#"
import http.server, json, sys, urllib.parse
port, hint = int(sys.argv[1]), sys.argv[2]
class NoRegistry(http.server.BaseHTTPRequestHandler):
    def answer(self, body):
        u = urllib.parse.urlsplit(self.path)
        parts = u.path.split("/")
        # /v2/<name>/manifests/<reference>?ns=<registry>
        image = self.path
        if len(parts) >= 5 and parts[1] == "v2" and parts[-2] in ("manifests", "blobs"):
            ns = urllib.parse.parse_qs(u.query).get("ns", [""])[0]
            name, ref = "/".join(parts[2:-2]), parts[-1]
            sep = "@" if ":" in ref else ":"
            image = (ns + "/" if ns else "") + name + sep + ref
        msg = image + " is not on this node, and the dev cluster pulls from no registry. " + hint
        data = json.dumps({"errors": [{"code": "DENIED", "message": msg}]}).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)
    def do_HEAD(self):
        self.answer(False)
    def do_GET(self):
        self.answer(True)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), NoRegistry).serve_forever()
"#;

/// How images come to the node, for [`NO_REGISTRY`]'s refusals.
pub fn no_registry_hint(l: &Layout) -> String {
    let state = l.dir.parent().unwrap_or(&l.dir).to_string_lossy();
    format!(
        "Images are built here and imported: `vcp-dev images --state-dir {state}` builds vcp's \
         images, Postgres and the control-plane images of every minor; pause, busybox and \
         agnhost come with the node (docs/dev-cluster.md, \"Images\")."
    )
}

/// Runs crictl against the node's containerd (the CRI, as the kubelet sees it); its output.
pub fn crictl(l: &Layout, args: &[&str]) -> Result<String> {
    let out = Command::new(l.path("bin/crictl"))
        .arg("--config")
        .arg(l.path("crictl.yaml"))
        .args(args)
        .output()
        .map_err(Error::io("crictl"))?;
    if !out.status.success() {
        return Err(Error::Node(format!(
            "`crictl {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// crictl's configuration for the node's containerd: `crictl --config <node>/crictl.yaml ps`.
pub fn crictl_config(l: &Layout) -> String {
    let socket = l.containerd_socket();
    format!(
        "runtime-endpoint: unix://{s}\nimage-endpoint: unix://{s}\ntimeout: 10\n",
        s = socket.display()
    )
}

/// The pod network: a bridge with the node as gateway, addresses from the node's /24.
/// Masquerading is off: nothing routes beyond the host, and the apiserver sees pods' own
/// addresses.
pub fn cni_config(l: &Layout, net: &NodeNet) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "vcp",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "dataDir": l.s("cni/ipam"),
                    "ranges": [[{"subnet": net.pod_cidr()}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
    .to_string()
}

/// A node component's kubeconfig: the apiserver at the host's end of the link (the relay,
/// [`api_relay`]), verified by
/// the name its certificate carries (`localhost`), with the client certificate
/// `pki/<cert>.crt` (`client` is the kubelet's).
pub fn node_kubeconfig(l: &Layout, net: &NodeNet, ca: &Path, cert: &str) -> String {
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "vcp-dev", "cluster": {
            "server": format!("https://{}:{API_PORT}", net.host_ip()),
            "certificate-authority": ca,
            "tls-server-name": "localhost",
        }}],
        "users": [{"name": "node", "user": {
            "client-certificate": l.s(&format!("pki/{cert}.crt")),
            "client-key": l.s(&format!("pki/{cert}.key")),
        }}],
        "contexts": [{"name": "vcp-dev", "context": {"cluster": "vcp-dev", "user": "node"}}],
        "current-context": "vcp-dev",
    });
    serde_yaml::to_string(&doc).expect("a JSON value always serializes to YAML")
}

/// kube-proxy's identity: the user the apiserver's bootstrap policy binds to
/// `system:node-proxier`.
pub const KUBE_PROXY_USER: &str = "system:kube-proxy";

/// kube-proxy's configuration: iptables mode (the `iptables` of Debian, on nf_tables) in the
/// node's own network namespace. Every conntrack setting is zero, which leaves the kernel's
/// alone: the table size is global to the machine, not the node's to change.
pub fn kube_proxy_config(l: &Layout, net: &NodeNet) -> String {
    let doc = serde_json::json!({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": l.s("kube-proxy.kubeconfig")},
        "mode": "iptables",
        "hostnameOverride": NODE_NAME,
        "bindAddress": net.node_ip().to_string(),
        "clusterCIDR": net.pod_cidr(),
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "nodePortAddresses": [format!("{}/32", net.node_ip())],
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    });
    serde_yaml::to_string(&doc).expect("a JSON value always serializes to YAML")
}

/// The kubelet's configuration. cgroupfs and `failCgroupV1: false` because these machines
/// have cgroup v1 only and PID 1 is not systemd; its API is authenticated by the cluster CA
/// and authorized by the apiserver (SubjectAccessReview), as a kubeadm node's is.
pub fn kubelet_config(l: &Layout, net: &NodeNet, ca: &Path) -> String {
    let doc = serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": false,
        "cgroupRoot": format!("/{}", net.cgroup_root()),
        "containerRuntimeEndpoint": format!("unix://{}", l.containerd_socket().to_string_lossy()),
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true},
            "x509": {"clientCAFile": ca},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": l.s("pki/serving.crt"),
        "tlsPrivateKeyFile": l.s("pki/serving.key"),
        "address": net.node_ip().to_string(),
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "clusterDomain": "cluster.local",
        "clusterDNS": [CLUSTER_DNS_IP],
        "podLogsDir": l.s("pods-logs"),
        "failSwapOn": false,
        "resolvConf": "",
        "makeIPTablesUtilChains": false,
        "serializeImagePulls": false,
        // A test machine's disk is shared with everything else: never evict or collect
        // images on its account.
        "evictionHard": {},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "registerNode": true,
        // Only pods that ask for a real node land here; the rest of the dev cluster's pods
        // keep going to kwok workers and the devnode.
        "registerWithTaints": [{"key": NODE_LABEL.0, "value": NODE_LABEL.1, "effect": "NoSchedule"}],
        "nodeLabels": {},
    });
    serde_yaml::to_string(&doc).expect("a JSON value always serializes to YAML")
}

/// The node's supervisor, run as the init of its own pid namespace in its own mount
/// namespace and in the node's network namespace. It starts containerd and, once containerd
/// answers, the kubelet and kube-proxy; it exits (taking every node process with it) when either exits or
/// on SIGTERM.
pub fn run_script(l: &Layout, net: &NodeNet) -> String {
    let cgroup_root = net.cgroup_root();
    format!(
        r#"#!/bin/bash
# Written by vcp-dev (tests/dev/src/node.rs); runs in the node's namespaces.
set -euo pipefail
export PATH="{bin}:/usr/sbin:/usr/bin:/sbin:/bin"
log() {{ printf '[node] %s\n' "$*"; }}
trap 'log "stopping"; kill -TERM $(jobs -p) 2>/dev/null; wait; exit 0' TERM INT
# Paths the kubelet hard-codes, private to this mount namespace.
mount --bind "{hostdirs}/var-lib-kubelet" /var/lib/kubelet
mount --bind "{hostdirs}/var-log-containers" /var/log/containers
mount -t tmpfs tmpfs /run/containerd
sysctl -q -w net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
# The node's own processes (host-network pods) dial Service addresses, which kube-proxy
# rewrites only after a route was found. A route through the loopback (from the node's
# address) gives them one that goes nowhere if no rule matches: the node has no default
# route, and these machines' kernels have no dummy links.
ip route replace {service_cidr} dev lo src {node_ip}
# In the mangle table, which kube-proxy leaves alone, so these come before any of its accepts.
# Pod traffic leaves the bridge only for the host's end of the link (the apiserver) or for the
# link to the outside, a network namespace of this machine that tests create; the node has no
# default route besides, so nothing a pod sends can leave the machine.
# (Each added once: the network namespace, and its rules, outlive a restart of the node.)
rule() {{ iptables -w -t mangle -C "$@" 2>/dev/null || iptables -w -t mangle -A "$@"; }}
iptables -w -t mangle -N {pod_out} 2>/dev/null || true
rule {pod_out} -d {host_ip} -j RETURN
rule {pod_out} -o {veth_outside} -j RETURN
rule {pod_out} -j DROP
rule FORWARD -i cni0 ! -o cni0 -j {pod_out}
# The first packet of every forwarded connection goes to kube-network-policies (queue
# {queue}), which accepts or drops it by the cluster's NetworkPolicies. No --queue-bypass:
# while it is not running, no new connection passes.
rule FORWARD -m conntrack --ctstate NEW -j NFQUEUE --queue-num {queue}
for h in /sys/fs/cgroup/*/; do
  case $h in */unified/) continue ;; esac
  mkdir -p "${{h}}{cgroup_root}"
done
python3 "{dir}/no-registry.py" {registry_port} "{hint}" >>"{dir}/logs/no-registry.log" 2>&1 &
# The socket of a killed containerd stays on disk; waiting for it would start the kubelet
# before containerd listens, and the kubelet exits at once when it cannot reach containerd.
rm -f "{socket}"
containerd --config "{dir}/containerd.toml" >>"{dir}/logs/containerd.log" 2>&1 &
# Quick on an idle machine; restoring its state after a kill takes longer on a loaded one.
for _ in $(seq 600); do [[ -S "{socket}" ]] && break; sleep 0.1; done
[[ -S "{socket}" ]] || {{ log "containerd did not start; see {dir}/logs/containerd.log"; exit 1; }}
kubelet --config "{dir}/kubelet.yaml" --kubeconfig "{dir}/kubelet.kubeconfig" \
  --root-dir "{dir}/kubelet" --node-ip {node_ip} --hostname-override {name} \
  --node-labels {label_key}={label_value} >>"{dir}/logs/kubelet.log" 2>&1 &
kube-proxy --config "{dir}/kube-proxy.yaml" >>"{dir}/logs/kube-proxy.log" 2>&1 &
log "containerd, kubelet and kube-proxy started"
set +e
wait -n
status=$?
log "a node process exited ($status); stopping the node"
kill -TERM $(jobs -p) 2>/dev/null
wait
exit $status
"#,
        bin = l.s("bin"),
        hostdirs = l.s("hostdirs"),
        dir = l.dir.to_string_lossy(),
        socket = l.containerd_socket().to_string_lossy(),
        node_ip = net.node_ip(),
        host_ip = net.host_ip(),
        veth_outside = net.veth_outside(),
        pod_out = POD_OUT_CHAIN,
        registry_port = NO_REGISTRY_PORT,
        hint = no_registry_hint(l).replace(['"', '`', '$'], "'"),
        queue = NFQUEUE_ID,
        service_cidr = crate::cluster::SERVICE_CIDR,
        name = NODE_NAME,
        label_key = NODE_LABEL.0,
        label_value = NODE_LABEL.1,
    )
}

/// The port the node dials the apiserver at, on the host's end of its link: a relay there
/// passes connections to the apiserver on the loopback. The usual apiserver port, so
/// NetworkPolicies that allow it by port mean the same here as on a real cluster.
pub const API_PORT: u16 = 6443;

/// The relay from the host's end of the node's link to the apiserver on the loopback
/// (Debian's socat, one process per connection).
pub fn api_relay(net: &NodeNet, api_port: u16) -> Result<ProcSpec> {
    Ok(ProcSpec::new("node-api-relay", which("socat")?).args([
        "-d".to_owned(),
        format!(
            "TCP-LISTEN:{API_PORT},bind={},fork,reuseaddr",
            net.host_ip()
        ),
        format!("TCP:127.0.0.1:{api_port}"),
    ]))
}

/// The netfilter queue the node's first packets go to, and kube-network-policies reads.
pub const NFQUEUE_ID: u16 = 100;
/// The node's mangle chain that drops pod traffic bound anywhere but the host's end of the
/// link or the outside (its DROP counter shows what it stopped).
pub const POD_OUT_CHAIN: &str = "VCP-POD-OUT";
/// Namespace and name of everything that runs kube-network-policies.
const NETPOL_NAME: &str = "kube-network-policies";

/// The NetworkPolicy enforcer of the real node, as its project deploys it (a privileged
/// DaemonSet on the host network, here pinned to the real node): its ServiceAccount, RBAC
/// and DaemonSet. Its own nftables rules need the kernel's `nft_queue`, which these machines
/// lack; it logs that it cannot install them, and `run.sh` diverts the same first packets to
/// its queue with iptables' `NFQUEUE` instead (docs/dev-cluster.md).
pub fn network_policy_objects(image: &str) -> Vec<serde_json::Value> {
    vec![
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": NETPOL_NAME, "namespace": "kube-system"},
        }),
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": NETPOL_NAME},
            "rules": [
                {"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["list", "watch"]},
                {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["list", "watch"]},
            ],
        }),
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": NETPOL_NAME},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NETPOL_NAME},
            "subjects": [{"kind": "ServiceAccount", "name": NETPOL_NAME, "namespace": "kube-system"}],
        }),
        serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": NETPOL_NAME, "namespace": "kube-system"},
            "spec": {
                "selector": {"matchLabels": {"app": NETPOL_NAME}},
                "template": {
                    "metadata": {"labels": {"app": NETPOL_NAME}},
                    "spec": {
                        "hostNetwork": true,
                        "dnsPolicy": "Default",
                        "serviceAccountName": NETPOL_NAME,
                        "nodeSelector": {NODE_LABEL.0: NODE_LABEL.1},
                        "tolerations": [{"key": NODE_LABEL.0, "operator": "Exists"}],
                        "priorityClassName": "system-node-critical",
                        "containers": [{
                            "name": NETPOL_NAME,
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            "args": [
                                "--hostname-override=$(NODE_NAME)",
                                format!("--nfqueue-id={NFQUEUE_ID}"),
                                // Containers' addresses come from the API; the runtime's NRI
                                // socket is not shared with it.
                                "--disable-nri=true",
                                // Kernel 6.12 and later carry the fix it works around.
                                "--netfilter-bug-1766-fix=false",
                                "--metrics-bind-address=127.0.0.1:9080",
                            ],
                            "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                            "securityContext": {"privileged": true},
                        }],
                    },
                },
            },
        }),
    ]
}

/// The host cluster's DNS Service address (`kube-system/kube-dns`), the kubelet's
/// `clusterDNS`: the tenth address of the Service CIDR, as kubeadm picks it.
pub const CLUSTER_DNS_IP: &str = "10.96.0.10";
const DNS_NAME: &str = "coredns";

/// The host cluster's DNS, which a real node's pods resolve Service names with (a tenant's
/// apiserver dials its etcd by name): CoreDNS on the real node, as kubeadm deploys it, with
/// no `forward`, so names outside the cluster get no answer and no query leaves the machine.
pub fn dns_objects(image: &str) -> Vec<serde_json::Value> {
    let corefile = ".:53 {\n    errors\n    health 127.0.0.1:8080\n    ready :8181\n    kubernetes cluster.local in-addr.arpa ip6.arpa {\n        pods insecure\n        fallthrough in-addr.arpa ip6.arpa\n    }\n    cache 30\n    loop\n}\n";
    vec![
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": DNS_NAME, "namespace": "kube-system"},
        }),
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "vcp-dev:coredns"},
            "rules": [
                {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            ],
        }),
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "vcp-dev:coredns"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "vcp-dev:coredns"},
            "subjects": [{"kind": "ServiceAccount", "name": DNS_NAME, "namespace": "kube-system"}],
        }),
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": DNS_NAME, "namespace": "kube-system"},
            "data": {"Corefile": corefile},
        }),
        serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": DNS_NAME, "namespace": "kube-system"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
                "template": {
                    "metadata": {"labels": {"k8s-app": "kube-dns"}},
                    "spec": {
                        "serviceAccountName": DNS_NAME,
                        "dnsPolicy": "Default",
                        "priorityClassName": "system-cluster-critical",
                        "nodeSelector": {NODE_LABEL.0: NODE_LABEL.1},
                        "tolerations": [{"key": NODE_LABEL.0, "operator": "Exists"}],
                        "containers": [{
                            "name": DNS_NAME,
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["coredns", "-conf", "/etc/coredns/Corefile"],
                            "ports": [
                                {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                                {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                            ],
                            "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
                            "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": true}],
                        }],
                        "volumes": [{"name": "config", "configMap": {"name": DNS_NAME}}],
                    },
                },
            },
        }),
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
            "spec": {
                "clusterIP": CLUSTER_DNS_IP,
                "selector": {"k8s-app": "kube-dns"},
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                ],
            },
        }),
    ]
}

/// Directories the node bind-mounts over in its mount namespace; they must exist on the host
/// (empty, and never written there).
const MOUNT_POINTS: [&str; 3] = ["/var/lib/kubelet", "/var/log/containers", "/run/containerd"];

/// Starts the node's supervisor: `unshare` (new mount and pid namespaces, the node process
/// killed with it) entering the node's network namespace.
pub fn spawn(l: &Layout, net: &NodeNet, mode: Supervision) -> Result<Spawned> {
    for m in MOUNT_POINTS {
        std::fs::create_dir_all(m).map_err(Error::io(m))?;
    }
    let unshare = which("unshare")?;
    let spec = ProcSpec::new("node", unshare).args([
        "--mount".to_owned(),
        "--pid".to_owned(),
        "--fork".to_owned(),
        "--kill-child".to_owned(),
        "--mount-proc".to_owned(),
        "--".to_owned(),
        "nsenter".to_owned(),
        format!("--net=/run/netns/{}", net.netns()),
        "--".to_owned(),
        "/bin/bash".to_owned(),
        l.s("run.sh"),
    ]);
    crate::process::spawn(&spec, mode, &l.path("logs/node.log"))
}

/// Waits until no process is left in the node's network namespace: a node killed with
/// SIGKILL takes its processes along only as the kernel gets to them, and a node started
/// again before then finds the kubelet's port, the no-registry port or containerd's database
/// still held, and stops at once (`run.sh` stops the node when any of its processes exits).
pub fn wait_emptied(net: &NodeNet, within: Duration) -> Result<()> {
    let started = Instant::now();
    loop {
        let left = netns_members(&net.netns());
        if left.is_empty() {
            return Ok(());
        }
        if started.elapsed() > within {
            return Err(Error::Node(format!(
                "processes {left:?} still run in network namespace {} {}s after the node was stopped",
                net.netns(),
                within.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The live processes in network namespace `name` (zombies have none and do not count).
fn netns_members(name: &str) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(ns) = std::fs::metadata(Path::new("/run/netns").join(name)) else {
        return Vec::new();
    };
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::metadata(format!("/proc/{pid}/ns/net"))
                .is_ok_and(|m| m.ino() == ns.ino() && m.dev() == ns.dev())
        })
        .collect()
}

fn which(name: &str) -> Result<PathBuf> {
    ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| Error::Node(format!("{name} is missing (Debian package util-linux)")))
}

/// Waits for containerd's socket, then imports every image of [`images::node_images`].
/// Returns how many were imported.
pub async fn import_images(l: &Layout, net: &NodeNet, node: &mut Spawned) -> Result<usize> {
    let socket = l.containerd_socket();
    let started = Instant::now();
    while !socket.exists() {
        node.check_running()?;
        if started.elapsed() > Duration::from_secs(60) {
            return Err(Error::Timeout {
                what: format!("containerd's socket {}", socket.display()),
                secs: 60,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let imgs = images::node_images()?;
    import(l, net, &imgs)?;
    Ok(imgs.len())
}

/// Writes each image's archive under `<node>/images` and imports it into the node's
/// containerd (namespace `k8s.io`, the kubelet's), replacing any image of the same name.
pub fn import(l: &Layout, net: &NodeNet, imgs: &[images::Image]) -> Result<()> {
    let dir = l.path("images");
    std::fs::create_dir_all(&dir).map_err(Error::io(&dir))?;
    for img in imgs {
        let file = dir.join(format!("{}.tar", img.reference.replace(['/', ':'], "_")));
        let bytes = img.archive()?;
        std::fs::write(&file, bytes).map_err(Error::io(&file))?;
        let out = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", net.netns()))
            .arg("--")
            .arg(l.path("bin/ctr"))
            .args(["--address"])
            .arg(l.containerd_socket())
            .args(["-n", "k8s.io", "images", "import"])
            .arg(&file)
            .output()
            .map_err(Error::io("nsenter"))?;
        // The archive is only the way in: containerd keeps its own copy.
        let _ = std::fs::remove_file(&file);
        if !out.status.success() {
            return Err(Error::Image(format!(
                "importing {} failed: {}",
                img.reference,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    Ok(())
}

/// The node recorded in a state dir's node dir: its layout and network.
pub fn recorded(node_dir: &Path) -> Option<(Layout, NodeNet)> {
    let text = std::fs::read_to_string(node_dir.join(NETWORK_FILE)).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let index = u8::try_from(v["index"].as_u64()?).ok()?;
    Some((
        // Absolute: the layout's paths are handed to tools that run inside the node's
        // network namespace from elsewhere (containerd's socket for an import), so
        // `vcp-dev images --state-dir .vcp-dev` found no containerd.
        Layout {
            dir: std::path::absolute(node_dir).ok()?,
        },
        NodeNet { index },
    ))
}

/// Sweeps the node recorded in a state dir, if any.
pub fn sweep(node_dir: &Path) {
    if let Some((_, net)) = recorded(node_dir) {
        net.sweep();
        let _ = std::fs::remove_file(node_dir.join(NETWORK_FILE));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout {
            dir: PathBuf::from("/state/node"),
        }
    }

    #[test]
    fn a_recorded_node_is_found_with_an_absolute_layout_from_a_relative_state_dir() {
        let dir = tempfile::tempdir_in(".").unwrap();
        std::fs::write(dir.path().join(NETWORK_FILE), r#"{"index": 3}"#).unwrap();
        let relative = Path::new(dir.path().file_name().unwrap());
        let (layout, net) = recorded(relative).unwrap();
        assert!(layout.dir.is_absolute(), "{}", layout.dir.display());
        assert_eq!(
            layout.dir.canonicalize().unwrap(),
            dir.path().canonicalize().unwrap()
        );
        assert_eq!(net.index, 3);
    }

    #[test]
    fn a_restarted_node_starts_without_the_runtime_state_of_the_last_one() {
        let dir = tempfile::tempdir().unwrap();
        let l = Layout {
            dir: dir.path().to_owned(),
        };
        l.reset_runtime_state().unwrap();
        let stale_shim = l.path("run/containerd-state/io.containerd.runtime.v2.task/k8s.io/c1");
        std::fs::create_dir_all(&stale_shim).unwrap();
        std::fs::write(l.containerd_socket(), "").unwrap();
        std::fs::write(l.path("kubelet.yaml"), "kept").unwrap();
        l.reset_runtime_state().unwrap();
        assert!(!l.containerd_socket().exists());
        assert!(!stale_shim.exists());
        assert_eq!(std::fs::read_dir(l.path("run")).unwrap().count(), 0);
        assert_eq!(
            std::fs::read_to_string(l.path("kubelet.yaml")).unwrap(),
            "kept"
        );
    }

    #[test]
    fn node_names_fit_linux_limits_and_addresses_do_not_overlap() {
        for index in 0..MAX_NODES {
            let n = NodeNet { index };
            assert!(n.veth_host().len() <= 15 && n.veth_node().len() <= 15);
            assert!(n.veth_outside().len() <= 15);
            assert_ne!(n.host_ip(), n.node_ip());
            // The link's /30 holds both ends; the outside's /30 is the next one.
            assert_eq!(n.host_ip().octets()[..3], n.node_ip().octets()[..3]);
            let quad = |a: Ipv4Addr| a.octets()[3] / 4;
            assert_eq!(quad(n.host_ip()), quad(n.node_ip()));
            assert_eq!(quad(n.outside_link_node()), quad(n.outside_link_far()));
            assert_ne!(quad(n.node_ip()), quad(n.outside_link_node()));
        }
        let (a, b) = (NodeNet { index: 1 }, NodeNet { index: 2 });
        assert_ne!(a.pod_cidr(), b.pod_cidr());
        assert_ne!(a.cgroup_root(), b.cgroup_root());
    }

    #[test]
    fn configurations_name_the_node_paths_and_addresses() {
        let (l, n) = (layout(), NodeNet { index: 7 });
        let ca = Path::new("/state/pki/ca.crt");
        let kubelet: serde_json::Value = serde_yaml::from_str(&kubelet_config(&l, &n, ca)).unwrap();
        assert_eq!(kubelet["cgroupDriver"], "cgroupfs");
        assert_eq!(kubelet["failCgroupV1"], false);
        assert_eq!(kubelet["cgroupRoot"], "/vcp-node-7");
        assert_eq!(kubelet["address"], "10.243.7.2");
        assert_eq!(kubelet["authentication"]["anonymous"]["enabled"], false);
        assert_eq!(
            kubelet["containerRuntimeEndpoint"],
            "unix:///state/node/run/containerd.sock"
        );
        let kc =
            kube::config::Kubeconfig::from_yaml(&node_kubeconfig(&l, &n, ca, "client")).unwrap();
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://10.243.7.1:6443"));
        assert_eq!(cluster.tls_server_name.as_deref(), Some("localhost"));
        let relay = api_relay(&n, 31000);
        if let Ok(relay) = relay {
            assert_eq!(
                relay.args[1],
                "TCP-LISTEN:6443,bind=10.243.7.1,fork,reuseaddr"
            );
            assert_eq!(relay.args[2], "TCP:127.0.0.1:31000");
        }
        let proxy: serde_json::Value = serde_yaml::from_str(&kube_proxy_config(&l, &n)).unwrap();
        assert_eq!(proxy["clusterCIDR"], "10.246.7.0/24");
        assert_eq!(proxy["conntrack"]["maxPerCore"], 0);
        let cni: serde_json::Value = serde_json::from_str(&cni_config(&l, &n)).unwrap();
        assert_eq!(
            cni["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
            "10.246.7.0/24"
        );
        assert_eq!(cni["plugins"][0]["ipMasq"], false);
        let ctd = containerd_config(&l);
        assert!(ctd.contains("restrict_oom_score_adj = true"));
        // Pod network namespaces are pinned in the node's state, not in the host's /run/netns.
        assert!(ctd.contains("netns_mounts_under_state_dir = true"));
        assert!(ctd.contains(images::PAUSE_IMAGE));
        assert!(ctd.contains("SystemdCgroup = false"));
        // Every pull goes to the dev cluster's registry of none, on the node's loopback.
        assert!(ctd.contains("config_path = '/state/node/registry-hosts'"));
        assert!(registry_hosts().starts_with("server = \"http://127.0.0.1:5000\""));
        assert!(no_registry_hint(&l).contains("`vcp-dev images --state-dir /state`"));
        assert!(crictl_config(&l).contains("unix:///state/node/run/containerd.sock"));
        let run = run_script(&l, &n);
        assert!(run.contains("--node-ip 10.243.7.2") && run.contains("vcp-node-7"));
        assert!(
            run.contains("python3 \"/state/node/no-registry.py\" 5000 \"Images are built here")
        );
        // A killed containerd's socket is gone before containerd starts, so the wait for it
        // waits for the new one.
        let removed = run.find("rm -f \"/state/node/run/containerd.sock\"");
        assert!(removed.is_some_and(|r| r < run.find("containerd --config").unwrap()));
        let queue = run
            .lines()
            .find(|l| l.starts_with("rule ") && l.contains("-j NFQUEUE"))
            .expect("the queue rule");
        assert!(queue.contains("--queue-num 100") && !queue.contains("--queue-bypass"));
        // Pod traffic leaving the bridge: to the host's end of the link or the outside only.
        let chain: Vec<&str> = run
            .lines()
            .filter(|l| l.starts_with("rule VCP-POD-OUT "))
            .collect();
        assert_eq!(
            chain,
            [
                "rule VCP-POD-OUT -d 10.243.7.1 -j RETURN",
                "rule VCP-POD-OUT -o vout7n -j RETURN",
                "rule VCP-POD-OUT -j DROP",
            ]
        );
        assert!(run.contains("rule FORWARD -i cni0 ! -o cni0 -j VCP-POD-OUT"));
        let ds = &network_policy_objects("img:1")[3];
        assert_eq!(
            ds["spec"]["template"]["spec"]["containers"][0]["args"][1],
            "--nfqueue-id=100"
        );
        for m in MOUNT_POINTS {
            assert!(run.contains(m), "run.sh mounts over {m}");
        }
    }
}
