#!/bin/sh
# prep-rootfs.sh ROOTFS: trim a debootstrap'ed bookworm tree into the sim engine's base layer (run as root).
set -eu
R=$1
cat > "$R/etc/apt/sources.list" <<SRC
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SRC
: > "$R/etc/machine-id"
rm -f "$R/var/lib/dbus/machine-id" "$R/etc/hostname"
if ls /usr/local/share/ca-certificates/* >/dev/null 2>&1; then
  cp -a /usr/local/share/ca-certificates/. "$R/usr/local/share/ca-certificates/"
fi
chroot "$R" update-ca-certificates >/dev/null 2>&1 || chroot "$R" update-ca-certificates
rm -rf "$R"/var/lib/apt/lists/* "$R"/var/cache/apt/*.bin "$R"/var/cache/apt/archives/*.deb "$R"/var/log/*.log
