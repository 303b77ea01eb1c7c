//! One pod's life on the devnode: a worker task per pod UID.
//!
//! Each tick (half a second, or sooner on an update) the worker moves the pod forward and is
//! idempotent about it: network namespace and IP -> hosts file -> volumes (refreshed every
//! tick, so a changed Secret shows up within about a second) -> init containers in order ->
//! containers, restarted per `restartPolicy` with exponential back-off -> probes -> status,
//! patched only when it changed. A pod with a deletion timestamp gets SIGTERM, SIGKILL after
//! its grace period, its namespace, mounts and files removed, and is then deleted from the
//! API with grace 0, as a kubelet does.

use crate::container::{self, Launch, Mount, ProbeResult};
use crate::dns;
use crate::identity::{self, ImageUser};
use crate::images::{self, ImageDirs};
use crate::network::{self, Network};
use crate::status::{self, ContainerView, Termination};
use crate::volumes::{self, Backing, Inputs};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, PersistentVolume, PersistentVolumeClaim, Pod, PodStatus, Probe, Secret,
    Service, ServiceAccount,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use vcp_dev::process::Spawned;

/// What every pod worker shares.
pub struct Shared {
    pub client: Client,
    pub node: String,
    pub net: Network,
    pub slots: Mutex<network::Slots>,
    pub images: ImageDirs,
    pub pods_dir: PathBuf,
    pub logs_dir: PathBuf,
    pub secrets: Store<Secret>,
    pub config_maps: Store<ConfigMap>,
    pub services: Store<Service>,
    pub slices: Store<EndpointSlice>,
    pub claims: Store<PersistentVolumeClaim>,
    pub volumes: Store<PersistentVolume>,
}

const TICK: Duration = Duration::from_millis(500);
const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A container that ran this long has its back-off reset.
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(30);
const IMAGE_RETRY: Duration = Duration::from_secs(10);

#[derive(Debug, Default, Clone)]
struct ProbeState {
    successes: i32,
    failures: i32,
    next: Option<Instant>,
}

struct Ctr {
    spec: Container,
    init: bool,
    proc: Option<Spawned>,
    running_since: Option<Time>,
    started_instant: Option<Instant>,
    restart_count: i32,
    waiting: Option<(String, String)>,
    terminated: Option<Termination>,
    last: Option<Termination>,
    restart_pending: bool,
    next_start: Instant,
    backoff: Duration,
    started: bool,
    ready: bool,
    probes: [ProbeState; 3],
}

impl Ctr {
    fn new(spec: Container, init: bool) -> Ctr {
        Ctr {
            spec,
            init,
            proc: None,
            running_since: None,
            started_instant: None,
            restart_count: 0,
            waiting: None,
            terminated: None,
            last: None,
            restart_pending: false,
            next_start: Instant::now(),
            backoff: BACKOFF_START,
            started: false,
            ready: false,
            probes: Default::default(),
        }
    }

    fn view(&self) -> ContainerView {
        ContainerView {
            name: self.spec.name.clone(),
            image: self.spec.image.clone().unwrap_or_default(),
            init: self.init,
            restart_count: self.restart_count,
            pid: self.proc.as_ref().map(|p| p.pid),
            running_since: self.running_since.clone(),
            started: self.started,
            ready: self.ready,
            waiting: self.waiting.clone(),
            terminated: if self.restart_pending {
                None
            } else {
                self.terminated.clone()
            },
            last: self.last.clone(),
        }
    }

