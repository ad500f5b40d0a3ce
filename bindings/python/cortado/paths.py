"""Where this package's `cortado` command and planner data are.

An installed package (`pip install .`, or its wheel on another machine) has
its own copies: pip puts the command in <prefix>/bin/cortado and the
planner's cost models and profiles in <prefix>/share/cortado/planner, and
lists both among the package's installed files, which importlib.metadata
reads. Nothing here points into the checkout or the build folder the wheel
came from. A package used from a CMake build (PYTHONPATH=build/bindings/python)
has no such record: its command is the build's launcher/cortado, and the
C++ planner falls back to the source tree the build came from.

CORTADO_BIN and CORTADO_PLANNER_DATA, when set, come first.
"""

import importlib.metadata
import os
import pathlib
import shutil

_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent


def _installed_file(suffix):
    """The absolute path of this package's installed file whose recorded
    path ends with `suffix`, or None when this package was not installed by
    pip (or another installed copy is not this one)."""
    try:
        dist = importlib.metadata.distribution("cortado")
    except importlib.metadata.PackageNotFoundError:
        return None
    # Another copy may be installed while this one runs from a build tree.
    own = pathlib.Path(dist.locate_file("cortado/__init__.py")).resolve()
    if own != _PACKAGE_DIR / "__init__.py":
        return None
    for f in dist.files or ():
        if f.as_posix().endswith(suffix):
            path = pathlib.Path(dist.locate_file(f)).resolve()
            if path.exists():
                return path
    return None


def command():
    """The `cortado` command that goes with this package: CORTADO_BIN, else
    the installed copy (<prefix>/bin/cortado), else the build's
    launcher/cortado next to a build tree's package, else `cortado` on PATH;
    None when there is none."""
    explicit = os.environ.get("CORTADO_BIN")
    if explicit:
        return explicit
    installed = _installed_file("bin/cortado")
    if installed is not None:
        return str(installed)
    # build/bindings/python/cortado -> build/launcher/cortado
    built = _PACKAGE_DIR.parents[2] / "launcher" / "cortado"
    if built.is_file() and os.access(built, os.X_OK):
        return str(built)
    return shutil.which("cortado")


def planner_data():
    """The folder with the planner's costs/ and profiles/: CORTADO_PLANNER_DATA,
    else the installed copy (<prefix>/share/cortado/planner); None leaves the
    choice to the C++ planner (the build's source tree, or an installed copy
    under the configured prefix)."""
    explicit = os.environ.get("CORTADO_PLANNER_DATA")
    if explicit:
        return explicit
    hardware = _installed_file("share/cortado/planner/costs/hardware.json")
    if hardware is not None:
        return str(hardware.parent.parent)
    return None
