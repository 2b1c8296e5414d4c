"""The RL step and what surrounds it: trainer loop, learner, batches, SFT warm start, checkpoints,
evaluation, the memory plan and the preflight checks."""
