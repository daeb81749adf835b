#!/bin/sh
# Boot the host's own systemd as PID 1 of a throw-away container:
# new pid+mount+uts+ipc+cgroup namespaces, root = overlayfs(lower=/, upper=tmpfs),
# private /dev,/run,/tmp, pure cgroup2 at /sys/fs/cgroup, unit dir = $D/units (host dir).
#   nsd.sh start DIR [TIMEOUT]  -> prints host PID of the container's systemd
#   nsd.sh stop  DIR
#   nsd.sh exec  DIR cmd...     -> run cmd inside (e.g. systemctl start x)
set -eu
cmd=$1; D=$(realpath -m "$2"); shift 2
CG=/sys/fs/cgroup/unified/nsd-$(echo "$D" | md5sum | cut -c1-12)
MASK="systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket
systemd-udev-trigger.service systemd-udev-settle.service systemd-sysctl.service
systemd-modules-load.service systemd-binfmt.service proc-sys-fs-binfmt_misc.automount
proc-sys-fs-binfmt_misc.mount systemd-timesyncd.service systemd-pstore.service
systemd-remount-fs.service kmod-static-nodes.service systemd-tmpfiles-setup-dev.service
systemd-hwdb-update.service ldconfig.service systemd-firstboot.service
systemd-machine-id-commit.service systemd-repart.service systemd-random-seed.service
sys-kernel-debug.mount sys-kernel-tracing.mount sys-kernel-config.mount
sys-fs-fuse-connections.mount dev-hugepages.mount getty.target console-getty.service
postgresql.service e2scrub_reap.service systemd-logind.service"
case $cmd in
start)
  [ ! -e "$D/pid" ] || { echo "already started: $D" >&2; exit 1; }
  mkdir -p "$D/units"
  for u in $MASK; do ln -sf /dev/null "$D/units/$u"; done
  mkdir -p "$CG"
  setsid sh -c 'echo $$ > "$1/cgroup.procs"; exec unshare --pid --fork --kill-child \
      --mount --uts --ipc --cgroup sh "$2" inner "$3"' sh "$CG" "$(realpath "$0")" "$D" \
      >"$D/console.log" 2>&1 </dev/null &
  to=${1:-30}; end=$(( $(date +%s) + to ))
  while :; do
    P=$(cat "$CG/cgroup.procs" "$CG"/init.scope/cgroup.procs 2>/dev/null | while read p; do
          [ "$(cat /proc/$p/comm 2>/dev/null)" = systemd ] && echo $p; done | head -1)
    if [ -n "$P" ]; then
      s=$(nsenter -t "$P" -m -p -r -w systemctl is-system-running 2>/dev/null || true)
      case $s in running|degraded) echo "$P" > "$D/pid"; echo "$P"; exit 0;; esac
    fi
    [ "$(date +%s)" -lt $end ] || { echo "boot timeout (state=${s:-none})" >&2; cat "$D/console.log" >&2; "$0" stop "$D"; exit 1; }
    sleep 0.05
  done ;;
inner)
  R=$D/root; O=$D/ovl
  export LIBMOUNT_UTAB=$D/utab
  mount --make-rprivate /
  mkdir -p "$O" "$R"
  mount -t tmpfs -o mode=755 tmpfs "$O"
  mkdir "$O/upper" "$O/work"
  mount -t overlay overlay -o "lowerdir=/,upperdir=$O/upper,workdir=$O/work" "$R"
  mount --bind "$D/units" "$R/etc/systemd/system"
  mount -t proc proc "$R/proc"
  mount --rbind /sys "$R/sys"; mount -o remount,bind,ro "$R/sys"
  mount -t cgroup2 cgroup2 "$R/sys/fs/cgroup"
  mount -t tmpfs -o mode=755,nosuid tmpfs "$R/dev"
  for n in null zero full random urandom tty; do touch "$R/dev/$n"; mount --bind /dev/$n "$R/dev/$n"; done
  touch "$R/dev/console"; mount --bind /dev/null "$R/dev/console"
  mkdir "$R/dev/pts" "$R/dev/shm"
  mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$R/dev/pts"
  ln -s pts/ptmx "$R/dev/ptmx"
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/dev/shm"
  ln -s /proc/self/fd "$R/dev/fd"
  for i in 0:stdin 1:stdout 2:stderr; do ln -s /proc/self/fd/${i%%:*} "$R/dev/${i#*:}"; done
  mount -t tmpfs -o mode=755,nosuid,nodev tmpfs "$R/run"
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/tmp"
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/var/tmp"
  cd "$R"
  exec env -i container=nsd PATH=/usr/sbin:/usr/bin:/sbin:/bin \
       chroot "$R" /lib/systemd/systemd --system --unit=basic.target --log-target=journal ;;
exec)
  exec nsenter -t "$(cat "$D/pid")" -m -p -u -i -C -r -w "$@" ;;
stop)
  P=$(cat "$D/pid" 2>/dev/null || true)
  if [ -n "$P" ] && kill -0 "$P" 2>/dev/null; then
    kill -s RTMIN+4 "$P"             # = poweroff for a containerised systemd
    for i in $(seq 100); do kill -0 "$P" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$P" 2>/dev/null && kill -9 "$P"   # pidns dies with its PID 1
  fi
  for p in $(cat "$CG"/cgroup.procs 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
  sleep 0.1
  [ ! -d "$CG" ] || find "$CG" -depth -type d -exec rmdir {} \;
  rm -f "$D/pid" ;;
esac
