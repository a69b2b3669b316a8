"""Parameter-efficient tuning (PET) modules for a frozen timm ``VisionTransformer``, built on the
model's own blocks so its weights stay shared (the prompt counterpart is ``vit_prompts``):

- ``Adapter``: a bottleneck MLP x -> s * up(act(down(x))), the up-projection zero-initialised so a
  new adapter starts as the identity of the frozen model (AdaptFormer, Chen et al. 2022; the
  "lora" init of the APER/EASE code: down kaiming-uniform, up and biases zero);
- ``adapted_blocks``: every block with optional parallel adapters beside its MLP (AdaptFormer's
  ``ffn_option="parallel"``: x + MLP(LN(x)) + adapter(x), the adapter reading the residual stream)
  and/or beside its attention (LAE's attention adapter: x + Attn(LN(x)) + adapter(LN(x)));
- ``AdaptedViT``: the [CLS] feature of the frozen ViT with one fixed set of adapters and/or VPT
  prompt tokens, an ``out_dim`` feature extractor that ``FrozenFeatures`` can cache once trained;
- ``layer_range``: a method's "first-last" block range hyperparameter, checked against the depth.
- ``SSFViT``: the ViT tuned by scaling and shifting its features (SSF) after each operation.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..hparams import HParamError
from .vit_prompts import embed, insert_prompts


def layer_range(spec: str, depth: int, method: str, name: str = "layers") -> list[int]:
    """'a-b' (inclusive) -> [a .. b], checked against the ViT's depth."""
    try:
        lo, hi = (int(v) for v in spec.split("-"))
    except ValueError:
        raise HParamError(f"method {method!r}: {name}={spec!r} must look like 'first-last', e.g. '0-4'") from None
    if not 0 <= lo <= hi < depth:
        raise HParamError(f"method {method!r}: {name}={spec!r} is outside the ViT's blocks 0-{depth - 1}; "
                          f"choose e.g. {name}='0-{min(4, depth - 1)}'")
    return list(range(lo, hi + 1))


