#!/usr/bin/env bash
# Real SLURM (Debian bookworm: 22.05) on this one host, for the integration tests.
#
#   tests/schedulers/slurm.sh start    install if missing, write config, start munged,
#                                      slurmctld and two slurmd (n1, n2); wait until both
#                                      nodes are idle; print `export ...` lines on stdout
#   tests/schedulers/slurm.sh stop     kill the daemons started here and remove the state
#   tests/schedulers/slurm.sh status   exit 0 when the cluster answers with both nodes up
#
# Must run as root. Idempotent: `start` on a running, healthy cluster only prints the env.
# State dir: $DIFFSCALE_SLURM_DIR (default /tmp/diffscale-slurm). The config lives there
# and /etc/slurm/{slurm,gres,cgroup}.conf are symlinks to it, so plain sbatch/srun work for
# any process without SLURM_CONF. Everything informational goes to stderr; stdout carries
# only the `export` lines (so `eval "$(slurm.sh start)"` works).
set -euo pipefail
# daemons and admin tools live in sbin; callers (pytest, CI) may not have it on PATH
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}"

STATE="${DIFFSCALE_SLURM_DIR:-/tmp/diffscale-slurm}"
ETC="$STATE/etc"
LOG="$STATE/log"
RUN="$STATE/run"
CONF_LINK_DIR=/etc/slurm
HOST="$(hostname -s)"
CTLD_PORT="${DIFFSCALE_SLURMCTLD_PORT:-6817}"
N1_PORT="${DIFFSCALE_SLURMD_PORT_N1:-6818}"
N2_PORT="${DIFFSCALE_SLURMD_PORT_N2:-6819}"
NODES=(n1 n2)
WAIT_S="${DIFFSCALE_SLURM_WAIT_S:-60}"
PKGS=(slurmctld slurmd slurm-client munge)

log() { echo "[slurm.sh] $*" >&2; }
script_sha() { sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1; }
die() { echo "[slurm.sh] ERROR: $*" >&2; exit 1; }

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

install_if_missing() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing ${PKGS[*]} (missing: ${missing[*]})"
        local t0=$SECONDS
        apt_install "${PKGS[@]}"
        log "installed in $((SECONDS - t0)) s"
    fi
}

# ---------------------------------------------------------------- munge
munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    if munge_ok; then return 0; fi
    install -d -o munge -g munge -m 0700 /etc/munge /var/log/munge
    install -d -o munge -g munge -m 0711 /var/lib/munge
    install -d -o munge -g munge -m 0755 /run/munge
    if [ ! -s /etc/munge/munge.key ]; then
        log "creating /etc/munge/munge.key"
        if command -v mungekey >/dev/null; then
            mungekey --create --force --keyfile=/etc/munge/munge.key
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
        fi
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
    # stale socket/pid of a dead munged
    rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock /run/munge/munged.pid
    # (daemons get their own stdio, never the caller's pipes, or a caller that reads our
    # output to EOF would wait for the daemons)
    runuser -u munge -- /usr/sbin/munged --force </dev/null >/dev/null 2>&1 8>&-
    local i
    for i in $(seq 1 50); do munge_ok && return 0; sleep 0.1; done
    die "munged did not come up (see /var/log/munge/munged.log)"
}

# ---------------------------------------------------------------- config
ensure_node_names() {
    # n1/n2 resolve to 127.0.0.1 like real node names do (a job may use $SLURMD_NODENAME or
    # the first name of $SLURM_JOB_NODELIST as MASTER_ADDR). Appended after the existing
    # lines, so 127.0.0.1 still reverse-resolves to "localhost" (Grid Engine relies on it).
    local n missing=()
    for n in "${NODES[@]}"; do
        grep -Eq "^[[:space:]]*127\.0\.0\.1[[:space:]](.*[[:space:]])?$n([[:space:]]|\$)" /etc/hosts 2>/dev/null \
            || missing+=("$n")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "127.0.0.1 ${missing[*]}  # diffscale test SLURM nodes (tests/schedulers/slurm.sh)" >>/etc/hosts
    fi
}

