"""Run a trained diffusion policy: ``Controller.load(RUN)``, then ``reset(seed)`` per episode and
``select_action(obs)`` per control step, as diffusion policy's and LeRobot's policies are
called. The public entry point of the policy task (its control loop is tasks/policy/controller.py),
the one module outside tasks/ that names it, as online/ names the fields task."""

from __future__ import annotations

from pathlib import Path

from diffscale.diffusion.inference import sampling_network
from diffscale.errors import ArgumentError
from diffscale.inference.trained import load_trained
from diffscale.tasks.policy.controller import Controller as _Controller

__all__ = ["Controller"]


class Controller(_Controller):
    """A policy's control loop: ``reset(seed)`` per episode, ``select_action(obs)`` per step
    (obs (O,) -> action (A,), or environments (B, O) -> (B, A), in the data's units).

    >>> from diffscale.policy import Controller
    >>> policy = Controller.load("runs/policy", device="cuda")   # doctest: +SKIP
    >>> policy.reset(seed=0)                                      # doctest: +SKIP
    >>> action = policy.select_action(obs)                        # doctest: +SKIP
    """

    @classmethod
    def load(cls, run_dir: Path | str, *, device: str | None = None, sampler: str | None = None,
             steps: int | None = None) -> Controller:
        """The newest checkpoint of the policy run ``run_dir`` on ``device`` (default: the run's),
        its EMA weights on the compiled inference network (CUDA graphs and the whole denoising
        loop recorded as one on CUDA; fp32, compiled, on a CPU). ``sampler``: ``ddpm`` (default, the
        process the run trained) or ``ddim``; ``steps``: denoising steps per plan (default: the
        run's ``train.sample_steps``, as its previews and ``diffscale eval`` sample)."""
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ArgumentError(f"Controller.load(steps={steps!r}): a plan needs a whole number of denoising steps, "
                                "at least one", "pass steps >= 1, or leave steps out for the run's train.sample_steps")
        run = load_trained(Path(run_dir), device)
        network = sampling_network(run.network, run.cfg.runtime, many_calls=True)
        sampler, steps = run.cfg.train.sampling(sampler, steps, task_sampler=run.task.evaluation_sampler)
        return cls(run.task, network, sampler=sampler, steps=steps)
