//! `vcp-devnode`: a minimal kubelet that runs the pods bound to its node as local processes.
//!
//! Data flow: [`node`] registers the Node (label and taint `vcp.dev/runtime=process`) and keeps
//! its Lease fresh; reflectors mirror the pods bound to it plus the Secrets, ConfigMaps,
//! Services, EndpointSlices, claims and volumes those pods use; one [`pod`] worker per pod UID
//! turns the spec into processes: a network namespace and IP from [`network`], files from
//! [`volumes`], a hosts file from [`dns`], executables from [`images`], processes from
//! [`container`]; and writes back a status built by [`status`]. [`forward`] stands in for
//! kube-proxy: the apiserver gateway for pods, and NodePorts on 127.0.0.1 (for the host) and
//! on the gateway (for pods). [`kubelet`] serves the kubelet API the host apiserver calls
//! (logs, exec, port-forward) and metrics-server scrapes (resource usage from [`usage`]).

#![forbid(unsafe_code)]

pub mod container;
pub mod dns;
pub mod forward;
pub mod identity;
pub mod images;
pub mod kubelet;
pub mod network;
pub mod node;
pub mod pod;
pub mod postgres;
pub mod status;
pub mod usage;
pub mod volumes;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// Errors that stop the devnode.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to reach the cluster")]
    Connect(#[source] vcp_dev::Error),
    #[error("the kubeconfig has no usable server address")]
    NoServer,
    #[error("failed to set up the pod network")]
    Network(#[from] network::IpError),
    #[error("failed to listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to register node {node}")]
    Register {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("failed to write {path}")]
    State {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Result with the devnode's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How to run.
#[derive(Debug, Clone)]
pub struct Config {
    pub kubeconfig: PathBuf,
    pub node_name: String,
    pub state_dir: PathBuf,
    pub images: images::ImageDirs,
    /// Version reported as the node's kubelet version.
    pub version: String,
    /// The kubelet API for the host apiserver (`kubectl logs`); none without certificates.
    pub kubelet: Option<KubeletConfig>,
}

/// Where the kubelet endpoint listens and its certificates.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    /// Port on 127.0.0.1; 0 picks a free one (published in the Node's status).
    pub port: u16,
    pub tls: kubelet::TlsFiles,
}

fn store_of<K>(
    client: Client,
    cfg: watcher::Config,
) -> (Store<K>, impl std::future::Future<Output = ()>)
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(Api::<K>::all(client), cfg))
        .default_backoff()
        .touched_objects()
        .for_each(|_| async {});
    (reader, stream)
}

/// A running pod worker: where its updates go, and its task.
type PodWorker = (watch::Sender<Option<Arc<Pod>>>, tokio::task::JoinHandle<()>);

/// Runs the devnode until `shutdown` completes, then stops every pod and removes the network.
pub async fn run(cfg: Config, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    let client = vcp_dev::cluster::client_from(&cfg.kubeconfig)
        .await
        .map_err(Error::Connect)?;
    let apiserver = apiserver_addr(&cfg.kubeconfig).ok_or(Error::NoServer)?;
    std::fs::create_dir_all(&cfg.state_dir).map_err(|source| Error::State {
        path: cfg.state_dir.clone(),
        source,
    })?;
    // A previous run of this devnode that died without cleaning up.
    vcp_dev::devnet::sweep_recorded(&cfg.state_dir);
    let net = network::Network::claim()?;
    let net_file = cfg.state_dir.join(vcp_dev::devnet::NETWORK_FILE);
    std::fs::write(
        &net_file,
        serde_json::json!({"index": net.index, "bridge": net.bridge}).to_string(),
    )
    .map_err(|source| Error::State {
        path: net_file.clone(),
        source,
    })?;
    tracing::info!(bridge = %net.bridge, cidr = %net.cidr(), "pod network ready");
    let result = serve(&cfg, client, apiserver, net.clone(), shutdown).await;
    net.teardown();
    let _ = std::fs::remove_file(&net_file);
    result
}

