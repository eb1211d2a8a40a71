"""The launcher: decide once, run torchrun, translate its exit.

topology.py   the cluster environment -> Topology (which node, how many, where they meet)
decide.py     pure decisions: processes per node, precision, global batch, /dev/shm
plan.py       all decisions for this node as one Plan, the torchrun command, the plan document
torchrun.py   run torchrun, forward signals, relay stderr, translate exit codes
__main__.py   python -m train.launch {train|plan}
"""
