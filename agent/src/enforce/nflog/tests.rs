use super::reader::{config_hint, config_message};
use super::*;
use proptest::prelude::*;

/// A netlink message of `kind` around `body`.
fn netlink(kind: u16, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&0u16.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(body);
    m.resize(align4(m.len()), 0);
    m
}

fn attribute(kind: u16, data: &[u8]) -> Vec<u8> {
    let mut a = Vec::new();
    a.extend_from_slice(&((NLA_HDRLEN + data.len()) as u16).to_ne_bytes());
    a.extend_from_slice(&kind.to_ne_bytes());
    a.extend_from_slice(data);
    a.resize(align4(a.len()), 0);
    a
}

/// The body of a packet message as the kernel builds it: nfgenmsg, packet header, prefix
/// (NUL-terminated), payload.
fn packet_body(prefix: &str, payload: &[u8]) -> Vec<u8> {
    let mut body = vec![libc::AF_INET as u8, NFNETLINK_V0, 0, 7];
    body.extend(attribute(1, &[0x08, 0x00, 1, 0])); // NFULA_PACKET_HDR
    let mut prefix = prefix.as_bytes().to_vec();
    prefix.push(0);
    body.extend(attribute(NFULA_PREFIX, &prefix));
    body.extend(attribute(NFULA_PAYLOAD, payload));
    body
}

fn packet_message(prefix: &str, payload: &[u8]) -> Vec<u8> {
    netlink(NFNL_SUBSYS_ULOG << 8, &packet_body(prefix, payload))
}

fn ipv4(protocol: u8, src: [u8; 4], dst: [u8; 4], transport: &[u8]) -> Vec<u8> {
    let mut p = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, protocol, 0, 0];
    p.extend_from_slice(&src);
    p.extend_from_slice(&dst);
    p.extend_from_slice(transport);
    p
}

fn ipv6(next: u8, src: Ipv6Addr, dst: Ipv6Addr, rest: &[u8]) -> Vec<u8> {
    let mut p = vec![0x60, 0, 0, 0, 0, 0, next, 64];
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(rest);
    p
}

