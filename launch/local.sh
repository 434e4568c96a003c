#!/usr/bin/env bash
# N processes of rl_lm.main on this machine, joined into one JAX job: a multi-host run without the hosts.
#
#   launch/local.sh --config=configs/sample.py --workdir=/tmp/rl_lm/local [--config.key=value ...]
#   NUM_PROCESSES=2 DEVICES_PER_PROCESS=4 launch/local.sh --config=configs/default.py:smoke --workdir=DIR
#
# Every process gets DEVICES_PER_PROCESS fake CPU devices (XLA_FLAGS, set before Python starts) and
# finds the coordinator (process 0) at 127.0.0.1:PORT through RL_LM_COORDINATOR, RL_LM_NUM_PROCESSES
# and RL_LM_PROCESS_ID. Process 0 prints to this terminal; process i writes <workdir>/logs/process_<i>.log
# (a temporary folder without --workdir). The script waits for all of them; when one fails it stops the
# others and exits with the failed process's status (130 on Ctrl-C).
#
# Variables: NUM_PROCESSES (2), DEVICES_PER_PROCESS (4), PORT (a free one), PYTHON (.venv/bin/python if
# present, else python3), GRACE_S (10: seconds processes get after Ctrl-C before SIGKILL).
set -euo pipefail

NUM_PROCESSES=${NUM_PROCESSES:-2}
DEVICES_PER_PROCESS=${DEVICES_PER_PROCESS:-4}
GRACE_S=${GRACE_S:-10}
REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z ${PYTHON:-} ]]; then
  if [[ -x $REPO_DIR/.venv/bin/python ]]; then PYTHON=$REPO_DIR/.venv/bin/python; else PYTHON=python3; fi
fi
PORT=${PORT:-$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}

workdir=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    --workdir=*) workdir=${args[i]#--workdir=} ;;
    --workdir) workdir=${args[i + 1]:-} ;;
  esac
done
if [[ -n $workdir ]]; then log_dir=$workdir/logs; else log_dir=$(mktemp -d -t rl_lm_local.XXXXXX); fi
mkdir -p "$log_dir"

pids=()
# Stops the processes still running: with $1 (TERM: JAX takes it as a preemption notice, which a trainer may
# use to save), then KILL what is left after GRACE_S. A peer of a failed process cannot finish: KILL at once.
stop_all() {
  local pid t
  for pid in "${pids[@]}"; do kill "-$1" "$pid" 2>/dev/null || true; done
  for ((t = 0; t < GRACE_S * 10; t++)); do
    local running=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && running=1; done
    ((running)) || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done  # reaped quietly (no "Killed" notice)
}
trap 'echo "launch/local.sh: interrupted; stopping all processes" >&2; stop_all TERM; exit 130' INT TERM

echo "launch/local.sh: $NUM_PROCESSES processes x $DEVICES_PER_PROCESS CPU devices, coordinator 127.0.0.1:$PORT," \
  "logs of processes 1.. in $log_dir" >&2
for ((i = 0; i < NUM_PROCESSES; i++)); do
  log=$log_dir/process_$i.log
  (
    cd "$REPO_DIR"
    other_flags=$(sed -E 's/--xla_force_host_platform_device_count=[0-9]+//g' <<<"${XLA_FLAGS:-}")
    export JAX_PLATFORMS=cpu XLA_FLAGS="$other_flags --xla_force_host_platform_device_count=$DEVICES_PER_PROCESS"
    export RL_LM_COORDINATOR=127.0.0.1:$PORT RL_LM_NUM_PROCESSES=$NUM_PROCESSES RL_LM_PROCESS_ID=$i
    if ((i == 0)); then exec "$PYTHON" -m rl_lm.main "$@"; else exec "$PYTHON" -m rl_lm.main "$@" >"$log" 2>&1; fi
  ) &
  pids+=($!)
done

# Poll rather than `wait`, so the first process to fail is noticed whichever it is.

remaining=$NUM_PROCESSES
declare -A done_
while ((remaining > 0)); do
  for i in "${!pids[@]}"; do
    pid=${pids[i]}
    [[ -n ${done_[$i]:-} ]] && continue
    kill -0 "$pid" 2>/dev/null && continue
    code=0
    wait "$pid" || code=$?
    done_[$i]=1
    remaining=$((remaining - 1))
    if ((code != 0)); then
      echo "launch/local.sh: process $i exited with status $code; stopping the others" >&2
      if ((i > 0)); then tail -n 5 "$log_dir/process_$i.log" | sed "s/^/  process $i: /" >&2; fi
      stop_all KILL
      exit "$code"
    fi
  done
  if ((remaining > 0)); then sleep 0.2; fi
done
echo "launch/local.sh: all $NUM_PROCESSES processes finished" >&2
exit 0
