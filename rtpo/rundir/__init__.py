"""The run folder and its lifecycle: everything `rtpo run` writes under runs/<name>/ and reads back.

- `runner`: one scenario -> a run folder (config.yaml, metrics.jsonl, checkpoints, plot, summary), and
  the in-memory run behind `rtpo.train`.
- `checkpoint`: the folder's layout and the checkpoint format (the one module that knows file names).
- `provenance`: RUN/provenance.json, where each process that ran the folder came from.
- `logs`: the libraries' log lines into RUN/logs/ instead of the console.
- `trackers`: the sinks fed the metrics record (jsonl, tensorboard, wandb, trackio, mlflow).
- `plots`: the learning-curve PNGs.
- `report`: `rtpo report`, the folder(s) as one self-contained HTML page (curves, per-turn statistics,
  trunks, timing, config, provenance, generations).

May import: rtpo.core, rtpo.scenario, and the backends only through the registry (rtpo.scenario.backends).
`checkpoint`, `provenance`, `logs`, `trackers` and `plots` import neither the runner nor a backend, so a
command or a backend may use them; only `runner` sits above the backends.  Nothing here imports a command.
"""
