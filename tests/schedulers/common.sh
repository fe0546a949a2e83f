# Shared by slurm.sh and sge.sh (sourced after each defines log, die and STATE).

need_root() { [ "$(id -u)" = 0 ] || die "must run as root"; }

apt_install() {
    # One apt at a time, across the slurm and sge scripts.
    export DEBIAN_FRONTEND=noninteractive
    local opts=(-y -q --no-install-recommends -o DPkg::Lock::Timeout=300)
    (
        flock -w 600 9 || die "apt lock timeout"
        if ! apt-get install "${opts[@]}" "$@" >&2; then
            log "apt-get install failed; running apt-get update and retrying"
            apt-get update -q >&2 || log "apt-get update reported errors (continuing)"
            apt-get install "${opts[@]}" "$@" >&2
        fi
    ) 9>/tmp/diffscale-apt.lock
}

# start/stop/restart are serialised (concurrent test sessions on one machine); the lock
# file lives next to the state dir, and the daemons never inherit its descriptor (8>&-).
locked() {
    exec 8>"$STATE.lock"
    flock -w 600 8 || die "could not lock $STATE.lock within 600 s"
    "$@"
}

# The command line: do_start, do_stop and do_status are each script's own.
dispatch() {
    case "${1:-}" in
        start) locked do_start ;;
        stop) locked do_stop ;;
        status) do_status ;;
        restart) locked do_stop; do_start ;;
        *) echo "usage: $0 {start|stop|status|restart}" >&2; exit 2 ;;
    esac
}