class Adapter(nn.Module):
    """Bottleneck adapter; ``scale`` None = a learnable scalar initialised at 1 (LAE's Scaler)."""

    def __init__(self, dim: int, bottleneck: int, scale: float | None = 0.1, dropout: float = 0.0,
                 activation: type[nn.Module] = nn.ReLU):
        super().__init__()
        self.down = nn.Linear(dim, bottleneck)
        self.act = activation()
        self.up = nn.Linear(bottleneck, dim)
        self.dropout = dropout
        if scale is None:
            self.scale = nn.Parameter(torch.ones(()))
        else:
            self.register_buffer("scale", torch.tensor(float(scale)), persistent=False)
        with torch.no_grad():
            nn.init.kaiming_uniform_(self.down.weight, a=math.sqrt(5))
            nn.init.zeros_(self.down.bias)
            nn.init.zeros_(self.up.weight)
            nn.init.zeros_(self.up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.dropout(self.act(self.down(x)), self.dropout, self.training)
        return self.up(h) * self.scale


def adapter_set(depth: int, dim: int, bottleneck: int, **options) -> nn.ModuleList:
    """One adapter per block."""
    return nn.ModuleList(Adapter(dim, bottleneck, **options) for _ in range(depth))


def adapted_block(block: nn.Module, x: torch.Tensor, ffn: nn.Module | None = None,
                  attn: nn.Module | None = None) -> torch.Tensor:
    """timm ``Block.forward`` with a parallel adapter beside the MLP and/or beside the attention."""
    if ffn is None and attn is None:
        return block(x)
    h = block.norm1(x)
    a = block.attn(h)
    if attn is not None:
        a = a + attn(h)
    x = x + block.drop_path1(block.ls1(a))
    out = x + block.drop_path2(block.ls2(block.mlp(block.norm2(x))))
    return out + ffn(x) if ffn is not None else out


def adapted_blocks(vit: nn.Module, tokens: torch.Tensor, ffn: nn.ModuleList | None = None,
                   attn: dict[int, nn.Module] | None = None, deep_prompts: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """Every block with its adapters (``ffn[i]``, ``attn[i]`` where given) and, for deep VPT,
    ``deep_prompts[i]`` (n, D) inserted after [CLS] before block i and dropped after it; final norm."""
    attn = attn or {}
    for i, block in enumerate(vit.blocks):
        if deep_prompts is not None:
            n = deep_prompts.shape[1]
            tokens = insert_prompts(tokens, deep_prompts[i].expand(len(tokens), -1, -1))
        tokens = adapted_block(block, tokens, ffn[i] if ffn is not None else None, attn.get(i))
        if deep_prompts is not None:
            tokens = torch.cat([tokens[:, :1], tokens[:, 1 + n:]], 1)
    return vit.norm(tokens)


class AdaptedViT(nn.Module):
    """Features of a (shared, frozen) ViT with one set of adapters and/or VPT prompts.
    ``vpt``: (depth, n, D) deep prompts (one set per block) or (1, n, D) shallow prompts (inserted
    once at the input and kept through the blocks); prompt outputs never reach the pooled feature."""

    def __init__(self, vit: nn.Module, adapters: nn.ModuleList | None = None, vpt: torch.Tensor | None = None,
                 deep: bool = True):
        super().__init__()
        self.vit = vit
        self.adapters = adapters
        self.vpt = vpt if vpt is None or isinstance(vpt, nn.Parameter) else nn.Parameter(vpt)
        self.deep = deep
        if vpt is not None and deep and len(vpt) != len(vit.blocks):
            raise ValueError(f"deep VPT needs one prompt set per block ({len(vit.blocks)}), got {len(vpt)}")
        self.out_dim = vit.embed_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        vit, tokens = self.vit, embed(self.vit, x)
        deep = self.vpt if self.vpt is not None and self.deep else None
        shallow = self.vpt if self.vpt is not None and not self.deep else None
        if shallow is not None:
            tokens = insert_prompts(tokens, shallow[0].expand(len(x), -1, -1))
        out = adapted_blocks(vit, tokens, self.adapters, deep_prompts=deep)
        if shallow is not None:
            out = torch.cat([out[:, :1], out[:, 1 + shallow.shape[1]:]], 1)
        return vit.forward_head(out, pre_logits=True)


class CosineClassifier(nn.Module):
    """sigma * cos(f, w_c), sigma learnable from 1 (the CosineLinear of the APER/EASE code)."""

    def __init__(self, dim: int, classes: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(classes, dim).uniform_(-1 / math.sqrt(dim), 1 / math.sqrt(dim)))
        self.sigma = nn.Parameter(torch.ones(()))

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return self.sigma * F.normalize(f, dim=1) @ F.normalize(self.weight, dim=1).T


class ScaleShift(nn.Module):
    """SSF's y = γ ⊙ x + β over the last dimension, γ ~ N(1, 0.02²), β ~ N(0, 0.02²) (the code's init)."""

    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.empty(dim).normal_(1.0, 0.02))
        self.shift = nn.Parameter(torch.empty(dim).normal_(0.0, 0.02))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.shift


class SSFViT(nn.Module):
    """Features of a (shared, frozen) ViT tuned by Scaling and Shifting its Features (SSF, Lian et
    al. 2022): a learnable ScaleShift after the patch embedding, after every block's norm1, qkv,
    attention projection, norm2, fc1 and fc2, and after the final norm (the SSF ViT of the
    APER/PILOT code; there the patch-embedding SSF sits after the projection, here after the whole
    embedding, the same when the embedding has no norm)."""

    def __init__(self, vit: nn.Module):
        super().__init__()
        self.vit = vit
        dim = vit.embed_dim
        self.patch = ScaleShift(dim)
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"norm1": ScaleShift(dim), "qkv": ScaleShift(3 * dim), "proj": ScaleShift(dim),
                           "norm2": ScaleShift(dim), "fc1": ScaleShift(b.mlp.fc1.out_features),
                           "fc2": ScaleShift(dim)}) for b in vit.blocks)
        self.norm = ScaleShift(dim)
        self.out_dim = dim

    @staticmethod
    def _attention(attn: nn.Module, x: torch.Tensor, ssf: nn.ModuleDict) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = ssf["qkv"](attn.qkv(x)).reshape(B, N, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = attn.q_norm(q), attn.k_norm(k)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=attn.attn_drop.p if attn.training else 0.0)
        out = getattr(attn, "norm", nn.Identity())(out.transpose(1, 2).reshape(B, N, -1))
        return attn.proj_drop(ssf["proj"](attn.proj(out)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        vit = self.vit
        tokens = vit.norm_pre(vit.patch_drop(vit._pos_embed(self.patch(vit.patch_embed(x)))))
        for block, ssf in zip(vit.blocks, self.blocks):
            tokens = tokens + block.drop_path1(block.ls1(self._attention(block.attn, ssf["norm1"](block.norm1(tokens)), ssf)))
            mlp = block.mlp
            h = mlp.norm(mlp.drop1(mlp.act(ssf["fc1"](mlp.fc1(ssf["norm2"](block.norm2(tokens)))))))
            tokens = tokens + block.drop_path2(block.ls2(mlp.drop2(ssf["fc2"](mlp.fc2(h)))))
        return vit.forward_head(self.norm(vit.norm(tokens)), pre_logits=True)
