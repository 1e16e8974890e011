//! A strict parser of the Prometheus text exposition format (version
//! 0.0.4), for the tests of `HETCCL_METRICS_FILE`: it rejects what a
//! Prometheus server would reject (bad names, bad escapes, unparseable
//! values, duplicate series, a `TYPE` after its samples, a family split in
//! two) and checks histograms (`le` on every bucket, cumulative counts, a
//! `+Inf` bucket equal to `_count`, a `_sum`).

use std::collections::{BTreeMap, HashMap, HashSet};

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The metric name as written (`x_bucket`, `x_sum`, ...).
    pub name: String,
    /// The labels.
    pub labels: BTreeMap<String, String>,
    /// The value.
    pub value: f64,
}

/// A parsed exposition.
#[derive(Debug, Clone, Default)]
pub struct Exposition {
    /// Family name -> type (`counter`, `gauge`, `histogram`, ...).
    pub types: HashMap<String, String>,
    /// Every sample, in order.
    pub samples: Vec<Sample>,
}

impl Exposition {
    /// The samples named `name` whose labels include every `(k, v)` of
    /// `want`.
    pub fn find(&self, name: &str, want: &[(&str, &str)]) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| {
                s.name == name
                    && want
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect()
    }

    /// The value of the one sample `find` returns; an error if there is not
    /// exactly one.
    pub fn value(&self, name: &str, want: &[(&str, &str)]) -> Result<f64, String> {
        match self.find(name, want).as_slice() {
            [s] => Ok(s.value),
            v => Err(format!("{} samples of {name} {want:?}", v.len())),
        }
    }
}

fn is_name(s: &str, colon: bool) -> bool {
    let mut c = s.chars();
    let first = |ch: char| ch.is_ascii_alphabetic() || ch == '_' || (colon && ch == ':');
    matches!(c.next(), Some(ch) if first(ch))
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || (colon && ch == ':'))
}

fn value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ if s.chars().all(|c| c.is_ascii_digit() || "+-.eE".contains(c)) && !s.is_empty() => {
            s.parse::<f64>().map_err(|e| format!("value {s:?}: {e}"))
        }
        _ => Err(format!("value {s:?}")),
    }
}

/// Parses `name{labels} value [timestamp]`.
fn sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    if !is_name(name, true) {
        return Err(format!("metric name {name:?}"));
    }
    let mut labels = BTreeMap::new();
    let b = line.as_bytes();
    let mut i = name_end;
    if b.get(i) == Some(&b'{') {
        i += 1;
        loop {
            if b.get(i) == Some(&b'}') {
                i += 1;
                break;
            }
            let eq = line[i..].find('=').ok_or("label without =")? + i;
            let key = &line[i..eq];
            if !is_name(key, false) || key.starts_with("__") {
                return Err(format!("label name {key:?}"));
            }
            if b.get(eq + 1) != Some(&b'"') {
                return Err(format!("label {key}: value not quoted"));
            }
            i = eq + 2;
            let mut v = String::new();
            loop {
                match b.get(i) {
                    None => return Err(format!("label {key}: unterminated value")),
                    Some(b'"') => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') => {
                        match b.get(i + 1) {
                            Some(b'\\') => v.push('\\'),
                            Some(b'"') => v.push('"'),
                            Some(b'n') => v.push('\n'),
                            other => return Err(format!("label {key}: escape {other:?}")),
                        }
                        i += 2;
                    }
                    Some(_) => {
                        let ch = line[i..].chars().next().expect("in bounds");
                        v.push(ch);
                        i += ch.len_utf8();
                    }
                }
            }
            if labels.insert(key.to_string(), v).is_some() {
                return Err(format!("label {key} twice"));
            }
            match b.get(i) {
                Some(b',') => i += 1,
                Some(b'}') => {}
                other => return Err(format!("after label {key}: {other:?}")),
            }
        }
    }
    let rest = &line[i..];
    let rest = rest.strip_prefix(' ').ok_or("no space before the value")?;
    let mut parts = rest.split(' ');
    let v = value(parts.next().ok_or("no value")?)?;
    if let Some(ts) = parts.next() {
        ts.parse::<i64>().map_err(|_| format!("timestamp {ts:?}"))?;
    }
    if parts.next().is_some() {
        return Err("trailing fields".into());
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value: v,
    })
}

/// The family a sample belongs to, given the declared types.
fn family_of<'a>(name: &'a str, types: &HashMap<String, String>) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if types
                .get(base)
                .is_some_and(|t| t == "histogram" || t == "summary")
            {
                return base;
            }
        }
    }
    name
}

