"""PixArt-Sigma and -alpha: cross-attention to the T5 text; alpha's default text length is 120."""
from ..record import BlockKind, CostModel, Defaults, ModelFamily, Modules, Parallel

RECORD = ModelFamily(
    "pixart", "PixArtTransformer2DModel", ("PixArtSigmaPipeline", "PixArtAlphaPipeline"), packed=False,
    modules=Modules.of("pixart"),
    defaults=Defaults(steps=20, guidance=4.5, max_sequence_length=300,
                      max_sequence_length_by_pipeline={"PixArtAlphaPipeline": 120}),
    parallel=Parallel(tensor=True),
    costs=CostModel(BlockKind.DOUBLE_SINGLE, batched_branches=True))
