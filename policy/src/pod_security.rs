//! Pod Security Standards (pure): which fields of a pod break a level.
//!
//! The syncer checks every tenant pod against its plan's level before the pod reaches the
//! host; the host's Pod Security admission checks it again on every host namespace. A pod with
//! violations stays in the tenant, Pending, with a Warning event and a condition that name
//! each field and rule.
//!
//! Which standard: the published Pod Security Standards as the Pod Security admission
//! controller of Kubernetes 1.37 enforces them at policy version `latest` (v1.37). The controls
//! and their names are those of the standard's page (kubernetes.io, "Pod Security Standards");
//! the allowed values are those of the admission controller's checks where the page lags
//! behind them: the restricted `image` volume type (allowed since 1.33) and the two sysctls
//! added in 1.37 (`net.ipv4.tcp_slow_start_after_idle`, `net.ipv4.tcp_notsent_lowat`). When
//! the host moves to a newer Kubernetes, the lists below are what to compare.
//!
//! Data flow: [`check`] builds one `View` of the pod (its pod-level security context, and
//! every container of the three kinds, `containers`, `initContainers` and
//! `ephemeralContainers`, with the path the tenant wrote it at), then runs each control of the
//! level over it. A control is a small function named after the standard's control; it pushes
//! one [`Refusal`] per offending field, under the rule `baseline: <control>` or
//! `restricted: <control>`, with a message that says what is wrong and what is allowed.
//!
//! Levels nest: `restricted` runs every `baseline` control, then its own. Upstream *replaces*
//! four baseline checks at restricted (hostPath volumes by volume types; seccomp;
//! capabilities; /proc mount type); here each restricted control reports only what its
//! baseline counterpart let through. So a field is refused once, under the first level that
//! forbids it, and every baseline refusal is also a restricted refusal (proved by proptest
//! below, with a generator that knows which level each field it inserts breaks).
//!
//! Pod level and container level, as the standard has it: an explicit bad value is refused
//! wherever it is written, and a pod-level value never excuses a container's own. For
//! `runAsNonRoot` and the restricted seccomp profile, which must be *set*, a container's own
//! setting stands in for an unset (or, for seccomp, a refused) pod-level one, and a pod-level
//! setting covers the containers that leave it unset.
//!
//! Two relaxations of the standard are implemented as published. A pod in its own user
//! namespace (`hostUsers: false`) skips "running as non-root" and "running as non-root user",
//! and may unmask /proc at baseline (never at restricted): its root is not the node's. A
//! Windows pod (`spec.os.name: windows`) skips the Linux-only restricted controls privilege
//! escalation, seccomp and capabilities, whose fields the API forbids on Windows pods; the
//! kubelet refuses a pod whose OS is not its node's, so the claim cannot dodge them on Linux.
//!
//! Fail closed where the types cannot see: a volume with no source these API types know (one
//! newer than k8s-openapi, dropped when the pod was read) is refused at restricted, as upstream
//! refuses every source outside its list, rather than passed on as the emptyDir the API would
//! make of it. Stricter than upstream, on purpose: a volume that (invalidly) names an allowed
//! and a forbidden source is refused for the forbidden one, where upstream stops at the
//! allowed one.

use super::Refusal;
use k8s_openapi::api::core::v1::{
    ContainerPort, HTTPGetAction, Lifecycle, Pod, PodSecurityContext, PodSpec, Probe,
    SecurityContext, TCPSocketAction, Volume,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A Pod Security Standards level. Ordered from the most to the least permissive.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Unrestricted: an explicit admin choice.
    Privileged,
    /// Prevents known privilege escalations (the default).
    #[default]
    Baseline,
    /// Hardened: baseline plus current pod-hardening practice.
    Restricted,
}

impl Level {
    /// The level as Pod Security admission labels spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Rule names: the level, then the control as the standard names it, lowercase.
mod rule {
    pub const HOST_PROCESS: &str = "baseline: hostprocess";
    pub const HOST_NAMESPACES: &str = "baseline: host namespaces";
    pub const PRIVILEGED_CONTAINERS: &str = "baseline: privileged containers";
    pub const CAPABILITIES: &str = "baseline: capabilities";
    pub const HOSTPATH_VOLUMES: &str = "baseline: hostpath volumes";
    pub const HOST_PORTS: &str = "baseline: host ports";
    pub const HOST_PROBES: &str = "baseline: host probes / lifecycle hooks";
    pub const APPARMOR: &str = "baseline: apparmor";
    pub const SELINUX: &str = "baseline: selinux";
    pub const PROC_MOUNT: &str = "baseline: /proc mount type";
    pub const SECCOMP: &str = "baseline: seccomp";
    pub const SYSCTLS: &str = "baseline: sysctls";

    pub const VOLUME_TYPES: &str = "restricted: volume types";
    pub const PRIVILEGE_ESCALATION: &str = "restricted: privilege escalation";
    pub const NON_ROOT: &str = "restricted: running as non-root";
    pub const NON_ROOT_USER: &str = "restricted: running as non-root user";
    pub const RESTRICTED_SECCOMP: &str = "restricted: seccomp";
    pub const RESTRICTED_CAPABILITIES: &str = "restricted: capabilities";
    pub const RESTRICTED_PROC_MOUNT: &str = "restricted: /proc mount type";
}

/// Capabilities a container may add at baseline: the container runtimes' default set, which
/// a container holds anyway unless it drops them (`NET_RAW` left out). Matched exactly, as
/// upstream does: `CAP_CHOWN` is not `CHOWN`.
const BASELINE_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The one capability a container may add at restricted.
const RESTRICTED_CAPABILITY: &str = "NET_BIND_SERVICE";

/// Sysctls a pod may set at baseline: namespaced, and isolated from other pods on the node.
/// 1.0: the first five; 1.27: `ip_local_reserved_ports`; 1.29: the keepalive and FIN
/// timeouts; 1.32: `tcp_rmem`, `tcp_wmem`; 1.37: `tcp_slow_start_after_idle`,
/// `tcp_notsent_lowat`.
const SAFE_SYSCTLS: [&str; 14] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
    "net.ipv4.tcp_slow_start_after_idle",
    "net.ipv4.tcp_notsent_lowat",
];

/// SELinux types a pod or container may ask for (empty: the runtime's choice);
/// `container_engine_t` since 1.31.
const SELINUX_TYPES: [&str; 5] = [
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// Volume sources a pod may use at restricted, by API field name: the core types, and
/// storage a PersistentVolume (hence the host's admin) defines. `image` since 1.33.
const RESTRICTED_VOLUMES: [&str; 9] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// The legacy per-container AppArmor annotation (before the `appArmorProfile` field); the
/// admission controller still reads it, so this check does too.
const APPARMOR_ANNOTATION: &str = "container.apparmor.security.beta.kubernetes.io/";

/// One control: looks at the pod, pushes a refusal per offending field.
type Control = fn(&View<'_>, &mut Vec<Refusal>);

/// The baseline controls, in the standard's order.
const BASELINE: [Control; 12] = [
    host_process,
    host_namespaces,
    privileged_containers,
    capabilities,
    hostpath_volumes,
    host_ports,
    host_probes,
    apparmor,
    selinux,
    proc_mount,
    seccomp,
    sysctls,
];

/// What restricted adds to baseline, in the standard's order.
const RESTRICTED: [Control; 7] = [
    volume_types,
    privilege_escalation,
    running_as_non_root,
    running_as_non_root_user,
    restricted_seccomp,
    restricted_capabilities,
    restricted_proc_mount,
];

/// Every field of `pod` that `level` does not allow (empty: admitted).
pub fn check(pod: &Pod, level: Level) -> Vec<Refusal> {
    let mut out = Vec::new();
    let on_top: &[Control] = match level {
        Level::Privileged => return out,
        Level::Baseline => &[],
        Level::Restricted => &RESTRICTED,
    };
    let no_spec = PodSpec::default();
    let view = View::of(pod, pod.spec.as_ref().unwrap_or(&no_spec));
    for control in BASELINE.iter().chain(on_top) {
        control(&view, &mut out);
    }
    out
}

/// A pod as the controls read it.
struct View<'a> {
    annotations: Option<&'a BTreeMap<String, String>>,
    spec: &'a PodSpec,
    pod_sc: Option<&'a PodSecurityContext>,
    /// Containers, then init containers, then ephemeral containers.
    containers: Vec<Container<'a>>,
}

/// A container of any of the three kinds, with the fields the controls read.
struct Container<'a> {
    /// Where the tenant wrote it: `spec.initContainers[1]`.
    path: String,
    sc: Option<&'a SecurityContext>,
    ports: &'a [ContainerPort],
    probes: [(&'static str, Option<&'a Probe>); 3],
    lifecycle: Option<&'a Lifecycle>,
}

/// `Container` and `EphemeralContainer` are distinct types with the same fields.
macro_rules! container_view {
    ($path:expr, $c:expr) => {
        Container {
            path: $path,
            sc: $c.security_context.as_ref(),
            ports: $c.ports.as_deref().unwrap_or_default(),
            probes: [
                ("livenessProbe", $c.liveness_probe.as_ref()),
                ("readinessProbe", $c.readiness_probe.as_ref()),
                ("startupProbe", $c.startup_probe.as_ref()),
            ],
            lifecycle: $c.lifecycle.as_ref(),
        }
    };
}

impl<'a> View<'a> {
    fn of(pod: &'a Pod, spec: &'a PodSpec) -> Self {
        let mut containers = Vec::new();
        for (i, c) in spec.containers.iter().enumerate() {
            containers.push(container_view!(format!("spec.containers[{i}]"), c));
        }
        for (i, c) in spec.init_containers.iter().flatten().enumerate() {
            containers.push(container_view!(format!("spec.initContainers[{i}]"), c));
        }
        for (i, c) in spec.ephemeral_containers.iter().flatten().enumerate() {
            containers.push(container_view!(format!("spec.ephemeralContainers[{i}]"), c));
        }
        View {
            annotations: pod.metadata.annotations.as_ref(),
            spec,
            pod_sc: spec.security_context.as_ref(),
            containers,
        }
    }

