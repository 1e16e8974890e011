//! "Did you mean …?" for unknown variable names.

/// The Levenshtein distance between two ASCII-ish strings, by chars.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The part after `NCCL_` or `HETCCL_`.
fn stem(name: &str) -> &str {
    name.strip_prefix("HETCCL_")
        .or_else(|| name.strip_prefix("NCCL_"))
        .unwrap_or(name)
}

/// The known name closest to `name`, if it is close enough to be a likely
/// typo. Names are compared whole and by their stem, so `HETCCL_DEBUG`
/// suggests `NCCL_DEBUG`.
pub(crate) fn closest<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (stem(name).chars().count() / 3).max(2);
    known
        .map(|k| {
            let d = distance(name, k).min(distance(stem(name), stem(k)));
            (d, k)
        })
        .filter(|&(d, _)| d <= limit)
        .min_by_key(|&(d, _)| d)
        .map(|(_, k)| k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_basics() {
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("same", "same"), 0);
    }

    #[test]
    fn suggests_typos_and_other_prefix() {
        let known = ["HETCCL_TIMEOUT_S", "HETCCL_SPIN_US", "NCCL_DEBUG"];
        assert_eq!(
            closest("HETCCL_TIMEOUT", known.into_iter()),
            Some("HETCCL_TIMEOUT_S")
        );
        assert_eq!(
            closest("HETCCL_SPINUS", known.into_iter()),
            Some("HETCCL_SPIN_US")
        );
        assert_eq!(
            closest("HETCCL_DEBUG", known.into_iter()),
            Some("NCCL_DEBUG")
        );
        assert_eq!(closest("HETCCL_ZZZZZZZZZZ", known.into_iter()), None);
    }
}
