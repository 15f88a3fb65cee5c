"""Patch-parallel VAE decode: the latent split into row bands, one per rank. Exact.

Image latents [B, C, h, w] and video latents [B, C, F, h, w] (the causal 3-D VAEs
of video_modules.py) are split along h, the second-to-last dim; time is never split.
The diffusers decoder runs unmodified on each rank's band (vae.decode is called
on the band, with its own frame-by-frame or frame-batch loop and caches). While it runs, hooks on its own modules make the result equal to
the whole-image decode:

- Conv2d with a k x k kernel (k = 2p+1, padding p): after the module has run on
  the band (zero padding at the band's edges), its first and last p output rows
  are recomputed, by the same module, on a strip that carries the neighbour's p
  halo rows (exchanged point to point). Zero rows are used only at the true
  image border. No copy of the band is made. The video VAEs' causal 3-D convs are
  fixed the same way; their cached frames from the previous chunk get the same halo.
- GroupNorm: mean from the all-reduced sum and count, then the variance from the
  all-reduced sum of squared deviations from that mean (two passes, exact).
- Attention (the mid block's): its input is gathered to the whole latent, the
  real module runs on it, and each rank keeps its own rows of the output
  (HunyuanVideo: the whole mid block, whose mask depends on the height).
- Everything else in the decoder works row by row (activations, dropout, 1x1
  convs, nearest 2x upsampling, which doubles band heights): left alone.

Any other module type makes the decode refuse to start (ConfigError) rather
than risk a silently different image.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from diffusers.models.attention_processor import Attention
from diffusers.models.upsampling import Upsample2D
from torch.distributed import ProcessGroup

from ..distributed.comm import (all_gather_uneven, all_reduce, exchange_with_neighbours, group_rank, group_size,
                               split_sizes)
from ..errors import ConfigError
from . import video_modules as video

# Containers only hold modules (walked into); an empty one computes nothing. The mid block
# of a VAE with mid_block_add_attention=False keeps an empty ModuleList of attentions.
_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)
_H = -2    # rows: dim 2 of [B, C, h, w], dim 3 of [B, C, F, h, w]
# Leaves that compute each output row from the same input row only.
_ROW_LOCAL = (nn.SiLU, nn.ReLU, nn.GELU, nn.Mish, nn.Tanh, nn.Sigmoid, nn.Identity, nn.Dropout)


@dataclass
class BandPlan:
    """Which latent rows each rank of the group decodes."""

    group: ProcessGroup
    rank: int                # index in the group
    sizes: list[int]         # latent rows per rank (split_sizes: first ones one longer)
    latent_height: int

    @property
    def world(self) -> int:
        return len(self.sizes)

    @property
    def offset(self) -> int:
        return sum(self.sizes[: self.rank])

    def lens_at(self, height: int) -> list[int]:
        """Band heights once the whole image is `height` rows (a multiple of the latent height)."""
        scale, rest = divmod(height, self.latent_height)
        if rest:
            raise RuntimeError(f"height {height} is not a multiple of the latent height {self.latent_height}")
        return [s * scale for s in self.sizes]


def _exchange_halos(x: torch.Tensor, p: int, plan: BandPlan) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Returns (p rows of the rank above, p rows of the rank below); None at the image border.

    NOTE: every rank of plan.group must call this for the same conv, in the same order.
    """
    first, last = plan.rank == 0, plan.rank == plan.world - 1
    return exchange_with_neighbours(None if first else x[..., :p, :], None if last else x[..., -p:, :],
                                    plan.group, "vae_halo_p2p")              # [B, C, (F,) p, W]


