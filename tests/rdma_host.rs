//! The verbs transport on a machine without RDMA: `libhetccl.so` has no
//! link-time dependency on libibverbs, and when the library cannot be
//! loaded the net plugin serves TCP and says why in one INFO line.

use std::process::Command;

use hetccl_testkit::net::{self, Api};

#[test]
fn libhetccl_does_not_link_libibverbs() {
    let so = hetccl_testkit::hetccl_so();
    let out = Command::new("readelf")
        .arg("-d")
        .arg(&so)
        .output()
        .expect("readelf (binutils) runs");
    assert!(out.status.success(), "readelf -d {}", so.display());
    let text = String::from_utf8_lossy(&out.stdout);
    let needed: Vec<&str> = text.lines().filter(|l| l.contains("(NEEDED)")).collect();
    assert!(
        !needed.is_empty(),
        "readelf shows the NEEDED entries:\n{text}"
    );
    assert!(
        !needed
            .iter()
            .any(|l| l.contains("ibverbs") || l.contains("rdmacm")),
        "libhetccl.so links rdma-core: {needed:?}"
    );
}

/// The child: opens the plugin with libibverbs made unloadable and prints
/// what it got.
#[test]
fn child_without_libibverbs() {
    if std::env::var_os("HETCCL_RDMA_HOST_CHILD").is_none() {
        return;
    }
    let api = Api::v12_of(net::lib());
    println!("DEVICES {}", api.devices());
    let (s, r) = api.pair();
    net::exchange(&api, s, r, &[(0, net::pattern(100_000, 1))], 100_000);
    println!("EXCHANGED");
    api.close_send(s);
    api.close_recv(r);
    api.finalize();
}

#[test]
fn without_libibverbs_the_plugin_serves_tcp_and_says_so_once() {
    let exe = std::env::current_exe().expect("own path");
    let out = Command::new(exe)
        .args([
            "--exact",
            "child_without_libibverbs",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("HETCCL_RDMA_HOST_CHILD", "1")
        .env("HETCCL_IBVERBS_LIB", "/nonexistent/libibverbs.so.1")
        .env("HETCCL_SOCKET_IFNAME", "=lo")
        .env_remove("HETCCL_NET")
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "NET")
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("DEVICES 1") && stdout.contains("EXCHANGED"),
        "{stdout}"
    );
    let lines = stdout
        .lines()
        .filter(|l| l.contains("NET/IB: not using verbs"))
        .count();
    assert_eq!(lines, 1, "one INFO line says why verbs is off:\n{stdout}");
    assert!(stdout.contains("device 0: lo"), "TCP device lo:\n{stdout}");
}