    fn succeeded(&self) -> bool {
        self.terminated.as_ref().is_some_and(|t| t.exit_code == 0) && self.proc.is_none()
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

struct Worker {
    sh: Arc<Shared>,
    pod: Arc<Pod>,
    dir: PathBuf,
    slot: Option<u8>,
    ip: Option<Ipv4Addr>,
    start_time: Time,
    ctrs: Vec<Ctr>,
    tokens: BTreeMap<(String, i64), (String, Instant)>,
    volumes_ready: bool,
    /// Writable volumes already given to the pod's fsGroup.
    grouped: BTreeSet<String>,
    hosts: String,
    last_status: Option<PodStatus>,
}

/// Runs a pod until it is deleted (or vanishes from the API).
pub async fn run(sh: Arc<Shared>, mut updates: watch::Receiver<Option<Arc<Pod>>>) {
    let Some(pod) = updates.borrow_and_update().clone() else {
        return;
    };
    let uid = pod.uid().unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();
    let ctrs = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| Ctr::new(c.clone(), true))
        .chain(spec.containers.iter().map(|c| Ctr::new(c.clone(), false)))
        .collect();
    let mut w = Worker {
        dir: sh.pods_dir.join(&uid),
        sh,
        pod,
        slot: None,
        ip: None,
        start_time: now(),
        ctrs,
        tokens: BTreeMap::new(),
        volumes_ready: false,
        grouped: BTreeSet::new(),
        hosts: String::new(),
        last_status: None,
    };
    tracing::info!(pod = %w.key(), uid = %uid, "pod accepted");
    loop {
        if w.pod.metadata.deletion_timestamp.is_some() {
            w.terminate(true).await;
            return;
        }
        w.tick().await;
        tokio::select! {
            changed = updates.changed() => {
                if changed.is_err() {
                    w.terminate(false).await;
                    return;
                }
                let next = updates.borrow_and_update().clone();
                match next {
                    Some(p) => w.pod = p,
                    None => {
                        // Gone from the API (force-deleted): stop everything, nothing to report.
                        w.terminate(false).await;
                        return;
                    }
                }
            }
            () = tokio::time::sleep(TICK) => {}
        }
    }
}

/// Where a container's termination message goes unless its spec says otherwise.
const TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";
/// A kubelet keeps at most this much of a termination message.
const TERMINATION_MESSAGE_MAX: usize = 4096;

impl Worker {
    fn termination_file(&self, container: &str) -> PathBuf {
        self.dir.join("termination").join(container)
    }

    /// The container's termination message: its file, or with `fallback` (a failed container
    /// under `FallbackToLogsOnError`) and an empty file, the tail of its log.
    fn termination_message(&self, container: &str, fallback: bool) -> Option<String> {
        let tail = |b: Vec<u8>| {
            let from = b.len().saturating_sub(TERMINATION_MESSAGE_MAX);
            String::from_utf8_lossy(&b[from..]).trim_end().to_owned()
        };
        let written = std::fs::read(self.termination_file(container))
            .map(tail)
            .unwrap_or_default();
        if !written.is_empty() {
            return Some(written);
        }
        if !fallback {
            return None;
        }
        let log = container::log_path(
            &self.sh.logs_dir,
            &self.ns(),
            &self.pod.name_any(),
            container,
        );
        std::fs::read(log).map(tail).ok().filter(|m| !m.is_empty())
    }

    fn key(&self) -> String {
        format!(
            "{}/{}",
            self.pod.namespace().unwrap_or_default(),
            self.pod.name_any()
        )
    }

    fn ns(&self) -> String {
        self.pod.namespace().unwrap_or_default()
    }

    fn restart_policy(&self) -> String {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.clone())
            .unwrap_or_else(|| "Always".into())
    }

