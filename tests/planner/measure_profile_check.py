#!/usr/bin/python3
"""ctest: scheduler/planner/tools/measure_profile.py on a real run of
torchvision's resnet18, checked against the model's own parameters, and the
profile it writes used by `cortado plan`. Usage: measure_profile_check.py CORTADO_BIN TOOL"""
import json
import os
import subprocess
import sys
import tempfile

import torchvision

cortado, tool = sys.argv[1], sys.argv[2]
with tempfile.TemporaryDirectory() as d:
    out = os.path.join(d, "r18.json")
    r = subprocess.run([sys.executable, tool, "--model", "resnet18", "--batch", "2",
                        "--image-size", "64", "--iters", "2", "--out", out],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    prof = json.load(open(out))
    assert prof["format"] == "cortado-profile" and prof["model"] == "resnet18", prof.keys()
    assert "measured" in prof["source"], prof["source"]
    want = {n: p.numel() for n, p in torchvision.models.resnet18().named_parameters()}
    got = [t["name"] for t in prof["tensors"]]
    assert sorted(got) == sorted(want), set(got) ^ set(want)
    for t in prof["tensors"]:
        assert t["elements"] == want[t["name"]], t
        assert t["dtype_bytes"] == 4 and t["backward_us"] >= 0, t
    # Gradient-ready order: the classifier first, the stem last.
    assert set(got[:2]) == {"fc.weight", "fc.bias"}, got[:4]
    assert got.index("layer4.1.conv2.weight") < got.index("layer1.0.conv1.weight") < got.index("conv1.weight")
    assert sum(t["backward_us"] for t in prof["tensors"]) > 0 and prof["forward_us"] > 0

    p = subprocess.run([cortado, "plan", "--model", out, "--machines", "2", "--gpus-per-machine", "2"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "model resnet18 (62 tensors" in p.stdout, p.stdout[:400]
    for i, name in enumerate(got):
        assert f"{i:>4}  {name:<44}" in p.stdout, name

    bad = subprocess.run([sys.executable, tool, "--model", "nonet", "--out", out],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "unknown model 'nonet'" in bad.stderr and "resnet50" in bad.stderr, bad.stderr
print("measure_profile: resnet18 profile matches the model and plans")
