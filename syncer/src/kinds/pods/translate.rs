//! Pods: the tenant's pod runs on the host; its status flows back.
//!
//! Down (tenant -> host), beyond the common metadata rules:
//! - `automountServiceAccountToken: false` and `enableServiceLinks: false`: a host token or host
//!   service variables would point the workload at the host. The tenant's own token volume
//!   (the projected `kube-api-access-*` volume) keeps its name and mount but reads from a host
//!   Secret ([`crate::naming::token_secret_name`]) holding a token the *tenant* apiserver issued for
//!   this pod, the tenant CA and the namespace; a host kubelet would otherwise fill it with a
//!   host token.
//! - `serviceAccountName` and scheduling gates refer to tenant objects the host does not have
//!   and are dropped (the service account's name stays readable by the downward API, through an
//!   annotation). Placement, affinity, priority and runtime classes are confined by the tenant's
//!   policy ([`vcp_policy::placement`]): a node the tenant named itself is required by
//!   affinity, and the syncer binds the host pod to it at creation only when that node is in
//!   the plan's pool (`bind_in_pool`); otherwise the host scheduler binds within the pool. Downward-API references read the tenant's values, and
//!   ephemeral volumes' claim templates are translated like claims.
//! - Every (init, ephemeral) container gets the full set of `KUBERNETES_*` variables a kubelet
//!   derives from the `kubernetes` Service ([`kubernetes_env`]), pointing at the tenant
//!   apiserver's host Service: the host kubelet injects the host's even with service links off,
//!   and only explicit env overrides them. The tenant's own values of those names are dropped.
//!   `kubernetes.default.svc` names resolve there through hostAliases.
//! - DNS: `dnsPolicy: None` with the tenant CoreDNS Service as nameserver and the tenant's
//!   search path, so names resolve in the tenant's world.
//! - Service links: the host pod never gets the host's (`enableServiceLinks: false`); unless the
//!   tenant pod opted out, it carries the variables a kubelet would derive from the *tenant's*
//!   Services in its namespace ([`service_links`], [`add_service_links`]), placed before the
//!   container's own `env` (so `$(VAR)` references to them still expand) and skipped where the
//!   container defines the name itself (env and envFrom win, as with a kubelet). Like a
//!   kubelet, they are fixed when the pod is created: env cannot change on a running pod.
//! - ConfigMap, Secret and PVC references keep their names: the objects are synced into the
//!   same host namespace under the same names.
//! - `podCertificate` projected sources name vcp's signer for the tenant's
//!   ([`crate::naming::host_pod_signer`]): the host kubelet's request is relayed to the tenant,
//!   whose signer answers it ([`crate::kinds::podcerts`]).
//! - `clusterTrustBundle` projected sources become keys of one host ConfigMap per pod
//!   ([`crate::naming::trust_bundles_name`]), which the syncer fills from the *tenant's*
//!   ClusterTrustBundles ([`trust_bundle_content`]); a host kubelet would read the host's.
//!
//! Up (host -> tenant): the status (phase, conditions, IPs, container statuses, start time,
//! reason, message) is copied verbatim; the node binding is done separately (a Binding on the
//! tenant pod, to the virtual node named after the host node).

use crate::tenant::{Ctx, PodEnv};
use k8s_openapi::api::certificates::v1::ClusterTrustBundle;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::core::v1::{
    ClusterTrustBundleProjection, ConfigMapProjection, Container, EnvVar, EphemeralContainer,
    HostAlias, KeyToPath, Pod, PodCondition, PodDNSConfig, PodDNSConfigOption, PodSpec, PodStatus,
    ProjectedVolumeSource, ResourceRequirements, SecretProjection, Volume, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet};
use vcp_core::host_pod::{HostContainer, HostPod};
use vcp_core::naming;
use vcp_core::naming::host_meta;
use vcp_policy::{self as policy, placement};

/// Keys of the host token Secret, as the projected volume lays them out.
pub const TOKEN_KEYS: [&str; 3] = ["token", "ca.crt", "namespace"];

/// The token request a pod's volumes need: (audience, expiration seconds), if any.
pub fn token_request(pod: &Pod) -> Option<(Option<String>, i64)> {
    pod.spec
        .as_ref()?
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.projected.as_ref())
        .flat_map(|p| p.sources.iter().flatten())
        .find_map(|s| {
            let t = s.service_account_token.as_ref()?;
            Some((t.audience.clone(), t.expiration_seconds.unwrap_or(3607)))
        })
}

