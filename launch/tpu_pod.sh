#!/usr/bin/env bash
# The same `python -m rl_lm.main` on every worker of a Cloud TPU VM slice (single- or multi-host).
#
#   TPU_NAME=my-v5p-64 ZONE=us-east5-a CONFIG=configs/gsm8k_qwen.py WORKDIR=/mnt/shared/runs/grpo \
#     launch/tpu_pod.sh [--config.key=value ...]
#   SETUP=1 ... launch/tpu_pod.sh ...        # first time: clone or update the repo and install it on every worker
#   DRY_RUN=1 ... launch/tpu_pod.sh ...      # print the gcloud commands instead of running them
#
# Each worker runs rl_lm.main with RL_LM_MULTIHOST=1, so `jax.distributed.initialize()` finds the
# other workers from the TPU metadata; process 0 (worker 0) prints progress. WORKDIR must be one
# folder every worker reaches (a shared mount) for checkpoints to be whole.
#
# Variables: TPU_NAME, ZONE, CONFIG, WORKDIR (required); PROJECT (gcloud's default if unset);
# REPO_DIR (~/rl_lm on the workers); REPO_URL (git URL cloned into REPO_DIR by SETUP=1; without it
# the repo must already be there); REPO_REF (branch or commit checked out by SETUP=1; default: pull the
# current branch); SETUP (1: run the setup step first); DRY_RUN (1: print only).
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

gcloud_ssh=(gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=all)
if [[ -n ${PROJECT:-} ]]; then gcloud_ssh+=(--project "$PROJECT"); fi

on_all_workers() {  # $1: a shell command line run on every worker at once
  if [[ $DRY_RUN == 1 ]]; then
    printf '%q ' "${gcloud_ssh[@]}" --command "$1"
    echo
  else
    "${gcloud_ssh[@]}" --command "$1"
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
  on_all_workers "$setup"
fi

args=(--config="$CONFIG" --workdir="$WORKDIR" "$@")
run="cd $REPO_DIR && RL_LM_MULTIHOST=1 .venv/bin/python -m rl_lm.main $(printf '%q ' "${args[@]}")"
on_all_workers "$run"
