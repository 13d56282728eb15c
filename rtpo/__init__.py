"""rtpo: a testbed for Reverse-Turn Policy Optimization — one algorithm core, tabular and LLM backends."""

__version__ = "0.1.0"
