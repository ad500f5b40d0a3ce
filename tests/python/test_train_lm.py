"""bindings/python/examples/train_lm.py: the word-level language model on the
King James Bible (Debian's bible-kjv, which scripts/install_deps.sh
installs). A short job on a slice of the corpus learns (its loss and
perplexity fall, below the uniform model's), its record is what
bench/gravac_table.py --workload lm reads, the split is by chapter and
disjoint, and bad options are refused before any job starts."""

import importlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from conftest import PYTHON, REPO

EXAMPLE = REPO / "bindings" / "python" / "examples" / "train_lm.py"

needs_corpus = pytest.mark.skipif(
    shutil.which("bible") is None,
    reason="the corpus is Debian's bible-kjv package (its `bible` program), which is not "
           "installed here: scripts/install_deps.sh installs it")


def _example_module():
    folder = str(EXAMPLE.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module("train_lm")


@needs_corpus
def test_the_corpus_is_split_by_chapter_into_disjoint_parts():
    lm = _example_module()
    chapters = lm.read_corpus()
    assert len(chapters) == 1189 and len(chapters[0]) == 31  # Genesis 1 has 31 verses
    assert chapters[0][0] == "In the beginning God created the heaven and the earth."
    assert chapters[-1][-1] == "The grace of our Lord Jesus Christ be with you all. Amen."
    train, val, vocab = lm.load(1000)
    # Every 20th chapter from the 8th is validation text: 60 of 1189. Counted
    # here from the verses, with a tokenizer of its own (words and single
    # punctuation marks, one <eos> a verse).
    def count(chs):
        return sum(len("".join(c if c.isalpha() or c.isspace() else f" {c} "
                               for c in v.lower()).split()) + 1 for ch in chs for v in ch)
    held_out = [c for i, c in enumerate(chapters) if i % 20 == 7]
    assert len(held_out) == 60
    assert len(val) == count(held_out)
    assert len(train) == count(chapters) - len(val)
    # The vocabulary: <unk> first, then the training text's most frequent tokens.
    assert len(vocab) == 1000 and vocab[0] == "<unk>" and len(set(vocab)) == 1000
    assert {"the", "and", "lord", "<eos>", ","} <= set(vocab), vocab[:20]
    # Loaded twice, the same ids: the split and the vocabulary do not depend on the run.
    train2, val2, vocab2 = lm.load(1000)
    assert vocab2 == vocab and train2.equal(train) and val2.equal(val)


@needs_corpus
def test_a_short_job_learns_and_writes_the_tables_record(run_job, tmp_path):
    # 2 workers, top-k 10x with error feedback, a 30000-token slice of the
    # training text and a 500-word vocabulary: in 60 steps the training loss
    # and the validation perplexity fall, and the perplexity ends below the
    # uniform model's (the vocabulary size).
    out = tmp_path / "record.json"
    os.chmod(tmp_path, 0o755)
    vocab, context, embed, hidden = 500, 3, 16, 32
    job = run_job(2, 1, EXAMPLE, "--steps", 60, "--eval-every", 20, "--vocab", vocab,
                  "--context", context, "--embed", embed, "--hidden", hidden,
                  "--max-train-tokens", 30000, "--val-tokens", 1000, "--lr", 0.1,
                  "--compression", "topk:ratio=0.1", "--json", out, timeout=240, out_arg=False)
    assert job.returncode == 0, job.describe()
    parameters = vocab * embed + context * embed * hidden + hidden + hidden * vocab + vocab
    assert f": {parameters} parameters;" in job.stdout, job.describe()
    record = json.loads(out.read_text())
    assert record["workload"] == "lm" and record["parameters"] == parameters
    assert [e["step"] for e in record["evals"]] == [20, 40, 60]
    assert len(record["step_seconds"]) == 60
    first, last = record["evals"][0], record["evals"][-1]
    assert last["train_loss"] < first["train_loss"], record["evals"]
    assert last["val_ppl"] < first["val_ppl"] and last["val_ppl"] < vocab, record["evals"]
    assert record["final"]["val_ppl"] == last["val_ppl"] and record["final"]["pushed"] > 0
    times = [e["seconds"] for e in record["evals"]]
    assert times == sorted(times) and record["final"]["seconds"] >= times[-1]
    # One line per evaluation from rank 0.
    lines = [l for l in job.stdout.splitlines() if l.startswith("step ")]
    assert len(lines) == 3 and f"val-ppl {last['val_ppl']:.2f}" in lines[-1], job.describe()


@needs_corpus
def test_the_seed_decides_the_initial_weights_and_the_batches(run_job, tmp_path):
    # bench/gravac_table.py --seeds runs each row once per seed: the same seed
    # must give the same run, another seed another one. 2 dense workers (a sum
    # of two is the same in either order), a slice of the corpus, 10 steps.
    os.chmod(tmp_path, 0o755)

    def perplexities(seed, name):
        out = tmp_path / f"{name}.json"
        job = run_job(2, 1, EXAMPLE, "--steps", 10, "--eval-every", 5, "--vocab", 300,
                      "--context", 2, "--embed", 8, "--hidden", 16,
                      "--max-train-tokens", 20000, "--val-tokens", 500, "--seed", seed,
                      "--json", out, timeout=240, out_arg=False)
        assert job.returncode == 0, job.describe()
        record = json.loads(out.read_text())
        return [(e["step"], e["val_ppl"], e["train_loss"]) for e in record["evals"]]

    first, again, other = perplexities(3, "a"), perplexities(3, "b"), perplexities(4, "c")
    assert [s for s, _, _ in first] == [5, 10]
    assert first == again
    # Another seed: other initial weights (the perplexity after 5 steps) and
    # other batches (the training loss).
    assert all(a[1] != b[1] and a[2] != b[2] for a, b in zip(first, other)), (first, other)


@pytest.mark.parametrize("option, value, needle", [
    ("--steps", "0", "must be at least 1, got 0"),
    ("--vocab", "1", "must be at least 2, got 1"),
    ("--eval-every", "-1", "must be 0 or more, got -1"),
    ("--lr", "0", "must be above 0, got 0"),
    ("--batch-size", "many", "must be a whole number, got 'many'"),
])
def test_bad_options_are_refused_before_a_job(option, value, needle):
    proc = subprocess.run([PYTHON, str(EXAMPLE), option, value],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc
    assert option in proc.stderr and needle in proc.stderr, proc.stderr


def test_without_the_corpus_the_message_names_the_package(tmp_path):
    # PATH without `bible`: the example stops before the job with the
    # package to install, not a traceback.
    env = dict(os.environ, PATH=str(tmp_path), PYTHONPATH=os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([PYTHON, str(EXAMPLE), "--steps", "1"], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode != 0
    assert "bible-kjv" in proc.stderr and "install_deps.sh" in proc.stderr, proc.stderr
