#!/usr/bin/env python3
"""Draws the plots of docs/benchmarks.md from the tables printed there.

Each plot reads the Markdown table that follows a `<!-- plot: NAME -->` line
in docs/benchmarks.md, so a figure always shows the numbers beside it; the
text after a `;` in the marker (`<!-- plot: NAME; 2026-11-28, 2-core VM -->`)
goes into the plot's title. Writes PNG files (matplotlib, Debian's
python3-matplotlib) into docs/figures/.

    /usr/bin/python3 bench/plot_figures.py             # every figure
    /usr/bin/python3 bench/plot_figures.py --check     # parse the tables only
"""
import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class TableError(Exception):
    pass


def row_cells(line):
    """The cells of a Markdown table row."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def marked_tables(path):
    """{name: (header, rows, note)} for every table after a `<!-- plot: NAME[; NOTE] -->` line."""
    lines = open(path, encoding="utf-8").read().split("\n")
    tables = {}
    for i, line in enumerate(lines):
        m = re.fullmatch(r"<!-- plot: ([\w-]+)(?:; (.*?))? -->", line.strip())
        if not m:
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("|"):
            if lines[j].strip():
                raise TableError(f"{path}:{j + 1}: the table marked '{m.group(1)}' must follow its marker")
            j += 1
        rows = []
        while j < len(lines) and lines[j].startswith("|"):
            rows.append(row_cells(lines[j]))
            j += 1
        if len(rows) < 3:
            raise TableError(f"{path}:{i + 1}: no table after the marker '{m.group(1)}'")
        tables[m.group(1)] = (rows[0], rows[2:], m.group(2) or "")
    return tables


def column(header, names, table):
    """The index of the first of `names` (one name or a list of alternatives) in the header."""
    names = [names] if isinstance(names, str) else names
    for name in names:
        if name in header:
            return header.index(name)
    raise TableError(f"table '{table}' has no column '{' or '.join(names)}' (columns: {', '.join(header)})")


def number(text, table):
    m = re.match(r"[-+]?\d+(\.\d+)?", text.replace(",", ""))
    if not m:
        raise TableError(f"table '{table}': '{text}' is not a number")
    return float(m.group(0))


def size_bytes(text, table):
    m = re.fullmatch(r"(\d+) (KiB|MiB|GiB)", text)
    if not m:
        raise TableError(f"table '{table}': '{text}' is not a size like '4 MiB'")
    return int(m.group(1)) << {"KiB": 10, "MiB": 20, "GiB": 30}[m.group(2)]


def get(tables, name):
    if name not in tables:
        raise TableError(f"docs/benchmarks.md has no table marked '<!-- plot: {name} -->'")
    return tables[name]


def pushpull_series(tables):
    header, rows, note = get(tables, "pushpull")
    sizes = [size_bytes(r[0], "pushpull") for r in rows]
    series = {}
    # compare_pushpull.py names Cortado's column after its transport.
    for label, col in [("Cortado (shared memory)", ["zmq GB/s", "cortado GB/s"]),
                       ("MPI_Allreduce, shared memory", "mpi_shm GB/s"),
                       ("MPI_Allreduce, TCP", "mpi_tcp GB/s"), ("Gloo allreduce", "gloo GB/s")]:
        k = column(header, col, "pushpull")
        series[label] = (sizes, [number(r[k], "pushpull") for r in rows])
    header, rows, _ = get(tables, "pushpull-tcp")
    k = column(header, ["zmq noshm GB/s", "cortado GB/s"], "pushpull-tcp")
    series["Cortado, CORTADO_SHM=0 (TCP)"] = ([size_bytes(r[0], "pushpull-tcp") for r in rows],
                                              [number(r[k], "pushpull-tcp") for r in rows])
    return series, note


def replay_cells(tables):
    header, rows, note = get(tables, "model-replay")
    strategies = ["none", "gpu", "cpu", "plan", "replan"]
    cols = [column(header, s, "model-replay") for s in strategies]
    err_col = column(header, "errors none/gpu/cpu/plan/replan", "model-replay")
    cells = []
    for r in rows:
        measured = [number(r[k], "model-replay") for k in cols]
        errors = [number(e, "model-replay") / 100 for e in r[err_col].rstrip("%").split("/")]
        if len(errors) != len(strategies):
            raise TableError(f"table 'model-replay': '{r[err_col]}' does not have {len(strategies)} errors")
        # An error is the prediction's against the measured time: predicted = measured x (1 + error).
        predicted = [m * (1 + e) for m, e in zip(measured, errors)]
        cells.append((f"{r[0]}\n{r[1]}", measured, predicted))
    return strategies, cells, note


def fused_cells(tables):
    header, rows, note = get(tables, "fused-groups")
    # gpu and cpu with their predictions in brackets or without; the plot
    # takes the measured time either way.
    strategies = [("gpu", ["gpu ms (pred.)", "gpu ms"]), ("cpu", ["cpu ms (pred.)", "cpu ms"]),
                  ("pertensor (unfused plan)", "pertensor ms"), ("plan (fused groups)", "plan ms (pred.)")]
    cols = [column(header, c, "fused-groups") for _, c in strategies]
    cells = []
    for r in rows:
        measured = [number(r[k], "fused-groups") for k in cols]
        m = re.fullmatch(r"[\d.]+ \(([\d.]+)\)", r[cols[-1]])
        if not m:
            raise TableError(f"table 'fused-groups': '{r[cols[-1]]}' is not 'MEASURED (PREDICTED)'")
        cells.append((r[0].replace(" / ", "\n"), measured, float(m.group(1))))
    return [s for s, _ in strategies], cells, note


def training_runs(tables):
    runs, notes = [], []
    for name, title in [("training-hosts", "4 emulated hosts at 1 Gbit/s, batch 8"),
                        ("training-hosts-b4", "4 emulated hosts at 1 Gbit/s, batch 4"),
                        ("training-local", "one machine, 4 workers, batch 8")]:
        header, rows, note = get(tables, name)
        k = column(header, "img/sec total", name)
        configs, rates, spreads = [], [], []
        for r in rows:
            m = re.fullmatch(r"([\d.]+) \+-([\d.]+)", r[k])
            if not m:
                raise TableError(f"table '{name}': '{r[k]}' is not 'RATE +-SPREAD'")
            configs.append(r[0])
            rates.append(float(m.group(1)))
            spreads.append(float(m.group(2)))
        runs.append((title, configs, rates, spreads))
        notes.append(note)
    return runs, notes[0]


def require_matplotlib(prog):
    """A script's --plot, checked before its runs: exits naming the package when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit(f"{prog}: --plot needs matplotlib: run scripts/install_deps.sh (Debian's python3-matplotlib)")


