"""Regional compilation (--compile): torch.compile of each block of the plan's block lists.

As diffusers' `compile_repeated_blocks` does, each block module is compiled on its own rather than
the whole transformer: blocks of one class share their compiled code (the weights are graph inputs),
so a 57-block FLUX.1 compiles its two block classes (per input shape), not 57 blocks. Compiling
comes last in `parallelize`, after PipeFusion has replaced other stages' blocks (their SkipBlocks
stay eager) and FP8 has swapped the Linear layers.

What stays outside the graphs (it communicates):
- the SDPA router (`attention/router.routed_sdpa`, compiler-disabled): it runs the collectives of
  Ulysses, ring and PipeFusion's stale K/V. Under sequence parallelism or PipeFusion each attention
  call is one graph break (a FLUX block: two graphs, one before and one after its attention); serial
  and CFG-parallel runs keep torch's own SDPA and have no break.
- PipeFusion's stage hooks (its sends and receives) on the stage's boundary blocks.
The hooks that mark attention modules append to a plain list, which traces without a break; breaks
in nested calls resume inside the same block (dynamo's nested_graph_breaks, set while a compiled
block runs) rather than splitting the block at every enclosing call.
"""
from __future__ import annotations

import torch

from ..errors import ConfigError
from .pipefusion import SkipBlock
from .plan import StagePlan


class CompiledBlock:
    """One block's forward, compiled; remove() makes it eager again."""

    def __init__(self, block: torch.nn.Module, backend: str) -> None:
        self.block = block
        # the same call nn.Module.compile() makes: hooks on the block and its submodules are traced too
        compiled = torch.compile(block._call_impl, backend=backend)

        def call(*args, **kwargs):
            with torch._dynamo.config.patch(nested_graph_breaks=True):
                return compiled(*args, **kwargs)

        block._compiled_call_impl = call

    def remove(self) -> None:
        self.block._compiled_call_impl = None


def compiling_notice(backend: str) -> str:
    """What the output rank prints before a compiled run's first step, which compiles before it runs."""
    return (f"meshdit: compiling the transformer blocks with torch.compile ({backend}) in the first step; this "
            "takes a while (once per size), then the steps run")


def check_backend(backend: str) -> None:
    """A ConfigError naming the choices if torch.compile does not know `backend`."""
    known = torch._dynamo.list_backends(exclude_tags=())
    if backend not in known:
        raise ConfigError(f"compile backend {backend!r} is not a torch.compile backend here; use one of "
                          f"{', '.join(sorted(known))} (e.g. --compile inductor).")


def compile_blocks(transformer: torch.nn.Module, plan: StagePlan, backend: str) -> list[CompiledBlock]:
    """Compiles every block this rank holds in the plan's block lists; returns handles that undo it."""
    return [CompiledBlock(block, backend) for block in blocks_of(transformer, plan)]


def blocks_of(transformer: torch.nn.Module, plan: StagePlan) -> list[torch.nn.Module]:
    """The blocks this rank computes (PipeFusion's SkipBlocks left out)."""
    modules = dict(transformer.named_modules())
    return [block for spec in plan.blocks for block in modules[spec.path] if not isinstance(block, SkipBlock)]