fn host_token_volume(v: &Volume, secret: &str) -> Volume {
    Volume {
        name: v.name.clone(),
        projected: Some(ProjectedVolumeSource {
            default_mode: v.projected.as_ref().and_then(|p| p.default_mode),
            sources: Some(vec![VolumeProjection {
                secret: Some(SecretProjection {
                    name: secret.to_owned(),
                    items: Some(
                        TOKEN_KEYS
                            .iter()
                            .map(|k| KeyToPath {
                                key: (*k).into(),
                                path: (*k).into(),
                                ..Default::default()
                            })
                            .collect(),
                    ),
                    optional: Some(false),
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The key of projected source `j` of volume `i` in the pod's trust-bundle ConfigMap.
fn trust_bundle_key(i: usize, j: usize) -> String {
    format!("ctb-{i}-{j}")
}

/// The pod's `clusterTrustBundle` projected sources, each with its key in the host ConfigMap
/// [`crate::naming::trust_bundles_name`].
pub fn trust_bundle_sources(pod: &Pod) -> Vec<(String, ClusterTrustBundleProjection)> {
    let mut out = Vec::new();
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    for (i, v) in volumes.enumerate() {
        let sources = v.projected.iter().flat_map(|p| p.sources.iter().flatten());
        for (j, src) in sources.enumerate() {
            if let Some(b) = &src.cluster_trust_bundle {
                out.push((trust_bundle_key(i, j), b.clone()));
            }
        }
    }
    out
}

/// What a `clusterTrustBundle` source reads from the tenant's bundles, as a kubelet reads the
/// cluster's: by `name`, that bundle's PEM; by `signerName`, every certificate of the bundles
/// of that signer whose labels `labelSelector` selects (no selector selects none, an empty one
/// all), each once, in the order of the bundles' names. `None` when nothing matched.
pub fn trust_bundle_content(
    src: &ClusterTrustBundleProjection,
    bundles: &[ClusterTrustBundle],
) -> Option<String> {
    if let Some(name) = &src.name {
        return bundles
            .iter()
            .find(|b| b.metadata.name.as_deref() == Some(name))
            .map(|b| b.spec.trust_bundle.clone());
    }
    let signer = src.signer_name.as_deref()?;
    let selector = src.label_selector.as_ref()?;
    let mut chosen: Vec<&ClusterTrustBundle> = bundles
        .iter()
        .filter(|b| b.spec.signer_name.as_deref() == Some(signer))
        .filter(|b| policy::network::selects(selector, b.labels()))
        .collect();
    chosen.sort_by_key(|b| b.metadata.name.clone());
    let mut seen = BTreeSet::new();
    let mut out = String::new();
    for block in chosen.iter().flat_map(|b| pem_blocks(&b.spec.trust_bundle)) {
        if seen.insert(block.clone()) {
            out.push_str(&block);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The PEM blocks of `text`, each with its BEGIN and END lines and a final newline; anything
/// between blocks is left out, as a kubelet re-encodes the blocks it parsed.
fn pem_blocks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut block: Option<String> = None;
    for line in text.lines().map(str::trim_end) {
        if line.starts_with("-----BEGIN ") {
            block = Some(String::new());
        }
        if let Some(b) = block.as_mut() {
            b.push_str(line);
            b.push('\n');
            if line.starts_with("-----END ") {
                out.extend(block.take());
            }
        }
    }
    out
}

/// A `clusterTrustBundle` source as the host pod reads it: key `key` of the pod's
/// trust-bundle ConfigMap, at the source's path. Never optional on the host: the syncer writes
/// an empty key for an optional source that matched nothing, and leaves the key out for a
/// required one, so the kubelet holds the pod back exactly when a tenant kubelet would.
fn host_trust_bundle_source(
    configmap: &str,
    key: String,
    src: &ClusterTrustBundleProjection,
) -> VolumeProjection {
    VolumeProjection {
        config_map: Some(ConfigMapProjection {
            name: configmap.to_owned(),
            items: Some(vec![KeyToPath {
                key,
                path: src.path.clone(),
                ..Default::default()
            }]),
            optional: Some(false),
        }),
        ..Default::default()
    }
}

fn is_token_volume(v: &k8s_openapi::api::core::v1::Volume) -> bool {
    v.projected.as_ref().is_some_and(|p| {
        p.sources
            .iter()
            .flatten()
            .any(|s| s.service_account_token.is_some())
    })
}

/// Port of the `kubernetes` Service of every apiserver (kube-apiserver hard-codes 443, named
/// `https`). Kubelets name the `KUBERNETES_PORT_443_TCP*` variables after it: the host's
/// kubelet for the host's Service, and a tenant kubelet would for the tenant's.
const KUBERNETES_SERVICE_PORT: i32 = 443;

/// `ip:port` as in a URL: IPv6 addresses are bracketed, as Go's JoinHostPort does.
fn join_host_port(ip: &str, port: i32) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// The `KUBERNETES_*` variables of a container on the host: every name a kubelet derives from
/// the `kubernetes` Service (it does so even with `enableServiceLinks: false`), with values
/// pointing at the tenant apiserver's host Service `ip:port`. The host kubelet injects the same
/// names for the host apiserver, but explicit container env wins over kubelet-injected service
/// env, so setting all of them leaves none of the host's values visible.
pub fn kubernetes_env(ip: &str, port: i32) -> Vec<EnvVar> {
    let url = format!("tcp://{}", join_host_port(ip, port));
    let pp = format!("KUBERNETES_PORT_{KUBERNETES_SERVICE_PORT}_TCP");
    [
        ("KUBERNETES_SERVICE_HOST".to_owned(), ip.to_owned()),
        ("KUBERNETES_SERVICE_PORT".to_owned(), port.to_string()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".to_owned(), port.to_string()),
        ("KUBERNETES_PORT".to_owned(), url.clone()),
        (pp.clone(), url),
        (format!("{pp}_PROTO"), "tcp".to_owned()),
        (format!("{pp}_PORT"), port.to_string()),
        (format!("{pp}_ADDR"), ip.to_owned()),
    ]
    .into_iter()
    .map(|(name, value)| EnvVar {
        name,
        value: Some(value),
        ..Default::default()
    })
    .collect()
}

/// Puts `vars` first in `env`, dropping the container's own variables of those names: a
/// tenant may not point its workload at another apiserver by forging them, and first is where
/// `$(VAR)` references in the rest of `env` can expand them.
fn set_kubernetes_env(env: &mut Option<Vec<EnvVar>>, vars: &[EnvVar]) {
    let own = env.take().unwrap_or_default();
    let mut merged = vars.to_vec();
    merged.extend(
        own.into_iter()
            .filter(|e| !vars.iter().any(|v| v.name == e.name)),
    );
    *env = Some(merged);
}

fn rewrite_container(c: &mut Container, dropped: &[String], kube_env: &[EnvVar]) {
    if let Some(mounts) = &mut c.volume_mounts {
        mounts.retain(|m| !dropped.contains(&m.name));
    }
    if !kube_env.is_empty() {
        set_kubernetes_env(&mut c.env, kube_env);
    }
}

/// The host pod for a tenant pod.
pub fn to_host(pod: &Pod, ctx: &Ctx, env: &PodEnv) -> Pod {
    to_host_noting(pod, ctx, env).0
}

/// [`to_host`], and what placement changed of what the tenant asked for (one sentence each,
/// told to the tenant once the host pod exists).
pub fn to_host_noting(pod: &Pod, ctx: &Ctx, env: &PodEnv) -> (Pod, Vec<String>) {
    let mut spec: PodSpec = pod.spec.clone().unwrap_or_default();
    let secret = crate::naming::token_secret_name(&pod.uid().unwrap_or_default());
    let bundles = crate::naming::trust_bundles_name(&pod.uid().unwrap_or_default());
    for (i, v) in spec.volumes.iter_mut().flatten().enumerate() {
        if is_token_volume(v) {
            *v = host_token_volume(v, &secret);
            continue;
        }
        let sources = v
            .projected
            .iter_mut()
            .flat_map(|p| p.sources.iter_mut().flatten());
        for (j, src) in sources.enumerate() {
            if let Some(b) = src.cluster_trust_bundle.take() {
                *src = host_trust_bundle_source(&bundles, trust_bundle_key(i, j), &b);
            }
            // The host kubelet asks vcp's signer, which the syncer relays to the tenant's.
            if let Some(c) = src.pod_certificate.as_mut() {
                c.signer_name = crate::naming::host_pod_signer(ctx.key.as_str(), &c.signer_name);
            }
        }
    }
    let dropped: Vec<String> = Vec::new();
    let kube_env = env
        .apiserver
        .as_ref()
        .map(|(ip, port)| kubernetes_env(ip, *port))
        .unwrap_or_default();
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        rewrite_container(c, &dropped, &kube_env);
    }
    for c in spec.ephemeral_containers.iter_mut().flatten() {
        if let Some(m) = &mut c.volume_mounts {
            m.retain(|m| !dropped.contains(&m.name));
        }
        if !kube_env.is_empty() {
            set_kubernetes_env(&mut c.env, &kube_env);
        }
    }
    spec.automount_service_account_token = Some(false);
    spec.enable_service_links = Some(false);
    let service_account = spec.service_account_name.take();
    #[allow(deprecated)] // the deprecated alias must go too, or the host defaults from it
    {
        spec.service_account = None;
    }
    spec.scheduling_gates = None;
    // Placement, affinity and classes: confined to the plan's pool and the tenant's own pods
    // (what it asked for and did not get, such as dropped tolerations, node selector keys the
    // pool overrides or unmapped priority classes, is returned beside the pod and told: the
    // pod still runs).
    let policy = &ctx.policy;
    let notes = placement::confine(&mut spec, &ctx.key, &policy.placement, &policy.scheduling);
    policy::pods::downward_to_tenant_view(&mut spec);
    // What the tenant-wide quota counted for containers that set no resources (the host's
    // LimitRange would fill in the same; written here so the two never disagree).
    policy::quota::fill_defaults(&mut spec, &policy.quota.limits);
    for v in spec.volumes.iter_mut().flatten() {
        let template = v
            .ephemeral
            .as_mut()
            .and_then(|e| e.volume_claim_template.as_mut());
        if let Some(t) = template {
            crate::kinds::pvcs::translate::claim_spec_to_host(&mut t.spec, &ctx.key, None);
            t.metadata = t.metadata.take().map(|m| ObjectMeta {
                labels: m.labels.as_ref().map(naming::map_to_host),
                annotations: m.annotations.as_ref().map(naming::map_to_host),
                ..Default::default()
            });
        }
    }
    if let Some((ip, _)) = &env.apiserver {
        let domain = &env.cluster_domain;
        let aliases = spec.host_aliases.get_or_insert_with(Vec::new);
        aliases.push(HostAlias {
            ip: ip.clone(),
            hostnames: Some(vec![
                "kubernetes".into(),
                "kubernetes.default".into(),
                "kubernetes.default.svc".into(),
                format!("kubernetes.default.svc.{domain}"),
            ]),
        });
    }
    let host_network = spec.host_network == Some(true);
    if let (Some(dns), false) = (&env.dns, host_network) {
        let ns = pod.namespace().unwrap_or_default();
        let domain = &env.cluster_domain;
        // The tenant's own dnsConfig options and extra searches come after ours, as with ClusterFirst.
        let mut searches = vec![
            format!("{ns}.svc.{domain}"),
            format!("svc.{domain}"),
            domain.clone(),
        ];
        let mut options = vec![PodDNSConfigOption {
            name: Some("ndots".into()),
            value: Some("5".into()),
        }];
        let mut nameservers = vec![dns.clone()];
        if spec.dns_policy.as_deref() == Some("None") {
            // The tenant chose its DNS entirely; keep it.
            searches.clear();
            options.clear();
            nameservers.clear();
        }
        if let Some(own) = &spec.dns_config {
            searches.extend(own.searches.iter().flatten().cloned());
            options.extend(own.options.iter().flatten().cloned());
            nameservers.extend(own.nameservers.iter().flatten().cloned());
        }
        spec.dns_policy = Some("None".into());
        spec.dns_config = Some(PodDNSConfig {
            nameservers: Some(nameservers),
            searches: Some(searches),
            options: Some(options),
        });
    }
    let mut metadata = host_meta(&pod.metadata, &ctx.key);
    // The pod's own name in its /etc/hosts, spelled with the tenant's namespace.
    if let Some(image) = &env.etc_hosts_image {
        crate::etc_hosts::add(
            &mut spec,
            image,
            metadata.namespace.as_deref().unwrap_or_default(),
            &pod.namespace().unwrap_or_default(),
            &env.cluster_domain,
        );
    }
    // The downward API reads the tenant's service account here (the host pod has none).
    metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            policy::pods::ANN_SERVICE_ACCOUNT.into(),
            service_account.unwrap_or_else(|| "default".into()),
        );
    let host = Pod {
        metadata,
        spec: Some(spec),
        status: None,
    };
    (host, notes)
}

/// A Service name or port name as a kubelet spells it in a variable name.
fn env_name(s: &str) -> String {
    s.to_ascii_uppercase().replace('-', "_")
}

/// The service-link variables a kubelet derives from `services` (the tenant Services in the
/// pod's namespace), sorted by Service name. Services without a ClusterIP (headless, or not
/// allocated yet) have none; the tenant apiserver's own Service never counts (its address on
/// the host is the host apiserver; `KUBERNETES_*` come from [`kubernetes_env`]).
pub fn service_links<'a>(services: impl IntoIterator<Item = &'a Service>) -> Vec<EnvVar> {
    let mut services: Vec<&Service> = services
        .into_iter()
        .filter(|s| !vcp_policy::services::is_local_service(s))
        .collect();
    services.sort_by_key(|s| s.metadata.name.clone());
    let var = |name: String, value: String| EnvVar {
        name,
        value: Some(value),
        ..Default::default()
    };
    let mut vars = Vec::new();
    for svc in services {
        let Some(spec) = &svc.spec else { continue };
        let ip = match spec.cluster_ip.as_deref() {
            Some(ip) if !ip.is_empty() && ip != "None" => ip,
            _ => continue,
        };
        let prefix = env_name(&svc.name_any());
        let ports = spec.ports.as_deref().unwrap_or_default();
        vars.push(var(format!("{prefix}_SERVICE_HOST"), ip.to_owned()));
        if let Some(first) = ports.first() {
            vars.push(var(
                format!("{prefix}_SERVICE_PORT"),
                first.port.to_string(),
            ));
        }
        for p in ports {
            if let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) {
                vars.push(var(
                    format!("{prefix}_SERVICE_PORT_{}", env_name(n)),
                    p.port.to_string(),
                ));
            }
        }
        for (i, p) in ports.iter().enumerate() {
            let proto = p.protocol.as_deref().unwrap_or("TCP");
            let url = format!(
                "{}://{}",
                proto.to_ascii_lowercase(),
                join_host_port(ip, p.port)
            );
            if i == 0 {
                vars.push(var(format!("{prefix}_PORT"), url.clone()));
            }
            let pp = format!("{prefix}_PORT_{}_{}", p.port, proto.to_ascii_uppercase());
            vars.push(var(pp.clone(), url));
            vars.push(var(format!("{pp}_PROTO"), proto.to_ascii_lowercase()));
            vars.push(var(format!("{pp}_PORT"), p.port.to_string()));
            vars.push(var(format!("{pp}_ADDR"), ip.to_owned()));
        }
    }
    vars
}

/// Whether a tenant pod gets service links (`enableServiceLinks` defaults to true).
pub fn wants_service_links(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.enable_service_links) != Some(false)
}

/// Keys of the ConfigMaps (`false`) and Secrets (`true`) a pod's envFrom reads, by name: the
/// variables they define win over service links.
pub type EnvFromKeys = BTreeMap<(bool, String), BTreeSet<String>>;

/// Puts `links` in front of every (init) container's env of `host`, except names the container
/// defines itself through env or envFrom.
pub fn add_service_links(host: &mut Pod, links: &[EnvVar], env_from: &EnvFromKeys) {
    if links.is_empty() {
        return;
    }
    let Some(spec) = &mut host.spec else { return };
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        let mut own: BTreeSet<String> = c.env.iter().flatten().map(|e| e.name.clone()).collect();
        for f in c.env_from.iter().flatten() {
            let prefix = f.prefix.as_deref().unwrap_or_default();
            let source = match (&f.config_map_ref, &f.secret_ref) {
                (Some(cm), _) => Some((false, cm.name.clone())),
                (_, Some(s)) => Some((true, s.name.clone())),
                _ => None,
            };
            let keys = source.and_then(|s| env_from.get(&s));
            own.extend(keys.into_iter().flatten().map(|k| format!("{prefix}{k}")));
        }
        let mut vars: Vec<EnvVar> = links
            .iter()
            .filter(|v| !own.contains(&v.name))
            .cloned()
            .collect();
        vars.extend(c.env.take().unwrap_or_default());
        c.env = Some(vars);
    }
}

/// Gives `desired` the placement host pod `host` was created with (node selector,
/// affinity, runtime class and node). It is settled at creation: a pod's affinity and selector cannot change, and
/// the tenant pod only names its node (which pins a new host pod) once the syncer bound it to
/// where the host scheduler had put it.
pub fn keep_host_placement(desired: &mut Pod, host: &Pod) {
    let (Some(ds), Some(hs)) = (&mut desired.spec, &host.spec) else {
        return;
    };
    ds.node_selector = hs.node_selector.clone();
    ds.affinity = hs.affinity.clone();
    // Set at creation for a pod the tenant bound to a pool node (`bind_in_pool`); an apply
    // without it would ask to unbind the pod.
    ds.node_name = hs.node_name.clone();
    // Chosen at creation from the tenant class's handler (immutable, like the rest).
    ds.runtime_class_name = hs.runtime_class_name.clone();
}

/// `desired` with each container's env and resources as `host` has them, and the syncer's
/// hosts file as `host` has it or not ([`crate::etc_hosts`]): all are immutable
/// on a pod (resources but through the resize subresource), and what the host pod was created
/// with (service links of that moment, the plan's container defaults of that moment) stays
/// valid for its life.
pub fn keep_host_env(desired: &mut Pod, host: &Pod) {
    let Some(hs) = &host.spec else { return };
    let Some(ds) = &mut desired.spec else { return };
    let find = |cs: &[Container], name: &str| {
        cs.iter()
            .find(|c| c.name == name)
            .map(|c| (c.env.clone(), c.resources.clone()))
    };
    for c in &mut ds.containers {
        if let Some((env, resources)) = find(&hs.containers, &c.name) {
            c.env = env;
            c.resources = resources;
        }
    }
    let host_init = hs.init_containers.as_deref().unwrap_or_default();
    for c in ds.init_containers.iter_mut().flatten() {
        if let Some((env, resources)) = find(host_init, &c.name) {
            c.env = env;
            c.resources = resources;
        }
    }
    // The syncer's hosts file as the host pod was created with it, or none (a pod created
    // before it existed, or by a syncer without its image): a pod's containers, volumes and
    // mounts cannot change.
    let own = host_init
        .iter()
        .find(|c| crate::etc_hosts::hidden(&c.name))
        .cloned();
    crate::etc_hosts::remove(ds);
    if let Some(c) = own {
        crate::etc_hosts::attach(ds, c);
    }
}

/// Whether two resource requirements ask for the same, by value: the host writes quantities in
/// canonical form (`1000m` comes back as `1`), so text alone would see a resize on every pass.
fn same_resources(a: Option<&ResourceRequirements>, b: Option<&ResourceRequirements>) -> bool {
    type Map = BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>;
    let same_map = |a: Option<&Map>, b: Option<&Map>| {
        let (a, b) = (a.filter(|m| !m.is_empty()), b.filter(|m| !m.is_empty()));
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                a.len() == b.len()
                    && a.iter().all(|(k, q)| {
                        b.get(k).is_some_and(|r| {
                            // Same text is the common case; only different text is parsed.
                            q.0 == r.0
                                || match (
                                    policy::quota::parse_quantity(&q.0),
                                    policy::quota::parse_quantity(&r.0),
                                ) {
                                    (Ok(x), Ok(y)) => x == y,
                                    _ => q.0 == r.0,
                                }
                        })
                    })
            }
            _ => false,
        }
    };
    same_map(
        a.and_then(|r| r.requests.as_ref()),
        b.and_then(|r| r.requests.as_ref()),
    ) && same_map(
        a.and_then(|r| r.limits.as_ref()),
        b.and_then(|r| r.limits.as_ref()),
    )
}

/// A resize to pass down: the resources each host container (init or not, by name) should
/// run, where that differs from what it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Resize(Vec<(bool, String, Option<ResourceRequirements>)>);

impl Resize {
    /// Host pod `host`, read whole from the host, with the resize applied: the body of a PUT
    /// to its `resize` subresource (its resource version guards against a change since).
    pub fn body(&self, host: &Pod) -> Pod {
        let mut body = host.clone();
        if let Some(spec) = body.spec.as_mut() {
            for (init, name, want) in &self.0 {
                let containers = if *init {
                    spec.init_containers.as_deref_mut().unwrap_or_default()
                } else {
                    &mut spec.containers[..]
                };
                if let Some(c) = containers.iter_mut().find(|c| c.name == *name) {
                    c.resources = want.clone();
                }
            }
        }
        body
    }
}

/// A resize the tenant made that host pod `host` does not run yet: each container's (and init
/// container's) resources as `desired` has them, to apply to the whole host pod
/// ([`Resize::body`]). `None` when every container runs what the tenant asked for. Only a
/// container of both pods is compared: the container set of a pod cannot change.
///
/// What tenant pod `tenant` leaves unset keeps the plan default the host pod was created with
/// (`desired` has today's): a plan whose defaults changed resizes no running pod. A default
/// limit below a raised request rises with it, as at creation.
pub fn resized(tenant: &Pod, desired: &Pod, host: &HostPod) -> Option<Resize> {
    let (Some(ts), Some(ds), Some(hs)) = (&tenant.spec, &desired.spec, &host.spec) else {
        return None;
    };
    // What each host container should run, where that differs from what it runs. Worked out
    // on every pass; the whole host pod is read only for an actual resize.
    let mut changes: Vec<(bool, String, Option<ResourceRequirements>)> = Vec::new();
    let mut look = |init: bool, hcs: &[HostContainer], dcs: &[Container], tcs: &[Container]| {
        for hc in hcs {
            let Some(dc) = dcs.iter().find(|d| d.name == hc.name) else {
                continue;
            };
            // The syncer's own init container runs once and is never resized.
            if crate::etc_hosts::hidden(&hc.name) {
                continue;
            }
            // Quick path: the tenant's container as the host runs it.
            if same_resources(dc.resources.as_ref(), hc.resources.as_ref()) {
                continue;
            }
            let set = tcs
                .iter()
                .find(|t| t.name == hc.name)
                .and_then(|t| t.resources.as_ref());
            let want = keep_host_defaults(dc.resources.clone(), set, hc.resources.as_ref());
            if !same_resources(want.as_ref(), hc.resources.as_ref()) {
                changes.push((init, hc.name.clone(), want));
            }
        }
    };
    look(false, &hs.containers, &ds.containers, &ts.containers);
    look(
        true,
        hs.init_containers.as_deref().unwrap_or_default(),
        ds.init_containers.as_deref().unwrap_or_default(),
        ts.init_containers.as_deref().unwrap_or_default(),
    );
    (!changes.is_empty()).then_some(Resize(changes))
}

/// `want` (the tenant's resources with today's plan defaults) with each value the tenant did
/// not set (`set`) as the host container has it (`host`), and a kept default limit raised to
/// the request where the request passed it.
fn keep_host_defaults(
    want: Option<ResourceRequirements>,
    set: Option<&ResourceRequirements>,
    host: Option<&ResourceRequirements>,
) -> Option<ResourceRequirements> {
    let mut want = want?;
    let tenant_set = |limits: bool, r: &str| {
        set.and_then(|s| {
            if limits {
                s.limits.as_ref()
            } else {
                s.requests.as_ref()
            }
        })
        .is_some_and(|m| m.contains_key(r))
    };
    let host_value = |limits: bool, r: &str| {
        host.and_then(|h| {
            if limits {
                h.limits.as_ref()
            } else {
                h.requests.as_ref()
            }
        })
        .and_then(|m| m.get(r))
        .cloned()
    };
    for limits in [false, true] {
        let map = if limits {
            want.limits.as_mut()
        } else {
            want.requests.as_mut()
        };
        for (r, q) in map.into_iter().flatten() {
            if !tenant_set(limits, r)
                && let Some(h) = host_value(limits, r)
            {
                *q = h;
            }
        }
    }
    let requests = want.requests.clone().unwrap_or_default();
    for (r, q) in want.limits.iter_mut().flatten() {
        let above = requests.get(r).is_some_and(|req| {
            matches!(
                (policy::quota::parse_quantity(&req.0), policy::quota::parse_quantity(&q.0)),
                (Ok(req), Ok(lim)) if req > lim
            )
        });
        if above && !tenant_set(true, r) {
            *q = requests[r].clone();
        }
    }
    Some(want)
}

/// Ephemeral containers the tenant added (`kubectl debug`) that host pod `host` lacks, as
/// `desired` translated them ([`with_ephemeral`] appends them). `None` when the host has them
/// all. Ephemeral containers are only ever added, never changed or removed, so names tell
/// which are new.
pub fn ephemeral_added(desired: &Pod, host: &HostPod) -> Option<Vec<EphemeralContainer>> {
    let want = desired.spec.as_ref()?.ephemeral_containers.as_deref()?;
    let have = host
        .spec
        .as_ref()?
        .ephemeral_containers
        .as_deref()
        .unwrap_or_default();
    let new: Vec<_> = want
        .iter()
        .filter(|w| !have.iter().any(|h| h.name == w.name))
        .cloned()
        .collect();
    (!new.is_empty()).then_some(new)
}

/// Host pod `host`, read whole from the host, with ephemeral containers `new` appended: the
/// body of a PUT to its `ephemeralcontainers` subresource.
pub fn with_ephemeral(host: &Pod, new: Vec<EphemeralContainer>) -> Pod {
    let mut body = host.clone();
    if let Some(spec) = body.spec.as_mut() {
        spec.ephemeral_containers
            .get_or_insert_with(Vec::new)
            .extend(new);
    }
    body
}

/// Whether going from host pod `host` to `resized` asks the host for more of any resource the
/// quota counts (requests or limits of CPU or memory): only such a resize needs the quota's
/// leave; a smaller one always goes down.
pub fn resize_grows(host: &Pod, resized: &Pod, limits: &policy::quota::Limits) -> bool {
    let amounts = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| policy::quota::effective_resources(s, limits).ok())
    };
    match (amounts(host), amounts(resized)) {
        (Some((hr, hl)), Some((rr, rl))) => {
            rr.cpu > hr.cpu || rr.memory > hr.memory || rl.cpu > hl.cpu || rl.memory > hl.memory
        }
        // A quantity the quota cannot read: it must not slip through as a shrink.
        _ => true,
    }
}

/// The tenant status that mirrors a host pod's, or `None` if the tenant already shows it
/// (`tenant`: the tenant pod's status as it stands, see [`bound_status`]).
///
/// Conditions are compared without their timestamps. The tenant's binding makes the tenant
/// apiserver write its own `PodScheduled` condition, stamped a moment after the host's for the
/// same transition; a patch that only moved that stamp would cost a tenant write per pod and
/// tell no client anything. Any real change (phase, IPs, container states, a condition's status,
/// reason or message) is copied whole, host timestamps included.
///
/// `observed` is the generation the tenant status says was observed ([`observed_generation`]):
/// the host pod's generations count the host's spec changes, not the tenant's.
pub fn status_to_tenant(
    host: &HostPod,
    tenant: Option<&PodStatus>,
    observed: Option<i64>,
) -> Option<PodStatus> {
    let mut want = host.status.clone()?;
    want.observed_generation = observed;
    // The syncer's own init container, and its hosts file's mounts, are not the tenant's.
    if let Some(init) = want.init_container_statuses.as_mut() {
        init.retain(|c| !crate::etc_hosts::hidden(&c.name));
    }
    let statuses = want
        .container_statuses
        .iter_mut()
        .chain(want.init_container_statuses.iter_mut())
        .flatten();
    for c in statuses {
        if let Some(m) = c.volume_mounts.as_mut() {
            m.retain(|m| !crate::etc_hosts::hidden(&m.name));
        }
    }
    // The QoS class is the tenant apiserver's, fixed at creation from the tenant's spec: the
    // host pod may differ (the plan's container defaults make a BestEffort pod Burstable), and
    // the tenant refuses any change of it.
    want.qos_class = tenant.and_then(|t| t.qos_class.clone());
    // The tenant's own conditions (see [`tenant_condition`]) stand as the tenant holds them:
    // a status patch replaces the whole list, and without them each copy would erase what a
    // tenant controller wrote (its eviction's `DisruptionTarget`, which a Job's pod failure
    // policy reads; a readiness gate's condition). The host's copy of a readiness gate is the
    // syncer's own mirror, a step behind, and a host `DisruptionTarget` (the host evicted the
    // pod) shows while the tenant has none of its own.
    let own = tenant
        .into_iter()
        .flat_map(|t| t.conditions.iter().flatten())
        .filter(|c| tenant_condition(&c.type_));
    for c in own {
        let conditions = want.conditions.get_or_insert_with(Vec::new);
        match conditions.iter_mut().find(|h| h.type_ == c.type_) {
            Some(h) => *h = c.clone(),
            None => conditions.push(c.clone()),
        }
    }
    let shown = tenant.is_some_and(|have| same_status(have, &want));
    (!shown).then_some(want)
}

/// The pod condition types the host decides: those its kubelet keeps to itself (the
/// kubelet's own list, `PodConditionsByKubelet`, with the feature-gated two) and the
/// scheduler's `PodScheduled`. The tenant pod shows the host's.
const HOST_CONDITIONS: [&str; 8] = [
    "PodScheduled",
    "PodReadyToStartContainers",
    "Initialized",
    "ContainersReady",
    "Ready",
    "PodResizePending",
    "PodResizeInProgress",
    "AllContainersRestarting",
];

/// Whether a pod condition of type `type_` is the tenant's own: set by a controller of the
/// tenant (an eviction's `DisruptionTarget`, a readiness gate's condition, any custom type),
/// never decided by the host, so copying status up keeps the tenant's value.
pub fn tenant_condition(type_: &str) -> bool {
    !HOST_CONDITIONS.contains(&type_)
}

/// The readiness-gate conditions to write to host pod `host`'s status so that the host
/// kubelet, which decides `Ready`, sees what tenant pod `tenant` holds: each condition of the
/// tenant's that a gate of the host pod names (the gates are the tenant's, copied down with
/// the spec) and the host does not show as such yet. Only the tenant's own types
/// ([`tenant_condition`]): a gate naming `Ready` would otherwise let the tenant write what the
/// host's kubelet decides. A condition the tenant removed stays on the host: a gate's
/// condition is set and changed, not removed, by the controllers that own one.
pub fn gates_to_host(tenant: &Pod, host: &HostPod) -> Vec<PodCondition> {
    let gates = host
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_deref())
        .unwrap_or_default();
    if gates.is_empty() {
        return Vec::new();
    }
    let shown = host
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let same = |a: &PodCondition, b: &PodCondition| {
        a.type_ == b.type_ && a.status == b.status && a.reason == b.reason && a.message == b.message
    };
    tenant
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|c| tenant_condition(&c.type_))
        .filter(|c| gates.iter().any(|g| g.condition_type == c.type_))
        .filter(|c| !shown.iter().any(|h| same(h, c)))
        .cloned()
        .collect()
}

