"""`rtpo compare`: every method × seed of a scenario at an equal rollout budget (SPEC §2.3), a table with
95% intervals over seeds, and plots.

    rtpo compare SCENARIO [--methods a,b:key=v,...] [--seeds N] [--sweep key=v1,v2,...]
                 [--tune key=v1,v2,... [--tune-seeds T]] [--workers 2] [--out DIR] [key=value ...]
    rtpo compare --runs RUN [RUN ...] [--out DIR]     (existing run folders: rtpo.compare.existing)

- A method spec is a registered name with optional `:key=value` settings of its Config
  (`grpo:normalize=false`, `rtpo:estimator=leave_one_out`); the spec is the row label.  A method
  whose Config is the scenario method's Config or a subclass of it (the RTPO variants from `rtpo`)
  starts from the scenario's method settings; any other starts from its own defaults.
- `key=value` overrides apply to every run; a `method.X=v` override applies to the methods whose
  Config has a field X and is skipped for the others.
- Equal tokens instead: with `budget.max_tokens=T` every method runs until it has generated T response
  tokens (checked at iteration boundaries; the last iteration may run past T and the table says so).
- The budget B: `budget.max_rollouts` if the scenario sets it, else what the scenario's own method plans
  for `budget.iterations` iterations (iterations × rollouts_per_query(K) × queries_per_iteration).
  Each method runs the whole iterations that fit in B (B // (its rollouts_per_query × queries), at
  least 1) and is also capped at B at iteration boundaries (a begun iteration always finishes and is
  trained: rtpo.rundir.runner._run_loop's budget rule); the table shows what each really spent, which is its
  checkpoint's counter, and flags a row that spent more than B (one iteration costs more than B).
- The report prints every method's resolved settings (its whole Config as run, inherited scenario
  settings included, and train.lr), calls out the shared update settings that differ between methods
  (e.g. RTPO inheriting the scenario's `epochs: 2` while GRPO runs its default 1), and counts training
  samples per turn (batch rows of turn k over the run, from each phase's `samples/turn_<k>`).  On the
  tabular backends it also prints which regime the task is in before training (the exact variance
  decomposition and RTPO/GRPO information index of rtpo.tabular.diagnostic).
- Tabular rows and llm exact-world rows (rtpo.llm.worlds) also give the normalised gain
  (V − V_uniform)/(V* − V_uniform); tabular rows also count the seeds that ended locked onto a wrong first
  action (eval/first_action_wrong > 1/2 at the last evaluation).
- `--sweep key=v1,v2,...` repeats the whole comparison for each value (e.g. task.num_turns=3,4,5).
- `--tune key=v1,v2,...` (e.g. train.lr=0.1,0.3,1.0) tunes per method (and sweep value): every candidate
  runs on T tuning seeds scenario.seed + N..N+T−1, disjoint from the reported ones; each method is then
  reported at its best candidate (mean value/V* over the tuning seeds), and the report prints every
  candidate's score (rtpo.compare.tuning) and how stable each choice is (the share of bootstrap resamples of
  the tuning seeds that pick it; below 80% is flagged).  Best-vs-best instead of one shared setting.  T
  (`--tune-seeds`) defaults to 4: on the shipped families, two disjoint sets of 4 seeds pick the same
  learning rate in most cells, where 2 seeds often disagree (bench/tune_stability.json).
- Seeds are scenario.seed + 0..N−1.  Runs go to 2 worker processes (single-threaded torch each,
  forked where the platform allows) whenever more than one run is queued.

Writes DIR/compare-<scenario>-<time>/: comparison.md, comparison.json (rewritten after every finished
run, so nothing computed is lost), curves.png (value / V* against rollouts, mean and 95% band over seeds),
ratio.png (rollout/train ratio against rollouts), zero_adv_vs_G.png (zero-advantage rate against G),
sweep.png (final value / V* against the swept key) and runs/ with every run folder.

The package: jobs (specs, budgets, one validated Job per run), runner (runs them, in worker processes),
tuning (--tune's selection), tables (statistics over seeds and the markdown table), plots (the figures)
and command (the CLI); every public name is importable from rtpo.compare itself.  A command (the top
floor): may import rtpo.scenario, rtpo.rundir (the runner, the folder layout), rtpo.core, rtpo.tabular
(the regime diagnostic, history scenarios) and rtpo.commands.common; nothing of rtpo imports it except
the `rtpo compare` dispatch in rtpo.commands.cli.
"""

from rtpo.commands.common import USAGE_ERROR
from rtpo.compare.command import DEFAULT_METHODS, main, write_outputs
from rtpo.compare.jobs import Job, build_jobs, parse_method_spec, resolved_settings
from rtpo.compare.plots import write_plots
from rtpo.compare.runner import CURVE_KEYS, Outcome, run_all, run_job
from rtpo.compare.tables import _wrong_first_action, aggregate, mean_ci, settings_lines, table_markdown

__all__ = [
    "CURVE_KEYS",
    "DEFAULT_METHODS",
    "USAGE_ERROR",
    "Job",
    "Outcome",
    "_wrong_first_action",
    "aggregate",
    "build_jobs",
    "main",
    "mean_ci",
    "parse_method_spec",
    "resolved_settings",
    "run_all",
    "run_job",
    "settings_lines",
    "table_markdown",
    "write_outputs",
    "write_plots",
]
