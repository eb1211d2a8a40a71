"""The machine a node runs on: the only NVML reader (gpus: inventory, visibility rules, driver check; sampler:
utilisation while training) and the CPUs and shared memory the container may use (resources).
``python -m train.machine [--json]`` prints the inventory."""