/// What tenant pod `tenant` is told about its readiness gates that name a condition the host
/// decides ([`tenant_condition`] is false: `Ready`, `PodScheduled`, ...): the syncer never
/// writes the tenant's value of those to the host pod, so such a gate is met or not as the
/// host's own condition says. `None` when no gate names one.
pub fn host_decided_gates(tenant: &Pod) -> Option<String> {
    let named: Vec<&str> = tenant
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|g| g.condition_type.as_str())
        .filter(|t| !tenant_condition(t))
        .collect();
    (!named.is_empty()).then(|| {
        format!(
            "readiness gates on {} name conditions the host's kubelet and scheduler decide; the syncer copies the host's value of them and never writes the pod's own",
            named.join(", ")
        )
    })
}

/// The status a tenant pod gets when it is being deleted and its host pod is already gone
/// before a terminal phase reached it: `Failed`, as a kubelet ends a pod it stopped, with the
/// rest of what the tenant shows kept. `None` when the phase is terminal already.
pub fn terminal_status(shown: Option<&PodStatus>) -> Option<PodStatus> {
    let phase = shown.and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Failed" | "Succeeded")) {
        return None;
    }
    let mut status = shown.cloned().unwrap_or_default();
    status.phase = Some("Failed".into());
    Some(status)
}

