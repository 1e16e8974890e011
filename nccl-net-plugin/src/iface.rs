//! Network devices: which interfaces we use and what the system says about them.
//!
//! Selection follows `NCCL_SOCKET_IFNAME` (`HETCCL_SOCKET_IFNAME` first), as
//! parsed by [`IfaceFilter`]: a comma-separated list of name prefixes; a
//! leading `^` excludes the listed names instead; a leading `=` (after any
//! `^`) asks for exact names. Without a filter we take the interfaces that
//! are up and not loopback, else loopback. `NCCL_SOCKET_FAMILY` restricts the
//! address family.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub use hetccl_core::config::{AddrFamily, IfaceFilter};

/// One usable network interface: one plugin device.
#[derive(Debug, Clone, PartialEq)]
pub struct NetDevice {
    /// Interface name, e.g. `eth0`.
    pub name: String,
    /// The address we listen on and connect to.
    pub addr: IpAddr,
    /// Link speed in Mbps (10000 when the system does not say).
    pub speed_mbps: i32,
    /// The canonical `/sys` device path, or `None` for a virtual interface.
    pub pci_path: Option<String>,
    /// Whether this is a loopback interface.
    pub loopback: bool,
}

/// An interface as `getifaddrs` reports it, before selection.
#[derive(Debug, Clone)]
struct RawIface {
    name: String,
    up: bool,
    loopback: bool,
    addr: IpAddr,
}

fn usable_v6(a: &Ipv6Addr) -> bool {
    // Link-local addresses need a scope id that the handle does not carry.
    (a.segments()[0] & 0xffc0) != 0xfe80
}

/// Lists interfaces with their first IPv4 address, else first usable IPv6
/// one (only addresses of `family`, if given).
fn list_raw(family: Option<AddrFamily>) -> Vec<RawIface> {
    let mut out: Vec<RawIface> = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        tracing::warn!(target: "hetccl::NET", "getifaddrs failed: {}", std::io::Error::last_os_error());
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a NUL-terminated name owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr is non-NULL; the family says which sockaddr it is.
        let sa_family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let addr = match sa_family {
            libc::AF_INET => {
                // SAFETY: AF_INET means sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: AF_INET6 means sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                let a = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                if !usable_v6(&a) {
                    continue;
                }
                IpAddr::V6(a)
            }
            _ => continue,
        };
        if family.is_some_and(|f| f.as_raw() != family_of(&addr)) {
            continue;
        }
        let flags = ifa.ifa_flags;
        let up = flags & libc::IFF_UP as u32 != 0;
        let loopback = flags & libc::IFF_LOOPBACK as u32 != 0;
        match out.iter_mut().find(|r| r.name == name) {
            // Prefer IPv4 over an IPv6 address seen first.
            Some(r) if r.addr.is_ipv6() && addr.is_ipv4() => r.addr = addr,
            Some(_) => {}
            None => out.push(RawIface {
                name,
                up,
                loopback,
                addr,
            }),
        }
    }
    // SAFETY: `head` came from getifaddrs.
    unsafe { libc::freeifaddrs(head) };
    out
}

fn family_of(a: &IpAddr) -> i32 {
    if a.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    }
}

fn sys_speed(name: &str) -> i32 {
    std::fs::read_to_string(format!("/sys/class/net/{name}/speed"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|&s| s > 0)
        .unwrap_or(10_000)
}

fn sys_pci_path(name: &str) -> Option<String> {
    let p = std::fs::canonicalize(format!("/sys/class/net/{name}/device")).ok()?;
    Some(p.to_string_lossy().into_owned())
}

/// Chooses devices from the interface list: the filter if given, else up and
/// not loopback, else loopback.
fn select(raw: Vec<RawIface>, filter: Option<&IfaceFilter>) -> Vec<RawIface> {
    match filter {
        Some(f) => raw
            .into_iter()
            .filter(|r| r.up && f.matches(&r.name))
            .collect(),
        None => {
            let (lo, other): (Vec<_>, Vec<_>) =
                raw.into_iter().filter(|r| r.up).partition(|r| r.loopback);
            if other.is_empty() {
                lo
            } else {
                other
            }
        }
    }
}

/// Discovers the devices of this host that pass the filter `spec` (NCCL
/// syntax) and `family`.
pub fn discover(spec: Option<&str>, family: Option<AddrFamily>) -> Vec<NetDevice> {
    let filter = spec.map(IfaceFilter::parse);
    discover_with(filter.as_ref(), family)
}

/// Discovers the devices of this host that pass `filter` and `family`.
pub fn discover_with(filter: Option<&IfaceFilter>, family: Option<AddrFamily>) -> Vec<NetDevice> {
    select(list_raw(family), filter)
        .into_iter()
        .map(|r| NetDevice {
            speed_mbps: sys_speed(&r.name),
            pci_path: if r.loopback {
                None
            } else {
                sys_pci_path(&r.name)
            },
            name: r.name,
            addr: r.addr,
            loopback: r.loopback,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(name: &str, up: bool, lo: bool) -> RawIface {
        RawIface {
            name: name.into(),
            up,
            loopback: lo,
            addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
        }
    }

    #[test]
    fn default_selection() {
        let l = vec![
            raw("lo", true, true),
            raw("eth0", true, false),
            raw("ifb0", false, false),
        ];
        let s = select(l.clone(), None);
        assert_eq!(
            s.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
            ["eth0"]
        );
        let s = select(vec![raw("lo", true, true), raw("ifb0", false, false)], None);
        assert_eq!(s[0].name, "lo");
        let s = select(l, Some(&IfaceFilter::parse("lo")));
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].name, "lo");
    }

    #[test]
    fn discovers_loopback() {
        let d = discover(Some("=lo"), None);
        assert_eq!(d.len(), 1);
        assert!(d[0].loopback && d[0].pci_path.is_none() && d[0].speed_mbps > 0);
    }
}
