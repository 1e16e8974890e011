//! `NCCL_DEBUG` and `NCCL_DEBUG_SUBSYS`: the log level and the subsystem mask.

use std::fmt;

/// The NCCL log level (`ncclDebugLogLevel`), read from `NCCL_DEBUG`.
///
/// The discriminants are NCCL's C values, so `level as i32` is what an
/// `ncclDebugLogger_t` expects. Levels are ordered: `Trace` prints everything
/// `Info` prints, and so on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(i32)]
pub enum DebugLevel {
    /// Nothing is printed (NCCL's behaviour when `NCCL_DEBUG` is unset).
    #[default]
    None = 0,
    /// Only the version line.
    Version = 1,
    /// Warnings (and errors) plus the version line.
    Warn = 2,
    /// Informational lines, filtered by subsystem, plus everything above.
    Info = 3,
    /// As `Info`; NCCL uses this level for abort messages.
    Abort = 4,
    /// Debug and trace lines too, filtered by subsystem.
    Trace = 5,
}

impl DebugLevel {
    /// Every level, in increasing order.
    pub const ALL: [DebugLevel; 6] = [
        DebugLevel::None,
        DebugLevel::Version,
        DebugLevel::Warn,
        DebugLevel::Info,
        DebugLevel::Abort,
        DebugLevel::Trace,
    ];

    /// Parses an `NCCL_DEBUG` value, case-insensitively (`"info"`, `"WARN"`…).
    pub fn parse(s: &str) -> Option<DebugLevel> {
        let s = s.trim();
        DebugLevel::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(s))
    }

    /// The upper-case name NCCL uses (`"INFO"`).
    pub fn name(self) -> &'static str {
        match self {
            DebugLevel::None => "NONE",
            DebugLevel::Version => "VERSION",
            DebugLevel::Warn => "WARN",
            DebugLevel::Info => "INFO",
            DebugLevel::Abort => "ABORT",
            DebugLevel::Trace => "TRACE",
        }
    }

    /// The C value (`NCCL_LOG_INFO` is 3).
    pub fn as_raw(self) -> i32 {
        self as i32
    }
}

impl fmt::Display for DebugLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of NCCL log subsystems (`ncclDebugLogSubSys` flags), read from
/// `NCCL_DEBUG_SUBSYS`.
///
/// The bit values are NCCL's, so `mask.0` can be passed as the `flags`
/// argument of an `ncclDebugLogger_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SubsysMask(pub u64);

impl SubsysMask {
    /// `INIT`: communicator creation.
    pub const INIT: SubsysMask = SubsysMask(0x1);
    /// `COLL`: collective calls.
    pub const COLL: SubsysMask = SubsysMask(0x2);
    /// `P2P`: point-to-point calls.
    pub const P2P: SubsysMask = SubsysMask(0x4);
    /// `SHM`: the shared-memory transport.
    pub const SHM: SubsysMask = SubsysMask(0x8);
    /// `NET`: network transports and plugins.
    pub const NET: SubsysMask = SubsysMask(0x10);
    /// `GRAPH`: topology detection and graph search.
    pub const GRAPH: SubsysMask = SubsysMask(0x20);
    /// `TUNING`: algorithm and protocol selection.
    pub const TUNING: SubsysMask = SubsysMask(0x40);
    /// `ENV`: environment variables.
    pub const ENV: SubsysMask = SubsysMask(0x80);
    /// `ALLOC`: device memory allocation.
    pub const ALLOC: SubsysMask = SubsysMask(0x100);
    /// `CALL`: API call tracing.
    pub const CALL: SubsysMask = SubsysMask(0x200);
    /// `PROXY`: the proxy (progress) thread.
    pub const PROXY: SubsysMask = SubsysMask(0x400);
    /// `NVLS`: NVLink SHARP.
    pub const NVLS: SubsysMask = SubsysMask(0x800);
    /// `BOOTSTRAP`: out-of-band rendezvous.
    pub const BOOTSTRAP: SubsysMask = SubsysMask(0x1000);
    /// `REG`: buffer registration.
    pub const REG: SubsysMask = SubsysMask(0x2000);
    /// `PROFILE`: the profiler.
    pub const PROFILE: SubsysMask = SubsysMask(0x4000);
    /// `RAS`: the reliability/availability service.
    pub const RAS: SubsysMask = SubsysMask(0x8000);
    /// `DESTROY`: communicator teardown.
    pub const DESTROY: SubsysMask = SubsysMask(0x10000);
    /// `ALLOC_HOST`: host memory allocation.
    pub const ALLOC_HOST: SubsysMask = SubsysMask(0x20000);
    /// `ALL`: every subsystem (`~0`).
    pub const ALL: SubsysMask = SubsysMask(!0);
    /// No subsystem.
    pub const EMPTY: SubsysMask = SubsysMask(0);
    /// NCCL's default when `NCCL_DEBUG_SUBSYS` is unset: `INIT,BOOTSTRAP,ENV`.
    pub const DEFAULT: SubsysMask = SubsysMask(0x1 | 0x1000 | 0x80);

