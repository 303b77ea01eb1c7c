//! Where the relay sends one CONNECT of the tenant apiserver's control-plane context: the
//! pure decision.
//!
//! Data flow: the relay ([`super`]) reads the target of each CONNECT (`host:port`, as the
//! apiserver writes it) and asks [`hop`], which parses it with the egress proxy's own
//! [`Target::parse`] and answers one of three things: the authorizer beside it
//! ([`Hop::Local`], dialled on the pod's loopback without the syncer, so revocations hold
//! while the syncer is down), the syncer's egress proxy ([`Hop::Chain`], which alone decides
//! whether the tenant may reach the target: its allow list stays in one place), or a refusal
//! ([`Hop::Refuse`]) for a target that is not `host:port` at all.
//!
//! One more target is dialled from the pod without the syncer: vcp's audit ingest, when the
//! authorizer is given it (`--audit-ingest`), exactly that `host:port` ([`Hop::Ingest`]). The
//! apiserver's audit webhook is control-plane egress too, and vcp is none of the tenant's
//! addresses, so the syncer would refuse it. A tenant's own webhook URL naming that address
//! reaches it as well, but finds there only the ingest, which takes nothing without the
//! per-tenant token that only the apiserver's audit configuration holds (docs/orchestrator.md,
//! "The tenant's audit log").
//!
//! A chained target is written out again from its parsed form, never copied from the request:
//! what goes on to the syncer is a plain `host:port` whatever bytes the apiserver was made to
//! send.

use crate::egress::allow::Target;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// What to do with one CONNECT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hop {
    /// The authorizer's own webhook: dial this address on the pod's loopback.
    Local(SocketAddr),
    /// Anything else: ask the syncer's egress proxy for this target (`host:port`).
    Chain(String),
    /// vcp's audit ingest: dial this `host:port` (canonical) from the pod.
    Ingest(String),
    /// Not a `host:port`: refused here, as the syncer would refuse it.
    Refuse,
}

/// Where the webhook is dialled when it listens on `listen`: an unspecified bind address
/// (`0.0.0.0`, `::`) is reached on the loopback of its family.
pub fn local_address(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, listen.port()).into(),
        IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, listen.port()).into(),
        _ => listen,
    }
}

/// Judges `authority`, the target of a CONNECT, for an authorizer whose webhook listens on
/// `listen` (its bound address).
///
/// Local is the webhook's own address only: its IP and port as bound (any loopback address on
/// its port when it is bound to every address), and `localhost` on its port when it is bound
/// to loopback or to every address (a kubeconfig may name the webhook that way). Every other
/// port of the pod, its loopback included, is chained like any target, so nothing else in the
/// pod becomes reachable through the relay.
pub fn hop(authority: &str, listen: SocketAddr) -> Hop {
    hop_with(authority, listen, None)
}

/// [`hop`] for a relay that also knows vcp's audit ingest (`ingest`, parsed as a CONNECT
/// target): that exact target is [`Hop::Ingest`]; anything else is judged as [`hop`] judges it.
pub fn hop_with(authority: &str, listen: SocketAddr, ingest: Option<&Target>) -> Hop {
    let Some(target) = Target::parse(authority) else {
        return Hop::Refuse;
    };
    if ingest == Some(&target) {
        return Hop::Ingest(canonical(target));
    }
    let anywhere = listen.ip().is_unspecified();
    let local = match &target {
        Target::Ip(addr) => {
            *addr == listen || (anywhere && addr.ip().is_loopback() && addr.port() == listen.port())
        }
        Target::Name(host, port) => {
            (anywhere || listen.ip().is_loopback()) && host == "localhost" && *port == listen.port()
        }
    };
    if local {
        return Hop::Local(local_address(listen));
    }
    Hop::Chain(canonical(target))
}

