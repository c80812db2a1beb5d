"""The schedules of a run's steps. Each is one module with one ``run_steps(run)``, a loop over
the phases of :mod:`rlfactory_core.steps` on an open :class:`~rlfactory_core.run.Run`:

* :mod:`.sync` (``train.mode=sync``, the default): each step's rollout, update and weight
  sync in turn; every trained token sampled by the weights being trained.
* :mod:`.one_step_off`: step ``k + 1``'s rollout runs while step ``k`` trains and syncs;
  tokens at most one policy version old.
* :mod:`.asynchronous` (``train.mode=async``): groups generated continuously
  (:mod:`rlfactory_core.stream`), up to ``train.max_staleness`` versions ahead.
"""

from __future__ import annotations

__all__: list[str] = []
