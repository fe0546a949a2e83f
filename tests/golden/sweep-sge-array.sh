#!/bin/bash
# Job script written by diffscale 0.1.0: regenerate it with `diffscale plan` rather than edit it.
# sweep hostile: 6 element(s) as one array; sge-two-host / gpu: 1 node(s) x 1 CPU process per node = 1 ranks
# Submit it from the sweep directory (diffscale sweep submit does).
#$ -N ds-it-s-a-weird-home-date-s-065808-gpu-1x1
#$ -S /bin/bash
#$ -cwd
#$ -j y
#$ -o logs/
#$ -pe smp 4
#$ -l h_rt=01:00:00
#$ -q all.q
#$ -r y
#$ -t 1-6
#$ -tc 2

set -uo pipefail
# Which element this array task runs: its run directory and its own job script there.
case "$SGE_TASK_ID" in
    1) ELEMENT_DIR='/scratch/it'"'"'s a "weird" $HOME `date` sweep/runs/000'; ELEMENT_SCRIPT=job-1x1.sge.sh ;;
    2) ELEMENT_DIR='/scratch/it'"'"'s a "weird" $HOME `date` sweep/runs/001'; ELEMENT_SCRIPT=job-1x1.sge.sh ;;
    3) ELEMENT_DIR='/scratch/it'"'"'s a "weird" $HOME `date` sweep/runs/002'; ELEMENT_SCRIPT=job-1x1.sge.sh ;;
    4) ELEMENT_DIR='/scratch/it'"'"'s a "weird" $HOME `date` sweep/runs/003'; ELEMENT_SCRIPT=job-1x1.sge.sh ;;
    5) ELEMENT_DIR='/scratch/it'"'"'s a "weird" $HOME `date` sweep/runs/004'; ELEMENT_SCRIPT=job-1x1.sge.sh ;;
    6) ELEMENT_DIR='/scratch/it'"'"'s a "weird" $HOME `date` sweep/runs/005'; ELEMENT_SCRIPT=job-1x1.sge.sh ;;
    *) echo "diffscale: array task $SGE_TASK_ID is not an element of this sweep" >&2; exit 2 ;;
esac
mkdir -p "$ELEMENT_DIR/logs" || exit 2
echo "diffscale: array task $SGE_TASK_ID runs $ELEMENT_DIR (log: $ELEMENT_DIR/logs/ds-it-s-a-weird-home-date-s-065808-gpu-1x1.o${JOB_ID}.${SGE_TASK_ID})"
# The element's output goes to its own log; exec keeps this shell's process, so the warning
# signal reaches the element script's trap and its requeue acts on this task alone.
exec >>"$ELEMENT_DIR/logs/ds-it-s-a-weird-home-date-s-065808-gpu-1x1.o${JOB_ID}.${SGE_TASK_ID}" 2>&1
cd "$ELEMENT_DIR" || exit 2
exec /bin/bash "./$ELEMENT_SCRIPT"