/// The `observedGeneration` tenant pod `tenant` shows: its own generation once host pod `host`
/// runs all of it (`in_sync`: nothing of the tenant's spec waits to go down, no resize
/// included) and the host's kubelet observed the host pod's latest generation; until then
/// what it showed before. A client waiting for a change (the resize tests do) so sees it
/// observed only once the host acted on it.
pub fn observed_generation(host: &HostPod, tenant: &Pod, in_sync: bool) -> Option<i64> {
    let host_caught_up = match (
        host.metadata.generation,
        host.status.as_ref().and_then(|s| s.observed_generation),
    ) {
        (Some(g), Some(o)) => o >= g,
        _ => false,
    };
    if in_sync && host_caught_up {
        tenant.metadata.generation
    } else {
        tenant.status.as_ref().and_then(|s| s.observed_generation)
    }
}

/// Whether two pod statuses say the same, condition timestamps aside (see [`status_to_tenant`]).
pub fn same_status(a: &PodStatus, b: &PodStatus) -> bool {
    without_condition_times(a) == without_condition_times(b)
}

fn without_condition_times(status: &PodStatus) -> PodStatus {
    let mut s = status.clone();
    for c in s.conditions.iter_mut().flatten() {
        c.last_probe_time = None;
        c.last_transition_time = None;
    }
    s
}

/// A tenant pod's status after a binding went through: the apiserver sets `PodScheduled` to
/// `True` (no reason, no message) as part of the binding.
pub fn bound_status(status: Option<&PodStatus>) -> PodStatus {
    let mut s = status.cloned().unwrap_or_default();
    let conditions = s.conditions.get_or_insert_with(Vec::new);
    let scheduled = PodCondition {
        type_: "PodScheduled".into(),
        status: "True".into(),
        ..Default::default()
    };
    match conditions.iter_mut().find(|c| c.type_ == "PodScheduled") {
        Some(c) => *c = scheduled,
        None => conditions.push(scheduled),
    }
    s
}

/// ConfigMaps and Secrets a tenant pod references (volumes, projections, env, envFrom, image
/// pull secrets), as (configmaps, secrets). The token volume's `kube-root-ca.crt` is not
/// listed: on the host that volume reads from the syncer's token Secret instead.
pub fn references(pod: &Pod) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut cms, mut secrets) = (BTreeSet::new(), BTreeSet::new());
    let Some(spec) = &pod.spec else {
        return (cms, secrets);
    };
    for v in spec.volumes.iter().flatten() {
        if is_token_volume(v) {
            continue;
        }
        if let Some(c) = &v.config_map {
            cms.insert(c.name.clone());
        }
        if let Some(s) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            secrets.insert(s);
        }
        for src in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(c) = &src.config_map {
                cms.insert(c.name.clone());
            }
            if let Some(s) = &src.secret {
                secrets.insert(s.name.clone());
            }
        }
    }
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for c in containers {
        for e in c.env.iter().flatten().filter_map(|e| e.value_from.as_ref()) {
            if let Some(r) = &e.config_map_key_ref {
                cms.insert(r.name.clone());
            }
            if let Some(r) = &e.secret_key_ref {
                secrets.insert(r.name.clone());
            }
        }
        for f in c.env_from.iter().flatten() {
            if let Some(r) = &f.config_map_ref {
                cms.insert(r.name.clone());
            }
            if let Some(r) = &f.secret_ref {
                secrets.insert(r.name.clone());
            }
        }
    }
    for s in spec.image_pull_secrets.iter().flatten() {
        secrets.insert(s.name.clone());
    }
    (cms, secrets)
}

