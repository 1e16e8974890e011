#!/usr/bin/env bash
# Runs a command inside a throwaway QEMU (TCG) guest with Soft-RoCE (rxe0).
#
#   bash scripts/rdma-vm.sh [--timeout S] [--env NAME=VALUE]... [--tmpfs DIR]... [--] COMMAND...
#
# The guest boots Debian's stock kernel (downloaded with apt-get download and
# unpacked with dpkg-deb -x, never installed), from a busybox initramfs built
# here. Its root is this machine's / mounted read-only over 9p, so the guest
# runs the binaries built on the host; /tmp, /run and /dev/shm are tmpfs, and
# a read-write share carries the command's output and exit status back.
# --tmpfs DIR mounts an empty tmpfs on DIR (an existing directory) in the
# guest, for programs that write next to their build (target/tmp).
# Inside: rdma_rxe and a veth pair (va, vb), `rdma link add rxe0 type rxe
# netdev va`, then COMMAND runs under bash in the caller's directory (a
# single argument is a shell snippet).
#
# Exit status: the command's. 90 when the guest could not boot or set up
# rxe0 (with a message saying what failed), 124 on timeout. Nothing is left
# running: qemu runs under `timeout` and is killed on exit.
set -euo pipefail

timeout_s=${HETCCL_VM_TIMEOUT_S:-900}
envs=()
tmpfs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --timeout) timeout_s=$2; shift 2 ;;
    --env) envs+=("$2"); shift 2 ;;
    --tmpfs) tmpfs+=("$2"); shift 2 ;;
    --) shift; break ;;
    -*) echo "rdma-vm: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: rdma-vm.sh [--timeout S] [--env N=V]... -- COMMAND..." >&2; exit 2; }

fail() { echo "rdma-vm: FAILED: $*" >&2; exit 90; }
here=$(cd "$(dirname "$0")" && pwd)
cache=${HETCCL_CACHE:-$HOME/.cache/hetccl}/rdma-vm
mkdir -p "$cache"

# --- host packages (Debian): qemu, busybox, rdma-core userspace, perftest.
pkgs=(qemu-system-x86 busybox-static rdma-core ibverbs-providers ibverbs-utils perftest
      libibverbs-dev iproute2 kmod cpio)
need=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "rdma-vm: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  # Other jobs may hold the dpkg lock: wait for it rather than fail.
  lock=(-o DPkg::Lock::Timeout=600)
  { apt-get "${lock[@]}" update -qq && apt-get "${lock[@]}" install -y -qq --no-install-recommends "${need[@]}" >/dev/null; } \
    || fail "apt-get install ${need[*]}"
fi
busybox_bin=/bin/busybox
[ -x "$busybox_bin" ] || fail "busybox-static did not install /bin/busybox"

# --- kernel: the package linux-image-amd64 depends on, unpacked (not installed).
kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
if [ -z "$kpkg" ]; then
  apt-get update -qq >/dev/null 2>&1 || true
  kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
