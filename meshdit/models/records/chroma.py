"""Chroma: FLUX.1's blocks, modulated from the timestep alone (no guidance embedding), true CFG with a negative
prompt; the T5 prompt's padding is masked in the joint attention (models/chroma.py). Defaults: __call__'s."""
from ..record import BlockKind, CostModel, Defaults, ModelFamily, Modules, Parallel, TextLength

RECORD = ModelFamily(
    "chroma", "ChromaTransformer2DModel", ("ChromaPipeline",), packed=True, modules=Modules.of("chroma"),
    defaults=Defaults(steps=35, guidance=5.0, max_sequence_length=512, sample_size=128),
    text=TextLength(limit=512),
    parallel=Parallel(tensor=True),
    costs=CostModel(BlockKind.DOUBLE_SINGLE, joint_attention=True))
