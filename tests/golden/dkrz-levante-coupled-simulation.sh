#!/bin/bash
# Job script written by diffscale 0.1.0: regenerate it with `diffscale plan` rather than edit it.
# simulation job on dkrz-levante / compute: 2 node(s) x 128 CPU processes per node = 256 ranks; user command: ./icon.exe --namelist 'it'"'"'s $x.nml'
# Submit it from the run directory (diffscale submit does): logs/ is relative to it.
#SBATCH --job-name=ds-it-s-a-weird-home-date-d-6f2ef2-simulation
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=128
#SBATCH --cpus-per-task=1
#SBATCH --time=08:00:00
#SBATCH --partition=compute
#SBATCH --account=bb1234
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
# For the command: where it hands its output to the coupled trainer (the spool directory).
export DIFFSCALE_SPOOL='/scratch/it'"'"'s a "weird" $HOME `date` dir
line two/spool $x'

# Rendezvous of every rank: the first host of the allocation, a port derived from the
# job id (diffscale, Lightning and torch env:// all read MASTER_ADDR/MASTER_PORT).
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
export MASTER_ADDR
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))

# A stop from outside (scancel, the time limit: SIGTERM) is the scheduler's to tell: the trainer
# asks it how this job ended (job.json in the spool names the job). The end marker below says
# only how the command ended by itself.
stopped=0
trap 'stopped=1' TERM
# One task per GPU, all started by srun (srun >= 22.05 needs --cpus-per-task again).
srun --kill-on-bad-exit=1 --nodes=2 --ntasks-per-node=128 --cpus-per-task=1 ./icon.exe --namelist 'it'"'"'s $x.nml' &
step_pid=$!
wait "$step_pid"; rc=$?
while [ "$rc" -gt 128 ] && kill -0 "$step_pid" 2>/dev/null; do wait "$step_pid"; rc=$?; done
if [ "$rc" -gt 128 ]; then wait "$step_pid" 2>/dev/null; _last=$?; [ "$_last" -ne 127 ] && rc=$_last; fi
got_signal=0

# The simulation has ended: its end marker tells the trainer following the spool to finish
# with what it has read (or, after a failure, to stop with this status).
if [ "$stopped" -eq 0 ] && [ "$rc" -ne 143 ]; then  # 143: SIGTERM, a stop from outside
    printf '{"exit_status": %d}\n' "$rc" > '/scratch/it'"'"'s a "weird" $HOME `date` dir
line two/spool $x/.ended.json.tmp' && mv -f '/scratch/it'"'"'s a "weird" $HOME `date` dir
line two/spool $x/.ended.json.tmp' '/scratch/it'"'"'s a "weird" $HOME `date` dir
line two/spool $x/ended.json' ||
        echo "diffscale: could not write the spool's end marker: the trainer will wait" >&2
fi

echo "diffscale: command exited with $rc"
exit "$rc"
