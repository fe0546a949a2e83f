"""Diffusion policy: generate the next chunk of actions from recorded demonstrations.

A training example is one window of a demonstration (data/episodes.py): the first
``obs_horizon`` (To) observations condition a ConditionalUnet1D (models/unet1d.py) that
denoises all ``pred_horizon`` (T) actions of the window. At run time the policy
executes ``action_horizon`` (Ta) of them and plans again (receding horizon).
Observations and actions are min/max-normalised per dimension; the statistics are task
state, kept in every checkpoint beside the weights.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from diffscale.config import PolicyModelConfig, RunConfig, write_yaml
from diffscale.data.device_loader import DataPosition, DeviceBatcher
from diffscale.data.feed import Feed
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
    no_feature_network,
    no_given_data,
)
from diffscale.tasks.policy.controller import DEFAULT_SAMPLER
from diffscale.tasks.policy.episodes import Episodes, MinMax, load_episodes, window_positions
from diffscale.tasks.policy.network import build_unet1d

PREVIEW_OBSERVATIONS = 64
"""Observation histories kept (as task state) for previews: episode starts, seeded."""
EVAL_EPISODES = 50
"""Rollouts of ``diffscale eval`` unless ``--count`` says otherwise."""
EVAL_GIFS = 4
CONFIG_NAME = "diffscale_config.yaml"
"""The run's config in an exported folder (``config.json`` holds the diffusion-policy arguments)."""
"""Rollouts of an evaluation written as GIFs."""


class WindowDataset(Dataset):
    """The windows as a CPU data set, one normalised (obs (To, O), action (T, A)) pair per item,
    as the reference's hand-written loop reads them through a DataLoader."""

    def __init__(self, obs: torch.Tensor, action: torch.Tensor, windows: torch.Tensor, obs_horizon: int) -> None:
        self.obs, self.action, self.windows, self.obs_horizon = obs, action, windows, obs_horizon

    def __len__(self) -> int:
        return int(self.windows.shape[0])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        rows = self.windows[index]
        return {"obs": self.obs[rows[: self.obs_horizon]], "action": self.action[rows]}


