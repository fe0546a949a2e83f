#!/bin/bash
# Job script written by diffscale 0.1.0: regenerate it with `diffscale plan` rather than edit it.
# sge-two-host / gpu: 2 node(s) x 2 GPUs per node = 4 ranks; diffscale train (preset tiny)
# Submit it from the run directory (diffscale submit does): logs/ is relative to it.
#$ -N ds-it-s-a-weird-home-date-d-6f2ef2-2x2
#$ -S /bin/bash
#$ -cwd
#$ -j y
#$ -o logs/
#$ -pe mpi 8
#$ -l h_rt=00:15:00
#$ -l s_rt=00:13:00
#$ -l gpus=0.5
#$ -q all.q
#$ -notify
#$ -r y

# No `set -e`: the script inspects the training's exit code itself.
set -uo pipefail
RUN_DIR='/scratch/it'"'"'s a "weird" $HOME `date` dir
line two'
cd "$RUN_DIR" || exit 2
echo "diffscale: job $JOB_ID on $(hostname) (restarted: ${RESTARTED:-0})"

# Race: the first shape to start owns the run (ln -s is atomic); it cancels the other
# shapes by job name. A rival starting later finds a claim that is not its own and
# exits 0 without training; this shape's own requeued/next jobs find their own claim.
if ln -s 2x2 "$RUN_DIR/race.claim" 2>/dev/null; then
    echo "diffscale: shape 2x2 started first and owns this run; cancelling the other shapes"
    qdel ds-it-s-a-weird-home-date-d-6f2ef2-1x2 || true
elif [ "$(readlink "$RUN_DIR/race.claim")" != 2x2 ]; then
    echo "diffscale: shape $(readlink "$RUN_DIR/race.claim") owns this run already; shape 2x2 exits without training"
    exit 0
fi

# Set-up: the cluster profile's lines, then --setup's (module load, conda activate, ...)
python_before="$(command -v python 2>/dev/null || command -v python3 2>/dev/null || true)"
module load cuda/12.4
# The interpreter: the `python` the set-up lines above put on PATH if they changed it, else the
# one the job was planned with.
job_python=/opt/diffscale-venv/bin/python
python_now="$(command -v python 2>/dev/null || command -v python3 2>/dev/null || true)"
if [ -n "$python_now" ] && [ "$python_now" != "$python_before" ]; then
    job_python="$python_now"
fi
echo "diffscale: python $job_python"
# Variables from the cluster profile (NCCL settings)
export NCCL_SOCKET_IFNAME=eth0

# s_rt sends SIGUSR1 (and -notify SIGUSR2 at h_rt) to every process group of the job, on
# every host. torchrun's workers run in sessions of their own, so torchrun must pass the
# signals on (and give them time to checkpoint before it kills them).
export TORCHELASTIC_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2
export PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=60
export PET_SHUTDOWN_TIMEOUT=60
# Hosts of the job from PE_HOSTFILE (`host slots queue cpus` lines; a host may appear
# once per queue instance: merge them). Master = the first host.
mapfile -t HOSTS < <(awk '!seen[$1]++ {print $1}' "$PE_HOSTFILE")
if [ "${#HOSTS[@]}" -ne 2 ]; then
    echo "diffscale: the PE gave ${#HOSTS[@]} hosts, this job needs 2:" >&2; cat "$PE_HOSTFILE" >&2
    exit 2
fi
MASTER_ADDR="${HOSTS[0]}"
MASTER_PORT=$((20000 + JOB_ID % 20000))
# The per-host launcher, a file in the run directory: qrsh -inherit starts remote tasks
# in the job's working directory but with neither this shell's variables nor, on some
# sites, its argument quoting -- so the remote command line is only plain words.
launcher=".diffscale-launch-$JOB_ID.sh"
cat >"$launcher" <<'DIFFSCALE_LAUNCHER_4cd7a5852991'
cd '/scratch/it'"'"'s a "weird" $HOME `date` dir
line two' || exit 2
python_before="$(command -v python 2>/dev/null || command -v python3 2>/dev/null || true)"
module load cuda/12.4
# The interpreter: the `python` the set-up lines above put on PATH if they changed it, else the
# one the job was planned with.
job_python=/opt/diffscale-venv/bin/python
python_now="$(command -v python 2>/dev/null || command -v python3 2>/dev/null || true)"
if [ -n "$python_now" ] && [ "$python_now" != "$python_before" ]; then
    job_python="$python_now"
