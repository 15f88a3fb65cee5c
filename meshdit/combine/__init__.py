"""The one package that combines the strategies (parallel/), the denoising loops (denoising/), the VAE decode
(vae/) and FP8 (quant/, attention/fp8.py) on a pipeline: parallelize.py installs them in a fixed order and
returns a Parallelized (parallelized.py), the one object the engine drives; fp8_runtime.py is what an Fp8Config
installs. It sits above every package it combines, so none of them imports it."""