class PolicyTask(WithoutQualityMetrics):
    name = "policy"
    records_whole_steps = False  # one GPU: recording was no faster (docs/benchmarks.md, "Diffusion policy")
    records_whole_ddp_steps = True  # several GPUs: recorded steps scaled much better, in the same call
    evaluation_sampler: str | None = DEFAULT_SAMPLER
    """DDPM, whatever the run's ``train.sample_sampler``: runs trained before the presets named
    DDPM there hold DPM-Solver++, and their evaluations ran DDPM."""

    def __init__(self, cfg: RunConfig, device: torch.device, *, load_data: bool = True,
                 signature: dict[str, Any] | None = None) -> None:
        assert isinstance(cfg.model, PolicyModelConfig), "task policy reads a PolicyModelConfig model section"
        self.cfg = cfg
        self.model: PolicyModelConfig = cfg.model
        self.device = device
        self.diffusion = GaussianDiffusion(cfg.diffusion)
        self.episodes: Episodes | None = None
        self.obs_norm: MinMax | None = None
        self.action_norm: MinMax | None = None
        self.preview_obs: torch.Tensor | None = None
        if load_data:
            self._load(load_episodes(cfg.data.source, min_length=self.model.pred_horizon,
                                     max_episodes=cfg.data.max_items))
        else:
            self.obs_dim = int((signature or {}).get("obs_dim", self.model.obs_dim))
            self.action_dim = int((signature or {}).get("action_dim", self.model.action_dim))
            if not self.obs_dim or not self.action_dim:
                raise UserError("the policy's observation and action sizes are unknown without its data",
                                "load a checkpoint of the run, or set model.obs_dim and model.action_dim")

    def _load(self, episodes: Episodes) -> None:
        """Check the data against the config and make it resident: raw steps and the (W, T)
        window table on the device; statistics and preview observations from the data."""
        for name, found in (("obs_dim", episodes.obs.shape[1]), ("action_dim", episodes.action.shape[1])):
            wanted = getattr(self.model, name)
            if wanted and wanted != found:
                raise UserError(f"{episodes.source} has {found} values per step where model.{name}={wanted}",
                                f"set model.{name}={found} (or 0 to follow the data)")
        self.episodes = episodes
        self.obs_dim, self.action_dim = episodes.obs.shape[1], episodes.action.shape[1]
        # Raw values stay resident and are normalised per batch: statistics restored from a
        # checkpoint then apply without rewriting the data.
        self.obs = torch.from_numpy(episodes.obs).to(self.device)
        self.action = torch.from_numpy(episodes.action).to(self.device)
        m = self.model
        windows = window_positions(episodes.ends, m.pred_horizon, pad_before=m.obs_horizon - 1,
                                   pad_after=m.action_horizon - 1)
        self.windows = torch.from_numpy(windows).to(self.device)
        self.obs_norm, self.action_norm = MinMax.fit(self.obs), MinMax.fit(self.action)
        starts = torch.from_numpy(np.concatenate([[0], episodes.ends[:-1]]))
        chosen = torch.randperm(len(starts), generator=torch.Generator().manual_seed(self.cfg.train.seed))
        first = starts[chosen[:PREVIEW_OBSERVATIONS]]
        self.preview_obs = torch.from_numpy(episodes.obs)[first][:, None].expand(-1, m.obs_horizon, -1).clone()

    # -- protocol: data ------------------------------------------------------------------------
    def batcher(self, global_batch: int, seed: int, position: DataPosition, feed: Feed) -> DeviceBatcher:
        del feed  # the windows are all resident: nothing arrives while training
        return DeviceBatcher(self.num_items(), global_batch, seed, self.device, position)

    def num_items(self) -> int:
        return int(self.windows.shape[0])

    def describe_data(self) -> str:
        assert self.episodes is not None
        return f"{self.episodes.describe()}, {self.num_items()} windows"

    def build_network(self) -> torch.nn.Module:
        return build_unet1d(self.model, self.obs_dim, self.action_dim)

    def signature(self) -> dict[str, Any]:
        m = self.model
        return {"task": self.name, "obs_dim": self.obs_dim, "action_dim": self.action_dim,
                "obs_horizon": m.obs_horizon, "pred_horizon": m.pred_horizon, "down_dims": list(m.down_dims),
                "kernel_size": m.kernel_size, "n_groups": m.n_groups, "step_embed_dim": m.step_embed_dim}

    def draw(self, indices: torch.Tensor, generator: torch.Generator,
             out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        n = indices.shape[0]
        return {  # into a recorded step's inputs where ``out`` has them: the same draws, no copies
            "indices": kept(out, "indices", indices),
            "noise": torch.randn((n, self.model.pred_horizon, self.action_dim), generator=generator,
                                 device=self.device, out=into(out, "noise")),
            "t": torch.randint(0, self.diffusion.num_timesteps, (n,), generator=generator, device=self.device,
                               out=into(out, "t")),
        }

    def _norms(self) -> tuple[MinMax, MinMax]:
        if self.obs_norm is None or self.action_norm is None:
            raise UserError("the policy has no normalisation statistics", "load a checkpoint of the run first")
        return self.obs_norm, self.action_norm

    def examples(self, batch: dict[str, torch.Tensor], rows: slice) -> dict[str, torch.Tensor]:
        """``action`` (B, T, A) and the flattened observation history ``obs`` (B, To * O), normalised."""
        obs_norm, action_norm = self._norms()
        positions = self.windows[batch["indices"][rows]]
        obs = obs_norm.normalize(self.obs[positions[:, : self.model.obs_horizon]])
        return {"action": action_norm.normalize(self.action[positions]), "obs": obs.flatten(1)}

    def loss(self, network: torch.nn.Module, batch: dict[str, torch.Tensor], rows: slice,
             *, channels_last: bool) -> torch.Tensor:
        ex = self.examples(batch, rows)
        noise, t = batch["noise"][rows], batch["t"][rows]
        return self.diffusion.loss(network(self.diffusion.q_sample(ex["action"], noise, t), t, ex["obs"]),
                                   ex["action"], noise, t)

    def example_inputs(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        m = self.model
        return (torch.randn(batch_size, m.pred_horizon, self.action_dim, device=self.device),
                torch.randint(0, self.diffusion.num_timesteps, (batch_size,), device=self.device),
                torch.randn(batch_size, m.obs_horizon * self.obs_dim, device=self.device))

    # -- protocol: generation ------------------------------------------------------------------
    @torch.no_grad()
    def plan(self, network: torch.nn.Module, obs_history: torch.Tensor | np.ndarray, *, steps: int = 10,
             sampler: str = "ddim", generator: torch.Generator | None = None, noise: torch.Tensor | None = None,
             autocast: Autocast | None = None, trajectory: bool = False) -> Generated:
        """Action chunks for observation histories (B, To, O) in the data's units: the policy as
        a controller calls it. Denoises ``noise`` (B, T, A) (default: drawn from ``generator``,
        itself seeded 0 by default). Returns actions (B, T, A) in the data's units, on the CPU;
        execute ``model.action_horizon`` of them from index ``model.obs_horizon - 1``."""
        obs_norm, action_norm = self._norms()
        history = torch.as_tensor(obs_history)
        horizon = self.model.obs_horizon
        if history.dim() != 3 or tuple(history.shape[1:]) != (horizon, self.obs_dim):
            raise UserError(f"an observation history of shape {tuple(history.shape)} does not fit this policy",
                            f"pass (B, {horizon}, {self.obs_dim}): a batch of model.obs_horizon={horizon} observations "
                            f"of {self.obs_dim} values (one history: obs_history[None])")
        generator = generator if generator is not None else torch.Generator().manual_seed(0)
        if noise is None:
            noise = torch.randn((history.shape[0], self.model.pred_horizon, self.action_dim), generator=generator)
        cond = obs_norm.normalize(history.to(self.device, torch.float32)).flatten(1)
        every = max(1, min(steps, self.diffusion.num_timesteps) // 25) if trajectory else 0
        with evaluating(network):
            actions, frames = sample(Conditioned(network, (cond,), autocast), self.diffusion, tuple(noise.shape),
                                     sampler=Sampler(SamplerKind(sampler), steps), generator=generator,
                                     device=self.device, trajectory_every=every, x_init=noise)
        return Generated(action_norm.unnormalize(actions), [action_norm.unnormalize(f) for f in frames])

    @torch.no_grad()
    def generate(self, network: torch.nn.Module, *, count: int, steps: int, seed: int, sampler: str = "ddim",
                 rows: slice | None = None, autocast: Autocast | None = None,
                 trajectory: bool = False, classes: Sequence[str] = (), guidance: float | None = None) -> Generated:
        """``count`` action chunks (count, T, A) for observation histories drawn from ``seed``
        among the preview observations (episode starts of the data)."""
        no_classes(self.name, classes, guidance)
        if self.preview_obs is None:
            raise UserError("the policy has no preview observations", "load a checkpoint of the run first")
        generator = torch.Generator().manual_seed(seed)
        which = torch.randint(0, len(self.preview_obs), (count,), generator=generator)
        noise = torch.randn((count, self.model.pred_horizon, self.action_dim), generator=generator)
        if rows is not None:
            which, noise = which[rows], noise[rows]
        if noise.shape[0] == 0:
            return Generated(noise)
        return self.plan(network, self.preview_obs[which], steps=steps, sampler=sampler, generator=generator,
                         noise=noise, autocast=autocast, trajectory=trajectory)

    def sample_for(self, network: torch.nn.Module, cond: Any, *, members: int, steps: int, seed: int,
                   sampler: str = "ddim", autocast: Autocast | None = None) -> torch.Tensor:
        raise UserError("policy runs plan from observation histories, not from --cond conditions",
                        "roll the policy out with diffscale eval RUN_DIR, or plan from Python with "
                        "task.plan(network, obs_history) (docs/policy.md)")

    def write_samples(self, generated: Generated, path: Path) -> list[Path]:
        from diffscale.tasks.policy.views import save_chunk_animation, save_chunks

        written = [save_chunks(generated.samples, path)]
        if generated.frames:
            written.append(save_chunk_animation(generated.frames, path.with_suffix(".gif")))
        return written

    def evaluate(self, network: torch.nn.Module, out_dir: Path, *, count: int | None, steps: int, seed: int,
                 env: str = "auto", max_episode_steps: int | None = None, data: str | None = None,
                 sampler: str | None = None, guidance: float | None = None,
                 gifs: int = EVAL_GIFS) -> dict[str, float | str]:
        """``count`` closed-loop rollouts (None: 50; episode i reset with seed ``seed + i``) of
        ``network`` (the EMA weights, run as given: ``sampling_network`` applies precision) in
        the environment ``env`` (``auto``: the data's own, reach2d or reach2d-routes for the
        built-in data; or ``reach2d``, ``reach2d-routes``, ``pusht``), each cut off after
        ``max_episode_steps`` (None: the environment's limit), all through one ``Controller``
        (reset with ``seed``) that plans with ``steps`` denoising steps of ``sampler`` (None:
        DDPM, as the reference evaluates) and executes ``model.action_horizon`` actions
        per plan. Returns ``env`` and the environment's summary (reach2d: success rate, each
        route's share beside the demonstrations', mean length; pusht: success rate, mean best
        coverage and score, mean length); writes ``gifs`` rollout GIFs and ``rollouts.jsonl``
        (one line per episode) to ``out_dir``."""
        from diffscale.tasks.policy.controller import Controller
        from diffscale.tasks.policy.envs.rollout import environment_for, rollouts, write_episodes, write_gifs

        no_given_data(self.name, data)
        no_classes(self.name, (), guidance)
        no_feature_network(self.name, self.cfg.train.eval_features)
        environment = environment_for(self.cfg.data.source, self.obs_dim, self.action_dim, env, max_episode_steps)
        sampler, steps = self.cfg.train.sampling(sampler, steps, task_sampler=self.evaluation_sampler)
        controller = Controller(self, network, sampler=sampler, steps=steps)
        results = rollouts(environment.make, controller, episodes=count or EVAL_EPISODES, seed=seed, record=gifs)
        write_gifs(results[:gifs], Path(out_dir))
        write_episodes(results, Path(out_dir) / "rollouts.jsonl", seed=seed)
        return {"env": environment.name, **environment.summarize(results)}

    # -- protocol: state, export, bench --------------------------------------------------------
    def state_tensors(self) -> dict[str, torch.Tensor]:
        obs_norm, action_norm = self._norms()
        assert self.preview_obs is not None
        return {"obs_min": obs_norm.lo.cpu(), "obs_max": obs_norm.hi.cpu(), "action_min": action_norm.lo.cpu(),
                "action_max": action_norm.hi.cpu(), "preview_obs": self.preview_obs.cpu()}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        for name, size in (("obs", self.obs_dim), ("action", self.action_dim)):
            found = tensors[f"{name}_min"].shape[0]
            if found != size:
                raise UserError(f"the checkpoint normalises {found} {name} values per step, this run's data has {size}",
                                "resume with the run's own data source, or start a new run with another --out")
        self.obs_norm = MinMax(tensors["obs_min"].to(self.device), tensors["obs_max"].to(self.device))
        self.action_norm = MinMax(tensors["action_min"].to(self.device), tensors["action_max"].to(self.device))
        self.preview_obs = tensors["preview_obs"].cpu()

    def export(self, network: torch.nn.Module, out_dir: Path) -> str:
        """The reference's format: a ConditionalUnet1D state dict (the names of the
        diffusion-policy code), the normalisation statistics and the constructor arguments."""
        from safetensors.torch import save_file

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in network.state_dict().items()},
                  out_dir / "unet.safetensors")
        save_file({k: v.contiguous() for k, v in self.state_tensors().items()}, out_dir / "normalizer.safetensors")
        m = self.model
        config = {
            "unet": {"input_dim": self.action_dim, "global_cond_dim": self.obs_dim * m.obs_horizon,
                     "diffusion_step_embed_dim": m.step_embed_dim, "down_dims": list(m.down_dims),
                     "kernel_size": m.kernel_size, "n_groups": m.n_groups},
            "horizons": {"obs": m.obs_horizon, "pred": m.pred_horizon, "action": m.action_horizon},
            "scheduler": self.diffusion.scheduler_kwargs(),
        }
        (out_dir / "config.json").write_text(json.dumps(config, indent=2, default=str))
        # what diffscale's own loader (tasks/policy/exported.py) rebuilds the task from
        write_yaml(self.cfg, out_dir / CONFIG_NAME)
        (out_dir / "signature.json").write_text(json.dumps(self.signature(), indent=2))
        return (f"diffscale.tasks.policy.exported.load_export('{out_dir}'), or "
                f"ConditionalUnet1D(**config['unet']).load_state_dict(safetensors.torch.load_file("
                f"'{out_dir / 'unet.safetensors'}')) with diffusion_policy's ConditionalUnet1D "
                f"(config.json; normalizer.safetensors holds the min/max statistics)")

    def hub_listing(self) -> HubListing:
        m = self.model
        code = ("import numpy as np\n"
                "from diffscale.tasks.policy.exported import load_export\n\n"
                "task, net = load_export(folder)\n"
                f"history = np.zeros((1, {m.obs_horizon}, {self.obs_dim}))  # a batch of the last {m.obs_horizon} "
                f"observations, in the data's units\n"
                f"actions = task.plan(net, history, steps=10).samples  # (1, {m.pred_horizon}, {self.action_dim}): "
                f"execute {m.action_horizon} from index {m.obs_horizon - 1}, then plan again\n")
        return HubListing("diffscale", "robotics", ("diffscale", "diffusion", "diffusion-policy", "robotics"), code)

    def reference_data(self) -> ReferenceData:
        obs_norm, action_norm = self._norms()
        dataset = WindowDataset(obs_norm.normalize(self.obs).cpu(), action_norm.normalize(self.action).cpu(),
                                self.windows.cpu(), self.model.obs_horizon)
        return ReferenceData(dataset, default_collate, fp16=False)  # the reference trains in fp32

    def reference_loss(self, network: torch.nn.Module, examples: Any) -> torch.Tensor:
        action, obs = examples["action"], examples["obs"].flatten(1)
        noise = torch.randn_like(action)
        t = torch.randint(0, self.diffusion.num_timesteps, (action.shape[0],), device=action.device)
        return self.diffusion.loss(network(self.diffusion.q_sample(action, noise, t), t, obs), action, noise, t)
