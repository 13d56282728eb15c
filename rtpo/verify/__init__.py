"""The verification suite: every claim of SPEC §4 as a property test that can fail (`pytest rtpo/verify`).

Exact enumeration on tiny TurnMDPs first (exact.py), Hypothesis strategies (strategies.py), and a
registry of deliberately broken variants (mutants.py) that the suite must kill (`rtpo verify --mutants`).

A command (the top floor): may import rtpo.core, rtpo.tabular and rtpo.commands.common; nothing of rtpo
imports it except the `rtpo verify` dispatch in rtpo.commands.cli.
"""
