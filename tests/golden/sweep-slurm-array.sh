#!/bin/bash
# Job script written by diffscale 0.1.0: regenerate it with `diffscale plan` rather than edit it.
# sweep hostile: 6 element(s) as one array; slurm-test / cpu: 1 node(s) x 1 CPU process per node = 1 ranks
# Submit it from the sweep directory (diffscale sweep submit does).
#SBATCH --job-name=ds-it-s-a-weird-home-date-s-065808-cpu-1x1
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=4
#SBATCH --time=01:00:00
#SBATCH --partition=cpu
#SBATCH --output=logs/%x-%A_%a.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --array=0-5%2

set -uo pipefail
# Which element this array task runs: its run directory and its own job script there.
case "$SLURM_ARRAY_TASK_ID" in
    0) ELEMENT_DIR='/scratch/it'"'"'s a "weird" $HOME `date` sweep/runs/000'; ELEMENT_SCRIPT=job-1x1.slurm.sh ;;
    1) ELEMENT_DIR='/scratch/it'"'"'s a "weird" $HOME `date` sweep/runs/001'; ELEMENT_SCRIPT=job-1x1.slurm.sh ;;
    2) ELEMENT_DIR='/scratch/it'"'"'s a "weird" $HOME `date` sweep/runs/002'; ELEMENT_SCRIPT=job-1x1.slurm.sh ;;
    3) ELEMENT_DIR='/scratch/it'"'"'s a "weird" $HOME `date` sweep/runs/003'; ELEMENT_SCRIPT=job-1x1.slurm.sh ;;
    4) ELEMENT_DIR='/scratch/it'"'"'s a "weird" $HOME `date` sweep/runs/004'; ELEMENT_SCRIPT=job-1x1.slurm.sh ;;
    5) ELEMENT_DIR='/scratch/it'"'"'s a "weird" $HOME `date` sweep/runs/005'; ELEMENT_SCRIPT=job-1x1.slurm.sh ;;
    *) echo "diffscale: array task $SLURM_ARRAY_TASK_ID is not an element of this sweep" >&2; exit 2 ;;
esac
mkdir -p "$ELEMENT_DIR/logs" || exit 2
echo "diffscale: array task $SLURM_ARRAY_TASK_ID runs $ELEMENT_DIR (log: $ELEMENT_DIR/logs/ds-it-s-a-weird-home-date-s-065808-cpu-1x1-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}.out)"
# The element's output goes to its own log; exec keeps this shell's process, so the warning
# signal reaches the element script's trap and its requeue acts on this task alone.
exec >>"$ELEMENT_DIR/logs/ds-it-s-a-weird-home-date-s-065808-cpu-1x1-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}.out" 2>&1
cd "$ELEMENT_DIR" || exit 2
exec /bin/bash "./$ELEMENT_SCRIPT"
