"""The options in sections: each a dataclass of the fields one part of the job reads, with their types, defaults,
help and bounds together (as torchtitan's JobConfig is sections: a builder takes its section, so its signature says
what it reads). HfArgumentParser reads them all as one flat set of options: every option keeps its ``MLM_*``
variable, flat YAML key and ``--flag`` whatever its section (train/config/parser.py); the ``Config`` holds one of
each (train/config/resolved.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from train.config.bounds import (
    DURATION,
    FRACTION,
    LOCAL_RANKS,
    MAX_DEMO_SAMPLES,
    MAX_PROCESSES,
    MAX_RESTARTS,
    MAX_SEQ_LENGTH,
    MAX_TIMEOUT_S,
    MIN_SEQ_LENGTH,
    OPEN_FRACTION,
    OVERRIDES,
    POSITIVE,
    PROBABILITY,
    PROCESSES,
    Section,
    integers,
    non_blank,
    option,
)
from train.config.resilience import ResilienceArguments

# Below this many rows a tokenization process costs more to start than it saves (train.data's rule, stated here
# once so that preprocessing_num_workers' help says the number the data layer uses).
MIN_ROWS_PER_WORKER = 20_000


@dataclass
class ModelArguments(Section):
    """The model and its tokenizer: what trains, from what, with which head and attention."""

    model_name_or_path: str = option(
        "distilbert-base-uncased",
        "Hub id or local directory of a pretrained model; or an architecture to train from scratch: "
        "a config.json path or scratch:<model_type> (e.g. scratch:distilbert).",
        non_blank("a hub id, a local directory or scratch:<model_type>"),
    )
    config_overrides: str | None = option(None, "Model config overrides when training from scratch.", OVERRIDES)
    recipe: Literal["auto", "modern", "classic"] = option(
        "auto",
        "The values of the options a run leaves unset: modern (30 % masking, warmup-stable-decay, AdamW betas "
        "0.9/0.98, learning rate 1e-3, documents packed apart) or classic (the seed's and BERT's: 15 % masking, "
        "linear decay, the Trainer's defaults); auto: modern for a model trained from scratch, classic for a "
        "pretrained one. Any option set wins over the recipe.",
    )
    tokenizer_name: str | None = option(
        None,
        "Hub id or local directory of the tokenizer. Default: the model's; from scratch without one, "
        "a tokenizer of tokenizer_type is trained on the training text.",
    )
    tokenizer_type: Literal["auto", "wordpiece", "bpe", "unigram"] = option(
        "auto",
        "The kind of tokenizer trained from scratch: auto picks the model family's (WordPiece for BERT-likes, "
        "byte-level BPE for RoBERTa/ModernBERT-likes, Unigram for ALBERT/DeBERTa/XLM-R-likes).",
    )
    tokenizer_vocab_size: int = option(
        30522, "Vocabulary size of a tokenizer trained on the training text.", integers(1)
    )
    masked_only_head: bool = option(
        True,
        "Compute the vocabulary projection only at masked positions while training and evaluating (same loss and "
        "accuracy, less compute; every masked-LM whose head works position by position, checked before training); "
        "the saved model is unchanged.",
    )
    attn_implementation: Literal["auto", "eager", "sdpa", "flash_attention_2", "flex_attention"] = option(
        "auto",
        "auto: flash_attention_2 where it is installed, on a GPU, for a model that has it; else SDPA where the "
        "model has it, eager where not. The banner and run.json say which ran.",
    )
    trust_remote_code: bool = option(False, "Allow model/tokenizer code from the hub to run. Off unless set.")


@dataclass
class DataArguments(Section):
    """The training and held-out text: where it is, how much of it, how it is cut and batched."""

    dataset: str = option(
        "demo",
        "demo (the seed's data); a .txt/.jsonl/.json/.csv/.parquet file (text formats also .gz, .bz2, "
        ".xz, .zst), a directory or glob of them, local or remote (s3://, gs://, hf://, https://), or a local "
        "directory written by datasets.save_to_disk; or a hub dataset id. Several, mixed by their share of the "
        "training tokens: SOURCE=WEIGHT,SOURCE=WEIGHT (YAML: a mapping of source: weight; docs/data.md#mixtures).",
        non_blank("demo, a local path or a hub dataset id"),
    )
    mixture_exhausted: Literal["repeat", "stop"] = option(
        "repeat", "A mixture's epoch ends once every source was read whole (repeat) or the first one was (stop)."
    )
    dataset_config_name: str | None = option(None, "Config name of a hub dataset.")
    text_column: str = option("text", "Column holding the text.")
    validation_file: str | None = option(
        None,
        "Evaluation data (a file, directory or glob, local or remote); default: a split of the training data.",
    )
    validation_split_percentage: int = option(
        20,
        "Percent of the training data held out for evaluation when there is no validation data.",
        integers(0, 99),
    )
    max_seq_length: int = option(
        128, "Longest sequence in tokens (longer text is cut).", integers(MIN_SEQ_LENGTH, MAX_SEQ_LENGTH)
    )
    padding: Literal["dynamic", "max_length", "packed", "packed_crossing", "padding_free"] = option(
        "dynamic",
        "dynamic: pad to the longest in the batch (on GPU a multiple of 8); max_length: pad all to "
        "max_seq_length (the seed's way); packed: concatenate and cut into full max_seq_length blocks, each "
        "document attending to itself only, its positions restarting; packed_crossing: the same blocks with "
        "attention across documents (run_mlm.py's group_texts); padding_free: each batch as one row of its "
        "examples, apart, with no padding.",
    )
    pad_to_multiple_of: int = option(
        8,
        "Dynamic padding rounds lengths up to this (at most max_seq_length); for tensor cores, so the launcher "
        "makes it 1 on CPU unless set.",
        integers(1),
    )
    preprocessing_num_workers: int | None = option(
        None,
        "Processes for tokenization (default: one per CPU this container may use, cgroup quota included, when "
        f"each gets {MIN_ROWS_PER_WORKER:,} rows or more; else one).",
        integers(1, MAX_PROCESSES),
    )
    streaming: bool = option(
        False,
        "Read, tokenize and pack the corpus on the fly while training, each rank its own part, with no cache "
        "(corpora too large for the disk or to tokenize first); needs max_steps, and max_eval_samples or "
        "validation_file to evaluate.",
    )
    demo_samples: int = option(50000, "Number of samples of the demo dataset.", integers(1, MAX_DEMO_SAMPLES))
    max_train_samples: int | None = option(
        None,
        "Use at most this many training examples: rows of the text (documents or lines), counted before packing "
        "cuts them into blocks (the banner shows both).",
        integers(1),
    )
    max_eval_samples: int | None = option(
        None,
        "Use at most this many evaluation examples: rows of the text (documents or lines), counted before packing "
        "cuts them into blocks (the banner shows both).",
        integers(1),
    )


@dataclass
class MaskingArguments(Section):
    """What is masked, at which rate, while training and evaluating."""

    mlm_probability: float = option(
        0.15, "Fraction of tokens masked while training (at the first step, with final_mlm_probability).", OPEN_FRACTION
    )
    final_mlm_probability: float | None = option(
        None,
        "The training mask rate at the end: the rate goes linearly from mlm_probability to it over the run's steps "
        "(Ankner et al. 2023: 0.3 to 0.15); each training record logs the rate of its step, and evaluation keeps "
        "its fixed rate. Default: none, mlm_probability all along.",
        OPEN_FRACTION,
    )
    eval_mlm_probability: float | None = option(
        None,
        "Fraction of tokens masked for evaluation; default: mlm_probability (ModernBERT and MosaicBERT train at 0.3 "
        "and evaluate at 0.15).",
        OPEN_FRACTION,
    )
    mask_replace_prob: float = option(
        0.8, "Of the masked tokens, the fraction replaced by the mask token.", PROBABILITY
    )
    random_replace_prob: float = option(
        0.1,
        "Of the masked tokens, the fraction replaced by a random token (the rest stay unchanged; at most "
        "1 - mask_replace_prob).",
        PROBABILITY,
    )
    whole_word_mask: bool = option(
        False,
        "Mask whole words: each word is chosen with mlm_probability and all its tokens are masked (where words "
        "start comes from the tokenizer: WordPiece's ##, byte-level BPE's and SentencePiece's space markers).",
    )


@dataclass
class ScheduleArguments(Section):
    """The schedule beyond the Trainer's own options: the decay's share, the global batch and its warm-up."""

    decay_ratio: float = option(
        0.2,
        "The fraction of the steps that warmup_stable_decay decays over (lr_scheduler_kwargs' num_decay_steps "
        "wins); whatever the steps turn out to be: epochs, a time budget's plan.",
        OPEN_FRACTION,
    )
    batch_warmup_ratio: float = option(
        0.0,
        "Fraction of the steps over which the global batch grows linearly, in rows, from batch_warmup_start of its "
        "size to all of it (docs/models.md); each training record logs its rows. 0: the whole batch from the start.",
        FRACTION,
    )
    batch_warmup_start: float = option(
        0.25, "The batch's share of its size at a batch warm-up's first step.", OPEN_FRACTION
    )
    global_batch_size: int | None = option(
        None,
        "Samples per optimizer step across all ranks; gradient accumulation is derived from it and the world size.",
        integers(1),
    )


@dataclass
class AdaptingArguments(Section):
    """Adapting a pretrained encoder: its new head warmed up alone and at its own rate, layers kept frozen."""

    head_warmup_steps: int | None = option(
        None,
        "Steps at the start that train the MLM head alone, the encoder frozen; default: a new head (a pretrained "
        "model's, wholly or in part) for the learning rate's warm-up, else none (docs/models.md).",
        integers(0),
    )
    head_learning_rate: float | None = option(None, "The MLM head's own peak rate (default: learning_rate).", POSITIVE)
    freeze_layers: int | None = option(
        None, "Keep a pretrained model's embeddings and first N layers as loaded (0: the embeddings).", integers(0)
    )


@dataclass
class CheckpointArguments(Section):
    """How checkpoints are written, which one a run resumes from, and on what terms."""

    resume: str = option(
        "auto",
        "auto: continue from the newest complete checkpoint in output_dir; never; or a checkpoint's path or URL.",
        non_blank("auto, never or a checkpoint path"),
    )
    resume_on_changed_data: bool = option(
        False,
        "Resume from a checkpoint although the data changed since it was saved (a file of the corpus with another "
        "size or content, added or gone: the checkpoint records each). Off: such a resume is refused (exit 2) "
        "with what changed. On: it goes on, said in the log, run.json (resumed_on_changed_data) and the card.",
    )
    async_save: bool = option(
        True,
        "Write each checkpoint behind the training loop: the loop waits only while the state is copied to CPU "
        "memory, a thread writes it, its digests and its .complete marker, then rotates the older ones away; one "
        "save in flight at most (docs/outputs.md). Synchronous, said once, under sharding fsdp, with an output_dir "
        "in a store, with load_best_model_at_end and under a time budget. false: every save waits for its writes.",
    )
    save_keep_every: int = option(
        0,
        "Keep every checkpoint whose step is a multiple of this, besides the newest save_total_limit (a training "
        "trajectory for analysis: each kept one costs a checkpoint's size on disk, weights and optimizer); 0: none.",
        integers(0),
    )


@dataclass
class OutputArguments(Section):
    """Where outputs are written beyond output_dir itself: a store's staging, its retries, starting over."""

    staging_dir: str | None = option(
        None,
        "Where a run whose output_dir is in a store (s3://, gs://, any fsspec URL) writes before mirroring there: "
        "HF_HOME/mlm-trainer/staging/<a key of output_dir> when unset (the cache volume). It needs room for "
        "save_total_limit + 1 checkpoints and the final model; unused with a local output_dir.",
        non_blank("a directory"),
    )
    store_retry_timeout: int = option(
        300,
        "Seconds a call to an output_dir in a store keeps being retried on transient errors (connection lost, "
        "5xx, throttling), waiting 1 s, 2 s, 4 s... up to 30 s between at most 6 attempts.",
        integers(1, MAX_TIMEOUT_S, " seconds"),
    )
    overwrite_output_dir: bool = option(
        False,
        "Start over on an output_dir holding a finished final/ (otherwise the job refuses): its checkpoints are "
        "removed and final/ is replaced when this run ends (kept as final.previous/ until then).",
    )


