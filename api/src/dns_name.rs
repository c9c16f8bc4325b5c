//! DNS names of outside peers, as the agent reports them and the API stores them: one definition of
//! what a host name is, for the agent's DNS parser, the flow sources, the controller's ingest and the
//! validation of the API's name fields.
//!
//! A host name here is lower-case ASCII, without the trailing dot, at most [`MAX_NAME_LEN`] bytes, of
//! labels of 1 to [`MAX_LABEL_LEN`] letters, digits, `-` and `_` (`_` appears in real names, such as
//! SRV-style service names; RFC 1123 host names do not have it, DNS names may). Names with other
//! bytes (non-ASCII, spaces, escapes) are refused, never rewritten: an internationalised name is
//! reported by its `xn--` form, which is what the pod asked.

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
}
