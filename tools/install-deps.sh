#!/bin/sh
# Installs the Debian packages muon's build needs, only those that are missing, and says so.
# Usage: tools/install-deps.sh pkg...   (the Makefile passes what the target needs)
set -e
missing=""
for p in "$@"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "muon: installing missing Debian packages:$missing (apt-get)"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq $missing >/dev/null
echo "muon: installed$missing"
