//! The DNS wire format (RFC 1035 section 4) read in place over the message's bytes: no copy, no
//! allocation, so that reading the pods' messages costs little per exchange. Hostile input is
//! expected: every read is bounds-checked, compression pointers only go back (so a name always ends),
//! and a name, its labels and its jumps are bounded.
//!
//! What is refused mirrors what `simple-dns` (which the agent used before) refuses, so the same
//! messages are malformed: the header's reserved bit set; a name that is cut, has a label over 63
//! bytes, is 255 bytes or more on the wire, or has a pointer that does not go back; any of the four
//! sections cut short; an unknown question type or class, or record class; an A (AAAA) record of 1 to
//! 3 (15) bytes; a CNAME whose target is not a name within its data; an EDNS (OPT) record whose options
//! do not fill its data. The data of the other record types is not looked into.

use simple_dns::{CLASS, QCLASS, QTYPE};

/// The header's length.
const HEADER_LEN: usize = 12;
/// A name's length on the wire (its labels and their length bytes, not the root's) from which it is
/// refused: 255 octets with the root's (RFC 1035 section 3.1).
const MAX_WIRE_NAME: usize = 255;
/// Compression pointers followed in one name. A name of at most 254 bytes has at most 127 labels: a
/// name needing more jumps than that only chains pointers to pointers.
const MAX_JUMPS: usize = 127;

pub const TYPE_A: u16 = 1;
pub const TYPE_CNAME: u16 = 5;
pub const TYPE_AAAA: u16 = 28;
const TYPE_OPT: u16 = 41;

const FLAG_RESPONSE: u16 = 0x8000;
/// The header's Z bit, which must be zero.
const FLAG_RESERVED: u16 = 0x0040;
const RCODE_MASK: u16 = 0x000f;
/// A record class's top bit (mDNS's cache flush) is not part of the class.
const CLASS_MASK: u16 = 0x7fff;

/// Why a message is not a DNS message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("the message ends within a field")]
    Truncated,
    #[error("the header's reserved bit is set")]
    Reserved,
    #[error("a label longer than 63 bytes")]
    LabelTooLong,
    #[error("a name of 255 bytes or more")]
    NameTooLong,
    #[error("a compression pointer that does not point back")]
    BadPointer,
    #[error("a name of more than {MAX_JUMPS} compression pointers")]
    TooManyJumps,
    #[error("an unknown question type {0}")]
    QuestionType(u16),
    #[error("an unknown class {0}")]
    Class(u16),
    #[error("the data of a record of type {0} does not hold it")]
    RecordData(u16),
}

fn u16_at(bytes: &[u8], at: usize) -> Result<u16, WireError> {
    bytes
        .get(at..at + 2)
        .and_then(|b| b.try_into().ok())
        .map(u16::from_be_bytes)
        .ok_or(WireError::Truncated)
}

fn u32_at(bytes: &[u8], at: usize) -> Result<u32, WireError> {
    bytes
        .get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_be_bytes)
        .ok_or(WireError::Truncated)
}

/// The labels of the name at some offset of a message, following compression pointers.
pub struct Labels<'a> {
    /// The message, cut where the name must end (a record's data).
    bytes: &'a [u8],
    pos: usize,
    /// Where the bytes after the name begin, once its end or first pointer was read.
    after: Option<usize>,
    wire_len: usize,
    jumps: usize,
}

impl<'a> Labels<'a> {
    pub fn new(bytes: &'a [u8], at: usize) -> Self {
        Self {
            bytes,
            pos: at,
            after: None,
            wire_len: 0,
            jumps: 0,
        }
    }

