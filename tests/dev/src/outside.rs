//! The world outside the cluster, for tests of what a plan lets tenants reach and be reached
//! from: a network namespace of this machine linked to the real node, holding addresses that no
//! cluster range contains.
//!
//! Data flow: [`Outside::wire`] creates the namespace `vcpout<k>` of node `k`, a veth pair to
//! the node (`10.243.<k>.4/30`), the addresses [`ADDRESSES`] on its loopback and the routes
//! both ways; [`Outside::serve`] counts the TCP connections one of them accepts, and
//! [`Outside::connect`] dials the node from one of them. Dropping it removes the namespace (and
//! with it the link). The node's own rule lets pod traffic leave the bridge for this link, so
//! pods reach these addresses exactly as far as the NetworkPolicies allow.
//!
//! Why these addresses: they stand for the internet, and must lie outside every cluster range
//! (the plans' `network.cluster_cidrs` default holds all private ones), yet never be a real
//! destination. TEST-NET-2 and TEST-NET-3 (RFC 5737) are reserved for documentation, and here
//! they are routed only into this namespace: nothing leaves the machine.

use crate::node::{NodeNet, ip};
use crate::{Error, Result};
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// Addresses of the outside: the first stands for what a test's plan allows, the second for
/// the rest of the internet.
pub const ADDRESSES: [Ipv4Addr; 2] = [
    Ipv4Addr::new(198, 51, 100, 1),
    Ipv4Addr::new(203, 0, 113, 1),
];

/// Accepts TCP connections on `argv[1]:argv[2]`, prints a line per connection with its source
/// and answers each with an HTTP 200.
const SERVER: &str = r#"
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(64)
print("listening", flush=True)
while True:
    c, peer = s.accept()
    print("accepted", peer[0], flush=True)
    try:
        c.sendall(b"HTTP/1.0 200 OK\r\n\r\nfrom the outside\n")
    finally:
        c.close()
"#;

/// Connects from `argv[1]` to `argv[2]:argv[3]`, sends one HTTP request and prints the answer.
const CLIENT: &str = r#"
import socket, sys
s = socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=3, source_address=(sys.argv[1], 0))
s.sendall(b"GET / HTTP/1.0\r\n\r\n")
data = b""
while True:
    b = s.recv(4096)
    if not b:
        break
    data += b
sys.stdout.write(data.decode(errors="replace"))
"#;

/// The outside of one real node; removed on drop.
pub struct Outside {
    net: NodeNet,
}

impl Outside {
    /// Creates the outside of node `net` (replacing one a killed test left) and routes it.
    pub fn wire(net: NodeNet) -> Result<Outside> {
        let (node_ns, ns) = (net.netns(), net.outside_netns());
        let _ = ip(&["netns", "del", &ns]);
        ip(&["netns", "add", &ns])?;
        let outside = Outside { net };
        let (near, far) = (net.veth_outside(), format!("vout{}o", net.index));
        let near_ip = net.outside_link_node().to_string();
        let far_ip = net.outside_link_far().to_string();
        let _ = ip(&["-n", &node_ns, "link", "del", &near]);
        ip(&["link", "add", &far, "type", "veth", "peer", "name", &near])?;
        ip(&["link", "set", &near, "netns", &node_ns])?;
        ip(&["link", "set", &far, "netns", &ns])?;
        ip(&[
            "-n",
            &node_ns,
            "addr",
            "add",
            &format!("{near_ip}/30"),
            "dev",
            &near,
        ])?;
        ip(&["-n", &node_ns, "link", "set", &near, "up"])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{far_ip}/30"),
            "dev",
            &far,
        ])?;
        ip(&["-n", &ns, "link", "set", &far, "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        for a in ADDRESSES {
            ip(&["-n", &ns, "addr", "add", &format!("{a}/32"), "dev", "lo"])?;
            ip(&[
                "-n",
                &node_ns,
                "route",
                "add",
                &format!("{a}/32"),
                "via",
                &far_ip,
            ])?;
        }
        // Back to the pods, and to the node's address (its NodePorts).
        for to in [net.pod_cidr(), format!("{}/32", net.node_ip())] {
            ip(&["-n", &ns, "route", "add", &to, "via", &near_ip])?;
        }
        Ok(outside)
    }

    /// Counts the connections `addr` accepts on `port` (a server in the outside's namespace,
    /// stopped on drop).
    pub fn serve(&self, addr: Ipv4Addr, port: u16) -> Result<Server> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.net.outside_netns(), "python3", "-c"])
            .arg(SERVER)
            .arg(addr.to_string())
            .arg(port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(Error::io("ip netns exec python3"))?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        match lines.next() {
            Some(Ok(l)) if l == "listening" => {}
            other => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Node(format!(
                    "the outside's server on {addr}:{port} did not start: {other:?}"
                )));
            }
        }
        let peers = Arc::new(Mutex::new(Vec::new()));
        let seen = peers.clone();
        std::thread::spawn(move || {
            for l in lines.map_while(std::result::Result::ok) {
                if let Some(peer) = l.strip_prefix("accepted ") {
                    seen.lock().expect("not poisoned").push(peer.to_owned());
                }
            }
        });
        Ok(Server { child, peers })
    }

    /// One HTTP request from the outside address `from` to `to`: the answer, or `None` when
    /// no connection was made (refused, or nothing answered within 3 s).
    pub fn connect(&self, from: Ipv4Addr, to: SocketAddr) -> Option<String> {
        let out = Command::new("timeout")
            .args(["10", "ip", "netns", "exec", &self.net.outside_netns()])
            .args(["python3", "-c", CLIENT])
            .arg(from.to_string())
            .arg(to.ip().to_string())
            .arg(to.port().to_string())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.net.outside_netns()]);
    }
}

/// A server of the outside; stopped on drop.
pub struct Server {
    child: Child,
    peers: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// The source address of every connection accepted so far, in order.
    pub fn peers(&self) -> Vec<String> {
        self.peers.lock().expect("not poisoned").clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
