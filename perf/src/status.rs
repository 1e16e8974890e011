//! `hetccl-perf status --pid PID` (or `--addr HOST:PORT`): asks a process's
//! hetccl status service (`HETCCL_STATUS`, docs/observability.md) who is
//! waiting on whom, and prints its answer. The service of process PID
//! writes its port to `<tmp>/hetccl-status-<PID>.port`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How long the service may take: it asks every rank with a deadline of
/// its own.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// The file holding the status port of process `pid` (as the library
/// writes it).
pub fn port_file(pid: u32) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("hetccl-status-{pid}.port"))
}

/// Where to ask: from `--pid PID` or `--addr HOST:PORT`.
pub fn target(args: &[String]) -> Result<SocketAddr, String> {
    match args {
        [flag, pid] if flag == "--pid" => {
            let pid: u32 = pid
                .parse()
                .map_err(|_| format!("--pid {pid}: not a process id"))?;
            let f = port_file(pid);
            let text = std::fs::read_to_string(&f).map_err(|e| {
                format!(
                    "no status service for pid {pid} ({}: {e}); is HETCCL_STATUS=1 set in that process?",
                    f.display()
                )
            })?;
            let port: u16 = text
                .trim()
                .parse()
                .map_err(|_| format!("{}: not a port", f.display()))?;
            Ok(SocketAddr::from(([127, 0, 0, 1], port)))
        }
        [flag, addr] if flag == "--addr" => addr
            .to_socket_addrs()
            .map_err(|e| format!("--addr {addr}: {e}"))?
            .next()
            .ok_or_else(|| format!("--addr {addr}: no address")),
        _ => Err("usage: hetccl-perf status --pid PID | --addr HOST:PORT".into()),
    }
}

fn ask(addr: SocketAddr) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(ANSWER_WITHIN))?;
    s.write_all(b"status\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// The subcommand; returns the exit code (0 answered, 2 no answer, 64
/// usage).
pub fn main(args: &[String]) -> i32 {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("usage: hetccl-perf status --pid PID | --addr HOST:PORT");
        return 0;
    }
    let addr = match target(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("hetccl-perf status: {e}");
            return if e.starts_with("usage") { 64 } else { 2 };
        }
    };
    match ask(addr) {
        Ok(t) => {
            print!("{t}");
            0
        }
        Err(e) => {
            eprintln!("hetccl-perf status: {addr}: {e}");
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let a = |v: &[&str]| target(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(a(&["--addr", "127.0.0.1:9"]).unwrap().port(), 9);
        assert!(a(&[]).unwrap_err().starts_with("usage"));
        assert!(a(&["--pid", "x"]).is_err());
        assert!(a(&["--pid", "4000000000"])
            .unwrap_err()
            .contains("no status service"));
    }
}
