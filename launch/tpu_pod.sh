#!/usr/bin/env bash
# The same `python -m rl_lm.main` on every worker of a Cloud TPU VM slice (single- or multi-host), after a
# pre-flight compile that refuses a job that will not fit.
#
#   TPU_NAME=my-v5p-64 ZONE=us-east5-a CONFIG=configs/gsm8k_qwen.py WORKDIR=/mnt/shared/runs/grpo \
#     launch/tpu_pod.sh [--config.key=value ...]
#   SETUP=1 ... launch/tpu_pod.sh ...        # first time: clone or update the repo and install it on every worker
#   DRY_RUN=1 ... launch/tpu_pod.sh ...      # print the gcloud commands instead of running them
#
# Pre-flight: before the job starts, `python -m rl_lm.aot --config=$CONFIG --topology=$ACCELERATOR --nocost
# <arguments>` compiles every jitted function of the job's stages for the slice and checks each fits the chips'
# HBM (rl_lm/aot). One that does not exits 2 with one line saying what and which knobs would help; the script
# then stops with that status and starts nothing. PREFLIGHT=local (default) runs it here, with the .venv's python
# (PYTHON overrides; it needs libtpu: pip install -r requirements-test.txt); PREFLIGHT=worker0 runs it on the
# slice's worker 0 (after SETUP, before the job); PREFLIGHT=0 skips it. The slice's accelerator type (v5p-64, ...)
# is ACCELERATOR, or asked of gcloud.
#
# Each worker runs rl_lm.main with RL_LM_MULTIHOST=1, so `jax.distributed.initialize()` finds the
# other workers from the TPU metadata; process 0 (worker 0) prints progress. WORKDIR must be one
# folder every worker reaches (a shared mount) for checkpoints to be whole.
#
# Variables: TPU_NAME, ZONE, CONFIG, WORKDIR (required); PROJECT (gcloud's default if unset);
# REPO_DIR (~/rl_lm on the workers); REPO_URL (git URL cloned into REPO_DIR by SETUP=1; without it
# the repo must already be there); REPO_REF (branch or commit checked out by SETUP=1; default: pull the
# current branch); SETUP (1: run the setup step first); DRY_RUN (1: print the gcloud commands; a local
# pre-flight still runs); ACCELERATOR; PREFLIGHT (local | worker0 | 0); PYTHON (the local pre-flight's).
set -euo pipefail

: "${TPU_NAME:?set TPU_NAME (the TPU VM name)}"
: "${ZONE:?set ZONE (the TPU VM zone)}"
: "${CONFIG:?set CONFIG, e.g. configs/gsm8k_qwen.py}"
: "${WORKDIR:?set WORKDIR (a folder every worker can reach)}"
REPO_DIR=${REPO_DIR:-'~/rl_lm'}  # expanded on the workers
REPO_URL=${REPO_URL:-}
REPO_REF=${REPO_REF:-}
SETUP=${SETUP:-0}
DRY_RUN=${DRY_RUN:-0}
PREFLIGHT=${PREFLIGHT:-local}
PYTHON=${PYTHON:-.venv/bin/python}
ACCELERATOR=${ACCELERATOR:-}

gcloud_tpu=(gcloud compute tpus tpu-vm)
where=(--zone "$ZONE")
if [[ -n ${PROJECT:-} ]]; then where+=(--project "$PROJECT"); fi

on_workers() {  # $1: which workers (all | 0); $2: a shell command line run there
  local ssh=("${gcloud_tpu[@]}" ssh "$TPU_NAME" "${where[@]}" --worker="$1" --command "$2")
  if [[ $DRY_RUN == 1 ]]; then
    printf '%q ' "${ssh[@]}"
    echo
  else
    "${ssh[@]}"
  fi
}

if [[ $SETUP == 1 ]]; then
  # The repo, a virtual environment from requirements.txt, and the TPU build of the pinned jax (libtpu).
  setup="set -euo pipefail; "
  if [[ -n $REPO_URL ]]; then
    setup+="if [[ ! -d $REPO_DIR/.git ]]; then git clone $(printf '%q' "$REPO_URL") $REPO_DIR; fi; "
    setup+="cd $REPO_DIR && git fetch --quiet && "
    if [[ -n $REPO_REF ]]; then
      setup+="git checkout --quiet $(printf '%q' "$REPO_REF"); "
    else
      setup+="git pull --ff-only --quiet; "
    fi
  fi
  setup+="cd $REPO_DIR && python3 -m venv .venv && .venv/bin/pip install --quiet -r requirements.txt"
  setup+=" && .venv/bin/pip install --quiet \"jax[tpu]==\$(sed -n 's/^jax==//p' requirements.txt)\""
  on_workers all "$setup"
fi

if [[ $PREFLIGHT != 0 ]]; then
  if [[ -z $ACCELERATOR ]]; then
    describe=("${gcloud_tpu[@]}" describe "$TPU_NAME" "${where[@]}" --format='value(acceleratorType)')
    if [[ $DRY_RUN == 1 ]]; then
      printf '%q ' "${describe[@]}"
      echo
      echo "launch/tpu_pod.sh: DRY_RUN needs ACCELERATOR (the slice's accelerator type, e.g. v5p-64) for the pre-flight" >&2
      exit 2
    fi
    ACCELERATOR=$("${describe[@]}")
    ACCELERATOR=${ACCELERATOR##*/}  # acceleratorType may come as a path: .../acceleratorTypes/v5p-64
  fi
  check=(-m rl_lm.aot --config="$CONFIG" --topology="$ACCELERATOR" --nocost "$@")
  case $PREFLIGHT in
    local)
      status=0
      JAX_PLATFORMS=cpu "$PYTHON" "${check[@]}" || status=$?
      if [[ $status != 0 ]]; then
        echo "launch/tpu_pod.sh: the pre-flight compile refused the job (exit $status); nothing was started" >&2
        exit "$status"
      fi
      ;;
    worker0)
      on_workers 0 "cd $REPO_DIR && JAX_PLATFORMS=cpu .venv/bin/python $(printf '%q ' "${check[@]}")"
      ;;
    *)
      echo "launch/tpu_pod.sh: PREFLIGHT must be local, worker0 or 0, got '$PREFLIGHT'" >&2
      exit 2
      ;;
  esac
fi

args=(--config="$CONFIG" --workdir="$WORKDIR" "$@")
run="cd $REPO_DIR && RL_LM_MULTIHOST=1 .venv/bin/python -m rl_lm.main $(printf '%q ' "${args[@]}")"
on_workers all "$run"