async fn serve(
    cfg: &Config,
    client: Client,
    apiserver: SocketAddr,
    net: network::Network,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let gateway = SocketAddr::new(net.gateway().into(), 443);
    let listener = tokio::net::TcpListener::bind(gateway)
        .await
        .map_err(|source| Error::Listen {
            addr: gateway,
            source,
        })?;
    let gateway_task = tokio::spawn(forward::serve(
        listener,
        "the gateway to the apiserver".to_owned(),
        move || Some(apiserver),
    ));
    let logs_dir = cfg.state_dir.join("logs");
    let (kubelet_listener, kubelet_port) = match &cfg.kubelet {
        Some(k) => match bind_kubelet(k).await {
            Ok((listener, tls, port)) => (Some((listener, tls)), Some(port)),
            Err(e) => {
                // Pods still run without it; only `kubectl logs` and friends fail.
                tracing::warn!(error = %e, "kubelet endpoint not started");
                (None, None)
            }
        },
        None => (None, None),
    };
    node::register(
        &client,
        &cfg.node_name,
        &net.cidr(),
        &cfg.version,
        kubelet_port,
    )
    .await
    .map_err(|source| Error::Register {
        node: cfg.node_name.clone(),
        source,
    })?;

    let (pods, pods_stream) = {
        let (reader, writer) = reflector::store::<Pod>();
        let notify = Arc::new(Notify::new());
        let n = notify.clone();
        let stream = reflector::reflector(
            writer,
            watcher(
                Api::<Pod>::all(client.clone()),
                watcher::Config::default().fields(&format!("spec.nodeName={}", cfg.node_name)),
            ),
        )
        .default_backoff()
        .touched_objects()
        .for_each(move |_| {
            n.notify_one();
            async {}
        });
        ((reader, notify), stream)
    };
    let (secrets, s1) = store_of::<Secret>(client.clone(), watcher::Config::default());
    let (config_maps, s2) = store_of::<ConfigMap>(client.clone(), watcher::Config::default());
    let (services, s3) = store_of::<Service>(client.clone(), watcher::Config::default());
    let (slices, s4) = store_of::<EndpointSlice>(client.clone(), watcher::Config::default());
    let (claims, s5) =
        store_of::<PersistentVolumeClaim>(client.clone(), watcher::Config::default());
    let (volumes, s6) = store_of::<PersistentVolume>(client.clone(), watcher::Config::default());
    let mut streams = None;
    let kubelet_task = kubelet_listener.map(|(listener, tls)| {
        streams = start_streams(&cfg.images.bin_dir, &cfg.state_dir);
        tokio::spawn(kubelet::serve(
            listener,
            tls,
            kubelet::Endpoint {
                logs_dir: logs_dir.clone(),
                pods: pods.0.clone(),
                streams: streams.as_ref().map(|(_, socket)| socket.clone()),
            },
        ))
    });
    let watches = tokio::spawn(async move {
        futures::join!(pods_stream, s1, s2, s3, s4, s5, s6);
    });
    let node_ports = tokio::spawn(forward::node_ports(
        services.clone(),
        slices.clone(),
        net.clone(),
    ));
    let heartbeat = tokio::spawn(node::keep_alive(
        client.clone(),
        cfg.node_name.clone(),
        cfg.version.clone(),
        kubelet_port,
    ));
    for ready in [
        pods.0.wait_until_ready().await.is_ok(),
        secrets.wait_until_ready().await.is_ok(),
        config_maps.wait_until_ready().await.is_ok(),
        services.wait_until_ready().await.is_ok(),
        slices.wait_until_ready().await.is_ok(),
    ] {
        if !ready {
            tracing::warn!("a watch ended before it was ready");
        }
    }
    let shared = Arc::new(pod::Shared {
        client,
        node: cfg.node_name.clone(),
        net,
        slots: Mutex::new(network::Slots::default()),
        images: cfg.images.clone(),
        pods_dir: cfg.state_dir.join("pods"),
        logs_dir,
        secrets,
        config_maps,
        services,
        slices,
        claims,
        volumes,
    });
    tracing::info!(node = %cfg.node_name, "devnode ready");
    let mut workers: HashMap<String, PodWorker> = HashMap::new();
    let (store, notify) = pods;
    tokio::pin!(shutdown);
    loop {
        let current: HashMap<String, Arc<Pod>> = store
            .state()
            .into_iter()
            .filter_map(|p| Some((p.uid()?, p)))
            .collect();
        for (uid, p) in &current {
            match workers.get(uid) {
                Some((tx, _)) => {
                    tx.send_if_modified(|old| {
                        let changed = old.as_ref().map(|o| o.resource_version())
                            != Some(p.resource_version());
                        if changed {
                            *old = Some(p.clone());
                        }
                        changed
                    });
                }
                None => {
                    let (tx, rx) = watch::channel(Some(p.clone()));
                    let task = tokio::spawn(pod::run(shared.clone(), rx));
                    workers.insert(uid.clone(), (tx, task));
                }
            }
        }
        for (uid, (tx, _)) in &workers {
            if !current.contains_key(uid) {
                let _ = tx.send(None);
            }
        }
        workers.retain(|_, (_, task)| !task.is_finished());
        tokio::select! {
            () = &mut shutdown => break,
            () = notify.notified() => {}
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
    tracing::info!("stopping all pods");
    for (tx, task) in workers.into_values() {
        drop(tx); // closing the channel stops the worker without deleting the pod
        let _ = task.await;
    }
    for t in [gateway_task, node_ports, heartbeat, watches]
        .into_iter()
        .chain(kubelet_task)
    {
        t.abort();
    }
    if let Some((mut helper, _)) = streams {
        helper.stop(Duration::from_secs(1));
    }
    Ok(())
}

/// Starts `devnode-streams` (exec and port-forward) on a socket in the state dir; `None`, with
/// a warning, when it is not built: pods and logs do not need it.
fn start_streams(
    bin_dir: &std::path::Path,
    state_dir: &std::path::Path,
) -> Option<(vcp_dev::process::Spawned, PathBuf)> {
    let bin = bin_dir.join("devnode-streams");
    if !bin.is_file() {
        tracing::warn!(path = %bin.display(), "devnode-streams is not built (tests/kube-bin/build.sh): no exec or port-forward");
        return None;
    }
    let socket = state_dir.join("streams.sock");
    let spec = vcp_dev::process::ProcSpec::new("devnode-streams", &bin)
        .arg(format!("--socket={}", socket.display()));
    match vcp_dev::process::spawn(
        &spec,
        vcp_dev::process::Supervision::Attached,
        &state_dir.join("devnode-streams.log"),
    ) {
        Ok(p) => Some((p, socket)),
        Err(e) => {
            tracing::warn!(error = %e, "devnode-streams did not start: no exec or port-forward");
            None
        }
    }
}

/// Binds the kubelet endpoint (served once the pods are watched); returns its port.
async fn bind_kubelet(
    k: &KubeletConfig,
) -> Result<(tokio::net::TcpListener, Arc<rustls::ServerConfig>, u16), Box<dyn std::error::Error>> {
    let tls = kubelet::tls_config(&k.tls)?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", k.port)).await?;
    let port = listener.local_addr()?.port();
    tracing::info!(port, "kubelet endpoint listening");
    Ok((listener, tls, port))
}

/// The apiserver's `host:port` from a kubeconfig's current cluster.
fn apiserver_addr(kubeconfig: &std::path::Path) -> Option<SocketAddr> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).ok()?;
    let server = kc.clusters.first()?.cluster.as_ref()?.server.clone()?;
    let uri: http::Uri = server.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let ip = if host == "localhost" {
        "127.0.0.1".parse().ok()?
    } else {
        host.parse().ok()?
    };
    Some(SocketAddr::new(ip, uri.port_u16().unwrap_or(443)))
}
