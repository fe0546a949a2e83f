#!/bin/bash
# Job script written by diffscale 0.1.0: regenerate it with `diffscale plan` rather than edit it.
# bu-scc / any-gpu: 1 node(s) x 1 GPU per node = 1 ranks; diffscale train (preset policy)
# Submit it from the run directory (diffscale submit does): logs/ is relative to it.
#$ -N ds-it-s-a-weird-home-date-d-6f2ef2
#$ -S /bin/bash
#$ -cwd
#$ -j y
#$ -o logs/
#$ -pe omp 4
#$ -l h_rt=00:30:00
#$ -l s_rt=00:28:00
#$ -l gpus=1
#$ -l gpu_c=7.0
#$ -P myproject
#$ -notify
#$ -r y

# No `set -e`: the script inspects the training's exit code itself.
set -uo pipefail
RUN_DIR='/scratch/it'"'"'s a "weird" $HOME `date` dir
line two'
cd "$RUN_DIR" || exit 2
echo "diffscale: job $JOB_ID on $(hostname) (restarted: ${RESTARTED:-0})"

# Set-up: the cluster profile's lines, then --setup's (module load, conda activate, ...)
python_before="$(command -v python 2>/dev/null || command -v python3 2>/dev/null || true)"
module load miniconda
conda activate dp-$USER
# The interpreter: the `python` the set-up lines above put on PATH if they changed it, else the
# one the job was planned with.
job_python=/opt/diffscale-venv/bin/python
python_now="$(command -v python 2>/dev/null || command -v python3 2>/dev/null || true)"
if [ -n "$python_now" ] && [ "$python_now" != "$python_before" ]; then
    job_python="$python_now"
fi
echo "diffscale: python $job_python"

# s_rt sends SIGUSR1 (and -notify SIGUSR2 at h_rt) to every process group of the job, on
# every host. torchrun's workers run in sessions of their own, so torchrun must pass the
# signals on (and give them time to checkpoint before it kills them).
export TORCHELASTIC_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2
export PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=60
export PET_SHUTDOWN_TIMEOUT=60

got_signal=0
pids=()
trap 'got_signal=1; echo "diffscale: got the time-limit warning: every rank checkpoints"' USR1 USR2

# One host: torchrun starts one process per GPU and picks a free rendezvous port.
"$job_python" -m torch.distributed.run --standalone --nnodes=1 --nproc_per_node=1 -m diffscale train '/scratch/it'"'"'s a "weird" $HOME `date` dir
line two/config.yaml' --out '/scratch/it'"'"'s a "weird" $HOME `date` dir
line two' --resume auto &
pids=($!)

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
        if next=$(qsub -terse -hold_jid "$JOB_ID" job-1x1.sge.sh) && [ -n "$next" ]; then
            printf '%s\t%s\t%s\n' "$next" "$JOB_ID" "logs/ds-it-s-a-weird-home-date-d-6f2ef2.o$next" >>"$RUN_DIR/continuations.tsv"
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
