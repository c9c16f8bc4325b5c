//! The DNS wire format (RFC 1035 section 4), read with the `domain` crate (NLnet Labs) in place over
//! the message's bytes: no copy, no allocation. `domain` bounds-checks every read, follows compression
//! pointers only back (so a name always ends), and refuses a label over 63 bytes or a name of 255
//! bytes or more; its names compare ignoring ASCII case.
//!
//! What is refused mirrors what `simple-dns` (which the agent used before) refuses, so the same
//! messages are malformed. `domain` itself refuses: a message shorter than its header; a name that is
//! cut, has a label over 63 bytes (or of an extended or obsolete type), is 255 bytes or more on the
//! wire, or has a pointer that does not go back; any of the four sections cut short; an A (AAAA)
//! record whose data is not 4 (16) bytes; a CNAME whose data is not one name; an EDNS (OPT) record
//! whose options do not fill its data. Checked here on top: the header's reserved bit; an unknown
//! question type or class, or record class (simple-dns's lists); a name of more than [`MAX_JUMPS`]
//! compression pointers (`domain` allows 255). Records without data are read as no record of their
//! type (no address, no target), and the data of the other record types is not looked into.

use domain::base::iana::Rtype;
use domain::base::name::ParsedName;
use domain::base::opt::{Opt, OptRecord};
use domain::base::wire::ParseError;
use domain::base::{Message as Wire, ParsedRecord};
use domain::rdata::{A, Aaaa, Cname};
use simple_dns::{CLASS, QCLASS, QTYPE};
use smallvec::SmallVec;
use std::net::IpAddr;

/// The most answer records read in one response; more is refused whole (no legitimate answer to one
/// A/AAAA question carries that many, and reading them costs the agent, not the sender).
pub const MAX_RECORDS: usize = 64;

/// Compression pointers followed in one name. A name of at most 254 bytes has at most 127 labels: a
/// name needing more jumps than that only chains pointers to pointers.
const MAX_JUMPS: usize = 127;

/// A record class's top bit (mDNS's cache flush) is not part of the class.
const CLASS_MASK: u16 = 0x7fff;

/// A name of a message, read in place.
pub type Name<'a> = ParsedName<&'a [u8]>;

/// A resource record of a message, read in place.
pub type Record<'a> = ParsedRecord<'a, [u8]>;

/// Why a message is not a DNS message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("{0}")]
    Parse(ParseError),
    #[error("the header's reserved bit is set")]
    Reserved,
    #[error("a name of more than {MAX_JUMPS} compression pointers")]
    TooManyJumps,
    #[error("an unknown question type {0}")]
    QuestionType(u16),
    #[error("an unknown class {0}")]
    Class(u16),
}

impl From<ParseError> for WireError {
    fn from(e: ParseError) -> Self {
        Self::Parse(e)
    }
}

/// A message whose four sections were read through.
#[derive(Clone)]
pub struct Message<'a> {
    pub id: u16,
    pub questions: u16,
    pub answers: u16,
    response: bool,
    /// The response code, extended by the first EDNS record (RFC 6891 section 6.1.3).
    rcode: u16,
    question: Option<Name<'a>>,
    /// The answer section's address and CNAME records, as read in the one pass over the message.
    answer_records: Answers<'a>,
}

/// What the agent reads of an answer record: its owner, TTL and address or CNAME target.
#[derive(Clone, Copy)]
pub struct AnswerRecord<'a> {
    pub owner: Name<'a>,
    /// Seconds.
    pub ttl: u32,
    pub data: Data<'a>,
}

/// The data of an answer record the agent reads.
#[derive(Clone, Copy)]
pub enum Data<'a> {
    Address(IpAddr),
    Cname(Name<'a>),
}

/// The answer records of a message: most responses carry a few, kept inline.
pub type Answers<'a> = SmallVec<[AnswerRecord<'a>; 4]>;

impl<'a> Message<'a> {
    /// Reads `bytes` through; an error when it is not a DNS message (see the module docs).
    pub fn parse(bytes: &'a [u8]) -> Result<Self, WireError> {
        let wire = Wire::from_slice(bytes).map_err(|_| ParseError::ShortInput)?;
        let header = wire.header();
        if header.z() {
            return Err(WireError::Reserved);
        }
        let counts = wire.header_counts();
        let mut questions = wire.question();
        let mut question = None;
        loop {
            let at = questions.pos();
            let Some(read) = questions.next() else {
                break;
            };
            let read = read?;
            check_jumps(bytes, at)?;
            let (qtype, qclass) = (read.qtype().to_int(), read.qclass().to_int());
            QTYPE::try_from(qtype).map_err(|_| WireError::QuestionType(qtype))?;
            QCLASS::try_from(qclass & CLASS_MASK).map_err(|_| WireError::Class(qclass))?;
            question.get_or_insert(*read.qname());
        }
        let mut section = questions.answer()?;
        let mut answer_records = Answers::new();
        // Only a response's answers are looked at, and none of one refused for their number.
        let mut in_answers = header.qr() && usize::from(counts.ancount()) <= MAX_RECORDS;
        let mut rcode = u16::from(header.rcode().to_int());
        let mut opt_seen = false;
        loop {
            loop {
                let at = section.pos();
                let Some(record) = section.next() else {
                    break;
                };
                let record = record?;
                let data = check_record(bytes, at, section.pos(), &record)?;
                if let (true, Some(data)) = (in_answers, data) {
                    answer_records.push(AnswerRecord {
                        owner: record.owner(),
                        ttl: record.ttl().as_secs(),
                        data,
                    });
                }
                if record.rtype() == Rtype::OPT && !opt_seen {
                    opt_seen = true;
                    if let Some(opt) = record.to_record::<Opt<&[u8]>>()? {
                        rcode = OptRecord::from(opt).rcode(header).to_int();
                    }
                }
            }
            match section.next_section()? {
                Some(next) => section = next,
                None => break,
            }
            in_answers = false;
        }
        Ok(Self {
            id: header.id(),
            questions: counts.qdcount(),
            answers: counts.ancount(),
            response: header.qr(),
            rcode,
            question,
            answer_records,
        })
    }

