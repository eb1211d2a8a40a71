"""The sub-commands beside the training job, each started one way (train/commands/start.py): ``evaluate`` (a model
scored on the held-out text) and ``finetune`` (scored on a labelled task), which the launcher runs under torchrun as
it runs the job; ``prepare`` (the corpus tokenized into the cache) and ``average`` (models' weights averaged), one
process each, behind ``entrypoint.sh``. They build on the per-rank program's pieces (train/run/), which never import
them."""
