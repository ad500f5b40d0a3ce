#!/usr/bin/python3
"""Writes the bundled model profiles (../profiles/*.json) for the planner.

Tensors are listed in gradient-ready order (the order the backward pass
produces them: output layers first). Shapes come from the real architectures:
torchvision's VGG16, ResNet50 and ResNet101 and torch.nn's LSTM, instantiated
here; BERT-base and GPT-2 (124M) from their published configurations
(Devlin et al. 2019 / google-research/bert bert_config.json; Radford et al.
2019 / openai gpt-2 hparams.json). Backward times are estimates: 2x the
forward FLOPs of the layer that owns the tensor, on an NVIDIA V100 (15.7
TFLOP/s FP32 peak) at an assumed 40% efficiency, plus 10 us of kernel
launches per layer. Run with Debian's interpreter: /usr/bin/python3 gen_profiles.py
"""
import json
import os

import torch
import torchvision

PEAK_FLOPS = 15.7e12
EFFICIENCY = 0.40
LAUNCH_US = 10.0
GPU = "NVIDIA V100 (15.7 TFLOP/s FP32 peak) at 40% efficiency, 10 us launch per layer"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "profiles")


def us(flops):
    return flops / (PEAK_FLOPS * EFFICIENCY) * 1e6


def write(model, source, layers, batch_note):
    """layers: forward-order list of (param list [(name, numel)], forward FLOPs)."""
    tensors = []
    pending = 0.0  # backward time of parameter-free layers, charged to the next tensor
    forward = 0.0
    for params, flops in reversed(layers):
        forward += us(flops) + LAUNCH_US
        pending += 2 * us(flops) + LAUNCH_US
        # The layer's tensors become ready together, when its backward is done.
        for i, (name, numel) in enumerate(reversed(params)):
            tensors.append({"name": name, "elements": int(numel), "dtype_bytes": 4,
                            "backward_us": round(pending if i == 0 else 0.0, 3)})
            pending = 0.0
    if pending and tensors:
        tensors[-1]["backward_us"] = round(tensors[-1]["backward_us"] + pending, 3)
    doc = {"format": "cortado-profile", "model": model,
           "source": f"{source}; {batch_note}; backward time estimated for {GPU}",
           "forward_us": round(forward, 3), "tensors": tensors}
    with open(os.path.join(OUT, model + ".json"), "w") as f:
        json.dump(doc, f, indent=1)
    total = sum(t["elements"] for t in tensors)
    print(f"{model}: {len(tensors)} tensors, {total / 1e6:.2f} M parameters, "
          f"backward {sum(t['backward_us'] for t in tensors) / 1000:.1f} ms, forward {forward / 1000:.1f} ms")


def torchvision_layers(net, batch):
    """Forward-order leaf modules with their own parameters and FLOPs."""
    layers = []
    names = {m: n for n, m in net.named_modules()}

    def hook(module, inputs, output):
        out = output.numel() * batch
        if isinstance(module, torch.nn.Conv2d):
            k = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
            flops = 2 * k * out
        elif isinstance(module, torch.nn.Linear):
            flops = 2 * module.in_features * out
        else:  # batch norm, activations, pooling: a few passes over the output
            flops = 4 * out
        params = [(f"{names[module]}.{pn}", p.numel())
                  for pn, p in module.named_parameters(recurse=False)]
        layers.append((params, flops))

    handles = [m.register_forward_hook(hook) for m in net.modules() if len(list(m.children())) == 0]
    with torch.no_grad():
        net(torch.zeros(1, 3, 224, 224))
    for h in handles:
        h.remove()
    return layers


def cnn(name, ctor):
    batch = 32
    net = ctor(weights=None).eval()
    layers = torchvision_layers(net, batch)
    n_model = sum(p.numel() for p in net.parameters())
    n_prof = sum(n for ps, _ in layers for _, n in ps)
    assert n_model == n_prof, (name, n_model, n_prof)
    write(name, f"torchvision {torchvision.__version__} {ctor.__name__}", layers,
          f"batch {batch} per GPU, 224x224")


