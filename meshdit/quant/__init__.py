"""FP8: GEMMs with FP8 weights, an FP8 attention backend, and an FP8 wire codec for communication."""
