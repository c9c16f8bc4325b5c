//! DNS names of outside peers, as the agent reports them and the API stores them: one definition of
//! what a host name is, for the agent's DNS parser, the flow sources, the controller's ingest and the
//! validation of the API's name fields.
//!
//! A host name here is lower-case ASCII, without the trailing dot, at most [`MAX_NAME_LEN`] bytes, of
//! labels of 1 to [`MAX_LABEL_LEN`] letters, digits, `-` and `_` (`_` appears in real names, such as
//! SRV-style service names; RFC 1123 host names do not have it, DNS names may). Names with other
//! bytes (non-ASCII, spaces, escapes) are refused, never rewritten: an internationalised name is
//! reported by its `xn--` form, which is what the pod asked.
//!
//! A name *written in the API* ([`name_pattern`], `spec.egressNames[].names`) is stricter: already
//! lower-case, without the trailing dot, and may be a wildcard `*.` followed by at least two labels.

/// A name's longest text form (RFC 1035: 255 bytes on the wire, 253 as text without the root).
pub const MAX_NAME_LEN: usize = 253;
/// A label's longest form (RFC 1035).
pub const MAX_LABEL_LEN: usize = 63;

/// Why a text is not a host name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("an empty name")]
    Empty,
    #[error("a name of {0} bytes: longer than {MAX_NAME_LEN}")]
    TooLong(usize),
    #[error("an empty label (two dots in a row, or a leading dot)")]
    EmptyLabel,
    #[error("a label of {0} bytes: longer than {MAX_LABEL_LEN}")]
    LabelTooLong(usize),
    #[error("a label with a byte that is not an ASCII letter, digit, '-' or '_'")]
    NotAHostName,
    #[error("an upper-case letter (names in the API are lower-case)")]
    NotLowerCase,
    #[error("a trailing dot (names in the API are written without it)")]
    TrailingDot,
    #[error("a '*' that is not the whole leftmost label followed by at least two labels")]
    Wildcard,
}

/// One label's check.
pub fn check_label(label: &[u8]) -> Result<(), NameError> {
    if label.is_empty() {
        return Err(NameError::EmptyLabel);
    }
    if label.len() > MAX_LABEL_LEN {
        return Err(NameError::LabelTooLong(label.len()));
    }
    if !label
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
    {
        return Err(NameError::NotAHostName);
    }
    Ok(())
}

/// `text` as a host name: lower-cased, one trailing dot removed; an error when it is none.
pub fn host_name(text: &str) -> Result<String, NameError> {
    let name = text.strip_suffix('.').unwrap_or(text);
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong(name.len()));
    }
    for label in name.split('.') {
        check_label(label.as_bytes())?;
    }
    Ok(name.to_ascii_lowercase())
}

/// A name as the API writes it ([`name_pattern`]): one host name, or every name below a suffix.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NamePattern {
    /// Exactly this host name.
    Exact(String),
    /// `*.<suffix>`: every name that ends in `.<suffix>`, at any depth (`a.suffix`, `a.b.suffix`), not
    /// the suffix itself. The suffix has at least two labels.
    Below(String),
}

impl NamePattern {
    /// Whether the host name `name` (as [`host_name`] returns it) is one this pattern names.
    pub fn matches(&self, name: &str) -> bool {
        match self {
            NamePattern::Exact(exact) => name == exact,
            NamePattern::Below(suffix) => is_below(name, suffix),
        }
    }
}

/// Whether `name` is one the API's name `pattern` (a valid [`name_pattern`]) names, without parsing
/// it: for a check per connection.
pub fn matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => is_below(name, suffix),
        None => pattern == name,
    }
}

/// `name` ends in `.suffix`, with at least one label before.
fn is_below(name: &str, suffix: &str) -> bool {
    name.strip_suffix(suffix)
        .and_then(|head| head.strip_suffix('.'))
        .is_some_and(|head| !head.is_empty())
}