/// The host node a host pod runs on: the tenant pod is bound to the virtual node of that name.
pub fn host_node(host: &HostPod) -> Option<&str> {
    host.node_name()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host pod as the host cache holds it.
    pub(super) fn hp(p: &Pod) -> HostPod {
        HostPod::from(p)
    }

    /// The resize body `resized` leads to, applied to the whole host pod `host`.
    pub(super) fn resized_body(t: &Pod, desired: &Pod, host: &Pod) -> Option<Pod> {
        resized(t, desired, &hp(host)).map(|r| r.body(host))
    }

    /// The ephemeral-container body `ephemeral_added` leads to, on the whole host pod `host`.
    pub(super) fn ephemeral_body(desired: &Pod, host: &Pod) -> Option<Pod> {
        ephemeral_added(desired, &hp(host)).map(|new| with_ephemeral(host, new))
    }
    use crate::tenant::fixtures::ctx;
    use vcp_core::naming::LABEL_TENANT;

    /// The nodes a host pod's required affinity names, per term.
    fn pinned_to(p: &Pod) -> Vec<Vec<String>> {
        let terms = p
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref()?.node_affinity.as_ref())
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .map(|r| r.node_selector_terms.clone())
            .unwrap_or_default();
        terms
            .iter()
            .map(|t| {
                t.match_fields
                    .iter()
                    .flatten()
                    .filter(|f| f.key == "metadata.name" && f.operator == "In")
                    .flat_map(|f| f.values.clone().unwrap_or_default())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_node_the_tenant_chose_is_where_the_host_scheduler_must_place_the_pod() {
        let mut pod = tenant_pod();
        pod.spec.as_mut().unwrap().node_name = Some("kwok-node-1".into());
        let (host, notes) = to_host_noting(&pod, &ctx(), &PodEnv::default());
        assert!(!notes.iter().any(|n| n.contains("nodeName")), "{notes:?}");
        assert_eq!(
            host.spec.as_ref().unwrap().node_name,
            None,
            "the host scheduler binds"
        );
        let pins = pinned_to(&host);
        assert!(
            !pins.is_empty() && pins.iter().all(|p| p == &["kwok-node-1"]),
            "{pins:?}"
        );
        // Not bound: no node required.
        assert!(
            pinned_to(&to_host(&tenant_pod(), &ctx(), &env()))
                .iter()
                .all(Vec::is_empty)
        );
    }

    #[test]
    fn an_update_keeps_the_placement_the_host_pod_was_created_with() {
        // Created before the syncer bound the tenant pod: no pin. Once bound, the tenant pod
        // names a node and its host pod would be pinned; affinity cannot change on a pod.
        let mut created = to_host(&tenant_pod(), &ctx(), &env());
        // The host class picked by the tenant class's handler, not the tenant's class name.
        created.spec.as_mut().unwrap().runtime_class_name = Some("e2e-handler".into());
        // Bound on the host (by its scheduler, or at creation for a pool node the tenant named).
        created.spec.as_mut().unwrap().node_name = Some("kwok-node-1".into());
        let mut bound = tenant_pod();
        let spec = bound.spec.as_mut().unwrap();
        spec.node_name = Some("kwok-node-1".into());
        spec.runtime_class_name = Some("runtimeclass-x7k2".into());
        let mut desired = to_host(&bound, &ctx(), &env());
        assert_ne!(pinned_to(&desired), pinned_to(&created));
        keep_host_placement(&mut desired, &created);
        let (d, c) = (desired.spec.unwrap(), created.spec.unwrap());
        assert_eq!(d.affinity, c.affinity);
        assert_eq!(d.node_selector, c.node_selector);
        assert_eq!(d.runtime_class_name.as_deref(), Some("e2e-handler"));
        assert_eq!(d.node_name.as_deref(), Some("kwok-node-1"), "never unbound");
    }

    const PEM_A: &str = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    const PEM_B: &str = "-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n";

    fn bundle(
        name: &str,
        signer: Option<&str>,
        labels: serde_json::Value,
        pem: &str,
    ) -> ClusterTrustBundle {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"signerName": signer, "trustBundle": pem},
        }))
        .unwrap()
    }

    fn source(v: serde_json::Value) -> ClusterTrustBundleProjection {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn trust_bundle_sources_read_the_tenants_bundles_as_a_kubelet_reads_the_clusters() {
        let bundles = [
            bundle("plain", None, serde_json::json!({}), PEM_A),
            bundle(
                "s.example.com:s:1",
                Some("example.com/s"),
                serde_json::json!({"alive": "true"}),
                PEM_A,
            ),
            bundle(
                "s.example.com:s:2",
                Some("example.com/s"),
                serde_json::json!({"alive": "true"}),
                &format!("junk\n{PEM_B}{PEM_A}"),
            ),
            bundle(
                "s.example.com:s:3",
                Some("example.com/s"),
                serde_json::json!({"alive": "false"}),
                PEM_B,
            ),
            bundle(
                "o.example.com:o:1",
                Some("example.com/o"),
                serde_json::json!({"alive": "true"}),
                PEM_B,
            ),
        ];
        let read = |v| trust_bundle_content(&source(v), &bundles);
        assert_eq!(
            read(serde_json::json!({"name": "plain", "path": "p"})).as_deref(),
            Some(PEM_A)
        );
        assert_eq!(
            read(serde_json::json!({"name": "missing", "path": "p"})),
            None
        );
        // By signer: the selected bundles' certificates, each once.
        assert_eq!(
            read(
                serde_json::json!({"signerName": "example.com/s", "labelSelector": {"matchLabels": {"alive": "true"}}, "path": "p"})
            ),
            Some(format!("{PEM_A}{PEM_B}"))
        );
        assert_eq!(
            read(
                serde_json::json!({"signerName": "example.com/s", "labelSelector": {}, "path": "p"})
            ),
            Some(format!("{PEM_A}{PEM_B}")),
            "an empty selector selects every bundle of the signer"
        );
        assert_eq!(
            read(serde_json::json!({"signerName": "example.com/s", "path": "p"})),
            None,
            "no selector selects none"
        );
        assert_eq!(
            read(
                serde_json::json!({"signerName": "example.com/s", "labelSelector": {"matchLabels": {"alive": "unknown"}}, "path": "p"})
            ),
            None
        );
    }

    #[test]
    fn a_trust_bundle_source_reads_the_pods_configmap_on_the_host() {
        let mut pod = tenant_pod();
        pod.spec.as_mut().unwrap().volumes.as_mut().unwrap().push(
            serde_json::from_value(serde_json::json!({"name": "ctb", "projected": {"sources": [
                {"configMap": {"name": "settings"}},
                {"clusterTrustBundle": {"name": "plain", "path": "anchors.pem", "optional": true}},
            ]}}))
            .unwrap(),
        );
        let keys: Vec<String> = trust_bundle_sources(&pod)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys, ["ctb-2-1"]);
        let host = to_host(&pod, &ctx(), &env());
        let v = host
            .spec
            .unwrap()
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == "ctb")
            .unwrap();
        let sources = v.projected.unwrap().sources.unwrap();
        assert_eq!(sources[0].config_map.as_ref().unwrap().name, "settings");
        assert!(
            sources[1].cluster_trust_bundle.is_none(),
            "the host's bundles are never read"
        );
        let cm = sources[1].config_map.as_ref().unwrap();
        assert_eq!(cm.name, crate::naming::trust_bundles_name("t-uid"));
        assert_eq!(cm.optional, Some(false));
        let item = &cm.items.as_ref().unwrap()[0];
        assert_eq!(
            (item.key.as_str(), item.path.as_str()),
            ("ctb-2-1", "anchors.pem")
        );
    }

    fn tenant_pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "web-1", "namespace": "apps", "uid": "t-uid",
                "labels": {"app": "web"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs"}],
                "finalizers": ["tenant.example/keep"],
            },
            "spec": {
                "serviceAccountName": "builder",
                "priorityClassName": "high",
                "containers": [{
                    "name": "web", "image": "nginx",
                    "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": "evil"}],
                    "volumeMounts": [
                        {"name": "kube-api-access-abcde", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
                        {"name": "config", "mountPath": "/etc/config"},
                    ],
                }],
                "volumes": [
                    {"name": "kube-api-access-abcde", "projected": {"sources": [
                        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    ]}},
                    {"name": "config", "configMap": {"name": "settings"}},
                ],
            },
            "status": {"phase": "Pending"},
        }))
        .unwrap()
    }

    fn env() -> PodEnv {
        PodEnv {
            apiserver: Some(("10.96.4.4".into(), 443)),
            dns: Some("10.96.5.5".into()),
            cluster_domain: "cluster.local".into(),
            etc_hosts_image: None,
        }
    }

    #[test]
    fn the_host_pod_is_isolated_from_host_credentials_and_services() {
        let host = to_host(&tenant_pod(), &ctx(), &env());
        assert_eq!(host.metadata.namespace.as_deref(), Some("demo-apps"));
        assert_eq!(host.metadata.labels.as_ref().unwrap()[LABEL_TENANT], "demo");
        assert!(host.metadata.owner_references.is_none() && host.metadata.finalizers.is_none());
        assert!(host.status.is_none());
        let spec = host.spec.unwrap();
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.enable_service_links, Some(false));
        assert!(spec.service_account_name.is_none() && spec.priority_class_name.is_none());
        let vols = spec.volumes.unwrap();
        let token = vols
            .iter()
            .find(|v| v.name == "kube-api-access-abcde")
            .unwrap();
        let sources = token.projected.as_ref().unwrap().sources.as_ref().unwrap();
        assert_eq!(
            sources.len(),
            1,
            "only the host Secret with the tenant's token"
        );
        assert!(
            sources[0].service_account_token.is_none(),
            "a host kubelet must not mint a host token"
        );
        assert_eq!(
            sources[0].secret.as_ref().unwrap().name,
            crate::naming::token_secret_name("t-uid")
        );
        let mounts: Vec<_> = spec.containers[0]
            .volume_mounts
            .clone()
            .unwrap()
            .into_iter()
            .map(|m| m.name)
            .collect();
        assert_eq!(
            mounts,
            ["kube-api-access-abcde", "config"],
            "mounts stay as the tenant wrote them"
        );
    }

    #[test]
    fn the_host_pod_talks_to_the_tenant_apiserver_and_dns() {
        let spec = to_host(&tenant_pod(), &ctx(), &env()).spec.unwrap();
        let vars = spec.containers[0].env.clone().unwrap();
        let get = |n: &str| {
            vars.iter()
                .filter(|e| e.name == n)
                .map(|e| e.value.clone().unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            get("KUBERNETES_SERVICE_HOST"),
            ["10.96.4.4"],
            "the tenant's own value must not win"
        );
        assert_eq!(get("KUBERNETES_SERVICE_PORT"), ["443"]);
        let alias = &spec.host_aliases.unwrap()[0];
        assert_eq!(alias.ip, "10.96.4.4");
        assert!(
            alias
                .hostnames
                .as_ref()
                .unwrap()
                .contains(&"kubernetes.default.svc.cluster.local".to_owned())
        );
        assert_eq!(spec.dns_policy.as_deref(), Some("None"));
        let dns = spec.dns_config.unwrap();
        assert_eq!(dns.nameservers.unwrap(), ["10.96.5.5"]);
        assert_eq!(
            dns.searches.unwrap()[0],
            "apps.svc.cluster.local",
            "tenant namespace, not the host one"
        );
    }

    #[test]
    fn every_container_gets_the_full_kubernetes_env_of_the_tenant_apiserver_and_no_forgery() {
        let mut pod = tenant_pod();
        let spec = pod.spec.as_mut().unwrap();
        spec.enable_service_links = Some(false);
        spec.containers[0].env = Some(
            serde_json::from_value(serde_json::json!([
                {"name": "KUBERNETES_PORT_443_TCP_ADDR", "value": "192.0.2.66"},
                {"name": "KUBERNETES_SERVICE_PORT_HTTPS", "valueFrom": {"configMapKeyRef": {"name": "evil", "key": "port"}}},
                {"name": "KUBERNETES_NAMESPACE", "value": "apps"},
                {"name": "API", "value": "https://$(KUBERNETES_SERVICE_HOST)"},
            ]))
            .unwrap(),
        );
        spec.init_containers = Some(vec![Container {
            name: "init".into(),
            ..Default::default()
        }]);
        spec.ephemeral_containers = Some(vec![
            serde_json::from_value(serde_json::json!({
                "name": "debug", "env": [{"name": "KUBERNETES_PORT", "value": "tcp://192.0.2.66:443"}],
            }))
            .unwrap(),
        ]);
        let env = PodEnv {
            apiserver: Some(("10.96.4.4".into(), 6443)),
            ..env()
        };
        let spec = to_host(&pod, &ctx(), &env).spec.unwrap();
        let want: BTreeMap<String, String> = [
            ("KUBERNETES_SERVICE_HOST", "10.96.4.4"),
            ("KUBERNETES_SERVICE_PORT", "6443"),
            ("KUBERNETES_SERVICE_PORT_HTTPS", "6443"),
            ("KUBERNETES_PORT", "tcp://10.96.4.4:6443"),
            // Named after port 443 of the `kubernetes` Service, as the host kubelet names the
            // host's: only these names override its values.
            ("KUBERNETES_PORT_443_TCP", "tcp://10.96.4.4:6443"),
            ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
            ("KUBERNETES_PORT_443_TCP_PORT", "6443"),
            ("KUBERNETES_PORT_443_TCP_ADDR", "10.96.4.4"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let envs = [
            ("container", spec.containers[0].env.clone().unwrap()),
            (
                "init",
                spec.init_containers.unwrap()[0].env.clone().unwrap(),
            ),
            (
                "ephemeral",
                spec.ephemeral_containers.unwrap()[0].env.clone().unwrap(),
            ),
        ];
        for (which, vars) in &envs {
            let kube: BTreeMap<String, String> = vars
                .iter()
                .filter(|e| want.contains_key(&e.name))
                .map(|e| {
                    assert!(e.value_from.is_none(), "{which}: {} forged", e.name);
                    (e.name.clone(), e.value.clone().unwrap())
                })
                .collect();
            assert_eq!(kube, want, "{which}");
            let names: Vec<&str> = vars.iter().map(|e| e.name.as_str()).collect();
            let unique: BTreeSet<&str> = names.iter().copied().collect();
            assert_eq!(
                unique.len(),
                names.len(),
                "{which}: a name twice: {names:?}"
            );
        }
        let names: Vec<&str> = envs[0].1.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names[want.len()..],
            ["KUBERNETES_NAMESPACE", "API"],
            "the tenant's other variables stay, after ours so $(KUBERNETES_SERVICE_HOST) expands"
        );

        let v6 = PodEnv {
            apiserver: Some(("fd00::4".into(), 443)),
            ..env
        };
        let vars = vars(
            &to_host(&pod, &ctx(), &v6).spec.unwrap().containers[0]
                .env
                .clone()
                .unwrap(),
        );
        assert_eq!(vars["KUBERNETES_PORT_443_TCP"], "tcp://[fd00::4]:443");
        assert_eq!(vars["KUBERNETES_PORT_443_TCP_ADDR"], "fd00::4");
    }

    #[test]
    fn references_cover_volumes_env_and_pull_secrets_but_not_the_token_volume() {
        let mut pod = tenant_pod();
        let spec = pod.spec.as_mut().unwrap();
        spec.image_pull_secrets = Some(vec![
            serde_json::from_value(serde_json::json!({"name": "registry"})).unwrap(),
        ]);
        spec.containers[0].env = Some(
            serde_json::from_value(serde_json::json!([
                {"name": "A", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}},
                {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "flags", "key": "x"}}},
            ]))
            .unwrap(),
        );
        let (cms, secrets) = references(&pod);
        assert_eq!(cms.into_iter().collect::<Vec<_>>(), ["flags", "settings"]);
        assert_eq!(secrets.into_iter().collect::<Vec<_>>(), ["db", "registry"]);
    }

    #[test]
    fn status_flows_up_only_when_it_differs() {
        let mut host = to_host(&tenant_pod(), &ctx(), &env());
        let tenant = tenant_pod();
        assert!(
            status_to_tenant(&hp(&host), tenant.status.as_ref(), None).is_none(),
            "no host status yet"
        );
        host.status =
            serde_json::from_value(serde_json::json!({"phase": "Running", "podIP": "10.244.1.7"}))
                .unwrap();
        let up = status_to_tenant(&hp(&host), tenant.status.as_ref(), None).unwrap();
        assert_eq!(up.pod_ip.as_deref(), Some("10.244.1.7"));
        assert!(status_to_tenant(&hp(&host), Some(&up), None).is_none());
    }

    fn status(v: serde_json::Value) -> PodStatus {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_scheduled_host_pod_costs_no_status_patch_after_the_binding() {
        // What the host's scheduler left on the host pod, and the tenant pod before its binding.
        let mut host = to_host(&tenant_pod(), &ctx(), &env());
        host.status = Some(status(serde_json::json!({
            "phase": "Pending", "qosClass": "BestEffort",
            "conditions": [{"type": "PodScheduled", "status": "True",
                "lastTransitionTime": "2026-11-21T10:00:00Z"}],
        })));
        let before = status(serde_json::json!({"phase": "Pending", "qosClass": "BestEffort"}));
        assert!(
            status_to_tenant(&hp(&host), Some(&before), None).is_some(),
            "unbound, the tenant does not show it"
        );
        // The binding marks the tenant pod scheduled (a second later): nothing left to copy.
        let bound = bound_status(Some(&before));
        assert!(status_to_tenant(&hp(&host), Some(&bound), None).is_none());
        let mut stamped = bound.clone();
        stamped.conditions.as_mut().unwrap()[0].last_transition_time =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-11-21T10:00:01Z".parse().unwrap(),
            ));
        assert!(status_to_tenant(&hp(&host), Some(&stamped), None).is_none());
        // Once the host pod runs, the whole status goes up, host timestamps included.
        host.status = Some(status(serde_json::json!({
            "phase": "Running", "qosClass": "BestEffort", "podIP": "10.244.1.7",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-21T10:00:00Z"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-21T10:00:02Z"}],
        })));
        assert_eq!(
            status_to_tenant(&hp(&host), Some(&stamped), None),
            host.status
        );
        // A condition that changed its status is a change, whatever the timestamps.
        let mut not_ready = host.status.clone().unwrap();
        not_ready.conditions.as_mut().unwrap()[1].status = "False".into();
        assert!(status_to_tenant(&hp(&host), Some(&not_ready), None).is_some());
    }

    fn service(name: &str, ip: &str, ports: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "apps"},
            "spec": {"clusterIP": ip, "ports": ports},
        }))
        .unwrap()
    }

    fn vars(v: &[EnvVar]) -> BTreeMap<String, String> {
        v.iter()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect()
    }

    #[test]
    fn service_links_are_the_variables_a_kubelet_would_set() {
        let web = service(
            "my-web",
            "10.96.7.7",
            serde_json::json!([
                {"name": "http", "port": 80, "targetPort": 8080},
                {"name": "dns-udp", "port": 53, "protocol": "UDP"},
            ]),
        );
        let got = vars(&service_links([&web]));
        let want: BTreeMap<String, String> = [
            ("MY_WEB_SERVICE_HOST", "10.96.7.7"),
            ("MY_WEB_SERVICE_PORT", "80"),
            ("MY_WEB_SERVICE_PORT_HTTP", "80"),
            ("MY_WEB_SERVICE_PORT_DNS_UDP", "53"),
            ("MY_WEB_PORT", "tcp://10.96.7.7:80"),
            ("MY_WEB_PORT_80_TCP", "tcp://10.96.7.7:80"),
            ("MY_WEB_PORT_80_TCP_PROTO", "tcp"),
            ("MY_WEB_PORT_80_TCP_PORT", "80"),
            ("MY_WEB_PORT_80_TCP_ADDR", "10.96.7.7"),
            ("MY_WEB_PORT_53_UDP", "udp://10.96.7.7:53"),
            ("MY_WEB_PORT_53_UDP_PROTO", "udp"),
            ("MY_WEB_PORT_53_UDP_PORT", "53"),
            ("MY_WEB_PORT_53_UDP_ADDR", "10.96.7.7"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn services_without_an_address_and_the_apiserver_service_have_no_links() {
        let ports = serde_json::json!([{"port": 80}]);
        let headless = service("db", "None", ports.clone());
        let unallocated = service("queue", "", ports.clone());
        let mut apiserver = service("kubernetes", "10.96.0.1", ports.clone());
        apiserver.metadata.namespace = Some("default".into());
        assert!(service_links([&headless, &unallocated, &apiserver]).is_empty());
        let v6 = vars(&service_links([&service("web", "fd00::7", ports)]));
        assert_eq!(v6["WEB_PORT"], "tcp://[fd00::7]:80");
    }

    #[test]
    fn container_env_and_env_from_win_over_service_links_which_come_first() {
        let mut pod = tenant_pod();
        let c = &mut pod.spec.as_mut().unwrap().containers[0];
        c.env = Some(
            serde_json::from_value(serde_json::json!([
                {"name": "WEB_SERVICE_PORT", "value": "8443"},
                {"name": "URL", "value": "http://$(WEB_SERVICE_HOST)"},
            ]))
            .unwrap(),
        );
        c.env_from = Some(
            serde_json::from_value(serde_json::json!([
                {"configMapRef": {"name": "flags"}, "prefix": "WEB_"},
            ]))
            .unwrap(),
        );
        let links = service_links([&service(
            "web",
            "10.96.7.7",
            serde_json::json!([{"port": 80}]),
        )]);
        let keys = EnvFromKeys::from([((false, "flags".into()), BTreeSet::from(["PORT".into()]))]);
        let mut host = to_host(&pod, &ctx(), &PodEnv::default());
        add_service_links(&mut host, &links, &keys);
        let env = host.spec.unwrap().containers[0].env.clone().unwrap();
        let names: Vec<&str> = env.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names.first(), Some(&"WEB_SERVICE_HOST"));
        assert!(
            names.iter().position(|n| *n == "WEB_SERVICE_HOST")
                < names.iter().position(|n| *n == "URL"),
            "links must precede the variables that reference them"
        );
        assert_eq!(
            env.iter().filter(|e| e.name == "WEB_SERVICE_PORT").count(),
            1
        );
        assert_eq!(vars(&env)["WEB_SERVICE_PORT"], "8443");
        assert!(
            !names.contains(&"WEB_PORT"),
            "envFrom defines WEB_PORT (prefix WEB_, key PORT)"
        );
    }

    #[test]
    fn updates_keep_the_env_the_host_pod_was_created_with() {
        let mut created = to_host(&tenant_pod(), &ctx(), &env());
        let links = service_links([&service(
            "web",
            "10.96.7.7",
            serde_json::json!([{"port": 80}]),
        )]);
        add_service_links(&mut created, &links, &EnvFromKeys::new());
        let mut desired = to_host(&tenant_pod(), &ctx(), &env());
        desired.spec.as_mut().unwrap().containers[0].image = Some("nginx:2".into());
        keep_host_env(&mut desired, &created);
        let (d, c) = (desired.spec.unwrap(), created.spec.unwrap());
        assert_eq!(d.containers[0].env, c.containers[0].env);
        assert_eq!(d.containers[0].image.as_deref(), Some("nginx:2"));
    }

    fn member() -> Pod {
        let mut pod = tenant_pod();
        let spec = pod.spec.as_mut().unwrap();
        spec.hostname = Some("web-1".into());
        spec.subdomain = Some("web".into());
        spec.init_containers = Some(vec![Container {
            name: "setup".into(),
            image: Some("busybox".into()),
            ..Default::default()
        }]);
        pod
    }

    fn with_image() -> PodEnv {
        PodEnv {
            etc_hosts_image: Some("vcp-syncer:dev".into()),
            ..env()
        }
    }

    fn init_names(p: &Pod) -> Vec<String> {
        p.spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten())
            .map(|c| c.name.clone())
            .collect()
    }

    #[test]
    fn a_pod_certificate_source_names_vcps_signer_for_the_tenants() {
        let mut pod = tenant_pod();
        pod.spec.as_mut().unwrap().volumes = Some(vec![serde_json::from_value(serde_json::json!({
            "name": "certs", "projected": {"sources": [
                {"podCertificate": {"signerName": "kubernetes.io/kube-apiserver-client-pod", "keyType": "ED25519", "credentialBundlePath": "b"}},
            ]},
        })).unwrap()]);
        let host = to_host(&pod, &ctx(), &env());
        let v = &host.spec.unwrap().volumes.unwrap()[0];
        let src = &v.projected.as_ref().unwrap().sources.as_ref().unwrap()[0];
        let signer = &src.pod_certificate.as_ref().unwrap().signer_name;
        assert_eq!(
            signer,
            &crate::naming::host_pod_signer("demo", "kubernetes.io/kube-apiserver-client-pod"),
            "a host signer's name never reaches the host"
        );
        assert!(signer.starts_with("pods.vcp.dev/demo."));
    }

    #[test]
    fn a_pod_with_a_subdomain_learns_its_tenant_name_first_in_its_hosts_file() {
        let host = to_host(&member(), &ctx(), &with_image());
        assert_eq!(init_names(&host), [crate::etc_hosts::NAME, "setup"]);
        let fix = &host
            .spec
            .as_ref()
            .unwrap()
            .init_containers
            .as_ref()
            .unwrap()[0];
        assert_eq!(fix.image.as_deref(), Some("vcp-syncer:dev"));
        assert_eq!(
            fix.args.as_deref().unwrap(),
            [
                "--from-domain=web.demo-apps.svc.cluster.local",
                "--to-domain=web.apps.svc.cluster.local",
                "--target=/vcp-etc-hosts/hosts",
            ]
        );
        let spec = host.spec.as_ref().unwrap();
        let copy = |c: &Container| {
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == crate::etc_hosts::NAME && m.mount_path == "/etc/hosts")
        };
        assert!(copy(&spec.containers[0]) && copy(&spec.init_containers.as_ref().unwrap()[1]));
        // No image configured, or no subdomain: the kubelet's file stays.
        assert_eq!(init_names(&to_host(&member(), &ctx(), &env())), ["setup"]);
        assert!(init_names(&to_host(&tenant_pod(), &ctx(), &with_image())).is_empty());
    }

    #[test]
    fn the_hosts_init_container_stays_as_the_host_pod_was_created_and_out_of_the_tenants_view() {
        // Created without it (before the image was configured): an update never adds it, since
        // a pod's init containers cannot change; created with it, it is kept.
        let before = to_host(&member(), &ctx(), &env());
        let mut desired = to_host(&member(), &ctx(), &with_image());
        keep_host_env(&mut desired, &before);
        assert_eq!(init_names(&desired), ["setup"]);
        let after = to_host(&member(), &ctx(), &with_image());
        let mut desired = to_host(&member(), &ctx(), &env());
        keep_host_env(&mut desired, &after);
        let (d, a) = (desired.spec.as_ref().unwrap(), after.spec.as_ref().unwrap());
        assert_eq!(d.init_containers, a.init_containers);
        assert_eq!(d.volumes, a.volumes);
        assert_eq!(d.containers[0].volume_mounts, a.containers[0].volume_mounts);
        let mut desired = to_host(&member(), &ctx(), &env());
        keep_host_env(&mut desired, &before);
        assert_eq!(desired.spec, before.spec, "never added later");
        // Never resized.
        let mut tenant = member();
        tenant.spec.as_mut().unwrap().containers[0].resources =
            after.spec.as_ref().unwrap().containers[0].resources.clone();
        let mut older = after.clone();
        older
            .spec
            .as_mut()
            .unwrap()
            .init_containers
            .as_mut()
            .unwrap()[0]
            .resources = None;
        assert!(resized_body(&tenant, &after, &older).is_none());
        // Its status is not the tenant's.
        let mut host = after.clone();
        host.status = Some(serde_json::from_value(serde_json::json!({
            "phase": "Pending",
            "initContainerStatuses": [
                {"name": crate::etc_hosts::NAME, "image": "vcp-syncer:dev", "imageID": "", "ready": true, "restartCount": 0},
                {"name": "setup", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0},
            ],
        })).unwrap());
        let up = status_to_tenant(&hp(&host), None, None).unwrap();
        let names: Vec<&str> = up
            .init_container_statuses
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["setup"]);
    }
}