fi
[ -n "$kpkg" ] || fail "apt-cache cannot resolve linux-image-amd64"
kver=${kpkg#linux-image-}
kroot=$cache/$kver/root
if [ ! -e "$kroot/boot/vmlinuz-$kver" ] || [ ! -e "$kroot/lib/modules/$kver/modules.dep" ]; then
  echo "rdma-vm: fetching $kpkg" >&2
  rm -rf "$cache/$kver"; mkdir -p "$cache/$kver/dl"
  (cd "$cache/$kver/dl" && apt-get download "$kpkg" >/dev/null 2>&1) || fail "apt-get download $kpkg"
  dpkg-deb -x "$cache/$kver"/dl/*.deb "$kroot" || fail "dpkg-deb -x $kpkg"
  rm -rf "$cache/$kver/dl"
  /sbin/depmod -b "$kroot" "$kver" || fail "depmod $kver"
fi
kmods=$kroot/lib/modules/$kver/kernel

# --- initramfs: busybox, the virtio/9p modules, and the init script.
initrd=$cache/$kver/initrd.cpio.gz
if [ ! -e "$initrd" ] || [ "$here/lib/rdma-vm-init.sh" -nt "$initrd" ]; then
  ird=$(mktemp -d); trap 'rm -rf "$ird"' EXIT
  mkdir -p "$ird"/{bin,mods,proc,sys,dev,newroot}
  cp "$busybox_bin" "$ird/bin/busybox"
  for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci 9pnet 9pnet_virtio netfs fscache 9p; do
    f=$(find "$kmods" -name "$m.ko" -print -quit)
    [ -n "$f" ] || fail "module $m.ko not in $kpkg"
    cp "$f" "$ird/mods/"
  done
  cp "$here/lib/rdma-vm-init.sh" "$ird/init"; chmod +x "$ird/init"
  (cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1 > "$initrd.tmp") || fail "cpio"
  mv "$initrd.tmp" "$initrd"
  rm -rf "$ird"; trap - EXIT
fi

# --- the run: a share with the command, its environment and its results.
# Not under /tmp (a tmpfs in the guest) nor the cache (an overlay there).
runs=${HETCCL_VM_RUNS:-/var/tmp/hetccl-vm}
mkdir -p "$runs"
share=$(mktemp -d "$runs/run.XXXXXX")
chmod 777 "$share"
qpid=
cleanup() {
  if [ -n "$qpid" ] && kill -0 "$qpid" 2>/dev/null; then kill -9 "$qpid" 2>/dev/null || true; fi
  rm -rf "$share"
}
trap cleanup EXIT INT TERM
{
  printf 'KROOT=%q\nKVER=%q\nVM_CWD=%q\nVM_HOME=%q\n' "$kroot" "$kver" "$PWD" "$HOME"
  # One argument is a shell snippet; several are a command and its arguments.
  if [ $# -eq 1 ]; then printf 'VM_CMD=%q\n' "$1"; else printf 'VM_CMD=%q\n' "$(printf '%q ' "$@")"; fi
  for e in "${envs[@]+"${envs[@]}"}"; do printf 'export %q\n' "$e"; done
  printf 'VM_TMPFS=(%s)\n' "$(for d in "${tmpfs[@]+"${tmpfs[@]}"}"; do printf '%q ' "$(cd "$d" && pwd)"; done)"
} > "$share/job"
cp "$here/lib/rdma-vm-guest.sh" "$share/guest.sh"

echo "rdma-vm: booting $kver (TCG, 2 CPUs), timeout ${timeout_s}s" >&2
t0=$(date +%s)
# Created first, so that tail below never starts before it exists.
: > "$share/console"
timeout -k 5 "$timeout_s" qemu-system-x86_64 -accel tcg -cpu max -m "${HETCCL_VM_MEM_MB:-4096}" -smp 2 \
  -nographic -no-reboot -net none -monitor none -serial stdio \
  -kernel "$kroot/boot/vmlinuz-$kver" -initrd "$initrd" \
  -append "console=ttyS0 panic=-1 quiet loglevel=1 rdmavm.share=$share" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs local,path="$share",mount_tag=share,security_model=none,multidevs=remap \
  < /dev/null > "$share/console" 2>&1 &
qpid=$!
# Stream the console while the guest runs (without the \r of the serial line).
tail -n +1 -f --pid="$qpid" "$share/console" 2>/dev/null | tr -d '\r' &
tpid=$!
set +e
wait "$qpid"; qrc=$?
set -e
qpid=
wait "$tpid" 2>/dev/null || true
t1=$(date +%s)
if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
  echo "rdma-vm: FAILED: timed out after ${timeout_s}s" >&2; exit 124
fi
[ -e "$share/booted" ] || fail "the guest did not boot (qemu exit $qrc); console above"
[ -e "$share/rxe-ok" ] || fail "rxe0 could not be set up in the guest; console above"
[ -e "$share/rc" ] || fail "the command did not finish in the guest (qemu exit $qrc)"
rc=$(cat "$share/rc")
echo "rdma-vm: command exited $rc after $((t1 - t0)) s in the guest" >&2
exit "$rc"