    /// The next label; `None` at the name's end.
    pub fn next_label(&mut self) -> Result<Option<&'a [u8]>, WireError> {
        loop {
            let len = *self.bytes.get(self.pos).ok_or(WireError::Truncated)?;
            match len {
                0 => {
                    self.after.get_or_insert(self.pos + 1);
                    return Ok(None);
                }
                1..=63 => {
                    let len = usize::from(len);
                    self.wire_len += 1 + len;
                    if self.wire_len >= MAX_WIRE_NAME {
                        return Err(WireError::NameTooLong);
                    }
                    let start = self.pos + 1;
                    let label = self
                        .bytes
                        .get(start..start + len)
                        .ok_or(WireError::Truncated)?;
                    self.pos = start + len;
                    return Ok(Some(label));
                }
                0xc0..=0xff => {
                    let low = *self.bytes.get(self.pos + 1).ok_or(WireError::Truncated)?;
                    let target = usize::from(u16::from_be_bytes([len & 0x3f, low]));
                    // Only back, before the pointer itself: a name cannot loop.
                    if target >= self.pos {
                        return Err(WireError::BadPointer);
                    }
                    self.jumps += 1;
                    if self.jumps > MAX_JUMPS {
                        return Err(WireError::TooManyJumps);
                    }
                    self.after.get_or_insert(self.pos + 2);
                    self.pos = target;
                }
                // 0b01 and 0b10 prefixes: extended and obsolete label types.
                _ => return Err(WireError::LabelTooLong),
            }
        }
    }

    /// The offset the next label is read from (where two names share their rest).
    fn pos(&self) -> usize {
        self.pos
    }
}

/// Checks the name at `at`, reading nothing past `bytes`; where the bytes after it begin.
fn skip_name(bytes: &[u8], at: usize) -> Result<usize, WireError> {
    let mut labels = Labels::new(bytes, at);
    while labels.next_label()?.is_some() {}
    labels.after.ok_or(WireError::Truncated)
}

/// Whether the names at `a` and `b` (both read by [`Message::parse`]) are the same, ignoring ASCII
/// case.
pub fn same_name(bytes: &[u8], a: usize, b: usize) -> bool {
    let (mut a, mut b) = (Labels::new(bytes, a), Labels::new(bytes, b));
    loop {
        // The same bytes from here on (typically both pointing at the question's name).
        if a.pos() == b.pos() {
            return true;
        }
        match (a.next_label(), b.next_label()) {
            (Ok(Some(x)), Ok(Some(y))) if x.eq_ignore_ascii_case(y) => {}
            (Ok(None), Ok(None)) => return true,
            _ => return false,
        }
    }
}

/// Whether the name at `at` is `text` (dotted labels, no trailing dot), ignoring ASCII case.
pub fn name_is(bytes: &[u8], at: usize, text: &str) -> bool {
    let mut labels = Labels::new(bytes, at);
    let mut rest = text.as_bytes();
    let mut first = true;
    loop {
        match labels.next_label() {
            Ok(Some(label)) => {
                if !first {
                    match rest.split_first() {
                        Some((b'.', tail)) => rest = tail,
                        _ => return false,
                    }
                }
                first = false;
                match (rest.get(..label.len()), rest.get(label.len()..)) {
                    (Some(head), Some(tail)) if head.eq_ignore_ascii_case(label) => rest = tail,
                    _ => return false,
                }
            }
            Ok(None) => return rest.is_empty(),
            Err(_) => return false,
        }
    }
}

/// One resource record of the answer section: where its parts are in the message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// The owner name's offset.
    pub owner: u32,
    pub rtype: u16,
    pub rdlen: u16,
    pub ttl: u32,
    /// The data's offset.
    pub rdata: u32,
}

/// A message whose four sections were read through.
#[derive(Clone, Debug)]
pub struct Message {
    pub id: u16,
    pub flags: u16,
    pub questions: u16,
    pub answers: u16,
    /// The offset of the answer section.
    answers_at: usize,
    /// The extended RCODE's upper 8 bits, from the first EDNS record of the additional section
    /// (RFC 6891 section 6.1.3).
    rcode_high: u8,
}

