"""The parallel methods the benchmark compares: one table entry per method.

Adding a method (PipeFusion, a USP layout, ...) is one `Method(...)` line in
METHODS. A method whose meshdit ParallelConfig does not validate when the
benchmark runs is skipped with the validation message as its note.

Communication formulas give the bytes ONE rank sends per denoising step (one
transformer call per guidance branch), counted the way the collectives count
them: an all-to-all sends everything but the rank's own chunk; an all-gather
sends the rank's piece to each of the N-1 others; a ring hop sends one block.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Shape:
    """What the formulas need to know about one benchmark case."""

    image_tokens: int  # p
    text_tokens: int
    hidden: int  # hs = heads x head_dim: q, k, v and attention output are [tokens, hs] per layer
    attention_layers: int  # L: Flux double blocks + single blocks, one joint attention each
    out_features: int  # proj_out width: the gathered output is [p, out_features]
    element_bytes: int  # 4 for fp32

    @property
    def tokens(self) -> int:  # S: text and image tokens share every attention
        return self.image_tokens + self.text_tokens


def output_gather(n: int, s: Shape) -> int:
    """The final all-gather of proj_out: my [p/N, out] piece to each of N-1 ranks."""
    return (n - 1) * (s.image_tokens // n) * s.out_features


def ulysses_elements(n: int, s: Shape) -> int:
    """Per layer q, k, v (seq->heads) and out (heads->seq): each sends (N-1)/N of the local [S/N, hs] block."""
    per_layer = 4 * (n - 1) * (s.tokens // n) * s.hidden // n
    return s.attention_layers * per_layer + output_gather(n, s)


def ring_elements(n: int, s: Shape) -> int:
    """Per layer the local K and V blocks [S/N, hs] travel N-1 hops (diffusers: one all-gather of K and V, same count)."""
    per_layer = 2 * (n - 1) * (s.tokens // n) * s.hidden
    return s.attention_layers * per_layer + output_gather(n, s)


def pipefusion_elements(n: int, s: Shape, patches: int | None = None) -> list[int]:
    """Per rank, one patch step: each stage but the last sends every patch's carried activations
    (its [p/M, hs] image rows and the [txt, hs] text stream: Flux carries both) to the next stage;
    the last stage hands each stepped patch [p/M, out] (Flux: out = the packed latent width) back to
    stage 0. M = patches (default: one per stage)."""
    m = patches or n
    return [(s.image_tokens + m * s.text_tokens) * s.hidden] * (n - 1) + [s.image_tokens * s.out_features]


def cfg_elements(n: int, s: Shape) -> int:
    """Each rank runs one branch on the whole sequence; the noise predictions [p, out] are all-gathered."""
    return (n - 1) * s.image_tokens * s.out_features


@dataclass(frozen=True)
class Method:
    name: str
    meshdit: dict  # meshdit ParallelConfig degrees
    diffusers: dict | None = None  # diffusers ContextParallelConfig degrees, None where diffusers has no such method
    unit: str = "forward"  # "forward": one transformer call; "step": one denoising step through Engine.generate
    cfg: bool = False  # the request runs two guidance branches (cond and uncond)
    formula: Callable[[int, Shape], int | list[int]] | None = None  # elements one rank (or each rank) sends per step
    formula_text: str = ""
    notes: str = ""
    degree: int = field(default=2)
    steps: int | None = None  # denoising steps of a timed "step"-unit run (None: the runner's 2)
    request: dict = field(default_factory=dict)  # GenerateRequest fields of the method (PipeFusion's settings)
    ulysses_chunks: int | None = None  # meshdit.attention.usp.ULYSSES_CHUNKS while it runs (None: the default)
    fp8: dict = field(default_factory=dict)  # meshdit Fp8Config fields of the method (empty: no FP8)


METHODS: tuple[Method, ...] = (
    Method("ulysses2", dict(ulysses_degree=2), dict(ulysses_degree=2), formula=ulysses_elements,
           formula_text="L*4*(N-1)/N*(S/N)*hs + (N-1)*(p/N)*out"),
    Method("ulysses2-two-groups", dict(ulysses_degree=2), None, formula=ulysses_elements,
           formula_text="as ulysses2", ulysses_chunks=2,
           notes="ulysses2 with its heads in two groups whose all-to-alls overlap the other group's attention "
                 "(usp.ULYSSES_CHUNKS = 2; the default is one all-to-all each way)"),
    Method("ring2", dict(ring_degree=2), dict(ring_degree=2), formula=ring_elements,
           formula_text="L*2*(N-1)*(S/N)*hs + (N-1)*(p/N)*out"),
    Method("cfg2", dict(cfg_degree=2), None, unit="step", cfg=True, formula=cfg_elements,
           formula_text="(N-1)*p*out per step (noise predictions all-gathered)"),
    Method("pipefusion2", dict(pipefusion_parallel_degree=2), None, unit="step", formula=pipefusion_elements,
           formula_text="stage 0: (p + M*txt)*hs, stage 1: p*out per patch step (M = 2 patches)",
           steps=20, request=dict(warmup_steps=1),
           notes="approximate method (stale K/V): 20 steps, 1 warmup step, 2 patches; time per step = the "
                 "denoising seconds / 20, warmup and pipeline fill included"),
    Method("pipefusion2-fp8kv", dict(pipefusion_parallel_degree=2), None, unit="step", formula=pipefusion_elements,
           formula_text="as pipefusion2", steps=20, request=dict(warmup_steps=1), fp8=dict(stale_kv=True),
           notes="pipefusion2 with --fp8-stale-kv: its stale K/V buffers held in FP8 (memory; the traffic is "
                 "unchanged)"),
)


def method(name: str) -> Method:
    return next(m for m in METHODS if m.name == name)
