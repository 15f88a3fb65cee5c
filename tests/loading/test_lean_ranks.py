"""Lean ranks: only the encoding rank holds text encoders, only decoding ranks the VAE; images equal one process's."""
import numpy as np

from meshdit.loading.text import ENCODING_RANK
from tests.loading import jobs


def test_only_the_encoding_rank_holds_text_encoders(run_ranks, flux_folder):
    reference = jobs.single_process_image(flux_folder)
    results = run_ranks(2, jobs.text_encoder_params_and_image, flux_folder, dict(cfg_degree=2))
    for rank, (held, image) in enumerate(results):
        if rank == ENCODING_RANK:
            assert held > 0
        else:
            assert held == 0, f"rank {rank} holds {held} text-encoder parameters"
        # Equal to one process within the suite's exactness bound (the ranks run 1 thread, this
        # process more, so float sums may round differently); test_replicated checks bit-equality
        # against a plain load on the same layout, where every rank encodes for itself.
        diff = np.abs(image - reference).max()
        assert diff <= 1e-5 * np.abs(reference).max(), f"rank {rank}: max diff {diff}"


def test_only_decoding_ranks_hold_the_vae(run_ranks, flux_folder):
    """Without parallel decode only the image group's rank 0 loads the VAE (the others get its images);
    with it every rank does. Images equal one process's either way."""
    reference = jobs.single_process_image(flux_folder)
    for parallel, degrees in ((False, dict(ulysses_degree=2)), (True, dict(ring_degree=2))):
        results = run_ranks(2, jobs.vae_bytes_and_image, flux_folder, degrees, parallel)
        held = [vae_bytes for vae_bytes, _ in results]
        assert held[0] > 0 and (held[1] > 0) == parallel, f"parallel VAE {parallel}: VAE bytes per rank {held}"
        for rank, (_, image) in enumerate(results):
            diff = np.abs(image - reference).max()
            assert diff <= 1e-5 * np.abs(reference).max(), f"parallel VAE {parallel}, rank {rank}: max diff {diff}"
