//! Tenant control planes as Kubernetes objects (pure: tenant + version + settings -> objects).
//!
//! One tera template per component in `templates/` (embedded at build time, or read from
//! `--templates` to customise a deployment). Templates see a flat context: the tenant's name,
//! key and namespace, its [`Version`], the placement [`Plan`], the deployment-wide
//! [`Settings`], labels, in-cluster kubeconfigs, and per-component certificate digests that
//! roll pods when a certificate is renewed. Output is checked: every document must be a
//! Kubernetes object in the tenant's namespace (or cluster-scoped and named after the key).

pub mod audit;
pub mod catalog;
pub mod datastore;
pub mod encryption;
pub mod host_rbac;
pub mod kubeconfig;
pub mod tuning;

use crate::chain;
pub use catalog::{Catalog, CatalogError, Version};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use vcp_core::naming::{TenantKey, control_plane_namespace};
use vcp_policy::TenantPolicy;

/// The templates, in the order their components come up.
pub const TEMPLATES: [(Component, &str, &str); 6] = [
    (
        Component::Network,
        "network.yaml",
        include_str!("../../../templates/network.yaml"),
    ),
    (
        Component::Etcd,
        "etcd.yaml",
        include_str!("../../../templates/etcd.yaml"),
    ),
    (
        Component::Apiserver,
        "kube-apiserver.yaml",
        include_str!("../../../templates/kube-apiserver.yaml"),
    ),
    (
        Component::ControllerManager,
        "kube-controller-manager.yaml",
        include_str!("../../../templates/kube-controller-manager.yaml"),
    ),
    (
        Component::Coredns,
        "coredns.yaml",
        include_str!("../../../templates/coredns.yaml"),
    ),
    (
        Component::Syncer,
        "vcp-syncer.yaml",
        include_str!("../../../templates/vcp-syncer.yaml"),
    ),
];

/// Templates of the Jobs vcp runs in a tenant's control-plane namespace, outside bring-up.
pub const JOB_TEMPLATES: [(JobKind, &str, &str); 4] = [
    (
        JobKind::Snapshot,
        "etcd-snapshot.yaml",
        include_str!("../../../templates/etcd-snapshot.yaml"),
    ),
    (
        JobKind::Restore,
        "etcd-restore.yaml",
        include_str!("../../../templates/etcd-restore.yaml"),
    ),
    (
        JobKind::Import,
        "etcd-import.yaml",
        include_str!("../../../templates/etcd-import.yaml"),
    ),
    (
        JobKind::Member,
        "etcd-member.yaml",
        include_str!("../../../templates/etcd-member.yaml"),
    ),
];

/// A shared datastore's objects, and the Job that administers it ([`datastore`]).
pub const DATASTORE_TEMPLATES: [(&str, &str); 2] = [
    (
        "datastore.yaml",
        include_str!("../../../templates/datastore.yaml"),
    ),
    (
        "datastore-job.yaml",
        include_str!("../../../templates/datastore-job.yaml"),
    ),
];

/// A Job vcp runs for a tenant ([`crate::snapshots`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    /// Takes one etcd snapshot (with the claim that keeps them).
    Snapshot,
    /// Restores one etcd member from a snapshot.
    Restore,
    /// Restores a tenant's keys from a logical snapshot (a tenant on a shared datastore).
    Import,
    /// Adds a member to the tenant's own etcd, or promotes it ([`crate::members`]).
    Member,
}

/// A control-plane component with a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Component {
    Network,
    Etcd,
    Apiserver,
    ControllerManager,
    Coredns,
    Syncer,
}

impl Component {
    /// Label value and key in `rollout`.
    pub fn as_str(self) -> &'static str {
        match self {
            Component::Network => "network",
            Component::Etcd => "etcd",
            Component::Apiserver => "apiserver",
            Component::ControllerManager => "controller_manager",
            Component::Coredns => "coredns",
            Component::Syncer => "syncer",
        }
    }
}

