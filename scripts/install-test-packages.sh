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
# A locale whose PostgreSQL translations the refusal tests read (tests/integration/
# test_pg_refusals.py): made from the `locales` package's data when the system lacks it,
# once that package is in.
german_locale() {
    if ! locale -a 2>/dev/null | grep -qix 'de_DE\.utf-\?8' && command -v localedef >/dev/null; then
        localedef -i de_DE -f UTF-8 de_DE.UTF-8 || echo "could not make the de_DE.UTF-8 locale" >&2
    fi
}
if [ "${#missing[@]}" -eq 0 ]; then german_locale; exit 0; fi
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
german_locale
