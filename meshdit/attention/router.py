"""The SDPA router: torch's scaled_dot_product_attention, swapped while any hook set needs it.

Every diffusers attention processor looks `torch.nn.functional.scaled_dot_product_attention` up at call
time, so routing that one function reaches them all without copying any. Inside an attention module a
hook set has marked, a call goes to the module's handler (parallel/sequence.py registers sequence-parallel
attention and PipeFusion's stale K/V through `route_during_forward`) or to its backend (FP8 attention:
`apply_attention_backend`); everywhere else to torch's own SDPA, untouched.

The seam guard: sequence parallelism is right only if a marked module's attention reaches its handler.
A processor that computes attention another way (explicit matmuls, linear attention) would attend over
this rank's shard alone. `route_during_forward` records every marked module that runs and the router
records every one whose call arrives; `unreached()` returns those that ran without arriving (the
sequence hooks check it after each transformer forward). A module that attends without SDPA (plan word
NotSdpa: SANA's linear attention) reaches it through `note_exchanged()`, called by its exchange.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

TORCH_SDPA = F.scaled_dot_product_attention
"""torch's own function (what every call outside a marked module gets)."""


class WhileRunning:
    """A value that hooks set while a module runs (innermost last), read by the SDPA router.

    A plain list rather than a ContextVar: torch.compile traces a list append inside a compiled
    block (ContextVar.set would break the graph there), and a rank runs one forward at a time.
    `ran` lists the guarded values set since the guard last looked (an append: traced as well);
    `reached` holds the ids of those whose attention call reached the router (set by the router,
    which runs eagerly).
    """

    def __init__(self) -> None:
        self.stack: list = []
        self.ran: list = []
        self.reached: set[int] = set()

    def get(self):
        return self.stack[-1] if self.stack else None


HANDLER = WhileRunning()  # the handler of the marked attention module running now (sequence parallelism)
BACKEND = WhileRunning()  # the attention backend (FP8) of the attention module running now


@torch.compiler.disable  # collectives inside: under --compile, one graph break per attention call
def routed_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
    handler = HANDLER.get()
    if handler is None:
        backend = BACKEND.get()
        plain = attn_mask is None and not dropout_p and not is_causal and not kwargs.get("enable_gqa")
        if backend is not None and plain:  # masked attention (e.g. PixArt's captions) stays on SDPA
            return backend.local(query, key, value, scale)
        return TORCH_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                          is_causal=is_causal, scale=scale, **kwargs)
    HANDLER.reached.add(id(handler))
    return handler(query, key, value, attn_mask, dropout_p, is_causal, scale, **kwargs)


class SdpaRouting:
    """torch's SDPA routed through `routed_sdpa` while any hook set needs it (reference-counted).

    The last remove() puts torch's own function back.
    """

    users = 0

    def __init__(self) -> None:
        if SdpaRouting.users == 0:
            torch.nn.functional.scaled_dot_product_attention = routed_sdpa
        SdpaRouting.users += 1
        self._removed = False

    def remove(self) -> None:
        if self._removed:
            return
        self._removed = True
        SdpaRouting.users -= 1
        if SdpaRouting.users == 0:
            torch.nn.functional.scaled_dot_product_attention = TORCH_SDPA


def install_sdpa_router() -> SdpaRouting:
    """Routes SDPA until the returned handle is removed (it goes with the hooks' handles)."""
    return SdpaRouting()


def is_attention(module: torch.nn.Module) -> bool:
    # diffusers' attention modules carry a processor that does the actual attention
    return hasattr(module, "processor") and hasattr(module, "set_processor")


def route_during_forward(module: torch.nn.Module, handler, guarded: bool = True) -> list:
    """While `module` runs, its SDPA calls go to `handler(q, k, v, attn_mask, dropout_p, is_causal, scale)`.

    guarded: the module is expected to reach the router (`unreached()` names it if it ran and did not).
    Returns the hook handles."""
    return set_during_forward(module, HANDLER, handler, record=guarded)


def unreached() -> list:
    """The guarded handlers whose module ran since the last call but whose attention never reached the
    router, in the order they ran; forgets what it saw (call it once per transformer forward)."""
    seen = {id(h): h for h in HANDLER.ran}
    missing = [h for key, h in seen.items() if key not in HANDLER.reached]
    HANDLER.ran.clear()
    HANDLER.reached.clear()
    return missing


@torch.compiler.disable  # beside the exchange's collectives, which run eagerly
def note_exchanged() -> None:
    """Called by a NotSdpa module's exchange while the module runs: its attention went the sequence-parallel
    way, as a routed SDPA call does for the other marked modules (the seam guard's record)."""
    handler = HANDLER.get()
    if handler is not None:
        HANDLER.reached.add(id(handler))


def apply_attention_backend(transformer: torch.nn.Module, backend) -> list:
    """Every attention module of `transformer` computes with `backend` (no communication); returns hooks."""
    handles = [install_sdpa_router()]
    for module in transformer.modules():
        if is_attention(module):
            handles += set_during_forward(module, BACKEND, backend)
    return handles


def set_during_forward(module: torch.nn.Module, var: WhileRunning, value, record: bool = False) -> list:
    """Hooks that set `var` to `value` while `module` runs (its attention calls see it); with `record`,
    also note in `var.ran` that it ran. Returns the handles.

    Nothing is left on the diffusers module; inside a compiled block the hooks trace without a graph break.
    """

    def enter(_mod, _args):
        var.stack.append(value)

    def enter_recorded(_mod, _args):
        var.stack.append(value)
        var.ran.append(value)

    def leave(_mod, _args, _out):
        if var.stack:
            var.stack.pop()

    return [module.register_forward_pre_hook(enter_recorded if record else enter),
            module.register_forward_hook(leave, always_call=True)]
