//! Network-related values: interface filters, address families, `host:port`.

use std::fmt;

/// A parsed `NCCL_SOCKET_IFNAME` / `HETCCL_SOCKET_IFNAME` value, with NCCL's
/// semantics.
///
/// - `eth,ib`: interfaces whose name starts with `eth` or `ib`;
/// - `^docker,lo`: every interface except those starting with `docker` or `lo`;
/// - `=eth0`: exactly `eth0`; `^=eth0`: everything except exactly `eth0`.
///
/// An empty list (`""`, `"^"`, `"="`) matches every interface.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IfaceFilter {
    exclude: bool,
    exact: bool,
    entries: Vec<String>,
}

impl IfaceFilter {
    /// Parses a filter. `^` must come before `=` when both are present, as in
    /// NCCL; entries are separated by commas and surrounding blanks are trimmed.
    pub fn parse(spec: &str) -> IfaceFilter {
        let spec = spec.trim();
        let (exclude, rest) = match spec.strip_prefix('^') {
            Some(r) => (true, r),
            None => (false, spec),
        };
        let (exact, rest) = match rest.strip_prefix('=') {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let entries = rest
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_string)
            .collect();
        IfaceFilter {
            exclude,
            exact,
            entries,
        }
    }

    /// True when the interface `name` passes the filter.
    pub fn matches(&self, name: &str) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        let hit = self.entries.iter().any(|e| {
            if self.exact {
                name == e
            } else {
                name.starts_with(e.as_str())
            }
        });
        hit != self.exclude
    }

    /// True for a `^` (exclusion) filter.
    pub fn is_exclude(&self) -> bool {
        self.exclude
    }

    /// True for a `=` (exact-name) filter.
    pub fn is_exact(&self) -> bool {
        self.exact
    }

    /// The listed names or prefixes, in order.
    pub fn entries(&self) -> &[String] {
        &self.entries
    }
}

impl fmt::Display for IfaceFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.exclude {
            f.write_str("^")?;
        }
        if self.exact {
            f.write_str("=")?;
        }
        f.write_str(&self.entries.join(","))
    }
}

/// The address family forced by `NCCL_SOCKET_FAMILY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AddrFamily {
    /// `AF_INET`: IPv4 only.
    Inet,
    /// `AF_INET6`: IPv6 only.
    Inet6,
}

impl AddrFamily {
    /// Parses `AF_INET` or `AF_INET6` (case-insensitive).
    pub fn parse(s: &str) -> Option<AddrFamily> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("AF_INET") {
            Some(AddrFamily::Inet)
        } else if s.eq_ignore_ascii_case("AF_INET6") {
            Some(AddrFamily::Inet6)
        } else {
            None
        }
    }

    /// The `libc` constant (`AF_INET` or `AF_INET6`).
    pub fn as_raw(self) -> i32 {
        match self {
            AddrFamily::Inet => libc::AF_INET,
            AddrFamily::Inet6 => libc::AF_INET6,
        }
    }
}

impl fmt::Display for AddrFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AddrFamily::Inet => "AF_INET",
            AddrFamily::Inet6 => "AF_INET6",
        })
    }
}

/// Splits an `NCCL_COMM_ID`-style address into host and port.
///
/// Accepts `host:port`, `1.2.3.4:port` and `[v6addr]:port` (the brackets are
/// removed from the returned host). An unbracketed host may not contain `:`.
pub fn split_host_port(s: &str) -> Option<(&str, u16)> {
    let s = s.trim();
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let close = rest.find(']')?;
        let host = &rest[..close];
        let port = rest[close + 1..].strip_prefix(':')?;
        (host, port)
    } else {
        let (host, port) = s.rsplit_once(':')?;
        if host.contains(':') {
            return None;
        }
        (host, port)
    };
    if host.is_empty() || port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let port = port.parse::<u16>().ok()?;
    Some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_list_matches_prefixes() {
        let f = IfaceFilter::parse("eth,ib");
        assert!(f.matches("eth0"));
        assert!(f.matches("ib1"));
        assert!(!f.matches("lo"));
        assert!(!f.matches("docker0"));
        assert!(!f.is_exclude() && !f.is_exact());
    }

    #[test]
    fn caret_excludes() {
        let f = IfaceFilter::parse("^docker,lo");
        assert!(f.is_exclude());
        assert!(!f.matches("docker0"));
        assert!(!f.matches("lo"));
        assert!(f.matches("eth0"));
    }

    #[test]
    fn equals_is_exact() {
        let f = IfaceFilter::parse("=eth0");
        assert!(f.is_exact());
        assert!(f.matches("eth0"));
        assert!(!f.matches("eth01"));
        assert!(!f.matches("eth"));
        let g = IfaceFilter::parse("^=eth0,lo");
        assert!(g.is_exclude() && g.is_exact());
        assert!(!g.matches("eth0"));
        assert!(g.matches("eth01"));
        assert!(!g.matches("lo"));
        assert!(g.matches("lo0"));
    }

    #[test]
    fn equals_before_caret_is_literal() {
        // NCCL only recognises "^=", so "=^x" is an exact match on "^x".
        let f = IfaceFilter::parse("=^eth0");
        assert!(!f.is_exclude());
        assert!(f.matches("^eth0"));
        assert!(!f.matches("eth1"));
    }

    #[test]
    fn empty_lists_match_everything() {
        for s in ["", "^", "=", "^=", " , "] {
            assert!(IfaceFilter::parse(s).matches("eth0"), "{s:?}");
        }
    }

    #[test]
    fn filter_display_round_trips() {
        for s in ["eth,ib", "^docker,lo", "=eth0", "^=eth0,lo"] {
            assert_eq!(IfaceFilter::parse(s).to_string(), s);
        }
    }

    #[test]
    fn family_parse() {
        assert_eq!(AddrFamily::parse("AF_INET"), Some(AddrFamily::Inet));
        assert_eq!(AddrFamily::parse("af_inet6"), Some(AddrFamily::Inet6));
        assert_eq!(AddrFamily::parse("ipv4"), None);
        assert_eq!(AddrFamily::Inet.as_raw(), libc::AF_INET);
        assert_eq!(AddrFamily::Inet6.to_string(), "AF_INET6");
    }

    #[test]
    fn host_port_forms() {
        assert_eq!(split_host_port("node1:1234"), Some(("node1", 1234)));
        assert_eq!(split_host_port("10.0.0.1:80"), Some(("10.0.0.1", 80)));
        assert_eq!(split_host_port("[fe80::1]:9000"), Some(("fe80::1", 9000)));
        assert_eq!(split_host_port("fe80::1:9000"), None);
        assert_eq!(split_host_port("node1"), None);
        assert_eq!(split_host_port("node1:"), None);
        assert_eq!(split_host_port(":80"), None);
        assert_eq!(split_host_port("node1:70000"), None);
        assert_eq!(split_host_port("node1:+80"), None);
        assert_eq!(split_host_port("[fe80::1]9000"), None);
    }
}
