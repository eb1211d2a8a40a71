"""Where a run's outputs live, decided once (location: a directory, or a bucket through a staging directory,
behind one set of methods), every file name in them (runfiles), which checkpoint is whole and which a run resumes
from (checkpoints), one job per output_dir (lease, store_lease), the directory's own operations (local), the
store and its mirror (store, mirror) and the run's record (record). Nothing here knows the model or the Trainer's
internals."""