/// Why rendering failed.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("template {template} failed: {message}")]
    Template { template: String, message: String },
    #[error("template {template} produced invalid YAML: {message}")]
    Yaml { template: String, message: String },
    #[error("template {template} produced an object without {field}")]
    Shape {
        template: String,
        field: &'static str,
    },
    #[error("template {template} produced {object} outside namespace {namespace}")]
    Escape {
        template: String,
        object: String,
        namespace: String,
    },
    #[error("cannot read templates from {path}: {message}")]
    Read { path: String, message: String },
    #[error("plan {plan:?} is invalid: {message}")]
    Plan { plan: String, message: String },
}

type Result<T, E = RenderError> = std::result::Result<T, E>;

/// How tenant apiservers are reached from outside the host cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "type")]
pub enum Expose {
    /// A NodePort; kubeconfigs use `https://<address>:<nodePort>`.
    NodePort { address: String },
    /// A LoadBalancer; kubeconfigs use its ingress address on port 6443.
    LoadBalancer,
    /// A ClusterIP Service behind an external name (a proxy or ingress the platform runs):
    /// kubeconfigs use `https://<key>.<domain>`.
    Hostname { domain: String },
    /// A ClusterIP Service behind vcp's own gateway (`vcp-gateway`, deployed by the chart), which
    /// routes each TLS connection by its server name `<key>.<domain>` without terminating it.
    /// Kubeconfigs use `https://<key>.<domain>:<port>`; with `address`, they dial that address
    /// instead and send the name as `tls-server-name` (a platform without wildcard DNS).
    Gateway {
        domain: String,
        port: u16,
        address: Option<String>,
    },
}

impl Expose {
    pub fn service_type(&self) -> &'static str {
        match self {
            Expose::NodePort { .. } => "NodePort",
            Expose::LoadBalancer => "LoadBalancer",
            Expose::Hostname { .. } | Expose::Gateway { .. } => "ClusterIP",
        }
    }

    /// What a client dials for a tenant whose endpoint is `endpoint` (as [`crate::provision::endpoint`]
    /// made it): the kubeconfig's `server` and, when it dials an address other than the name
    /// the certificate carries, the `tls-server-name` to send and verify.
    pub fn dial(&self, endpoint: &str) -> (String, Option<String>) {
        match self {
            Expose::Gateway {
                domain,
                port,
                address: Some(address),
            } => {
                let name = endpoint
                    .strip_prefix("https://")
                    .and_then(|rest| rest.split([':', '/']).next())
                    .filter(|host| host.ends_with(&format!(".{domain}")));
                match name {
                    Some(name) => (
                        crate::provision::url(address, i32::from(*port)),
                        Some(name.to_owned()),
                    ),
                    None => (endpoint.to_owned(), None),
                }
            }
            _ => (endpoint.to_owned(), None),
        }
    }
}

/// The label that names a tenant's apiserver Service to the gateway (its value: the key).
pub const LABEL_GATEWAY_NAME: &str = "vcp.dev/gateway-name";

/// Deployment-wide settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Settings {
    /// The host's service CIDR; tenant apiservers allocate from the same range, so the syncer
    /// can give tenant Services their host ClusterIPs.
    pub service_cidr: String,
    pub cluster_domain: String,
    pub syncer_image: String,
    /// Image with the `vcp` binary, for the snapshot and restore Jobs (`vcp tool ...`).
    pub tools_image: String,
    pub expose: Expose,
    /// Prefix of the shared host ClusterRoles (`<prefix>:tenant-namespace`,
    /// `<prefix>:syncer-namespaced`; [`host_rbac`]): `vcp`, or the chart's release name.
    pub host_roles_prefix: String,
    /// The shared datastores vcp runs (`--datastores`), by name; plans name them.
    pub datastores: BTreeMap<String, datastore::Spec>,
    /// Where tenant apiservers send their audit events (`--audit-url`, vcp's ingest); `None`:
    /// tenant apiservers keep no audit log.
    pub audit_url: Option<String>,
}

