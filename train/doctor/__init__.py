"""A preflight before a long job: ``python -m train.doctor [options]`` (``entrypoint.sh doctor``).

It takes the same options as a training run (YAML, MLM_* variables, flags) and the same environment, so it checks
the run you are about to start. One row per check, OK / WARN / FAIL / SKIP, with a fix under a WARN or FAIL (or in
its message, where the rule's own message names the fix):

    gpus              the GPUs this run may use (train.machine.gpus: NVML, NVIDIA_VISIBLE_DEVICES, MIG,
    CUDA_VISIBLE_DEVICES) driver            the driver against torch's CUDA build (train.machine.gpus.check_driver)
    torch.cuda        torch sees those GPUs and computes on each (doctor's own probe)
    /dev/shm          room for the dataloader workers (train.launch.decide.shm_warning)
    processes / plan  the launcher's own plan: processes, backend, precision, batch; FAIL ("plan") where the
                      launcher would refuse to start (train.launch.plan.make_plan)
    output_dir        writable with free space, no finished final/, the checkpoint a run would resume from
    cache (HF_HOME)   writable with free space (train.common.hf)
    model, tokenizer, dataset   local paths exist; hub ids answer, or are cached when offline
    nccl              an all-reduce across the plan's GPUs, with its bus bandwidth
    master            multi-node: the rendezvous address resolves and answers, or its port is free on the node
                      that hosts it (train.launch.topology)

Exit codes: 0 when no row FAILs, 3 when one does, 2 on a configuration error (the options do not parse).

    rows.py      the Check row, the table and the JSON document
    machine.py   gpus, driver, torch.cuda, /dev/shm, the plan
    storage.py   output_dir and the HF cache
    sources.py   model, tokenizer, dataset and the hub
    network.py   NCCL all-reduce, master / rendezvous
    __main__.py  run_checks and main
"""
