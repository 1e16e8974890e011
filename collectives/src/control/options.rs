//! The keys of `hetcclCommSetOption`/`hetcclCommGetOption` and their
//! values, as strings parsed per key:
//!
//! | key | value |
//! |---|---|
//! | `algo` | an `NCCL_ALGO` value for every collective, or `default` (back to `NCCL_ALGO`) |
//! | `algo.<collective>` | an algorithm list (`ring`, `ring,tree`, `^tree`) for one collective (`allreduce`, `broadcast`, `reduce`, `allgather`, `reducescatter`, `alltoall`, `gather`, `scatter`), or `default` |
//! | `tune` | `off`, `init` or `online` |
//! | `compress` | `off`, `bf16` or `fp8e4m3` |
//! | `chunk_bytes` | the pipelined plans' chunk size, 4 KiB – 64 MiB (`K`/`M` suffixes), or `default` (512 KiB) |
//!
//! Keys and `default` are case-insensitive; values are trimmed.

use hetccl_core::config::{Compression, TuneMode};

use crate::algo::{AlgoFilter, Collective};

/// The value that clears an option.
pub const DEFAULT: &str = "default";

/// The longest key a set carries (bytes).
pub const MAX_KEY: usize = 64;
/// The longest value a set carries (bytes).
pub const MAX_VALUE: usize = 128;

/// The smallest `chunk_bytes`.
pub const MIN_CHUNK: usize = 4 << 10;
/// The largest `chunk_bytes`.
pub const MAX_CHUNK: usize = 64 << 20;

/// An option's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// `algo`.
    Algo,
    /// `algo.<collective>`.
    AlgoFor(Collective),
    /// `tune`.
    Tune,
    /// `compress`.
    Compress,
    /// `chunk_bytes`.
    ChunkBytes,
}

/// A parsed (key, value): what a set applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setting {
    /// `algo` (`None`: default).
    Algo(Option<String>),
    /// `algo.<collective>` (`None`: default).
    AlgoFor(Collective, Option<String>),
    /// `tune`.
    Tune(TuneMode),
    /// `compress`.
    Compress(Compression),
    /// `chunk_bytes` (`None`: default).
    ChunkBytes(Option<usize>),
}

/// The collectives `algo.<collective>` accepts.
fn collective(name: &str) -> Option<Collective> {
    Collective::ALL
        .into_iter()
        .filter(|c| !matches!(c, Collective::Send | Collective::Recv))
        .find(|c| c.name().eq_ignore_ascii_case(name))
}

/// Parses a key.
pub fn key(k: &str) -> Result<Key, String> {
    let lower = k.trim().to_ascii_lowercase();
    Ok(match lower.as_str() {
        "algo" => Key::Algo,
        "tune" => Key::Tune,
        "compress" => Key::Compress,
        "chunk_bytes" => Key::ChunkBytes,
        _ => match lower.strip_prefix("algo.") {
            Some(c) => Key::AlgoFor(collective(c).ok_or_else(|| {
                format!(
                    "unknown collective {c:?} in key {k:?} (allreduce, broadcast, reduce, \
                     allgather, reducescatter, alltoall, gather, scatter)"
                )
            })?),
            None => {
                return Err(format!(
                    "unknown key {k:?} (algo, algo.<collective>, tune, compress, chunk_bytes)"
                ))
            }
        },
    })
}

