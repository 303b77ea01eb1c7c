//! Names of the devnode's host network objects, shared by `vcp-devnode` (which creates them)
//! and `vcp-dev down` (which sweeps what a crashed devnode left).
//!
//! Devnode network `k` is the bridge `vcpdev<k>` with `10.245.<k>.0/24`; pod slot `n` is the
//! namespace `vcpdn<k>-<n>` with host-side veth `vdn<k>h<n>` and pod-side `vdn<k>p<n>`.

use std::process::Command;

/// File in the devnode's state dir recording the network it claimed.
pub const NETWORK_FILE: &str = "network.json";

pub fn bridge(k: u8) -> String {
    format!("vcpdev{k}")
}

pub fn netns(k: u8, n: u8) -> String {
    format!("vcpdn{k}-{n}")
}

pub fn veth_host(k: u8, n: u8) -> String {
    format!("vdn{k}h{n}")
}

pub fn veth_pod(k: u8, n: u8) -> String {
    format!("vdn{k}p{n}")
}

/// Pod slots of network `k` that have a namespace.
pub fn slots_in_use(k: u8) -> Vec<u8> {
    let prefix = format!("vcpdn{k}-");
    std::fs::read_dir("/run/netns")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.strip_prefix(&prefix)?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Removes pod slot `n` of network `k`. Never fails.
pub fn remove_slot(k: u8, n: u8) {
    let ns = netns(k, n);
    let _ = Command::new("ip")
        .args(["link", "del", &veth_host(k, n)])
        .output();
    let _ = Command::new("ip").args(["netns", "del", &ns]).output();
    let _ = std::fs::remove_dir_all(format!("/etc/netns/{ns}"));
}

/// Removes network `k` entirely. Never fails.
pub fn sweep(k: u8) {
    for n in slots_in_use(k) {
        remove_slot(k, n);
    }
    let _ = Command::new("ip")
        .args(["link", "del", &bridge(k)])
        .output();
}

/// The network index recorded in a devnode state dir.
pub fn recorded(state_dir: &std::path::Path) -> Option<u8> {
    let text = std::fs::read_to_string(state_dir.join(NETWORK_FILE)).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    u8::try_from(v["index"].as_u64()?).ok()
}

/// Sweeps the network recorded in a devnode state dir, if any.
pub fn sweep_recorded(state_dir: &std::path::Path) {
    if let Some(k) = recorded(state_dir) {
        sweep(k);
        let _ = std::fs::remove_file(state_dir.join(NETWORK_FILE));
    }
}