impl Settings {
    /// Where tenant `key` of `plan` keeps its data: `None` in its own etcd.
    pub fn placement(&self, plan: &Plan, key: &str) -> Option<datastore::Placement> {
        let name = plan.datastore.as_deref()?;
        let spec = self.datastores.get(name)?;
        Some(datastore::Placement::new(name, spec, key))
    }
}

/// Plans that name a datastore `--datastores` does not declare.
pub fn check_datastores(
    plans: &BTreeMap<String, Plan>,
    datastores: &BTreeMap<String, datastore::Spec>,
) -> Result<()> {
    for (name, p) in plans {
        if let Some(d) = &p.datastore
            && !datastores.contains_key(d)
        {
            return Err(RenderError::Plan {
                plan: name.clone(),
                message: format!("datastore {d:?} is not declared (--datastores)"),
            });
        }
    }
    Ok(())
}

/// Placement and size of a tenant's control plane.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default)]
    pub tolerations: Vec<Value>,
    #[serde(default = "one")]
    pub etcd_replicas: u8,
    #[serde(default = "one")]
    pub apiserver_replicas: u8,
    #[serde(default = "one")]
    pub dns_replicas: u8,
    #[serde(default)]
    pub storage_class: Option<String>,
    #[serde(default = "default_storage")]
    pub etcd_storage: String,
    /// Container resources per component (`etcd`, `kube-apiserver`, ...).
    #[serde(default)]
    pub resources: BTreeMap<String, Value>,
    /// What the tenant may put on the host (docs/syncer.md, "Security model"); the syncer
    /// enforces it. Absent: the restrictive defaults.
    #[serde(default)]
    pub policy: TenantPolicy,
    /// When fleet upgrades may start the plan's tenants (a tenant's own window wins), e.g.
    /// `{days: [sat, sun], start: "02:00", duration_minutes: 240}` (UTC). Absent: any time.
    #[serde(default)]
    pub maintenance_window: Option<crate::window::MaintenanceWindow>,
    /// `auto_update: patch`: the plan's tenants move to the newest release of their minor in
    /// their maintenance window (a tenant's own setting wins). Absent: off.
    #[serde(default)]
    pub auto_update: Option<vcp_core::lifecycle::AutoUpdate>,
    /// How lean the control plane runs (Go's GC, the apiserver's watch cache, etcd's quota and
    /// raft log, CoreDNS's cache; [`tuning`]). Absent: every component's own defaults.
    #[serde(default)]
    pub tuning: tuning::Tuning,
    /// `sleep: {after_idle_minutes: N}`: the plan's tenants go to sleep (control plane scaled to
    /// zero) after N minutes with no connection through the gateway and no running workload
    /// ([`crate::sleep`]). Absent: they sleep only when asked.
    #[serde(default)]
    pub sleep: Option<crate::sleep::SleepPlan>,
    /// `datastore: NAME`: the plan's tenants keep their data on that shared datastore (declared
    /// by `--datastores`), each under its own prefix and etcd user, instead of an etcd of their
    /// own ([`datastore`]). Absent: a dedicated etcd per tenant.
    #[serde(default)]
    pub datastore: Option<String>,
    /// What the tenant apiserver encrypts in etcd with the tenant's key
    /// (`encryption: {resources: [secrets, configmaps]}`; [`encryption`]). Absent: Secrets.
    #[serde(default)]
    pub encryption: encryption::EncryptionPlan,
    /// The tenant apiserver's audit log, which vcp collects and the owner reads
    /// (`audit: {policy: default|metadata|none, retention_days: 30}`; [`audit`]). Absent: the
    /// default policy, kept 30 days.
    #[serde(default)]
    pub audit: audit::AuditPlan,
    /// `backups: {hourly: N, daily: M}`: a snapshot each UTC hour and day, the newest N and M
    /// kept ([`crate::snapshots::schedule`]); uploaded when a backup store is configured.
    /// Absent: snapshots only when asked for.
    #[serde(default)]
    pub backups: Option<crate::backup_store::BackupPlan>,
}

