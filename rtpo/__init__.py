"""rtpo: a testbed for Reverse-Turn Policy Optimization — one algorithm core, tabular and LLM backends."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # rtpo.train / rtpo.TrainResult (rtpo.api) load on first use, so `import rtpo` stays light
    if name in ("train", "resolve", "TrainResult"):
        from rtpo import api

        return getattr(api, name)
    raise AttributeError(f"module 'rtpo' has no attribute {name!r}")