/// The first bytes of a TCP or UDP header with these ports.
fn l4(sport: u16, dport: u16) -> Vec<u8> {
    let mut t = sport.to_be_bytes().to_vec();
    t.extend_from_slice(&dport.to_be_bytes());
    t.extend_from_slice(&[0; 16]);
    t
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn tcp4_syn() -> Vec<u8> {
    ipv4(6, [10, 0, 0, 1], [10, 0, 0, 2], &l4(40000, 80))
}

#[test]
fn packet_table() {
    let v6a: Ipv6Addr = "fd00::1".parse().unwrap();
    let v6b: Ipv6Addr = "fd00::2".parse().unwrap();
    let denied = |direction, protocol, source: &str, destination: &str| {
        Ok(Some(Denied {
            direction,
            protocol,
            source: addr(source),
            destination: addr(destination),
        }))
    };
    use DenyDirection::{Egress, Ingress};
    let mut fragment = tcp4_syn();
    fragment[6] = 0x00;
    fragment[7] = 0x10; // offset 16 * 8 bytes: no transport header
    let mut v4_options = ipv4(17, [10, 0, 0, 1], [10, 0, 0, 2], &[]);
    v4_options[0] = 0x46; // one word of options before the UDP header
    v4_options.extend_from_slice(&[1, 1, 1, 1]);
    v4_options.extend(l4(53, 5353));
    let mut hop_by_hop = vec![17, 0, 0, 0, 0, 0, 0, 0];
    hop_by_hop.extend(l4(1000, 2000));
    let later_fragment = [17u8, 0, 0, 0x08, 0, 0, 0, 1]; // offset 1
    let first_fragment = {
        let mut f = vec![6u8, 0, 0, 0x01, 0, 0, 0, 1]; // offset 0, more fragments
        f.extend(l4(3, 4));
        f
    };
    // (name, message body, expected)
    type Case = (&'static str, Vec<u8>, Result<Option<Denied>, ParseError>);
    let cases: Vec<Case> = vec![
        (
            "IPv4 TCP ingress",
            packet_body("ne-deny ingress", &tcp4_syn()),
            denied(Ingress, 6, "10.0.0.1:40000", "10.0.0.2:80"),
        ),
        (
            "IPv6 UDP egress",
            packet_body("ne-deny egress", &ipv6(17, v6a, v6b, &l4(5000, 53))),
            denied(Egress, 17, "[fd00::1]:5000", "[fd00::2]:53"),
        ),
        (
            "IPv4 with options",
            packet_body("ne-deny egress", &v4_options),
            denied(Egress, 17, "10.0.0.1:53", "10.0.0.2:5353"),
        ),
        (
            "IPv6 hop-by-hop then UDP",
            packet_body("ne-deny ingress", &ipv6(0, v6a, v6b, &hop_by_hop)),
            denied(Ingress, 17, "[fd00::1]:1000", "[fd00::2]:2000"),
        ),
        (
            "IPv6 first fragment has ports",
            packet_body("ne-deny ingress", &ipv6(44, v6a, v6b, &first_fragment)),
            denied(Ingress, 6, "[fd00::1]:3", "[fd00::2]:4"),
        ),
        (
            "IPv6 later fragment has none",
            packet_body("ne-deny ingress", &ipv6(44, v6a, v6b, &later_fragment)),
            denied(Ingress, 17, "[fd00::1]:0", "[fd00::2]:0"),
        ),
        (
            "IPv4 later fragment has none",
            packet_body("ne-deny ingress", &fragment),
            denied(Ingress, 6, "10.0.0.1:0", "10.0.0.2:0"),
        ),
        (
            "ICMP has no ports",
            packet_body(
                "ne-deny ingress",
                &ipv4(1, [10, 0, 0, 1], [10, 0, 0, 2], &[8, 0]),
            ),
            denied(Ingress, 1, "10.0.0.1:0", "10.0.0.2:0"),
        ),
        (
            "another prefix",
            packet_body("someone else", &tcp4_syn()),
            Ok(None),
        ),
        (
            "our prefix as a mere start",
            packet_body("ne-deny ingress2", &tcp4_syn()),
            Ok(None),
        ),
        (
            "no prefix",
            {
                let mut b = vec![2, 0, 0, 7];
                b.extend(attribute(NFULA_PAYLOAD, &tcp4_syn()));
                b
            },
            Err(ParseError::NoPrefix),
        ),
        (
            "no payload (copy mode meta)",
            {
                let mut b = vec![2, 0, 0, 7];
                b.extend(attribute(NFULA_PREFIX, b"ne-deny ingress\0"));
                b
            },
            Err(ParseError::NoPayload),
        ),
        (
            "IPv4 header truncated",
            packet_body("ne-deny ingress", &tcp4_syn()[..19]),
            Err(ParseError::TruncatedIpHeader {
                version: 4,
                length: 19,
            }),
        ),
        (
            "IPv4 header length beyond the payload",
            packet_body("ne-deny ingress", &{
                let mut p = ipv4(6, [10, 0, 0, 1], [10, 0, 0, 2], &[]);
                p[0] = 0x4f;
                p
            }),
            Err(ParseError::TruncatedIpHeader {
                version: 4,
                length: 20,
            }),
        ),
        (
            "IPv6 header truncated",
            packet_body("ne-deny ingress", &ipv6(17, v6a, v6b, &[])[..39]),
            Err(ParseError::TruncatedIpHeader {
                version: 6,
                length: 39,
            }),
        ),
        (
            "TCP ports cut by the copy range",
            packet_body(
                "ne-deny ingress",
                &ipv4(6, [10, 0, 0, 1], [10, 0, 0, 2], &[0, 80]),
            ),
            Err(ParseError::TruncatedTransportHeader {
                protocol: 6,
                available: 2,
            }),
        ),
        (
            "IPv6 extension header cut",
            packet_body("ne-deny ingress", &ipv6(0, v6a, v6b, &[17])),
            Err(ParseError::TruncatedExtensionHeader { length: 41 }),
        ),
        (
            "not IP",
            packet_body("ne-deny ingress", &[0x20; 40]),
            Err(ParseError::UnknownIpVersion(2)),
        ),
        (
            "empty payload",
            packet_body("ne-deny ingress", &[]),
            Err(ParseError::TruncatedIpHeader {
                version: 0,
                length: 0,
            }),
        ),
        (
            "no nfgenmsg",
            vec![2, 0],
            Err(ParseError::TruncatedNfgenmsg { length: 2 }),
        ),
        (
            "attribute longer than the message",
            {
                let mut b = vec![2, 0, 0, 7];
                b.extend_from_slice(&200u16.to_ne_bytes());
                b.extend_from_slice(&NFULA_PREFIX.to_ne_bytes());
                b.extend_from_slice(b"ne-d");
                b
            },
            Err(ParseError::BadAttributeLength {
                kind: NFULA_PREFIX,
                offset: 4,
                length: 200,
                available: 8,
            }),
        ),
        (
            "attribute shorter than its header",
            {
                let mut b = vec![2, 0, 0, 7];
                b.extend_from_slice(&2u16.to_ne_bytes());
                b.extend_from_slice(&NFULA_PAYLOAD.to_ne_bytes());
                b
            },
            Err(ParseError::BadAttributeLength {
                kind: NFULA_PAYLOAD,
                offset: 4,
                length: 2,
                available: 4,
            }),
        ),
        (
            "attribute header cut",
            vec![2, 0, 0, 7, 8, 0],
            Err(ParseError::TruncatedAttribute {
                offset: 4,
                available: 2,
            }),
        ),
    ];
    for (name, body, expected) in cases {
        assert_eq!(parse_packet(&body), expected, "{name}");
    }
}

#[test]
fn several_messages_in_one_datagram() {
    let mut datagram = packet_message("ne-deny ingress", &tcp4_syn());
    datagram.extend(packet_message("someone else", &tcp4_syn()));
    datagram.extend(netlink(NLMSG_ERROR, &[0; 20])); // an acknowledgement: not evidence
    datagram.extend(packet_message("ne-deny ingress", &[0x45])); // malformed, skipped
    datagram.extend(packet_message(
        "ne-deny egress",
        &ipv4(17, [10, 0, 0, 3], [10, 0, 0, 4], &l4(1, 2)),
    ));
    let parsed = parse_datagram(&datagram);
    assert_eq!(
        parsed.denied,
        vec![
            Denied {
                direction: DenyDirection::Ingress,
                protocol: 6,
                source: addr("10.0.0.1:40000"),
                destination: addr("10.0.0.2:80"),
            },
            Denied {
                direction: DenyDirection::Egress,
                protocol: 17,
                source: addr("10.0.0.3:1"),
                destination: addr("10.0.0.4:2"),
            },
        ]
    );
    assert_eq!(parsed.other_prefix, 1);
    assert_eq!(parsed.malformed, 1);
    assert_eq!(
        parsed.first_error,
        Some(ParseError::TruncatedIpHeader {
            version: 4,
            length: 1
        })
    );
}

#[test]
fn datagram_framing_table() {
    let good = packet_message("ne-deny ingress", &tcp4_syn());
    // Messages whose last attribute, and the datagram's last message, lack their padding.
    let mut odd_body = packet_body(
        "ne-deny ingress",
        &ipv4(1, [10, 0, 0, 1], [10, 0, 0, 2], &[8]),
    );
    odd_body.truncate(odd_body.len() - 3);
    let odd = netlink(NFNL_SUBSYS_ULOG << 8, &odd_body);
    let mut unpadded_last = odd.clone();
    unpadded_last.extend_from_slice(&odd[..NLMSG_HDRLEN + odd_body.len()]);
    let mut too_long = good.clone();
    too_long[0..4].copy_from_slice(&10_000u32.to_ne_bytes());
    let mut too_short = good.clone();
    too_short[0..4].copy_from_slice(&8u32.to_ne_bytes());
    let mut good_then_cut = good.clone();
    good_then_cut.extend_from_slice(&good[..10]);
    // (name, bytes, denied, malformed, first error)
    type Case = (&'static str, Vec<u8>, usize, u64, Option<ParseError>);
    let cases: Vec<Case> = vec![
        ("empty", vec![], 0, 0, None),
        ("one good", good.clone(), 1, 0, None),
        ("last without padding", unpadded_last, 2, 0, None),
        (
            "header cut",
            good[..10].to_vec(),
            0,
            1,
            Some(ParseError::TruncatedNetlinkHeader { available: 10 }),
        ),
        (
            "length beyond the datagram",
            too_long,
            0,
            1,
            Some(ParseError::BadNetlinkLength {
                length: 10_000,
                available: good.len(),
            }),
        ),
        (
            "length shorter than a header",
            too_short,
            0,
            1,
            Some(ParseError::BadNetlinkLength {
                length: 8,
                available: good.len(),
            }),
        ),
        (
            "good then cut",
            good_then_cut,
            1,
            1,
            Some(ParseError::TruncatedNetlinkHeader { available: 10 }),
        ),
    ];
    for (name, bytes, denied, malformed, first_error) in cases {
        let parsed = parse_datagram(&bytes);
        assert_eq!(parsed.denied.len(), denied, "{name}");
        assert_eq!(parsed.malformed, malformed, "{name}");
        assert_eq!(parsed.first_error, first_error, "{name}");
    }
}

#[test]
fn config_message_layout() {
    let m = config_message(
        7,
        libc::AF_UNSPEC as u8,
        0x1234,
        &[
            (NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND]),
            (NFULA_CFG_MODE, &[0, 0, 0, 128, 2, 0]),
        ],
    );
    // header 16 + nfgenmsg 4 + cmd (5 → 8) + mode (10 → 12)
    assert_eq!(m.len(), 40);
    assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 40);
    assert_eq!(u16::from_ne_bytes(m[4..6].try_into().unwrap()), 0x0401);
    assert_eq!(u16::from_ne_bytes(m[6..8].try_into().unwrap()), 0x5);
    assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 7);
    assert_eq!(&m[16..20], &[0, 0, 0x12, 0x34]);
    assert_eq!(&m[20..22], &5u16.to_ne_bytes());
    assert_eq!(&m[22..24], &NFULA_CFG_CMD.to_ne_bytes());
    assert_eq!(m[24], NFULNL_CFG_CMD_BIND);
    assert_eq!(u16::from_ne_bytes(m[28..30].try_into().unwrap()), 10);
    assert_eq!(&m[32..38], &[0, 0, 0, 128, 2, 0]);
}

