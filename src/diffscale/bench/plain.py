"""The common recipe our users copy, reproduced for side-by-side benchmarks.

The task's own network (the same one), fp16 autocast + GradScaler where the task's
reference loop uses it (images) and fp32 elsewhere, fp32 AdamW (PyTorch's default
implementation), a CPU DataLoader with 4 workers and pin_memory over the task's reference
data, DDP with default settings, a per-parameter EMA loop (with diffusers' ``EMAModel`` warm-up)
and ``loss.item()`` every step.
It is deliberately *not* tuned: it is the baseline ``diffscale bench`` compares to.
"""

from __future__ import annotations

import time

import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from diffscale.runtime.resources import cpus_for_rank, host_memory_bytes, worker_budget


class PlainRunner:
    """Same interface as ``train.StepRunner`` (``step()``), with the plain recipe inside."""

    def __init__(self, run_state, *, workers: int = 4) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.run_state = run_state
        cfg, ctx, device = run_state.cfg, run_state.ctx, run_state.device
        reference = run_state.task.reference_data()
        dataset = reference.dataset
        # The recipe's 4 workers, but never more than the host's CPUs and memory allow.
        local = ctx.info.local_world_size
        workers = worker_budget(workers, cpus=cpus_for_rank(local), host_bytes=host_memory_bytes(),
                                ranks_on_host=local, data_bytes=_bytes_of(dataset)).workers
        self.sampler: DistributedSampler | RandomSampler
        if ctx.distributed:
            self.sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True,
                                              seed=cfg.train.seed, drop_last=True)
        else:
            self.sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(cfg.train.seed))
        self.loader = DataLoader(dataset, batch_size=cfg.train.batch_per_gpu, sampler=self.sampler,
                                 num_workers=workers, pin_memory=device.type == "cuda", drop_last=True,
                                 persistent_workers=workers > 0,
                                 collate_fn=reference.collate)
        self.epoch = 0
        self._iter = iter(self.loader)
        self.model = DDP(run_state.net, device_ids=[device.index] if device.type == "cuda" else None) \
            if ctx.distributed else run_state.net
        self.opt = torch.optim.AdamW(run_state.net.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        self.fp16 = device.type == "cuda" and reference.fp16
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.fp16)
        self.ema = [p.detach().clone() for p in run_state.net.parameters()]
        self.data_wait_s = 0.0
        self.effective = cfg.effective_batch(ctx.world_size)

    def _next_examples(self):
        start = time.perf_counter()
        try:
            examples = next(self._iter)
        except StopIteration:
            self.epoch += 1
            if isinstance(self.sampler, DistributedSampler):
                self.sampler.set_epoch(self.epoch)
            self._iter = iter(self.loader)
            examples = next(self._iter)
        self.data_wait_s += time.perf_counter() - start
        return _to(examples, self.run_state.device)

    def step(self) -> float:
        tr = self.run_state
        device = tr.device
        lr = tr.cfg.optim.lr
        examples = self._next_examples()
        with torch.autocast(device.type, dtype=torch.float16, enabled=self.fp16):
            loss = tr.task.reference_loss(self.model, examples)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.opt)
        torch.nn.utils.clip_grad_norm_(tr.net.parameters(), tr.cfg.optim.grad_clip or float("inf"))
        self.scaler.step(self.opt)
        self.scaler.update()
        self.opt.zero_grad(set_to_none=True)
        # diffusers' EMAModel's default warm-up, (1 + step) / (10 + step) up to the decay: a constant
        # decay from step 0 would keep the initial weights in the average for thousands of steps
        decay = min(tr.cfg.train.ema_decay, (1 + tr.step) / (10 + tr.step))
        with torch.no_grad():
            for ema, param in zip(self.ema, tr.net.parameters(), strict=True):
                ema.mul_(decay).add_(param.detach(), alpha=1 - decay)
        loss.item()  # per-step logging, as the recipe does
        tr.step += 1
        return lr


def _to(examples, device: torch.device):
    """A collated batch (a tensor, or a dict / tuple of tensors) on ``device``."""
    if torch.is_tensor(examples):
        return examples.to(device, non_blocking=True)
    if isinstance(examples, dict):
        return {k: _to(v, device) for k, v in examples.items()}
    return type(examples)(_to(v, device) for v in examples)


def _bytes_of(dataset) -> int:
    """Bytes of a data set's tensors (each loader worker holds a copy of an in-memory set)."""
    tensors = [v for v in vars(dataset).values() if torch.is_tensor(v)]
    tensors += [t for v in vars(dataset).values() if isinstance(v, tuple) for t in v if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in tensors)  # a TensorDataset keeps its tensors in a tuple