    /// One field of the pod's security context and of every container's, where set: the path
    /// of each security context that sets it, and the value. Pod level first.
    fn settings<T>(
        &self,
        at_pod: impl Fn(&'a PodSecurityContext) -> Option<T>,
        at_container: impl Fn(&'a SecurityContext) -> Option<T>,
    ) -> Vec<(String, T)> {
        let mut out = Vec::new();
        if let Some(v) = self.pod_sc.and_then(at_pod) {
            out.push(("spec.securityContext".to_owned(), v));
        }
        for c in &self.containers {
            if let Some(v) = c.sc.and_then(&at_container) {
                out.push((c.field("securityContext"), v));
            }
        }
        out
    }

    fn volumes(&self) -> impl Iterator<Item = (usize, &'a Volume)> + use<'a> {
        self.spec.volumes.iter().flatten().enumerate()
    }

    /// `hostUsers: false`: the pod runs in its own user namespace.
    fn user_namespace(&self) -> bool {
        self.spec.host_users == Some(false)
    }

    /// `spec.os.name: windows`.
    fn windows(&self) -> bool {
        self.spec.os.as_ref().is_some_and(|os| os.name == "windows")
    }
}

impl Container<'_> {
    fn field(&self, rest: &str) -> String {
        format!("{}.{rest}", self.path)
    }

    fn capabilities_added(&self) -> impl Iterator<Item = &str> {
        let caps = self.sc.and_then(|s| s.capabilities.as_ref());
        caps.and_then(|c| c.add.as_deref())
            .unwrap_or_default()
            .iter()
            .map(String::as_str)
    }

    /// The `procMount` this container asks for, if it is not the default.
    fn unmasked_proc(&self) -> Option<&str> {
        let mount = self.sc?.proc_mount.as_deref()?;
        (mount != "Default").then_some(mount)
    }
}

/// "capability X is" / "capabilities X, Y are", for a message.
fn capability_list(caps: &[&str]) -> String {
    match caps {
        [one] => format!("capability {one} is"),
        many => format!("capabilities {} are", many.join(", ")),
    }
}

// ---- baseline ----------------------------------------------------------------------------

/// HostProcess: Windows containers with the node's privileges.
fn host_process(pod: &View<'_>, out: &mut Vec<Refusal>) {
    let set = pod.settings(
        |s| s.windows_options.as_ref()?.host_process,
        |s| s.windows_options.as_ref()?.host_process,
    );
    for (sc, host_process) in set {
        if host_process {
            out.push(Refusal::new(
                format!("{sc}.windowsOptions.hostProcess"),
                rule::HOST_PROCESS,
                "Windows HostProcess containers are not allowed (only unset or false)",
            ));
        }
    }
}

/// Host namespaces: sharing the node's network, PID or IPC namespace.
fn host_namespaces(pod: &View<'_>, out: &mut Vec<Refusal>) {
    let s = pod.spec;
    let shared = [
        ("spec.hostNetwork", s.host_network, "network"),
        ("spec.hostPID", s.host_pid, "process ID"),
        ("spec.hostIPC", s.host_ipc, "IPC"),
    ];
    for (field, set, namespace) in shared {
        if set == Some(true) {
            out.push(Refusal::new(
                field,
                rule::HOST_NAMESPACES,
                format!(
                    "sharing the host's {namespace} namespace is not allowed (only unset or false)"
                ),
            ));
        }
    }
}

/// Privileged containers.
fn privileged_containers(pod: &View<'_>, out: &mut Vec<Refusal>) {
    for c in &pod.containers {
        if c.sc.and_then(|s| s.privileged) == Some(true) {
            out.push(Refusal::new(
                c.field("securityContext.privileged"),
                rule::PRIVILEGED_CONTAINERS,
                "privileged containers are not allowed (only unset or false)",
            ));
        }
    }
}

/// Capabilities: adding any beyond the runtimes' default set.
fn capabilities(pod: &View<'_>, out: &mut Vec<Refusal>) {
    for c in &pod.containers {
        let bad: Vec<&str> = c
            .capabilities_added()
            .filter(|cap| !BASELINE_CAPABILITIES.contains(cap))
            .collect();
        if !bad.is_empty() {
            out.push(Refusal::new(
                c.field("securityContext.capabilities.add"),
                rule::CAPABILITIES,
                format!(
                    "{} not allowed (baseline allows {})",
                    capability_list(&bad),
                    BASELINE_CAPABILITIES.join(", ")
                ),
            ));
        }
    }
}

/// HostPath volumes.
fn hostpath_volumes(pod: &View<'_>, out: &mut Vec<Refusal>) {
    for (i, v) in pod.volumes() {
        if v.host_path.is_some() {
            out.push(Refusal::new(
                format!("spec.volumes[{i}].hostPath"),
                rule::HOSTPATH_VOLUMES,
                "hostPath volumes mount the node's own files and are not allowed",
            ));
        }
    }
}

/// Host ports.
fn host_ports(pod: &View<'_>, out: &mut Vec<Refusal>) {
    for c in &pod.containers {
        for (j, p) in c.ports.iter().enumerate() {
            if let Some(port) = p.host_port.filter(|p| *p != 0) {
                out.push(Refusal::new(
                    c.field(&format!("ports[{j}].hostPort")),
                    rule::HOST_PORTS,
                    format!("host port {port} is not allowed (only unset or 0)"),
                ));
            }
        }
    }
}

/// Host probes / lifecycle hooks: a `host` makes the kubelet connect to an address of its
/// choosing from the node, not to the pod.
fn host_probes(pod: &View<'_>, out: &mut Vec<Refusal>) {
    fn hosts<'h>(
        http: Option<&'h HTTPGetAction>,
        tcp: Option<&'h TCPSocketAction>,
    ) -> [(&'static str, Option<&'h str>); 2] {
        [
            ("httpGet", http.and_then(|h| h.host.as_deref())),
            ("tcpSocket", tcp.and_then(|t| t.host.as_deref())),
        ]
    }
    for c in &pod.containers {
        let mut handlers: Vec<(&str, &str, Option<&str>)> = Vec::new();
        for (name, probe) in c.probes {
            if let Some(p) = probe {
                let at = hosts(p.http_get.as_ref(), p.tcp_socket.as_ref());
                handlers.extend(at.map(|(action, host)| (name, action, host)));
            }
        }
        if let Some(l) = c.lifecycle {
            let hooks = [
                ("lifecycle.postStart", l.post_start.as_ref()),
                ("lifecycle.preStop", l.pre_stop.as_ref()),
            ];
            for (name, hook) in hooks {
                if let Some(h) = hook {
                    let at = hosts(h.http_get.as_ref(), h.tcp_socket.as_ref());
                    handlers.extend(at.map(|(action, host)| (name, action, host)));
                }
            }
        }
        for (name, action, host) in handlers {
            if let Some(host) = host.filter(|h| !h.is_empty()) {
                out.push(Refusal::new(
                    c.field(&format!("{name}.{action}.host")),
                    rule::HOST_PROBES,
                    format!(
                        "probe or lifecycle hook host {host} is not allowed (only unset or empty: the pod's own IP)"
                    ),
                ));
            }
        }
    }
}

/// AppArmor: the profile field at pod and container level, and the legacy annotations.
fn apparmor(pod: &View<'_>, out: &mut Vec<Refusal>) {
    let set = pod.settings(
        |s| s.app_armor_profile.as_ref().map(|p| p.type_.as_str()),
        |s| s.app_armor_profile.as_ref().map(|p| p.type_.as_str()),
    );
    for (sc, profile) in set {
        if !matches!(profile, "RuntimeDefault" | "Localhost") {
            out.push(Refusal::new(
                format!("{sc}.appArmorProfile.type"),
                rule::APPARMOR,
                format!("AppArmor profile {profile} is not allowed (RuntimeDefault or Localhost)"),
            ));
        }
    }
    for (key, profile) in pod.annotations.into_iter().flatten() {
        let allowed =
            profile.is_empty() || profile == "runtime/default" || profile.starts_with("localhost/");
        if key.starts_with(APPARMOR_ANNOTATION) && !allowed {
            out.push(Refusal::new(
                format!("metadata.annotations[{key}]"),
                rule::APPARMOR,
                format!(
                    "AppArmor profile {profile:?} is not allowed (runtime/default, localhost/<profile> or empty)"
                ),
            ));
        }
    }
}

/// SELinux: the type limited to the container types; no custom user or role.
fn selinux(pod: &View<'_>, out: &mut Vec<Refusal>) {
    let set = pod.settings(
        |s| s.se_linux_options.as_ref(),
        |s| s.se_linux_options.as_ref(),
    );
    for (sc, options) in set {
        let kind = options.type_.as_deref().unwrap_or_default();
        if !SELINUX_TYPES.contains(&kind) {
            out.push(Refusal::new(
                format!("{sc}.seLinuxOptions.type"),
                rule::SELINUX,
                format!(
                    "SELinux type {kind} is not allowed ({} or unset)",
                    SELINUX_TYPES[1..].join(", ")
                ),
            ));
        }
        for (name, value) in [("user", &options.user), ("role", &options.role)] {
            if value.as_deref().is_some_and(|v| !v.is_empty()) {
                out.push(Refusal::new(
                    format!("{sc}.seLinuxOptions.{name}"),
                    rule::SELINUX,
                    format!("a custom SELinux {name} is not allowed (only unset)"),
                ));
            }
        }
    }
}

/// /proc mount type: the default masks, except in a pod's own user namespace (1.35+).
fn proc_mount(pod: &View<'_>, out: &mut Vec<Refusal>) {
    if pod.user_namespace() {
        return;
    }
    for c in &pod.containers {
        if let Some(mount) = c.unmasked_proc() {
            out.push(Refusal::new(
                c.field("securityContext.procMount"),
                rule::PROC_MOUNT,
                format!(
                    "procMount {mount} is not allowed (only Default or unset, unless hostUsers is false)"
                ),
            ));
        }
    }
}

/// Seccomp: never explicitly Unconfined.
fn seccomp(pod: &View<'_>, out: &mut Vec<Refusal>) {
    let set = pod.settings(
        |s| s.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
        |s| s.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
    );
    for (sc, profile) in set {
        if profile == "Unconfined" {
            out.push(Refusal::new(
                format!("{sc}.seccompProfile.type"),
                rule::SECCOMP,
                "seccomp profile Unconfined is not allowed (RuntimeDefault, Localhost or unset)",
            ));
        }
    }
}

/// Sysctls: only the safe set.
fn sysctls(pod: &View<'_>, out: &mut Vec<Refusal>) {
    let set = pod.pod_sc.and_then(|s| s.sysctls.as_deref());
    for (i, sysctl) in set.unwrap_or_default().iter().enumerate() {
        if !SAFE_SYSCTLS.contains(&sysctl.name.as_str()) {
            out.push(Refusal::new(
                format!("spec.securityContext.sysctls[{i}]"),
                rule::SYSCTLS,
                format!(
                    "sysctl {} is not allowed (baseline allows only the safe set: {})",
                    sysctl.name,
                    SAFE_SYSCTLS.join(", ")
                ),
            ));
        }
    }
}

// ---- restricted --------------------------------------------------------------------------

/// Every source a pod volume may name, by API field name, and whether `v` names it.
fn volume_sources(v: &Volume) -> [(&'static str, bool); 30] {
    [
        ("awsElasticBlockStore", v.aws_elastic_block_store.is_some()),
        ("azureDisk", v.azure_disk.is_some()),
        ("azureFile", v.azure_file.is_some()),
        ("cephfs", v.cephfs.is_some()),
        ("cinder", v.cinder.is_some()),
        ("configMap", v.config_map.is_some()),
        ("csi", v.csi.is_some()),
        ("downwardAPI", v.downward_api.is_some()),
        ("emptyDir", v.empty_dir.is_some()),
        ("ephemeral", v.ephemeral.is_some()),
        ("fc", v.fc.is_some()),
        ("flexVolume", v.flex_volume.is_some()),
        ("flocker", v.flocker.is_some()),
        ("gcePersistentDisk", v.gce_persistent_disk.is_some()),
        ("gitRepo", v.git_repo.is_some()),
        ("glusterfs", v.glusterfs.is_some()),
        ("hostPath", v.host_path.is_some()),
        ("image", v.image.is_some()),
        ("iscsi", v.iscsi.is_some()),
        ("nfs", v.nfs.is_some()),
        ("persistentVolumeClaim", v.persistent_volume_claim.is_some()),
        ("photonPersistentDisk", v.photon_persistent_disk.is_some()),
        ("portworxVolume", v.portworx_volume.is_some()),
        ("projected", v.projected.is_some()),
        ("quobyte", v.quobyte.is_some()),
        ("rbd", v.rbd.is_some()),
        ("scaleIO", v.scale_io.is_some()),
        ("secret", v.secret.is_some()),
        ("storageos", v.storageos.is_some()),
        ("vsphereVolume", v.vsphere_volume.is_some()),
    ]
}

/// Volume types: only the allowed sources (hostPath is baseline's to refuse).
fn volume_types(pod: &View<'_>, out: &mut Vec<Refusal>) {
    for (i, v) in pod.volumes() {
        let named: Vec<&str> = volume_sources(v)
            .into_iter()
            .filter_map(|(name, set)| set.then_some(name))
            .collect();
        if named.is_empty() {
            out.push(Refusal::new(
                format!("spec.volumes[{i}]"),
                rule::VOLUME_TYPES,
                format!(
                    "volume {} has no source this check knows (restricted allows {})",
                    v.name,
                    RESTRICTED_VOLUMES.join(", ")
                ),
            ));
        }
        for source in named {
            if source != "hostPath" && !RESTRICTED_VOLUMES.contains(&source) {
                out.push(Refusal::new(
                    format!("spec.volumes[{i}].{source}"),
                    rule::VOLUME_TYPES,
                    format!(
                        "volume type {source} is not allowed (restricted allows {})",
                        RESTRICTED_VOLUMES.join(", ")
                    ),
                ));
            }
        }
    }
}

/// Privilege escalation: `allowPrivilegeEscalation: false` on every container (Linux only).
fn privilege_escalation(pod: &View<'_>, out: &mut Vec<Refusal>) {
    if pod.windows() {
        return;
    }
    for c in &pod.containers {
        let message = match c.sc.and_then(|s| s.allow_privilege_escalation) {
            Some(false) => continue,
            Some(true) => "allowPrivilegeEscalation true is not allowed (must be false)",
            None => "allowPrivilegeEscalation must be set to false (unset allows escalation)",
        };
        out.push(Refusal::new(
            c.field("securityContext.allowPrivilegeEscalation"),
            rule::PRIVILEGE_ESCALATION,
            message,
        ));
    }
}

/// Running as non-root: `runAsNonRoot: true` at pod level or on every container, and never
/// false anywhere. Skipped in a pod's own user namespace.
fn running_as_non_root(pod: &View<'_>, out: &mut Vec<Refusal>) {
    const FALSE: &str = "runAsNonRoot false is not allowed (must be true)";
    if pod.user_namespace() {
        return;
    }
    let at_pod = pod.pod_sc.and_then(|s| s.run_as_non_root);
    if at_pod == Some(false) {
        out.push(Refusal::new(
            "spec.securityContext.runAsNonRoot",
            rule::NON_ROOT,
            FALSE,
        ));
    }
    for c in &pod.containers {
        let message = match (c.sc.and_then(|s| s.run_as_non_root), at_pod) {
            (Some(true), _) | (None, Some(true)) => continue,
            (Some(false), _) => FALSE,
            (None, _) => "runAsNonRoot must be true, here or in spec.securityContext",
        };
        out.push(Refusal::new(
            c.field("securityContext.runAsNonRoot"),
            rule::NON_ROOT,
            message,
        ));
    }
}

/// Running as non-root user: `runAsUser` never 0. Skipped in a pod's own user namespace.
fn running_as_non_root_user(pod: &View<'_>, out: &mut Vec<Refusal>) {
    if pod.user_namespace() {
        return;
    }
    for (sc, uid) in pod.settings(|s| s.run_as_user, |s| s.run_as_user) {
        if uid == 0 {
            out.push(Refusal::new(
                format!("{sc}.runAsUser"),
                rule::NON_ROOT_USER,
                "runAsUser 0 (root) is not allowed (any other UID, or unset)",
            ));
        }
    }
}

/// Seccomp at restricted: RuntimeDefault or Localhost, at pod level or on every container
/// (Linux only). Explicit Unconfined is baseline's to refuse.
fn restricted_seccomp(pod: &View<'_>, out: &mut Vec<Refusal>) {
    fn allowed(profile: &str) -> bool {
        matches!(profile, "RuntimeDefault" | "Localhost")
    }
    fn refused_here(profile: &str) -> bool {
        !allowed(profile) && profile != "Unconfined"
    }
    if pod.windows() {
        return;
    }
    let at_pod = pod
        .pod_sc
        .and_then(|s| s.seccomp_profile.as_ref())
        .map(|p| p.type_.as_str());
    if let Some(profile) = at_pod.filter(|p| refused_here(p)) {
        out.push(Refusal::new(
            "spec.securityContext.seccompProfile.type",
            rule::RESTRICTED_SECCOMP,
            format!("seccomp profile {profile} is not allowed (RuntimeDefault or Localhost)"),
        ));
    }
    let covered = at_pod.is_some_and(allowed);
    for c in &pod.containers {
        let own =
            c.sc.and_then(|s| s.seccomp_profile.as_ref())
                .map(|p| p.type_.as_str());
        match own {
            Some(profile) if refused_here(profile) => out.push(Refusal::new(
                c.field("securityContext.seccompProfile.type"),
                rule::RESTRICTED_SECCOMP,
                format!("seccomp profile {profile} is not allowed (RuntimeDefault or Localhost)"),
            )),
            None if !covered => out.push(Refusal::new(
                c.field("securityContext.seccompProfile"),
                rule::RESTRICTED_SECCOMP,
                "a seccomp profile must be set, here or in spec.securityContext (RuntimeDefault or Localhost)",
            )),
            _ => {}
        }
    }
}

/// Capabilities at restricted: drop ALL, add at most NET_BIND_SERVICE (Linux only). Adds
/// outside the baseline set are baseline's to refuse.
fn restricted_capabilities(pod: &View<'_>, out: &mut Vec<Refusal>) {
    if pod.windows() {
        return;
    }
    for c in &pod.containers {
        let caps = c.sc.and_then(|s| s.capabilities.as_ref());
        let dropped = caps.and_then(|c| c.drop.as_deref()).unwrap_or_default();
        if !dropped.iter().any(|d| d == "ALL") {
            out.push(Refusal::new(
                c.field("securityContext.capabilities.drop"),
                rule::RESTRICTED_CAPABILITIES,
                "capabilities.drop must include ALL",
            ));
        }
        let bad: Vec<&str> = c
            .capabilities_added()
            .filter(|cap| *cap != RESTRICTED_CAPABILITY && BASELINE_CAPABILITIES.contains(cap))
            .collect();
        if !bad.is_empty() {
            out.push(Refusal::new(
                c.field("securityContext.capabilities.add"),
                rule::RESTRICTED_CAPABILITIES,
                format!(
                    "{} not allowed (restricted allows only {RESTRICTED_CAPABILITY})",
                    capability_list(&bad)
                ),
            ));
        }
    }
}

/// /proc mount type at restricted: the default masks even in a pod's own user namespace
/// (outside one, baseline has refused the others already).
fn restricted_proc_mount(pod: &View<'_>, out: &mut Vec<Refusal>) {
    if !pod.user_namespace() {
        return;
    }
    for c in &pod.containers {
        if let Some(mount) = c.unmasked_proc() {
            out.push(Refusal::new(
                c.field("securityContext.procMount"),
                rule::RESTRICTED_PROC_MOUNT,
                format!(
                    "procMount {mount} is not allowed, even with hostUsers false (only Default or unset)"
                ),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// `base` with each JSON pointer set to its value, objects created on the way; a last
    /// segment `-` appends to the array there (created if missing).
    fn patched(mut base: Value, sets: &[(&str, Value)]) -> Value {
        for (at, value) in sets {
            set(&mut base, at, value.clone());
        }
        base
    }

    /// Sets the field at JSON pointer `at`; returns the index when appending with `-`.
    fn set(doc: &mut Value, at: &str, value: Value) -> usize {
        let segments: Vec<String> = at
            .split('/')
            .skip(1)
            .map(|s| s.replace("~1", "/").replace("~0", "~"))
            .collect();
        let (last, path) = segments.split_last().expect("a pointer names a field");
        let mut here = doc;
        for segment in path {
            here = match here {
                Value::Array(items) => &mut items[segment.parse::<usize>().unwrap()],
                other => other
                    .as_object_mut()
                    .expect("an object on the way")
                    .entry(segment.as_str())
                    .or_insert_with(|| json!({})),
            };
        }
        if last == "-" {
            if !here.is_array() {
                *here = json!([]);
            }
            let items = here.as_array_mut().unwrap();
            items.push(value);
            items.len() - 1
        } else {
            match here {
                Value::Array(items) => items[last.parse::<usize>().unwrap()] = value,
                other => {
                    other.as_object_mut().unwrap().insert(last.clone(), value);
                }
            }
            0
        }
    }

    fn hardened(name: &str) -> Value {
        json!({"name": name, "image": "registry.example/app:1", "securityContext": {
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}})
    }

    /// A pod that meets restricted, with one container of each kind: most tests break one
    /// field of it.
    fn restricted_pod() -> Value {
        json!({
            "metadata": {"name": "web", "namespace": "apps"},
            "spec": {
                "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [hardened("web")],
                "initContainers": [hardened("setup")],
                "ephemeralContainers": [hardened("debug")],
                "volumes": [{"name": "scratch", "emptyDir": {}}],
            }
        })
    }

    /// The restricted pod with fields set.
    fn with(sets: &[(&str, Value)]) -> Pod {
        pod(patched(restricted_pod(), sets))
    }

    fn pod(v: Value) -> Pod {
        serde_json::from_value(v).expect("a valid pod")
    }

    /// (field, rule) of every refusal.
    fn refused(pod: &Pod, level: Level) -> Vec<(String, String)> {
        check(pod, level)
            .into_iter()
            .map(|r| (r.field, r.rule.to_owned()))
            .collect()
    }

    fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
        expected
            .iter()
            .map(|(f, r)| ((*f).to_owned(), (*r).to_owned()))
            .collect()
    }

    /// Where each kind of container of the restricted pod lives.
    const KINDS: [(&str, &str); 3] = [
        ("/spec/containers/0", "spec.containers[0]"),
        ("/spec/initContainers/0", "spec.initContainers[0]"),
        ("/spec/ephemeralContainers/0", "spec.ephemeralContainers[0]"),
    ];

    /// Asserts that setting `suffix` to `value` on each kind of container is refused at
    /// `levels` with `rule` on the same field (plus `field_suffix` when it differs).
    fn refused_on_every_kind(suffix: &str, value: Value, levels: &[Level], expected: &[&str]) {
        for (pointer, path) in KINDS {
            let p = with(&[(&format!("{pointer}/{suffix}"), value.clone())]);
            let field = format!("{path}.{}", suffix.replace('/', "."));
            for level in levels {
                let want: Vec<(String, String)> = expected
                    .iter()
                    .map(|rule| (field.clone(), (*rule).to_owned()))
                    .collect();
                assert_eq!(refused(&p, *level), want, "{pointer}/{suffix} at {level}");
            }
        }
    }

    #[test]
    fn the_restricted_fixture_meets_every_level() {
        let p = pod(restricted_pod());
        for level in [Level::Privileged, Level::Baseline, Level::Restricted] {
            assert_eq!(check(&p, level), [], "{level}");
        }
    }

    #[test]
    fn privileged_refuses_nothing() {
        let p = with(&[
            ("/spec/hostNetwork", json!(true)),
            ("/spec/containers/0/securityContext/privileged", json!(true)),
            (
                "/spec/volumes/-",
                json!({"name": "root", "hostPath": {"path": "/"}}),
            ),
        ]);
        assert_eq!(check(&p, Level::Privileged), []);
        assert_eq!(check(&p, Level::Baseline).len(), 3);
    }

    #[test]
    fn hostprocess_is_refused_at_pod_and_container_level() {
        let on = json!({"hostProcess": true});
        let p = with(&[("/spec/securityContext/windowsOptions", on.clone())]);
        let want = [(
            "spec.securityContext.windowsOptions.hostProcess",
            rule::HOST_PROCESS,
        )];
        assert_eq!(refused(&p, Level::Baseline), pairs(&want));
        assert_eq!(refused(&p, Level::Restricted), pairs(&want));
        refused_on_every_kind(
            "securityContext/windowsOptions/hostProcess",
            json!(true),
            &[Level::Baseline, Level::Restricted],
            &[rule::HOST_PROCESS],
        );
        let off = with(&[(
            "/spec/containers/0/securityContext/windowsOptions/hostProcess",
            json!(false),
        )]);
        assert_eq!(check(&off, Level::Restricted), []);
    }

    #[test]
    fn host_namespaces_are_refused() {
        for field in ["hostNetwork", "hostPID", "hostIPC"] {
            let p = with(&[(&format!("/spec/{field}"), json!(true))]);
            let want = pairs(&[(&format!("spec.{field}"), rule::HOST_NAMESPACES)]);
            assert_eq!(refused(&p, Level::Baseline), want);
            assert_eq!(refused(&p, Level::Restricted), want);
            let p = with(&[(&format!("/spec/{field}"), json!(false))]);
            assert_eq!(check(&p, Level::Restricted), []);
        }
        let r = check(&with(&[("/spec/hostPID", json!(true))]), Level::Baseline);
        assert_eq!(
            r[0].message,
            "sharing the host's process ID namespace is not allowed (only unset or false)"
        );
    }

    #[test]
    fn privileged_containers_are_refused_on_every_kind() {
        refused_on_every_kind(
            "securityContext/privileged",
            json!(true),
            &[Level::Baseline, Level::Restricted],
            &[rule::PRIVILEGED_CONTAINERS],
        );
        let p = with(&[(
            "/spec/initContainers/0/securityContext/privileged",
            json!(false),
        )]);
        assert_eq!(check(&p, Level::Restricted), []);
    }

    #[test]
    fn baseline_capabilities_allow_only_the_default_set() {
        refused_on_every_kind(
            "securityContext/capabilities/add",
            json!(["SYS_ADMIN"]),
            &[Level::Baseline, Level::Restricted],
            &[rule::CAPABILITIES],
        );
        let p = with(&[(
            "/spec/containers/0/securityContext/capabilities/add",
            json!(["CHOWN", "SYS_ADMIN", "NET_RAW", "NET_BIND_SERVICE"]),
        )]);
        let r = check(&p, Level::Baseline);
        assert_eq!(r.len(), 1);
        assert_eq!(
            r[0].message,
            "capabilities SYS_ADMIN, NET_RAW are not allowed (baseline allows AUDIT_WRITE, CHOWN, \
             DAC_OVERRIDE, FOWNER, FSETID, KILL, MKNOD, NET_BIND_SERVICE, SETFCAP, SETGID, SETPCAP, \
             SETUID, SYS_CHROOT)"
        );
        // The whole default set is fine at baseline, and upstream matches names exactly.
        let all = with(&[(
            "/spec/containers/0/securityContext/capabilities/add",
            json!([
                "AUDIT_WRITE",
                "CHOWN",
                "DAC_OVERRIDE",
                "FOWNER",
                "FSETID",
                "KILL",
                "MKNOD",
                "NET_BIND_SERVICE",
                "SETFCAP",
                "SETGID",
                "SETPCAP",
                "SETUID",
                "SYS_CHROOT"
            ]),
        )]);
        assert_eq!(check(&all, Level::Baseline), []);
        let prefixed = with(&[(
            "/spec/containers/0/securityContext/capabilities/add",
            json!(["CAP_CHOWN"]),
        )]);
        assert_eq!(check(&prefixed, Level::Baseline).len(), 1);
    }

    #[test]
    fn restricted_capabilities_drop_all_and_add_only_net_bind_service() {
        // Adds baseline allows are restricted's to refuse, once, on the same field.
        refused_on_every_kind(
            "securityContext/capabilities/add",
            json!(["CHOWN"]),
            &[Level::Restricted],
            &[rule::RESTRICTED_CAPABILITIES],
        );
        let p = with(&[(
            "/spec/containers/0/securityContext/capabilities/add",
            json!(["SYS_ADMIN", "KILL"]),
        )]);
        let add = "spec.containers[0].securityContext.capabilities.add";
        assert_eq!(
            refused(&p, Level::Restricted),
            pairs(&[
                (add, rule::CAPABILITIES),
                (add, rule::RESTRICTED_CAPABILITIES)
            ])
        );
        assert_eq!(
            check(&p, Level::Restricted)[1].message,
            "capability KILL is not allowed (restricted allows only NET_BIND_SERVICE)"
        );
        let bind = with(&[(
            "/spec/containers/0/securityContext/capabilities/add",
            json!(["NET_BIND_SERVICE"]),
        )]);
        assert_eq!(check(&bind, Level::Restricted), []);

        for drop in [json!(null), json!([]), json!(["NET_RAW"]), json!(["all"])] {
            refused_on_every_kind(
                "securityContext/capabilities/drop",
                drop.clone(),
                &[Level::Restricted],
                &[rule::RESTRICTED_CAPABILITIES],
            );
            let p = with(&[("/spec/containers/0/securityContext/capabilities/drop", drop)]);
            assert_eq!(check(&p, Level::Baseline), []);
        }
        let no_context = with(&[("/spec/containers/0/securityContext", json!(null))]);
        assert!(refused(&no_context, Level::Restricted).contains(&(
            "spec.containers[0].securityContext.capabilities.drop".into(),
            rule::RESTRICTED_CAPABILITIES.into()
        )));
    }

    #[test]
    fn hostpath_volumes_are_refused_once_at_both_levels() {
        let p = with(&[
            (
                "/spec/volumes/-",
                json!({"name": "conf", "configMap": {"name": "c"}}),
            ),
            (
                "/spec/volumes/-",
                json!({"name": "node", "hostPath": {"path": "/var/run"}}),
            ),
        ]);
        let want = pairs(&[("spec.volumes[2].hostPath", rule::HOSTPATH_VOLUMES)]);
        assert_eq!(refused(&p, Level::Baseline), want);
        assert_eq!(refused(&p, Level::Restricted), want);
    }

    #[test]
    fn host_ports_must_be_unset_or_zero_on_every_kind() {
        for (pointer, path) in KINDS {
            let p = with(&[
                (
                    &format!("{pointer}/ports/-"),
                    json!({"containerPort": 80, "hostPort": 0}),
                ),
                (&format!("{pointer}/ports/-"), json!({"containerPort": 81})),
                (
                    &format!("{pointer}/ports/-"),
                    json!({"containerPort": 82, "hostPort": 8080}),
                ),
            ]);
            let want = pairs(&[(&format!("{path}.ports[2].hostPort"), rule::HOST_PORTS)]);
            assert_eq!(refused(&p, Level::Baseline), want);
            assert_eq!(refused(&p, Level::Restricted), want);
        }
        let p = with(&[(
            "/spec/initContainers/0/ports/-",
            json!({"containerPort": 80, "hostPort": 8080}),
        )]);
        assert_eq!(
            check(&p, Level::Baseline)[0].message,
            "host port 8080 is not allowed (only unset or 0)"
        );
    }

    #[test]
    fn probes_and_lifecycle_hooks_may_not_name_a_host() {
        let handlers = [
            ("livenessProbe", "httpGet"),
            ("readinessProbe", "tcpSocket"),
            ("startupProbe", "httpGet"),
            ("lifecycle/postStart", "httpGet"),
            ("lifecycle/preStop", "tcpSocket"),
        ];
        for (handler, action) in handlers {
            refused_on_every_kind(
                &format!("{handler}/{action}/host"),
                json!("169.254.169.254"),
                &[Level::Baseline, Level::Restricted],
                &[rule::HOST_PROBES],
            );
            let empty = with(&[(
                &format!("/spec/containers/0/{handler}/{action}"),
                json!({"port": 8080, "host": ""}),
            )]);
            assert_eq!(check(&empty, Level::Restricted), [], "{handler}");
        }
    }

    #[test]
    fn apparmor_allows_only_runtime_default_and_localhost() {
        let unconfined = json!({"type": "Unconfined"});
        let p = with(&[("/spec/securityContext/appArmorProfile", unconfined.clone())]);
        let want = pairs(&[("spec.securityContext.appArmorProfile.type", rule::APPARMOR)]);
        assert_eq!(refused(&p, Level::Baseline), want);
        assert_eq!(refused(&p, Level::Restricted), want);
        refused_on_every_kind(
            "securityContext/appArmorProfile/type",
            json!("Unconfined"),
            &[Level::Baseline, Level::Restricted],
            &[rule::APPARMOR],
        );
        for ok in [
            json!({"type": "RuntimeDefault"}),
            json!({"type": "Localhost", "localhostProfile": "k8s-nginx"}),
        ] {
            let p = with(&[
                ("/spec/securityContext/appArmorProfile", ok.clone()),
                (
                    "/spec/ephemeralContainers/0/securityContext/appArmorProfile",
                    ok,
                ),
            ]);
            assert_eq!(check(&p, Level::Restricted), []);
        }
    }

    #[test]
    fn legacy_apparmor_annotations_are_checked_too() {
        let key = |c: &str| {
            format!("/metadata/annotations/{APPARMOR_ANNOTATION}{c}").replacen(
                "kubernetes.io/",
                "kubernetes.io~1",
                1,
            )
        };
        let p = with(&[
            (&key("web"), json!("unconfined")),
            (&key("setup"), json!("runtime/default")),
            (&key("debug"), json!("localhost/k8s-debug")),
            (&key("gone"), json!("")),
            (
                "/metadata/annotations/example.com~1apparmor",
                json!("unconfined"),
            ),
        ]);
        let want = pairs(&[(
            "metadata.annotations[container.apparmor.security.beta.kubernetes.io/web]",
            rule::APPARMOR,
        )]);
        assert_eq!(refused(&p, Level::Baseline), want);
        assert_eq!(refused(&p, Level::Restricted), want);
        assert_eq!(
            check(&p, Level::Baseline)[0].message,
            "AppArmor profile \"unconfined\" is not allowed (runtime/default, localhost/<profile> or empty)"
        );
    }

    #[test]
    fn selinux_limits_the_type_and_forbids_user_and_role() {
        let p = with(&[(
            "/spec/securityContext/seLinuxOptions",
            json!({"type": "spc_t", "user": "system_u", "role": "system_r", "level": "s0:c1,c2"}),
        )]);
        let sc = "spec.securityContext.seLinuxOptions";
        let want = pairs(&[
            (&format!("{sc}.type"), rule::SELINUX),
            (&format!("{sc}.user"), rule::SELINUX),
            (&format!("{sc}.role"), rule::SELINUX),
        ]);
        assert_eq!(refused(&p, Level::Baseline), want);
        assert_eq!(refused(&p, Level::Restricted), want);
        for field in ["type", "user", "role"] {
            refused_on_every_kind(
                &format!("securityContext/seLinuxOptions/{field}"),
                json!("unconfined_t"),
                &[Level::Baseline, Level::Restricted],
                &[rule::SELINUX],
            );
        }
        let allowed = [
            "",
            "container_t",
            "container_init_t",
            "container_kvm_t",
            "container_engine_t",
        ];
        for kind in allowed {
            let p = with(&[
                (
                    "/spec/securityContext/seLinuxOptions",
                    json!({"type": kind, "level": "s0:c1,c2"}),
                ),
                (
                    "/spec/initContainers/0/securityContext/seLinuxOptions",
                    json!({"type": kind, "user": "", "role": ""}),
                ),
            ]);
            assert_eq!(check(&p, Level::Restricted), [], "{kind}");
        }
    }

    #[test]
    fn proc_mount_is_default_except_in_a_user_namespace_at_baseline() {
        refused_on_every_kind(
            "securityContext/procMount",
            json!("Unmasked"),
            &[Level::Baseline, Level::Restricted],
            &[rule::PROC_MOUNT],
        );
        let default = with(&[(
            "/spec/containers/0/securityContext/procMount",
            json!("Default"),
        )]);
        assert_eq!(check(&default, Level::Restricted), []);

        // In its own user namespace a pod may unmask /proc at baseline, not at restricted.
        let userns = with(&[
            ("/spec/hostUsers", json!(false)),
            (
                "/spec/ephemeralContainers/0/securityContext/procMount",
                json!("Unmasked"),
            ),
        ]);
        assert_eq!(check(&userns, Level::Baseline), []);
        assert_eq!(
            refused(&userns, Level::Restricted),
            pairs(&[(
                "spec.ephemeralContainers[0].securityContext.procMount",
                rule::RESTRICTED_PROC_MOUNT
            )])
        );
        let host_users = with(&[
            ("/spec/hostUsers", json!(true)),
            (
                "/spec/containers/0/securityContext/procMount",
                json!("Unmasked"),
            ),
        ]);
        assert_eq!(check(&host_users, Level::Baseline).len(), 1);
    }

    #[test]
    fn baseline_seccomp_refuses_unconfined_at_either_level() {
        let p = with(&[(
            "/spec/securityContext/seccompProfile/type",
            json!("Unconfined"),
        )]);
        let pod_field = "spec.securityContext.seccompProfile.type";
        assert_eq!(
            refused(&p, Level::Baseline),
            pairs(&[(pod_field, rule::SECCOMP)])
        );
        // At restricted the pod level no longer covers the containers.
        let mut want = pairs(&[(pod_field, rule::SECCOMP)]);
        for (_, path) in KINDS {
            want.extend(pairs(&[(
                &format!("{path}.securityContext.seccompProfile"),
                rule::RESTRICTED_SECCOMP,
            )]));
        }
        assert_eq!(refused(&p, Level::Restricted), want);

        refused_on_every_kind(
            "securityContext/seccompProfile/type",
            json!("Unconfined"),
            &[Level::Baseline, Level::Restricted],
            &[rule::SECCOMP],
        );
        // A container's own profile does not excuse an Unconfined pod level, nor the reverse.
        let both = with(&[
            (
                "/spec/securityContext/seccompProfile/type",
                json!("Unconfined"),
            ),
            (
                "/spec/containers/0/securityContext/seccompProfile/type",
                json!("RuntimeDefault"),
            ),
        ]);
        assert_eq!(
            refused(&both, Level::Baseline),
            pairs(&[(pod_field, rule::SECCOMP)])
        );
        let unset = with(&[("/spec/securityContext/seccompProfile", json!(null))]);
        assert_eq!(check(&unset, Level::Baseline), []);
    }

    #[test]
    fn restricted_seccomp_is_set_at_pod_level_or_on_every_container() {
        let without = [("/spec/securityContext/seccompProfile", json!(null))];
        let mut every: Vec<(&str, Value)> = without.to_vec();
        let pointers: Vec<String> = KINDS
            .iter()
            .map(|(p, _)| format!("{p}/securityContext/seccompProfile"))
            .collect();
        for p in &pointers {
            every.push((
                p,
                json!({"type": "Localhost", "localhostProfile": "profiles/app.json"}),
            ));
        }
        assert_eq!(
            check(&with(&every), Level::Restricted),
            [],
            "containers stand in"
        );

        // One container without a profile of its own, and no pod-level one.
        let missing = with(&every[..3]);
        assert_eq!(
            refused(&missing, Level::Restricted),
            pairs(&[(
                "spec.ephemeralContainers[0].securityContext.seccompProfile",
                rule::RESTRICTED_SECCOMP
            )])
        );
        assert_eq!(check(&missing, Level::Baseline), []);

        // Pod level covers containers that leave it unset; an explicit bad one is refused.
        let localhost = with(&[(
            "/spec/securityContext/seccompProfile",
            json!({"type": "Localhost", "localhostProfile": "p.json"}),
        )]);
        assert_eq!(check(&localhost, Level::Restricted), []);
        let odd = with(&[(
            "/spec/initContainers/0/securityContext/seccompProfile/type",
            json!("Custom"),
        )]);
        assert_eq!(
            refused(&odd, Level::Restricted),
            pairs(&[(
                "spec.initContainers[0].securityContext.seccompProfile.type",
                rule::RESTRICTED_SECCOMP
            )])
        );
    }

    #[test]
    fn sysctls_are_limited_to_the_safe_set() {
        // The standard's safe set as of 1.37, the last two new in 1.37.
        let safe: Vec<Value> = [
            "kernel.shm_rmid_forced",
            "net.ipv4.ip_local_port_range",
            "net.ipv4.tcp_syncookies",
            "net.ipv4.ping_group_range",
            "net.ipv4.ip_unprivileged_port_start",
            "net.ipv4.ip_local_reserved_ports",
            "net.ipv4.tcp_keepalive_time",
            "net.ipv4.tcp_fin_timeout",
            "net.ipv4.tcp_keepalive_intvl",
            "net.ipv4.tcp_keepalive_probes",
            "net.ipv4.tcp_rmem",
            "net.ipv4.tcp_wmem",
            "net.ipv4.tcp_slow_start_after_idle",
            "net.ipv4.tcp_notsent_lowat",
        ]
        .iter()
        .map(|s| json!({"name": s, "value": "1"}))
        .collect();
        let p = with(&[("/spec/securityContext/sysctls", json!(safe))]);
        assert_eq!(check(&p, Level::Restricted), []);
        let p = with(&[(
            "/spec/securityContext/sysctls",
            json!([
                {"name": "net.ipv4.tcp_notsent_lowat", "value": "16384"},
                {"name": "kernel.msgmax", "value": "65536"},
                {"name": "net.core.somaxconn", "value": "1024"},
            ]),
        )]);
        let want = pairs(&[
            ("spec.securityContext.sysctls[1]", rule::SYSCTLS),
            ("spec.securityContext.sysctls[2]", rule::SYSCTLS),
        ]);
        assert_eq!(refused(&p, Level::Baseline), want);
        assert_eq!(refused(&p, Level::Restricted), want);
        assert!(check(&p, Level::Baseline)[0].message.starts_with(
            "sysctl kernel.msgmax is not allowed (baseline allows only the safe set: kernel.shm_rmid_forced, "
        ));
    }

    #[test]
    fn restricted_volume_types_are_the_core_ones() {
        let allowed = [
            json!({"name": "a", "configMap": {"name": "c"}}),
            json!({"name": "b", "csi": {"driver": "secrets-store.csi.k8s.io"}}),
            json!({"name": "c", "downwardAPI": {"items": []}}),
            json!({"name": "d", "emptyDir": {"medium": "Memory"}}),
            json!({"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}}),
            json!({"name": "f", "image": {"reference": "registry.example/model:1"}}),
            json!({"name": "g", "persistentVolumeClaim": {"claimName": "data"}}),
            json!({"name": "h", "projected": {"sources": []}}),
            json!({"name": "i", "secret": {"secretName": "tls"}}),
        ];
        let p = with(&[("/spec/volumes", json!(allowed))]);
        assert_eq!(check(&p, Level::Restricted), []);

        let p = with(&[
            (
                "/spec/volumes/-",
                json!({"name": "share", "nfs": {"server": "nfs.example", "path": "/"}}),
            ),
            (
                "/spec/volumes/-",
                json!({"name": "src", "gitRepo": {"repository": "https://example/r"}}),
            ),
            (
                "/spec/volumes/-",
                json!({"name": "disk", "awsElasticBlockStore": {"volumeID": "vol-1"}}),
            ),
        ]);
        assert_eq!(check(&p, Level::Baseline), []);
        assert_eq!(
            refused(&p, Level::Restricted),
            pairs(&[
                ("spec.volumes[1].nfs", rule::VOLUME_TYPES),
                ("spec.volumes[2].gitRepo", rule::VOLUME_TYPES),
                ("spec.volumes[3].awsElasticBlockStore", rule::VOLUME_TYPES),
            ])
        );
        assert_eq!(
            check(&p, Level::Restricted)[0].message,
            "volume type nfs is not allowed (restricted allows configMap, csi, downwardAPI, \
             emptyDir, ephemeral, image, persistentVolumeClaim, projected, secret)"
        );
        // A source these types do not know (or none): fail closed.
        let unknown = with(&[(
            "/spec/volumes/-",
            json!({"name": "future", "someNewSource": {}}),
        )]);
        assert_eq!(
            refused(&unknown, Level::Restricted),
            pairs(&[("spec.volumes[1]", rule::VOLUME_TYPES)])
        );
    }

    #[test]
    fn every_volume_source_is_named_as_the_api_names_it() {
        // One volume per source field of the API type, each naming only that source.
        macro_rules! one_each {
            ($($source:ident),* $(,)?) => {
                vec![$(Volume { $source: Some(Default::default()), ..Default::default() }),*]
            };
        }
        let volumes = one_each![
            aws_elastic_block_store,
            azure_disk,
            azure_file,
            cephfs,
            cinder,
            config_map,
            csi,
            downward_api,
            empty_dir,
            ephemeral,
            fc,
            flex_volume,
            flocker,
            gce_persistent_disk,
            git_repo,
            glusterfs,
            host_path,
            image,
            iscsi,
            nfs,
            persistent_volume_claim,
            photon_persistent_disk,
            portworx_volume,
            projected,
            quobyte,
            rbd,
            scale_io,
            secret,
            storageos,
            vsphere_volume,
        ];
        assert_eq!(volumes.len(), volume_sources(&Volume::default()).len());
        for v in volumes {
            let json = serde_json::to_value(&v).unwrap();
            let api: Vec<&str> = json
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .filter(|k| *k != "name")
                .collect();
            let named: Vec<&str> = volume_sources(&v)
                .into_iter()
                .filter_map(|(n, on)| on.then_some(n))
                .collect();
            assert_eq!(named, api);
        }
    }

    #[test]
    fn privilege_escalation_must_be_false_on_every_container() {
        for value in [json!(true), json!(null)] {
            refused_on_every_kind(
                "securityContext/allowPrivilegeEscalation",
                value.clone(),
                &[Level::Restricted],
                &[rule::PRIVILEGE_ESCALATION],
            );
            let p = with(&[(
                "/spec/containers/0/securityContext/allowPrivilegeEscalation",
                value,
            )]);
            assert_eq!(check(&p, Level::Baseline), []);
        }
    }

    #[test]
    fn running_as_non_root_is_required_at_pod_level_or_on_every_container() {
        let unset_at_pod = [("/spec/securityContext/runAsNonRoot", json!(null))];
        let p = with(&unset_at_pod);
        let want: Vec<(String, String)> = KINDS
            .iter()
            .map(|(_, path)| {
                (
                    format!("{path}.securityContext.runAsNonRoot"),
                    rule::NON_ROOT.to_owned(),
                )
            })
            .collect();
        assert_eq!(refused(&p, Level::Restricted), want);
        assert_eq!(check(&p, Level::Baseline), []);

        // Containers stand in for the pod level.
        let mut every: Vec<(&str, Value)> = unset_at_pod.to_vec();
        let pointers: Vec<String> = KINDS
            .iter()
            .map(|(p, _)| format!("{p}/securityContext/runAsNonRoot"))
            .collect();
        for p in &pointers {
            every.push((p, json!(true)));
        }
        assert_eq!(check(&with(&every), Level::Restricted), []);

        // A container's false overrides the pod's true, and is refused.
        refused_on_every_kind(
            "securityContext/runAsNonRoot",
            json!(false),
            &[Level::Restricted],
            &[rule::NON_ROOT],
        );
        // The pod's own false is refused even when every container says true.
        every[0].1 = json!(false);
        assert_eq!(
            refused(&with(&every), Level::Restricted),
            pairs(&[("spec.securityContext.runAsNonRoot", rule::NON_ROOT)])
        );
        // In its own user namespace, the pod's root is not the node's.
        let userns = with(&[
            ("/spec/hostUsers", json!(false)),
            ("/spec/securityContext/runAsNonRoot", json!(false)),
        ]);
        assert_eq!(check(&userns, Level::Restricted), []);
    }

    #[test]
    fn running_as_non_root_user_refuses_uid_0() {
        let p = with(&[("/spec/securityContext/runAsUser", json!(0))]);
        assert_eq!(
            refused(&p, Level::Restricted),
            pairs(&[("spec.securityContext.runAsUser", rule::NON_ROOT_USER)])
        );
        assert_eq!(check(&p, Level::Baseline), []);
        refused_on_every_kind(
            "securityContext/runAsUser",
            json!(0),
            &[Level::Restricted],
            &[rule::NON_ROOT_USER],
        );
        let p = with(&[
            ("/spec/securityContext/runAsUser", json!(1000)),
            ("/spec/containers/0/securityContext/runAsUser", json!(101)),
        ]);
        assert_eq!(check(&p, Level::Restricted), []);
        let userns = with(&[
            ("/spec/hostUsers", json!(false)),
            ("/spec/containers/0/securityContext/runAsUser", json!(0)),
        ]);
        assert_eq!(check(&userns, Level::Restricted), []);
    }

    #[test]
    fn windows_pods_skip_the_linux_only_restricted_controls() {
        let mut sets: Vec<(&str, Value)> = vec![
            ("/spec/os", json!({"name": "windows"})),
            ("/spec/securityContext/seccompProfile", json!(null)),
        ];
        let contexts: Vec<String> = KINDS
            .iter()
            .map(|(p, _)| format!("{p}/securityContext"))
            .collect();
        for c in &contexts {
            sets.push((
                c,
                json!({"windowsOptions": {"runAsUserName": "ContainerUser"}}),
            ));
        }
        assert_eq!(check(&with(&sets), Level::Restricted), []);
        // The same pod on Linux breaks all three controls on every container.
        sets[0].1 = json!({"name": "linux"});
        let rules: Vec<String> = check(&with(&sets), Level::Restricted)
            .into_iter()
            .map(|r| r.rule)
            .collect();
        for rule in [
            rule::PRIVILEGE_ESCALATION,
            rule::RESTRICTED_SECCOMP,
            rule::RESTRICTED_CAPABILITIES,
        ] {
            assert_eq!(rules.iter().filter(|r| *r == rule).count(), 3, "{rule}");
        }
    }

    #[test]
    fn a_pod_without_spec_is_judged_on_its_annotations() {
        let p = pod(json!({"metadata": {"name": "p", "annotations": {
            "container.apparmor.security.beta.kubernetes.io/app": "unconfined"}}}));
        assert_eq!(check(&p, Level::Baseline).len(), 1);
        assert_eq!(
            check(&pod(json!({"metadata": {"name": "p"}})), Level::Restricted),
            []
        );
    }

    /// nginx-unprivileged as a hardened chart deploys it.
    fn nginx_unprivileged() -> Pod {
        pod(json!({
            "metadata": {"name": "web-7d9f8c-x2k4q", "namespace": "shop", "labels": {"app": "web"}},
            "spec": {
                "securityContext": {
                    "runAsNonRoot": true, "runAsUser": 101, "runAsGroup": 101, "fsGroup": 101,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [{
                    "name": "nginx",
                    "image": "nginxinc/nginx-unprivileged:1.27-alpine",
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                    "securityContext": {
                        "allowPrivilegeEscalation": false,
                        "readOnlyRootFilesystem": true,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "readinessProbe": {"httpGet": {"path": "/", "port": "http"}},
                    "livenessProbe": {"tcpSocket": {"port": 8080}},
                    "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
                    "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
                    "volumeMounts": [
                        {"name": "tmp", "mountPath": "/tmp"},
                        {"name": "conf", "mountPath": "/etc/nginx/conf.d", "readOnly": true},
                        {"name": "kube-api-access-8x2lq", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true},
                    ],
                }],
                "volumes": [
                    {"name": "tmp", "emptyDir": {}},
                    {"name": "conf", "configMap": {"name": "web-nginx"}},
                    {"name": "kube-api-access-8x2lq", "projected": {"defaultMode": 420, "sources": [
                        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                    ]}},
                ],
            }
        }))
    }

    #[test]
    fn a_hardened_nginx_meets_every_level() {
        let p = nginx_unprivileged();
        for level in [Level::Privileged, Level::Baseline, Level::Restricted] {
            assert_eq!(check(&p, level), [], "{level}");
        }
    }

    #[test]
    fn a_typical_unhardened_app_meets_baseline_but_not_restricted() {
        let p = pod(json!({
            "metadata": {"name": "api-5c9b-q8v2n", "namespace": "shop"},
            "spec": {
                "containers": [{
                    "name": "api",
                    "image": "registry.example/shop/api:2.3.1",
                    "ports": [{"containerPort": 3000}],
                    "env": [{"name": "DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": "db", "key": "url"}}}],
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": 3000}},
                    "volumeMounts": [{"name": "config", "mountPath": "/app/config"}],
                }],
                "volumes": [
                    {"name": "config", "configMap": {"name": "api"}},
                    {"name": "certs", "secret": {"secretName": "api-tls"}},
                ],
            }
        }));
        assert_eq!(check(&p, Level::Baseline), []);
        let sc = "spec.containers[0].securityContext";
        assert_eq!(
            refused(&p, Level::Restricted),
            pairs(&[
                (
                    &format!("{sc}.allowPrivilegeEscalation"),
                    rule::PRIVILEGE_ESCALATION
                ),
                (&format!("{sc}.runAsNonRoot"), rule::NON_ROOT),
                (&format!("{sc}.seccompProfile"), rule::RESTRICTED_SECCOMP),
                (
                    &format!("{sc}.capabilities.drop"),
                    rule::RESTRICTED_CAPABILITIES
                ),
            ])
        );
    }

    /// Property tests: pods built from a restricted base by random changes, each of which
    /// knows the first level that forbids it and the field it wrote.
    mod generated {
        use super::*;
        use proptest::prelude::*;
        use std::collections::BTreeSet;

        #[derive(Debug, Clone, Copy)]
        struct Shape {
            containers: usize,
            init: usize,
            ephemeral: usize,
            /// Every container starts with a seccomp profile of its own.
            own_seccomp: bool,
            /// Every container starts with `runAsNonRoot: true` of its own.
            own_non_root: bool,
        }

        impl Shape {
            fn total(self) -> usize {
                self.containers + self.init + self.ephemeral
            }

            /// (JSON pointer, field path, name) of container `k` counting across the kinds.
            fn container(self, k: usize) -> (String, String, String) {
                let (kind, key, i) = if k < self.containers {
                    ("containers", "c", k)
                } else if k < self.containers + self.init {
                    ("initContainers", "i", k - self.containers)
                } else {
                    ("ephemeralContainers", "e", k - self.containers - self.init)
                };
                (
                    format!("/spec/{kind}/{i}"),
                    format!("spec.{kind}[{i}]"),
                    format!("{key}{i}"),
                )
            }

            fn base(self) -> Value {
                let kind = |n: usize, key: &str| -> Vec<Value> {
                    (0..n)
                        .map(|i| {
                            let mut c = hardened(&format!("{key}{i}"));
                            if self.own_seccomp {
                                set(
                                    &mut c,
                                    "/securityContext/seccompProfile/type",
                                    json!("RuntimeDefault"),
                                );
                            }
                            if self.own_non_root {
                                set(&mut c, "/securityContext/runAsNonRoot", json!(true));
                            }
                            c
                        })
                        .collect()
                };
                json!({
                    "metadata": {"name": "p", "namespace": "apps"},
                    "spec": {
                        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": kind(self.containers, "c"),
                        "initContainers": kind(self.init, "i"),
                        "ephemeralContainers": kind(self.ephemeral, "e"),
                        "volumes": [{"name": "scratch", "emptyDir": {}}],
                    }
                })
            }
        }

        /// The first level that forbids a change (`Allowed`: none does).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        enum Verdict {
            Allowed,
            Restricted,
            Baseline,
        }

        impl Verdict {
            fn refused_at(self, level: Level) -> bool {
                match level {
                    Level::Privileged => false,
                    Level::Baseline => self == Verdict::Baseline,
                    Level::Restricted => self != Verdict::Allowed,
                }
            }
        }

        /// Handlers that may carry a host: (JSON path under the container, action).
        const HANDLERS: [(&str, &str); 5] = [
            ("livenessProbe", "httpGet"),
            ("readinessProbe", "tcpSocket"),
            ("startupProbe", "httpGet"),
            ("lifecycle/postStart", "httpGet"),
            ("lifecycle/preStop", "tcpSocket"),
        ];

        /// One change to the restricted base; `usize` is a container counted across kinds.
        #[derive(Debug, Clone)]
        enum Change {
            HostNamespace(&'static str),
            PodHostProcess,
            PodSeccomp(Option<&'static str>),
            PodAppArmor(&'static str),
            PodSeLinux(&'static str, &'static str),
            PodRunAsNonRoot(Option<bool>),
            PodRunAsUser(i64),
            UserNamespace,
            Sysctl(&'static str),
            Volume(&'static str),
            AppArmorAnnotation(usize, &'static str),
            Privileged(usize),
            HostProcess(usize),
            AddCapability(usize, &'static str),
            KeepCapabilities(usize),
            PrivilegeEscalation(usize, Option<bool>),
            HostPort(usize, i32),
            HandlerHost(usize, usize, &'static str),
            Seccomp(usize, &'static str),
            AppArmor(usize, &'static str),
            SeLinux(usize, &'static str, &'static str),
            ProcMount(usize, &'static str),
            RunAsNonRoot(usize, bool),
            RunAsUser(usize, i64),
        }

        /// What some changes' verdicts depend on: the rest of the pod.
        struct Context {
            user_namespace: bool,
            total: usize,
            /// Containers with a seccomp profile restricted allows of their own.
            own_seccomp: BTreeSet<usize>,
            /// Containers with `runAsNonRoot: true` of their own.
            own_non_root: BTreeSet<usize>,
        }

        impl Context {
            fn of(shape: Shape, changes: &[Change]) -> Context {
                let every = |own: bool| -> BTreeSet<usize> {
                    if own {
                        (0..shape.total()).collect()
                    } else {
                        BTreeSet::new()
                    }
                };
                let mut c = Context {
                    user_namespace: false,
                    total: shape.total(),
                    own_seccomp: every(shape.own_seccomp),
                    own_non_root: every(shape.own_non_root),
                };
                for change in changes {
                    match change {
                        Change::UserNamespace => c.user_namespace = true,
                        Change::Seccomp(k, "RuntimeDefault" | "Localhost") => {
                            c.own_seccomp.insert(*k);
                        }
                        Change::Seccomp(k, _) => {
                            c.own_seccomp.remove(k);
                        }
                        Change::RunAsNonRoot(k, own) => {
                            if *own {
                                c.own_non_root.insert(*k);
                            } else {
                                c.own_non_root.remove(k);
                            }
                        }
                        _ => {}
                    }
                }
                c
            }

            /// Root checks do not apply in a pod's own user namespace.
            fn root(&self) -> Verdict {
                if self.user_namespace {
                    Verdict::Allowed
                } else {
                    Verdict::Restricted
                }
            }
        }

        fn bad_if(cond: bool, verdict: Verdict) -> Verdict {
            if cond { verdict } else { Verdict::Allowed }
        }

        impl Change {
            /// Changes that write the same field: only the first of them is kept.
            fn slot(&self) -> Option<(u8, usize, usize)> {
                let sub = |field: &str| {
                    ["type", "user", "role", "level"]
                        .iter()
                        .position(|f| *f == field)
                        .unwrap()
                };
                Some(match self {
                    Change::PodSeccomp(_) => (0, 0, 0),
                    Change::PodAppArmor(_) => (1, 0, 0),
                    Change::PodSeLinux(f, _) => (2, 0, sub(f)),
                    Change::PodRunAsNonRoot(_) => (3, 0, 0),
                    Change::PodRunAsUser(_) => (4, 0, 0),
                    Change::AppArmorAnnotation(k, _) => (5, *k, 0),
                    Change::PrivilegeEscalation(k, _) => (6, *k, 0),
                    Change::HandlerHost(k, h, _) => (7, *k, *h),
                    Change::Seccomp(k, _) => (8, *k, 0),
                    Change::AppArmor(k, _) => (9, *k, 0),
                    Change::SeLinux(k, f, _) => (10, *k, sub(f)),
                    Change::ProcMount(k, _) => (11, *k, 0),
                    Change::RunAsNonRoot(k, _) => (12, *k, 0),
                    Change::RunAsUser(k, _) => (13, *k, 0),
                    _ => return None,
                })
            }

            fn verdict(&self, cx: &Context) -> Verdict {
                use Verdict::*;
                let selinux = |field: &str, value: &str| match field {
                    "type" => bad_if(value == "spc_t", Baseline),
                    "user" | "role" => bad_if(!value.is_empty(), Baseline),
                    _ => Allowed,
                };
                match self {
                    Change::HostNamespace(_)
                    | Change::PodHostProcess
                    | Change::Privileged(_)
                    | Change::HostProcess(_) => Baseline,
                    Change::PodSeccomp(None) => bad_if(cx.own_seccomp.len() < cx.total, Restricted),
                    Change::PodSeccomp(Some(p)) | Change::Seccomp(_, p) => {
                        bad_if(*p == "Unconfined", Baseline)
                    }
                    Change::PodAppArmor(p) | Change::AppArmor(_, p) => {
                        bad_if(*p == "Unconfined", Baseline)
                    }
                    Change::PodSeLinux(f, v) | Change::SeLinux(_, f, v) => selinux(f, v),
                    Change::PodRunAsNonRoot(Some(true)) | Change::RunAsNonRoot(_, true) => Allowed,
                    Change::PodRunAsNonRoot(Some(false)) | Change::RunAsNonRoot(_, false) => {
                        cx.root()
                    }
                    Change::PodRunAsNonRoot(None) => {
                        if cx.own_non_root.len() < cx.total {
                            cx.root()
                        } else {
                            Allowed
                        }
                    }
                    Change::PodRunAsUser(uid) | Change::RunAsUser(_, uid) => {
                        if *uid == 0 {
                            cx.root()
                        } else {
                            Allowed
                        }
                    }
                    Change::UserNamespace => Allowed,
                    Change::Sysctl(name) => bad_if(
                        matches!(
                            *name,
                            "kernel.msgmax" | "net.core.somaxconn" | "vm.swappiness"
                        ),
                        Baseline,
                    ),
                    Change::Volume("hostPath") => Baseline,
                    Change::Volume(kind) => bad_if(matches!(*kind, "nfs" | "gitRepo"), Restricted),
                    Change::AppArmorAnnotation(_, p) => bad_if(*p == "unconfined", Baseline),
                    Change::AddCapability(_, cap) => match *cap {
                        "SYS_ADMIN" | "NET_RAW" | "ALL" => Baseline,
                        "NET_BIND_SERVICE" => Allowed,
                        _ => Restricted,
                    },
                    Change::KeepCapabilities(_) => Restricted,
                    Change::PrivilegeEscalation(_, ape) => bad_if(*ape != Some(false), Restricted),
                    Change::HostPort(_, port) => bad_if(*port != 0, Baseline),
                    Change::HandlerHost(_, _, host) => bad_if(!host.is_empty(), Baseline),
                    Change::ProcMount(_, "Default") => Allowed,
                    Change::ProcMount(..) if cx.user_namespace => Restricted,
                    Change::ProcMount(..) => Baseline,
                }
            }

            /// Writes the change into `pod`; returns the field a refusal must name, where
            /// there is exactly one.
            fn apply(&self, pod: &mut Value, shape: Shape) -> Option<String> {
                let at = |k: usize| shape.container(k);
                let profile = |kind: &str, local: &str| match kind {
                    "Localhost" => json!({"type": kind, "localhostProfile": local}),
                    _ => json!({"type": kind}),
                };
                let mut put = |pointer: &str, value: Value| set(pod, pointer, value);
                Some(match self {
                    Change::HostNamespace(field) => {
                        put(&format!("/spec/{field}"), json!(true));
                        format!("spec.{field}")
                    }
                    Change::PodHostProcess => {
                        put(
                            "/spec/securityContext/windowsOptions/hostProcess",
                            json!(true),
                        );
                        "spec.securityContext.windowsOptions.hostProcess".into()
                    }
                    Change::PodSeccomp(kind) => {
                        let value = kind.map_or(Value::Null, |k| profile(k, "p.json"));
                        put("/spec/securityContext/seccompProfile", value);
                        (*kind)?;
                        "spec.securityContext.seccompProfile.type".into()
                    }
                    Change::PodAppArmor(kind) => {
                        put(
                            "/spec/securityContext/appArmorProfile",
                            profile(kind, "k8s-app"),
                        );
                        "spec.securityContext.appArmorProfile.type".into()
                    }
                    Change::PodSeLinux(field, value) => {
                        put(
                            &format!("/spec/securityContext/seLinuxOptions/{field}"),
                            json!(value),
                        );
                        format!("spec.securityContext.seLinuxOptions.{field}")
                    }
                    Change::PodRunAsNonRoot(value) => {
                        put("/spec/securityContext/runAsNonRoot", json!(value));
                        value.as_ref()?;
                        "spec.securityContext.runAsNonRoot".into()
                    }
                    Change::PodRunAsUser(uid) => {
                        put("/spec/securityContext/runAsUser", json!(uid));
                        "spec.securityContext.runAsUser".into()
                    }
                    Change::UserNamespace => {
                        put("/spec/hostUsers", json!(false));
                        return None;
                    }
                    Change::Sysctl(name) => {
                        let i = put(
                            "/spec/securityContext/sysctls/-",
                            json!({"name": name, "value": "1"}),
                        );
                        format!("spec.securityContext.sysctls[{i}]")
                    }
                    Change::Volume(kind) => {
                        let body = match *kind {
                            "hostPath" => json!({"path": "/var/run"}),
                            "nfs" => json!({"server": "nfs.example", "path": "/"}),
                            "gitRepo" => json!({"repository": "https://example/r"}),
                            "csi" => json!({"driver": "d"}),
                            "image" => json!({"reference": "registry.example/data:1"}),
                            "configMap" => json!({"name": "c"}),
                            "secret" => json!({"secretName": "s"}),
                            "persistentVolumeClaim" => json!({"claimName": "c"}),
                            _ => json!({}),
                        };
                        let i = put("/spec/volumes/-", json!({"name": "v", *kind: body}));
                        format!("spec.volumes[{i}].{kind}")
                    }
                    Change::AppArmorAnnotation(k, value) => {
                        let name = at(*k).2;
                        put(
                            &format!(
                                "/metadata/annotations/container.apparmor.security.beta.kubernetes.io~1{name}"
                            ),
                            json!(value),
                        );
                        format!("metadata.annotations[{APPARMOR_ANNOTATION}{name}]")
                    }
                    Change::Privileged(k) => self.at_container(
                        &mut put,
                        at(*k),
                        "securityContext/privileged",
                        json!(true),
                    ),
                    Change::HostProcess(k) => self.at_container(
                        &mut put,
                        at(*k),
                        "securityContext/windowsOptions/hostProcess",
                        json!(true),
                    ),
                    Change::AddCapability(k, cap) => {
                        let (pointer, path, _) = at(*k);
                        put(
                            &format!("{pointer}/securityContext/capabilities/add/-"),
                            json!(cap),
                        );
                        format!("{path}.securityContext.capabilities.add")
                    }
                    Change::KeepCapabilities(k) => self.at_container(
                        &mut put,
                        at(*k),
                        "securityContext/capabilities/drop",
                        Value::Null,
                    ),
                    Change::PrivilegeEscalation(k, ape) => self.at_container(
                        &mut put,
                        at(*k),
                        "securityContext/allowPrivilegeEscalation",
                        json!(ape),
                    ),
                    Change::HostPort(k, port) => {
                        let (pointer, path, _) = at(*k);
                        let j = put(
                            &format!("{pointer}/ports/-"),
                            json!({"containerPort": 80, "hostPort": port}),
                        );
                        format!("{path}.ports[{j}].hostPort")
                    }
                    Change::HandlerHost(k, h, host) => {
                        let (handler, action) = HANDLERS[*h];
                        let (pointer, path, _) = at(*k);
                        put(
                            &format!("{pointer}/{handler}/{action}"),
                            json!({"port": 8080, "host": host}),
                        );
                        format!("{path}.{}.{action}.host", handler.replace('/', "."))
                    }
                    Change::Seccomp(k, kind) => {
                        let (pointer, path, _) = at(*k);
                        put(
                            &format!("{pointer}/securityContext/seccompProfile"),
                            profile(kind, "p.json"),
                        );
                        format!("{path}.securityContext.seccompProfile.type")
                    }
                    Change::AppArmor(k, kind) => {
                        let (pointer, path, _) = at(*k);
                        put(
                            &format!("{pointer}/securityContext/appArmorProfile"),
                            profile(kind, "k8s-app"),
                        );
                        format!("{path}.securityContext.appArmorProfile.type")
                    }
                    Change::SeLinux(k, field, value) => self.at_container(
                        &mut put,
                        at(*k),
                        &format!("securityContext/seLinuxOptions/{field}"),
                        json!(value),
                    ),
                    Change::ProcMount(k, mount) => self.at_container(
                        &mut put,
                        at(*k),
                        "securityContext/procMount",
                        json!(mount),
                    ),
                    Change::RunAsNonRoot(k, value) => self.at_container(
                        &mut put,
                        at(*k),
                        "securityContext/runAsNonRoot",
                        json!(value),
                    ),
                    Change::RunAsUser(k, uid) => {
                        self.at_container(&mut put, at(*k), "securityContext/runAsUser", json!(uid))
                    }
                })
            }

            /// Sets `rest` (a JSON path) of a container; returns its field path.
            fn at_container(
                &self,
                put: &mut impl FnMut(&str, Value) -> usize,
                (pointer, path, _): (String, String, String),
                rest: &str,
                value: Value,
            ) -> String {
                put(&format!("{pointer}/{rest}"), value);
                format!("{path}.{}", rest.replace('/', "."))
            }
        }

        fn change(total: usize) -> impl Strategy<Value = Change> {
            use prop::sample::select;
            let k = 0..total;
            let selinux = select(vec![
                ("type", "spc_t"),
                ("type", "container_t"),
                ("type", "container_engine_t"),
                ("type", ""),
                ("user", "system_u"),
                ("user", ""),
                ("role", "system_r"),
                ("level", "s0:c1,c2"),
            ]);
            let seccomp = select(vec!["Unconfined", "RuntimeDefault", "Localhost"]);
            prop_oneof![
                select(vec!["hostNetwork", "hostPID", "hostIPC"]).prop_map(Change::HostNamespace),
                Just(Change::PodHostProcess),
                select(vec![None, Some("Unconfined"), Some("Localhost")])
                    .prop_map(Change::PodSeccomp),
                seccomp.clone().prop_map(Change::PodAppArmor),
                selinux.clone().prop_map(|(f, v)| Change::PodSeLinux(f, v)),
                select(vec![None, Some(false), Some(true)]).prop_map(Change::PodRunAsNonRoot),
                select(vec![0, 1000]).prop_map(Change::PodRunAsUser),
                Just(Change::UserNamespace),
                select(vec![
                    "kernel.shm_rmid_forced",
                    "net.ipv4.tcp_notsent_lowat",
                    "net.ipv4.tcp_rmem",
                    "kernel.msgmax",
                    "net.core.somaxconn",
                    "vm.swappiness",
                ])
                .prop_map(Change::Sysctl),
                select(vec![
                    "hostPath",
                    "nfs",
                    "gitRepo",
                    "csi",
                    "image",
                    "configMap",
                    "emptyDir",
                    "secret",
                    "projected",
                    "downwardAPI",
                    "persistentVolumeClaim",
                    "ephemeral",
                ])
                .prop_map(Change::Volume),
                (
                    k.clone(),
                    select(vec![
                        "unconfined",
                        "runtime/default",
                        "localhost/k8s-app",
                        ""
                    ])
                )
                    .prop_map(|(k, p)| Change::AppArmorAnnotation(k, p)),
                k.clone().prop_map(Change::Privileged),
                k.clone().prop_map(Change::HostProcess),
                (
                    k.clone(),
                    select(vec![
                        "SYS_ADMIN",
                        "NET_RAW",
                        "ALL",
                        "CHOWN",
                        "KILL",
                        "SYS_CHROOT",
                        "NET_BIND_SERVICE"
                    ])
                )
                    .prop_map(|(k, c)| Change::AddCapability(k, c)),
                k.clone().prop_map(Change::KeepCapabilities),
                (k.clone(), select(vec![None, Some(true)]))
                    .prop_map(|(k, a)| Change::PrivilegeEscalation(k, a)),
                (k.clone(), select(vec![0, 8080])).prop_map(|(k, p)| Change::HostPort(k, p)),
                (k.clone(), 0..HANDLERS.len(), select(vec!["", "10.0.0.1"]))
                    .prop_map(|(k, h, host)| Change::HandlerHost(k, h, host)),
                (k.clone(), seccomp.clone()).prop_map(|(k, p)| Change::Seccomp(k, p)),
                (k.clone(), seccomp).prop_map(|(k, p)| Change::AppArmor(k, p)),
                (k.clone(), selinux).prop_map(|(k, (f, v))| Change::SeLinux(k, f, v)),
                (k.clone(), select(vec!["Unmasked", "Default"]))
                    .prop_map(|(k, m)| Change::ProcMount(k, m)),
                (k.clone(), any::<bool>()).prop_map(|(k, v)| Change::RunAsNonRoot(k, v)),
                (k, select(vec![0, 1000])).prop_map(|(k, uid)| Change::RunAsUser(k, uid)),
            ]
        }

        /// A pod shape and changes to it, one per field.
        fn changed_pods() -> impl Strategy<Value = (Shape, Vec<Change>)> {
            (
                1..=3usize,
                0..=2usize,
                0..=1usize,
                any::<bool>(),
                any::<bool>(),
            )
                .prop_flat_map(|(containers, init, ephemeral, own_seccomp, own_non_root)| {
                    let shape = Shape {
                        containers,
                        init,
                        ephemeral,
                        own_seccomp,
                        own_non_root,
                    };
                    (
                        Just(shape),
                        prop::collection::vec(change(shape.total()), 0..10),
                    )
                })
                .prop_map(|(shape, changes)| {
                    let mut seen = BTreeSet::new();
                    let kept = changes
                        .into_iter()
                        .filter(|c| c.slot().is_none_or(|s| seen.insert(s)))
                        .collect();
                    (shape, kept)
                })
        }

        /// The pod, and each change's verdict with the field it wrote.
        fn build(
            shape: Shape,
            changes: &[Change],
        ) -> (Pod, Vec<(Verdict, Option<String>, Change)>) {
            let cx = Context::of(shape, changes);
            let mut doc = shape.base();
            let inserted = changes
                .iter()
                .map(|c| (c.verdict(&cx), c.apply(&mut doc, shape), c.clone()))
                .collect();
            (pod(doc), inserted)
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(1000))]

            #[test]
            fn levels_nest_and_privileged_refuses_nothing((shape, changes) in changed_pods()) {
                let (pod, _) = build(shape, &changes);
                prop_assert_eq!(check(&pod, Level::Privileged), vec![]);
                let baseline = check(&pod, Level::Baseline);
                let restricted = check(&pod, Level::Restricted);
                for r in &baseline {
                    prop_assert!(r.rule.starts_with("baseline: "), "{r}");
                    prop_assert!(
                        restricted.iter().any(|s| s.field == r.field && s.rule == r.rule),
                        "{r} is missing at restricted: {restricted:?}"
                    );
                }
            }

            #[test]
            fn every_inserted_violation_is_refused_at_its_level((shape, changes) in changed_pods()) {
                let (pod, inserted) = build(shape, &changes);
                for level in [Level::Baseline, Level::Restricted] {
                    let refusals = check(&pod, level);
                    let forbidden: Vec<_> = inserted.iter().filter(|(v, ..)| v.refused_at(level)).collect();
                    prop_assert_eq!(
                        refusals.is_empty(), forbidden.is_empty(),
                        "at {}: forbidden {:?}, refused {:?}", level, forbidden, refusals
                    );
                    for (verdict, field, change) in forbidden {
                        let Some(field) = field else { continue };
                        let prefix = if *verdict == Verdict::Baseline { "baseline: " } else { "restricted: " };
                        prop_assert!(
                            refusals.iter().any(|r| &r.field == field && r.rule.starts_with(prefix)),
                            "at {level}: {change:?} should refuse {field} under {prefix}..: {refusals:?}"
                        );
                    }
                }
            }

            #[test]
            fn pods_built_from_allowed_values_are_admitted_at_their_level(
                (shape, changes) in changed_pods(),
                level in prop::sample::select(vec![Level::Baseline, Level::Restricted]),
            ) {
                // Dropping forbidden changes only relaxes the context (a container's own
                // Unconfined or runAsNonRoot false goes; all else it counts is allowed
                // everywhere), so what was allowed stays allowed.
                let cx = Context::of(shape, &changes);
                let allowed: Vec<Change> = changes
                    .into_iter()
                    .filter(|c| !c.verdict(&cx).refused_at(level))
                    .collect();
                let (pod, _) = build(shape, &allowed);
                prop_assert_eq!(check(&pod, level), vec![], "{:?}", allowed);
            }
        }
    }
}
