//! Enumerated settings: the tuning mode (`HETCCL_TUNE`) and the wire
//! compression of gradients (`HETCCL_COMPRESS`).

use std::fmt;

/// `HETCCL_TUNE`: where algorithm choices come from besides the tuning table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TuneMode {
    /// The table where it covers a case, the cost model elsewhere.
    #[default]
    Off,
    /// As `Off`, with the cost model calibrated by a short probe at init.
    Init,
    /// As `Init`, and choices adapt at run time to measured call times.
    Online,
}

impl TuneMode {
    /// Parses `off`, `init` or `online` (case-insensitive; `0` is `off`).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "0" | "none" => Ok(Self::Off),
            "init" => Ok(Self::Init),
            "online" => Ok(Self::Online),
            _ => Err("one of off, init, online".to_string()),
        }
    }

    /// The name as the variable spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Init => "init",
            Self::Online => "online",
        }
    }
}

impl fmt::Display for TuneMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `HETCCL_COMPRESS`: the wire format of floating-point sum/avg reductions
/// between nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    /// Data travels as it is.
    #[default]
    Off,
    /// Quantized to bfloat16 on the wire.
    Bf16,
    /// Quantized to fp8 e4m3 on the wire.
    Fp8E4M3,
}

impl Compression {
    /// Parses `off`, `bf16` or `fp8e4m3` (case-insensitive; `0` is `off`).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "0" | "none" => Ok(Self::Off),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "fp8e4m3" | "fp8" | "e4m3" => Ok(Self::Fp8E4M3),
            _ => Err("one of off, bf16, fp8e4m3".to_string()),
        }
    }

    /// The name as the variable spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Bf16 => "bf16",
            Self::Fp8E4M3 => "fp8e4m3",
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_round_trip() {
        for m in [TuneMode::Off, TuneMode::Init, TuneMode::Online] {
            assert_eq!(TuneMode::parse(m.name()), Ok(m));
        }
        for c in [Compression::Off, Compression::Bf16, Compression::Fp8E4M3] {
            assert_eq!(Compression::parse(c.name()), Ok(c));
        }
        assert_eq!(TuneMode::parse(" ONLINE "), Ok(TuneMode::Online));
        assert!(TuneMode::parse("yes").is_err());
        assert!(Compression::parse("fp16").is_err());
    }
}