/// A size in bytes with an optional binary `K`, `M` or `G` suffix.
fn size(v: &str) -> Option<usize> {
    let v = v.trim();
    let (digits, shift) = match v.chars().last()?.to_ascii_uppercase() {
        'K' => (&v[..v.len() - 1], 10),
        'M' => (&v[..v.len() - 1], 20),
        'G' => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    let n: usize = digits.trim().parse().ok()?;
    n.checked_mul(1usize << shift)
}

/// Parses `value` for `key`; the error says what the key accepts.
pub fn parse(key_text: &str, value: &str) -> Result<Setting, String> {
    let k = key(key_text)?;
    // Algorithm and collective names are case-insensitive: the canonical
    // form is lower case without blanks.
    let v: String = match k {
        Key::Algo | Key::AlgoFor(_) => value
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
            .to_ascii_lowercase(),
        _ => value.trim().to_string(),
    };
    let v = v.as_str();
    let is_default = v.eq_ignore_ascii_case(DEFAULT);
    let bad = |what: &str| format!("invalid value {value:?} for {key_text:?}: {what}");
    Ok(match k {
        Key::Algo if is_default => Setting::Algo(None),
        Key::Algo => {
            AlgoFilter::parse(v).map_err(|e| bad(&e.to_string()))?;
            if v.is_empty() {
                return Err(bad("an NCCL_ALGO value or default"));
            }
            Setting::Algo(Some(v.to_string()))
        }
        Key::AlgoFor(c) if is_default => Setting::AlgoFor(c, None),
        Key::AlgoFor(c) => {
            if v.is_empty() || v.contains([';', ':']) {
                return Err(bad("an algorithm list such as ring, ring,tree or ^tree"));
            }
            AlgoFilter::parse(&format!("{}:{v}", c.name())).map_err(|e| bad(&e.to_string()))?;
            Setting::AlgoFor(c, Some(v.to_string()))
        }
        Key::Tune => Setting::Tune(TuneMode::parse(v).map_err(|e| bad(&e))?),
        Key::Compress => Setting::Compress(Compression::parse(v).map_err(|e| bad(&e))?),
        Key::ChunkBytes if is_default => Setting::ChunkBytes(None),
        Key::ChunkBytes => match size(v) {
            Some(n) if (MIN_CHUNK..=MAX_CHUNK).contains(&n) => Setting::ChunkBytes(Some(n)),
            _ => return Err(bad("a size from 4K to 64M, or default")),
        },
    })
}

/// The canonical text of a setting, `key=value`: what the ranks compare.
pub fn canonical(s: &Setting) -> (String, String) {
    let d = || DEFAULT.to_string();
    match s {
        Setting::Algo(v) => ("algo".into(), v.clone().unwrap_or_else(d)),
        Setting::AlgoFor(c, v) => (format!("algo.{}", c.name()), v.clone().unwrap_or_else(d)),
        Setting::Tune(m) => ("tune".into(), m.name().into()),
        Setting::Compress(c) => ("compress".into(), c.name().into()),
        Setting::ChunkBytes(n) => ("chunk_bytes".into(), n.map_or_else(d, |n| n.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values() {
        assert_eq!(
            key("ALGO.AllReduce"),
            Ok(Key::AlgoFor(Collective::AllReduce))
        );
        assert!(key("algo.send").is_err());
        assert!(key("algo.").is_err());
        assert!(key("channels").is_err());
        assert_eq!(
            parse("algo.allreduce", " Ring "),
            Ok(Setting::AlgoFor(Collective::AllReduce, Some("ring".into())))
        );
        assert!(parse("algo.allreduce", "rung").is_err());
        assert!(parse("algo.allreduce", "ring;tree").is_err());
        assert!(parse("algo.allreduce", "broadcast:ring").is_err());
        assert!(parse("algo.allreduce", "").is_err());
        assert_eq!(
            parse("algo", "Ring; allreduce:tree"),
            Ok(Setting::Algo(Some("ring;allreduce:tree".into())))
        );
        assert!(parse("algo", "").is_err());
        assert_eq!(parse("tune", "Online"), Ok(Setting::Tune(TuneMode::Online)));
        assert!(parse("tune", "fast").is_err());
        assert_eq!(
            parse("compress", "fp8e4m3"),
            Ok(Setting::Compress(Compression::Fp8E4M3))
        );
        assert!(parse("compress", "fp16").is_err());
        assert_eq!(
            parse("chunk_bytes", "1M"),
            Ok(Setting::ChunkBytes(Some(1 << 20)))
        );
        assert_eq!(
            parse("chunk_bytes", "Default"),
            Ok(Setting::ChunkBytes(None))
        );
        for bad in ["0", "4095", "65M", "x", "", "99999999999999999999G"] {
            assert!(parse("chunk_bytes", bad).is_err(), "{bad}");
        }
        let e = parse("nope", "1").unwrap_err();
        assert!(e.contains("unknown key"), "{e}");
        assert_eq!(
            canonical(&parse("algo.reduce", "default").unwrap()),
            ("algo.reduce".into(), "default".into())
        );
    }
}