def save(fig, out):
    """Writes a drawn figure to the PNG `out` and frees it."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def draw_pushpull(series, note, out):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    styles = {"Cortado (shared memory)": dict(color="C3", marker="o", linewidth=2.5),
              "Cortado, CORTADO_SHM=0 (TCP)": dict(color="C3", marker="o", linestyle="--"),
              "MPI_Allreduce, shared memory": dict(color="C0", marker="s"),
              "MPI_Allreduce, TCP": dict(color="C0", marker="s", linestyle=":"),
              "Gloo allreduce": dict(color="C2", marker="^")}
    for label, (sizes, gbps) in series.items():
        points = [(s, g) for s, g in zip(sizes, gbps) if g > 0]  # 0.000 GB/s: below the table's resolution
        ax.plot([p[0] for p in points], [p[1] for p in points], label=label, **styles[label])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = [s for s in series["Cortado (shared memory)"][0] if s in (4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20)]
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{t >> 20} MiB" if t >= 1 << 20 else f"{t >> 10} KiB" for t in ticks])
    ax.set_xlabel("tensor size")
    ax.set_ylabel("algorithm bandwidth (GB/s)")
    ax.set_title(f"Push-pull on one machine, 4 workers, 2 servers ({note})", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    save(fig, out)


def draw_replay(strategies, cells, note, out, where="4 emulated hosts at 1 Gbit/s"):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5))
    width = 0.8 / len(strategies)
    for s, strategy in enumerate(strategies):
        xs = [c + (s - (len(strategies) - 1) / 2) * width for c in range(len(cells))]
        ax.bar(xs, [cell[1][s] for cell in cells], width, label=strategy, color=f"C{s}")
        ax.scatter(xs, [cell[2][s] for cell in cells], marker="_", s=200, color="black", zorder=3,
                   label="predicted" if s == 0 else None)
    ax.set_yscale("log")
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([c[0] for c in cells])
    ax.set_ylabel("iteration time (ms, log scale)")
    ax.set_title(f"Model replay on {where} ({note})" if where else f"Model replay ({note})", fontsize=10)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(ncol=3)
    save(fig, out)


def draw_fused(strategies, cells, note, out):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / len(strategies)
    for s, strategy in enumerate(strategies):
        xs = [c + (s - (len(strategies) - 1) / 2) * width for c in range(len(cells))]
        ax.bar(xs, [cell[1][s] for cell in cells], width, label=strategy, color=f"C{s}")
    xs = [c + (len(strategies) - 1) / 2 * width for c in range(len(cells))]
    ax.scatter(xs, [cell[2] for cell in cells], marker="_", s=200, color="black", zorder=3,
               label="plan, predicted")
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([c[0] for c in cells])
    ax.set_ylabel("iteration time (ms)")
    ax.set_title(f"Fused groups in the model replay, 4 emulated hosts at 1 Gbit/s ({note})", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    save(fig, out)


def draw_training(runs, note, out):
    import matplotlib.pyplot as plt
    # One panel per run, each with its own configurations (the runs need not
    # have the same ones).
    fig, axes = plt.subplots(1, len(runs), figsize=(6.5 * len(runs), 5), squeeze=False)
    axes = axes[0]
    for ax, (title, configs, rates, spreads) in zip(axes, runs):
        colors = ["C3" if c.startswith("Cortado") else "C0" if c.startswith("DDP") else "C2" for c in configs]
        ys = list(range(len(configs)))
        ax.barh(ys, rates, xerr=spreads, color=colors, capsize=3)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("images/sec, all workers")
        ax.set_yticks(ys)
        ax.set_yticklabels([c.replace(", ", ",\n", 1) for c in configs], fontsize=7)
        ax.invert_yaxis()
        ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle(f"resnet18 training with the Python binding against DDP and Horovod with Gloo ({note})")
    save(fig, out)


def first_table(text, xcols):
    """(header, rows) of the first Markdown table in `text` whose header has every column of `xcols`."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"\|[\s:|-]+\|?$", lines[i + 1]):
            header = row_cells(lines[i])
            j = i + 2
            rows = []
            while j < len(lines) and lines[j].startswith("|"):
                rows.append(row_cells(lines[j]))
                j += 1
            if all(x in header for x in xcols):
                return header, rows
            i = j
        else:
            i += 1
    raise TableError(f"no Markdown table with the column(s) {', '.join(repr(x) for x in xcols)}")


