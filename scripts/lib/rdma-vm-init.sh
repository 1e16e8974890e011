#!/bin/busybox sh
# /init of scripts/rdma-vm.sh's initramfs: virtio and 9p modules, the host's /
# read-only as the new root, the share read-write at its host path, then the
# guest script in a chroot, then power off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
share=$(sed -n 's/.*rdmavm.share=\([^ ]*\).*/\1/p' /proc/cmdline)
say() { echo "rdma-vm(init): $*" > /dev/console; }
for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci \
         9pnet 9pnet_virtio netfs fscache 9p; do
  insmod /mods/$m.ko 2>/dev/null || say "insmod $m failed"
done
opts=trans=virtio,version=9p2000.L,msize=524288,cache=loose
if ! mount -t 9p -o ro,$opts hostroot /newroot; then
  say "cannot mount the host root over 9p"; poweroff -f
fi
if ! mount -t 9p -o $opts share /newroot$share; then
  say "cannot mount the share $share"; poweroff -f
fi
echo booted > /newroot$share/booted
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount --bind /dev /newroot/dev
mount -t tmpfs tmpfs /newroot/run
# The host's /tmp stays reachable at /run/hosttmp: a checkout under /tmp
# (a CI clone) is bound back into the guest's tmpfs /tmp by the guest script.
mkdir -p /newroot/run/hosttmp
mount --bind /newroot/tmp /newroot/run/hosttmp
mount -t tmpfs tmpfs /newroot/tmp
mkdir -p /dev/shm
mount -t tmpfs tmpfs /newroot/dev/shm
chroot /newroot /bin/bash "$share/guest.sh" "$share" < /dev/console > /dev/console 2>&1
sync
poweroff -f
