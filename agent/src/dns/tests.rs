use super::answer::{DnsError, MAX_CHAIN, MAX_RECORDS, read_answer};
use super::tracker::{Limits, Pod, Refused, Tracker};
use simple_dns::rdata::{A, AAAA, CNAME, RData};
use simple_dns::{CLASS, Name, Packet, QCLASS, QTYPE, Question, RCODE, ResourceRecord, TYPE};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

fn query(id: u16, name: &str) -> Vec<u8> {
    let mut packet = Packet::new_query(id);
    packet.questions.push(Question::new(
        Name::new_unchecked(name),
        QTYPE::TYPE(TYPE::A),
        QCLASS::CLASS(CLASS::IN),
        false,
    ));
    packet.build_bytes_vec().unwrap()
}

/// A response to `name` (id `id`) with `records`: (owner, ttl, data).
fn response(id: u16, name: &str, records: &[(&str, u32, RData<'static>)]) -> Vec<u8> {
    let mut packet = Packet::new_reply(id);
    packet.questions.push(Question::new(
        Name::new_unchecked(name),
        QTYPE::TYPE(TYPE::A),
        QCLASS::CLASS(CLASS::IN),
        false,
    ));
    for (owner, ttl, data) in records {
        packet.answers.push(ResourceRecord::new(
            Name::new_unchecked(owner),
            CLASS::IN,
            *ttl,
            data.clone(),
        ));
    }
    packet.build_bytes_vec().unwrap()
}

fn a(ip: &str) -> RData<'static> {
    let ip: std::net::Ipv4Addr = ip.parse().unwrap();
    RData::A(A {
        address: u32::from(ip),
    })
}

fn aaaa(ip: &str) -> RData<'static> {
    let ip: std::net::Ipv6Addr = ip.parse().unwrap();
    RData::AAAA(AAAA {
        address: u128::from(ip),
    })
}

