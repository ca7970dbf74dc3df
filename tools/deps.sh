#!/bin/sh
# Installs the Debian packages duet needs (as root), or prints the exact
# command to run and fails (otherwise).
# usage: tools/deps.sh PACKAGE...
missing=""
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "duet: missing packages:$missing" >&2
  echo "duet: run as root:  apt-get update && apt-get install -y$missing" >&2
  exit 1
fi
echo "duet: installing:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing
