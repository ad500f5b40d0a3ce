#!/usr/bin/env python3
"""The table of bench/train.sh: one row per configuration (the median round
by total images/sec), with the loss after the run's steps and the ratios
against DDP with Gloo (with --framework tensorflow: against TensorFlow's
MultiWorkerMirroredStrategy), against Horovod with Gloo (where it ran), against
Cortado one gradient at a time, and as a share of the compute bound (the
`compute` configuration: the workers training alone, no communication)
where it ran.

    train_table.py RESULTS [--title T] [--command C] [--configs LIST]
                   [--skipped CONFIG,...=WHY] [--json FILE]

RESULTS holds one JSON object per line: {"config", "round", "wall_s",
"result": the benchmark_synthetic.py --json line of rank 0}.
"""

import argparse
import json
import sys

NAMES = {
    "cortado-fused": "Cortado, {codec}, fused groups of {fusion}",
    "cortado-single": "Cortado, {codec}, one gradient at a time",
    "cortado-search": "Cortado, {codec}, MergeComp's online group search",
    "cortado-none": "Cortado, no compression, fused groups of {fusion}",
    "cortado-engine": "Cortado, {codec}, default path (gradients fused by size, {fusion})",
    "cortado-engine-single": "Cortado, {codec}, default path, one push_pull per gradient",
    "cortado-engine-cb": "Cortado, {codec}, default path ({fusion} groups), cross-barrier",
    "ddp": "DDP with Gloo",
    "compute": "No communication (each worker alone: the compute bound)",
    "horovod": "Horovod with Gloo",
    "horovod-fp16": "Horovod with Gloo, fp16 compression",
    "tf-mwms": "TensorFlow's MultiWorkerMirroredStrategy (ring all-reduce over gRPC)",
}


def human(nbytes):
    if nbytes is None:
        return "the default size"
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("results")
    p.add_argument("--title", default="")
    p.add_argument("--command", default="")
    p.add_argument("--configs", default="")
    p.add_argument("--skipped", action="append", default=[])
    p.add_argument("--json", default=None)
    args = p.parse_args()

    runs = {}
    with open(args.results, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                runs.setdefault(r["config"], []).append(r)
    skipped = {}
    for item in args.skipped:
        configs, _, why = item.partition("=")
        for c in configs.split(","):
            skipped[c] = why
    order = [c for c in args.configs.split(",") if c] or list(runs)

    def median(rs):
        return sorted(rs, key=lambda r: r["result"]["img_sec_total"])[len(rs) // 2]

    med = {c: median(rs) for c, rs in runs.items()}

    def total(c):
        return med[c]["result"]["img_sec_total"] if c in med else None

    # The peer: DDP with Gloo, or TensorFlow's own strategy for the
    # TensorFlow binding's runs (its ratio under peer_key, the other None).
    peer = "ddp" if "ddp" in med or "tf-mwms" not in med else "tf-mwms"
    peer_name, peer_key = {"ddp": ("DDP + Gloo", "vs_ddp"), "tf-mwms": ("TF MWMS", "vs_mwms")}[peer]
    # "One at a time": the executor's where it ran, else the default path's.
    base, single = total(peer), total("cortado-single") or total("cortado-engine-single")
    horovod, bound = total("horovod"), total("compute")
    rows = []
    for c in order:
        if c not in med:
            if c in skipped:
                rows.append({"config": c, "skipped": skipped[c]})
            continue
        r = med[c]["result"]
        name = NAMES.get(c, c).format(codec=r.get("compression"), fusion=human(r.get("fusion_bytes")))
        rows.append({
            "config": c, "name": name, "workers": r["workers"],
            "img_sec_total": r["img_sec_total"], "conf95_total": r["conf95_total"],
            "img_sec_per_worker": r["img_sec_per_worker"], "steps": r["steps"],
            "loss_first": r["loss_first"], "loss_last": r["loss_last"],
            "loss_last_mean": r["loss_last_mean"],
            "vs_ddp": None, "vs_mwms": None,
            peer_key: r["img_sec_total"] / base if base else None,
            "vs_horovod": r["img_sec_total"] / horovod if horovod else None,
            "vs_single": r["img_sec_total"] / single if single else None,
            "of_bound": r["img_sec_total"] / bound if bound else None,
            "all_rounds": [x["result"]["img_sec_total"] for x in runs[c]],
            "wall_s": [x["wall_s"] for x in runs[c]],
        })

    def ratio(x):
        return "-" if x is None else f"{x:.2f}x"

    def share(x):
        return "-" if x is None else f"{100 * x:.0f}%"

    if args.title:
        print(f"{args.title}")
    if args.command:
        print(f"`{args.command}`")
    print()
    steps = sorted({r["steps"] for r in rows if "steps" in r})
    step_text = "/".join(str(s) for s in steps) or "?"
    print(f"| configuration | img/sec total | img/sec per worker | loss after {step_text} steps "
          f"(mean over workers; first step) | vs {peer_name} | vs Horovod + Gloo | vs one at a time "
          f"| of the compute bound | rounds (total img/sec) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "skipped" in r:
            print(f"| {NAMES.get(r['config'], r['config']).format(codec='', fusion='')} "
                  f"| skipped: {r['skipped']} | | | | | | | |")
            continue
        every = ", ".join(f"{x:.1f}" for x in r["all_rounds"])
        print(f"| {r['name']} | {r['img_sec_total']:.1f} +-{r['conf95_total']:.1f} "
              f"| {r['img_sec_per_worker']:.1f} | {r['loss_last_mean']:.4f} ({r['loss_first']:.4f}) "
              f"| {ratio(r[peer_key])} | {ratio(r['vs_horovod'])} | {ratio(r['vs_single'])} "
              f"| {share(r['of_bound'])} "
              f"| {every} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"title": args.title, "command": args.command, "rows": rows,
                       "runs": [x for c in order for x in runs.get(c, [])]}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
