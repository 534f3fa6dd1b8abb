#!/usr/bin/env bash
# old (fb7aa0a: each operation's repeats in a row) against new (operations take turns), alternating
set -u
OLD=/tmp/s34/wt/src; NEW=/work/main/src; PY=/work/main/.venv/bin/python
: > /tmp/s34/ab/out.jsonl
for r in $(seq 1 ${1:-8}); do
  if (( r % 2 )); then order="old new"; else order="new old"; fi
  for v in $order; do
    src=$OLD; [[ $v == new ]] && src=$NEW
    echo "{\"v\": \"$v\", \"round\": $r, \"rows\": $(PYTHONPATH=$src $PY /tmp/s34/ab/one.py)}" >> /tmp/s34/ab/out.jsonl
  done
done
