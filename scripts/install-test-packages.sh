#!/usr/bin/env bash
# The Debian packages that the real-server tests use (Postfix, Dovecot, Chromium, the
# PostgreSQL 15 server binaries), installed only when missing. Run as root by `make test`;
# elsewhere those tests skip with the reason.
# The packages' own services are kept from starting: test fixtures run private instances on
# loopback ports with configs in a temp folder.
set -euo pipefail
missing=()
for pkg in "$@"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
echo "installing test packages: ${missing[*]}" >&2
blocker=/usr/sbin/policy-rc.d
added_blocker=0
if [ ! -e "$blocker" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$blocker"
    chmod +x "$blocker"
    added_blocker=1
fi
trap '[ "$added_blocker" = 1 ] && rm -f "$blocker"' EXIT
echo "postfix postfix/main_mailer_type select No configuration" | debconf-set-selections
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=300 "${missing[@]}" >/dev/null
