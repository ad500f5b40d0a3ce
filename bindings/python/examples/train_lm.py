#!/usr/bin/env python3
"""Train a word-level language model on the King James Bible with Cortado.

    cortado launch -w 4 -s 2 -- /usr/bin/python3 bindings/python/examples/train_lm.py

The corpus is Debian's bible-kjv (scripts/install_deps.sh installs it; its
`bible` program prints the text), so this runs offline. It is split by
chapter: every 20th chapter (the 8th, 28th, ...) is held out for
validation, the rest is training text, so the split is the same on every
machine. Words are lowercased; punctuation marks are tokens of their own
and every verse ends with <eos>. The vocabulary is the training text's
--vocab most frequent tokens (ties in alphabetical order), the others
become <unk>.

The model is a feedforward n-gram language model: the embeddings of the
--context previous tokens, concatenated, a tanh layer of --hidden units
and a softmax over the vocabulary. At the defaults it has 2,635,664
parameters (10.5 MB of gradients a step), nearly all of them in the input
embedding (no compute but a lookup; its gradient has non-zeros only in the
rows of the step's context words) and the softmax: with few examples a
step, the bytes a step moves weigh against its compute on a slow link.

Each worker draws its --batch-size examples a step from its own contiguous
share of the training text. Rank 0 measures the validation perplexity (on
the first --val-tokens held-out tokens) every --eval-every steps and at the
end, off the training clock, and prints a line for each; every worker
marks those pauses with optimizer.exclude_pause(), so that GraVAC's
controller does not count them as step time. --json writes the
run's record (as train_digits.py's: step times, evaluations, the bytes
pushed, GraVAC's history) for bench/gravac_table.py --workload lm.

The three lines a Horovod/BytePS user changes are marked "Cortado:".
"""

import argparse
import collections
import json
import math
import os
import re
import shutil
import subprocess
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import cortado.torch as ct
from cortado.compression import dgc_momentum

# Every verse of the King James Bible, as bible-kjv's `bible` names them.
ALL_VERSES = "gen1:1-rev22:21"
VALIDATION_EVERY = 20   # every 20th chapter is validation text ...
VALIDATION_OFFSET = 7   # ... starting at the 8th (index 7)
UNK, EOS = "<unk>", "<eos>"
TOKEN = re.compile(r"[a-z]+|[^\sa-z]")


class NgramLM(nn.Module):
    """The embeddings of `context` tokens, concatenated -> tanh(hidden) -> logits
    over the vocabulary."""

    def __init__(self, vocab, context, embed, hidden):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.hidden = nn.Linear(context * embed, hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(self.embed(x).flatten(1))))


