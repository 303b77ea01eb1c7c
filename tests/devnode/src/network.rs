//! Pod networking: a bridge per devnode, a network namespace and veth pair per pod.
//!
//! Each devnode claims the first free bridge `vcpdev<k>` (k in 0..=250) by creating it, so
//! several dev clusters on one machine never share addresses. Its pod network is
//! `10.245.<k>.0/24`: the bridge holds `.1` in the root namespace, pods get `.2`..`.254`. Pod
//! IPs are private addresses inside namespaces this process created, so the machine may talk
//! to them; the bridge makes them reachable from the root namespace. Names:
//! netns `vcpdn<k>-<n>`, host-side veth `vdn<k>h<n>` (at most 15 characters, Linux's limit).
//! Everything is removed by [`Network::teardown`] and, after a crash, by
//! `vcp_dev::devnet::sweep_recorded` (names are shared through `vcp_dev::devnet`).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::process::Command;
use vcp_dev::devnet;

/// A failed `ip` command.
#[derive(Debug, thiserror::Error)]
#[error("`ip {args}` failed: {stderr}")]
pub struct IpError {
    pub args: String,
    pub stderr: String,
}

fn ip(args: &[&str]) -> Result<(), IpError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| IpError {
            args: args.join(" "),
            stderr: e.to_string(),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(IpError {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// The devnode's pod network.
#[derive(Debug, Clone)]
pub struct Network {
    pub index: u8,
    pub bridge: String,
}

/// Pure address plan of network `k`.
impl Network {
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 245, self.index, 1)
    }

    pub fn cidr(&self) -> String {
        format!("10.245.{}.0/24", self.index)
    }

    /// Whether `ip` is a pod address of this network.
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        matches!(ip, std::net::IpAddr::V4(v4) if v4.octets()[..3] == [10, 245, self.index] && v4.octets()[3] >= 2)
    }

    pub fn pod_ip(&self, n: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 245, self.index, n)
    }

    pub fn netns(&self, n: u8) -> String {
        devnet::netns(self.index, n)
    }

    fn veth_host(&self, n: u8) -> String {
        devnet::veth_host(self.index, n)
    }

    fn veth_pod(&self, n: u8) -> String {
        devnet::veth_pod(self.index, n)
    }

    /// Claims the first free bridge and brings it up with the gateway address.
    pub fn claim() -> Result<Network, IpError> {
        let mut last = None;
        for index in 0..=250u8 {
            let bridge = devnet::bridge(index);
            // Creating the link is the lock: it fails if another devnode holds this index.
            match ip(&["link", "add", &bridge, "type", "bridge"]) {
                Ok(()) => {
                    let net = Network { index, bridge };
                    ip(&[
                        "addr",
                        "add",
                        &format!("{}/24", net.gateway()),
                        "dev",
                        &net.bridge,
                    ])?;
                    ip(&["link", "set", &net.bridge, "up"])?;
                    return Ok(net);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("tried at least one index"))
    }

    /// Creates the namespace and veth pair of pod slot `n`, with its address and a default
    /// route through the bridge.
    pub fn add_pod(&self, n: u8) -> Result<Ipv4Addr, IpError> {
        let (ns, host, pod) = (self.netns(n), self.veth_host(n), self.veth_pod(n));
        // A leftover of a crashed run holds the slot; start clean.
        self.remove_pod(n);
        ip(&["netns", "add", &ns])?;
        ip(&["link", "add", &host, "type", "veth", "peer", "name", &pod])?;
        ip(&["link", "set", &pod, "netns", &ns])?;
        ip(&["link", "set", &host, "master", &self.bridge, "up"])?;
        let addr = self.pod_ip(n);
        ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", &pod])?;
        ip(&["-n", &ns, "link", "set", &pod, "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        ip(&[
            "-n",
            &ns,
            "route",
            "add",
            "default",
            "via",
            &self.gateway().to_string(),
        ])?;
        Ok(addr)
    }

    /// Removes pod slot `n` (namespace, veth, per-namespace files). Never fails.
    pub fn remove_pod(&self, n: u8) {
        devnet::remove_slot(self.index, n);
    }

    /// Removes every pod slot and the bridge.
    pub fn teardown(&self) {
        devnet::sweep(self.index);
    }
}

/// The pod slots in use and the last one handed out (pure IPAM).
///
/// Slots go round-robin, like host-local IPAM: a freed address is not handed out again
/// until every other one has been. Something that still holds a gone pod's IP (a stale
/// endpoint, a test checking the pod's namespace is gone) then never meets a new pod
/// behind it.
#[derive(Debug, Default)]
pub struct Slots {
    used: BTreeSet<u8>,
    last: u8,
}

impl Slots {
    /// Takes the next free slot after the last one handed out, wrapping around.
    pub fn take(&mut self) -> Option<u8> {
        let after = self.last.max(1);
        let slot = (after + 1..=254)
            .chain(2..=after)
            .find(|n| !self.used.contains(n))?;
        self.used.insert(slot);
        self.last = slot;
        Some(slot)
    }

    pub fn release(&mut self, slot: u8) {
        self.used.remove(&slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_linux_limits_and_addresses_stay_in_the_network() {
        let net = Network {
            index: 250,
            bridge: "vcpdev250".into(),
        };
        assert!(net.veth_host(254).len() <= 15 && net.veth_pod(254).len() <= 15);
        assert_eq!(net.pod_ip(17), Ipv4Addr::new(10, 245, 250, 17));
        assert_eq!(net.cidr(), "10.245.250.0/24");
        assert!(net.contains("10.245.250.17".parse().unwrap()));
        assert!(
            !net.contains("10.245.250.1".parse().unwrap()),
            "the gateway is no pod"
        );
        assert!(!net.contains("10.245.1.17".parse().unwrap()));
        assert!(!net.contains("10.244.250.17".parse().unwrap()));
    }

    #[test]
    fn slots_go_round_robin_skip_used_ones_and_run_out() {
        let mut slots = Slots::default();
        assert_eq!(slots.take(), Some(2));
        assert_eq!(slots.take(), Some(3));
        slots.release(2);
        assert_eq!(slots.take(), Some(4), "a freed slot waits its turn");
        for n in 5..=254 {
            assert_eq!(slots.take(), Some(n));
        }
        assert_eq!(
            slots.take(),
            Some(2),
            "after 254 it wraps to the freed slot"
        );
        assert_eq!(slots.take(), None, "every slot is in use");
        slots.release(100);
        assert_eq!(slots.take(), Some(100));
    }
}
