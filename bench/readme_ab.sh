#!/bin/bash
# The README's first command, before and after: fresh clones of two commits, each with an empty HOME (so no
# ~/.cache/mmw: both convert the GGUF models and judge from an empty cache) and no venv active.
#   bash bench/readme_ab.sh BEFORE_COMMIT AFTER_COMMIT [WORKDIR]
# Prints the setup and `dvc repro` wall times; per-stage seconds are in WORKDIR/<name>/reports/timings/.
set -u
before=${1:?before commit}; after=${2:?after commit}; work=${3:-/tmp/mmw-readme-ab}
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
for pair in "before:$before" "after:$after"; do
  name=${pair%%:*}; commit=${pair#*:}
  rm -rf "$work/$name" "$work/home-$name"; mkdir -p "$work/home-$name"
  git clone -q "$repo" "$work/$name" && git -C "$work/$name" checkout -q "$commit" || exit 1
  cd "$work/$name" || exit 1
  clean="env -i HOME=$work/home-$name PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 TERM=dumb"
  s=$(date +%s.%N); $clean bash -c 'bash scripts/setup.sh' > "$work/$name-setup.log" 2>&1; rc1=$?
  t=$(date +%s.%N); $clean bash -c '.venv/bin/dvc repro' > "$work/$name-repro.log" 2>&1; rc2=$?
  e=$(date +%s.%N)
  printf '%s %s: setup rc=%s %.1f s; dvc repro rc=%s %.1f s\n' "$name" "$commit" "$rc1" "$(echo "$t-$s" | bc)" \
    "$rc2" "$(echo "$e-$t" | bc)"
done
