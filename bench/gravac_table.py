#!/usr/bin/env python3
"""GraVAC's Table 2 on scikit-learn's digits (train_digits.py) or on a
word-level language model of the King James Bible (train_lm.py, --workload
lm): the example with each compression in turn (dense, static top-k and DGC ratios, GraVAC), on H
emulated hosts (tests/testbed/testbed.sh, 1 worker and 1 server per host,
links shaped at --rate; needs root) or on this machine (--local), and a
markdown table of final accuracy, the bytes each worker pushed (and how
much less than dense), the time to --target test accuracy (and the
speedup over each static ratio that reaches it), and what one worker had
pushed by the step that reached it (where the link bounds every step, the
time to the target follows those bytes).

    bench/gravac_table.py [--workload digits|lm] [--hosts 4] [--rate 1gbit] [--local]
                          [--epochs 10] [--steps N] [--target 0.95] [--configs none;topk:ratio=0.1;...]
                          [--model cnn|mlp] [--hidden H] [--lr X] [--seed S | --seeds S1,S2,...]
                          [--eval-every K] [--trace DIR]
                          [--fusion-bytes N]
                          [--build build] [--json FILE] [--python PY] [--plot FILE]
                          [--example-args "ARGS"]

--workload lm runs bindings/python/examples/train_lm.py for --steps steps
(default 600): --target is then a validation perplexity (the time to the
first evaluation at or below it; default 250), --eval-every K its
evaluation interval (default 50), and "final" the perplexity at the last
step. --model, --hidden and --epochs are the digits'; --example-args
passes further options to either example (e.g. "--embed 256 --batch-size 16").

--seed S gives the example its seed: train_digits.py's train/test split
and initial weights, train_lm.py's initial weights and the batches each
worker draws. --seeds S1,S2,... runs every configuration once per seed,
seed by seed (all configurations with S1, then all with S2, ..., each
seed's round starting one configuration further on, so that a
configuration's runs are spread over the machine's load), prints a row
per run and then a table of the means over the seeds: the final accuracy
or perplexity (mean, lowest and highest), the bytes pushed, the time to
the target over the runs that reached it, and GraVAC's speedup over each
static ratio from the seeds on which both reached the target.

--model mlp --hidden H trains train_digits.py's wide perceptron (64 x H +
H + H x 10 + 10 parameters) instead of its small CNN.

--eval-every K has rank 0 measure the test accuracy every K steps
(train_digits.py --eval-every), so that the time to the target is read at
step resolution, not at each epoch's end; every configuration runs with
the same K, and evaluation time is left out of every time in the table.

--trace DIR records each configuration's Chrome traces (cortado launch
--trace, docs/tracing.md) in DIR/<n>, n its place in --configs: the plan
executor's stages, GraVAC's own among them, and the servers' work.

A config ending in "@executor" (e.g. "gravac:codec=topk@executor") runs
train_digits.py --executor: the gradients through the plan executor (with
MPI's collective groups, as under every `cortado launch` with hosts;
CORTADO_EXECUTOR_MPI=0 in the environment runs it without them).
"@lr=X" runs that configuration with train_digits.py --lr X (per worker)
instead of --lr (or the script's default); both combine as
"gravac:codec=dgc@executor,lr=0.1". DGC takes the place of SGD's momentum
(train_digits.py runs SGD without momentum under it), so its rows may
need a learning rate of their own.

Progress on stderr, the table on stdout. --plot FILE also draws, per
configuration, the bytes pushed and the time to the target as a PNG
(matplotlib: Debian's python3-matplotlib).
"""

import argparse
import json
import os
import pathlib
import random
import shlex
import subprocess
import sys

import plot_figures  # bench/, this script's folder
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
TB = ROOT / "tests" / "testbed" / "testbed.sh"
EXAMPLES = {"digits": ROOT / "bindings" / "python" / "examples" / "train_digits.py",
            "lm": ROOT / "bindings" / "python" / "examples" / "train_lm.py"}
