"""``make bench``: the seed recipe against our default recipe on the same model and data (see bench/run.py)."""
