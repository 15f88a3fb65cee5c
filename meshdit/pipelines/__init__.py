"""Denoising-loop recipes per pipeline family, built on public diffusers pipeline methods."""