/// The policy a tenant's syncer enforces: the plan's, plus what only vcp knows. Nodes that
/// run control planes (the plan's control-plane node selector) are never a tenant pod's, and
/// the static band of the host's service CIDR (where fixed addresses such as cluster DNS
/// live) is never a tenant Service's ClusterIP.
///
/// Except where the plan's workload pool asks for a control-plane label itself
/// (`placement.node_selector` with the same key and value): that plan shares its
/// control-plane nodes with its tenants on purpose (the dev environment's process-workloads
/// plan, whose only real node runs both), and avoiding the label would leave its pods no node.
pub fn syncer_policy(plan: &Plan, settings: &Settings) -> TenantPolicy {
    let mut p = plan.policy.clone();
    for (k, v) in &plan.node_selector {
        if p.placement.node_selector.get(k) == Some(v) {
            continue;
        }
        p.placement
            .avoid_node_labels
            .entry(k.clone())
            .or_insert_with(|| v.clone());
    }
    if let Some(band) = static_band(&settings.service_cidr)
        && !p.services.reserved_cluster_ips.contains(&band)
    {
        p.services.reserved_cluster_ips.push(band);
    }
    p
}

/// The lower band of a service CIDR that Kubernetes keeps for addresses chosen by hand
/// (dynamic allocation uses it last): `max(16, min(256, size / 16))` addresses.
pub fn static_band(cidr: &str) -> Option<ipnet::IpNet> {
    let net: ipnet::IpNet = cidr.parse().ok()?;
    let host_bits = u32::from(net.max_prefix_len() - net.prefix_len());
    // size / 16 in powers of two, clamped to [16, 256].
    let band_bits = host_bits.saturating_sub(4).clamp(4, 8).min(host_bits);
    let prefix = net.max_prefix_len() - u8::try_from(band_bits).ok()?;
    ipnet::IpNet::new(net.network(), prefix).ok()
}

fn one() -> u8 {
    1
}

fn default_storage() -> String {
    "1Gi".into()
}

impl Default for Plan {
    fn default() -> Plan {
        serde_yaml::from_str("{}").expect("empty plan")
    }
}

/// Named plans (`--plans FILE`: a YAML map of name -> [`Plan`]); `default` always exists.
pub fn parse_plans(yaml: &str) -> Result<BTreeMap<String, Plan>> {
    let mut plans: BTreeMap<String, Plan> =
        serde_yaml::from_str(yaml).map_err(|e| RenderError::Plan {
            plan: "<file>".into(),
            message: e.to_string(),
        })?;
    plans.entry("default".into()).or_default();
    for (name, p) in &plans {
        let bad = |message: &str| RenderError::Plan {
            plan: name.clone(),
            message: message.to_owned(),
        };
        if !matches!(p.etcd_replicas, 1 | 3) {
            return Err(bad("etcd_replicas must be 1 or 3"));
        }
        if !(1..=3).contains(&p.apiserver_replicas) {
            return Err(bad("apiserver_replicas must be 1 to 3"));
        }
        if !(1..=3).contains(&p.dns_replicas) {
            return Err(bad("dns_replicas must be 1 to 3"));
        }
        p.policy.validate().map_err(|e| bad(&e.to_string()))?;
        p.tuning.validate().map_err(|e| bad(&e))?;
        if let Some(sleep) = &p.sleep {
            sleep.validate().map_err(|e| bad(&e))?;
        }
        p.encryption.validate().map_err(|e| bad(&e))?;
        p.audit.validate().map_err(|e| bad(&e))?;
        if let Some(b) = &p.backups {
            b.validate().map_err(|e| bad(&e))?;
        }
    }
    Ok(plans)
}

/// Everything one tenant's templates see.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    pub name: &'a str,
    pub key: &'a TenantKey,
    pub version: &'a Version,
    pub plan: &'a Plan,
    pub settings: &'a Settings,
    /// Component -> digest of the certificates its pods mount.
    pub rollout: BTreeMap<String, String>,
    /// Whether the control plane runs.
    pub run: Run,
}