    fn hostname(&self) -> String {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.hostname.clone())
            .unwrap_or_else(|| self.pod.name_any())
    }

    async fn tick(&mut self) {
        if self.slot.is_none()
            && let Err(msg) = self.setup_network()
        {
            self.wait_all("NetworkNotReady", &msg);
            self.report().await;
            return;
        }
        self.refresh_hosts();
        match self.refresh_volumes().await {
            Ok(()) => self.volumes_ready = true,
            Err(msg) if !self.volumes_ready => {
                self.wait_all("ContainerCreating", &msg);
                self.report().await;
                return;
            }
            Err(msg) => tracing::warn!(pod = %self.key(), error = %msg, "volume refresh failed"),
        }
        let policy = self.restart_policy();
        let mut init_done = true;
        for i in 0..self.ctrs.len() {
            if !self.ctrs[i].init {
                continue;
            }
            if self.ctrs[i].succeeded() {
                continue;
            }
            init_done = false;
            self.drive(i, &policy).await;
            break;
        }
        if init_done {
            for i in 0..self.ctrs.len() {
                if !self.ctrs[i].init {
                    self.drive(i, &policy).await;
                }
            }
        }
        self.run_probes().await;
        self.report().await;
    }

    fn wait_all(&mut self, reason: &str, msg: &str) {
        for c in &mut self.ctrs {
            if c.proc.is_none() {
                c.waiting = Some((reason.to_owned(), msg.to_owned()));
            }
        }
    }

    fn setup_network(&mut self) -> Result<(), String> {
        let slot = {
            let mut slots = self.sh.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.take().ok_or("the devnode's pod network is full")?
        };
        match self.sh.net.add_pod(slot) {
            Ok(ip) => {
                self.slot = Some(slot);
                self.ip = Some(ip);
                Ok(())
            }
            Err(e) => {
                self.sh.net.remove_pod(slot);
                self.sh
                    .slots
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .release(slot);
                Err(e.to_string())
            }
        }
    }

    fn refresh_hosts(&mut self) {
        let Some(slot) = self.slot else { return };
        let spec = self.pod.spec.as_ref();
        let identity = dns::PodIdentity {
            namespace: self.ns(),
            ip: self.ip.map(IpAddr::V4),
            hostname: self.hostname(),
            subdomain: spec.and_then(|s| s.subdomain.clone()),
        };
        let services: Vec<Service> = self
            .sh
            .services
            .state()
            .iter()
            .map(|s| (**s).clone())
            .collect();
        let slices: Vec<EndpointSlice> = self
            .sh
            .slices
            .state()
            .iter()
            .map(|s| (**s).clone())
            .collect();
        let net = self.sh.net.clone();
        let mut hosts = dns::hosts_file(&identity, &services, &slices, |ip| net.contains(ip));
        let gw = self.sh.net.gateway();
        hosts.push_str(&format!(
            "{gw}\tkubernetes kubernetes.default kubernetes.default.svc kubernetes.default.svc.{}\n",
            dns::CLUSTER_DOMAIN
        ));
        if hosts == self.hosts {
            return;
        }
        let dir = PathBuf::from(format!("/etc/netns/{}", self.sh.net.netns(slot)));
        let _ = std::fs::create_dir_all(&dir);
        // `ip netns exec` mounts this over /etc/resolv.conf too. There is no cluster DNS here
        // and the machine's nameserver is out of a pod's reach: a name the hosts file lacks
        // must fail at once (nothing answers on the pod's own loopback), not after a resolver
        // timeout that Go shares with every concurrent lookup of that name, including ones
        // made after the name appeared in the hosts file.
        let resolv = dir.join("resolv.conf");
        if !resolv.exists() {
            let _ = std::fs::write(&resolv, dns::RESOLV_CONF);
        }
        // In place, not by rename: running containers see this file through a bind mount of
        // its inode.
        if std::fs::write(dir.join("hosts"), &hosts).is_ok() {
            self.hosts = hosts;
        }
    }

    async fn refresh_volumes(&mut self) -> Result<(), String> {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let ns = self.ns();
        let mut inputs = Inputs::default();
        for v in spec.volumes.iter().flatten() {
            let mut secret_names = Vec::new();
            let mut cm_names = Vec::new();
            if let Some(s) = &v.secret {
                secret_names.extend(s.secret_name.clone());
            }
            if let Some(c) = &v.config_map {
                cm_names.push(c.name.clone());
            }
            for src in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
                if let Some(s) = &src.secret {
                    secret_names.push(s.name.clone());
                }
                if let Some(c) = &src.config_map {
                    cm_names.push(c.name.clone());
                }
            }
            for n in secret_names {
                if let Some(s) = self.sh.secrets.get(&ObjectRef::new(&n).within(&ns)) {
                    inputs.secrets.insert(n, (*s).clone());
                }
            }
            for n in cm_names {
                if let Some(c) = self.sh.config_maps.get(&ObjectRef::new(&n).within(&ns)) {
                    inputs.config_maps.insert(n, (*c).clone());
                }
            }
            if let Some(c) = &v.persistent_volume_claim {
                let path = self
                    .sh
                    .claims
                    .get(&ObjectRef::new(&c.claim_name).within(&ns))
                    .and_then(|pvc| pvc.spec.as_ref()?.volume_name.clone())
                    .and_then(|pv| self.sh.volumes.get(&ObjectRef::new(&pv)))
                    .and_then(|pv| {
                        Some(PathBuf::from(&pv.spec.as_ref()?.host_path.as_ref()?.path))
                    });
                if let Some(p) = path {
                    inputs.claim_paths.insert(c.claim_name.clone(), p);
                }
            }
        }
        for req in volumes::token_requests(&self.pod) {
            let due = self
                .tokens
                .get(&req)
                .is_none_or(|(_, refresh)| Instant::now() >= *refresh);
            if due {
                let token = self.request_token(&req.0, req.1).await?;
                // Refresh at 80% of the lifetime, as a kubelet does.
                let refresh =
                    Instant::now() + Duration::from_secs((req.1.max(600) as u64) * 8 / 10);
                self.tokens.insert(req.clone(), (token, refresh));
            }
        }
        inputs.tokens = self
            .tokens
            .iter()
            .map(|(k, (t, _))| (k.clone(), t.clone()))
            .collect();
        let fs_group = spec
            .security_context
            .as_ref()
            .and_then(|s| s.fs_group)
            .map(|g| u32::try_from(g).map_err(|_| format!("invalid fsGroup {g}")))
            .transpose()?;
        for v in spec.volumes.iter().flatten() {
            let backing = volumes::files_for(&self.pod, v, &inputs).map_err(|e| e.to_string())?;
            let dir = self.dir.join("volumes").join(&v.name);
            match backing {
                // Under an fsGroup, a kubelet gives read-only volumes to the group with group
                // read: a non-root container reads its 0400 Secret that way.
                Backing::Files(files) => {
                    let files = match fs_group {
                        Some(_) => volumes::group_readable(files),
                        None => files,
                    };
                    volumes::write_atomic(&dir, &files)
                        .map_err(|e| format!("volume {}: {e}", v.name))?;
                    if let Some(gid) = fs_group {
                        volumes::give_to_group_read_only(&dir, gid)
                            .map_err(|e| format!("volume {}: fsGroup {gid}: {e}", v.name))?;
                    }
                }
                Backing::Dir(None) => {
                    volumes::make_empty_dir(&dir).map_err(|e| format!("volume {}: {e}", v.name))?;
                }
                Backing::Dir(Some(_)) => {}
            }
        }
        self.apply_fs_group(&spec, &inputs)?;
        Ok(())
    }

    /// Gives the pod's writable volumes (emptyDir, claims) to its `fsGroup` once, as a
    /// kubelet does when it mounts them: group ownership, group read and write, and setgid
    /// directories so new files stay in the group. (Secret, ConfigMap and projected files are
    /// given to the group with group read as they are written.)
    fn apply_fs_group(
        &mut self,
        spec: &k8s_openapi::api::core::v1::PodSpec,
        inputs: &Inputs,
    ) -> Result<(), String> {
        let Some(gid) = spec.security_context.as_ref().and_then(|s| s.fs_group) else {
            return Ok(());
        };
        let gid = u32::try_from(gid).map_err(|_| format!("invalid fsGroup {gid}"))?;
        for v in spec.volumes.iter().flatten() {
            let dir = if v.empty_dir.is_some() {
                self.dir.join("volumes").join(&v.name)
            } else if let Some(c) = &v.persistent_volume_claim {
                match inputs.claim_paths.get(&c.claim_name) {
                    Some(p) => p.clone(),
                    None => continue,
                }
            } else {
                continue;
            };
            if self.grouped.contains(&v.name) {
                continue;
            }
            volumes::give_to_group(&dir, gid)
                .map_err(|e| format!("volume {}: fsGroup {gid}: {e}", v.name))?;
            self.grouped.insert(v.name.clone());
        }
        Ok(())
    }

    async fn request_token(&self, audience: &str, expiration: i64) -> Result<String, String> {
        let spec = self.pod.spec.as_ref();
        let sa = spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let mut req = serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": expiration.max(600),
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.pod.name_any(), "uid": self.pod.uid()},
            },
        });
        if !audience.is_empty() {
            req["spec"]["audiences"] = serde_json::json!([audience]);
        }
        let api: Api<ServiceAccount> = Api::namespaced(self.sh.client.clone(), &self.ns());
        let tr: TokenRequest = api
            .create_subresource("token", &sa, &PostParams::default(), &req)
            .await
            .map_err(|e| format!("token for service account {sa}: {e}"))?;
        tr.status
            .and_then(|s| s.token)
            .ok_or_else(|| "token request returned no token".into())
    }

    fn volume_source(&self, name: &str) -> Option<PathBuf> {
        let v = self
            .pod
            .spec
            .as_ref()?
            .volumes
            .as_ref()?
            .iter()
            .find(|v| v.name == name)?;
        if let Some(h) = &v.host_path {
            return Some(PathBuf::from(&h.path));
        }
        if let Some(c) = &v.persistent_volume_claim {
            let ns = self.ns();
            let pv = self
                .sh
                .claims
                .get(&ObjectRef::new(&c.claim_name).within(&ns))?
                .spec
                .as_ref()?
                .volume_name
                .clone()?;
            return Some(PathBuf::from(
                &self
                    .sh
                    .volumes
                    .get(&ObjectRef::new(&pv))?
                    .spec
                    .as_ref()?
                    .host_path
                    .as_ref()?
                    .path,
            ));
        }
        Some(self.dir.join("volumes").join(name))
    }

    /// The container's environment: the runtime's basics, the image's, then the pod's.
    fn env_of(
        &self,
        c: &Container,
        image_env: &[(String, String)],
    ) -> Result<Vec<(String, String)>, String> {
        let ns = self.ns();
        let mut env = container::base_env(&self.hostname());
        let set = |env: &mut Vec<(String, String)>, k: String, v: String| {
            env.retain(|(ek, _)| *ek != k);
            env.push((k, v));
        };
        for (k, v) in image_env {
            set(&mut env, k.clone(), v.clone());
        }
        for from in c.env_from.iter().flatten() {
            let prefix = from.prefix.clone().unwrap_or_default();
            if let Some(r) = &from.config_map_ref {
                match self
                    .sh
                    .config_maps
                    .get(&ObjectRef::new(&r.name).within(&ns))
                {
                    Some(cm) => {
                        for (k, v) in cm.data.iter().flatten() {
                            set(&mut env, format!("{prefix}{k}"), v.clone());
                        }
                    }
                    None if r.optional == Some(true) => {}
                    None => return Err(format!("configmap {:?} not found", r.name)),
                }
            }
            if let Some(r) = &from.secret_ref {
                match self.sh.secrets.get(&ObjectRef::new(&r.name).within(&ns)) {
                    Some(s) => {
                        for (k, v) in s.data.iter().flatten() {
                            set(
                                &mut env,
                                format!("{prefix}{k}"),
                                String::from_utf8_lossy(&v.0).into_owned(),
                            );
                        }
                    }
                    None if r.optional == Some(true) => {}
                    None => return Err(format!("secret {:?} not found", r.name)),
                }
            }
        }
        for e in c.env.iter().flatten() {
            let value = match &e.value_from {
                None => expand(e.value.as_deref().unwrap_or_default(), &env),
                Some(src) => {
                    if let Some(f) = &src.field_ref {
                        match f.field_path.as_str() {
                            // Our own view is ahead of the API's: the status may not be written yet.
                            "status.podIP" => self.ip.map(|i| i.to_string()).unwrap_or_default(),
                            "status.podIPs" => self.ip.map(|i| i.to_string()).unwrap_or_default(),
                            "status.hostIP" | "status.hostIPs" => "127.0.0.1".into(),
                            "spec.nodeName" => self.sh.node.clone(),
                            _ => volumes::pod_field(&self.pod, f).map_err(|e| e.to_string())?,
                        }
                    } else if let Some(r) = &src.config_map_key_ref {
                        match self
                            .sh
                            .config_maps
                            .get(&ObjectRef::new(&r.name).within(&ns))
                            .and_then(|cm| cm.data.as_ref()?.get(&r.key).cloned())
                        {
                            Some(v) => v,
                            None if r.optional == Some(true) => continue,
                            None => {
                                return Err(format!(
                                    "key {:?} of configmap {:?} not found",
                                    r.key, r.name
                                ));
                            }
                        }
                    } else if let Some(r) = &src.secret_key_ref {
                        match self
                            .sh
                            .secrets
                            .get(&ObjectRef::new(&r.name).within(&ns))
                            .and_then(|s| s.data.as_ref()?.get(&r.key).cloned())
                        {
                            Some(v) => String::from_utf8_lossy(&v.0).into_owned(),
                            None if r.optional == Some(true) => continue,
                            None => {
                                return Err(format!(
                                    "key {:?} of secret {:?} not found",
                                    r.key, r.name
                                ));
                            }
                        }
                    } else {
                        // resourceFieldRef: processes here are not limited.
                        "0".into()
                    }
                }
            };
            set(&mut env, e.name.clone(), value);
        }
        Ok(env)
    }

    fn launch_for(&self, c: &Container) -> Result<Launch, (String, String)> {
        let image = c.image.clone().unwrap_or_default();
        let pulled = |e: images::ImageError| ("ErrImagePull".to_owned(), e.to_string());
        let config = |m: String| ("CreateContainerConfigError".to_owned(), m);
        let found = images::lookup(&image, &self.sh.images).map_err(pulled)?;
        let (image_env, users) = found.map(|i| (i.env, i.users)).unwrap_or_default();
        let env = self.env_of(c, &image_env).map_err(config)?;
        let run_as = identity::run_as(
            self.pod
                .spec
                .as_ref()
                .and_then(|s| s.security_context.as_ref()),
            &c.name,
            c.security_context.as_ref(),
            &users,
        )
        .map_err(|e| config(e.to_string()))?;
        let command: Vec<String> = c
            .command
            .iter()
            .flatten()
            .map(|s| expand(s, &env))
            .collect();
        let args: Vec<String> = c.args.iter().flatten().map(|s| expand(s, &env)).collect();
        let exec = images::resolve(&image, &command, &args, &self.sh.images, is_executable)
            .map_err(pulled)?;
        let mut mounts = self.user_tables(&c.name, &users).map_err(config)?;
        for m in c.volume_mounts.iter().flatten() {
            let mut source = self.volume_source(&m.name).ok_or_else(|| {
                (
                    "CreateContainerConfigError".to_owned(),
                    format!("volume {:?} not found", m.name),
                )
            })?;
            if let Some(sub) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                source = source.join(sub);
            }
            mounts.push(Mount {
                source,
                target: m.mount_path.clone(),
                read_only: m.read_only == Some(true),
            });
        }
        // The termination-message file, empty at each start, as a kubelet mounts it.
        let term = self.termination_file(&c.name);
        let fresh = term
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&term, b""))
            .and_then(|()| {
                // Writable by whichever uid the container runs as, as a kubelet makes it.
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&term, std::fs::Permissions::from_mode(0o666))
            });
        if let Err(e) = fresh {
            return Err((
                "CreateContainerConfigError".to_owned(),
                format!("termination message file {}: {e}", term.display()),
            ));
        }
        mounts.push(Mount {
            source: term,
            target: c
                .termination_message_path
                .clone()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| TERMINATION_MESSAGE_PATH.to_owned()),
            read_only: false,
        });
        // A volume over the program's own path would hide it from the container.
        let (program, bind) =
            container::place_program(&exec.program, &mounts).map_err(|e| config(e.to_string()))?;
        mounts.extend(bind);
        let slot = self
            .slot
            .expect("network is set up before containers start");
        Ok(Launch {
            name: format!("{}/{}", self.key(), c.name),
            netns: self.sh.net.netns(slot),
            program,
            args: exec.args,
            env,
            mounts,
            working_dir: c.working_dir.clone(),
            log: container::log_path(&self.sh.logs_dir, &self.ns(), &self.pod.name_any(), &c.name),
            run_as,
        })
    }

    /// For an image with users of its own: `/etc/passwd` and `/etc/group` as the image has
    /// them (see [`identity`]), written for this container and mounted read-only.
    fn user_tables(&self, container: &str, users: &[ImageUser]) -> Result<Vec<Mount>, String> {
        if users.is_empty() {
            return Ok(Vec::new());
        }
        let dir = self.dir.join("etc").join(container);
        let mut mounts = Vec::new();
        for (name, render) in [
            (
                "passwd",
                identity::passwd_with as fn(&str, &[ImageUser]) -> String,
            ),
            ("group", identity::group_with),
        ] {
            let host = Path::new("/etc").join(name);
            let text = std::fs::read_to_string(&host).unwrap_or_default();
            let path = dir.join(name);
            std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(&path, render(&text, users)))
                .map_err(|e| format!("{}: {e}", path.display()))?;
            mounts.push(Mount {
                source: path,
                target: host.display().to_string(),
                read_only: true,
            });
        }
        Ok(mounts)
    }

    async fn drive(&mut self, i: usize, policy: &str) {
        // An exited process: record how it ended and decide on a restart.
        let exited = self.ctrs[i].proc.as_mut().and_then(|p| p.try_wait());
        if let Some(status) = exited {
            let c = &mut self.ctrs[i];
            c.proc = None;
            let ran = c.started_instant.map(|t| t.elapsed()).unwrap_or_default();
            let mut term = termination(status, c.running_since.take().unwrap_or_else(now));
            let fallback = c.spec.termination_message_policy.as_deref()
                == Some("FallbackToLogsOnError")
                && term.exit_code != 0;
            let name = c.spec.name.clone();
            term.message = self.termination_message(&name, fallback);
            let c = &mut self.ctrs[i];
            tracing::info!(pod = %format!("{}/{}", self.pod.namespace().unwrap_or_default(), self.pod.name_any()),
                container = %c.spec.name, exit_code = term.exit_code, "container exited");
            let failed = term.exit_code != 0;
            c.terminated = Some(term);
            c.ready = false;
            c.started = false;
            c.probes = Default::default();
            let restart = match policy {
                "Never" => false,
                "OnFailure" => failed,
                _ => !c.init || failed,
            };
            c.restart_pending = restart;
            if restart {
                if ran >= BACKOFF_RESET_AFTER {
                    c.backoff = BACKOFF_START;
                }
                c.next_start = Instant::now() + c.backoff;
                c.waiting = Some((
                    "CrashLoopBackOff".into(),
                    format!(
                        "back-off {}s restarting failed container",
                        c.backoff.as_secs()
                    ),
                ));
                c.backoff = (c.backoff * 2).min(BACKOFF_MAX);
            }
        }
        let c = &self.ctrs[i];
        let should_start = c.proc.is_none() && (c.terminated.is_none() || c.restart_pending);
        if !should_start || Instant::now() < c.next_start {
            return;
        }
        let spec = c.spec.clone();
        match self.launch_for(&spec) {
            Err((reason, msg)) => {
                let c = &mut self.ctrs[i];
                c.waiting = Some((reason, msg));
                c.next_start = Instant::now() + IMAGE_RETRY.min(c.backoff.max(BACKOFF_START) * 5);
            }
            Ok(launch) => match container::start(&launch) {
                Err(e) => {
                    let c = &mut self.ctrs[i];
                    c.waiting = Some(("RunContainerError".into(), e.to_string()));
                    c.next_start = Instant::now() + c.backoff;
                }
                Ok(proc) => {
                    let c = &mut self.ctrs[i];
                    if c.terminated.is_some() {
                        c.last = c.terminated.take();
                        c.restart_count += 1;
                    }
                    tracing::info!(container = %launch.name, pid = proc.pid, "container started");
                    c.proc = Some(proc);
                    c.restart_pending = false;
                    c.running_since = Some(now());
                    c.started_instant = Some(Instant::now());
                    c.waiting = None;
                    c.started = c.spec.startup_probe.is_none();
                    c.ready = c.started && c.spec.readiness_probe.is_none();
                }
            },
        }
    }

    async fn run_probes(&mut self) {
        let Some(ip) = self.ip else { return };
        for i in 0..self.ctrs.len() {
            if self.ctrs[i].proc.is_none() || self.ctrs[i].init {
                continue;
            }
            let spec = self.ctrs[i].spec.clone();
            let since = self.ctrs[i].started_instant.unwrap_or_else(Instant::now);
            // 0: startup, 1: readiness, 2: liveness. Liveness and readiness wait for startup.
            for (k, probe) in [
                (0, &spec.startup_probe),
                (1, &spec.readiness_probe),
                (2, &spec.liveness_probe),
            ] {
                let Some(p) = probe else { continue };
                let c = &self.ctrs[i];
                if (k == 0 && c.started) || (k != 0 && !c.started) {
                    continue;
                }
                let state = &c.probes[k];
                let first =
                    since + Duration::from_secs(p.initial_delay_seconds.unwrap_or(0).max(0) as u64);
                if Instant::now() < state.next.unwrap_or(first) {
                    continue;
                }
                let result = self.probe_once(p, ip, &spec).await;
                let c = &mut self.ctrs[i];
                let st = &mut c.probes[k];
                st.next = Some(
                    Instant::now()
                        + Duration::from_secs(p.period_seconds.unwrap_or(10).max(1) as u64),
                );
                match result {
                    ProbeResult::Success => {
                        st.successes += 1;
                        st.failures = 0;
                    }
                    ProbeResult::Failure => {
                        st.failures += 1;
                        st.successes = 0;
                    }
                }
                let (succ, fail) = (st.successes, st.failures);
                let success_threshold = p.success_threshold.unwrap_or(1).max(1);
                let failure_threshold = p.failure_threshold.unwrap_or(3).max(1);
                match k {
                    0 if succ >= 1 => {
                        c.started = true;
                        c.ready = spec.readiness_probe.is_none();
                    }
                    1 if succ >= success_threshold => c.ready = true,
                    1 if fail >= failure_threshold => c.ready = false,
                    0 | 2 if fail >= failure_threshold => {
                        tracing::info!(pod = %self.pod.name_any(), container = %spec.name, "probe failed; restarting container");
                        self.kill_container(i, 0).await;
                    }
                    _ => {}
                }
            }
        }
    }

    async fn probe_once(&self, p: &Probe, ip: Ipv4Addr, spec: &Container) -> ProbeResult {
        let netns = self.slot.map(|s| self.sh.net.netns(s)).unwrap_or_default();
        let image = spec.image.clone().unwrap_or_default();
        let dirs = self.sh.images.clone();
        container::probe(p, IpAddr::V4(ip), spec, |command| {
            let e = images::resolve(&image, command, &[], &dirs, is_executable).ok()?;
            Some((e.program, e.args, netns))
        })
        .await
    }

    /// Stops container `i` (its process group) within `grace` seconds; the next tick records
    /// the exit and applies the restart policy.
    async fn kill_container(&mut self, i: usize, grace: u64) {
        if let Some(mut p) = self.ctrs[i].proc.take() {
            let status = tokio::task::spawn_blocking(move || {
                let s = p.stop_and_wait(Duration::from_secs(grace));
                (p, s)
            })
            .await;
            if let Ok((p, _)) = status {
                // Put it back so the next tick sees the exit through try_wait.
                self.ctrs[i].proc = Some(p);
            }
        }
    }

    async fn terminate(&mut self, delete_from_api: bool) {
        let grace = self
            .pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| self.pod.spec.as_ref()?.termination_grace_period_seconds)
            .unwrap_or(30)
            .max(0) as u64;
        let grace = if delete_from_api { grace } else { 0 };
        tracing::info!(pod = %self.key(), grace_s = grace, "stopping pod");
        let procs: Vec<Spawned> = self.ctrs.iter_mut().filter_map(|c| c.proc.take()).collect();
        let _ = tokio::task::spawn_blocking(move || {
            std::thread::scope(|s| {
                for mut p in procs {
                    s.spawn(move || p.stop(Duration::from_secs(grace)));
                }
            });
        })
        .await;
        if let Some(slot) = self.slot.take() {
            self.sh.net.remove_pod(slot);
            self.sh
                .slots
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .release(slot);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        if delete_from_api {
            let api: Api<Pod> = Api::namespaced(self.sh.client.clone(), &self.ns());
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: self.pod.uid(),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match api.delete(&self.pod.name_any(), &dp).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => {
                    tracing::warn!(pod = %self.key(), error = %e, "failed to remove pod from the API")
                }
            }
        }
        tracing::info!(pod = %self.key(), "pod stopped and cleaned up");
    }

    async fn report(&mut self) {
        let views: Vec<ContainerView> = self.ctrs.iter().map(Ctr::view).collect();
        let ip = self.ip.map(|i| i.to_string());
        let status = status::pod_status(
            &views,
            &self.restart_policy(),
            ip.as_deref(),
            "127.0.0.1",
            &self.start_time,
            &now(),
            self.last_status.as_ref().or(self.pod.status.as_ref()),
        );
        if self.last_status.as_ref() == Some(&status) {
            return;
        }
        let api: Api<Pod> = Api::namespaced(self.sh.client.clone(), &self.ns());
        let patch = serde_json::json!({"status": status});
        match api
            .patch_status(
                &self.pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => self.last_status = Some(status),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                tracing::warn!(pod = %self.key(), error = %e, "status update failed; retrying")
            }
        }
    }
}