    /// Every named subsystem except `ALL`, in bit order.
    pub const NAMED: [(&'static str, SubsysMask); 18] = [
        ("INIT", SubsysMask::INIT),
        ("COLL", SubsysMask::COLL),
        ("P2P", SubsysMask::P2P),
        ("SHM", SubsysMask::SHM),
        ("NET", SubsysMask::NET),
        ("GRAPH", SubsysMask::GRAPH),
        ("TUNING", SubsysMask::TUNING),
        ("ENV", SubsysMask::ENV),
        ("ALLOC", SubsysMask::ALLOC),
        ("CALL", SubsysMask::CALL),
        ("PROXY", SubsysMask::PROXY),
        ("NVLS", SubsysMask::NVLS),
        ("BOOTSTRAP", SubsysMask::BOOTSTRAP),
        ("REG", SubsysMask::REG),
        ("PROFILE", SubsysMask::PROFILE),
        ("RAS", SubsysMask::RAS),
        ("DESTROY", SubsysMask::DESTROY),
        ("ALLOC_HOST", SubsysMask::ALLOC_HOST),
    ];

    /// The flag of one subsystem name (case-insensitive), `ALL` included.
    pub fn flag(name: &str) -> Option<SubsysMask> {
        let name = name.trim();
        if name.eq_ignore_ascii_case("ALL") {
            return Some(SubsysMask::ALL);
        }
        SubsysMask::NAMED
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|&(_, m)| m)
    }

    /// Parses an `NCCL_DEBUG_SUBSYS` value with NCCL's semantics.
    ///
    /// A comma list of names selects those subsystems; a leading `^` inverts
    /// the whole list (`"^NET,P2P"` is everything except NET and P2P).
    /// Returns the mask and the names that were not recognised (ignored).
    pub fn parse(s: &str) -> (SubsysMask, Vec<String>) {
        let s = s.trim();
        let (invert, list) = match s.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let mut mask = if invert { !0u64 } else { 0 };
        let mut unknown = Vec::new();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match SubsysMask::flag(name) {
                Some(m) if invert => mask &= !m.0,
                Some(m) => mask |= m.0,
                None => unknown.push(name.to_string()),
            }
        }
        (SubsysMask(mask), unknown)
    }

    /// True when the subsystem `name` (case-insensitive) is in the mask.
    ///
    /// `"ALL"` asks whether every bit is set. Unknown names are never contained.
    pub fn contains(self, name: &str) -> bool {
        match SubsysMask::flag(name) {
            Some(f) => self.contains_flags(f),
            None => false,
        }
    }

    /// True when every bit of `flags` is in the mask.
    pub fn contains_flags(self, flags: SubsysMask) -> bool {
        self.0 & flags.0 == flags.0
    }

    /// True when the mask shares at least one bit with `flags` (NCCL's test:
    /// `flags & ncclDebugMask`).
    pub fn intersects(self, flags: SubsysMask) -> bool {
        self.0 & flags.0 != 0
    }
}

impl Default for SubsysMask {
    fn default() -> Self {
        SubsysMask::DEFAULT
    }
}

