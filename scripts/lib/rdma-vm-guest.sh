#!/bin/bash
# Runs inside scripts/rdma-vm.sh's guest (chrooted into the host's / over 9p):
# loads Soft-RoCE, makes rxe0 on a veth pair, runs the job, records its status.
set -u
share=$1
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp
# shellcheck disable=SC1091
. "$share/job"
# The host's home (read-only): its caches (NVIDIA headers) are there.
export HOME=$VM_HOME
say() { echo "rdma-vm(guest): $*"; }
modprobe -d "$KROOT" -S "$KVER" -a crc32_generic crc32_pclmul rdma_rxe ib_uverbs veth \
  || { say "modprobe failed"; exit 1; }
ip link set lo up
ip link add va type veth peer name vb
# TEST-NET-1 addresses: nothing leaves the guest (qemu runs with -net none).
ip addr add 192.0.2.1/24 dev va
ip addr add 192.0.2.2/24 dev vb
ip link set va up
ip link set vb up
rdma link add rxe0 type rxe netdev va || { say "rdma link add rxe0 failed"; exit 1; }
for _ in $(seq 100); do
  grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null && break
  sleep 0.1
done
if ! grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null; then
  say "rxe0 port 1 is not ACTIVE"; exit 1
fi
echo ok > "$share/rxe-ok"
ulimit -l unlimited
# The host's hetccl cache (NVIDIA headers) writable through an overlay
# whose changes are dropped with the guest.
if [ -d "$HOME/.cache/hetccl" ] && modprobe -d "$KROOT" -S "$KVER" overlay; then
  mkdir -p /tmp/.ov/u /tmp/.ov/w
  mount -t overlay overlay -o "lowerdir=$HOME/.cache/hetccl,upperdir=/tmp/.ov/u,workdir=/tmp/.ov/w" \
    "$HOME/.cache/hetccl" || say "no overlay on $HOME/.cache/hetccl"
fi
# A working directory under /tmp is the host's, hidden by the guest's tmpfs:
# bind its top directory back from the host's /tmp (read-only, like /).
case $VM_CWD in
  /tmp/?*)
    top=${VM_CWD#/tmp/}
    top=${top%%/*}
    mkdir -p "/tmp/$top"
    mount --bind "/run/hosttmp/$top" "/tmp/$top" || { say "cannot bind /tmp/$top from the host"; exit 1; }
    ;;
esac
for d in "${VM_TMPFS[@]}"; do mount -t tmpfs tmpfs "$d" || { say "cannot mount a tmpfs on $d"; exit 1; }; done
cd "$VM_CWD" || exit 1
eval "set -o pipefail; $VM_CMD" 2>&1 | tee "$share/out"
echo "${PIPESTATUS[0]}" > "$share/rc"
