//! A bare tenant control plane as local processes, for syncer tests.
//!
//! etcd, kube-apiserver (with the host's service CIDR, so ClusterIPs can be kept in step) and
//! kube-controller-manager on free loopback ports, with a PKI of their own. There is no
//! scheduler (the host schedules) and the controller-manager runs without node lifecycle (the
//! syncer owns the virtual nodes). [`TenantControlPlane::start_syncer`] runs `vcp-syncer`
//! between this tenant and the host. With [`TenantControlPlane::start_with_egress`] the
//! revocation authorizer runs too, for the apiserver's control-plane egress. Everything stops
//! on drop and dies with the test process.

use crate::cluster::{self, DevCluster, SERVICE_CIDR};
use crate::pki::ClusterPki;
use crate::process::{self, ProcSpec, Spawned, Supervision};
use crate::{Error, Result, bins, kubeconfig};
use kube::Client;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A running tenant control plane.
pub struct TenantControlPlane {
    pub key: String,
    pub kubeconfig: PathBuf,
    procs: Vec<Spawned>,
    dir: tempfile::TempDir,
    /// The kubelet endpoint's port, fixed in advance when the apiserver's egress goes through
    /// it ([`TenantControlPlane::start_with_egress`]).
    kubelet_port: Option<u16>,
}

