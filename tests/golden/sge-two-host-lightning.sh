#!/bin/bash
# Job script written by diffscale 0.1.0: regenerate it with `diffscale plan` rather than edit it.
# sge-two-host / gpu: 2 node(s) x 2 GPUs per node = 4 ranks; Lightning command: python train.py --name 'it'"'"'s $x'
# Submit it from the run directory (diffscale submit does): logs/ is relative to it.
#$ -N ds-it-s-a-weird-home-date-d-6f2ef2
#$ -S /bin/bash
#$ -cwd
#$ -j y
#$ -o logs/
#$ -pe mpi 8
#$ -l h_rt=04:00:00
#$ -l gpus=0.5
#$ -q all.q
#$ -r y

# No `set -e`: the script inspects the training's exit code itself.
set -uo pipefail
RUN_DIR='/scratch/it'"'"'s a "weird" $HOME `date` dir
line two'
cd "$RUN_DIR" || exit 2
echo "diffscale: job $JOB_ID on $(hostname) (restarted: ${RESTARTED:-0})"

# For the command: a job log is a file, which Python block-buffers; unbuffered, what it
# prints appears in the log as it happens.
export PYTHONUNBUFFERED=1

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

# A Lightning Trainer: torchrun's RANK / LOCAL_RANK / WORLD_SIZE / GROUP_RANK select Lightning's
# TorchElasticEnvironment (Grid Engine has none of its own); nothing else is set by hand.
# The Trainer must say devices=2 and num_nodes=2 (Lightning checks both).
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
cat >"$launcher" <<'DIFFSCALE_LAUNCHER_cc20ecefa869'
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
export PYTHONUNBUFFERED=1
export NCCL_SOCKET_IFNAME=eth0
exec "$job_python" -m torch.distributed.run --nnodes=2 --node_rank="$1" --nproc_per_node=2 --master_addr="$2" --master_port="$3" --no-python python train.py --name 'it'"'"'s $x'
DIFFSCALE_LAUNCHER_cc20ecefa869

got_signal=0
pids=()

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

echo "diffscale: command exited with $rc"
exit "$rc"
