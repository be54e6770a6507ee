"""One process of tests/pytorch/test_compiler_processes_gpu.py: a small model (Linear + GELU,
causal attention, an RMSNorm with its residual (left to Inductor), a head and its loss)
compiled with ``ge2jit.torch.compile``, one training step, then what ge2jit's kernel cache
did in this process, as JSON on stdout: ``{"loss", "misses", "writes", "hits"}``."""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

import ge2jit
import ge2jit.torch as gt

D, HEADS, VOCAB = 256, 4, 1000


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(D, D)
        self.qkv = torch.nn.Linear(D, 3 * D, bias=False)
        self.norm = torch.nn.RMSNorm(D, eps=1e-6)
        self.head = torch.nn.Linear(D, VOCAB, bias=False)

    def forward(self, x, targets):
        b, s, _ = x.shape
        h = F.gelu(self.up(x), approximate="tanh")
        q, k, v = self.qkv(h).view(b, s, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = self.norm(h + o.transpose(1, 2).reshape(b, s, D))
        return F.cross_entropy(self.head(h).float().view(-1, VOCAB), targets.view(-1))


def main() -> None:
    torch.manual_seed(0)
    model = Tiny().cuda().bfloat16()
    x = torch.randn(2, 128, D, device="cuda", dtype=torch.bfloat16)
    targets = torch.randint(0, VOCAB, (2, 128), device="cuda")
    loss = gt.compile(model, fullgraph=True)(x, targets)
    loss.backward()
    torch.cuda.synchronize()
    info = ge2jit.cache_info()
    fused = sorted(op.split("(")[0] for r in gt.compiler.reports for _, _, op in r.fused)
    print(json.dumps({"loss": loss.item(), "misses": info["process_misses"],
                      "writes": info["process_writes"], "hits": info["process_hits"],
                      "fused": fused}))


if __name__ == "__main__":
    main()