fn cname(target: &'static str) -> RData<'static> {
    RData::CNAME(CNAME(Name::new_unchecked(target)))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn an_answer_follows_cnames_back_to_the_asked_name_with_the_smallest_ttl() {
    let bytes = response(
        7,
        "API.Example.com",
        &[
            ("api.example.com", 300, cname("edge.cdn.example.net")),
            ("edge.cdn.example.net", 60, a("192.0.2.10")),
            ("edge.cdn.example.net", 600, aaaa("2001:db8::10")),
            // Not on the chain: ignored.
            ("other.example.org", 5, a("198.51.100.1")),
        ],
    );
    let answer = read_answer(&bytes).unwrap();
    assert_eq!(answer.id, 7);
    assert_eq!(answer.name, "api.example.com");
    assert_eq!(
        answer.addresses,
        vec![(ip("192.0.2.10"), 60), (ip("2001:db8::10"), 300)]
    );
}

#[test]
fn hostile_and_odd_responses_are_refused_or_read_as_nothing() {
    // A query is not an answer.
    assert_eq!(
        read_answer(&query(1, "a.example.com")),
        Err(DnsError::NotAResponse)
    );
    // Garbage.
    assert!(matches!(
        read_answer(&[1, 2, 3]),
        Err(DnsError::Malformed(_))
    ));
    // Too many records.
    let many: Vec<(&str, u32, RData<'static>)> = (0..=MAX_RECORDS)
        .map(|i| ("a.example.com", 30, a(&format!("192.0.2.{}", i % 250))))
        .collect();
    assert_eq!(
        read_answer(&response(2, "a.example.com", &many)),
        Err(DnsError::TooManyRecords(MAX_RECORDS + 1))
    );
    // A CNAME loop, and a chain one step too long.
    let looped = response(
        3,
        "a.example.com",
        &[
            ("a.example.com", 30, cname("b.example.com")),
            ("b.example.com", 30, cname("a.example.com")),
        ],
    );
    assert_eq!(read_answer(&looped), Err(DnsError::ChainTooLong));
    let names: Vec<String> = (0..=MAX_CHAIN + 1)
        .map(|i| format!("n{i}.example.com"))
        .collect();
    let names: Vec<&'static str> = names
        .into_iter()
        .map(|n| &*Box::leak(n.into_boxed_str()))
        .collect();
    let chain: Vec<(&str, u32, RData<'static>)> =
        names.windows(2).map(|w| (w[0], 30, cname(w[1]))).collect();
    assert_eq!(
        read_answer(&response(4, names[0], &chain)),
        Err(DnsError::ChainTooLong)
    );
    // Exactly the longest chain allowed is read.
    let ok: Vec<(&str, u32, RData<'static>)> = chain[..MAX_CHAIN]
        .iter()
        .cloned()
        .chain([(names[MAX_CHAIN], 30, a("192.0.2.1"))])
        .collect();
    assert_eq!(
        read_answer(&response(5, names[0], &ok)).unwrap().addresses,
        vec![(ip("192.0.2.1"), 30)]
    );
    // A name that is no host name.
    assert_eq!(
        read_answer(&response(6, "caf\u{e9}.example.com", &[])),
        Err(DnsError::NotAHostName)
    );
    // A negative answer: nothing resolved.
    let bytes = response(8, "gone.example.com", &[]);
    let mut nx = Packet::parse(&bytes).unwrap();
    *nx.rcode_mut() = RCODE::NameError;
    let nx = nx.build_bytes_vec().unwrap();
    assert!(read_answer(&nx).unwrap().addresses.is_empty());
    // A truncated message.
    let whole = response(9, "a.example.com", &[("a.example.com", 30, a("192.0.2.1"))]);
    assert!(read_answer(&whole[..whole.len() - 3]).is_err());
}

fn pod(name: &str) -> Pod {
    name.into()
}

fn at(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[test]
fn only_an_answer_to_a_query_the_pod_sent_is_believed_until_its_ttl_and_grace() {
    let limits = Limits {
        grace: Duration::from_secs(10),
        ..Limits::default()
    };
    let mut tracker = Tracker::new(limits);
    let t0 = Duration::from_secs(1_000);
    let (web, other) = (pod("web"), pod("other"));
    let (client, dns) = (at("10.244.0.5:40000"), at("10.96.0.10:53"));
    let answer = response(
        42,
        "api.example.com",
        &[("api.example.com", 60, a("192.0.2.10"))],
    );

    // Nobody asked: unsolicited.
    assert_eq!(
        tracker.answer(&web, client, dns, &answer, t0),
        Err(Refused::Unsolicited)
    );
    tracker.query(&web, client, dns, &query(42, "api.example.com"), t0);
    // Another pod, another port, another server or another question: not this query's answer.
    assert_eq!(
        tracker.answer(&other, client, dns, &answer, t0),
        Err(Refused::Unsolicited)
    );
    assert_eq!(
        tracker.answer(&web, at("10.244.0.5:40001"), dns, &answer, t0),
        Err(Refused::Unsolicited)
    );
    assert_eq!(
        tracker.answer(&web, client, at("10.96.0.11:53"), &answer, t0),
        Err(Refused::Unsolicited)
    );
    let spoofed = response(
        42,
        "evil.example.com",
        &[("evil.example.com", 60, a("192.0.2.66"))],
    );
    assert_eq!(
        tracker.answer(&web, client, dns, &spoofed, t0),
        Err(Refused::Unsolicited)
    );
    // The answer.
    assert_eq!(
        tracker.answer(&web, client, dns, &answer, t0).unwrap(),
        vec![(ip("192.0.2.10"), "api.example.com".into())]
    );
    // Once: a repeat is unsolicited.
    assert_eq!(
        tracker.answer(&web, client, dns, &answer, t0),
        Err(Refused::Unsolicited)
    );
    assert_eq!(
        tracker.name_of(&web, ip("192.0.2.10"), t0),
        Some("api.example.com")
    );
    assert_eq!(tracker.name_of(&other, ip("192.0.2.10"), t0), None);
    // TTL 60 s plus the 10 s grace.
    assert!(
        tracker
            .name_of(&web, ip("192.0.2.10"), t0 + Duration::from_secs(69))
            .is_some()
    );
    assert!(
        tracker
            .name_of(&web, ip("192.0.2.10"), t0 + Duration::from_secs(70))
            .is_none()
    );
    tracker.expire(t0 + Duration::from_secs(70));
    assert!(tracker.name_of(&web, ip("192.0.2.10"), t0).is_none());
    // A query's answer arriving after the timeout is unsolicited.
    tracker.query(&web, client, dns, &query(43, "api.example.com"), t0);
    let late = response(
        43,
        "api.example.com",
        &[("api.example.com", 60, a("192.0.2.11"))],
    );
    assert_eq!(
        tracker.answer(&web, client, dns, &late, t0 + Duration::from_secs(6)),
        Err(Refused::Unsolicited)
    );
    let c = tracker.counters();
    assert_eq!((c.queries, c.answers, c.unsolicited), (2, 1, 7));
}

#[test]
fn with_replace_oldest_pending_a_new_query_takes_the_room_of_the_pods_oldest() {
    // The DNS hold's tracker: answers with nothing new never reach it, their queries stay pending.
    let limits = Limits {
        pending_per_pod: 4,
        pending: 6,
        replace_oldest_pending: true,
        ..Limits::default()
    };
    let mut tracker = Tracker::new(limits);
    let t0 = Duration::from_secs(1_000);
    let (spray, web) = (pod("spray"), pod("web"));
    let dns = at("10.96.0.10:53");
    let client = at("10.244.0.9:5000");
    tracker.query(
        &web,
        at("10.244.0.5:5000"),
        dns,
        &query(1, "api.example.com"),
        t0,
    );
    for id in 0..100u16 {
        tracker.query(
            &spray,
            client,
            dns,
            &query(id, &format!("r{id}.example.com")),
            t0,
        );
    }
    let c = tracker.counters();
    // Never refused: the pod's own oldest queries made room (96), never the other pod's.
    assert_eq!((c.pending_full, c.pending_replaced), (0, 96));
    let answer = |id: u16, name: &str| response(id, name, &[(name, 60, a("192.0.2.1"))]);
    assert!(
        tracker
            .answer(&spray, client, dns, &answer(99, "r99.example.com"), t0)
            .is_ok()
    );
    assert_eq!(
        tracker.answer(&spray, client, dns, &answer(0, "r0.example.com"), t0),
        Err(Refused::Unsolicited)
    );
    assert!(
        tracker
            .answer(
                &web,
                at("10.244.0.5:5000"),
                dns,
                &answer(1, "api.example.com"),
                t0
            )
            .is_ok()
    );
    // The node's bound: the oldest pending query on the node makes room, whoever sent it.
    for (n, name) in ["a", "b", "c"].iter().enumerate() {
        let other = pod(name);
        for id in 0..3u16 {
            tracker.query(
                &other,
                client,
                dns,
                &query(id, "x.example.com"),
                t0 + Duration::from_millis(n as u64),
            );
        }
    }
    let c = tracker.counters();
    assert_eq!(c.pending_full, 0);
    assert!(c.pending_replaced > 96, "{c:?}");
}

#[test]
fn a_pod_querying_many_names_fills_only_its_own_room() {
    let limits = Limits {
        pending_per_pod: 4,
        pending: 6,
        names_per_pod: 2,
        names: 3,
        ..Limits::default()
    };
    let mut tracker = Tracker::new(limits);
    let t0 = Duration::from_secs(1_000);
    let (spray, web) = (pod("spray"), pod("web"));
    let dns = at("10.96.0.10:53");
    for id in 0..100u16 {
        tracker.query(
            &spray,
            at("10.244.0.9:5000"),
            dns,
            &query(id, &format!("r{id}.example.com")),
            t0,
        );
    }
    assert_eq!(tracker.counters().pending_full, 96);
    // The other pod still has room.
    tracker.query(
        &web,
        at("10.244.0.5:5000"),
        dns,
        &query(1, "api.example.com"),
        t0,
    );
    let answer = response(
        1,
        "api.example.com",
        &[
            ("api.example.com", 60, a("192.0.2.1")),
            ("api.example.com", 60, a("192.0.2.2")),
            ("api.example.com", 60, a("192.0.2.3")),
        ],
    );
    // Two addresses per pod: the third is counted, not kept.
    let believed = tracker
        .answer(&web, at("10.244.0.5:5000"), dns, &answer, t0)
        .unwrap();
    assert_eq!(believed.len(), 2);
    assert_eq!(tracker.counters().names_full, 1);
    // A pod that is gone leaves no room taken.
    tracker.forget_pod(&spray);
    tracker.query(
        &spray,
        at("10.244.0.9:5000"),
        dns,
        &query(500, "again.example.com"),
        t0,
    );
    assert_eq!(tracker.counters().pending_full, 96);
}

#[test]
fn resolving_again_keeps_a_connection_made_between_the_answers_named() {
    let mut tracker = Tracker::new(Limits::default());
    let t0 = Duration::from_secs(1_000);
    let web = pod("web");
    let (client, dns) = (at("10.244.0.5:40000"), at("10.96.0.10:53"));
    let exchange = |tracker: &mut Tracker, id: u16, t: Duration| {
        tracker.query(&web, client, dns, &query(id, "api.example.com"), t);
        let answer = response(
            id,
            "api.example.com",
            &[("api.example.com", 5, a("192.0.2.10"))],
        );
        tracker.answer(&web, client, dns, &answer, t).unwrap();
    };
    exchange(&mut tracker, 1, t0);
    // The pod connects 1 s later, then resolves the name again before the flush asks.
    let connected = t0 + Duration::from_secs(1);
    exchange(&mut tracker, 2, t0 + Duration::from_secs(2));
    assert_eq!(
        tracker.name_of(&web, ip("192.0.2.10"), connected),
        Some("api.example.com")
    );
    // Once it had expired, a new answer starts afresh: a connection before it was not by name.
    let later = t0 + Duration::from_secs(2 + 5 + 31);
    exchange(&mut tracker, 3, later);
    assert_eq!(
        tracker.name_of(&web, ip("192.0.2.10"), later - Duration::from_secs(1)),
        None
    );
}

// The wire reader on hand-built messages: what a resolver sends, and what a hostile one could.

const QR: u16 = 0x8000;
const T_A: u16 = 1;
const T_CNAME: u16 = 5;
const T_NULL: u16 = 10;
const T_AAAA: u16 = 28;
const T_OPT: u16 = 41;

/// A message: id 7, `flags`, the four section counts, then `body`.
fn raw(flags: u16, counts: [u16; 4], body: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 7];
    out.extend(flags.to_be_bytes());
    for c in counts {
        out.extend(c.to_be_bytes());
    }
    out.extend(body);
    out
}

/// A name's labels, uncompressed, with the root.
fn labels(name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for label in name.split('.').filter(|l| !l.is_empty()) {
        out.push(label.len() as u8);
        out.extend(label.as_bytes());
    }
    out.push(0);
    out
}

/// A question for `qtype`, class IN.
fn q(name: &[u8], qtype: u16) -> Vec<u8> {
    let mut out = name.to_vec();
    out.extend(qtype.to_be_bytes());
    out.extend(1u16.to_be_bytes());
    out
}

/// A record of class `class`.
fn rr_in(owner: &[u8], rtype: u16, class: u16, ttl: u32, rdata: &[u8]) -> Vec<u8> {
    let mut out = owner.to_vec();
    out.extend(rtype.to_be_bytes());
    out.extend(class.to_be_bytes());
    out.extend(ttl.to_be_bytes());
    out.extend((rdata.len() as u16).to_be_bytes());
    out.extend(rdata);
    out
}

fn rr(owner: &[u8], rtype: u16, ttl: u32, rdata: &[u8]) -> Vec<u8> {
    rr_in(owner, rtype, 1, ttl, rdata)
}

/// A pointer to `offset`.
fn ptr(offset: usize) -> Vec<u8> {
    vec![0xc0 | (offset >> 8) as u8, offset as u8]
}

/// The question's name is at offset 12.
const QNAME: usize = 12;

/// What a table case expects: the addresses, or which refusal.
#[derive(Debug, PartialEq)]
enum Read {
    Addresses(Vec<(IpAddr, u32)>),
    Malformed,
    Refused(DnsError),
}

fn read(bytes: &[u8]) -> Read {
    match read_answer(bytes) {
        Ok(answer) => Read::Addresses(answer.addresses),
        Err(DnsError::Malformed(_)) => Read::Malformed,
        Err(e) => Read::Refused(e),
    }
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn the_wire_reader_follows_the_format_and_refuses_what_is_out_of_bounds() {
    let name = labels("api.example.com");
    let question = q(&name, T_A);
    let v4 = [192, 0, 2, 10];
    let v6: [u8; 16] = "2001:db8::10"
        .parse::<std::net::Ipv6Addr>()
        .unwrap()
        .octets();
    let ok =
        |list: &[(&str, u32)]| Read::Addresses(list.iter().map(|(a, t)| (ip(a), *t)).collect());
    // Offset of the first answer record.
    let answers = QNAME + question.len();
    let long_label = "a".repeat(63);
    // Labels of 63, 63, 63 and 61 bytes: 253 as text, 254 on the wire (the longest name).
    let longest = format!("{long_label}.{long_label}.{long_label}.{}", "b".repeat(61));
    let too_long = format!("{long_label}.{long_label}.{long_label}.{}", "b".repeat(62));
    // A chain of pointers, each to the one before, in the data of a record nobody reads: the first
    // at `chain`, pointing to the question's name.
    let chain_of = |n: usize| {
        // After the record's owner (a pointer) and its 10 bytes of type, class, TTL and length.
        let chain = answers + 2 + 10;
        let mut data = ptr(QNAME);
        for i in 1..n {
            data.extend(ptr(chain + 2 * (i - 1)));
        }
        let last = chain + 2 * (n - 1);
        let null = rr(&ptr(QNAME), T_NULL, 30, &data);
        assert_eq!(answers + null.len(), chain + data.len());
        cat(&[&question, &null, &rr(&ptr(last), T_A, 30, &v4)])
    };
    let cases: Vec<(&str, Vec<u8>, Read)> = vec![
        (
            "an address in the authority section is not an answer",
            raw(
                QR,
                [1, 0, 1, 0],
                &cat(&[&question, &rr(&ptr(QNAME), T_A, 30, &v4)]),
            ),
            ok(&[]),
        ),
        (
            "an address and a CNAME in the additional section are not answers",
            raw(
                QR,
                [1, 1, 0, 2],
                &cat(&[
                    &question,
                    &rr(&ptr(QNAME), T_AAAA, 30, &v6),
                    &rr(&ptr(QNAME), T_CNAME, 30, &labels("b.example.com")),
                    &rr(&ptr(QNAME), T_A, 30, &v4),
                ]),
            ),
            ok(&[("2001:db8::10", 30)]),
        ),
        (
            "compressed owner",
            raw(
                QR,
                [1, 1, 0, 0],
                &cat(&[&question, &rr(&ptr(QNAME), T_A, 30, &v4)]),
            ),
            ok(&[("192.0.2.10", 30)]),
        ),
        (
            "owner compressed to the question's suffix",
            raw(
                QR,
                [1, 1, 0, 0],
                &cat(&[
                    &question,
                    &rr(&cat(&[&[3], b"api", &ptr(QNAME + 4)]), T_A, 30, &v4),
                ]),
            ),
            ok(&[("192.0.2.10", 30)]),
        ),
        (
            "upper-case question and owner",
            raw(
                QR,
                [1, 1, 0, 0],
                &cat(&[
                    &q(&labels("API.Example.COM"), T_A),
                    &rr(&labels("api.EXAMPLE.com"), T_A, 30, &v4),
                ]),
            ),
            ok(&[("192.0.2.10", 30)]),
        ),
        (
            "AAAA",
            raw(
                QR,
                [1, 1, 0, 0],
                &cat(&[&q(&name, T_AAAA), &rr(&ptr(QNAME), T_AAAA, 60, &v6)]),
            ),
            ok(&[("2001:db8::10", 60)]),
        ),
        (
            "a pointer to itself",
            raw(
                QR,
                [1, 1, 0, 0],
                &cat(&[&question, &rr(&ptr(answers), T_A, 30, &v4)]),
            ),
            Read::Malformed,
        ),
        (
            "a pointer forward",
            raw(
                QR,
                [1, 1, 0, 0],
                &cat(&[&question, &rr(&ptr(answers + 2), T_A, 30, &v4)]),
            ),
            Read::Malformed,
        ),
        (
            "a pointer past the end",
            raw(
                QR,
                [1, 1, 0, 0],
                &cat(&[&question, &rr(&ptr(0x3fff), T_A, 30, &v4)]),
            ),
            Read::Malformed,
        ),
        (
            "a pointer cut in half",
            raw(QR, [1, 0, 0, 0], &[0xc0]),
            Read::Malformed,
        ),
        (
            "127 jumps",
            raw(QR, [1, 2, 0, 0], &chain_of(126)),
            ok(&[("192.0.2.10", 30)]),
        ),
        (
            "128 jumps",
            raw(QR, [1, 2, 0, 0], &chain_of(127)),
            Read::Malformed,
        ),
        (
            "a label of 64 bytes",
            raw(QR, [1, 0, 0, 0], &q(&cat(&[&[64], &[b'a'; 64], &[0]]), T_A)),
            Read::Malformed,
        ),
        (
            "the longest name",
            raw(
                QR,
                [1, 1, 0, 0],
                &cat(&[&q(&labels(&longest), T_A), &rr(&ptr(QNAME), T_A, 30, &v4)]),
            ),
            ok(&[("192.0.2.10", 30)]),
        ),
        (
            "a name of 254 bytes as text",
            raw(QR, [1, 0, 0, 0], &q(&labels(&too_long), T_A)),
            Read::Malformed,
        ),
        (
            "a name made too long through a pointer",
            raw(
                QR,
                [1, 1, 0, 0],
                &cat(&[
                    &q(&labels(&longest), T_A),
                    &rr(&cat(&[&[5], b"extra", &ptr(QNAME)]), T_A, 30, &v4),
                ]),
            ),
            Read::Malformed,
        ),
        (
            "a non-ASCII question",
            raw(QR, [1, 0, 0, 0], &q(&labels("caf\u{e9}.example.com"), T_A)),
            Read::Refused(DnsError::NotAHostName),
        ),
        (
            "a non-ASCII owner off the chain",
            raw(
                QR,
                [1, 2, 0, 0],
                &cat(&[
                    &question,
                    &rr(
                        &labels("caf\u{e9}.example.com"),
                        T_A,
                        30,
                        &[198, 51, 100, 1],
                    ),
                    &rr(&ptr(QNAME), T_A, 30, &v4),
                ]),
            ),
            ok(&[("192.0.2.10", 30)]),
        ),
        (
            "a non-ASCII CNAME target",
            raw(
                QR,
                [1, 1, 0, 0],
                &cat(&[
                    &question,
                    &rr(&ptr(QNAME), T_CNAME, 30, &labels("caf\u{e9}.example.net")),
                ]),
            ),
            Read::Refused(DnsError::NotAHostName),
        ),
        (
            "a CNAME target pointing out of its data",
            raw(
                QR,
                [1, 1, 0, 0],
                &cat(&[&question, &rr(&ptr(QNAME), T_CNAME, 30, &[3, b'a', b'p'])]),
            ),
            Read::Malformed,
        ),
        (
            "a compressed CNAME chain with the smallest TTL",
            raw(
                QR,
                [1, 2, 0, 0],
                &cat(&[
                    &question,
                    &rr(
                        &ptr(QNAME),
                        T_CNAME,
                        300,
                        &cat(&[&[4], b"edge", &ptr(QNAME + 4)]),
                    ),
                    &rr(&cat(&[&[4], b"EDGE", &ptr(QNAME + 4)]), T_A, 600, &v4),
                ]),
            ),
            ok(&[("192.0.2.10", 300)]),
        ),
        (
            "NXDOMAIN with records",
            raw(
                QR | 3,
                [1, 1, 0, 0],
                &cat(&[&question, &rr(&ptr(QNAME), T_A, 30, &v4)]),
            ),
            ok(&[]),
        ),
        (
            "EDNS extended RCODE (BADVERS)",
            raw(
                QR,
                [1, 1, 0, 1],
                &cat(&[
                    &question,
                    &rr(&ptr(QNAME), T_A, 30, &v4),
                    &rr_in(&[0], T_OPT, 1232, 1 << 24, &[]),
                ]),
            ),
            ok(&[]),
        ),
        (
            "EDNS with an option, NOERROR",
            raw(
                QR,
                [1, 1, 0, 1],
                &cat(&[
                    &question,
                    &rr(&ptr(QNAME), T_A, 30, &v4),
                    &rr_in(&[0], T_OPT, 1232, 0, &[0, 10, 0, 2, 1, 2]),
                ]),
            ),
            ok(&[("192.0.2.10", 30)]),
        ),
        (
            "EDNS option cut",
            raw(
                QR,
                [1, 1, 0, 1],
                &cat(&[
                    &question,
                    &rr(&ptr(QNAME), T_A, 30, &v4),
                    &rr_in(&[0], T_OPT, 1232, 0, &[0, 10, 0, 3, 1, 2]),
                ]),
            ),
            Read::Malformed,
        ),
        (
            "two questions",
            raw(QR, [2, 0, 0, 0], &cat(&[&question, &question])),
            Read::Refused(DnsError::Questions(2)),
        ),
        (
            "no question",
            raw(QR, [0, 0, 0, 0], &[]),
            Read::Refused(DnsError::Questions(0)),
        ),
        (
            "the reserved bit",
            raw(QR | 0x0040, [1, 0, 0, 0], &question),
            Read::Malformed,
        ),
        (
            "an unknown question type",
            raw(QR, [1, 0, 0, 0], &q(&name, 0xff00)),
            Read::Malformed,
        ),
        (
            "an unknown record class",
            raw(
                QR,
                [1, 1, 0, 0],
                &cat(&[&question, &rr_in(&ptr(QNAME), T_A, 9, 30, &v4)]),
            ),
            Read::Malformed,
        ),
        (
            "an empty A record",
            raw(
                QR,
                [1, 1, 0, 0],
                &cat(&[&question, &rr(&ptr(QNAME), T_A, 30, &[])]),
            ),
            ok(&[]),
        ),
        (
            "an A record of 2 bytes",
            raw(
                QR,
                [1, 1, 0, 0],
                &cat(&[&question, &rr(&ptr(QNAME), T_A, 30, &[192, 0])]),
            ),
            Read::Malformed,
        ),
        (
            "a record cut in the authority section",
            raw(
                QR,
                [1, 1, 1, 0],
                &cat(&[&question, &rr(&ptr(QNAME), T_A, 30, &v4), &[0, 0, 6]]),
            ),
            Read::Malformed,
        ),
        (
            "trailing bytes",
            raw(
                QR,
                [1, 1, 0, 0],
                &cat(&[&question, &rr(&ptr(QNAME), T_A, 30, &v4), &[1, 2, 3]]),
            ),
            ok(&[("192.0.2.10", 30)]),
        ),
    ];
    for (what, bytes, expected) in cases {
        assert_eq!(read(&bytes), expected, "{what}");
    }
}

#[test]
fn the_wire_reader_refuses_every_cut_and_bounds_records_and_chains() {
    let name = labels("api.example.com");
    let whole = raw(
        QR,
        [1, 2, 0, 0],
        &cat(&[
            &q(&name, T_A),
            &rr(&ptr(QNAME), T_CNAME, 300, &labels("edge.example.net")),
            &rr(&labels("edge.example.net"), T_A, 60, &[192, 0, 2, 10]),
        ]),
    );
    assert_eq!(read(&whole), Read::Addresses(vec![(ip("192.0.2.10"), 60)]));
    for len in 0..whole.len() {
        assert_eq!(read(&whole[..len]), Read::Malformed, "cut at {len}");
    }
    // 64 records are read, 65 refused.
    let records = |n: u16| {
        let mut body = q(&name, T_A);
        for i in 0..n {
            body.extend(rr(&ptr(QNAME), T_A, 30, &[192, 0, 2, i as u8]));
        }
        raw(QR, [1, n, 0, 0], &body)
    };
    assert!(matches!(read(&records(64)), Read::Addresses(a) if a.len() == 64));
    assert_eq!(
        read(&records(65)),
        Read::Refused(DnsError::TooManyRecords(65))
    );
    // A compressed chain of MAX_CHAIN CNAMEs is followed, one more refused: n{i}.x → n{i+1}.x.
    let chain = |n: usize| {
        let mut body = q(&labels("n0.x"), T_A);
        let mut owner = ptr(QNAME);
        for i in 1..=n {
            let at = QNAME + body.len() + owner.len() + 10;
            let target = cat(&[&labels(&format!("n{i}"))[..3], &ptr(QNAME + 3)]);
            body.extend(rr(&owner, T_CNAME, 30, &target));
            owner = ptr(at);
        }
        body.extend(rr(&owner, T_A, 30, &[192, 0, 2, 1]));
        raw(QR, [1, n as u16 + 1, 0, 0], &body)
    };
    assert_eq!(
        read(&chain(MAX_CHAIN)),
        Read::Addresses(vec![(ip("192.0.2.1"), 30)])
    );
    assert_eq!(
        read(&chain(MAX_CHAIN + 1)),
        Read::Refused(DnsError::ChainTooLong)
    );
}

#[test]
fn queries_are_read_in_place_whatever_their_case_and_extras() {
    let (web, client, dns) = (pod("web"), at("10.244.0.5:40000"), at("10.96.0.10:53"));
    let t0 = Duration::from_secs(1_000);
    let name = labels("API.Example.com");
    let opt = rr_in(&[0], T_OPT, 1232, 0x8000, &[]);
    let answer = raw(
        QR,
        [1, 1, 0, 0],
        &cat(&[
            &q(&labels("api.example.COM"), T_A),
            &rr(&ptr(QNAME), T_A, 30, &[192, 0, 2, 10]),
        ]),
    );
    let cases: Vec<(&str, Vec<u8>, bool, u64)> = vec![
        // (what, the query, whether its answer is believed, malformed counted)
        (
            "with EDNS",
            raw(0x0100, [1, 0, 0, 1], &cat(&[&q(&name, T_A), &opt])),
            true,
            0,
        ),
        (
            "a response",
            raw(QR, [1, 0, 0, 0], &q(&name, T_A)),
            false,
            0,
        ),
        (
            "two questions",
            raw(0, [2, 0, 0, 0], &cat(&[&q(&name, T_A), &q(&name, T_A)])),
            false,
            0,
        ),
        ("cut", raw(0, [1, 0, 0, 0], &q(&name, T_A)[..5]), false, 1),
        (
            "not a host name",
            raw(0, [1, 0, 0, 0], &q(&labels("a b.example.com"), T_A)),
            false,
            1,
        ),
        (
            "another name",
            raw(0, [1, 0, 0, 0], &q(&labels("api.example.org"), T_A)),
            false,
            0,
        ),
    ];
    for (what, query, believed, malformed) in cases {
        let mut tracker = Tracker::new(Limits::default());
        tracker.query(&web, client, dns, &query, t0);
        let got = tracker.answer(&web, client, dns, &answer, t0);
        assert_eq!(got.is_ok(), believed, "{what}: {got:?}");
        assert_eq!(tracker.counters().malformed, malformed, "{what}");
        if believed {
            assert_eq!(
                tracker.name_of(&web, ip("192.0.2.10"), t0),
                Some("api.example.com"),
                "{what}"
            );
        }
    }
}

#[test]
fn a_pods_number_is_given_back_once_it_holds_nothing() {
    // Pods come and go: each holds one resolution until it expires, and then nothing of it stays.
    let mut tracker = Tracker::new(Limits {
        grace: Duration::ZERO,
        ..Limits::default()
    });
    let dns = at("10.96.0.10:53");
    let t0 = Duration::from_secs(1_000);
    for round in 0..3u64 {
        let t = t0 + Duration::from_secs(100 * round);
        for p in 0..50u16 {
            let (pod, client) = (
                pod(&format!("pod-{round}-{p}")),
                at(&format!("10.244.0.{}:5000", p + 1)),
            );
            tracker.query(&pod, client, dns, &query(p, "api.example.com"), t);
            let answer = response(
                p,
                "api.example.com",
                &[("api.example.com", 10, a("192.0.2.1"))],
            );
            assert_eq!(
                tracker.answer(&pod, client, dns, &answer, t).unwrap().len(),
                1
            );
            assert_eq!(
                tracker.name_of(&pod, ip("192.0.2.1"), t),
                Some("api.example.com")
            );
        }
        assert_eq!(tracker.resolved(), 50);
        tracker.expire(t + Duration::from_secs(10));
        assert_eq!(tracker.resolved(), 0);
    }
    // A pod that asks after its number went to another pod sees nothing of the other's.
    let (old, new) = (pod("pod-2-0"), pod("fresh"));
    let t = t0 + Duration::from_secs(1_000);
    tracker.query(
        &new,
        at("10.244.0.1:5000"),
        dns,
        &query(1, "b.example.com"),
        t,
    );
    assert_eq!(
        tracker.name_of(&old, ip("192.0.2.1"), t0 + Duration::from_secs(200)),
        None
    );
    assert_eq!(
        tracker.answer(
            &old,
            at("10.244.0.1:5000"),
            dns,
            &response(1, "b.example.com", &[]),
            t
        ),
        Err(Refused::Unsolicited)
    );
    // One pod holds something; the numbers of the 150 before were reused.
    let (pods, numbers) = tracker.pods_held();
    assert_eq!(pods, 1);
    assert!(numbers <= 50, "{numbers} numbers");
}

#[test]
fn a_name_is_held_once_and_only_while_something_holds_it() {
    let mut tracker = Tracker::new(Limits::default());
    let dns = at("10.96.0.10:53");
    let t = Duration::from_secs(1_000);
    // Two pods resolve the same name, whatever its case: one name held.
    for (p, asked) in [(1u16, "API.example.com"), (2, "api.EXAMPLE.com")] {
        let (pod, client) = (pod(&format!("pod-{p}")), at(&format!("10.244.0.{p}:5000")));
        tracker.query(&pod, client, dns, &query(p, asked), t);
        let answer = response(p, asked, &[(asked, 10, a("192.0.2.1"))]);
        assert_eq!(
            tracker.answer(&pod, client, dns, &answer, t).unwrap().len(),
            1
        );
    }
    assert_eq!(tracker.names_held().0, 1);
    // A pod asking one socket and id again and again for new names (each replacing the last): the
    // names nobody holds any more are dropped, not kept to the next expiry.
    let (pod, client) = (pod("sprayer"), at("10.244.0.9:5000"));
    for i in 0..3 * super::tracker::NAMES_SLACK {
        tracker.query(
            &pod,
            client,
            dns,
            &query(7, &format!("n{i}.example.com")),
            t,
        );
    }
    let (held, _) = tracker.names_held();
    assert!(held <= super::tracker::NAMES_SLACK + 3, "{held} names held");
    // Once the resolutions and the query expire, no name is held.
    tracker.expire(t + Duration::from_secs(3_600));
    assert_eq!(tracker.names_held().0, 0);
}

#[test]
fn names_the_caller_keeps_do_not_make_every_query_sweep() {
    // The caller keeps what the answers believed (as the pipeline does until its next flush), past
    // the resolutions' end: a sweep keeps those names. Names asked after that are still swept once
    // per NAMES_SLACK added, not at every query: the set stays at what is held plus the slack.
    let slack = super::tracker::NAMES_SLACK;
    let mut tracker = Tracker::new(Limits {
        grace: Duration::ZERO,
        ..Limits::default()
    });
    let dns = at("10.96.0.10:53");
    let t = Duration::from_secs(1_000);
    let (pod, client) = (pod("resolver"), at("10.244.0.9:5000"));
    let mut kept = Vec::new();
    for i in 0..slack + 100 {
        let (id, name) = (i as u16, format!("kept{i}.example.com"));
        tracker.query(&pod, client, dns, &query(id, &name), t);
        let answer = response(id, &name, &[(&name, 1, a("192.0.2.1"))]);
        kept.extend(tracker.answer(&pod, client, dns, &answer, t).unwrap());
    }
    tracker.expire(t + Duration::from_secs(10));
    assert_eq!(tracker.resolved(), 0);
    let (held, swept_before) = tracker.names_held();
    assert_eq!(held, slack + 100, "the kept names stay");
    for i in 0..3 * slack {
        tracker.query(
            &pod,
            client,
            dns,
            &query(7, &format!("n{i}.example.com")),
            t,
        );
    }
    let (held, swept) = tracker.names_held();
    assert!(held <= 2 * slack + 101, "{held} names held");
    assert!(held > slack + 100, "{held}: swept, not emptied");
    assert!(
        swept - swept_before <= 3,
        "{} sweeps for {} names",
        swept - swept_before,
        3 * slack
    );
    drop(kept);
}

#[test]
fn an_answer_whose_question_is_no_host_name_is_malformed_not_unsolicited() {
    // The tracker checks an answer's question only when it is not the pending query's name: one that
    // is no host name is still counted as malformed, and one that is, but unasked, as unsolicited.
    let mut tracker = Tracker::new(Limits::default());
    let (dns, client, t) = (
        at("10.96.0.10:53"),
        at("10.244.0.1:5000"),
        Duration::from_secs(1),
    );
    let p = pod("asker");
    tracker.query(&p, client, dns, &query(1, "api.example.com"), t);
    let bad = raw(
        QR,
        [1, 1, 0, 0],
        &cat(&[
            &q(&labels("a!b.example.com"), T_A),
            &rr(&ptr(QNAME), T_A, 30, &[192, 0, 2, 1]),
        ]),
    );
    let refused = tracker.answer(&p, client, dns, &bad, t);
    assert_eq!(refused, Err(Refused::Dns(DnsError::NotAHostName)));
    let unasked = response(
        1,
        "other.example.com",
        &[("other.example.com", 30, a("192.0.2.1"))],
    );
    assert_eq!(
        tracker.answer(&p, client, dns, &unasked, t),
        Err(Refused::Unsolicited)
    );
    let c = tracker.counters();
    assert_eq!((c.malformed, c.unsolicited, c.answers), (1, 1, 0));
    // The query still waits for its answer.
    let answer = response(
        1,
        "api.example.com",
        &[("api.example.com", 30, a("192.0.2.1"))],
    );
    assert_eq!(
        tracker.answer(&p, client, dns, &answer, t).unwrap().len(),
        1
    );
}