def bert_base():
    # bert_config.json of BERT-Base, Uncased.
    V, H, L, I, P, T = 30522, 768, 12, 3072, 512, 2
    batch, seq = 32, 128
    tok = batch * seq
    lin = lambda i, o: 2 * i * o * tok
    ln = lambda: 5 * H * tok
    layers = [([("bert.embeddings.word_embeddings.weight", V * H),
                ("bert.embeddings.position_embeddings.weight", P * H),
                ("bert.embeddings.token_type_embeddings.weight", T * H)], 3 * H * tok),
              ([("bert.embeddings.LayerNorm.weight", H), ("bert.embeddings.LayerNorm.bias", H)], ln())]
    for l in range(L):
        p = f"bert.encoder.layer.{l}"
        for proj in ("query", "key", "value"):
            layers.append(([(f"{p}.attention.self.{proj}.weight", H * H),
                            (f"{p}.attention.self.{proj}.bias", H)], lin(H, H)))
        layers.append(([], 2 * 2 * seq * seq * H * batch + 5 * 12 * seq * seq * batch))  # scores, softmax
        layers.append(([(f"{p}.attention.output.dense.weight", H * H),
                        (f"{p}.attention.output.dense.bias", H)], lin(H, H)))
        layers.append(([(f"{p}.attention.output.LayerNorm.weight", H),
                        (f"{p}.attention.output.LayerNorm.bias", H)], ln()))
        layers.append(([(f"{p}.intermediate.dense.weight", H * I),
                        (f"{p}.intermediate.dense.bias", I)], lin(H, I)))
        layers.append(([(f"{p}.output.dense.weight", I * H), (f"{p}.output.dense.bias", H)], lin(I, H)))
        layers.append(([(f"{p}.output.LayerNorm.weight", H), (f"{p}.output.LayerNorm.bias", H)], ln()))
    # Pretraining heads; the MLM decoder's weight is tied to the word embeddings,
    # whose gradient is complete only at the end of the backward pass.
    layers.append(([("bert.pooler.dense.weight", H * H), ("bert.pooler.dense.bias", H)], 2 * H * H * batch))
    layers.append(([("cls.seq_relationship.weight", 2 * H), ("cls.seq_relationship.bias", 2)], 4 * H * batch))
    layers.append(([("cls.predictions.transform.dense.weight", H * H),
                    ("cls.predictions.transform.dense.bias", H)], lin(H, H)))
    layers.append(([("cls.predictions.transform.LayerNorm.weight", H),
                    ("cls.predictions.transform.LayerNorm.bias", H)], ln()))
    layers.append(([("cls.predictions.bias", V)], lin(H, V)))
    write("bert-base", "BERT-Base published config (L=12, H=768, A=12, vocab 30522), pretraining heads",
          layers, f"batch {batch} per GPU, sequence {seq}")


def gpt2():
    # hparams.json of the 124M model.
    V, C, E, L = 50257, 1024, 768, 12
    batch, seq = 8, 1024
    tok = batch * seq
    lin = lambda i, o: 2 * i * o * tok
    ln = lambda: 5 * E * tok
    layers = [([("transformer.wte.weight", V * E), ("transformer.wpe.weight", C * E)], 2 * E * tok)]
    for l in range(L):
        p = f"transformer.h.{l}"
        layers.append(([(f"{p}.ln_1.weight", E), (f"{p}.ln_1.bias", E)], ln()))
        layers.append(([(f"{p}.attn.c_attn.weight", E * 3 * E), (f"{p}.attn.c_attn.bias", 3 * E)], lin(E, 3 * E)))
        layers.append(([], 2 * 2 * seq * seq * E * batch + 5 * 12 * seq * seq * batch))
        layers.append(([(f"{p}.attn.c_proj.weight", E * E), (f"{p}.attn.c_proj.bias", E)], lin(E, E)))
        layers.append(([(f"{p}.ln_2.weight", E), (f"{p}.ln_2.bias", E)], ln()))
        layers.append(([(f"{p}.mlp.c_fc.weight", E * 4 * E), (f"{p}.mlp.c_fc.bias", 4 * E)], lin(E, 4 * E)))
        layers.append(([(f"{p}.mlp.c_proj.weight", 4 * E * E), (f"{p}.mlp.c_proj.bias", E)], lin(4 * E, E)))
    layers.append(([("transformer.ln_f.weight", E), ("transformer.ln_f.bias", E)], ln()))
    layers.append(([], lin(E, V)))  # lm_head, tied to wte
    write("gpt2", "GPT-2 124M published hparams (n_layer=12, n_embd=768, n_ctx=1024, vocab 50257), "
          "lm_head tied to wte", layers, f"batch {batch} per GPU, sequence {seq}")


def lstm():
    # PyTorch's word_language_model on WikiText-2: 2-layer LSTM, 1500 units.
    V, H, layers_n = 33278, 1500, 2
    batch, bptt = 20, 35
    tok = batch * bptt
    rnn = torch.nn.LSTM(H, H, layers_n)
    layers = [([("encoder.weight", V * H)], H * tok)]
    for l in range(layers_n):
        params = [(f"rnn.{n}", p.numel()) for n, p in rnn.named_parameters() if n.endswith(f"_l{l}")]
        layers.append((params, 2 * 4 * H * 2 * H * tok))
    layers.append(([("decoder.weight", V * H), ("decoder.bias", V)], 2 * H * V * tok))
    write("lstm", "2-layer LSTM language model (torch.nn.LSTM 1500x1500, vocab 33278, WikiText-2)",
          layers, f"batch {batch} per GPU, bptt {bptt}")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    cnn("vgg16", torchvision.models.vgg16)
    cnn("resnet50", torchvision.models.resnet50)
    cnn("resnet101", torchvision.models.resnet101)
    bert_base()
    gpt2()
    lstm()
