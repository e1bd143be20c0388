#!/bin/sh
# weft-epilog.sh — Slurm Epilog: remove weft's same-host exchange folders that no process holds.
# Ranks remove their folder on every exit path they control; a rank killed by SIGKILL (srun ending a
# failed step, the OOM killer) cannot. A folder is stale exactly when nobody holds the shared flock on
# its `lock` file (the kernel drops it when a process dies), never judged by age or pid. Sites add
#   Epilog=/path/to/weft-epilog.sh
# to slurm.conf (slurm-up.sh does). Runs as root (SlurmdUser) on each node after a job.
for d in /dev/shm/weft-[0-9]*-*; do
  [ -d "$d" ] && [ ! -L "$d" ] || continue
  if [ ! -e "$d/lock" ] || flock -n -x "$d/lock" true 2>/dev/null; then rm -rf -- "$d"; fi
done
exit 0
