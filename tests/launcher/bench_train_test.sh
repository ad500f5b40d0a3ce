#!/usr/bin/env bash
# ctest: bench/train.sh, the Python training benchmark, at tiny size on 2
# emulated hosts (a small torchvision model, 16x16 images, batch 2, 2 steps):
#   1. Cortado fused and one gradient at a time with DGC, and DDP with Gloo
#      (and Horovod with Gloo where horovod.torch imports, else the table
#      says it was skipped), the default path with the cross-barrier, and the
#      workers with no communication (the compute bound): exit 0, one table
#      row and one JSON row per configuration, each after 2 steps from the
#      same first loss (same seed and data), and the ratios against DDP,
#      one-at-a-time and the compute bound;
#   2. a run that fails (an unknown model) exits non-zero;
#   3. a run stopped by SIGINT mid-run exits within 30 s;
#   4. --framework tensorflow (the TensorFlow binding, with the virtual
#      environment's Python): fused, one at a time and TensorFlow's
#      MultiWorkerMirroredStrategy, the table's ratios against the strategy;
# and after each, nothing is left: no testbed, no process of the runs.
#   bench_train_test.sh BUILD_DIR
# Skips (exit 77) where it cannot run: not root, no network namespaces, no
# mpirun, no torch/torchvision for the interpreter (CORTADO_TEST_PYTHON,
# default /usr/bin/python3).
set -uo pipefail
BUILD=$1
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
TRAIN=$ROOT/bench/train.sh
PY=${CORTADO_TEST_PYTHON:-/usr/bin/python3}  # a venv with Horovod runs its rows too
NAME=b$(printf '%04x%03x' $((RANDOM % 65536)) $(($$ % 4096)))
OUT=$(mktemp -d /tmp/cortado-train-test.XXXXXX)
FAILED=0
job=""
fail() {
  echo "FAIL: $*" >&2
  FAILED=1
}
ok() { echo "ok: $*"; }
skip() {
  echo "SKIP: $*"
  exit 77
}
cleanup() {
  [[ -n $job ]] && kill "$job" 2>/dev/null
  "$ROOT/tests/testbed/testbed.sh" down "$NAME" >/dev/null 2>&1 || true
  rm -rf "$OUT"
}
trap cleanup EXIT

[[ $(id -u) -eq 0 ]] || skip "the emulated hosts need root (network namespaces, veth pairs, tc); run ctest as root"
command -v mpirun >/dev/null || skip "mpirun is not installed (scripts/install_deps.sh installs OpenMPI); cortado launch --hosts starts the workers under it"
"$PY" -c 'import torch, torchvision' 2>/dev/null || skip "$PY cannot import torch and torchvision (scripts/install_deps.sh installs python3-torch python3-torchvision)"
if ! err=$(ip netns add "${NAME}x" 2>&1); then
  skip "this machine does not allow network namespaces ('ip netns add' failed: $err)"
fi
ip netns del "${NAME}x"
[[ -x $BUILD/launcher/cortado && -d $BUILD/bindings/python/cortado ]] ||
  { echo "FAIL: $BUILD has no launcher/cortado or bindings/python/cortado (configure with -DCORTADO_WITH_PYTHON=ON and build)"; exit 1; }

