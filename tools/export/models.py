"""The three graphs of the FLUX.2 [klein] 4B browser pack, built from the upstream model classes.

Everything here is plain PyTorch around the upstream classes:

* text encoder: transformers `Qwen3Model`, wrapped so that it returns the hidden states of the tap
  layers (9, 18, 27 for the real model), stacked, permuted and flattened exactly as diffusers'
  `Flux2KleinPipeline._get_qwen3_prompt_embeds` does (diffusers 0.42.1,
  `pipelines/flux2/pipeline_flux2_klein.py`):

      out = torch.stack([output.hidden_states[k] for k in (9, 18, 27)], dim=1)   # [B, 3, S, H]
      prompt_embeds = out.permute(0, 2, 1, 3).reshape(B, S, 3 * H)              # per token [h9|h18|h27]

  `hidden_states[0]` is the embedding output and `hidden_states[k]` the output of 0-based decoder
  layer k-1, so the graph needs layers 0..26 only; the model is cut to 28 layers as the pack card says
  (layer 27 is dead code and the exporter drops it).
* transformer: diffusers `Flux2Transformer2DModel` with its RoPE computed in float32 (upstream asks
  for float64, which ONNX Runtime Web cannot run) and every LayerNorm evaluated in float32 even when
  the activations are float16 (a float16 LayerNorm overflows on a residual stream saturated at
  +/-65504). `timestep` is sigma in 0..1; the upstream forward multiplies it by 1000 itself.
* VAE decoder: diffusers `AutoencoderKLFlux2` with the pipeline's batch-norm de-normalisation and
  2x2 unpatchify folded in front of `decode`, so it takes the 128-channel packed latent
  [B, 128, h, w] and returns the image [B, 3, 16h, 16w].
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.nn.functional as F
from torch import nn

# --------------------------------------------------------------------------------------------------
# configurations
# --------------------------------------------------------------------------------------------------

# Qwen3-4B, as published in Qwen/Qwen3-4B `config.json` (Qwen3ForCausalLM; the FLUX.2-klein-4B
# repo's `text_encoder/config.json` carries the same numbers: hidden 2560, head_dim 128, bf16).
# Cut to 28 of its 36 layers.
QWEN3_4B = dict(
    vocab_size=151936,
    hidden_size=2560,
    intermediate_size=9728,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    hidden_act="silu",
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    attention_bias=False,
    tie_word_embeddings=True,
    bos_token_id=151643,
    eos_token_id=151645,
)

# FLUX.2 [klein] 4B transformer: black-forest-labs/FLUX.2-klein-4B `transformer/config.json`, as
# diffusers 0.42.1 reads it (`Flux2Transformer2DModel`; block counts as in public FLUX.2 ports such
# as filipstrand/mflux and marcelcotta/iris.c, BFL's `Klein4BParams`). 3.88 B parameters.
KLEIN_4B_TRANSFORMER = dict(
    patch_size=1,
    in_channels=128,
    out_channels=None,
    num_layers=5,
    num_single_layers=20,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=7680,
    timestep_guidance_channels=256,
    mlp_ratio=3.0,
    axes_dims_rope=(32, 32, 32, 32),
    rope_theta=2000,
    eps=1e-6,
    guidance_embeds=False,
)

# FLUX.2 VAE: diffusers `AutoencoderKLFlux2()` defaults, which match the klein repo's
# `vae/config.json` (reference-pipeline.md Part B section 9): latent 32 channels, blocks
# [128, 256, 512, 512], 2 layers per block, GroupNorm 32, batch_norm_eps 1e-4, patch 2x2.
FLUX2_VAE = dict(
    latent_channels=32,
    block_out_channels=(128, 256, 512, 512),
    layers_per_block=2,
    norm_num_groups=32,
    batch_norm_eps=1e-4,
    patch_size=(2, 2),
)


@dataclasses.dataclass
class Config:
    name: str
    text: dict
    text_layers: int          # decoder layers kept (28 of 36 for the real model)
    text_taps: tuple          # hidden_states indices stacked into prompt_embeds
    transformer: dict
    vae: dict
    shard_bytes: int          # largest external-data shard
    vocab_wrap: bool = False  # tiny only: input_ids % vocab, so any Qwen3 id is valid input


FULL = Config(
    name="full",
    text=QWEN3_4B,
    text_layers=28,
    text_taps=(9, 18, 27),
    transformer=KLEIN_4B_TRANSFORMER,
    vae=FLUX2_VAE,
    # Shards stay under 2 GB: one ArrayBuffer cannot reach 2 GiB in Chrome (the pack card).
    shard_bytes=1_800_000_000,
)

# The real I/O widths with very few, very narrow layers. The text width must stay 2560 so that three
# stacked hidden states give the 7680-wide prompt_embeds; heads are made tiny instead. The RoPE axes
# stay 4 x 32 (so head_dim 128, one head). The vocab is cut to 4096 and the graph takes ids modulo
# 4096, so the real tokenizer's ids (< 151936) still work. Small shards make both sharded graphs
# span several files, as the real ones do. The VAE keeps its four blocks (three 2x upsamplers) and its
# mid-block attention with as few channels as GroupNorm allows in groups of 4 (two or four a group): on
# SwiftShader, the browser tests' WebGPU, one decode of a 256x256 image (the smallest size) took 19-20 s
# at twice these widths (16, 16, 32, 32), 7-9 s at these (`cargo xtask bench layout`, NCHW, 2 cores).
TINY = Config(
    name="tiny",
    text=dict(QWEN3_4B, vocab_size=4096, intermediate_size=64, num_attention_heads=2,
              num_key_value_heads=1, head_dim=32, bos_token_id=None, eos_token_id=None),
    text_layers=4,
    text_taps=(1, 2, 3),
    transformer=dict(KLEIN_4B_TRANSFORMER, num_layers=1, num_single_layers=1,
                     num_attention_heads=1, attention_head_dim=128),
    vae=dict(FLUX2_VAE, block_out_channels=(8, 8, 16, 16), layers_per_block=1, norm_num_groups=4),
    shard_bytes=2_000_000,
    vocab_wrap=True,
)

# The tiny configuration with the transformer at its real width (24 heads of 128: 3072), one block of
# each kind: each of its weights the size of the real one (int8 `MatMulNBits` of 9 to 81 MiB, float
# modulations of 113 MB in float16), 0.6 GB in all, so that what a weight's size costs the browser
# (the renderer's memory while ORT uploads it) can be measured on a machine without a GPU.
WIDE = dataclasses.replace(
    TINY,
    name="wide",
    transformer=dict(KLEIN_4B_TRANSFORMER, num_layers=1, num_single_layers=1),
    shard_bytes=FULL.shard_bytes,
)

CONFIGS = {"full": FULL, "tiny": TINY, "wide": WIDE}


# --------------------------------------------------------------------------------------------------
# text encoder
# --------------------------------------------------------------------------------------------------

def qwen3_config(cfg: Config):
    from transformers import Qwen3Config

    c = Qwen3Config(**dict(cfg.text, num_hidden_layers=cfg.text_layers))
    c._attn_implementation = "sdpa"
    return c


def build_text_encoder(cfg: Config, weights: str | None):
    """transformers `Qwen3Model` with `cfg.text_layers` layers, float32, eval mode."""
    from transformers import Qwen3Model

    if weights:
        # diffusers layout: <weights>/text_encoder holds a Qwen3ForCausalLM checkpoint; Qwen3Model
        # loads the `model.` weights of it (base_model_prefix) and the layers past the cut are skipped.
        path = os.path.join(weights, "text_encoder")
        model = Qwen3Model.from_pretrained(path, num_hidden_layers=cfg.text_layers, dtype=torch.float32,
                                           attn_implementation="sdpa")
    else:
        model = Qwen3Model(qwen3_config(cfg))
        # Random weights: transformers initialises the embedding like every Linear (std 0.02), so at
        # init each layer's update is several times larger than the residual stream it is added to
        # (0.02 -> 0.14 -> 0.21 -> 0.26 in the tiny model). A trained Qwen3 is the other way round:
        # its residual stream is large next to any one layer's update, which is why int4 keeps the
        # published encoder at cosine 0.999. Drawing the table with std EMBED_STD gives the random
        # model that property, so the int4 check measures quantisation, not an untrained network.
        with torch.no_grad():
            model.embed_tokens.weight.normal_(0.0, EMBED_STD)
    return model.float().eval()


EMBED_STD = 0.5


class TextEncoder(nn.Module):
    """input_ids, attention_mask [B, S] int64 -> prompt_embeds [B, S, len(taps) * hidden]."""

    def __init__(self, qwen, taps, vocab_wrap):
        super().__init__()
        self.qwen = qwen
        self.taps = tuple(taps)
        self.vocab_wrap = vocab_wrap
        self.embed_f16_bytes = None

    def store_table_as_f16_bytes(self):
        """Keeps the embedding table as the bytes of its float16 values (uint8, [vocab, 2 * hidden],
        little-endian), decoded to the activation dtype after the Gather (float16_bytes_to_float).

        Why, under float32 activations: the full table (151936 x 2560) is 1.56 GB in float32, one tensor
        above the 1 GiB maxBufferSize of SwiftShader and many GPUs, and makes the graph 3.0 GB instead
        of the published 2.2 GB. A float16 table does not run there either: ORT Web's WebGPU Gather
        takes float16 into a shader ("Program Gather requires f16 but the device does not support
        it"); and ORT Web's CPU kernels cast neither int16 nor uint16. A uint8 Gather and Cast run on
        ORT Web's CPU provider; the decode is integer and float32 arithmetic on the gathered rows only.
        """
        w = self.qwen.embed_tokens.weight.detach()
        self.embed_f16_bytes = nn.Parameter(w.to(torch.float16).view(torch.uint8), requires_grad=False)
        self.qwen.embed_tokens = None
        return self

    def forward(self, input_ids, attention_mask):
        q = self.qwen
        if self.vocab_wrap:
            input_ids = torch.remainder(input_ids, q.config.vocab_size)
        if self.embed_f16_bytes is not None:
            h = float16_bytes_to_float(F.embedding(input_ids, self.embed_f16_bytes)).to(q.norm.weight.dtype)
        else:
            h = q.embed_tokens(input_ids)
        s = input_ids.shape[1]
        position_ids = torch.arange(s, device=input_ids.device).unsqueeze(0)
        # The mask transformers' create_causal_mask builds for sdpa: causal, and only real keys;
        # pad queries see the real keys before them (right padding). [B, 1, S, S] bool.
        idx = torch.arange(s, device=input_ids.device)
        causal = idx[None, :] <= idx[:, None]
        mask = causal[None, None, :, :] & attention_mask.bool()[:, None, None, :]
        pe = q.rotary_emb(h, position_ids)
        hidden = [h]
        for layer in q.layers[: max(self.taps)]:
            h = layer(h, attention_mask=mask, position_ids=position_ids, position_embeddings=pe)
            hidden.append(h)
        # diffusers Flux2KleinPipeline._get_qwen3_prompt_embeds: stack on dim 1, permute, flatten
        out = torch.stack([hidden[k] for k in self.taps], dim=1)
        b, c, s_, d = out.shape
        return out.permute(0, 2, 1, 3).reshape(b, s_, c * d)


def float16_bytes_to_float(data):
    """float16 values stored as little-endian bytes (uint8 [..., 2n]) -> float32 [..., n], with integer
    and float32 operations only (no float16 anywhere, no bit casts: ONNX opset 18 has none). Exact for
    finite values."""
    x = data.to(torch.int32).unflatten(-1, (-1, 2))
    bits = x[..., 0] + x[..., 1] * 256
    negative = bits >= 32768
    magnitude = torch.where(negative, bits - 32768, bits)
    exponent = torch.div(magnitude, 1024, rounding_mode="floor")
    mantissa = magnitude - exponent * 1024
    normal = (mantissa + 1024).float() * torch.exp2(exponent.float() - 25.0)
    subnormal = mantissa.float() * (2.0 ** -24)
    value = torch.where(exponent == 0, subnormal, normal)
    return torch.where(negative, -value, value)


def text_encoder_reference(qwen, taps, input_ids, attention_mask, vocab_wrap):
    """The upstream path, for verification: Qwen3Model(output_hidden_states=True) + diffusers' stacking."""
    if vocab_wrap:
        input_ids = torch.remainder(input_ids, qwen.config.vocab_size)
    output = qwen(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                  use_cache=False)
    out = torch.stack([output.hidden_states[k] for k in taps], dim=1)
    batch_size, num_channels, seq_len, hidden_dim = out.shape
    return out.permute(0, 2, 1, 3).reshape(batch_size, seq_len, num_channels * hidden_dim)


# --------------------------------------------------------------------------------------------------
# transformer
# --------------------------------------------------------------------------------------------------

def build_transformer(cfg: Config, weights: str | None):
    from diffusers import Flux2Transformer2DModel

    if weights:
        model = Flux2Transformer2DModel.from_pretrained(os.path.join(weights, "transformer"),
                                                        torch_dtype=torch.float32)
    else:
        model = Flux2Transformer2DModel(**cfg.transformer)
    return model.float().eval()


class Flux2PosEmbedF32(nn.Module):
    """diffusers `Flux2PosEmbed` with its frequencies in float32 instead of float64.

    Upstream computes `freqs` in float64 (`maybe_adjust_dtype_for_device(torch.float64, ...)`), which
    the exporter turns into Cast(to=DOUBLE) nodes that ONNX Runtime Web has no kernel for. Positions
    are small integers (< 2^24) and theta 2000, so float32 gives the same cos/sin to ~1e-6.
    """

    def __init__(self, theta, axes_dim):
        super().__init__()
        self.theta = theta
        self.axes_dim = axes_dim

    def forward(self, ids):
        from diffusers.models.embeddings import get_1d_rotary_pos_embed

        cos_out, sin_out = [], []
        pos = ids.float()
        for i in range(len(self.axes_dim)):
            cos, sin = get_1d_rotary_pos_embed(self.axes_dim[i], pos[..., i], theta=self.theta,
                                               repeat_interleave_real=True, use_real=True,
                                               freqs_dtype=torch.float32)
            cos_out.append(cos)
            sin_out.append(sin)
        return torch.cat(cos_out, dim=-1), torch.cat(sin_out, dim=-1)


class LayerNormF32(nn.LayerNorm):
    """nn.LayerNorm evaluated in float32 whatever the activation dtype; result cast back."""

    def forward(self, x):
        w = self.weight.float() if self.weight is not None else None
        b = self.bias.float() if self.bias is not None else None
        return F.layer_norm(x.float(), self.normalized_shape, w, b, self.eps).to(x.dtype)


def patch_transformer(model, rope_float32=True, layernorm_float32=True):
    """The pack card's changes to the upstream transformer (in place)."""
    if rope_float32:
        old = model.pos_embed
        model.pos_embed = Flux2PosEmbedF32(old.theta, old.axes_dim)
    if layernorm_float32:
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.LayerNorm:
                    new = LayerNormF32(child.normalized_shape, eps=child.eps,
                                       elementwise_affine=child.elementwise_affine,
                                       bias=child.bias is not None)
                    new.load_state_dict(child.state_dict())
                    setattr(parent, name, new)
    return model


class Transformer(nn.Module):
    """hidden_states, encoder_hidden_states, timestep (sigma), img_ids, txt_ids -> noise_pred."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids):
        # Flux2Transformer2DModel.forward does `timestep.to(dtype) * 1000` itself.
        return self.model(hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states,
                          timestep=timestep, img_ids=img_ids, txt_ids=txt_ids, guidance=None,
                          return_dict=False)[0]


# --------------------------------------------------------------------------------------------------
# VAE decoder
# --------------------------------------------------------------------------------------------------

def build_vae(cfg: Config, weights: str | None, seed: int):
    from diffusers import AutoencoderKLFlux2

    if weights:
        vae = AutoencoderKLFlux2.from_pretrained(os.path.join(weights, "vae"), torch_dtype=torch.float32)
    else:
        c = cfg.vae
        n = len(c["block_out_channels"])
        vae = AutoencoderKLFlux2(
            latent_channels=c["latent_channels"], block_out_channels=tuple(c["block_out_channels"]),
            layers_per_block=c["layers_per_block"], norm_num_groups=c["norm_num_groups"],
            batch_norm_eps=c["batch_norm_eps"], patch_size=tuple(c["patch_size"]),
            down_block_types=("DownEncoderBlock2D",) * n, up_block_types=("UpDecoderBlock2D",) * n)
        # Random weights: give the BN statistics non-trivial values so the folding is tested.
        g = torch.Generator().manual_seed(seed + 3)
        with torch.no_grad():
            vae.bn.running_mean.copy_(torch.randn(vae.bn.running_mean.shape, generator=g) * 0.3)
            vae.bn.running_var.copy_(torch.rand(vae.bn.running_var.shape, generator=g) * 1.5 + 0.5)
    return vae.float().eval()


def unpatchify(latents):
    """diffusers Flux2KleinPipeline._unpatchify_latents: [B,128,h,w] -> [B,32,2h,2w], channel c*4+dy*2+dx."""
    batch_size, num_channels_latents, height, width = latents.shape
    latents = latents.reshape(batch_size, num_channels_latents // (2 * 2), 2, 2, height, width)
    latents = latents.permute(0, 1, 4, 2, 5, 3)
    return latents.reshape(batch_size, num_channels_latents // (2 * 2), height * 2, width * 2)


class VaeDecoder(nn.Module):
    """packed_latent [B, 128, h, w] (BN-normalised, patchified) -> sample [B, 3, 16h, 16w]."""

    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    def forward(self, packed_latent):
        # Flux2KleinPipeline.__call__, end: BN de-normalisation in the 128-channel space, unpatchify,
        # then vae.decode (post_quant_conv + decoder).
        bn = self.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(packed_latent.dtype)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + self.vae.config.batch_norm_eps).to(packed_latent.dtype)
        z = unpatchify(packed_latent * std + mean)
        return self.vae.decode(z, return_dict=False)[0]


# --------------------------------------------------------------------------------------------------
# building all three
# --------------------------------------------------------------------------------------------------

def build_all(cfg: Config, weights: str | None, seed: int):
    """The three float32 PyTorch models (upstream, unpatched), deterministic for a seed."""
    torch.manual_seed(seed)
    qwen = build_text_encoder(cfg, weights)
    torch.manual_seed(seed + 1)
    tr = build_transformer(cfg, weights)
    torch.manual_seed(seed + 2)
    vae = build_vae(cfg, weights, seed)
    return qwen, tr, vae
