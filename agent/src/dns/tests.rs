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
