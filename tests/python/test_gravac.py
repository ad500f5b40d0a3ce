"""Compression.gravac: workers agree on one ratio per step (a job through
`cortado launch`, against a replay of the whole job in each worker), and
bad settings are refused with a message that names them; bench/gravac_table.py
reads each configuration's path and learning rate and counts what was pushed
by the target."""

import argparse

import pytest

import cortado
from cortado import Compression


def test_workers_with_different_gradients_take_one_ratio_sequence(run_job):
    # 4 KiB chunks: the larger weights' top-k payloads go through Zen, the
    # smaller tensors' travel as the engine's top-k codec; both are checked,
    # and every step pushes at most its messages' bytes.
    job = run_job(3, 1, "gravac_check.py", timeout=240,
                  env={"CORTADO_PARTITION_BYTES": "4K"})
    results = job.results()
    assert job.returncode == 0 and sorted(results) == [0, 1, 2], job.describe()
    for rank, r in results.items():
        assert r["ok"], (rank, r["report"], job.describe())
    for codec in ("topk", "dgc", "randomk"):
        sequences = {rank: tuple(r["report"][codec]["ratios"]) for rank, r in results.items()}
        assert len(set(sequences.values())) == 1, (codec, sequences)
        # One worker marked a pause: every worker left that step's time out.
        seconds = {rank: tuple(r["report"][codec]["seconds"]) for rank, r in results.items()}
        assert len(set(seconds.values())) == 1, (codec, seconds)
        # Compressed levels were used and the ratio moved.
        assert len(set(sequences[0])) >= 2 and max(sequences[0]) > 1, (codec, sequences[0])
    print({c: results[0]["report"][c]["ratios"] for c in ("topk", "dgc", "randomk")})


@pytest.mark.parametrize("kwargs, needle", [
    (dict(min_ratio=100, max_ratio=10), "out of order"),
    (dict(epsilon=0), "epsilon is 0"),
    (dict(epsilon=1.5), "epsilon is 1.5"),
    (dict(omega=1.0), "omega"),
    (dict(min_ratio=0.5), "min_ratio is 0.5"),
    (dict(window=0), "window"),
    (dict(policy="linear"), "policy 'linear'"),
    (dict(codec="qsgd"), "codec 'qsgd'"),
])
def test_bad_settings_are_refused(kwargs, needle):
    with pytest.raises(cortado.CortadoError) as e:
        Compression.gravac(**kwargs)
    assert needle in str(e.value)
    assert e.value.code == "invalid_argument"


def test_the_planner_replans_in_the_executor(run_job):
    # replan="planner": the plan at every ratio that moved 2x is the Espresso
    # planner's (push/pull options on a profile of the parameters); every
    # worker runs the same plans, switches at the same steps and ends equal.
    job = run_job(2, 1, "gravac_planner_check.py", timeout=240)
    results = job.results()
    assert job.returncode == 0 and sorted(results) == [0, 1], job.describe()
    r0, r1 = results[0], results[1]
    assert "Espresso planner" in r0["replanner"], r0["replanner"]
    assert not r0["problems"] and not r1["problems"], (r0["problems"], r1["problems"])
    assert r0["ratios"] == r1["ratios"] and len(set(r0["ratios"])) >= 2, (r0["ratios"], r1["ratios"])
    assert r0["replans"] == r1["replans"] and r0["replans"] >= 2, (r0["replans"], r0["ratios"])
    assert r0["plan"] == r1["plan"] and r0["plan_cf"] == r1["plan_cf"]
    for a, b in zip(r0["params"], r1["params"]):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5, (a, b)
    print(r0["ratios"], r0["replans"], r0["plan_cf"])


def test_replan_setting():
    assert Compression.gravac().replan == "keep"
    assert Compression.lookup("gravac:codec=topk,replan=planner,inter=25gbit").replan == "planner"
    with pytest.raises(cortado.CortadoError) as e:
        Compression.gravac(replan="often")
    assert "replan 'often'" in str(e.value) and e.value.code == "invalid_argument"