CONFIGS = ["none", "topk:ratio=0.1", "topk:ratio=0.01", "topk:ratio=0.001", "dgc:ratio=0.1",
           "dgc:ratio=0.01", "dgc:ratio=0.001", "gravac:codec=dgc,window=20,epsilon=0.7",
           "gravac:codec=topk,window=20,epsilon=0.5"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=sorted(EXAMPLES), default="digits",
                   help="digits: train_digits.py, test accuracy; lm: train_lm.py, validation "
                        "perplexity")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--local", action="store_true", help="no emulated hosts: --hosts workers here")
    p.add_argument("--epochs", type=int, default=10, help="digits: epochs")
    p.add_argument("--steps", type=int, default=600, help="lm: training steps")
    p.add_argument("--target", type=float,
                   help="digits: test accuracy (default 0.95); lm: validation perplexity "
                        "(default 250)")
    p.add_argument("--configs", default=";".join(CONFIGS),
                   help="';'-separated compressions (default: %(default)s)")
    p.add_argument("--model", choices=["cnn", "mlp"], default="cnn", help="train_digits.py --model")
    p.add_argument("--hidden", type=int, help="train_digits.py --hidden (with --model mlp)")
    p.add_argument("--lr", type=float,
                   help="train_digits.py --lr (per worker) for every configuration without its own "
                        "@lr=X (default: the script's)")
    seeding = p.add_mutually_exclusive_group()
    seeding.add_argument("--seed", type=int,
                         help="the example's --seed (digits: the train/test split and the "
                              "initial weights; lm: the initial weights and the batches drawn; "
                              "default: the script's, 0)")
    seeding.add_argument("--seeds", type=seed_list, metavar="S1,S2,...",
                         help="run every configuration once per seed (seed by seed) and add a "
                              "table of the means over the seeds")
    p.add_argument("--eval-every", type=int, metavar="K",
                   help="digits: test accuracy every K steps (default 0: at each epoch's "
                        "end); lm: validation perplexity every K steps (default 50)")
    p.add_argument("--example-args", default="", metavar="ARGS",
                   help="further options for the example, as one shell-quoted string")
    p.add_argument("--fusion-bytes", type=int, metavar="N",
                   help="train_digits.py --fusion-bytes N for every configuration")
    p.add_argument("--trace", metavar="DIR", help="cortado launch --trace DIR/<n> per config")
    p.add_argument("--build", default=str(ROOT / "build"))
    p.add_argument("--json", help="also write every run's record here")
    p.add_argument("--from-json", metavar="FILE,...",
                   help="run nothing: print the tables of the records that --json wrote "
                        "(comma-separated files, their runs together)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per run")
    p.add_argument("--python", default="/usr/bin/python3", help="the workers' interpreter")
    p.add_argument("--plot", metavar="FILE", help="also write a PNG of traffic and time to the target")
    args = p.parse_args()
    lm = args.workload == "lm"
    if args.target is None:
        args.target = 250.0 if lm else 0.95
    if args.eval_every is None:
        args.eval_every = 50 if lm else 0
    if args.target <= 0 or (not lm and args.target > 1):
        p.error(f"--target {args.target}: a test accuracy in (0, 1] for the digits, a "
                f"perplexity above 0 for lm")
    if lm and (args.model != "cnn" or args.hidden):
        p.error("--model and --hidden are train_digits.py's; give train_lm.py's sizes with "
                "--example-args (e.g. \"--hidden 128 --embed 128\")")
    if args.plot:
        plot_figures.require_matplotlib("gravac_table")
    return args


def seed_list(text):
    """'1,2,3' -> [1, 2, 3]: whole numbers, at least one, none twice."""
    try:
        seeds = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a list of whole numbers: give them comma-separated, e.g. 1,2,3")
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"'{text}' names a seed twice: each seed runs once")
    return seeds


