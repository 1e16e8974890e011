//! Child processes and network namespaces for the harness.
//!
//! A child is this test binary run again with `HETCCL_NET_ROLE` set: the
//! test named [`CHILD_TEST`] then plays that role instead of doing nothing.
//! Children talk to the parent with lines on stdout (`HANDLE <hex>`, `OK`…)
//! and read lines from stdin.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// The test function that dispatches roles in a child.
pub const CHILD_TEST: &str = "child_role";

/// A running child with line-based I/O.
pub struct Proc {
    /// The process.
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Its role, for messages.
    pub name: String,
}

impl Proc {
    /// Starts this test binary as `role`, optionally inside network namespace `netns`.
    pub fn spawn(role: &str, netns: Option<&str>, env: &[(&str, String)]) -> Proc {
        let exe = std::env::current_exe().expect("current_exe");
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env("HETCCL_NET_ROLE", role)
            .env("HETCCL_LIB", super::so_path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {role}: {e}"));
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc {
            stdin: child.stdin.take(),
            child,
            lines: rx,
            name: role.to_string(),
        }
    }

    /// Waits for a line containing `prefix`; returns what follows it. A
    /// child that exits or stays silent fails the test with the lines it
    /// printed meanwhile.
    pub fn expect(&self, prefix: &str, timeout: Duration) -> String {
        let t0 = Instant::now();
        let mut seen: Vec<String> = Vec::new();
        loop {
            let left = timeout.checked_sub(t0.elapsed()).unwrap_or_else(|| {
                panic!(
                    "{}: no `{prefix}` line within {timeout:?}; it printed {seen:?}",
                    self.name
                )
            });
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    // libtest may print "test child_role ... " before the first line.
                    if let Some(i) = l.find(prefix) {
                        return l[i + prefix.len()..].trim().to_string();
                    }
                    seen.push(l);
                }
                Err(_) => panic!(
                    "{}: no `{prefix}` line within {timeout:?} (or it exited); it printed {seen:?}",
                    self.name
                ),
            }
        }
    }

    /// Sends a line to the child's stdin.
    pub fn send_line(&mut self, line: &str) {
        let s = self.stdin.as_mut().expect("stdin");
        writeln!(s, "{line}")
            .and_then(|_| s.flush())
            .expect("write to child");
    }

    /// Waits for exit (bounded); kills the child on timeout. Returns success.
    pub fn wait_ok(&mut self, timeout: Duration) -> bool {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return st.success();
            }
            if t0.elapsed() > timeout {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Reads one line from stdin (in a child), bounded by `timeout`.
pub fn read_stdin_line(prefix: &str, timeout: Duration) -> String {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut l = String::new();
        let _ = std::io::stdin().read_line(&mut l);
        let _ = tx.send(l);
    });
    let l = rx.recv_timeout(timeout).expect("no line on stdin");
    l.trim()
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("expected `{prefix}`, got `{l}`"))
        .trim()
        .to_string()
}

/// Hex encoding of a handle.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Decodes [`hex`].
pub fn unhex(s: &str) -> [u8; 128] {
    let mut h = [0u8; 128];
    assert_eq!(s.len(), 256, "handle hex length");
    for (i, b) in h.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex");
    }
    h
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Two network namespaces joined by a veth pair, removed on drop.
pub struct Netns {
    /// The two namespaces.
    pub ns: [String; 2],
    /// The veth end in each.
    pub ifs: [String; 2],
    /// The address of each end (no prefix length).
    pub addrs: [String; 2],
}

impl Netns {
    /// Creates `hcnet<pid><tag>a/b` with 10.231.x.1/2 on the veth ends.
    pub fn create(tag: &str) -> Result<Netns, String> {
        let id = format!("{}{tag}", std::process::id());
        let ns = [format!("hcnet{id}a"), format!("hcnet{id}b")];
        let ifs = ns.clone();
        let x = std::process::id() % 250;
        let addrs = [format!("10.231.{x}.1"), format!("10.231.{x}.2")];
        let n = Netns { ns, ifs, addrs };
        n.setup()?;
        Ok(n)
    }

    fn setup(&self) -> Result<(), String> {
        let [na, nb] = &self.ns;
        let [ia, ib] = &self.ifs;
        ip(&["netns", "add", na])?;
        ip(&["netns", "add", nb])?;
        ip(&["link", "add", ia, "type", "veth", "peer", "name", ib])?;
        ip(&["link", "set", ia, "netns", na])?;
        ip(&["link", "set", ib, "netns", nb])?;
        for k in 0..2 {
            let (n, i, a) = (&self.ns[k], &self.ifs[k], &self.addrs[k]);
            ip(&["-n", n, "addr", "add", &format!("{a}/24"), "dev", i])?;
            ip(&["-n", n, "link", "set", i, "up"])?;
            ip(&["-n", n, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.ns {
            let _ = ip(&["netns", "del", n]);
        }
        // The veth pair goes with its namespaces; remove it if setup stopped early.
        let _ = ip(&["link", "del", &self.ifs[0]]);
    }
}

/// Connects to `peer` and accepts on `l` in one thread (both non-blocking,
/// retried until both comms exist, within the harness limit).
pub fn cross_connect(api: &super::Api, l: super::P, peer: &[u8; 128]) -> (super::P, super::P) {
    let mut h = *peer;
    let (mut s, mut r) = (super::P::null(), super::P::null());
    let t0 = Instant::now();
    while s.is_null() || r.is_null() {
        assert!(t0.elapsed() < super::LIMIT, "cross connect did not finish");
        if s.is_null() {
            s = api.connect(&mut h).expect("connect");
        }
        if r.is_null() {
            r = api.accept(l).expect("accept");
        }
    }
    (s, r)
}
