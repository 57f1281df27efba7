"""Synthetic drafter marginals for model-free policy and scorer tests."""

import torch


def random_marginals(depth, vocab, seed, sharp=3.0):
    """[depth, vocab] rows that sum to 1; larger `sharp` = more peaked."""
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(sharp * torch.randn(depth, vocab, generator=g), dim=-1)