    pub fn is_response(&self) -> bool {
        self.response
    }

    /// The response code, extended by EDNS; 0 is NOERROR.
    pub fn rcode(&self) -> u16 {
        self.rcode
    }

    /// The first question's name, when there is one.
    pub fn question(&self) -> Option<Name<'a>> {
        self.question
    }

    /// The answer section's address (A, AAAA) and CNAME records with data, in the message's order;
    /// none for a query, or for a response of more than [`MAX_RECORDS`] answers.
    pub fn answer_records(&self) -> &[AnswerRecord<'a>] {
        &self.answer_records
    }
}

/// Checks the record read from `at` to `end` (the owner name read and checked by `domain`): the
/// class, the jumps of its names and the data of the types the agent reads; that data (`None` for
/// another type, or a record without data).
fn check_record<'a>(
    bytes: &[u8],
    at: usize,
    end: usize,
    record: &Record<'a>,
) -> Result<Option<Data<'a>>, WireError> {
    check_jumps(bytes, at)?;
    let rtype = record.rtype();
    if rtype == Rtype::OPT {
        // The class is the requestor's UDP size; the data a list of options (checked by `domain`,
        // above).
        return Ok(None);
    }
    let class = record.class().to_int();
    CLASS::try_from(class & CLASS_MASK).map_err(|_| WireError::Class(class))?;
    if record.rdlen() == 0 {
        return Ok(None);
    }
    Ok(match rtype {
        Rtype::A => record
            .to_record::<A>()?
            .map(|r| Data::Address(IpAddr::V4(r.data().addr()))),
        Rtype::AAAA => record
            .to_record::<Aaaa>()?
            .map(|r| Data::Address(IpAddr::V6(r.data().addr()))),
        Rtype::CNAME => {
            let cname = record.to_record::<Cname<Name<'a>>>()?;
            check_jumps(bytes, end - usize::from(record.rdlen()))?;
            cname.map(|r| Data::Cname(*r.data().cname()))
        }
        _ => None,
    })
}

/// Refuses the name at `at` (read by `domain`: its pointers go back) when it follows more than
/// [`MAX_JUMPS`] pointers.
fn check_jumps(bytes: &[u8], mut at: usize) -> Result<(), WireError> {
    let mut jumps = 0;
    while let Some(&len) = bytes.get(at) {
        match len {
            0 => break,
            0xc0..=0xff => {
                jumps += 1;
                if jumps > MAX_JUMPS {
                    return Err(WireError::TooManyJumps);
                }
                let low = bytes.get(at + 1).copied().unwrap_or_default();
                at = usize::from(u16::from_be_bytes([len & 0x3f, low]));
            }
            _ => at += 1 + usize::from(len),
        }
    }
    Ok(())
}

/// The labels of `name`, without the root.
pub fn labels<'n>(name: &'n Name<'_>) -> impl Iterator<Item = &'n [u8]> + 'n {
    name.iter()
        .filter(|label| !label.is_root())
        .map(|label| label.as_slice())
}

/// Whether `name` is `text` (dotted labels, no trailing dot), ignoring ASCII case.
pub fn name_is(name: &Name<'_>, text: &str) -> bool {
    let mut rest = text.as_bytes();
    for (i, label) in labels(name).enumerate() {
        if i > 0 {
            match rest.split_first() {
                Some((b'.', tail)) => rest = tail,
                _ => return false,
            }
        }
        match (rest.get(..label.len()), rest.get(label.len()..)) {
            (Some(head), Some(tail)) if head.eq_ignore_ascii_case(label) => rest = tail,
            _ => return false,
        }
    }
    rest.is_empty()
}

#[cfg(test)]
mod differences {
    //! Where `domain` refuses what the hand-written reader before it read: data longer than its type
    //! holds (RFC 1035 section 3.3 and 3.4: an A record's data is exactly 4 bytes, a CNAME's exactly
    //! one name). No resolver sends them.
    use super::Message;

    /// A response to one A question for `a.b`, with one answer record of `rtype` and `rdata` owned by
    /// the question's name.
    fn response(rtype: u16, rdata: &[u8]) -> Vec<u8> {
        let mut out = vec![0, 7, 0x80, 0, 0, 1, 0, 1, 0, 0, 0, 0];
        out.extend([1, b'a', 1, b'b', 0, 0, 1, 0, 1]);
        out.extend([0xc0, 12]);
        out.extend(rtype.to_be_bytes());
        out.extend([0, 1, 0, 0, 0, 30]);
        out.extend((rdata.len() as u16).to_be_bytes());
        out.extend(rdata);
        out
    }

    #[test]
    fn data_longer_than_its_type_holds_is_refused() {
        assert!(Message::parse(&response(1, &[192, 0, 2, 1])).is_ok());
        assert!(Message::parse(&response(1, &[192, 0, 2, 1, 0])).is_err());
        assert!(Message::parse(&response(28, &[0; 16])).is_ok());
        assert!(Message::parse(&response(28, &[0; 17])).is_err());
        assert!(Message::parse(&response(5, &[1, b'c', 0])).is_ok());
        assert!(Message::parse(&response(5, &[1, b'c', 0, 9])).is_err());
        // The data of other types is not looked into.
        assert!(Message::parse(&response(16, &[1, b'x', 0, 9])).is_ok());
    }
}
