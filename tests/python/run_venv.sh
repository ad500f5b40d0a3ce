#!/usr/bin/env bash
# Runs the Python of the project's virtual environment with the arguments
# after the first: ctest's python_tensorflow test, whose TensorFlow lives
# there (scripts/install_deps.sh). The environment is CORTADO_VENV when set
# at test time, else $1 (what CMake configured: CORTADO_VENV then, or the
# repository's .venv). Without one, /usr/bin/python3 runs, and the TensorFlow
# tests skip, saying why (they fail instead once install_deps.sh made the
# environment: test_tensorflow.py).
set -euo pipefail
venv=${CORTADO_VENV:-$1}
shift
if [[ -x $venv/bin/python ]]; then
  python=$venv/bin/python
else
  echo "run_venv.sh: no virtual environment at $venv (scripts/install_deps.sh makes it);" \
       "running /usr/bin/python3"
  python=/usr/bin/python3
fi
export CORTADO_VENV=$venv CORTADO_TEST_PYTHON=$python
exec "$python" "$@"
