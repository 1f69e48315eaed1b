#!/bin/busybox sh
# vm-init.sh - PID 1 of a kernel-matrix guest (`cargo xtask vm-test`, xtask/src/vm/).
#
# Loads the kernel's own 9p/virtio modules (listed in /modules/order, dependencies first),
# mounts the host's root file system read-only over 9p (tag `hostroot`) at /newroot, puts
# writable tmpfs where tests write (/tmp, /run, /var/tmp, /dev/shm, and the extra paths in
# `pyebpf.tmpfs=a,b` on the kernel command line), mounts the writable output share (tag `out`)
# at its host path `pyebpf.out=DIR`, then runs DIR/guest.sh chrooted into the host's root and
# powers off. guest.sh's exit status lands in DIR/guest.rc. Every line it prints starts with
# `vm-init:` so the console log reads apart from the kernel's.
B=/bin/busybox
say() { echo "vm-init: $*"; }
halt() { $B sync; $B poweroff -f; }

$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
$B mount -t devtmpfs dev /dev 2>/dev/null
say "kernel $($B uname -r)"
while read -r m; do
  [ -n "$m" ] || continue
  $B insmod "/modules/$m" || say "insmod $m failed"
done </modules/order

OUT= TMPFS=
for arg in $($B cat /proc/cmdline); do
  case $arg in
    pyebpf.out=*) OUT=${arg#pyebpf.out=} ;;
    pyebpf.tmpfs=*) TMPFS=${arg#pyebpf.tmpfs=} ;;
  esac
done
[ -n "$OUT" ] || { say "no pyebpf.out= on the kernel command line"; halt; }

NR=/newroot
# cache=loose: the root is read-only for the whole run; msize: fewer, larger 9p messages.
if ! $B mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot $NR; then
  say "cannot mount the host root over 9p"; halt
fi
$B mount -t proc proc $NR/proc
$B mount -t sysfs sys $NR/sys
$B mount -t devtmpfs dev $NR/dev
$B mkdir -p $NR/dev/pts $NR/dev/shm 2>/dev/null
$B mount -t devpts devpts $NR/dev/pts
for d in /dev/shm /tmp /run /var/tmp $(echo "$TMPFS" | $B tr ',' ' '); do
  [ -d "$NR$d" ] && $B mount -t tmpfs -o mode=1777 tmpfs "$NR$d"
done
$B mount -t tracefs tracefs $NR/sys/kernel/tracing 2>/dev/null
$B mount -t debugfs debugfs $NR/sys/kernel/debug 2>/dev/null
$B mount -t bpf bpf $NR/sys/fs/bpf 2>/dev/null
$B mount -t cgroup2 cgroup2 $NR/sys/fs/cgroup 2>/dev/null
if ! $B mount -t 9p -o trans=virtio,version=9p2000.L,rw,msize=262144 out "$NR$OUT"; then
  say "cannot mount the output share at $OUT"; halt
fi
$B ip link set lo up 2>/dev/null
say "running $OUT/guest.sh"
$B chroot $NR /bin/bash "$OUT/guest.sh"
rc=$?
echo "$rc" >"$NR$OUT/guest.rc"
say "guest.sh exited $rc"
$B umount "$NR$OUT"
halt
