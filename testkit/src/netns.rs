//! Two network namespaces joined by a veth pair, for "two nodes on one
//! host" tests (`tests/collectives_netns.rs`).
//!
//! [`NetnsPair::create`] makes, as root:
//! - namespaces `hetccl-<pid>-<seq>-a` and `...-b`;
//! - a veth pair `hcA<pid><seq>` (in a) / `hcB<pid><seq>` (in b), names cut
//!   to the kernel's 15 characters;
//! - addresses `10.231.<x>.1/24` (a) and `10.231.<x>.2/24` (b), with `x`
//!   derived from the pid; they exist only inside the two namespaces, which
//!   have no other interface than their `lo`, so no traffic can leave them;
//! - every link up, `lo` included.
//!
//! Dropping the value deletes both namespaces (which deletes the veth pair),
//! also during a panic's unwinding. Namespaces left behind by a test process
//! that was killed (their pid no longer exists) are deleted on the next
//! [`NetnsPair::create`].

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The prefix of every namespace this module creates.
pub const PREFIX: &str = "hetccl-";

/// Two namespaces and the veth pair between them.
#[derive(Debug)]
pub struct NetnsPair {
    /// Namespace of "node A".
    pub ns_a: String,
    /// Namespace of "node B".
    pub ns_b: String,
    /// The veth end in A.
    pub veth_a: String,
    /// The veth end in B.
    pub veth_b: String,
    /// A's address (no prefix length).
    pub addr_a: String,
    /// B's address.
    pub addr_b: String,
    created: Vec<String>,
}

fn ip(args: &[&str]) -> Result<String, String> {
    let o = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip {}`: {e}", args.join(" ")))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(format!(
            "`ip {}` failed ({}): {}",
            args.join(" "),
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Deletes namespaces named `hetccl-<pid>-...` whose pid is gone.
fn remove_stale() {
    let Ok(list) = ip(&["netns", "list"]) else {
        return;
    };
    for line in list.lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !pid_alive(pid) {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

impl NetnsPair {
    /// Creates the pair, or says why it cannot (not root, no `ip`, no
    /// permission in this container, ...). Whatever was made before a
    /// failing step is removed again.
    pub fn create() -> Result<Self, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("network namespaces need root (euid is not 0)".into());
        }
        remove_stale();
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let x = (pid as usize * 7 + seq) % 250 + 1;
        let cut = |s: String| s.chars().take(15).collect::<String>();
        let mut me = Self {
            ns_a: format!("{PREFIX}{pid}-{seq}-a"),
            ns_b: format!("{PREFIX}{pid}-{seq}-b"),
            veth_a: cut(format!("hcA{pid}{seq}")),
            veth_b: cut(format!("hcB{pid}{seq}")),
            addr_a: format!("10.231.{x}.1"),
            addr_b: format!("10.231.{x}.2"),
            created: Vec::new(),
        };
        me.setup()?; // on error, `me` is dropped and cleans up
        Ok(me)
    }

    fn setup(&mut self) -> Result<(), String> {
        for ns in [self.ns_a.clone(), self.ns_b.clone()] {
            ip(&["netns", "add", &ns])?;
            self.created.push(ns);
        }
        ip(&[
            "link",
            "add",
            &self.veth_a,
            "netns",
            &self.ns_a,
            "type",
            "veth",
            "peer",
            "name",
            &self.veth_b,
            "netns",
            &self.ns_b,
        ])?;
        for (ns, dev, addr) in [
            (&self.ns_a, &self.veth_a, &self.addr_a),
            (&self.ns_b, &self.veth_b, &self.addr_b),
        ] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    /// The namespace and veth of node 0 (A) or 1 (B).
    pub fn node(&self, i: usize) -> (&str, &str) {
        if i == 0 {
            (&self.ns_a, &self.veth_a)
        } else {
            (&self.ns_b, &self.veth_b)
        }
    }

    /// The prefix that runs a program in node `i`'s namespace.
    pub fn exec_prefix(&self, i: usize) -> Vec<String> {
        vec![
            "ip".into(),
            "netns".into(),
            "exec".into(),
            self.node(i).0.to_string(),
        ]
    }

    /// A one-line description for logs.
    pub fn describe(&self) -> String {
        format!(
            "{} ({} {}) <-> {} ({} {})",
            self.ns_a, self.veth_a, self.addr_a, self.ns_b, self.veth_b, self.addr_b
        )
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        for ns in self.created.drain(..).rev() {
            if let Err(e) = ip(&["netns", "del", &ns]) {
                eprintln!("warning: cleaning up network namespace {ns}: {e}");
            }
        }
    }
}
