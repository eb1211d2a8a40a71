"""The launcher: decide once, run torchrun, translate its exit.

topology.py   the cluster environment -> Topology (which node, how many, where they meet; its Mode)
slurm.py      a Slurm job step and its host-list grammar (node 0 is the step's first host)
rendezvous.py the wait for the rendezvous address to resolve, and the hint when it never does
variables.py  reading the cluster's variables: the first one set, an integer in bounds
decide.py     pure decisions: processes per node, precision, global batch, /dev/shm
plan.py       all decisions for this node as one Plan, the torchrun command, the plan document
torchrun.py   run torchrun, forward signals, relay stderr, translate exit codes
__main__.py   python -m train.launch {train|plan}
"""
