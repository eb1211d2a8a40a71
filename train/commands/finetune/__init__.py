"""``./entrypoint.sh finetune``: a model fine-tuned on a labelled task with one fixed recipe over seeds, and scored
(``command``: the command, run as ``python -m train.commands.finetune`` under torchrun; ``recipe``: the recipe's
settings and TrainingArguments; ``scores``: accuracy, macro F1 and MCC, their mean and spread, and the score's
line; ``series``: a run's checkpoints and final model verified and placed by step, tokens and time, and the model
the run started from)."""