def table_series(header, rows, xcols, ycols):
    """Labels (the xcols of each row joined) and, per y column, each row's leading number
    (NaN where a cell holds none, e.g. "not reached")."""
    xi = [column(header, x, "results") for x in xcols]
    yi = [column(header, y, "results") for y in ycols]
    labels = [" ".join(r[i] for i in xi) for r in rows]
    series = []
    for i in yi:
        values = []
        for r in rows:
            try:
                values.append(number(r[i], "results") if i < len(r) else float("nan"))
            except TableError:
                values.append(float("nan"))
        series.append(values)
    if not rows:
        raise TableError("the results table has no rows")
    return labels, series


def draw_table(labels, ycols, series, title, out, panels=False, log=False):
    """Grouped bars of the y columns per row (panels: one plot per column, for different units)."""
    import textwrap
    import matplotlib.pyplot as plt
    n = len(ycols)
    labels = [textwrap.fill(label.replace("`", ""), 18) for label in labels]
    if panels:
        fig, axes = plt.subplots(n, 1, figsize=(max(7, 1.2 * len(labels)), 4.5 * n), squeeze=False)
        for ax, y, values in zip(axes[:, 0], ycols, series):
            ax.bar(range(len(labels)), values, color="C0")
            ax.set_ylabel(y)
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, fontsize=7)
            ax.grid(True, axis="y", alpha=0.3)
            if log:
                ax.set_yscale("log")
    else:
        fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(labels)), 5.5))
        width = 0.8 / n
        for s, (y, values) in enumerate(zip(ycols, series)):
            xs = [c + (s - (n - 1) / 2) * width for c in range(len(labels))]
            ax.bar(xs, values, width, label=y, color=f"C{s}")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, fontsize=7 if len(labels) > 4 else 8)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        if log:
            ax.set_yscale("log")
        if n > 1:
            ax.legend()
        else:
            ax.set_ylabel(ycols[0])
    fig.suptitle(title, fontsize=10)
    save(fig, out)


def plot_table(path, out, xcols, ycols, note, panels=False, log=False):
    """--plot of the benchmarks that print a Markdown table: draws its y columns against its rows."""
    import matplotlib
    matplotlib.use("Agg")
    with open(path, encoding="utf-8") as f:
        header, rows = first_table(f.read(), xcols)
    labels, series = table_series(header, rows, xcols, ycols)
    draw_table(labels, ycols, series, note, out, panels=panels, log=log)


def replay_from_json(lines):
    """The model-replay cells of `cortado bench model --json` lines (bench/model.sh --json):
    (strategies, [(label, measured, predicted)]), each strategy's mean and prediction in ms."""
    rows = [r for r in lines if "strategy" in r and "measured_ms" in r]
    if not rows:
        raise TableError("no strategy lines (cortado bench model --json) to plot")
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    cells = {}
    for r in rows:
        cells.setdefault((r["model"], r["codec"]), {})[r["strategy"]] = r
    out = []
    for (model, codec), by in cells.items():
        measured = [by[s]["measured_ms"] if s in by else float("nan") for s in strategies]
        # No prediction (null: gravac, or a replan plan on another codec): nan.
        predicted = [by[s].get("predicted_ms") if s in by else None for s in strategies]
        predicted = [float("nan") if p is None else p for p in predicted]
        out.append((f"{model}\n{codec}", measured, predicted))
    return strategies, out