/// A target written out again from its parsed form.
fn canonical(target: Target) -> String {
    match target {
        Target::Ip(addr) => addr.to_string(),
        Target::Name(host, port) => format!("{host}:{port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn listen() -> SocketAddr {
        "127.0.0.1:10262".parse().unwrap()
    }

    fn local() -> Hop {
        Hop::Local(listen())
    }

    fn chain(s: &str) -> Hop {
        Hop::Chain(s.to_owned())
    }

    #[test]
    fn the_authorizers_own_address_is_dialled_locally() {
        assert_eq!(hop("127.0.0.1:10262", listen()), local());
        assert_eq!(hop("localhost:10262", listen()), local());
        assert_eq!(hop("LOCALHOST.:10262", listen()), local());
        // Another loopback address is not where the webhook listens: the syncer judges it
        // (and refuses it), as the apiserver dialling it directly would have found nothing.
        assert_eq!(hop("127.0.0.2:10262", listen()), chain("127.0.0.2:10262"));
        assert_eq!(hop("[::1]:10262", listen()), chain("[::1]:10262"));
    }

    #[test]
    fn every_other_port_of_the_pod_goes_to_the_syncer() {
        // The apiserver itself, the authorizer's health port, anything else on loopback: the
        // syncer refuses them, and the relay gives them no way round it.
        for t in [
            "127.0.0.1:6443",
            "127.0.0.1:10263",
            "localhost:2379",
            "127.0.0.1:10261",
        ] {
            assert_eq!(hop(t, listen()), chain(t), "{t}");
        }
    }

    #[test]
    fn targets_outside_the_pod_go_to_the_syncer_in_a_canonical_form() {
        assert_eq!(hop("192.0.2.2:8080", listen()), chain("192.0.2.2:8080"));
        assert_eq!(
            hop("Web.Apps.SVC.:443", listen()),
            chain("web.apps.svc:443")
        );
        assert_eq!(
            hop("[2001:db8::1]:443", listen()),
            chain("[2001:db8::1]:443")
        );
        // The webhook's port on another host is not the webhook.
        assert_eq!(hop("10.0.0.1:10262", listen()), chain("10.0.0.1:10262"));
        assert_eq!(
            hop("evil.example:10262", listen()),
            chain("evil.example:10262")
        );
    }

    #[test]
    fn what_is_not_host_and_port_is_refused_here() {
        for t in [
            "",
            "127.0.0.1",
            "localhost",
            "a b:80",
            "a:80\r\nX-Evil: 1",
            "a:99999",
            "::1:10262",
            "a/b:80",
        ] {
            assert_eq!(hop(t, listen()), Hop::Refuse, "{t:?}");
        }
    }

    #[test]
    fn a_webhook_bound_to_every_address_is_local_on_loopback_and_its_own_ip() {
        let any: SocketAddr = "0.0.0.0:10262".parse().unwrap();
        let lo = Hop::Local("127.0.0.1:10262".parse().unwrap());
        assert_eq!(hop("127.0.0.1:10262", any), lo);
        assert_eq!(hop("localhost:10262", any), lo);
        assert_eq!(hop("0.0.0.0:10262", any), lo);
        assert_eq!(hop("10.0.0.1:10262", any), chain("10.0.0.1:10262"));
        // Bound to a pod IP: that address only, never loopback or `localhost`.
        let pod: SocketAddr = "10.0.0.1:10262".parse().unwrap();
        assert_eq!(hop("10.0.0.1:10262", pod), Hop::Local(pod));
        assert_eq!(hop("127.0.0.1:10262", pod), chain("127.0.0.1:10262"));
        assert_eq!(hop("localhost:10262", pod), chain("localhost:10262"));
    }

    #[test]
    fn the_audit_ingest_is_dialled_from_the_pod_and_nothing_else_is() {
        let ingest = Target::parse("vcp.vcp-system.svc:8081");
        let with = |t: &str| hop_with(t, listen(), ingest.as_ref());
        assert_eq!(
            with("VCP.vcp-system.svc.:8081"),
            Hop::Ingest("vcp.vcp-system.svc:8081".into())
        );
        // Its other ports, and other names on its port, are judged by the syncer.
        assert_eq!(
            with("vcp.vcp-system.svc:8080"),
            chain("vcp.vcp-system.svc:8080")
        );
        assert_eq!(with("vcp.other.svc:8081"), chain("vcp.other.svc:8081"));
        assert_eq!(with("127.0.0.1:10262"), local());
        let by_ip = Target::parse("10.245.3.1:9000");
        assert_eq!(
            hop_with("10.245.3.1:9000", listen(), by_ip.as_ref()),
            Hop::Ingest("10.245.3.1:9000".into())
        );
        assert_eq!(
            hop_with("10.245.3.1:9001", listen(), by_ip.as_ref()),
            chain("10.245.3.1:9001")
        );
        // Without an ingest, nothing is dialled from the pod but the webhook.
        assert_eq!(hop("10.245.3.1:9000", listen()), chain("10.245.3.1:9000"));
    }

    proptest! {
        /// Whatever the apiserver was made to send, a local hop is the webhook's port, and a
        /// chained target is a plain `host:port` that reads back as itself: nothing but a
        /// target reaches the syncer's request line.
        #[test]
        fn hops_are_the_webhook_or_a_clean_target(authority in "\\PC{0,40}|[a-zA-Z0-9.:\\[\\]-]{0,40}") {
            match hop(&authority, listen()) {
                Hop::Local(addr) => prop_assert_eq!(addr, listen()),
                Hop::Chain(t) => {
                    prop_assert!(t.bytes().all(|b| b.is_ascii_alphanumeric() || b".:-[]".contains(&b)), "{}", t);
                    prop_assert_eq!(hop(&t, listen()), Hop::Chain(t.clone()));
                    prop_assert_eq!(Target::parse(&t), Target::parse(&authority));
                }
                Hop::Refuse => prop_assert!(Target::parse(&authority).is_none()),
                Hop::Ingest(t) => prop_assert!(false, "no ingest configured, got {}", t),
            }
        }

        /// Every port but the webhook's, on any loopback address or `localhost`, is chained.
        #[test]
        fn no_other_loopback_port_is_local(port in any::<u16>(), last in 1u8..255, by_name in any::<bool>()) {
            prop_assume!(port != 10262);
            let t = if by_name { format!("localhost:{port}") } else { format!("127.0.0.{last}:{port}") };
            prop_assert_eq!(hop(&t, listen()), Hop::Chain(t.clone()));
        }
    }
}
