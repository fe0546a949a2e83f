#!/usr/bin/env bash
# Chromium from Debian's packages, for the headless-browser test of `diffscale report`
# (tests/unit/test_report_browser.py drives it with playwright-python; playwright never
# downloads a browser here).
#
#   tests/browser/chromium.sh install   install chromium if missing (as root), print its path on stdout
#
# Installs with the same apt helper (and the same lock) as tests/schedulers/*.sh.
set -euo pipefail
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}"

log() { echo "[chromium.sh] $*" >&2; }
die() { echo "[chromium.sh] ERROR: $*" >&2; exit 1; }

source "$(dirname "${BASH_SOURCE[0]}")/../schedulers/common.sh"

do_install() {
    if ! command -v chromium >/dev/null; then
        need_root
        log "installing chromium (Debian package)"
        local t0=$SECONDS
        apt_install chromium
        log "installed in $((SECONDS - t0)) s"
    fi
    command -v chromium
}

case "${1:-}" in
    install) do_install ;;
    *) echo "usage: $0 install" >&2; exit 2 ;;
esac