def int_at_least(minimum, bound):
    """An argparse type: a whole number of at least `minimum` (`bound` says
    so in the error)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value
    return parse


positive_int = int_at_least(1, "at least 1")
whole_number = int_at_least(0, "0 or more")


def positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=positive_int, default=300,
                   help="training steps (default %(default)s); the learning rate decays to 0 over them")
    p.add_argument("--batch-size", type=positive_int, default=32, help="examples per worker per step")
    p.add_argument("--vocab", type=int_at_least(2, "at least 2"), default=10000,
                   help="vocabulary size, <unk> included (default %(default)s)")
    p.add_argument("--context", type=positive_int, default=4, help="tokens of context (default %(default)s)")
    p.add_argument("--embed", type=positive_int, default=128, help="embedding width (default %(default)s)")
    p.add_argument("--hidden", type=positive_int, default=128, help="hidden units (default %(default)s)")
    p.add_argument("--lr", type=positive_float, default=0.05,
                   help="per worker; scaled by the worker count, then decayed (cosine) to 0")
    p.add_argument("--momentum", type=float, default=None,
                   help="SGD's momentum (default 0.9; 0 with DGC, whose momentum correction "
                        "takes its place)")
    p.add_argument("--compression", default="none",
                   help="none, fp16, an engine codec (topk:ratio=0.01, dgc, ...), or gravac "
                        "(adaptive ratio; settings as gravac:codec=topk,window=100)")
    p.add_argument("--executor", action="store_true",
                   help="run the gradients through the plan executor (executor=True)")
    p.add_argument("--fusion-bytes", type=whole_number,
                   help="DistributedOptimizer's fusion_bytes (default: the optimizer's)")
    p.add_argument("--seed", type=int, default=0, help="initial weights and the batches drawn")
    p.add_argument("--eval-every", type=whole_number, default=25, metavar="K",
                   help="validation perplexity every K steps (rank 0, off the training clock; "
                        "0: only at the end)")
    p.add_argument("--val-tokens", type=positive_int, default=4096,
                   help="held-out tokens evaluated (the first of the validation text; "
                        "default %(default)s)")
    p.add_argument("--max-train-tokens", type=whole_number, default=0,
                   help="use only the first N training tokens (0: all; for quick tests)")
    p.add_argument("--json", help="rank 0 writes the run's record to this file")
    return p.parse_args(argv)


def read_corpus():
    """The KJV as chapters, each a list of verses (strings), from bible-kjv's
    `bible` program. Raises RuntimeError naming the package if it is missing."""
    program = shutil.which("bible")
    if program is None:
        raise RuntimeError("train_lm.py: the corpus comes from Debian's bible-kjv package "
                           "(its `bible` program), which is not installed: run "
                           "scripts/install_deps.sh or `apt-get install bible-kjv`")
    text = subprocess.run([program, "-l", "100000", ALL_VERSES], capture_output=True,
                          text=True, check=True).stdout
    chapters = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():  # "Genesis 1": a chapter begins
            chapters.append([])
            continue
        number, _, verse = line.strip().partition(" ")
        if not number.isdigit() or not chapters:
            raise RuntimeError(f"train_lm.py: unexpected line from `bible`: {line[:80]!r}")
        chapters[-1].append(verse)
    if len(chapters) != 1189:
        raise RuntimeError(f"train_lm.py: `bible` gave {len(chapters)} chapters, not the "
                           f"KJV's 1189")
    return chapters


def tokens_of(chapters):
    out = []
    for verse in (v for c in chapters for v in c):
        out.extend(TOKEN.findall(verse.lower()))
        out.append(EOS)
    return out


def load(vocab_size):
    """(train ids, validation ids, vocabulary): the chapters split by index,
    the vocabulary from the training text alone."""
    chapters = read_corpus()
    val = [c for i, c in enumerate(chapters) if i % VALIDATION_EVERY == VALIDATION_OFFSET]
    train = [c for i, c in enumerate(chapters) if i % VALIDATION_EVERY != VALIDATION_OFFSET]
    train_tokens, val_tokens = tokens_of(train), tokens_of(val)
    counts = collections.Counter(train_tokens)
    counts.pop(UNK, None)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    vocab = [UNK] + [w for w, _ in ranked[:vocab_size - 1]]
    index = {w: i for i, w in enumerate(vocab)}
    def ids(tokens):
        return torch.tensor([index.get(t, 0) for t in tokens], dtype=torch.int64)
    return ids(train_tokens), ids(val_tokens), vocab


def examples(stream, context, positions):
    """(contexts, targets) for the given target positions (each >= context)."""
    offsets = torch.arange(-context, 0)
    return stream[positions.unsqueeze(1) + offsets], stream[positions]


def main():
    args = parse_args()
    compression = ct.Compression.lookup(args.compression)  # a bad name fails before the job
    try:
        train_ids, val_ids, vocab = load(args.vocab)
    except RuntimeError as e:
        raise SystemExit(str(e)) from None
    if args.max_train_tokens:
        train_ids = train_ids[:args.max_train_tokens]
    ct.init()                                                            # Cortado: 1
    rank, size = ct.rank(), ct.size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // ct.local_size()))
    torch.manual_seed(args.seed)

    # Each worker's contiguous share of the training text; the first
    # `context` tokens of a share are only context.
    share = len(train_ids) // size
    if share <= args.context:
        raise SystemExit(f"train_lm.py: {len(train_ids)} training tokens leave {share} per "
                         f"worker, not more than --context {args.context}")
    mine = train_ids[rank * share:(rank + 1) * share]
    val_ids = val_ids[:args.val_tokens + args.context]
    val_x, val_y = examples(val_ids, args.context, torch.arange(args.context, len(val_ids)))

    model = NgramLM(len(vocab), args.context, args.embed, args.hidden)
    parameters = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(f"model: {args.context}-token context, vocabulary {len(vocab)}, embedding "
              f"{args.embed}, hidden {args.hidden}: {parameters} parameters; "
              f"{len(train_ids)} training tokens, {len(val_y)} validation tokens", flush=True)
    momentum = args.momentum
    if momentum is None:
        momentum = 0.0 if dgc_momentum(compression) > 0 else 0.9
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=momentum)
    optimizer = ct.DistributedOptimizer(optimizer, model.named_parameters(),  # Cortado: 2
                                        compression=compression,
                                        executor=args.executor,
                                        fusion_bytes=args.fusion_bytes)
    ct.broadcast_parameters(model.state_dict(), root_rank=0)                 # Cortado: 3
    ct.broadcast_optimizer_state(optimizer, root_rank=0)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)

    record = {"workload": "lm", "compression": args.compression, "workers": size,
              "model": "ngram", "parameters": parameters, "vocab": len(vocab),
              "steps": args.steps, "eval_every": args.eval_every, "evals": [],
              "step_seconds": []}
    began = time.monotonic()
    paused = 0.0  # evaluation time, left out of every time reported

    def clock():
        return time.monotonic() - began - paused

    def validation_ppl():
        """Rank 0's perplexity on the validation tokens, off the training clock.
        Every worker holds the same model after a step, so one worker's
        evaluation is the job's (the others wait in their next push_pull)."""
        nonlocal paused
        t0 = time.monotonic()
        model.eval()
        nll = 0.0
        with torch.no_grad():
            for i in range(0, len(val_y), 2048):
                nll += F.cross_entropy(model(val_x[i:i + 2048]), val_y[i:i + 2048],
                                       reduction="sum").item()
        model.train()
        paused += time.monotonic() - t0
        return math.exp(nll / len(val_y))

    draw = torch.Generator().manual_seed(args.seed * 1000 + rank)
    pushed_at_start = ct.pushed_bytes()
    recent = []  # the training loss of the steps since the last evaluation
    model.train()
    for step in range(1, args.steps + 1):
        step_start = time.monotonic()
        x, y = examples(mine, args.context,
                        torch.randint(args.context, len(mine), (args.batch_size,), generator=draw))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        schedule.step()
        record["step_seconds"].append(time.monotonic() - step_start)
        recent.append(loss.item())
        evaluating = (args.eval_every and step % args.eval_every == 0) or step == args.steps
        if evaluating:
            # Rank 0 evaluates, the others wait for it in their next
            # push_pull: GraVAC's controller leaves that time out of the next
            # step's (optimizer.exclude_pause; one worker's mark would do).
            optimizer.exclude_pause()
        if rank == 0 and evaluating:
            ppl = validation_ppl()
            train_loss = sum(recent) / len(recent)
            recent = []
            record["evals"].append({"step": step, "val_ppl": ppl, "train_loss": train_loss,
                                    "seconds": clock()})
            ratios = optimizer.compression_ratio_history  # GraVAC: the ratio of every step
            cf = f"  CF {ratios[-1]:g}x" if ratios else ""
            print(f"step {step}/{args.steps}  train-loss {train_loss:.4f}  val-ppl {ppl:.2f}  "
                  f"({clock():.1f} s){cf}", flush=True)
    # The bytes this worker pushed for the gradients (as sent), without the
    # broadcasts above.
    pushed = ct.pushed_bytes() - pushed_at_start
    if rank == 0:
        last = record["evals"][-1]
        record["final"] = {"val_ppl": last["val_ppl"], "seconds": clock(), "pushed": pushed}
        print(f"final val-ppl {last['val_ppl']:.2f}  pushed {pushed / 1e6:.2f} MB  "
              f"({clock():.1f} s, {size} workers)", flush=True)
        if args.json:
            record["history"] = optimizer.gravac_history
            with open(args.json, "w") as f:
                json.dump(record, f)
    ct.shutdown()


if __name__ == "__main__":
    main()