fn termination(status: std::process::ExitStatus, started_at: Time) -> Termination {
    use std::os::unix::process::ExitStatusExt;
    let signal = status.signal();
    let exit_code = status.code().unwrap_or_else(|| 128 + signal.unwrap_or(0));
    Termination {
        exit_code,
        signal,
        reason: if exit_code == 0 { "Completed" } else { "Error" }.into(),
        message: None,
        started_at,
        finished_at: now(),
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Expands `$(VAR)` references to earlier variables, as Kubernetes does for env values,
/// command and args; `$$(` stays a literal `$(`, unknown references stay as written.
pub fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix("$(") {
            out.push_str("$(");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix('(') {
            match tail.find(')') {
                Some(end) => {
                    let name = &tail[..end];
                    match env.iter().rev().find(|(k, _)| k == name) {
                        Some((_, v)) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &tail[end + 1..];
                }
                None => {
                    out.push('$');
                    rest = after;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::expand;

    #[test]
    fn variable_references_expand_like_kubernetes() {
        let env = vec![
            ("POD_IP".to_owned(), "10.245.0.2".to_owned()),
            ("N".to_owned(), "3".to_owned()),
        ];
        assert_eq!(
            expand("--advertise-address=$(POD_IP)", &env),
            "--advertise-address=10.245.0.2"
        );
        assert_eq!(expand("$(N)$(N)", &env), "33");
        assert_eq!(expand("$$(POD_IP)", &env), "$(POD_IP)");
        assert_eq!(expand("$(MISSING) $ $(", &env), "$(MISSING) $ $(");
    }
}