def test_lookup_reads_settings():
    c = Compression.lookup("gravac:codec=topk,min_ratio=5,max_ratio=500,window=20")
    assert c.settings["codec"] == "topk" and c.settings["window"] == 20
    assert c.settings["min_ratio"] == 5.0 and c.settings["max_ratio"] == 500.0
    assert Compression.lookup("gravac").settings["codec"] == "dgc"
    for bad in ("gravac:window", "gravac:window=x", "gravac:speed=3"):
        with pytest.raises(cortado.CortadoError):
            Compression.lookup(bad)


def test_core_decides_alike_from_the_same_sums():
    # Two cores, different gradients, the same summed energies: one decision.
    import numpy as np
    a = Compression.gravac(codec="topk", window=2, min_ratio=4, max_ratio=64, epsilon=0.3).make(2)
    b = Compression.gravac(codec="topk", window=2, min_ratio=4, max_ratio=64, epsilon=0.3).make(2)
    rng = np.random.default_rng(0)
    seen = set()
    for step in range(8):
        ga = rng.standard_normal(1000).astype(np.float32)
        gb = (3 * rng.standard_normal(1000)).astype(np.float32)
        a.prepare(0, ga.ctypes.data, ga.size, step)
        b.prepare(0, gb.ctypes.data, gb.size, step)
        sums = [x + y for x, y in zip(a.local_sums(), b.local_sums())]
        da, db = a.decide(*sums, 0.1), b.decide(*sums, 0.1)
        assert da == db
        seen.add(da["ratio"])
        assert a.message_bytes(0) == b.message_bytes(0)
    assert len(seen) >= 2, seen


def test_plan_executor_runs_gravac_as_a_replay_does(run_job):
    # DistributedOptimizer(executor=True): the plan executor decides (one
    # ratio per step for every worker), re-plans when the ratio moves 2x,
    # and its results match a plain-loop replay of the job in each worker.
    job = run_job(3, 1, "gravac_exec_check.py", timeout=240)
    results = job.results()
    assert job.returncode == 0 and sorted(results) == [0, 1, 2], job.describe()
    for rank, r in results.items():
        assert r["ok"], (rank, r, job.describe())
    sequences = {rank: tuple(r["ratios"]) for rank, r in results.items()}
    assert len(set(sequences.values())) == 1, sequences
    assert len({tuple(r["seconds"]) for r in results.values()}) == 1, results
    assert all(r["untimed"] == results[0]["untimed"] for r in results.values()), results
    assert all(r["refused"] for r in results.values()), results
    print(results[0]["ratios"], results[0]["replans"], results[0]["max_param_diff"])



def test_the_executor_traces_gravac_stages(run_job, tmp_path):
    # cortado launch --trace DIR with executor=True: every worker writes its
    # executor's stages, GraVAC's own among them, once per step; the count is
    # the example's step count (2 workers: 719 training samples each, batch
    # 16, 45 steps an epoch).
    import json
    import pathlib
    trace = tmp_path / "trace"
    example = pathlib.Path(__file__).resolve().parents[2] / "bindings" / "python" / "examples" \
        / "train_digits.py"
    job = run_job(2, 1, example, "--epochs", "1", "--no-progress", "--model", "mlp",
                  "--hidden", 300, "--compression", "gravac:codec=topk,window=10,epsilon=0.3",
                  "--executor", timeout=180, out_arg=False, launch_args=("--trace", trace))
    assert job.returncode == 0, job.describe()
    for rank in (0, 1):
        events = json.loads((trace / f"worker-{rank}.json").read_text())
        events = events["traceEvents"] if isinstance(events, dict) else events
        stages = {}
        for e in events:
            if e.get("ph") == "X":
                stages.setdefault(e["cat"], set()).add(e["args"]["iteration"])
        assert stages.get("gravac encode") == set(range(45)), (rank, sorted(stages))
        assert stages.get("gravac agree") == set(range(45)), (rank, sorted(stages))
        # Sparse steps run the plan with GraVAC's message as its payload and
        # its push/pull; no codec encodes what GraVAC already selected.
        assert "gravac payload" in stages and any(s.startswith("inter push") for s in stages), \
            sorted(stages)
        assert "encode" not in stages, sorted(stages)


