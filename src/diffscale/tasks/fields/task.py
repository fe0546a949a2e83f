"""Conditional field diffusion: a condition ``c`` (C values) -> a field ``x`` (D values, or D x K).

The network sees standardised values: per-feature means and standard deviations of the
condition and the field, computed from the data at the start of a run, are task state
(saved in checkpoints, restored on resume and for sampling), applied to every training
batch and undone on every generated sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from diffscale.config import FieldModelConfig, RunConfig
from diffscale.data.device_loader import DataPosition, DeviceBatcher
from diffscale.data.feed import Batcher, Feed
from diffscale.data.locations import SpoolSpec, parse_spool_spec
from diffscale.diffusion import Conditioned, GaussianDiffusion, Sampler, SamplerKind, evaluating, sample
from diffscale.errors import UserError
from diffscale.tasks.base import (
    Autocast,
    Generated,
    HubListing,
    ReferenceData,
    WithoutQualityMetrics,
    into,
    kept,
    no_classes,
    no_environment,
    no_feature_network,
)
from diffscale.tasks.fields.buffer import BufferBatcher, BufferPolicy, BufferSpec, ReplayBuffer, parse_buffer_spec
from diffscale.tasks.fields.data import FieldData, load_fields, sizes_of_data, sizes_of_signature
from diffscale.tasks.fields.follow import SpoolBatcher
from diffscale.tasks.fields.network import FieldMLP
from diffscale.tasks.fields.spool import SpoolReader
from diffscale.tasks.fields.standardise import StandardiseCollate, Standardiser

PREVIEW_CONDITIONS = 4
"""Conditions a preview samples for (members are spread over them); kept in the task state."""
EVAL_MEMBERS = 16
"""Ensemble members ``evaluate`` samples per condition unless told."""
EVAL_CASES = 512
"""Conditions ``evaluate`` scores."""
STAT_KEYS = ("cond_mean", "cond_std", "x_mean", "x_std", "preview_cond", "preview_x")
"""Task state tensors of every field run (a buffer's come on top)."""
SAMPLE_CHUNK = 16384
"""Rows denoised at once when sampling many conditions x members (bounds memory)."""


class FieldTask(WithoutQualityMetrics):
    name = "fields"
    records_whole_steps = True  # 2,400-step rounds: docs/benchmarks.md, "Field diffusion"
    records_whole_ddp_steps = False  # not measured yet
    evaluation_sampler: str | None = None  # the run's train.sample_sampler
    cond: torch.Tensor
    """(N, C) conditions on the device, in data units (set once the data is read)."""
    x: torch.Tensor
    """(N, *x_shape) fields on the device, in data units (set once the data is read)."""

    def __init__(self, cfg: RunConfig, device: torch.device, *, load_data: bool = True,
                 signature: dict[str, Any] | None = None) -> None:
        assert isinstance(cfg.model, FieldModelConfig), "the config loader picks the model section by task"
        self.cfg = cfg
        self.model_cfg: FieldModelConfig = cfg.model
        self.device = device
        if cfg.diffusion.clip_sample:
            raise UserError("config diffusion.clip_sample is true: sampling would clip standardised fields to [-1, 1] "
                            "(every value beyond one standard deviation)", "set diffusion.clip_sample: false "
                            "(the field presets do)")
        self.diffusion = GaussianDiffusion(cfg.diffusion)
        self.data: FieldData | None = None
        self.buffer: ReplayBuffer | None = None
        self.spool: SpoolSpec | None = None
        self.stats_fitted = True
        if cfg.data.source.startswith(("online:", "spool:")):  # fed while training: sizes from config or checkpoint
            self.cond_dim, self.x_dim, self.fields = sizes_of_signature(self.model_cfg, signature)
            self.buffer = ReplayBuffer(self._buffer_spec(load_data), self.cond_dim, self.x_shape, device,
                                       seed=cfg.train.seed)
            self.cond, self.x = self.buffer.cond, self.buffer.x
            self._unfitted()
        elif load_data:
            self._read_data()
            self.fit_statistics()
        else:  # sizes from the checkpoint; statistics and previews come with load_state_tensors
            self.cond_dim, self.x_dim, self.fields = sizes_of_signature(self.model_cfg, signature)
            self._unfitted()
        if self.model_cfg.coarse_index >= self.cond_dim:
            raise UserError(f"config model.coarse_index: {self.model_cfg.coarse_index} is past the condition's "
                            f"{self.cond_dim} values", f"use 0..{self.cond_dim - 1}, or -1 for none")

    def _buffer_spec(self, load_data: bool) -> BufferSpec:
        """The buffer of ``online:POLICY:N``, or the FIFO of ``spool:DIR[:N]`` (whose directory
        must exist when the run reads data; sampling a trained run does not need it)."""
        source = self.cfg.data.source
        if not source.startswith("spool:"):
            return parse_buffer_spec(source)
        self.spool = parse_spool_spec(source)
        if load_data and not self.spool.directory.is_dir():
            raise UserError(f"spool directory '{self.spool.directory}' does not exist",
                            "check the path given to --data spool:DIR, or create it (the simulation's SpoolWriter "
                            "creates it when it starts)")
        return BufferSpec(BufferPolicy.FIFO, self.spool.capacity)

    def _unfitted(self) -> None:
        """Identity statistics and empty previews until data or a checkpoint provides them."""
        zeros, ones, device = torch.zeros, torch.ones, self.device
        self.stats = Standardiser(zeros(self.cond_dim, device=device), ones(self.cond_dim, device=device),
                                  zeros(self.x_shape, device=device), ones(self.x_shape, device=device))
        self.preview_cond = zeros((PREVIEW_CONDITIONS, self.cond_dim), device=device)
        self.preview_x = zeros((PREVIEW_CONDITIONS, *self.x_shape), device=device)
        self.stats_fitted = False

    def fit_statistics(self) -> None:
        """Standardisation statistics and preview conditions from the data held now (at the start
        of a run; for a buffer, once it is first ready). They stay fixed for the rest of the run."""
        n = self.num_items()
        cond, x = self.cond[:n], self.x[:n]
        self.stats = Standardiser.fit(cond, x)
        picks = torch.randperm(n, generator=torch.Generator().manual_seed(self.cfg.train.seed))
        picks = picks[:PREVIEW_CONDITIONS].to(self.device)
        self.preview_cond, self.preview_x = cond[picks], x[picks]
        self.stats_fitted = True

    def _read_data(self, expected: tuple[int, int, int] | None = None) -> FieldData:
        """Read ``data.source`` (onto the device too); ``expected``: the (C, D, K) it must hold."""
        data = load_fields(self.cfg.data.source, max_items=self.cfg.data.max_items)
        sizes = sizes_of_data(self.model_cfg, data)
        if expected is not None and sizes != expected:
            raise UserError(f"{data.label} holds cond {sizes[0]} -> x {sizes[1]} x {sizes[2]} but the model was "
                            f"trained for {expected[0]} -> {expected[1]} x {expected[2]}",
                            "point data.source at the data the run was trained on")
        self.cond_dim, self.x_dim, self.fields = sizes
        if self.fields == 1 and data.x.dim() == 3:
            data.x = data.x[..., 0]
        self.data = data
        self.cond, self.x = data.cond.to(self.device), data.x.to(self.device)
        return data

    @property
    def x_shape(self) -> tuple[int, ...]:
        """Shape of one field: (D,) or (D, K)."""
        return (self.x_dim,) if self.fields == 1 else (self.x_dim, self.fields)

    def training_data(self) -> FieldData:
        """The data (CPU tensors): a buffer's contents, or read from ``data.source`` now if the
        task was built without it."""
        if self.buffer is not None:
            size = self.buffer.size
            return FieldData(self.cond[:size].cpu(), self.x[:size].cpu(), self.buffer.describe())
        if self.data is None:  # built for a trained run: its statistics stay those restored
            return self._read_data(expected=(self.cond_dim, self.x_dim, self.fields))
        return self.data

    # -- protocol: data and network ----------------------------------------------------------
    def num_items(self) -> int:
        return self.buffer.size if self.buffer is not None else int(self.training_data().cond.shape[0])

    def describe_data(self) -> str:
        if self.spool is not None and self.buffer is not None:
            return f"spool {self.spool.directory}: {self.buffer.describe()}; trains once it is full"
        return self.buffer.describe() if self.buffer is not None else self.training_data().describe()

    def batcher(self, global_batch: int, seed: int, position: DataPosition, feed: Feed) -> Batcher:
        """Resident data: epochs of a permutation. A buffer: draws from what it holds now (an
        ``OnlineTrainer`` fills it). A spool: the same, filled from the spool before each draw."""
        if self.buffer is None:
            return DeviceBatcher(self.num_items(), global_batch, seed, self.device, position)
        if self.spool is None:
            return BufferBatcher(self.buffer, global_batch, seed, self.device, position)
        if self.spool.capacity < global_batch:
            raise UserError(f"data source '{self.cfg.data.source}' keeps {self.spool.capacity} samples, fewer than one "
                            f"effective batch of {global_batch}", f"write spool:{self.spool.directory}:N with N >= "
                            f"{global_batch}, or lower train.batch_per_gpu / train.grad_accum")
        reader = SpoolReader(self.spool.directory, self.cond_dim, self.x_shape, next=self.buffer.cursor)
        return SpoolBatcher(self.buffer, reader, global_batch, seed, self.device, position, feed,
                            on_ready=self._buffer_ready)

    def _buffer_ready(self) -> None:
        if not self.stats_fitted:  # once: the statistics stay those of the first full buffer
            self.fit_statistics()

    def build_network(self) -> torch.nn.Module:
        return FieldMLP(self.model_cfg, cond_dim=self.cond_dim, x_dim=self.x_dim)

    def signature(self) -> dict[str, Any]:
        m = self.model_cfg
        return {"task": self.name, "cond_dim": self.cond_dim, "x_dim": self.x_dim, "fields": self.fields,
                "hidden": m.hidden, "depth": m.depth, "embed_dim": m.embed_dim}

    def draw(self, indices: torch.Tensor, generator: torch.Generator,
             out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        n = indices.shape[0]
        return {  # into a recorded step's inputs where ``out`` has them: the same draws, no copies
            "indices": kept(out, "indices", indices),
            "noise": torch.randn((n, *self.x_shape), generator=generator, device=self.device, out=into(out, "noise")),
            "t": torch.randint(0, self.diffusion.num_timesteps, (n,), generator=generator, device=self.device,
                               out=into(out, "t")),
        }

    def examples(self, batch: dict[str, torch.Tensor], rows: slice) -> dict[str, torch.Tensor]:
        """Standardised ``x`` (B, *x_shape) and ``cond`` (B, C) of ``rows``."""
        index = batch["indices"][rows]
        return {"x": self.stats.x(self.x[index]), "cond": self.stats.cond(self.cond[index])}

    def loss(self, network: torch.nn.Module, batch: dict[str, torch.Tensor], rows: slice,
             *, channels_last: bool) -> torch.Tensor:
        del channels_last  # a memory format of 4-D images; fields are 2-D or 3-D
        clean = self.examples(batch, rows)
        noise, t = batch["noise"][rows], batch["t"][rows]
        xt = self.diffusion.q_sample(clean["x"], noise, t)
        return self.diffusion.loss(network(xt, t, clean["cond"]), clean["x"], noise, t)

    def example_inputs(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        return (torch.randn((batch_size, *self.x_shape), device=self.device),
                torch.randint(0, self.diffusion.num_timesteps, (batch_size,), device=self.device),
                torch.randn((batch_size, self.cond_dim), device=self.device))

    # -- protocol: generation ----------------------------------------------------------------
    @torch.no_grad()
    def generate(self, network: torch.nn.Module, *, count: int, steps: int, seed: int, sampler: str = "ddim",
                 rows: slice | None = None, autocast: Autocast | None = None,
                 trajectory: bool = False, classes: Sequence[str] = (), guidance: float | None = None) -> Generated:
        """``count`` fields for the preview conditions in turn (sample i for condition i mod 4)."""
        no_classes(self.name, classes, guidance)
        groups = min(PREVIEW_CONDITIONS, count)
        cond = self.preview_cond[torch.arange(count, device=self.device) % groups]
        generator = torch.Generator().manual_seed(seed)
        start = torch.randn((count, *self.x_shape), generator=generator)
        if rows is not None:
            start, cond = start[rows], cond[rows]
        if start.shape[0] == 0:
            return Generated(start)
        samples, frames = self._denoise(network, cond, start, steps=steps, sampler=SamplerKind(sampler),
                                        generator=generator, autocast=autocast, trajectory=trajectory)
        return Generated(samples, frames)

    @torch.no_grad()
    def sample_for(self, network: torch.nn.Module, cond: torch.Tensor | np.ndarray, *, members: int, steps: int,
                   seed: int, sampler: str = "ddim", autocast: Autocast | None = None) -> torch.Tensor:
        """An ensemble for each condition: cond (N, C) in data units, a tensor or a NumPy array ->
        (N, members, *x_shape) on the CPU."""
        cond = torch.as_tensor(cond)
        if cond.dim() != 2 or cond.shape[1] != self.cond_dim:
            raise UserError(f"conditions of shape {tuple(cond.shape)} do not fit this model, which takes N x "
                            f"{self.cond_dim}", f"pass an N x {self.cond_dim} array of conditions in the data's units")
        from diffscale.runtime.resources import check_fits

        # the members' start noise, their samples and the array written hold N x members fields each
        each = 3 * 4 * int(np.prod(self.x_shape)) + 4 * self.cond_dim
        check_fits(cond.shape[0] * members * each, f"{cond.shape[0]:,} conditions x --members {members:,}",
                   "ask for fewer members (--members), or split the conditions into several files")
        generator = torch.Generator().manual_seed(seed)
        rows = cond.to(self.device).float().repeat_interleave(members, dim=0)
        start = torch.randn((rows.shape[0], *self.x_shape), generator=generator)
        out = [self._denoise(network, rows[i:i + SAMPLE_CHUNK], start[i:i + SAMPLE_CHUNK], steps=steps,
                             sampler=SamplerKind(sampler), generator=generator, autocast=autocast)[0]
               for i in range(0, rows.shape[0], SAMPLE_CHUNK)]
        return torch.cat(out).view(cond.shape[0], members, *self.x_shape)

    def _denoise(self, network: torch.nn.Module, cond: torch.Tensor, start: torch.Tensor, *, steps: int,
                 sampler: SamplerKind, generator: torch.Generator, autocast: Autocast | None,
                 trajectory: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Denoise standardised noise ``start`` (B, *x_shape) for conditions (B, C) in data units."""
        denoise = Conditioned(network, (self.stats.cond(cond),), autocast)
        with evaluating(network):
            x, frames = sample(denoise, self.diffusion, tuple(start.shape), sampler=Sampler(sampler, steps),
                               generator=generator, device=self.device,
                               trajectory_every=max(1, steps // 25) if trajectory else 0, x_init=start)
        return self.stats.x_back(x), [self.stats.x_back(f) for f in frames]

    def write_samples(self, generated: Generated, path: Path) -> list[Path]:
        """A PNG of the preview: for each preview condition its true field, members, mean and spread."""
        from diffscale.tasks.fields.plots import plot_preview

        groups = min(PREVIEW_CONDITIONS, generated.samples.shape[0])
        return [plot_preview(generated.samples, self.preview_x[:groups].cpu(), path)]

    def evaluate(self, network: torch.nn.Module, out_dir: Path, *, count: int | None, steps: int, seed: int,
                 env: str = "auto", max_episode_steps: int | None = None, data: str | None = None,
                 sampler: str | None = None, guidance: float | None = None,
                 cases: int = EVAL_CASES) -> dict[str, float]:
        """Probabilistic scores of ``count``-member ensembles (None: 16) on ``cases`` conditions
        (held-out pairs of ``data``, a field data spec, where given), against climatology and a
        deterministic MLP trained here on the same data; writes ``out_dir/evaluation.png``.
        ``network`` runs as given (``sampling_network`` applies precision)."""
        from diffscale.tasks.fields.evaluation import evaluate_fields

        no_environment(self.name, env, max_episode_steps)
        no_classes(self.name, (), guidance)
        no_feature_network(self.name, self.cfg.train.eval_features)
        if count is not None and count < 2:  # refused before sampling: spread and ranks need two members
            raise UserError(f"--count {count}: a fields evaluation scores ensembles, and the spread-skill ratio and "
                            "rank histogram need at least 2 members",
                            f"pass --count 2 or more (default {EVAL_MEMBERS})")
        held_out = self.held_out_data(data) if data is not None else None
        sampler, steps = self.cfg.train.sampling(sampler, steps, task_sampler=self.evaluation_sampler)
        return evaluate_fields(self, network, Path(out_dir), steps=steps, members=count or EVAL_MEMBERS, seed=seed,
                               cases=cases, held_out=held_out, sampler=sampler)

    def held_out_data(self, spec: str) -> FieldData:
        """Pairs of ``spec`` to score on, checked against the run's sizes."""
        data = load_fields(spec)
        found = (data.cond.shape[1], data.x.shape[1], data.x.shape[2] if data.x.dim() == 3 else 1)
        wanted = (self.cond_dim, self.x_dim, self.fields)
        if found != wanted:
            raise UserError(f"{data.label} holds cond {found[0]} -> x {found[1]} x {found[2]} but this run was trained "
                            f"for cond {wanted[0]} -> x {wanted[1]} x {wanted[2]}",
                            "pass held-out pairs of the sizes of the run's training data")
        if data.x.dim() == 3 and self.fields == 1:
            data.x = data.x[..., 0]
        return data

    # -- protocol: state, export, reference loop ---------------------------------------------
    def state_tensors(self) -> dict[str, torch.Tensor]:
        s = self.stats
        tensors = {"cond_mean": s.cond_mean, "cond_std": s.cond_std, "x_mean": s.x_mean, "x_std": s.x_std,
                   "preview_cond": self.preview_cond, "preview_x": self.preview_x}
        out = {k: v.detach().cpu().clone() for k, v in tensors.items()}
        out["stats_fitted"] = torch.tensor([int(self.stats_fitted)])
        return {**out, **(self.buffer.state_tensors() if self.buffer is not None else {})}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        expected = {k: tuple(v.shape) for k, v in self.state_tensors().items() if k in STAT_KEYS}
        found = {k: tuple(v.shape) for k, v in tensors.items() if k in STAT_KEYS}
        if found != expected:
            raise UserError(f"the checkpoint's field statistics {found} do not fit this task's {expected}",
                            "load a checkpoint written by a fields run with the same data sizes")
        on = {k: tensors[k].to(self.device, torch.float32) for k in STAT_KEYS}
        self.stats = Standardiser(on["cond_mean"], on["cond_std"], on["x_mean"], on["x_std"])
        self.preview_cond, self.preview_x = on["preview_cond"], on["preview_x"]
        self.stats_fitted = bool(tensors.get("stats_fitted", torch.ones(1)).item())
        if self.buffer is not None and "buffer_counters" in tensors:
            self.buffer.load_state_tensors(tensors)

    def export(self, network: torch.nn.Module, out_dir: Path) -> str:
        from diffscale.tasks.fields.export import export_fields

        return export_fields(self, network, Path(out_dir))

    def hub_listing(self) -> HubListing:
        """No Hub pipeline tag: none of the Hub's task categories is conditional generation of
        vectors or fields, and a wrong one would list the model among unrelated ones."""
        shape = ", ".join(str(s) for s in self.x_shape)
        code = ("import numpy as np\n"
                "from diffscale.tasks.fields.exported import load_export\n\n"
                "task, net = load_export(folder)\n"
                f"cond = np.zeros((4, {self.cond_dim}))  # your conditions: N x {self.cond_dim}, in the data's units\n"
                f"ensembles = task.sample_for(net, cond, members=16, steps={self.cfg.train.sample_steps}, seed=0)"
                f"  # (N, 16, {shape}) in the data's units\n")
        return HubListing("diffscale", None, ("diffscale", "diffusion", "ensemble-forecasting", "downscaling"), code)

    def reference_data(self) -> ReferenceData:
        data = self.training_data()
        return ReferenceData(TensorDataset(data.cond, data.x), StandardiseCollate(self.stats), fp16=False)

    def reference_loss(self, network: torch.nn.Module, examples: Any) -> torch.Tensor:
        x, cond = examples["x"], examples["cond"]
        noise = torch.randn_like(x)
        t = torch.randint(0, self.diffusion.num_timesteps, (x.shape[0],), device=x.device)
        xt = self.diffusion.q_sample(x, noise, t)
        return self.diffusion.loss(network(xt, t, cond), x, noise, t)
