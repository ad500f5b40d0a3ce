#!/usr/bin/env bash
# `cmake --install` into a scratch prefix gives a cortado that runs on its
# own: bin/cortado, and the planner's data under share/cortado/planner, which
# the installed binary reads before the source tree (a broken link in the
# installed hardware model is what the installed binary then reports).
#   install_test.sh BUILD_DIR
set -euo pipefail
BUILD=$1
PREFIX=$(mktemp -d /tmp/cortado-install-test.XXXXXX)
trap 'rm -rf "$PREFIX"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$BUILD" --prefix "$PREFIX" >"$PREFIX/install.log" 2>&1 ||
  fail "cmake --install: $(tail -5 "$PREFIX/install.log")"
CORTADO=$PREFIX/bin/cortado
DATA=$PREFIX/share/cortado/planner
[[ -x $CORTADO ]] || fail "no bin/cortado under the prefix"
[[ -f $DATA/costs/hardware.json && -f $DATA/costs/codecs.json && -f $DATA/profiles/resnet50.json ]] ||
  fail "the planner's data is not under $DATA: $(find "$PREFIX" -maxdepth 4 | head -20)"

unset CORTADO_PLANNER_DATA
out=$("$CORTADO" plan --model resnet50 --machines 2 --gpus-per-machine 2 --intra pcie \
  --inter 25gbit --codec dgc:ratio=0.01 2>&1) || fail "installed cortado plan failed: $out"
grep -q "predicted iteration time" <<<"$out" || fail "no summary from the installed cortado: $out"

# The installed copy is the one read: rename a link there, and the installed
# binary no longer knows it (the source tree's copy still would).
sed -i 's/"25gbit"/"25gbit-renamed"/' "$DATA/costs/hardware.json"
if out=$("$CORTADO" plan --model resnet50 --machines 2 --gpus-per-machine 2 --intra pcie \
  --inter 25gbit --codec dgc:ratio=0.01 2>&1); then
  fail "the installed binary read another hardware model than $DATA: $out"
fi
grep -q "25gbit-renamed" <<<"$out" || fail "the error does not list the installed model's links: $out"
echo "install layout passed"