def plot_run(kind, path, out, note):
    """--plot of a benchmark script: draws one run's results into the PNG `out`.
    kind "replay": `path` holds bench/model.sh's --json lines; "training":
    bench/train_table.py's --json file."""
    import json
    import matplotlib
    matplotlib.use("Agg")
    if kind == "replay":
        with open(path, encoding="utf-8") as f:
            lines = [json.loads(l) for l in f if l.strip().startswith("{")]
        strategies, cells = replay_from_json(lines)
        draw_replay(strategies, cells, note, out, where=None)
    else:
        with open(path, encoding="utf-8") as f:
            rows = [r for r in json.load(f)["rows"] if "skipped" not in r]
        draw_training([("", [r["name"] for r in rows], [r["img_sec_total"] for r in rows],
                        [r["conf95_total"] for r in rows])], note, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "docs", "figures"))
    ap.add_argument("--check", action="store_true", help="parse the marked tables, draw nothing")
    ap.add_argument("--run", nargs=3, metavar=("KIND", "RESULTS", "PNG"),
                    help="draw one run's results (KIND replay: bench/model.sh --json lines; training: "
                         "bench/train_table.py --json) into PNG, as the scripts' --plot does")
    ap.add_argument("--note", default="", help="with --run or --table: the plot's title")
    ap.add_argument("--table", nargs=2, metavar=("RESULTS", "PNG"),
                    help="draw the first Markdown table in RESULTS that has the --x columns: the --y "
                         "columns per row into PNG, as the scripts' --plot does")
    ap.add_argument("--x", action="append", default=[], help="with --table: the column naming each row "
                    "(repeat to join several)")
    ap.add_argument("--y", action="append", default=[], help="with --table: a column to draw (repeat)")
    ap.add_argument("--panels", action="store_true", help="with --table: one plot per --y column")
    ap.add_argument("--log", action="store_true", help="with --table: a log scale")
    args = ap.parse_args()
    if args.table:
        if not args.x or not args.y:
            print("plot_figures: --table needs --x and --y columns", file=sys.stderr)
            return 2
        try:
            plot_table(args.table[0], args.table[1], args.x, args.y, args.note, args.panels, args.log)
        except ImportError:
            print("plot_figures: matplotlib is missing: run scripts/install_deps.sh (Debian's "
                  "python3-matplotlib)", file=sys.stderr)
            return 1
        except (OSError, ValueError, TableError) as e:
            print(f"plot_figures: {e}", file=sys.stderr)
            return 1
        print(f"plot_figures: wrote {args.table[1]}", file=sys.stderr)
        return 0
    if args.run:
        try:
            plot_run(args.run[0], args.run[1], args.run[2], args.note)
        except ImportError:
            print("plot_figures: matplotlib is missing: run scripts/install_deps.sh (Debian's "
                  "python3-matplotlib)", file=sys.stderr)
            return 1
        except (OSError, ValueError, KeyError, TableError) as e:
            print(f"plot_figures: {e}", file=sys.stderr)
            return 1
        print(f"plot_figures: wrote {args.run[2]}", file=sys.stderr)
        return 0
    try:
        tables = marked_tables(args.doc)
        pushpull, pushpull_note = pushpull_series(tables)
        strategies, cells, replay_note = replay_cells(tables)
        runs, training_note = training_runs(tables)
        fused_strategies, fused, fused_note = fused_cells(tables)
    except (OSError, TableError) as e:
        print(f"plot_figures: {e}", file=sys.stderr)
        return 1
    if args.check:
        print(f"plot_figures: {len(tables)} marked tables parse")
        return 0
    try:
        import matplotlib
    except ImportError:
        print("plot_figures: matplotlib is missing: run scripts/install_deps.sh (Debian's python3-matplotlib)",
              file=sys.stderr)
        return 1
    matplotlib.use("Agg")
    os.makedirs(args.out_dir, exist_ok=True)
    for name, draw in [("pushpull.png", lambda p: draw_pushpull(pushpull, pushpull_note, p)),
                       ("model_replay.png", lambda p: draw_replay(strategies, cells, replay_note, p)),
                       ("fused_groups.png", lambda p: draw_fused(fused_strategies, fused, fused_note, p)),
                       ("training.png", lambda p: draw_training(runs, training_note, p))]:
        path = os.path.join(args.out_dir, name)
        draw(path)
        print(f"plot_figures: wrote {os.path.relpath(path, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