/// Parses and checks a whole exposition.
pub fn parse(text: &str) -> Result<Exposition, String> {
    let mut e = Exposition::default();
    let mut helped = HashSet::new();
    let mut done_families: HashSet<String> = HashSet::new();
    let mut current: Option<String> = None;
    let mut series = HashSet::new();
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("the last line has no newline".into());
    }
    for (n, line) in text.lines().enumerate() {
        let err = |m: String| format!("line {}: {m}: {line:?}", n + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(c) = line.strip_prefix('#') {
            let mut w = c.trim_start().splitn(3, ' ');
            match (w.next(), w.next(), w.next()) {
                (Some("TYPE"), Some(name), Some(t)) => {
                    if !is_name(name, true) {
                        return Err(err("bad TYPE name".into()));
                    }
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&t) {
                        return Err(err(format!("type {t:?}")));
                    }
                    if e.types.insert(name.to_string(), t.to_string()).is_some() {
                        return Err(err("second TYPE".into()));
                    }
                    if done_families.contains(name) || current.as_deref() == Some(name) {
                        return Err(err("TYPE after the family's samples".into()));
                    }
                }
                (Some("HELP"), Some(name), _) if !helped.insert(name.to_string()) => {
                    return Err(err("second HELP".into()));
                }
                _ => {}
            }
            continue;
        }
        let s = sample(line).map_err(err)?;
        let fam = family_of(&s.name, &e.types).to_string();
        if current.as_deref() != Some(fam.as_str()) {
            if done_families.contains(&fam) {
                return Err(err(format!("family {fam} split in two")));
            }
            if let Some(c) = current.take() {
                done_families.insert(c);
            }
            current = Some(fam.clone());
        }
        let key = (s.name.clone(), format!("{:?}", s.labels));
        if !series.insert(key) {
            return Err(err("duplicate series".into()));
        }
        if e.types.get(&fam).map(String::as_str) == Some("counter")
            && (s.value.is_nan() || s.value < 0.0)
        {
            return Err(err("negative counter".into()));
        }
        e.samples.push(s);
    }
    check_histograms(&e)?;
    Ok(e)
}

fn check_histograms(e: &Exposition) -> Result<(), String> {
    for (fam, _) in e.types.iter().filter(|(_, t)| *t == "histogram") {
        // Group the buckets by their labels without `le`.
        let mut groups: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for s in e
            .samples
            .iter()
            .filter(|s| s.name == format!("{fam}_bucket"))
        {
            let le = s
                .labels
                .get("le")
                .ok_or(format!("{fam}: bucket without le"))?;
            let mut rest = s.labels.clone();
            rest.remove("le");
            groups
                .entry(format!("{rest:?}"))
                .or_default()
                .push((value(le)?, s.value));
        }
        for (labels, mut b) in groups {
            b.sort_by(|x, y| x.0.partial_cmp(&y.0).expect("no NaN bound"));
            if b.last().map(|x| x.0) != Some(f64::INFINITY) {
                return Err(format!("{fam}{labels}: no +Inf bucket"));
            }
            if b.windows(2).any(|w| w[1].1 < w[0].1) {
                return Err(format!("{fam}{labels}: buckets not cumulative"));
            }
            let find = |suffix: &str| {
                e.samples
                    .iter()
                    .find(|s| {
                        s.name == format!("{fam}{suffix}") && format!("{:?}", s.labels) == labels
                    })
                    .map(|s| s.value)
            };
            let count = find("_count").ok_or(format!("{fam}{labels}: no _count"))?;
            find("_sum").ok_or(format!("{fam}{labels}: no _sum"))?;
            if b.last().expect("non-empty").1 != count {
                return Err(format!("{fam}{labels}: +Inf bucket != _count"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_good_and_rejects_bad() {
        let good = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\",y=\"q\\\"\\n\"} 3\n\
                    # TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 4.5e-1\nh_count 2\n";
        let e = parse(good).unwrap();
        assert_eq!(e.value("a_total", &[("y", "q\"\n")]).unwrap(), 3.0);
        for bad in [
            "a{x=\"1} 3\n",
            "a{x=1} 3\n",
            "1a 3\n",
            "a 3x\n",
            "a 1\na 2\n",
            "a 1\nb 1\na{z=\"1\"} 2\n",
            "a 1\n# TYPE a counter\n",
            "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
            "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 2\n",
            "a{x=\"\\t\"} 1\n",
            "a 1",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
