"""Image diffusion (DDPM/DDIM/DPM-Solver++ on a diffusers UNet2DModel), unconditional or
class-conditional with classifier-free guidance (``model.class_conditional``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from diffscale.config import ModelConfig, RunConfig
from diffscale.data.device_loader import DataPosition, DeviceBatcher, shift_augment
from diffscale.data.feed import Feed
from diffscale.data.streaming import StreamingBatcher, resident_choice, stream_workers
from diffscale.diffusion import Conditioned, GaussianDiffusion, Sampler, SamplerKind, evaluating, sample
from diffscale.errors import UserError
from diffscale.evaluation.quality import accuracy
from diffscale.io.media import save_animation, save_grid
from diffscale.tasks.base import (
    Autocast,
    Generated,
    HubListing,
    ReferenceData,
    into,
    kept,
    no_classes,
    no_environment,
    no_given_data,
)
from diffscale.tasks.images.classes import balanced_labels, grid_labels, pick_classes, spread, training_classes
from diffscale.tasks.images.data_features import DataFeatures
from diffscale.tasks.images.dataset import ImageData, fit_channels, open_image_data
from diffscale.tasks.images.network import Denoiser, build_unet
from diffscale.tasks.images.quality import Featurizer, cache_path, scores, trained_features, user_features
from diffscale.tasks.images.reference import ImageRows, ShiftCollate
from diffscale.tasks.images.sources import describe, load_labels


class ImageTask:
    name = "images"
    records_whole_steps = False  # not measured yet with whole-step graphs
    records_whole_ddp_steps = False
    evaluation_sampler: str | None = None  # the run's train.sample_sampler

    def __init__(self, cfg: RunConfig, device: torch.device, *, load_data: bool = True,
                 signature: dict[str, Any] | None = None) -> None:
        assert isinstance(cfg.model, ModelConfig), "the config loader gives task images a ModelConfig"
        self.cfg = cfg
        self.model: ModelConfig = cfg.model
        self.device = device
        self.diffusion = GaussianDiffusion(cfg.diffusion)
        self.images: torch.Tensor | None = None
        self.resident, self.placement, self.workers = True, "", 0
        self.data: ImageData | None = None
        """The opened data set: labels and class names where the data has them."""
        channels = int((signature or {}).get("channels", self.model.channels))
        if load_data:
            self.data = open_image_data(cfg.data.source, self.model.sample_size, max_items=cfg.data.max_items,
                                        max_bad_fraction=cfg.data.max_bad_fraction)
            channels = channels or self.data.shape[1]
            self.resident, self.placement = resident_choice(cfg.data.resident.value, self.data.nbytes, device)
            if self.data.cache is None:  # generated in memory (builtin): nothing on disk to stream from
                self.resident, self.placement = True, "resident on the device (generated data)"
            if not self.resident:
                self.workers, why = stream_workers(cfg.data.workers)
                self.placement += f", {self.workers} loader workers per rank ({why})"
            if self.resident:
                # uint8 on the device: an EMNIST-size set is ~90 MB and needs no loader workers.
                self.images = fit_channels(self.data.tensor(), channels).to(device)
        self.channels = channels or 1
        self.labels: torch.Tensor | None = None
        """A class-conditional run's class of each training image (N,) int64 on the device."""
        self.class_names: list[str] = []
        """A class-conditional run's classes (empty: unconditional); index ``len`` means "no class"."""
        if self.model.class_conditional:
            if self.data is not None:
                found = self._labels(self.num_items(), required=True)
                self.labels, self.class_names = training_classes(found, cfg.data.source)
                self.labels = self.labels.to(device)
            else:
                self.class_names = [str(name) for name in (signature or {}).get("classes", [])]
        self._stream: StreamingBatcher | None = None
        self._featurizer: Featurizer | None = None
        self._data_features: DataFeatures | None = None
        self._known: list[int] = []
        """The classes of the data (set by ``prepare_quality``); empty: every class of the run."""

    def _data(self) -> torch.Tensor:
        assert self.images is not None, "built with load_data=False, or streamed"
        return self.images

    def num_items(self) -> int:
        assert self.data is not None, "built with load_data=False"
        return int(self.data.shape[0])

    def describe_data(self) -> str:
        assert self.data is not None, "built with load_data=False"
        return f"{self.cfg.data.source} ({describe(self.data.shape)}; {self.placement})"

    def build_network(self) -> torch.nn.Module:
        classes = len(self.class_names)
        return Denoiser(build_unet(self.model, self.channels, classes), classes)

    def signature(self) -> dict[str, Any]:
        m = self.model
        return {
            "task": self.name,
            "channels": self.channels,
            "sample_size": m.sample_size,
            "block_out_channels": list(m.block_out_channels),
            "attention": list(m.attention),
            "layers_per_block": m.layers_per_block,
            "norm_num_groups": m.norm_num_groups,
            **({"classes": self.class_names} if m.class_conditional else {}),
        }

    def batcher(self, global_batch: int, seed: int, position: DataPosition, feed: Feed) -> DeviceBatcher:
        if self.resident:
            return DeviceBatcher(self.num_items(), global_batch, seed, self.device, position)
        assert self.data is not None and self.data.cache is not None
        self._stream = StreamingBatcher(self.data.cache, self.data.shape, global_batch, seed, self.device,
                                        position, rank=feed.rank, world_size=feed.world_size,
                                        batch_per_gpu=self.cfg.train.batch_per_gpu, workers=self.workers)
        return self._stream

    def draw(self, indices: torch.Tensor, generator: torch.Generator,
             out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        n = indices.shape[0]
        size = self.model.sample_size
        shift = self.cfg.data.shift_px
        device = self.device
        drawn = {  # into a recorded step's inputs where ``out`` has them: the same draws, no copies
            "indices": kept(out, "indices", indices),
            "noise": torch.randn((n, self.channels, size, size), generator=generator, device=device,
                                 out=into(out, "noise")),
            "t": torch.randint(0, self.diffusion.num_timesteps, (n,), generator=generator, device=device,
                               out=into(out, "t")),
            "shifts": torch.randint(-shift, shift + 1, (n, 2), generator=generator, device=device,
                                    out=into(out, "shifts")),
            "flips": torch.lt(torch.rand((n,), generator=generator, device=device), 0.5, out=into(out, "flips")),
        }
        if self.labels is not None:  # drawn last: an unconditional run's draws stay as they were
            dropped = torch.rand((n,), generator=generator, device=device) < self.model.label_dropout
            labels = self.labels[drawn["indices"]].masked_fill(dropped, len(self.class_names))
            drawn["labels"] = kept(out, "labels", labels)
        return drawn

    def examples(self, batch: dict[str, torch.Tensor], rows: slice) -> dict[str, torch.Tensor]:
        """``x0``: (b, C, H, W) in [-1, 1], shifted and flipped as drawn."""
        if self.images is None:
            assert self._stream is not None, "a streamed run's batches come from its batcher"
            x0 = fit_channels(self._stream.rows_of(rows), self.channels).float() / 127.5 - 1.0
        else:
            x0 = self._data()[batch["indices"][rows]].float() / 127.5 - 1.0
        x0 = shift_augment(x0, batch["shifts"][rows], self.cfg.data.shift_px)
        if self.cfg.data.hflip:
            x0 = torch.where(batch["flips"][rows].view(-1, 1, 1, 1), x0.flip(-1), x0)
        return {"x0": x0}

    def loss(self, network: torch.nn.Module, batch: dict[str, torch.Tensor], rows: slice,
             *, channels_last: bool) -> torch.Tensor:
        x0 = self.examples(batch, rows)["x0"]
        noise, t = batch["noise"][rows], batch["t"][rows]
        xt = self.diffusion.q_sample(x0, noise, t)
        if channels_last:
            xt = xt.contiguous(memory_format=torch.channels_last)
        condition = (batch["labels"][rows],) if self.class_names else ()
        return self.diffusion.loss(network(xt, t, *condition), x0, noise, t)

    def example_inputs(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        size = self.model.sample_size
        inputs: tuple[torch.Tensor, ...] = (torch.randn(batch_size, self.channels, size, size, device=self.device),
                                            torch.randint(0, self.diffusion.num_timesteps, (batch_size,),
                                                          device=self.device))
        if self.class_names:
            inputs += (torch.randint(0, len(self.class_names) + 1, (batch_size,), device=self.device),)
        return inputs

    @torch.no_grad()
    def generate(self, network: torch.nn.Module, *, count: int, steps: int, seed: int, sampler: str = "ddim",
                 rows: slice | None = None, autocast: Autocast | None = None, trajectory: bool = False,
                 classes: Sequence[str] = (), guidance: float | None = None) -> Generated:
        """``count`` images (B, C, H, W) in [-1, 1] from ``seed``; with ``rows``, only those rows of
        that same draw (so ranks sharing the work together produce exactly the single-process images).
        A class-conditional run draws the ``classes`` asked (names or indices; none: classes spread
        over the grid's rows) with guidance scale ``guidance`` (None: ``train.sample_guidance``)."""
        if not self.class_names:
            no_classes(self.name, classes, guidance, trained="trained without classes (model.class_conditional off)")
            return self._generate(network, None, 1.0, count=count, steps=steps, seed=seed, sampler=sampler,
                                  rows=rows, autocast=autocast, trajectory=trajectory)
        chosen = pick_classes(classes, self.class_names) if classes else spread(len(self.class_names), count)
        scale = self.cfg.train.sample_guidance if guidance is None else guidance
        return self._generate(network, grid_labels(chosen, count), scale, count=count, steps=steps, seed=seed,
                              sampler=sampler, rows=rows, autocast=autocast, trajectory=trajectory)

    def _generate(self, network: torch.nn.Module, labels: torch.Tensor | None, guidance: float, *, count: int,
                  steps: int, seed: int, sampler: str, rows: slice | None, autocast: Autocast | None,
                  trajectory: bool = False) -> Generated:
        """``generate`` with the class of each of the ``count`` samples given (labels (count,)),
        or None for an unconditional run."""
        size = self.model.sample_size
        generator = torch.Generator().manual_seed(seed)
        start = torch.randn((count, self.channels, size, size), generator=generator)
        if rows is not None:
            start = start[rows]
            labels = None if labels is None else labels[rows]
        if start.shape[0] == 0:
            return Generated(start)
        denoise = Conditioned(network, (), autocast)
        if labels is not None:
            labels = labels.to(self.device)
            denoise = Conditioned(network, (labels,), autocast, (torch.full_like(labels, len(self.class_names)),),
                                  guidance)
        with evaluating(network):
            images, frames = sample(
                denoise, self.diffusion, tuple(start.shape),
                sampler=Sampler(SamplerKind(sampler), steps), generator=generator, device=self.device,
                trajectory_every=max(1, steps // 25) if trajectory else 0, x_init=start,
            )
        return Generated(images, frames)

    def write_samples(self, generated: Generated, path: Path) -> list[Path]:
        written = [save_grid(generated.samples, path)]
        if generated.frames:
            written += save_animation(generated.frames, path.with_suffix(".gif"))
        return written

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {}  # images are scaled by a fixed rule: nothing beyond the weights

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        pass

    def sample_for(self, network: torch.nn.Module, cond: Any, *, members: int, steps: int, seed: int,
                   sampler: str = "ddim", autocast: Autocast | None = None) -> torch.Tensor:
        raise UserError("image runs are sampled without conditions: --cond and --members are for fields runs",
                        "drop --cond and --members (diffscale sample RUN_DIR --n 64)")

    def prepare_quality(self) -> None:
        """The feature network (trained once per data set and resolution, then read from the data
        cache) and the data images samples are scored against (:mod:`.data_features`)."""
        if self._data_features is not None:
            return
        size = self.model.sample_size
        if self.images is not None:
            images = self.images.cpu()
        elif self.data is not None:  # streamed: the decoded cache, memory-mapped
            images = fit_channels(self.data.tensor(), self.channels)
        else:
            images = _load(self.cfg, size, self.channels)
        t = self.cfg.train
        path: Path | None = None  # diffscale's own network, kept in the data cache: the reference beside it
        if t.eval_features:
            self._featurizer = user_features(t.eval_features)
        else:
            labelled = self._labels(images.shape[0])
            if labelled is not None:  # the classes the data's classifier knows: those evaluations ask for
                self._known = sorted(set(labelled[0].tolist()))
            path = cache_path(self.cfg.data.source, self.cfg.data.max_items, size, self.channels)
            self._featurizer = trained_features(images, labelled[0] if labelled else None, path,
                                                device=self.device)
        self._featurizer.network.to(self.device)
        self._data_features = DataFeatures(images, self._featurizer, path.with_suffix("") if path else None)

    def _labels(self, count: int, required: bool = False) -> tuple[torch.Tensor, list[str]] | None:
        """The data's class of each image and the class names, where the data has them (``required``:
        a missing labels file the data set keeps beside its images ends in a message naming it)."""
        if self.data is not None and self.data.labels is not None:
            return torch.as_tensor(self.data.labels[:count]).long(), list(self.data.class_names or ())
        return load_labels(self.cfg.data.source, count, required=required)

    def quality_features(self, network: torch.nn.Module, *, count: int, steps: int, seed: int, sampler: str = "ddim",
                         rows: slice | None = None, autocast: Autocast | None = None) -> torch.Tensor:
        self.prepare_quality()
        assert self._featurizer is not None
        generated = self._generate(network, self._evaluated_labels(count), self.cfg.train.sample_guidance,
                                   count=count, steps=steps, seed=seed, sampler=sampler, rows=rows, autocast=autocast)
        return self._featurizer.features(generated.samples)

    def _evaluated_labels(self, count: int) -> torch.Tensor | None:
        """The classes quality evaluations generate: each class the data holds in turn (None: unconditional)."""
        if not self.class_names:
            return None
        known = torch.as_tensor(self._known or range(len(self.class_names)), dtype=torch.long)
        return known[balanced_labels(len(known), count)]

    def quality_scores(self, features: torch.Tensor) -> dict[str, float]:
        self.prepare_quality()
        assert self._featurizer is not None and self._data_features is not None
        count = features.shape[0]
        result = {**scores(self._featurizer, self._data_features.real(count), features),
                  **self._data_features.reference(count)}
        head = self._featurizer.head
        if self.class_names:  # the samples were drawn for every class in turn (_evaluated_labels)
            result["guidance"] = self.cfg.train.sample_guidance
            if head is not None:  # the share of samples the data's classifier finds in the class asked
                with torch.no_grad():
                    logits = head(features.to(next(head.parameters()).device))
                labels = self._evaluated_labels(len(features))
                assert labels is not None
                result["class_accuracy"] = accuracy(logits, labels)
        return result

    def evaluate(self, network: torch.nn.Module, out_dir: Path, *, count: int | None, steps: int,
                 seed: int, env: str = "auto", max_episode_steps: int | None = None,
                 data: str | None = None, sampler: str | None = None,
                 guidance: float | None = None) -> dict[str, float | str]:
        """Frechet distance, precision, recall, density and coverage of ``count`` samples (None:
        ``train.eval_count``) against as many data images (``data_count``: fewer where the data holds
        fewer), and of other data images against those (``reference_*``), in the feature network's
        space; a class-conditional run's drawn with guidance scale ``guidance`` (None:
        ``train.sample_guidance``). Writes ``out_dir/samples.png``."""
        no_environment(self.name, env, max_episode_steps)
        no_given_data(self.name, data)
        if not self.class_names:
            no_classes(self.name, (), guidance, trained="trained without classes (model.class_conditional off)")
        scale = self.cfg.train.sample_guidance if guidance is None else guidance
        count = count or self.cfg.train.eval_count
        sampler, steps = self.cfg.train.sampling(sampler, steps, task_sampler=self.evaluation_sampler)
        if count < 2:
            raise UserError(f"--count {count}: a Frechet distance needs at least 2 samples",
                            f"pass --count 2 or more (default {self.cfg.train.eval_count})")
        self.prepare_quality()
        assert self._featurizer is not None
        generated = self._generate(network, self._evaluated_labels(count), scale,
                                   count=count, steps=steps, seed=seed, sampler=sampler, rows=None, autocast=None)
        save_grid(generated.samples[:64], Path(out_dir) / "samples.png")
        result: dict[str, float | str] = {"sampler": sampler, "count": count,
                                          **self.quality_scores(self._featurizer.features(generated.samples)),
                                          "features": self._featurizer.description}
        if "guidance" in result:  # quality_scores records the run's scale
            result["guidance"] = scale
        return result

    def export(self, network: torch.nn.Module, out_dir: Path) -> str:
        from diffscale.tasks.images.export import export_class_conditional, export_ddpm_pipeline

        if not isinstance(network, Denoiser):
            raise UserError("this network is not a diffusers UNet2DModel", "export the EMA network of an images run")
        if self.class_names:
            export_class_conditional(network.unet, out_dir, cfg=self.cfg, signature=self.signature(),
                                     state=self.state_tensors(), scheduler=self.diffusion.ddpm_scheduler())
            return (f"diffusers.DiffusionPipeline.from_pretrained('{out_dir}', custom_pipeline='{out_dir}', "
                    "trust_remote_code=True)")
        export_ddpm_pipeline(network.unet, self.diffusion.ddpm_scheduler(), out_dir)
        return "diffusers.DDPMPipeline.from_pretrained"

    def hub_listing(self) -> HubListing:
        if self.class_names:
            return self._class_conditional_listing()
        steps = min(50, self.diffusion.num_timesteps)
        code = ("import torch\n"
                "from diffusers import DDPMPipeline\n\n"
                "pipe = DDPMPipeline.from_pretrained(folder)\n"
                f"images = pipe(batch_size=4, num_inference_steps={steps}, "
                "generator=torch.Generator().manual_seed(0)).images  # PIL images\n")
        return HubListing("diffusers", "unconditional-image-generation",
                          ("diffscale", "diffusion", "diffusers", "diffusers:DDPMPipeline"), code, loads_hub_ids=True)

    def _class_conditional_listing(self) -> HubListing:
        """The folder's own pipeline (pipeline.py) samples it by class: diffusers loads it."""
        shown = ", ".join(self.class_names[:40]) + (", ..." if len(self.class_names) > 40 else "")
        code = ("import torch\n"
                "from diffusers import DiffusionPipeline\n\n"
                "pipe = DiffusionPipeline.from_pretrained(folder, custom_pipeline=folder,\n"
                "                                         trust_remote_code=True)  # runs the folder's pipeline.py\n"
                f"# its {len(self.class_names)} classes (pipe.config.class_names): {shown}\n"
                f"images = pipe(class_labels=[{self.class_names[0]!r}] * 4, num_inference_steps="
                f"{min(50, self.diffusion.num_timesteps)}, guidance_scale={self.cfg.train.sample_guidance:g}, "
                "generator=torch.Generator().manual_seed(0)).images  # PIL images\n")
        tags = ("diffscale", "diffusion", "diffusers", "class-conditional", "classifier-free-guidance")
        return HubListing("diffusers", None, tags, code)  # no Hub category is class-conditional generation

    def reference_data(self) -> ReferenceData:
        assert self.data is not None, "built with load_data=False"
        images = self._data().cpu() if self.images is not None else fit_channels(self.data.tensor(), self.channels)
        return ReferenceData(ImageRows(images), ShiftCollate(self.cfg.data.shift_px, self.cfg.train.seed))

    def reference_loss(self, network: torch.nn.Module, examples: Any) -> torch.Tensor:
        x0 = examples
        noise = torch.randn_like(x0)
        t = torch.randint(0, self.diffusion.num_timesteps, (x0.shape[0],), device=x0.device)
        xt = self.diffusion.q_sample(x0, noise, t)
        return self.diffusion.loss(network(xt, t), x0, noise, t)


def _load(cfg: RunConfig, size: int, channels: int) -> torch.Tensor:
    """The run's images, uint8 (N, channels, size, size) on the CPU (``channels`` 0: as stored)."""
    data = open_image_data(cfg.data.source, size, max_items=cfg.data.max_items,
                           max_bad_fraction=cfg.data.max_bad_fraction)
    return fit_channels(data.tensor(), channels)