def _group_norm(module: nn.GroupNorm, plan: BandPlan):
    """A forward for `module` that normalises with statistics over every rank's band.

    Two passes, as the whole-image GroupNorm: mean from the all-reduced sums and
    counts, then the variance from the all-reduced squared deviations from that
    mean. Arithmetic in float32 at least (as torch's own GroupNorm for 16-bit
    inputs), statistics in float64, a few groups at a time so the temporaries stay
    a fraction of the band.
    """

    def forward(x: torch.Tensor) -> torch.Tensor:  # x: [B, C, h_band, W] or [B, C, F, h_band, W]
        # NOTE: every rank of plan.group joins two all-reduces per call.
        b, c = x.shape[:2]
        g = module.num_groups
        calc = torch.promote_types(x.dtype, torch.float32)
        xg = x.reshape(b, g, c // g, -1)                                # [B, G, C/G, (F *) h_band * W]
        chunks = [slice(k, min(k + max(1, g // 8), g)) for k in range(0, g, max(1, g // 8))]
        sums = torch.cat([xg[:, gs].to(calc).sum(dim=(2, 3), dtype=torch.float64) for gs in chunks], 1)
        stats = torch.cat([sums.reshape(-1), sums.new_tensor([xg[0, 0].numel()])])  # [B*G sums, count]
        all_reduce(stats, plan.group, "vae_groupnorm_all_reduce")
        count = stats[-1]
        mean = (stats[:-1] / count).reshape(b, g, 1, 1).to(calc)       # [B, G, 1, 1]
        ssd = torch.cat([
            torch.linalg.vector_norm(xg[:, gs].to(calc) - mean[:, gs], dim=(2, 3)).double().square()
            for gs in chunks
        ], 1).reshape(-1)                                               # [B*G]
        all_reduce(ssd, plan.group, "vae_groupnorm_all_reduce")
        rstd = torch.rsqrt(ssd / count + module.eps).reshape(b, g, 1, 1).to(calc)   # biased var, as nn.GroupNorm
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)    # contiguous: og is a view
        og = out.reshape(b, g, c // g, -1)
        weight = module.weight.reshape(g, c // g, 1).to(calc) if module.affine else None
        bias = module.bias.reshape(g, c // g, 1).to(calc) if module.affine else None
        for gs in chunks:
            y = (xg[:, gs].to(calc) - mean[:, gs]).mul_(rstd[:, gs])
            if weight is not None:
                y.mul_(weight[gs]).add_(bias[gs])
            og[:, gs] = y
        return out

    return forward


def _halo_of(conv: nn.Conv2d | nn.Conv3d) -> int:
    """Rows a conv needs from each neighbour; refuses convs the band split cannot reproduce (H and W: the last dims)."""
    kh, kw = conv.kernel_size[-2:]
    ph, pw = (kh // 2, kw // 2) if conv.padding == "same" else (
        conv.padding[-2:] if isinstance(conv.padding, tuple) else (None, None))
    if conv.stride[-2:] != (1, 1) or conv.dilation[-2:] != (1, 1) or conv.padding_mode != "zeros" or ph is None:
        raise ConfigError(f"parallel VAE decode supports stride-1, zero-padded convs only; found {conv}. "
                          "Run without --use-parallel-vae (tiling bounds memory too).")
    if kh % 2 == 0 or ph != kh // 2 or pw != kw // 2:
        raise ConfigError(f"parallel VAE decode needs 'same' padding (odd kernel k, padding k//2); found {conv}. "
                          "Run without --use-parallel-vae.")
    return ph


class BandHooks:
    """Installs the hooks on a decoder for one decode; `with BandHooks(decoder, plan):`."""

    def __init__(self, decoder: nn.Module, plan: BandPlan) -> None:
        self.decoder, self.plan = decoder, plan
        self.convs: list[tuple[nn.Module, video.CausalConv]] = []   # plain convs get a CausalConv without cache
        self.norms: list[nn.GroupNorm] = []
        self.gathered: list[nn.Module] = []
        self._walk(decoder)
        halo = max((c.halo for _, c in self.convs), default=0)
        if plan.sizes and min(plan.sizes) < halo:  # same answer on every rank: all refuse, none hangs
            raise ConfigError(
                f"parallel VAE decode: {min(plan.sizes)} latent row(s) on some rank but convs need {halo} "
                f"halo rows from each neighbour; use at most {plan.latent_height // halo} ranks for this image."
            )
        self._handles: list = []
        self._fixing = False

    def _walk(self, module: nn.Module) -> None:
        for child in module.children():
            video.check_refused(child)
            if isinstance(child, Attention) or video.runs_gathered(child):
                self.gathered.append(child)        # runs whole; its inside needs no hooks
            elif (spec := video.causal_conv(child)) is not None:
                if spec.halo:                      # its inner Conv3d runs inside its forward: not walked
                    self.convs.append((child, spec))
            elif isinstance(child, (nn.Conv2d, nn.Conv3d)):   # plain convs (CogVideoX's 1x1x1 shortcut)
                halo = _halo_of(child)
                if halo:
                    self.convs.append((child, video.CausalConv(halo, None, False)))
            elif isinstance(child, nn.GroupNorm):
                self.norms.append(child)
            elif isinstance(child, _CONTAINERS) or video.is_conditioning(child):
                if isinstance(child, _CONTAINERS):
                    self._walk(child)              # possibly empty (mid block without attention): nothing to split
            elif isinstance(child, Upsample2D) and (child.use_conv_transpose or not child.interpolate):
                raise ConfigError(f"parallel VAE decode supports nearest-neighbour upsampling only; found {child}.")
            elif not list(child.children()) and not isinstance(child, _ROW_LOCAL) and not video.is_row_local(child):
                raise ConfigError(
                    f"parallel VAE decode does not know how to split {type(child).__name__} over row bands; "
                    "run without --use-parallel-vae (use --vae-tile-height/--vae-tile-width to bound memory)."
                )
            else:
                self._walk(child)

    def _conv_hook(self, spec: video.CausalConv):
        plan, halo = self.plan, spec.halo

        def hook(module: nn.Module, args, kwargs, out):
            if self._fixing:
                return None
            x = args[0]                                 # [B, Cin, (F,) h, W]; output [B, Cout, (F,) h, W]
            cache = (args[1] if len(args) > 1 else kwargs.get(spec.cache_arg)) if spec.cache_arg else None
            if not isinstance(cache, torch.Tensor):
                cache = None
            # The cached frames (previous chunk's last inputs) need the same halo rows: one exchange for both.
            frames = 0 if cache is None else cache.shape[2]
            both = x if cache is None else torch.cat([cache, x], 2)    # [B, Cin, F_cache + F, h, W]
            top, bottom = _exchange_halos(both, halo, plan)
            result = out[0] if spec.returns_cache else out
            h = x.shape[_H]

            def recompute(rows: torch.Tensor, above: torch.Tensor | None, below: torch.Tensor | None):
                """The module's output on `rows` with the neighbours' rows around (the module pads the rest)."""
                strip = torch.cat([t for t in (above, rows, below) if t is not None], _H)
                call = (strip,) if cache is None else (strip[:, :, frames:],)
                extra = {} if cache is None else {spec.cache_arg: strip[:, :, :frames]}
                y = module(*call, **extra)
                return y[0] if spec.returns_cache else y

            self._fixing = True
            try:
                if h < 2 * halo:  # a very thin band: recompute it whole between both halos
                    result.copy_(recompute(both, top, bottom).narrow(_H, 0 if top is None else halo, h))
                else:
                    if top is not None:  # first `halo` output rows see the rows above
                        result[..., :halo, :] = recompute(both[..., : 2 * halo, :], top, None)[..., halo: 2 * halo, :]
                    if bottom is not None:
                        result[..., -halo:, :] = recompute(both[..., -2 * halo:, :], None, bottom)[..., halo: 2 * halo, :]
            finally:
                self._fixing = False
            return out

        return hook

    def _gather_pre_hook(self, module, args, kwargs):
        # NOTE: every rank of the group gathers here (all_gather).
        x = args[0]                                                # [B, C, (F,) h_band, W]
        full_height = x.shape[_H] * self.plan.latent_height // self.plan.sizes[self.plan.rank]
        full = all_gather_uneven(x.contiguous(), x.dim() + _H, self.plan.lens_at(full_height), self.plan.group)
        return (full, *args[1:]), kwargs                           # [B, C, (F,) h, W]

    def _gather_post_hook(self, module, args, out: torch.Tensor):
        lens = self.plan.lens_at(out.shape[_H])
        start = sum(lens[: self.plan.rank])
        return out.narrow(out.dim() + _H, start, lens[self.plan.rank]).contiguous()  # [B, C, (F,) h_band, W]

    def __enter__(self) -> "BandHooks":
        try:
            for conv, spec in self.convs:
                self._handles.append(conv.register_forward_hook(self._conv_hook(spec), with_kwargs=True))
            for norm in self.norms:
                norm.forward = _group_norm(norm, self.plan)        # instance attribute; removed on exit
            for attn in self.gathered:
                self._handles.append(attn.register_forward_pre_hook(self._gather_pre_hook, with_kwargs=True))
                self._handles.append(attn.register_forward_hook(self._gather_post_hook))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for norm in self.norms:
            norm.__dict__.pop("forward", None)


def plan_bands(latent_height: int, group: ProcessGroup) -> BandPlan | None:
    """Row bands for this group; None when there are fewer latent rows than ranks (decode whole)."""
    world = group_size(group)
    if latent_height < world:
        return None
    return BandPlan(group, group_rank(group), split_sizes(latent_height, world), latent_height)


def decode_bands(vae, latents: torch.Tensor, plan: BandPlan, **vae_kwargs) -> torch.Tensor:
    """Decodes this rank's band with the real vae.decode, then gathers the image on every rank.

    vae_kwargs: passed on to vae.decode (LTX's timestep `temb`).
    NOTE: every rank of plan.group must call this with the same latents.
    """
    dim = latents.dim() + _H
    band = latents.narrow(dim, plan.offset, plan.sizes[plan.rank]).contiguous()   # [B, C, (F,) h_band, w]
    with BandHooks(vae.decoder, plan):
        image_band = vae.decode(band, return_dict=False, **vae_kwargs)[0]         # [B, 3, (F',) h_band*f, W]
    scale = image_band.shape[_H] // band.shape[_H]
    return all_gather_uneven(image_band, dim, [s * scale for s in plan.sizes], plan.group)

