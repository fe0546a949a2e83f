#!/bin/bash
# Job script written by diffscale 0.1.0: regenerate it with `diffscale plan` rather than edit it.
# slurm-test / gpu: 2 node(s) x 2 GPUs per node = 4 ranks; Lightning command: python train.py --name 'it'"'"'s $x'
# Submit it from the run directory (diffscale submit does): logs/ is relative to it.
#SBATCH --job-name=ds-it-s-a-weird-home-date-d-6f2ef2
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-node=2
#SBATCH --cpus-per-task=2
#SBATCH --partition=gpu
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

# A Lightning Trainer: its SLURMEnvironment reads SLURM_NTASKS / SLURM_PROCID / SLURM_LOCALID /
# SLURM_NODEID of the srun tasks below and derives MASTER_ADDR/PORT from the allocation.
# Nothing is set by hand; values inherited from the submitting shell would override it.
unset MASTER_ADDR MASTER_PORT RANK LOCAL_RANK WORLD_SIZE NODE_RANK GROUP_RANK
# The Trainer must say devices=2 and num_nodes=2 (Lightning checks both).

# One task per GPU, all started by srun (srun >= 22.05 needs --cpus-per-task again).
srun --kill-on-bad-exit=1 --nodes=2 --ntasks-per-node=2 --cpus-per-task=2 python train.py --name 'it'"'"'s $x' &
step_pid=$!
wait "$step_pid"; rc=$?
while [ "$rc" -gt 128 ] && kill -0 "$step_pid" 2>/dev/null; do wait "$step_pid"; rc=$?; done
if [ "$rc" -gt 128 ]; then wait "$step_pid" 2>/dev/null; _last=$?; [ "$_last" -ne 127 ] && rc=$_last; fi
got_signal=0

echo "diffscale: command exited with $rc"
exit "$rc"