fi
echo "diffscale: python $job_python"
export NCCL_SOCKET_IFNAME=eth0
export TORCHELASTIC_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2
export PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=60
export PET_SHUTDOWN_TIMEOUT=60
exec "$job_python" -m torch.distributed.run --nnodes=2 --node_rank="$1" --nproc_per_node=2 --master_addr="$2" --master_port="$3" -m diffscale train '/scratch/it'"'"'s a "weird" $HOME `date` dir
line two/config.yaml' --out '/scratch/it'"'"'s a "weird" $HOME `date` dir
line two' --resume auto
DIFFSCALE_LAUNCHER_4cd7a5852991

got_signal=0
pids=()
trap 'got_signal=1; echo "diffscale: got the time-limit warning: every rank checkpoints"' USR1 USR2

# One torchrun per host: locally on the first, through qrsh -inherit (tight integration,
# the PE's control_slaves) on the others.
pids=()
for k in "${!HOSTS[@]}"; do
    if [ "$k" -eq 0 ]; then
        /bin/bash "$launcher" "$k" "$MASTER_ADDR" "$MASTER_PORT" &
    else
        qrsh -inherit -nostdin "${HOSTS[$k]}" /bin/bash "$launcher" "$k" "$MASTER_ADDR" "$MASTER_PORT" &
    fi
    pids+=($!)
done

# Wait for every launcher; the job fails when any fails.
rc=0
for pid in "${pids[@]}"; do
    wait "$pid"; one=$?
    while [ "$one" -gt 128 ] && kill -0 "$pid" 2>/dev/null; do wait "$pid"; one=$?; done
    if [ "$one" -gt 128 ]; then wait "$pid" 2>/dev/null; _last=$?; [ "$_last" -ne 127 ] && one=$_last; fi
    if [ "$one" -ne 0 ] && [ "$rc" -eq 0 ]; then rc=$one; fi
done

# Exit 85: diffscale checkpointed on the warning signal and is not finished.
# torchrun reports a worker's exit 85 as 1, so failing after the warning counts too.
# A rescheduled rerun (-r y, exit 99) keeps this run's h_rt clock and is stopped at the
# same limit (measured on SoGE 8.1.9): the run continues in a new job instead, held until
# this one has ended, and listed in continuations.tsv for status/logs/cancel. The restart
# count lives in the run directory.
if [ "$rc" -eq 85 ] || { [ "$got_signal" -eq 1 ] && [ "$rc" -ne 0 ]; }; then
    count_file="$RUN_DIR/.restarts"
    restarts=$(cat "$count_file" 2>/dev/null || echo 0)
    if [ "$restarts" -lt 20 ]; then
        echo $((restarts + 1)) >"$count_file"
        if next=$(qsub -terse -hold_jid "$JOB_ID" job-2x2.sge.sh) && [ -n "$next" ]; then
            printf '%s\t%s\t%s\n' "$next" "$JOB_ID" "logs/ds-it-s-a-weird-home-date-d-6f2ef2-2x2.o$next" >>"$RUN_DIR/continuations.tsv"
            echo "diffscale: checkpointed; continuation job $next submitted (restart $((restarts + 1)) of 20)"
            exit 0
        fi
        echo "diffscale: qsub of the continuation failed; rescheduling this job inside its h_rt instead" >&2
        exit 99
    fi
    echo "diffscale: checkpointed, but the run was already continued $restarts times (max 20); submit again to continue" >&2
    exit 85
fi
echo "diffscale: command exited with $rc"
exit "$rc"
