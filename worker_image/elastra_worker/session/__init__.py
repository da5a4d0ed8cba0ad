"""The parts a ``Session`` (``api.py``) is made of, split the way PyTorch's large-model trainers
split theirs; ``Session`` is the facade a training script uses and holds no logic of its own.

- ``world.py``: the trainer's rank, the plan's parallel dimensions, device, process groups, mesh
- ``model.py``: ``prepare`` (tensor parallel, FSDP or DDP for the plan) and the model parts held
- ``state.py``: registered objects, ``user_state`` and RNG state, as checkpoint blobs
- ``checkpoints.py``: the checkpoint manager: restore the newest good step, save, wait
- ``data.py``: the data position: the step count, the job's sample order, sampler and loader
- ``gradients.py``: the gradient reduction a bare module needs, loss weights, clipping
- ``scaling.py``: precision in the step: autocast, the GradScaler, the optimizer update
- ``loop.py``: the step loop: batches, micro-batches, the per-step agreement of all ranks
- ``records.py``: the step log, progress for the agent, the parameter hash
- ``carry.py``: a survivor of a resize into the next world in its own process, state in memory
- ``peers.py``: a live model's state sent from one member to the others (a joiner)
- ``peerdcp.py``: DCP storage in the members' memory, loaded resharded from the members
- ``rerun.py``, ``kept.py``: the script run again for the next world, and what it keeps for it
"""
