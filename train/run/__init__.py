"""The per-rank program torchrun starts (``python -m train.run.job``): build (config -> a typed ``Prepared``),
the Trainer subclass and its callbacks, preemption, what a run amounts to (outcome), crash lines, logs and the
banner. It receives the launcher's decisions and asks outputs/ where its files live; the sub-commands beside it
(evaluate, finetune, prepare, average) are train/commands/."""
