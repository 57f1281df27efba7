"""taps: lossless speculative decoding with block-diffusion drafters and TAPS draft trees."""


def load(*args, **kwargs):  # TEMPORARY (serve branch): the lead's public API replaces this and taps/_api_shim.py
    from taps._api_shim import load as shim_load
    return shim_load(*args, **kwargs)
