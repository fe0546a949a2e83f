"""The Task protocol: everything the loop, checkpoints, sampling, bench and export need from a
kind of diffusion problem, and nothing more.

The loop, checkpointing and distributed code are the same for every task. A task owns
its data (resident on the device), its network (single-device code), its state beyond
the weights (normalisation statistics, a replay buffer), generation and what a preview
shows. All randomness of an optimizer step is drawn for the *global* batch from a
generator seeded by (seed, step), identically on every rank; each rank then computes the
loss of its own rows. So results depend on the effective batch, not on how it is split
over processes and accumulation steps.

Where the data comes from while training is the task's too: ``batcher`` returns the stream of
global batches (an epoch permutation of resident data, or draws from a replay buffer that a
spool directory fills while training runs). The loop only asks it for the next indices.

If adding a task needs an ``if task == ...`` outside ``tasks/``, this protocol is missing
a method.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.utils.data import Dataset

from diffscale.data.device_loader import DataPosition
from diffscale.data.feed import Batcher, Feed
from diffscale.errors import UserError

Autocast = Callable[[], AbstractContextManager[Any]]
"""A zero-argument context manager factory (``DevicePolicy.autocast``)."""


@dataclass
class Generated:
    """What ``Task.generate`` returns: samples on the CPU in the task's own units, and the
    denoising trajectory when asked for (each frame shaped like ``samples``)."""

    samples: torch.Tensor
    frames: list[torch.Tensor] = field(default_factory=list)


@dataclass
class ReferenceData:
    """The data as the common hand-written loop reads it, for ``diffscale bench``'s plain
    recipe: a CPU data set, the collate function its loader workers run, and its precision."""

    dataset: Dataset
    collate: Callable[[list[Any]], Any]
    fp16: bool = True
    """The loop runs its forward pass under fp16 autocast with a GradScaler on CUDA (the common
    image recipe); False: fp32 throughout, as the field and policy reference loops do."""


@dataclass(frozen=True)
class HubListing:
    """How an exported folder presents itself on a model hub (the model card's front matter) and
    the Python that loads it."""

    library_name: str
    """The library that loads the folder (the Hub's ``library_name``)."""
    pipeline_tag: str | None
    """The Hub's task category, or None where none of its categories describes the model."""
    tags: tuple[str, ...]
    loading_code: str
    """Python source that loads the folder named by the variable ``folder`` (a path, or a Hub repo
    id where ``loads_hub_ids``) and samples from it, runnable as written on a CPU."""
    loads_hub_ids: bool = False
    """Whether the library takes a Hub repo id for ``folder`` (else it is downloaded first)."""


class Task(Protocol):
    name: str
    records_whole_steps: bool
    """Whether ``runtime.step_graph auto`` records this task's optimizer steps as one CUDA graph:
    its ``loss`` reads only tensors that stay in place during a run (data resident or in a
    preallocated buffer, statistics fitted once), and recording was measured faster for it."""
    records_whole_ddp_steps: bool
    """The same for DDP runs (the gradient all-reduces recorded too), measured on its own: a
    network whose one-GPU step keeps its host ahead may still gain under DDP, where one rank's
    slow host makes every other rank wait."""
    evaluation_sampler: str | None
    """The reverse process ``evaluate`` runs where none is named (``diffscale eval``, a loaded
    controller), where the task fixes one whatever the run's ``train.sample_sampler`` says; None:
    the run's ``train.sample_sampler`` (``TrainConfig.sampling`` applies the rule)."""

    def num_items(self) -> int:
        """Examples in the data set (one epoch)."""
        ...

    def describe_data(self) -> str:
        """One line for the banner."""
        ...

    def build_network(self) -> torch.nn.Module:
        """The denoiser, on the CPU, in fp32. Called as ``network(*example_inputs)``."""
        ...

    def signature(self) -> dict[str, Any]:
        """What must match for a checkpoint to load into this task's network (JSON-able).
        A task built without data (``load_data=False``) takes its sizes from this."""
        ...

    def batcher(self, global_batch: int, seed: int, position: DataPosition, feed: Feed) -> Batcher:
        """The run's stream of ``global_batch`` indices from ``position`` (seeded by ``seed``).
        May block while data is still to arrive (saying so through ``feed``), and raise
        ``StopWaiting`` when ``feed.stopping()`` turns true meanwhile."""
        ...

    def draw(self, indices: torch.Tensor, generator: torch.Generator,
             out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """All random inputs of one global batch (same on every rank). ``indices``: (B,) rows of the data.
        ``out``: an earlier draw's tensors (a recorded step's inputs), drawn into in place and
        returned: the same values as a new draw, without allocating (``out['indices']`` takes
        ``indices`` unless it is that tensor already)."""
        ...

    def examples(self, batch: dict[str, torch.Tensor], rows: slice) -> dict[str, torch.Tensor]:
        """The clean training examples (and conditions) of ``rows`` of a drawn batch, on the
        device, augmented and normalised: the data part of a step, without the network."""
        ...

    def loss(self, network: torch.nn.Module, batch: dict[str, torch.Tensor], rows: slice,
             *, channels_last: bool) -> torch.Tensor:
        """Scalar loss of ``rows`` of the global batch."""
        ...

    def example_inputs(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        """Random network inputs of ``batch_size`` rows on the task's device (FLOP counting)."""
        ...

    def generate(self, network: torch.nn.Module, *, count: int, steps: int, seed: int, sampler: str = "ddim",
                 rows: slice | None = None, autocast: Autocast | None = None,
                 trajectory: bool = False, classes: Sequence[str] = (), guidance: float | None = None) -> Generated:
        """``count`` samples from ``seed``; with ``rows``, only those rows of the same seeded draw
        (ranks sharing the work together produce exactly the single-process samples). A
        class-conditional model draws the ``classes`` given (names or indices; none: the task's
        choice) with classifier-free guidance scale ``guidance`` (None: the run's); other models
        refuse both (``no_classes``)."""
        ...

    def sample_for(self, network: torch.nn.Module, cond: Any, *, members: int, steps: int, seed: int,
                   sampler: str = "ddim", autocast: Autocast | None = None) -> torch.Tensor:
        """An ensemble for each given condition (``diffscale sample --cond``): cond (N, C) in the
        data's units, a tensor or a NumPy array -> (N, members, *sample shape) on the CPU, in the
        data's units. Raises ``UserError`` where the task samples from no conditions a user gives."""
        ...

    def write_samples(self, generated: Generated, path: Path) -> list[Path]:
        """Write what a preview shows of ``generated`` to ``path`` (a ``.png``); returns the files."""
        ...

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Task state beyond the weights that a checkpoint keeps (normalisation statistics, a
        replay buffer); empty when there is none."""
        ...

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Restore what ``state_tensors`` returned (tensors on the CPU)."""
        ...

    def evaluate(self, network: torch.nn.Module, out_dir: Path, *, count: int | None, steps: int,
                 seed: int, env: str = "auto", max_episode_steps: int | None = None,
                 data: str | None = None, sampler: str | None = None,
                 guidance: float | None = None) -> Mapping[str, float | str]:
        """Score the trained ``network`` (EMA weights, as sampling runs it) and write what shows
        it (plots, rollout GIFs) to ``out_dir``: ``count`` rollouts or ensemble members (None:
        the task's default), ``steps`` denoising steps each; a task that rolls out in an
        environment runs it in ``env`` (``auto``: the data's own), episodes cut off after
        ``max_episode_steps`` (None: the environment's limit), and the others refuse those
        (``no_environment``); ``data``: a data spec of held-out pairs to score on, for a task
        that scores pairs (the others refuse it). ``sampler``: the reverse process (None:
        ``evaluation_sampler``, or the run's ``train.sample_sampler`` where that is None).
        ``guidance``: a class-conditional model's classifier-free guidance scale (None: the run's;
        models without classes refuse it, ``no_classes``). Raises ``UserError`` where the task
        has no evaluation."""
        ...

    def prepare_quality(self) -> None:
        """Make ready what ``quality_features``/``quality_scores`` need (a feature network, the
        data's features) before training starts, on every rank; raises ``UserError`` where the
        task has no quality metrics (``train.eval_every`` is then refused before the first step)."""
        ...

    def quality_features(self, network: torch.nn.Module, *, count: int, steps: int, seed: int, sampler: str = "ddim",
                         rows: slice | None = None, autocast: Autocast | None = None) -> torch.Tensor:
        """Features (rows, D) of ``rows`` of ``count`` samples generated from ``seed`` (as
        ``generate`` draws them), on the CPU: ranks each compute their rows and gather them."""
        ...

    def quality_scores(self, features: torch.Tensor) -> dict[str, float]:
        """Quality metrics of all generated samples' features (N, D) against the data's (no collectives)."""
        ...

    def export(self, network: torch.nn.Module, out_dir: Path) -> str:
        """Write the EMA network in the format the field's tools load; returns how to load it.
        Raises ``UserError`` where the task has no such format."""
        ...

    def hub_listing(self) -> HubListing:
        """The model card's library, Hub category and tags, and the code that loads an export."""
        ...

    def reference_data(self) -> ReferenceData:
        """The data set and collate function of the common hand-written loop (bench's plain recipe)."""
        ...

    def reference_loss(self, network: torch.nn.Module, examples: Any) -> torch.Tensor:
        """The loss of one plain-recipe batch (``examples`` as the collate made it, on the device;
        noise and timesteps from the global RNG, as the hand-written loop draws them)."""
        ...


def into(out: dict[str, torch.Tensor] | None, name: str) -> torch.Tensor | None:
    """Where a draw named ``name`` goes: a recorded step's input (``Task.draw``'s ``out``), or
    None, a new tensor (torch's ``out=None``)."""
    return None if out is None else out[name]


def kept(out: dict[str, torch.Tensor] | None, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, or the recorded step's input ``name`` holding its values (a copy unless it is
    that input already)."""
    if out is None or out[name] is tensor:
        return tensor
    return out[name].copy_(tensor)


def no_environment(task: str, env: str, max_episode_steps: int | None) -> None:
    """Refuse rollout settings in the evaluation of a task that runs no environment."""
    if env != "auto" or max_episode_steps is not None:
        raise UserError(f"{task} runs are evaluated without an environment: --env and --max-episode-steps are for "
                        "policy runs", "drop --env and --max-episode-steps")


def no_classes(task: str, classes: Sequence[str], guidance: float | None, *,
               trained: str = "not class-conditional") -> None:
    """Refuse classes and a guidance scale in the sampling of a model without classes."""
    flags = [flag for flag, given in (("--class", bool(classes)), ("--guidance", guidance is not None)) if given]
    if flags:
        raise UserError(f"{' and '.join(flags)} {'need' if len(flags) > 1 else 'needs'} a class-conditional "
                        f"images run; this {task} run is {trained}",
                        "drop --class and --guidance, or train on labelled images with "
                        "--set model.class_conditional=on")


def no_given_data(task: str, data: str | None) -> None:
    """Refuse held-out data in the evaluation of a task that scores no pairs."""
    if data is not None:
        raise UserError(f"{task} runs are not scored on given pairs: --data is for fields runs", "drop --data")


def no_feature_network(task: str, features: str) -> None:
    """Refuse a feature network (``--features``/``train.eval_features``) in an evaluation that uses none."""
    if features:
        raise UserError(f"{task} runs are evaluated without a feature network: --features (train.eval_features) "
                        "is for image runs", "drop --features")


def no_quality(task: str) -> UserError:
    """The refusal of quality metrics by a task that has none."""
    return UserError(f"{task} runs have no sample-quality metrics (train.eval_every is for image runs)",
                     "set train.eval_every to 0 and score the run with diffscale eval RUN_DIR")


class WithoutQualityMetrics:
    """The quality part of the ``Task`` protocol for a task without sample-quality metrics:
    each call is refused with the fix (``train.eval_every`` is then refused before training)."""

    name: str

    def prepare_quality(self) -> None:
        raise no_quality(self.name)

    def quality_features(self, network: torch.nn.Module, *, count: int, steps: int, seed: int, sampler: str = "ddim",
                         rows: slice | None = None, autocast: Autocast | None = None) -> torch.Tensor:
        raise no_quality(self.name)

    def quality_scores(self, features: torch.Tensor) -> dict[str, float]:
        raise no_quality(self.name)


def preview(task: Task, network: torch.nn.Module, path: Path, *, count: int, steps: int, seed: int,
            sampler: str = "ddim", trajectory: bool = False, autocast: Autocast | None = None,
            classes: Sequence[str] = (), guidance: float | None = None) -> list[Path]:
    """Generate and write in one process (``diffscale sample``)."""
    generated = task.generate(network, count=count, steps=steps, seed=seed, sampler=sampler, trajectory=trajectory,
                              autocast=autocast, classes=classes, guidance=guidance)
    return task.write_samples(generated, path)


def count_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
