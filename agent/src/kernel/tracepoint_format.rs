//! Reads the layout of the `sock/inet_sock_set_state` tracepoint record from its tracefs `format` file.
//!
//! The record's layout is part of the tracepoint, not a stable ABI (the `protocol` field, for one, arrived in
//! Linux 5.6), so the program gets the offsets from the running kernel instead of assuming one layout.

use crate::error::{Error, Result};
use network_enforcer_agent_common::TcpTracepointLayout;
use std::path::Path;

/// One `field:` line of a format file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The field's name, without array brackets (`saddr` for `__u8 saddr[4]`).
    pub name: String,
    /// Offset in bytes from the start of the record.
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
}

/// Parses the `field:` lines of a tracefs `format` file; other lines are ignored.
pub fn parse_fields(text: &str) -> Vec<Field> {
    text.lines()
        .filter_map(|line| {
            // "\tfield:__u8 saddr[4];\toffset:32;\tsize:4;\tsigned:0;"
            let mut decl = None;
            let mut offset = None;
            let mut size = None;
            for part in line.split(';').map(str::trim) {
                if let Some(d) = part.strip_prefix("field:") {
                    decl = Some(d);
                } else if let Some(o) = part.strip_prefix("offset:") {
                    offset = o.parse().ok();
                } else if let Some(s) = part.strip_prefix("size:") {
                    size = s.parse().ok();
                }
            }
            let last_word = decl?.split_whitespace().last()?;
            let name = last_word.split('[').next()?.to_string();
            Some(Field {
                name,
                offset: offset?,
                size: size?,
            })
        })
        .collect()
}

/// The layout of `sock/inet_sock_set_state` from the text of its format file. `path` is only for errors.
pub fn tcp_layout_from_format(text: &str, path: &Path) -> Result<TcpTracepointLayout> {
    let fields = parse_fields(text);
    let find = |name: &str, size: usize| -> Result<u16> {
        let field =
            fields
                .iter()
                .find(|f| f.name == name)
                .ok_or_else(|| Error::TracepointFormat {
                    path: path.to_path_buf(),
                    reason: format!("no field `{name}`"),
                })?;
        if field.size != size {
            return Err(Error::TracepointFormat {
                path: path.to_path_buf(),
                reason: format!("field `{name}` has size {} (expected {size})", field.size),
            });
        }
        u16::try_from(field.offset).map_err(|_| Error::TracepointFormat {
            path: path.to_path_buf(),
            reason: format!("field `{name}` has offset {} (too large)", field.offset),
        })
    };
    Ok(TcpTracepointLayout {
        skaddr: find("skaddr", 8)?,
        oldstate: find("oldstate", 4)?,
        newstate: find("newstate", 4)?,
        sport: find("sport", 2)?,
        dport: find("dport", 2)?,
        family: find("family", 2)?,
        protocol: find("protocol", 2)?,
        saddr: find("saddr", 4)?,
        daddr: find("daddr", 4)?,
        saddr_v6: find("saddr_v6", 16)?,
        daddr_v6: find("daddr_v6", 16)?,
        _pad: 0,
    })
}

/// Reads the layout from `<tracefs>/events/sock/inet_sock_set_state/format`.
pub fn read_tcp_layout(tracefs: &Path) -> Result<TcpTracepointLayout> {
    let path = tracefs.join("events/sock/inet_sock_set_state/format");
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Read {
        path: path.clone(),
        source,
    })?;
    tcp_layout_from_format(&text, &path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The format file of Linux 6.18 (x86_64), as read from tracefs.
    const LINUX_6_18: &str = "name: inet_sock_set_state
ID: 2287
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:const void * skaddr;\toffset:8;\tsize:8;\tsigned:0;
\tfield:int oldstate;\toffset:16;\tsize:4;\tsigned:1;
\tfield:int newstate;\toffset:20;\tsize:4;\tsigned:1;
\tfield:__u16 sport;\toffset:24;\tsize:2;\tsigned:0;
\tfield:__u16 dport;\toffset:26;\tsize:2;\tsigned:0;
\tfield:__u16 family;\toffset:28;\tsize:2;\tsigned:0;
\tfield:__u16 protocol;\toffset:30;\tsize:2;\tsigned:0;
\tfield:__u8 saddr[4];\toffset:32;\tsize:4;\tsigned:0;
\tfield:__u8 daddr[4];\toffset:36;\tsize:4;\tsigned:0;
\tfield:__u8 saddr_v6[16];\toffset:40;\tsize:16;\tsigned:0;
\tfield:__u8 daddr_v6[16];\toffset:56;\tsize:16;\tsigned:0;

print fmt: \"family=%s protocol=%s\", REC->family
";

    #[test]
    fn reads_the_layout_of_linux_6_18() {
        let layout = tcp_layout_from_format(LINUX_6_18, Path::new("format")).unwrap();
        assert_eq!(layout, TcpTracepointLayout::DEFAULT);
    }

    #[test]
    fn rejects_a_format_without_the_protocol_field() {
        // Kernels before 5.6 had no `protocol` field; the program needs it to skip SCTP/MPTCP.
        let old = LINUX_6_18.replace(
            "\tfield:__u16 protocol;\toffset:30;\tsize:2;\tsigned:0;\n",
            "",
        );
        let err = tcp_layout_from_format(&old, Path::new("format")).unwrap_err();
        assert!(err.to_string().contains("no field `protocol`"), "{err}");
    }

    #[test]
    fn rejects_a_field_of_unexpected_size() {
        let odd = LINUX_6_18.replace(
            "oldstate;\toffset:16;\tsize:4",
            "oldstate;\toffset:16;\tsize:8",
        );
        let err = tcp_layout_from_format(&odd, Path::new("format")).unwrap_err();
        assert!(err.to_string().contains("size 8"), "{err}");
    }
}
