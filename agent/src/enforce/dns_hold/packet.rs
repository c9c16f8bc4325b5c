//! A queued packet read as a UDP datagram: the kernel hands the hold the IP packet as it is on the
//! wire at the hook (no link header). Pure.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// A UDP datagram: who sent it, to whom, and its payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Datagram<'a> {
    pub from: SocketAddr,
    pub to: SocketAddr,
    pub payload: &'a [u8],
}

const UDP: u8 = 17;

/// The datagram in `packet` (IPv4 or IPv6, UDP); `None` for anything else, a fragment, or a packet
/// shorter than its headers say. IPv6 extension headers are not walked (a DNS datagram has none).
pub fn udp(packet: &[u8]) -> Option<Datagram<'_>> {
    let (from, to, rest) = match packet.first()? >> 4 {
        4 => {
            let header_len = usize::from(packet[0] & 0x0f) * 4;
            let total = usize::from(u16::from_be_bytes([*packet.get(2)?, *packet.get(3)?]));
            let fragment = u16::from_be_bytes([*packet.get(6)?, *packet.get(7)?]);
            // More fragments, or an offset: not a whole datagram.
            if header_len < 20 || *packet.get(9)? != UDP || fragment & 0x3fff != 0 {
                return None;
            }
            let from = Ipv4Addr::from(<[u8; 4]>::try_from(packet.get(12..16)?).ok()?);
            let to = Ipv4Addr::from(<[u8; 4]>::try_from(packet.get(16..20)?).ok()?);
            let end = total.min(packet.len());
            (
                IpAddr::V4(from),
                IpAddr::V4(to),
                packet.get(header_len..end)?,
            )
        }
        6 => {
            if *packet.get(6)? != UDP {
                return None;
            }
            let payload_len = usize::from(u16::from_be_bytes([*packet.get(4)?, *packet.get(5)?]));
            let from = Ipv6Addr::from(<[u8; 16]>::try_from(packet.get(8..24)?).ok()?);
            let to = Ipv6Addr::from(<[u8; 16]>::try_from(packet.get(24..40)?).ok()?);
            let end = (40 + payload_len).min(packet.len());
            (IpAddr::V6(from), IpAddr::V6(to), packet.get(40..end)?)
        }
        _ => return None,
    };
    let source = u16::from_be_bytes([*rest.first()?, *rest.get(1)?]);
    let destination = u16::from_be_bytes([*rest.get(2)?, *rest.get(3)?]);
    let length = usize::from(u16::from_be_bytes([*rest.get(4)?, *rest.get(5)?]));
    if length < 8 {
        return None;
    }
    Some(Datagram {
        from: SocketAddr::new(from, source),
        to: SocketAddr::new(to, destination),
        payload: rest.get(8..length.min(rest.len()))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(payload: &[u8], fragment: u16) -> Vec<u8> {
        let total = 28 + payload.len();
        let mut p = vec![
            0x45, 0, 0, 0, 0, 0, 0, 0, 64, UDP, 0, 0, 10, 0, 0, 5, 10, 96, 0, 10,
        ];
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[6..8].copy_from_slice(&fragment.to_be_bytes());
        p.extend_from_slice(&40000u16.to_be_bytes());
        p.extend_from_slice(&53u16.to_be_bytes());
        p.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(payload);
        p
    }

    #[test]
    fn a_whole_udp_datagram_is_read_and_anything_else_is_not() {
        let packet = v4(b"dns", 0);
        assert_eq!(
            udp(&packet),
            Some(Datagram {
                from: "10.0.0.5:40000".parse().unwrap(),
                to: "10.96.0.10:53".parse().unwrap(),
                payload: b"dns",
            })
        );
        // A first fragment (more fragments set), a later fragment, TCP, truncated, empty.
        assert_eq!(udp(&v4(b"dns", 0x2000)), None);
        assert_eq!(udp(&v4(b"dns", 0x0010)), None);
        let mut tcp = v4(b"dns", 0);
        tcp[9] = 6;
        assert_eq!(udp(&tcp), None);
        assert_eq!(udp(&packet[..24]), None);
        assert_eq!(udp(&[]), None);
        assert_eq!(udp(&[0x45]), None);

        let mut six = vec![0x60, 0, 0, 0, 0, 11, UDP, 64];
        six.extend_from_slice(&"fd00::5".parse::<Ipv6Addr>().unwrap().octets());
        six.extend_from_slice(&"fd00::a".parse::<Ipv6Addr>().unwrap().octets());
        six.extend_from_slice(&[0x00, 0x35, 0x9c, 0x40, 0x00, 0x0b, 0, 0, b'a', b'b', b'c']);
        assert_eq!(
            udp(&six),
            Some(Datagram {
                from: "[fd00::5]:53".parse().unwrap(),
                to: "[fd00::a]:40000".parse().unwrap(),
                payload: b"abc",
            })
        );
    }
}