/// Whether a tenant's control plane runs, as its templates render it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run {
    /// Every component at its plan's replicas.
    Up,
    /// etcd, the apiserver, the controller-manager and the syncer at no replicas, CoreDNS kept
    /// (while a restore replaces etcd's data).
    Stopped,
    /// Asleep: every component at no replicas, but CoreDNS while `dns` (the tenant's workloads
    /// still run and resolve names from what it last read); the apiserver Service says so
    /// (`vcp.dev/asleep`), so the gateway asks for a wake instead of dialling nothing.
    Asleep { dns: bool },
}

/// The annotation of an asleep tenant's apiserver Service (its value: `"true"`).
pub const ANNOTATION_ASLEEP: &str = "vcp.dev/asleep";

/// One rendered object.
#[derive(Debug, Clone, PartialEq)]
pub struct Object(pub Value);

impl Object {
    pub fn api_version(&self) -> &str {
        self.0["apiVersion"].as_str().unwrap_or_default()
    }
    pub fn kind(&self) -> &str {
        self.0["kind"].as_str().unwrap_or_default()
    }
    pub fn name(&self) -> &str {
        self.0["metadata"]["name"].as_str().unwrap_or_default()
    }
    pub fn namespace(&self) -> Option<&str> {
        self.0["metadata"]["namespace"].as_str()
    }
}

/// Labels of everything vcp creates for a tenant's control plane (the first and the last are
/// read by the syncer too, so they live in vcp-core).
pub use vcp_core::naming::{LABEL_COMPONENT, LABEL_CONTROL_PLANE_OF};
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// The loaded templates.
pub struct Renderer {
    tera: tera::Tera,
}

impl std::fmt::Debug for Renderer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renderer").finish_non_exhaustive()
    }
}

impl Renderer {
    /// The templates built into this binary.
    pub fn builtin() -> Result<Renderer> {
        Renderer::from_sources(
            TEMPLATES
                .iter()
                .map(|(_, n, s)| ((*n).to_owned(), (*s).to_owned()))
                .chain(
                    JOB_TEMPLATES
                        .iter()
                        .map(|(_, n, s)| ((*n).to_owned(), (*s).to_owned())),
                )
                .chain(
                    DATASTORE_TEMPLATES
                        .iter()
                        .map(|(n, s)| ((*n).to_owned(), (*s).to_owned())),
                ),
        )
    }

