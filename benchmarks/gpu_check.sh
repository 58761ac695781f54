#!/usr/bin/env bash
# The GPU check, prepared to run in one go when a session is lent a GPU machine (BUILD.md, "Run on a GPU"): the
# synthetic stream read by 1-12 readers, the loop benchmark, the README's default job and Criteo Kaggle's
# GPU-sized variant on the synthetic stream, with the GPU's
# utilization sampled by nvidia-smi every 0.2 s and read per phase. Everything lands in $OUT (default /tmp/gpu_check):
# each phase's output, smi.csv, phases.txt and summary.txt (the GPU's mean utilization while each phase trained).
#
#   OUT=/tmp/gpu_check bash benchmarks/gpu_check.sh [python]
#   PHASES=quick KAGGLE_EXAMPLES=4000000 OUT=... bash benchmarks/gpu_check.sh   # no loop benchmark, a shorter run
#
# The python to use is the first argument (default: python). Each phase has a time limit, so that one that hangs
# leaves time for the rest; a phase that fails is said in summary.txt and the next one runs.
set -uo pipefail
PYTHON=${1:-python}
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 200 \
  >"$OUT/smi.csv" 2>&1 &
SMI=$!
trap 'kill $SMI 2>/dev/null' EXIT

phase() {  # phase NAME SECONDS COMMAND...: runs COMMAND, its output in $OUT/NAME.txt, its start and end in phases.txt
  local name=$1 limit=$2
  shift 2
  echo "$name start $(date +%s.%N)" >>"$OUT/phases.txt"
  timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
  echo "$name end $(date +%s.%N) exit $?" >>"$OUT/phases.txt"
}

phase reader 60 "$PYTHON" - <<'READER'
# How fast blocks of the synthetic stream are read by 1..12 readers (data.readers), processes and threads.
import time
from experiments.configs import criteo_kaggle, default
from shadowsync_jax.data import input_pipeline, readers
input_pipeline.pin_blas_threads()
for name, make in (('default', default.get_config), ('kaggle', criteo_kaggle.get_config)):
  config = make()
  config.data.source, config.data.num_train_examples, config.data.num_eval_examples = 'synthetic', 1 << 26, 16384
  source, _ = input_pipeline.make_sources(config.data, 0)
  for kind, count in (('threads', 4), ('processes', 1), ('processes', 4), ('processes', 8), ('processes', 12)):
    side_by_side = readers.make(source, count, processes=kind == 'processes') if count > 1 else readers.Serial(source)
    side_by_side.read_range(0, 1 << 19)  # Starts the processes.
    started = time.perf_counter()
    for block in range(1, 5):
      side_by_side.read_range(block << 19, 1 << 19)
    print(f'{name}: {count} reader {kind}: {4 * (1 << 19) / (time.perf_counter() - started):,.0f} examples/s',
          flush=True)
    side_by_side.close()
READER
[[ ${PHASES:-} == quick ]] || phase loop 240 "$PYTHON" -m benchmarks.loop --repeats=2 --default_examples=4000000 --kaggle_examples=1000000 --nojob \
  --out="$OUT/loop.md" --root=/tmp/gpu_check_loop
phase default 90 "$PYTHON" -m experiments.train --workdir=/tmp/gpu_check_default
phase kaggle_gpu 150 "$PYTHON" -m experiments.train --workdir=/tmp/gpu_check_kaggle_gpu \
  --config=experiments/configs/criteo_kaggle.py:gpu --config.data.source=synthetic \
  --config.data.num_train_examples=${KAGGLE_EXAMPLES:-20000000} --config.data.num_eval_examples=262144
kill $SMI 2>/dev/null

"$PYTHON" - "$OUT" <<'EOF' | tee "$OUT/summary.txt"
import datetime, pathlib, sys
out = pathlib.Path(sys.argv[1])
samples = []
for line in (out / 'smi.csv').read_text().splitlines():
  try:
    stamp, busy, memory = (field.strip() for field in line.split(','))
    when = datetime.datetime.strptime(stamp, '%Y/%m/%d %H:%M:%S.%f').timestamp()
    samples.append((when, float(busy), float(memory)))
  except ValueError:
    continue
phases = {}
for line in (out / 'phases.txt').read_text().splitlines():
  name, what, when, *rest = line.split()
  phases.setdefault(name, {})[what] = float(when)
  if rest:
    phases[name]['exit'] = rest[-1]
for name, p in phases.items():
  inside = [s for s in samples if p['start'] <= s[0] <= p.get('end', p['start'])]
  busy = sum(s[1] for s in inside) / len(inside) if inside else float('nan')
  memory = max((s[2] for s in inside), default=float('nan'))
  working = [s for s in inside if s[1] > 0]  # From the first sample the GPU worked to the last: the training.
  window = [s for s in inside if working and working[0][0] <= s[0] <= working[-1][0]]
  busy_window = sum(s[1] for s in window) / len(window) if window else float('nan')
  print(f'{name}: exit {p.get("exit")}, {p.get("end", p["start"]) - p["start"]:.0f} s, GPU busy {busy:.0f}% on '
        f'average over the phase ({len(inside)} samples), {busy_window:.0f}% from its first busy sample to its last '
        f'({len(window)} samples), GPU memory up to {memory:.0f} MiB')
  tail = (out / f'{name}.txt').read_text().strip().splitlines()[-3:]
  print('  ' + '\n  '.join(tail))
EOF