write_config() {
    mkdir -p "$ETC" "$LOG" "$RUN" "$STATE/ctld" "$STATE/dev" "$STATE/tmp"
    local n
    for n in "${NODES[@]}"; do mkdir -p "$STATE/spool/$n"; done
    chmod 1777 "$STATE/tmp"

    # Fake GPUs: character devices (major 195 like NVIDIA's). gres_gpu only needs the
    # files to exist and be char devices; it then sets CUDA_VISIBLE_DEVICES. n1 owns
    # nvidia0-1, n2 owns nvidia2-3.
    local k
    for k in 0 1 2 3; do
        [ -c "$STATE/dev/nvidia$k" ] || { rm -f "$STATE/dev/nvidia$k"; mknod "$STATE/dev/nvidia$k" c 195 "$k"; }
    done

    cat >"$ETC/slurm.conf" <<EOF
# Written by tests/schedulers/slurm.sh -- test cluster, two slurmd on one host.
ClusterName=diffscale
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# requeued jobs wait cred_expire seconds before they may start again (default 120)
AuthInfo=cred_expire=10
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
TmpFS=$STATE/tmp
ReturnToService=2
SlurmctldTimeout=60
SlurmdTimeout=60
InactiveLimit=0
# finished jobs stay visible to scontrol show job / squeue -t all for an hour
MinJobAge=3600
KillWait=5
Waittime=0
JobRequeue=1
# a job asking more than a partition allows (time, nodes, memory) is refused at submit
# time instead of pending forever
EnforcePartLimits=ALL
MailProg=/bin/true
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
SchedulerType=sched/backfill
# re-evaluate pending jobs often (defaults 60 s / 30 s) so requeued/held jobs start soon
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=2048
# Each node declares more CPUs than the host has (2); config_overrides makes slurmd
# report the configured values instead of draining the node.
SlurmdParameters=config_overrides
GresTypes=gpu
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/jobcomp.txt
NodeName=n1 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$N1_PORT CPUs=4 Boards=1 SocketsPerBoard=1 CoresPerSocket=4 ThreadsPerCore=1 RealMemory=8192 Gres=gpu:2 State=UNKNOWN
NodeName=n2 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$N2_PORT CPUs=4 Boards=1 SocketsPerBoard=1 CoresPerSocket=4 ThreadsPerCore=1 RealMemory=8192 Gres=gpu:2 State=UNKNOWN
PartitionName=cpu Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=n1,n2 MaxTime=INFINITE State=UP
PartitionName=short Nodes=n1,n2 MaxTime=00:01:00 State=UP
EOF

    cat >"$ETC/gres.conf" <<EOF
NodeName=n1 Name=gpu File=$STATE/dev/nvidia[0-1]
NodeName=n2 Name=gpu File=$STATE/dev/nvidia[2-3]
EOF

    # ConstrainRAMSpace=yes: a job's --mem (default DefMemPerCPU x CPUs, >= 2 GB) is a real
    # memory-cgroup limit, so a job over it is OOM-killed (state OUT_OF_MEMORY) as on a real
    # cluster -- the doctor's OOM test needs that. Cores and devices stay unconstrained.
    cat >"$ETC/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
CgroupAutomount=yes
ConstrainCores=no
ConstrainRAMSpace=yes
ConstrainDevices=no
EOF

    mkdir -p "$CONF_LINK_DIR"
    local f
    for f in slurm.conf gres.conf cgroup.conf; do
        if [ -e "$CONF_LINK_DIR/$f" ] && [ ! -L "$CONF_LINK_DIR/$f" ]; then
            mv -f "$CONF_LINK_DIR/$f" "$CONF_LINK_DIR/$f.diffscale-bak"
        fi
        ln -sfn "$ETC/$f" "$CONF_LINK_DIR/$f"
    done
}

# ---------------------------------------------------------------- daemons
# A process that exited stays a zombie until PID 1 reaps it, which on these machines can
# take seconds: kill -0 still succeeds on zombies, so they are filtered out here.
alive() { local st; st="$(ps -o stat= -p "$1" 2>/dev/null)" && [ -n "$st" ] && [ "${st#Z}" = "$st" ]; }
pid_alive() { [ -s "$1" ] && alive "$(cat "$1")"; }

