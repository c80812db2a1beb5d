"""Training: the GRPO objective and everything an engine needs to update a policy.

* :mod:`.grpo`: advantages and losses, pure functions on tensors.
* :mod:`.assembly`: a step's batch from finished groups (dynamic sampling's filters).
* :mod:`.overlong`: trajectories a length limit cut off (DAPO's filter and soft penalty).
* :mod:`.batch`: the rollout batch (a TensorDict, one row per trajectory) and micro-batches.
* :mod:`.logprobs`: the policy's logprobs of the sampled tokens.
* :mod:`.update`: the optimizer steps on one batch (single process or one FSDP rank).
* :mod:`.fsdp`: FSDP2 sharding for a trainer group, and its checkpoints in the local format.
* :mod:`.policy`: the policy, the reference model and the optimizer, for every engine.
* :mod:`.checkpoint`: checkpoints, written atomically, and resuming from them.

The package imports nothing heavy itself; import the module you need.
"""
