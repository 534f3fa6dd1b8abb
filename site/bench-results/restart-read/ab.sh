#!/usr/bin/env bash
# restart hits: old (fb7aa0a) against new (reads into reused buffers), alternating, TCMalloc and glibc
set -u
PY=/work/main/.venv/bin/python
for alloc in auto system; do
  for r in 1 2; do
    if (( r % 2 )); then order="old new"; else order="new old"; fi
    for v in $order; do
      src=/work/main/src; [[ $v == old ]] && src=/tmp/s34/wt/src
      echo "== $alloc $v round $r" >> ab.log
      ALLOC=$alloc CONFIGS=example,kvmux-async OUT=/tmp/s34/rs/ab-$alloc-$v-$r.json PYTHONPATH=$src timeout 900 $PY restart.py 6 2>/dev/null | grep -E "^(example|kvmux)" >> ab.log
    done
  done
done
echo done >> ab.log
