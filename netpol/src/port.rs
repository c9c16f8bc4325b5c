//! A rule's ports: a protocol (TCP when unset) with every port, a number, a range up to `endPort`, or
//! a container port's name.

use crate::Invalid;
use k8s_openapi::api::networking::v1::NetworkPolicyPort;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use network_enforcer_api::Protocol;
use std::borrow::Cow;

/// One entry of a rule's `ports`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Port<'a> {
    /// Matches nothing.
    Invalid(Invalid),
    /// Every port of a protocol.
    Any(Protocol),
    /// Ports `first..=last` of a protocol (`first == last`: one port).
    Range(Protocol, u16, u16),
    /// A container port's name, resolved on the destination pod.
    Named(Protocol, Cow<'a, str>),
}

/// The container ports of a pod, which a named port resolves on.
pub trait NamedPorts {
    /// The number `name` stands for on this pod for `protocol`, if a container declares it (the API
    /// server keeps port names unique within a pod).
    fn resolve(&self, name: &str, protocol: Protocol) -> Option<u16>;
}

/// The port side of a connection.
#[derive(Clone, Copy)]
pub struct PortQuery<'a> {
    pub protocol: Protocol,
    pub port: u16,
    /// The destination pod's container ports; `None` when the destination is no pod (an address
    /// has no named ports).
    pub destination: Option<&'a dyn NamedPorts>,
}

impl<'a> Port<'a> {
    /// Reads `port` as the API server would accept it; anything it would reject is
    /// [`Port::Invalid`].
    pub fn parse(port: &'a NetworkPolicyPort) -> Self {
        let Some(protocol) = Protocol::from_kubernetes(port.protocol.as_deref()) else {
            return Port::Invalid(Invalid::Protocol(port.protocol.clone().unwrap_or_default()));
        };
        match (&port.port, port.end_port) {
            (None, None) => Port::Any(protocol),
            (None, Some(end)) => Port::Invalid(Invalid::EndPortWithoutPort(end)),
            (Some(IntOrString::String(name)), Some(_)) => {
                Port::Invalid(Invalid::EndPortWithName(name.clone()))
            }
            (Some(IntOrString::String(name)), None) => Port::Named(protocol, Cow::Borrowed(name)),
            (Some(IntOrString::Int(first)), end) => {
                let last = end.unwrap_or(*first);
                match (u16::try_from(*first), u16::try_from(last)) {
                    (Ok(f), Ok(l)) if f <= l => Port::Range(protocol, f, l),
                    _ => Port::Invalid(Invalid::Range {
                        first: *first,
                        last,
                    }),
                }
            }
        }
    }

    /// The same port owning its name.
    pub fn into_owned(self) -> Port<'static> {
        match self {
            Port::Invalid(why) => Port::Invalid(why),
            Port::Any(protocol) => Port::Any(protocol),
            Port::Range(protocol, first, last) => Port::Range(protocol, first, last),
            Port::Named(protocol, name) => Port::Named(protocol, Cow::Owned(name.into_owned())),
        }
    }

    /// Whether a connection on `query` is one of these ports.
    pub fn matches(&self, query: &PortQuery<'_>) -> bool {
        match self {
            Port::Invalid(_) => false,
            Port::Any(protocol) => *protocol == query.protocol,
            Port::Range(protocol, first, last) => {
                *protocol == query.protocol && (*first..=*last).contains(&query.port)
            }
            Port::Named(protocol, name) => {
                *protocol == query.protocol
                    && query
                        .destination
                        .and_then(|pod| pod.resolve(name, *protocol))
                        == Some(query.port)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Web;
    impl NamedPorts for Web {
        fn resolve(&self, name: &str, protocol: Protocol) -> Option<u16> {
            match (name, protocol) {
                ("http", Protocol::TCP) => Some(8080),
                ("dns", Protocol::UDP) => Some(5353),
                _ => None,
            }
        }
    }

    fn port(value: serde_json::Value) -> NetworkPolicyPort {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn ports_parse_as_the_api_server_accepts_them() {
        let cases = [
            (json!({}), Port::Any(Protocol::TCP)),
            (json!({"protocol": "UDP"}), Port::Any(Protocol::UDP)),
            (json!({"port": 80}), Port::Range(Protocol::TCP, 80, 80)),
            (
                json!({"port": 80, "endPort": 90, "protocol": "SCTP"}),
                Port::Range(Protocol::SCTP, 80, 90),
            ),
            (
                json!({"port": "http"}),
                Port::Named(Protocol::TCP, Cow::Borrowed("http")),
            ),
            (
                json!({"protocol": "ICMP"}),
                Port::Invalid(Invalid::Protocol("ICMP".into())),
            ),
            (
                json!({"endPort": 90}),
                Port::Invalid(Invalid::EndPortWithoutPort(90)),
            ),
            (
                json!({"port": "http", "endPort": 90}),
                Port::Invalid(Invalid::EndPortWithName("http".into())),
            ),
            (
                json!({"port": 90, "endPort": 80}),
                Port::Invalid(Invalid::Range {
                    first: 90,
                    last: 80,
                }),
            ),
            (
                json!({"port": 70000}),
                Port::Invalid(Invalid::Range {
                    first: 70000,
                    last: 70000,
                }),
            ),
        ];
        for (input, want) in cases {
            let p = port(input.clone());
            assert_eq!(Port::parse(&p), want, "{input}");
        }
    }

    #[test]
    fn a_port_matches_its_protocol_and_numbers_and_names_resolve_on_the_destination() {
        let q = |protocol, port, pod: bool| PortQuery {
            protocol,
            port,
            destination: pod.then_some(&Web as &dyn NamedPorts),
        };
        let http = Port::Named(Protocol::TCP, Cow::Borrowed("http"));
        let cases = [
            (Port::Any(Protocol::TCP), q(Protocol::TCP, 1, false), true),
            (Port::Any(Protocol::TCP), q(Protocol::UDP, 1, false), false),
            (
                Port::Range(Protocol::TCP, 80, 90),
                q(Protocol::TCP, 90, false),
                true,
            ),
            (
                Port::Range(Protocol::TCP, 80, 90),
                q(Protocol::TCP, 91, false),
                false,
            ),
            (http.clone(), q(Protocol::TCP, 8080, true), true),
            (http.clone(), q(Protocol::TCP, 8081, true), false),
            // An address has no named ports.
            (http.clone(), q(Protocol::TCP, 8080, false), false),
            // The name resolves for its own protocol only.
            (
                Port::Named(Protocol::UDP, Cow::Borrowed("http")),
                q(Protocol::UDP, 8080, true),
                false,
            ),
            (
                Port::Invalid(Invalid::EmptyPeer),
                q(Protocol::TCP, 1, true),
                false,
            ),
        ];
        for (i, (port, query, want)) in cases.into_iter().enumerate() {
            assert_eq!(port.matches(&query), want, "case {i}: {port:?}");
        }
    }
}
