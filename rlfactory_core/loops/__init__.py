"""The schedules of a run's steps. Each is one module with one ``run_steps(run)``, a loop over
the phases of :mod:`rlfactory_core.steps` on an open :class:`~rlfactory_core.run.Run`:

* :mod:`.sync` (the only one so far): each step's rollout, update and weight sync in turn.
"""

from __future__ import annotations

__all__: list[str] = []