impl fmt::Display for SubsysMask {
    /// Writes the mask in a form [`SubsysMask::parse`] reads back: `ALL`,
    /// `INIT,ENV`, or `^NET` when more than the unnamed high bits are set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let named: u64 = SubsysMask::NAMED.iter().fold(0, |a, (_, m)| a | m.0);
        let m = self.0;
        if m == !0 {
            return f.write_str("ALL");
        }
        let (prefix, shown) = if m & !named == !named {
            ("^", !m & named)
        } else {
            ("", m & named)
        };
        let names: Vec<&str> = SubsysMask::NAMED
            .iter()
            .filter(|(_, b)| shown & b.0 != 0)
            .map(|(n, _)| *n)
            .collect();
        if prefix.is_empty() && names.is_empty() {
            // Nothing selected; "^ALL" parses back to the empty mask.
            return f.write_str("^ALL");
        }
        let extra = if prefix.is_empty() { m & !named } else { 0 };
        write!(f, "{prefix}{}", names.join(","))?;
        if extra != 0 {
            write!(f, " (+0x{extra:x})")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_parse_is_case_insensitive() {
        assert_eq!(DebugLevel::parse("info"), Some(DebugLevel::Info));
        assert_eq!(DebugLevel::parse(" WARN "), Some(DebugLevel::Warn));
        assert_eq!(DebugLevel::parse("Trace"), Some(DebugLevel::Trace));
        assert_eq!(DebugLevel::parse("version"), Some(DebugLevel::Version));
        assert_eq!(DebugLevel::parse("abort"), Some(DebugLevel::Abort));
        assert_eq!(DebugLevel::parse("none"), Some(DebugLevel::None));
        assert_eq!(DebugLevel::parse("loud"), None);
        assert_eq!(DebugLevel::parse(""), None);
    }

    #[test]
    fn level_raw_values_match_nccl() {
        let raw: Vec<i32> = DebugLevel::ALL.iter().map(|l| l.as_raw()).collect();
        assert_eq!(raw, vec![0, 1, 2, 3, 4, 5]);
        assert!(DebugLevel::Trace > DebugLevel::Info);
        assert_eq!(DebugLevel::default(), DebugLevel::None);
    }

    #[test]
    fn subsys_flag_values_match_nccl() {
        assert_eq!(SubsysMask::flag("init"), Some(SubsysMask(0x1)));
        assert_eq!(SubsysMask::flag("ENV"), Some(SubsysMask(0x80)));
        assert_eq!(SubsysMask::flag("BOOTSTRAP"), Some(SubsysMask(0x1000)));
        assert_eq!(SubsysMask::flag("alloc_host"), Some(SubsysMask(0x20000)));
        assert_eq!(SubsysMask::flag("ALL"), Some(SubsysMask(!0)));
        assert_eq!(SubsysMask::flag("NOPE"), None);
        assert_eq!(SubsysMask::default().0, 0x1 | 0x80 | 0x1000);
    }

    #[test]
    fn subsys_list_selects() {
        let (m, unknown) = SubsysMask::parse("INIT,net , coll");
        assert_eq!(m.0, 0x1 | 0x10 | 0x2);
        assert!(unknown.is_empty());
        assert!(m.contains("NET"));
        assert!(!m.contains("P2P"));
        assert!(!m.contains("ALL"));
    }

    #[test]
    fn subsys_caret_inverts_whole_list() {
        let (m, _) = SubsysMask::parse("^NET,P2P");
        assert!(!m.contains("NET"));
        assert!(!m.contains("P2P"));
        assert!(m.contains("INIT"));
        assert!(m.contains("ALLOC_HOST"));
        assert_eq!(m.0, !0x14);
        let (none, _) = SubsysMask::parse("^ALL");
        assert_eq!(none, SubsysMask::EMPTY);
        let (all, _) = SubsysMask::parse("ALL");
        assert!(all.contains("ALL"));
    }

    #[test]
    fn subsys_unknown_names_reported_and_ignored() {
        let (m, unknown) = SubsysMask::parse("INIT,BOGUS,NET");
        assert_eq!(m.0, 0x11);
        assert_eq!(unknown, vec!["BOGUS".to_string()]);
    }

    #[test]
    fn subsys_display_round_trips() {
        for s in [
            "INIT,ENV",
            "ALL",
            "^NET,P2P",
            "^ALL",
            "INIT,BOOTSTRAP,ENV",
            "ALLOC_HOST",
        ] {
            let (m, _) = SubsysMask::parse(s);
            let shown = m.to_string();
            assert_eq!(SubsysMask::parse(&shown).0, m, "{s} -> {shown}");
        }
        assert_eq!(SubsysMask::DEFAULT.to_string(), "INIT,ENV,BOOTSTRAP");
        assert_eq!(SubsysMask::parse("^NET").0.to_string(), "^NET");
    }
}
