"""taps: lossless speculative decoding with block drafters and target-aware draft trees.

    import taps
    spec = taps.load("smollm2-135m")
    print(spec.generate("Write a haiku about caches.").text)

The public API is `load` (taps.engine) and what it returns. Imports are lazy, so the light
parts (taps.records, taps.report) work without torch.
"""

__all__ = ["GenerationResult", "Round", "Speculator", "load"]


def __getattr__(name: str):
    if name in ("load", "Speculator"):
        from taps import engine

        return getattr(engine, name)
    if name in ("GenerationResult", "Round"):
        from taps import decode

        return getattr(decode, name)
    raise AttributeError(f"module 'taps' has no attribute {name!r}")