daemons_alive() {
    pid_alive "$RUN/slurmctld.pid" || return 1
    local n
    for n in "${NODES[@]}"; do pid_alive "$RUN/slurmd-$n.pid" || return 1; done
}

node_states() { sinfo -h -N -o '%N %t' 2>/dev/null | sort -u; }

nodes_ready() {
    # both nodes answer and are usable: idle, or busy with (other sessions') jobs
    local out n st
    out="$(node_states)" || return 1
    for n in "${NODES[@]}"; do
        st="$(awk -v n="$n" '$1==n{print $2}' <<<"$out" | head -1)"
        case "$st" in idle|alloc|mix|comp) ;; *) return 1 ;; esac
    done
}

resume_nodes() {
    # nodes drained/down by a test's misbehaving job (e.g. "Kill task failed") come back
    # without restarting the cluster, so other sessions' running jobs survive
    local out n st
    out="$(node_states)" || return 0
    for n in "${NODES[@]}"; do
        st="$(awk -v n="$n" '$1==n{print $2}' <<<"$out" | head -1)"
        case "$st" in
            drain*|drng*|down*|fail*) scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true ;;
        esac
    done
}

nodes_idle() {
    local out
    out="$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u)" || return 1
    [ "$(awk '$2=="idle"' <<<"$out" | wc -l)" -ge "${#NODES[@]}" ]
}

print_env() {
    echo "export SLURM_CONF=$CONF_LINK_DIR/slurm.conf"
    echo "export DIFFSCALE_SLURM_DIR=$STATE"
}

diagnostics() {
    {
        echo "----- sinfo -N -l"; sinfo -N -l 2>&1 || true
        echo "----- scontrol show nodes"; scontrol show nodes 2>&1 || true
        echo "----- processes"; ps -eo pid,user,args | grep -E '[s]lurm|[m]unge' || true
        for f in "$LOG"/slurmctld.log "$LOG"/slurmd-*.log; do
            [ -f "$f" ] && { echo "----- tail -n 60 $f"; tail -n 60 "$f"; }
        done
    } >&2
}

kill_pidfiles() {
    # TERM all at once (each daemon takes ~2 s to shut down), wait up to 5 s, then KILL
    local f pids=() pid i
    for f in "$@"; do
        [ -s "$f" ] && pid="$(cat "$f")" && alive "$pid" && pids+=("$pid")
        rm -f "$f"
    done
    [ "${#pids[@]}" -gt 0 ] || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for i in $(seq 1 50); do
        local alive=0
        for pid in "${pids[@]}"; do alive "$pid" && alive=1; done
        [ "$alive" = 0 ] && return 0
        sleep 0.1
    done
    kill -KILL "${pids[@]}" 2>/dev/null || true
}

our_pids() {
    # our daemons (started with -f $ETC/slurm.conf) and slurmstepds (cwd under $STATE)
    local pid cwd
    for pid in $(pgrep -f -- "-f $ETC/slurm.conf" 2>/dev/null); do alive "$pid" && echo "$pid"; done
    for pid in $(pgrep -x slurmstepd 2>/dev/null); do
        alive "$pid" || continue
        cwd="$(readlink "/proc/$pid/cwd" 2>/dev/null || true)"
        case "$cwd" in "$STATE"|"$STATE"/*) echo "$pid" ;; esac
    done
}

job_cgroup_dirs() {
    # cgroup v1 dirs the two slurmd create (proctrack/cgroup): <controller>/slurm_<node>
    local n
    for n in "${NODES[@]}"; do
        ls -d /sys/fs/cgroup/*/slurm_"$n" 2>/dev/null || true
    done
}

kill_job_processes() {
    # processes still in our nodes' job cgroups (jobs whose slurmstepd is gone)
    local d pid
    for d in $(job_cgroup_dirs); do
        for pid in $(find "$d" -name tasks -exec cat {} + 2>/dev/null | sort -u); do
            kill -KILL "$pid" 2>/dev/null || true
        done
    done
    sleep 0.2
    # remove the now-empty cgroups, deepest first (best effort)
    for d in $(job_cgroup_dirs); do
        find "$d" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
}

