"""Prompted forward passes through a timm ``VisionTransformer``, built on the model's own modules
(``patch_embed``, ``_pos_embed``, ``blocks``, ``norm``) so any timm ViT works and its weights stay
shared. Two ways to prompt (L2P and DualPrompt, Wang et al. 2022):

- prompt tuning: extra tokens inserted after the [CLS] token (``insert_prompts``);
- prefix tuning: per-layer key/value prefixes concatenated to the keys and values of a block's
  self-attention (``forward_blocks(..., prefixes={layer: (B, 2, L, D)})``), the sequence length
  stays the same.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..method import MethodError

_NEEDED = ("patch_embed", "_pos_embed", "blocks", "norm", "cls_token", "forward_head")


def vit_of(backbone: nn.Module, method: str) -> nn.Module:
    """The timm VisionTransformer inside a ``timm`` backbone (or cache wrapper), or a clear error."""
    model = backbone
    for _ in range(3):   # FrozenFeatures.backbone -> TimmBackbone.model -> VisionTransformer
        inner = getattr(model, "backbone", None) or getattr(model, "model", None)
        if all(hasattr(model, a) for a in _NEEDED) or inner is None:
            break
        model = inner
    if not all(hasattr(model, a) for a in _NEEDED) or model.cls_token is None:
        raise MethodError(f"method {method!r} prompts a Vision Transformer and needs backbone = \"timm\" with a ViT "
                          f"with a [CLS] token (e.g. backbone_options = {{ model = \"vit_base_patch16_224\" }}); "
                          f"got {type(model).__name__}")
    return model


def embed(vit: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Tokens entering the first block: patch embedding, [CLS] + position embedding (timm's own)."""
    return vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(x))))


def insert_prompts(tokens: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
    """[CLS], prompts (B, L, D), then the patch tokens (L2P prepends prompts to the patch embeddings)."""
    return torch.cat([tokens[:, :1], prompts, tokens[:, 1:]], dim=1)


def prompt_position(vit: nn.Module) -> torch.Tensor:
    """(1, 1, D): the position embedding the reference L2P adds to every prompt token. Its ViT sizes
    ``pos_embed`` for [CLS] + N·Lp prompts + patches, and loading the pretrained weights copies the
    [CLS] entry to the N·Lp prompt slots (l2p-pytorch ``resize_pos_embed``), so each prompt token
    enters the blocks as p + pos[CLS]. Zero where the ViT gives [CLS] no position embedding."""
    pos = getattr(vit, "pos_embed", None)
    if pos is None or getattr(vit, "no_embed_class", False):
        return torch.zeros(1, 1, vit.embed_dim, device=vit.cls_token.device, dtype=vit.cls_token.dtype)
    return pos[:, :1]


def batchwise_vote(idx: torch.Tensor, pool_size: int) -> torch.Tensor:
    """The official L2P/DualPrompt code's ``batchwise_prompt``: the k = idx.shape[1] prompt ids chosen
    most often over the whole batch (ties to the lower id), given to every sample: (B, k). At test
    time this lets a batch of one task's images vote, which the per-sample rule of the papers cannot."""
    counts = torch.bincount(idx.flatten(), minlength=pool_size)
    major = torch.sort(counts, descending=True, stable=True).indices[: idx.shape[1]]
    return major.expand(len(idx), -1)


def prefix_attention(attn: nn.Module, x: torch.Tensor, prefix: torch.Tensor | None) -> torch.Tensor:
    """timm ``Attention.forward`` with key/value prefixes: prefix (B, 2, L, D) holds p_K and p_V
    (DualPrompt eq. 2: f_prefix(p, h) = MSA(h_Q, [p_K; h_K], [p_V; h_V]))."""
    B, N, C = x.shape
    heads = attn.num_heads
    qkv = attn.qkv(x).reshape(B, N, 3, heads, -1).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    if prefix is not None:
        pk, pv = (prefix[:, i].reshape(B, prefix.shape[2], heads, C // heads).transpose(1, 2) for i in (0, 1))
        k, v = torch.cat([pk.to(k.dtype), k], 2), torch.cat([pv.to(v.dtype), v], 2)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=attn.attn_drop.p if attn.training else 0.0)
    out = out.transpose(1, 2).reshape(B, N, -1)
    out = getattr(attn, "norm", nn.Identity())(out)
    return attn.proj_drop(attn.proj(out))


def block_forward(block: nn.Module, x: torch.Tensor, prefix: torch.Tensor | None = None) -> torch.Tensor:
    """timm ``Block.forward`` (pre-norm, layer scale, drop path) with an optional attention prefix."""
    if prefix is None:
        return block(x)
    x = x + block.drop_path1(block.ls1(prefix_attention(block.attn, block.norm1(x), prefix)))
    return x + block.drop_path2(block.ls2(block.mlp(block.norm2(x))))


def forward_blocks(vit: nn.Module, tokens: torch.Tensor,
                   prefixes: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
    """Every block (with its prefix where given), then the final norm."""
    prefixes = prefixes or {}
    for i, block in enumerate(vit.blocks):
        tokens = block_forward(block, tokens, prefixes.get(i))
    return vit.norm(tokens)
