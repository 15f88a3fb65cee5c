"""SANA: linear self-attention (its K.V summary exchanged), Gemma text through cross-attention, latents split by
whole rows for the Mix-FFN's 3x3 conv; defaults are SanaPipeline.__call__'s (1024 px from sample_size 32 and the
DC-AE's factor 32)."""
from ..record import BlockKind, CallArguments, CostModel, Defaults, ModelFamily, Modules, Parallel

RECORD = ModelFamily(
    "sana", "SanaTransformer2DModel", ("SanaPipeline",), packed=False, modules=Modules.of("sana"),
    defaults=Defaults(steps=20, guidance=4.5, max_sequence_length=300,
                      square_bin_by_sample_size={16: 512, 32: 1024, 64: 2048, 128: 4096}),
    call_arguments=CallArguments(taken=("complex_human_instruction",)),
    parallel=Parallel(sequence_rows=True),
    costs=CostModel(BlockKind.LINEAR_MIX_FFN, config_keys=("attention_head_dim", "num_layers"),
                    batched_branches=True))
