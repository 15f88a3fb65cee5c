"""HunyuanDiT: cross-attention to CLIP and T5 text of one fixed length, U-Net-like long skips; the pipeline bins its
default square to a standard side."""
from ..record import BlockKind, CostModel, Defaults, ModelFamily, Modules, Parallel, TextLength

RECORD = ModelFamily(
    "hunyuandit", "HunyuanDiT2DModel", ("HunyuanDiTPipeline",), packed=False, modules=Modules.of("hunyuandit"),
    defaults=Defaults(steps=50, guidance=5.0, max_sequence_length=256, standard_square_sides=(1024, 1280)),
    text=TextLength(fixed=True),
    parallel=Parallel(tensor=True),
    costs=CostModel(BlockKind.DOUBLE_SINGLE, batched_branches=True))
