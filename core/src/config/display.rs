//! `Display for Config`: one `NAME=value` line per variable that is set or
//! has a default.

use std::fmt;

use super::vars::VARS;
use super::Config;

impl fmt::Display for Config {
    /// Writes, in table order, one line per variable:
    /// - `NAME=value` when it came from the environment (with
    ///   `(overrides OTHER)` when it beat an alias that was also set, and
    ///   `(ignored: why)` when hetccl ignores it);
    /// - `NAME=value (default)` when unset but the field has a default;
    /// - `NAME=value` when unset but set in code to a non-default value.
    ///
    /// Unset optional variables are omitted.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let default = Config::default();
        let from_env = |i: usize| self.from_env & (1u64 << i) != 0;
        for (i, var) in VARS.iter().enumerate() {
            let group: Vec<usize> = (0..VARS.len())
                .filter(|&j| VARS[j].field == var.field)
                .collect();
            let winner = group.iter().copied().rfind(|&j| from_env(j));
            let Some(value) = (var.show)(self) else {
                continue;
            };
            match winner {
                Some(w) if w == i => {
                    let beaten: Vec<&str> = group
                        .iter()
                        .filter(|&&j| j != i && from_env(j))
                        .map(|&j| VARS[j].name)
                        .collect();
                    let ignored = super::vars::ignored(var.name)
                        .map(|why| format!(" (ignored: {why})"))
                        .unwrap_or_default();
                    if beaten.is_empty() {
                        writeln!(f, "{}={value}{ignored}", var.name)?;
                    } else {
                        writeln!(
                            f,
                            "{}={value} (overrides {}){ignored}",
                            var.name,
                            beaten.join(", ")
                        )?;
                    }
                }
                Some(_) => {}
                None if group.first() == Some(&i) => {
                    if (var.show)(&default).as_ref() == Some(&value) {
                        writeln!(f, "{}={value} (default)", var.name)?;
                    } else {
                        writeln!(f, "{}={value}", var.name)?;
                    }
                }
                None => {}
            }
        }
        Ok(())
    }
}
