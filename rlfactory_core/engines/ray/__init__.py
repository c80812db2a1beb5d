"""The ray engine (``engine: ray``): the engine protocol (:mod:`rlfactory_core.engines.base`)
with its work placed on Ray actors (:mod:`.actors`; the driver side is :mod:`.engine`, FSDP2
is :mod:`rlfactory_core.training.fsdp`).

Roles (``ray.*`` in the config sets each one's actors and resources):

* **Rollout workers** (``ray.rollout``): each builds the run's task (env, parser, tool
  manager, rewards) and its own generation backend (vLLM or hf), and runs the agent loop
  *and the rewards* on its share of the step's prompts, so the env's per-trajectory state
  and the tools stay where the episode ran. The prompts are split into contiguous chunks
  and each chunk keeps the sampling seeds it has on the local engine (trajectory ``i`` uses
  ``seed + i``), so the same weights give the same trajectories on either engine.
* **Trainer group** (``ray.trainer``): N actors in one ``torch.distributed`` group (gloo on
  CPU, NCCL on GPU). The policy, and the reference model when ``grpo.kl_coef > 0``, are
  sharded with FSDP2 (``fully_shard`` on every decoder layer, then on the whole model);
  each rank back-propagates every N-th micro-batch of the same batch, and the update is the
  single-process one (:func:`rlfactory_core.training.update.update_policy` with a
  ``DataParallel``; tested to give
  the same weights as the local engine). So is the cold start's warm-up
  (:func:`rlfactory_core.training.cold_start.supervised_update`, also tested for parity); its
  examples are collected by the driver: rejection sampling through the rollout workers,
  demonstrations replayed and scored in the driver's own task.
* **Judge pool** (``ray.judge``, used when ``ray.judge.rewards`` names rewards): those
  rewards (a judge model) are built once, on their own resources, and the rollout workers'
  reward layers send them the trajectories; timeouts, fallbacks and error counts stay the
  reward layer's.
* **Tool actors** (``ray.tool_actors.names``): one actor serves each named env tool for the
  whole job (one retriever in memory, one rate limit for an API); the rollout workers' tool
  managers call it like a local tool, so its failures reach the model as tool errors. The
  tool gets the sample in its context, not the env state.

Each step: the driver (``rlf train``) sends the prompts to the rollout workers and gathers
trajectories and rewards; builds the batch (advantages) and puts it in the object store
once; every trainer rank updates; rank 0 gathers the full weights from the shards
(``get_model_state_dict``, full and on CPU), and that one object goes to every rollout
worker, which loads it into its backend in place (``weight_sync/mb`` and
``weight_sync/ms_per_mb`` are logged). The latest weights stay in the object store, so a
replacement worker starts from them.

Faults: a rollout worker that dies is replaced (same placement bundle, latest weights) and
its prompts run again; one found dead when the new weights are pushed is replaced by a worker
that starts from them; both count against ``ray.max_restarts`` replacements a step, beyond
which the run fails saying so (0: any lost worker ends the run); tool and judge actors are
restarted by Ray, and the calls that failed meanwhile are tool errors or reward errors. A
trainer rank that dies ends the run with a message naming it: its shards are gone; resume
from the last checkpoint (``rlf train --resume``, on either engine).

Checkpoints are the local engine's format: rank 0 writes the full weights in HF format and
the optimizer state indexed like ``torch.optim.AdamW`` over the model's parameters, so a
ray run resumes on the local engine and a local run on the ray engine.

Placement: ``colocated`` (the default) gives trainer rank i and rollout worker i one bundle
(``cpus``/``gpus`` of both roles): they take turns, as verl's hybrid engine does (sync:
rollout, then update; an overlapping ``train.mode``: every worker's generation pauses, its
requests kept, while the ranks update, so the rollout's waits on tools and servers still
overlap the update; a worker replaced meanwhile starts unpaused); ``separate`` gives each
role its own placement group. Requests the cluster cannot meet are reported with what the
cluster has. The cluster is ``ray.address``, else ``$RAY_ADDRESS``, else a local one started
for the run (``ray.num_cpus``/``ray.num_gpus``); an address where nothing answers is refused
at once (``ray.init`` would retry it for minutes).
"""

from .engine import RayEngine

__all__ = ["RayEngine"]