/// `text` as a name of the API (`spec.egressNames[].names`): a host name as [`host_name`] defines it,
/// but already lower-case and without the trailing dot (refused, not rewritten, so what is stored is
/// what is matched), at most [`MAX_NAME_LEN`] characters in all; or a wildcard, `*.` followed by a
/// host name of at least two labels (`*.example.com`; not `*.com`, `a.*.com`, `*example.com`, `*`).
/// The CRDs' CEL rule `crd::rules::NAME_RULE_NAMES` is the same check.
pub fn name_pattern(text: &str) -> Result<NamePattern, NameError> {
    if text.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong(text.len()));
    }
    if text.ends_with('.') {
        return Err(NameError::TrailingDot);
    }
    let (wildcard, name) = match text.strip_prefix("*.") {
        Some(suffix) => (true, suffix),
        None => (false, text),
    };
    if name.contains('*') || (wildcard && !name.contains('.')) {
        return Err(NameError::Wildcard);
    }
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(NameError::NotLowerCase);
    }
    let name = host_name(name)?;
    Ok(if wildcard {
        NamePattern::Below(name)
    } else {
        NamePattern::Exact(name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_are_lower_cased_and_refused_by_rule() {
        let long_label = "a".repeat(64);
        let long_name = ["abcdefghi"; 26].join("."); // 259 bytes
        let cases: &[(&str, Result<&str, NameError>)] = &[
            ("API.Partner.Test", Ok("api.partner.test")),
            ("api.partner.test.", Ok("api.partner.test")),
            ("_sip._tcp.example.com", Ok("_sip._tcp.example.com")),
            ("xn--bcher-kva.example", Ok("xn--bcher-kva.example")),
            ("", Err(NameError::Empty)),
            (".", Err(NameError::Empty)),
            ("a..b", Err(NameError::EmptyLabel)),
            (".a", Err(NameError::EmptyLabel)),
            ("bücher.example", Err(NameError::NotAHostName)),
            ("a b.example", Err(NameError::NotAHostName)),
            ("*.example.com", Err(NameError::NotAHostName)),
            (&long_label, Err(NameError::LabelTooLong(64))),
            (&long_name, Err(NameError::TooLong(259))),
        ];
        for (text, want) in cases {
            assert_eq!(
                host_name(text).as_deref().map_err(Clone::clone),
                want.clone(),
                "{text:?}"
            );
        }
    }

    #[test]
    fn api_names_are_host_names_as_written_or_one_leftmost_wildcard() {
        let exact = |n: &str| Ok(NamePattern::Exact(n.to_string()));
        let below = |n: &str| Ok(NamePattern::Below(n.to_string()));
        // A name of `len` bytes, of labels of at most 62 bytes.
        let name_of = |len: usize| {
            let mut name = String::new();
            while len - name.len() > 63 {
                name.push_str(&"a".repeat(62));
                name.push('.');
            }
            name.push_str(&"a".repeat(len - name.len()));
            name
        };
        let longest = name_of(MAX_NAME_LEN);
        let longest_wildcard = format!("*.{}", name_of(MAX_NAME_LEN - 2));
        let too_long_wildcard = format!("*.{}", name_of(MAX_NAME_LEN - 1));
        let label_63 = format!("{}.example", "a".repeat(63));
        let label_64 = format!("{}.example", "a".repeat(64));
        let cases: &[(&str, Result<NamePattern, NameError>)] = &[
            ("api.partner.test", exact("api.partner.test")),
            ("localhost", exact("localhost")),
            ("_sip._tcp.example.com", exact("_sip._tcp.example.com")),
            ("-a.b-", exact("-a.b-")),
            ("xn--bcher-kva.example", exact("xn--bcher-kva.example")),
            (&longest, exact(&longest)),
            (&label_63, exact(&label_63)),
            ("*.example.com", below("example.com")),
            ("*.storage.partner.test", below("storage.partner.test")),
            (&longest_wildcard, below(&longest_wildcard[2..])),
            ("", Err(NameError::Empty)),
            ("*.", Err(NameError::TrailingDot)),
            ("api.partner.test.", Err(NameError::TrailingDot)),
            (".", Err(NameError::TrailingDot)),
            ("API.partner.test", Err(NameError::NotLowerCase)),
            ("*.Example.com", Err(NameError::NotLowerCase)),
            ("*", Err(NameError::Wildcard)),
            ("*.com", Err(NameError::Wildcard)),
            ("a.*.com", Err(NameError::Wildcard)),
            ("*example.com", Err(NameError::Wildcard)),
            ("*.*.example.com", Err(NameError::Wildcard)),
            ("**.example.com", Err(NameError::Wildcard)),
            ("a*.example.com", Err(NameError::Wildcard)),
            ("a..b", Err(NameError::EmptyLabel)),
            (".a", Err(NameError::EmptyLabel)),
            ("*..a.b", Err(NameError::EmptyLabel)),
            ("bücher.example", Err(NameError::NotAHostName)),
            ("a b.example", Err(NameError::NotAHostName)),
            ("a/b.example", Err(NameError::NotAHostName)),
            (&label_64, Err(NameError::LabelTooLong(64))),
            (&too_long_wildcard, Err(NameError::TooLong(254))),
        ];
        for (text, want) in cases {
            assert_eq!(&name_pattern(text), want, "{text:?}");
        }
    }

    #[test]
    fn a_wildcard_matches_every_name_below_its_suffix_and_nothing_else() {
        let exact = name_pattern("api.partner.test").unwrap();
        assert!(exact.matches("api.partner.test"));
        assert!(!exact.matches("x.api.partner.test"));
        assert!(!exact.matches("partner.test"));
        let below = name_pattern("*.storage.partner.test").unwrap();
        for name in ["a.storage.partner.test", "a.b.storage.partner.test"] {
            assert!(below.matches(name), "{name}");
        }
        for name in [
            "storage.partner.test",
            "astorage.partner.test",
            ".storage.partner.test",
            "storage.partner.test.evil",
            "partner.test",
        ] {
            assert!(!below.matches(name), "{name}");
        }
    }
}