# Nothing of testbed NAME and no process of its runs may be left.
check_clean() {
  local what=$1 left
  if left=$("$ROOT/tests/testbed/testbed.sh" leftovers "$NAME" 2>&1); then
    ok "$what: no testbed left"
  else
    fail "$what: left behind: $left"
  fi
  left=$(pgrep -f "benchmark_synthetic(_keras)?.py.*--num-classes 4 --data-batches 2 " | grep -v "^$$\$" || true)
  [[ -z $left ]] && ok "$what: no benchmark process left" || fail "$what: benchmark processes left: $(ps -o pid,args -p "${left//$'\n'/,}" 2>/dev/null)"
}

SIZES=(--model mobilenet_v3_small --image-size 16 --batch-size 2 --num-classes 4 --data-batches 2
  --warmup 0 --iters 1 --steps-per-iter 2 --threads 1 --run-timeout 240)
configs=cortado-fused,cortado-single,ddp,horovod,cortado-engine-cb,compute
export CORTADO_LOG_LEVEL=warn

# run_ok WHAT ARG...: bench/train.sh ARG... on testbed NAME within 10
# minutes, its table printed; exit 0 expected (else its stderr's end).
run_ok() {
  local what=$1 rc
  shift
  timeout -s INT 600 bash "$TRAIN" --hosts 2 --name "$NAME" --build "$BUILD" "$@" \
    >"$OUT/out" 2>"$OUT/err"
  rc=$?
  cat "$OUT/out"
  if ((rc != 0)); then
    fail "$what exited $rc"
    tail -40 "$OUT/err" >&2
  else
    ok "$what exits 0"
  fi
}

# 1. A full tiny run.
run_ok "the tiny run" --python "$PY" --configs "$configs" "${SIZES[@]}" --json "$OUT/table.json"
for row in "fused groups of 25 MiB" "one gradient at a time" "DDP with Gloo" "Horovod with Gloo" \
    "cross-barrier" "the compute bound"; do
  grep -q "^| .*$row" "$OUT/out" && ok "table row: $row" || fail "no table row '$row'"
done
if "$PY" - "$OUT/table.json" <<'EOF'; then ok "JSON rows: 2 steps each, same first loss, ratios"; else fail "JSON rows (above)"; fi
import json, math, sys
t = json.load(open(sys.argv[1]))
rows = [r for r in t["rows"] if "skipped" not in r]
names = [r["config"] for r in rows]
assert names[:3] == ["cortado-fused", "cortado-single", "ddp"], names
assert names[-2:] == ["cortado-engine-cb", "compute"], names
skipped = [r["config"] for r in t["rows"] if "skipped" in r]
assert "horovod" in names or skipped == ["horovod"], (names, skipped)
firsts = {round(r["loss_first"], 4) for r in rows}
assert len(firsts) == 1, f"first-step losses differ: {firsts}"
for r in rows:
    assert r["steps"] == 2 and r["workers"] == 2, r
    assert r["img_sec_total"] > 0 and math.isfinite(r["loss_last_mean"]), r
    assert abs(r["vs_ddp"] - r["img_sec_total"] / rows[2]["img_sec_total"]) < 1e-9, r
    assert abs(r["vs_single"] - r["img_sec_total"] / rows[1]["img_sec_total"]) < 1e-9, r
    assert abs(r["of_bound"] - r["img_sec_total"] / rows[-1]["img_sec_total"]) < 1e-9, r
    hvd = [x["img_sec_total"] for x in rows if x["config"] == "horovod"]
    assert (r["vs_horovod"] is None) if not hvd else \
        abs(r["vs_horovod"] - r["img_sec_total"] / hvd[0]) < 1e-9, r
print("rows:", names, "skipped:", skipped)
EOF
check_clean "the tiny run"

# 2. A failing run: exits non-zero, leaves nothing.
timeout -s INT 300 bash "$TRAIN" --hosts 2 --name "$NAME" --build "$BUILD" --python "$PY" \
  --configs ddp "${SIZES[@]}" --model no_such_model >"$OUT/out" 2>"$OUT/err"
rc=$?
((rc != 0)) && grep -q "ddp failed" "$OUT/err" && ok "a failing run exits $rc, naming the configuration" ||
  fail "a failing run: exit $rc, stderr: $(tail -5 "$OUT/err")"
check_clean "the failing run"

# 3. SIGINT mid-run (as Ctrl-C sends it): exits within 30 s, leaves nothing.
# A background job of a script starts with SIGINT ignored, which bash then
# cannot trap: env restores the default first, as a terminal's shell has it.
env --default-signal=INT bash "$TRAIN" --hosts 2 --name "$NAME" --build "$BUILD" --python "$PY" --configs ddp "${SIZES[@]}" \
  --iters 1000 >"$OUT/out" 2>"$OUT/err" &
job=$!
for _ in $(seq 120); do
  pgrep -f "benchmark_synthetic.py --backend gloo .*--num-iters 1000" >/dev/null && break
  sleep 1
done
sleep 3
kill -INT "$job"
stopped=""
for _ in $(seq 30); do
  kill -0 "$job" 2>/dev/null || { stopped=1; break; }
  sleep 1
done
if [[ -n $stopped ]]; then
  wait "$job"
  rc=$?
  job=""
  ((rc == 130)) && ok "SIGINT: exits 130 within 30 s" || fail "SIGINT: exit $rc (expected 130)"
else
  fail "SIGINT: still running 30 s later"
  kill -KILL "$job" 2>/dev/null
  job=""
fi
check_clean "the interrupted run"

# 4. The TensorFlow binding (--framework tensorflow) with the Python of the
# project's virtual environment, where scripts/install_deps.sh installs
# TensorFlow: Cortado's default path fused and one push_pull per gradient
# against TensorFlow's MultiWorkerMirroredStrategy, the same first loss and
# the ratios against the strategy and one at a time.
VENV=${CORTADO_VENV:-$ROOT/.venv}
TFPY=$VENV/bin/python
if [[ -x $TFPY ]] && "$TFPY" -c 'import tensorflow, keras' 2>/dev/null; then
  run_ok "the TensorFlow run" --framework tensorflow --python "$TFPY" --model MobileNetV2 \
    --image-size 32 --batch-size 2 --num-classes 4 --data-batches 2 --warmup 1 --iters 1 \
    --steps-per-iter 2 --run-timeout 300 --json "$OUT/tf.json"
  if "$PY" - "$OUT/tf.json" <<'EOF'; then ok "TensorFlow JSON rows: fused, one at a time, MWMS"; else fail "TensorFlow JSON rows (above)"; fi
import json, math, sys
t = json.load(open(sys.argv[1]))
rows = t["rows"]
assert [r["config"] for r in rows] == ["cortado-engine", "cortado-engine-single", "tf-mwms"], rows
assert rows[0]["name"].endswith("(gradients fused by size, 4 MiB)"), rows[0]["name"]
assert len({round(r["loss_first"], 4) for r in rows}) == 1, [r["loss_first"] for r in rows]
for r in rows:
    assert r["steps"] == 3 and r["workers"] == 2, r
    assert r["img_sec_total"] > 0 and math.isfinite(r["loss_last_mean"]), r
    assert r["vs_ddp"] is None, r
    assert abs(r["vs_mwms"] - r["img_sec_total"] / rows[2]["img_sec_total"]) < 1e-9, r
    assert abs(r["vs_single"] - r["img_sec_total"] / rows[1]["img_sec_total"]) < 1e-9, r
EOF
  grep -q "^| configuration .*| vs TF MWMS |" "$OUT/out" && ok "the table's peer column: TF MWMS" ||
    fail "no 'vs TF MWMS' column in the table"
  check_clean "the TensorFlow run"
  bash "$TRAIN" --framework tensorflow --configs ddp --hosts 2 --python "$TFPY" >"$OUT/out" 2>&1
  rc=$?
  ((rc != 0)) && grep -q "not one for --framework tensorflow" "$OUT/out" &&
    ok "a torch configuration with --framework tensorflow is refused" ||
    fail "ddp with --framework tensorflow: exit $rc, $(tail -2 "$OUT/out")"
elif [[ -e $VENV/cortado-requirements.txt ]]; then
  fail "$TFPY cannot import tensorflow and keras, although scripts/install_deps.sh installed them there"
else
  echo "part 4 skipped: $TFPY cannot import tensorflow (scripts/install_deps.sh installs it into $VENV)"
fi

((FAILED)) && { echo "bench_train: FAILED"; exit 1; }
echo "bench_train: all passed"
