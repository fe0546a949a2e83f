#!/bin/bash
# Job script written by diffscale 0.1.0: regenerate it with `diffscale plan` rather than edit it.
# nyu-torch / h200: 1 node(s) x 1 GPU per node = 1 ranks; user command: /opt/diffscale-venv/bin/python -m diffscale probe --seconds 120 --out '/scratch/it'"'"'s a "weird" $HOME `date` dir?line two' -- python train.py --name 'it'"'"'s $x'
# Submit it from the run directory (diffscale submit does): logs/ is relative to it.
#SBATCH --job-name=ds-it-s-a-weird-home-date-d-6f2ef2
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=4
#SBATCH --time=00:07:00
#SBATCH --account=torch_pr_1
#SBATCH --constraint=h200
#SBATCH --output=logs/%x-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue

# No `set -e`: the script inspects the training's exit code itself.
set -uo pipefail
RUN_DIR='/scratch/it'"'"'s a "weird" $HOME `date` dir
line two'
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
srun --kill-on-bad-exit=1 --nodes=1 --ntasks-per-node=1 --cpus-per-task=4 /opt/diffscale-venv/bin/python -m diffscale probe --seconds 120 --out '/scratch/it'"'"'s a "weird" $HOME `date` dir
line two' -- python train.py --name 'it'"'"'s $x' &
step_pid=$!
wait "$step_pid"; rc=$?
while [ "$rc" -gt 128 ] && kill -0 "$step_pid" 2>/dev/null; do wait "$step_pid"; rc=$?; done
if [ "$rc" -gt 128 ]; then wait "$step_pid" 2>/dev/null; _last=$?; [ "$_last" -ne 127 ] && rc=$_last; fi
got_signal=0

echo "diffscale: command exited with $rc"
exit "$rc"
