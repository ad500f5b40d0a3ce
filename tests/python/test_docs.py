"""The README and docs/*.md against the code: every relative link resolves,
every `cortado` flag the README shows exists, docs/running.md's settings
table is what `cortado settings` prints, and the tables that
bench/plot_figures.py draws parse (seconds, no job)."""

import re
import subprocess
import sys

from conftest import REPO, _cortado_bin

DOCS = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))


def _anchors(path):
    """GitHub's anchors of a Markdown file's headings."""
    out = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"#+ (.*)", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def _links(path):
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return [m.group(1) for m in re.finditer(r"\]\(([^)\s]+)\)", text) if not m.group(1).startswith("http")]


def broken_links(paths):
    broken = []
    for path in paths:
        for link in _links(path):
            target, _, anchor = link.partition("#")
            resolved = (path.parent / target).resolve() if target else path
            if not resolved.exists():
                broken.append(f"{path.name}: {link} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{path.name}: {link} (no heading '{anchor}' in {resolved.name})")
    return broken


def test_every_relative_link_resolves():
    assert broken_links(DOCS) == []


def test_a_broken_link_and_a_missing_anchor_are_found(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n[x](b.md) [y](#title) [z](#nothing)\n")
    assert broken_links([tmp_path / "a.md"]) == ["a.md: b.md (no such file)",
                                                 "a.md: #nothing (no heading 'nothing' in a.md)"]


def readme_commands(text):
    """(subcommand path, flags) of every `cortado ...` command in the README's sh blocks."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0]
            for part in line.split(" -- "):
                words = part.split()
                if "cortado" not in words:
                    continue
                words = words[words.index("cortado") + 1:]
                path = []
                while words and re.fullmatch(r"[a-z]+", words[0]):
                    path.append(words.pop(0))
                flags = {w.split("=")[0] for w in words if re.fullmatch(r"--?[a-z][\w-]*(=.*)?", w)}
                commands.append((path, sorted(flags)))
    return commands


def test_the_readme_shows_only_flags_that_cortado_has():
    commands = readme_commands((REPO / "README.md").read_text(encoding="utf-8"))
    assert len(commands) >= 3, "the README's tour shows cortado commands"
    missing = []
    for path, flags in commands:
        # The subcommand path stops at the first positional word (a command after --).
        while True:
            p = subprocess.run([_cortado_bin()] + path + ["--help"], capture_output=True, text=True, timeout=30)
            if p.returncode == 0 or not path:
                break
            path = path[:-1]
        assert p.returncode == 0, p.stderr
        missing += [f"cortado {' '.join(path)} {f}" for f in flags
                    if not re.search(r"(?<![\w-])" + re.escape(f) + r"\b", p.stdout)]
    assert missing == []


def settings_table(markdown):
    """The first table whose header starts with "| variable | alias", as lines."""
    lines = markdown.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("| variable | alias")), None)
    if start is None:
        return []
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return lines[start:end]


def test_the_settings_table_is_what_cortado_settings_prints():
    printed = subprocess.run([_cortado_bin(), "settings"], capture_output=True, text=True,
                             timeout=30, check=True).stdout
    documented = settings_table((REPO / "docs" / "running.md").read_text(encoding="utf-8"))
    assert len(documented) > 10, "docs/running.md has no settings table"
    differ = sorted(set(documented) ^ set(settings_table(printed)))
    assert differ == [], ("docs/running.md's settings table and `cortado settings` differ (paste "
                          "the command's output into the doc):\n" + "\n".join(differ))


def test_a_changed_setting_line_is_caught():
    table = "| variable | alias | default | meaning |\n| --- | --- | --- | --- |\n| `A` |  | 1 | x |\n"
    assert settings_table("text\n\n" + table + "\nmore") == table.strip().splitlines()
    assert settings_table(table.replace("| x |", "| y |")) != settings_table(table)


def test_a_made_up_flag_is_caught():
    [(path, flags)] = readme_commands("```sh\ncortado plan --model x --no-such-flag\n```\n")
    assert path == ["plan"] and flags == ["--model", "--no-such-flag"]
    [(_, flags)] = readme_commands("```sh\ncortado bench pushpull -w 4 -q 2\n```\n")
    assert flags == ["-q", "-w"]
    help_text = subprocess.run([_cortado_bin(), "plan", "--help"], capture_output=True, text=True,
                               timeout=30).stdout
    assert "--no-such-flag" not in help_text and "--model" in help_text
    help_text = subprocess.run([_cortado_bin(), "bench", "pushpull", "--help"], capture_output=True, text=True,
                               timeout=30).stdout
    assert re.search(r"(?<![\w-])-w\b", help_text) and not re.search(r"(?<![\w-])-q\b", help_text)


def test_the_benchmark_tables_that_are_plotted_parse():
    p = subprocess.run([sys.executable, str(REPO / "bench" / "plot_figures.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_a_missing_plotted_table_is_named(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# nothing marked here\n")
    p = subprocess.run([sys.executable, str(REPO / "bench" / "plot_figures.py"), "--check", "--doc", str(doc)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert "no table marked '<!-- plot: pushpull -->'" in p.stderr


def test_a_runs_results_plot_as_the_scripts_plot_option_draws_them(tmp_path):
    # bench/model.sh --plot: `cortado bench model --json` lines, comments and
    # summaries among them; bench/train.sh --plot: train_table.py's --json.
    lines = tmp_path / "model.jsonl"
    lines.write_text("# bench/model.sh header\n"
                     '{"model": "resnet50", "codec": "dgc", "strategy": "gpu", "measured_ms": 130.0, "predicted_ms": 120.0}\n'
                     '{"model": "resnet50", "codec": "dgc", "strategy": "plan", "measured_ms": 100.0, "predicted_ms": 95.0}\n'
                     '{"model": "resnet50", "codec": "dgc", "summary": true}\n')
    table = tmp_path / "table.json"
    table.write_text('{"rows": [{"name": "Cortado", "img_sec_total": 10.0, "conf95_total": 1.0}, '
                     '{"config": "horovod", "skipped": "not installed"}]}')
    script = str(REPO / "bench" / "plot_figures.py")
    for kind, results in (("replay", lines), ("training", table)):
        png = tmp_path / f"{kind}.png"
        r = subprocess.run([sys.executable, script, "--run", kind, str(results), str(png), "--note", "t"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Nothing to draw: said, and no file.
    r = subprocess.run([sys.executable, script, "--run", "replay", str(table), str(tmp_path / "x.png")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "no strategy lines" in r.stderr, r.stderr
    assert not (tmp_path / "x.png").exists()


def test_a_printed_table_plots_as_the_scripts_plot_option_draws_it(tmp_path):
    # bench/multihost.sh, zen_multihost.sh, zen_train_multihost.sh --plot: the first Markdown
    # table with the --x columns in the run's output; a cell without a number is left out.
    out = tmp_path / "run.md"
    out.write_text("# a comment\n| other | x |\n| --- | --- |\n| 1 | 2 |\n\n"
                   "| density/worker | Zen ms | dense ms | check |\n|---|---|---|---|\n"
                   "| 0.10% | 26.8 | 1019.1 | ok |\n| 1.00% | not reached | 1043.2 (1000-1100) | ok |\n")
    script = str(REPO / "bench" / "plot_figures.py")
    png = tmp_path / "t.png"
    r = subprocess.run([sys.executable, script, "--table", str(out), str(png), "--x", "density/worker",
                        "--y", "Zen ms", "--y", "dense ms", "--log", "--note", "t"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sys.path.insert(0, str(REPO / "bench"))
    import plot_figures
    header, rows = plot_figures.first_table(out.read_text(), ["density/worker"])
    labels, series = plot_figures.table_series(header, rows, ["density/worker"], ["Zen ms", "dense ms"])
    assert labels == ["0.10%", "1.00%"] and series[0][0] == 26.8 and series[0][1] != series[0][1]
    assert series[1] == [1019.1, 1043.2]
    # A column that is not there is named, and no file is written.
    r = subprocess.run([sys.executable, script, "--table", str(out), str(tmp_path / "x.png"), "--x",
                        "density/worker", "--y", "Zen s"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "no column 'Zen s'" in r.stderr, r.stderr
    assert not (tmp_path / "x.png").exists()


def test_every_benchmark_script_offers_plot():
    # docs/benchmarks.md, "Running the benchmarks": each script draws its run with --plot FILE.
    for name in ("model.sh", "train.sh", "multihost.sh", "zen_multihost.sh", "zen_train_multihost.sh",
                 "compare_pushpull.py", "latency.py", "gravac_table.py"):
        text = (REPO / "bench" / name).read_text(encoding="utf-8")
        assert "--plot" in text and "plot_figures" in text or name == "compare_pushpull.py", name
        assert "matplotlib" in text, f"bench/{name} checks for matplotlib before its runs"