#[cfg(test)]
mod resize_tests {
    use super::tests::{ephemeral_body, hp, resized_body};
    use super::*;

    fn pod_with(resources: serde_json::Value, generation: i64, observed: Option<i64>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "n", "generation": generation, "resourceVersion": "7"},
            "spec": {"containers": [
                {"name": "c1", "image": "x", "resources": resources},
                {"name": "c2", "image": "x"},
            ]},
            "status": {"observedGeneration": observed},
        }))
        .unwrap()
    }

    /// What the tenant pod looks like down on the host with `limits` as the plan's defaults.
    fn down(t: &Pod, limits: &policy::quota::Limits) -> Pod {
        let mut d = t.clone();
        policy::quota::fill_defaults(d.spec.as_mut().unwrap(), limits);
        d
    }

    fn resize_of(t: &Pod, host: &Pod) -> Option<Pod> {
        resized_body(t, &down(t, &policy::quota::Limits::default()), host)
    }

    #[test]
    fn a_resize_keeps_the_defaults_the_host_pod_was_created_with() {
        let old = policy::quota::Limits::default();
        let tenant = pod_with(serde_json::json!({"requests": {"cpu": "500m"}}), 1, None);
        let host = down(&tenant, &old);
        let mut new = old.clone();
        new.default_limit = Some(policy::quota::Resources {
            cpu: "2".into(),
            memory: "1Gi".into(),
        });
        new.default_request = Some(policy::quota::Resources {
            cpu: "100m".into(),
            memory: "256Mi".into(),
        });
        assert_eq!(
            resized_body(&tenant, &down(&tenant, &new), &host),
            None,
            "a plan's new defaults resize no running pod"
        );
        // The tenant raises its request past the default limit the host pod runs with (1 CPU).
        let raised = pod_with(serde_json::json!({"requests": {"cpu": "3"}}), 2, None);
        let body = resized_body(&raised, &down(&raised, &new), &host).expect("a resize");
        let r = body.spec.unwrap().containers[0].resources.clone().unwrap();
        assert_eq!(r.requests.as_ref().unwrap()["cpu"].0, "3");
        assert_eq!(
            r.limits.as_ref().unwrap()["cpu"].0,
            "3",
            "the default limit rises with it"
        );
        assert_eq!(
            r.requests.as_ref().unwrap()["memory"].0,
            "128Mi",
            "the host's default"
        );
        assert_eq!(r.limits.as_ref().unwrap()["memory"].0, "512Mi");
    }

    #[test]
    fn a_resize_is_seen_by_value_and_sent_as_the_host_pod_with_new_resources() {
        let host = down(
            &pod_with(
                serde_json::json!({"requests": {"cpu": "1", "memory": "128Mi"}}),
                1,
                Some(1),
            ),
            &policy::quota::Limits::default(),
        );
        let same = pod_with(
            serde_json::json!({"requests": {"cpu": "1000m", "memory": "134217728"}}),
            1,
            None,
        );
        assert_eq!(
            resize_of(&same, &host),
            None,
            "the same amounts written otherwise"
        );
        let bigger = pod_with(
            serde_json::json!({"requests": {"cpu": "1500m", "memory": "128Mi"}}),
            2,
            None,
        );
        let body = resize_of(&bigger, &host).expect("a resize");
        let r = body.spec.as_ref().unwrap().containers[0]
            .resources
            .clone()
            .unwrap();
        assert_eq!(
            r.requests,
            bigger.spec.as_ref().unwrap().containers[0]
                .resources
                .clone()
                .unwrap()
                .requests
        );
        assert_eq!(
            r.limits.unwrap()["cpu"].0,
            "1500m",
            "the default limit rises with the request"
        );
        assert_eq!(
            body.metadata.resource_version.as_deref(),
            Some("7"),
            "the host's version guards the PUT"
        );
        assert_eq!(
            body.spec.as_ref().unwrap().containers[1],
            host.spec.as_ref().unwrap().containers[1]
        );
        let limits = policy::quota::Limits::default();
        assert!(resize_grows(&host, &body, &limits));
        assert!(
            !resize_grows(&body, &host, &limits),
            "back down: no leave needed"
        );
        // A limit added where none was counts as more (the default limit it replaces is 1 CPU).
        let limited = pod_with(
            serde_json::json!({"requests": {"cpu": "1", "memory": "128Mi"}, "limits": {"cpu": "4"}}),
            2,
            None,
        );
        let body = resize_of(&limited, &host).expect("a limit added");
        assert!(resize_grows(&host, &body, &limits));
        let unreadable = pod_with(serde_json::json!({"requests": {"cpu": "lots"}}), 2, None);
        let body = resize_of(&unreadable, &host).expect("a resize");
        assert!(
            resize_grows(&host, &body, &limits),
            "unreadable never passes as smaller"
        );
    }

    #[test]
    fn ephemeral_containers_the_host_lacks_are_appended_once() {
        let mut host = pod_with(serde_json::json!({}), 1, None);
        let mut desired = host.clone();
        assert_eq!(ephemeral_body(&desired, &host), None);
        let debugger: k8s_openapi::api::core::v1::EphemeralContainer =
            serde_json::from_value(serde_json::json!({"name": "debugger", "image": "busybox"}))
                .unwrap();
        desired.spec.as_mut().unwrap().ephemeral_containers = Some(vec![debugger.clone()]);
        let body = ephemeral_body(&desired, &host).expect("one to add");
        assert_eq!(
            body.spec.as_ref().unwrap().ephemeral_containers,
            Some(vec![debugger.clone()])
        );
        assert_eq!(body.metadata.resource_version.as_deref(), Some("7"));
        host.spec.as_mut().unwrap().ephemeral_containers = Some(vec![debugger.clone()]);
        assert_eq!(ephemeral_body(&desired, &host), None, "the host runs it");
        let mut second = debugger.clone();
        second.name = "second".into();
        desired.spec.as_mut().unwrap().ephemeral_containers =
            Some(vec![debugger.clone(), second.clone()]);
        let body = ephemeral_body(&desired, &host).unwrap();
        assert_eq!(
            body.spec.unwrap().ephemeral_containers,
            Some(vec![debugger, second]),
            "appended after the first"
        );
    }

    #[test]
    fn the_tenant_sees_its_generation_observed_only_once_the_host_runs_it() {
        let tenant = pod_with(serde_json::json!({}), 2, Some(1));
        let host_behind = pod_with(serde_json::json!({}), 3, Some(2));
        let host_done = pod_with(serde_json::json!({}), 3, Some(3));
        assert_eq!(observed_generation(&hp(&host_done), &tenant, true), Some(2));
        assert_eq!(
            observed_generation(&hp(&host_behind), &tenant, true),
            Some(1)
        );
        assert_eq!(
            observed_generation(&hp(&host_done), &tenant, false),
            Some(1),
            "a change still on its way down"
        );
        let no_kubelet = pod_with(serde_json::json!({}), 1, None);
        assert_eq!(
            observed_generation(&hp(&no_kubelet), &tenant, true),
            Some(1)
        );
        let mut status = host_done.clone();
        status.status.as_mut().unwrap().phase = Some("Running".into());
        let up = status_to_tenant(&hp(&status), None, Some(2)).unwrap();
        assert_eq!(up.observed_generation, Some(2), "not the host's 3");
    }

    #[test]
    fn the_tenants_own_disruption_condition_stays_and_a_stopped_pod_ends_failed() {
        let host: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap();
        let shown: PodStatus = serde_json::from_value(serde_json::json!({
            "phase": "Running",
            "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}],
        }))
        .unwrap();
        let up = status_to_tenant(&hp(&host), Some(&shown), None).unwrap();
        let types: Vec<&str> = up
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(types, ["Ready", "DisruptionTarget"]);
        let ended = terminal_status(Some(&shown)).unwrap();
        assert_eq!(ended.phase.as_deref(), Some("Failed"));
        assert_eq!(ended.conditions, shown.conditions, "the rest kept");
        assert_eq!(terminal_status(Some(&ended)), None, "terminal already");
        assert_eq!(
            terminal_status(None).unwrap().phase.as_deref(),
            Some("Failed")
        );
    }

    fn conditions_of(up: &PodStatus) -> Vec<(&str, &str)> {
        up.conditions
            .iter()
            .flatten()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect()
    }

    #[test]
    fn the_host_decides_its_kubelets_conditions_and_the_tenant_keeps_its_own() {
        let host: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady"},
                {"type": "ContainersReady", "status": "True"},
                {"type": "example.com/lb-ready", "status": "False"},
                {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"},
            ]},
        }))
        .unwrap();
        // The tenant shows an older `Ready` and `ContainersReady`, and its controller has
        // already set its gate `True` (the host's mirror of it is still `False`).
        let shown: PodStatus = serde_json::from_value(serde_json::json!({
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "ContainersReady", "status": "False"},
                {"type": "example.com/lb-ready", "status": "True"},
                {"type": "example.com/custom", "status": "True", "reason": "Mine"},
            ],
        }))
        .unwrap();
        let up = status_to_tenant(&hp(&host), Some(&shown), None).unwrap();
        assert_eq!(
            conditions_of(&up),
            [
                ("Ready", "False"),
                ("ContainersReady", "True"),
                ("example.com/lb-ready", "True"),
                ("DisruptionTarget", "True"),
                ("example.com/custom", "True"),
            ],
            "the host's kubelet types and its eviction; the tenant's gate and custom type"
        );
        // Copied once, the same status again writes nothing.
        assert_eq!(status_to_tenant(&hp(&host), Some(&up), None), None);
        for t in [
            "Ready",
            "PodScheduled",
            "PodReadyToStartContainers",
            "PodResizePending",
        ] {
            assert!(!tenant_condition(t), "{t}");
        }
        assert!(tenant_condition("DisruptionTarget"));
    }

    #[test]
    fn a_readiness_gate_set_in_the_tenant_is_written_to_the_host_pod_once() {
        let host: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [], "readinessGates": [
                {"conditionType": "example.com/lb-ready"},
                {"conditionType": "Ready"},
            ]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]},
        }))
        .unwrap();
        let mut tenant: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"conditions": [
                {"type": "example.com/lb-ready", "status": "True", "reason": "Registered"},
                {"type": "example.com/not-a-gate", "status": "True"},
                {"type": "Ready", "status": "True"},
            ]},
        }))
        .unwrap();
        let down = gates_to_host(&tenant, &hp(&host));
        let types: Vec<&str> = down.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            types,
            ["example.com/lb-ready"],
            "neither a type no gate names nor one the host's kubelet decides"
        );
        let mut mirrored = host.clone();
        let conditions = mirrored
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap();
        conditions.extend(down);
        assert!(
            gates_to_host(&tenant, &hp(&mirrored)).is_empty(),
            "shown already"
        );
        // A later change goes down again.
        let gate = &mut tenant.status.as_mut().unwrap().conditions.as_mut().unwrap()[0];
        gate.status = "False".into();
        assert_eq!(gates_to_host(&tenant, &hp(&mirrored)).len(), 1);
        let no_gates = pod_with(serde_json::json!({}), 1, None);
        assert!(gates_to_host(&tenant, &hp(&no_gates)).is_empty());
    }

    #[test]
    fn gates_on_host_decided_conditions_are_named_to_the_tenant_and_others_are_not() {
        let with_gates = |types: &[&str]| -> Pod {
            let gates: Vec<_> = types
                .iter()
                .map(|t| serde_json::json!({"conditionType": t}))
                .collect();
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p"},
                "spec": {"containers": [], "readinessGates": gates},
            }))
            .unwrap()
        };
        let note = host_decided_gates(&with_gates(&[
            "example.com/lb-ready",
            "Ready",
            "PodScheduled",
        ]))
        .expect("two gates on host conditions");
        assert!(note.contains("Ready, PodScheduled"), "{note}");
        assert!(!note.contains("lb-ready"), "{note}");
        assert_eq!(
            host_decided_gates(&with_gates(&["example.com/lb-ready"])),
            None
        );
        assert_eq!(host_decided_gates(&with_gates(&[])), None);
        assert_eq!(
            host_decided_gates(&pod_with(serde_json::json!({}), 1, None)),
            None
        );
    }
}