@pytest.mark.skipif(not cortado._C.built_with_mpi, reason="this build has no MPI")
def test_executor_batches_are_whole_iterations_under_mpirun(run_job):
    # Under mpirun the workers agree on each batch; with random sleeps
    # between the submissions, a worker drains while a peer has queued only
    # part of the iteration, and the batch must still be the whole iteration.
    # One worker a machine: the message is the plan's payload, summed exactly.
    job = run_job(3, 1, "gravac_mpi_check.py", timeout=180, launch_args=("--mpi",),
                  env={"CORTADO_FAKE_HOST_SIZE": "1"})
    results = job.results()
    assert job.returncode == 0 and sorted(results) == [0, 1, 2], job.describe()
    for rank, r in results.items():
        assert r["ok"], (rank, r, job.describe())
    assert len({tuple(r["ratios"]) for r in results.values()}) == 1, results



def _gravac_table():
    import importlib
    import pathlib
    import sys
    bench = str(pathlib.Path(__file__).resolve().parents[2] / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    return importlib.import_module("gravac_table")


def test_the_table_tool_reads_each_configs_path_and_learning_rate():
    t = _gravac_table()
    assert t.split_config("topk:ratio=0.1", None) == ("topk:ratio=0.1", False, None)
    assert t.split_config("dgc:ratio=0.1@lr=0.1", 0.025) == ("dgc:ratio=0.1", False, 0.1)
    assert t.split_config("gravac:codec=dgc,epsilon=0.6@executor,lr=0.2", None) == \
        ("gravac:codec=dgc,epsilon=0.6", True, 0.2)
    assert t.split_config("none@executor", 0.05) == ("none", True, 0.05)
    for bad, needle in (("dgc@foo", "'foo' in config 'dgc@foo' is unknown"),
                        ("dgc@lr=x", "must be a positive number"),
                        ("dgc@lr=-1", "must be a positive number")):
        with pytest.raises(SystemExit, match=needle):
            t.split_config(bad, None)


def test_the_table_tool_counts_what_was_pushed_by_the_target():
    t = _gravac_table()
    # GraVAC: its per-step bytes, summed by hand; static: the run's mean per step.
    gravac = {"history": [{"bytes": b, "ratio": r} for b, r in
                          ((900, 10.0), (450, 20.0), (7000, 1.0), (450, 20.0))],
              "step_seconds": [0.1] * 4, "epochs": [{"pushed": 8800}]}
    assert t.pushed_to(gravac, 3) == pytest.approx((900 + 450 + 7000) / 1e6)
    static = {"step_seconds": [0.1] * 8, "epochs": [{"pushed": 8000}]}
    assert t.pushed_to(static, 2) == pytest.approx(2000 / 1e6)
    assert t.cf_runs([10.0] * 3 + [20.0]) == "10x 3, 20x 1"
    switching = [10.0, 20.0, 10.0, 1.0, 20.0, 10.0, 20.0, 20.0]
    assert t.cf_runs(switching) == \
        "10x 1, 20x 1, 10x 1, ... (7 runs; in all dense 1, 10x 3, 20x 4)"


def test_the_table_tool_reads_the_language_models_records():
    # --workload lm: the target is a perplexity, reached at the first
    # evaluation at or below it; the final row comes from the record's "final".
    t = _gravac_table()
    run = {"workload": "lm", "step_seconds": [0.2] * 300,
           "evals": [{"step": s, "val_ppl": p, "seconds": s * 0.2} for s, p in
                     ((100, 210.0), (200, 150.0), (300, 139.5))],
           "final": {"val_ppl": 139.5, "seconds": 61.0, "pushed": 3000}}
    assert t.reach(run, 150.0) == (40.0, 200)
    assert t.reach(run, 139.5) == (60.0, 300)
    assert t.reach(run, 139.0) is None
    assert t.final(run) == {"metric": 139.5, "pushed": 3000, "seconds": 61.0}
    assert t.pushed_to(run, 100) == pytest.approx(1000 / 1e6)
    digits = {"epochs": [{"epoch": 1, "test_acc": 0.9, "pushed": 10, "seconds": 1.0}],
              "step_seconds": [0.1]}
    assert t.final(digits) == {"metric": 0.9, "pushed": 10, "seconds": 1.0}
    assert t.reach(digits, 0.95) is None and t.reach(digits, 0.9) == (1.0, 1)


def test_the_table_tool_takes_means_over_seeds(capsys):
    # Two seeds of dense, a static ratio and GraVAC, with numbers chosen so that
    # every mean, spread and ratio can be worked out by hand.
    t = _gravac_table()

    def run(config, seed, ppls, seconds, pushed):
        return {"workload": "lm", "config": config, "seed": seed, "step_seconds": [0.1] * 100,
                "evals": [{"step": 50 * (i + 1), "val_ppl": p, "seconds": s}
                          for i, (p, s) in enumerate(zip(ppls, seconds))],
                "final": {"val_ppl": ppls[-1], "seconds": seconds[-1], "pushed": pushed}}

    records = [run("none", 1, (150.0, 99.0), (20.0, 40.0), 1000e6),
               run("topk:ratio=0.01", 1, (160.0, 104.0), (10.0, 20.0), 10e6),
               run("gravac:codec=topk", 1, (140.0, 100.0), (5.0, 12.0), 80e6),
               run("none", 2, (150.0, 101.0), (22.0, 44.0), 1000e6),
               run("topk:ratio=0.01", 2, (160.0, 110.0), (11.0, 22.0), 10e6),
               run("gravac:codec=topk", 2, (102.0, 102.0), (4.0, 9.0), 120e6)]
    args = argparse.Namespace(workload="lm", target=105.0, seeds=[1, 2])
    t.print_means(records, args)
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")
            for line in capsys.readouterr().out.splitlines() if line.startswith("| ")}
    dense, static, gravac = rows["none"], rows["topk:ratio=0.01"], rows["gravac:codec=topk"]
    assert dense[1] == "2 (seeds 1,2)" and dense[2] == "100.00 (99.00-101.00)"
    assert dense[3] == "+0.00%" and dense[5] == "1.0x" and dense[6] == "2 of 2"
    assert dense[7] == "42.0 (40.0-44.0)" and dense[8] == "100"
    # GraVAC: ppl 101 (1% above dense's 100), 100 MB (10x less than 1000), the
    # target at 12 s and 4 s (mean 8, steps 100 and 50).
    assert gravac[2] == "101.00 (100.00-102.00)" and gravac[3] == "+1.00%"
    assert gravac[4] == "100.00 (80.00-120.00)" and gravac[5] == "10.0x"
    assert gravac[7] == "8.0 (4.0-12.0)" and gravac[8] == "50, 100"
    # The static ratio reached 105 only with seed 1 (at 20 s; 110 with seed 2):
    # the speedup is 20 / 12 over that seed alone.
    assert static[3] == "+7.00%" and static[6] == "1 of 2" and static[7] == "20.0"
    assert gravac[9].rstrip(" |") == "topk:ratio=0.01 1.67x (1 of 2 seeds)"
    # Records of two invocations (--from-json a.json,b.json): seed 1's static
    # ratio once more, at 30 s; its time for seed 1 is then the mean, 25 s.
    capsys.readouterr()
    t.print_means(records + [run("topk:ratio=0.01", 1, (160.0, 104.0), (15.0, 30.0), 10e6)], args)
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")
            for line in capsys.readouterr().out.splitlines() if line.startswith("| ")}
    static, gravac = rows["topk:ratio=0.01"], rows["gravac:codec=topk"]
    assert static[1] == "3 (seeds 1,2,1)" and static[6] == "2 of 3"
    assert static[7] == "25.0 (20.0-30.0)"
    assert gravac[9].rstrip(" |") == "topk:ratio=0.01 2.08x (1 of 2 seeds)"
    assert t.spread([1.0, 2.0, 6.0], ".1f") == "3.0 (1.0-6.0)" and t.spread([], ".1f") == ""
    with pytest.raises(argparse.ArgumentTypeError, match="names a seed twice"):
        t.seed_list("1,2,1")
    with pytest.raises(argparse.ArgumentTypeError, match="comma-separated, e.g. 1,2,3"):
        t.seed_list("1;2")
