"""The README's commands run as written.

Every ```sh block of the README is marked, on the line before its fence,
either `<!-- runnable -->` (this test runs it) or `<!-- not run: REASON -->`
(it installs or builds the whole project: the test command itself, and the
pip_install test for pip). The runnable blocks run in order in one bash
(`set -euo pipefail`, so the tour's exports reach the later blocks), from a
view of the repository whose `build` is this test's build directory, so
`$PWD/build/...` in the README means the build under test. ctest runs this
file on its own (`readme_commands`): the tour's jobs take a minute or two.
"""

import os
import pathlib
import re
import signal
import subprocess

import pytest

from conftest import REPO, _cortado_bin

README = REPO / "README.md"
MARK = re.compile(r"<!-- (runnable|not run: .+) -->")


class ReadmeError(Exception):
    pass


def shell_blocks(text):
    """[(line, kind, code)] for every ```sh block; kind is 'runnable' or 'not run: ...'."""
    lines = text.split("\n")
    blocks = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```sh":
            start = i + 1
            j = start
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            if j == len(lines):
                raise ReadmeError(f"README.md:{i + 1}: the ```sh block is not closed")
            before = lines[i - 1].strip() if i > 0 else ""
            m = MARK.fullmatch(before)
            if not m:
                raise ReadmeError(f"README.md:{i + 1}: the ```sh block is not marked: put `<!-- runnable -->` "
                                  f"or `<!-- not run: REASON -->` on the line before its fence")
            blocks.append((i + 1, m.group(1), "\n".join(lines[start:j])))
            i = j
        i += 1
    return blocks


def script(blocks):
    """One bash script running the runnable blocks in order, each announced by its README line."""
    parts = ["set -euo pipefail"]
    for line, kind, code in blocks:
        if kind == "runnable":
            parts.append(f"echo '### README.md:{line}' >&2")
            parts.append(code)
    return "\n".join(parts) + "\n"


def repo_view(tmp_path, build_dir):
    """A directory of links to the repository's entries, with `build` linked to the build under test."""
    view = tmp_path / "repo"
    view.mkdir()
    for entry in REPO.iterdir():
        if entry.name != "build":
            (view / entry.name).symlink_to(entry)
    (view / "build").symlink_to(build_dir)
    return view


def run_blocks(text, cwd, timeout):
    """Runs the blocks in their own process group, killed whole after `timeout` seconds (a job
    the README starts never outlives the test); returns the finished process and the README
    line of the last block that started."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the README's exports set it
    p = subprocess.Popen(["bash", "-c", script(shell_blocks(text))], cwd=cwd, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        p.stdout_text, p.stderr_text = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.stdout_text, p.stderr_text = p.communicate()
        p.stderr_text += f"\n(killed after {timeout} s)"
    announced = re.findall(r"### (README\.md:\d+)", p.stderr_text)
    return p, (announced[-1] if announced else None)


def test_every_shell_block_is_marked_and_the_tour_is_runnable():
    blocks = shell_blocks(README.read_text(encoding="utf-8"))
    runnable = [b for b in blocks if b[1] == "runnable"]
    assert len(runnable) >= 3, "the tour's blocks (exports, a job, a plan) are marked runnable"
    assert any("cortado launch" in code for _, _, code in runnable)


def test_an_unmarked_block_and_a_failing_block_are_named(tmp_path):
    with pytest.raises(ReadmeError, match=r"README.md:2: the ```sh block is not marked"):
        shell_blocks("text\n```sh\necho hi\n```\n")
    text = ("<!-- runnable -->\n```sh\nexport X=1\n```\n<!-- not run: installs -->\n```sh\nexit 7\n```\n"
            "<!-- runnable -->\n```sh\ntest \"$X\" = 1\nfalse\necho after\n```\n")
    p, where = run_blocks(text, tmp_path, 30)
    assert p.returncode == 1 and where == "README.md:10" and "after" not in p.stdout_text


def test_the_readmes_runnable_blocks_run_as_written(tmp_path):
    build_dir = pathlib.Path(_cortado_bin()).resolve().parent.parent
    view = repo_view(tmp_path, build_dir)
    p, where = run_blocks(README.read_text(encoding="utf-8"), view, 540)
    assert p.returncode == 0, (f"the README block at {where} failed (exit {p.returncode})\n--- stdout ---\n"
                               f"{p.stdout_text[-4000:]}\n--- stderr ---\n{p.stderr_text[-6000:]}")
    # The last block's replay printed its comparison (set -e: every block before it exited 0).
    assert "plan vs none" in p.stdout_text, p.stdout_text[-4000:]