do_stop() {
    need_root
    if pid_alive "$RUN/slurmctld.pid"; then
        # cancel every job so slurmstepd cleans up, then wait (bounded) for them to end
        local ids i
        ids="$(squeue -h -t PD,R,CG,S,CF,RQ,RS,SE,ST -o %A 2>/dev/null | tr '\n' ' ')" || ids=""
        if [ -n "${ids// }" ]; then
            # shellcheck disable=SC2086
            scancel $ids 2>/dev/null || true
            for i in $(seq 1 15); do
                [ -z "$(squeue -h -t R,CG,S,CF -o %A 2>/dev/null)" ] && break
                sleep 0.2
            done
        fi
    fi
    local n pid
    kill_pidfiles "$RUN/slurmctld.pid" $(for n in "${NODES[@]}"; do echo "$RUN/slurmd-$n.pid"; done)
    for pid in $(our_pids); do kill -KILL "$pid" 2>/dev/null || true; done
    kill_job_processes
    # munged is shared infrastructure; leave it running (harmless, and other users may rely on it)
    local f
    for f in slurm.conf gres.conf cgroup.conf; do
        if [ -L "$CONF_LINK_DIR/$f" ] && [ "$(readlink "$CONF_LINK_DIR/$f")" = "$ETC/$f" ]; then
            rm -f "$CONF_LINK_DIR/$f"
        fi
    done
    # keep the last logs for post-mortems (the state dir itself goes)
    if [ -d "$LOG" ]; then
        rm -rf "$STATE.last-log" && cp -a "$LOG" "$STATE.last-log" 2>/dev/null || true
    fi
    rm -rf "$STATE"
    log "stopped"
}

do_start() {
    need_root
    local t0=$SECONDS
    install_if_missing
    if daemons_alive && [ "$(cat "$STATE/script.sha256" 2>/dev/null)" != "$(script_sha)" ]; then
        log "running cluster was started by a different version of this script: restarting"
        do_stop 2>/dev/null
    fi
    if daemons_alive; then
        local i
        for i in $(seq 1 50); do
            nodes_ready && { log "already running ($STATE)"; print_env; return 0; }
            resume_nodes
            sleep 0.2
        done
        log "daemons alive but nodes not usable: $(node_states | tr '\n' ' ')"
        diagnostics
    fi
    if [ -d "$STATE" ]; then
        log "unhealthy or stopped cluster state in $STATE: restarting from scratch"
        do_stop 2>/dev/null
    fi
    # other slurm daemons (not ours) would hold the ports
    local p foreign=""
    for p in $(pgrep -x slurmctld) $(pgrep -x slurmd); do alive "$p" && foreign+=" $p"; done
    if [ -n "$foreign" ]; then
        ps -eo pid,args | grep -E '[s]lurm(ctld|d)' >&2 || true
        die "slurm daemons not started by this script are running; stop them first"
    fi
    start_munge
    ensure_node_names
    write_config
    : >"$STATE/jobcomp.txt"
    script_sha >"$STATE/script.sha256"
    export SLURM_CONF="$CONF_LINK_DIR/slurm.conf"
    # -c: clear previous job state; -i: ignore (absent) state files
    slurmctld -c -i -f "$ETC/slurm.conf" </dev/null >>"$LOG/slurmctld.stdio" 2>&1 8>&- \
        || { cat "$LOG/slurmctld.stdio" >&2; diagnostics; die "slurmctld failed to start"; }
    local n
    for n in "${NODES[@]}"; do
        slurmd -N "$n" -f "$ETC/slurm.conf" </dev/null >>"$LOG/slurmd-$n.stdio" 2>&1 8>&- \
            || { cat "$LOG/slurmd-$n.stdio" >&2; diagnostics; die "slurmd -N $n failed to start"; }
    done
    local deadline=$((SECONDS + WAIT_S))
    until nodes_idle; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            diagnostics
            die "nodes not idle after ${WAIT_S}s"
        fi
        # a node that registered as down (e.g. after an unclean stop) is brought back
        resume_nodes
        sleep 0.2
    done
    log "up in $((SECONDS - t0)) s: $(sinfo -h -N -o '%N=%t' | sort -u | tr '\n' ' ')"
    print_env
}

do_status() {
    if daemons_alive && nodes_ready; then
        sinfo -N >&2
        print_env
        return 0
    fi
    log "not running"
    return 1
}

dispatch "$@"
