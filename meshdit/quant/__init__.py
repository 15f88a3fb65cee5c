"""FP8: GEMMs with FP8 weights, an FP8 attention backend, and an FP8 wire codec for communication
(what an Fp8Config installs on a pipeline: meshdit.combine.fp8_runtime)."""