@dataclass
class LaunchArguments(Section):
    """How the launcher starts the ranks: processes, GPUs, sharding, logs, restarts and timeouts."""

    nproc_per_node: str | None = option(
        None,
        "Processes per node: auto (the default) the visible GPUs, or 1 on CPU; gpu the visible GPUs (an error "
        "without one); cpu one per CPU core; or a number.",
        PROCESSES,
    )
    require_gpu: bool = option(False, "Fail (exit 3) instead of falling back to the CPU.")
    sharding: Literal["ddp", "fsdp", "auto"] = option(
        "ddp",
        "ddp: each rank holds the whole model, its gradients and optimizer state. fsdp: FSDP2 (fully_shard), each "
        "rank holds its share of them (about 1/N on N ranks): for a model whose training state does not fit one "
        "device; only rank 0 ever holds the whole model. fsdp takes no fp16; its checkpoints hold each rank's shard "
        "of the weights and optimizer state and resume on any number of ranks, resharded. auto: fsdp when DDP's "
        "memory estimate (weights, gradients, AdamW state, activations at the batch) does not fit 85 % of the "
        "smallest visible GPU, else ddp (train/run/sharding.py).",
    )
    log_ranks: str = option("0", "Local ranks whose output is shown.", LOCAL_RANKS)
    log_format: Literal["auto", "text", "json"] = option("auto", "auto: text on a terminal, JSON lines otherwise.")
    max_restarts: int = option(0, "torchrun restarts of a failed rank group.", integers(0, MAX_RESTARTS))
    rdzv_timeout: int = option(
        900, "Seconds to wait for all nodes at rendezvous.", integers(1, MAX_TIMEOUT_S, " seconds")
    )
    stop_timeout: int = option(
        270,
        "Seconds the ranks get, after SIGTERM/SIGINT/SIGUSR1/SIGUSR2, to save a checkpoint before torchrun kills "
        "them; keep it below the grace period (Kubernetes terminationGracePeriodSeconds 300, compose "
        "stop_grace_period 300s) and above the time a checkpoint takes to write.",
        integers(1, MAX_TIMEOUT_S, " seconds"),
    )
    image_revision: str | None = option(None, "Source revision of the image (set by it).")