    /// Templates read from a directory holding every file of [`TEMPLATES`].
    pub fn from_dir(dir: &Path) -> Result<Renderer> {
        let mut sources = Vec::new();
        let names = TEMPLATES.iter().map(|(_, n, _)| *n);
        let names = names
            .chain(JOB_TEMPLATES.iter().map(|(_, n, _)| *n))
            .chain(DATASTORE_TEMPLATES.iter().map(|(n, _)| *n));
        for name in names {
            let path = dir.join(name);
            let text = std::fs::read_to_string(&path).map_err(|e| RenderError::Read {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
            sources.push((name.to_owned(), text));
        }
        Renderer::from_sources(sources)
    }

    fn from_sources(sources: impl IntoIterator<Item = (String, String)>) -> Result<Renderer> {
        let mut tera = tera::Tera::default();
        // YAML, not HTML: nothing is escaped.
        tera.autoescape_on(vec![]);
        for (name, text) in sources {
            tera.add_raw_template(&name, &text)
                .map_err(|e| RenderError::Template {
                    template: name.clone(),
                    message: chain(&e),
                })?;
        }
        Ok(Renderer { tera })
    }

    /// Renders one component's objects.
    pub fn render(&self, component: Component, input: &Input<'_>) -> Result<Vec<Object>> {
        self.render_with(component, input, Value::Null)
    }

    /// One component's objects with `extra` added to the context (the etcd StatefulSet while
    /// members are added: `etcd_growth`).
    pub fn render_with(
        &self,
        component: Component,
        input: &Input<'_>,
        extra: Value,
    ) -> Result<Vec<Object>> {
        let (_, template, _) = TEMPLATES
            .iter()
            .find(|(c, _, _)| *c == component)
            .expect("every component has a template");
        self.render_extended(template, input, extra)
    }

    /// A Job's objects; `extra` adds to the context what the template's header lists.
    pub fn render_job(
        &self,
        kind: JobKind,
        input: &Input<'_>,
        extra: Value,
    ) -> Result<Vec<Object>> {
        let (_, template, _) = JOB_TEMPLATES
            .iter()
            .find(|(k, _, _)| *k == kind)
            .expect("every job has a template");
        self.render_extended(template, input, extra)
    }

    /// `template` over the tenant's context with the keys of `extra` (an object) added.
    fn render_extended(
        &self,
        template: &str,
        input: &Input<'_>,
        extra: Value,
    ) -> Result<Vec<Object>> {
        let mut ctx = context(input);
        if let (Some(c), Value::Object(extra)) = (ctx.as_object_mut(), extra) {
            c.extend(extra);
        }
        self.render_template(template, ctx, input)
    }

    /// A shared datastore's objects; `certificates`: the digest of its member certificate,
    /// which rolls the members when it is reissued.
    pub fn render_datastore(
        &self,
        name: &str,
        spec: &datastore::Spec,
        images: (&str, &str),
        certificates: &str,
    ) -> Result<Vec<Object>> {
        let mut ctx = datastore::context(name, spec, images.0, images.1);
        ctx["certificates"] = json!(certificates);
        self.render_in("datastore.yaml", ctx, &datastore::namespace(name))
    }

    /// The Job of one administration step on a shared datastore.
    pub fn render_datastore_job(
        &self,
        name: &str,
        spec: &datastore::Spec,
        images: (&str, &str),
        admin: &datastore::Admin,
    ) -> Result<Vec<Object>> {
        let mut ctx = datastore::context(name, spec, images.0, images.1);
        ctx["job"] = json!(admin.job());
        ctx["args"] = json!(admin.args());
        self.render_in("datastore-job.yaml", ctx, &datastore::namespace(name))
    }

    /// A template whose every object is in `namespace` (no cluster-scoped ones: no key ends
    /// a name with "/").
    fn render_in(&self, template: &str, ctx: Value, namespace: &str) -> Result<Vec<Object>> {
        self.render_checked(template, ctx, namespace, "/")
    }

    fn render_template(
        &self,
        template: &str,
        ctx: Value,
        input: &Input<'_>,
    ) -> Result<Vec<Object>> {
        self.render_checked(
            template,
            ctx,
            &control_plane_namespace(input.key),
            input.key,
        )
    }

    /// Renders `template` and checks its objects: in `namespace`, or cluster-scoped and named
    /// after `key`.
    fn render_checked(
        &self,
        template: &str,
        ctx: Value,
        namespace: &str,
        key: &str,
    ) -> Result<Vec<Object>> {
        let ctx = tera::Context::from_value(ctx).map_err(|e| RenderError::Template {
            template: template.to_owned(),
            message: chain(&e),
        })?;
        let text = self
            .tera
            .render(template, &ctx)
            .map_err(|e| RenderError::Template {
                template: template.to_owned(),
                message: chain(&e),
            })?;
        parse_objects(template, &text, namespace, key)
    }

    /// Every component's objects, in bring-up order.
    pub fn render_all(&self, input: &Input<'_>) -> Result<Vec<(Component, Vec<Object>)>> {
        TEMPLATES
            .iter()
            .map(|(c, _, _)| Ok((*c, self.render(*c, input)?)))
            .collect()
    }
}

fn labels(key: &str, component: &str) -> (Value, Value) {
    let selector = json!({
        LABEL_CONTROL_PLANE_OF: key,
        LABEL_COMPONENT: component,
    });
    let mut all = selector.clone();
    all[LABEL_MANAGED_BY] = json!("vcp");
    (all, selector)
}

/// The template context.
fn context(input: &Input<'_>) -> Value {
    let ns = control_plane_namespace(input.key);
    let members: Vec<String> = (0..input.plan.etcd_replicas)
        .map(|i| format!("etcd-{i}"))
        .collect();
    let mut ctx = json!({
        "name": input.name,
        "key": input.key,
        "namespace": ns,
        "version": input.version,
        "plan": input.plan,
        "service_cidr": input.settings.service_cidr,
        "cluster_domain": input.settings.cluster_domain,
        "syncer_image": input.settings.syncer_image,
        "tools_image": input.settings.tools_image,
        "syncer_host_role": host_rbac::syncer_namespaced_role(&input.settings.host_roles_prefix),
        "stopped": input.run != Run::Up,
        "asleep": matches!(input.run, Run::Asleep { .. }),
        "dns_stopped": input.run == Run::Asleep { dns: false },
        "annotation_asleep": ANNOTATION_ASLEEP,
        "expose": {"service_type": input.settings.expose.service_type()},
        "etcd_servers": members.iter()
            .map(|m| format!("https://{m}.etcd.{ns}.svc:2379"))
            .collect::<Vec<_>>().join(","),
        "etcd_peer_cn": crate::pki::ETCD_PEER_CN,
        "etcd_initial_cluster": members.iter()
            .map(|m| format!("{m}=https://{m}.etcd.{ns}.svc:2380"))
            .collect::<Vec<_>>().join(","),
        "datastore": null,
        "etcd_growth": null,
        // The apiserver's default --etcd-prefix: where its keys are in an etcd of its own.
        "etcd_prefix": "/registry",
    });
    // On a shared datastore the apiserver dials its members and keeps its keys under the
    // tenant's prefix; the tenant has no etcd of its own.
    if let Some(p) = input.settings.placement(input.plan, input.key) {
        ctx["etcd_servers"] = json!(p.servers);
        ctx["etcd_prefix"] = json!(p.prefix);
        ctx["datastore"] = json!(p);
        ctx["label_datastore"] = json!(datastore::LABEL_DATASTORE);
        ctx["datastore_client_secret"] = json!(crate::pki::DATASTORE_CLIENT);
        ctx["datastore_user_secret"] = json!(datastore::SECRET_TENANT_USER);
    }
    let mut rollout = serde_json::Map::new();
    for (c, label) in [
        (Component::Network, "network"),
        (Component::Etcd, "etcd"),
        (Component::Apiserver, "kube-apiserver"),
        (Component::ControllerManager, "kube-controller-manager"),
        (Component::Coredns, "coredns"),
        (Component::Syncer, "vcp-syncer"),
    ] {
        let (all, selector) = labels(input.key, label);
        ctx[format!("labels_{}", c.as_str())] = all;
        ctx[format!("selector_{}", c.as_str())] = selector;
        rollout.insert(
            c.as_str().to_owned(),
            json!(input.rollout.get(c.as_str()).cloned().unwrap_or_default()),
        );
    }
    // Not a component's digest: the token generation the syncer is started with (a change
    // rolls it too, and it reissues every pod's token; see pki::rotation).
    rollout.insert(
        "tokens".to_owned(),
        json!(input.rollout.get("tokens").cloned().unwrap_or_default()),
    );
    // Not a certificate's digest either: the apiserver's encryption configuration's (vcp
    // renders it into a Secret from the inventory; a change rolls the apiserver).
    rollout.insert(
        "encryption".to_owned(),
        json!(input.rollout.get("encryption").cloned().unwrap_or_default()),
    );
    // Nor this: the audit policy's and webhook's (vcp writes them into a Secret with the
    // tenant's ingest token; a change rolls the apiserver).
    rollout.insert(
        "audit".to_owned(),
        json!(input.rollout.get("audit").cloned().unwrap_or_default()),
    );
    ctx["rollout"] = Value::Object(rollout);
    // The apiserver Service: only behind the gateway does it name a route.
    let mut service = ctx["labels_apiserver"].clone();
    if matches!(input.settings.expose, Expose::Gateway { .. }) {
        service[LABEL_GATEWAY_NAME] = json!(input.key);
    }
    ctx["labels_apiserver_service"] = service;
    // Pods of vcp's Jobs: never matched by the etcd StatefulSet's or Service's selector.
    ctx["labels_etcd_snapshot"] = labels(input.key, "etcd-snapshot").0;
    let policy = serde_yaml::to_string(&syncer_policy(input.plan, input.settings))
        .expect("a policy always serializes");
    ctx["syncer_policy_digest"] = json!(digest(&policy));
    ctx["syncer_policy"] = json!(policy);
    ctx["revocation_match_condition"] = json!(vcp_core::revocation::MATCH_CONDITION);
    ctx["revocation_authorizer_url"] = json!(vcp_core::revocation::authorizer_url());
    ctx["revocation_authorizer_listen"] = json!(vcp_core::revocation::AUTHORIZER_LISTEN);
    ctx["egress_dir"] = json!(vcp_core::revocation::EGRESS_DIR);
    ctx["egress_socket"] = json!(vcp_core::revocation::egress_socket());
    ctx["revocation_configmap"] = json!(vcp_core::revocation::CONFIGMAP);
    ctx["revocation_key"] = json!(vcp_core::revocation::KEY);
    ctx["encryption_secret"] = json!(encryption::SECRET);
    ctx["encryption_file"] = json!(encryption::FILE);
    // The audit webhook, when vcp collects audit logs and the plan keeps one: the Secret vcp
    // writes, and the one target the authorizer's relay dials from the pod.
    ctx["audit"] = match (&input.settings.audit_url, input.plan.audit.enabled()) {
        (Some(url), true) => json!({
            "secret": audit::SECRET,
            "policy_file": audit::POLICY_FILE,
            "webhook_file": audit::WEBHOOK_FILE,
            "ingest": audit::authority(url),
            "ingest_port": audit::authority(url)
                .and_then(|a| a.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok())),
        }),
        _ => Value::Null,
    };
    // Resources default to nothing per component, so templates can always index them.
    for c in [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "coredns",
        "vcp-syncer",
        "vcp-authorizer",
    ] {
        if ctx["plan"]["resources"].get(c).is_none() {
            ctx["plan"]["resources"][c] = json!({});
        }
    }
    // The plan's tuning as each component's extra flags and environment (empty lists when
    // the plan tunes nothing, so templates can always loop over them).
    for c in tuning::GO_COMPONENTS {
        ctx["tuning_args"][c] = json!(input.plan.tuning.args(c));
        ctx["tuning_env"][c] = json!(input.plan.tuning.env(c));
    }
    ctx["dns_cache_seconds"] = json!(input.plan.tuning.dns_cache_seconds());
    ctx["controllers"] = json!(input.plan.tuning.controllers());
    let server = format!("https://kube-apiserver.{ns}.svc:6443");
    for (c, dir) in [
        ("controller_manager", "/etc/kubernetes/pki/client"),
        ("coredns", "/etc/coredns-pki"),
        ("syncer", "/etc/vcp/pki"),
    ] {
        ctx[format!("kubeconfig_{c}")] = json!(kubeconfig::in_cluster(&server, dir));
    }
    ctx
}

/// A short SHA-256 of a rendered input, for pod annotations that roll a component when it changes.
fn digest(text: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(text.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn parse_objects(template: &str, text: &str, namespace: &str, key: &str) -> Result<Vec<Object>> {
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let v = Value::deserialize(doc).map_err(|e| RenderError::Yaml {
            template: template.to_owned(),
            message: e.to_string(),
        })?;
        if v.is_null() {
            continue;
        }
        let o = Object(v);
        let shape = |field| RenderError::Shape {
            template: template.to_owned(),
            field,
        };
        if o.api_version().is_empty() {
            return Err(shape("apiVersion"));
        }
        if o.kind().is_empty() {
            return Err(shape("kind"));
        }
        if o.name().is_empty() {
            return Err(shape("metadata.name"));
        }
        // A template may not reach into other namespaces; cluster-scoped objects carry the key
        // in their name so two tenants' objects never meet.
        let ok = match o.namespace() {
            Some(ns) => ns == namespace,
            None => o.name().ends_with(&format!("-{key}")),
        };
        if !ok {
            return Err(RenderError::Escape {
                template: template.to_owned(),
                object: format!("{}/{}", o.kind(), o.name()),
                namespace: namespace.to_owned(),
            });
        }
        out.push(o);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