fn denial(sport: u16) -> Denied {
    Denied {
        direction: DenyDirection::Ingress,
        protocol: 6,
        source: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), sport),
        destination: addr("10.0.0.2:80"),
    }
}

#[test]
fn dedupe_table() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let egress = Denied {
        direction: DenyDirection::Egress,
        ..denial(1)
    };
    let udp = Denied {
        protocol: 17,
        ..denial(1)
    };
    // (name, capacity, window, [(denial, seconds after t0, reported?)], suppressed, evicted)
    type Step = (Denied, u64, bool);
    type Case = (&'static str, usize, u64, Vec<Step>, u64, u64);
    let cases: Vec<Case> = vec![
        (
            "SYN retransmits reported once",
            16,
            60,
            vec![
                (denial(1), 0, true),
                (denial(1), 1, false),
                (denial(1), 3, false),
                (denial(1), 7, false),
            ],
            3,
            0,
        ),
        (
            "a new attempt has a new source port",
            16,
            60,
            vec![
                (denial(1), 0, true),
                (denial(2), 1, true),
                (denial(1), 2, false),
            ],
            1,
            0,
        ),
        (
            "direction and protocol are part of the key",
            16,
            60,
            vec![
                (denial(1), 0, true),
                (egress, 0, true),
                (udp, 0, true),
                (udp, 1, false),
            ],
            1,
            0,
        ),
        (
            "reported again once the window has passed",
            16,
            60,
            vec![
                (denial(1), 0, true),
                (denial(1), 59, false),
                (denial(1), 60, true),
                (denial(1), 61, false),
            ],
            2,
            0,
        ),
        (
            "overflow evicts the oldest",
            2,
            60,
            vec![
                (denial(1), 0, true),
                (denial(2), 1, true),
                (denial(3), 2, true), // evicts 1
                (denial(2), 3, false),
                (denial(1), 4, true), // forgotten: reported again, evicts 2
                (denial(3), 5, false),
            ],
            2,
            2,
        ),
        (
            "expired entries make room without eviction",
            1,
            10,
            vec![
                (denial(1), 0, true),
                (denial(2), 10, true),
                (denial(2), 11, false),
            ],
            1,
            0,
        ),
        (
            "capacity 0 acts as 1",
            0,
            60,
            vec![(denial(1), 0, true), (denial(1), 1, false)],
            1,
            0,
        ),
    ];
    for (name, capacity, window, steps, suppressed, evicted) in cases {
        let mut dedupe = Dedupe::new(capacity, s(window));
        for (i, (d, at, reported)) in steps.iter().enumerate() {
            assert_eq!(dedupe.admit(d, t0 + s(*at)), *reported, "{name}: step {i}");
            assert!(dedupe.len() <= capacity.max(1), "{name}: bounded");
        }
        assert_eq!(dedupe.suppressed(), suppressed, "{name}: suppressed");
        assert_eq!(dedupe.evicted(), evicted, "{name}: evicted");
    }
}

