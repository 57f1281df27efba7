"""taps: lossless speculative decoding with block-diffusion drafters and TAPS draft trees."""