impl Message {
    /// Reads `bytes` through; an error when it is not a DNS message (see the module docs).
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        let id = u16_at(bytes, 0)?;
        let flags = u16_at(bytes, 2)?;
        let questions = u16_at(bytes, 4)?;
        let answers = u16_at(bytes, 6)?;
        let authority = u16_at(bytes, 8)?;
        let additional = u16_at(bytes, 10)?;
        if flags & FLAG_RESERVED != 0 {
            return Err(WireError::Reserved);
        }
        let mut at = HEADER_LEN;
        for _ in 0..questions {
            at = skip_name(bytes, at)?;
            let qtype = u16_at(bytes, at)?;
            let qclass = u16_at(bytes, at + 2)?;
            QTYPE::try_from(qtype).map_err(|_| WireError::QuestionType(qtype))?;
            QCLASS::try_from(qclass & CLASS_MASK).map_err(|_| WireError::Class(qclass))?;
            at += 4;
        }
        let mut message = Self {
            id,
            flags,
            questions,
            answers,
            answers_at: at,
            rcode_high: 0,
        };
        for _ in 0..answers {
            (_, at) = read_record(bytes, at)?;
        }
        for _ in 0..authority {
            (_, at) = read_record(bytes, at)?;
        }
        let mut opt_seen = false;
        for _ in 0..additional {
            let record;
            (record, at) = read_record(bytes, at)?;
            if record.rtype == TYPE_OPT && !opt_seen {
                opt_seen = true;
                message.rcode_high = record.ttl.to_be_bytes()[0];
            }
        }
        Ok(message)
    }

    pub fn is_response(&self) -> bool {
        self.flags & FLAG_RESPONSE != 0
    }

    /// The response code, extended by EDNS; 0 is NOERROR.
    pub fn rcode(&self) -> u16 {
        (u16::from(self.rcode_high) << 4) | (self.flags & RCODE_MASK)
    }

    /// The offset of the first question's name, when there is one.
    pub fn question(&self) -> Option<usize> {
        (self.questions > 0).then_some(HEADER_LEN)
    }

    /// The answer records of `bytes`, the message read: read again where they are rather than kept,
    /// so that reading a message writes nothing but this small summary.
    pub fn answer_records<'b>(&self, bytes: &'b [u8]) -> impl Iterator<Item = Record> + 'b {
        let mut at = self.answers_at;
        (0..self.answers).map_while(move |_| {
            let (record, next) = read_record(bytes, at).ok()?;
            at = next;
            Some(record)
        })
    }
}

/// Reads the resource record at `at`: its parts and where the next begins.
fn read_record(bytes: &[u8], at: usize) -> Result<(Record, usize), WireError> {
    let owner = at;
    let at = skip_name(bytes, at)?;
    let rtype = u16_at(bytes, at)?;
    let class = u16_at(bytes, at + 2)?;
    let ttl = u32_at(bytes, at + 4)?;
    let rdlen = u16_at(bytes, at + 8)?;
    let rdata = at + 10;
    let end = rdata + usize::from(rdlen);
    let data = bytes.get(rdata..end).ok_or(WireError::Truncated)?;
    if rtype == TYPE_OPT {
        // The class is the requestor's UDP size; the data a list of (code, length, value).
        let mut rest = data;
        while !rest.is_empty() {
            let len = usize::from(u16_at(rest, 2)?);
            rest = rest.get(4 + len..).ok_or(WireError::RecordData(TYPE_OPT))?;
        }
    } else {
        CLASS::try_from(class & CLASS_MASK).map_err(|_| WireError::Class(class))?;
        let fits = match (rtype, rdlen) {
            // No data is read as no record of the type (no address, no target).
            (_, 0) => true,
            (TYPE_A, n) => n >= 4,
            (TYPE_AAAA, n) => n >= 16,
            // The target within the data; its pointers may go back out of it.
            (TYPE_CNAME, _) => bytes
                .get(..end)
                .is_some_and(|within| skip_name(within, rdata).is_ok()),
            _ => true,
        };
        if !fits {
            return Err(WireError::RecordData(rtype));
        }
    }
    let offset = |v: usize| u32::try_from(v).map_err(|_| WireError::Truncated);
    let record = Record {
        owner: offset(owner)?,
        rtype,
        rdlen,
        ttl,
        rdata: offset(rdata)?,
    };
    Ok((record, end))
}
