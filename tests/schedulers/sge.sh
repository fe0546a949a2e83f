#!/usr/bin/env bash
# Real Grid Engine (Debian bookworm: Son of Grid Engine 8.1.9) on this one host, for the
# integration tests.
#
#   tests/schedulers/sge.sh start    install if missing, (re)initialise a fresh cell, start
#                                    sge_qmaster + sge_execd, configure queue/PEs/complexes,
#                                    wait for the exec host's load report; print `export ...`
#                                    lines on stdout
#   tests/schedulers/sge.sh stop     delete all jobs, kill the daemons (config stays on disk,
#                                    the next start re-initialises it anyway)
#   tests/schedulers/sge.sh status   exit 0 when qmaster answers and the host reports load
#
# Must run as root. Idempotent: `start` on a running, healthy cell only prints the env.
# Uses Debian's default SGE_ROOT=/var/lib/gridengine, SGE_CELL=default (so the /usr/bin
# clients work from any process without extra env). Helper files (configs, the starter
# method, logs) live in $DIFFSCALE_SGE_DIR (default /tmp/diffscale-sge).
# Informational output goes to stderr; stdout carries only the `export` lines.
set -euo pipefail
# daemons and admin tools live in sbin; callers (pytest, CI) may not have it on PATH
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}"

STATE="${DIFFSCALE_SGE_DIR:-/tmp/diffscale-sge}"
export SGE_ROOT=/var/lib/gridengine
export SGE_CELL=default
COMMON="$SGE_ROOT/$SGE_CELL/common"
SPOOL=/var/spool/gridengine
RUNDIR=/var/run/gridengine
QMASTER_PID="$RUNDIR/qmaster.pid"
EXECD_PID="$RUNDIR/execd.pid"
ADMIN=sgeadmin
QUEUE=all.q
SLOTS="${DIFFSCALE_SGE_SLOTS:-4}"
GPUS="${DIFFSCALE_SGE_GPUS:-2}"
WAIT_S="${DIFFSCALE_SGE_WAIT_S:-60}"
PKGS=(gridengine-master gridengine-exec gridengine-client)
CLEAN_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

T0="$(date +%s%N)"
log() { echo "[sge.sh] $*" >&2; }
script_sha() { sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1; }
phase() { [ -z "${DIFFSCALE_SGE_TRACE:-}" ] || log "+$(( ($(date +%s%N) - T0) / 1000000 )) ms: $*"; }
die() { echo "[sge.sh] ERROR: $*" >&2; exit 1; }
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

install_if_missing() {
    if [ -x /usr/lib/gridengine/sge_qmaster ] && [ -x /usr/lib/gridengine/sge_execd ] \
        && [ -x /usr/lib/gridengine/qsub ] && [ -f "$COMMON/bootstrap" ]; then
        return 0
    fi
    local h t0=$SECONDS
    h="$(hostname)"
    log "installing ${PKGS[*]}"
    debconf-set-selections <<EOF
gridengine-common shared/gridengineconfig boolean true
gridengine-common shared/gridenginecell string default
gridengine-common shared/gridenginemaster string $h
gridengine-master shared/gridengineconfig boolean true
gridengine-master shared/gridenginecell string default
gridengine-master shared/gridenginemaster string $h
gridengine-client shared/gridengineconfig boolean true
gridengine-client shared/gridenginemaster string $h
gridengine-exec shared/gridengineconfig boolean true
gridengine-exec shared/gridenginemaster string $h
EOF
    apt_install "${PKGS[@]}"
    [ -f "$COMMON/bootstrap" ] || die "package install did not create $COMMON/bootstrap"
    log "installed in $((SECONDS - t0)) s"
}

sge_host() {
    # the name Grid Engine itself uses for this host (after host_aliases)
    /usr/lib/gridengine/gethostname -aname 2>/dev/null || hostname
}

# A process that exited stays a zombie until PID 1 reaps it, which on these machines can
# take seconds: kill -0 and pgrep still see zombies, so they are filtered out here.
alive() { local st; st="$(ps -o stat= -p "$1" 2>/dev/null)" && [ -n "$st" ] && [ "${st#Z}" = "$st" ]; }
live_pids() { local p; for p in $(pgrep -x "$1" 2>/dev/null); do alive "$p" && echo "$p"; done; return 0; }
qmaster_pids() { live_pids sge_qmaster; }
execd_pids() { live_pids sge_execd; }

daemon_env() {
    # jobs inherit sge_execd's environment: keep it minimal and predictable
    env -i PATH="$CLEAN_PATH" SGE_ROOT="$SGE_ROOT" SGE_CELL="$SGE_CELL" LANG=C.UTF-8 \
        HOME=/root SHELL=/bin/bash "$@"
}

