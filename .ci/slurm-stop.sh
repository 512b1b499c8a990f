#!/usr/bin/env bash
# Stop the daemons .ci/slurm-setup.sh started (slurmd, slurmctld, munged), each by the pid its pid file
# names, and wait until each has exited: .ci/run calls this on exit, so CI leaves no process behind.
# Usage: slurm-stop.sh [PIDFILE...] (default: the pid files slurm-setup.sh's configuration names)
set -u
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
  files=(/run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid)
fi
status=0
alive() {  # running: signalable and not a zombie (an exited process its parent has not reaped yet)
  kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]
}
for f in "${files[@]}"; do
  [ -s "$f" ] || continue
  pid=$(cat "$f")
  alive "$pid" || continue
  kill -TERM "$pid"
  for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
  if alive "$pid"; then
    kill -KILL "$pid" 2>/dev/null
    sleep 0.2
  fi
  if alive "$pid"; then
    echo "slurm-stop: $f: pid $pid still running" >&2
    status=1
  else
    echo "slurm-stop: stopped pid $pid ($f)"
  fi
done
exit $status
