#!/usr/bin/env bash
# The GPU check, prepared to run in one go when a session is lent a GPU machine (BUILD.md, "Run on a GPU"): the
# synthetic stream generated on the device and on the host, the loop benchmark, the README's default job (its
# stream generated on the device, 'auto', and on the host) and Criteo Kaggle's GPU-sized variant, with the GPU's
# utilization sampled by nvidia-smi every 0.2 s and read per phase. Everything lands in $OUT (default /tmp/gpu_check):
# each phase's output, smi.csv, phases.txt and summary.txt (the GPU's mean utilization while each phase trained).
#
#   OUT=/tmp/gpu_check bash benchmarks/gpu_check.sh [python]
#   PHASES=quick KAGGLE_EXAMPLES=4000000 OUT=... bash benchmarks/gpu_check.sh   # no loop benchmark, a shorter run
#   HOST=1 ...: also the default job with its stream made on the host (data.generator=host)
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

phase generator 60 "$PYTHON" - <<'GENERATOR'
# How fast the synthetic stream is made: on the device (data.generator='device') and by one host process.
import time
import jax
from experiments.configs import criteo_kaggle, default
from shadowsync_jax.data import synthetic, synthetic_device
for name, make in (('default', default.get_config), ('kaggle', criteo_kaggle.get_config)):
  cardinalities = tuple(make().data.cardinalities)
  source = synthetic.SyntheticSource(synthetic.SyntheticSpec(cardinalities=cardinalities))
  generator = synthetic_device.DeviceGenerator(source)
  for count in (1 << 14, 1 << 20):
    jax.block_until_ready(generator(0, count))
    started = time.perf_counter()
    for block in range(1, 6):
      jax.block_until_ready(generator(block * count, count))
    print(f'{name}: on the device, blocks of {count}: {5 * count / (time.perf_counter() - started):,.0f} examples/s',
          flush=True)
  started = time.perf_counter()
  source.read(0, 1 << 18)
  print(f'{name}: one host process: {(1 << 18) / (time.perf_counter() - started):,.0f} examples/s', flush=True)
GENERATOR
phase default 60 "$PYTHON" -m experiments.train --workdir=/tmp/gpu_check_default
phase kaggle_gpu 120 "$PYTHON" -m experiments.train --workdir=/tmp/gpu_check_kaggle_gpu \
  --config=experiments/configs/criteo_kaggle.py:gpu --config.data.source=synthetic \
  --config.data.num_train_examples=${KAGGLE_EXAMPLES:-20000000} --config.data.num_eval_examples=262144
[[ ${HOST:-} == 1 ]] && phase default_host 60 "$PYTHON" -m experiments.train --workdir=/tmp/gpu_check_default_host \
  --config.data.generator=host
phase default_long 90 "$PYTHON" -m experiments.train --workdir=/tmp/gpu_check_default_long \
  --config.data.num_train_examples=40000000
[[ ${PHASES:-} == quick ]] || phase loop 180 "$PYTHON" -m benchmarks.loop --repeats=1 --default_examples=8000000 --kaggle_examples=2000000 --nojob \
  --out="$OUT/loop.md" --root=/tmp/gpu_check_loop
kill $SMI 2>/dev/null
for name in default default_host default_long kaggle_gpu; do cp "/tmp/gpu_check_$name/summary.json" "$OUT/${name}_summary.json" 2>/dev/null; done

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
