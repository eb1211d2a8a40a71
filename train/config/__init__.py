"""The one configuration schema and its precedence.

Every option is a typed dataclass field: ours in sections (``sections``: model, data, masking, schedule,
adapting, checkpoint, outputs, launch, budget, task) plus every field of ``transformers.TrainingArguments``.
Each is settable four ways, later ones winning:

    defaults  <  YAML file (MLM_CONFIG=path or --config path)  <  environment (MLM_<FIELD>)  <  CLI (--field)

- ``sections``: our fields by section, each with its type, default, help and bound.
- ``schema``: the options as one table (names, bounds, sections); our defaults for the Trainer's fields.
- ``bounds``: what a bound is, the limits (``MAX_PROCESSES``, ...), and how a value shows in an error.
- ``parser``: the schema as one HfArgumentParser, which converts every layer's strings.
- ``layers``: the four layers read by one loop (unknown keys name the nearest option); ``yaml_file`` reads the
  YAML layer's file.
- ``resolved``: the resolved :class:`Config`, where each value came from, and its redaction.
- ``implied``: what the options imply, settled at load: a store's staging directory, the job's Hub push, trackers.
- ``validate``: the bounds and the rules between options, checked before TrainingArguments is built.
- ``reference``: the option reference from the schema (docs/options.md's table, ``help options``).

Other modules import from here, not from the modules inside.
"""

from train.config.bounds import (
    INT64,
    MAX_DEMO_SAMPLES,
    MAX_PROCESSES,
    MAX_RESTARTS,
    MAX_SEQ_LENGTH,
    MAX_TIMEOUT_S,
    MIN_SEQ_LENGTH,
    NPROC_WORDS,
    SEED_MAX,
    SHOWN_CHARS,
    Bound,
    help_with,
    shown,
)
from train.config.implied import split_trackers, take_over_push
from train.config.layers import config_file, load_config
from train.config.parser import TOKENS_SEEN_MODES, build_parser, expected_type, option_actions, tokens_seen_mode
from train.config.phases import PHASE_OPTIONS, PhaseSpec, phase_flags, phases_in
from train.config.reference import option_rows, options_text
from train.config.resilience import ResilienceArguments
from train.config.resolved import REDACTED, Config, move_hub_token_to_env
from train.config.schema import (
    BOUNDS,
    ENV_PREFIX,
    JOB_FIELDS,
    NON_OPTION_ENV,
    PROJECT_DEFAULTS,
    SECRET_FIELDS,
    SECTION_OF,
    TRAINING_BOUNDS,
    env_name,
)
from train.config.sections import (
    MIN_ROWS_PER_WORKER,
    SECTIONS,
    AdaptingArguments,
    BudgetArguments,
    CheckpointArguments,
    DataArguments,
    LaunchArguments,
    MaskingArguments,
    ModelArguments,
    OutputArguments,
    ScheduleArguments,
    TaskArguments,
)
from train.config.validate import validate
from train.config.yaml_file import read_yaml

__all__ = [
    "option_rows",
    "options_text",
    "BOUNDS",
    "ENV_PREFIX",
    "INT64",
    "JOB_FIELDS",
    "MAX_DEMO_SAMPLES",
    "MAX_PROCESSES",
    "MAX_RESTARTS",
    "MAX_SEQ_LENGTH",
    "MAX_TIMEOUT_S",
    "MIN_ROWS_PER_WORKER",
    "MIN_SEQ_LENGTH",
    "NON_OPTION_ENV",
    "NPROC_WORDS",
    "PROJECT_DEFAULTS",
    "REDACTED",
    "SECRET_FIELDS",
    "SEED_MAX",
    "SHOWN_CHARS",
    "TOKENS_SEEN_MODES",
    "TRAINING_BOUNDS",
    "Bound",
    "Config",
    "SECTIONS",
    "SECTION_OF",
    "AdaptingArguments",
    "BudgetArguments",
    "CheckpointArguments",
    "DataArguments",
    "LaunchArguments",
    "MaskingArguments",
    "ModelArguments",
    "OutputArguments",
    "ResilienceArguments",
    "ScheduleArguments",
    "TaskArguments",
    "build_parser",
    "env_name",
    "expected_type",
    "help_with",
    "load_config",
    "config_file",
    "PHASE_OPTIONS",
    "PhaseSpec",
    "phase_flags",
    "phases_in",
    "move_hub_token_to_env",
    "option_actions",
    "read_yaml",
    "shown",
    "split_trackers",
    "take_over_push",
    "tokens_seen_mode",
    "validate",
]
