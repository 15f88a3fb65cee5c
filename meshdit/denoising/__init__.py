"""The shared recipe base and the denoising loops (serial / CFG-parallel, PipeFusion) the engine runs."""
