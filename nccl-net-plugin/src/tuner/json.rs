//! Bounded readers of JSON values, shared by the tuning-table parsers (the
//! tuner plugin's here, the engine's in `hetccl-collectives`). Each returns
//! the value or a message naming what was expected.

use serde_json::{Map, Value};

/// `v` as an object; `what` names it in the message.
pub fn object<'a>(v: &'a Value, what: &str) -> Result<&'a Map<String, Value>, String> {
    v.as_object()
        .ok_or_else(|| format!("{what} must be a JSON object"))
}

/// Refuses a key of `m` outside `keys`, so that a misspelt field is an
/// error instead of being skipped.
pub fn known_keys(m: &Map<String, Value>, what: &str, keys: &[&str]) -> Result<(), String> {
    match m.keys().find(|k| !keys.contains(&k.as_str())) {
        Some(k) => Err(format!("{what} has an unknown key {k:?}")),
        None => Ok(()),
    }
}

/// The array at `key`, of at most `max` items.
pub fn array<'a>(
    m: &'a Map<String, Value>,
    key: &str,
    what: &str,
    max: usize,
) -> Result<&'a Vec<Value>, String> {
    let a = m
        .get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| format!("{what} needs an array {key:?}"))?;
    if a.len() > max {
        return Err(format!("{key:?} has {} items (at most {max})", a.len()));
    }
    Ok(a)
}

/// The non-negative integer at `key`, if present.
pub fn opt_uint(m: &Map<String, Value>, key: &str, what: &str) -> Result<Option<u64>, String> {
    match m.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("{key:?} of {what} must be an integer >= 0")),
    }
}

/// The non-negative integer at `key`.
pub fn uint(m: &Map<String, Value>, key: &str, what: &str) -> Result<u64, String> {
    opt_uint(m, key, what)?.ok_or_else(|| format!("{what} needs {key:?}"))
}

/// The string at `key`.
pub fn string<'a>(m: &'a Map<String, Value>, key: &str) -> Result<&'a str, String> {
    m.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("an entry needs a string {key:?}"))
}

/// A name as the tables compare them: lower case, `_` and `-` dropped
/// (`CollNet_Direct` is `collnetdirect`).
pub fn normalise(s: &str) -> String {
    s.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}
