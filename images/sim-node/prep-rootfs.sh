#!/bin/sh
# prep-rootfs.sh ROOTFS DNS_JSON: turn a debootstrap'ed bookworm tree into a sim node's root filesystem.
# Run as root on the host by `sparkdeploy sim up` (src/sparkdeploy/sim/images.py). Idempotent.
set -eu
R=$1
DNS_JSON=${2:-[]}
HERE=$(cd "$(dirname "$0")" && pwd)

cat > "$R/etc/apt/sources.list" <<SRC
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SRC

# Each node must get its own SSH host keys and machine-id at first boot, not share the baked ones.
rm -f "$R"/etc/ssh/ssh_host_*
install -m 0644 "$HERE/sparkdeploy-ssh-hostkeys.service" "$R/etc/systemd/system/sparkdeploy-ssh-hostkeys.service"
mkdir -p "$R/etc/systemd/system/multi-user.target.wants" "$R/etc/systemd/system/ssh.service.wants"
ln -sf /etc/systemd/system/sparkdeploy-ssh-hostkeys.service "$R/etc/systemd/system/multi-user.target.wants/"
ln -sf /etc/systemd/system/sparkdeploy-ssh-hostkeys.service "$R/etc/systemd/system/ssh.service.wants/"
install -m 0644 "$HERE/sshd.conf" "$R/etc/ssh/sshd_config.d/sparkdeploy.conf"
: > "$R/etc/machine-id"
rm -f "$R/var/lib/dbus/machine-id"
rm -f "$R/etc/hostname"

# Nondeterministic background jobs and consoles a container has no use for.
for t in apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer fstrim.timer; do
  ln -sf /dev/null "$R/etc/systemd/system/$t"
done
rm -f "$R/etc/systemd/system/getty.target.wants/getty@tty1.service" \
      "$R/etc/systemd/system/default.target.wants/e2scrub_reap.service" \
      "$R/etc/systemd/system/sysinit.target.wants/systemd-pstore.service"

# The node's own dockerd: systemd cgroup driver (nested containers nest under the node's cgroup),
# overlay2 on the /var/lib/docker volume, and the host's resolver (the node's 127.0.0.11 is not reachable
# from nested containers, which would fall back to public resolvers).
mkdir -p "$R/etc/docker"
printf '{"exec-opts": ["native.cgroupdriver=systemd"], "storage-driver": "overlay2", "dns": %s}\n' "$DNS_JSON" \
  > "$R/etc/docker/daemon.json"

# The host's extra CA certificates (TLS-intercepting proxies), copied by glob: names differ between machines.
if ls /usr/local/share/ca-certificates/* >/dev/null 2>&1; then
  cp -a /usr/local/share/ca-certificates/. "$R/usr/local/share/ca-certificates/"
fi
chroot "$R" update-ca-certificates >/dev/null 2>&1 || chroot "$R" update-ca-certificates

# Keep the image small: no apt lists, no downloaded packages.
rm -rf "$R"/var/lib/apt/lists/* "$R"/var/cache/apt/*.bin "$R"/var/cache/apt/archives/*.deb "$R"/var/log/*.log