@dataclass
class BudgetArguments(Section):
    """The wall time a run may take."""

    time_budget: str | None = option(
        None,
        "Wall time the run may take, launch to exit (90m, 2h, 1h30m, 45s, or seconds). After a few steps the job "
        "measures its step time and plans the steps so that training, the learning rate's decay, the final "
        "evaluation, saving and publishing end before it, with a margin; it only ever shortens the run the "
        "other options set. slurm: the Slurm job's end time (with a duration under Slurm, whichever comes first). "
        "A time with its zone (2026-12-03T18:00:00Z): the run ends by then, however late it starts (a Kubernetes "
        "Job's deadline, computed when it is submitted).",
        DURATION,
    )


@dataclass
class TaskArguments(Section):
    """finetune: the labelled task and the fixed recipe a model is fine-tuned and scored with."""

    task: str | None = option(
        None,
        "finetune: a labelled sequence-classification task: a directory holding train.* and test.* (csv, jsonl/json "
        "or parquet; a text column, a second one for pairs, a label column), a GLUE task by name (glue:sst2, "
        "glue:mrpc, ...: the hub's nyu-mll/glue) or a GLUE download's task folder (SST-2/; docs/downstream.md).",
        non_blank("a local directory or glue:NAME"),
    )
    task_text_column: str = option("text", "finetune: the task's column holding the text.", non_blank("a column"))
    task_text_pair_column: str = option(
        "text_pair",
        "finetune: the task's column holding a pair's second text; used when the files have it (named "
        "explicitly, it must be there).",
        non_blank("a column"),
    )
    task_label_column: str = option("label", "finetune: the task's label column.", non_blank("a column"))
    task_learning_rate: float = option(
        1e-4,
        "finetune: the peak learning rate of the fixed recipe (ELECTRA's fine-tuning default for small and base "
        "models; the rest of the recipe does not change).",
        POSITIVE,
    )
    task_epochs: int = option(3, "finetune: epochs over the task's training split.", integers(1, 1000))
    task_seeds: int = option(
        3,
        "finetune: how many times the fine-tuning runs, with seeds 0 to n-1 (the head's initialisation and the "
        "batches' order); the score is the mean and standard deviation over them.",
        integers(1, 100),
    )
    task_baselines: bool = option(
        False,
        "finetune: also fine-tune a randomly initialised model of the same architecture with the same recipe and "
        "seeds, so the results show what pretraining added.",
    )
    task_all_checkpoints: bool = option(
        False, "finetune: model_name_or_path is a run's output_dir: score each checkpoint-N/ and final/ in it."
    )


# The sections in the order the options are listed (help, docs/options.md), each with its name in the Config.
SECTIONS: tuple[tuple[str, type[Section]], ...] = (
    ("model", ModelArguments),
    ("data", DataArguments),
    ("masking", MaskingArguments),
    ("schedule", ScheduleArguments),
    ("adapting", AdaptingArguments),
    ("checkpoint", CheckpointArguments),
    ("outputs", OutputArguments),
    ("launch", LaunchArguments),
    ("budget", BudgetArguments),
    ("resilience", ResilienceArguments),
    ("task", TaskArguments),
)