fn p(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

async fn wait_url(proc: &mut Spawned, url: &str, ca: &str) -> Result<()> {
    let start = Instant::now();
    loop {
        proc.check_running()?;
        if cluster::probe(url, ca).await {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(90) {
            return Err(Error::Unhealthy {
                component: proc.name.clone(),
                secs: 90,
                log: proc.log.clone(),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The workspace's `vcp-syncer` binary (next to the test binary's target dir).
pub fn syncer_binary() -> Result<PathBuf> {
    let devnode = cluster::devnode_binary()?;
    let path = devnode.with_file_name("vcp-syncer");
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::MissingBinary {
            component: "vcp-syncer".into(),
            version: "workspace".into(),
            path,
        })
    }
}

/// Starts the revocation authorizer as the apiserver pod's sidecar runs
/// (templates/kube-apiserver.yaml), for its control-plane egress relay on `socket`: no list is
/// revoked, its webhook on a port of its own (the relay knows where it bound), the chained hop
/// to the syncer's proxy at `proxy` with the apiserver's kubelet client certificate. Returns
/// once the socket is there.
async fn start_authorizer(dir: &Path, socket: &Path, proxy: &str, pki: &Path) -> Result<Spawned> {
    let revoked = dir.join("revoked");
    std::fs::write(&revoked, "").map_err(Error::io(&revoked))?;
    let f = |n: &str| p(&pki.join(n));
    let mut spec = ProcSpec::new("tenant-authorizer", syncer_binary()?).args([
        "authorize".to_owned(),
        "--listen=127.0.0.1:0".to_owned(),
        format!("--revocations-file={}", p(&revoked)),
        format!("--egress-socket={}", p(socket)),
        format!("--egress-proxy={proxy}"),
        format!("--egress-ca={}", f("ca.crt")),
        format!("--egress-client-cert={}", f("kubelet-client.crt")),
        format!("--egress-client-key={}", f("kubelet-client.key")),
        // Nobody sends it SIGTERM for a drain here; a test's end stops it at once.
        "--drain-seconds=0".to_owned(),
    ]);
    spec.env
        .push(("RUST_LOG".into(), "warn,vcp_syncer=debug".into()));
    let mut proc = process::spawn(&spec, Supervision::Attached, &dir.join("authorizer.log"))?;
    let start = Instant::now();
    while !socket.exists() {
        proc.check_running()?;
        if start.elapsed() > Duration::from_secs(30) {
            return Err(Error::Unhealthy {
                component: proc.name.clone(),
                secs: 30,
                log: proc.log.clone(),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(proc)
}

impl TenantControlPlane {
    /// Starts a tenant control plane of the host's Kubernetes version.
    pub async fn start(key: &str) -> Result<TenantControlPlane> {
        Self::start_opts(key, false).await
    }

    /// [`Self::start`] with the apiserver's egress as a provisioned tenant's apiserver runs
    /// (templates/kube-apiserver.yaml): its cluster context through its syncer's egress
    /// proxy, its control-plane context through the revocation authorizer's relay (started
    /// here, before the apiserver), which passes all but its own webhook to that proxy. The
    /// syncer's kubelet endpoint gets a port chosen now, which both name.
    pub async fn start_with_egress(key: &str) -> Result<TenantControlPlane> {
        Self::start_opts(key, true).await
    }

    async fn start_opts(key: &str, egress: bool) -> Result<TenantControlPlane> {
        let version = bins::host_kubernetes_version();
        let etcd_bin = bins::tool("etcd")?;
        let api_bin = bins::binary("kube-apiserver", version)?;
        let kcm_bin = bins::binary("kube-controller-manager", version)?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("vcp-tenant-{key}-"))
            .tempdir()
            .map_err(Error::io(std::env::temp_dir()))?;
        let d = dir.path();
        let pki_dir = d.join("pki");
        std::fs::create_dir_all(&pki_dir).map_err(Error::io(&pki_dir))?;
        let pki = ClusterPki::generate(
            &[[127, 0, 0, 1].into(), cluster::KUBERNETES_SERVICE_IP.into()],
            time::OffsetDateTime::now_utc(),
        )?;
        for (name, pem) in pki.files() {
            std::fs::write(pki_dir.join(&name), pem).map_err(Error::io(pki_dir.join(&name)))?;
        }
        let f = |n: &str| p(&pki_dir.join(n));
        let log = |n: &str| d.join(format!("{n}.log"));
        let [etcd_port, peer_port, api_port, kcm_port, kubelet_port] = process::free_ports()?;
        let kubelet_port = egress.then_some(kubelet_port);
        let mut egress_flags = Vec::new();
        let mut procs = Vec::new();
        if let Some(port) = kubelet_port {
            let socket = d.join("egress.sock");
            // As templates/kube-apiserver.yaml: the cluster context through the syncer's
            // proxy; the control-plane one (the authorization webhook, webhooks by URL)
            // through the revocation authorizer's relay on a Unix socket, which keeps its own
            // webhook local and asks the syncer's proxy for everything else.
            let proxy = format!("https://localhost:{port}");
            let file = d.join("egress.yaml");
            let mut text = String::from(
                "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\negressSelections:\n",
            );
            text.push_str(&format!(
                "- name: controlplane\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      uds:\n        udsName: {}\n",
                p(&socket)
            ));
            text.push_str(&format!(
                "- name: cluster\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      tcp:\n        url: {proxy}\n        tlsConfig:\n          caBundle: {}\n          clientCert: {}\n          clientKey: {}\n",
                f("ca.crt"),
                f("kubelet-client.crt"),
                f("kubelet-client.key"),
            ));
            std::fs::write(&file, text).map_err(Error::io(&file))?;
            egress_flags.push(format!("--egress-selector-config-file={}", p(&file)));
            procs.push(start_authorizer(d, &socket, &proxy, &pki_dir).await?);
        }

        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let mut etcd = process::spawn(
            &ProcSpec::new("tenant-etcd", &etcd_bin).args([
                "--name=tenant".to_owned(),
                format!("--data-dir={}", p(&d.join("etcd"))),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer}"),
                format!("--initial-advertise-peer-urls={peer}"),
                format!("--initial-cluster=tenant={peer}"),
                "--unsafe-no-fsync".to_owned(),
                "--log-level=warn".to_owned(),
            ]),
            Supervision::Attached,
            &log("etcd"),
        )?;
        wait_url(&mut etcd, &format!("{etcd_url}/health"), &pki.ca.cert_pem).await?;
        procs.push(etcd);

        let api_url = format!("https://127.0.0.1:{api_port}");
        let mut api = process::spawn(
            &ProcSpec::new("tenant-apiserver", &api_bin).args(
                [
                    format!("--etcd-servers={etcd_url}"),
                    "--bind-address=127.0.0.1".to_owned(),
                    format!("--secure-port={api_port}"),
                    format!("--advertise-address={}", cluster::ADVERTISE_ADDRESS),
                    "--endpoint-reconciler-type=none".to_owned(),
                    format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                    format!("--tls-cert-file={}", f("apiserver.crt")),
                    format!("--tls-private-key-file={}", f("apiserver.key")),
                    format!("--client-ca-file={}", f("ca.crt")),
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local"
                        .to_owned(),
                    format!("--service-account-key-file={}", f("sa.pub")),
                    format!("--service-account-signing-key-file={}", f("sa.key")),
                    "--authorization-mode=RBAC".to_owned(),
                    "--profiling=false".to_owned(),
                    // Kubelet calls go to the syncer's endpoint, verified as a kubelet is.
                    format!("--kubelet-client-certificate={}", f("kubelet-client.crt")),
                    format!("--kubelet-client-key={}", f("kubelet-client.key")),
                    format!("--kubelet-certificate-authority={}", f("ca.crt")),
                    "--kubelet-preferred-address-types=Hostname,InternalIP".to_owned(),
                    // Aggregated APIs (the syncer's metrics.k8s.io) get requests passed on with the
                    // front-proxy client certificate, as a provisioned tenant's apiserver does.
                    format!("--requestheader-client-ca-file={}", f("front-proxy-ca.crt")),
                    "--requestheader-allowed-names=front-proxy-client".to_owned(),
                    "--requestheader-username-headers=X-Remote-User".to_owned(),
                    "--requestheader-group-headers=X-Remote-Group".to_owned(),
                    "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_owned(),
                    format!("--proxy-client-cert-file={}", f("front-proxy-client.crt")),
                    format!("--proxy-client-key-file={}", f("front-proxy-client.key")),
                ]
                .into_iter()
                .chain(egress_flags),
            ),
            Supervision::Attached,
            &log("kube-apiserver"),
        )?;
        wait_url(&mut api, &format!("{api_url}/readyz"), &pki.ca.cert_pem).await?;
        procs.push(api);

        let admin = d.join("admin.kubeconfig");
        std::fs::write(
            &admin,
            kubeconfig::render(
                &format!("tenant-{key}"),
                &api_url,
                &pki.ca.cert_pem,
                "admin",
                &pki.admin,
            ),
        )
        .map_err(Error::io(&admin))?;
        let kcm_kc = d.join("kcm.kubeconfig");
        std::fs::write(
            &kcm_kc,
            kubeconfig::render(
                "tenant",
                &api_url,
                &pki.ca.cert_pem,
                "kcm",
                &pki.controller_manager,
            ),
        )
        .map_err(Error::io(&kcm_kc))?;
        let mut kcm = process::spawn(
            &ProcSpec::new("tenant-controller-manager", &kcm_bin).args([
                format!("--kubeconfig={}", p(&kcm_kc)),
                "--bind-address=127.0.0.1".to_owned(),
                format!("--secure-port={kcm_port}"),
                format!("--tls-cert-file={}", f("controller-manager-serving.crt")),
                format!(
                    "--tls-private-key-file={}",
                    f("controller-manager-serving.key")
                ),
                "--leader-elect=false".to_owned(),
                "--use-service-account-credentials=true".to_owned(),
                format!("--service-account-private-key-file={}", f("sa.key")),
                format!("--root-ca-file={}", f("ca.crt")),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                // The syncer plays the kubelet and owns virtual nodes; no node lifecycle here.
                "--controllers=*,-nodelifecycle".to_owned(),
                "--kube-api-qps=200".to_owned(),
                "--kube-api-burst=400".to_owned(),
            ]),
            Supervision::Attached,
            &log("kube-controller-manager"),
        )?;
        wait_url(
            &mut kcm,
            &format!("https://127.0.0.1:{kcm_port}/healthz"),
            &pki.ca.cert_pem,
        )
        .await?;
        procs.push(kcm);
        Ok(TenantControlPlane {
            key: key.to_owned(),
            kubeconfig: admin,
            procs,
            dir,
            kubelet_port,
        })
    }

    /// A cluster-admin client of the tenant for the current runtime.
    pub async fn connect(&self) -> Result<Client> {
        cluster::client_from(&self.kubeconfig).await
    }

    /// Starts `vcp-syncer` between this tenant and `host`, with extra flags. Its log is
    /// `<tenant dir>/syncer.log`; it stops when the returned handle drops.
    pub fn start_syncer(&self, host: &DevCluster, extra: &[&str]) -> Result<Spawned> {
        self.start_syncer_binary(host, &syncer_binary()?, extra)
    }

    /// [`Self::start_syncer`] with another build of `vcp-syncer` (a release build, say).
    pub fn start_syncer_binary(
        &self,
        host: &DevCluster,
        binary: &std::path::Path,
        extra: &[&str],
    ) -> Result<Spawned> {
        self.start_syncer_as(host.kubeconfig_path(), binary, extra)
    }

    /// [`Self::start_syncer_binary`] with host credentials of the caller's choosing
    /// (`host_kubeconfig`, a restricted or impersonating one, say).
    pub fn start_syncer_as(
        &self,
        host_kubeconfig: &std::path::Path,
        binary: &std::path::Path,
        extra: &[&str],
    ) -> Result<Spawned> {
        // Port 0: nobody probes it here, and a port picked in advance can be taken by another
        // test's process before the syncer binds it (the syncer would exit at once).
        let mut spec = ProcSpec::new("vcp-syncer", binary.to_path_buf()).args([
            format!("--tenant-kubeconfig={}", p(&self.kubeconfig)),
            format!("--host-kubeconfig={}", p(host_kubeconfig)),
            format!("--tenant-key={}", self.key),
            "--listen=127.0.0.1:0".to_owned(),
            // The kubelet endpoint on a port of its own, named `localhost` on virtual nodes
            // (its certificate's name).
            "--kubelet-listen=127.0.0.1:0".to_owned(),
            "--kubelet-address=localhost".to_owned(),
            format!(
                "--kubelet-tls-cert={}",
                p(&self.pki_file("kubelet-serving.crt"))
            ),
            format!(
                "--kubelet-tls-key={}",
                p(&self.pki_file("kubelet-serving.key"))
            ),
            format!("--kubelet-client-ca={}", p(&self.pki_file("ca.crt"))),
            // As vcp runs it: pods with a subdomain get the hosts-file init container (on kwok
            // workers it only has to be there).
            "--etc-hosts-image=ghcr.io/vcp-dev/vcp-syncer:dev".to_owned(),
            // `kubectl top`: the metrics API on the same endpoint, for the front-proxy client.
            format!(
                "--metrics-api-client-ca={}",
                p(&self.pki_file("front-proxy-ca.crt"))
            ),
        ]);
        if let Some(port) = self.kubelet_port {
            spec = spec.args([format!("--kubelet-listen=127.0.0.1:{port}")]);
        }
        spec = spec.args(extra.iter().map(|s| (*s).to_owned()));
        spec.env
            .push(("RUST_LOG".into(), "warn,vcp_syncer=debug".into()));
        process::spawn(&spec, Supervision::Attached, &self.syncer_log())
    }

    /// Writes a tenant policy (YAML, as a plan's `policy` section) next to the control plane
    /// and returns the syncer flag that reads it.
    pub fn policy_flag(&self, yaml: &str) -> Result<String> {
        let path = self.dir.path().join("policy.yaml");
        std::fs::write(&path, yaml).map_err(crate::Error::io(&path))?;
        Ok(format!("--policy={}", p(&path)))
    }

    /// A PEM file of this control plane's PKI (`ca.crt`, `admin.crt`, `kubelet-client.key`, ...).
    pub fn pki_file(&self, name: &str) -> PathBuf {
        self.dir.path().join("pki").join(name)
    }

    /// Each process of this control plane, alive or not, with the end of its log.
    pub fn postmortem(&self) -> String {
        process::postmortem(&self.procs, 8)
    }

    /// Where the syncer logs.
    pub fn syncer_log(&self) -> PathBuf {
        self.dir.path().join("syncer.log")
    }
}

impl Drop for TenantControlPlane {
    fn drop(&mut self) {
        for p in self.procs.iter_mut().rev() {
            p.stop(Duration::from_secs(5));
        }
    }
}
