"""Command line: parse, validate, call one function per verb. User errors print one line, exit 2."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .errors import EXIT_USER_ERROR, UserError


def _run_config(args: argparse.Namespace):
    """Preset -> YAML file -> --data/--device/--precision -> --set overrides, validated."""
    from . import config as C
    from .presets import get_preset

    data: dict = {}
    config_path = getattr(args, "config", None)
    out = getattr(args, "out", None)
    if not config_path and getattr(args, "resume", None) and out and (Path(out) / "config.yaml").is_file():
        config_path = str(Path(out) / "config.yaml")  # resuming: the run's own resolved config
    if config_path:
        data = C.load_yaml(config_path)
    preset = args.preset or data.get("preset") or "tiny"
    cfg = C.merge(get_preset(preset), data) if data else get_preset(preset)
    extra: dict = {}
    if getattr(args, "data", None):
        extra.setdefault("data", {})["source"] = args.data
    if getattr(args, "device", None):
        extra.setdefault("runtime", {})["device"] = args.device
    if getattr(args, "precision", None):
        extra.setdefault("runtime", {})["precision"] = args.precision
    if getattr(args, "recipe", None):
        extra.setdefault("runtime", {})["recipe"] = args.recipe
    overrides = C.parse_overrides(getattr(args, "set", None) or [])
    merged = C.deep_merge(extra, overrides)
    if merged:
        cfg = C.merge(cfg, merged)
    if args.preset:
        cfg.preset = args.preset
    return cfg


def cmd_train(args: argparse.Namespace) -> int:
    from rich.console import Console

    cfg = _run_config(args)
    out = Path(args.out or os.path.join("runs", cfg.preset))
    if args.max_steps is not None and args.max_steps < 1:
        raise UserError(f"--max-steps {args.max_steps} is not positive", "pass a step count of 1 or more")
    if args.dry_run:
        print(cfg.to_yaml(), end="")
        return 0
    from .train import train

    outcome = train(cfg, out, resume=args.resume, max_steps=args.max_steps, console=Console(soft_wrap=True))
    return outcome.exit_code


def _load_for_inference(run_dir: Path, device_name: str | None):
    from . import config as C
    from .runtime import checkpoint as ckpt
    from .runtime.device import pick_device
    from .tasks import build_task

    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise UserError(f"'{run_dir}' is not a diffscale run (no config.yaml)", "pass the RUN_DIR that `diffscale train --out` wrote")
    cfg = C.from_dict(C.load_yaml(cfg_path))
    state = ckpt.load_latest(run_dir, log=lambda m: print(m, file=sys.stderr))
    if state is None:
        raise UserError(f"'{run_dir}' has no usable checkpoint", "train first (diffscale train --out RUN_DIR)")
    channels = int(state.meta.get("signature", {}).get("channels", cfg.model.channels or 1))
    cfg.model.channels = channels
    device = pick_device(C.Device(device_name) if device_name else cfg.runtime.device)
    task = build_task(cfg, device, load_data=False)
    net = task.build_network()
    net.load_state_dict(state.ema)
    return cfg, task, net.to(device).eval(), state


def cmd_sample(args: argparse.Namespace) -> int:
    from .engine import sampling_network

    if args.n < 1 or args.steps < 1:
        raise UserError("--n and --steps must be positive", "e.g. --n 64 --steps 50")
    cfg, task, net, state = _load_for_inference(Path(args.run_dir), args.device)
    out = Path(args.out) if args.out else Path(args.run_dir) / "samples" / f"sample_step{state.step:08d}_seed{args.seed}_{args.sampler}{args.steps}.png"
    written = task.preview(sampling_network(net, cfg.runtime), out, count=args.n, steps=args.steps, seed=args.seed, sampler=args.sampler, gif=args.gif)
    for path in written:
        print(path)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .export import export_diffusers

    cfg, task, net, state = _load_for_inference(Path(args.run_dir), "cpu")
    out = export_diffusers(task, net, Path(args.diffusers))
    print(f"exported EMA weights of step {state.step} to {out} (load with diffusers.DDPMPipeline.from_pretrained)")
    return 0


def cmd_presets(args: argparse.Namespace) -> int:  # noqa: ARG001
    import torch
    from rich.console import Console
    from rich.table import Table

    from .models import build_unet, count_parameters
    from .presets import PRESETS

    table = Table(title="diffscale presets")
    for col in ("preset", "px", "block_out_channels", "attention", "params", "batch/GPU", "for"):
        table.add_column(col, no_wrap=True)
    for name, info in PRESETS.items():
        cfg = info.build()
        with torch.device("meta"):
            params = count_parameters(build_unet(cfg.model, 1))
        attn = ",".join("yes" if a else "no" for a in cfg.model.attention)
        table.add_row(name, str(cfg.model.sample_size), str(cfg.model.block_out_channels), attn,
                      f"{params / 1e6:.1f} M", str(cfg.train.batch_per_gpu), info.purpose)
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diffscale",
        description="Train diffusion models on a laptop, a GPU, a node or a SLURM / Grid Engine cluster with one config.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("train", help="train a diffusion model (no arguments: the CPU demo)")
    p.add_argument("config", nargs="?", help="YAML config (e.g. a RUN_DIR/config.yaml)")
    p.add_argument("--preset", help="start from a preset (see `diffscale presets`)")
    p.add_argument("--data", help="builtin[:glyphs|digits|mix], imagefolder:PATH, npz:PATH, emnist:ROOT[:split], mnist:ROOT")
    p.add_argument("--out", help="run directory (default runs/PRESET)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field, e.g. train.steps=500")
    p.add_argument("--resume", metavar="auto|PATH", help="continue from the newest checkpoint (auto) or a given one")
    p.add_argument("--max-steps", type=int, help="stop this invocation at this step (the run's target stays train.steps)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"])
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"])
    p.add_argument("--recipe", choices=["fast", "plain"])
    p.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("sample", help="sample images from a trained run (EMA weights)")
    p.add_argument("run_dir")
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--sampler", choices=["ddim", "ddpm"], default="ddim")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gif", action="store_true", help="also write the denoising trajectory as GIF (and MP4 with ffmpeg)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"])
    p.add_argument("--out", help="PNG path (default RUN_DIR/samples/...)")
    p.set_defaults(func=cmd_sample)

    p = sub.add_parser("export", help="export a run for diffusers.DDPMPipeline")
    p.add_argument("run_dir")
    p.add_argument("--diffusers", required=True, metavar="OUT_DIR")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("presets", help="list the model presets")
    p.set_defaults(func=cmd_presets)

    _register_optional(sub)
    return parser


def _register_optional(sub) -> None:
    """Verbs owned by other modules (cluster, bench, doctor) register themselves."""
    for module in ("diffscale.cluster.cli", "diffscale.bench", "diffscale.doctor"):
        try:
            mod = __import__(module, fromlist=["register"])
        except ImportError as exc:
            if exc.name and exc.name.startswith("diffscale"):
                continue
            raise
        mod.register(sub)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv:
        argv = ["train"]  # the demo: `diffscale` alone trains the CPU preset
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USER_ERROR
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
