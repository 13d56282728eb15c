"""The ways in: the `rtpo` command line and the Python API.

- `cli`: `rtpo run|solve|config|plot|export|eval|verify|compare` (the console script's `main`).
- `common`: what every command shares: bad input is one line on stderr and exit status 2; report files
  written whole or not at all.
- `eval`: the `rtpo eval` command (the metrics it reports are rtpo.core.sampled_eval's).
- `export`: the `rtpo export` command (a run's checkpoint, verified, -> the backend's exporter; the llm
  backend's is rtpo.llm.hf_folder).
- `api`: `rtpo.train` / `rtpo.resolve`, the same run as `rtpo run`, from Python.
- `gold`: `python -m rtpo.commands.gold`, gold trajectories for SFT (written by rtpo.llm.gold).
- `launch`: `python -m rtpo.commands.launch slurm|kuberay`, cluster launch recipes for a Ray scenario.

The top floor: may import anything of rtpo; nothing of rtpo imports a command except rtpo.compare and
rtpo.verify, which are commands themselves (they use `common`).
"""
