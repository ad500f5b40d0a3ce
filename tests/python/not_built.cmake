# Run by ctest in place of the Python tests when the bindings were not built:
# the test command must fail, not skip.
message(FATAL_ERROR
  "python_bindings: the Python bindings were not built (CORTADO_WITH_PYTHON=${OPTION_VALUE}, "
  "and python3-dev + pybind11-dev for /usr/bin/python3 were not both found). Run "
  "scripts/install_deps.sh and configure again.")