def split_config(config, default_lr):
    """"<compression>@executor,lr=X" -> (compression, through the plan executor?,
    learning rate or default_lr). Exits with a message on an unknown suffix."""
    compression, _, suffix = config.partition("@")
    executor, lr = False, default_lr
    for part in filter(None, suffix.split(",")):
        if part == "executor":
            executor = True
        elif part.startswith("lr="):
            try:
                lr = float(part[3:])
            except ValueError:
                lr = -1.0
            if not lr > 0:
                raise SystemExit(f"gravac_table: '{part}' in config '{config}': the learning "
                                 f"rate must be a positive number, e.g. lr=0.1")
        else:
            raise SystemExit(f"gravac_table: '{part}' in config '{config}' is unknown: use "
                             f"'executor' or 'lr=X', e.g. dgc:ratio=0.1@lr=0.1")
    return compression, executor, lr


def run(args, compression, out, name, index=0, seed=None):
    build = pathlib.Path(args.build).resolve()
    env = dict(os.environ, PYTHONPATH=str(build / "bindings" / "python"),
               CORTADO_LOG_LEVEL="warn", OMP_NUM_THREADS="1",
               CORTADO_CONNECT_TIMEOUT_MS="180000")
    cortado = str(build / "launcher" / "cortado")
    compression, executor, lr = split_config(compression, args.lr)
    if args.workload == "lm":
        script = [args.python, str(EXAMPLES["lm"]), "--steps", str(args.steps),
                  "--compression", compression, "--json", str(out),
                  "--eval-every", str(args.eval_every)]
    else:
        script = [args.python, str(EXAMPLES["digits"]), "--epochs", str(args.epochs),
                  "--no-progress", "--compression", compression, "--json", str(out),
                  "--model", args.model] + \
            (["--hidden", str(args.hidden)] if args.hidden else []) + \
            (["--eval-every", str(args.eval_every)] if args.eval_every else [])
    script += \
        (["--fusion-bytes", str(args.fusion_bytes)] if args.fusion_bytes is not None else []) + \
        (["--lr", repr(lr)] if lr is not None else []) + \
        (["--seed", str(seed)] if seed is not None else []) + \
        (["--executor"] if executor else []) + shlex.split(args.example_args)
    trace = ["--trace", str(pathlib.Path(args.trace).resolve() / str(index))] if args.trace else []
    if args.local:
        cmd = [cortado, "launch", "-w", str(args.hosts), "-s", "2"] + trace + ["--"] + script
    else:
        hosts = ",".join(f"{name}-h{i}" for i in range(1, args.hosts + 1))
        cmd = [str(TB), "exec", name, "1", "env"] + [f"{k}={env[k]}" for k in (
            "PYTHONPATH", "CORTADO_LOG_LEVEL", "OMP_NUM_THREADS", "CORTADO_CONNECT_TIMEOUT_MS",
            "CORTADO_EXECUTOR_MPI") if k in env] + \
            [cortado, "launch", "-w", "1", "-s", "1", "--hosts", hosts, "--agent",
             f"{TB} exec-host {{host}}"] + trace + ["--"] + script
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0 or not out.exists():
        print(f"# {compression}: failed (exit {proc.returncode})\n{proc.stdout[-2000:]}\n"
              f"{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    record = json.loads(out.read_text())
    record["wall"] = time.monotonic() - start
    return record


def print_tables(records, args):
    """The table of every run; with runs of several seeds, a table per seed and the means."""
    seeds = list(dict.fromkeys(r.get("seed") for r in records))
    if len(seeds) > 1 or args.seeds:
        for seed in seeds:
            print(f"\nseed {seed}:\n")
            print_table([r for r in records if r.get("seed") == seed], args)
        print(f"\nmeans over seeds {','.join(map(str, seeds))}:\n")
        print_means(records, args)
    else:
        print_table(records, args)


def main():
    args = parse_args()
    if args.from_json:
        records = []
        for f in args.from_json.split(","):
            try:
                records += json.loads(pathlib.Path(f).read_text())
            except (OSError, ValueError) as e:
                raise SystemExit(f"gravac_table: --from-json {f}: {e}: give a file that "
                                 f"--json wrote")
        for r in records:
            r.setdefault("seed", args.seed)
        print_tables(records, args)
        return
    configs = [c for c in args.configs.split(";") if c]
    for c in configs:
        split_config(c, args.lr)  # a bad suffix fails before any run
    seeds = args.seeds or [args.seed]
    name = "g" + "".join(random.choice("0123456789abcdef") for _ in range(6))
    records = []
    up = False
    try:
        if not args.local:
            subprocess.run([str(TB), "up", name, str(args.hosts), "--rate", args.rate],
                           check=True, stdout=subprocess.DEVNULL)
            up = True
        with tempfile.TemporaryDirectory(prefix="gravac-table-") as tmp:
            os.chmod(tmp, 0o755)
            for n, seed in enumerate(seeds):
                # Each seed starts one configuration further on, so that no
                # configuration always runs first (or last) in a round.
                turn = n % len(configs)
                for i, c in enumerate(configs[turn:] + configs[:turn]):
                    index = n * len(configs) + i
                    label = f" (seed {seed})" if args.seeds else ""
                    began, load = time.strftime("%H:%M:%S", time.gmtime()), os.getloadavg()[0]
                    print(f"# {began} UTC {c}{label}, load {load:.1f}", file=sys.stderr,
                          flush=True)
                    r = run(args, c, pathlib.Path(tmp) / f"run{index}.json", name, index, seed)
                    if r is not None:
                        r["config"] = c
                        r["seed"] = seed
                        r["began_utc"], r["load"] = began, [load, os.getloadavg()[0]]
                        records.append(r)
                        if args.json:  # every run kept as it ends
                            pathlib.Path(args.json).write_text(json.dumps(records))
    finally:
        if up:
            subprocess.run([str(TB), "down", name], stdout=subprocess.DEVNULL)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(records))
    print_tables(records, args)
    if args.plot:
        plot(records, args)


