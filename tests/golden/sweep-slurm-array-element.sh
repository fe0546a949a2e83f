#!/bin/bash
# Job script written by diffscale 0.1.0: regenerate it with `diffscale plan` rather than edit it.
# slurm-test / cpu: 1 node(s) x 1 CPU process per node = 1 ranks; user command: python /opt/train.py --name '$(touch /tmp/pwned)' --seed=1 --out '/scratch/it'"'"'s a "weird" $HOME `date` sweep/runs/003'
# Submit it from the run directory (diffscale submit does): logs/ is relative to it.
#SBATCH --job-name=ds-003-928fb3
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=4
#SBATCH --time=01:00:00
#SBATCH --partition=cpu
#SBATCH --output=logs/%x-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue

# No `set -e`: the script inspects the training's exit code itself.
set -uo pipefail
RUN_DIR='/scratch/it'"'"'s a "weird" $HOME `date` sweep/runs/003'
cd "$RUN_DIR" || exit 2
echo "diffscale: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST"

# For the command: a job log is a file, which Python block-buffers; unbuffered, what it
# prints appears in the log as it happens.
export PYTHONUNBUFFERED=1

# Rendezvous of every rank: the first host of the allocation, a port derived from the
# job id (diffscale, Lightning and torch env:// all read MASTER_ADDR/MASTER_PORT).
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
export MASTER_ADDR
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))

# One task per GPU, all started by srun (srun >= 22.05 needs --cpus-per-task again).
srun --kill-on-bad-exit=1 --nodes=1 --ntasks-per-node=1 --cpus-per-task=4 python /opt/train.py --name '$(touch /tmp/pwned)' --seed=1 --out '/scratch/it'"'"'s a "weird" $HOME `date` sweep/runs/003' &
step_pid=$!
wait "$step_pid"; rc=$?
while [ "$rc" -gt 128 ] && kill -0 "$step_pid" 2>/dev/null; do wait "$step_pid"; rc=$?; done
if [ "$rc" -gt 128 ]; then wait "$step_pid" 2>/dev/null; _last=$?; [ "$_last" -ne 127 ] && rc=$_last; fi
got_signal=0

echo "diffscale: command exited with $rc"
exit "$rc"
