#!/usr/bin/env bash
# clang-tidy over Cortado's C++ with the checks in .clang-tidy: every tracked
# .cc file of the build, or only the files named (scripts/tidy.sh
# core/worker.cc ...). Needs a build (scripts/build.sh: its
# compile_commands.json) and Debian's clang-tidy package (scripts/
# install_deps.sh installs it); not part of the test command.
# Prints what the checks report; exits 1 when they report anything.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${CORTADO_BUILD_DIR:-build}"
if ! command -v run-clang-tidy >/dev/null; then
  echo "tidy: run-clang-tidy not found: run scripts/install_deps.sh (Debian's clang-tidy)" >&2
  exit 2
fi
if [ ! -f "$build/compile_commands.json" ]; then
  echo "tidy: no $build/compile_commands.json: build first (scripts/build.sh)" >&2
  exit 2
fi
# Built by g++ but beyond clang 14's parser: target_clones on a template and
# a __builtin_cpu_supports feature name it does not know.
skip='^(core/common/half\.cc|core/common/reduce\.cc|tests/common/half_test\.cc)$'
if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(git ls-files '*.cc' | grep -Ev "$skip")
fi
# run-clang-tidy takes regular expressions over the build's files: anchor
# each path (a file the build does not compile, e.g. CUDA code without
# nvcc, matches nothing and is not checked).
patterns=()
for f in "${files[@]}"; do
  f="${f#"$PWD"/}"  # paths relative to the repository root, or absolute
  patterns+=("^$PWD/${f//./\\.}\$")
done
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
run-clang-tidy -p "$build" -j "${CORTADO_BUILD_JOBS:-2}" -quiet "${patterns[@]}" >"$out" 2>&1 || true
# Findings only (run-clang-tidy also echoes each command and clang's counts).
# (It colours its output on some terminals: the escapes are taken out.)
if sed -e 's/\x1b\[[0-9;]*m//g' "$out" | grep -E "(warning|error): " | sed "s|$PWD/||" | sort -u |
  grep .; then
  echo "tidy: the checks above need a fix (or a NOLINT(check) with the reason)" >&2
  exit 1
fi
echo "tidy: ${#files[@]} files, nothing reported"
