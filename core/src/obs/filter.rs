//! Which events pass: NCCL_DEBUG (level) and NCCL_DEBUG_SUBSYS (subsystem).
//!
//! Targets of the form `hetccl::<SUBSYS>` (or `hetccl::<SUBSYS>::…`) name an
//! NCCL subsystem, case-insensitively. `hetccl::VERSION` is the version line.
//! Any other target (another crate, or an unknown subsystem) is "ALL-only":
//! its INFO/TRACE lines show only when every subsystem is selected
//! (`NCCL_DEBUG_SUBSYS=ALL`).

use tracing::{Level, Metadata};

use crate::config::{Config, DebugLevel, SubsysMask};

/// The target of the version line.
pub(crate) const VERSION_TARGET: &str = "hetccl::VERSION";

/// What a target says about an event's subsystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Subsys {
    /// `hetccl::VERSION`: printed at NCCL_DEBUG >= VERSION, whatever the mask.
    Version,
    /// A known NCCL subsystem (or `hetccl::ALL`), with its flags.
    Known(SubsysMask),
    /// Anything else: shown only when the mask is `ALL`.
    Other,
}

impl Subsys {
    /// Classifies a tracing target.
    pub(crate) fn of(target: &str) -> Subsys {
        let Some(rest) = target.strip_prefix("hetccl::") else {
            return Subsys::Other;
        };
        let name = rest.split("::").next().unwrap_or(rest);
        if name.eq_ignore_ascii_case("VERSION") {
            return Subsys::Version;
        }
        match SubsysMask::flag(name) {
            Some(m) => Subsys::Known(m),
            None => Subsys::Other,
        }
    }

    /// The `flags` argument for an `ncclDebugLogger_t`. WARN, VERSION and
    /// unclassified lines carry `NCCL_ALL`, as NCCL's own WARN lines do.
    pub(crate) fn flags(self, level: DebugLevel) -> u64 {
        match self {
            Subsys::Known(m) if level > DebugLevel::Warn => m.0,
            _ => SubsysMask::ALL.0,
        }
    }
}

/// The NCCL level of a tracing level: ERROR and WARN are WARN, INFO is INFO,
/// DEBUG and TRACE are TRACE.
pub(crate) fn nccl_level(level: &Level) -> DebugLevel {
    match *level {
        Level::ERROR | Level::WARN => DebugLevel::Warn,
        Level::INFO => DebugLevel::Info,
        _ => DebugLevel::Trace,
    }
}

/// The level and subsystem settings of one logging setup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Filter {
    /// NCCL_DEBUG.
    pub level: DebugLevel,
    /// NCCL_DEBUG_SUBSYS.
    pub subsys: SubsysMask,
}

impl Filter {
    /// The filter a configuration asks for.
    pub(crate) fn from_config(cfg: &Config) -> Filter {
        Filter {
            level: cfg.debug,
            subsys: cfg.debug_subsys,
        }
    }

    /// The NCCL level an event is printed at, if the level setting lets it
    /// through (the subsystem is not checked here). The version line reports
    /// [`DebugLevel::Version`].
    pub(crate) fn level_of(&self, meta: &Metadata<'_>) -> Option<DebugLevel> {
        if Subsys::of(meta.target()) == Subsys::Version {
            return (self.level >= DebugLevel::Version).then_some(DebugLevel::Version);
        }
        let lvl = nccl_level(meta.level());
        (self.level >= lvl).then_some(lvl)
    }

    /// True when a line at `level` for `subsys` is printed by hetccl itself:
    /// WARN and VERSION always (given the level passed), INFO and TRACE only
    /// for selected subsystems.
    pub(crate) fn subsys_passes(&self, level: DebugLevel, subsys: Subsys) -> bool {
        if level <= DebugLevel::Warn {
            return true;
        }
        match subsys {
            Subsys::Version => true,
            Subsys::Known(m) => self.subsys.intersects(m),
            Subsys::Other => self.subsys == SubsysMask::ALL,
        }
    }

    /// The most verbose tracing level this filter can let through.
    pub(crate) fn max_tracing_level(&self) -> tracing::level_filters::LevelFilter {
        use tracing::level_filters::LevelFilter;
        match self.level {
            DebugLevel::None => LevelFilter::OFF,
            // The version line is an INFO event.
            DebugLevel::Version | DebugLevel::Warn | DebugLevel::Info | DebugLevel::Abort => {
                LevelFilter::INFO
            }
            DebugLevel::Trace => LevelFilter::TRACE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_classify() {
        assert_eq!(Subsys::of("hetccl::INIT"), Subsys::Known(SubsysMask::INIT));
        assert_eq!(Subsys::of("hetccl::net"), Subsys::Known(SubsysMask::NET));
        assert_eq!(
            Subsys::of("hetccl::NET::tcp"),
            Subsys::Known(SubsysMask::NET)
        );
        assert_eq!(Subsys::of("hetccl::ALL"), Subsys::Known(SubsysMask::ALL));
        assert_eq!(Subsys::of("hetccl::VERSION"), Subsys::Version);
        assert_eq!(Subsys::of("hetccl::WHATEVER"), Subsys::Other);
        assert_eq!(Subsys::of("hetccl_core::obs"), Subsys::Other);
        assert_eq!(Subsys::of("hyper::client"), Subsys::Other);
    }

    #[test]
    fn flags_for_the_external_logger() {
        let net = Subsys::Known(SubsysMask::NET);
        assert_eq!(net.flags(DebugLevel::Info), 0x10);
        assert_eq!(net.flags(DebugLevel::Trace), 0x10);
        assert_eq!(net.flags(DebugLevel::Warn), !0);
        assert_eq!(Subsys::Other.flags(DebugLevel::Info), !0);
        assert_eq!(Subsys::Version.flags(DebugLevel::Version), !0);
    }

    #[test]
    fn subsystems_gate_info_not_warn() {
        let f = Filter {
            level: DebugLevel::Trace,
            subsys: SubsysMask::INIT,
        };
        let net = Subsys::Known(SubsysMask::NET);
        assert!(f.subsys_passes(DebugLevel::Warn, net));
        assert!(!f.subsys_passes(DebugLevel::Info, net));
        assert!(!f.subsys_passes(DebugLevel::Trace, net));
        assert!(f.subsys_passes(DebugLevel::Info, Subsys::Known(SubsysMask::INIT)));
        assert!(f.subsys_passes(DebugLevel::Info, Subsys::Known(SubsysMask::ALL)));
        assert!(!f.subsys_passes(DebugLevel::Info, Subsys::Other));
        let all = Filter {
            subsys: SubsysMask::ALL,
            ..f
        };
        assert!(all.subsys_passes(DebugLevel::Info, Subsys::Other));
    }

    #[test]
    fn tracing_levels_map_to_nccl_levels() {
        assert_eq!(nccl_level(&Level::ERROR), DebugLevel::Warn);
        assert_eq!(nccl_level(&Level::WARN), DebugLevel::Warn);
        assert_eq!(nccl_level(&Level::INFO), DebugLevel::Info);
        assert_eq!(nccl_level(&Level::DEBUG), DebugLevel::Trace);
        assert_eq!(nccl_level(&Level::TRACE), DebugLevel::Trace);
    }
}