def plot(records, args):
    """Two panels per configuration: what one worker pushed, and the time to the target (none
    where it was not reached)."""
    import matplotlib
    matplotlib.use("Agg")
    pushed = [final(r)["pushed"] / 1e6 for r in records]
    reached = [(reach(r, args.target) or (float("nan"),))[0] for r in records]
    where = "this machine" if args.local else f"{args.hosts} emulated hosts at {args.rate}"
    workload = "the KJV language model" if args.workload == "lm" else "the digits"
    plot_figures.draw_table([r["config"] for r in records],
                            ["pushed per worker (MB)", f"time to {target_name(args)} (s)"],
                            [pushed, reached], f"GraVAC and static ratios on {workload}, {where}",
                            args.plot, panels=True)
    print(f"# plot written to {args.plot}", file=sys.stderr)


def is_lm(r):
    return r.get("workload") == "lm"


def final(r):
    """The run's end: {"metric": test accuracy (digits) or validation perplexity (lm),
    "pushed": bytes one worker pushed for the gradients, "seconds": training time}."""
    e = r["final"] if is_lm(r) else r["epochs"][-1]
    return {"metric": e.get("val_ppl" if is_lm(r) else "test_acc"), "pushed": e["pushed"],
            "seconds": e.get("seconds")}


def target_name(args):
    return (f"val ppl <= {args.target:g}" if args.workload == "lm"
            else f"{args.target:.0%} test accuracy")


def reach(r, target):
    """(seconds, step) of the first evaluation that reaches the target, or None:
    for lm the first validation perplexity at or below it; for the digits the
    first test accuracy at or above it, from the evaluations every K steps
    where the run made them, else at each epoch's end."""
    if is_lm(r):
        return next(((e["seconds"], e["step"]) for e in r["evals"] if e["val_ppl"] <= target),
                    None)
    if r.get("evals"):
        return next(((e["seconds"], e["step"]) for e in r["evals"] if e["test_acc"] >= target),
                    None)
    per_epoch = len(r.get("step_seconds", [])) // max(1, len(r["epochs"])) or None
    return next(((e["seconds"], e["epoch"] * per_epoch if per_epoch else None)
                 for e in r["epochs"] if e["test_acc"] >= target), None)


