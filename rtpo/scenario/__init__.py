"""The scenario language: what a scenario file may say and how it becomes a typed config.

- `schema`: the shared sections (budget, train, eval, logging, ...), the one-line ConfigError, YAML reading
  and the validation helpers every backend's section builds on.
- `backends`: the backend registry (a `backend.kind` names a config section, a task parser, a builder).
- `plugins`: user modules and entry points that register names before a scenario is validated.
- `shipped`: the scenarios shipped in the package (rtpo/scenarios, a link to the repository's scenarios/)
  by name, and the one rule that turns a SCENARIO argument into a file (a path, else a shipped name).
- `load`: a whole scenario: YAML -> overrides -> ScenarioConfig (`load_scenario`, `parse_scenario`).
- `docs`: the same keys as readable text: `rtpo config show|schema` and docs/config.md
  (`python -m rtpo.scenario.docs --write docs/config.md`).

May import: rtpo.core, and the run folder's tracker registry (rtpo.rundir.trackers, to check
`logging.trackers`).  `schema`, `backends` and `plugins` sit below the backends (rtpo.tabular, rtpo.llm
import them); `load` and `docs` sit above them (they reach the backends through the registry).  Nothing
here imports the runner or a command.
"""