#[test]
fn errors_say_what_to_do() {
    let eperm = io::Error::from_raw_os_error(libc::EPERM);
    assert!(config_hint(&eperm).contains("CAP_NET_ADMIN"));
    assert!(config_hint(&eperm).contains("another NFLOG group"));
    let einval = io::Error::from_raw_os_error(libc::EINVAL);
    assert!(config_hint(&einval).contains("nfnetlink_log"));
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = parse_datagram(&bytes);
        let _ = parse_packet(&bytes);
    }

    /// Damage to a well-formed datagram (cuts, overwritten bytes) reaches deeper code paths than
    /// random bytes do.
    #[test]
    fn damaged_datagrams_never_panic(
        v6 in any::<bool>(),
        cut in 0usize..400,
        damage in proptest::collection::vec((0usize..400, any::<u8>()), 0..8),
    ) {
        let payload = if v6 {
            let a: Ipv6Addr = "fd00::1".parse().unwrap();
            let mut ext = vec![44u8, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0];
            ext.extend(l4(1, 2));
            ipv6(0, a, a, &ext)
        } else {
            tcp4_syn()
        };
        let mut bytes = packet_message("ne-deny ingress", &payload);
        bytes.extend(packet_message("ne-deny egress", &payload));
        for (at, value) in damage {
            if let Some(b) = bytes.get_mut(at) {
                *b = value;
            }
        }
        bytes.truncate(cut);
        let parsed = parse_datagram(&bytes);
        prop_assert!(parsed.denied.len() <= 2);
    }
}