host_ready() {
    # exec host reports load and the queue instance is not unknown/alarm/error/disabled
    local h="$1" load states
    load="$(qhost -h "$h" 2>/dev/null | awk -v h="$h" '$1==h{print $7}')"
    [ -n "$load" ] && [ "$load" != "-" ] || return 1
    states="$(qstat -f -q "$QUEUE@$h" 2>/dev/null | awk -v q="$QUEUE@$h" '$1==q{print $6}')" || return 1
    qstat -f -q "$QUEUE@$h" 2>/dev/null | grep -q "^$QUEUE@$h" || return 1
    case "$states" in *u*|*a*|*E*|*d*|*s*|*D*|*C*) return 1 ;; esac
}

print_env() {
    echo "export SGE_ROOT=$SGE_ROOT"
    echo "export SGE_CELL=$SGE_CELL"
    echo "export DIFFSCALE_SGE_DIR=$STATE"
    echo "export DIFFSCALE_SGE_HOST=$(sge_host)"
    echo "# clients (qsub qstat qacct qrsh qmod qdel qconf qhost) are in /usr/bin: no PATH change needed"
}

diagnostics() {
    {
        echo "----- processes"; ps -eo pid,user,args | grep -E '[s]ge_' || true
        echo "----- qhost"; qhost 2>&1 || true
        echo "----- qstat -f"; qstat -f 2>&1 || true
        echo "----- act_qmaster: $(cat "$COMMON/act_qmaster" 2>/dev/null)"
        echo "----- host_aliases:"; cat "$COMMON/host_aliases" 2>/dev/null || true
        local f
        for f in "$SPOOL/qmaster/messages" "$SPOOL"/execd/*/messages /tmp/execd_messages.* /tmp/qmaster_messages.*; do
            [ -f "$f" ] && { echo "----- tail -n 40 $f"; tail -n 40 "$f"; }
        done
    } >&2
}

kill_pids_wait() {
    # TERM the given pids, wait up to $1 tenths of a second, then KILL
    local tenths="$1"; shift
    [ "$#" -gt 0 ] || return 0
    kill -TERM "$@" 2>/dev/null || true
    local i pid alive
    for i in $(seq 1 "$tenths"); do
        alive=0
        for pid in "$@"; do alive "$pid" && alive=1; done
        [ "$alive" = 0 ] && return 0
        sleep 0.1
    done
    kill -KILL "$@" 2>/dev/null || true
}

kill_jobs() {
    # all job processes: every sge_shepherd and its process group/session members
    local pid sid
    for pid in $(live_pids sge_shepherd); do
        for sid in $(ps -eo pid=,sid=,ppid= | awk -v p="$pid" '$3==p{print $1}'); do
            kill -KILL -- "-$sid" 2>/dev/null || kill -KILL "$sid" 2>/dev/null || true
        done
        kill -KILL "$pid" 2>/dev/null || true
    done
}

do_stop() {
    need_root
    if [ -n "$(qmaster_pids)" ]; then
        qdel -f -u '*' >/dev/null 2>&1 || true
    fi
    # shellcheck disable=SC2046
    kill_pids_wait 50 $(execd_pids)
    kill_jobs
    # shellcheck disable=SC2046
    kill_pids_wait 30 $(qmaster_pids)
    rm -f "$QMASTER_PID" "$EXECD_PID"
    # keep the last daemon logs for post-mortems (the spool is wiped by the next start)
    mkdir -p "$STATE.last-log"
    cp -f "$SPOOL/qmaster/messages" "$STATE.last-log/qmaster.messages" 2>/dev/null || true
    local f
    for f in "$SPOOL"/execd/*/messages; do
        if [ -f "$f" ]; then cp -f "$f" "$STATE.last-log/execd.messages" || true; fi
    done
    rm -rf "$STATE"
    log "stopped"
}

fresh_cell() {
    # Wipe and re-create the cell's spool (job ids restart at 1, empty accounting) -- what
    # the gridengine-master postinst does on first install.
    local h="$1"
    rm -rf "$SPOOL/spooldb" "$SPOOL/qmaster" "$SPOOL/execd"
    install -d -o "$ADMIN" -g "$ADMIN" -m 0755 "$SPOOL/spooldb" "$SPOOL/qmaster" \
        "$SPOOL/qmaster/job_scripts" "$SPOOL/execd" "$RUNDIR"
    rm -f "$COMMON/accounting" "$COMMON/reporting"
    runuser -u "$ADMIN" -- /usr/share/gridengine/scripts/init_cluster \
        "$SGE_ROOT" "$SGE_CELL" "$SPOOL/spooldb" "$ADMIN" >"$STATE/init_cluster.log" 2>&1 \
        || { cat "$STATE/init_cluster.log" >&2; die "init_cluster failed"; }
    # 127.0.0.1 reverse-resolves to "localhost": make that an alias of this host, or
    # qmaster refuses clients ("access denied ... not identical to clients host name").
    echo "$h localhost" >"$COMMON/host_aliases"
    echo "$h" >"$COMMON/act_qmaster"
    chown "$ADMIN:$ADMIN" "$COMMON/host_aliases" "$COMMON/act_qmaster"
    chmod 0644 "$COMMON/host_aliases" "$COMMON/act_qmaster"
}

write_starter() {
    # starter_method: SoGE 8.1.9 drops TMPDIR from the environment it hands a starter
    # method (TMP is still set to the per-job dir the execd creates and removes). Restore
    # TMPDIR from TMP (or make a dir), then run the job: scripts by their #! line
    # (shell_start_mode unix_behavior), binaries (-b y) directly. The job is exec'd, not
    # wrapped, so -notify's SIGUSR2 and qdel's signals reach it directly.
    cat >"$STATE/starter.sh" <<'EOF'
#!/bin/sh
if [ -z "${TMPDIR:-}" ] || [ ! -d "$TMPDIR" ]; then
    if [ -n "${TMP:-}" ] && [ -d "$TMP" ]; then
        TMPDIR="$TMP"
    else
        TMPDIR="/tmp/sge-job.${JOB_ID:-0}.${SGE_TASK_ID:-undefined}"
        mkdir -p "$TMPDIR" 2>/dev/null || TMPDIR=/tmp
    fi
    export TMPDIR
fi
[ -n "${TMP:-}" ] || { TMP="$TMPDIR"; export TMP; }
exec "$@"
EOF
    chmod 0755 "$STATE/starter.sh"
}

configure_cell() {
    local h="$1" d="$STATE/conf"
    mkdir -p "$d"
    # global configuration
    # (qconf -sconf wraps long values with "\\"-continuations: join them first)
    qconf -sconf global | sed -e ':a' -e '/\\$/N; s/\\\n[[:space:]]*/ /; ta' >"$d/global.orig"
    sed -E \
        -e 's/^(min_uid|min_gid)[[:space:]].*/\1 0/' \
        -e 's/^shell_start_mode[[:space:]].*/shell_start_mode unix_behavior/' \
        -e 's/^mailer[[:space:]].*/mailer \/bin\/true/' \
        -e 's/^load_report_time[[:space:]].*/load_report_time 00:00:02/' \
        -e 's/^execd_params[[:space:]].*/execd_params ENABLE_ADDGRP_KILL=true/' \
        -e 's/^reporting_params[[:space:]].*/reporting_params accounting=true reporting=false flush_time=00:00:00 joblog=false sharelog=00:00:00 accounting_flush_time=00:00:00/' \
        -e 's/^(rsh|rlogin|qlogin)_(command|daemon)[[:space:]].*/\1_\2 builtin/' \
        "$d/global.orig" | grep -v '^#' >"$d/global"
    qconf -Mconf "$d/global" >&2
    # scheduler: schedule every second and on submit/finish; no load adjustments
    qconf -ssconf >"$d/sched.orig"
    sed -E \
        -e 's/^schedule_interval[[:space:]].*/schedule_interval 0:0:1/' \
        -e 's/^flush_submit_sec[[:space:]].*/flush_submit_sec 1/' \
        -e 's/^flush_finish_sec[[:space:]].*/flush_finish_sec 1/' \
        -e 's/^job_load_adjustments[[:space:]].*/job_load_adjustments NONE/' \
        -e 's/^load_adjustment_decay_time[[:space:]].*/load_adjustment_decay_time 0:0:0/' \
        "$d/sched.orig" >"$d/sched"
    qconf -Msconf "$d/sched" >&2
    # submit host (admin host is added by init)
    qconf -as "$h" >&2 2>/dev/null || true
    # consumable gpus complex, per JOB (not per slot): -l gpus=N takes N of the host's gpus
    qconf -sc >"$d/complex"
    grep -q '^gpus ' "$d/complex" || echo "gpus gpus INT <= YES JOB 0 0" >>"$d/complex"
    qconf -Mc "$d/complex" >&2
    # exec host with 2 gpus
    cat >"$d/exechost" <<EOF
hostname              $h
load_scaling          NONE
complex_values        gpus=$GPUS
user_lists            NONE
xuser_lists           NONE
projects              NONE
xprojects             NONE
usage_scaling         NONE
report_variables      NONE
EOF
    qconf -Ae "$d/exechost" >&2
    # parallel environments
    local pe rule
    for pe in smp mpi; do
        rule='$pe_slots'; [ "$pe" = mpi ] && rule='$fill_up'
        cat >"$d/pe.$pe" <<EOF
pe_name            $pe
slots              999
user_lists         NONE
xuser_lists        NONE
start_proc_args    NONE
stop_proc_args     NONE
allocation_rule    $rule
control_slaves     TRUE
job_is_first_task  FALSE
urgency_slots      min
accounting_summary FALSE
qsort_args         NONE
EOF
        qconf -Ap "$d/pe.$pe" >&2
    done
    # the queue
    cat >"$d/queue" <<EOF
qname                 $QUEUE
hostlist              $h
seq_no                0
load_thresholds       NONE
suspend_thresholds    NONE
nsuspend              1
suspend_interval      00:05:00
priority              0
min_cpu_interval      00:05:00
processors            UNDEFINED
qtype                 BATCH INTERACTIVE
ckpt_list             NONE
pe_list               smp mpi
rerun                 FALSE
slots                 $SLOTS
tmpdir                /tmp
shell                 /bin/bash
prolog                NONE
epilog                NONE
shell_start_mode      unix_behavior
starter_method        $STATE/starter.sh
suspend_method        NONE
resume_method         NONE
terminate_method      NONE
notify                00:00:05
owner_list            NONE
user_lists            NONE
xuser_lists           NONE
subordinate_list      NONE
complex_values        NONE
projects              NONE
xprojects             NONE
calendar              NONE
initial_state         default
s_rt                  INFINITY
h_rt                  INFINITY
s_cpu                 INFINITY
h_cpu                 INFINITY
s_fsize               INFINITY
h_fsize               INFINITY
s_data                INFINITY
h_data                INFINITY
s_stack               INFINITY
h_stack               INFINITY
s_core                INFINITY
h_core                INFINITY
s_rss                 INFINITY
h_rss                 INFINITY
s_vmem                INFINITY
h_vmem                INFINITY
EOF
    qconf -Aq "$d/queue" >&2
}

do_start() {
    need_root
    local t0=$SECONDS h
    install_if_missing
    h="$(sge_host)"
    if [ -n "$(qmaster_pids)" ] && [ "$(cat "$STATE/script.sha256" 2>/dev/null)" != "$(script_sha)" ]; then
        log "running cell was configured by a different version of this script: restarting"
        do_stop 2>/dev/null
    fi
    if [ -n "$(qmaster_pids)" ] && [ -n "$(execd_pids)" ]; then
        # running: join it. A queue instance left in error/disabled state by some job is
        # cleared rather than restarting the cell (other sessions' jobs keep running).
        local i
        for i in $(seq 1 50); do
            host_ready "$h" && { log "already running (host $h)"; print_env; return 0; }
            if [ "$i" = 1 ] || [ "$i" = 25 ]; then
                qmod -c "$QUEUE" >/dev/null 2>&1 || true
                qmod -e "$QUEUE" >/dev/null 2>&1 || true
            fi
            sleep 0.2
        done
        log "daemons running but cell not healthy: restarting from scratch"
        diagnostics
    elif [ -n "$(qmaster_pids)$(execd_pids)" ]; then
        log "only some daemons running: restarting from scratch"
    fi
    do_stop 2>/dev/null
    phase stopped
    mkdir -p "$STATE"
    fresh_cell "$h"
    phase "fresh cell"
    write_starter
    script_sha >"$STATE/script.sha256"
    # (daemons get their own stdio, never the caller's pipes)
    daemon_env SGE_MASTER_PIDFILE="$QMASTER_PID" /usr/sbin/sge_qmaster \
        </dev/null >>"$STATE/sge_qmaster.stdio" 2>&1 8>&- \
        || { cat "$STATE/sge_qmaster.stdio" >&2; diagnostics; die "sge_qmaster failed to start"; }
    local deadline=$((SECONDS + WAIT_S))
    until qconf -sh >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || { diagnostics; die "qmaster not answering after ${WAIT_S}s"; }
        sleep 0.2
    done
    phase "qmaster answers"
    configure_cell "$h" || { diagnostics; die "configuring the cell failed"; }
    daemon_env SGE_EXECD_PIDFILE="$EXECD_PID" /usr/sbin/sge_execd \
        </dev/null >>"$STATE/sge_execd.stdio" 2>&1 8>&- \
        || { cat "$STATE/sge_execd.stdio" >&2; diagnostics; die "sge_execd failed to start"; }
    phase "configured, execd started"
    until host_ready "$h"; do
        [ "$SECONDS" -lt "$deadline" ] || { diagnostics; die "exec host $h not ready after ${WAIT_S}s"; }
        sleep 0.2
    done
    log "up in $((SECONDS - t0)) s: host $h, queue $QUEUE ($SLOTS slots, gpus=$GPUS), PEs smp mpi"
    print_env
}

do_status() {
    local h
    h="$(sge_host)"
    if [ -n "$(qmaster_pids)" ] && [ -n "$(execd_pids)" ] && host_ready "$h"; then
        qstat -f >&2
        print_env
        return 0
    fi
    log "not running"
    return 1
}

dispatch "$@"