def cf_runs(ratios):
    """'10x 39, 20x 191': the CF sent, run by run (dense: CF 1); past 6 runs, the
    first 3 and the steps at each CF in all."""
    out = []
    for x in ratios:
        if out and out[-1][0] == x:
            out[-1][1] += 1
        else:
            out.append([x, 1])
    def name(x):
        return "dense" if x == 1.0 else f"{x:g}x"
    if len(out) <= 6:
        return ", ".join(f"{name(x)} {n}" for x, n in out)
    # Many switches: the first runs, then the steps at each CF in all.
    total = {}
    for x, n in out:
        total[x] = total.get(x, 0) + n
    return (", ".join(f"{name(x)} {n}" for x, n in out[:3]) + f", ... ({len(out)} runs; in all "
            + ", ".join(f"{name(x)} {n}" for x, n in sorted(total.items())) + ")")


def seconds_per_step(r):
    """The run's training time over its steps, and GraVAC's mean step time at each CF
    (the step's own duration on rank 0, from zero_grad to the optimizer's step)."""
    steps = r.get("step_seconds") or []
    total = final(r)["seconds"] / len(steps) if steps else float("nan")
    by_cf = {}
    if r.get("history") and len(r["history"]) == len(steps):
        for h, t in zip(r["history"], steps):
            by_cf.setdefault(h["ratio"], []).append(t)
    return total, {cf: sorted(ts)[len(ts) // 2] for cf, ts in by_cf.items()}


def pushed_to(r, step):
    """MB one worker had pushed for the gradients by the end of `step` (1-based):
    GraVAC's per-step bytes from its history, else the run's mean per step."""
    if r.get("history"):
        return sum(h["bytes"] for h in r["history"][:step]) / 1e6
    steps = len(r.get("step_seconds") or [])
    return final(r)["pushed"] * step / steps / 1e6 if steps else float("nan")


def print_table(records, args):
    dense = next((r for r in records if r["config"] == "none"), None)
    dense_bytes = final(dense)["pushed"] if dense else None

    def to_target(r):
        hit = reach(r, args.target)
        return hit[0] if hit else None

    static = [r for r in records if not r["config"].startswith(("none", "gravac"))]
    lm = args.workload == "lm"
    metric = "final val ppl" if lm else "final test acc"
    short = f"ppl <= {args.target:g}" if lm else f"{args.target:.0%}"
    print(f"| compression | CFs sent (steps) | {metric} | pushed per worker (MB) | "
          f"less than dense | time to {short} (s) | step | pushed by then (MB) | "
          f"s/step (median) | GraVAC's speedup over the static ratios that reach it |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in records:
        last = final(r)
        hit = reach(r, args.target)
        t = hit[0] if hit else None
        less = f"{dense_bytes / last['pushed']:.1f}x" if dense_bytes and last["pushed"] else "-"
        vs = ""
        if r["config"].startswith("gravac") and t is not None:
            vs = ", ".join(f"{s['config']} {to_target(s) / t:.2f}x" for s in static
                           if to_target(s) is not None)
        nsteps = len(r.get("step_seconds") or []) or "?"
        if r.get("history"):
            cfs = cf_runs([h["ratio"] for h in r["history"]])
        elif r["config"] == "none":
            cfs = f"dense {nsteps}"
        else:
            cfs = f"static {nsteps}"
        total, by_cf = seconds_per_step(r)
        steps = r.get("step_seconds") or []
        median = sorted(steps)[len(steps) // 2] if steps else float("nan")
        per_step = f"{total:.3f} ({median:.3f})"
        if len(by_cf) > 1:
            per_step += "; " + ", ".join(("dense" if cf == 1.0 else f"{cf:g}x") + f" {v:.3f}"
                                         for cf, v in sorted(by_cf.items()))
        reached = f"{t:.1f}" if t is not None else "not reached"
        at = str(hit[1]) if hit and hit[1] is not None else ("" if hit is None else "?")
        by_then = f"{pushed_to(r, hit[1]):.2f}" if hit and hit[1] is not None else ""
        value = f"{last['metric']:.2f}" if lm else f"{last['metric']:.4f}"
        print(f"| {r['config']} | {cfs} | {value} | {last['pushed'] / 1e6:.2f} | "
              f"{less} | {reached} | {at} | {by_then} | {per_step} | {vs} |")


def spread(values, fmt):
    """'mean (lowest-highest)' of the values, each written with fmt."""
    if not values:
        return ""
    mean = sum(values) / len(values)
    if len(values) == 1:
        return format(mean, fmt)
    return f"{mean:{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def print_means(records, args):
    """One row per configuration over its runs (one per seed): the final metric, the bytes
    pushed and the time to the target as mean (lowest-highest); the metric against dense's
    mean, the bytes as dense's mean over this mean; the time over the runs that reached the
    target; GraVAC's speedup over a static ratio as the ratio of their mean times over the
    seeds on which both reached it."""
    lm = args.workload == "lm"
    configs = list(dict.fromkeys(r["config"] for r in records))
    by_config = {c: [r for r in records if r["config"] == c] for c in configs}

    def mean(values):
        return sum(values) / len(values) if values else None

    dense = by_config.get("none", [])
    dense_metric = mean([final(r)["metric"] for r in dense])
    dense_bytes = mean([final(r)["pushed"] for r in dense])
    static = [c for c in configs if not c.startswith(("none", "gravac"))]

    def hits(c):
        """(seed, seconds to the target) of the configuration's runs that reached it."""
        return [(r["seed"], reach(r, args.target)[0]) for r in by_config[c]
                if reach(r, args.target) is not None]

    def times(c):
        """{seed: mean seconds to the target over that seed's runs that reached it}
        (records of several invocations may hold a seed more than once)."""
        per_seed = {}
        for seed, t in hits(c):
            per_seed.setdefault(seed, []).append(t)
        return {seed: mean(ts) for seed, ts in per_seed.items()}

    metric = "final val ppl" if lm else "final test acc"
    against = "above dense's mean" if lm else "against dense's mean (points)"
    short = f"ppl <= {args.target:g}" if lm else f"{args.target:.0%}"
    print(f"| compression | runs | {metric}, mean (lowest-highest) | {against} | pushed per "
          f"worker (MB) | less than dense (means) | reached {short} | time to it (s), runs "
          f"that reached it | at step | GraVAC's speedup over the static ratios that reach "
          f"it (seeds where both did) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for c in configs:
        runs = by_config[c]
        metrics = [final(r)["metric"] for r in runs]
        pushed = [final(r)["pushed"] / 1e6 for r in runs]
        m = mean(metrics)
        if dense_metric is None:
            vs = "-"
        elif lm:
            vs = f"{(m - dense_metric) / dense_metric:+.2%}"
        else:
            vs = f"{(m - dense_metric) * 100:+.2f}"
        less = f"{dense_bytes / 1e6 / mean(pushed):.1f}x" if dense_bytes and mean(pushed) else "-"
        reached = times(c)
        reached_runs = [t for _, t in hits(c)]
        steps = sorted({reach(r, args.target)[1] for r in runs
                        if reach(r, args.target) is not None and reach(r, args.target)[1]})
        speedups = ""
        if c.startswith("gravac") and reached:
            parts = []
            for s in static:
                theirs = times(s)
                both = sorted(set(reached) & set(theirs))
                if not both:
                    continue
                ratio = sum(theirs[k] for k in both) / sum(reached[k] for k in both)
                seeds = len({r["seed"] for r in runs})
                note = "" if len(both) == seeds else f" ({len(both)} of {seeds} seeds)"
                parts.append(f"{s} {ratio:.2f}x{note}")
            speedups = ", ".join(parts)
        value = ".2f" if lm else ".4f"
        print(f"| {c} | {len(runs)} (seeds {','.join(str(r['seed']) for r in runs)}) | "
              f"{spread(metrics, value)} | {vs} | {spread(pushed, '.2f')} | {less} | "
              f"{len(reached_runs)} of {len(runs)} | {spread(reached_runs, '.1f')} | "
              f"{', '.join(map(str, steps))} | {speedups} |")


if __name__ == "__main__":
    main()
